//! What every `metcd` flag means, its unit and its default: the one source
//! of `metcd --help` and of the flag table in docs/operations.md (a test
//! keeps the file equal to [`markdown`]).
//!
//! Flags are grouped as etcd's `--help` groups them (member, clustering,
//! security, auth, experimental), then metcd's own. A default written as a
//! value is the value [`crate::config::Config`] takes when the flag is
//! absent (tested: giving it explicitly changes nothing); one in
//! parentheses is a rule (it depends on other flags or on the machine).

use clap::{CommandFactory, FromArgMatches};

use crate::config::Flags;

/// etcd's groups, in its order, then ours.
pub const GROUPS: &[&str] = &[
    "Member",
    "Clustering",
    "Security",
    "Auth",
    "Experimental",
    "metcd",
];

/// One flag's documentation.
#[derive(Debug, Clone, Copy)]
pub struct FlagDoc {
    pub group: &'static str,
    /// The long name, without `--`.
    pub name: &'static str,
    /// What the value is, with its unit (`<ms>`, `<bytes>`, `<urls>`).
    pub value: &'static str,
    /// The value taken when the flag is absent (see the module doc).
    pub default: &'static str,
    pub help: &'static str,
}

const fn flag(
    group: &'static str,
    name: &'static str,
    value: &'static str,
    default: &'static str,
    help: &'static str,
) -> FlagDoc {
    FlagDoc {
        group,
        name,
        value,
        default,
        help,
    }
}

