//! etcd's gRPC metrics (go-grpc-prometheus, as etcd 3.4 registers it):
//! `grpc_server_started_total`, `grpc_server_handled_total` (by code),
//! `grpc_server_msg_received_total` and `grpc_server_msg_sent_total`, for
//! every method of the services etcd instruments, zeros included.
//!
//! Counted where etcd counts them: after the leader check (a `no leader`
//! refusal is not an RPC the handler saw), on the shard that serves the
//! connection. Each shard writes only its own slot (relaxed atomics, no
//! cache line shared between writers); the page sums the slots. This
//! module never blocks and never allocates on the request path.

use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Instant;

use hyper::body::{Body, Frame, SizeHint};

/// (service, method, type) of every method etcd 3.4's gRPC metrics list,
/// in their order (grpc.health.v1 aside: metcd does not serve it).
pub const METHODS: &[(&str, &str, &str)] = &[
    ("etcdserverpb.Auth", "AuthDisable", "unary"),
    ("etcdserverpb.Auth", "AuthEnable", "unary"),
    ("etcdserverpb.Auth", "Authenticate", "unary"),
    ("etcdserverpb.Auth", "RoleAdd", "unary"),
    ("etcdserverpb.Auth", "RoleDelete", "unary"),
    ("etcdserverpb.Auth", "RoleGet", "unary"),
    ("etcdserverpb.Auth", "RoleGrantPermission", "unary"),
    ("etcdserverpb.Auth", "RoleList", "unary"),
    ("etcdserverpb.Auth", "RoleRevokePermission", "unary"),
    ("etcdserverpb.Auth", "UserAdd", "unary"),
    ("etcdserverpb.Auth", "UserChangePassword", "unary"),
    ("etcdserverpb.Auth", "UserDelete", "unary"),
    ("etcdserverpb.Auth", "UserGet", "unary"),
    ("etcdserverpb.Auth", "UserGrantRole", "unary"),
    ("etcdserverpb.Auth", "UserList", "unary"),
    ("etcdserverpb.Auth", "UserRevokeRole", "unary"),
    ("etcdserverpb.Cluster", "MemberAdd", "unary"),
    ("etcdserverpb.Cluster", "MemberList", "unary"),
    ("etcdserverpb.Cluster", "MemberPromote", "unary"),
    ("etcdserverpb.Cluster", "MemberRemove", "unary"),
    ("etcdserverpb.Cluster", "MemberUpdate", "unary"),
    ("etcdserverpb.KV", "Compact", "unary"),
    ("etcdserverpb.KV", "DeleteRange", "unary"),
    ("etcdserverpb.KV", "Put", "unary"),
    ("etcdserverpb.KV", "Range", "unary"),
    ("etcdserverpb.KV", "Txn", "unary"),
    ("etcdserverpb.Lease", "LeaseGrant", "unary"),
    ("etcdserverpb.Lease", "LeaseKeepAlive", "bidi_stream"),
    ("etcdserverpb.Lease", "LeaseLeases", "unary"),
    ("etcdserverpb.Lease", "LeaseRevoke", "unary"),
    ("etcdserverpb.Lease", "LeaseTimeToLive", "unary"),
    ("etcdserverpb.Maintenance", "Alarm", "unary"),
    ("etcdserverpb.Maintenance", "Defragment", "unary"),
    ("etcdserverpb.Maintenance", "Hash", "unary"),
    ("etcdserverpb.Maintenance", "HashKV", "unary"),
    ("etcdserverpb.Maintenance", "MoveLeader", "unary"),
    ("etcdserverpb.Maintenance", "Snapshot", "server_stream"),
    ("etcdserverpb.Maintenance", "Status", "unary"),
    ("etcdserverpb.Watch", "Watch", "bidi_stream"),
];

/// gRPC status codes by number, named as grpc-go names them.
const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// The `client-api-version` values etcd's clients send, in label order
/// (`etcd_server_client_requests_total`). Any other value, or none, counts
/// as `unknown`, so a client cannot grow the page without bound.
const CLIENT_VERSIONS: [&str; 9] = [
    "3.0", "3.1", "3.2", "3.3", "3.4", "3.5", "3.6", "3.7", "unknown",
];

/// Prometheus' default buckets, which go-grpc-prometheus' handling-time
/// histogram uses (`--metrics extensive`), in seconds.
const HANDLING_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Counters per method of the handling-time histogram: its buckets (not
/// cumulative here), then those over every bound, then the summed
/// nanoseconds.
const HANDLING_SLOTS: usize = HANDLING_BUCKETS.len() + 2;

/// The request types of `etcd_server_client_requests_total`, in label order.
const REQUEST_TYPES: [&str; 2] = ["stream", "unary"];

/// The index in [`METHODS`] of a gRPC path (`/etcdserverpb.KV/Put`).
pub fn method_of(path: &str) -> Option<usize> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    METHODS
        .iter()
        .position(|(s, m, _)| *s == service && *m == method)
}

