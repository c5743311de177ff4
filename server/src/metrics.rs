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

/// A Prometheus histogram with Go's `ExponentialBuckets(first, 2, N)`:
/// `FIRST_E4` is the first bucket's bound in units of 10^-4 (etcd's
/// histograms start at 0.0001 to 1,000,000), then each bound doubles.
#[derive(Debug)]
pub struct Histogram<const FIRST_E4: u64, const N: usize> {
    /// Observations at or below each bucket's bound and over the one
    /// before (not cumulative here; rendering sums them).
    buckets: [Cell<u64>; N],
    over: Cell<u64>,
    /// Summed as Go's client sums: in float64.
    sum: Cell<f64>,
}

impl<const FIRST_E4: u64, const N: usize> Default for Histogram<FIRST_E4, N> {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| Cell::new(0)),
            over: Cell::new(0),
            sum: Cell::new(0.0),
        }
    }
}

impl<const FIRST_E4: u64, const N: usize> Histogram<FIRST_E4, N> {
    fn bound(i: usize) -> f64 {
        // Doubling a float is exact: Go's repeated `start *= factor`.
        (FIRST_E4 as f64 / 1e4) * f64::from(1u32 << i)
    }

    pub fn observe(&self, value: f64) {
        let slot = (0..N).find(|&i| value <= Self::bound(i));
        let counter = slot.map_or(&self.over, |i| &self.buckets[i]);
        counter.set(counter.get() + 1);
        self.sum.set(self.sum.get() + value);
    }

    /// Observes a duration in seconds (etcd's `_seconds` histograms).
    pub fn observe_seconds(&self, took: Duration) {
        self.observe(took.as_secs_f64());
    }

    /// Observes a duration in whole milliseconds, truncated as etcd's
    /// `float64(time.Since(start) / time.Millisecond)`.
    pub fn observe_millis(&self, took: Duration) {
        self.observe(took.as_millis() as f64);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        self.render_series(out, name, "");
    }

    /// The histogram's lines with `labels` (`To="…"`, or none).
    fn render_series(&self, out: &mut String, name: &str, labels: &str) {
        let buckets =
            (self.buckets.iter().enumerate()).map(|(i, count)| (Self::bound(i), count.get()));
        histogram_series(out, name, labels, buckets, self.over.get(), self.sum.get());
    }
}

/// One series of a histogram: a line per bucket with its bound and the
/// observations up to it (`buckets` holds each bucket's own count, in
/// bound order), the `+Inf` line (`over`: observations past every bound),
/// then its sum and count, all with `labels` (`a="…",b="…"`, or none).
pub(crate) fn histogram_series(
    out: &mut String,
    name: &str,
    labels: &str,
    buckets: impl IntoIterator<Item = (f64, u64)>,
    over: u64,
    sum: f64,
) {
    let sep = if labels.is_empty() { "" } else { "," };
    let mut cumulative = 0;
    for (le, count) in buckets {
        cumulative += count;
        let le = go_float64(le);
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
        );
    }
    cumulative += over;
    let _ = writeln!(
        out,
        "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}"
    );
    let sum = go_float64(sum);
    let labels = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(
        out,
        "{name}_sum{labels} {sum}\n{name}_count{labels} {cumulative}"
    );
}

/// A labelled family (a Go counter or gauge vector) that holds only the
/// series seen so far: nothing at all while `series` is empty, else its
/// HELP and TYPE lines, then `name{labels} value` for each
/// `(labels, value)` in the order given.
pub(crate) fn labelled_family(
    out: &mut String,
    (name, kind, help): (&str, &str, &str),
    series: impl IntoIterator<Item = (String, u64)>,
) {
    let mut series = series.into_iter().peekable();
    if series.peek().is_none() {
        return;
    }
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in series {
        let _ = writeln!(out, "{name}{{{labels}}} {}", go_float(value));
    }
}

/// etcd's disk latency buckets: 1 ms doubling up to 8.192 s.
pub type DiskHistogram = Histogram<10, 14>;

