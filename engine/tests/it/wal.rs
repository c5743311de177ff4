//! WAL recovery: group-committed frames survive, torn tails are cut,
//! damage in the middle is refused with file and offset, released segments
//! are not needed to recover.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use engine::wal::{self, Wal, WalOptions};
use engine::Error;

fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(move || async move { f() })
        .unwrap()
        .join()
        .unwrap()
}

fn run_async<T, Fut>(f: impl FnOnce() -> Fut + Send + 'static) -> T
where
    T: Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

fn entry(i: u64) -> Vec<u8> {
    format!("entry-{i:06}-{}", "x".repeat((i % 50) as usize)).into_bytes()
}

/// Writes `batches` group commits of `per_batch` entries each, starting after
/// whatever `dir` already holds; returns the last index written.
fn write_batches(dir: &Path, opts: WalOptions, batches: u64, per_batch: u64) -> u64 {
    let dir = dir.to_path_buf();
    run_async(move || async move {
        let recovered = wal::recover(&dir).unwrap();
        let mut w = Wal::open(&dir, opts, &recovered).await.unwrap();
        let mut index = recovered.last_index();
        for _ in 0..batches {
            for _ in 0..per_batch {
                index += 1;
                w.append_entry(index, &entry(index));
            }
            w.append_state(format!("state-{index}").as_bytes());
            w.sync().await.unwrap();
        }
        w.close().await.unwrap();
        index
    })
}

fn small_segments() -> WalOptions {
    WalOptions {
        segment_bytes: 8 << 10,
        preallocate: true,
        ..WalOptions::default()
    }
}

fn assert_entries(recovered: &wal::Recovered, first: u64, last: u64) {
    let indices: Vec<u64> = recovered.entries.iter().map(|(i, _)| *i).collect();
    let expected: Vec<u64> = (first..=last).collect();
    assert_eq!(indices, expected);
    for (i, data) in &recovered.entries {
        assert_eq!(data, &Bytes::from(entry(*i)), "entry {i}");
    }
}

fn last_segment(dir: &Path) -> PathBuf {
    wal::list_segments(dir)
        .unwrap()
        .last()
        .unwrap()
        .path
        .clone()
}

/// Offsets of every frame in a segment (frames start 8-aligned).
fn frame_offsets(path: &Path) -> Vec<u64> {
    let data = std::fs::read(path).unwrap();
    let mut offsets = Vec::new();
    let mut pos = 0usize;
    while pos + 8 <= data.len() {
        let len = u32::from_le_bytes(data[pos..pos + 4].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        offsets.push(pos as u64);
        pos += (8 + len).div_ceil(8) * 8;
    }
    offsets
}

#[test]
fn group_commits_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let last = write_batches(dir.path(), WalOptions::default(), 20, 7);
    assert_eq!(last, 140);
    let recovered = wal::recover(dir.path()).unwrap();
    assert_entries(&recovered, 1, 140);
    assert_eq!(recovered.state.as_deref(), Some(&b"state-140"[..]));
    assert!(recovered.truncated.is_none());
    // A second session appends after the first.
    let last = write_batches(dir.path(), WalOptions::default(), 3, 5);
    assert_eq!(last, 155);
    let recovered = wal::recover(dir.path()).unwrap();
    assert_entries(&recovered, 1, 155);
    assert_eq!(recovered.segments.len(), 2);
}

#[test]
fn fdatasync_mode_survives_reopen_too() {
    let dir = tempfile::tempdir().unwrap();
    let opts = WalOptions {
        dsync: false,
        ..small_segments()
    };
    let last = write_batches(dir.path(), opts.clone(), 40, 5);
    let recovered = wal::recover(dir.path()).unwrap();
    assert_entries(&recovered, 1, last);
    assert!(recovered.segments.len() > 1);
}

/// A follower that installs a leader's snapshot ahead of its own log
/// records the marker past its last entry; the log then continues after
/// the snapshot, across a reopen.
#[test]
fn snapshot_marker_ahead_of_the_log_restarts_it() {
    let dir = tempfile::tempdir().unwrap();
    let last = write_batches(dir.path(), WalOptions::default(), 1, 5);
    assert_eq!(last, 5);
    let d = dir.path().to_path_buf();
    run_async(move || async move {
        let recovered = wal::recover(&d).unwrap();
        let mut w = Wal::open(&d, WalOptions::default(), &recovered)
            .await
            .unwrap();
        w.append_snapshot(100, b"meta-100");
        w.sync().await.unwrap();
        assert_eq!(w.last_index(), 100);
        w.close().await.unwrap();
    });
    let recovered = wal::recover(dir.path()).unwrap();
    assert_eq!(recovered.last_index(), 100);
    assert!(
        recovered.entries.is_empty(),
        "entries below the snapshot are covered"
    );
    let last = write_batches(dir.path(), WalOptions::default(), 2, 3);
    assert_eq!(last, 106);
    let recovered = wal::recover(dir.path()).unwrap();
    assert_entries(&recovered, 101, 106);
    assert_eq!(recovered.snapshot.as_ref().map(|(i, _)| *i), Some(100));
}

#[test]
fn torn_tail_is_truncated_and_earlier_frames_kept() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(dir.path(), WalOptions::default(), 10, 4);
    let seg = last_segment(dir.path());
    let offsets = frame_offsets(&seg);
    let last_frame = *offsets.last().unwrap();
    // Tear the last frame: keep its header and half of its payload, and
    // leave garbage where the rest would be.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .unwrap();
    f.seek(SeekFrom::Start(last_frame + 24)).unwrap();
    f.write_all(&[0xAB; 40]).unwrap();
    drop(f);
    let recovered = wal::recover(dir.path()).unwrap();
    // The last frame held entries 37..=40.
    assert_entries(&recovered, 1, 36);
    assert_eq!(recovered.state.as_deref(), Some(&b"state-36"[..]));
    let (path, offset) = recovered.truncated.clone().unwrap();
    assert_eq!(path, seg);
    assert_eq!(offset, last_frame);
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), last_frame);
    // The log keeps working: append, reopen, everything is there and the
    // truncated segment, now an older one, reads clean.
    let last = write_batches(dir.path(), WalOptions::default(), 2, 3);
    assert_eq!(last, 42);
    let recovered = wal::recover(dir.path()).unwrap();
    assert_entries(&recovered, 1, 42);
    assert!(recovered.truncated.is_none());
}