/// One shard's counters, on cache lines of their own.
#[repr(align(128))]
struct Slot {
    started: Box<[AtomicU64]>,
    received: Box<[AtomicU64]>,
    sent: Box<[AtomicU64]>,
    /// `METHODS.len() * CODES.len()`, method-major.
    handled: Box<[AtomicU64]>,
    /// `CLIENT_VERSIONS.len() * REQUEST_TYPES.len()`, version-major.
    client_requests: Box<[AtomicU64]>,
    /// Bytes of gRPC messages (etcd's codec counts what it decodes and
    /// encodes: the 5-byte prefixes aside).
    received_bytes: AtomicU64,
    sent_bytes: AtomicU64,
    /// `METHODS.len() * HANDLING_SLOTS` with `--metrics extensive`, else
    /// empty.
    handling: Box<[AtomicU64]>,
}

fn zeros(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

/// The counters of every shard.
pub struct GrpcCounters {
    slots: Box<[Slot]>,
    /// Whether RPCs' handling times are measured (`--metrics extensive`).
    extensive: bool,
}

static COUNTERS: OnceLock<GrpcCounters> = OnceLock::new();

/// Sets up the process's counters for `shards` shards (once, at start),
/// with handling times if `extensive`.
pub fn init(shards: usize, extensive: bool) {
    let _ = COUNTERS.set(GrpcCounters::new(shards, extensive));
}

/// The process's counters, once [`init`] ran.
pub fn counters() -> Option<&'static GrpcCounters> {
    COUNTERS.get()
}

impl GrpcCounters {
    pub fn new(shards: usize, extensive: bool) -> GrpcCounters {
        let n = METHODS.len();
        let handling = if extensive { n * HANDLING_SLOTS } else { 0 };
        let slots = (0..shards.max(1))
            .map(|_| Slot {
                started: zeros(n),
                received: zeros(n),
                sent: zeros(n),
                handled: zeros(n * CODES.len()),
                client_requests: zeros(CLIENT_VERSIONS.len() * REQUEST_TYPES.len()),
                received_bytes: AtomicU64::new(0),
                sent_bytes: AtomicU64::new(0),
                handling: zeros(handling),
            })
            .collect();
        GrpcCounters { slots, extensive }
    }

    fn slot(&self, shard: usize) -> &Slot {
        &self.slots[shard % self.slots.len()]
    }

    pub fn started(&self, shard: usize, method: usize) {
        self.slot(shard).started[method].fetch_add(1, Ordering::Relaxed);
    }

