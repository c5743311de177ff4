//! Nothing lost: run a bounded concurrent write load against the real
//! `metcd`, SIGKILL it mid-load, restart, and check every acknowledged write
//! is there with the revision it was acknowledged with. Several rounds, each
//! killing at a different point, all on the same data dir; small snapshot
//! count and WAL segments so snapshots and segment release happen mid-load.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{HttpConn, Server};

const WRITERS: usize = 16;
const MAX_WRITES_PER_WRITER: usize = 4000;

#[derive(Debug, Clone)]
struct Acked {
    value: String,
    revision: i64,
}

/// Runs writers until `stop` is set or each hit its bound; returns the
/// acknowledged writes.
fn write_load(
    addr: String,
    round: usize,
    stop: Arc<AtomicBool>,
    acked_count: Arc<AtomicUsize>,
) -> Vec<std::thread::JoinHandle<BTreeMap<String, Acked>>> {
    (0..WRITERS)
        .map(|w| {
            let addr = addr.clone();
            let stop = stop.clone();
            let acked_count = acked_count.clone();
            std::thread::spawn(move || {
                let mut acked = BTreeMap::new();
                let Ok(mut conn) = HttpConn::connect(&addr) else {
                    return acked;
                };
                for i in 0..MAX_WRITES_PER_WRITER {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    // Writers overwrite a few shared keys too, so the newest
                    // acknowledged revision must win after recovery.
                    let key = if i % 5 == 0 {
                        format!("/crash/shared/{}", i % 7)
                    } else {
                        format!("/crash/r{round}/w{w}/{i}")
                    };
                    let value = format!("r{round}-w{w}-i{i}-{}", "v".repeat(i % 64));
                    match conn.request("PUT", &key, value.as_bytes()) {
                        Ok(r) if r.status == 204 => {
                            let revision = r.header_i64("x-metcd-revision").unwrap();
                            acked.insert(key, Acked { value, revision });
                            acked_count.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => panic!("unexpected status {} for {key}: {}", r.status, r.text()),
                        // The server was killed: this write's fate is unknown.
                        Err(_) => break,
                    }
                }
                acked
            })
        })
        .collect()
}

#[test]
fn acknowledged_writes_survive_kill9() {
    writes_survive_kill9_with("memory");
}

#[test]
fn acknowledged_writes_survive_kill9_with_the_btree_engine() {
    writes_survive_kill9_with("btree");
}

#[test]
fn acknowledged_writes_survive_kill9_with_the_lsm_engine() {
    writes_survive_kill9_with("lsm");
}

/// Kills the member at several points of a bounded concurrent write load
/// and checks every acknowledged write after each restart, with `engine`.
fn writes_survive_kill9_with(engine: &str) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("member");
    let mut server = Server::start(
        &data,
        &[
            "--engine",
            engine,
            // A small cache: reads after restart go to the files.
            "--engine-cache-bytes",
            "2097152",
            "--shards",
            "2",
            "--snapshot-count",
            "500",
            "--wal-segment-bytes",
            "65536",
        ],
    );
    // key -> (value, revision) of the newest acknowledged write.
    let mut expected: BTreeMap<String, Acked> = BTreeMap::new();
    let kill_after = [300usize, 1500, 4000, 9000];
    // Memory engine checkpoints after its first are deltas (files
    // `<prev>-<index>.delta` beside the base): restarts read them back.
    let mut deltas_seen = 0;
    for (round, &kill_at) in kill_after.iter().enumerate() {
        let stop = Arc::new(AtomicBool::new(false));
        let acked_count = Arc::new(AtomicUsize::new(0));
        let writers = write_load(server.addr(), round, stop.clone(), acked_count.clone());
        let deadline = Instant::now() + Duration::from_secs(60);
        while acked_count.load(Ordering::Relaxed) < kill_at && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
            if let Ok(files) = std::fs::read_dir(data.join("member").join("snap")) {
                deltas_seen += files
                    .filter_map(|f| f.ok())
                    .filter(|f| f.file_name().to_string_lossy().ends_with(".delta"))
                    .count();
            }
        }
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        let mut round_acked: Vec<(String, Acked)> = Vec::new();
        for w in writers {
            round_acked.extend(w.join().unwrap());
        }
        assert!(
            round_acked.len() >= kill_at.min(100),
            "round {round}: only {} writes",
            round_acked.len()
        );
        // Shared keys: the highest acknowledged revision is the one that must win.
        round_acked.sort_by_key(|(_, a)| a.revision);
        for (k, a) in round_acked {
            expected.insert(k, a);
        }
        server.restart();
        verify(&server, &expected);
    }
    // After all that, the server still takes writes at a higher revision.
    let max_rev = expected.values().map(|a| a.revision).max().unwrap();
    let mut c = server.conn();
    let r = c.request("PUT", "/crash/after", b"x").unwrap();
    assert_eq!(r.status, 204);
    assert!(r.header_i64("x-metcd-revision").unwrap() > max_rev);
    let log = server.log_text();
    assert!(
        log.contains("snapshot at applied index"),
        "no snapshot happened:\n{log}"
    );
    if engine == "memory" {
        assert!(deltas_seen > 0, "no delta checkpoint was ever on disk");
    }
}

fn verify(server: &Server, expected: &BTreeMap<String, Acked>) {
    let mut conn = server.conn();
    let failures = Mutex::new(Vec::new());
    for (key, want) in expected {
        let r = conn.request("GET", key, b"").unwrap();
        if r.status != 200 {
            failures
                .lock()
                .unwrap()
                .push(format!("{key}: status {} ({})", r.status, r.text()));
            continue;
        }
        if r.body != want.value.as_bytes()
            && !(key.starts_with("/crash/shared/")
                && r.header_i64("x-metcd-mod-revision").unwrap_or(0) > want.revision)
        {
            failures.lock().unwrap().push(format!(
                "{key}: value {:?}, want {:?}",
                r.text(),
                want.value
            ));
        }
        let mod_rev = r.header_i64("x-metcd-mod-revision").unwrap();
        // A shared key may since hold a write that was applied but whose
        // acknowledgement was lost to the kill: newer is fine, older is not.
        let shared = key.starts_with("/crash/shared/");
        if shared && mod_rev > want.revision {
            continue;
        }
        if mod_rev != want.revision {
            failures.lock().unwrap().push(format!(
                "{key}: mod_revision {mod_rev}, acknowledged at {}",
                want.revision
            ));
        }
    }
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} acknowledged writes lost or wrong, e.g. {:?}",
        failures.len(),
        expected.len(),
        &failures[..failures.len().min(10)]
    );
}

/// A data dir remembers its engine: starting it with another one is refused
/// with a message naming both, and nothing in it is touched.
#[test]
fn a_data_dir_refuses_another_engine() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("member");
    let mut server = Server::start(&data, &["--engine", "memory"]);
    let mut c = server.conn();
    assert_eq!(c.request("PUT", "/kept", b"v").unwrap().status, 204);
    server.kill9();
    let mut other = Server::start_unchecked(&data, &["--engine", "lsm"]);
    let status = other
        .wait_exit(Duration::from_secs(30))
        .expect("metcd with the wrong engine kept running");
    assert!(!status.success());
    let log = other.log_text();
    assert!(
        log.contains("created with --engine memory") && log.contains("--engine is lsm"),
        "{log}"
    );
    let mut again = Server::start(&data, &["--engine", "memory"]);
    let r = again.conn().request("GET", "/kept", b"").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"v");
    again.kill9();
}
