//! The Prometheus `/metrics` page: a subset of etcd's metrics, with etcd's
//! names, help texts, types and histogram buckets, so dashboards and alert
//! rules written for etcd (has leader, leader changes, proposals, WAL
//! fsync latency, DB size, keys, watchers) work unchanged.
//!
//! This module owns the metric values the Raft loop records
//! ([`NodeMetrics`], owner core only) and the text rendering. It must
//! never be on a request's path beyond a counter increment.

use std::cell::Cell;
use std::fmt::Write as _;
use std::time::Duration;

/// etcd's latency buckets for disk metrics: 1 ms doubling up to 8.192 s.
const DISK_BUCKETS: usize = 14;

/// A Prometheus histogram with etcd's disk buckets (`le` 0.001 … 8.192).
#[derive(Debug, Default)]
pub struct DiskHistogram {
    /// Observations at or below each bucket's bound (not cumulative here;
    /// rendering sums them).
    buckets: [Cell<u64>; DISK_BUCKETS],
    over: Cell<u64>,
    sum_nanos: Cell<u128>,
}

impl DiskHistogram {
    pub fn observe(&self, took: Duration) {
        let mut bound = Duration::from_millis(1);
        let slot = self.buckets.iter().find(|_| {
            let fits = took <= bound;
            bound *= 2;
            fits
        });
        let counter = slot.unwrap_or(&self.over);
        counter.set(counter.get() + 1);
        self.sum_nanos.set(self.sum_nanos.get() + took.as_nanos());
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let sum = self.sum_nanos.get() as f64 / 1e9;
        write_histogram(
            out,
            (name, help),
            &self.buckets,
            |i| format_seconds(1 << i),
            self.over.get(),
            &sum.to_string(),
        );
    }
}

/// Writes a Prometheus histogram whose buckets hold their own
/// observations (`counts`, not cumulative; `bound(i)` writes bucket i's
/// `le`), then those over every bound, and the sum as written.
fn write_histogram(
    out: &mut String,
    (name, help): (&str, &str),
    counts: &[Cell<u64>],
    bound: impl Fn(usize) -> String,
    over: u64,
    sum: &str,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cumulative = 0;
    for (i, count) in counts.iter().enumerate() {
        cumulative += count.get();
        let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cumulative}", bound(i));
    }
    cumulative += over;
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cumulative}");
}

/// etcd's lease TTL buckets: 1 s to 2^23 s (`ExponentialBuckets(1, 2, 24)`).
const TTL_BUCKETS: usize = 24;

/// A Prometheus histogram of granted lease TTLs in seconds, with etcd's
/// buckets (`etcd_debugging_lease_ttl_total`).
#[derive(Debug, Default)]
pub struct TtlHistogram {
    /// Observations per bucket (not cumulative here; rendering sums them).
    buckets: [Cell<u64>; TTL_BUCKETS],
    over: Cell<u64>,
    sum: Cell<u64>,
}

impl TtlHistogram {
    pub fn observe(&self, ttl_seconds: i64) {
        let ttl = u64::try_from(ttl_seconds).unwrap_or(0);
        let slot = (0..TTL_BUCKETS).find(|i| ttl <= 1 << i);
        let counter = slot.map_or(&self.over, |i| &self.buckets[i]);
        counter.set(counter.get() + 1);
        self.sum.set(self.sum.get().saturating_add(ttl));
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        write_histogram(
            out,
            (name, help),
            &self.buckets,
            |i| go_float(1 << i),
            self.over.get(),
            &go_float(self.sum.get()),
        );
    }
}

