//! The snapshot file format: a full, checksummed dump of an engine snapshot.
//!
//! This module owns the byte layout below, its writer (glommio direct I/O,
//! yielding between chunks so a large dump does not starve the executor) and
//! its reader (plain std I/O, used at startup). The same byte stream is meant
//! to be the payload of Raft snapshots sent to followers.
//!
//! It must never hand out data from a file that has not been verified end to
//! end (magic, version, framing, order, record count and CRC), and never
//! leave a partially written file behind under the name it was asked to
//! write. It knows nothing about where files live or how they are named or
//! renamed: that is the caller's business.
//!
//! # Layout (all integers little-endian)
//!
//! ```text
//! offset  size  field
//! 0       8     magic "METCDSNP"
//! 8       4     u32 format version (1)
//! 12      8     u64 applied index
//! 20      ...   records, keys strictly ascending, each:
//!                 u32 key_len | u32 value_len | key | value
//! end-12  8     u64 record count
//! end-4   4     u32 CRC32C (Castagnoli) of every byte before this field
//! ```
//!
//! The file carries no length field: the records end where the 12-byte
//! footer begins, so any truncation shows up as a framing, count or CRC
//! error rather than as a shorter but valid-looking snapshot.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::ops::Bound;
use std::path::Path;

use bytes::Bytes;
use glommio::io::{DmaBuffer, DmaFile};

use crate::{EngineSnapshot, Error, Result, Scan};

pub const MAGIC: &[u8; 8] = b"METCDSNP";
pub const FORMAT_VERSION: u32 = 1;
pub const VERSION_OFFSET: u64 = 8;
pub const APPLIED_INDEX_OFFSET: u64 = 12;
pub const HEADER_LEN: u64 = 20;
pub const RECORD_HEADER_LEN: u64 = 8;
pub const FOOTER_LEN: u64 = 12;

/// A scan chunk ends after this many records or bytes, whichever first,
/// bounding both memory and the time between yields.
const CHUNK_MAX_RECORDS: usize = 4096;
const CHUNK_MAX_BYTES: usize = 1 << 20;

/// Size of each direct I/O write (rounded up to the device alignment).
const WRITE_BUFFER_SIZE: u64 = 256 << 10;
const READ_BUFFER_SIZE: usize = 1 << 20;

const WHAT: &str = "snapshot file";

/// A verified snapshot file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotData {
    pub applied_index: u64,
    /// Keys strictly ascending.
    pub entries: Vec<(Bytes, Bytes)>,
}

/// Writes `snap` to `path` (created or truncated) and fdatasyncs it.
/// Returns the file's length in bytes.
///
/// Must run on a glommio executor. The caller makes the file durable under
/// its final name (rename, directory fsync); on error the partial file is
/// removed.
pub async fn write<S: EngineSnapshot>(snap: &S, path: &Path) -> Result<u64> {
    let file = DmaFile::create(path)
        .await
        .map_err(|e| Error::glommio("create snapshot file", path, e))?;
    let result = write_to(snap, DmaSink::new(file, path)).await;
    if result.is_err() {
        // Best effort: the error being returned matters more than this one.
        let _ = glommio::io::remove(path).await;
    }
    result
}

async fn write_to<S: EngineSnapshot>(snap: &S, mut sink: DmaSink<'_>) -> Result<u64> {
    sink.put(&file_header(snap.applied_index())).await?;

    let mut count: u64 = 0;
    let mut resume_after: Option<Bytes> = None;
    let mut chunk: Vec<(Bytes, Bytes)> = Vec::new();
    loop {
        // `scan` is synchronous, so gather a bounded chunk, then write it
        // with awaits in between; resuming after the last key keeps the
        // chunks disjoint and in order.
        chunk.clear();
        let mut chunk_bytes = 0usize;
        let mut more = false;
        let start = match &resume_after {
            Some(key) => Bound::Excluded(key.as_ref()),
            None => Bound::Unbounded,
        };
        snap.scan(start, Bound::Unbounded, |key, value| {
            chunk.push((Bytes::copy_from_slice(key), value.clone()));
            chunk_bytes += RECORD_HEADER_LEN as usize + key.len() + value.len();
            if chunk.len() >= CHUNK_MAX_RECORDS || chunk_bytes >= CHUNK_MAX_BYTES {
                more = true;
                Scan::Stop
            } else {
                Scan::Continue
            }
        })?;
        for (key, value) in &chunk {
            sink.put(&record_header(key, value)?).await?;
            sink.put(key).await?;
            sink.put(value).await?;
            count += 1;
        }
        resume_after = chunk.last().map(|(key, _)| key.clone());
        glommio::yield_if_needed().await;
        if !more {
            break;
        }
    }

    sink.put(&count.to_le_bytes()).await?;
    let crc = sink.crc;
    sink.put_unchecksummed(&crc.to_le_bytes()).await?;
    sink.finish().await
}

