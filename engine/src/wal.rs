//! The write-ahead log: segmented files of checksummed frames, written with
//! direct I/O through io_uring, one `fdatasync` per group commit.
//!
//! The WAL owns durability of the replicated log. It knows three kinds of
//! records and nothing of what they mean: *entries* (an index plus opaque
//! bytes; a later entry at index `i` replaces `i` and everything after it, as
//! a Raft log does), *state* (an opaque blob; the newest one wins, e.g. Raft's
//! HardState) and *snapshot markers* (an index plus opaque metadata; entries
//! at or below the newest marker are no longer needed).
//!
//! # Byte format (all integers little-endian)
//!
//! A segment file is named `{seq:016x}-{first_index:016x}.wal` and holds
//! frames back to back, each starting at a multiple of 8 bytes:
//!
//! ```text
//! frame   = payload_len: u32 | crc: u32 | payload | zero pad to 8
//! crc     = crc32c(seq as u64 LE ++ payload)   (seq: this segment's number)
//! payload = record*
//! record  = kind: u8 | index: u64 | len: u32 | data[len]
//! ```
//!
//! Every *sync* writes exactly one frame, so a frame is the unit of group
//! commit and of tearing: a crash can only tear the last frame of the last
//! segment. The first frame of a segment holds a `Header` record
//! (`"METCDWAL"`, format version, seq, first index) followed by the newest
//! state and snapshot marker, so releasing older segments loses nothing.
//! Space after the last frame is zero (segments are preallocated, and a write
//! pads its last block with zeros).
//!
//! # Recovery rules
//!
//! Scanning stops at the first frame that is all zero or invalid (bad length,
//! implausible first record, or checksum). Entry indices must not jump
//! forward (a gap means lost entries). If any valid frame can still be found after that point, the
//! damage is in the middle of acknowledged data and recovery refuses to go
//! on, naming the file and offset. Otherwise, in the last segment, it is a
//! torn tail: the file is truncated there. A damaged frame in an older
//! segment is always corruption, because a segment is only closed after its
//! last frame was synced.
//!
//! # Must never
//!
//! Retry a failed `fdatasync`: a failure poisons the WAL (fsyncgate) and every
//! later call fails. Know what entries mean.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use bytes::{Buf, BufMut, Bytes};
use glommio::io::{Directory, DmaFile, OpenOptions};

use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"METCDWAL";
const FORMAT_VERSION: u32 = 1;
const FRAME_HEADER: usize = 8;
const FRAME_ALIGN: usize = 8;
const RECORD_HEADER: usize = 1 + 8 + 4;
/// Frames larger than this are refused when writing and treated as garbage
/// when reading: no legitimate group commit comes close.
pub const MAX_FRAME_BYTES: usize = 256 << 20;

const KIND_HEADER: u8 = 1;
const KIND_ENTRY: u8 = 2;
const KIND_STATE: u8 = 3;
const KIND_SNAPSHOT: u8 = 4;

/// Tunables of the WAL writer.
#[derive(Debug, Clone)]
pub struct WalOptions {
    /// A segment is closed and a new one started once it holds this much.
    pub segment_bytes: u64,
    /// Preallocate segments to `segment_bytes` *and write zeros through
    /// them*, so a sync overwrites already-written blocks and `fdatasync`
    /// has no metadata to journal (fallocate alone leaves unwritten extents
    /// whose conversion costs a journal commit on ext4: measured 3 ms vs
    /// 0.3 ms per sync). The next segment is prepared in the background.
    pub preallocate: bool,
    /// Write frames with O_DSYNC (one I/O per group commit, durable when it
    /// completes; FUA on devices that have it) instead of write + fdatasync.
    /// Only with `preallocate`: the writes then change no metadata.
    pub dsync: bool,
}

impl Default for WalOptions {
    fn default() -> Self {
        Self {
            segment_bytes: 64 << 20,
            preallocate: true,
            // Measured on this project's machines: one O_DSYNC write per
            // group commit instead of write + fdatasync took 1 writer from
            // 4,400 to 6,300 durable writes/s (docs/benchmarks.md).
            dsync: true,
        }
    }
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Entry { index: u64, data: Bytes },
    State(Bytes),
    Snapshot { index: u64, meta: Bytes },
}

/// A segment file on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub seq: u64,
    /// The index the first entry written to this segment was expected to have.
    pub first_index: u64,
    pub path: PathBuf,
}

/// What recovery found in a WAL directory.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Live entries in index order (conflicting suffixes already replaced),
    /// without those covered by the newest snapshot marker.
    pub entries: Vec<(u64, Bytes)>,
    pub state: Option<Bytes>,
    pub snapshot: Option<(u64, Bytes)>,
    pub segments: Vec<SegmentInfo>,
    /// Where a torn tail was cut off, if one was.
    pub truncated: Option<(PathBuf, u64)>,
}

