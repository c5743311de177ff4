//! The clients (etcd's Rust `etcd-client`, one member each) running a
//! seeded mix on a small key set, the watchers (one per member, from
//! revision 1, resuming after each break), the faults done meanwhile, and
//! the final convergence; everything they see goes into a [`History`].
//!
//! Every loop is bounded in time and count; every call has a deadline.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};

use crate::cluster::Cluster;
use crate::history::{
    decode_value, encode_value, Event, EventKind, FinalState, History, Kv, LeaseId, Nanos, Op,
    Outcome, Request, Response, ValueId, WatchRecord,
};
use crate::linearizable::splitmix;

/// A small seeded generator (splitmix64): runs are reproducible in what
/// they choose, if not in how the kernel schedules it.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(splitmix(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix(self.0)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    pub fn between_ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

#[derive(Clone, Debug)]
pub struct Settings {
    pub clients: u32,
    pub keys: u32,
    pub run_for: Duration,
    pub seed: u64,
    /// Most operations one client issues.
    pub max_ops_per_client: u64,
    pub faults: Vec<FaultKind>,
    /// The members' engine (chooses the disk faults that apply).
    pub engine: String,
    /// Pause between faults (uniform in the range).
    pub fault_every_ms: (u64, u64),
    /// Double faults: a kill or pause of a second member during about half
    /// of the kills, pauses and partitions (no quorum meanwhile).
    pub overlap: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    Kill,
    Pause,
    Partition,
    /// Restarted with a disk fault armed (WAL fsync EIO, WAL write ENOSPC,
    /// a torn WAL write, a btree commit's fsync): it must stop by itself,
    /// and after a clean restart catch up with nothing acknowledged lost.
    Disk,
    /// A follower replaced by a new member: killed, removed, its data
    /// wiped, added back as a learner, started, promoted once in sync.
    Membership,
}

impl FaultKind {
    pub fn parse(s: &str) -> Option<FaultKind> {
        match s {
            "kill" => Some(FaultKind::Kill),
            "pause" | "stop" => Some(FaultKind::Pause),
            "partition" => Some(FaultKind::Partition),
            "disk" => Some(FaultKind::Disk),
            "member" | "membership" => Some(FaultKind::Membership),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill -9 + restart",
            FaultKind::Pause => "SIGSTOP + SIGCONT",
            FaultKind::Partition => "partition + heal",
            FaultKind::Disk => "disk fault + clean restart",
            FaultKind::Membership => "remove + add learner + promote",
        }
    }
}

/// A fault done during the run.
#[derive(Clone, Debug)]
pub struct Fault {
    pub kind: FaultKind,
    pub member: usize,
    pub was_leader: bool,
    pub at: Nanos,
    pub lasted: Duration,
    /// What happened, where it varies (a disk fault: fired or not).
    pub detail: String,
}

pub struct Run {
    pub history: History,
    pub faults: Vec<Fault>,
    /// Problems with the run itself (a member that crashed, did not come
    /// back, or never converged): reported like anomalies.
    pub run_errors: Vec<String>,
}

const CALL_TIMEOUT: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Leases end only by revoke in a run: a TTL of 11 days never expires one
/// (expiry would delete keys no operation in the history asked to).
const LEASE_TTL_S: i64 = 1_000_000;

fn since(start: Instant) -> Nanos {
    start.elapsed().as_nanos() as Nanos
}

async fn connect(endpoint: &str) -> Option<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(CALL_TIMEOUT);
    tokio::time::timeout(CALL_TIMEOUT, Client::connect([endpoint], Some(options)))
        .await
        .ok()?
        .ok()
}

