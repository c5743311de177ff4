//! `compare`: real etcd against metcd, same machine, same client, on the
//! cases of etcd's published performance page (suite `etcd-docs`).
//!
//! For each topology (`--members`, 1 and 3 by default) and each system, the
//! servers are started here as child processes on free loopback ports with
//! their data in a fresh temp dir (flags as in `compare-etcd.sh` and
//! `compare-etcd-cluster.sh`), awaited (bounded), the leader found through
//! Maintenance/Status, the cases run against the leader with the in-process
//! workloads of `ops`, and the servers killed and their data deleted
//! ([`Cluster`] does both on drop, so also on error).
//!
//! The results go to stdout and to a markdown file (machine, command, date,
//! one table per topology, the put p99 with and without scans of
//! mixed-expensive) and to an SVG scatter of ops/s against p99 (`plot`).

use std::fmt::Write as _;
use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::grpc::{self, pb::etcdserverpb as pb};
use crate::load::{self, LoadArgs};
use crate::ops;
use crate::plot;
use crate::report::{Output, Report};

/// `compare` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct CompareArgs {
    /// The case list; only `etcd-docs` (etcd's performance page) exists.
    #[arg(long, default_value = "etcd-docs")]
    pub suite: String,
    /// Topologies: members per cluster, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    pub members: Vec<usize>,
    /// Multiplies every case's request total (10,000 for one client and
    /// 100,000 for many at 1.0); each case also stops after 20 s.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Markdown report.
    #[arg(long, default_value = "docs/benchmarks-suite.md")]
    pub out: PathBuf,
    /// SVG scatter plot of ops/s against p99 latency.
    #[arg(long, default_value = "docs/benchmarks-suite.svg")]
    pub plot: PathBuf,
    /// The metcd binary (default: `metcd` beside this executable).
    #[arg(long)]
    pub metcd: Option<PathBuf>,
    /// The etcd binary.
    #[arg(long, default_value = "etcd")]
    pub etcd: PathBuf,
    /// Instead of the suite: start one metcd member per `*.toml` profile in
    /// --profiles-dir and measure each (put at 1 and 1000 clients, put p99
    /// with and without scans); the table replaces the profiles section of
    /// --profiles-out.
    #[arg(long)]
    pub profiles: bool,
    #[arg(long, default_value = "tuning")]
    pub profiles_dir: PathBuf,
    #[arg(long, default_value = "docs/benchmarks.md")]
    pub profiles_out: PathBuf,
}

/// Upper bound of every case.
const CASE_SECONDS: f64 = 20.0;
/// How long a cluster may take to answer and elect a leader.
const STARTUP: Duration = Duration::from_secs(30);
/// The prefix mixed-expensive scans.
const SCAN_PREFIX: &str = "/scan/";
const SCAN_KEYS: u64 = 10_000;

/// The two systems compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    Etcd,
    Metcd,
}

impl System {
    pub const ALL: [System; 2] = [System::Etcd, System::Metcd];

    pub fn name(self) -> &'static str {
        match self {
            System::Etcd => "etcd",
            System::Metcd => "metcd",
        }
    }
}

/// The workload of a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Put { key_space: u64 },
    Range { serializable: bool },
    TxnPut,
    MixedExpensive { scan_clients: usize },
}

/// One case of the suite.
#[derive(Clone, Copy, Debug)]
struct Case {
    name: &'static str,
    clients: usize,
    conns: usize,
    /// Requests at scale 1.0.
    total: u64,
    kind: Kind,
}

/// The name of the mixed-expensive case with scans and of its baseline.
pub const MIXED: &str = "mixed-expensive put, 100 clients/10 conns, 2 scan clients";
pub const MIXED_BASE: &str = "mixed-expensive put, 100 clients/10 conns, 0 scan clients";