/// Every flag `metcd` takes (the test-only hidden one aside).
pub const FLAGS: &[FlagDoc] = &[
    // Member
    flag("Member", "name", "<name>", "default", "Human-readable name of this member."),
    flag(
        "Member",
        "data-dir",
        "<path>",
        "(<name>.metcd)",
        "WAL (member/wal) and snapshots (member/snap); locked against a second process. Relative to the working directory at start.",
    ),
    flag(
        "Member",
        "listen-peer-urls",
        "<urls>",
        "(the advertise peer URLs, when the cluster has peers)",
        "Where peers connect (metcd's own peer protocol over TCP or TLS, or over a Unix socket: `unix://<file>`, the file named by the URL's host and path as in etcd).",
    ),
    flag(
        "Member",
        "listen-client-urls",
        "<urls>",
        "http://127.0.0.1:2379",
        "etcd's v3 gRPC API, its JSON gateway and /health, /version, /metrics; `unix://<file>` listens on a Unix socket (on one shard).",
    ),
    flag(
        "Member",
        "listen-metrics-urls",
        "<urls>",
        "(none)",
        "More URLs serving /metrics and /health only (for Prometheus); https:// ones use --cert-file and --key-file (and --client-cert-auth), as in etcd.",
    ),
    flag(
        "Member",
        "metrics",
        "<basic|extensive>",
        "basic",
        "extensive adds grpc_server_handling_seconds, each gRPC method's handling time, to /metrics (as etcd).",
    ),
    flag(
        "Member",
        "snapshot-count",
        "<entries>",
        "100000",
        "Applied entries between two snapshots (WAL segments are released after one).",
    ),
    flag("Member", "heartbeat-interval", "<ms>", "100", "Time of a Raft heartbeat."),
    flag(
        "Member",
        "election-timeout",
        "<ms>",
        "1000",
        "Time a follower waits for the leader before it campaigns.",
    ),
    flag(
        "Member",
        "quota-backend-bytes",
        "<bytes>",
        "0",
        "Backend quota: a write past it raises NOSPACE. 0 = 2 GiB (etcd's default), negative = no quota.",
    ),
    flag("Member", "max-txn-ops", "<ops>", "128", "Most operations in one txn."),
    flag(
        "Member",
        "max-concurrent-streams",
        "<streams>",
        "4096",
        "HTTP/2 streams one client connection may have open at once (etcd: unlimited). Given explicitly, it also caps the JSON gateway's requests of the member together, as etcd's gateway shares its one connection to the server.",
    ),
    flag(
        "Member",
        "max-request-bytes",
        "<bytes>",
        "1572864",
        "Largest client request accepted.",
    ),
    // Clustering
    flag(
        "Clustering",
        "initial-advertise-peer-urls",
        "<urls>",
        "http://localhost:2380",
        "This member's peer URLs, announced to the cluster; with the cluster token they give the member ID.",
    ),
    flag(
        "Clustering",
        "initial-cluster",
        "<name=url,...>",
        "(<name>=<initial-advertise-peer-urls>)",
        "Every member of a new cluster; this member's entry must equal its advertise peer URLs.",
    ),
    flag(
        "Clustering",
        "initial-cluster-state",
        "<new|existing>",
        "new",
        "new: bootstrap; existing: join a running cluster after `etcdctl member add`.",
    ),
    flag(
        "Clustering",
        "initial-cluster-token",
        "<token>",
        "etcd-cluster",
        "Cluster token; with the peer URLs it gives the cluster and member IDs.",
    ),
    flag(
        "Clustering",
        "advertise-client-urls",
        "<urls>",
        "(the listen client URLs)",
        "Client URLs shown in member lists.",
    ),
    flag(
        "Clustering",
        "strict-reconfig-check",
        "<bool>",
        "true",
        "Refuse membership changes that would leave too few started or reachable members.",
    ),
    flag(
        "Clustering",
        "auto-compaction-mode",
        "<periodic|revision>",
        "periodic",
        "How auto-compaction-retention is read.",
    ),
    flag(
        "Clustering",
        "auto-compaction-retention",
        "<hours|duration|revisions>",
        "0",
        "History kept by auto-compaction: periodic: hours (1) or a duration (30m); revision: a count. 0 = off.",
    ),
    // Security
    flag(
        "Security",
        "cert-file",
        "<path>",
        "(none)",
        "Certificate chain (PEM) of the client URLs; with it they are https://.",
    ),
    flag("Security", "key-file", "<path>", "(none)", "Private key (PEM) of cert-file."),
    flag(
        "Security",
        "client-cert-auth",
        "<bool>",
        "false",
        "Refuse clients without a certificate of trusted-ca-file.",
    ),
    flag(
        "Security",
        "trusted-ca-file",
        "<path>",
        "(none)",
        "CA that client certificates must chain to (client certificates are then required).",
    ),
    flag(
        "Security",
        "peer-cert-file",
        "<path>",
        "(none)",
        "Certificate chain (PEM) presented to peers; with it peer URLs are https://.",
    ),
    flag("Security", "peer-key-file", "<path>", "(none)", "Private key (PEM) of peer-cert-file."),
    flag(
        "Security",
        "peer-client-cert-auth",
        "<bool>",
        "false",
        "Refuse peers connecting in without a certificate of peer-trusted-ca-file.",
    ),
    flag(
        "Security",
        "auto-tls",
        "<bool>",
        "false",
        "https:// client URLs without cert-file get a self-signed certificate (made once in <data-dir>/fixtures/client).",
    ),
    flag(
        "Security",
        "peer-auto-tls",
        "<bool>",
        "false",
        "https:// peer URLs without peer-cert-file get a self-signed certificate (<data-dir>/fixtures/peer); peers then verify none, as in etcd.",
    ),
    flag(
        "Security",
        "client-crl-file",
        "<path>",
        "(none)",
        "Certificate revocation list (PEM or DER): client certificates it lists are refused.",
    ),
    flag(
        "Security",
        "peer-crl-file",
        "<path>",
        "(none)",
        "Certificate revocation list for peer certificates (with peer-client-cert-auth).",
    ),
    flag(
        "Security",
        "peer-cert-allowed-cn",
        "<name>",
        "(any)",
        "Peers' certificates must carry this common name (checked both ways; peers must present one).",
    ),
    flag(
        "Security",
        "peer-cert-allowed-hostname",
        "<host>",
        "(any)",
        "Peers' certificates must be valid for this host name (their SANs).",
    ),
    flag(
        "Security",
        "cipher-suites",
        "<names>",
        "(every suite)",
        "TLS 1.2 cipher suites offered to clients and peers, Go's names comma-separated (ECDHE with AES-GCM or ChaCha20-Poly1305); TLS 1.3's are always offered, as in Go.",
    ),
    flag(
        "Security",
        "peer-trusted-ca-file",
        "<path>",
        "(none)",
        "CA that peer certificates must chain to.",
    ),
    // Auth
    flag(
        "Auth",
        "auth-token",
        "<simple|jwt,...>",
        "simple",
        "Token kind: simple, or jwt,pub-key=<path>,priv-key=<path>,sign-method=<RS256|...>,ttl=<duration>.",
    ),
    flag(
        "Auth",
        "auth-token-ttl",
        "<seconds>",
        "300",
        "How long a simple token lives after its last use.",
    ),
    flag(
        "Auth",
        "bcrypt-cost",
        "<4..31>",
        "10",
        "bcrypt cost of passwords hashed on this member.",
    ),
    // Experimental
    flag(
        "Experimental",
        "experimental-initial-corrupt-check",
        "<bool>",
        "false",
        "Before serving, compare this member's KV hash with its peers' and refuse to start on a difference.",
    ),
    flag(
        "Experimental",
        "experimental-corrupt-check-time",
        "<duration>",
        "0s",
        "How often the leader compares the members' KV hashes (0s = never).",
    ),
    flag(
        "Experimental",
        "experimental-enable-lease-checkpoint",
        "<bool>",
        "false",
        "The leader puts long leases' remaining TTLs through the log.",
    ),
    flag(
        "Experimental",
        "experimental-lease-checkpoint-interval",
        "<duration>",
        "5m",
        "How often leases are checkpointed.",
    ),
    flag(
        "Experimental",
        "experimental-snapshot-catchup-entries",
        "<entries>",
        "5000",
        "Log entries kept behind a snapshot for lagging followers.",
    ),
    flag(
        "Experimental",
        "experimental-watch-progress-notify-interval",
        "<duration>",
        "10m",
        "Progress notifications for watchers that ask (0s = off).",
    ),
    // metcd's own
    flag(
        "Member",
        "config-file",
        "<path>",
        "(none)",
        "etcd's YAML config file (its keys); with it every other flag is ignored, as in etcd.",
    ),
    flag(
        "metcd",
        "config",
        "<path>",
        "(none)",
        "TOML file with any of these flags as keys (snapshot-count = 10000); flags win over it.",
    ),
    flag(
        "metcd",
        "listen-http-urls",
        "<urls>",
        "http://127.0.0.1:3379",
        "The curl API (PUT/GET/DELETE /<key>); empty ('') turns it off.",
    ),
    flag(
        "metcd",
        "engine",
        "<memory|btree|lsm>",
        "memory",
        "Storage engine, fixed at the data dir's first start.",
    ),
    flag(
        "metcd",
        "engine-cache-bytes",
        "<bytes>",
        "(a quarter of RAM, 64 MiB to 1 GiB)",
        "Block cache of the btree and lsm engines (they read with O_DIRECT: size it like a buffer pool).",
    ),
    flag(
        "metcd",
        "shards",
        "<cores>",
        "(every core but one, at least 1)",
        "Pinned executors; shard 0 owns the Raft group. More than the CPUs of the set is refused.",
    ),
    flag(
        "metcd",
        "cpus",
        "<list>",
        "(the process's CPU affinity)",
        "CPUs to pin shards to, in taskset's syntax (0-7, 8,10,12-15): shard i on the i-th.",
    ),
    flag(
        "metcd",
        "owner-accepts-clients",
        "<bool>",
        "(true below 3 shards)",
        "Whether shard 0, which runs the Raft group, also accepts client connections.",
    ),
    flag(
        "metcd",
        "wal-batch-window-us",
        "<us>",
        "0",
        "Group commit: wait this long for more proposals before the fsync.",
    ),
    flag("metcd", "wal-max-batch", "<proposals>", "4096", "Most proposals in one group commit."),
    flag("metcd", "wal-segment-bytes", "<bytes>", "67108864", "WAL segment size."),
    flag(
        "metcd",
        "wal-dsync",
        "<bool>",
        "true",
        "Write group commits with O_DSYNC (one I/O) instead of write + fdatasync.",
    ),
    flag(
        "metcd",
        "max-pending-proposals",
        "<proposals>",
        "100000",
        "Beyond this, writes get `etcdserver: too many requests`.",
    ),
    flag(
        "metcd",
        "io-memory-bytes",
        "<bytes>",
        "1048576",
        "glommio locked I/O memory per shard (about 3x this is locked per shard).",
    ),
    flag(
        "metcd",
        "spin-before-park-us",
        "<us>",
        "0",
        "An idle shard spins this long before it sleeps.",
    ),
    flag(
        "metcd",
        "range-cpu-shares",
        "<1-1000>",
        "250",
        "CPU shares of range work against the write path's 1000 on each shard.",
    ),
];