/// `ms` milliseconds as Prometheus writes a bucket bound ("0.001", "8.192").
fn format_seconds(ms: u64) -> String {
    let s = format!("{}.{:03}", ms / 1000, ms % 1000);
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// What the Raft loop counts as it goes.
#[derive(Debug, Default)]
pub struct NodeMetrics {
    pub leader_changes: Cell<u64>,
    pub last_leader: Cell<u64>,
    pub proposals_failed: Cell<u64>,
    pub wal_fsync: DiskHistogram,
    pub backend_commit: DiskHistogram,
    /// Leases this member applied grants and revokes of, and renewed
    /// (keep-alives, on the leader), as etcd's lessor counts them.
    pub leases_granted: Cell<u64>,
    pub leases_revoked: Cell<u64>,
    pub leases_renewed: Cell<u64>,
    /// The TTLs of the leases this member applied grants of.
    pub lease_ttls: TtlHistogram,
    /// Leases this member, as leader, revoked because they expired.
    pub leases_expired: Cell<u64>,
    /// Learners promoted through this member, as leader.
    pub learners_promoted: Cell<u64>,
    /// Log entries whose apply took longer than [`SLOW_APPLY`].
    pub slow_applies: Cell<u64>,
    /// Whether a leader's snapshot is being installed now.
    pub snapshot_applying: Cell<bool>,
}

/// An apply slower than this counts in `etcd_server_slow_apply_total`
/// (etcd's `warnApplyDuration`).
pub const SLOW_APPLY: std::time::Duration = std::time::Duration::from_millis(100);

/// Adds one to a counter of the Raft loop.
pub fn count(counter: &Cell<u64>) {
    counter.set(counter.get() + 1);
}

/// `/health` answers of this process (any shard), as etcd counts them.
pub static HEALTH_SUCCESS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static HEALTH_FAILURES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl NodeMetrics {
    /// Counts a change to a new, known leader (etcd's
    /// `leader_changes_seen_total`: the first election counts too).
    pub fn note_leader(&self, leader: u64) {
        if leader != self.last_leader.get() {
            self.last_leader.set(leader);
            if leader != 0 {
                self.leader_changes.set(self.leader_changes.get() + 1);
            }
        }
    }

    pub fn note_failed_proposal(&self) {
        count(&self.proposals_failed);
    }
}

/// A point-in-time view of the member, gathered on the owner core.
#[derive(Debug, Clone, Default)]
pub struct Gauges {
    pub member_id: u64,
    pub has_leader: bool,
    pub is_leader: bool,
    pub is_learner: bool,
    pub committed_index: u64,
    pub applied_index: u64,
    pub proposals_pending: usize,
    pub db_size: engine::EngineSize,
    /// The btree/lsm block cache: counted apart from memory per key.
    pub block_cache: engine::io::CacheUsage,
    pub keys: usize,
    /// Ranges, puts, deletes and txns seen (etcd's mvcc counters).
    pub ops: crate::mvcc::OpCounts,
    pub watchers: usize,
    /// Watchers that fell behind a client that does not read.
    pub slow_watchers: usize,
    /// gRPC watch streams open (the JSON gateway's too).
    pub watch_streams: usize,
    /// Events sent to watchers, each event once per watcher.
    pub watch_events_sent: u64,
    pub quota_backend_bytes: u64,
    /// The store's revision and its last compaction's.
    pub revision: i64,
    pub compact_revision: i64,
}

/// A metric with one sample: its HELP and TYPE lines, then `name`,
/// `labels` (`{server_id="…"}`, or empty) and the value.
fn sample(out: &mut String, kind: &str, name: &str, help: &str, labels: &str, value: u64) {
    let value = go_float(value);
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{labels} {value}"
    );
}

fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    sample(out, "gauge", name, help, "", value);
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    sample(out, "counter", name, help, "", value);
}

/// Values are floats in Prometheus' Go client, printed with `%g`: a
/// million and up in exponent form (etcd prints its 2 GiB quota as
/// `2.147483648e+09`).
pub(crate) fn go_float(v: u64) -> String {
    if v < 1_000_000 {
        return v.to_string();
    }
    go_float64(v as f64)
}

/// The whole page, in etcd's metric order (alphabetical).
/// metcd's own families, which etcd does not have: served on the HTTP API's
/// `/metrics` after etcd's, never on the client URL's (clients compare
/// that page with etcd's).
pub fn render_metcd(g: &Gauges) -> String {
    let mut out = String::new();
    gauge(
        &mut out,
        "metcd_engine_block_cache_bytes",
        "Bytes of file blocks the btree/lsm engine's block cache holds (part of the resident memory).",
        g.block_cache.used_bytes,
    );
    gauge(
        &mut out,
        "metcd_engine_block_cache_capacity_bytes",
        "The most the btree/lsm engine's block cache holds (--engine-cache-bytes).",
        g.block_cache.capacity_bytes,
    );
    out
}