/// A snapshot file written record by record from plain std I/O, for
/// offline tools (a restore converting another store) whose source hands
/// out records in ascending key order and is too big to hold: the bytes are
/// exactly [`write`]'s. Nothing is left under `path` unless
/// [`StreamWriter::finish`] succeeds (the file is removed on drop).
pub struct StreamWriter {
    file: Option<std::io::BufWriter<File>>,
    path: std::path::PathBuf,
    crc: u32,
    count: u64,
    last_key: Option<Vec<u8>>,
}

impl StreamWriter {
    pub fn create(path: &Path, applied_index: u64) -> Result<StreamWriter> {
        let file = File::create(path).map_err(|e| Error::io("create snapshot file", path, e))?;
        let mut writer = StreamWriter {
            file: Some(std::io::BufWriter::with_capacity(
                WRITE_BUFFER_SIZE as usize,
                file,
            )),
            path: path.to_path_buf(),
            crc: 0,
            count: 0,
            last_key: None,
        };
        writer.put_bytes(&file_header(applied_index))?;
        Ok(writer)
    }

    /// Appends a record; keys must come strictly ascending.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        if self.last_key.as_deref().is_some_and(|last| last >= key) {
            return Err(Error::Invalid(format!(
                "snapshot records out of order: {:02x?} after {:02x?}",
                &key[..key.len().min(32)],
                self.last_key.as_deref().map(|k| &k[..k.len().min(32)])
            )));
        }
        self.put_bytes(&record_header(key, value)?)?;
        self.put_bytes(key)?;
        self.put_bytes(value)?;
        self.count += 1;
        let last = self.last_key.get_or_insert_with(Vec::new);
        last.clear();
        last.extend_from_slice(key);
        Ok(())
    }

    /// Writes the footer and makes the file durable; answers its length.
    pub fn finish(mut self) -> Result<u64> {
        self.put_bytes(&self.count.to_le_bytes())?;
        let crc = self.crc.to_le_bytes();
        let mut file = self
            .file
            .take()
            .ok_or_else(|| Error::Invalid("a finished snapshot writer".into()))?;
        let path = self.path.clone();
        let done = (|| {
            use std::io::Write;
            file.write_all(&crc)?;
            let file = file.into_inner().map_err(|e| e.into_error())?;
            file.sync_data()?;
            file.metadata().map(|m| m.len())
        })();
        match done {
            Ok(len) => {
                // Kept: nothing to remove on drop.
                self.path = std::path::PathBuf::new();
                Ok(len)
            }
            Err(e) => Err(Error::io("write snapshot file", &path, e)),
        }
    }

    fn put_bytes(&mut self, data: &[u8]) -> Result<()> {
        use std::io::Write;
        self.crc = crc32c::crc32c_append(self.crc, data);
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| Error::Invalid("a finished snapshot writer".into()))?;
        file.write_all(data)
            .map_err(|e| Error::io("write snapshot file", &self.path, e))
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        // Unfinished (an error on the way): leave no partial file behind.
        if !self.path.as_os_str().is_empty() {
            self.file = None;
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The file's first bytes: magic, format version, applied index.
fn file_header(applied_index: u64) -> [u8; HEADER_LEN as usize] {
    let mut header = [0u8; HEADER_LEN as usize];
    header[..8].copy_from_slice(MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[12..20].copy_from_slice(&applied_index.to_le_bytes());
    header
}

/// A record's length prefix.
fn record_header(key: &[u8], value: &[u8]) -> Result<[u8; RECORD_HEADER_LEN as usize]> {
    let mut header = [0u8; RECORD_HEADER_LEN as usize];
    header[..4].copy_from_slice(&len_u32(key.len(), "key")?.to_le_bytes());
    header[4..].copy_from_slice(&len_u32(value.len(), "value")?.to_le_bytes());
    Ok(header)
}

fn len_u32(len: usize, what: &str) -> Result<u32> {
    u32::try_from(len).map_err(|_| {
        Error::Invalid(format!(
            "{what} of {len} bytes exceeds the snapshot format's u32 length limit"
        ))
    })
}

/// Sequential writer over direct I/O: fills an aligned buffer, writes it at
/// the next aligned offset, and on finish pads the tail to the alignment,
/// then truncates the file back to its logical length.
struct DmaSink<'p> {
    file: DmaFile,
    path: &'p Path,
    buf: DmaBuffer,
    filled: usize,
    /// Bytes already written; always a multiple of the buffer size.
    flushed: u64,
    crc: u32,
}

impl<'p> DmaSink<'p> {
    fn new(file: DmaFile, path: &'p Path) -> Self {
        let buf = file.alloc_dma_buffer(file.align_up(WRITE_BUFFER_SIZE) as usize);
        DmaSink {
            file,
            path,
            buf,
            filled: 0,
            flushed: 0,
            crc: 0,
        }
    }

    async fn put(&mut self, data: &[u8]) -> Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, data);
        self.put_unchecksummed(data).await
    }

    async fn put_unchecksummed(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let capacity = self.buf.len();
            let n = (capacity - self.filled).min(data.len());
            self.buf.as_bytes_mut()[self.filled..self.filled + n].copy_from_slice(&data[..n]);
            self.filled += n;
            data = &data[n..];
            if self.filled == capacity {
                let next = self.file.alloc_dma_buffer(capacity);
                let full = std::mem::replace(&mut self.buf, next);
                write_all_at(&self.file, self.path, full, self.flushed).await?;
                self.flushed += capacity as u64;
                self.filled = 0;
            }
        }
        Ok(())
    }

    async fn finish(self) -> Result<u64> {
        let DmaSink {
            file,
            path,
            mut buf,
            filled,
            flushed,
            ..
        } = self;
        let len = flushed + filled as u64;
        if filled > 0 {
            let padded = file.align_up(filled as u64) as usize;
            // The buffer may hold stale memory; never put that on disk.
            buf.as_bytes_mut()[filled..padded].fill(0);
            buf.trim_to_size(padded);
            write_all_at(&file, path, buf, flushed).await?;
        }
        file.truncate(len)
            .await
            .map_err(|e| Error::glommio("truncate snapshot file", path, e))?;
        file.fdatasync()
            .await
            .map_err(|e| Error::glommio("fdatasync snapshot file", path, e))?;
        file.close()
            .await
            .map_err(|e| Error::glommio("close snapshot file", path, e))?;
        Ok(len)
    }
}

