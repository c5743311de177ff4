//! A real etcd 3.4 (`/usr/bin/etcd`) on loopback ports, and a bounded way to
//! run the real `etcdctl` (v3 API) against any endpoint. Used by the
//! etcdctl compatibility tests as the reference implementation.

#![allow(dead_code)]

use crate::support::free_ports;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const ETCD: &str = "/usr/bin/etcd";
pub const ETCDCTL: &str = "/usr/bin/etcdctl";

/// How long etcd may take to answer `etcdctl endpoint health`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Passed to every etcdctl run; etcdctl itself gives up after these.
pub const DIAL_TIMEOUT: &str = "2s";
pub const COMMAND_TIMEOUT: &str = "5s";
/// Wall-clock bound on one etcdctl process (killed after it), in case it
/// hangs despite its own timeouts (e.g. waiting on stdin).
pub const ETCDCTL_WALL_LIMIT: Duration = Duration::from_secs(20);

/// Both binaries are installed.
pub fn have_etcd() -> bool {
    is_executable(Path::new(ETCD)) && is_executable(Path::new(ETCDCTL))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Fails the calling test (never skips it) when etcd/etcdctl 3.4 are not
/// installed: the compatibility tests must not pass vacuously.
pub fn require_etcd() {
    assert!(
        have_etcd(),
        "{ETCD} and {ETCDCTL} are required by the etcdctl compatibility tests \
         but are not installed; run ./scripts/test (it installs the Debian \
         packages etcd-server and etcd-client)"
    );
    let out = Command::new(ETCDCTL)
        .arg("version")
        .env("ETCDCTL_API", "3")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {ETCDCTL} version: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("etcdctl version: 3.4."),
        "the etcdctl compatibility tests expect etcdctl 3.4 (its output and \
         error formats), found:\n{text}\nrun ./scripts/test (installs \
         etcd-server etcd-client)"
    );
}

/// `etcdctl snapshot restore <backup> --data-dir <data_dir> <flags...>`,
/// which must succeed (bounded to a minute).
pub fn etcdctl_restore(backup: &Path, data_dir: &Path, flags: &[&str]) {
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .arg("snapshot")
        .arg("restore")
        .arg(backup)
        .arg("--data-dir")
        .arg(data_dir)
        .args(flags);
    let out = run_bounded(cmd, None, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "etcdctl snapshot restore: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A single-member etcd 3.4 on loopback, killed on drop.
pub struct RealEtcd {
    /// `127.0.0.1:<client port>`, as given to `etcdctl --endpoints`.
    pub endpoint: String,
    pub client_url: String,
    pub peer_url: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

impl RealEtcd {
    /// Starts etcd with its data in `dir/etcd-data` and its output in
    /// `dir/etcd.log`, and waits (at most 30 s) until
    /// `etcdctl endpoint health` succeeds.
    pub fn start(dir: &Path) -> RealEtcd {
        let mut e = RealEtcd::spawn(dir);
        e.wait_healthy();
        e
    }

    /// Starts the process without waiting; call [`RealEtcd::wait_healthy`].
    pub fn spawn(dir: &Path) -> RealEtcd {
        RealEtcd::spawn_with(dir, &[])
    }

    /// As [`RealEtcd::spawn`], with more etcd flags after the usual ones.
    pub fn spawn_with(dir: &Path, extra: &[&str]) -> RealEtcd {
        let ports = free_ports(2);
        RealEtcd::spawn_at(dir, ports[0], ports[1], extra)
    }

    /// A new `n`-member etcd cluster (members `n1`..), each in `dir/<name>`;
    /// waits until every member is healthy.
    pub fn cluster(dir: &Path, n: usize) -> Vec<RealEtcd> {
        let ports: Vec<(u16, u16)> = (0..n)
            .map(|_| (free_ports(1)[0], free_ports(1)[0]))
            .collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("n{}=http://127.0.0.1:{peer}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut members: Vec<RealEtcd> = ports
            .iter()
            .enumerate()
            .map(|(i, (client, peer))| {
                let name = format!("n{}", i + 1);
                // etcd takes the last of a repeated flag.
                let extra = ["--name", &name, "--initial-cluster", &initial];
                RealEtcd::spawn_at(&dir.join(&name), *client, *peer, &extra)
            })
            .collect();
        for m in &mut members {
            m.wait_healthy();
        }
        members
    }

    /// Restores `backup` with `etcdctl snapshot restore` into the data dir
    /// of a member named `peer` with fresh ports, then starts etcd on it
    /// and waits until it is healthy.
    pub fn restored_from(dir: &Path, backup: &Path) -> RealEtcd {
        require_etcd();
        std::fs::create_dir_all(dir).unwrap();
        let ports = free_ports(2);
        let peer_url = format!("http://127.0.0.1:{}", ports[1]);
        let cluster = format!("peer={peer_url}");
        etcdctl_restore(
            backup,
            &dir.join("etcd-data"),
            &[
                "--name",
                "peer",
                "--initial-cluster",
                &cluster,
                "--initial-advertise-peer-urls",
                &peer_url,
            ],
        );
        let mut e = RealEtcd::spawn_at(dir, ports[0], ports[1], &[]);
        e.wait_healthy();
        e
    }

    fn spawn_at(dir: &Path, client_port: u16, peer_port: u16, extra: &[&str]) -> RealEtcd {
        require_etcd();
        std::fs::create_dir_all(dir).unwrap();
        let ports = [client_port, peer_port];
        let client_url = format!("http://127.0.0.1:{}", ports[0]);
        let peer_url = format!("http://127.0.0.1:{}", ports[1]);
        let data_dir = dir.join("etcd-data");
        let log = dir.join("etcd.log");
        let log_file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(ETCD);
        // etcd reads every ETCD_* variable as a flag: keep the caller's out.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD") {
                cmd.env_remove(k);
            }
        }
        cmd.arg("--name")
            .arg("peer")
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(format!("peer={peer_url}"))
            .arg("--initial-cluster-state")
            .arg("new")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file.try_clone().unwrap()))
            .stderr(Stdio::from(log_file));
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {ETCD}: {e}"));
        RealEtcd {
            endpoint: format!("127.0.0.1:{}", ports[0]),
            client_url,
            peer_url,
            data_dir,
            log,
            child: Some(child),
        }
    }

    pub fn wait_healthy(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!(
                        "etcd exited with {status} during start-up:\n{}",
                        self.log_text()
                    );
                }
            }
            let out = etcdctl_with(
                &self.endpoint,
                &["--dial-timeout=1s", "--command-timeout=2s"],
                &["endpoint", "health"],
                None,
            );
            if out.status.success() {
                return;
            }
            last = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "etcd at {} not healthy within {START_TIMEOUT:?}; last etcdctl \
             output:\n{last}\netcd log:\n{}",
            self.endpoint,
            self.log_text()
        );
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RealEtcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `ETCDCTL_API=3 etcdctl --endpoints=<endpoint> --dial-timeout=2s
/// --command-timeout=5s <args>`, stdin closed, killed after 20 s.
pub fn etcdctl(endpoint: &str, args: &[&str]) -> Output {
    etcdctl_with(endpoint, &[], args, None)
}