impl Recovered {
    /// Adds the next record read back, in write order: an entry replaces a
    /// conflicting suffix, the newest state wins, a snapshot marker drops
    /// the entries it covers. Pure, so a simulated disk recovers through
    /// the same rules as the files do.
    pub fn add(&mut self, record: Record) -> std::result::Result<(), String> {
        match record {
            Record::Entry { index, data } => {
                // A Raft log replaces a conflicting suffix: index i overrides
                // i and everything after it.
                if let Some((last, _)) = self.entries.last() {
                    if index > *last + 1 {
                        return Err(format!(
                            "entry index jumps from {last} to {index}: entries are missing"
                        ));
                    }
                    if index <= *last {
                        let keep = self.entries.partition_point(|(i, _)| *i < index);
                        self.entries.truncate(keep);
                    }
                }
                self.entries.push((index, data));
            }
            Record::State(data) => self.state = Some(data),
            Record::Snapshot { index, meta } => {
                let newer = self.snapshot.as_ref().is_none_or(|(i, _)| index >= *i);
                if newer {
                    // A snapshot installed from a leader can be ahead of the
                    // whole log: every entry is then covered by it, and the
                    // log continues at index + 1.
                    if self.entries.last().is_some_and(|(last, _)| *last < index) {
                        self.entries.clear();
                    } else {
                        // Entries it covers are in the state machine: drop
                        // them now rather than hold every segment's.
                        let covered = self.entries.partition_point(|(i, _)| *i <= index);
                        self.entries.drain(..covered);
                    }
                    self.snapshot = Some((index, meta));
                }
            }
        }
        Ok(())
    }

    /// Index of the last entry, or of the snapshot marker if no entry follows it.
    pub fn last_index(&self) -> u64 {
        let snapshot = self.snapshot.as_ref().map_or(0, |(index, _)| *index);
        match self.entries.last() {
            Some((index, _)) => (*index).max(snapshot),
            None => snapshot,
        }
    }
}

/// How many of the oldest segments a durable snapshot marker at `index`
/// lets go: `first_indices` are the segments' first indices, oldest first,
/// the one being written last (never released). A segment goes when every
/// entry in it is at or below `index`, i.e. the next one starts at or below
/// `index + 1`. Pure, so the simulation releases by the same rule.
pub fn releasable_segments(first_indices: &[u64], index: u64) -> usize {
    first_indices
        .windows(2)
        .take_while(|pair| pair[1] <= index.saturating_add(1))
        .count()
}

fn segment_name(seq: u64, first_index: u64) -> String {
    format!("{seq:016x}-{first_index:016x}.wal")
}

fn parse_segment_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".wal")?;
    let (seq, first) = stem.split_once('-')?;
    if seq.len() != 16 || first.len() != 16 {
        return None;
    }
    Some((
        u64::from_str_radix(seq, 16).ok()?,
        u64::from_str_radix(first, 16).ok()?,
    ))
}

/// Lists the segments of `dir` in sequence order, checking there is no gap.
pub fn list_segments(dir: &Path) -> Result<Vec<SegmentInfo>> {
    let mut segments = Vec::new();
    let read_dir = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(segments),
        Err(e) => return Err(Error::io("read_dir", dir, e)),
    };
    for entry in read_dir {
        let entry = entry.map_err(|e| Error::io("read_dir", dir, e))?;
        let name = entry.file_name();
        if let Some((seq, first_index)) = name.to_str().and_then(parse_segment_name) {
            segments.push(SegmentInfo {
                seq,
                first_index,
                path: entry.path(),
            });
        }
    }
    segments.sort_by_key(|s| s.seq);
    for pair in segments.windows(2) {
        if pair[1].seq != pair[0].seq + 1 {
            return Err(Error::Corrupt {
                what: "wal",
                path: pair[1].path.clone(),
                offset: 0,
                reason: format!(
                    "segment sequence jumps from {:016x} to {:016x}: a segment is missing",
                    pair[0].seq, pair[1].seq
                ),
            });
        }
    }
    Ok(segments)
}

/// The frame checksum covers the segment's sequence number too, so a frame
/// copied from another segment (or embedded in a value) never validates.
fn crc(seq: u64, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&seq.to_le_bytes()), payload)
}

fn padded(len: usize) -> usize {
    len.div_ceil(FRAME_ALIGN) * FRAME_ALIGN
}

fn encode_record(out: &mut Vec<u8>, kind: u8, index: u64, data: &[u8]) {
    out.reserve(RECORD_HEADER + data.len());
    out.put_u8(kind);
    out.put_u64_le(index);
    // Callers bound record sizes far below 4 GiB (MAX_FRAME_BYTES).
    out.put_u32_le(data.len() as u32);
    out.extend_from_slice(data);
}

/// Parses the records of one frame payload. `None` if it is malformed.
fn decode_payload(payload: &Bytes) -> Option<Vec<(u8, u64, Bytes)>> {
    let mut records = Vec::new();
    let mut rest = payload.clone();
    while rest.has_remaining() {
        if rest.remaining() < RECORD_HEADER {
            return None;
        }
        let kind = rest.get_u8();
        let index = rest.get_u64_le();
        let len = rest.get_u32_le() as usize;
        if len > rest.remaining() || !(KIND_HEADER..=KIND_SNAPSHOT).contains(&kind) {
            return None;
        }
        records.push((kind, index, rest.split_to(len)));
    }
    Some(records)
}