/// The documentation of `name`, if it is a documented flag.
pub fn find(name: &str) -> Option<&'static FlagDoc> {
    FLAGS.iter().find(|f| f.name == name)
}

/// `metcd`'s clap command with every flag's help, value name, default and
/// group from [`FLAGS`].
pub fn command() -> clap::Command {
    let mut cmd = Flags::command();
    for doc in FLAGS {
        // clap names an argument after its field (`data_dir`).
        cmd = cmd.mut_arg(doc.name.replace('-', "_"), |arg| {
            arg.help(format!("{} [default: {}]", doc.help, doc.default))
                .value_name(doc.value.trim_start_matches('<').trim_end_matches('>'))
                .help_heading(doc.group)
        });
    }
    cmd
}

/// Parses the process's arguments with the documented command, etcd's
/// own flags ([`ETCD_ONLY`]) noted and left out first.
pub fn parse() -> Flags {
    let args = match without_etcd_only_flags(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(refusal) => {
            eprintln!("metcd: {refusal}");
            std::process::exit(2);
        }
    };
    let matches = command().get_matches_from(args);
    match Flags::from_arg_matches(&matches) {
        Ok(flags) => flags,
        Err(e) => e.exit(),
    }
}

/// How an etcd flag takes its value on etcd's command line (Go's flag
/// package): a switch takes none (`--pre-vote`, or `--pre-vote=false`),
/// the others the next argument or `=value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes {
    Nothing,
    Value,
}