    pub fn received(&self, shard: usize, method: usize, messages: u64, bytes: u64) {
        let slot = self.slot(shard);
        slot.received[method].fetch_add(messages, Ordering::Relaxed);
        slot.received_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn sent(&self, shard: usize, method: usize, messages: u64, bytes: u64) {
        let slot = self.slot(shard);
        slot.sent[method].fetch_add(messages, Ordering::Relaxed);
        slot.sent_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A client request (`stream` or not) from a client that says it speaks
    /// `version` (its `client-api-version` metadata), as etcd's
    /// interceptors count them.
    pub fn client_request(&self, shard: usize, version: Option<&[u8]>, stream: bool) {
        let unknown = CLIENT_VERSIONS.len() - 1;
        let v = version
            .and_then(|v| CLIENT_VERSIONS.iter().position(|c| c.as_bytes() == v))
            .unwrap_or(unknown);
        let t = if stream { 0 } else { 1 };
        self.slot(shard).client_requests[v * REQUEST_TYPES.len() + t]
            .fetch_add(1, Ordering::Relaxed);
    }

    /// An RPC that began at `since` ended with gRPC status `code` (an
    /// unknown number counts as Unknown, as grpc-go maps it).
    pub fn handled(&self, shard: usize, method: usize, code: u32, since: Instant) {
        let code = usize::try_from(code)
            .ok()
            .filter(|c| *c < CODES.len())
            .unwrap_or(2);
        let slot = self.slot(shard);
        slot.handled[method * CODES.len() + code].fetch_add(1, Ordering::Relaxed);
        if self.extensive {
            let took = since.elapsed();
            let seconds = took.as_secs_f64();
            let bucket = HANDLING_BUCKETS
                .iter()
                .position(|le| seconds <= *le)
                .unwrap_or(HANDLING_BUCKETS.len());
            let at = method * HANDLING_SLOTS;
            slot.handling[at + bucket].fetch_add(1, Ordering::Relaxed);
            let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            slot.handling[at + HANDLING_SLOTS - 1].fetch_add(nanos, Ordering::Relaxed);
        }
    }

    /// `grpc_server_handling_seconds` (only with `--metrics extensive`),
    /// every method's series, as go-grpc-prometheus initializes them.
    fn render_handling(&self, out: &mut String, by_name: &[usize]) {
        if !self.extensive {
            return;
        }
        let name = "grpc_server_handling_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.\n# TYPE {name} histogram"
        );
        for &i in by_name {
            let (service, method, kind) = METHODS[i];
            let labels =
                format!("grpc_method=\"{method}\",grpc_service=\"{service}\",grpc_type=\"{kind}\"");
            let at = i * HANDLING_SLOTS;
            let count = |slot: usize| self.sum(|s| &s.handling, at + slot);
            let buckets = (HANDLING_BUCKETS.iter().enumerate()).map(|(b, le)| (*le, count(b)));
            let over = count(HANDLING_BUCKETS.len());
            let seconds = count(HANDLING_SLOTS - 1) as f64 / 1e9;
            crate::metrics::histogram_series(out, name, &labels, buckets, over, seconds);
        }
    }

    fn sum(&self, pick: impl Fn(&Slot) -> &[AtomicU64], i: usize) -> u64 {
        self.slots
            .iter()
            .map(|s| pick(s)[i].load(Ordering::Relaxed))
            .sum()
    }

    /// etcd's families counted at its gRPC edge: client requests by
    /// version and type (only those seen, as a Go counter vector prints),
    /// and the bytes of client messages.
    pub fn render_etcd(&self, out: &mut String) {
        let bytes = |pick: fn(&Slot) -> &AtomicU64| -> u64 {
            self.slots
                .iter()
                .map(|s| pick(s).load(Ordering::Relaxed))
                .sum()
        };
        crate::metrics::counter(
            out,
            "etcd_network_client_grpc_received_bytes_total",
            "The total number of bytes received from grpc clients.",
            bytes(|s| &s.received_bytes),
        );
        crate::metrics::counter(
            out,
            "etcd_network_client_grpc_sent_bytes_total",
            "The total number of bytes sent to grpc clients.",
            bytes(|s| &s.sent_bytes),
        );
        let series = CLIENT_VERSIONS.iter().enumerate().flat_map(|(v, version)| {
            REQUEST_TYPES
                .iter()
                .enumerate()
                .filter_map(move |(t, kind)| {
                    let n = self.sum(|s| &s.client_requests, v * REQUEST_TYPES.len() + t);
                    let labels = format!("client_api_version=\"{version}\",type=\"{kind}\"");
                    (n > 0).then_some((labels, n))
                })
        });
        crate::metrics::labelled_family(
            out,
            (
                "etcd_server_client_requests_total",
                "counter",
                "The total number of client requests per client version.",
            ),
            series,
        );
    }

    /// The four families as go-grpc-prometheus writes them: alphabetical,
    /// series sorted by their label values.
    pub fn render(&self, out: &mut String) {
        let mut by_name: Vec<usize> = (0..METHODS.len()).collect();
        by_name.sort_by_key(|&i| (METHODS[i].1, METHODS[i].0, METHODS[i].2));
        let mut codes: Vec<usize> = (0..CODES.len()).collect();
        codes.sort_by_key(|&c| CODES[c]);
        let head = |out: &mut String, name: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        };
        head(
            out,
            "grpc_server_handled_total",
            "Total number of RPCs completed on the server, regardless of success or failure.",
        );
        for &c in &codes {
            for &i in &by_name {
                let (service, method, kind) = METHODS[i];
                let value = self.sum(|s| &s.handled, i * CODES.len() + c);
                let _ = writeln!(
                    out,
                    "grpc_server_handled_total{{grpc_code=\"{}\",grpc_method=\"{method}\",grpc_service=\"{service}\",grpc_type=\"{kind}\"}} {}",
                    CODES[c],
                    crate::metrics::go_float(value)
                );
            }
        }
        type Pick = fn(&Slot) -> &[AtomicU64];
        let families: [(&str, &str, Pick); 3] = [
            (
                "grpc_server_msg_received_total",
                "Total number of RPC stream messages received on the server.",
                |s| &s.received,
            ),
            (
                "grpc_server_msg_sent_total",
                "Total number of gRPC stream messages sent by the server.",
                |s| &s.sent,
            ),
            (
                "grpc_server_started_total",
                "Total number of RPCs started on the server.",
                |s| &s.started,
            ),
        ];
        self.render_handling(out, &by_name);
        for (name, help, pick) in families {
            head(out, name, help);
            for &i in &by_name {
                let (service, method, kind) = METHODS[i];
                let _ = writeln!(
                    out,
                    "{name}{{grpc_method=\"{method}\",grpc_service=\"{service}\",grpc_type=\"{kind}\"}} {}",
                    crate::metrics::go_float(self.sum(pick, i))
                );
            }
        }
    }
}

