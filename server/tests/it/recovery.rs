//! Start-up recovery of the real binary: a torn WAL tail is cut and the
//! member serves; damage in the middle of the log stops it with a message
//! naming the file and offset, and leaves the files as they were.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::support::Server;

fn segments(data: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data.join("member/wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    v.sort();
    v
}

fn write_some(s: &Server, prefix: &str, n: usize) {
    let mut c = s.conn();
    for i in 0..n {
        let r = c
            .request(
                "PUT",
                &format!("/{prefix}/{i}"),
                format!("value-{i}").as_bytes(),
            )
            .unwrap();
        assert_eq!(r.status, 204);
    }
}

#[test]
fn torn_tail_is_cut_and_the_member_serves() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("m");
    let mut s = Server::start(&data, &["--wal-segment-bytes", "65536"]);
    write_some(&s, "a", 50);
    s.kill9();
    // Garbage right after the last frame: a group commit torn by the crash.
    let last = segments(&data).pop().unwrap();
    let bytes = std::fs::read(&last).unwrap();
    let end = bytes.iter().rposition(|b| *b != 0).unwrap() + 1;
    let at = end.div_ceil(8) * 8;
    let mut f = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
    f.seek(SeekFrom::Start(at as u64)).unwrap();
    f.write_all(&[0x40, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3])
        .unwrap();
    drop(f);
    s.restart();
    assert!(s.log_text().contains("cut a torn tail"), "{}", s.log_text());
    let mut c = s.conn();
    for i in 0..50 {
        let r = c.request("GET", &format!("/a/{i}"), b"").unwrap();
        assert_eq!(r.text(), format!("value-{i}"));
    }
    write_some(&s, "b", 5);
}

#[test]
fn corruption_in_the_middle_refuses_to_start_and_names_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("m");
    let mut s = Server::start(&data, &[]);
    write_some(&s, "a", 30);
    s.kill9();
    let first = segments(&data).remove(0);
    let before = std::fs::read(&first).unwrap();
    // Inside the first frame's payload; valid frames follow it.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .unwrap();
    f.seek(SeekFrom::Start(20)).unwrap();
    f.write_all(&[before[20] ^ 0x01]).unwrap();
    drop(f);
    let out = crate::support::run_metcd_to_exit(&data);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&first.display().to_string()), "{err}");
    assert!(err.contains("at offset 0"), "{err}");
    assert!(err.contains("corrupt wal"), "{err}");
    // Evidence is kept: nothing was truncated.
    assert_eq!(
        std::fs::metadata(&first).unwrap().len(),
        before.len() as u64
    );
}

#[test]
fn restart_after_segment_release_recovers_from_snapshot_and_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("m");
    let mut s = Server::start(
        &data,
        &["--snapshot-count", "200", "--wal-segment-bytes", "65536"],
    );
    write_some(&s, "a", 1200);
    // Wait (bounded) for a release in the log and for the files to go: they
    // are deleted off the commit loop, just after the log line. Checkpoints
    // run at the lowest CPU priority: on a machine busy with other tests
    // one took 4.4 s (as wait_for_checkpoint_after, allow a minute).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let first_is_gone = || {
        !segments(&data)[0]
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("0000000000000000-")
    };
    while !(s.log_text().contains("released 1 WAL") || s.log_text().contains("released 2 WAL"))
        || !first_is_gone()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the first segment was not released: {:?}\n{}",
            segments(&data),
            s.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    s.restart();
    let mut c = s.conn();
    for i in (0..1200).step_by(7) {
        let r = c.request("GET", &format!("/a/{i}"), b"").unwrap();
        assert_eq!((r.status, r.text()), (200, format!("value-{i}")));
    }
    let r = c.request("GET", "/a/?prefix&count_only", b"").unwrap();
    assert_eq!(r.json()["count"], "1200");
}

fn put_values(s: &Server, keys: impl Iterator<Item = String>, value: &[u8]) {
    let mut c = s.conn();
    for key in keys {
        let r = c.request("PUT", &key, value).unwrap();
        assert_eq!(r.status, 204, "{key}: {}", r.text());
    }
}

/// The memory engine rewrites the whole store only in a full checkpoint;
/// small writes to a large store are checkpointed as deltas of what they
/// changed every `--snapshot-count` entries, and the store is not
/// rewritten for them. Enough log growth still brings a full checkpoint,
/// and a restart recovers from both.
#[test]
fn a_memory_store_is_checkpointed_no_faster_than_its_log_grows() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("m");
    let mut s = Server::start(&data, &["--snapshot-count", "50"]);
    let big = vec![b'b'; 8000];
    // ~2.4 MB of store in 300 entries: checkpoints as the store grows.
    put_values(&s, (0..300).map(|i| format!("/big/{i}")), &big);
    // A few small writes: the next checkpoint covers the last big ones.
    put_values(&s, (0..60).map(|i| format!("/small/{}", i % 5)), b"v");
    s.wait_for_checkpoint_after(305, "after the fill");
    let snap_dir = data.join("member").join("snap");
    let files = |suffix: &str| -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = std::fs::read_dir(&snap_dir)
            .unwrap()
            .filter_map(|f| f.ok())
            .filter(|f| f.file_name().to_string_lossy().ends_with(suffix))
            .map(|f| {
                (
                    f.file_name().to_string_lossy().into_owned(),
                    f.metadata().unwrap().len(),
                )
            })
            .collect();
        out.sort();
        out
    };
    let bases_before = files(".snap");
    let deltas_before = files(".delta");

    // 500 small writes (~60 KB of log): checkpoints every 50 entries, each
    // a delta of a few small keys; the 2.4 MB base is not written again.
    put_values(&s, (0..500).map(|i| format!("/small/{}", i % 5)), b"v");
    s.wait_for_checkpoint_after(805, "during the small writes");
    assert_eq!(
        files(".snap"),
        bases_before,
        "the store was rewritten for 60 KB of log"
    );
    let deltas: Vec<(String, u64)> = files(".delta")
        .into_iter()
        .filter(|d| !deltas_before.contains(d))
        .collect();
    assert!(deltas.len() >= 5, "{deltas:?}:\n{}", s.log_text());
    for (name, len) in &deltas {
        assert!(*len < 64 << 10, "{name} is {len} bytes");
    }

    // Overwriting the store once more (~3.2 MB of log) must checkpoint.
    let newer = vec![b'n'; 8000];
    put_values(&s, (0..300).map(|i| format!("/big/{i}")), &newer);
    put_values(&s, (0..100).map(|i| format!("/big/{i}")), &newer);
    s.wait_for_checkpoint_after(1205, "after the log outgrew the store");

    s.restart();
    let mut c = s.conn();
    for i in (0..300).step_by(13) {
        let r = c.request("GET", &format!("/big/{i}"), b"").unwrap();
        assert_eq!((r.status, r.text().into_bytes()), (200, newer.clone()));
    }
    for i in 0..5 {
        let r = c.request("GET", &format!("/small/{i}"), b"").unwrap();
        assert_eq!((r.status, r.text()), (200, "v".to_owned()));
    }
}