/// etcd's lease TTL buckets: 1 s to 2^23 s (`ExponentialBuckets(1, 2, 24)`).
pub type TtlHistogram = Histogram<10_000, 24>;

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
    /// Heartbeats this member, as leader, sent later than twice the
    /// heartbeat interval after the last one to the same peer (etcd's
    /// sign of an overloaded leader).
    pub heartbeat_send_failures: Cell<u64>,
    /// ReadIndex rounds that failed (no leader, or a leader change).
    pub read_indexes_failed: Cell<u64>,
    /// ReadIndex rounds that timed out, or answered after this member
    /// had given up on them.
    pub slow_read_indexes: Cell<u64>,
    /// Promotions this member refused as leader, by reason (a handful of
    /// error messages at most).
    pub learner_promote_failures: std::cell::RefCell<Vec<(String, u64)>>,
    /// Revisions compactions deleted from the engine.
    pub compaction_keys: Cell<u64>,
    /// How long each compaction held writes, and took in all (metcd
    /// compacts in one step, so these are the same), and the part spent
    /// pruning the key index, in milliseconds.
    pub compaction_pause_ms: Histogram<10_000, 13>,
    pub compaction_total_ms: Histogram<1_000_000, 14>,
    pub index_compaction_pause_ms: Histogram<5_000, 14>,
    pub defrag: Histogram<1_000, 13>,
    pub defrag_inflight: Cell<bool>,
    /// Backups streamed by the Maintenance Snapshot RPC.
    pub backend_snapshot: Histogram<100, 17>,
    /// The Hash and HashKV RPCs.
    pub hash: Histogram<100, 15>,
    pub hash_rev: Histogram<100, 15>,
    /// Per peer, as leader: from a heartbeat to its response.
    pub peer_round_trips: std::cell::RefCell<std::collections::BTreeMap<u64, Histogram<1, 16>>>,
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

    /// Records a compaction that took `took` to apply, writes waiting all
    /// along (metcd deletes a compaction's garbage in one engine batch).
    pub fn note_compaction(&self, took: Duration, stats: crate::mvcc::store::CompactionStats) {
        self.compaction_keys
            .set(self.compaction_keys.get() + stats.revisions_deleted);
        self.compaction_pause_ms.observe_millis(took);
        self.compaction_total_ms.observe_millis(took);
        self.index_compaction_pause_ms
            .observe_millis(stats.index_pause);
    }

    /// Counts a promotion refused for `reason` (etcd labels the series
    /// with the error's message).
    pub fn note_promote_failure(&self, reason: &str) {
        let mut failures = self.learner_promote_failures.borrow_mut();
        match failures.iter_mut().find(|(r, _)| r == reason) {
            Some((_, n)) => *n += 1,
            None => failures.push((reason.to_string(), 1)),
        }
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
    /// The auth store's revision (1 before its first change, as etcd's).
    pub auth_revision: u64,
    /// Events queued for watch clients and not yet taken by their streams.
    pub pending_events: u64,
    /// Bytes of WAL frames this process wrote.
    pub wal_write_bytes: u64,
    /// Traffic with each peer this member has had a link with.
    pub peers: Option<std::rc::Rc<crate::peer::PeerTraffic>>,
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

pub(crate) fn counter(out: &mut String, name: &str, help: &str, value: u64) {
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

/// The whole page, in etcd's metric order (alphabetical: the families are
/// written in any order, then sorted by [`in_name_order`]).
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
    for prefix in ["etcd", "etcd_debugging"] {
        for (op, what, value) in ops {
            counter(
                &mut out,
                &format!("{prefix}_mvcc_{op}_total"),
                &format!("Total number of {what} seen by this member."),
                value,
            );
        }
    }
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
    gauge(
        &mut out,
        "etcd_debugging_mvcc_slow_watcher_total",
        "Total number of unsynced slow watchers.",
        g.slow_watchers as u64,
    );
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
    render_more(&mut out, g, m);
    if let Some(grpc) = crate::api::grpc::metrics::counters() {
        grpc.render_etcd(&mut out);
        grpc.render(&mut out);
    }
    let process = ProcessFigures::read();
    render_os_fds(&mut out, &process);
    render_process(&mut out, &process);
    in_name_order(&out)
}

/// The families of compaction, defragmentation, hashing, backups, the WAL,
/// ReadIndex and heartbeats ([`render`] writes families in any order:
/// [`in_name_order`] sorts the page).
fn render_more(out: &mut String, g: &Gauges, m: &NodeMetrics) {
    gauge(
        out,
        "etcd_debugging_auth_revision",
        "The current revision of auth store.",
        g.auth_revision,
    );
    counter(
        out,
        "etcd_debugging_mvcc_db_compaction_keys_total",
        "Total number of db keys compacted.",
        m.compaction_keys.get(),
    );
    m.compaction_pause_ms.render(
        out,
        "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds",
        "Bucketed histogram of db compaction pause duration.",
    );
    m.compaction_total_ms.render(
        out,
        "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds",
        "Bucketed histogram of db compaction total duration.",
    );
    m.index_compaction_pause_ms.render(
        out,
        "etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds",
        "Bucketed histogram of index compaction pause duration.",
    );
    gauge(
        out,
        "etcd_debugging_mvcc_pending_events_total",
        "Total number of pending events to be sent.",
        g.pending_events,
    );
    gauge(
        out,
        "etcd_debugging_mvcc_total_put_size_in_bytes",
        "The total size of put kv pairs seen by this member.",
        g.ops.put_bytes,
    );
    m.defrag.render(
        out,
        "etcd_disk_backend_defrag_duration_seconds",
        "The latency distribution of backend defragmentation.",
    );
    m.backend_snapshot.render(
        out,
        "etcd_disk_backend_snapshot_duration_seconds",
        "The latency distribution of backend snapshots.",
    );
    gauge(
        out,
        "etcd_disk_defrag_inflight",
        "Whether or not defrag is active on the member. 1 means active, 0 means not.",
        u64::from(m.defrag_inflight.get()),
    );
    gauge(
        out,
        "etcd_disk_wal_write_bytes_total",
        "Total number of bytes written in WAL.",
        g.wal_write_bytes,
    );
    m.hash.render(
        out,
        "etcd_mvcc_hash_duration_seconds",
        "The latency distribution of storage hash operation.",
    );
    m.hash_rev.render(
        out,
        "etcd_mvcc_hash_rev_duration_seconds",
        "The latency distribution of storage hash by revision operation.",
    );
    counter(
        out,
        "etcd_server_heartbeat_send_failures_total",
        "The total number of leader heartbeat send failures (likely overloaded from slow disk).",
        m.heartbeat_send_failures.get(),
    );
    let mut failures = m.learner_promote_failures.borrow().clone();
    failures.sort();
    labelled_family(
        out,
        (
            "etcd_server_learner_promote_failures",
            "counter",
            "The total number of failed learner promotions (likely learner not ready) while this member is leader.",
        ),
        (failures.into_iter()).map(|(reason, n)| (format!("Reason=\"{}\"", label_value(&reason)), n)),
    );
    render_peers(out, g, m);
    counter(
        out,
        "etcd_server_read_indexes_failed_total",
        "The total number of failed read indexes seen.",
        m.read_indexes_failed.get(),
    );
    counter(
        out,
        "etcd_server_slow_read_indexes_total",
        "The total number of pending read indexes not in sync with leader's or timed out read index requests.",
        m.slow_read_indexes.get(),
    );
}

/// etcd's peer network families (rafthttp's): a series per peer once
/// there is something to count, labelled with member IDs in hex.
fn render_peers(out: &mut String, g: &Gauges, m: &NodeMetrics) {
    let Some(traffic) = &g.peers else {
        return;
    };
    let mut peers: Vec<(String, crate::peer::PeerCounts)> = traffic
        .all()
        .into_iter()
        .map(|(id, counts)| (format!("{id:x}"), counts))
        .collect();
    peers.sort_by(|a, b| a.0.cmp(&b.0));
    let local = format!("{:x}", g.member_id);
    type Pick = fn(&crate::peer::PeerCounts) -> Option<u64>;
    let families: [(&str, &str, &str, &str, Pick); 12] = [
        (
            "etcd_network_active_peers",
            "gauge",
            "The current number of active peer connections.",
            "Local",
            |c| c.ever_active.then_some(u64::from(c.active)),
        ),
        (
            "etcd_network_disconnected_peers_total",
            "counter",
            "The total number of disconnected peers.",
            "Local",
            |c| (c.disconnects > 0).then_some(c.disconnects),
        ),
        (
            "etcd_network_peer_received_bytes_total",
            "counter",
            "The total number of bytes received from peers.",
            "From",
            |c| (c.received_bytes > 0).then_some(c.received_bytes),
        ),
        (
            "etcd_network_peer_sent_bytes_total",
            "counter",
            "The total number of bytes sent to peers.",
            "To",
            |c| (c.sent_bytes > 0).then_some(c.sent_bytes),
        ),
        (
            "etcd_network_peer_received_failures_total",
            "counter",
            "The total number of receive failures from peers.",
            "From",
            |c| (c.received_failures > 0).then_some(c.received_failures),
        ),
        (
            "etcd_network_peer_sent_failures_total",
            "counter",
            "The total number of send failures from peers.",
            "To",
            |c| (c.sent_failures > 0).then_some(c.sent_failures),
        ),
        (
            "etcd_network_snapshot_receive_failures",
            "counter",
            "Total number of snapshot receive failures",
            "From",
            |c| (c.snapshot_receive_failures > 0).then_some(c.snapshot_receive_failures),
        ),
        (
            "etcd_network_snapshot_receive_inflights_total",
            "gauge",
            "Total number of inflight snapshot receives",
            "From",
            |c| {
                (c.snapshot_receives + c.snapshot_receive_failures + c.snapshot_receives_inflight
                    > 0)
                .then_some(c.snapshot_receives_inflight)
            },
        ),
        (
            "etcd_network_snapshot_receive_success",
            "counter",
            "Total number of successful snapshot receives",
            "From",
            |c| (c.snapshot_receives > 0).then_some(c.snapshot_receives),
        ),
        (
            "etcd_network_snapshot_send_failures",
            "counter",
            "Total number of snapshot send failures",
            "To",
            |c| (c.snapshot_send_failures > 0).then_some(c.snapshot_send_failures),
        ),
        (
            "etcd_network_snapshot_send_inflights_total",
            "gauge",
            "Total number of inflight snapshot sends",
            "To",
            |c| {
                (c.snapshot_sends + c.snapshot_send_failures + c.snapshot_sends_inflight > 0)
                    .then_some(c.snapshot_sends_inflight)
            },
        ),
        (
            "etcd_network_snapshot_send_success",
            "counter",
            "Total number of successful snapshot sends",
            "To",
            |c| (c.snapshot_sends > 0).then_some(c.snapshot_sends),
        ),
    ];
    for (name, kind, help, label, pick) in families {
        let series = peers.iter().filter_map(|(peer, counts)| {
            let labels = if label == "Local" {
                format!("Local=\"{local}\",Remote=\"{peer}\"")
            } else {
                format!("{label}=\"{peer}\"")
            };
            Some((labels, pick(counts)?))
        });
        labelled_family(out, (name, kind, help), series);
    }
    let round_trips = m.peer_round_trips.borrow();
    render_by_peer(
        out,
        (
            "etcd_network_peer_round_trip_time_seconds",
            "Round-Trip-Time histogram between peers",
        ),
        "To",
        round_trips.iter(),
    );
    render_by_peer(
        out,
        (
            "etcd_network_snapshot_receive_total_duration_seconds",
            "Total latency distributions of v3 snapshot receives",
        ),
        "From",
        traffic.snapshot_receive_seconds.borrow().iter(),
    );
    render_by_peer(
        out,
        (
            "etcd_network_snapshot_send_total_duration_seconds",
            "Total latency distributions of v3 snapshot sends",
        ),
        "To",
        traffic.snapshot_send_seconds.borrow().iter(),
    );
}

/// A histogram family with a series per peer (none: no family), labelled
/// `label="<member ID in hex>"` and sorted as Go sorts label values.
fn render_by_peer<'a, const F: u64, const N: usize>(
    out: &mut String,
    (name, help): (&str, &str),
    label: &str,
    by_peer: impl Iterator<Item = (&'a u64, &'a Histogram<F, N>)>,
) {
    let mut sorted: Vec<(String, &Histogram<F, N>)> =
        by_peer.map(|(id, h)| (format!("{id:x}"), h)).collect();
    if sorted.is_empty() {
        return;
    }
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (peer, h) in sorted {
        h.render_series(out, name, &format!("{label}=\"{peer}\""));
    }
}