pub fn render(g: &Gauges, m: &NodeMetrics) -> String {
    let mut out = String::with_capacity(8192);
    sample(
        &mut out,
        "gauge",
        "etcd_cluster_version",
        "Which version is running. 1 for 'cluster_version' label with current cluster version",
        &format!(
            "{{cluster_version=\"{}\"}}",
            major_minor(crate::ETCD_CLUSTER_VERSION)
        ),
        1,
    );
    // etcd 3.4 counts these twice: the `etcd_debugging_` names are the
    // older ones, kept until 3.5.
    let ops = [
        ("delete", "deletes", g.ops.deletes),
        ("put", "puts", g.ops.puts),
        ("range", "ranges", g.ops.ranges),
        ("txn", "txns", g.ops.txns),
    ];
    let op_counter = |out: &mut String, prefix: &str, (op, what, value): (&str, &str, u64)| {
        counter(
            out,
            &format!("{prefix}_mvcc_{op}_total"),
            &format!("Total number of {what} seen by this member."),
            value,
        );
    };
    for (what, help, value) in [
        (
            "granted",
            "The total number of granted leases.",
            m.leases_granted.get(),
        ),
        (
            "renewed",
            "The number of renewed leases seen by the leader.",
            m.leases_renewed.get(),
        ),
        (
            "revoked",
            "The total number of revoked leases.",
            m.leases_revoked.get(),
        ),
    ] {
        counter(
            &mut out,
            &format!("etcd_debugging_lease_{what}_total"),
            help,
            value,
        );
    }
    m.lease_ttls.render(
        &mut out,
        "etcd_debugging_lease_ttl_total",
        "Bucketed histogram of lease TTLs.",
    );
    gauge(
        &mut out,
        "etcd_debugging_mvcc_compact_revision",
        "The revision of the last compaction in store.",
        g.compact_revision.max(0) as u64,
    );
    gauge(
        &mut out,
        "etcd_debugging_mvcc_current_revision",
        "The current revision of store.",
        g.revision.max(0) as u64,
    );
    gauge(
        &mut out,
        "etcd_debugging_mvcc_db_total_size_in_bytes",
        "Total size of the underlying database physically allocated in bytes.",
        g.db_size.total_bytes,
    );
    op_counter(&mut out, "etcd_debugging", ops[0]);
    counter(
        &mut out,
        "etcd_debugging_mvcc_events_total",
        "Total number of events sent by this member.",
        g.watch_events_sent,
    );
    gauge(
        &mut out,
        "etcd_debugging_mvcc_keys_total",
        "Total number of keys.",
        g.keys as u64,
    );
    for op in &ops[1..3] {
        op_counter(&mut out, "etcd_debugging", *op);
    }
    gauge(
        &mut out,
        "etcd_debugging_mvcc_slow_watcher_total",
        "Total number of unsynced slow watchers.",
        g.slow_watchers as u64,
    );
    op_counter(&mut out, "etcd_debugging", ops[3]);
    gauge(
        &mut out,
        "etcd_debugging_mvcc_watch_stream_total",
        "Total number of watch streams.",
        g.watch_streams as u64,
    );
    gauge(
        &mut out,
        "etcd_debugging_mvcc_watcher_total",
        "Total number of watchers.",
        g.watchers as u64,
    );
    counter(
        &mut out,
        "etcd_debugging_server_lease_expired_total",
        "The total number of expired leases.",
        m.leases_expired.get(),
    );
    m.backend_commit.render(
        &mut out,
        "etcd_disk_backend_commit_duration_seconds",
        "The latency distributions of commit called by backend.",
    );
    m.wal_fsync.render(
        &mut out,
        "etcd_disk_wal_fsync_duration_seconds",
        "The latency distributions of fsync called by WAL.",
    );
    gauge(
        &mut out,
        "etcd_mvcc_db_total_size_in_bytes",
        "Total size of the underlying database physically allocated in bytes.",
        g.db_size.total_bytes,
    );
    gauge(
        &mut out,
        "etcd_mvcc_db_total_size_in_use_in_bytes",
        "Total size of the underlying database logically in use in bytes.",
        g.db_size.in_use_bytes,
    );
    for op in ops {
        op_counter(&mut out, "etcd", op);
    }
    gauge(
        &mut out,
        "etcd_server_has_leader",
        "Whether or not a leader exists. 1 is existence, 0 is not.",
        u64::from(g.has_leader),
    );
    use std::sync::atomic::Ordering::Relaxed;
    counter(
        &mut out,
        "etcd_server_health_failures",
        "The total number of failed health checks",
        HEALTH_FAILURES.load(Relaxed),
    );
    counter(
        &mut out,
        "etcd_server_health_success",
        "The total number of successful health checks",
        HEALTH_SUCCESS.load(Relaxed),
    );
    sample(
        &mut out,
        "gauge",
        "etcd_server_id",
        "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
        &format!("{{server_id=\"{:x}\"}}", g.member_id),
        1,
    );
    gauge(
        &mut out,
        "etcd_server_is_leader",
        "Whether or not this member is a leader. 1 if is, 0 otherwise.",
        u64::from(g.is_leader),
    );
    gauge(
        &mut out,
        "etcd_server_is_learner",
        "Whether or not this member is a learner. 1 if is, 0 otherwise.",
        u64::from(g.is_learner),
    );
    counter(
        &mut out,
        "etcd_server_leader_changes_seen_total",
        "The number of leader changes seen.",
        m.leader_changes.get(),
    );
    counter(
        &mut out,
        "etcd_server_learner_promote_successes",
        "The total number of successful learner promotions while this member is leader.",
        m.learners_promoted.get(),
    );
    gauge(
        &mut out,
        "etcd_server_proposals_applied_total",
        "The total number of consensus proposals applied.",
        g.applied_index,
    );
    gauge(
        &mut out,
        "etcd_server_proposals_committed_total",
        "The total number of consensus proposals committed.",
        g.committed_index,
    );
    counter(
        &mut out,
        "etcd_server_proposals_failed_total",
        "The total number of failed proposals seen.",
        m.proposals_failed.get(),
    );
    gauge(
        &mut out,
        "etcd_server_proposals_pending",
        "The current number of pending proposals to commit.",
        g.proposals_pending as u64,
    );
    gauge(
        &mut out,
        "etcd_server_quota_backend_bytes",
        "Current backend storage quota size in bytes.",
        g.quota_backend_bytes,
    );
    counter(
        &mut out,
        "etcd_server_slow_apply_total",
        "The total number of slow apply requests (likely overloaded from slow disk).",
        m.slow_applies.get(),
    );
    gauge(
        &mut out,
        "etcd_server_snapshot_apply_in_progress_total",
        "1 if the server is applying the incoming snapshot. 0 if none.",
        u64::from(m.snapshot_applying.get()),
    );
    sample(
        &mut out,
        "gauge",
        "etcd_server_version",
        "Which version is running. 1 for 'server_version' label with current version.",
        &format!("{{server_version=\"{}\"}}", crate::ETCD_API_VERSION),
        1,
    );
    if let Some(grpc) = crate::api::grpc::metrics::counters() {
        grpc.render(&mut out);
    }
    let process = ProcessFigures::read();
    render_os_fds(&mut out, &process);
    render_process(&mut out, &process);
    out
}

