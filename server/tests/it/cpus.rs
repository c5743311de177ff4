//! Members choose their cores: shards are pinned only to CPUs of `--cpus`
//! or, without it, of the affinity the process inherited (`taskset`,
//! systemd's `CPUAffinity=`: operator.rs checks that one); a set smaller
//! than `--shards` is refused; the owner shard can leave every client
//! connection to the others.
//! Checked where an operator would look: each shard thread's
//! `Cpus_allowed_list` in `/proc/<pid>/task/*/status`, the listening
//! sockets in `/proc/net/tcp`.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{free_port, run_metcd_to_exit_with, Server};

/// The CPUs this test process may run on (as `taskset -p` shows them).
fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    server::config::parse_cpu_list(&list).unwrap()
}

/// `Cpus_allowed_list` of every shard executor thread of `pid`, by shard
/// (glommio names them `metcd-shard-<shard>-<executor id>`), once `shards`
/// of them exist (bounded wait).
fn shard_affinities(pid: u32, shards: usize) -> Vec<(usize, String)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut found = Vec::new();
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                let Some(rest) = comm.trim().strip_prefix("metcd-shard-") else {
                    continue;
                };
                let Some(shard) = rest.split('-').next().and_then(|s| s.parse().ok()) else {
                    continue;
                };
                let status =
                    std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
                if let Some(list) = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                {
                    found.push((shard, list.trim().to_string()));
                }
            }
        }
        found.sort();
        found.dedup_by_key(|(shard, _)| *shard);
        if found.len() >= shards {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "{shards} shard threads never appeared: {found:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn cpus_chooses_the_cores_in_order() {
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        eprintln!("one CPU here: only the refusals are checked");
        return;
    }
    // The two last CPUs in reverse order of preference is not expressible
    // in taskset syntax; the list is ascending, shard i on the i-th.
    let (a, b) = (cpus[cpus.len() - 2], cpus[cpus.len() - 1]);
    let list = format!("{a},{b}");
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &["--shards", "2", "--cpus", &list]);
    let pinned = shard_affinities(s.pid().unwrap(), 2);
    assert_eq!(pinned, vec![(0, a.to_string()), (1, b.to_string())]);
}

#[test]
fn a_cpu_set_smaller_than_the_shards_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cpus = allowed_cpus();
    let first = cpus[0].to_string();
    // Through --cpus.
    let out = run_metcd_to_exit_with(&dir.path().join("a"), &["--shards", "2", "--cpus", &first]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "--shards 2 needs 2 CPUs, but the CPU set has 1 ({first})"
        )),
        "{err}"
    );
    // Through the inherited affinity.
    let out = Command::new("taskset")
        .args(["-c", &first])
        .arg(env!("CARGO_BIN_EXE_metcd"))
        .arg("--data-dir")
        .arg(dir.path().join("b"))
        .arg("--listen-http-urls")
        .arg(format!("http://127.0.0.1:{}", free_port()))
        .args(["--shards", "2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--shards 2 needs 2 CPUs"), "{err}");
    // A CPU outside what the process may use, and a malformed list.
    let beyond = (cpus[cpus.len() - 1] + 1).to_string();
    let out = run_metcd_to_exit_with(&dir.path().join("c"), &["--shards", "1", "--cpus", &beyond]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("CPU {beyond} is not one this process may run on")),
        "{err}"
    );
    let out = run_metcd_to_exit_with(&dir.path().join("d"), &["--cpus", "3-1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cpus"));
    // The owner alone cannot leave the clients to nobody.
    let out = run_metcd_to_exit_with(
        &dir.path().join("e"),
        &["--shards", "1", "--owner-accepts-clients", "false"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--owner-accepts-clients false needs --shards 2"),
        "{err}"
    );
}

/// Listening TCP sockets on `port` (one per shard that accepts, with
/// SO_REUSEPORT).
fn listeners_on(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.get(1).is_some_and(|a| a.ends_with(&local)) && cols.get(3) == Some(&"0A")
        })
        .count()
}

#[test]
fn an_owner_that_accepts_no_clients_leaves_them_to_the_other_shards() {
    let dir = tempfile::tempdir().unwrap();
    let both = Server::start(&dir.path().join("both"), &["--shards", "2"]);
    assert_eq!(listeners_on(both.client_port), 2);
    assert_eq!(listeners_on(both.port), 2);
    drop(both);
    let s = Server::start(
        &dir.path().join("one"),
        &["--shards", "2", "--owner-accepts-clients", "false"],
    );
    assert_eq!(listeners_on(s.client_port), 1, "the gRPC port");
    assert_eq!(listeners_on(s.port), 1, "the HTTP API's port");
    // Every connection lands on shard 1 and is served there.
    for i in 0..20 {
        let mut c = s.conn();
        let key = format!("/k{i}");
        assert_eq!(c.request("PUT", &key, b"v").unwrap().status, 204);
        let got = c.request("GET", &key, b"").unwrap();
        assert_eq!(got.status, 200);
        assert_eq!(got.text(), "v");
    }
}
