//! The load loop shared by the gRPC subcommands: the global load flags
//! ([`LoadArgs`]), connection setup before timing (round-robin over the
//! endpoints, or only the leader with `--target-leader`), and [`run`],
//! which drives the clients of a run within `--total`, `--duration` and
//! `--rate`, each client with its own histograms, merged at the end.
//!
//! What one request is belongs to the workload ([`Worker`], see `ops`).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::grpc::{self, pb::etcdserverpb as pb};
use crate::rate::RateLimiter;
use crate::report::{self, Output, Report};

/// Global load flags, flattened into every gRPC subcommand.
#[derive(clap::Args, Clone, Debug)]
pub struct LoadArgs {
    /// Comma-separated host:port list of the etcd v3 gRPC API (an
    /// `http://` prefix is ignored). `--endpoint` is an alias.
    #[arg(
        long = "endpoints",
        visible_alias = "endpoint",
        value_delimiter = ',',
        default_value = "127.0.0.1:2379"
    )]
    pub endpoints: Vec<String>,
    /// HTTP/2 connections, spread round-robin over the endpoints.
    #[arg(long, default_value_t = 1)]
    pub conns: usize,
    /// Concurrent clients, spread round-robin over the connections.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Requests (upper bound; the run also stops at --duration).
    #[arg(long, default_value_t = 10_000)]
    pub total: u64,
    /// Seconds (upper bound; the run also stops at --total).
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Requests per second over all clients; 0 = unlimited.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Send only to the leader: before timing, ask every endpoint for
    /// Maintenance/Status and keep the one whose leader is itself.
    #[arg(long)]
    pub target_leader: bool,
    /// Report format: text (summary line + histogram) or json (one object
    /// per reported series).
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// CPU to pin the client to (none: unpinned).
    #[arg(long)]
    pub cpu: Option<usize>,
}

impl LoadArgs {
    pub fn conns(&self) -> usize {
        self.conns.max(1)
    }

    pub fn clients(&self) -> usize {
        self.clients.max(1)
    }

    /// `<what> conns=.. clients=..`, the name scripts know.
    pub fn label(&self, what: &str) -> String {
        format!("{what} conns={} clients={}", self.conns, self.clients)
    }

    fn duration(&self) -> Result<Duration, String> {
        Duration::try_from_secs_f64(self.duration).map_err(|e| format!("--duration: {e}"))
    }
}

/// Runs `f` on a new glommio executor (pinned to `cpu` if given) and
/// returns its output.
pub fn run_on_executor<T: Send + 'static, F, Fut>(cpu: Option<usize>, f: F) -> Result<T, String>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    let placement = match cpu {
        Some(c) => glommio::Placement::Fixed(c),
        None => glommio::Placement::Unbound,
    };
    glommio::LocalExecutorBuilder::new(placement)
        .io_memory(1 << 20)
        .spawn(f)
        .map_err(|e| e.to_string())?
        .join()
        .map_err(|e| e.to_string())
}

fn strip_scheme(endpoint: &str) -> &str {
    endpoint
        .trim()
        .trim_start_matches("http://")
        .trim_end_matches('/')
}

/// Asks `endpoint` for Maintenance/Status: its member ID if that member
/// is the leader, `None` if it answered and is not.
pub async fn leader_member(endpoint: &str) -> Result<Option<u64>, String> {
    let mut conn = grpc::Conn::connect(endpoint).await?;
    let s = conn
        .unary::<_, pb::StatusResponse>("/etcdserverpb.Maintenance/Status", &pb::StatusRequest {})
        .await?;
    let member = s.header.as_ref().map_or(0, |h| h.member_id);
    Ok((s.leader != 0 && s.leader == member).then_some(member))
}

/// The endpoints to load: all of them, or only the leader.
async fn endpoints(args: &LoadArgs) -> Result<Vec<String>, String> {
    let all: Vec<String> = args
        .endpoints
        .iter()
        .map(|e| strip_scheme(e).to_string())
        .filter(|e| !e.is_empty())
        .collect();
    if all.is_empty() {
        return Err("--endpoints: no endpoint".into());
    }
    if !args.target_leader {
        return Ok(all);
    }
    for endpoint in &all {
        match leader_member(endpoint).await {
            Ok(Some(member)) => {
                eprintln!("metcd-bench: --target-leader: {endpoint} (member {member:x})");
                return Ok(vec![endpoint.clone()]);
            }
            Ok(None) => {}
            Err(e) => eprintln!("metcd-bench: status of {endpoint}: {e}"),
        }
    }
    Err(format!(
        "--target-leader: no leader among {}",
        all.join(",")
    ))
}

/// The connections of a run, set up before timing starts.
pub async fn connect(args: &LoadArgs) -> Result<Vec<grpc::Conn>, String> {
    let endpoints = endpoints(args).await?;
    let mut conns = Vec::with_capacity(args.conns());
    for i in 0..args.conns() {
        conns.push(grpc::Conn::connect(&endpoints[i % endpoints.len()]).await?);
    }
    Ok(conns)
}

