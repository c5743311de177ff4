//! etcd compatibility as users see it: the real `etcdctl` 3.4 (v3 API) runs
//! the same command lines against metcd's gRPC API and against a real etcd
//! 3.4, each started fresh on loopback, and their stdout, stderr and exit
//! status must match byte for byte after normalising only what legitimately
//! differs between two servers (cluster/member ids, raft term, endpoint
//! addresses, client log timestamps; for `endpoint status`/`hashkv` also the
//! version, sizes, raft indexes and hash).
//!
//! `harness_self_check_etcd_vs_etcd` runs every scenario against two real
//! etcds: it shows the normalisation hides nothing that differs between two
//! correct servers, and that each scenario really produces the outputs and
//! errors it is meant to exercise.

use std::net::TcpStream;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::etcd_peer::{etcdctl_with, require_etcd, RealEtcd};
use crate::support::Server;

/// How long metcd may take to accept connections on its gRPC port after its
/// HTTP `/health` answers.
const GRPC_LISTEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Upper bound for one scenario against one pair of servers.
const SCENARIO_BUDGET: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------
// Servers under test

/// metcd with its gRPC API on `127.0.0.1:<grpc_port>`, killed on drop.
pub struct Metcd {
    pub server: Server,
    pub grpc_port: u16,
}

impl Metcd {
    /// Starts metcd with data in `dir/metcd` (log `dir/metcd.log`), waits for
    /// its HTTP `/health` (support::Server, which also passes
    /// `--listen-client-urls http://127.0.0.1:<client_port>`) and then,
    /// bounded, for that gRPC port to accept TCP connections.
    pub fn start(dir: &Path) -> Metcd {
        Metcd::start_with(dir, &[])
    }

    /// As [`Metcd::start`], with more flags.
    pub fn start_with(dir: &Path, extra: &[&str]) -> Metcd {
        let mut args = vec!["--shards", "2"];
        args.extend_from_slice(extra);
        let server = Server::start(&dir.join("metcd"), &args);
        let m = Metcd {
            grpc_port: server.client_port,
            server,
        };
        m.wait_grpc_listening();
        m
    }

    fn wait_grpc_listening(&self) {
        let deadline = Instant::now() + GRPC_LISTEN_TIMEOUT;
        while Instant::now() < deadline {
            if TcpStream::connect(("127.0.0.1", self.grpc_port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "metcd is healthy on its HTTP port but does not accept connections \
             on --listen-client-urls http://127.0.0.1:{} within {:?} (is the \
             etcd v3 gRPC API served?)\nmetcd log:\n{}",
            self.grpc_port,
            GRPC_LISTEN_TIMEOUT,
            tail(&self.server.log_text(), 4000)
        );
    }
}

/// Something etcdctl can talk to.
trait Target {
    fn label(&self) -> &'static str;
    fn endpoint(&self) -> String;
    fn log_text(&self) -> String;
}

struct EtcdTarget(&'static str, RealEtcd);

impl Target for EtcdTarget {
    fn label(&self) -> &'static str {
        self.0
    }
    fn endpoint(&self) -> String {
        self.1.endpoint.clone()
    }
    fn log_text(&self) -> String {
        self.1.log_text()
    }
}

impl Target for Metcd {
    fn label(&self) -> &'static str {
        "metcd"
    }
    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.grpc_port)
    }
    fn log_text(&self) -> String {
        self.server.log_text()
    }
}

// ---------------------------------------------------------------------------
// Scenarios

/// How a step's stdout is normalised (stderr and exit status are always
/// compared with [`Norm::Exact`] rules).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Norm {
    /// Byte for byte, except ids, endpoint address and the client's log
    /// timestamps/targets (see [`normalize_text`]).
    Exact,
    /// `member add`: as `Exact`, with the new member's and the cluster's
    /// ids masked (etcd picks the member id from the clock), the existing
    /// members of `ETCD_INITIAL_CLUSTER` masked (each server's own name and
    /// peer URL) and the list sorted (it is in member id order).
    MemberAdd,
    /// `endpoint status -w json`: structure and header revision compared,
    /// ids/version/sizes/raft fields replaced (see [`normalize_status`]).
    EndpointStatus,
    /// `endpoint hashkv -w json`: structure, header revision and
    /// compact_revision compared, hash and ids replaced.
    HashKv,
}

