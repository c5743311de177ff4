//! An operator's habits: relative paths on the command line, `--help` and
//! `--version`, and taking over the peer port of a member (etcd's or ours)
//! that just stopped on the same host.

use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{free_port, Server};

/// Waits (bounded) for `GET /health` on `port` to say true.
fn wait_health(port: u16, log: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let o = Command::new("curl")
            .args(["-s", "-m", "2", &format!("http://127.0.0.1:{port}/health")])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&o.stdout).contains("\"health\":\"true\"") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no health on {port}:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A one-shard member on fresh ports with its data in `dir/d` and its
/// log in `dir/metcd.log`, started through `wrapper` (e.g. `taskset -c
/// 1`) if any: the command, its HTTP port and the log's path.
fn one_member(dir: &std::path::Path, wrapper: &[&str]) -> (Command, u16, std::path::PathBuf) {
    let (http, client) = (free_port(), free_port());
    let log = dir.join("metcd.log");
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut cmd = Command::new(program);
            cmd.args(args).arg(env!("CARGO_BIN_EXE_metcd"));
            cmd
        }
        None => Command::new(env!("CARGO_BIN_EXE_metcd")),
    };
    cmd.args([
        "--data-dir",
        dir.join("d").to_str().unwrap(),
        "--listen-http-urls",
        &format!("http://127.0.0.1:{http}"),
        "--listen-client-urls",
        &format!("http://127.0.0.1:{client}"),
        "--shards",
        "1",
    ])
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log).unwrap());
    (cmd, http, log)
}

/// `--data-dir` relative to the working directory (and the default,
/// `<name>.metcd`) is where the files go, printed absolute; a restart from
/// the same directory finds the data again.
#[test]
fn relative_data_dirs_are_taken_from_the_working_directory() {
    let cwd = tempfile::tempdir().unwrap();
    let (http, client) = (free_port(), free_port());
    let log = cwd.path().join("metcd.log");
    let start = |extra: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_metcd"))
            .current_dir(cwd.path())
            .args([
                "--listen-http-urls",
                &format!("http://127.0.0.1:{http}"),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--shards",
                "1",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        wait_health(http, &log);
        let put = Command::new("curl")
            .args([
                "-s",
                "-XPUT",
                &format!("http://127.0.0.1:{http}/k"),
                "-d",
                "v",
            ])
            .output()
            .unwrap();
        assert!(put.status.success());
        child.kill().unwrap();
        child.wait().unwrap();
        std::fs::read_to_string(&log).unwrap()
    };
    for (extra, dir) in [
        (&["--data-dir", "sub/d"][..], "sub/d"),
        (&["--name", "n7"][..], "n7.metcd"),
    ] {
        let printed = start(extra);
        let absolute = cwd.path().join(dir);
        assert!(
            printed.contains(&format!("data dir {},", absolute.display())),
            "{printed}"
        );
        assert!(absolute.join("member/wal").is_dir(), "{printed}");
        // Again from the same directory: the same member, its data back.
        let again = start(extra);
        assert!(again.contains("recovered"), "{again}");
    }
}

/// A peer port whose previous owner left connections in TIME_WAIT (an
/// etcd member stopped a moment ago, the drop-in migration path) is taken
/// at once, as etcd's own listeners take it.
#[test]
fn the_peer_port_is_taken_over_despite_time_wait_connections() {
    let port = free_port();
    // Another listener on the port, a connection it closes first (so its
    // side goes to TIME_WAIT), then the listener gone.
    {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        drop(accepted);
        let mut buf = [0u8; 1];
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(std::io::Read::read(&mut &client, &mut buf).unwrap(), 0);
        drop(client);
    }
    // The precondition: a socket without SO_REUSEADDR cannot bind it now.
    let plain = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let refused = plain.bind(&addr.into()).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::AddrInUse, "{refused}");
    drop(plain);

    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let server = Server::start(
        &dir.path().join("m"),
        &[
            "--listen-peer-urls",
            &url,
            "--initial-advertise-peer-urls",
            &url,
        ],
    );
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "metcd listens for peers on {port}:\n{}",
        server.log_text()
    );
}

