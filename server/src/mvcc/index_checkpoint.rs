//! The key index's checkpoint format (issue 20, restart time): the index as
//! it stood at one applied index and revision, so that a restart loads it
//! and reads only the revisions written after it from the engine, instead
//! of every revision in the store.
//!
//! This module owns the bytes: [`Encoder`] turns slices of the index into
//! chunks (the caller writes them to a file, off the owner core), and
//! [`decode`] checks a whole file and builds the index back. It does no I/O
//! and must never be the only copy of anything: a missing, torn, corrupt,
//! foreign or stale checkpoint only costs the full rebuild (see
//! [`super::MvccStore::open_with_index_checkpoint`] for when one is used).
//!
//! # Layout (all integers little-endian; varints are LEB128)
//!
//! ```text
//! header   "MKIXv001" | applied index u64 | revision i64 | compact revision i64 | cluster id u64
//! key      0x01 | varint shared prefix with the previous key | varint suffix length | suffix
//!               | varint event count (>= 1)
//!               | per event: varint main (the first absolute, then the step from the one before)
//!                            varint (sub << 1 | tombstone)
//!               | varint version (0: generation unknown) [| varint newest main - created revision]
//! end      0x00 | varint key count | CRC32C of every byte before it (u32)
//! ```
//!
//! Keys ascend strictly; a key's events ascend strictly by `(main, sub)`,
//! all at or below the header's revision; a generation belongs to a put.

use super::key_index::{Generation, KeyIndex, Rev};

const MAGIC: &[u8; 8] = b"MKIXv001";
const HEADER_LEN: usize = 8 + 8 * 4;
const TAG_KEY: u8 = 1;
const TAG_END: u8 = 0;

/// The most key bytes a checkpoint may hold per byte of file (prefix
/// compression of real keys gains a few times at most).
const MAX_KEY_EXPANSION: u64 = 256;

/// What a checkpoint describes: the index at `revision`, which the store
/// reached at Raft index `applied_index` with compaction at
/// `compact_revision`, in the cluster `cluster_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexCheckpointPlan {
    pub applied_index: u64,
    pub revision: i64,
    pub compact_revision: i64,
    pub cluster_id: u64,
}

/// Why a checkpoint cannot be used; the store is then rebuilt from the
/// engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error("the key index checkpoint is damaged: {0}")]
    Damaged(String),
    #[error("the key index checkpoint belongs to cluster {found:x}, not {expected:x}")]
    OtherCluster { found: u64, expected: u64 },
    #[error(
        "the key index checkpoint (applied index {checkpoint}) is newer than the engine \
         (applied index {engine})"
    )]
    Ahead { checkpoint: u64, engine: u64 },
    #[error(
        "the store was compacted at revision {compacted} after the key index checkpoint at \
         revision {revision}"
    )]
    CompactedSince { revision: i64, compacted: i64 },
    #[error(
        "the key index checkpoint was compacted at revision {checkpoint}, the engine only at \
         {engine}"
    )]
    CompactedAhead { checkpoint: i64, engine: i64 },
    #[error("a compaction ran while the key index checkpoint was being written")]
    Interrupted,
}

fn damaged(what: impl Into<String>) -> CheckpointError {
    CheckpointError::Damaged(what.into())
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Encodes a checkpoint chunk by chunk; [`Encoder::finish`] adds the end.
#[derive(Debug)]
pub(crate) struct Encoder {
    plan: IndexCheckpointPlan,
    previous_key: Vec<u8>,
    keys: u64,
    crc: u32,
    started: bool,
}

impl Encoder {
    pub(crate) fn new(plan: IndexCheckpointPlan) -> Encoder {
        Encoder {
            plan,
            previous_key: Vec::new(),
            keys: 0,
            crc: 0,
            started: false,
        }
    }

    /// Keys encoded so far.
    pub(crate) fn keys(&self) -> u64 {
        self.keys
    }

    /// Starts a chunk: the header before the first key.
    pub(crate) fn begin_chunk(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.plan.applied_index.to_le_bytes());
        out.extend_from_slice(&self.plan.revision.to_le_bytes());
        out.extend_from_slice(&self.plan.compact_revision.to_le_bytes());
        out.extend_from_slice(&self.plan.cluster_id.to_le_bytes());
    }

    /// One key with its events at or below the plan's revision (`older`
    /// then `newest`; at least one) and the newest's generation.
    pub(crate) fn key(
        &mut self,
        out: &mut Vec<u8>,
        key: &[u8],
        older: &[Rev],
        newest: Option<Rev>,
        generation: Option<Generation>,
    ) {
        let shared = key
            .iter()
            .zip(&self.previous_key)
            .take_while(|(a, b)| a == b)
            .count();
        out.push(TAG_KEY);
        put_varint(out, shared as u64);
        let suffix = key.get(shared..).unwrap_or_default();
        put_varint(out, suffix.len() as u64);
        out.extend_from_slice(suffix);
        self.previous_key.truncate(shared);
        self.previous_key.extend_from_slice(suffix);
        let count = older.len() + usize::from(newest.is_some());
        put_varint(out, count as u64);
        let mut before = 0i64;
        let mut last_main = 0i64;
        for r in older.iter().chain(newest.as_ref()) {
            put_varint(out, r.main.wrapping_sub(before) as u64);
            before = r.main;
            last_main = r.main;
            put_varint(out, (u64::from(r.sub) << 1) | u64::from(r.tombstone));
        }
        match generation.filter(|_| newest.is_some_and(|r| !r.tombstone)) {
            Some(g) if g.version > 0 && g.created >= 1 && g.created <= last_main => {
                put_varint(out, g.version as u64);
                put_varint(out, (last_main - g.created) as u64);
            }
            _ => put_varint(out, 0),
        }
        self.keys += 1;
    }

    /// Folds a finished chunk into the checksum.
    pub(crate) fn end_chunk(&mut self, chunk: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, chunk);
    }

    /// The last chunk: the end marker, the key count and the checksum.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + HEADER_LEN);
        self.begin_chunk(&mut out);
        out.push(TAG_END);
        put_varint(&mut out, self.keys);
        let crc = crc32c::crc32c_append(self.crc, &out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }
}

