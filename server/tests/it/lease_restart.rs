//! Leases survive kill -9 and restart: the lease, its granted TTL and its
//! attached keys come back, it gets a full TTL again (etcd's Promote), and it
//! still expires afterwards, deleting its keys.

use std::time::{Duration, Instant};

use crate::etcd_peer::etcdctl_ok as ok;
use crate::support::Server;

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

/// "lease 694d77aa9e3c7a05 granted with TTL(60s), remaining(57s)" -> 57.
fn remaining_secs(timetolive: &str) -> i64 {
    let at = timetolive.find("remaining(").expect(timetolive) + "remaining(".len();
    let rest = &timetolive[at..];
    rest[..rest.find('s').unwrap()].parse().unwrap()
}

/// etcd's `--experimental-enable-lease-checkpoint`: the remaining TTL goes
/// through the log, so a restarted member continues the countdown instead
/// of granting a full TTL again, and a keep-alive resets it to the full TTL.
#[test]
fn checkpointed_leases_keep_counting_down_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "--experimental-enable-lease-checkpoint",
        "--experimental-lease-checkpoint-interval",
        "1s",
    ];
    let mut s = Server::start(&dir.path().join("m"), &flags);
    let e = s.client_endpoint();
    let granted = ok(&e, &["lease", "grant", "60"]);
    let id = granted.split_whitespace().nth(1).unwrap().to_string();
    // Several checkpoints (one a second) while it counts down.
    std::thread::sleep(Duration::from_millis(4500));
    // From the restart on, no periodic checkpoint comes between a
    // keep-alive and the next restart: only its reset can explain a full
    // TTL then.
    for flag in s.extra.iter_mut().filter(|f| f.as_str() == "1s") {
        *flag = "1h".into();
    }
    s.kill9();
    s.restart();
    let e = s.client_endpoint();
    let left = remaining_secs(&ok(&e, &["lease", "timetolive", &id]));
    assert!(
        (50..=57).contains(&left),
        "remaining {left}s after the restart"
    );

    // A keep-alive gives the full TTL back, and that is what the next
    // restart starts from (the reset went through the log too).
    let kept = ok(&e, &["lease", "keep-alive", "--once", &id]);
    assert!(kept.contains("keepalived with TTL(60)"), "{kept}");
    std::thread::sleep(Duration::from_millis(300));
    s.kill9();
    s.restart();
    let e = s.client_endpoint();
    let left = remaining_secs(&ok(&e, &["lease", "timetolive", &id]));
    assert!(
        left >= 58,
        "remaining {left}s after a keep-alive and a restart"
    );
}

/// Without checkpoints a restarted member grants a full TTL (etcd's
/// Promote): the contrast the test above relies on.
#[test]
fn unchecked_leases_get_a_full_ttl_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(&dir.path().join("m"), &[]);
    let e = s.client_endpoint();
    let granted = ok(&e, &["lease", "grant", "60"]);
    let id = granted.split_whitespace().nth(1).unwrap().to_string();
    std::thread::sleep(Duration::from_millis(3000));
    s.kill9();
    s.restart();
    let left = remaining_secs(&ok(&s.client_endpoint(), &["lease", "timetolive", &id]));
    assert!(left >= 59, "remaining {left}s");
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