/// What a [`Counted`] body counts when it ends.
#[derive(Clone, Copy)]
pub enum Count {
    /// A request's messages: `grpc_server_msg_received_total`.
    Received,
    /// A response's messages, and the end of the RPC begun at `since`
    /// with the status of its trailers (`Canceled` when the client went
    /// away first).
    SentAndHandled { since: Instant },
}

/// gRPC's `Canceled`.
pub const CANCELED: u32 = 1;

/// Counts the gRPC messages in a body as it passes (each is a 5-byte
/// prefix, flag and big-endian length, then the message) into the shard's
/// counters when the body ends. No allocation: the body is wrapped in
/// place.
pub struct Counted<B> {
    body: B,
    /// Bytes of the current message still to come.
    in_message: u64,
    prefix: [u8; 5],
    prefix_len: usize,
    messages: u64,
    /// Bytes of the messages, prefixes aside.
    bytes: u64,
    /// Where the counts go; `None` once counted (or never counted).
    target: Option<(ShardCounters, usize, Count)>,
}

impl<B> Counted<B> {
    /// `body`, counted into `target` (shard counters, method, what) if any.
    pub fn new(body: B, target: Option<(ShardCounters, usize, Count)>) -> Counted<B> {
        Counted {
            body,
            in_message: 0,
            prefix: [0; 5],
            prefix_len: 0,
            messages: 0,
            bytes: 0,
            target,
        }
    }

    fn scan(&mut self, mut data: &[u8]) {
        if self.target.is_none() {
            return;
        }
        while !data.is_empty() {
            if self.in_message > 0 {
                let take = usize::try_from(self.in_message)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                self.in_message -= take as u64;
                data = &data[take..];
                continue;
            }
            let take = (5 - self.prefix_len).min(data.len());
            self.prefix[self.prefix_len..self.prefix_len + take].copy_from_slice(&data[..take]);
            self.prefix_len += take;
            data = &data[take..];
            if self.prefix_len == 5 {
                self.messages += 1;
                self.prefix_len = 0;
                let len = [
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ];
                self.in_message = u64::from(u32::from_be_bytes(len));
                self.bytes += self.in_message;
            }
        }
    }

    fn finish(&mut self, status: Option<u32>) {
        let Some((c, method, count)) = self.target.take() else {
            return;
        };
        match count {
            Count::Received => c
                .counters
                .received(c.shard, method, self.messages, self.bytes),
            Count::SentAndHandled { since } => {
                c.counters.sent(c.shard, method, self.messages, self.bytes);
                c.counters
                    .handled(c.shard, method, status.unwrap_or(CANCELED), since);
            }
        }
    }
}

/// The `grpc-status` of a header map (trailers, or a trailers-only
/// answer's headers).
pub fn status_of(headers: &hyper::HeaderMap) -> Option<u32> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