/// etcd's performance page, in the order run. The baseline without scans
/// runs after the case with scans, over the same prefilled keys.
fn etcd_docs() -> Vec<Case> {
    let case = |name, clients, conns, total, kind| Case {
        name,
        clients,
        conns,
        total,
        kind,
    };
    vec![
        case(
            "put, 1 client/1 conn",
            1,
            1,
            10_000,
            Kind::Put { key_space: 100_000 },
        ),
        case(
            "put, 1000 clients/100 conns, one key",
            1000,
            100,
            100_000,
            Kind::Put { key_space: 1 },
        ),
        case(
            "put, 1000 clients/100 conns, random keys",
            1000,
            100,
            100_000,
            Kind::Put { key_space: 100_000 },
        ),
        case(
            "range linearizable, 1000 clients/100 conns",
            1000,
            100,
            100_000,
            Kind::Range {
                serializable: false,
            },
        ),
        case(
            "range serializable, 1000 clients/100 conns",
            1000,
            100,
            100_000,
            Kind::Range { serializable: true },
        ),
        case(
            "txn-put, 100 clients/10 conns",
            100,
            10,
            100_000,
            Kind::TxnPut,
        ),
        case(
            MIXED,
            100,
            10,
            100_000,
            Kind::MixedExpensive { scan_clients: 2 },
        ),
        case(
            MIXED_BASE,
            100,
            10,
            100_000,
            Kind::MixedExpensive { scan_clients: 0 },
        ),
    ]
}

/// What a table shows of one run of a case.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub ops_per_sec: f64,
    pub p99_ms: f64,
    pub ops: u64,
    pub errors: u64,
}

impl Summary {
    pub fn of(r: &Report) -> Summary {
        Summary {
            ops_per_sec: r.ops_per_sec(),
            p99_ms: r.quantile_ms(0.99),
            ops: r.ops,
            errors: r.errors,
        }
    }
}

/// One case on both systems of one topology.
#[derive(Clone, Debug)]
pub struct Row {
    pub case: String,
    pub etcd: Result<Summary, String>,
    pub metcd: Result<Summary, String>,
}

impl Row {
    pub fn get(&self, system: System) -> &Result<Summary, String> {
        match system {
            System::Etcd => &self.etcd,
            System::Metcd => &self.metcd,
        }
    }
}

/// All cases of one topology.
#[derive(Clone, Debug)]
pub struct Table {
    pub members: usize,
    pub rows: Vec<Row>,
}

/// `b / a` as `1.23x`; `-` when either is missing or `a` is not positive.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a > 0.0 && a.is_finite() && b.is_finite() => {
            format!("{:.2}x", b / a)
        }
        _ => "-".into(),
    }
}

/// Ops/s with no decimals and thousands separators.
pub fn fmt_ops(v: f64) -> String {
    let n = v.max(0.0).round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Milliseconds: three decimals below 10 ms, one above.
pub fn fmt_ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.1}")
    }
}

fn cell<T>(r: &Result<Summary, String>, f: impl Fn(&Summary) -> T, fmt: fn(T) -> String) -> String {
    match r {
        Ok(s) => fmt(f(s)),
        Err(_) => "failed".into(),
    }
}

fn topology_name(members: usize) -> String {
    if members == 1 {
        "1 member".into()
    } else {
        format!("{members} members")
    }
}

/// The markdown table of one topology, its notes (errors, failures) and
/// the mixed-expensive line.
pub fn render_table(t: &Table) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### {}, requests to the leader\n",
        topology_name(t.members)
    );
    let _ = writeln!(
        out,
        "| case | etcd ops/s | metcd ops/s | ratio | etcd p99 ms | metcd p99 ms | p99 ratio |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    let mut notes = Vec::new();
    for (i, row) in t.rows.iter().enumerate() {
        let ops = |s: &Summary| s.ops_per_sec;
        let p99 = |s: &Summary| s.p99_ms;
        let get = |r: &Result<Summary, String>, f: fn(&Summary) -> f64| r.as_ref().ok().map(f);
        let _ = writeln!(
            out,
            "| {}. {} | {} | {} | {} | {} | {} | {} |",
            i + 1,
            row.case,
            cell(&row.etcd, ops, fmt_ops),
            cell(&row.metcd, ops, fmt_ops),
            ratio(get(&row.etcd, ops), get(&row.metcd, ops)),
            cell(&row.etcd, p99, fmt_ms),
            cell(&row.metcd, p99, fmt_ms),
            ratio(get(&row.etcd, p99), get(&row.metcd, p99)),
        );
        for system in System::ALL {
            match row.get(system) {
                Ok(s) if s.errors > 0 => notes.push(format!(
                    "{} {}: {} errors ({} ok)",
                    system.name(),
                    row.case,
                    s.errors,
                    s.ops
                )),
                Ok(_) => {}
                Err(full) => {
                    // The first line: log tails stay on stderr.
                    let e = full.lines().next().unwrap_or_default();
                    let all_same = t
                        .rows
                        .iter()
                        .all(|r| r.get(system).as_ref().err() == Some(full));
                    let note = if all_same && t.rows.len() > 1 {
                        format!("{}: every case failed: {e}", system.name())
                    } else {
                        format!("{} {}: failed: {e}", system.name(), row.case)
                    };
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                }
            }
        }
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "ratio: metcd / etcd ops/s (higher is better for metcd); p99 ratio: metcd / etcd p99 (lower is better for metcd).\n"
    );
    if let Some(line) = mixed_line(t) {
        let _ = writeln!(out, "{line}\n");
    }
    for n in notes {
        let _ = writeln!(out, "- {n}");
    }
    out
}

