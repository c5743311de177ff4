//! python-etcd3 (Debian's python3-etcd3, on Debian's /usr/bin/python3)
//! against metcd, and the same script against real etcd 3.4 so the
//! script's expectations are etcd's, not ours.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::etcd_peer::{require_etcd, run_bounded, RealEtcd};
use crate::support::Server;

const PYTHON: &str = "/usr/bin/python3";

const KV: &str = "kv_etcd3.py";
const LEASE_WATCH_LOCK: &str = "lease_watch_etcd3.py";
const RANGE_STREAM: &str = "range_stream.py";

fn run_script(name: &str, endpoint: &str) -> (bool, String) {
    assert!(
        Path::new(PYTHON).exists(),
        "{PYTHON} is missing: run ./scripts/test, which installs python3-etcd3"
    );
    let (host, port) = endpoint.rsplit_once(':').unwrap();
    let mut cmd = Command::new(PYTHON);
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(name);
    cmd.arg(script).arg(host).arg(port);
    let out = run_bounded(cmd, None, Duration::from_secs(60));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn python_etcd3_kv_against_metcd() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    let (ok, out) = run_script(KV, &s.client_endpoint());
    assert!(
        ok,
        "python etcd3 against metcd failed:\n{out}\nmetcd log:\n{}",
        s.log_text()
    );
    assert!(out.contains("all checks passed"), "{out}");
}

#[test]
fn python_etcd3_leases_watch_and_lock_against_metcd() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    let (ok, out) = run_script(LEASE_WATCH_LOCK, &s.client_endpoint());
    assert!(
        ok,
        "python etcd3 leases/watch/lock against metcd failed:\n{out}\nmetcd log:\n{}",
        s.log_text()
    );
    assert!(out.contains("all checks passed"), "{out}");
}

#[test]
fn python_etcd3_scripts_hold_against_real_etcd() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let etcd = RealEtcd::start(dir.path());
    for script in [KV, LEASE_WATCH_LOCK] {
        let (ok, out) = run_script(script, &etcd.endpoint);
        assert!(
            ok,
            "{script}: the script's expectations are not etcd's:\n{out}"
        );
    }
}

/// metcd's RangeStream (no etcd 3.4 counterpart to compare with).
#[test]
fn range_stream_chunks_at_one_revision() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    let (ok, out) = run_script(RANGE_STREAM, &s.client_endpoint());
    assert!(
        ok,
        "RangeStream failed:\n{out}\nmetcd log:\n{}",
        s.log_text()
    );
}
