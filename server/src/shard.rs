//! Shard executors: one pinned glommio executor per core, each accepting
//! client connections on the same ports (SO_REUSEPORT). Shard 0 owns the
//! Raft group; the other shards ask it what they cannot answer themselves
//! through their links to it ([`crate::owner`]), and take its feed of
//! applied events for their watchers.
//!
//! Must never: share mutable state between cores except through these
//! links; block an executor.

use std::rc::Rc;
use std::time::Duration;

use glommio::channels::shared_channel::{self, ConnectedSender};
use glommio::{LocalExecutorBuilder, Placement};

use crate::api::grpc::require_leader::LeaderGuard;
use crate::api::grpc::serve::{serve as grpc_serve, Router};
use crate::api::grpc::service::{MemberInfo, Services};
use crate::api::http::{self, HttpLimits};
use crate::config::Config;
use crate::error::{Result, ServerError};
use crate::mvcc;
use crate::node::Node;
use crate::owner::link::{serve_remote, Link, Outbox, MAX_IN_FLIGHT};
use crate::owner::{Backend, Remote};
use crate::read_view::ReadView;
use crate::watch::{EventSubscriber, Feed, HeaderIds, WatchHub};

/// The owner core of the Raft group.
pub const OWNER_SHARD: usize = 0;
/// Messages (each up to [`crate::owner::link::MAX_BATCH`] feed items, one item per applied
/// entry's events) the event channel to a shard holds before the owner's
/// forwarding task waits (the Raft loop itself only queues).
const CHANNEL_CAPACITY: usize = 4096;

/// Number of executors: `--shards`, or every CPU of the set but one
/// (without `--cpus`, no more than the CPUs the process may use, cgroup
/// quota included). More shards than CPUs in the set is refused: two
/// pinned executors on one CPU take turns at the scheduler's pace.
///
/// The spare core is for the work a shard cannot do itself: the kernel's
/// I/O completions and loopback delivery, the checkpoint thread, and the
/// clients and sidecars that share small machines (a 2-vCPU control-plane
/// VM runs the API server next to its store). Measured on 2 vCPUs with the
/// load client beside the server (docs/benchmarks.md): one shard beat two
/// on every etcd benchmark case, +20 % puts and +36 % ranges at 1000
/// clients, because two shards plus the client oversubscribe the cores and
/// every request that lands on the non-owner shard pays a cross-core hop.
pub fn shard_count(cfg: &Config, cpus: &[usize]) -> Result<usize> {
    if cfg.shards == 0 {
        let usable = match cfg.cpus {
            Some(_) => cpus.len(),
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        return Ok(default_shards(usable.min(cpus.len())));
    }
    if cfg.shards > cpus.len() {
        return Err(ServerError::Startup(format!(
            "--shards {} needs {} CPUs, but the CPU set has {} ({}): lower --shards, or give \
             the member more CPUs (--cpus, taskset -c, systemd's CPUAffinity=)",
            cfg.shards,
            cfg.shards,
            cpus.len(),
            format_cpu_list(cpus)
        )));
    }
    Ok(cfg.shards)
}

/// Whether the owner shard accepts client connections: as configured, by
/// default only below 3 shards (from 3 on, the owner's core is worth more
/// running the group alone than serving a third or less of the clients).
fn owner_accepts_clients(cfg: &Config, shards: usize) -> Result<bool> {
    let accepts = cfg.owner_accepts_clients.unwrap_or(shards < 3);
    if !accepts && shards < 2 {
        return Err(ServerError::Startup(
            "--owner-accepts-clients false needs --shards 2 or more: with one shard nothing \
             else would accept clients"
                .into(),
        ));
    }
    Ok(accepts)
}

/// The CPUs shards are pinned to: `--cpus`, which must lie inside the
/// process's affinity, or else that affinity.
pub fn cpu_set(cfg: &Config) -> Result<Vec<usize>> {
    let allowed = allowed_cpus();
    let Some(list) = &cfg.cpus else {
        return Ok(allowed);
    };
    let cpus = crate::config::parse_cpu_list(list)
        .map_err(|reason| ServerError::Startup(format!("--cpus {list}: {reason}")))?;
    if let Some(cpu) = cpus.iter().find(|cpu| !allowed.contains(cpu)) {
        return Err(ServerError::Startup(format!(
            "--cpus {list}: CPU {cpu} is not one this process may run on ({})",
            format_cpu_list(&allowed)
        )));
    }
    Ok(cpus)
}

/// `cpus` (ascending) in taskset's list syntax: `0-3,8,10-11`.
fn format_cpu_list(cpus: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while let Some(&first) = cpus.get(i) {
        let mut last = first;
        while cpus.get(i + 1) == Some(&(last + 1)) {
            last += 1;
            i += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if first == last {
            out.push_str(&first.to_string());
        } else {
            out.push_str(&format!("{first}-{last}"));
        }
        i += 1;
    }
    out
}

/// The CPUs this process may run on (its affinity mask), in order.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
    // fills it for this process and CPU_ISSET only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        (0..(libc::CPU_SETSIZE as usize).min(crate::config::MAX_CPUS))
            .filter(|cpu| libc::CPU_ISSET(*cpu, &set))
            .collect()
    }
}

