//! The gRPC workloads, one per subcommand: their flags, the setup done
//! before timing (prefill, lease grants, streams), and what one request of
//! each client is ([`Client`], a [`Worker`]). The load loop itself is in
//! `load`, the rendering in `report`.

use std::cell::Cell;
use std::rc::Rc;

use crate::grpc::{self, pb::etcdserverpb as pb};
use crate::keys::{self, KeyGen};
use crate::load::{self, LoadArgs, Step, Worker};
use crate::report::Report;

const PUT: &str = "/etcdserverpb.KV/Put";
const RANGE: &str = "/etcdserverpb.KV/Range";
const TXN: &str = "/etcdserverpb.KV/Txn";
const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
const LEASE_REVOKE: &str = "/etcdserverpb.Lease/LeaseRevoke";
const LEASE_KEEPALIVE: &str = "/etcdserverpb.Lease/LeaseKeepAlive";

/// `put`: etcd benchmark's put.
#[derive(clap::Args, Clone, Debug)]
pub struct PutArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Key width: keys are the key index as zero-padded decimal of exactly
    /// this many digits (index 42 is `00000042`), so it must fit
    /// --key-space-size - 1.
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 256)]
    pub val_size: usize,
    /// Key indices are in 0..key-space-size.
    #[arg(long, default_value_t = 100_000)]
    pub key_space_size: u64,
    /// Keys 0, 1, 2, .. in order across all clients (wrapping after the key
    /// space) instead of random.
    #[arg(long)]
    pub sequential_keys: bool,
}

/// `range`: etcd benchmark's range.
#[derive(clap::Args, Clone, Debug)]
pub struct RangeArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    #[arg(long, default_value = "foo")]
    pub key: String,
    /// range_end: the range is [key, end); none for the single key.
    #[arg(long)]
    pub end: Option<String>,
    /// At most this many keys per response; 0 = no limit.
    #[arg(long, default_value_t = 0)]
    pub limit: i64,
    /// l (linearizable) or s (serializable).
    #[arg(long, default_value = "l")]
    pub consistency: String,
}

/// `txn-put`: Kubernetes' create.
#[derive(clap::Args, Clone, Debug)]
pub struct TxnPutArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Keys are this prefix + a sequential index, zero-padded decimal of
    /// --key-size digits (more if --total needs them).
    #[arg(long, default_value = "/registry/pods/")]
    pub prefix: String,
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    #[arg(long, default_value_t = 256)]
    pub val_size: usize,
}

/// `txn-mixed`: reads and writes of random keys.
#[derive(clap::Args, Clone, Debug)]
pub struct TxnMixedArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Reads per write (1.0: half reads).
    #[arg(long, default_value_t = 1.0)]
    pub rw_ratio: f64,
    /// Key width (zero-padded decimal, as for `put`).
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    #[arg(long, default_value_t = 256)]
    pub val_size: usize,
    #[arg(long, default_value_t = 100_000)]
    pub key_space_size: u64,
    /// Reads: l (linearizable) or s (serializable).
    #[arg(long, default_value = "l")]
    pub consistency: String,
}

/// `mixed-expensive`: puts while other clients scan a prefix.
#[derive(clap::Args, Clone, Debug)]
pub struct MixedExpensiveArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Clients doing back-to-back full scans of --prefix (0: puts only, the
    /// baseline), on a thread of their own with a connection each, as
    /// clients of other processes (not on the put clients' thread or
    /// connections). Not bounded by --total or --rate; they stop with the
    /// puts.
    #[arg(long, default_value_t = 2)]
    pub scan_clients: usize,
    /// The scanned prefix; filled with --prefill keys (prefix + zero-padded
    /// index) of 256-byte values before timing.
    #[arg(long, default_value = "/registry/pods/")]
    pub prefix: String,
    #[arg(long, default_value_t = 10_000)]
    pub prefill: u64,
    /// Put key width (zero-padded decimal, outside the prefix).
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    #[arg(long, default_value_t = 256)]
    pub val_size: usize,
    #[arg(long, default_value_t = 100_000)]
    pub key_space_size: u64,
}