impl<B> Body for Counted<B>
where
    B: Body<Data = bytes::Bytes> + Unpin,
{
    type Data = bytes::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.scan(data);
                } else if let Some(trailers) = frame.trailers_ref() {
                    self.finish(status_of(trailers));
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.finish(None),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B> Drop for Counted<B> {
    /// A stream the client cancelled ends here, without trailers.
    fn drop(&mut self) {
        self.finish(None);
    }
}

/// Counters of one shard, handed to its router.
#[derive(Clone, Copy)]
pub struct ShardCounters {
    pub counters: &'static GrpcCounters,
    pub shard: usize,
}

impl ShardCounters {
    pub fn of_shard(shard: usize) -> Option<ShardCounters> {
        counters().map(|counters| ShardCounters { counters, shard })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn messages_are_counted_across_frame_boundaries() {
        let counters: &'static GrpcCounters = Box::leak(Box::new(GrpcCounters::new(1, false)));
        let target = ShardCounters { counters, shard: 0 };
        let mut c = Counted::new((), Some((target, 0, Count::Received)));
        // Two messages (3 and 0 bytes) split at awkward places.
        let wire = [0u8, 0, 0, 0, 3, b'a', b'b', b'c', 0, 0, 0, 0, 0];
        for chunk in wire.chunks(2) {
            c.scan(chunk);
        }
        assert_eq!(c.messages, 2);
        assert_eq!(c.bytes, 3);
        assert_eq!((c.in_message, c.prefix_len), (0, 0));
        c.finish(None);
        let mut page = String::new();
        counters.render_etcd(&mut page);
        assert!(page.contains("\netcd_network_client_grpc_received_bytes_total 3\n"));
    }

    /// With `--metrics extensive`, each method's handling times, in the
    /// lines etcd 3.4 printed for one Put (its sum aside); without, none.
    #[test]
    fn handling_times_as_etcd_prints_them() {
        let put = method_of("/etcdserverpb.KV/Put").unwrap();
        let basic = GrpcCounters::new(1, false);
        basic.handled(0, put, 0, Instant::now());
        let mut page = String::new();
        basic.render(&mut page);
        assert!(!page.contains("grpc_server_handling_seconds"));
        let c = GrpcCounters::new(2, true);
        c.handled(1, put, 0, Instant::now());
        let mut page = String::new();
        c.render(&mut page);
        let labels = "grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"";
        let mut want = String::new();
        for le in [
            "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf",
        ] {
            want.push_str(&format!(
                "grpc_server_handling_seconds_bucket{{{labels},le=\"{le}\"}} 1\n"
            ));
        }
        want.push_str(&format!("grpc_server_handling_seconds_sum{{{labels}}} "));
        assert!(page.contains(&want), "{page}");
        assert!(page.contains(&format!(
            "\ngrpc_server_handling_seconds_count{{{labels}}} 1\n"
        )));
        // Every method has its series, zeros included; the first by name
        // is Maintenance's Alarm, as etcd lists them.
        assert_eq!(
            page.matches("\ngrpc_server_handling_seconds_count{")
                .count(),
            METHODS.len()
        );
        assert!(page.contains(
            "# TYPE grpc_server_handling_seconds histogram\n\
             grpc_server_handling_seconds_bucket{grpc_method=\"Alarm\",grpc_service=\"etcdserverpb.Maintenance\",grpc_type=\"unary\",le=\"0.005\"} 0\n"
        ));
    }

    /// Client requests by the version the client names: one etcd knows,
    /// or `unknown` for none and for anything else (a client cannot add
    /// series); only the series seen are printed, in label order.
    #[test]
    fn client_requests_by_version_and_type() {
        let c = GrpcCounters::new(2, false);
        let mut page = String::new();
        c.render_etcd(&mut page);
        assert!(!page.contains("etcd_server_client_requests_total"));
        c.client_request(0, Some(b"3.4"), false);
        c.client_request(1, Some(b"3.4"), false);
        c.client_request(1, Some(b"3.4"), true);
        c.client_request(0, None, true);
        c.client_request(0, Some(b"\"}\n9.9"), false);
        let mut page = String::new();
        c.render_etcd(&mut page);
        let name = "etcd_server_client_requests_total";
        let want = format!(
            "# TYPE {name} counter\n\
             {name}{{client_api_version=\"3.4\",type=\"stream\"}} 1\n\
             {name}{{client_api_version=\"3.4\",type=\"unary\"}} 2\n\
             {name}{{client_api_version=\"unknown\",type=\"stream\"}} 1\n\
             {name}{{client_api_version=\"unknown\",type=\"unary\"}} 1\n"
        );
        assert!(page.ends_with(&want), "{page}");
    }

    #[test]
    fn the_page_lists_every_method_and_code_in_gos_order() {
        let c = GrpcCounters::new(2, false);
        let put = method_of("/etcdserverpb.KV/Put").unwrap();
        c.started(0, put);
        c.started(1, put);
        c.handled(1, put, 0, Instant::now());
        c.handled(0, put, 99, Instant::now());
        let mut page = String::new();
        c.render(&mut page);
        assert!(page.contains(
            "grpc_server_started_total{grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 2\n"
        ));
        assert!(page.contains(
            "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 1\n"
        ));
        assert!(page.contains(
            "grpc_server_handled_total{grpc_code=\"Unknown\",grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 1\n"
        ));
        let handled = page
            .lines()
            .filter(|l| l.starts_with("grpc_server_handled_total{"))
            .count();
        assert_eq!(handled, METHODS.len() * CODES.len());
        assert!(page.starts_with("# HELP grpc_server_handled_total"));
        assert_eq!(method_of("/etcdserverpb.KV/Nope"), None);
        assert_eq!(method_of("/v3lockpb.Lock/Lock"), None);
    }
}
