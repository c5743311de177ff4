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

/// etcdctl's `lock` and `elect` (clientv3/concurrency: leases, create-
/// revision txns, watches) work against metcd: two holders of one lock never
/// overlap, and an election has one leader that observers see.
#[test]
fn etcdctl_lock_is_exclusive_and_elect_reports_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    let e = s.client_endpoint();
    let spans: Vec<(u128, u128)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let e = e.clone();
                scope.spawn(move || {
                    let out = crate::etcd_peer::etcdctl_with(
                        &e,
                        &["--command-timeout=20s"],
                        &[
                            "lock",
                            "the-lock",
                            "--",
                            "sh",
                            "-c",
                            "date +%s%N; sleep 0.5; date +%s%N",
                        ],
                        None,
                    );
                    assert!(
                        out.status.success(),
                        "{}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    let text = String::from_utf8_lossy(&out.stdout).into_owned();
                    let stamps: Vec<u128> =
                        text.lines().filter_map(|l| l.trim().parse().ok()).collect();
                    assert_eq!(stamps.len(), 2, "{text}");
                    (stamps[0], stamps[1])
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (a, b) = (spans[0], spans[1]);
    assert!(
        a.1 <= b.0 || b.1 <= a.0,
        "lock holders overlapped: {a:?} {b:?}"
    );

    std::thread::scope(|scope| {
        let e2 = e.clone();
        let candidate = scope.spawn(move || {
            let mut cmd = std::process::Command::new("etcdctl");
            cmd.env("ETCDCTL_API", "3")
                .arg(format!("--endpoints={e2}"))
                .args(["elect", "the-election", "alice"]);
            crate::etcd_peer::run_bounded(cmd, None, Duration::from_secs(3))
        });
        std::thread::sleep(Duration::from_millis(1000));
        // An observer (`--listen` never exits by itself) sees the leader.
        let mut cmd = std::process::Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={e}"))
            .args(["elect", "--listen", "the-election"]);
        let observed = crate::etcd_peer::run_bounded(cmd, None, Duration::from_millis(1500));
        let seen = String::from_utf8_lossy(&observed.stdout);
        assert!(seen.contains("alice"), "observer saw no leader: {seen}");
        let out = candidate.join().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("alice"), "candidate did not win: {text}");
    });
}