/// The Prometheus client's process metrics, as Go's collector reads them
/// from `/proc/self` (what `etcdctl check datascale` reads before and
/// after its load, and what dashboards chart). A figure that cannot be
/// read is left out, as Go's collector leaves out what fails.
#[derive(Debug, Default, PartialEq)]
struct ProcessFigures {
    cpu_seconds: Option<f64>,
    max_fds: Option<f64>,
    open_fds: Option<f64>,
    resident_bytes: Option<f64>,
    start_time_seconds: Option<f64>,
    virtual_bytes: Option<f64>,
    virtual_max_bytes: Option<f64>,
}

impl ProcessFigures {
    fn read() -> ProcessFigures {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        // SAFETY: sysconf only reads a system constant.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let boot_time = read("/proc/stat").and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        });
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|dir| dir.count() as f64);
        let mut figures = ProcessFigures::parse(
            read("/proc/self/stat").as_deref().unwrap_or(""),
            read("/proc/self/limits").as_deref().unwrap_or(""),
            ticks as f64,
            page as f64,
            boot_time,
        );
        figures.open_fds = open_fds;
        figures
    }

    /// The figures in `/proc/self/stat` and `/proc/self/limits` (`ticks`
    /// per second, `page` bytes, the boot time from `/proc/stat`).
    fn parse(stat: &str, limits: &str, ticks: f64, page: f64, boot: Option<f64>) -> ProcessFigures {
        // Fields counted from 1 as in proc(5); the command name (field 2)
        // may hold spaces, so count from its closing parenthesis.
        let after_name: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let field = |n: usize| -> Option<f64> { after_name.get(n.checked_sub(3)?)?.parse().ok() };
        let per_tick = |v: f64| (ticks > 0.0).then(|| v / ticks);
        let limit = |name: &str| -> Option<f64> {
            let rest = limits.lines().find_map(|l| l.strip_prefix(name))?;
            match rest.split_whitespace().next()? {
                // Go reads "unlimited" as the largest uint64.
                "unlimited" => Some(u64::MAX as f64),
                soft => soft.parse().ok(),
            }
        };
        ProcessFigures {
            cpu_seconds: field(14)
                .zip(field(15))
                .and_then(|(user, system)| per_tick(user + system)),
            max_fds: limit("Max open files"),
            open_fds: None,
            resident_bytes: field(24).map(|pages| pages * page),
            start_time_seconds: field(22)
                .and_then(per_tick)
                .zip(boot)
                .map(|(since_boot, boot)| boot + since_boot),
            virtual_bytes: field(23),
            virtual_max_bytes: limit("Max address space"),
        }
    }
}