/// A refusal that certainly took no effect, or an answer we cannot judge.
fn classify(e: etcd_client::Error) -> Outcome {
    use etcd_client::Error;
    match e {
        Error::GRpcStatus(status) => {
            use tonic::Code;
            // etcd refuses these before proposing anything.
            let definite = matches!(
                status.code(),
                Code::InvalidArgument
                    | Code::NotFound
                    | Code::FailedPrecondition
                    | Code::OutOfRange
                    | Code::PermissionDenied
                    | Code::AlreadyExists
                    | Code::Unauthenticated
            );
            let text = format!("{:?}: {}", status.code(), status.message());
            // tonic could not open a connection: nothing was sent.
            let not_sent = status.code() == Code::Unavailable
                && status.message().starts_with("tcp connect error");
            if definite || not_sent {
                Outcome::Failed(text)
            } else {
                Outcome::Unknown(text)
            }
        }
        other => Outcome::Unknown(other.to_string()),
    }
}

fn kv_of(kv: &etcd_client::KeyValue) -> Kv {
    Kv {
        value: decode_value(kv.value()).unwrap_or(ValueId::MAX),
        mod_revision: kv.mod_revision(),
        lease: kv.lease(),
    }
}

fn header_revision(h: Option<&etcd_client::ResponseHeader>) -> i64 {
    h.map_or(0, |h| h.revision())
}

/// One client's loop: sequential operations on one member.
async fn client_loop(
    client_id: u32,
    member: usize,
    incarnation: Arc<AtomicU32>,
    endpoint: String,
    settings: Settings,
    start: Instant,
) -> Vec<Op> {
    let mut rng = Rng::new(settings.seed ^ (u64::from(client_id) << 32) ^ 0x00C1_1E17);
    let mut ops = Vec::new();
    let mut client: Option<Client> = None;
    let mut leases: Vec<LeaseId> = Vec::new();
    let mut last_read: HashMap<String, Option<Kv>> = HashMap::new();
    let mut seq: u64 = 0;
    let deadline = start + settings.run_for;
    while Instant::now() < deadline && (ops.len() as u64) < settings.max_ops_per_client {
        if client.is_none() {
            client = connect(&endpoint).await;
            if client.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        }
        let Some(c) = client.as_mut() else { continue };
        let key = format!("key/{:02}", rng.below(u64::from(settings.keys)));
        seq += 1;
        let value: ValueId = (u64::from(client_id) << 40) | seq;
        let roll = rng.below(100);
        let lease = if !leases.is_empty() && rng.below(4) == 0 {
            leases[rng.below(leases.len() as u64) as usize]
        } else {
            0
        };
        let request = match roll {
            0..=24 => Request::Put { key, value, lease },
            25..=44 => Request::Get {
                key,
                serializable: false,
            },
            45..=59 => Request::Get {
                key,
                serializable: true,
            },
            60..=74 => {
                let seen = last_read.get(&key).copied().flatten();
                let by_mod_revision = rng.below(2) == 0;
                Request::Cas {
                    expect: seen.map(|kv| kv.value),
                    mod_revision: by_mod_revision.then(|| seen.map_or(0, |kv| kv.mod_revision)),
                    key,
                    value,
                    lease,
                }
            }
            75..=84 => Request::Delete { key },
            85..=89 if leases.len() < 2 => Request::LeaseGrant { ttl_s: LEASE_TTL_S },
            90..=93 if !leases.is_empty() => {
                let i = rng.below(leases.len() as u64) as usize;
                Request::LeaseRevoke {
                    lease: leases.swap_remove(i),
                }
            }
            _ => Request::Get {
                key,
                serializable: false,
            },
        };
        let sent_to = incarnation.load(Ordering::SeqCst);
        let invoke = since(start);
        let outcome = match tokio::time::timeout(CALL_TIMEOUT, perform(c, &request)).await {
            Ok(Ok(resp)) => Outcome::Ok(resp),
            Ok(Err(e)) => classify(e),
            Err(_) => Outcome::Unknown("no answer in time".into()),
        };
        let ret = since(start);
        match (&request, &outcome) {
            (Request::Get { key, .. }, Outcome::Ok(Response::Get { kv, .. })) => {
                last_read.insert(key.clone(), *kv);
            }
            (Request::Cas { key, .. }, Outcome::Ok(Response::Cas { current, .. })) => {
                last_read.insert(key.clone(), *current);
            }
            (Request::LeaseGrant { .. }, Outcome::Ok(Response::LeaseGrant { lease, .. })) => {
                leases.push(*lease);
            }
            (_, Outcome::Unknown(_) | Outcome::Failed(_)) if is_transport(&outcome) => {
                // The member may be gone or paused: connect again, after a
                // pause so a dead member is not asked thousands of times.
                client = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => {}
        }
        if let (Request::Put { lease, .. } | Request::Cas { lease, .. }, Outcome::Failed(_)) =
            (&request, &outcome)
        {
            // A lease refused as not found was revoked or expired: stop
            // using it.
            leases.retain(|l| l != lease);
        }
        ops.push(Op {
            client: client_id,
            member,
            incarnation: sent_to,
            invoke,
            ret,
            request,
            outcome,
        });
    }
    ops
}

/// An outcome of the connection rather than of etcd's answer.
fn is_transport(outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Unknown(_) => true,
        Outcome::Failed(text) => text.starts_with("Unavailable"),
        Outcome::Ok(_) => false,
    }
}