fn default_shards(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

/// Starts every shard and blocks until they exit (they serve forever unless
/// start-up fails, in which case the process exits with the error).
pub fn run(mut cfg: Config) -> Result<()> {
    let cpus = cpu_set(&cfg)?;
    let shards = shard_count(&cfg, &cpus)?;
    let owner_accepts_clients = owner_accepts_clients(&cfg, shards)?;
    crate::api::grpc::metrics::init(shards, cfg.metrics == "extensive");
    let addrs = cfg
        .http_listen_addrs()
        .map_err(|e| ServerError::Startup(e.to_string()))?;
    let grpc_addrs = cfg
        .client_listen_addrs()
        .map_err(|e| ServerError::Startup(e.to_string()))?;
    let metrics_addrs = cfg
        .metrics_listen_addrs()
        .map_err(|e| ServerError::Startup(e.to_string()))?;
    for addr in addrs
        .iter()
        .copied()
        .chain(grpc_addrs.iter().filter_map(crate::net::Endpoint::tcp))
        .chain(metrics_addrs.iter().filter_map(|(e, _)| e.tcp()))
    {
        probe_port(addr)?;
    }
    let _lock = crate::node::lock_data_dir(&cfg.data_dir())?;
    crate::tls::auto_tls(&mut cfg).map_err(ServerError::Startup)?;
    let (cluster_id, member_id) = crate::node::resolve_identity(&cfg)?;
    let client_tls = match cfg.client_tls_files() {
        Some(files) => Some(crate::tls::client_url_acceptor(&files).map_err(ServerError::Startup)?),
        None => None,
    };
    let member = member_info(&cfg, cluster_id, member_id);
    let read_view = std::sync::Arc::new(ReadView::new(member.auth_enabled.clone()));
    let listeners = Listeners {
        client_tls,
        cert_users: cfg.client_cert_auth,
        max_concurrent_streams: cfg.max_concurrent_streams,
        gateway_request_limit: cfg.gateway_request_limit(),
        http: addrs
            .iter()
            .copied()
            .map(crate::net::Endpoint::Tcp)
            .collect(),
        grpc: grpc_addrs.clone(),
        metrics: metrics_addrs,
        lone_listener_shard: if owner_accepts_clients {
            OWNER_SHARD
        } else {
            OWNER_SHARD + 1
        },
        http_limits: HttpLimits {
            max_request_bytes: cfg.max_request_bytes,
            auth_enabled: member.auth_enabled.clone(),
        },
        member,
        // etcd accepts gRPC messages up to --max-request-bytes plus 512 KiB
        // of overhead, then checks the request itself against the limit.
        max_grpc_message_bytes: cfg.max_request_bytes + GRPC_OVERHEAD_BYTES,
        election_timeout: Duration::from_millis(cfg.election_timeout),
        read_view,
        binding: BindingShards::new(if owner_accepts_clients {
            shards
        } else {
            shards - 1
        }),
    };
    let mut owner_side = Vec::new();
    let mut remote_side = Vec::new();
    for _ in 1..shards {
        let link = Link::<Node>::new();
        let (events_tx, events_rx) = shared_channel::new_bounded::<Vec<Feed>>(CHANNEL_CAPACITY);
        owner_side.push((link.questions.1, link.answers.0, events_tx));
        remote_side.push((link.questions.0, link.answers.1, events_rx));
    }
    let progress_every = cfg
        .watch_progress_notify_interval()
        .map_err(|e| ServerError::Startup(e.to_string()))?;
    let mut handles = Vec::new();
    // Shard i on the i-th CPU of the set, so `--cpus`, `taskset`,
    // systemd's `CPUAffinity=` or a cgroup's cpuset choose the cores
    // (shard_count checked there are enough).
    let placement = |shard: usize| match cpus.get(shard) {
        Some(cpu) => Placement::Fixed(*cpu),
        None => Placement::Unbound,
    };
    let owner_cfg = cfg.clone();
    let owner_listeners = listeners.clone();
    let owner = LocalExecutorBuilder::new(placement(OWNER_SHARD))
        .name("metcd-shard-0")
        .io_memory(cfg.io_memory_bytes)
        .spin_before_park(Duration::from_micros(cfg.spin_before_park_us))
        .spawn(move || async move {
            crate::sched::install(owner_cfg.range_cpu_shares);
            let bound = owner_accepts_clients.then(|| bind_all(&owner_listeners, OWNER_SHARD));
            owner_listeners.binding.wait_until_all_bound().await;
            let node = match Node::start(&owner_cfg).await {
                Ok(node) => node,
                Err(e) => {
                    eprintln!("metcd: cannot start: {e}");
                    std::process::exit(1);
                }
            };
            node.share_auth_flag(owner_listeners.member.auth_enabled.clone());
            node.share_read_view(owner_listeners.read_view.clone());
            let hub = WatchHub::new(
                owner_listeners.header_ids(),
                owner_listeners.http_limits.max_request_bytes,
            );
            node.subscribe_events(feed_in_watch_queue(hub.clone()));
            for (questions, answers, events) in owner_side {
                let questions = questions.connect().await;
                let answers = answers.connect().await;
                glommio::spawn_local(serve_remote(node.clone(), questions, answers)).detach();
                node.subscribe_events(forward_events(events.connect().await));
            }
            spawn_progress_notifier(hub.clone(), progress_every);
            let backend = Backend::Local(node);
            spawn_watch_resync(hub.clone(), backend.clone());
            if let Some(bound) = bound {
                serve_all(bound, &owner_listeners, OWNER_SHARD, backend, hub).await;
            } else {
                // The owner's core runs only the group; the other shards
                // accept every connection.
                glommio::timer::sleep(Duration::from_secs(u64::MAX / 4)).await;
            }
        })
        .map_err(|e| ServerError::Startup(format!("starting shard 0: {e}")))?;
    handles.push(owner);
    for (i, (questions, answers, events)) in remote_side.into_iter().enumerate() {
        let shard = i + 1;
        let listeners = listeners.clone();
        let range_cpu_shares = cfg.range_cpu_shares;
        let handle = LocalExecutorBuilder::new(placement(shard))
            .name(&format!("metcd-shard-{shard}"))
            .io_memory(cfg.io_memory_bytes)
            .spin_before_park(Duration::from_micros(cfg.spin_before_park_us))
            .spawn(move || async move {
                crate::sched::install(range_cpu_shares);
                let bound = bind_all(&listeners, shard);
                let remote = Remote::start(
                    questions,
                    answers,
                    listeners.read_view.clone(),
                    MAX_IN_FLIGHT,
                )
                .await;
                let hub = WatchHub::new(
                    listeners.header_ids(),
                    listeners.http_limits.max_request_bytes,
                );
                let events = events.connect().await;
                let feed = hub.clone();
                crate::sched::spawn_watch_fanout(async move {
                    while let Some(batch) = events.recv().await {
                        feed_batch(&feed, &batch).await;
                    }
                });
                spawn_progress_notifier(hub.clone(), progress_every);
                let backend = Backend::Remote(remote);
                spawn_watch_resync(hub.clone(), backend.clone());
                serve_all(bound, &listeners, shard, backend, hub).await;
            })
            .map_err(|e| ServerError::Startup(format!("starting shard {shard}: {e}")))?;
        handles.push(handle);
    }
    let list = |a: &[crate::net::Endpoint]| {
        a.iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "metcd: {shards} shard(s); etcd gRPC API on {}; HTTP API on {}",
        list(&grpc_addrs),
        list(&listeners.http)
    );
    for h in handles {
        h.join()
            .map_err(|e| ServerError::Startup(format!("shard exited: {e}")))?;
    }
    Ok(())
}

/// SO_REUSEPORT would let us share a port with another process by accident,
/// and the kernel would hand it some of our connections: probe first without
/// it, so a busy port is a clear error. A member killed a moment ago can
/// still hold its listener for a little while (io_uring tears rings down
/// asynchronously), so a busy port is retried for a few seconds first.
fn probe_port(addr: std::net::SocketAddr) -> Result<()> {
    crate::net::retry_while_in_use(|| std::net::TcpListener::bind(addr))
        .map(drop)
        .map_err(|e| ServerError::Startup(format!("cannot listen on {addr}: {e}")))
}

/// What every shard listens on.
#[derive(Clone)]
struct Listeners {
    http: Vec<crate::net::Endpoint>,
    grpc: Vec<crate::net::Endpoint>,
    /// `--listen-metrics-urls`, each with whether it is https://.
    metrics: Vec<(crate::net::Endpoint, bool)>,
    /// The shard that serves what one listener alone may take: the Unix
    /// sockets among the client URLs (one socket file) and the metrics
    /// URLs (little traffic). The client URLs' TCP ports are every shard's.
    lone_listener_shard: usize,
    http_limits: HttpLimits,
    member: MemberInfo,
    max_grpc_message_bytes: usize,
    /// How often leader-requiring streams check for a leader.
    election_timeout: Duration,
    /// `--cert-file`: every client URL connection is TLS.
    client_tls: Option<futures_rustls::TlsAcceptor>,
    /// `--client-cert-auth`: a request without a token is the user its
    /// client certificate's common name names (etcd's AuthInfoFromTLS).
    cert_users: bool,
    /// `--max-concurrent-streams`, per client connection.
    max_concurrent_streams: u32,
    /// The JSON gateway's requests in flight in the member, all together
    /// (`Config::gateway_request_limit`).
    gateway_request_limit: u32,
    /// The owner's published read view ([`crate::read_view`]).
    read_view: std::sync::Arc<ReadView>,
    /// The shards still binding their client listeners.
    binding: BindingShards,
}

/// Counts the shards that have not bound their listeners yet. The owner
/// starts its member only once every shard has: the member's start-up
/// publish prints the lines that tools wait for ("ready to serve client
/// requests", and etcd's e2e harness waits for "published"). A client
/// that saw those lines must never find the port closed: it connects, and
/// the connection waits in the backlog until the shard serves (etcd too
/// listens before its server starts).
#[derive(Clone)]
struct BindingShards(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl BindingShards {
    fn new(shards: usize) -> BindingShards {
        BindingShards(std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(
            shards,
        )))
    }

    fn one_bound(&self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Shards start in parallel threads: a few milliseconds at most.
    async fn wait_until_all_bound(&self) {
        while self.0.load(std::sync::atomic::Ordering::Acquire) > 0 {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
    }
}

const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

impl Listeners {
    fn header_ids(&self) -> HeaderIds {
        HeaderIds {
            cluster_id: self.member.cluster_id,
            member_id: self.member.member_id,
        }
    }
}

fn member_info(cfg: &Config, cluster_id: u64, member_id: u64) -> MemberInfo {
    let split = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(String::from)
            .collect()
    };
    MemberInfo {
        name: cfg.name.clone(),
        cluster_id,
        member_id,
        peer_urls: split(&cfg.initial_advertise_peer_urls),
        client_urls: split(
            cfg.advertise_client_urls
                .as_deref()
                .unwrap_or(&cfg.listen_client_urls),
        ),
        max_txn_ops: cfg.max_txn_ops,
        bcrypt_cost: cfg.bcrypt_cost,
        auth_enabled: Default::default(),
    }
}

/// The owner's end of a remote shard's event feed: the Raft loop only
/// enqueues (never waits for another core); a task moves what each turn
/// queued across as one message.
fn forward_events(to_shard: ConnectedSender<Vec<Feed>>) -> EventSubscriber {
    let outbox = Outbox::new();
    glommio::spawn_local(outbox.clone().drain_into(to_shard)).detach();
    Box::new(move |item| outbox.push_feed(item))
}

/// The owner's own hub, fed in this shard's watch fan-out queue
/// ([`crate::sched`]): the Raft loop only enqueues, so matching events
/// against many watchers never lengthens its turn.
fn feed_in_watch_queue(hub: Rc<WatchHub>) -> EventSubscriber {
    let outbox: Rc<Outbox<Feed>> = Outbox::new();
    let queued = outbox.clone();
    crate::sched::spawn_watch_fanout(async move {
        while let Some(batch) = queued.next_batch().await {
            feed_batch(&hub, &batch).await;
        }
    });
    Box::new(move |item| outbox.push_feed(item))
}

/// Feeds `batch` to `hub` in order, letting the other queues run after it
/// if its time is up.
async fn feed_batch(hub: &WatchHub, batch: &[Feed]) {
    for item in batch {
        hub.feed(item);
    }
    glommio::yield_if_needed().await;
}

/// After this member installed a leader's snapshot, its watchers re-read
/// the history they missed from the new store: one read over every key
/// from the oldest revision any of them needs. Watchers whose next
/// revision was compacted away are cancelled with the compact revision,
/// as etcd cancels a watcher that fell behind compaction.
fn spawn_watch_resync(hub: Rc<WatchHub>, backend: Backend) {
    glommio::spawn_local(async move {
        loop {
            let mut pending = hub.take_resync().await;
            while let Some(from) = pending.iter().map(|claim| claim.from).min() {
                let (history, _) = backend
                    .watch_history(
                        bytes::Bytes::from_static(b"\0"),
                        bytes::Bytes::from_static(b"\0"),
                        from,
                    )
                    .await;
                match history {
                    Ok((events, upto)) => {
                        for claim in pending.drain(..) {
                            hub.finish_resync(&claim, &events, upto);
                        }
                    }
                    Err(ServerError::Mvcc(mvcc::MvccError::Compacted)) => {
                        let compacted = backend.compact_revision().await.unwrap_or(i64::MAX);
                        let before = pending.len();
                        pending.retain(|claim| {
                            if claim.from < compacted {
                                hub.cancel_compacted(claim.id.0, claim.id.1, compacted);
                                false
                            } else {
                                true
                            }
                        });
                        if pending.len() == before {
                            // Only a compaction racing this read: retry
                            // without spinning the core.
                            glommio::timer::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    Err(e) => {
                        // The owner is stopping; nothing to resync into.
                        eprintln!("metcd: watch resync after a snapshot failed: {e}");
                        break;
                    }
                }
            }
        }
    })
    .detach();
}

fn spawn_progress_notifier(hub: Rc<WatchHub>, every: Option<Duration>) {
    if let Some(every) = every {
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(every).await;
                hub.notify_progress();
            }
        })
        .detach();
    }
}

/// How often a shard asks the owner whether it may serve, at start.
const SERVING_POLL: Duration = Duration::from_millis(20);

/// What one shard listens on, bound but not served yet.
struct BoundListeners {
    http: Vec<crate::net::Listener>,
    grpc: Vec<crate::net::Listener>,
    /// Each with whether it is https://.
    metrics: Vec<(crate::net::Listener, bool)>,
}

/// Binds this shard's listeners (exits the process if one cannot be
/// bound, as at start) and counts the shard as bound.
fn bind_all(listeners: &Listeners, shard: usize) -> BoundListeners {
    use crate::net::{Endpoint, Listener, PortSharing};
    let bind = |endpoint: &Endpoint, sharing| match Listener::bind(endpoint, sharing) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("metcd: cannot listen on {endpoint}: {e}");
            std::process::exit(1);
        }
    };
    let lone = shard == listeners.lone_listener_shard;
    let http_listeners: Vec<_> = (listeners.http.iter())
        .map(|endpoint| bind(endpoint, PortSharing::EveryShard))
        .collect();
    let grpc_listeners: Vec<_> = (listeners.grpc.iter())
        .filter(|endpoint| matches!(endpoint, Endpoint::Tcp(_)) || lone)
        .map(|endpoint| bind(endpoint, PortSharing::EveryShard))
        .collect();
    let metrics_listeners: Vec<_> = (listeners.metrics.iter())
        .filter(|_| lone)
        .map(|(endpoint, https)| (bind(endpoint, PortSharing::Exclusive), *https))
        .collect();
    listeners.binding.one_bound();
    BoundListeners {
        http: http_listeners,
        grpc: grpc_listeners,
        metrics: metrics_listeners,
    }
}

