//! `metcd-bench`: load generation against metcd (and, from the gRPC issue
//! on, real etcd). A client only: it never imports server internals.
//!
//! Subcommands so far:
//! - `put`, `range`: etcd's benchmark cases over the etcd v3 gRPC API
//!   (`--conns` HTTP/2 connections shared by `--clients` concurrent
//!   clients), against metcd or real etcd alike.
//! - `http-put`: durable 256-byte writes through the seed's curl API at a
//!   list of concurrency levels; prints writes/s and p50/p90/p99/p99.9/max.
//! - `fsync`: the physical floor, 4 KiB O_DIRECT write + fdatasync per op on
//!   the disk holding `--dir`.
//!
//! Every run is bounded by `--total` and `--duration`, whichever ends first.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

mod grpc;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use glommio::{LocalExecutorBuilder, Placement};
use hdrhistogram::Histogram;

#[derive(Parser)]
#[command(name = "metcd-bench", about = "Load generator for metcd and etcd")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct Load {
    /// host:port of the etcd v3 gRPC API.
    #[arg(long, default_value = "127.0.0.1:2379")]
    endpoint: String,
    #[arg(long, default_value_t = 1)]
    conns: usize,
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Requests (upper bound).
    #[arg(long, default_value_t = 10_000)]
    total: u64,
    /// Seconds (upper bound).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// CPU to pin the client to (none: unpinned).
    #[arg(long)]
    cpu: Option<usize>,
}

#[derive(Subcommand)]
enum Cmd {
    /// etcd benchmark `put`: random keys from a key space, fixed-size values.
    Put {
        #[command(flatten)]
        load: Load,
        #[arg(long, default_value_t = 256)]
        val_size: usize,
        #[arg(long, default_value_t = 100_000)]
        key_space_size: u64,
    },
    /// etcd benchmark `range` of one key, linearizable (l) or serializable (s).
    Range {
        #[command(flatten)]
        load: Load,
        #[arg(long, default_value = "foo")]
        key: String,
        #[arg(long, default_value = "l")]
        consistency: String,
    },
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
        Cmd::Put {
            load,
            val_size,
            key_space_size,
        } => grpc_load(
            load,
            Op::Put {
                value: vec![b'v'; val_size].into(),
                key_space: key_space_size.max(1),
            },
        ),
        Cmd::Range {
            load,
            key,
            consistency,
        } => match consistency.as_str() {
            "l" | "s" => grpc_load(
                load,
                Op::Range {
                    key: key.into_bytes().into(),
                    serializable: consistency == "s",
                },
            ),
            other => Err(format!("--consistency {other:?}: expected l or s")),
        },
    };
    if let Err(e) = result {
        eprintln!("metcd-bench: {e}");
        std::process::exit(1);
    }
}

struct Report {
    label: String,
    ops: u64,
    errors: u64,
    elapsed: Duration,
    hist: Histogram<u64>,
}

impl Report {
    fn print(&self) {
        let q = |p: f64| self.hist.value_at_quantile(p) as f64 / 1000.0;
        println!(
            "{:<28} {:>9} ops {:>6} err {:>11.0} ops/s  p50 {:>8.3} ms  p90 {:>8.3} ms  p99 {:>8.3} ms  p99.9 {:>8.3} ms  max {:>8.3} ms",
            self.label,
            self.ops,
            self.errors,
            self.ops as f64 / self.elapsed.as_secs_f64(),
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            self.hist.max() as f64 / 1000.0,
        );
    }
}

fn new_hist() -> Result<Histogram<u64>, String> {
    // Microseconds, up to 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())
}

fn run_on_executor<T: Send + 'static, F, Fut>(cpu: Option<usize>, f: F) -> Result<T, String>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    let placement = match cpu {
        Some(c) => Placement::Fixed(c),
        None => Placement::Unbound,
    };
    LocalExecutorBuilder::new(placement)
        .io_memory(1 << 20)
        .spawn(f)
        .map_err(|e| e.to_string())?
        .join()
        .map_err(|e| e.to_string())
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
        report.print();
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

