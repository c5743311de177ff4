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
    let (http, client) = (free_port(), free_port());
    let log = dir.path().join("metcd.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_metcd"));
    cmd.args([
        "--data-dir",
        dir.path().join("d").to_str().unwrap(),
        "--listen-http-urls",
        &format!("http://127.0.0.1:{http}"),
        "--listen-client-urls",
        &format!("http://127.0.0.1:{client}"),
        "--shards",
        "1",
    ])
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log).unwrap());
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