async fn perform(c: &mut Client, request: &Request) -> Result<Response, etcd_client::Error> {
    Ok(match request {
        Request::Put { key, value, lease } => {
            let options = (*lease != 0).then(|| PutOptions::new().with_lease(*lease));
            let r = c.put(key.as_str(), encode_value(*value), options).await?;
            Response::Put {
                revision: header_revision(r.header()),
            }
        }
        Request::Get { key, serializable } => {
            let options = serializable.then(|| GetOptions::new().with_serializable());
            let r = c.get(key.as_str(), options).await?;
            Response::Get {
                revision: header_revision(r.header()),
                kv: r.kvs().first().map(kv_of),
            }
        }
        Request::Cas {
            key,
            expect,
            mod_revision,
            value,
            lease,
        } => {
            let compare = match (mod_revision, expect) {
                (Some(rev), _) => Compare::mod_revision(key.as_str(), CompareOp::Equal, *rev),
                (None, Some(v)) => Compare::value(key.as_str(), CompareOp::Equal, encode_value(*v)),
                (None, None) => Compare::version(key.as_str(), CompareOp::Equal, 0),
            };
            let options = (*lease != 0).then(|| PutOptions::new().with_lease(*lease));
            let txn = Txn::new()
                .when([compare])
                .and_then([TxnOp::put(key.as_str(), encode_value(*value), options)])
                .or_else([TxnOp::get(key.as_str(), None)]);
            let r = c.txn(txn).await?;
            let current = r.op_responses().into_iter().find_map(|o| match o {
                TxnOpResponse::Get(g) => Some(g.kvs().first().map(kv_of)),
                _ => None,
            });
            Response::Cas {
                revision: header_revision(r.header()),
                succeeded: r.succeeded(),
                current: current.flatten(),
            }
        }
        Request::Delete { key } => {
            let r = c.delete(key.as_str(), None).await?;
            Response::Delete {
                revision: header_revision(r.header()),
                deleted: r.deleted(),
            }
        }
        Request::LeaseGrant { ttl_s } => {
            let r = c.lease_grant(*ttl_s, None).await?;
            Response::LeaseGrant {
                revision: header_revision(r.header()),
                lease: r.id(),
            }
        }
        Request::LeaseRevoke { lease } => {
            let r = c.lease_revoke(*lease).await?;
            Response::LeaseRevoke {
                revision: header_revision(r.header()),
            }
        }
    })
}