/// `lease-keepalive`: keep-alives on LeaseKeepAlive streams.
#[derive(clap::Args, Clone, Debug)]
pub struct LeaseKeepAliveArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Leases granted (TTL 60 s) before timing and revoked after; client i
    /// keeps lease i mod leases alive. Default: one per client.
    #[arg(long)]
    pub leases: Option<usize>,
}

type KeepAliveStream = grpc::BidiStream<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>;

/// One client of a workload.
pub enum Client {
    /// A put of the next key; series 0.
    Put {
        conn: grpc::Conn,
        keys: KeyGen,
        value: Vec<u8>,
    },
    /// A fixed range request; series `series`, counts `kvs`.
    Range {
        conn: grpc::Conn,
        req: pb::RangeRequest,
        series: usize,
    },
    /// Create-if-absent of the next key; series 0, counts
    /// `succeeded`/`failed`.
    TxnPut {
        conn: grpc::Conn,
        keys: KeyGen,
        value: Vec<u8>,
    },
    /// A read (series 0) or a put (series 1) of a random key.
    Mixed {
        conn: grpc::Conn,
        keys: KeyGen,
        value: Vec<u8>,
        rng: u64,
        /// A request is a read when a draw in 0..1_000_000 is below this.
        reads_per_million: u64,
        serializable: bool,
    },
    /// A keep-alive of `lease` on the client's own stream (reopened after
    /// an error); series 0.
    KeepAlive {
        conn: grpc::Conn,
        stream: Option<KeepAliveStream>,
        lease: i64,
    },
}

impl Worker for Client {
    async fn step(&mut self) -> Step {
        match self {
            Client::Put { conn, keys, value } => Step {
                series: 0,
                result: put(conn, keys.next_key(), value.clone())
                    .await
                    .map(|_| None),
            },
            Client::Range { conn, req, series } => Step {
                series: *series,
                result: conn
                    .unary::<_, pb::RangeResponse>(RANGE, req)
                    .await
                    .map(|r| Some(("kvs", r.kvs.len() as u64))),
            },
            Client::TxnPut { conn, keys, value } => Step {
                series: 0,
                result: txn_create(conn, keys.next_key(), value.clone())
                    .await
                    .map(|ok| Some((if ok { "succeeded" } else { "failed" }, 1))),
            },
            Client::Mixed {
                conn,
                keys,
                value,
                rng,
                reads_per_million,
                serializable,
            } => {
                if keys::next_rand(rng) % 1_000_000 < *reads_per_million {
                    let req = pb::RangeRequest {
                        key: keys.next_key(),
                        serializable: *serializable,
                        ..Default::default()
                    };
                    Step {
                        series: 0,
                        result: conn
                            .unary::<_, pb::RangeResponse>(RANGE, &req)
                            .await
                            .map(|_| None),
                    }
                } else {
                    Step {
                        series: 1,
                        result: put(conn, keys.next_key(), value.clone())
                            .await
                            .map(|_| None),
                    }
                }
            }
            Client::KeepAlive {
                conn,
                stream,
                lease,
            } => {
                let result = keep_alive(conn, stream, *lease).await;
                if result.is_err() {
                    *stream = None;
                }
                Step { series: 0, result }
            }
        }
    }
}

pub(crate) async fn put(
    conn: &mut grpc::Conn,
    key: Vec<u8>,
    value: Vec<u8>,
) -> Result<pb::PutResponse, String> {
    let req = pb::PutRequest {
        key,
        value,
        ..Default::default()
    };
    conn.unary(PUT, &req).await
}

/// Kubernetes' create: put `key` if it has never been written (mod
/// revision 0), else read it. Whether the put happened.
async fn txn_create(conn: &mut grpc::Conn, key: Vec<u8>, value: Vec<u8>) -> Result<bool, String> {
    use pb::compare::{CompareResult, CompareTarget, TargetUnion};
    use pb::request_op::Request;
    let req = pb::TxnRequest {
        compare: vec![pb::Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Mod as i32,
            key: key.clone(),
            range_end: Vec::new(),
            target_union: Some(TargetUnion::ModRevision(0)),
        }],
        success: vec![pb::RequestOp {
            request: Some(Request::RequestPut(pb::PutRequest {
                key: key.clone(),
                value,
                ..Default::default()
            })),
        }],
        failure: vec![pb::RequestOp {
            request: Some(Request::RequestRange(pb::RangeRequest {
                key,
                ..Default::default()
            })),
        }],
    };
    conn.unary::<_, pb::TxnResponse>(TXN, &req)
        .await
        .map(|r| r.succeeded)
}