/// A checkpoint read back: its plan and the index it holds.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub(crate) plan: IndexCheckpointPlan,
    pub(crate) index: KeyIndex,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CheckpointError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| damaged(format!("cut short at byte {}", self.at)))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, CheckpointError> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, CheckpointError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    fn varint(&mut self) -> Result<u64, CheckpointError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(damaged(format!("varint too long at byte {}", self.at)))
    }

    /// A length that must fit in what is left (so nothing is allocated by
    /// an unchecked length).
    fn length(&mut self) -> Result<usize, CheckpointError> {
        let n = self.varint()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.bytes.len() - self.at)
            .ok_or_else(|| damaged(format!("length {n} past the end at byte {}", self.at)))
    }
}

/// Checks a whole checkpoint and builds its index. Never panics and never
/// allocates by a length it has not checked against `bytes`.
pub(crate) fn decode(bytes: &[u8]) -> Result<Decoded, CheckpointError> {
    let body_len = bytes
        .len()
        .checked_sub(4)
        .filter(|&n| n >= HEADER_LEN)
        .ok_or_else(|| damaged(format!("{} bytes: too short", bytes.len())))?;
    let (body, crc) = bytes.split_at(body_len);
    let mut stored = [0u8; 4];
    stored.copy_from_slice(crc);
    if crc32c::crc32c(body) != u32::from_le_bytes(stored) {
        return Err(damaged("checksum mismatch (torn or overwritten)"));
    }
    let mut r = Reader { bytes: body, at: 0 };
    if r.take(MAGIC.len())? != MAGIC {
        return Err(damaged("not a key index checkpoint (magic)"));
    }
    let plan = IndexCheckpointPlan {
        applied_index: r.u64()?,
        revision: r.u64()? as i64,
        compact_revision: r.u64()? as i64,
        cluster_id: r.u64()?,
    };
    if plan.revision < 1 || plan.compact_revision > plan.revision {
        return Err(damaged(format!(
            "revision {} with compaction at {}",
            plan.revision, plan.compact_revision
        )));
    }
    let mut index = KeyIndex::default();
    let mut key = Vec::new();
    let mut events = Vec::new();
    let mut keys = 0u64;
    let mut key_bytes = 0u64;
    let key_bytes_limit = (bytes.len() as u64)
        .saturating_mul(MAX_KEY_EXPANSION)
        .saturating_add(1 << 20);
    loop {
        match r.u8()? {
            TAG_END => break,
            TAG_KEY => {}
            t => return Err(damaged(format!("unknown tag {t} at byte {}", r.at - 1))),
        }
        // A count of bytes of the key before, not of bytes that follow.
        let shared = usize::try_from(r.varint()?).unwrap_or(usize::MAX);
        if shared > key.len() {
            return Err(damaged(format!(
                "key {keys} shares more than the key before"
            )));
        }
        key.truncate(shared);
        let suffix_len = r.length()?;
        key.extend_from_slice(r.take(suffix_len)?);
        // Shared prefixes let a small file describe many long keys: bound
        // what it may make us hold (real stores stay far below).
        key_bytes = key_bytes.saturating_add(key.len() as u64);
        if key_bytes > key_bytes_limit {
            return Err(damaged(format!(
                "{key_bytes} bytes of keys from a {}-byte file",
                bytes.len()
            )));
        }
        let count = r.length()?;
        if count == 0 {
            return Err(damaged(format!("key {keys} has no event")));
        }
        events.clear();
        let mut main = 0i64;
        for _ in 0..count {
            let step = i64::try_from(r.varint()?).map_err(|_| damaged("revision overflow"))?;
            let next = main
                .checked_add(step)
                .ok_or_else(|| damaged("revision overflow"))?;
            let sub_tomb = r.varint()?;
            let sub = u32::try_from(sub_tomb >> 1).map_err(|_| damaged("sub revision overflow"))?;
            let rev = Rev {
                main: next,
                sub,
                tombstone: sub_tomb & 1 == 1,
            };
            let ascending = events
                .last()
                .is_none_or(|p: &Rev| (p.main, p.sub) < (rev.main, rev.sub));
            if next < 1 || next > plan.revision || !ascending {
                return Err(damaged(format!(
                    "key {keys}: event at {next}/{sub} out of order or past revision {}",
                    plan.revision
                )));
            }
            main = next;
            events.push(rev);
        }
        let version = i64::try_from(r.varint()?).map_err(|_| damaged("version overflow"))?;
        let generation = if version == 0 {
            None
        } else {
            let back = i64::try_from(r.varint()?).map_err(|_| damaged("revision overflow"))?;
            let created = main - back;
            if created < 1 || events.last().is_some_and(|e| e.tombstone) {
                return Err(damaged(format!("key {keys}: a generation it cannot have")));
            }
            Some(Generation { created, version })
        };
        if !index.append_history(&key, &events, generation) {
            return Err(damaged(format!("key {keys} out of order")));
        }
        keys += 1;
    }
    let count = r.varint()?;
    if count != keys || r.at != body.len() {
        return Err(damaged(format!(
            "{keys} keys read, {count} counted, {} bytes left",
            body.len() - r.at
        )));
    }
    Ok(Decoded { plan, index })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::key_index::Newest;
    use super::*;

    fn plan(revision: i64) -> IndexCheckpointPlan {
        IndexCheckpointPlan {
            applied_index: 9,
            revision,
            compact_revision: -1,
            cluster_id: 3,
        }
    }

    fn encode(index: &KeyIndex, plan: IndexCheckpointPlan) -> Vec<u8> {
        let mut encoder = Encoder::new(plan);
        let mut out = Vec::new();
        encoder.begin_chunk(&mut out);
        index.visit_history_slice(plan.revision, None, usize::MAX, |k, older, newest, g| {
            encoder.key(&mut out, k, older, newest, g);
        });
        encoder.end_chunk(&out);
        out.extend_from_slice(&encoder.finish());
        out
    }

    fn put(main: i64) -> Rev {
        Rev {
            main,
            sub: 0,
            tombstone: false,
        }
    }

    /// Kubernetes-style keys share long prefixes: the last key's shared
    /// length exceeds the bytes left after it, and must still decode.
    #[test]
    fn keys_with_long_shared_prefixes_round_trip() {
        let mut index = KeyIndex::default();
        let keys = [
            "/registry/pods/default/web-0",
            "/registry/pods/default/web-1",
            "/registry/pods/kube-system/coredns-7db6d8ff4d-abcde",
            "/registry/pods/kube-system/coredns-7db6d8ff4d-abcdf",
        ];
        for (i, k) in keys.iter().enumerate() {
            let main = 2 + i as i64;
            index.push(k.as_bytes(), put(main), Some(Generation::created_at(main)));
        }
        let bytes = encode(&index, plan(5));
        let decoded = decode(&bytes).unwrap();
        assert_eq!(decoded.plan, plan(5));
        assert_eq!(decoded.index.first_difference(&index), None);
        assert_eq!(decoded.index.len(), keys.len());
    }

    /// Events newer than the plan's revision stay out, and so does the
    /// newest event's generation when that event is left out.
    #[test]
    fn a_checkpoint_holds_the_index_as_it_stood_at_its_revision() {
        let mut index = KeyIndex::default();
        index.push(b"a", put(2), Some(Generation::created_at(2)));
        index.push(b"b", put(3), Some(Generation::created_at(3)));
        index.push(b"a", put(4), Some(Generation::created_at(2).next()));
        let decoded = decode(&encode(&index, plan(3))).unwrap();
        let mut at_3 = KeyIndex::default();
        at_3.push(b"a", put(2), None);
        at_3.push(b"b", put(3), None);
        assert_eq!(decoded.index.first_difference(&at_3), None);
        assert_eq!(decoded.index.newest(b"a", 5), Newest::Unknown);
        assert_eq!(
            decoded.index.newest(b"b", 5),
            Newest::Put(Generation::created_at(3))
        );
    }

    /// A small file whose keys reuse one long prefix many times is refused
    /// before it makes the decoder hold far more than the file.
    #[test]
    fn shared_prefixes_cannot_blow_up_memory() {
        let mut index = KeyIndex::default();
        let long = vec![b'x'; 64 << 10];
        for i in 0..600i64 {
            let mut key = long.clone();
            key.extend_from_slice(format!("{i:05}").as_bytes());
            index.push(&key, put(2 + i), None);
        }
        let bytes = encode(&index, plan(700));
        assert!(bytes.len() < 128 << 10, "{} bytes", bytes.len());
        assert!(matches!(decode(&bytes), Err(CheckpointError::Damaged(_))));
    }
}