/// Each system's mixed-expensive put p99 with scans / without, if both ran.
pub fn mixed_line(t: &Table) -> Option<String> {
    let find = |name: &str| t.rows.iter().find(|r| r.case == name);
    let (with, without) = (find(MIXED)?, find(MIXED_BASE)?);
    let parts: Vec<String> = System::ALL
        .iter()
        .map(|&s| match (with.get(s), without.get(s)) {
            (Ok(w), Ok(b)) => format!(
                "{} {} ms / {} ms ({})",
                s.name(),
                fmt_ms(w.p99_ms),
                fmt_ms(b.p99_ms),
                ratio(Some(b.p99_ms), Some(w.p99_ms))
            ),
            _ => format!("{} -", s.name()),
        })
        .collect();
    Some(format!(
        "mixed-expensive, put p99 with 2 scan clients / without: {}.",
        parts.join("; ")
    ))
}

/// The whole markdown document.
pub fn render_markdown(header: &[String], tables: &[Table]) -> String {
    let mut out = String::from("# metcd vs etcd: etcd's benchmark suite\n\n");
    for h in header {
        let _ = writeln!(out, "- {h}");
    }
    out.push('\n');
    for t in tables {
        out.push_str(&render_table(t));
        out.push('\n');
    }
    out
}

fn command_output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `N x <cpu model>, M GiB RAM, <kernel>`.
fn machine_line() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_string();
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or("? GiB".to_string(), |kb| {
            format!("{:.1} GiB", kb / 1024.0 / 1024.0)
        });
    let kernel = command_output("uname", &["-sr"]).unwrap_or_else(|| "unknown kernel".into());
    format!("{cpus} x {model}, {mem_gib} RAM, {kernel}")
}

/// Ports that were free a moment ago (all bound at once, so distinct).
fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("free port: {e}"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("free port: {e}"))
}