/// One member's watcher from revision 1 with prev_kv, resuming after the
/// last revision it delivered whenever the stream breaks, until it has
/// delivered `until` (set at the end) or `give_up` passes.
async fn watch_loop(
    member: usize,
    endpoint: String,
    until: Arc<AtomicI64>,
    give_up: Arc<Mutex<Option<Instant>>>,
) -> WatchRecord {
    let mut record = WatchRecord {
        member,
        ..WatchRecord::default()
    };
    let mut batch = 0u64;
    let mut started = false;
    let done = |record: &WatchRecord| {
        let target = until.load(Ordering::Relaxed);
        (target > 0 && record.last_revision() >= target)
            || give_up
                .lock()
                .map(|g| g.is_some_and(|t| Instant::now() > t))
                .unwrap_or(true)
    };
    'reconnect: while !done(&record) {
        let Some(mut c) = connect(&endpoint).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let options = WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_start_revision(record.last_revision() + 1);
        let Ok(Ok((_watcher, mut stream))) =
            tokio::time::timeout(CALL_TIMEOUT, c.watch("key/", Some(options))).await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if started {
            record.resumed += 1;
        }
        started = true;
        loop {
            if done(&record) {
                break 'reconnect;
            }
            let message = tokio::time::timeout(Duration::from_millis(500), stream.message()).await;
            let resp = match message {
                Err(_) => continue, // quiet: check whether we are done
                Ok(Ok(Some(resp))) => resp,
                Ok(_) => break, // the stream broke or ended: resume
            };
            if resp.canceled() {
                break;
            }
            batch += 1;
            for e in resp.events() {
                let Some(kv) = e.kv() else { continue };
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let (kind, put) = match e.event_type() {
                    EventType::Put => (EventKind::Put, Some(kv_of(kv))),
                    EventType::Delete => (EventKind::Delete, None),
                };
                record.events.push((
                    batch,
                    Event {
                        revision: kv.mod_revision(),
                        key,
                        kind,
                        kv: put,
                        prev: e.prev_kv().map(kv_of),
                    },
                ));
            }
        }
    }
    record
}

/// Raft IDs and the leader, as members report them in Status.
async fn members_status(cluster: &Mutex<Cluster>) -> (Vec<u64>, Option<usize>) {
    let endpoints: Vec<(String, bool)> = match cluster.lock() {
        Ok(c) => c
            .members
            .iter()
            .map(|m| (m.endpoint(), m.running() && !m.paused()))
            .collect(),
        Err(_) => return (Vec::new(), None),
    };
    let mut ids = vec![0; endpoints.len()];
    let mut leader_id = None;
    for (i, (ep, up)) in endpoints.iter().enumerate() {
        if !up {
            continue;
        }
        let Some(mut c) = connect(ep).await else {
            continue;
        };
        if let Ok(Ok(st)) = tokio::time::timeout(Duration::from_secs(1), c.status()).await {
            ids[i] = st.header().map_or(0, |h| h.member_id());
            if st.leader() != 0 {
                leader_id = Some(st.leader());
            }
        }
    }
    let leader = leader_id.and_then(|l| ids.iter().position(|id| *id == l));
    (ids, leader)
}