/// etcd's own file descriptor gauges (the same figures as the process
/// collector's, under etcd's names).
fn render_os_fds(out: &mut String, p: &ProcessFigures) {
    let families = [
        ("os_fd_limit", "The file descriptor limit.", p.max_fds),
        (
            "os_fd_used",
            "The number of used file descriptors.",
            p.open_fds,
        ),
    ];
    for (name, help, value) in families {
        if let Some(value) = value {
            gauge(out, name, help, value as u64);
        }
    }
}

fn render_process(out: &mut String, p: &ProcessFigures) {
    let families = [
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            p.cpu_seconds,
        ),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            p.max_fds,
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            p.open_fds,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            p.resident_bytes,
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            p.start_time_seconds,
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            p.virtual_bytes,
        ),
        (
            "process_virtual_memory_max_bytes",
            "gauge",
            "Maximum amount of virtual memory available in bytes.",
            p.virtual_max_bytes,
        ),
    ];
    for (name, kind, help, value) in families {
        if let Some(value) = value {
            let value = go_float64(value);
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
    }
}

/// A float as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes it (the
/// Prometheus text format): the shortest digits that read back the same,
/// in exponent form below 1e-4 and from 1e6 on (`2.5935872e+07`,
/// `1.79577519494e+09`, `1.5e-05`), plain otherwise (`0.02`, `20000`).
fn go_float64(v: f64) -> String {
    if !v.is_finite() {
        return if v.is_nan() {
            "NaN".into()
        } else if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    let magnitude = v.abs();
    if v == 0.0 || (1e-4..1e6).contains(&magnitude) {
        return format!("{v}");
    }
    let s = format!("{v:e}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let exp: i32 = exp.parse().unwrap_or(0);
            let sign = if exp < 0 { '-' } else { '+' };
            format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
        }
        None => s,
    }
}