/// `metcd --version` has the lines of `etcd --version`, in its order, with
/// metcd's own facts: its version, the etcd API it serves, the git SHA it
/// was built from, the compiler.
#[test]
fn version_reads_like_etcds() {
    let o = Command::new(env!("CARGO_BIN_EXE_metcd"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let labels: Vec<&str> = lines
        .iter()
        .map(|l| l.split_once(": ").map_or("", |(k, _)| k))
        .collect();
    assert_eq!(
        labels,
        [
            "metcd Version",
            "etcd API Version",
            "Git SHA",
            "Rust Version",
            "Rust OS/Arch"
        ],
        "{text}"
    );
    assert!(lines[0].ends_with(env!("CARGO_PKG_VERSION")), "{text}");
    assert!(lines[3].contains("rustc 1."), "{text}");
    let sha = lines[2].trim_start_matches("Git SHA: ");
    assert!(
        sha.len() == 12 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
        "{text}"
    );
    // etcd's shape: `<name> Version`, `Git SHA`, `<toolchain> Version`,
    // `<toolchain> OS/Arch`.
    if crate::etcd_peer::have_etcd() {
        let etcd = Command::new("etcd").arg("--version").output().unwrap();
        let etcd = String::from_utf8_lossy(&etcd.stdout).into_owned();
        let theirs: Vec<&str> = etcd
            .lines()
            .filter_map(|l| l.split_once(": "))
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            theirs,
            ["etcd Version", "Git SHA", "Go Version", "Go OS/Arch"],
            "{etcd}"
        );
    }
}

/// `metcd --help` answers the quick start's questions: every flag with its
/// unit and default, in etcd's groups.
#[test]
fn help_lists_every_flag_with_its_default() {
    let o = Command::new(env!("CARGO_BIN_EXE_metcd"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(o.status.success());
    let help = String::from_utf8(o.stdout).unwrap();
    for (flag, shown) in [
        ("--data-dir <path>", "[default: (<name>.metcd)]"),
        (
            "--listen-client-urls <urls>",
            "[default: http://127.0.0.1:2379]",
        ),
        (
            "--listen-http-urls <urls>",
            "[default: http://127.0.0.1:3379]",
        ),
        ("--heartbeat-interval <ms>", "[default: 100]"),
        ("--engine <memory|btree|lsm>", "[default: memory]"),
        (
            "--shards <cores>",
            "[default: (every core but one, at least 1)]",
        ),
    ] {
        assert!(help.contains(flag), "{flag}:\n{help}");
        assert!(help.contains(shown), "{shown}:\n{help}");
    }
    for group in [
        "Member:",
        "Clustering:",
        "Security:",
        "Auth:",
        "Experimental:",
        "metcd:",
    ] {
        assert!(help.contains(group), "{group}:\n{help}");
    }
}

/// SIGTERM (what `systemctl stop` sends) while a client writes: the member
/// stops by itself within the bound, with status 0, and every write it
/// acknowledged is there after a restart.
#[test]
fn sigterm_stops_a_member_cleanly_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("m"), &[]);
    let writer = server.put_until_refused("/stop/", 100_000);
    std::thread::sleep(Duration::from_millis(500));
    server.signal(libc::SIGTERM);
    let status = server.wait_exit(Duration::from_secs(15));
    let acked = writer.join().unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}:\n{}",
        server.log_text()
    );
    let log = server.log_text();
    assert!(
        log.contains("received terminated signal, shutting down..."),
        "{log}"
    );
    assert!(log.contains("stopped (applied index"), "{log}");
    assert!(
        !acked.is_empty(),
        "no write was acknowledged before the stop"
    );
    server.restart();
    server.assert_all_present(&acked);
}

/// A member started with SIGINT ignored (a shell's background job) still
/// stops on it, as etcd does: the handlers are its own.
#[test]
fn sigint_stops_a_member_whose_parent_ignored_it() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let (mut cmd, http, log) = one_member(dir.path(), &[]);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    wait_health(http, &log);
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.is_some_and(|s| s.success()), "{status:?}:\n{text}");
    assert!(
        text.contains("received interrupt signal, shutting down..."),
        "{text}"
    );
}

/// The metric names in one PromQL expression (functions, keywords, label
/// matchers, ranges, `by (...)` groups and numbers left out).
fn metric_names(expr: &str) -> Vec<String> {
    const PROMQL: &[&str] = &[
        "sum",
        "max",
        "min",
        "avg",
        "rate",
        "irate",
        "increase",
        "histogram_quantile",
        "time",
        "by",
        "without",
        "and",
        "or",
        "unless",
    ];
    // Drop what is not a name: {matchers}, [ranges], by (labels).
    let mut plain = String::new();
    let mut depth_brace = 0;
    let mut depth_bracket = 0;
    for c in expr.chars() {
        match c {
            '{' => depth_brace += 1,
            '}' => depth_brace -= 1,
            '[' => depth_bracket += 1,
            ']' => depth_bracket -= 1,
            _ if depth_brace > 0 || depth_bracket > 0 => {}
            _ => plain.push(c),
        }
    }
    let mut names = Vec::new();
    let mut skip_group = false;
    let mut word = String::new();
    for c in plain.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            let w = std::mem::take(&mut word);
            if w == "by" || w == "without" {
                skip_group = true;
            } else if !skip_group
                && !PROMQL.contains(&w.as_str())
                && !w.chars().next().is_some_and(|c| c.is_ascii_digit())
            {
                names.push(w);
            }
        }
        if c == ')' {
            skip_group = false;
        }
    }
    names
}