/// What one request returned: the series it belongs to (an index into the
/// run's series names) and either a failure or an optional named count to
/// add (e.g. `("kvs", 10)`).
pub struct Step {
    pub series: usize,
    pub result: Result<Option<(&'static str, u64)>, String>,
}

/// One client of a workload: issues one request per [`Worker::step`].
pub trait Worker {
    async fn step(&mut self) -> Step;
}

/// Takes the right to send one more request, within `--total`,
/// `--duration` and `--rate`.
struct Gate {
    issued: u64,
    total: u64,
    deadline: Instant,
    limiter: RateLimiter,
}

impl Gate {
    /// When the claimed request may be sent; None when the run is over.
    fn claim(&mut self, now: Instant) -> Option<Instant> {
        if self.issued >= self.total || now >= self.deadline {
            return None;
        }
        let at = self.limiter.reserve(now, self.deadline)?;
        self.issued += 1;
        Some(at)
    }
}

/// One client's results, per series.
struct ClientStats {
    sent: Vec<u64>,
    ok: Vec<u64>,
    errors: Vec<u64>,
    hists: Vec<Histogram<u64>>,
    counters: Vec<BTreeMap<&'static str, u64>>,
    first_error: Option<String>,
}

impl ClientStats {
    fn new(series: usize) -> Result<ClientStats, String> {
        Ok(ClientStats {
            sent: vec![0; series],
            ok: vec![0; series],
            errors: vec![0; series],
            hists: (0..series)
                .map(|_| report::new_hist())
                .collect::<Result<_, _>>()?,
            counters: vec![BTreeMap::new(); series],
            first_error: None,
        })
    }

    fn record(&mut self, step: Step, latency: Duration) {
        let s = step.series.min(self.sent.len().saturating_sub(1));
        self.sent[s] += 1;
        match step.result {
            Ok(count) => {
                self.ok[s] += 1;
                report::record(&mut self.hists[s], latency);
                if let Some((name, n)) = count {
                    *self.counters[s].entry(name).or_default() += n;
                }
            }
            Err(e) => {
                self.errors[s] += 1;
                self.first_error.get_or_insert(e);
            }
        }
    }
}

/// Clients that run beside a load, unbounded, until it is done: on an
/// executor (a thread) of their own, with a connection each, as clients in
/// other processes would be. Their own work (decoding a scan's megabytes)
/// then neither holds up the measured clients' replies on a shared thread
/// nor shares a connection with them.
pub struct Background {
    stop: Arc<AtomicBool>,
    handle: glommio::ExecutorJoinHandle<Result<Vec<ClientStats>, String>>,
}

impl Background {
    /// Starts `clients` workers made by `make` (given a connection each),
    /// recording into series `of_series` of `series` series; returns once
    /// they are connected. They stop when the load they run beside is
    /// done, or after the load's duration.
    pub fn start<W, F>(
        args: &LoadArgs,
        clients: usize,
        series: usize,
        make: F,
    ) -> Result<Background, String>
    where
        W: Worker + 'static,
        F: FnOnce(Vec<grpc::Conn>) -> Vec<W> + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let (connected, ready) = std::sync::mpsc::channel::<Result<(), String>>();
        let (args, stopped) = (args.clone(), stop.clone());
        let handle = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(1 << 20)
            .spawn(move || async move {
                let limit = args.duration()?;
                let connect = async {
                    let endpoints = endpoints(&args).await?;
                    let mut conns = Vec::with_capacity(clients);
                    for i in 0..clients {
                        conns.push(grpc::Conn::connect(&endpoints[i % endpoints.len()]).await?);
                    }
                    Ok::<_, String>(conns)
                };
                let conns = match connect.await {
                    Ok(conns) => {
                        let _ = connected.send(Ok(()));
                        conns
                    }
                    Err(e) => {
                        let _ = connected.send(Err(e.clone()));
                        return Err(e);
                    }
                };
                let deadline = Instant::now() + limit;
                let mut tasks = Vec::new();
                for mut w in make(conns) {
                    let stop = stopped.clone();
                    let mut stats = ClientStats::new(series)?;
                    tasks.push(glommio::spawn_local(async move {
                        while !stop.load(Ordering::Acquire) && Instant::now() < deadline {
                            let t0 = Instant::now();
                            let step = w.step().await;
                            stats.record(step, t0.elapsed());
                        }
                        stats
                    }));
                }
                let mut all = Vec::with_capacity(tasks.len());
                for t in tasks {
                    all.push(t.await);
                }
                Ok(all)
            })
            .map_err(|e| e.to_string())?;
        ready
            .recv()
            .map_err(|_| "the background clients' thread ended".to_string())??;
        Ok(Background { stop, handle })
    }

    /// Stops the clients (each after its request in flight) and takes
    /// their results.
    fn finish(self) -> Result<Vec<ClientStats>, String> {
        self.stop.store(true, Ordering::Release);
        self.handle.join().map_err(|e| e.to_string())?
    }
}