#[test]
fn file_cut_mid_frame_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(
        dir.path(),
        WalOptions {
            preallocate: false,
            ..WalOptions::default()
        },
        5,
        3,
    );
    let seg = last_segment(dir.path());
    let offsets = frame_offsets(&seg);
    let last_frame = *offsets.last().unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(last_frame + 13).unwrap();
    drop(f);
    let recovered = wal::recover(dir.path()).unwrap();
    assert_entries(&recovered, 1, 12);
    assert_eq!(recovered.truncated.unwrap().1, last_frame);
}

#[test]
fn flipped_bit_in_a_middle_frame_is_refused_with_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(dir.path(), WalOptions::default(), 10, 4);
    let seg = last_segment(dir.path());
    let offsets = frame_offsets(&seg);
    let victim = offsets[4];
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .unwrap();
    let mut byte = [0u8; 1];
    f.seek(SeekFrom::Start(victim + 20)).unwrap();
    f.read_exact(&mut byte).unwrap();
    byte[0] ^= 0x10;
    f.seek(SeekFrom::Start(victim + 20)).unwrap();
    f.write_all(&byte).unwrap();
    drop(f);
    let size_before = std::fs::metadata(&seg).unwrap().len();
    match wal::recover(dir.path()) {
        Err(Error::Corrupt { path, offset, .. }) => {
            assert_eq!(path, seg);
            assert_eq!(offset, victim);
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    let message = wal::recover(dir.path()).unwrap_err().to_string();
    assert!(message.contains(&seg.display().to_string()), "{message}");
    assert!(message.contains(&format!("offset {victim}")), "{message}");
    // Refusing must not destroy evidence.
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), size_before);
}

#[test]
fn zeroed_middle_frame_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(dir.path(), WalOptions::default(), 6, 2);
    let seg = last_segment(dir.path());
    let offsets = frame_offsets(&seg);
    let victim = offsets[2];
    let mut f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.seek(SeekFrom::Start(victim)).unwrap();
    f.write_all(&[0u8; 16]).unwrap();
    drop(f);
    assert!(matches!(
        wal::recover(dir.path()),
        Err(Error::Corrupt { offset, .. }) if offset == victim
    ));
}