/// etcd 3.4 flags (and config file keys) that tune only etcd itself: its
/// logging, profiling, v2 API, gRPC keep-alives and bbolt. An operator's
/// etcd command line or config file may carry them; metcd notes each one
/// on stderr and ignores it.
pub const ETCD_ONLY: &[(&str, Takes)] = &[
    ("debug", Takes::Nothing),
    ("logger", Takes::Value),
    ("log-level", Takes::Value),
    ("log-outputs", Takes::Value),
    ("log-output", Takes::Value),
    ("log-package-levels", Takes::Value),
    ("enable-v2", Takes::Nothing),
    ("experimental-enable-v2v3", Takes::Value),
    ("enable-pprof", Takes::Nothing),
    ("enable-grpc-gateway", Takes::Nothing),
    ("cors", Takes::Value),
    ("host-whitelist", Takes::Value),
    ("grpc-keepalive-interval", Takes::Value),
    ("grpc-keepalive-min-time", Takes::Value),
    ("grpc-keepalive-timeout", Takes::Value),
    ("initial-election-tick-advance", Takes::Nothing),
    ("pre-vote", Takes::Nothing),
    ("max-snapshots", Takes::Value),
    ("max-wals", Takes::Value),
    ("backend-batch-interval", Takes::Value),
    ("backend-batch-limit", Takes::Value),
    ("experimental-backend-bbolt-freelist-type", Takes::Value),
    ("experimental-compaction-batch-limit", Takes::Value),
    ("experimental-warning-apply-duration", Takes::Value),
    (
        "experimental-enable-lease-checkpoint-persist",
        Takes::Nothing,
    ),
];