/// "3.5.0" -> "3.5", as etcd labels its cluster version.
fn major_minor(version: &str) -> &str {
    match version.match_indices('.').nth(1) {
        Some((at, _)) => &version[..at],
        None => version,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_with_etcds_bounds() {
        let h = DiskHistogram::default();
        h.observe(Duration::from_micros(150));
        h.observe(Duration::from_micros(1500));
        h.observe(Duration::from_secs(20));
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.002\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"8.192\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count 3\n"), "{out}");
        assert!(out.contains("x_sum 20.00165\n"), "{out}");
    }

    /// etcd's lease TTL histogram, as etcd 3.4 printed it for leases of
    /// 2 and 100 seconds (and one of 2^30 s, over every bucket).
    #[test]
    fn lease_ttls_as_etcd_prints_them() {
        let h = TtlHistogram::default();
        h.observe(2);
        h.observe(100);
        let mut out = String::new();
        h.render(&mut out, "t", "help");
        assert!(
            out.contains("t_bucket{le=\"1\"} 0\nt_bucket{le=\"2\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("t_bucket{le=\"64\"} 1\nt_bucket{le=\"128\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("t_bucket{le=\"524288\"} 2\nt_bucket{le=\"1.048576e+06\"} 2\n"));
        assert!(out.contains("t_bucket{le=\"8.388608e+06\"} 2\nt_bucket{le=\"+Inf\"} 2\n"));
        assert!(out.ends_with("t_sum 102\nt_count 2\n"), "{out}");
        h.observe(1 << 30);
        let mut out = String::new();
        h.render(&mut out, "t", "help");
        assert!(out.contains("t_bucket{le=\"8.388608e+06\"} 2\nt_bucket{le=\"+Inf\"} 3\n"));
        assert!(out.ends_with("t_sum 1.073741926e+09\nt_count 3\n"), "{out}");
        assert_eq!(go_float(1_000_000), "1e+06");
        assert_eq!(go_float(999_999), "999999");
    }

    #[test]
    fn numbers_and_labels_as_etcd_prints_them() {
        assert_eq!(format_seconds(1), "0.001");
        assert_eq!(format_seconds(1024), "1.024");
        assert_eq!(format_seconds(2000), "2");
        assert_eq!(go_float(2 << 30), "2.147483648e+09");
        assert_eq!(go_float(20480), "20480");
        assert_eq!(go_float64(0.02), "0.02");
        assert_eq!(go_float64(20000.0), "20000");
        assert_eq!(go_float64(25_935_872.0), "2.5935872e+07");
        assert_eq!(go_float64(1_795_775_194.94), "1.79577519494e+09");
        assert_eq!(go_float64(u64::MAX as f64), "1.8446744073709552e+19");
        assert_eq!(go_float64(0.000015), "1.5e-05");
        assert_eq!(go_float64(0.0), "0");
        assert_eq!(go_float64(-1.0), "-1");
        assert_eq!(major_minor("3.5.0"), "3.5");
        let m = NodeMetrics::default();
        m.note_leader(0);
        m.note_leader(7);
        m.note_leader(7);
        m.note_leader(9);
        // Lost, then the same leader again: a change seen, as etcd counts.
        m.note_leader(0);
        m.note_leader(9);
        assert_eq!(m.leader_changes.get(), 3);
        count(&m.leases_granted);
        count(&m.leases_granted);
        let page = render(
            &Gauges {
                member_id: 0x8e9e05c52164694d,
                has_leader: true,
                revision: 42,
                compact_revision: 7,
                ..Gauges::default()
            },
            &m,
        );
        assert!(page.contains("etcd_server_id{server_id=\"8e9e05c52164694d\"} 1\n"));
        assert!(page.contains("etcd_server_has_leader 1\n"));
        assert!(page.contains("etcd_server_leader_changes_seen_total 3\n"));
        assert!(page.contains("etcd_cluster_version{cluster_version=\"3.5\"} 1\n"));
        assert!(page.contains("etcd_debugging_mvcc_current_revision 42\n"));
        assert!(page.contains("etcd_debugging_mvcc_compact_revision 7\n"));
        assert!(page.contains("etcd_debugging_lease_granted_total 2\n"));
        assert!(page.contains("etcd_debugging_lease_revoked_total 0\n"));
        // Families in name order, as Go's registry writes them.
        let names: Vec<&str> = page
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
    }

    #[test]
    fn process_figures_from_proc_as_gos_collector_reads_them() {
        // A command name with a space and a parenthesis, as proc(5) allows.
        let stat = "4242 (metcd (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    150 50 0 0 20 0 3 0 12300 987654321 2560 18446744073709551615";
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            20000                1048576              files     \n\
                      Max address space         unlimited            unlimited            bytes     \n";
        let p = ProcessFigures::parse(stat, limits, 100.0, 4096.0, Some(1_700_000_000.0));
        assert_eq!(p.cpu_seconds, Some(2.0), "(150 + 50) ticks at 100/s");
        assert_eq!(p.resident_bytes, Some(2560.0 * 4096.0));
        assert_eq!(p.virtual_bytes, Some(987_654_321.0));
        assert_eq!(p.start_time_seconds, Some(1_700_000_123.0));
        assert_eq!(p.max_fds, Some(20000.0));
        assert_eq!(p.virtual_max_bytes, Some(u64::MAX as f64));
        let mut page = String::new();
        render_os_fds(&mut page, &p);
        assert!(
            page.contains("# TYPE os_fd_limit gauge\nos_fd_limit 20000\n"),
            "{page}"
        );
        let mut page = String::new();
        render_process(&mut page, &p);
        assert!(page.contains(
            "# HELP process_resident_memory_bytes Resident memory size in bytes.\n\
             # TYPE process_resident_memory_bytes gauge\n\
             process_resident_memory_bytes 1.048576e+07\n"
        ));
        assert!(page.contains("process_max_fds 20000\n"));
        assert!(!page.contains("process_open_fds"), "unread: left out");

        // Garbage in, figures left out (never a panic).
        assert_eq!(
            ProcessFigures::parse("", "", 100.0, 4096.0, None),
            ProcessFigures::default()
        );
        assert_eq!(
            ProcessFigures::parse("1 (x) S", "", 0.0, 4096.0, None),
            ProcessFigures::default()
        );
    }
}