#[test]
fn damage_in_an_older_segment_is_never_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(dir.path(), small_segments(), 100, 10);
    let segments = wal::list_segments(dir.path()).unwrap();
    assert!(segments.len() > 3, "{} segments", segments.len());
    let older = &segments[1].path;
    let offsets = frame_offsets(older);
    let last_frame = *offsets.last().unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(older).unwrap();
    f.seek(SeekFrom::Start(last_frame + 30)).unwrap();
    f.write_all(b"garbage!").unwrap();
    drop(f);
    assert!(matches!(
        wal::recover(dir.path()),
        Err(Error::Corrupt { path, .. }) if &path == older
    ));
}

#[test]
fn released_segments_are_not_needed_after_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let (released, segments_before) = run_async(move || async move {
        let recovered = wal::recover(&path).unwrap();
        let mut w = Wal::open(&path, small_segments(), &recovered)
            .await
            .unwrap();
        for index in 1..=1500u64 {
            w.append_entry(index, &entry(index));
            if index % 10 == 0 {
                w.append_state(format!("state-{index}").as_bytes());
                w.sync().await.unwrap();
            }
        }
        let before = w.segments().count();
        w.append_snapshot(1250, b"snap-meta-1250");
        w.sync().await.unwrap();
        let released = w.release_through(1250);
        assert_eq!(
            w.settle_unlinks().await,
            0,
            "every released segment unlinked"
        );
        w.close().await.unwrap();
        (released, before)
    });
    assert!(segments_before > 3);
    assert!(
        released > 0 && released < segments_before,
        "released {released} of {segments_before}"
    );
    let recovered = wal::recover(dir.path()).unwrap();
    assert_eq!(recovered.segments.len(), segments_before - released);
    assert_eq!(
        recovered.snapshot,
        Some((1250, Bytes::from_static(b"snap-meta-1250")))
    );
    assert_entries(&recovered, 1251, 1500);
    assert_eq!(recovered.state.as_deref(), Some(&b"state-1500"[..]));
    // Nothing past the snapshot was released: the oldest kept segment starts
    // at or below 1251.
    assert!(recovered.segments[0].first_index <= 1251);
}

#[test]
fn later_entries_replace_a_conflicting_suffix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run_async(move || async move {
        let recovered = wal::recover(&path).unwrap();
        let mut w = Wal::open(&path, WalOptions::default(), &recovered)
            .await
            .unwrap();
        for index in 1..=10u64 {
            w.append_entry(index, b"old");
        }
        w.sync().await.unwrap();
        w.append_entry(6, b"new");
        w.append_entry(7, b"new");
        w.sync().await.unwrap();
        w.close().await.unwrap();
    });
    let recovered = wal::recover(dir.path()).unwrap();
    let got: Vec<(u64, &[u8])> = recovered
        .entries
        .iter()
        .map(|(i, d)| (*i, &d[..]))
        .collect();
    let mut expected: Vec<(u64, &[u8])> = (1..=5).map(|i| (i, &b"old"[..])).collect();
    expected.push((6, b"new"));
    expected.push((7, b"new"));
    assert_eq!(got, expected);
}

#[test]
fn empty_directory_recovers_to_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let recovered = run(move || wal::recover(&dir.path().join("missing")).unwrap());
    assert!(recovered.entries.is_empty());
    assert_eq!(recovered.last_index(), 0);
}

#[test]
fn a_gap_in_entry_indices_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run_async(move || async move {
        let recovered = wal::recover(&path).unwrap();
        let mut w = Wal::open(&path, WalOptions::default(), &recovered)
            .await
            .unwrap();
        for index in [1u64, 2, 3, 5] {
            w.append_entry(index, b"e");
            w.sync().await.unwrap();
        }
        w.close().await.unwrap();
    });
    let err = wal::recover(dir.path()).unwrap_err().to_string();
    assert!(err.contains("jumps from 3 to 5"), "{err}");
}