async fn keep_alive(
    conn: &mut grpc::Conn,
    stream: &mut Option<KeepAliveStream>,
    lease: i64,
) -> Result<Option<(&'static str, u64)>, String> {
    if stream.is_none() {
        *stream = Some(conn.open_stream(LEASE_KEEPALIVE).await?);
    }
    let Some(s) = stream.as_mut() else {
        return Err("no stream".into());
    };
    s.send(&pb::LeaseKeepAliveRequest { id: lease })?;
    let resp = s.recv().await?;
    if resp.id != lease {
        return Err(format!(
            "keep-alive answered lease {:x}, not {lease:x}",
            resp.id
        ));
    }
    if resp.ttl <= 0 {
        return Err(format!("lease {lease:x} not found or expired"));
    }
    Ok(None)
}

/// etcd's prefix range end: the prefix with its last byte below 0xff
/// incremented (trailing 0xff bytes dropped); `\0` (to the end of the key
/// space) when there is none.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn serializable(consistency: &str) -> Result<bool, String> {
    match consistency {
        "l" => Ok(false),
        "s" => Ok(true),
        other => Err(format!("--consistency {other:?}: expected l or s")),
    }
}

fn consistency_name(serializable: bool) -> &'static str {
    if serializable {
        "serializable"
    } else {
        "linearizable"
    }
}

/// Runs `f` (setup, then the timed run) on a fresh executor and returns
/// its reports.
fn execute<F, Fut>(load: &LoadArgs, f: F) -> Result<Vec<Report>, String>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Vec<Report>, String>> + 'static,
{
    load::run_on_executor(load.cpu, f)?
}

/// Prints `reports` in the `--output` format of `load`.
fn print_all(load: &LoadArgs, reports: Result<Vec<Report>, String>) -> Result<(), String> {
    for r in &reports? {
        r.print(load.output)?;
    }
    Ok(())
}

pub fn put_cmd(args: PutArgs) -> Result<(), String> {
    let load = args.load.clone();
    print_all(&load, put_reports(args))
}

/// The reports of a `put` run, not printed.
pub fn put_reports(args: PutArgs) -> Result<Vec<Report>, String> {
    let spec = keys::KeySpec {
        prefix: b"".to_vec(),
        width: args.key_size,
        space: args.key_space_size,
        sequential: args.sequential_keys,
    };
    spec.build()?;
    let load = args.load.clone();
    execute(&args.load, move || async move {
        let keys = spec.build()?;
        let conns = load::connect(&load).await?;
        let value = vec![b'v'; args.val_size];
        let workers = (0..load.clients())
            .map(|c| Client::Put {
                conn: conns[c % conns.len()].clone(),
                keys: keys.for_client(c),
                value: value.clone(),
            })
            .collect();
        load::run(&load, &[load.label("put")], workers, None).await
    })
}

pub fn range_cmd(args: RangeArgs) -> Result<(), String> {
    let load = args.load.clone();
    print_all(&load, range_reports(args))
}

/// The reports of a `range` run, not printed.
pub fn range_reports(args: RangeArgs) -> Result<Vec<Report>, String> {
    let serializable = serializable(&args.consistency)?;
    let load = args.load.clone();
    execute(&args.load, move || async move {
        let conns = load::connect(&load).await?;
        let req = pb::RangeRequest {
            key: args.key.into_bytes(),
            range_end: args.end.map(String::into_bytes).unwrap_or_default(),
            limit: args.limit,
            serializable,
            ..Default::default()
        };
        let workers = (0..load.clients())
            .map(|c| Client::Range {
                conn: conns[c % conns.len()].clone(),
                req: req.clone(),
                series: 0,
            })
            .collect();
        let name = load.label(&format!("range ({})", consistency_name(serializable)));
        load::run(&load, &[name], workers, None).await
    })
}