/// Faults one at a time (a quorum always stays up, unless `overlap` adds a
/// second one), each undone before the next; favours the leader.
async fn nemesis(
    cluster: Arc<Mutex<Cluster>>,
    settings: Settings,
    start: Instant,
    mut ids: Vec<u64>,
) -> (Vec<Fault>, Vec<String>) {
    let mut rng = Rng::new(settings.seed ^ 0xFA17);
    let mut faults = Vec::new();
    let mut errors = Vec::new();
    let deadline = start + settings.run_for;
    if settings.faults.is_empty() {
        return (faults, errors);
    }
    let n = ids.len();
    loop {
        let wait = rng.between_ms(settings.fault_every_ms.0, settings.fault_every_ms.1);
        if Instant::now() + wait + Duration::from_secs(5) > deadline {
            break;
        }
        tokio::time::sleep(wait).await;
        let kind = settings.faults[rng.below(settings.faults.len() as u64) as usize];
        let (_, leader) = members_status(&cluster).await;
        let member = match leader {
            // A membership change replaces a follower (etcd's runbook:
            // move leadership away first).
            Some(l) if kind == FaultKind::Membership => {
                (l + 1 + rng.below(n as u64 - 1) as usize) % n
            }
            Some(l) if rng.below(3) > 0 => l,
            _ => rng.below(n as u64) as usize,
        };
        let at = since(start);
        let lasted = match kind {
            FaultKind::Kill => rng.between_ms(200, 2000),
            FaultKind::Pause => rng.between_ms(500, 4000),
            FaultKind::Partition => rng.between_ms(1000, 5000),
            FaultKind::Disk => DISK_FAULT_EXIT_LIMIT,
            FaultKind::Membership => Duration::ZERO,
        };
        // A second fault on another member, begun while the first lasts:
        // only a kill or a pause (a partition rewrites every member's fault
        // file; a disk fault holds the cluster for its whole wait).
        let second = (settings.overlap
            && matches!(
                kind,
                FaultKind::Kill | FaultKind::Pause | FaultKind::Partition
            )
            && rng.below(2) == 0)
            .then(|| {
                let other = (member + 1 + rng.below(n as u64 - 1) as usize) % n;
                let kind2 = [FaultKind::Kill, FaultKind::Pause][rng.below(2) as usize];
                let delay = rng.between_ms(0, lasted.as_millis() as u64 / 2);
                (
                    other,
                    kind2,
                    delay,
                    rng.between_ms(200, 2000),
                    Rng::new(rng.next_u64()),
                )
            });
        let mut ids2 = ids.clone();
        let first = inject(
            &cluster, kind, member, leader, lasted, &mut ids, &mut rng, &settings,
        );
        let (detail, second_fault) = match second {
            None => (first.await, None),
            Some((other, kind2, delay, lasted2, mut rng2)) => {
                let (cluster2, settings2) = (cluster.clone(), settings.clone());
                let overlapping = async move {
                    tokio::time::sleep(delay).await;
                    let at = since(start);
                    let detail = inject(
                        &cluster2, kind2, other, leader, lasted2, &mut ids2, &mut rng2, &settings2,
                    )
                    .await;
                    (other, kind2, at, lasted2, detail)
                };
                let (detail, second) = tokio::join!(first, overlapping);
                (detail, Some(second))
            }
        };
        // The second fault is always on another member than the first.
        let first_member = member;
        let mut back = Vec::new();
        for (member, kind, at, lasted, detail) in
            std::iter::once((member, kind, at, lasted, detail)).chain(second_fault)
        {
            let detail = detail.unwrap_or_else(|e| {
                errors.push(e);
                String::new()
            });
            let detail = match (member == first_member, detail.is_empty()) {
                (true, _) => detail,
                (false, true) => format!("overlapping the fault on member {first_member}"),
                (false, false) => {
                    format!("overlapping the fault on member {first_member}: {detail}")
                }
            };
            faults.push(Fault {
                kind,
                member,
                was_leader: leader == Some(member),
                at,
                lasted,
                detail,
            });
            back.push((member, kind));
        }
        // Let the members rejoin before the next fault.
        for (member, kind) in back {
            let member_back = tokio::task::spawn_blocking({
                let cluster = cluster.clone();
                move || {
                    lock(&cluster)?
                        .wait_healthy(member, Duration::from_secs(30))
                        .map_err(|e| e.to_string())
                }
            })
            .await;
            match member_back {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(format!("after {}: {e}", kind.name())),
                Err(e) => errors.push(e.to_string()),
            }
        }
    }
    (faults, errors)
}

/// The cluster, for one step of a fault; a poisoned lock is an error like
/// any other.
fn lock(cluster: &Mutex<Cluster>) -> Result<std::sync::MutexGuard<'_, Cluster>, String> {
    cluster
        .lock()
        .map_err(|_| "cluster lock poisoned".to_string())
}