/// What the reference (real etcd) must do for the step to test what it is
/// meant to: checks the scenario itself, not the server under test.
#[derive(Clone, Debug)]
enum Expect {
    Any,
    /// Exit 0 and stdout contains this.
    Ok(&'static str),
    /// Exit 0 and stderr contains this (`endpoint health` reports there).
    OkStderr(&'static str),
    /// Non-zero exit and stderr contains this.
    Err(&'static str),
}

#[derive(Clone, Debug)]
struct Step {
    args: Vec<String>,
    stdin: Option<Vec<u8>>,
    norm: Norm,
    expect: Expect,
}

/// One etcdctl command line (after the global flags the harness adds).
fn step(args: &[&str]) -> Step {
    Step {
        args: args.iter().map(|s| s.to_string()).collect(),
        stdin: None,
        norm: Norm::Exact,
        expect: Expect::Any,
    }
}

impl Step {
    fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Step {
        self.stdin = Some(bytes.into());
        self
    }
    fn norm(mut self, norm: Norm) -> Step {
        self.norm = norm;
        self
    }
    fn ok(mut self, stdout_contains: &'static str) -> Step {
        self.expect = Expect::Ok(stdout_contains);
        self
    }
    fn ok_stderr(mut self, stderr_contains: &'static str) -> Step {
        self.expect = Expect::OkStderr(stderr_contains);
        self
    }
    fn err(mut self, stderr_contains: &'static str) -> Step {
        self.expect = Expect::Err(stderr_contains);
        self
    }
    fn describe(&self) -> String {
        let mut s = format!("etcdctl {}", shell_words(&self.args));
        if let Some(input) = &self.stdin {
            if input.len() <= 200 {
                s.push_str(&format!(" <<< {:?}", String::from_utf8_lossy(input)));
            } else {
                s.push_str(&format!(" < ({} bytes)", input.len()));
            }
        }
        s
    }
}

fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if a.is_empty() || a.contains([' ', '"', '\'', '(', ')', '<', '>']) {
                format!("'{a}'")
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

const COMPACTED: &str = "Error: etcdserver: mvcc: required revision has been compacted";
const FUTURE: &str = "Error: etcdserver: mvcc: required revision is a future revision";

/// (a) put / get / delete and their output formats. A fresh store is at
/// revision 1, so the first put is revision 2.
fn scenario_put_get() -> Vec<Step> {
    vec![
        step(&["put", "foo", "bar"]).ok("OK"),
        step(&["get", "foo"]).ok("foo\nbar\n"),
        step(&["get", "foo", "-w", "json"]).ok("\"kvs\""),
        step(&["get", "foo", "-w", "fields"]).ok("\"Key\" : \"foo\""),
        step(&["get", "foo", "--print-value-only"]).ok("bar"),
        step(&["put", "foo", "bar2", "--prev-kv"]).ok("OK\nfoo\nbar\n"),
        step(&["put", "foo", "bar3", "--prev-kv", "-w", "json"]).ok("\"prev_kv\""),
        // Revision 1 exists (the empty store): no error, no output.
        step(&["get", "foo", "--rev=1"]).ok(""),
        step(&["get", "foo", "--rev=2"]).ok("bar"),
        step(&["get", "foo", "--rev=3", "-w", "json"]).ok("\"mod_revision\":3"),
        step(&["get", "nosuchkey"]).ok(""),
        step(&["get", "nosuchkey", "-w", "json"]).ok("\"header\""),
        step(&["del", "foo"]).ok("1"),
        step(&["del", "foo"]).ok("0"),
        step(&["del", "foo", "-w", "json"]).ok("\"header\""),
        step(&["get", "foo", "--rev=4", "-w", "json"]).ok("\"version\":3"),
        // Value read from stdin when omitted; kept byte for byte.
        step(&["put", "multi"]).stdin("line1\nline2\n").ok("OK"),
        step(&["get", "multi", "-w", "json"]).ok("\"count\":1"),
        step(&["get", "multi", "--print-value-only"]).ok("line1\nline2\n"),
    ]
}

/// (b) prefix, ranges, limit, sort, keys-only, from-key, ranged delete.
/// (etcdctl 3.4 has no `--count-only`; `--limit` with `-w json` shows the
/// `count` and `more` fields instead.)
fn scenario_prefix_range() -> Vec<Step> {
    let mut steps: Vec<Step> = (0..10)
        .map(|i| {
            let k = format!("k{i:02}");
            let v = format!("v{i}");
            step(&["put", &k, &v]).ok("OK")
        })
        .collect();
    // Rewrite one key so CREATE and MODIFY orders differ.
    steps.push(step(&["put", "k03", "v3b"]).ok("OK"));
    steps.extend([
        step(&["get", "k", "--prefix"]).ok("k00\nv0\nk01\n"),
        step(&["get", "k", "--prefix", "--limit", "3"]).ok("k02\nv2\n"),
        step(&["get", "k", "--prefix", "--limit", "3", "-w", "json"]).ok("\"more\":true"),
        step(&["get", "k0", "k05"]).ok("k04\nv4\n"),
        step(&["get", "k0", "k05", "-w", "json"]).ok("\"count\":5"),
        step(&["get", "k", "--prefix", "--keys-only"]).ok("k00\n\nk01\n"),
        step(&["get", "k", "--prefix", "--keys-only", "-w", "json"]).ok("\"count\":10"),
        step(&[
            "get",
            "k",
            "--prefix",
            "--sort-by=MODIFY",
            "--order=DESCEND",
            "--limit",
            "2",
        ])
        .ok("k03\nv3b\nk09\nv9\n"),
        step(&[
            "get",
            "k",
            "--prefix",
            "--sort-by=CREATE",
            "--order=DESCEND",
            "--limit",
            "2",
        ])
        .ok("k09\nv9\nk08\nv8\n"),
        step(&[
            "get",
            "k",
            "--prefix",
            "--sort-by=VALUE",
            "--order=DESCEND",
            "--limit",
            "2",
        ])
        .ok("k09\nv9\n"),
        step(&[
            "get",
            "k",
            "--prefix",
            "--sort-by=VERSION",
            "--order=DESCEND",
            "--limit",
            "1",
        ])
        .ok("k03\nv3b\n"),
        step(&[
            "get",
            "k",
            "--prefix",
            "--order=DESCEND",
            "--limit",
            "2",
            "-w",
            "json",
        ])
        .ok("\"more\":true"),
        step(&["get", "--from-key", "k07"]).ok("k07\nv7\nk08\n"),
        step(&["get", "--from-key", "", "--keys-only"]).ok("k00\n"),
        step(&["get", "k05", "--rev=5", "-w", "json"]).ok("\"header\""),
        step(&["get", "k", "--prefix", "--rev=5", "--keys-only"]).ok("k03\n"),
        step(&["del", "k08", "k99"]).ok("2"),
        step(&["del", "k", "--prefix", "--prev-kv"]).ok("8\nk00\nv0\n"),
        step(&["get", "k", "--prefix", "-w", "json"]).ok("\"header\""),
        step(&["del", "k", "--prefix", "-w", "json"]).ok("\"header\""),
    ]);
    steps
}

/// The stdin of `etcdctl txn`: compares, a blank line, success requests, a
/// blank line, failure requests, a blank line (each line as etcdctl's
/// interactive mode reads it; every section must end with an empty line).
fn txn_stdin(compares: &[&str], success: &[&str], failure: &[&str]) -> String {
    let mut s = String::new();
    for section in [compares, success, failure] {
        for line in section {
            s.push_str(line);
            s.push('\n');
        }
        s.push('\n');
    }
    s
}

/// (c) transactions read from stdin, both branches, simple and json output.
fn scenario_txn() -> Vec<Step> {
    vec![
        step(&["txn"])
            .stdin(txn_stdin(
                &[r#"mod("foo") = "0""#],
                &["put foo bar"],
                &["put foo nope"],
            ))
            .ok("SUCCESS\n\nOK\n"),
        step(&["txn"])
            .stdin(txn_stdin(
                &[r#"mod("foo") = "0""#],
                &["put foo bar"],
                &["put foo nope"],
            ))
            .ok("FAILURE\n\nOK\n"),
        step(&["get", "foo"]).ok("foo\nnope\n"),
        step(&["txn", "-w", "json"])
            .stdin(txn_stdin(
                &[r#"value("foo") = "nope""#, r#"version("foo") > "1""#],
                &["get foo", "del foo --prev-kv", "put x y"],
                &["get foo"],
            ))
            .ok("\"succeeded\":true"),
        step(&["txn", "-w", "json"])
            .stdin(txn_stdin(
                &[r#"value("x") = "nope""#],
                &["put x nope"],
                &["get x", "put x y2 --prev-kv"],
            ))
            .ok("\"prev_kv\""),
        // No compares: the success branch runs.
        step(&["txn"])
            .stdin(txn_stdin(&[], &["put a 1", "put b 2", "get x"], &[]))
            .ok("SUCCESS\n\nOK\n\nOK\n\nx\ny2\n"),
        step(&["txn", "-w", "json"])
            .stdin(txn_stdin(
                &[
                    r#"create("a") > "0""#,
                    r#"mod("b") < "100""#,
                    r#"value("a") != "2""#,
                ],
                &["get a --prefix", "del a c"],
                &[],
            ))
            .ok("\"deleted\":2"),
        // Failure branch with no requests.
        step(&["txn"])
            .stdin(txn_stdin(&[r#"version("a") > "0""#], &["put never 1"], &[]))
            .ok("FAILURE\n"),
        step(&["txn", "-w", "json"])
            .stdin(txn_stdin(&[r#"create("a") = "0""#], &[], &[]))
            .ok("\"succeeded\":true"),
        step(&["txn"])
            .stdin(txn_stdin(&[], &["put d 1", "put d 2"], &[]))
            .err("Error: etcdserver: duplicate key given in txn request"),
        step(&["get", "", "--from-key", "-w", "json"]).ok("\"count\":1"),
    ]
}

/// (d) compaction and reads of compacted / future revisions.
fn scenario_compaction() -> Vec<Step> {
    vec![
        step(&["put", "foo", "v1"]).ok("OK"), // rev 2
        step(&["put", "foo", "v2"]).ok("OK"), // rev 3
        step(&["put", "foo", "v3"]).ok("OK"), // rev 4
        step(&["put", "bar", "b"]).ok("OK"),  // rev 5
        step(&["get", "foo", "--rev=2"]).ok("v1"),
        step(&["compaction", "4"]).ok("compacted revision 4"),
        step(&["get", "foo", "--rev=3"]).err(COMPACTED),
        step(&["get", "foo", "--rev=2", "-w", "json"]).err(COMPACTED),
        step(&["get", "foo", "--rev=4"]).ok("foo\nv3\n"),
        step(&["get", "foo", "--rev=4", "-w", "json"]).ok("\"mod_revision\":4"),
        step(&["get", "bar", "--rev=4"]).ok(""),
        step(&["compaction", "4"]).err(COMPACTED),
        step(&["compaction", "3"]).err(COMPACTED),
        step(&["compaction", "99"]).err(FUTURE),
        step(&["compaction", "5", "--physical"]).ok("compacted revision 5"),
        step(&["get", "foo", "--rev=4"]).err(COMPACTED),
        step(&["get", "foo", "-w", "json"]).ok("\"version\":3"),
        step(&["del", "foo"]).ok("1"), // rev 6
        step(&["compaction", "6"]).ok("compacted revision 6"),
        step(&["get", "foo", "--rev=6", "-w", "json"]).ok("\"header\""),
        step(&["get", "", "--from-key", "-w", "json"]).ok("\"count\":1"),
    ]
}

/// (e) endpoint status and hashkv, compared structurally.
fn scenario_status_hashkv() -> Vec<Step> {
    vec![
        step(&["endpoint", "status", "-w", "json"])
            .norm(Norm::EndpointStatus)
            .ok("\"dbSize\""),
        step(&["endpoint", "hashkv", "-w", "json"])
            .norm(Norm::HashKv)
            .ok("\"hash\""),
        step(&["put", "a", "1"]).ok("OK"),
        step(&["put", "a", "2"]).ok("OK"),
        step(&["put", "b", "3"]).ok("OK"),
        step(&["endpoint", "hashkv", "--rev=3", "-w", "json"])
            .norm(Norm::HashKv)
            .ok("\"hash\""),
        step(&["compaction", "3"]).ok("compacted revision 3"),
        step(&["endpoint", "status", "-w", "json"])
            .norm(Norm::EndpointStatus)
            .ok("\"revision\":4"),
        step(&["endpoint", "hashkv", "-w", "json"])
            .norm(Norm::HashKv)
            .ok("\"compact_revision\":3"),
        step(&["endpoint", "hashkv", "--rev=4", "-w", "json"])
            .norm(Norm::HashKv)
            .ok("\"compact_revision\":3"),
        step(&["endpoint", "hashkv", "--rev=2", "-w", "json"]).err(COMPACTED),
        // The compaction point itself is compacted for HashKV (not for Range).
        step(&["endpoint", "hashkv", "--rev=3", "-w", "json"]).err(COMPACTED),
        // Tombstones, a txn's sub revisions, and revisions below the
        // compaction point that a later write superseded (etcd leaves those
        // out of the hash).
        step(&["del", "a"]).ok("1"),
        step(&["txn"])
            .stdin(txn_stdin(&[], &["put x 1", "put y 2", "del b"], &[]))
            .ok("SUCCESS"),
        step(&["put", "a", "again"]).ok("OK"),
        step(&["endpoint", "hashkv", "--rev=5", "-w", "json"])
            .norm(Norm::HashKv)
            .ok("\"hash\""),
        step(&["compaction", "5"]).ok("compacted revision 5"),
        step(&["endpoint", "hashkv", "--rev=6", "-w", "json"])
            .norm(Norm::HashKv)
            .ok("\"compact_revision\":5"),
        step(&["endpoint", "hashkv", "-w", "json"])
            .norm(Norm::HashKv)
            .ok("\"compact_revision\":5"),
        step(&["endpoint", "hashkv"]).ok(", "),
        step(&["endpoint", "health"]).ok_stderr("is healthy"),
    ]
}

/// Default `--max-request-bytes` of both servers: 1.5 MiB.
const MAX_REQUEST_BYTES: usize = 1536 * 1024;

/// (f) errors the server reports.
fn scenario_errors() -> Vec<Step> {
    // Above the server's request limit but below the client's 2 MiB send
    // limit (with a 2 MiB value etcdctl itself refuses to send:
    // "trying to send message larger than max").
    let too_big = vec![b'x'; MAX_REQUEST_BYTES + 100 * 1024];
    let fits = vec![b'y'; MAX_REQUEST_BYTES - 64 * 1024];
    vec![
        step(&["get", "foo", "--rev=99999"]).err(FUTURE),
        step(&["get", "foo", "--rev=2", "-w", "json"]).err(FUTURE),
        step(&["put", "", "v"]).err("Error: etcdserver: key is not provided"),
        step(&["get", ""]).err("Error: etcdserver: key is not provided"),
        step(&["del", ""]).err("Error: etcdserver: key is not provided"),
        // `etcdctl put big < file`: the value comes from stdin.
        step(&["put", "big"])
            .stdin(too_big)
            .err("Error: etcdserver: request is too large"),
        step(&["get", "big", "-w", "json"]).ok("\"header\""),
        step(&["put", "big"]).stdin(fits).ok("OK"),
        step(&["get", "big", "--keys-only"]).ok("big\n"),
        step(&["get", "foo", "--rev=3"]).err(FUTURE),
        step(&["compaction", "2"]).ok("compacted revision 2"),
        step(&["compaction", "0"]).err(COMPACTED),
        step(&["get", "big", "--rev=1"]).err(COMPACTED),
    ]
}

/// etcd's strict reconfiguration checks (`--strict-reconfig-check`, on by
/// default): a single member may take a second voter (the restore
/// procedure) even though it cannot start yet, but then a third voter or a
/// removal would leave too few started members, and a learner needs every
/// voter reachable. All refused before anything is proposed.
fn scenario_strict_reconfig() -> Vec<Step> {
    const NOT_ENOUGH_STARTED: &str =
        "Error: etcdserver: re-configuration failed due to not enough started members";
    vec![
        step(&["member", "add", "m2", "--peer-urls=http://127.0.0.1:1"])
            .norm(Norm::MemberAdd)
            .ok("added to cluster"),
        step(&["member", "add", "m3", "--peer-urls=http://127.0.0.1:2"]).err(NOT_ENOUGH_STARTED),
        step(&["member", "remove", "1234"]).err(NOT_ENOUGH_STARTED),
        step(&[
            "member",
            "add",
            "m4",
            "--learner",
            "--peer-urls=http://127.0.0.1:3",
        ])
        .err("Error: etcdserver: unhealthy cluster"),
    ]
}

/// (g) auth: users, roles, permissions, enable/disable, and what every
/// kind of caller is told (no token, a wrong password, a token without the
/// permission, a non-root caller of auth management or maintenance).
fn scenario_auth() -> Vec<Step> {
    const EMPTY: &str = "Error: etcdserver: user name is empty";
    const DENIED: &str = "Error: etcdserver: permission denied";
    const FAILED: &str = "Error: etcdserver: authentication failed, invalid user ID or password";
    let root = |args: &[&str]| {
        let mut all = vec!["--user", "root:rootpw"];
        all.extend_from_slice(args);
        step(&all)
    };
    let alice = |password: &'static str, args: &[&str]| {
        let user = if password == "old" {
            "alice:apw"
        } else {
            "alice:newpw"
        };
        let mut all = vec!["--user", user];
        all.extend_from_slice(args);
        step(&all)
    };
    vec![
        step(&["auth", "enable"]).err("Error: etcdserver: root user does not exist"),
        step(&["user", "add", "root:rootpw"]).ok("User root created"),
        step(&["user", "add", "root:again"]).err("Error: etcdserver: user name already exists"),
        step(&["user", "list"]).ok("root"),
        step(&["user", "get", "root"]).ok("User: root"),
        // etcdctl adds the root role itself when the server asks for it.
        step(&["auth", "enable"]).ok("Authentication Enabled"),
        step(&["role", "add", "root"]).err(EMPTY),
        step(&["get", "foo"]).err(EMPTY),
        step(&["put", "foo", "bar"]).err(EMPTY),
        step(&["--user", "root:wrong", "get", "foo"]).err(FAILED),
        step(&["--user", "nobody:x", "get", "foo"]).err(FAILED),
        root(&["put", "foo", "bar"]).ok("OK"),
        root(&["get", "foo"]).ok("bar"),
        root(&["role", "add", "reader"]).ok("Role reader created"),
        root(&["role", "add", "reader"]).err("Error: etcdserver: role name already exists"),
        root(&["role", "grant-permission", "reader", "read", "foo"]).ok("updated"),
        root(&[
            "role",
            "grant-permission",
            "reader",
            "readwrite",
            "--prefix=true",
            "pub/",
        ])
        .ok("updated"),
        root(&["role", "grant-permission", "reader", "write", "a", "z"]).ok("updated"),
        root(&["role", "get", "reader"]).ok("KV Read:"),
        root(&["role", "get", "reader", "-w", "json"]).ok("permType"),
        root(&["role", "get", "root"]),
        root(&["role", "list"]).ok("reader"),
        root(&["user", "add", "alice:apw"]).ok("User alice created"),
        root(&["user", "grant-role", "alice", "reader"]).ok("is granted"),
        root(&["user", "grant-role", "alice", "reader"]).ok("is granted"),
        root(&["user", "grant-role", "alice", "nosuch"])
            .err("Error: etcdserver: role name not found"),
        root(&["user", "grant-role", "bob", "reader"])
            .err("Error: etcdserver: user name not found"),
        root(&["user", "get", "alice", "-w", "json"]).ok("reader"),
        root(&["user", "list"]).ok("alice"),
        alice("old", &["get", "foo"]).ok("bar"),
        alice("old", &["put", "foo", "x"]).ok("OK"),
        alice("old", &["put", "pub/x", "1"]).ok("OK"),
        alice("old", &["get", "pub/", "--prefix"]).ok("pub/x"),
        alice("old", &["get", "pub/", "--from-key"]).err(DENIED),
        alice("old", &["get", "zz"]).err(DENIED),
        alice("old", &["put", "zz", "1"]).err(DENIED),
        alice("old", &["put", "foo", "y", "--prev-kv"]).ok("OK"),
        alice("old", &["put", "b", "y", "--prev-kv"]).err(DENIED),
        alice("old", &["del", "foo"]).ok("1"),
        alice("old", &["user", "list"]).err(DENIED),
        alice("old", &["txn"])
            .stdin(txn_stdin(
                &["value(\"foo\") = \"bar\""],
                &["put pub/y 2"],
                &[],
            ))
            .ok("FAILURE"),
        alice("old", &["txn"])
            .stdin(txn_stdin(
                &["value(\"zz\") = \"bar\""],
                &["put pub/y 2"],
                &[],
            ))
            .err(DENIED),
        alice("old", &["txn"])
            .stdin(txn_stdin(&[], &["put pub/y 2"], &["get zz"]))
            .err(DENIED),
        alice("old", &["watch", "zz"]),
        alice("old", &["compaction", "1"]).ok("compacted revision 1"),
        alice("old", &["endpoint", "hashkv"]).err("auth: permission denied"),
        alice("old", &["lease", "list"]).ok("found 0 leases"),
        alice("old", &["user", "passwd", "alice", "--interactive=false"])
            .stdin("newpw\n")
            .err(DENIED),
        root(&["user", "passwd", "alice", "--interactive=false"])
            .stdin("newpw\n")
            .ok("Password updated"),
        alice("old", &["get", "foo"]).err(FAILED),
        alice("new", &["get", "pub/x"]).ok("1"),
        root(&["role", "revoke-permission", "reader", "foo"]).ok("is revoked"),
        root(&["role", "revoke-permission", "reader", "foo"])
            .err("Error: etcdserver: permission is not granted to the role"),
        alice("new", &["get", "foo"]).err(DENIED),
        root(&["user", "revoke-role", "alice", "reader"]).ok("is revoked"),
        root(&["user", "revoke-role", "alice", "reader"])
            .err("Error: etcdserver: role is not granted to the user"),
        alice("new", &["get", "pub/x"]).err(DENIED),
        root(&["user", "revoke-role", "root", "root"])
            .err("Error: etcdserver: invalid auth management"),
        root(&["role", "delete", "root"]).err("Error: etcdserver: invalid auth management"),
        root(&["user", "delete", "root"]).err("Error: etcdserver: invalid auth management"),
        root(&["role", "delete", "reader"]).ok("Role reader deleted"),
        root(&["role", "delete", "reader"]).err("Error: etcdserver: role name not found"),
        root(&["user", "delete", "alice"]).ok("User alice deleted"),
        root(&["user", "delete", "alice"]).err("Error: etcdserver: user name not found"),
        root(&["user", "add", "bob", "--no-password"]).ok("User bob created"),
        step(&["--user", "bob:", "get", "foo"]).err(EMPTY),
        root(&["auth", "disable"]).ok("Authentication Disabled"),
        step(&["auth", "disable"]).ok("Authentication Disabled"),
        step(&["get", "pub/x"]).ok("1"),
        step(&["user", "list"]).ok("bob"),
        step(&["role", "list"]).ok("root"),
        step(&["--user", "root:rootpw", "get", "pub/x"]).ok("1"),
    ]
}

/// What etcd 3.4 allows only to root once auth is on — membership changes
/// (its `checkMembershipOperationPermission`), Defragment and HashKV (its
/// Maintenance `isAuthenticated`), auth management — asked by no user, by
/// a user without the root role and by root; and what it leaves open to
/// any caller (Status, Alarm, MoveLeader). Root's answers show the check
/// passed (a learner added, then a member that does not exist).
fn scenario_admin_only() -> Vec<Step> {
    const EMPTY: &str = "Error: etcdserver: user name is empty";
    const DENIED: &str = "Error: etcdserver: permission denied";
    let as_user = |who: &'static str, args: &[&str]| {
        let mut all = Vec::new();
        if !who.is_empty() {
            all.extend(["--user", who]);
        }
        all.extend_from_slice(args);
        step(&all)
    };
    let membership: [&[&str]; 4] = [
        &[
            "member",
            "add",
            "m2",
            "--learner",
            "--peer-urls=http://127.0.0.1:1",
        ],
        &["member", "update", "1234", "--peer-urls=http://127.0.0.1:2"],
        &["member", "remove", "1234"],
        &["member", "promote", "1234"],
    ];
    let mut steps = vec![
        step(&["user", "add", "root:rootpw"]).ok("User root created"),
        step(&["user", "add", "alice:apw"]).ok("User alice created"),
        step(&["role", "add", "reader"]).ok("Role reader created"),
        step(&["user", "grant-role", "alice", "reader"]).ok("is granted"),
        step(&["auth", "enable"]).ok("Authentication Enabled"),
    ];
    for args in membership {
        steps.push(as_user("", args).err(EMPTY));
        steps.push(as_user("alice:apw", args).err(DENIED));
        steps.push(as_user("root:x", args).err("authentication failed"));
    }
    steps.extend([
        // Malformed URLs are refused before the caller is looked at.
        as_user("", &["member", "add", "m3", "--peer-urls=127.0.0.1:1"]).err("Error:"),
        as_user("root:rootpw", membership[0])
            .norm(Norm::MemberAdd)
            .ok("added to cluster"),
        as_user("root:rootpw", membership[1]).err("Error:"),
        as_user("root:rootpw", membership[2]).err("Error:"),
        as_user("root:rootpw", membership[3]).err("Error:"),
        as_user("", &["defrag"]).err("auth: user name is empty"),
        as_user("alice:apw", &["defrag"]).err("auth: permission denied"),
        as_user("root:rootpw", &["defrag"]).ok("Finished defragmenting"),
        as_user("", &["endpoint", "hashkv"]).err("auth: user name is empty"),
        as_user("alice:apw", &["endpoint", "hashkv"]).err("auth: permission denied"),
        as_user("root:rootpw", &["endpoint", "hashkv", "-w", "json"])
            .norm(Norm::HashKv)
            .ok("\"hash\""),
        as_user("", &["user", "add", "bob:b"]).err(EMPTY),
        as_user("alice:apw", &["user", "add", "bob:b"]).err(DENIED),
        as_user("alice:apw", &["user", "get", "root"]).err(DENIED),
        as_user("alice:apw", &["user", "get", "alice"]).ok("User: alice"),
        as_user("alice:apw", &["role", "get", "root"]).err(DENIED),
        as_user("alice:apw", &["role", "get", "reader"]).ok("Role reader"),
        as_user("alice:apw", &["role", "list"]).err(DENIED),
        as_user("alice:apw", &["role", "add", "r2"]).err(DENIED),
        as_user("alice:apw", &["user", "grant-role", "alice", "root"]).err(DENIED),
        as_user("alice:apw", &["auth", "disable"]).err(DENIED),
        as_user("", &["auth", "disable"]).err(EMPTY),
        // Open to every caller in etcd 3.4.
        as_user("", &["endpoint", "status", "-w", "json"]).norm(Norm::EndpointStatus),
        as_user("alice:apw", &["endpoint", "status", "-w", "json"]).norm(Norm::EndpointStatus),
        as_user("", &["alarm", "list"]),
        as_user("alice:apw", &["alarm", "list"]),
        as_user("alice:apw", &["move-leader", "1234"]).err("Error:"),
        as_user("root:rootpw", &["auth", "disable"]).ok("Authentication Disabled"),
    ]);
    steps
}

/// etcd's backend quota with `--quota-backend-bytes 1`: every store is
/// already too big, so both servers refuse the first put and raise NOSPACE
/// at the same step (a real quota is reached at a store size that depends
/// on each server's layout: `quota::the_nospace_alarm_*` fills one).
/// Under the alarm reads, read-only txns and deletes work, puts and lease
/// grants do not; disarming clears the list until the next put finds the
/// store still too big.
fn scenario_nospace() -> Vec<Step> {
    const NOSPACE: &str = "Error: etcdserver: mvcc: database space exceeded";
    vec![
        step(&["get", "k"]),
        step(&["alarm", "list"]),
        step(&["put", "k", "v"]).err(NOSPACE),
        step(&["alarm", "list"]).ok("alarm:NOSPACE"),
        step(&["put", "k", "v"]).err(NOSPACE),
        step(&["get", "k", "-w", "json"]).ok("\"header\""),
        step(&["del", "k"]).ok("0"),
        step(&["txn"])
            .stdin(txn_stdin(&[], &["get k"], &[]))
            .ok("SUCCESS"),
        step(&["txn"])
            .stdin(txn_stdin(&[], &["put k v"], &[]))
            .err(NOSPACE),
        step(&["lease", "grant", "10"])
            .err("Error: failed to grant lease (etcdserver: mvcc: database space exceeded)"),
        step(&["endpoint", "status", "-w", "json"])
            .norm(Norm::EndpointStatus)
            .ok("alarm:NOSPACE"),
        step(&["compaction", "1"]).ok("compacted revision 1"),
        step(&["defrag"]).ok("Finished defragmenting"),
        step(&["alarm", "disarm"]).ok("alarm:NOSPACE"),
        step(&["alarm", "list"]),
        step(&["endpoint", "status", "-w", "json"]).norm(Norm::EndpointStatus),
        step(&["put", "k", "v"]).err(NOSPACE),
        step(&["alarm", "list", "-w", "json"]).ok("\"alarms\""),
    ]
}

/// Every scenario, with the flags both servers start with.
fn all_scenarios() -> Vec<(&'static str, Vec<Step>, &'static [&'static str])> {
    vec![
        ("put_get", scenario_put_get(), &[]),
        ("prefix_range", scenario_prefix_range(), &[]),
        ("txn", scenario_txn(), &[]),
        ("compaction", scenario_compaction(), &[]),
        ("status_hashkv", scenario_status_hashkv(), &[]),
        ("errors", scenario_errors(), &[]),
        ("strict_reconfig", scenario_strict_reconfig(), &[]),
        ("auth", scenario_auth(), &[]),
        ("admin_only", scenario_admin_only(), &[]),
        ("nospace", scenario_nospace(), &QUOTA_OF_ONE_BYTE),
    ]
}

// ---------------------------------------------------------------------------
// Normalisation

/// Replaces the value after every occurrence of `prefix` (e.g.
/// `"cluster_id":`): a JSON number with `0`, or a JSON string with
/// `"<masked>"`. Everything else is kept byte for byte.
fn mask_after(text: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find(prefix) {
        let (head, tail) = rest.split_at(pos + prefix.len());
        out.push_str(head);
        let bytes = tail.as_bytes();
        let mut end = 0;
        if bytes.first() == Some(&b'"') {
            end = 1;
            while end < bytes.len() && bytes[end] != b'"' {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            end = (end + 1).min(bytes.len());
            out.push_str("\"<masked>\"");
        } else {
            if bytes.first() == Some(&b'-') {
                end = 1;
            }
            while end < bytes.len() && bytes[end].is_ascii_digit() {
                end += 1;
            }
            if end > 0 {
                out.push('0');
            }
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Bytes as text, keeping invalid UTF-8 visible (so it cannot compare equal
/// to a lossy replacement).
fn as_text(bytes: &[u8]) -> String {
    match String::from_utf8(bytes.to_vec()) {
        Ok(s) => s,
        Err(e) => format!("<non-UTF-8 output: {:?}>", e.into_bytes()),
    }
}

/// The rules for every stdout and stderr:
/// - the server's endpoint address (`127.0.0.1:<port>`) → `<endpoint>`;
/// - `-w json` headers: `cluster_id`, `member_id` → 0 (they identify the
///   cluster and member, derived from each server's own peer URLs);
///   `raft_term` is compared: a fresh member of both elects itself at
///   term 2;
/// - `-w fields`: `"ClusterID"`, `"MemberID"` → 0 likewise;
/// - the client's zap warning lines on stderr
///   (`{"level":"warn","ts":...,"target":...}`): `ts` (wall clock) and
///   `target` (random client id + endpoint) masked. Their `error` field,
///   which carries the gRPC status code and message, is compared.
pub(crate) fn normalize_text(text: &str, endpoint: &str) -> String {
    let mut s = mask_took(&text.replace(endpoint, "<endpoint>"));
    for prefix in [
        "\"cluster_id\":",
        "\"member_id\":",
        "\"ClusterID\" : ",
        "\"MemberID\" : ",
        "\"ts\":",
        "\"target\":",
        // `alarm list`/`alarm disarm` print `memberID:<id> alarm:NOSPACE `
        // (`"memberID":<id>` with `-w json`).
        "memberID:",
        "\"memberID\":",
    ] {
        s = mask_after(&s, prefix);
    }
    s
}

/// `endpoint health` reports its latency: `... is healthy: successfully
/// committed proposal: took = 6.02ms` → `took = <duration>`.
fn mask_took(text: &str) -> String {
    const TOOK: &str = "took = ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find(TOOK) {
        out.push_str(&rest[..pos + TOOK.len()]);
        out.push_str("<duration>");
        rest = &rest[pos + TOOK.len()..];
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn zero_if_present(obj: &mut Value, key: &str) {
    if let Some(v) = obj.get_mut(key) {
        *v = Value::from(0);
    }
}

fn zero_header_ids(header: Option<&mut Value>) {
    if let Some(h) = header {
        for k in ["cluster_id", "member_id"] {
            zero_if_present(h, k);
        }
    }
}

/// `Member 8e16.. added to cluster 24aa..` and `ETCD_INITIAL_CLUSTER="a=..,b=.."`.
fn normalize_member_add(text: &str) -> String {
    let new_member = text
        .lines()
        .find_map(|l| l.strip_prefix("ETCD_NAME="))
        .map(|n| format!("{}=", n.trim_matches('"')))
        .unwrap_or_default();
    text.lines()
        .map(|line| {
            if let Some(rest) = line.strip_prefix("Member ") {
                if rest.contains(" added to cluster ") {
                    return "Member <id> added to cluster <id>".to_string();
                }
            }
            if let Some(list) = line.strip_prefix("ETCD_INITIAL_CLUSTER=") {
                // The founding member's name and peer URL are the harness'
                // choice for each server; the new member's are the step's.
                let mut members: Vec<&str> = list
                    .trim_matches('"')
                    .split(',')
                    .map(|m| {
                        if m.starts_with(&new_member) {
                            m
                        } else {
                            "<member>"
                        }
                    })
                    .collect();
                members.sort_unstable();
                return format!("ETCD_INITIAL_CLUSTER=\"{}\"", members.join(","));
            }
            line.to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `endpoint status -w json` is `[{"Endpoint":..,"Status":{header, version,
/// dbSize, leader, raftIndex, raftTerm, raftAppliedIndex, dbSizeInUse, ..}}]`.
/// Compared: the set of keys everywhere, header.revision, the raft terms,
/// and any other field (e.g. isLearner, errors). Replaced: the endpoint,
/// header ids, `version` (server version string), `dbSize`/`dbSizeInUse`
/// (storage layout), `raftIndex`/`raftAppliedIndex` (count raft entries
/// such as conf changes and etcd's internal publishes, not data). `leader` becomes `"<self>"` when it
/// equals the member id (a single member leads itself), else `"<other>"`.
fn normalize_status(v: &mut Value) {
    let Some(items) = v.as_array_mut() else {
        return;
    };
    for item in items {
        if let Some(e) = item.get_mut("Endpoint") {
            *e = Value::from("<endpoint>");
        }
        let Some(st) = item.get_mut("Status") else {
            continue;
        };
        let member = st.pointer("/header/member_id").cloned();
        if let Some(l) = st.get_mut("leader") {
            *l = Value::from(if Some(&*l) == member.as_ref() {
                "<self>"
            } else {
                "<other>"
            });
        }
        zero_header_ids(st.get_mut("header"));
        if let Some(ver) = st.get_mut("version") {
            *ver = Value::from("<version>");
        }
        for k in ["dbSize", "dbSizeInUse", "raftIndex", "raftAppliedIndex"] {
            zero_if_present(st, k);
        }
        // Alarms name the member that raised them.
        if let Some(Value::Array(errors)) = st.get_mut("errors") {
            for e in errors {
                if let Value::String(text) = e {
                    *text = mask_after(text, "memberID:");
                }
            }
        }
    }
}

/// `endpoint hashkv -w json` is `[{"Endpoint":..,"HashKV":{header, hash,
/// compact_revision}}]`. Everything but the endpoint and the header ids is
/// compared, the hash too: metcd hashes its revisions in etcd's bbolt
/// layout, so the same history gives etcd's number.
fn normalize_hashkv(v: &mut Value) {
    let Some(items) = v.as_array_mut() else {
        return;
    };
    for item in items {
        if let Some(e) = item.get_mut("Endpoint") {
            *e = Value::from("<endpoint>");
        }
        if let Some(h) = item.get_mut("HashKV") {
            zero_header_ids(h.get_mut("header"));
        }
    }
}

/// A normalised run: what is compared.
#[derive(Debug, PartialEq)]
struct Seen {
    exit: String,
    stdout: String,
    stderr: String,
}

fn normalize(step: &Step, endpoint: &str, out: &Output) -> Seen {
    let exit = match out.status.code() {
        Some(c) => format!("exit {c}"),
        None => format!("{}", out.status),
    };
    let raw_stdout = as_text(&out.stdout);
    let stdout = match step.norm {
        Norm::Exact => normalize_text(&raw_stdout, endpoint),
        Norm::MemberAdd => normalize_member_add(&normalize_text(&raw_stdout, endpoint)),
        Norm::EndpointStatus | Norm::HashKv => match serde_json::from_str::<Value>(&raw_stdout) {
            Ok(mut v) => {
                if step.norm == Norm::EndpointStatus {
                    normalize_status(&mut v);
                } else {
                    normalize_hashkv(&mut v);
                }
                serde_json::to_string_pretty(&v).unwrap()
            }
            // Errors print nothing on stdout; anything else is shown as is.
            Err(e) if !raw_stdout.is_empty() => format!(
                "<stdout is not JSON ({e})>\n{}",
                normalize_text(&raw_stdout, endpoint)
            ),
            Err(_) => String::new(),
        },
    };
    Seen {
        exit,
        stdout,
        stderr: normalize_text(&as_text(&out.stderr), endpoint),
    }
}

// ---------------------------------------------------------------------------
// Runner

fn run_step(target: &dyn Target, step: &Step) -> Output {
    let args: Vec<&str> = step.args.iter().map(String::as_str).collect();
    etcdctl_with(&target.endpoint(), &[], &args, step.stdin.as_deref())
}

fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

fn clip(s: &str) -> String {
    const MAX: usize = 3000;
    if s.len() <= MAX {
        format!("{s:?}")
    } else {
        let mut end = MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{:?}... ({} bytes)", &s[..end], s.len())
    }
}

/// Checks the reference's raw output against what the step is meant to
/// exercise. `None` when it holds.
fn check_expect(step: &Step, raw: &Output) -> Option<String> {
    let ok = raw.status.success();
    match &step.expect {
        Expect::Any => None,
        Expect::Ok(want) if ok && as_text(&raw.stdout).contains(want) => None,
        Expect::OkStderr(want) if ok && as_text(&raw.stderr).contains(want) => None,
        Expect::Err(want) if !ok && as_text(&raw.stderr).contains(want) => None,
        Expect::Ok(want) => Some(format!("expected success with stdout containing {want:?}")),
        Expect::OkStderr(want) => Some(format!("expected success with stderr containing {want:?}")),
        Expect::Err(want) => Some(format!("expected failure with stderr containing {want:?}")),
    }
}

/// Runs `steps` in order against both targets (each step on the reference,
/// then on the candidate) and returns a report of every difference, or
/// `None` when all matched. Panics if the reference itself does not do what
/// a step expects (a broken scenario, not a compatibility bug).
fn compare(
    scenario: &str,
    steps: &[Step],
    reference: &dyn Target,
    candidate: &dyn Target,
) -> Option<String> {
    let started = Instant::now();
    let (rl, cl) = (reference.label(), candidate.label());
    let mut report = String::new();
    let mut diffs = 0;
    for (i, step) in steps.iter().enumerate() {
        if started.elapsed() > SCENARIO_BUDGET {
            diffs += 1;
            report.push_str(&format!(
                "\n(stopped before step {i}: scenario over its {SCENARIO_BUDGET:?} budget)\n"
            ));
            break;
        }
        let r_raw = run_step(reference, step);
        let r = normalize(step, &reference.endpoint(), &r_raw);
        if let Some(why) = check_expect(step, &r_raw) {
            panic!(
                "scenario {scenario} step {i} `{}`: the reference {rl} did not \
                 behave as the scenario assumes: {why}\n got {r:#?}\n{rl} log tail:\n{}",
                step.describe(),
                tail(&reference.log_text(), 3000)
            );
        }
        let c_raw = run_step(candidate, step);
        let c = normalize(step, &candidate.endpoint(), &c_raw);
        // The transcript (shown by the test runner on failure, or with
        // --nocapture).
        println!(
            "[{scenario} {i}] {}\n  {}  stdout {}  stderr {}{}",
            step.describe(),
            r.exit,
            clip(&r.stdout),
            clip(&r.stderr),
            if r == c { "" } else { "  <-- differs" }
        );
        if r == c {
            continue;
        }
        diffs += 1;
        report.push_str(&format!("\nstep {i}: {}\n", step.describe()));
        if r.exit != c.exit {
            report.push_str(&format!(
                "  exit    {rl}: {}\n          {cl}: {}\n",
                r.exit, c.exit
            ));
        }
        if r.stdout != c.stdout {
            report.push_str(&format!(
                "  stdout  {rl}: {}\n          {cl}: {}\n",
                clip(&r.stdout),
                clip(&c.stdout)
            ));
        }
        if r.stderr != c.stderr {
            report.push_str(&format!(
                "  stderr  {rl}: {}\n          {cl}: {}\n",
                clip(&r.stderr),
                clip(&c.stderr)
            ));
        }
        // A candidate that cannot be reached or hangs makes every later step
        // wait for etcdctl's timeouts: stop here.
        let hung = |s: &str| {
            s.contains("context deadline exceeded") || s.contains("<test harness: killed")
        };
        if hung(&c.stderr) && !hung(&r.stderr) {
            report.push_str(&format!(
                "\n(stopped after step {i}: {cl} unreachable or timing out)\n"
            ));
            break;
        }
    }
    if diffs == 0 {
        return None;
    }
    Some(format!(
        "scenario {scenario}: {cl} differs from {rl} in {diffs} step(s) \
         (outputs normalised, see server/tests/it/etcdctl.rs):\n{report}\n\
         {cl} log tail:\n{}",
        tail(&candidate.log_text(), 3000)
    ))
}

/// Starts a fresh real etcd and a fresh metcd and compares one scenario.
fn etcd_vs_metcd(scenario: &str, steps: Vec<Step>) {
    etcd_vs_metcd_with(scenario, steps, &[]);
}

/// As [`etcd_vs_metcd`], both servers started with `flags` too.
fn etcd_vs_metcd_with(scenario: &str, steps: Vec<Step>, flags: &[&str]) {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    // Let etcd elect itself while metcd starts.
    let mut etcd = RealEtcd::spawn_with(&dir.path().join("etcd"), flags);
    let metcd = Metcd::start_with(dir.path(), flags);
    etcd.wait_healthy();
    let etcd = EtcdTarget("etcd", etcd);
    if let Some(report) = compare(scenario, &steps, &etcd, &metcd) {
        panic!("{report}");
    }
}

#[test]
fn put_get_matches_etcd() {
    etcd_vs_metcd("put_get", scenario_put_get());
}

#[test]
fn prefix_range_limit_sort_match_etcd() {
    etcd_vs_metcd("prefix_range", scenario_prefix_range());
}

#[test]
fn txn_from_stdin_matches_etcd() {
    etcd_vs_metcd("txn", scenario_txn());
}

#[test]
fn compaction_matches_etcd() {
    etcd_vs_metcd("compaction", scenario_compaction());
}

#[test]
fn endpoint_status_and_hashkv_match_etcd() {
    etcd_vs_metcd("status_hashkv", scenario_status_hashkv());
}

#[test]
fn strict_reconfig_checks_match_etcd() {
    etcd_vs_metcd("strict_reconfig", scenario_strict_reconfig());
}

#[test]
fn auth_users_roles_and_permissions_match_etcd() {
    etcd_vs_metcd("auth", scenario_auth());
}

/// The membership-change hole (any user could add or remove members once
/// auth was on) stays closed, and every other root-only call with it.
#[test]
fn admin_only_calls_refuse_others_as_etcd_does() {
    etcd_vs_metcd("admin_only", scenario_admin_only());
}

#[test]
fn errors_match_etcd() {
    etcd_vs_metcd("errors", scenario_errors());
}

#[test]
fn nospace_alarm_matches_etcd() {
    etcd_vs_metcd_with("nospace", scenario_nospace(), &QUOTA_OF_ONE_BYTE);
}

const QUOTA_OF_ONE_BYTE: [&str; 2] = ["--quota-backend-bytes", "1"];

/// Every scenario against two real etcds (fresh data for each scenario):
/// must pass, or the normalisation is too weak (or a scenario depends on
/// something nondeterministic).
#[test]
fn harness_self_check_etcd_vs_etcd() {
    require_etcd();
    let mut failures = Vec::new();
    for (name, steps, flags) in all_scenarios() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = RealEtcd::spawn_with(&dir.path().join("a"), flags);
        let mut b = RealEtcd::spawn_with(&dir.path().join("b"), flags);
        a.wait_healthy();
        b.wait_healthy();
        assert_ne!(a.endpoint, b.endpoint);
        let a = EtcdTarget("etcd-a", a);
        let b = EtcdTarget("etcd-b", b);
        if let Some(report) = compare(name, &steps, &a, &b) {
            failures.push(report);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Negative control: the runner does report a server that behaves
/// differently (here an etcd with a 1000-byte request limit).
#[test]
fn harness_reports_a_differing_server() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let mut a = RealEtcd::spawn(&dir.path().join("a"));
    let mut b = RealEtcd::spawn_with(&dir.path().join("b"), &["--max-request-bytes", "1000"]);
    a.wait_healthy();
    b.wait_healthy();
    let (a, b) = (EtcdTarget("etcd", a), EtcdTarget("small-etcd", b));
    let steps = vec![
        step(&["put", "k", "v"]).ok("OK"),
        step(&["put", "big"]).stdin(vec![b'x'; 2000]).ok("OK"),
        step(&["get", "k", "-w", "json"]).ok("\"count\":1"),
    ];
    let report = compare("negative_control", &steps, &a, &b)
        .expect("a server with a smaller request limit went unnoticed");
    assert!(
        report.contains("differs from etcd in 2 step(s)")
            && report.contains("step 1: etcdctl put big")
            && report.contains("etcdserver: request is too large")
            && report.contains("step 2: etcdctl get k -w json"),
        "{report}"
    );
}

/// The normaliser itself: masks only the named fields.
#[test]
fn normalizer_masks_only_volatile_fields() {
    let out = r#"{"header":{"cluster_id":324952591200643719,"member_id":3319814642761637952,"revision":2,"raft_term":2},"kvs":[{"key":"Zm9v","create_revision":2}],"count":1}"#;
    assert_eq!(
        normalize_text(out, "127.0.0.1:1"),
        r#"{"header":{"cluster_id":0,"member_id":0,"revision":2,"raft_term":2},"kvs":[{"key":"Zm9v","create_revision":2}],"count":1}"#
    );
    let log = r#"{"level":"warn","ts":"2026-11-26T02:44:44.511Z","caller":"clientv3/retry_interceptor.go:62","msg":"retrying of unary invoker failed","target":"endpoint://client-e3/127.0.0.1:23790","attempt":0,"error":"rpc error: code = OutOfRange desc = x"}"#;
    assert_eq!(
        normalize_text(log, "127.0.0.1:23790"),
        r#"{"level":"warn","ts":"<masked>","caller":"clientv3/retry_interceptor.go:62","msg":"retrying of unary invoker failed","target":"<masked>","attempt":0,"error":"rpc error: code = OutOfRange desc = x"}"#
    );
    assert_eq!(
        normalize_text(
            "\"ClusterID\" : 12\n\"Revision\" : 3\n\"RaftTerm\" : 2\n",
            "x"
        ),
        "\"ClusterID\" : 0\n\"Revision\" : 3\n\"RaftTerm\" : 2\n"
    );
    assert_eq!(
        mask_after(r#"a"ts":"x\"y"b"#, "\"ts\":"),
        r#"a"ts":"<masked>"b"#
    );
}

/// `etcdctl check datascale`: reads `process_resident_memory_bytes` from
/// the client URL's `/metrics` before and after 10,000 puts of 1 KiB from
/// 50 clients, then deletes them, compacts and defragments; it passes, and
/// the store is left as it was found.
#[test]
fn check_datascale_passes() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    let ep = s.client_endpoint();
    let out = etcdctl_with(
        &ep,
        &[],
        &[
            "check",
            "datascale",
            "--load",
            "s",
            "--auto-compact",
            "--auto-defrag",
        ],
        None,
    );
    let text = as_text(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", as_text(&out.stderr));
    assert!(
        text.contains("PASS: Approximate system memory used"),
        "{text}"
    );
    let left = etcdctl_with(
        &ep,
        &[],
        &["get", "--prefix", "/", "--keys-only", "-w", "json"],
        None,
    );
    let json: Value = serde_json::from_slice(&left.stdout).unwrap();
    assert_eq!(json.get("count"), None, "no key left: {json}");
    assert!(
        json["header"]["revision"].as_i64().unwrap() > 10_000,
        "the load went through the store: {json}"
    );
}

/// The whole auth scenario again with JWT tokens on both servers
/// (`--auth-token jwt,...,sign-method=RS256`, the test keys).
#[test]
fn auth_with_jwt_tokens_matches_etcd() {
    let flag = crate::auth::jwt_flag("RS256");
    etcd_vs_metcd_with("auth_jwt", scenario_auth(), &["--auth-token", &flag]);
}
