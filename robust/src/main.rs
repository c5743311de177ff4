//! `metcd-robust`: one seeded fault run against a fresh three-member metcd
//! cluster; prints a summary table and every anomaly with its evidence,
//! and exits 1 when there is any.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;

use robust::check::{check, Options};
use robust::cluster::Cluster;
use robust::history::{Outcome, Request};
use robust::workload::{run, FaultKind, Settings};

#[derive(Parser, Debug)]
#[command(
    name = "metcd-robust",
    about = "Concurrent etcd clients against a 3-member metcd cluster under kills, pauses and partitions; the history is checked for linearizability and etcd's watch guarantees"
)]
struct Args {
    /// How long the clients run, in seconds.
    #[arg(long, default_value_t = 40)]
    seconds: u64,
    /// Chooses every client's operations and every fault.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Storage engine of every member: memory, btree or lsm.
    #[arg(long, default_value = "memory")]
    engine: String,
    #[arg(long, default_value_t = 12)]
    clients: u32,
    /// Keys the clients share (more contention with fewer).
    #[arg(long, default_value_t = 8)]
    keys: u32,
    /// Faults to inject, comma-separated: kill, pause, partition, disk,
    /// member (none: "").
    #[arg(long, default_value = "kill,pause,partition,disk,member")]
    faults: String,
    /// Double faults: during about half of the kills, pauses and
    /// partitions, a second member is killed or paused too, so the
    /// cluster loses its quorum for a while.
    #[arg(long)]
    overlap: bool,
    /// The metcd binary (default: `metcd` beside this program).
    #[arg(long)]
    metcd: Option<PathBuf>,
    /// Where members keep data and logs (default: a temporary dir, kept
    /// only when the run finds an anomaly).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Steps the linearizability search may take per key.
    #[arg(long, default_value_t = 5_000_000)]
    budget_steps: u64,
    /// Most operations per client (bounds a run's history).
    #[arg(long, default_value_t = 200_000)]
    max_ops_per_client: u64,
    /// Writes every operation and every watcher's events to this file, one
    /// per line (for reading a failure).
    #[arg(long)]
    dump_history: Option<PathBuf>,
    /// Extra flags for every member.
    #[arg(long, allow_hyphen_values = true, num_args = 1..)]
    member_flags: Vec<String>,
}

fn main() {
    let args = Args::parse();
    std::process::exit(match run_once(&args) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("metcd-robust: {e}");
            2
        }
    });
}