/// [`etcdctl`] that must succeed: its stdout.
pub fn etcdctl_ok(endpoint: &str, args: &[&str]) -> String {
    let out = etcdctl(endpoint, args);
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `etcdctl endpoint hashkv --rev <revision>`: the member's KV hash there.
pub fn hashkv_at(endpoint: &str, revision: i64) -> u64 {
    let rev = revision.to_string();
    let out = etcdctl_ok(
        endpoint,
        &["endpoint", "hashkv", "--rev", &rev, "-w", "json"],
    );
    let v: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    v[0]["HashKV"]["hash"]
        .as_u64()
        .unwrap_or_else(|| panic!("no hash in {out}"))
}

/// As [`etcdctl`], with `stdin` fed to the process.
pub fn etcdctl_stdin(endpoint: &str, args: &[&str], stdin: &[u8]) -> Output {
    etcdctl_with(endpoint, &[], args, Some(stdin))
}

/// The general form: `global` flags (e.g. other timeouts) go after the
/// default timeouts, so they override them, then `args`.
pub fn etcdctl_with(
    endpoint: &str,
    global: &[&str],
    args: &[&str],
    stdin: Option<&[u8]>,
) -> Output {
    let mut cmd = Command::new(ETCDCTL);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ETCDCTL") {
            cmd.env_remove(k);
        }
    }
    cmd.env("ETCDCTL_API", "3");
    cmd.arg(format!("--endpoints={endpoint}"));
    // Later occurrences of a flag win in pflag: defaults first, then the
    // caller's globals.
    cmd.arg(format!("--dial-timeout={DIAL_TIMEOUT}"));
    cmd.arg(format!("--command-timeout={COMMAND_TIMEOUT}"));
    cmd.args(global);
    cmd.args(args);
    run_bounded(cmd, stdin, ETCDCTL_WALL_LIMIT)
}

/// Runs `cmd` with piped stdio, feeding `stdin` (or closing it), killing it
/// after `limit`. A killed run gets a note appended to its stderr.
pub fn run_bounded(mut cmd: Command, stdin: Option<&[u8]>, limit: Duration) -> Output {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut pipe_in = child.stdin.take().unwrap();
    let mut pipe_out = child.stdout.take().unwrap();
    let mut pipe_err = child.stderr.take().unwrap();
    let input = stdin.map(|s| s.to_vec()).unwrap_or_default();
    let writer = std::thread::spawn(move || {
        // A process that exits without reading all of it is not an error.
        let _ = pipe_in.write_all(&input);
    });
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe_out.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe_err.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + limit;
    let mut killed = false;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            killed = true;
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let _ = writer.join();
    let stdout = out_reader.join().unwrap();
    let mut stderr = err_reader.join().unwrap();
    if killed {
        stderr.extend_from_slice(format!("\n<test harness: killed after {limit:?}>\n").as_bytes());
    }
    Output {
        status,
        stdout,
        stderr,
    }
}