/// Outcome of reading one frame at an offset.
enum FrameAt {
    /// A valid frame: its records and the offset just past it.
    Valid(Vec<(u8, u64, Bytes)>, usize),
    /// Zero header: nothing was ever written here.
    Zero,
    Invalid(&'static str),
}

fn frame_at(buf: &Bytes, pos: usize, seq: u64) -> FrameAt {
    if pos + FRAME_HEADER > buf.len() {
        return if buf[pos..].iter().all(|b| *b == 0) {
            FrameAt::Zero
        } else {
            FrameAt::Invalid("frame header cut short")
        };
    }
    let mut header = &buf[pos..pos + FRAME_HEADER];
    let len = header.get_u32_le() as usize;
    let sum = header.get_u32_le();
    if len == 0 && sum == 0 {
        return FrameAt::Zero;
    }
    if len == 0 || len > MAX_FRAME_BYTES || pos + FRAME_HEADER + len > buf.len() {
        return FrameAt::Invalid("frame length runs past the end of the file");
    }
    let payload = buf.slice(pos + FRAME_HEADER..pos + FRAME_HEADER + len);
    // Cheap plausibility before a checksum over up to the whole file: a
    // payload starts with a known record kind whose length fits.
    if len < RECORD_HEADER
        || !(KIND_HEADER..=KIND_SNAPSHOT).contains(&payload[0])
        || u32::from_le_bytes([payload[9], payload[10], payload[11], payload[12]]) as usize
            > len - RECORD_HEADER
    {
        return FrameAt::Invalid("frame payload does not start with a record");
    }
    if crc(seq, &payload) != sum {
        return FrameAt::Invalid("frame checksum mismatch");
    }
    match decode_payload(&payload) {
        Some(records) => FrameAt::Valid(records, pos + padded(FRAME_HEADER + len)),
        None => FrameAt::Invalid("malformed records in a frame with a valid checksum"),
    }
}

/// True if a valid frame starts anywhere at or after `from`.
fn valid_frame_after(buf: &Bytes, from: usize, seq: u64) -> Option<usize> {
    let mut pos = padded(from);
    while pos + FRAME_HEADER <= buf.len() {
        // A zero length word can never start a frame; skip cheaply.
        if buf[pos..pos + 4] != [0, 0, 0, 0] {
            if let FrameAt::Valid(..) = frame_at(buf, pos, seq) {
                return Some(pos);
            }
        }
        pos += FRAME_ALIGN;
    }
    None
}

fn corrupt(path: &Path, offset: usize, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        what: "wal",
        path: path.to_path_buf(),
        offset: offset as u64,
        reason: reason.into(),
    }
}

/// Reads every segment of `dir`, validating frames, and truncates a torn tail
/// of the last segment (with plain, synchronous I/O: it runs before serving).
///
/// Fails with [`Error::Corrupt`], naming the file and offset, on damage that
/// is not a torn tail.
pub fn recover(dir: &Path) -> Result<Recovered> {
    let segments = list_segments(dir)?;
    let mut out = Recovered::default();
    let last_seq = segments.last().map(|s| s.seq);
    for segment in &segments {
        let is_last = Some(segment.seq) == last_seq;
        // Mapped, not read: a preallocated segment is mostly zeros, and a
        // heap copy of each (64 MiB by default) would stay in the process's
        // resident memory after recovery (the allocator keeps freed pages).
        let buf = map_file(&segment.path)?;
        let mut pos = 0usize;
        let mut saw_header = false;
        let end = loop {
            if pos >= buf.len() {
                break pos;
            }
            match frame_at(&buf, pos, segment.seq) {
                FrameAt::Valid(records, next) => {
                    apply_records(&mut out, segment, pos, records, &mut saw_header)?;
                    pos = next;
                }
                end @ (FrameAt::Zero | FrameAt::Invalid(_)) => {
                    let why = match end {
                        FrameAt::Invalid(why) => why,
                        _ => "non-zero bytes after a zero frame header",
                    };
                    if let Some(found) = valid_frame_after(&buf, pos + FRAME_ALIGN, segment.seq) {
                        return Err(corrupt(
                            &segment.path,
                            pos,
                            format!("{why}, yet a valid frame follows at offset {found}"),
                        ));
                    }
                    let damaged =
                        matches!(end, FrameAt::Invalid(_)) || buf[pos..].iter().any(|b| *b != 0);
                    if damaged {
                        if !is_last {
                            return Err(corrupt(&segment.path, pos, why));
                        }
                        out.truncated = Some((segment.path.clone(), pos as u64));
                    }
                    break pos;
                }
            }
        };
        if !saw_header {
            if is_last {
                // Created but its first frame never reached the disk.
                std::fs::remove_file(&segment.path)
                    .map_err(|e| Error::io("remove", &segment.path, e))?;
                out.truncated = Some((segment.path.clone(), 0));
                continue;
            }
            return Err(corrupt(&segment.path, 0, "segment has no header frame"));
        }
        let mapped_len = buf.len();
        // Unmapped before the file shrinks under it (records were copied).
        drop(buf);
        if is_last && end < mapped_len {
            // Cut the torn frame and the zero tail, so this segment never
            // looks damaged once a newer segment follows it.
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&segment.path)
                .map_err(|e| Error::io("open", &segment.path, e))?;
            file.set_len(end as u64)
                .map_err(|e| Error::io("truncate", &segment.path, e))?;
            file.sync_all()
                .map_err(|e| Error::io("fsync", &segment.path, e))?;
        }
        out.segments.push(segment.clone());
    }
    if let Some((snap_index, _)) = &out.snapshot {
        let keep_from = out
            .entries
            .partition_point(|(index, _)| index <= snap_index);
        out.entries.drain(..keep_from);
    }
    Ok(out)
}