#[test]
fn metric_names_are_read_out_of_promql() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (instance, le) (rate(a_b_bucket{job=~"$job"}[5m])))"#
        ),
        ["a_b_bucket"]
    );
    assert_eq!(metric_names("time() - p_start{x=\"y\"}"), ["p_start"]);
}

/// contrib/grafana/metcd-dashboard.json queries only metrics a live member
/// serves on /metrics (etcd's names; docs/operations.md lists the etcd
/// dashboard metrics metcd does not export).
#[test]
fn the_grafana_dashboard_uses_only_metrics_a_member_exports() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../contrib/grafana/metcd-dashboard.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            exprs.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() >= 10, "{exprs:?}");
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("m"), &[]);
    // A write and a checkpoint, so that every histogram has samples.
    let r = server.conn().request("PUT", "/k", b"v").unwrap();
    assert_eq!(r.status, 204);
    server.restart();
    let page = Command::new("curl")
        .args([
            "-s",
            &format!("http://{}/metrics", server.client_endpoint()),
        ])
        .output()
        .unwrap();
    let page = String::from_utf8(page.stdout).unwrap();
    let served: std::collections::BTreeSet<&str> = page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no metric in {expr}");
        for name in names {
            assert!(
                served.contains(name.as_str()),
                "the dashboard queries {name} ({expr}), which /metrics does not serve:\n{served:?}"
            );
        }
    }
}

/// Shards are pinned inside the CPUs the process was given (`taskset`,
/// systemd's `CPUAffinity=`): started on the last CPU alone, no thread of
/// the member may run anywhere else.
#[test]
fn shards_are_pinned_to_the_cpus_the_process_was_given() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        eprintln!("skipped: one CPU, nothing to choose");
        return;
    }
    let last = (cpus - 1).to_string();
    let dir = tempfile::tempdir().unwrap();
    let (mut cmd, http, log) = one_member(dir.path(), &["taskset", "-c", &last]);
    let mut child = cmd.spawn().unwrap();
    wait_health(http, &log);
    let tasks = std::fs::read_dir(format!("/proc/{}/task", child.id())).unwrap();
    let mut seen = Vec::new();
    for task in tasks {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        let name = status.lines().next().unwrap_or("").to_string();
        let allowed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_string();
        seen.push(format!("{name}: {allowed}"));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.iter().all(|s| s.ends_with(&format!(": {last}"))),
        "every thread on CPU {last}: {seen:?}"
    );
}