async fn serve_all(
    bound: BoundListeners,
    listeners: &Listeners,
    shard: usize,
    backend: Backend,
    hub: Rc<WatchHub>,
) {
    let mut tasks = Vec::new();
    // As etcd: listening at once (connections wait in the backlog), serving
    // once this member has applied its start-up publish (node,
    // publish_attributes). Polled: once per start, on every shard.
    while !matches!(backend.serving().await, Ok(true)) {
        glommio::timer::sleep(SERVING_POLL).await;
    }
    for (listener, https) in bound.metrics {
        let tls = if https {
            listeners.client_tls.clone()
        } else {
            None
        };
        tasks.push(glommio::spawn_local(http::serve_metrics(
            listener,
            backend.clone(),
            tls,
        )));
    }
    for listener in bound.http {
        tasks.push(glommio::spawn_local(http::serve(
            listener,
            backend.clone(),
            listeners.http_limits.clone(),
        )));
    }
    let (router, gateway) = Router::new(
        Services::new(backend.clone(), hub, listeners.member.clone()),
        listeners.max_grpc_message_bytes,
        LeaderGuard::start(backend.clone(), listeners.election_timeout),
        backend.clone(),
        crate::api::grpc::metrics::ShardCounters::of_shard(shard),
        listeners.gateway_request_limit,
    );
    for listener in bound.grpc {
        tasks.push(glommio::spawn_local(grpc_serve(
            listener,
            router.clone(),
            gateway.clone(),
            backend.clone(),
            listeners.client_tls.clone(),
            listeners.cert_users,
            listeners.max_concurrent_streams,
        )));
    }
    for t in tasks {
        t.await;
    }
    // Never reached while serving; keep the executor alive otherwise.
    glommio::timer::sleep(Duration::from_secs(u64::MAX / 4)).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    #[test]
    fn cpu_lists_print_as_taskset_writes_them() {
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpu_list(&[5]), "5");
        assert_eq!(format_cpu_list(&[]), "");
    }

    #[test]
    fn the_owner_stops_accepting_clients_from_three_shards_unless_told() {
        let cfg = |accepts| Config {
            owner_accepts_clients: accepts,
            ..Config::default()
        };
        assert!(owner_accepts_clients(&cfg(None), 1).unwrap());
        assert!(owner_accepts_clients(&cfg(None), 2).unwrap());
        assert!(!owner_accepts_clients(&cfg(None), 3).unwrap());
        assert!(owner_accepts_clients(&cfg(Some(true)), 7).unwrap());
        assert!(!owner_accepts_clients(&cfg(Some(false)), 2).unwrap());
        assert!(owner_accepts_clients(&cfg(Some(false)), 1).is_err());
    }

    #[test]
    fn more_shards_than_cpus_are_refused() {
        let cfg = |shards, cpus: Option<&str>| Config {
            shards,
            cpus: cpus.map(str::to_string),
            ..Config::default()
        };
        assert_eq!(
            shard_count(&cfg(0, Some("0-7")), &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap(),
            7
        );
        assert_eq!(
            shard_count(&cfg(3, Some("0-7")), &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap(),
            3
        );
        assert_eq!(shard_count(&cfg(2, None), &[4, 6]).unwrap(), 2);
        let refused = shard_count(&cfg(3, None), &[4, 6]).unwrap_err().to_string();
        assert!(
            refused.contains("--shards 3 needs 3 CPUs, but the CPU set has 2 (4,6)"),
            "{refused}"
        );
    }

    #[test]
    fn the_default_leaves_one_core_to_the_rest_of_the_machine() {
        assert_eq!(default_shards(1), 1);
        assert_eq!(default_shards(2), 1);
        assert_eq!(default_shards(3), 2);
        assert_eq!(default_shards(16), 15);
    }
}