/// A read-only private mapping of a whole file, unmapped when dropped.
struct MappedFile {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only (PROT_READ, MAP_PRIVATE) and owned by
// this value alone; shared `&[u8]` views of it are sound from any thread.
unsafe impl Send for MappedFile {}
// SAFETY: as above: no one writes through the mapping.
unsafe impl Sync for MappedFile {}

impl AsRef<[u8]> for MappedFile {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes (len > 0, checked at
        // creation) until drop; recovery holds the data dir's lock, so no
        // other process truncates the file meanwhile, and recovery itself
        // truncates only after dropping the mapping.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `map_file`, once.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

/// The whole file at `path` as bytes backed by a private read-only mapping.
fn map_file(path: &Path) -> Result<Bytes> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).map_err(|e| Error::io("open", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io("stat", path, e))?
        .len() as usize;
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: a fresh read-only private mapping of an open file descriptor
    // (the mapping outlives the descriptor, as mmap(2) allows); checked
    // for failure below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(Error::io("mmap", path, std::io::Error::last_os_error()));
    }
    Ok(Bytes::from_owner(MappedFile { ptr, len }))
}

fn apply_records(
    out: &mut Recovered,
    segment: &SegmentInfo,
    frame_pos: usize,
    records: Vec<(u8, u64, Bytes)>,
    saw_header: &mut bool,
) -> Result<()> {
    for (kind, index, data) in records {
        // Own the record's bytes: a slice would keep its whole segment
        // buffer (up to a segment's size, 64 MiB by default) alive for as
        // long as any entry from it lives (raft's log keeps the tail).
        let data = if kind == KIND_HEADER {
            data
        } else {
            Bytes::copy_from_slice(&data)
        };
        match kind {
            KIND_HEADER => {
                check_header(&data, segment)
                    .map_err(|why| corrupt(&segment.path, frame_pos, why))?;
                *saw_header = true;
            }
            _ if !*saw_header => {
                return Err(corrupt(
                    &segment.path,
                    frame_pos,
                    "records before the segment header",
                ));
            }
            KIND_ENTRY => out
                .add(Record::Entry { index, data })
                .map_err(|why| corrupt(&segment.path, frame_pos, why))?,
            KIND_STATE => out
                .add(Record::State(data))
                .map_err(|why| corrupt(&segment.path, frame_pos, why))?,
            KIND_SNAPSHOT => out
                .add(Record::Snapshot { index, meta: data })
                .map_err(|why| corrupt(&segment.path, frame_pos, why))?,
            _ => {
                return Err(corrupt(
                    &segment.path,
                    frame_pos,
                    format!("unknown record kind {kind}"),
                ))
            }
        }
    }
    Ok(())
}

fn header_bytes(seq: u64, first_index: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(28);
    h.extend_from_slice(MAGIC);
    h.put_u32_le(FORMAT_VERSION);
    h.put_u64_le(seq);
    h.put_u64_le(first_index);
    h
}

fn check_header(data: &[u8], segment: &SegmentInfo) -> std::result::Result<(), String> {
    if data.len() != 28 || &data[..8] != MAGIC {
        return Err("bad segment magic".into());
    }
    let mut rest = &data[8..];
    let version = rest.get_u32_le();
    if version != FORMAT_VERSION {
        return Err(format!("unsupported WAL format version {version}"));
    }
    let seq = rest.get_u64_le();
    let first_index = rest.get_u64_le();
    if seq != segment.seq || first_index != segment.first_index {
        return Err(format!(
            "header says segment {seq:016x}-{first_index:016x}, file name disagrees"
        ));
    }
    Ok(())
}

/// The WAL writer. Owned by one task on one executor.
pub struct Wal {
    dir: PathBuf,
    opts: WalOptions,
    file: DmaFile,
    segment: SegmentInfo,
    /// Older segments still on disk, oldest first.
    closed: VecDeque<SegmentInfo>,
    /// Bytes of the current segment that hold frames.
    len: u64,
    /// The bytes between `align_down(len)` and `len`: the block we rewrite
    /// on the next sync, because direct I/O writes whole blocks.
    tail: Vec<u8>,
    /// Records appended since the last sync: the next frame's payload.
    pending: Vec<u8>,
    last_index: u64,
    last_state: Option<Bytes>,
    last_snapshot: Option<(u64, Bytes)>,
    poisoned: Option<String>,
    frame_count: u64,
    /// Frame bytes written since open (padding included).
    bytes_written: u64,
    /// The next segment's file, being zero-filled in the background.
    spare: Option<glommio::Task<Result<PreparedFile>>>,
    unlinker: std::rc::Rc<std::cell::RefCell<Unlinker>>,
}

/// Released segments waiting to be unlinked, oldest first. One task
/// unlinks them at a time, in order, so the segments on disk always stay
/// a contiguous run (recovery refuses a gap in their numbering); one that
/// fails to go stays first in line and is retried at the next release.
#[derive(Default)]
struct Unlinker {
    queue: VecDeque<PathBuf>,
    running: bool,
    failure: Option<String>,
}

/// Unlinks `paths` in order and syncs `dir`, stopping at the first
/// failure; answers how many went, and the failure.
fn unlink_in_order(dir: &Path, paths: &[PathBuf]) -> (usize, Option<String>) {
    for (done, path) in paths.iter().enumerate() {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return (done, Some(format!("remove {}: {e}", path.display()))),
        }
    }
    // Not needed for correctness (recovery reads past covered segments):
    // only makes the space's return prompt.
    let synced = crate::io::sync_dir(dir).err().map(|e| e.to_string());
    (paths.len(), synced)
}