/// Does fault `kind` to `member` and undoes it; what happened where it
/// varies (a disk fault fired or not, the member IDs of a replacement).
#[allow(clippy::too_many_arguments)]
async fn inject(
    cluster: &Arc<Mutex<Cluster>>,
    kind: FaultKind,
    member: usize,
    leader: Option<usize>,
    lasted: Duration,
    ids: &mut [u64],
    rng: &mut Rng,
    settings: &Settings,
) -> Result<String, String> {
    match kind {
        FaultKind::Kill => {
            lock(cluster)?.kill9(member);
            tokio::time::sleep(lasted).await;
            lock(cluster)?.spawn(member).map_err(|e| e.to_string())?;
            Ok(String::new())
        }
        FaultKind::Pause => {
            lock(cluster)?.pause(member);
            tokio::time::sleep(lasted).await;
            lock(cluster)?.resume(member);
            Ok(String::new())
        }
        FaultKind::Partition => {
            // A cut that could not be written is healed below all the same.
            let _ = lock(cluster)?.isolate(Some(member), ids);
            tokio::time::sleep(lasted).await;
            lock(cluster)?
                .isolate(None, ids)
                .map_err(|e| e.to_string())?;
            Ok(String::new())
        }
        FaultKind::Disk => {
            let armed = disk_fault(rng, &settings.engine);
            let cluster = cluster.clone();
            tokio::task::spawn_blocking(move || disk_fault_on(&cluster, member, &armed))
                .await
                .map_err(|e| e.to_string())?
        }
        FaultKind::Membership => replace_member(cluster, ids, member, leader).await,
    }
}