async fn write_all_at(file: &DmaFile, path: &Path, buf: DmaBuffer, pos: u64) -> Result<()> {
    let len = buf.len();
    let written = file
        .write_at(buf, pos)
        .await
        .map_err(|e| Error::glommio("write snapshot file", path, e))?;
    if written != len {
        // Direct I/O short writes mean the device is out of space or
        // failing; a retry would not make the file trustworthy.
        return Err(Error::io(
            "write snapshot file",
            path,
            io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {written} of {len} bytes at offset {pos}"),
            ),
        ));
    }
    Ok(())
}

/// Reads and fully verifies the snapshot file at `path`.
///
/// Any inconsistency is [`Error::Corrupt`] naming `path` and the offset
/// where it was found; nothing is returned unless the whole file checks out.
pub fn read(path: &Path) -> Result<SnapshotData> {
    let mut entries: Vec<(Bytes, Bytes)> = Vec::new();
    let applied_index = read_with(path, |key, value| {
        entries.push((key, value));
        Ok(())
    })?;
    Ok(SnapshotData {
        applied_index,
        entries,
    })
}

/// Streams the records of the snapshot file at `path` to `visit` in key
/// order, with bounded memory, and returns its applied index once the
/// whole file has been verified. `visit` sees records before the final
/// checksum is checked: a caller that builds state from them must discard
/// it when this returns an error.
pub fn read_with(path: &Path, mut visit: impl FnMut(Bytes, Bytes) -> Result<()>) -> Result<u64> {
    let file = File::open(path).map_err(|e| Error::io("open snapshot file", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io("stat snapshot file", path, e))?
        .len();
    let corrupt = |offset: u64, reason: String| Error::Corrupt {
        what: WHAT,
        path: path.to_path_buf(),
        offset,
        reason,
    };
    if len < HEADER_LEN + FOOTER_LEN {
        return Err(corrupt(
            len,
            format!(
                "file is {len} bytes, shorter than header plus footer ({} bytes): truncated",
                HEADER_LEN + FOOTER_LEN
            ),
        ));
    }
    let mut reader = ChecksummedReader {
        inner: BufReader::with_capacity(READ_BUFFER_SIZE, file),
        path,
        pos: 0,
        crc: 0,
    };

    let header: [u8; HEADER_LEN as usize] = reader.array()?;
    if &header[..8] != MAGIC {
        return Err(corrupt(0, format!("bad magic {:02x?}", &header[..8])));
    }
    let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if version != FORMAT_VERSION {
        return Err(corrupt(
            VERSION_OFFSET,
            format!("unsupported format version {version}, expected {FORMAT_VERSION}"),
        ));
    }
    let mut applied = [0u8; 8];
    applied.copy_from_slice(&header[12..20]);
    let applied_index = u64::from_le_bytes(applied);

    let records_end = len - FOOTER_LEN;
    let mut records = 0u64;
    // A copy, not a clone of the key: a clone would turn every key's
    // buffer into a shared one (an allocation more per record).
    let mut previous: Vec<u8> = Vec::new();
    while reader.pos < records_end {
        let at = reader.pos;
        if records_end - at < RECORD_HEADER_LEN {
            return Err(corrupt(
                at,
                format!(
                    "record header runs into the footer at {records_end}: truncated or misframed"
                ),
            ));
        }
        let record_header: [u8; RECORD_HEADER_LEN as usize] = reader.array()?;
        let key_len = u32::from_le_bytes([
            record_header[0],
            record_header[1],
            record_header[2],
            record_header[3],
        ]);
        let value_len = u32::from_le_bytes([
            record_header[4],
            record_header[5],
            record_header[6],
            record_header[7],
        ]);
        // Checked before allocating so a corrupt length cannot ask for 8 GiB.
        let body_len = u64::from(key_len) + u64::from(value_len);
        if body_len > records_end - reader.pos {
            return Err(corrupt(
                at,
                format!(
                    "record of {key_len}+{value_len} bytes runs past the end of the records \
                     at {records_end}: truncated or misframed"
                ),
            ));
        }
        let key = reader.vec(key_len as usize)?;
        let value = reader.vec(value_len as usize)?;
        if records > 0 && key <= previous {
            return Err(corrupt(
                at,
                "keys are not in strictly ascending order".into(),
            ));
        }
        previous.clear();
        previous.extend_from_slice(&key);
        let key = Bytes::from(key);
        records += 1;
        visit(key, Bytes::from(value))?;
    }

    let count = u64::from_le_bytes(reader.array()?);
    let computed = reader.crc;
    let stored = u32::from_le_bytes(reader.array_unchecksummed()?);
    if stored != computed {
        return Err(corrupt(
            len - 4,
            format!("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"),
        ));
    }
    if count != records {
        return Err(corrupt(
            records_end,
            format!("footer says {count} records but {records} were found"),
        ));
    }
    Ok(applied_index)
}

struct ChecksummedReader<'p> {
    inner: BufReader<File>,
    path: &'p Path,
    pos: u64,
    crc: u32,
}

impl ChecksummedReader<'_> {
    fn fill(&mut self, buf: &mut [u8]) -> Result<()> {
        // Lengths were checked against the file size, so running out here
        // means the file changed underneath us: an I/O problem, not rot.
        self.inner
            .read_exact(buf)
            .map_err(|e| Error::io("read snapshot file", self.path, e))?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let out = self.array_unchecksummed::<N>()?;
        self.crc = crc32c::crc32c_append(self.crc, &out);
        Ok(out)
    }

    fn array_unchecksummed<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        self.fill(&mut out)?;
        Ok(out)
    }

    fn vec(&mut self, len: usize) -> Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        self.fill(&mut out)?;
        self.crc = crc32c::crc32c_append(self.crc, &out);
        Ok(out)
    }
}
