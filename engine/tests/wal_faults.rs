//! The WAL's disk faults (the failpoints the fault suite arms through
//! `FAILPOINTS`): a full disk, a torn write and a failed fsync each fail
//! the group commit, poison the WAL (no retry, fsyncgate), and leave a log
//! that recovers every frame synced before, continues after a reopen, and
//! never holds half a frame.
//!
//! Its own test binary: failpoints are process-wide.

#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use engine::wal::{self, Wal, WalOptions};
use engine::Error;
use fail::FailScenario;

fn entry(i: u64) -> Vec<u8> {
    format!("entry-{i:06}-{}", "y".repeat((i % 40) as usize)).into_bytes()
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

/// Syncs `synced` frames of 3 entries, then one more frame with `point`
/// armed; returns the failure's text and what the second sync said.
fn fail_a_commit(
    dir: &std::path::Path,
    point: &'static str,
    action: &'static str,
) -> (String, bool) {
    let dir = dir.to_path_buf();
    run_async(move || async move {
        let recovered = wal::recover(&dir).unwrap();
        let mut w = Wal::open(&dir, WalOptions::default(), &recovered)
            .await
            .unwrap();
        for index in 1..=15u64 {
            w.append_entry(index, &entry(index));
            if index % 3 == 0 {
                w.sync().await.unwrap();
            }
        }
        fail::cfg(point, action).unwrap();
        for index in 16..=18u64 {
            w.append_entry(index, &entry(index));
        }
        let err = w.sync().await.unwrap_err().to_string();
        fail::remove(point);
        let poisoned = matches!(w.sync().await, Err(Error::Poisoned(_)));
        (err, poisoned)
    })
}

fn entries(recovered: &wal::Recovered) -> Vec<u64> {
    recovered.entries.iter().map(|(i, _)| *i).collect()
}

fn check(point: &'static str, action: &'static str, says: &str, failed_frame_kept: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (err, poisoned) = fail_a_commit(dir.path(), point, action);
    assert!(err.contains(says), "{point}={action}: {err}");
    assert!(
        poisoned,
        "{point}={action}: a failed commit must poison the WAL"
    );

    let recovered = wal::recover(dir.path()).unwrap();
    let last = if failed_frame_kept { 18 } else { 15 };
    if action == "return(torn)" {
        assert!(recovered.truncated.is_some(), "the torn frame is cut");
    }
    assert_eq!(
        entries(&recovered),
        (1..=last).collect::<Vec<u64>>(),
        "{point}={action}"
    );
    for (i, data) in &recovered.entries {
        assert_eq!(data, &Bytes::from(entry(*i)));
    }
    // Reopened, the log goes on from what it kept.
    let dir2 = dir.path().to_path_buf();
    run_async(move || async move {
        let recovered = wal::recover(&dir2).unwrap();
        let mut w = Wal::open(&dir2, WalOptions::default(), &recovered)
            .await
            .unwrap();
        w.append_entry(last + 1, &entry(last + 1));
        w.sync().await.unwrap();
        w.close().await.unwrap();
    });
    let recovered = wal::recover(dir.path()).unwrap();
    assert_eq!(entries(&recovered), (1..=last + 1).collect::<Vec<u64>>());
    assert!(recovered.truncated.is_none());
}

#[test]
fn disk_faults_fail_the_commit_poison_the_wal_and_recover_clean() {
    let scenario = FailScenario::setup();
    // A full disk: nothing of the frame written.
    check(
        "wal::write",
        "return(enospc)",
        "No space left on device",
        false,
    );
    // A torn write: the frame's second half never reached the disk; the
    // next start cuts it as a torn tail.
    check("wal::write", "return(torn)", "injected torn write", false);
    // The frame was written but its sync failed: it may come back (it was
    // never acknowledged, so either way is right); here the write landed.
    check("wal::fdatasync", "return", "Input/output error", true);
    scenario.teardown();
}
