//! Durable writes through the WAL + Raft + apply path on one core, without
//! any network: N concurrent proposer tasks on the owner core's executor
//! call `Node::write` (what every API ends up calling) with 256-byte
//! values. Each acknowledged write has been fdatasync'd and applied.
//!
//! `cargo bench -p server --bench durable_path -- [--dir DIR] [--clients 1,10,100,1000]
//!  [--total N] [--seconds S] [--cpu C] [--snapshot-count N]`

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use server::config::Config;
use server::mvcc::{PutRequest, Request};
use server::node::{Caller, Node};

// The same allocator as the `metcd` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    dir: std::path::PathBuf,
    clients: Vec<usize>,
    total: u64,
    seconds: f64,
    cpu: usize,
    value_size: usize,
    snapshot_count: u64,
}

fn parse_args() -> Args {
    let mut a = Args {
        dir: std::env::temp_dir(),
        clients: vec![1, 10, 100, 1000],
        total: 200_000,
        seconds: 5.0,
        cpu: 0,
        value_size: 256,
        snapshot_count: Config::default().snapshot_count,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--dir" => a.dir = v.into(),
            "--clients" => a.clients = v.split(',').filter_map(|c| c.parse().ok()).collect(),
            "--total" => a.total = v.parse().unwrap_or(a.total),
            "--seconds" => a.seconds = v.parse().unwrap_or(a.seconds),
            "--cpu" => a.cpu = v.parse().unwrap_or(a.cpu),
            "--value-size" => a.value_size = v.parse().unwrap_or(a.value_size),
            "--snapshot-count" => a.snapshot_count = v.parse().unwrap_or(a.snapshot_count),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

fn main() {
    server::alloc::tune();
    let args = parse_args();
    println!(
        "# durable path, one core (cpu {}), {}-byte values, a fresh store per level, data under {}",
        args.cpu,
        args.value_size,
        args.dir.display()
    );
    for &clients in &args.clients {
        let data = args.dir.join(format!(
            "metcd-durable-bench-{}-{clients}",
            std::process::id()
        ));
        let cfg = Config {
            data_dir: Some(data.clone()),
            shards: 1,
            snapshot_count: args.snapshot_count,
            ..Default::default()
        };
        let (total, seconds, value_size) = (args.total, args.seconds, args.value_size);
        let result = glommio::LocalExecutorBuilder::new(glommio::Placement::Fixed(args.cpu))
            .io_memory(cfg.io_memory_bytes)
            .spawn(move || async move {
                match Node::start(&cfg).await {
                    Ok(node) => {
                        run_level(
                            &node,
                            clients,
                            total,
                            Duration::from_secs_f64(seconds),
                            value_size,
                        )
                        .await
                    }
                    Err(e) => eprintln!("start: {e}"),
                }
            })
            .and_then(|h| h.join());
        if let Err(e) = result {
            eprintln!("executor: {e}");
        }
        let _ = std::fs::remove_dir_all(&data);
    }
}

async fn run_level(
    node: &Rc<Node>,
    clients: usize,
    total: u64,
    limit: Duration,
    value_size: usize,
) {
    let hist = Rc::new(RefCell::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram"),
    ));
    let issued = Rc::new(RefCell::new(0u64));
    let errors = Rc::new(RefCell::new(0u64));
    let value = Bytes::from(vec![b'v'; value_size]);
    let syncs_before = node.status().wal_syncs;
    let start = Instant::now();
    let deadline = start + limit;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (node, hist, issued, errors, value) = (
            node.clone(),
            hist.clone(),
            issued.clone(),
            errors.clone(),
            value.clone(),
        );
        tasks.push(glommio::spawn_local(async move {
            let mut i = 0u64;
            loop {
                {
                    let mut n = issued.borrow_mut();
                    if *n >= total || Instant::now() >= deadline {
                        break;
                    }
                    *n += 1;
                }
                let key = Bytes::from(format!("/bench/{c:05}/{i:08}"));
                i += 1;
                let t0 = Instant::now();
                let r = node
                    .write(
                        Request::Put(PutRequest {
                            key,
                            value: value.clone(),
                            ..Default::default()
                        }),
                        Caller::Client(None),
                    )
                    .await;
                match r {
                    Ok(_) => {
                        let _ = hist
                            .borrow_mut()
                            .record((t0.elapsed().as_micros() as u64).max(1));
                    }
                    Err(_) => *errors.borrow_mut() += 1,
                }
            }
        }));
    }
    for t in tasks {
        t.await;
    }
    let elapsed = start.elapsed();
    let h = hist.borrow();
    let syncs = node.status().wal_syncs - syncs_before;
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    println!(
        "writers={clients:<5} {:>8} writes {:>4} err {:>9.0} writes/s  {:>7} fsyncs ({:>6.1} writes/fsync)  p50 {:>7.3} ms  p99 {:>7.3} ms  p99.9 {:>7.3} ms  max {:>7.3} ms",
        h.len(),
        errors.borrow(),
        h.len() as f64 / elapsed.as_secs_f64(),
        syncs,
        h.len() as f64 / syncs.max(1) as f64,
        q(0.5),
        q(0.99),
        q(0.999),
        h.max() as f64 / 1000.0
    );
}
