//! `metcd-bench`: load generation against metcd (and real etcd). A client
//! only: it never imports server internals.
//!
//! Subcommands, modelled on etcd's `benchmark` tool. The gRPC ones share
//! the global load flags (`--endpoints` (alias `--endpoint`), `--conns`
//! HTTP/2 connections shared by `--clients` concurrent clients, `--total`,
//! `--duration`, `--rate`, `--target-leader`, `--output text|json`,
//! `--cpu`):
//! - `put`: puts of random (or `--sequential-keys`) keys, zero-padded
//!   decimal of `--key-size` digits from `--key-space-size`.
//! - `range`: one range request (`--key`, `--end`, `--limit`), linearizable
//!   (l) or serializable (s).
//! - `txn-put`: Kubernetes' create, a Txn putting a key under `--prefix`
//!   only if its mod revision is 0; counts succeeded and failed.
//! - `txn-mixed`: reads and puts of random keys, `--rw-ratio` reads per
//!   write; one histogram each.
//! - `mixed-expensive`: puts while `--scan-clients` scan a `--prefill`ed
//!   prefix, to compare put latency with and without expensive reads.
//! - `lease-keepalive`: keep-alives on LeaseKeepAlive streams, one per
//!   client, over leases granted before timing.
//!
//! - `watch`: `--watchers` watches of a prefix over `--streams` Watch
//!   streams while `--clients` put under it at `--put-rate`; the latency
//!   from each put's send to each event's arrival.
//! - `list`: Kubernetes' paged LIST of `--prefix`, pages of `--limit`
//!   keys at the first page's revision, one after another on one
//!   connection (own flags: `--endpoint`, `--keys-only`, `--consistency`,
//!   `--max-pages`); prints keys, pages and page latencies.
//! - `compare`: starts real etcd and metcd (1 and 3 members) itself and
//!   runs etcd's published benchmark cases on both (`--suite etcd-docs`);
//!   a markdown table per topology and an SVG scatter plot.
//!
//! And two that are not gRPC:
//! - `http-put`: durable 256-byte writes through the seed's curl API at a
//!   list of concurrency levels; prints writes/s and p50/p90/p99/p99.9/max.
//! - `fsync`: the physical floor, 4 KiB O_DIRECT write + fdatasync per op on
//!   the disk holding `--dir`.
//!
//! Every run is bounded by `--total` and `--duration`, whichever ends first;
//! connections are set up before timing. Modules: `load` (flags, load loop),
//! `ops` (workloads), `grpc` (client), `keys`, `rate`, `report`,
//! `watch`, `list`, `compare` (the etcd/metcd suite) and `plot` (its figure).

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

mod compare;
// The shoot-out's generator and write-amp arithmetic; `benches/engines.rs`
// includes it, the binary only compiles it for its unit tests.
#[cfg(test)]
mod engine_bench;
mod grpc;
mod keys;
mod list;
mod load;
mod ops;
mod plot;
mod rate;
mod report;
mod watch;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use hdrhistogram::Histogram;
use load::run_on_executor;
use report::{new_hist, Report};