/// etcd flags (and config file keys) whose meaning metcd does not have
/// and whose absence would change where data lives, how safely it is
/// written, how members find each other or who may connect: refused,
/// unless their value says they are unused ([`is_unused_value`]: etcd's
/// sample config file lists `wal-dir:` empty and `proxy: 'off'`).
pub const ETCD_REFUSED: &[&str] = &[
    "wal-dir",
    "unsafe-no-fsync",
    "force-new-cluster",
    "proxy",
    "discovery",
    "discovery-proxy",
    "discovery-srv",
    "discovery-srv-name",
    "client-cert-allowed-hostname",
    "experimental-peer-skip-client-san-verification",
];

/// A refused flag's value that leaves it unused: empty, `false`, `off`.
pub fn is_unused_value(value: &str) -> bool {
    matches!(value, "" | "false" | "off")
}

/// `args` (the program name first) without the flags of [`ETCD_ONLY`],
/// each noted on stderr; a flag of [`ETCD_REFUSED`] is the refusal. As
/// Go's flag package, `-name` is `--name`, and nothing after `--` is a flag.
pub fn without_etcd_only_flags(
    args: Vec<std::ffi::OsString>,
) -> Result<Vec<std::ffi::OsString>, String> {
    let mut kept = Vec::with_capacity(args.len());
    let mut args = args.into_iter();
    kept.extend(args.next());
    while let Some(arg) = args.next() {
        if arg == "--" {
            kept.push(arg);
            kept.extend(args.by_ref());
            break;
        }
        let text = arg.to_string_lossy();
        let Some(flag) = text.strip_prefix("--").or_else(|| text.strip_prefix('-')) else {
            kept.push(arg);
            continue;
        };
        let (name, inline_value) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (flag, None),
        };
        if ETCD_REFUSED.contains(&name) {
            if inline_value.is_some_and(is_unused_value) {
                continue;
            }
            return Err(format!(
                "--{name} is not supported by metcd; remove it to start (see docs/operations.md)"
            ));
        }
        match ETCD_ONLY.iter().find(|(only, _)| *only == name) {
            Some((_, takes)) => {
                eprintln!("metcd: ignoring --{name} (etcd's own; see docs/operations.md)");
                if *takes == Takes::Value && inline_value.is_none() {
                    args.next();
                }
            }
            None => kept.push(arg),
        }
    }
    Ok(kept)
}