pub fn txn_put_cmd(args: TxnPutArgs) -> Result<(), String> {
    let load = args.load.clone();
    print_all(&load, txn_put_reports(args))
}

/// The reports of a `txn-put` run, not printed.
pub fn txn_put_reports(args: TxnPutArgs) -> Result<Vec<Report>, String> {
    let width = args
        .key_size
        .max(keys::digits(args.load.total.saturating_sub(1)));
    let space = u32::try_from(width)
        .ok()
        .and_then(|w| 10u64.checked_pow(w))
        .unwrap_or(u64::MAX);
    let spec = keys::KeySpec {
        prefix: args.prefix.as_bytes().to_vec(),
        width,
        space,
        sequential: true,
    };
    spec.build()?;
    let load = args.load.clone();
    execute(&args.load, move || async move {
        let keys = spec.build()?;
        let conns = load::connect(&load).await?;
        let value = vec![b'v'; args.val_size];
        let workers = (0..load.clients())
            .map(|c| Client::TxnPut {
                conn: conns[c % conns.len()].clone(),
                keys: keys.for_client(c),
                value: value.clone(),
            })
            .collect();
        let mut reports = load::run(&load, &[load.label("txn-put")], workers, None).await?;
        for r in &mut reports {
            for outcome in ["succeeded", "failed"] {
                r.counters.entry(outcome.to_string()).or_default();
            }
        }
        Ok(reports)
    })
}

pub fn txn_mixed_cmd(args: TxnMixedArgs) -> Result<(), String> {
    let load = args.load.clone();
    print_all(&load, txn_mixed_reports(args))
}

/// The reports of a `txn-mixed` run, not printed.
pub fn txn_mixed_reports(args: TxnMixedArgs) -> Result<Vec<Report>, String> {
    let serializable = serializable(&args.consistency)?;
    if !(args.rw_ratio >= 0.0 && args.rw_ratio.is_finite()) {
        return Err(format!(
            "--rw-ratio {}: expected a number >= 0",
            args.rw_ratio
        ));
    }
    let reads_per_million = (args.rw_ratio / (args.rw_ratio + 1.0) * 1_000_000.0).round() as u64;
    let spec = keys::KeySpec {
        prefix: b"".to_vec(),
        width: args.key_size,
        space: args.key_space_size,
        sequential: false,
    };
    spec.build()?;
    let load = args.load.clone();
    execute(&args.load, move || async move {
        let keys = spec.build()?;
        let conns = load::connect(&load).await?;
        let value = vec![b'v'; args.val_size];
        let workers = (0..load.clients())
            .map(|c| Client::Mixed {
                conn: conns[c % conns.len()].clone(),
                keys: keys.for_client(c),
                value: value.clone(),
                rng: keys::seed(c + 1_000_003),
                reads_per_million,
                serializable,
            })
            .collect();
        let series = [
            load.label(&format!(
                "txn-mixed read ({})",
                consistency_name(serializable)
            )),
            load.label("txn-mixed write"),
        ];
        load::run(&load, &series, workers, None).await
    })
}