/// The start-up lines operators' tools wait for (etcd's own e2e harness
/// waits for the last two), in etcd's words.
#[test]
fn start_up_lines_are_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("m"), &["--name", "s1"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let published = format!(
        "published {{Name:s1 ClientURLs:[http://127.0.0.1:{}]}} to cluster ",
        server.client_port
    );
    loop {
        let log = server.log_text();
        if log.contains(&published) {
            assert!(log.contains("ready to serve client requests"), "{log}");
            assert!(log.contains("enabled capabilities for version 3."), "{log}");
            break;
        }
        assert!(Instant::now() < deadline, "no {published:?} in:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Once a member says it is ready, every client port takes connections:
/// tools (etcd's e2e harness, scripts) connect the moment they read the
/// line. Here the owner shard accepts no clients, so the line comes from
/// one thread and the listeners from another (CI once saw curl refused
/// right after "published"). Several restarts, each checked the instant
/// the line appears.
#[test]
fn a_member_that_says_it_is_ready_takes_connections() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_unchecked(
        &dir.path().join("m"),
        &["--shards", "2", "--owner-accepts-clients", "false"],
    );
    for start in 0..5 {
        if start > 0 {
            // The log file is appended to: wait for one more ready line.
            server.respawn_unchecked();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while server
            .log_text()
            .matches("ready to serve client requests")
            .count()
            <= start
        {
            assert!(Instant::now() < deadline, "{}", server.log_text());
            std::thread::sleep(Duration::from_millis(1));
        }
        for port in [server.client_port, server.port] {
            if let Err(e) = TcpStream::connect(("127.0.0.1", port)) {
                panic!("start {start}: port {port} refused after the ready line: {e}");
            }
        }
    }
}

/// `--max-concurrent-streams` (etcd's flag) is what a client connection is
/// told in the server's HTTP/2 SETTINGS (SETTINGS_MAX_CONCURRENT_STREAMS).
#[test]
fn max_concurrent_streams_is_advertised() {
    use std::io::{Read, Write};
    let advertised = |extra: &[&str]| -> Option<u32> {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(&dir.path().join("m"), extra);
        let mut tcp = TcpStream::connect(server.client_endpoint()).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The client preface and an empty SETTINGS frame.
        tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .unwrap();
        let mut head = [0u8; 9];
        tcp.read_exact(&mut head).unwrap();
        assert_eq!(head[3], 0x04, "the server's first frame is SETTINGS");
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        tcp.read_exact(&mut payload).unwrap();
        payload.chunks(6).find_map(|entry| {
            (entry[..2] == [0, 3]).then(|| u32::from_be_bytes(entry[2..6].try_into().unwrap()))
        })
    };
    assert_eq!(advertised(&["--max-concurrent-streams", "3"]), Some(3));
    assert_eq!(advertised(&[]), Some(4096));
}

/// An operator's etcd config file (`--config-file`, etcd's YAML keys)
/// starts metcd unchanged: its name, relative data dir, ports and limits
/// are taken, etcd-only logging keys are ignored, other flags are not read
/// (as etcd), and a key metcd cannot honour refuses the start.
#[test]
fn an_etcd_config_file_starts_a_member() {
    let cwd = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let yaml = format!(
        "name: infra1\ndata-dir: infra1.etcd\nlisten-client-urls: http://127.0.0.1:{client}\n\
         advertise-client-urls: http://127.0.0.1:{client}\n\
         listen-peer-urls: http://127.0.0.1:{peer}\ninitial-advertise-peer-urls: http://127.0.0.1:{peer}\n\
         initial-cluster: infra1=http://127.0.0.1:{peer}\ninitial-cluster-state: new\n\
         max-txn-ops: 2\nlogger: zap\nlog-level: info\n"
    );
    std::fs::write(cwd.path().join("etcd.yaml"), yaml).unwrap();
    let log = cwd.path().join("metcd.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_metcd"))
        .current_dir(cwd.path())
        .args([
            "--config-file",
            "etcd.yaml",
            "--name",
            "ignored",
            "--shards",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let ep = format!("127.0.0.1:{client}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let list = loop {
        let o = crate::etcd_peer::etcdctl(&ep, &["member", "list"]);
        if o.status.success() {
            break String::from_utf8_lossy(&o.stdout).into_owned();
        }
        assert!(
            Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(list.contains(", started, infra1, "), "{list}");
    assert!(cwd.path().join("infra1.etcd/member/wal").is_dir());
    let txn = crate::etcd_peer::etcdctl_stdin(&ep, &["txn"], b"\nput a 1\nput b 2\nput c 3\n\n\n");
    assert!(
        String::from_utf8_lossy(&txn.stderr).contains("too many operations in txn request"),
        "{txn:?}"
    );
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("ignoring logger (etcd's own)"), "{text}");

    std::fs::write(
        cwd.path().join("bad.yaml"),
        "name: x\nwal-dir: /var/lib/wal\n",
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_metcd"))
        .current_dir(cwd.path())
        .args(["--config-file", "bad.yaml"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("wal-dir is not supported by metcd"), "{err}");
}

/// An etcd command line starts metcd unchanged: etcd's own flags (the v2
/// API switch the e2e tests turn on, logging, pre-vote) are noted and
/// ignored, switches and valued flags alike; a flag whose absence would
/// change where data lives refuses the start with a clear message.
#[test]
fn etcds_own_flags_are_noted_and_ignored_and_unsafe_ones_refused() {
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "--enable-v2",
        "--name",
        "s1",
        "--logger",
        "zap",
        "--log-level=debug",
        "--pre-vote",
        "--snapshot-count",
        "5",
    ];
    let server = Server::start(&dir.path().join("m"), &flags);
    let endpoint = server.client_endpoint();
    crate::etcd_peer::etcdctl_ok(&endpoint, &["put", "k", "v"]);
    let list = crate::etcd_peer::etcdctl_ok(&endpoint, &["member", "list"]);
    assert!(list.contains(", started, s1, "), "{list}");
    let log = server.log_text();
    for flag in ["--enable-v2", "--logger", "--log-level", "--pre-vote"] {
        assert!(
            log.contains(&format!("ignoring {flag} (etcd's own")),
            "{flag}:\n{log}"
        );
    }
    let out = crate::support::run_metcd_to_exit_with(&dir.path().join("w"), &["--wal-dir", "w"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--wal-dir is not supported by metcd; remove it to start"),
        "{err}"
    );
    assert!(
        !dir.path().join("w").exists(),
        "a refused start made its data dir"
    );
}
