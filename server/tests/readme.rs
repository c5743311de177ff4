//! The README, executed: its shell blocks run as a user types them and
//! each command's output is checked. A README edit that breaks a command,
//! or adds one this test does not know, fails here.
//!
//! - The quick start's server command (`cargo run --release -p server
//!   --bin metcd`, no flags) runs from an empty directory inside the clone
//!   (cargo finds the workspace upwards; the data dir is `./default.metcd`
//!   of that directory), then the etcdctl and curl blocks run there too.
//! - The three-member block runs as one bash script, as written (its
//!   ports included), from another empty directory inside the clone.
//! - The test command (`./scripts/test`) is what runs this test; the
//!   benchmark block loads a server for minutes. Both are listed as not
//!   run here, and every other block must be one of the above.
//!
//! A binary of its own: the README's ports are fixed (2379, 2380, 3379,
//! 22379, ...), and test binaries run one after another, so no other test
//! holds them meanwhile.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The release build the README's commands need, when the test itself
/// starts it (a cold build on a 2-core machine takes minutes).
const BUILD_LIMIT: Duration = Duration::from_secs(1500);
/// One README command.
const COMMAND_LIMIT: Duration = Duration::from_secs(60);
/// A member of the README's commands becoming healthy.
const START_LIMIT: Duration = Duration::from_secs(120);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the server crate sits in the workspace")
        .to_path_buf()
}

/// One fenced ```sh block: the `## ` heading above it and its lines.
#[derive(Debug)]
struct Block {
    heading: String,
    text: String,
}

impl Block {
    /// Its commands: lines without comments, continuation lines joined.
    fn commands(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut pending = String::new();
        for line in self.text.lines() {
            let line = line.trim_end();
            if let Some(cont) = line.strip_suffix('\\') {
                pending.push_str(cont);
                continue;
            }
            pending.push_str(line);
            let cmd = std::mem::take(&mut pending);
            if !cmd.trim().is_empty() && !cmd.trim_start().starts_with('#') {
                out.push(cmd);
            }
        }
        out
    }
}

fn sh_blocks(readme: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut heading = String::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if let Some(h) = line.strip_prefix("## ") {
            heading = h.to_string();
        } else if line.trim() == "```sh" {
            let text: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
            blocks.push(Block {
                heading: heading.clone(),
                text: text.join("\n"),
            });
        }
    }
    blocks
}

/// `bash -c <command>` in `dir`, in a process group of its own (so that
/// whatever it leaves running can be killed with it).
fn bash(dir: &Path, command: &str) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(command).current_dir(dir).process_group(0);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ETCDCTL") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A process group killed on drop.
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        if let Ok(pgid) = i32::try_from(self.0.id()) {
            // SAFETY: kill(2) on the process group this test created.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
        let _ = self.0.wait();
    }
}

/// Runs `command` to completion (killed after `limit`).
fn run(dir: &Path, command: &str, limit: Duration) -> Output {
    let mut cmd = bash(dir, command);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut group = Group(cmd.spawn().expect("bash runs"));
    let mut out = group.0.stdout.take().expect("piped");
    let mut err = group.0.stderr.take().expect("piped");
    let readers = (
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = out.read_to_end(&mut b);
            b
        }),
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = err.read_to_end(&mut b);
            b
        }),
    );
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = group.0.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            panic!("README command ran past {limit:?}: {command}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // What the command left running (the three-member block's members)
    // holds the pipes open: it goes with the group.
    drop(group);
    Output {
        status,
        stdout: readers.0.join().expect("reader"),
        stderr: readers.1.join().expect("reader"),
    }
}

