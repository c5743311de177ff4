//! The lsm engine's manifest: the one file saying which tables are live, at
//! which level, and what they make durable (the applied index and the last
//! sequence they contain, the next file number).
//!
//! It owns the manifest's format and its atomic replacement. Each edit
//! rewrites the whole (small) manifest to `MANIFEST.tmp` with direct I/O,
//! fdatasyncs it, renames it over `MANIFEST` and fsyncs the directory: the
//! rename is the commit point, so there is never a torn manifest to cut,
//! and any checksum or framing failure is corruption that refuses to open
//! (naming the file and offset). It must never report an edit durable
//! before the directory fsync returned.
//!
//! # Format (version 1, little-endian)
//!
//! ```text
//! "METCDMAN" | version u32 | body len u32 | body | crc32c u32 (of all before)
//! body: edit u64 | next file u64 | last seq u64 | applied index u64 |
//!       n u32 | n × (level u8 | file u64 | size u64 | smallest | largest)
//! ```
//! (keys are `u32`-length-prefixed), zero-padded to the alignment.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::format::{
    failpoint, put_len_prefixed, seal, unseal, Reader, FORMAT_VERSION, MANIFEST_MAGIC,
};
use super::sst::TableMeta;
use crate::io::{sync_dir, AlignedBuf, DirectFile, ALIGN};
use crate::{Error, Result};

pub(crate) const MANIFEST_NAME: &str = "MANIFEST";
pub(crate) const MANIFEST_TMP_NAME: &str = "MANIFEST.tmp";
const HEADER_BYTES: usize = 16;

/// Everything a manifest records.
#[derive(Debug, Clone, Default)]
pub(crate) struct ManifestState {
    /// Edit counter: each rewrite increments it (for humans and tests).
    pub edit: u64,
    pub next_file: u64,
    pub last_seq: u64,
    pub applied_index: u64,
    /// `(level, table)`.
    pub tables: Vec<(u8, TableMeta)>,
}

impl ManifestState {
    fn encode(&self) -> Result<Vec<u8>> {
        let mut body = Vec::new();
        body.extend_from_slice(&self.edit.to_le_bytes());
        body.extend_from_slice(&self.next_file.to_le_bytes());
        body.extend_from_slice(&self.last_seq.to_le_bytes());
        body.extend_from_slice(&self.applied_index.to_le_bytes());
        body.extend_from_slice(&(self.tables.len() as u32).to_le_bytes());
        for (level, t) in &self.tables {
            body.push(*level);
            body.extend_from_slice(&t.file_no.to_le_bytes());
            body.extend_from_slice(&t.size.to_le_bytes());
            put_len_prefixed(&mut body, &t.smallest)?;
            put_len_prefixed(&mut body, &t.largest)?;
        }
        let mut out = Vec::with_capacity(body.len() + HEADER_BYTES + 4);
        out.extend_from_slice(MANIFEST_MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        let len = u32::try_from(body.len())
            .map_err(|_| Error::Invalid("manifest too large".to_owned()))?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&body);
        seal(&mut out);
        Ok(out)
    }

    fn decode(path: &Path, data: &[u8]) -> Result<ManifestState> {
        let corrupt = |offset: usize, reason: &str| Error::Corrupt {
            what: "manifest",
            path: path.to_path_buf(),
            offset: offset as u64,
            reason: reason.to_owned(),
        };
        if data.len() < HEADER_BYTES || &data[..8] != MANIFEST_MAGIC {
            return Err(Error::Invalid(format!(
                "{} is not a metcd lsm manifest (bad magic)",
                path.display()
            )));
        }
        let mut r = Reader::new(data);
        r.pos = 8;
        let version = r.u32().ok_or_else(|| corrupt(8, "truncated header"))?;
        if version != FORMAT_VERSION {
            return Err(Error::Invalid(format!(
                "{} has lsm format version {version}; this build reads version {FORMAT_VERSION}",
                path.display()
            )));
        }
        let len = r.u32().ok_or_else(|| corrupt(12, "truncated header"))? as usize;
        let end = HEADER_BYTES + len + 4;
        if end > data.len() {
            return Err(corrupt(12, "body length past the end of the file"));
        }
        let sealed =
            unseal(&data[..end]).ok_or_else(|| corrupt(HEADER_BYTES + len, "checksum mismatch"))?;
        let mut r = Reader::new(&sealed[HEADER_BYTES..]);
        let bad = |r: &Reader<'_>| corrupt(HEADER_BYTES + r.pos, "truncated body");
        let mut state = ManifestState::default();
        macro_rules! field {
            ($e:expr) => {
                match $e {
                    Some(v) => v,
                    None => return Err(bad(&r)),
                }
            };
        }
        state.edit = field!(r.u64());
        state.next_file = field!(r.u64());
        state.last_seq = field!(r.u64());
        state.applied_index = field!(r.u64());
        let n = field!(r.u32());
        for _ in 0..n {
            let level = field!(r.u8());
            let file_no = field!(r.u64());
            let size = field!(r.u64());
            let smallest = Bytes::copy_from_slice(field!(r.len_prefixed()));
            let largest = Bytes::copy_from_slice(field!(r.len_prefixed()));
            state.tables.push((
                level,
                TableMeta {
                    file_no,
                    size,
                    smallest,
                    largest,
                },
            ));
        }
        Ok(state)
    }
}

