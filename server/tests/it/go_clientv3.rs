//! Go clientv3 3.4, the client Kubernetes and most etcd tooling link, as a
//! program of our own (`tests/go/clientv3_transcript`): run against a real
//! etcd 3.4 and against metcd, its transcripts (values, revisions, events,
//! error strings, what the concurrency, mirror, namespace and leasing
//! packages see) must be identical line for line.
//!
//! The program is built in GOPATH mode from Debian's clientv3 sources,
//! which `scripts/fetch-go-clientv3` puts in `target/gopath` (or an
//! installed `golang-etcd-server-dev` in `/usr/share/gocode`), with
//! Debian's `golang-go`; `./scripts/test` brings both.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::etcd_peer::{require_etcd, run_bounded, RealEtcd};
use crate::support::Server;

/// Where the transcript program's sources are.
fn program_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/go/clientv3_transcript")
}

/// A GOPATH holding `go.etcd.io/etcd/clientv3` and its dependencies:
/// `target/gopath` (what scripts/fetch-go-clientv3 unpacked, which leaves
/// out Go packages already installed) then Debian's `/usr/share/gocode`.
fn gopath() -> std::ffi::OsString {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let roots: Vec<PathBuf> = [workspace.join("target/gopath"), "/usr/share/gocode".into()]
        .into_iter()
        .filter(|p| p.join("src").is_dir())
        .collect();
    assert!(
        roots
            .iter()
            .any(|p| p.join("src/go.etcd.io/etcd/clientv3").is_dir()),
        "no clientv3 sources in target/gopath or /usr/share/gocode: run ./scripts/test \
         (it runs scripts/fetch-go-clientv3)"
    );
    std::env::join_paths(roots).unwrap()
}

/// Builds the transcript program once per test process.
fn transcript_program() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let binary = out_dir.join("clientv3_transcript");
        // Built under a name of this process, then renamed over the shared
        // one: another test process (scripts/test runs the cluster tests in
        // their own) may build it at the same time, or run it.
        let building = out_dir.join(format!("clientv3_transcript.{}", std::process::id()));
        let mut cmd = Command::new("go");
        cmd.current_dir(program_dir())
            .args(["build", "-o"])
            .arg(&building)
            .arg(".")
            .env("GO111MODULE", "off")
            .env("GOPATH", gopath())
            .env("GOFLAGS", "")
            .env("GOPROXY", "off")
            .env("GOCACHE", out_dir.join("go-build-cache"));
        // The first build compiles gRPC and clientv3 from source.
        let out = run_bounded(cmd, None, Duration::from_secs(600));
        assert!(
            out.status.success(),
            "go build of {:?} failed (is golang-go installed? ./scripts/test installs it):\n{}{}",
            program_dir(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&building, &binary).unwrap();
        binary
    })
}

/// The program's stdout with `args` (an endpoint, or `cluster` and the
/// members' endpoints), and its stderr (for failures).
fn transcript<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (String, String) {
    let mut cmd = Command::new(transcript_program());
    cmd.args(args);
    let out = run_bounded(cmd, None, Duration::from_secs(180));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Against each storage engine (the default memory engine, the B+tree
/// and the LSM tree), each a fresh member next to the same etcd run.
#[test]
fn go_clientv3_sees_what_it_sees_against_etcd() {
    require_etcd();
    transcript_program();
    let dir = tempfile::tempdir().unwrap();
    let etcd = RealEtcd::start(&dir.path().join("etcd"));
    let etcd_endpoint = etcd.endpoint.clone();
    let theirs = std::thread::spawn(move || transcript(&[etcd_endpoint]));
    let mut ours = Vec::new();
    for engine in ["memory", "btree", "lsm"] {
        let metcd = Server::start(&dir.path().join(engine), &["--engine", engine]);
        let transcript = transcript(&[metcd.client_endpoint()]);
        ours.push((engine, transcript, metcd.log_text()));
    }
    let theirs = theirs.join().unwrap();
    for (engine, transcript, log) in ours {
        let log = format!("engine {engine}:\n{log}");
        same_transcripts(transcript, theirs.clone(), &log);
    }
}

/// The same program's cluster part against three etcd 3.4 members and
/// three metcd members: a client of every member and one per member see
/// the same leader, writes through each member read back through every
/// member, a watch on one member sees writes through another, HashKV
/// agrees on every member, a lease and a lock span members, a leadership
/// transfer (and its refusal by a follower), a learner added, refused
/// promotion and removed after the strict reconfiguration wait.
#[test]
fn go_clientv3_against_a_cluster_sees_what_it_sees_against_etcds() {
    require_etcd();
    transcript_program();
    // The metcd cluster holds the one-cluster-at-a-time lock while the
    // etcd cluster runs too; one after the other, so six members never
    // share the two vCPUs at once.
    let cluster = crate::cluster::Cluster::start(3);
    let dir = tempfile::tempdir().unwrap();
    let theirs = {
        let etcd = RealEtcd::cluster(dir.path(), 3);
        let mut args = vec!["cluster".to_string()];
        args.extend(etcd.iter().map(|m| m.endpoint.clone()));
        transcript(&args)
    };
    let mut args = vec!["cluster".to_string()];
    args.extend(cluster.members.iter().map(Server::client_endpoint));
    let ours = transcript(&args);
    let logs: String = cluster.members.iter().map(Server::log_text).collect();
    same_transcripts(ours, theirs, &logs);
}

/// Requires etcd's transcript to be complete and metcd's to equal it.
fn same_transcripts(ours: (String, String), theirs: (String, String), metcd_log: &str) {
    let ((ours, our_stderr), (theirs, their_stderr)) = (ours, theirs);
    assert!(
        theirs.ends_with("done\n"),
        "the program does not run through against etcd 3.4 itself:\n{theirs}\n{their_stderr}"
    );
    let (ours_lines, theirs_lines): (Vec<&str>, Vec<&str>) =
        (ours.lines().collect(), theirs.lines().collect());
    for (i, (o, t)) in ours_lines.iter().zip(&theirs_lines).enumerate() {
        assert_eq!(
            o,
            t,
            "line {} differs (metcd left, etcd right); metcd's transcript:\n{ours}\n\
             stderr:\n{our_stderr}\nmetcd log:\n{metcd_log}",
            i + 1
        );
    }
    assert_eq!(
        ours_lines.len(),
        theirs_lines.len(),
        "metcd's transcript:\n{ours}\nstderr:\n{our_stderr}"
    );
}