/// Runs `workers` (bounded by the load flags) beside the `background`
/// workers (unbounded, stopped when the bounded ones are done) and reports
/// one [`Report`] per series name in `series`, in that order. The clock
/// starts here: connections and workers are set up by the caller.
pub async fn run<W: Worker + 'static>(
    args: &LoadArgs,
    series: &[String],
    workers: Vec<W>,
    background: Option<Background>,
) -> Result<Vec<Report>, String> {
    let n = series.len().max(1);
    let start = Instant::now();
    let deadline = start + args.duration()?;
    let gate = Rc::new(RefCell::new(Gate {
        issued: 0,
        total: args.total,
        deadline,
        limiter: RateLimiter::new(args.rate),
    }));
    let stop = Rc::new(Cell::new(false));
    let mut tasks = Vec::new();
    for mut w in workers {
        let gate = gate.clone();
        let mut stats = ClientStats::new(n)?;
        tasks.push(glommio::spawn_local(async move {
            loop {
                let now = Instant::now();
                let Some(at) = gate.borrow_mut().claim(now) else {
                    break;
                };
                if at > now {
                    glommio::timer::sleep(at - now).await;
                }
                let t0 = Instant::now();
                let step = w.step().await;
                stats.record(step, t0.elapsed());
            }
            stats
        }));
    }
    let progress = Progress::start(args.total, args.duration()?, gate.clone(), stop.clone());
    let mut all = Vec::with_capacity(tasks.len());
    for t in tasks {
        all.push(t.await);
    }
    let elapsed = start.elapsed();
    stop.set(true);
    progress.finish().await;
    let bounded_sent: u64 = all.iter().flat_map(|s| s.sent.iter()).sum();
    let issued = gate.borrow().issued;
    assert_eq!(
        issued, bounded_sent,
        "requests claimed and requests accounted for differ"
    );
    if let Some(background) = background {
        all.extend(background.finish()?);
    }
    if let Some(e) = all.iter().find_map(|s| s.first_error.as_ref()) {
        eprintln!("metcd-bench: first error: {e}");
    }
    let mut reports = Vec::with_capacity(n);
    for (i, name) in series.iter().enumerate() {
        let hist = report::merge(all.iter().map(|s| &s.hists[i]))?;
        let mut r = Report::new(
            name.clone(),
            all.iter().map(|s| s.sent[i]).sum(),
            all.iter().map(|s| s.ok[i]).sum(),
            all.iter().map(|s| s.errors[i]).sum(),
            elapsed,
            hist,
        );
        for s in &all {
            for (k, v) in &s.counters[i] {
                *r.counters.entry((*k).to_string()).or_default() += v;
            }
        }
        reports.push(r);
    }
    Ok(reports)
}

/// A progress bar of requests issued (and of time, when the duration bound
/// comes first) on stderr, only when stderr is a terminal: scripts and CI
/// logs stay quiet.
struct Progress {
    task: Option<glommio::task::JoinHandle<()>>,
}

impl Progress {
    fn start(
        total: u64,
        limit: Duration,
        gate: Rc<RefCell<Gate>>,
        stop: Rc<Cell<bool>>,
    ) -> Progress {
        use std::io::IsTerminal;
        if !std::io::stderr().is_terminal() {
            return Progress { task: None };
        }
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} requests, {elapsed} of at most {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(format!("{:.0?}", limit));
        let task = glommio::spawn_local(async move {
            while !stop.get() {
                bar.set_position(gate.borrow().issued);
                glommio::timer::sleep(Duration::from_millis(100)).await;
            }
            bar.finish_and_clear();
        })
        .detach();
        Progress { task: Some(task) }
    }

    async fn finish(self) {
        if let Some(task) = self.task {
            task.await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn gate_stops_at_total() {
        let now = Instant::now();
        let mut g = Gate {
            issued: 0,
            total: 3,
            deadline: now + Duration::from_secs(60),
            limiter: RateLimiter::new(0),
        };
        assert!((0..3).all(|_| g.claim(now).is_some()));
        assert_eq!(g.claim(now), None);
        assert_eq!(g.issued, 3);
    }

    #[test]
    fn gate_stops_at_deadline() {
        let now = Instant::now();
        let mut g = Gate {
            issued: 0,
            total: 1000,
            deadline: now + Duration::from_millis(450),
            limiter: RateLimiter::new(10),
        };
        let mut n = 0;
        while g.claim(now).is_some() {
            n += 1;
        }
        // Slots at 0, 100, .., 400 ms.
        assert_eq!(n, 5);
        assert_eq!(g.claim(now + Duration::from_secs(1)), None);
    }

    #[test]
    fn endpoints_accept_urls() {
        assert_eq!(strip_scheme(" http://127.0.0.1:2379/ "), "127.0.0.1:2379");
        assert_eq!(strip_scheme("h:1"), "h:1");
    }
}