/// Reads `dir`'s manifest, or `None` if there is none.
pub(crate) fn read(dir: &Path) -> Result<Option<ManifestState>> {
    let path = dir.join(MANIFEST_NAME);
    if !path.exists() {
        return Ok(None);
    }
    let file = DirectFile::open(&path, false)?;
    let len = file.len()?;
    if len == 0 || !len.is_multiple_of(ALIGN as u64) {
        return Err(Error::Corrupt {
            what: "manifest",
            path,
            offset: len,
            reason: format!("bad file length {len}"),
        });
    }
    let len = usize::try_from(len).map_err(|_| Error::Invalid("manifest too large".into()))?;
    let mut buf = AlignedBuf::zeroed(len);
    file.read_at(&mut buf, 0)?;
    ManifestState::decode(&path, &buf).map(Some)
}

/// Durably replaces `dir`'s manifest with `state` (see the module docs).
/// `ctx` prefixes the failpoint names (`lsm::flush`, `lsm::compaction`...).
pub(crate) fn write(dir: &Path, state: &ManifestState, ctx: &str) -> Result<()> {
    let tmp: PathBuf = dir.join(MANIFEST_TMP_NAME);
    let path = dir.join(MANIFEST_NAME);
    let bytes = state.encode()?;
    let buf = AlignedBuf::from_slice(&bytes);
    let file = DirectFile::open(&tmp, true)?;
    file.set_len(0)?;
    failpoint(&format!("{ctx}::manifest_write"), &tmp)?;
    file.write_all_at(&[(0, &buf)])?;
    failpoint(&format!("{ctx}::manifest_sync"), &tmp)?;
    file.sync_data()?;
    drop(file);
    failpoint(&format!("{ctx}::manifest_rename"), &tmp)?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io("rename manifest into place", &path, e))?;
    failpoint(&format!("{ctx}::manifest_dir_sync"), dir)?;
    sync_dir(dir)
}

/// Fuzzing: `data` decoded as a manifest as given, then with magic,
/// version, body length and checksum made valid around it.
pub(crate) fn fuzz_decode(data: &[u8]) {
    let path = Path::new("fuzz-manifest");
    let _ = ManifestState::decode(path, data);
    let mut sealed = Vec::with_capacity(HEADER_BYTES + data.len() + 4);
    sealed.extend_from_slice(MANIFEST_MAGIC);
    sealed.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    let Ok(len) = u32::try_from(data.len()) else {
        return;
    };
    sealed.extend_from_slice(&len.to_le_bytes());
    sealed.extend_from_slice(data);
    seal(&mut sealed);
    let _ = ManifestState::decode(path, &sealed);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn sample() -> ManifestState {
        ManifestState {
            edit: 3,
            next_file: 9,
            last_seq: 77,
            applied_index: 41,
            tables: vec![(
                1,
                TableMeta {
                    file_no: 4,
                    size: 8192,
                    smallest: Bytes::from_static(b"a"),
                    largest: Bytes::from_static(b"q"),
                },
            )],
        }
    }

    #[test]
    fn manifest_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap().is_none());
        write(dir.path(), &sample(), "lsm::test").unwrap();
        let got = read(dir.path()).unwrap().unwrap();
        assert_eq!(
            (got.edit, got.next_file, got.last_seq, got.applied_index),
            (3, 9, 77, 41)
        );
        assert_eq!(got.tables.len(), 1);
        assert_eq!(got.tables[0].1.largest, Bytes::from_static(b"q"));
    }

    #[test]
    fn flipped_byte_or_newer_version_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &sample(), "lsm::test").unwrap();
        let path = dir.path().join(MANIFEST_NAME);
        let good = std::fs::read(&path).unwrap();
        let mut bad = good.clone();
        bad[30] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        let err = read(dir.path()).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("MANIFEST"), "{err}");
        let mut newer = good;
        newer[8] = 2;
        std::fs::write(&path, &newer).unwrap();
        let err = read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("format version 2"), "{err}");
    }
}
