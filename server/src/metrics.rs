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
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        let mut bound_ms = 1u64;
        for b in &self.buckets {
            cumulative += b.get();
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{}\"}} {cumulative}",
                format_seconds(bound_ms)
            );
            bound_ms *= 2;
        }
        cumulative += self.over.get();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = self.sum_nanos.get() as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cumulative}");
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
}

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
        self.proposals_failed.set(self.proposals_failed.get() + 1);
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
    pub keys: usize,
    pub watchers: usize,
    pub quota_backend_bytes: u64,
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
fn go_float(v: u64) -> String {
    if v < 1_000_000 {
        return v.to_string();
    }
    let s = format!("{:e}", v as f64);
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let exp: i32 = exp.parse().unwrap_or(0);
            format!("{mantissa}e+{exp:02}")
        }
        None => s,
    }
}

/// The whole page, in etcd's metric order (alphabetical).
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
    gauge(
        &mut out,
        "etcd_debugging_mvcc_keys_total",
        "Total number of keys.",
        g.keys as u64,
    );
    gauge(
        &mut out,
        "etcd_debugging_mvcc_watcher_total",
        "Total number of watchers.",
        g.watchers as u64,
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
    gauge(
        &mut out,
        "etcd_server_has_leader",
        "Whether or not a leader exists. 1 is existence, 0 is not.",
        u64::from(g.has_leader),
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
    sample(
        &mut out,
        "gauge",
        "etcd_server_version",
        "Which version is running. 1 for 'server_version' label with current version.",
        &format!("{{server_version=\"{}\"}}", crate::ETCD_API_VERSION),
        1,
    );
    out
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

    #[test]
    fn numbers_and_labels_as_etcd_prints_them() {
        assert_eq!(format_seconds(1), "0.001");
        assert_eq!(format_seconds(1024), "1.024");
        assert_eq!(format_seconds(2000), "2");
        assert_eq!(go_float(2 << 30), "2.147483648e+09");
        assert_eq!(go_float(20480), "20480");
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
        let page = render(
            &Gauges {
                member_id: 0x8e9e05c52164694d,
                has_leader: true,
                ..Gauges::default()
            },
            &m,
        );
        assert!(page.contains("etcd_server_id{server_id=\"8e9e05c52164694d\"} 1\n"));
        assert!(page.contains("etcd_server_has_leader 1\n"));
        assert!(page.contains("etcd_server_leader_changes_seen_total 3\n"));
        assert!(page.contains("etcd_cluster_version{cluster_version=\"3.5\"} 1\n"));
    }
}