/// The flag table of docs/operations.md.
pub fn markdown() -> String {
    let mut out = String::new();
    for group in GROUPS {
        out.push_str(&format!(
            "\n**{group}**\n\n| flag | default | meaning |\n|---|---|---|\n"
        ));
        for doc in FLAGS.iter().filter(|f| f.group == *group) {
            out.push_str(&format!(
                "| `--{} {}` | `{}` | {} |\n",
                doc.name,
                doc.value,
                doc.default,
                doc.help.replace('|', "\\|")
            ));
        }
    }
    let names = |names: &mut dyn Iterator<Item = &str>| {
        names
            .map(|n| format!("`--{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    out.push_str(&format!(
        "\n**etcd's own flags**, which tune only etcd (logging, profiling, the v2 API, \
         gRPC keep-alives, bbolt): metcd notes each on stderr and ignores it, on the \
         command line and as keys of `--config-file`: {}.\n\n\
         **Refused** (their absence would change where data lives, how safely it is \
         written, how members find each other or who may connect): {}.\n",
        names(&mut ETCD_ONLY.iter().map(|(n, _)| *n)),
        names(&mut ETCD_REFUSED.iter().copied()),
    ));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[test]
    fn etcds_own_flags_are_left_out_and_refused_ones_refuse() {
        let args = |list: &[&str]| {
            list.iter()
                .map(std::ffi::OsString::from)
                .collect::<Vec<_>>()
        };
        let kept = super::without_etcd_only_flags(args(&[
            "metcd",
            "--enable-v2",
            "--name",
            "e1",
            "--log-level",
            "debug",
            "--pre-vote=true",
            "-logger=zap",
            "--experimental-enable-v2v3",
            "v2/",
            "--data-dir",
            "d",
            "--",
            "--debug",
        ]))
        .unwrap();
        assert_eq!(
            kept,
            args(&["metcd", "--name", "e1", "--data-dir", "d", "--", "--debug"])
        );
        let flags = <super::Flags as clap::Parser>::try_parse_from(&kept[..3]).unwrap();
        assert_eq!(flags.name.as_deref(), Some("e1"));
        let unused = [
            "metcd",
            "--force-new-cluster=false",
            "--wal-dir=",
            "--proxy=off",
        ];
        assert_eq!(
            super::without_etcd_only_flags(args(&unused)).unwrap(),
            args(&["metcd"])
        );
        for refused in [
            "--force-new-cluster",
            "--wal-dir=/w",
            "-discovery-srv",
            "--proxy=on",
        ] {
            let err = super::without_etcd_only_flags(args(&["metcd", refused])).unwrap_err();
            assert!(err.contains("not supported by metcd"), "{err}");
        }
    }
    use super::*;
    use crate::config::Config;

    /// Every flag clap knows has a line here and every line a flag.
    #[test]
    fn every_flag_is_documented_once() {
        let cmd = Flags::command();
        let mut known: Vec<&str> = cmd
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long())
            .filter(|l| !matches!(*l, "help" | "version"))
            .collect();
        known.sort_unstable();
        let mut documented: Vec<&str> = FLAGS.iter().map(|f| f.name).collect();
        documented.sort_unstable();
        let before = documented.len();
        documented.dedup();
        assert_eq!(before, documented.len(), "a flag is documented twice");
        assert_eq!(known, documented);
        for doc in FLAGS {
            assert!(
                GROUPS.contains(&doc.group),
                "{}: group {}",
                doc.name,
                doc.group
            );
        }
    }

    /// A default written as a value is what the flag's absence gives.
    #[test]
    fn documented_defaults_are_the_defaults() {
        let absent = Config::from_flags(Flags::default()).unwrap();
        for doc in FLAGS.iter().filter(|d| !d.default.starts_with('(')) {
            let arg = format!("--{}={}", doc.name, doc.default);
            let matches = command()
                .try_get_matches_from(["metcd", arg.as_str()])
                .unwrap_or_else(|e| panic!("{arg}: {e}"));
            let flags = Flags::from_arg_matches(&matches).unwrap();
            let given = Config::from_flags(flags).unwrap_or_else(|e| panic!("{arg}: {e}"));
            assert_eq!(given, absent, "{arg} is not the default");
        }
    }

    #[test]
    fn help_shows_every_flag_with_its_default() {
        let help = command().render_long_help().to_string();
        for doc in FLAGS {
            assert!(help.contains(&format!("--{}", doc.name)), "{}", doc.name);
            assert!(
                help.contains(&format!("[default: {}]", doc.default)),
                "{}: {help}",
                doc.name
            );
        }
        for group in GROUPS {
            assert!(help.contains(&format!("{group}:")), "{group}: {help}");
        }
    }

    /// docs/operations.md carries the table as generated here
    /// (`METCD_UPDATE_DOCS=1 cargo test -p server --lib flag_docs` rewrites it).
    #[test]
    fn operations_doc_has_the_generated_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let (begin, end) = (
            "<!-- flags: generated by server/src/flag_docs.rs -->",
            "<!-- end of flags -->",
        );
        let start = doc.find(begin).map(|i| i + begin.len());
        let stop = doc.find(end);
        let (Some(start), Some(stop)) = (start, stop) else {
            panic!("docs/operations.md has no {begin} ... {end} section");
        };
        let expected = markdown();
        if std::env::var_os("METCD_UPDATE_DOCS").is_some() {
            let updated = format!("{}{expected}{}", &doc[..start], &doc[stop..]);
            std::fs::write(path, updated).unwrap();
            return;
        }
        assert!(
            doc[start..stop] == expected,
            "docs/operations.md's flag table differs from the flags; replace the section with:\n{expected}"
        );
    }
}