#[test]
fn garbage_after_the_end_of_an_older_segment_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(dir.path(), small_segments(), 100, 10);
    let segments = wal::list_segments(dir.path()).unwrap();
    let older = &segments[0].path;
    // Past the last frame, where only zeros belong: not a valid frame, but
    // not nothing either.
    let bytes = std::fs::read(older).unwrap();
    let end = bytes.iter().rposition(|b| *b != 0).unwrap() + 1;
    let at = end.div_ceil(8) * 8 + 64;
    assert!(at + 11 < bytes.len(), "the segment should have a zero tail");
    let mut f = std::fs::OpenOptions::new().write(true).open(older).unwrap();
    f.seek(SeekFrom::Start(at as u64)).unwrap();
    f.write_all(b"stray bytes").unwrap();
    drop(f);
    assert!(matches!(
        wal::recover(dir.path()),
        Err(Error::Corrupt { path, .. }) if &path == older
    ));
}

/// Files of `dir` whose names end with `suffix`.
fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    found.sort();
    found
}

fn inode(path: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap())
}

/// A restart does not zero-fill a segment of its own when the last run
/// left one ready: the spare (kept by a close, as by a crash) becomes the
/// first segment the next run writes, and the log reads the same.
#[test]
fn a_spare_left_by_the_last_run_becomes_the_next_segment() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("wal");
    write_batches(&dir, small_segments(), 2, 3);
    let spares = files_ending(&dir, ".wal.spare");
    assert_eq!(spares.len(), 1, "one spare kept: {spares:?}");
    assert_eq!(std::fs::metadata(&spares[0]).unwrap().len(), 8 << 10);
    // A second name keeps the inode from being reused by a new file if
    // the spare were deleted.
    std::fs::hard_link(&spares[0], root.path().join("held")).unwrap();
    let spare = inode(&spares[0]);
    let last = write_batches(&dir, small_segments(), 2, 3);
    let recovered = wal::recover(&dir).unwrap();
    assert_entries(&recovered, 1, last);
    assert_eq!(recovered.segments.len(), 2);
    assert_eq!(
        inode(&recovered.segments[1].path),
        spare,
        "the second run wrote into the first run's spare"
    );
}

/// A spare cut short (not the segment size) or still being prepared when
/// the last run died is deleted, never written into.
#[test]
fn an_incomplete_spare_is_deleted_not_used() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(dir.path(), small_segments(), 2, 3);
    let spares = files_ending(dir.path(), ".wal.spare");
    assert_eq!(spares.len(), 1);
    // Marked so that a file written into would show: (inode numbers do
    // not tell, a deleted file's is reused at once).
    let mark = [0xa5u8; 64];
    std::fs::write(&spares[0], mark.repeat(4096 / 64)).unwrap();
    let preparing = dir.path().join("00000000000000ff.wal.preparing");
    std::fs::write(&preparing, mark.repeat((8 << 10) / 64)).unwrap();
    let last = write_batches(dir.path(), small_segments(), 2, 3);
    assert!(files_ending(dir.path(), ".wal.preparing").is_empty());
    // The second run's segment was prepared whole, zero-filled (read
    // before recovery cuts its zero tail).
    let segments = wal::list_segments(dir.path()).unwrap();
    assert_eq!(segments.len(), 2);
    let second = std::fs::read(&segments[1].path).unwrap();
    assert_eq!(second.len(), 8 << 10);
    assert!(
        !second.windows(mark.len()).any(|w| w == mark),
        "the second run wrote into a file that was not a complete spare"
    );
    let recovered = wal::recover(dir.path()).unwrap();
    assert_entries(&recovered, 1, last);
}

/// The newest state and marker live on in every segment's first frame: a
/// state written once, before segments that were since released, is
/// still recovered.
#[test]
fn a_state_written_before_released_segments_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let released = run_async(move || async move {
        let recovered = wal::recover(&path).unwrap();
        let mut w = Wal::open(&path, small_segments(), &recovered)
            .await
            .unwrap();
        w.append_state(b"the one state");
        for index in 1..=600u64 {
            w.append_entry(index, &entry(index));
            if index % 10 == 0 {
                w.sync().await.unwrap();
            }
        }
        w.append_snapshot(500, b"snap-meta-500");
        w.sync().await.unwrap();
        let released = w.release_through(500);
        assert_eq!(w.settle_unlinks().await, 0);
        w.close().await.unwrap();
        released
    });
    assert!(released > 1, "released {released} segments");
    let recovered = wal::recover(dir.path()).unwrap();
    assert_eq!(recovered.state.as_deref(), Some(&b"the one state"[..]));
    assert_eq!(
        recovered.snapshot,
        Some((500, Bytes::from_static(b"snap-meta-500")))
    );
    assert_entries(&recovered, 501, 600);
}