fn run_once(args: &Args) -> Result<bool, String> {
    let metcd = match &args.metcd {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .with_file_name("metcd"),
    };
    let mut faults = Vec::new();
    for f in args.faults.split(',').filter(|s| !s.is_empty()) {
        faults.push(FaultKind::parse(f).ok_or(format!("unknown fault {f:?}"))?);
    }
    let temp;
    let dir = match &args.work_dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
            d.clone()
        }
        None => {
            temp = tempfile::Builder::new()
                .prefix("metcd-robust-")
                .tempdir()
                .map_err(|e| e.to_string())?;
            temp.path().to_path_buf()
        }
    };
    let mut flags = vec!["--engine".to_string(), args.engine.clone()];
    if !args.member_flags.iter().any(|f| f == "--shards") {
        flags.extend(["--shards".to_string(), "1".to_string()]);
    }
    // Checkpoints every few thousand entries instead of etcd's 100,000, so
    // a run of seconds restarts members from engine and key index
    // checkpoints and catches followers up by snapshot, not only by log.
    if !args.member_flags.iter().any(|f| f == "--snapshot-count") {
        flags.extend(["--snapshot-count".to_string(), "2000".to_string()]);
    }
    flags.extend(args.member_flags.iter().cloned());
    println!(
        "metcd-robust: seed {} engine {} clients {} keys {} for {} s, faults [{}], dir {}",
        args.seed,
        args.engine,
        args.clients,
        args.keys,
        args.seconds,
        args.faults,
        dir.display()
    );
    let cluster = Cluster::start(&metcd, &dir, 3, &flags).map_err(|e| e.to_string())?;
    let settings = Settings {
        clients: args.clients,
        keys: args.keys,
        run_for: Duration::from_secs(args.seconds),
        seed: args.seed,
        max_ops_per_client: args.max_ops_per_client,
        faults,
        engine: args.engine.clone(),
        fault_every_ms: (300, 2000),
        overlap: args.overlap,
    };
    let started = Instant::now();
    let outcome = run(cluster, &settings);
    let ran_s = started.elapsed().as_secs_f64();
    let checking = Instant::now();
    let report = check(
        &outcome.history,
        &Options {
            budget_steps: args.budget_steps,
            ..Options::default()
        },
    );
    let check_s = checking.elapsed().as_secs_f64();
    if let Some(path) = &args.dump_history {
        dump(&outcome.history, path).map_err(|e| format!("{}: {e}", path.display()))?;
    }

    // Operations by type and outcome.
    let mut table: BTreeMap<&str, [usize; 3]> = BTreeMap::new();
    for op in &outcome.history.ops {
        let row = table.entry(op.request.name()).or_default();
        row[match op.outcome {
            Outcome::Ok(_) => 0,
            Outcome::Failed(_) => 1,
            Outcome::Unknown(_) => 2,
        }] += 1;
    }
    println!("\n| operation | ok | failed | unknown |\n|---|---:|---:|---:|");
    for (name, [ok, failed, unknown]) in &table {
        println!("| {name} | {ok} | {failed} | {unknown} |");
    }
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for op in &outcome.history.ops {
        if let Outcome::Unknown(e) | Outcome::Failed(e) = &op.outcome {
            *reasons.entry(e.chars().take(100).collect()).or_default() += 1;
        }
    }
    for (reason, n) in &reasons {
        println!("  {n} x {reason}");
    }
    let total = outcome.history.ops.len();
    let unknown_writes = outcome
        .history
        .ops
        .iter()
        .filter(|o| {
            matches!(o.outcome, Outcome::Unknown(_))
                && matches!(o.request, Request::Put { .. } | Request::Cas { .. })
        })
        .count();
    println!(
        "\n{total} operations in {ran_s:.1} s; {} revisions; unknown writes {unknown_writes} (log shows {} applied, {} not)",
        report.last_revision,
        report.unknown_writes_applied,
        report.unknown_writes_dropped
    );
    let events: usize = outcome.history.watches.iter().map(|w| w.events.len()).sum();
    let resumed: u32 = outcome.history.watches.iter().map(|w| w.resumed).sum();
    println!(
        "watchers: {} events over {} watchers, {resumed} streams resumed",
        events,
        outcome.history.watches.len()
    );
    let mut by_kind: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for f in &outcome.faults {
        let e = by_kind.entry(f.kind.name()).or_default();
        e.0 += 1;
        e.1 += usize::from(f.was_leader);
    }
    println!("faults: {}", outcome.faults.len());
    for (kind, (n, leader)) in &by_kind {
        println!("  {kind}: {n} ({leader} on the leader)");
    }
    for f in outcome.faults.iter().filter(|f| !f.detail.is_empty()) {
        println!(
            "  at {:.1} s on member {}: {}",
            f.at as f64 / 1e9,
            f.member,
            f.detail
        );
    }
    println!(
        "checked {} keys for linearizability in {check_s:.1} s{}",
        report.keys_checked,
        if report.inconclusive.is_empty() {
            String::new()
        } else {
            format!(", inconclusive: {}", report.inconclusive.join(", "))
        }
    );
    for e in &outcome.run_errors {
        println!("RUN ERROR: {e}");
    }
    for a in &report.anomalies {
        println!("ANOMALY [{}] {}", a.check, a.detail);
    }
    let clean = report.ok() && outcome.run_errors.is_empty();
    println!(
        "\nresult: {} (seed {}, engine {}): {} anomalies, {} run errors, {} inconclusive keys",
        if clean { "PASS" } else { "FAIL" },
        args.seed,
        args.engine,
        report.anomalies.len(),
        outcome.run_errors.len(),
        report.inconclusive.len()
    );
    if !clean && args.work_dir.is_none() {
        // Keep the members' logs and data for whoever reads the failure.
        let kept = std::env::temp_dir().join(format!(
            "metcd-robust-seed{}-{}",
            args.seed,
            std::process::id()
        ));
        if std::fs::rename(&dir, &kept).is_ok() {
            println!("members' logs and data kept in {}", kept.display());
        }
    }
    Ok(clean)
}

fn dump(h: &robust::history::History, path: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for id in 0..h.ops.len() {
        writeln!(f, "{}", h.describe(id))?;
    }
    for (w, watch) in h.watches.iter().enumerate() {
        for (batch, e) in &watch.events {
            writeln!(
                f,
                "watcher {w} member {} batch {batch}: {e:?}",
                watch.member
            )?;
        }
    }
    for fin in &h.finals {
        writeln!(f, "final {fin:?}")?;
    }
    f.flush()
}