#[derive(Parser)]
#[command(name = "metcd-bench", about = "Load generator for metcd and etcd")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// etcd benchmark `put`: random (or sequential) keys from a key space,
    /// fixed-size values.
    Put(ops::PutArgs),
    /// etcd benchmark `range`: one key or [key, end), linearizable (l) or
    /// serializable (s).
    Range(ops::RangeArgs),
    /// Kubernetes' create: Txn{mod_revision(key) == 0 ? put : range} on
    /// distinct sequential keys under --prefix.
    TxnPut(ops::TxnPutArgs),
    /// Ranges of one random key and puts, --rw-ratio reads per write.
    TxnMixed(ops::TxnMixedArgs),
    /// Puts while --scan-clients scan a prefilled prefix.
    MixedExpensive(ops::MixedExpensiveArgs),
    /// Back-to-back keep-alives on LeaseKeepAlive streams.
    LeaseKeepalive(ops::LeaseKeepAliveArgs),
    /// Starts real etcd and metcd clusters and runs a suite of cases on
    /// both; writes a markdown report and an SVG plot.
    Compare(compare::CompareArgs),
    /// Event latency of watches on a prefix while keys under it are put.
    Watch(watch::WatchArgs),
    /// Kubernetes' paged LIST: a prefix read in pages of --limit keys at
    /// the first page's revision, timed.
    List(list::ListArgs),
    /// Durable PUTs over the HTTP API at several concurrency levels.
    HttpPut {
        #[arg(long, default_value = "127.0.0.1:3379")]
        endpoint: String,
        /// Comma-separated concurrency levels (one connection per writer).
        #[arg(long, default_value = "1,10,100,1000")]
        clients: String,
        /// Writes per level (upper bound).
        #[arg(long, default_value_t = 100_000)]
        total: u64,
        /// Seconds per level (upper bound).
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
        #[arg(long, default_value_t = 256)]
        value_size: usize,
        #[arg(long, default_value_t = 100_000)]
        key_space: u64,
        /// CPU to pin the client to (none: unpinned).
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// 4 KiB O_DIRECT write + fdatasync, one after another.
    Fsync {
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        #[arg(long, default_value_t = 5000)]
        total: u64,
        #[arg(long, default_value_t = 5.0)]
        duration: f64,
    },
}

fn main() {
    // A closed stdout (`metcd-bench ... | head -1`) ends the process quietly,
    // as for any Unix filter, instead of panicking in println!.
    // SAFETY: resets one signal's disposition to the default before any
    // thread starts; no memory is involved.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::HttpPut {
            endpoint,
            clients,
            total,
            duration,
            value_size,
            key_space,
            cpu,
        } => {
            let levels: Result<Vec<usize>, _> = clients
                .split(',')
                .map(|c| c.trim().parse::<usize>())
                .collect();
            match levels {
                Ok(levels) => http_put(
                    endpoint,
                    levels,
                    total,
                    Duration::from_secs_f64(duration),
                    value_size,
                    key_space,
                    cpu,
                ),
                Err(e) => Err(format!("--clients: {e}")),
            }
        }
        Cmd::Fsync {
            dir,
            total,
            duration,
        } => fsync_floor(dir, total, Duration::from_secs_f64(duration)),
        Cmd::Put(args) => ops::put_cmd(args),
        Cmd::Range(args) => ops::range_cmd(args),
        Cmd::TxnPut(args) => ops::txn_put_cmd(args),
        Cmd::TxnMixed(args) => ops::txn_mixed_cmd(args),
        Cmd::MixedExpensive(args) => ops::mixed_expensive_cmd(args),
        Cmd::LeaseKeepalive(args) => ops::lease_keepalive_cmd(args),
        Cmd::Compare(args) => compare::compare_cmd(args),
        Cmd::Watch(args) => watch::watch_cmd(args),
        Cmd::List(args) => list::list_cmd(args),
    };
    if let Err(e) = result {
        eprintln!("metcd-bench: {e}");
        std::process::exit(1);
    }
}

fn http_put(
    endpoint: String,
    levels: Vec<usize>,
    total: u64,
    duration: Duration,
    value_size: usize,
    key_space: u64,
    cpu: Option<usize>,
) -> Result<(), String> {
    println!("# http-put against {endpoint}: {value_size}-byte values, key space {key_space}, per level at most {total} writes or {duration:?}");
    for clients in levels {
        let endpoint = endpoint.clone();
        let report = run_on_executor(cpu, move || async move {
            put_level(endpoint, clients, total, duration, value_size, key_space).await
        })??;
        println!("{}", report.summary_line());
    }
    Ok(())
}

struct Shared {
    issued: u64,
    done: u64,
    errors: u64,
    hist: Histogram<u64>,
}

impl Shared {
    /// Takes the right to send one more request, within both bounds.
    fn claim(&mut self, total: u64, deadline: Instant) -> bool {
        if self.issued >= total || Instant::now() >= deadline {
            return false;
        }
        self.issued += 1;
        true
    }
}

