//! End to end: the real `metcd` server on free loopback ports with a temp
//! data dir, loaded by the real `metcd-bench` binary; the keys a `put` run
//! wrote are then read back with a `range` run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BENCH: &str = env!("CARGO_BIN_EXE_metcd-bench");

/// The metcd binary beside metcd-bench. `cargo test --workspace` (the
/// README's test command) builds it before any test runs; a nested cargo
/// build here could wait forever on the outer cargo's lock, so a missing
/// binary is an error that says what to run.
fn metcd_binary() -> PathBuf {
    let path = Path::new(BENCH).with_file_name("metcd");
    assert!(
        path.exists(),
        "{} is missing: run the workspace tests (./scripts/test) or `cargo build -p server` first",
        path.display()
    );
    path
}

/// Two distinct free loopback ports: both are held while the second is
/// chosen, so the kernel cannot hand out the same one twice.
fn two_free_ports() -> (u16, u16) {
    let first = TcpListener::bind("127.0.0.1:0").unwrap();
    let second = TcpListener::bind("127.0.0.1:0").unwrap();
    (
        first.local_addr().unwrap().port(),
        second.local_addr().unwrap().port(),
    )
}

/// Kills the server when the test ends, passing or panicking.
struct Server {
    child: Child,
    grpc: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET `path` over HTTP/1.1; the status code, if any answer came.
fn http_get_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).ok()?;
    let text = std::str::from_utf8(&head[..n]).ok()?;
    text.split(' ').nth(1)?.parse().ok()
}

fn start_server() -> Server {
    let bin = metcd_binary();
    let dir = tempfile::tempdir().unwrap();
    let (grpc, http) = two_free_ports();
    let log = dir.path().join("metcd.log");
    let child = Command::new(bin)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args([
            "--listen-client-urls",
            &format!("http://127.0.0.1:{grpc}"),
            "--listen-http-urls",
            &format!("http://127.0.0.1:{http}"),
            "--shards",
            "1",
        ])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.path().join("metcd.err")).unwrap())
        .spawn()
        .expect("start metcd");
    let server = Server {
        child,
        grpc,
        log,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if TcpStream::connect(("127.0.0.1", grpc)).is_ok()
            && http_get_status(http, "/health") == Some(200)
        {
            return server;
        }
        assert!(
            Instant::now() < deadline,
            "metcd did not come up in 30 s; log at {}",
            server.log.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs metcd-bench with `args`; its JSON reports (one per line).
fn bench_json(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(BENCH)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run metcd-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "metcd-bench {args:?} failed: {stdout}\n{stderr}"
    );
    stdout
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}\n{stderr}"))
        })
        .collect()
}

#[test]
fn put_then_range_reads_the_written_keys() {
    let server = start_server();
    let endpoint = format!("127.0.0.1:{}", server.grpc);

    let reports = bench_json(&[
        "put",
        "--endpoints",
        &endpoint,
        "--total",
        "500",
        "--duration",
        "60",
        "--clients",
        "10",
        "--conns",
        "2",
        "--sequential-keys",
        "--key-space-size",
        "500",
        "--output",
        "json",
    ]);
    assert_eq!(reports.len(), 1, "{reports:?}");
    let put = &reports[0];
    assert_eq!(put["name"], "put conns=2 clients=10");
    let (ops, errors) = (
        put["ops"].as_u64().unwrap(),
        put["errors"].as_u64().unwrap(),
    );
    assert_eq!(ops + errors, 500, "{put}");
    assert_eq!(errors, 0, "{put}");
    for field in [
        "seconds",
        "ops_per_sec",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "p999_ms",
        "max_ms",
    ] {
        assert!(put[field].as_f64().is_some(), "{field} missing in {put}");
    }

    // Sequential keys 0..500 of width 8: exactly 00000000..00000499.
    let reports = bench_json(&[
        "range",
        "--endpoint",
        &endpoint,
        "--key",
        "00000000",
        "--end",
        "99999999",
        "--total",
        "1",
        "--output",
        "json",
    ]);
    let range = &reports[0];
    assert_eq!(range["ops"], 1, "{range}");
    assert_eq!(range["errors"], 0, "{range}");
    assert_eq!(range["counters"]["kvs"], 500, "{range}");

    for key in ["00000000", "00000499"] {
        let reports = bench_json(&[
            "range",
            "--endpoints",
            &endpoint,
            "--key",
            key,
            "--total",
            "1",
            "--output",
            "json",
        ]);
        assert_eq!(reports[0]["counters"]["kvs"], 1, "{key}: {}", reports[0]);
    }
    let reports = bench_json(&[
        "range",
        "--endpoints",
        &endpoint,
        "--key",
        "00000500",
        "--total",
        "1",
        "--output",
        "json",
    ]);
    assert_eq!(reports[0]["counters"]["kvs"], 0, "{}", reports[0]);

    // Kubernetes' paged LIST of the same keys: 500 in pages of 64 is seven
    // full pages and one of 52; with values, 256 bytes each.
    let listed = bench_text(&[
        "list",
        "--endpoint",
        &endpoint,
        "--prefix",
        "0000",
        "--limit",
        "64",
    ]);
    assert!(
        listed.contains("list: 500 keys (0.1 MiB of values) in 8 pages at revision 501 in "),
        "{listed}"
    );
    let listed = bench_text(&[
        "list",
        "--endpoint",
        &endpoint,
        "--limit",
        "499",
        "--keys-only",
        "--consistency",
        "s",
    ]);
    assert!(
        listed.contains("list: 500 keys (0.0 MiB of values) in 2 pages at revision 501 in "),
        "{listed}"
    );
    let listed = bench_text(&[
        "list",
        "--endpoint",
        &endpoint,
        "--limit",
        "100",
        "--max-pages",
        "3",
    ]);
    assert!(
        listed.contains("list: 300 keys (0.1 MiB of values) in 3 pages at revision 501 (stopped at --max-pages) in "),
        "{listed}"
    );
}

/// Runs metcd-bench with `args`; its standard output.
fn bench_text(args: &[&str]) -> String {
    let out = Command::new(BENCH)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run metcd-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "metcd-bench {args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