fn show(command: &str, o: &Output) -> String {
    format!(
        "README command: {command}\nexit: {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `command` and checks it succeeded; its stdout.
fn run_ok(dir: &Path, command: &str) -> String {
    let o = run(dir, command, COMMAND_LIMIT);
    assert!(o.status.success(), "{}", show(command, &o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn healthy(port: u16) -> bool {
    let o = Command::new("curl")
        .args(["-s", "-m", "2", &format!("http://127.0.0.1:{port}/health")])
        .output();
    o.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("\"health\":\"true\""))
}

fn wait_healthy(port: u16, server: &mut Group, log: &Path) {
    let deadline = Instant::now() + START_LIMIT;
    while !healthy(port) {
        if let Ok(Some(status)) = server.0.try_wait() {
            panic!(
                "the README's server exited ({status}) before it was healthy:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "no health on port {port} within {START_LIMIT:?}:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An empty directory inside the clone (so cargo finds the workspace).
fn empty_dir_in_clone(name: &str) -> PathBuf {
    let dir = repo_root().join("target").join("readme").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

/// Checks one line of the etcdctl block against what etcd's tool prints.
fn etcdctl_line(dir: &Path, command: &str) {
    let words: Vec<&str> = command.split_whitespace().collect();
    let after = |w: &str| {
        words
            .iter()
            .position(|x| *x == w)
            .map(|i| words[i + 1..].join(" "))
    };
    if let Some(args) = after("watch") {
        // A watch runs until stopped: it must print the next put under its
        // prefix, with the previous value.
        assert_eq!(args, "--prefix / --prev-kv", "{command}");
        let watch_out = dir.join("watch.out");
        let mut cmd = bash(dir, &format!("{command} > watch.out 2>&1"));
        let _watch = Group(cmd.spawn().expect("bash runs"));
        let deadline = Instant::now() + COMMAND_LIMIT;
        let mut value = 0;
        loop {
            value += 1;
            run_ok(
                dir,
                &format!("ETCDCTL_API=3 etcdctl --endpoints 127.0.0.1:2379 put /w v{value}"),
            );
            let seen = std::fs::read_to_string(&watch_out).unwrap_or_default();
            // etcdctl prints the event's type, then the previous key and
            // value, then the new ones.
            if value > 1 && seen.contains(&format!("PUT\n/w\nv{}\n/w\nv{value}\n", value - 1)) {
                break;
            }
            assert!(Instant::now() < deadline, "{command} printed:\n{seen}");
            std::thread::sleep(Duration::from_millis(300));
        }
        return;
    }
    let out = run_ok(dir, command);
    if let Some(args) = after("put") {
        assert_eq!(args, "foo bar", "{command}");
        assert_eq!(out, "OK\n", "{command}");
    } else if let Some(args) = after("get") {
        assert_eq!(args, "foo --rev=2 -w json", "{command}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        // foo = bar, written at revision 2 by the put above.
        assert_eq!(v["kvs"][0]["key"], "Zm9v", "{out}");
        assert_eq!(v["kvs"][0]["value"], "YmFy", "{out}");
        assert_eq!(v["kvs"][0]["mod_revision"], 2, "{out}");
    } else if let Some(args) = after("grant") {
        assert_eq!(args, "10", "{command}");
        assert!(
            out.starts_with("lease ") && out.ends_with(" granted with TTL(10s)\n"),
            "{command}: {out}"
        );
    } else if let Some(args) = after("status") {
        assert_eq!(args, "-w table", "{command}");
        assert!(out.contains("| IS LEADER |"), "{out}");
        assert!(out.contains("| 127.0.0.1:2379 |"), "{out}");
        assert!(out.contains(" true |"), "a single member leads: {out}");
    } else if let Some(args) = after("save") {
        assert_eq!(args, "backup.db", "{command}");
        assert_eq!(out, "Snapshot saved at backup.db\n", "{command}");
        let status = run_ok(dir, "etcdctl snapshot status backup.db -w json");
        let v: serde_json::Value = serde_json::from_str(&status).expect("JSON");
        assert!(v["totalKey"].as_u64() > Some(0), "{status}");
    } else {
        panic!("a README etcdctl command this test does not check: {command}");
    }
}

/// Checks one line of the curl block (the seed's HTTP API).
fn curl_line(dir: &Path, command: &str) {
    let out = run_ok(dir, command);
    let url = command
        .split_whitespace()
        .nth(2)
        .expect("curl -L <url> ...")
        .trim_matches('\'');
    if command.contains("-XPUT") {
        assert_eq!(url, "http://127.0.0.1:3379/hello", "{command}");
        assert_eq!(out, "", "a put answers 204: {command}");
    } else if command.contains("-XDELETE") {
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(v["deleted"], "1", "{command}: {out}");
    } else if url.ends_with("/hello") {
        assert_eq!(out, "world", "{command}");
    } else if url.contains("/hello?prefix") {
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(v["count"], "1", "{command}: {out}");
        assert_eq!(v["kvs"][0]["value"], "world", "{command}: {out}");
    } else {
        panic!("a README curl command this test does not check: {command}");
    }
}

/// The quick start, then the three-member example, as written.
#[test]
fn readme_commands_work_as_written() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let blocks = sh_blocks(&readme);
    let find = |what: &str, pick: &dyn Fn(&Block) -> bool| -> &Block {
        let found: Vec<&Block> = blocks.iter().filter(|b| pick(b)).collect();
        assert_eq!(found.len(), 1, "the README's {what} block: {found:?}");
        found[0]
    };
    let server = find("server", &|b| {
        b.text.contains("cargo run --release -p server --bin metcd") && !b.text.contains("for i in")
    });
    let test_cmd = find("test command", &|b| b.text.trim() == "./scripts/test");
    let etcdctl = find("etcdctl", &|b| {
        b.commands().iter().all(|c| c.contains("etcdctl"))
    });
    let curl = find("curl", &|b| {
        b.commands().iter().all(|c| c.starts_with("curl "))
    });
    let cluster = find("three-member", &|b| b.text.contains("for i in 1 2 3"));
    let bench = find("benchmark", &|b| b.text.contains("metcd-bench"));
    let known = [server, test_cmd, etcdctl, curl, cluster, bench];
    for b in &blocks {
        assert!(
            known.iter().any(|k| std::ptr::eq(*k, b)),
            "a README block this test neither runs nor lists as not run (under '{}'):\n{}",
            b.heading,
            b.text
        );
    }
    assert_eq!(
        server.commands(),
        ["cargo run --release -p server --bin metcd"]
    );

    // The release build first, so that the server command's start is not
    // measured against a cold compile.
    let root = repo_root();
    let build = run(
        &root,
        "cargo build --release -p server --bin metcd",
        BUILD_LIMIT,
    );
    assert!(build.status.success(), "{}", show("cargo build", &build));

    // The quick start, from an empty directory, no flags.
    let dir = empty_dir_in_clone("quickstart");
    let log = dir.join("metcd.log");
    let mut cmd = bash(&dir, &format!("{} > metcd.log 2>&1", server.commands()[0]));
    let mut member = Group(cmd.spawn().expect("bash runs"));
    wait_healthy(3379, &mut member, &log);
    let started = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        started.contains(&format!("data dir {}", dir.join("default.metcd").display())),
        "the data dir is printed absolute: {started}"
    );
    assert!(dir.join("default.metcd/member/wal").is_dir(), "{started}");
    for command in etcdctl.commands() {
        etcdctl_line(&dir, &command);
    }
    for command in curl.commands() {
        curl_line(&dir, &command);
    }
    drop(member);

    // The three-member cluster, as one script.
    let dir = empty_dir_in_clone("cluster");
    let o = run(&dir, &cluster.commands().join("\n"), START_LIMIT);
    let text = show(&cluster.text, &o);
    assert!(o.status.success(), "{text}");
    let out = String::from_utf8_lossy(&o.stdout);
    for name in ["n1", "n2", "n3"] {
        assert!(
            out.contains(&format!(", started, {name}, http://127.0.0.1:")),
            "member list shows {name}: {text}"
        );
        assert!(
            dir.join(format!("{name}.metcd/member/wal")).is_dir(),
            "{text}"
        );
    }
    for port in [2379, 22379, 32379] {
        assert!(
            out.contains(&format!(" http://127.0.0.1:{port} |")),
            "{text}"
        );
    }
    assert_eq!(
        out.matches(" true |").count(),
        1,
        "endpoint status shows one leader: {text}"
    );
}
