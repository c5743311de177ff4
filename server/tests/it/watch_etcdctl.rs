//! `etcdctl watch` against metcd and against real etcd 3.4, outputs
//! compared: history replay from a revision, prefixes, prev_kv, JSON
//! output, live events, and the compacted-revision cancel.

use std::time::Duration;

use crate::etcd_peer::{etcdctl, etcdctl_with, require_etcd, RealEtcd};
use crate::etcdctl::{normalize_text, Metcd};

/// Runs `etcdctl watch ...` for `for_how_long`, then kills it and returns
/// its normalised stdout and stderr.
fn watch(endpoint: &str, args: &[&str], for_how_long: Duration) -> (String, String) {
    let mut cmd = std::process::Command::new("etcdctl");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ETCDCTL") {
            cmd.env_remove(k);
        }
    }
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("watch")
        .args(args);
    let out = crate::etcd_peer::run_bounded(cmd, None, for_how_long);
    let stderr = String::from_utf8_lossy(&out.stderr)
        .lines()
        // run_bounded notes the kill; the client's own log lines carry times.
        .filter(|l| !l.contains("killed after") && !l.starts_with('{'))
        .collect::<Vec<_>>()
        .join("\n");
    (
        normalize_text(&String::from_utf8_lossy(&out.stdout), endpoint),
        normalize_text(&stderr, endpoint),
    )
}

fn history(endpoint: &str) {
    for args in [
        &["put", "a", "1"][..],
        &["put", "b", "2"],
        &["put", "a", "3"],
        &["del", "a"],
        &["put", "ab", "4"],
        &["put", "c", "5"],
    ] {
        let out = etcdctl(endpoint, args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn watch_matches_etcd() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let etcd = RealEtcd::start(dir.path());
    let metcd = Metcd::start(dir.path());
    let endpoints = [etcd.endpoint.clone(), metcd.server.client_endpoint()];
    for e in &endpoints {
        history(e);
    }
    let short = Duration::from_millis(1500);
    for args in [
        &["a", "--rev", "1"][..],
        &["a", "--rev", "2", "--prev-kv"],
        &["--prefix", "a", "--rev", "1"],
        &["--prefix", "", "--rev", "3", "-w", "json"],
        &["b", "c", "--rev", "1"],
        &["--prefix", "a", "--rev", "1", "--prev-kv", "-w", "json"],
    ] {
        let got: Vec<(String, String)> = endpoints.iter().map(|e| watch(e, args, short)).collect();
        assert!(
            !got[0].0.is_empty(),
            "etcd printed nothing for watch {args:?}"
        );
        assert_eq!(
            got[1], got[0],
            "watch {args:?}: metcd (right) differs from etcd (left)"
        );
    }

    // Live events: a watcher started first sees puts made afterwards.
    let live: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = endpoints
            .iter()
            .map(|e| {
                s.spawn(move || {
                    watch(
                        e,
                        &["--prefix", "live/", "--prev-kv"],
                        Duration::from_secs(3),
                    )
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1200));
        for e in &endpoints {
            for args in [
                &["put", "live/x", "1"][..],
                &["put", "live/x", "2"],
                &["del", "live/x"],
            ] {
                assert!(etcdctl(e, args).status.success());
            }
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        live[0].0.contains("live/x"),
        "etcd saw no live event: {:?}",
        live[0]
    );
    assert_eq!(
        live[1], live[0],
        "live watch: metcd (right) differs from etcd (left)"
    );

    // A watch from a compacted revision is cancelled, as etcd does it.
    for e in &endpoints {
        let out = etcdctl_with(e, &[], &["compaction", "5"], None);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let got: Vec<(String, String)> = endpoints
        .iter()
        .map(|e| watch(e, &["a", "--rev", "2"], short))
        .collect();
    assert!(
        got[0].1.contains("compacted") || got[0].0.contains("compacted"),
        "etcd: {:?}",
        got[0]
    );
    assert_eq!(
        got[1], got[0],
        "compacted watch: metcd (right) differs from etcd (left)"
    );
}

/// `etcdctl watch` asks for a leader (`hasleader` metadata, clientv3's
/// `WithRequireLeader`, as Kubernetes' watches do). When the member loses
/// its leader (here: a voter that never starts is added to a one-member
/// cluster, so there is no quorum), a running watch is cancelled with
/// `etcdserver: no leader` after a few election timeouts, and a new one is
/// refused at once; both exactly as etcd does.
#[test]
fn watch_ends_when_the_member_loses_its_leader_as_etcd() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let etcd = RealEtcd::start(dir.path());
    let metcd = Metcd::start(dir.path());
    let endpoints = [etcd.endpoint.clone(), metcd.server.client_endpoint()];
    let never_started = format!(
        "--peer-urls=http://127.0.0.1:{}",
        crate::support::free_port()
    );
    // Far longer than the member needs to notice (1 s election timeout,
    // then three checks a timeout apart): a watch still running at the
    // end was killed, not cancelled.
    let bound = Duration::from_secs(20);
    let running: Vec<(String, String, Duration)> = std::thread::scope(|s| {
        let handles: Vec<_> = endpoints
            .iter()
            .map(|e| {
                s.spawn(move || {
                    let started = std::time::Instant::now();
                    let (out, err) = watch(e, &["w"], bound);
                    (out, err, started.elapsed())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1200));
        for e in &endpoints {
            assert!(etcdctl(e, &["put", "w", "1"]).status.success());
            let out = etcdctl(e, &["member", "add", "never", &never_started]);
            assert!(
                out.status.success(),
                "member add on {e}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((out, err, took), server) in running.iter().zip(["etcd", "metcd"]) {
        assert!(
            *took < bound,
            "{server}: the watch was not cancelled within {bound:?}: {out} {err}"
        );
        assert!(
            out.contains("watch was canceled (etcdserver: no leader)")
                || err.contains("watch was canceled (etcdserver: no leader)"),
            "{server}: {out:?} {err:?}"
        );
    }
    assert_eq!(
        (&running[1].0, &running[1].1),
        (&running[0].0, &running[0].1),
        "cancelled watch: metcd (right) differs from etcd (left)"
    );
    // A new watch is refused at once.
    let fresh: Vec<(String, String)> = endpoints
        .iter()
        .map(|e| watch(e, &["w", "--rev", "1"], Duration::from_secs(5)))
        .collect();
    assert!(
        fresh[0].0.contains("etcdserver: no leader")
            || fresh[0].1.contains("etcdserver: no leader"),
        "etcd: {:?}",
        fresh[0]
    );
    assert_eq!(
        fresh[1], fresh[0],
        "watch without a leader: metcd (right) differs from etcd (left)"
    );
}