/// xorshift64: cheap, deterministic per client, good enough for key choice.
fn next_rand(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
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
                let key = next_rand(&mut rng) % key_space;
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
    Ok(Report {
        label: format!("put clients={clients}"),
        ops: s.done,
        errors: s.errors,
        elapsed,
        hist: s.hist.clone(),
    })
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
        Ok::<_, String>(Report {
            label: "4KiB write+fdatasync".into(),
            ops,
            errors: 0,
            elapsed,
            hist,
        })
    })??;
    report.print();
    Ok(())
}

#[derive(Clone)]
enum Op {
    Put {
        value: bytes::Bytes,
        key_space: u64,
    },
    Range {
        key: bytes::Bytes,
        serializable: bool,
    },
}

impl Op {
    async fn run(&self, conn: &mut grpc::Conn, rng: &mut u64) -> Result<(), String> {
        use grpc::pb::etcdserverpb as pb;
        match self {
            Op::Put { value, key_space } => {
                let req = pb::PutRequest {
                    key: format!("{:08}", next_rand(rng) % key_space).into_bytes(),
                    value: value.to_vec(),
                    ..Default::default()
                };
                conn.unary::<_, pb::PutResponse>("/etcdserverpb.KV/Put", &req)
                    .await
                    .map(|_| ())
            }
            Op::Range { key, serializable } => {
                let req = pb::RangeRequest {
                    key: key.to_vec(),
                    serializable: *serializable,
                    ..Default::default()
                };
                conn.unary::<_, pb::RangeResponse>("/etcdserverpb.KV/Range", &req)
                    .await
                    .map(|_| ())
            }
        }
    }

    fn label(&self) -> String {
        match self {
            Op::Put { .. } => "put".into(),
            Op::Range {
                serializable: true, ..
            } => "range (serializable)".into(),
            Op::Range { .. } => "range (linearizable)".into(),
        }
    }
}

fn grpc_load(load: Load, op: Op) -> Result<(), String> {
    let cpu = load.cpu;
    let report = run_on_executor(cpu, move || async move { grpc_level(load, op).await })??;
    report.print();
    Ok(())
}

async fn grpc_level(load: Load, op: Op) -> Result<Report, String> {
    // Connections are set up before timing starts.
    let mut conns = Vec::with_capacity(load.conns.max(1));
    for _ in 0..load.conns.max(1) {
        conns.push(grpc::Conn::connect(&load.endpoint).await?);
    }
    let shared = Rc::new(RefCell::new(Shared {
        issued: 0,
        done: 0,
        errors: 0,
        hist: new_hist()?,
    }));
    let first_error: Rc<RefCell<Option<String>>> = Rc::default();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(load.duration);
    let mut tasks = Vec::new();
    for c in 0..load.clients.max(1) {
        let mut conn = conns[c % conns.len()].clone();
        let (shared, op, first_error) = (shared.clone(), op.clone(), first_error.clone());
        let total = load.total;
        tasks.push(glommio::spawn_local(async move {
            let mut rng = (c as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            loop {
                if !shared.borrow_mut().claim(total, deadline) {
                    break;
                }
                let t0 = Instant::now();
                let result = op.run(&mut conn, &mut rng).await;
                let us = t0.elapsed().as_micros() as u64;
                let mut s = shared.borrow_mut();
                match result {
                    Ok(()) => {
                        s.done += 1;
                        let _ = s.hist.record(us.max(1));
                    }
                    Err(e) => {
                        s.errors += 1;
                        first_error.borrow_mut().get_or_insert(e);
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await;
    }
    let elapsed = start.elapsed();
    if let Some(e) = first_error.borrow().as_ref() {
        eprintln!("metcd-bench: first error: {e}");
    }
    let s = shared.borrow();
    Ok(Report {
        label: format!(
            "{} conns={} clients={}",
            op.label(),
            load.conns,
            load.clients
        ),
        ops: s.done,
        errors: s.errors,
        elapsed,
        hist: s.hist.clone(),
    })
}