/// Replaces follower `member` with a new member on the same ports: kill -9,
/// MemberRemove, wipe, MemberAdd as a learner, start (joining), then
/// MemberPromote once the learner is in sync (bounded retries).
async fn replace_member(
    cluster: &Arc<Mutex<Cluster>>,
    ids: &mut [u64],
    member: usize,
    leader: Option<usize>,
) -> Result<String, String> {
    let Some(leader) = leader.filter(|l| *l != member) else {
        return Ok("no leader to ask: skipped".into());
    };
    let (leader_ep, peer_url) = {
        let mut c = lock(cluster)?;
        c.kill9(member);
        (c.members[leader].endpoint(), c.members[member].peer_url())
    };
    let old = ids[member];
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut admin = None;
    let mut step = "remove";
    let mut new_id = 0;
    while Instant::now() < deadline {
        if admin.is_none() {
            admin = connect(&leader_ep).await;
        }
        let Some(a) = admin.as_mut() else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let done = match step {
            "remove" => match tokio::time::timeout(CALL_TIMEOUT, a.member_remove(old)).await {
                Ok(Ok(_)) => true,
                // Removed by an earlier try whose answer was lost.
                Ok(Err(e)) if e.to_string().contains("member not found") => true,
                _ => false,
            },
            "add" => {
                let options = etcd_client::MemberAddOptions::new().with_is_learner();
                match tokio::time::timeout(
                    CALL_TIMEOUT,
                    a.member_add([peer_url.as_str()], Some(options)),
                )
                .await
                {
                    Ok(result) => {
                        new_id = match result {
                            Ok(r) => r.member().map_or(0, |m| m.id()),
                            // Added by an earlier try whose answer was lost.
                            Err(e) if e.to_string().contains("exists") => {
                                match a.member_list().await {
                                    Ok(list) => list
                                        .members()
                                        .iter()
                                        .find(|m| m.peer_urls().contains(&peer_url))
                                        .map_or(0, |m| m.id()),
                                    Err(_) => 0,
                                }
                            }
                            Err(_) => 0,
                        };
                        if new_id == 0 {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            continue;
                        }
                        let mut c = lock(cluster)?;
                        c.wipe_for_rejoin(member).map_err(|e| e.to_string())?;
                        c.spawn(member).map_err(|e| e.to_string())?;
                        // The slot holds the learner from here on: a later
                        // replacement must remove it, not wipe it while it
                        // is still a member (which the member refuses, as
                        // it should, once its leader counts entries on it).
                        ids[member] = new_id;
                        true
                    }
                    Err(_) => false,
                }
            }
            _ => matches!(
                tokio::time::timeout(CALL_TIMEOUT, a.member_promote(new_id)).await,
                Ok(Ok(_))
            ),
        };
        if done {
            step = match step {
                "remove" => "add",
                "add" => "promote",
                _ => {
                    return Ok(format!(
                        "member {old:x} replaced by {new_id:x} (learner, promoted)"
                    ));
                }
            };
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Err(format!(
        "replacing member {member} ({old:x}) stuck at {step} for 30 s"
    ))
}

/// How long a member restarted with a disk fault may keep running before
/// the fault fires and it stops.
const DISK_FAULT_EXIT_LIMIT: Duration = Duration::from_secs(15);

/// A disk fault to arm (`FAILPOINTS`), firing after a seeded number of
/// passes so the member first rejoins and takes writes.
fn disk_fault(rng: &mut Rng, engine: &str) -> String {
    let after = 20 + rng.below(400);
    let mut choices = vec![
        "wal::fdatasync=return",
        "wal::write=return(enospc)",
        "wal::write=return(torn)",
    ];
    if engine == "btree" {
        choices.push("btree::commit::after_data_sync=return");
    }
    let (point, action) = choices[rng.below(choices.len() as u64) as usize]
        .split_once('=')
        .unwrap_or(("wal::fdatasync", "return"));
    format!("{point}={after}*off->{action}")
}

/// Restarts `member` with `armed`; it must stop by itself once the fault
/// fires (a poisoned WAL or engine serves nothing more); then it restarts
/// clean.
fn disk_fault_on(cluster: &Mutex<Cluster>, member: usize, armed: &str) -> Result<String, String> {
    let mut c = lock(cluster)?;
    c.kill9(member);
    let from = c.log_len(member);
    c.spawn_with_failpoints(member, Some(armed))
        .map_err(|e| e.to_string())?;
    let exited = c.wait_exit(member, DISK_FAULT_EXIT_LIMIT);
    let log = c.log_since(member, from);
    let fired = log.contains("injected") || log.contains("fatal:");
    let result = match exited {
        None if fired => Err(format!(
            "member {member} kept running {} s after its disk failed ({armed})",
            DISK_FAULT_EXIT_LIMIT.as_secs()
        )),
        Some(_) if log.contains("panicked") => Err(format!(
            "member {member} panicked on a disk fault ({armed}):\n{log}"
        )),
        Some(status) => Ok(format!(
            "{armed}: stopped ({status}): {}",
            log.lines()
                .find(|l| l.contains("fatal:"))
                .unwrap_or("no reason logged")
        )),
        // Not fired in time (a quiet member): no fault, just a restart.
        None => Ok(format!("{armed}: did not fire")),
    };
    c.kill9(member);
    c.spawn(member).map_err(|e| e.to_string())?;
    result
}

/// Each member's serializable view of the keys, once every member is at
/// the same revision (bounded wait), with HashKV at that revision.
async fn converge(endpoints: &[String], errors: &mut Vec<String>) -> Vec<FinalState> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut finals: Vec<FinalState>;
    loop {
        finals = Vec::new();
        for (member, ep) in endpoints.iter().enumerate() {
            let Some(mut c) = connect(ep).await else {
                continue;
            };
            let options = GetOptions::new().with_prefix().with_serializable();
            if let Ok(Ok(r)) =
                tokio::time::timeout(CALL_TIMEOUT, c.get("key/", Some(options))).await
            {
                finals.push(FinalState {
                    member,
                    revision: header_revision(r.header()),
                    kvs: r
                        .kvs()
                        .iter()
                        .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv_of(kv)))
                        .collect(),
                    hash: None,
                });
            }
        }
        let same = finals.len() == endpoints.len()
            && finals.windows(2).all(|w| w[0].revision == w[1].revision);
        if same {
            break;
        }
        if Instant::now() > deadline {
            errors.push(format!(
                "members did not converge in 30 s: (member, revision) {:?}",
                finals
                    .iter()
                    .map(|f| (f.member, f.revision))
                    .collect::<Vec<_>>()
            ));
            return finals;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for f in &mut finals {
        if let Some(mut c) = connect(&endpoints[f.member]).await {
            if let Ok(Ok(h)) = tokio::time::timeout(CALL_TIMEOUT, c.hash_kv(f.revision)).await {
                f.hash = Some(h.hash());
            }
        }
    }
    finals
}

/// Runs the clients, watchers and faults against `cluster`, then heals
/// everything, waits for convergence and returns what was seen.
pub fn run(cluster: Cluster, settings: &Settings) -> Run {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return Run {
                history: History::default(),
                faults: Vec::new(),
                run_errors: vec![format!("tokio runtime: {e}")],
            }
        }
    };
    let endpoints: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let incarnations: Vec<Arc<AtomicU32>> = cluster
        .members
        .iter()
        .map(|m| m.incarnation.clone())
        .collect();
    let cluster = Arc::new(Mutex::new(cluster));
    runtime.block_on(async move {
        let start = Instant::now();
        let watch_until = Arc::new(AtomicI64::new(0));
        let give_up = Arc::new(Mutex::new(None));
        let (ids, _) = members_status(&cluster).await;
        let watchers: Vec<_> = endpoints
            .iter()
            .enumerate()
            .map(|(m, ep)| {
                tokio::spawn(watch_loop(
                    m,
                    ep.clone(),
                    watch_until.clone(),
                    give_up.clone(),
                ))
            })
            .collect();
        let clients: Vec<_> = (0..settings.clients)
            .map(|c| {
                let member = c as usize % endpoints.len();
                tokio::spawn(client_loop(
                    c,
                    member,
                    incarnations[member].clone(),
                    endpoints[member].clone(),
                    settings.clone(),
                    start,
                ))
            })
            .collect();
        let (faults, mut run_errors) =
            nemesis(cluster.clone(), settings.clone(), start, ids.clone()).await;
        let mut ops = Vec::new();
        for c in clients {
            match c.await {
                Ok(mut mine) => ops.append(&mut mine),
                Err(e) => run_errors.push(format!("client task: {e}")),
            }
        }
        // Heal whatever is left (nothing should be), then converge.
        if let Ok(mut c) = cluster.lock() {
            let _ = c.isolate(None, &ids);
            for (name, status) in c.crashed() {
                run_errors.push(format!("member {name} exited by itself: {status}"));
            }
            for i in 0..c.members.len() {
                if c.members[i].paused() {
                    c.resume(i);
                }
                if !c.members[i].running() {
                    if let Err(e) = c.spawn(i) {
                        run_errors.push(e.to_string());
                    }
                }
            }
        }
        let finals = converge(&endpoints, &mut run_errors).await;
        let target = finals.iter().map(|f| f.revision).max().unwrap_or(0);
        watch_until.store(target.max(1), Ordering::Relaxed);
        if let Ok(mut g) = give_up.lock() {
            *g = Some(Instant::now() + Duration::from_secs(30));
        }
        let mut watches = Vec::new();
        for w in watchers {
            match w.await {
                Ok(record) => {
                    if record.last_revision() < target {
                        run_errors.push(format!(
                            "watcher on member {} reached revision {} of {target} in 30 s",
                            record.member,
                            record.last_revision()
                        ));
                    }
                    watches.push(record);
                }
                Err(e) => run_errors.push(format!("watcher task: {e}")),
            }
        }
        ops.sort_by_key(|o| (o.invoke, o.client));
        Run {
            history: History {
                ops,
                watches,
                finals,
            },
            faults,
            run_errors,
        }
    })
}