/// A label value escaped as the Prometheus text format wants it.
pub(crate) fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The page with its families sorted by name, as Go's registry writes
/// them (each family is its `# HELP` line and what follows up to the next).
fn in_name_order(page: &str) -> String {
    let mut families: Vec<&str> = Vec::new();
    let mut rest = page;
    while !rest.is_empty() {
        let next = rest
            .get(1..)
            .and_then(|r| r.find("\n# HELP "))
            .map_or(rest.len(), |at| at + 2);
        families.push(&rest[..next]);
        rest = &rest[next..];
    }
    let name = |f: &str| {
        let f = f.strip_prefix("# HELP ").unwrap_or(f);
        f.split(' ').next().unwrap_or("").to_string()
    };
    families.sort_by_cached_key(|f| name(f));
    families.concat()
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
pub(crate) fn go_float64(v: f64) -> String {
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
        h.observe_seconds(Duration::from_micros(150));
        h.observe_seconds(Duration::from_micros(1500));
        h.observe_seconds(Duration::from_secs(20));
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.002\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"8.192\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count 3\n"), "{out}");
        // Summed in float64, as Go's client sums.
        assert!(
            out.contains(&format!("x_sum {}\n", 0.00015 + 0.0015 + 20.0)),
            "{out}"
        );
    }

    /// etcd's lease TTL histogram, as etcd 3.4 printed it for leases of
    /// 2 and 100 seconds (and one of 2^30 s, over every bucket).
    #[test]
    fn lease_ttls_as_etcd_prints_them() {
        let h = TtlHistogram::default();
        h.observe(2.0);
        h.observe(100.0);
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
        h.observe(f64::from(1u32 << 30));
        let mut out = String::new();
        h.render(&mut out, "t", "help");
        assert!(out.contains("t_bucket{le=\"8.388608e+06\"} 2\nt_bucket{le=\"+Inf\"} 3\n"));
        assert!(out.ends_with("t_sum 1.073741926e+09\nt_count 3\n"), "{out}");
        assert_eq!(go_float(1_000_000), "1e+06");
        assert_eq!(go_float(999_999), "999999");
    }

    /// The bucket bounds of each histogram as etcd 3.4.23's `/metrics`
    /// printed them, and what one compaction, defragmentation, backup and
    /// hash add.
    #[test]
    fn histograms_have_etcds_bounds_and_count_what_happened() {
        let etcd = [
            (
                "etcd_disk_backend_snapshot_duration_seconds",
                "0.01 0.02 0.04 0.08 0.16 0.32 0.64 1.28 2.56 5.12 10.24 20.48 40.96 81.92 163.84 327.68 655.36 +Inf",
            ),
            (
                "etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds",
                "0.5 1 2 4 8 16 32 64 128 256 512 1024 2048 4096 +Inf",
            ),
            (
                "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds",
                "100 200 400 800 1600 3200 6400 12800 25600 51200 102400 204800 409600 819200 +Inf",
            ),
            (
                "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds",
                "1 2 4 8 16 32 64 128 256 512 1024 2048 4096 +Inf",
            ),
            (
                "etcd_disk_backend_defrag_duration_seconds",
                "0.1 0.2 0.4 0.8 1.6 3.2 6.4 12.8 25.6 51.2 102.4 204.8 409.6 +Inf",
            ),
            (
                "etcd_mvcc_hash_rev_duration_seconds",
                "0.01 0.02 0.04 0.08 0.16 0.32 0.64 1.28 2.56 5.12 10.24 20.48 40.96 81.92 163.84 +Inf",
            ),
            (
                "etcd_mvcc_hash_duration_seconds",
                "0.01 0.02 0.04 0.08 0.16 0.32 0.64 1.28 2.56 5.12 10.24 20.48 40.96 81.92 163.84 +Inf",
            ),
        ];
        let m = NodeMetrics::default();
        m.note_compaction(
            Duration::from_micros(2500),
            crate::mvcc::store::CompactionStats {
                revisions_deleted: 3,
                index_pause: Duration::from_micros(300),
            },
        );
        m.defrag.observe_seconds(Duration::from_millis(150));
        m.backend_snapshot.observe_seconds(Duration::from_millis(5));
        m.note_promote_failure("etcdserver: can only promote a learner member");
        m.note_promote_failure("etcdserver: can only promote a learner member");
        let page = render(
            &Gauges {
                auth_revision: 1,
                pending_events: 7,
                wal_write_bytes: 1712,
                ops: crate::mvcc::OpCounts {
                    put_bytes: 4,
                    ..Default::default()
                },
                ..Gauges::default()
            },
            &m,
        );
        for (name, bounds) in etcd {
            let ours: Vec<&str> = page
                .lines()
                .filter_map(|l| l.strip_prefix(name)?.strip_prefix("_bucket{le=\""))
                .filter_map(|l| l.split('"').next())
                .collect();
            assert_eq!(ours.join(" "), bounds, "{name}");
        }
        for line in [
            "etcd_debugging_mvcc_db_compaction_keys_total 3\n",
            // 2.5 ms is 2 whole milliseconds, as etcd truncates.
            "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds_bucket{le=\"1\"} 0\n",
            "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds_bucket{le=\"2\"} 1\n",
            "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds_sum 2\n",
            "etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds_bucket{le=\"0.5\"} 1\n",
            "etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds_sum 0\n",
            "etcd_disk_backend_defrag_duration_seconds_bucket{le=\"0.1\"} 0\n",
            "etcd_disk_backend_defrag_duration_seconds_bucket{le=\"0.2\"} 1\n",
            "etcd_disk_backend_defrag_duration_seconds_sum 0.15\n",
            "etcd_disk_backend_snapshot_duration_seconds_bucket{le=\"0.01\"} 1\n",
            "etcd_mvcc_hash_duration_seconds_count 0\n",
            "etcd_disk_defrag_inflight 0\n",
            "etcd_disk_wal_write_bytes_total 1712\n",
            "etcd_debugging_auth_revision 1\n",
            "etcd_debugging_mvcc_pending_events_total 7\n",
            "etcd_debugging_mvcc_total_put_size_in_bytes 4\n",
            "etcd_server_heartbeat_send_failures_total 0\n",
            "etcd_server_read_indexes_failed_total 0\n",
            "etcd_server_slow_read_indexes_total 0\n",
            "# TYPE etcd_server_learner_promote_failures counter\n\
             etcd_server_learner_promote_failures{Reason=\"etcdserver: can only promote a learner member\"} 2\n",
        ] {
            assert!(page.contains(line), "{line} not in:\n{page}");
        }
        assert!(!render(&Gauges::default(), &NodeMetrics::default())
            .contains("learner_promote_failures"));
        assert_eq!(label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    /// Peer series are labelled with member IDs in hex, sorted as strings,
    /// and printed once there is something to count.
    #[test]
    fn peer_families_as_etcds_rafthttp_prints_them() {
        let quiet = crate::peer::PeerCounts::default();
        let busy = crate::peer::PeerCounts {
            sent_bytes: 10,
            received_bytes: 20,
            active: true,
            ever_active: true,
            ..quiet
        };
        let m = NodeMetrics::default();
        m.peer_round_trips
            .borrow_mut()
            .entry(0xab)
            .or_default()
            .observe_seconds(Duration::from_micros(150));
        let traffic = std::rc::Rc::new(crate::peer::PeerTraffic::default());
        for (peer, counts) in [(0xab, busy), (0x9, busy), (0x7, quiet)] {
            traffic.update(peer, |c| *c = counts);
        }
        // A snapshot sent to 9 (and one under way), one from ab that failed.
        traffic.update(0x9, |c| c.snapshot_sends_inflight = 2);
        traffic.snapshot_done(0x9, true, std::time::Instant::now(), true);
        traffic.update(0xab, |c| c.snapshot_receives_inflight = 1);
        traffic.snapshot_done(0xab, false, std::time::Instant::now(), false);
        let page = render(
            &Gauges {
                member_id: 0x1,
                peers: Some(traffic),
                ..Gauges::default()
            },
            &m,
        );
        for line in [
            "etcd_network_snapshot_send_success{To=\"9\"} 1\n",
            "etcd_network_snapshot_send_inflights_total{To=\"9\"} 1\n",
            "etcd_network_snapshot_receive_failures{From=\"ab\"} 1\n",
            "etcd_network_snapshot_receive_inflights_total{From=\"ab\"} 0\n",
            "etcd_network_snapshot_send_total_duration_seconds_bucket{To=\"9\",le=\"0.1\"} 1\n",
            "etcd_network_snapshot_send_total_duration_seconds_bucket{To=\"9\",le=\"51.2\"} 1\n",
        ] {
            assert!(page.contains(line), "{line} not in:\n{page}");
        }
        assert!(!page.contains("etcd_network_snapshot_receive_success"));
        assert!(!page.contains("etcd_network_snapshot_receive_total_duration_seconds"));
        assert!(page.contains(
            "# TYPE etcd_network_active_peers gauge\n\
             etcd_network_active_peers{Local=\"1\",Remote=\"9\"} 1\n\
             etcd_network_active_peers{Local=\"1\",Remote=\"ab\"} 1\n"
        ));
        assert!(page.contains(
            "etcd_network_peer_sent_bytes_total{To=\"9\"} 10\n\
             etcd_network_peer_sent_bytes_total{To=\"ab\"} 10\n"
        ));
        assert!(page.contains("etcd_network_peer_received_bytes_total{From=\"ab\"} 20\n"));
        assert!(!page.contains("Remote=\"7\""));
        assert!(!page.contains("etcd_network_peer_sent_failures_total"));
        assert!(!page.contains("etcd_network_disconnected_peers_total"));
        assert!(page.contains(
            "etcd_network_peer_round_trip_time_seconds_bucket{To=\"ab\",le=\"0.0001\"} 0\n\
             etcd_network_peer_round_trip_time_seconds_bucket{To=\"ab\",le=\"0.0002\"} 1\n"
        ));
        assert!(page.contains(
            "etcd_network_peer_round_trip_time_seconds_bucket{To=\"ab\",le=\"3.2768\"} 1\n\
             etcd_network_peer_round_trip_time_seconds_bucket{To=\"ab\",le=\"+Inf\"} 1\n\
             etcd_network_peer_round_trip_time_seconds_sum{To=\"ab\"} 0.00015\n\
             etcd_network_peer_round_trip_time_seconds_count{To=\"ab\"} 1\n"
        ));
    }

    #[test]
    fn numbers_and_labels_as_etcd_prints_them() {
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
