//! Leases survive kill -9 and restart: the lease, its granted TTL and its
//! attached keys come back, it gets a full TTL again (etcd's Promote), and it
//! still expires afterwards, deleting its keys.

use std::time::{Duration, Instant};

use crate::etcd_peer::etcdctl;
use crate::support::Server;

fn ok(endpoint: &str, args: &[&str]) -> String {
    let out = etcdctl(endpoint, args);
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn leases_survive_kill9_and_still_expire() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(&dir.path().join("m"), &[]);
    let e = s.client_endpoint();
    // "lease 694d77aa9e3c7a05 granted with TTL(4s)"
    let granted = ok(&e, &["lease", "grant", "4"]);
    let id = granted.split_whitespace().nth(1).unwrap().to_string();
    ok(&e, &["put", "held", "v", &format!("--lease={id}")]);
    let long = ok(&e, &["lease", "grant", "600"]);
    let long_id = long.split_whitespace().nth(1).unwrap().to_string();
    ok(&e, &["put", "kept", "v", &format!("--lease={long_id}")]);

    s.kill9();
    s.restart();
    let e = s.client_endpoint();
    let ttl = ok(&e, &["lease", "timetolive", &long_id, "--keys"]);
    assert!(ttl.contains("granted with TTL(600s)"), "{ttl}");
    assert!(ttl.contains("attached keys([kept])"), "{ttl}");
    let list = ok(&e, &["lease", "list"]);
    assert!(list.contains(&id) && list.contains(&long_id), "{list}");

    // The short lease expires after the restart and takes its key along.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = ok(&e, &["get", "held"]);
        if got.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "lease {id} never expired after restart"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ttl = ok(&e, &["lease", "timetolive", &id]);
    assert!(ttl.contains("already expired"), "{ttl}");
    assert_eq!(ok(&e, &["get", "kept", "--print-value-only"]), "v\n");
}