async fn put_level(
    endpoint: String,
    clients: usize,
    total: u64,
    duration: Duration,
    value_size: usize,
    key_space: u64,
) -> Result<Report, String> {
    // Connections are set up before timing starts.
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        let s = TcpStream::connect(endpoint.as_str())
            .await
            .map_err(|e| format!("connect {endpoint}: {e}"))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        conns.push(s);
    }
    let shared = Rc::new(RefCell::new(Shared {
        issued: 0,
        done: 0,
        errors: 0,
        hist: new_hist()?,
    }));
    let value = vec![b'v'; value_size];
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for (c, mut stream) in conns.into_iter().enumerate() {
        let shared = shared.clone();
        let value = value.clone();
        tasks.push(glommio::spawn_local(async move {
            let mut buf = vec![0u8; 4096];
            let mut req = Vec::with_capacity(value.len() + 128);
            let mut rng = (c as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            loop {
                if !shared.borrow_mut().claim(total, deadline) {
                    break;
                }
                let key = keys::next_rand(&mut rng) % key_space;
                req.clear();
                req.extend_from_slice(
                    format!(
                        "PUT /bench/{key:08} HTTP/1.1\r\nHost: b\r\nContent-Length: {}\r\n\r\n",
                        value.len()
                    )
                    .as_bytes(),
                );
                req.extend_from_slice(&value);
                let t0 = Instant::now();
                let ok = match stream.write_all(&req).await {
                    Ok(()) => read_status(&mut stream, &mut buf).await == Some(204),
                    Err(_) => false,
                };
                let us = t0.elapsed().as_micros() as u64;
                let mut s = shared.borrow_mut();
                if ok {
                    s.done += 1;
                    let _ = s.hist.record(us.max(1));
                } else {
                    s.errors += 1;
                    break;
                }
            }
        }));
    }
    for t in tasks {
        t.await;
    }
    let elapsed = start.elapsed();
    let s = shared.borrow();
    Ok(Report::new(
        format!("put clients={clients}"),
        s.issued,
        s.done,
        s.errors,
        elapsed,
        s.hist.clone(),
    ))
}

/// Reads one response with no body (a 204) or a small one; returns the status.
async fn read_status(stream: &mut TcpStream, buf: &mut [u8]) -> Option<u16> {
    let mut filled = 0;
    loop {
        let n = stream.read(&mut buf[filled..]).await.ok()?;
        if n == 0 {
            return None;
        }
        filled += n;
        let data = &buf[..filled];
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&data[..end]).ok()?;
            let status = head.split(' ').nth(1)?.parse().ok()?;
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let mut have = filled - end - 4;
            while have < len {
                let n = stream.read(buf).await.ok()?;
                if n == 0 {
                    return None;
                }
                have += n;
            }
            return Some(status);
        }
        if filled == buf.len() {
            return None;
        }
    }
}

fn fsync_floor(dir: PathBuf, total: u64, duration: Duration) -> Result<(), String> {
    let report = run_on_executor(None, move || async move {
        let path = dir.join(format!("metcd-bench-fsync-{}.tmp", std::process::id()));
        let file = glommio::io::DmaFile::create(&path)
            .await
            .map_err(|e| e.to_string())?;
        let mut hist = new_hist()?;
        let start = Instant::now();
        let mut ops = 0u64;
        while ops < total && start.elapsed() < duration {
            let mut buf = file.alloc_dma_buffer(4096);
            buf.as_bytes_mut().fill(ops as u8);
            let t0 = Instant::now();
            file.write_at(buf, (ops % 1024) * 4096)
                .await
                .map_err(|e| e.to_string())?;
            file.fdatasync().await.map_err(|e| e.to_string())?;
            let _ = hist.record((t0.elapsed().as_micros() as u64).max(1));
            ops += 1;
        }
        let elapsed = start.elapsed();
        let _ = file.close().await;
        let _ = std::fs::remove_file(&path);
        Ok::<_, String>(Report::new(
            "4KiB write+fdatasync".into(),
            ops,
            ops,
            0,
            elapsed,
            hist,
        ))
    })??;
    println!("{}", report.summary_line());
    Ok(())
}