/// Writes `prefix` + index for every index in `0..n` (256-byte values),
/// `parallel` puts in flight at a time. Fails on the first error.
async fn prefill(
    conns: &[grpc::Conn],
    parallel: usize,
    prefix: &[u8],
    width: usize,
    n: u64,
) -> Result<(), String> {
    let next = Rc::new(Cell::new(0u64));
    let mut tasks: Vec<glommio::Task<Result<(), String>>> = Vec::new();
    for c in 0..parallel.max(1) {
        let mut conn = conns[c % conns.len()].clone();
        let (next, prefix) = (next.clone(), prefix.to_vec());
        tasks.push(glommio::spawn_local(async move {
            loop {
                let i = next.get();
                if i >= n {
                    return Ok(());
                }
                next.set(i + 1);
                put(
                    &mut conn,
                    keys::format_key(&prefix, i, width),
                    vec![b'p'; 256],
                )
                .await
                .map_err(|e| format!("prefill: {e}"))?;
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    Ok(())
}

pub fn mixed_expensive_cmd(args: MixedExpensiveArgs) -> Result<(), String> {
    let load = args.load.clone();
    print_all(&load, mixed_expensive_reports(args))
}

/// The reports of a `mixed-expensive` run, not printed.
pub fn mixed_expensive_reports(args: MixedExpensiveArgs) -> Result<Vec<Report>, String> {
    let spec = keys::KeySpec {
        prefix: b"".to_vec(),
        width: args.key_size,
        space: args.key_space_size,
        sequential: false,
    };
    spec.build()?;
    let prefix = args.prefix.clone().into_bytes();
    if prefix.is_empty() {
        return Err("--prefix must not be empty".into());
    }
    let load = args.load.clone();
    execute(&args.load, move || async move {
        let keys = spec.build()?;
        let conns = load::connect(&load).await?;
        let width = args
            .key_size
            .max(keys::digits(args.prefill.saturating_sub(1)));
        prefill(&conns, load.clients().min(64), &prefix, width, args.prefill).await?;
        let value = vec![b'v'; args.val_size];
        let workers = (0..load.clients())
            .map(|c| Client::Put {
                conn: conns[c % conns.len()].clone(),
                keys: keys.for_client(c),
                value: value.clone(),
            })
            .collect();
        let scan = pb::RangeRequest {
            range_end: prefix_end(&prefix),
            key: prefix,
            serializable: true,
            ..Default::default()
        };
        // The scanners run as other client processes would: a thread and
        // a connection each of their own (load::Background).
        let scanners = (args.scan_clients > 0)
            .then(|| {
                load::Background::start(&load, args.scan_clients, 2, move |conns| {
                    conns
                        .into_iter()
                        .map(|conn| Client::Range {
                            conn,
                            req: scan.clone(),
                            series: 1,
                        })
                        .collect::<Vec<_>>()
                })
            })
            .transpose()?;
        let series = [
            load.label(&format!(
                "mixed-expensive put scan-clients={}",
                args.scan_clients
            )),
            format!("mixed-expensive scan scan-clients={}", args.scan_clients),
        ];
        let mut reports = load::run(&load, &series, workers, scanners).await?;
        if args.scan_clients == 0 {
            reports.truncate(1);
        }
        Ok(reports)
    })
}

pub fn lease_keepalive_cmd(args: LeaseKeepAliveArgs) -> Result<(), String> {
    let load = args.load.clone();
    print_all(&load, lease_keepalive_reports(args))
}

/// The reports of a `lease-keepalive` run, not printed.
pub fn lease_keepalive_reports(args: LeaseKeepAliveArgs) -> Result<Vec<Report>, String> {
    let load = args.load.clone();
    let leases = args.leases.unwrap_or(load.clients()).max(1);
    execute(&args.load, move || async move {
        let mut conns = load::connect(&load).await?;
        let mut ids = Vec::with_capacity(leases);
        for _ in 0..leases {
            let granted: pb::LeaseGrantResponse = conns[0]
                .unary(LEASE_GRANT, &pb::LeaseGrantRequest { ttl: 60, id: 0 })
                .await
                .map_err(|e| format!("lease grant: {e}"))?;
            ids.push(granted.id);
        }
        let mut workers = Vec::with_capacity(load.clients());
        for c in 0..load.clients() {
            let mut conn = conns[c % conns.len()].clone();
            let stream = conn.open_stream(LEASE_KEEPALIVE).await?;
            workers.push(Client::KeepAlive {
                conn,
                stream: Some(stream),
                lease: ids[c % ids.len()],
            });
        }
        let reports = load::run(&load, &[load.label("lease-keepalive")], workers, None).await;
        for id in ids {
            let revoked: Result<pb::LeaseRevokeResponse, _> = conns[0]
                .unary(LEASE_REVOKE, &pb::LeaseRevokeRequest { id })
                .await;
            if let Err(e) = revoked {
                eprintln!("metcd-bench: revoke lease {id:x}: {e}");
                break;
            }
        }
        reports
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"/registry/pods/"), b"/registry/pods0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    }

    #[test]
    fn consistency_flag() {
        assert_eq!(serializable("l"), Ok(false));
        assert_eq!(serializable("s"), Ok(true));
        assert!(serializable("x").is_err());
    }
}