/// A zero-filled file under a temporary name, ready to become a segment.
struct PreparedFile {
    file: DmaFile,
    path: PathBuf,
}

/// A segment file prepared ahead (preallocated, zero-filled and synced,
/// when [`WalOptions::preallocate`]); one left by the last run is the
/// first segment of the next.
const SPARE_SUFFIX: &str = ".wal.spare";
/// A spare being prepared: it takes the spare's name only once complete,
/// so a spare found at open never needs checking block by block.
const PREPARING_SUFFIX: &str = ".wal.preparing";

impl Wal {
    /// Opens the WAL for appending after [`recover`]: always starts a fresh
    /// segment, so no torn block is ever rewritten in place.
    pub async fn open(dir: &Path, opts: WalOptions, recovered: &Recovered) -> Result<Wal> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create_dir", dir, e))?;
        let seq = recovered.segments.last().map_or(0, |s| s.seq + 1);
        let last_index = recovered.last_index();
        // Zero-filling a segment takes ~0.1 s of a restart for 64 MiB.
        let prepared = match take_spare(dir, &opts).await? {
            Some(spare) => spare,
            None => prepare_file(dir.to_path_buf(), seq, opts.clone()).await?,
        };
        let (file, segment) = install_segment(dir, &opts, prepared, seq, last_index + 1).await?;
        let mut wal = Wal {
            dir: dir.to_path_buf(),
            opts,
            file,
            segment,
            closed: recovered.segments.iter().cloned().collect(),
            len: 0,
            tail: Vec::new(),
            pending: Vec::new(),
            last_index,
            last_state: recovered.state.clone(),
            last_snapshot: recovered.snapshot.clone(),
            poisoned: None,
            frame_count: 0,
            bytes_written: 0,
            spare: None,
            unlinker: Default::default(),
        };
        wal.start_spare();
        wal.begin_segment_frame();
        wal.sync().await?;
        Ok(wal)
    }

    fn begin_segment_frame(&mut self) {
        let header = header_bytes(self.segment.seq, self.segment.first_index);
        encode_record(&mut self.pending, KIND_HEADER, 0, &header);
        if let Some(state) = &self.last_state {
            encode_record(&mut self.pending, KIND_STATE, 0, state);
        }
        if let Some((index, meta)) = &self.last_snapshot {
            encode_record(&mut self.pending, KIND_SNAPSHOT, *index, meta);
        }
    }

    /// Queues an entry; durable after the next [`Wal::sync`].
    pub fn append_entry(&mut self, index: u64, data: &[u8]) {
        encode_record(&mut self.pending, KIND_ENTRY, index, data);
        self.last_index = index;
    }

    /// Queues a state blob (the newest synced one wins at recovery).
    pub fn append_state(&mut self, state: &[u8]) {
        encode_record(&mut self.pending, KIND_STATE, 0, state);
        self.last_state = Some(Bytes::copy_from_slice(state));
    }

    /// Queues a snapshot marker: entries up to `index` may be released.
    pub fn append_snapshot(&mut self, index: u64, meta: &[u8]) {
        encode_record(&mut self.pending, KIND_SNAPSHOT, index, meta);
        self.last_snapshot = Some((index, Bytes::copy_from_slice(meta)));
        // A snapshot from the leader may be ahead of this log.
        self.last_index = self.last_index.max(index);
    }

    /// Bytes queued for the next sync.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    /// Frames written since open (each one `fdatasync`).
    pub fn frames_written(&self) -> u64 {
        self.frame_count
    }

    /// Frame bytes written since open: how fast the log grows, which
    /// paces checkpoints that rewrite a whole store.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    pub fn segments(&self) -> impl Iterator<Item = &SegmentInfo> {
        self.closed.iter().chain(std::iter::once(&self.segment))
    }

    fn check_poisoned(&self) -> Result<()> {
        match &self.poisoned {
            Some(why) => Err(Error::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    /// Writes everything queued as one frame and `fdatasync`s it: the group
    /// commit. Rolls to a new segment when the current one is full.
    pub async fn sync(&mut self) -> Result<()> {
        self.check_poisoned()?;
        if self.pending.is_empty() {
            return Ok(());
        }
        if self.pending.len() > MAX_FRAME_BYTES {
            // The queued records already advanced `last_index` and friends:
            // dropping them would leave a hole, so this WAL is done.
            let why = format!(
                "wal frame of {} bytes exceeds the limit of {MAX_FRAME_BYTES}",
                self.pending.len()
            );
            self.poisoned = Some(why.clone());
            return Err(Error::Invalid(why));
        }
        if let Err(e) = self.write_frame().await {
            self.poisoned = Some(e.to_string());
            return Err(e);
        }
        if self.len >= self.opts.segment_bytes {
            if let Err(e) = self.roll().await {
                self.poisoned = Some(e.to_string());
                return Err(e);
            }
        }
        Ok(())
    }

    async fn write_frame(&mut self) -> Result<()> {
        let frame_len = padded(FRAME_HEADER + self.pending.len());
        let base = self.file.align_down(self.len);
        let in_block = (self.len - base) as usize;
        debug_assert_eq!(in_block, self.tail.len());
        let write_len = self.file.align_up((in_block + frame_len) as u64) as usize;
        let mut buf = self.file.alloc_dma_buffer(write_len);
        {
            let bytes = buf.as_bytes_mut();
            bytes[..in_block].copy_from_slice(&self.tail);
            let mut header = &mut bytes[in_block..in_block + FRAME_HEADER];
            header.put_u32_le(self.pending.len() as u32);
            header.put_u32_le(crc(self.segment.seq, &self.pending));
            let start = in_block + FRAME_HEADER;
            bytes[start..start + self.pending.len()].copy_from_slice(&self.pending);
            // Pool buffers are not zeroed; padding must be, so recovery sees
            // a zero header after the last frame.
            bytes[start + self.pending.len()..].fill(0);
        }
        let new_len = self.len + frame_len as u64;
        let new_base = self.file.align_down(new_len);
        let tail_start = (new_base - base) as usize;
        let tail_end = (new_len - base) as usize;
        self.tail.clear();
        self.tail
            .extend_from_slice(&buf.as_bytes()[tail_start..tail_end]);
        let path = self.segment.path.clone();
        // Disk faults for the fault suite (`FAILPOINTS=wal::write=return(enospc)`
        // or `return(torn)`): a full disk, or a torn write whose frame's
        // second half never reached the disk. Neither frame was synced, so
        // nothing acknowledged depends on it; the WAL is poisoned after.
        if let Some(kind) = fail::eval("wal::write", |kind| kind.unwrap_or_default()) {
            if kind == "torn" {
                let keep = in_block + FRAME_HEADER + self.pending.len() / 2;
                let mut torn = buf;
                torn.as_bytes_mut()[keep..].fill(0);
                let _ = self.file.write_at(torn, base).await;
                return Err(Error::io(
                    "write",
                    &path,
                    std::io::Error::other("injected torn write"),
                ));
            }
            return Err(Error::io(
                "write",
                &path,
                std::io::Error::from_raw_os_error(libc::ENOSPC),
            ));
        }
        let written = self
            .file
            .write_at(buf, base)
            .await
            .map_err(|e| Error::glommio("write", &path, e))?;
        if written != write_len {
            return Err(Error::io(
                "write",
                &path,
                std::io::Error::other(format!("short write: {written} of {write_len} bytes")),
            ));
        }
        // The frame's sync failing (with O_DSYNC the write is the sync).
        fail::fail_point!("wal::fdatasync", |_| Err(Error::io(
            "fdatasync",
            &path,
            std::io::Error::from_raw_os_error(libc::EIO),
        )));
        if !self.opts.dsync {
            self.file
                .fdatasync()
                .await
                .map_err(|e| Error::glommio("fdatasync", &path, e))?;
        }
        self.len = new_len;
        self.pending.clear();
        self.frame_count += 1;
        self.bytes_written += frame_len as u64;
        Ok(())
    }

    fn start_spare(&mut self) {
        let dir = self.dir.clone();
        let opts = self.opts.clone();
        let seq = self.segment.seq + 1;
        self.spare = Some(glommio::spawn_local(prepare_file(dir, seq, opts)));
    }

    async fn roll(&mut self) -> Result<()> {
        let seq = self.segment.seq + 1;
        let prepared = match self.spare.take() {
            Some(task) => task.await?,
            None => prepare_file(self.dir.clone(), seq, self.opts.clone()).await?,
        };
        let (file, segment) =
            install_segment(&self.dir, &self.opts, prepared, seq, self.last_index + 1).await?;
        let old_file = std::mem::replace(&mut self.file, file);
        let old_segment = std::mem::replace(&mut self.segment, segment);
        old_file
            .close()
            .await
            .map_err(|e| Error::glommio("close", &old_segment.path, e))?;
        self.closed.push_back(old_segment);
        self.len = 0;
        self.tail.clear();
        self.begin_segment_frame();
        self.write_frame().await?;
        self.start_spare();
        Ok(())
    }

    /// Releases every closed segment whose entries are all at or below
    /// `index` (covered by a durable snapshot marker); answers how many.
    /// Their files are unlinked by a task on a thread of its own: unlinking
    /// a 64 MiB preallocated segment holds the calling thread ~15 ms on
    /// ext4, which on a shard would stall every connection and the commit
    /// loop. A crash before the unlink leaves covered segments, which
    /// recovery reads past.
    pub fn release_through(&mut self, index: u64) -> usize {
        let first_indices: Vec<u64> = self
            .closed
            .iter()
            .chain(std::iter::once(&self.segment))
            .map(|s| s.first_index)
            .collect();
        let released = releasable_segments(&first_indices, index);
        let mut unlinker = self.unlinker.borrow_mut();
        for oldest in self.closed.drain(..released) {
            unlinker.queue.push_back(oldest.path);
        }
        let start = !unlinker.running && !unlinker.queue.is_empty();
        if start {
            unlinker.running = true;
        }
        drop(unlinker);
        if start {
            glommio::spawn_local(unlink_released(self.unlinker.clone(), self.dir.clone())).detach();
        }
        released
    }

    /// Why unlinking released segments last failed, once (they are retried
    /// at the next release).
    pub fn take_unlink_failure(&mut self) -> Option<String> {
        self.unlinker.borrow_mut().failure.take()
    }

    /// Waits until no released segment is being unlinked; answers how many
    /// wait for a retry.
    pub async fn settle_unlinks(&self) -> usize {
        while self.unlinker.borrow().running {
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
        }
        self.unlinker.borrow().queue.len()
    }

    /// Closes the current segment. A spare prepared meanwhile is kept
    /// for the next [`Wal::open`].
    pub async fn close(mut self) -> Result<()> {
        if let Some(task) = self.spare.take() {
            if let Ok(spare) = task.await {
                let _ = spare.file.close().await;
            }
        }
        let path = self.segment.path.clone();
        self.file
            .close()
            .await
            .map_err(|e| Error::glommio("close", &path, e))
    }
}

/// The unlink task of [`Wal::release_through`]: takes what is queued, in
/// order, until the queue is empty or an unlink fails.
async fn unlink_released(unlinker: std::rc::Rc<std::cell::RefCell<Unlinker>>, dir: PathBuf) {
    loop {
        let batch: Vec<PathBuf> = unlinker.borrow_mut().queue.drain(..).collect();
        if batch.is_empty() {
            break;
        }
        let outcome = crate::any::off_core(
            (dir.clone(), batch.clone()),
            crate::any::Urgency::Waited,
            |(dir, batch)| Ok(unlink_in_order(&dir, &batch)),
        )
        .await;
        let (done, failure) = match outcome {
            Ok(answer) => answer,
            Err(e) => (0, Some(e.to_string())),
        };
        if done < batch.len() {
            // Back at the front, before anything released meanwhile.
            let mut u = unlinker.borrow_mut();
            for path in batch[done..].iter().rev() {
                u.queue.push_front(path.clone());
            }
        }
        if let Some(why) = failure {
            unlinker.borrow_mut().failure = Some(why);
            if done < batch.len() {
                break;
            }
        }
    }
    unlinker.borrow_mut().running = false;
}

/// Creates `{seq}.wal.spare`, preallocated and zero-filled when
/// `opts.preallocate`, and synced so its blocks are written extents. It is
/// prepared as `{seq}.wal.preparing` and renamed when complete; the rename
/// needs no directory sync, since a lost one leaves a file that
/// [`take_spare`] deletes.
async fn prepare_file(dir: PathBuf, seq: u64, opts: WalOptions) -> Result<PreparedFile> {
    // Small, one at a time: every WAL fdatasync flushes the device cache and
    // waits for in-flight zero-fill writes, so keep them short.
    const ZERO_CHUNK: usize = 128 << 10;
    let path = dir.join(format!("{seq:016x}{PREPARING_SUFFIX}"));
    let file = OpenOptions::new()
        .write(true)
        .read(true)
        .create(true)
        .truncate(true)
        .dma_open(&path)
        .await
        .map_err(|e| Error::glommio("create", &path, e))?;
    if opts.preallocate {
        file.pre_allocate(opts.segment_bytes, false)
            .await
            .map_err(|e| Error::glommio("fallocate", &path, e))?;
        let total = file.align_up(opts.segment_bytes);
        let mut pos = 0u64;
        while pos < total {
            let len = ZERO_CHUNK.min((total - pos) as usize);
            let mut buf = file.alloc_dma_buffer(len);
            buf.as_bytes_mut().fill(0);
            file.write_at(buf, pos)
                .await
                .map_err(|e| Error::glommio("zero-fill", &path, e))?;
            pos += len as u64;
        }
        file.fdatasync()
            .await
            .map_err(|e| Error::glommio("fdatasync", &path, e))?;
    }
    let spare = dir.join(format!("{seq:016x}{SPARE_SUFFIX}"));
    file.rename(&spare)
        .await
        .map_err(|e| Error::glommio("rename", &path, e))?;
    Ok(PreparedFile { file, path: spare })
}

/// Gives a prepared file its segment name and makes the name durable.
async fn install_segment(
    dir: &Path,
    opts: &WalOptions,
    prepared: PreparedFile,
    seq: u64,
    first_index: u64,
) -> Result<(DmaFile, SegmentInfo)> {
    let path = dir.join(segment_name(seq, first_index));
    prepared
        .file
        .rename(&path)
        .await
        .map_err(|e| Error::glommio("rename", &prepared.path, e))?;
    sync_dir(dir).await?;
    let file = if opts.dsync && opts.preallocate {
        // Zero-filled with plain writes; appended to with O_DSYNC.
        let dsync = OpenOptions::new()
            .write(true)
            .read(true)
            .custom_flags(libc::O_DSYNC)
            .dma_open(&path)
            .await
            .map_err(|e| Error::glommio("open O_DSYNC", &path, e))?;
        let _ = prepared.file.close().await;
        dsync
    } else {
        prepared.file
    };
    Ok((
        file,
        SegmentInfo {
            seq,
            first_index,
            path,
        },
    ))
}

/// A complete spare left in `dir` by an earlier run, to be the next
/// segment: one that `opts` would have prepared (preallocated to the
/// segment size; never a file a write has touched, since a spare is
/// renamed to a segment, and the rename synced, before its first frame).
/// Every other spare, and every spare still being prepared, is deleted:
/// none is ever part of the log.
async fn take_spare(dir: &Path, opts: &WalOptions) -> Result<Option<PreparedFile>> {
    let read_dir = std::fs::read_dir(dir).map_err(|e| Error::io("read_dir", dir, e))?;
    let mut taken: Option<PreparedFile> = None;
    for entry in read_dir {
        let entry = entry.map_err(|e| Error::io("read_dir", dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.ends_with(SPARE_SUFFIX) && taken.is_none() && opts.preallocate {
            let file = OpenOptions::new()
                .write(true)
                .read(true)
                .dma_open(&path)
                .await
                .map_err(|e| Error::glommio("open spare", &path, e))?;
            let size = file
                .file_size()
                .await
                .map_err(|e| Error::glommio("stat spare", &path, e))?;
            if size == file.align_up(opts.segment_bytes) {
                taken = Some(PreparedFile { file, path });
                continue;
            }
            let _ = file.close().await;
        }
        if name.ends_with(SPARE_SUFFIX) || name.ends_with(PREPARING_SUFFIX) {
            std::fs::remove_file(&path).map_err(|e| Error::io("remove", &path, e))?;
        }
    }
    Ok(taken)
}

async fn sync_dir(dir: &Path) -> Result<()> {
    let d = Directory::open(dir)
        .await
        .map_err(|e| Error::glommio("open_dir", dir, e))?;
    d.sync()
        .await
        .map_err(|e| Error::glommio("fsync_dir", dir, e))?;
    d.close()
        .await
        .map_err(|e| Error::glommio("close_dir", dir, e))
}

/// Fuzzing: builds segment 1 (first index 1) in `dir` from `data` and
/// recovers it. The first byte's low bit puts a valid header record first;
/// the rest is cut into frames, each a length byte (× 4) and that many
/// payload bytes, framed with a valid length and checksum. A cut-short last
/// chunk is written raw, as a torn tail would be.
pub(crate) fn fuzz_recover(dir: &Path, data: &[u8]) -> Result<()> {
    const SEQ: u64 = 1;
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create dir", dir, e))?;
    let Some((&flags, mut rest)) = data.split_first() else {
        return Ok(());
    };
    let mut file = Vec::new();
    let frame = |file: &mut Vec<u8>, payload: &[u8]| {
        file.put_u32_le(payload.len() as u32);
        file.put_u32_le(crc(SEQ, payload));
        file.extend_from_slice(payload);
        file.resize(padded(file.len()), 0);
    };
    if flags & 1 == 1 {
        let mut payload = Vec::new();
        encode_record(&mut payload, KIND_HEADER, 0, &header_bytes(SEQ, 1));
        frame(&mut file, &payload);
    }
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len) * 4;
        if len > tail.len() {
            file.extend_from_slice(tail);
            break;
        }
        let (payload, next) = tail.split_at(len);
        frame(&mut file, payload);
        rest = next;
    }
    let path = dir.join(segment_name(SEQ, 1));
    std::fs::write(&path, &file).map_err(|e| Error::io("write", &path, e))?;
    recover(dir).map(|_| ())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_segment_goes_once_every_entry_in_it_is_covered() {
        // Segments starting at 1, 101, 201; the last is being written.
        let firsts = [1, 101, 201];
        assert_eq!(releasable_segments(&firsts, 0), 0);
        assert_eq!(
            releasable_segments(&firsts, 99),
            0,
            "entry 100 is not covered"
        );
        assert_eq!(releasable_segments(&firsts, 100), 1);
        assert_eq!(releasable_segments(&firsts, 199), 1);
        assert_eq!(releasable_segments(&firsts, 200), 2);
        assert_eq!(
            releasable_segments(&firsts, u64::MAX),
            2,
            "never the one being written"
        );
        assert_eq!(releasable_segments(&[7], 1000), 0);
        assert_eq!(releasable_segments(&[], 1000), 0);
    }

    #[test]
    fn segment_names_roundtrip() {
        let name = segment_name(3, 0x1234);
        assert_eq!(parse_segment_name(&name), Some((3, 0x1234)));
        assert_eq!(parse_segment_name("junk.wal"), None);
    }

    #[test]
    fn payload_rejects_truncated_record() {
        let mut p = Vec::new();
        encode_record(&mut p, KIND_ENTRY, 7, b"hello");
        let full = Bytes::from(p.clone());
        assert_eq!(decode_payload(&full).unwrap().len(), 1);
        let cut = Bytes::from(p[..p.len() - 1].to_vec());
        assert!(decode_payload(&cut).is_none());
    }
}