/// A running cluster: its processes and their temp dir, both gone on drop.
pub struct Cluster {
    children: Vec<Child>,
    logs: Vec<PathBuf>,
    endpoints: Vec<String>,
    // Dropped after `drop` has killed the servers.
    dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

impl Cluster {
    /// Starts `members` servers of `system` from `bin`.
    fn start(
        system: System,
        bin: &Path,
        members: usize,
        extra: &[String],
    ) -> Result<Cluster, String> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("metcd-compare-{}-", system.name()))
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let ports = free_ports(3 * members)?;
        // Member i: client port, peer port, metcd's HTTP port.
        let port = |i: usize, k: usize| ports[3 * i + k];
        let names: Vec<String> = (1..=members)
            .map(|i| {
                if members == 1 && system == System::Etcd {
                    "bench".to_string()
                } else {
                    format!("n{i}")
                }
            })
            .collect();
        let initial_cluster = (0..members)
            .map(|i| format!("{}={}", names[i], url(port(i, 1))))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Cluster {
            children: Vec::new(),
            logs: Vec::new(),
            endpoints: (0..members)
                .map(|i| format!("127.0.0.1:{}", port(i, 0)))
                .collect(),
            dir,
        };
        for (i, name) in names.iter().enumerate() {
            let data = cluster.dir.path().join(name);
            let data = data.to_string_lossy().to_string();
            let (client, peer, http) = (url(port(i, 0)), url(port(i, 1)), url(port(i, 2)));
            let mut args: Vec<String> = Vec::new();
            let mut push = |flag: &str, v: &str| {
                args.push(flag.to_string());
                args.push(v.to_string());
            };
            match (system, members) {
                (System::Etcd, _) => {
                    push("--name", name);
                    push("--data-dir", &data);
                    push("--listen-client-urls", &client);
                    push("--advertise-client-urls", &client);
                    push("--listen-peer-urls", &peer);
                    push("--initial-advertise-peer-urls", &peer);
                    push("--initial-cluster", &initial_cluster);
                    if members > 1 {
                        push("--initial-cluster-token", "bench");
                    }
                }
                (System::Metcd, 1) => {
                    push("--data-dir", &data);
                    push("--listen-client-urls", &client);
                    push("--listen-http-urls", &http);
                }
                (System::Metcd, _) => {
                    push("--name", name);
                    push("--data-dir", &data);
                    push("--listen-client-urls", &client);
                    push("--listen-http-urls", &http);
                    push("--initial-advertise-peer-urls", &peer);
                    push("--initial-cluster", &initial_cluster);
                    push("--initial-cluster-token", "bench");
                    push("--shards", "1");
                }
            }
            if system == System::Metcd {
                args.extend(extra.iter().cloned());
            }
            let log_path = cluster.dir.path().join(format!("{name}.log"));
            let log = File::create(&log_path).map_err(|e| format!("log file: {e}"))?;
            let log2 = log.try_clone().map_err(|e| format!("log file: {e}"))?;
            let child = Command::new(bin)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log2)
                .spawn()
                .map_err(|e| format!("start {}: {e}", bin.display()))?;
            cluster.children.push(child);
            cluster.logs.push(log_path);
        }
        Ok(cluster)
    }

    /// The last lines of every member's log, for an error message.
    fn log_tails(&self) -> String {
        let mut out = String::new();
        for p in &self.logs {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(5)..].join("\n    ");
            let _ = write!(out, "\n  {}:\n    {tail}", p.display());
        }
        out
    }

    /// Fails if a member has exited.
    fn check_alive(&mut self) -> Result<(), String> {
        for c in &mut self.children {
            if let Ok(Some(status)) = c.try_wait() {
                return Err(format!("a server exited ({status})"));
            }
        }
        Ok(())
    }

    /// Waits (at most [`STARTUP`]) until every member answers
    /// Maintenance/Status and one says it is the leader; returns that one.
    fn leader(&mut self) -> Result<String, String> {
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Err(e) = self.check_alive() {
                return Err(format!("{e}{}", self.log_tails()));
            }
            let endpoints = self.endpoints.clone();
            let found = load::run_on_executor(None, move || async move {
                let mut leader = None;
                for ep in &endpoints {
                    // Every member must answer before the cluster counts as up.
                    if load::leader_member(ep).await.ok()?.is_some() {
                        leader = Some(ep.clone());
                    }
                }
                leader
            })?;
            if let Some(leader) = found {
                return Ok(leader);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no leader among {} after {STARTUP:?}{}",
                    self.endpoints.join(","),
                    self.log_tails()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn load_args(endpoint: &str, case: &Case, scale: f64) -> LoadArgs {
    LoadArgs {
        endpoints: vec![endpoint.to_string()],
        conns: case.conns,
        clients: case.clients,
        total: ((case.total as f64 * scale).round() as u64).max(1),
        duration: CASE_SECONDS,
        rate: 0,
        target_leader: false,
        output: Output::Text,
        cpu: None,
    }
}

/// Puts `foo` = `bar`, the key the range cases read.
fn put_foo(endpoint: &str) -> Result<(), String> {
    let ep = endpoint.to_string();
    load::run_on_executor(None, move || async move {
        let mut conn = grpc::Conn::connect(&ep).await?;
        conn.unary::<_, pb::PutResponse>(
            "/etcdserverpb.KV/Put",
            &pb::PutRequest {
                key: b"foo".to_vec(),
                value: b"bar".to_vec(),
                ..Default::default()
            },
        )
        .await
        .map(|_| ())
    })?
}

/// Runs one case against `endpoint`; the report of its main series.
fn run_case(endpoint: &str, case: &Case, scale: f64) -> Result<Report, String> {
    let load = load_args(endpoint, case, scale);
    let reports = match case.kind {
        Kind::Put { key_space } => ops::put_reports(ops::PutArgs {
            load,
            key_size: 8,
            val_size: 256,
            key_space_size: key_space,
            sequential_keys: false,
        }),
        Kind::Range { serializable } => ops::range_reports(ops::RangeArgs {
            load,
            key: "foo".into(),
            end: None,
            limit: 0,
            consistency: if serializable { "s" } else { "l" }.into(),
        }),
        Kind::TxnPut => ops::txn_put_reports(ops::TxnPutArgs {
            load,
            prefix: "/registry/pods/".into(),
            key_size: 8,
            val_size: 256,
        }),
        Kind::MixedExpensive { scan_clients } => {
            ops::mixed_expensive_reports(ops::MixedExpensiveArgs {
                load,
                scan_clients,
                prefix: SCAN_PREFIX.into(),
                // The baseline runs after, over the keys already there.
                prefill: if scan_clients > 0 { SCAN_KEYS } else { 0 },
                key_size: 8,
                val_size: 256,
                key_space_size: 100_000,
            })
        }
    }?;
    reports
        .into_iter()
        .next()
        .ok_or_else(|| format!("{}: no report", case.name))
}

/// Runs every case on one system; the whole system fails if its cluster
/// does not come up.
fn run_system(
    system: System,
    bin: &Path,
    members: usize,
    extra: &[String],
    cases: &[Case],
    scale: f64,
) -> Vec<Result<Summary, String>> {
    let started = Cluster::start(system, bin, members, extra).and_then(|mut c| {
        let leader = c.leader()?;
        put_foo(&leader)?;
        Ok((c, leader))
    });
    let (mut cluster, leader) = match started {
        Ok(x) => x,
        Err(e) => {
            eprintln!("metcd-bench: {} x{members}: {e}", system.name());
            return cases.iter().map(|_| Err(e.clone())).collect();
        }
    };
    eprintln!(
        "metcd-bench: {} {}: leader {leader}",
        system.name(),
        topology_name(members)
    );
    let mut out = Vec::new();
    for case in cases {
        let result = cluster
            .check_alive()
            .and_then(|()| run_case(&leader, case, scale));
        match &result {
            Ok(r) => eprintln!("  {} {}", system.name(), r.summary_line().trim_end()),
            Err(e) => eprintln!("  {} {}: {e}", system.name(), case.name),
        }
        out.push(result.map(|r| Summary::of(&r)));
    }
    drop(cluster);
    out
}

pub fn compare_cmd(args: CompareArgs) -> Result<(), String> {
    if args.profiles {
        return profiles_cmd(&args);
    }
    if args.suite != "etcd-docs" {
        return Err(format!("--suite {}: only etcd-docs exists", args.suite));
    }
    if !(args.scale > 0.0 && args.scale.is_finite()) {
        return Err(format!("--scale {}: expected a number > 0", args.scale));
    }
    if args.members.is_empty() || args.members.contains(&0) {
        return Err("--members: expected counts >= 1".into());
    }
    let metcd = metcd_bin(&args)?;
    let etcd_bin = args.etcd.to_string_lossy().to_string();
    let etcd_version = command_output(&etcd_bin, &["--version"])
        .and_then(|v| v.lines().next().map(str::to_string))
        .unwrap_or_else(|| format!("{etcd_bin}: version unknown"));
    let mut header = run_header();
    header.extend([
        format!(
            "etcd: `{}` ({etcd_version}); metcd: `{}`",
            args.etcd.display(),
            metcd.display()
        ),
        format!(
            "scale {}: request totals {} (1 client) and {} (others), each case at most {CASE_SECONDS} s; one metcd-bench client process on the same machine",
            args.scale,
            ((10_000.0 * args.scale).round() as u64).max(1),
            ((100_000.0 * args.scale).round() as u64).max(1),
        ),
    ]);
    let cases = etcd_docs();
    let mut tables = Vec::new();
    for &members in &args.members {
        let etcd = run_system(System::Etcd, &args.etcd, members, &[], &cases, args.scale);
        let metcd = run_system(System::Metcd, &metcd, members, &[], &cases, args.scale);
        let rows = cases
            .iter()
            .zip(etcd.into_iter().zip(metcd))
            .map(|(c, (etcd, metcd))| Row {
                case: c.name.to_string(),
                etcd,
                metcd,
            })
            .collect();
        let table = Table { members, rows };
        println!("{}", render_table(&table));
        tables.push(table);
    }
    let ran = tables
        .iter()
        .flat_map(|t| &t.rows)
        .any(|r| r.etcd.is_ok() || r.metcd.is_ok());
    let markdown = render_markdown(&header, &tables);
    std::fs::write(&args.out, &markdown)
        .map_err(|e| format!("write {}: {e}", args.out.display()))?;
    plot::scatter(&args.plot, &tables)?;
    eprintln!(
        "metcd-bench: wrote {} and {}",
        args.out.display(),
        args.plot.display()
    );
    if ran {
        Ok(())
    } else {
        Err("no case ran on either system".into())
    }
}

/// The lines every report starts with: machine, command, date.
fn run_header() -> Vec<String> {
    vec![
        format!("machine: {}", machine_line()),
        format!(
            "command: `{}`",
            std::env::args().collect::<Vec<_>>().join(" ")
        ),
        format!(
            "date: {}",
            command_output("date", &[]).unwrap_or_else(|| "unknown".into())
        ),
    ]
}

fn metcd_bin(args: &CompareArgs) -> Result<PathBuf, String> {
    match &args.metcd {
        Some(p) => Ok(p.clone()),
        None => Ok(std::env::current_exe()
            .map_err(|e| format!("current exe: {e}"))?
            .with_file_name("metcd")),
    }
}

/// The cases measured per tuning profile: latency alone, throughput, and
/// the cost of expensive reads to writes.
fn profile_cases() -> Vec<Case> {
    let suite = etcd_docs();
    [0usize, 2, 6, 7].iter().map(|&i| suite[i]).collect()
}

/// One profile's results, in [`profile_cases`] order.
#[derive(Clone, Debug)]
pub struct ProfileRow {
    pub profile: String,
    pub results: Vec<Result<Summary, String>>,
}

const PROFILES_BEGIN: &str = "<!-- metcd-bench compare --profiles: begin -->";
const PROFILES_END: &str = "<!-- metcd-bench compare --profiles: end -->";

/// The profiles table: per profile, put at 1 client (ops/s, p99), put at
/// 1000 clients (ops/s, p99) and put p99 with scans / without.
pub fn render_profiles(header: &[String], rows: &[ProfileRow]) -> String {
    let mut out =
        format!("{PROFILES_BEGIN}\n## Tuning profiles (`metcd-bench compare --profiles`)\n\n");
    for h in header {
        let _ = writeln!(out, "- {h}");
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "| profile | put 1 client ops/s | p99 ms | put 1000 clients ops/s | p99 ms | put p99 with 2 scanners | without | ratio |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut notes = Vec::new();
    for row in rows {
        let r = |i: usize| row.results.get(i).cloned().unwrap_or(Err("not run".into()));
        let (one, many, with, without) = (r(0), r(1), r(2), r(3));
        let p99 = |r: &Result<Summary, String>| r.as_ref().ok().map(|s| s.p99_ms);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row.profile,
            cell(&one, |s| s.ops_per_sec, fmt_ops),
            cell(&one, |s| s.p99_ms, fmt_ms),
            cell(&many, |s| s.ops_per_sec, fmt_ops),
            cell(&many, |s| s.p99_ms, fmt_ms),
            cell(&with, |s| s.p99_ms, fmt_ms),
            cell(&without, |s| s.p99_ms, fmt_ms),
            ratio(p99(&without), p99(&with)),
        );
        for (case, result) in profile_cases().iter().zip(&row.results) {
            match result {
                Ok(s) if s.errors > 0 => notes.push(format!(
                    "{} {}: {} errors ({} ok)",
                    row.profile, case.name, s.errors, s.ops
                )),
                Ok(_) => {}
                Err(e) => notes.push(format!(
                    "{} {}: failed: {}",
                    row.profile,
                    case.name,
                    e.lines().next().unwrap_or_default()
                )),
            }
        }
    }
    out.push('\n');
    for n in notes {
        let _ = writeln!(out, "- {n}");
    }
    out.push_str(PROFILES_END);
    out.push('\n');
    out
}

/// `doc` with its profiles section replaced by `section` (appended when it
/// has none).
pub fn splice_profiles(doc: &str, section: &str) -> String {
    if let (Some(a), Some(b)) = (doc.find(PROFILES_BEGIN), doc.find(PROFILES_END)) {
        if a < b {
            let mut end = b + PROFILES_END.len();
            if doc[end..].starts_with('\n') {
                end += 1;
            }
            return format!("{}{section}{}", &doc[..a], &doc[end..]);
        }
    }
    let sep = if doc.is_empty() || doc.ends_with("\n\n") {
        ""
    } else if doc.ends_with('\n') {
        "\n"
    } else {
        "\n\n"
    };
    format!("{doc}{sep}{section}")
}

fn profiles_cmd(args: &CompareArgs) -> Result<(), String> {
    if !(args.scale > 0.0 && args.scale.is_finite()) {
        return Err(format!("--scale {}: expected a number > 0", args.scale));
    }
    let metcd = metcd_bin(args)?;
    let dir = &args.profiles_dir;
    let mut profiles: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("--profiles-dir {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    profiles.sort();
    if profiles.is_empty() {
        return Err(format!(
            "--profiles-dir {}: no *.toml profile",
            dir.display()
        ));
    }
    let cases = profile_cases();
    let mut rows = Vec::new();
    for path in &profiles {
        let profile = path
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        eprintln!("metcd-bench: profile {profile}");
        let extra = vec!["--config".to_string(), path.to_string_lossy().to_string()];
        let results = run_system(System::Metcd, &metcd, 1, &extra, &cases, args.scale);
        rows.push(ProfileRow { profile, results });
    }
    let mut header = run_header();
    header.push(format!(
            "one metcd member per profile of `{}` (its flags from `--config`, data and ports from the tool); scale {}: {} requests at 1 client, {} otherwise, each case at most {CASE_SECONDS} s; same metcd-bench client for all",
            dir.display(),
            args.scale,
            ((10_000.0 * args.scale).round() as u64).max(1),
            ((100_000.0 * args.scale).round() as u64).max(1),
        ));
    let section = render_profiles(&header, &rows);
    println!("{section}");
    let doc = std::fs::read_to_string(&args.profiles_out).unwrap_or_default();
    std::fs::write(&args.profiles_out, splice_profiles(&doc, &section))
        .map_err(|e| format!("write {}: {e}", args.profiles_out.display()))?;
    eprintln!("metcd-bench: wrote {}", args.profiles_out.display());
    if rows.iter().any(|r| r.results.iter().any(|x| x.is_ok())) {
        Ok(())
    } else {
        Err("no profile case ran".into())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::report::new_hist;

    fn report(ops: u64, errors: u64, secs: u64, latency_us: u64) -> Report {
        let mut h = new_hist().unwrap();
        for _ in 0..ops {
            h.record(latency_us).unwrap();
        }
        Report::new(
            "fake".into(),
            ops + errors,
            ops,
            errors,
            Duration::from_secs(secs),
            h,
        )
    }

    fn table() -> Table {
        let row = |case: &str, e: &Report, m: &Report| Row {
            case: case.into(),
            etcd: Ok(Summary::of(e)),
            metcd: Ok(Summary::of(m)),
        };
        Table {
            members: 1,
            rows: vec![
                row(
                    "put, 1 client/1 conn",
                    &report(1000, 0, 2, 2000),
                    &report(4000, 0, 2, 500),
                ),
                row(MIXED, &report(100, 0, 1, 40_000), &report(100, 3, 1, 1500)),
                row(
                    MIXED_BASE,
                    &report(100, 0, 1, 10_000),
                    &report(100, 0, 1, 1000),
                ),
                Row {
                    case: "range".into(),
                    etcd: Err("boom".into()),
                    metcd: Ok(Summary::of(&report(10, 0, 1, 100))),
                },
            ],
        }
    }

    #[test]
    fn ratios_and_numbers_format() {
        assert_eq!(ratio(Some(2.0), Some(3.0)), "1.50x");
        assert_eq!(ratio(Some(0.0), Some(3.0)), "-");
        assert_eq!(ratio(None, Some(3.0)), "-");
        assert_eq!(ratio(Some(3.0), None), "-");
        assert_eq!(fmt_ops(0.0), "0");
        assert_eq!(fmt_ops(999.4), "999");
        assert_eq!(fmt_ops(1234.6), "1,235");
        assert_eq!(fmt_ops(1_234_567.0), "1,234,567");
        assert_eq!(fmt_ms(1.23456), "1.235");
        assert_eq!(fmt_ms(123.456), "123.5");
    }

    #[test]
    fn table_has_one_row_per_case_and_the_ratios() {
        let md = render_table(&table());
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines[0], "### 1 member, requests to the leader");
        assert!(lines.contains(
            &"| case | etcd ops/s | metcd ops/s | ratio | etcd p99 ms | metcd p99 ms | p99 ratio |"
        ));
        let put = lines
            .iter()
            .find(|l| l.starts_with("| 1. put, 1 client/1 conn |"))
            .unwrap();
        let cells: Vec<&str> = put.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells[1..5], ["500", "2,000", "4.00x", "2.000"]);
        assert_eq!(cells[5], "0.500");
        assert_eq!(cells[6], "0.25x");
        let rows = lines.iter().filter(|l| l.starts_with("| ")).count();
        assert_eq!(rows, 1 + 4, "{md}");
        let failed = lines
            .iter()
            .find(|l| l.starts_with("| 4. range |"))
            .unwrap();
        assert!(failed.contains("| failed |"), "{failed}");
        assert!(md.contains("- etcd range: failed: boom"), "{md}");
        assert!(
            md.contains(&format!("- metcd {MIXED}: 3 errors (100 ok)")),
            "{md}"
        );
    }

    #[test]
    fn a_system_that_never_started_gets_one_note() {
        let mut t = table();
        for row in &mut t.rows {
            row.metcd = Err("start: no such file".into());
        }
        let md = render_table(&t);
        assert_eq!(md.matches("start: no such file").count(), 1, "{md}");
        assert!(md.contains("- metcd: every case failed: start: no such file"));
        assert!(md.contains("metcd -."), "{md}");
    }

    #[test]
    fn mixed_line_gives_p99_with_and_without_scans() {
        let line = mixed_line(&table()).unwrap();
        assert_eq!(
            line,
            "mixed-expensive, put p99 with 2 scan clients / without: etcd 40.0 ms / 10.0 ms (4.00x); metcd 1.500 ms / 1.000 ms (1.50x)."
        );
        let none = Table {
            members: 3,
            rows: Vec::new(),
        };
        assert_eq!(mixed_line(&none), None);
    }

    #[test]
    fn markdown_has_header_and_tables() {
        let header = vec!["machine: x".to_string(), "date: y".to_string()];
        let mut three = table();
        three.members = 3;
        let md = render_markdown(&header, &[table(), three]);
        assert!(md.starts_with("# "));
        assert!(md.contains("\n- machine: x\n- date: y\n"));
        assert!(md.contains("### 1 member,"));
        assert!(md.contains("### 3 members,"));
    }

    #[test]
    fn profiles_table_and_splice() {
        let row = ProfileRow {
            profile: "latency".into(),
            results: vec![
                Ok(Summary::of(&report(1000, 0, 1, 500))),
                Ok(Summary::of(&report(4000, 2, 2, 1500))),
                Ok(Summary::of(&report(100, 0, 1, 2000))),
                Ok(Summary::of(&report(100, 0, 1, 1000))),
            ],
        };
        let failed = ProfileRow {
            profile: "dev".into(),
            results: vec![Err("start: boom".into()); 4],
        };
        let section = render_profiles(&["date: y".to_string()], &[row, failed]);
        let line = section
            .lines()
            .find(|l| l.starts_with("| latency |"))
            .unwrap();
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(
            cells,
            ["latency", "1,000", "0.500", "2,000", "1.500", "2.000", "1.000", "2.00x"]
        );
        assert!(section.contains("| dev | failed | failed |"), "{section}");
        assert!(section
            .contains("- latency put, 1000 clients/100 conns, random keys: 2 errors (4000 ok)"));
        assert!(section.contains("- dev put, 1 client/1 conn: failed: start: boom"));

        let doc = "# Benchmarks\n\nintro\n";
        let once = splice_profiles(doc, &section);
        assert!(once.starts_with("# Benchmarks\n\nintro\n\n<!-- metcd-bench"));
        let twice = splice_profiles(&format!("{once}\n## later\n"), &section);
        assert_eq!(twice.matches(PROFILES_BEGIN).count(), 1);
        assert!(twice.ends_with("\n## later\n"), "{twice}");
        assert_eq!(twice, format!("{once}\n## later\n"));
    }

    #[test]
    fn suite_has_the_documented_cases() {
        let cases = etcd_docs();
        assert_eq!(cases.len(), 8);
        assert_eq!(cases[0].clients, 1);
        assert_eq!(cases[0].total, 10_000);
        assert!(cases[1..].iter().all(|c| c.total == 100_000));
        let load = load_args("h:1", &cases[1], 0.1);
        assert_eq!((load.clients, load.conns, load.total), (1000, 100, 10_000));
    }
}
