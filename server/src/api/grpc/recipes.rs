//! etcd's Lock and Election services (`v3lockpb`, `v3electionpb`): the
//! server side of clientv3's concurrency recipes, for clients that would
//! rather call an RPC than run the recipe (the Rust `etcd-client`'s
//! `lock`/`campaign`, grpc-gateway's `/v3/lock/*` and `/v3/election/*`).
//!
//! Built only from what any client has — KV, Lease and Watch with the
//! caller's token — exactly as etcd 3.4 builds them on an in-process
//! client: a lock or a leadership is a key under `<name>/` named after its
//! lease (`%x`), and the oldest such key (lowest create revision) holds it.
//! So it keeps no state of its own, needs no log entries of its own, and a
//! lock taken here and one taken by `etcdctl lock` exclude each other.
//!
//! As in etcd 3.4, every error is answered with gRPC code Unknown and
//! etcd's text: its in-process client turns status errors into plain ones
//! (`etcdserver: requested lease not found` arrives as code 2, not 5).
//!
//! Must never: keep a waiter's key once its caller stopped waiting. A
//! Lock or Campaign abandoned while it waits for older holders deletes
//! (resigns) its key, as etcd's does when the request's context ends, and
//! so does one whose answer found nobody to take it. (As with etcd, a
//! caller gone during the first txn may leave its key; its lease ends it.)

use std::future::Future;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use futures_lite::StreamExt;
use send_wrapper::SendWrapper;
use tonic::{Code, Request, Response, Status};

use super::convert::{self, HeaderInfo};
use super::pb::etcdserverpb as pb;
use super::pb::mvccpb;
use super::pb::v3electionpb as epb;
use super::pb::v3lockpb as lpb;
use super::service::{here, register_watch, status_of, token_of, BoxStream, Shared};
use crate::auth::{Need, Requirement};
use crate::error::ServerError;
use crate::mvcc;
use crate::watch::{WatchHub, WatchSpec};

/// The TTL of the lease a Lock or Campaign without one gets (clientv3
/// concurrency's default session TTL). Nobody keeps it alive: the key goes
/// 60 s later unless the caller unlocks first, as with etcd.
const SESSION_TTL_SECS: i64 = 60;

const NOT_LEADER: &str = "election: not leader";
const NO_LEADER: &str = "election: no leader";
const MISSING_LEADER_KEY: &str = "\"leader\" field must be provided";

/// What etcd's Lock and Election servers answer for an error of the
/// operations they are built from.
fn recipe_error(status: Status) -> Status {
    Status::new(Code::Unknown, status.message().to_string())
}

fn unknown(message: &str) -> Status {
    Status::new(Code::Unknown, message.to_string())
}

/// Go's `%x` of a lease ID (a minus sign, not two's complement).
fn lease_hex(lease: i64) -> String {
    if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    }
}

/// `<name>/`: every key of the lock or election lives under it.
fn key_prefix(name: &[u8]) -> Bytes {
    let mut prefix = BytesMut::with_capacity(name.len() + 1);
    prefix.extend_from_slice(name);
    prefix.extend_from_slice(b"/");
    prefix.freeze()
}

/// The key a session with `lease` holds under `prefix`.
fn owner_key(prefix: &[u8], lease: i64) -> Bytes {
    let mut key = BytesMut::from(prefix);
    key.extend_from_slice(lease_hex(lease).as_bytes());
    key.freeze()
}

/// clientv3's `WithFirstCreate` (`first == true`) or `WithLastCreate` over
/// `prefix`: the one key created first or last.
fn by_create(prefix: &Bytes, first: bool) -> mvcc::RangeRequest {
    mvcc::RangeRequest {
        key: prefix.clone(),
        range_end: Bytes::from(crate::api::http::prefix_end(prefix)),
        limit: 1,
        sort_order: if first {
            mvcc::SortOrder::Ascend
        } else {
            mvcc::SortOrder::Descend
        },
        sort_target: mvcc::SortTarget::Create,
        ..Default::default()
    }
}

fn get(key: &Bytes) -> mvcc::RequestOp {
    mvcc::RequestOp::Range(mvcc::RangeRequest {
        key: key.clone(),
        ..Default::default()
    })
}

fn put(key: &Bytes, value: Bytes, lease: i64) -> mvcc::RequestOp {
    mvcc::RequestOp::Put(mvcc::PutRequest {
        key: key.clone(),
        value,
        lease,
        ..Default::default()
    })
}

/// `key`'s create revision is `rev` (0: the key does not exist).
fn created_at(key: &Bytes, rev: i64) -> mvcc::Compare {
    mvcc::Compare {
        result: mvcc::CompareResult::Equal,
        target: mvcc::CompareTarget::Create,
        key: key.clone(),
        range_end: Bytes::new(),
        target_union: mvcc::TargetUnion::CreateRevision(rev),
    }
}

/// The kvs of a txn's `i`th response, if it was a range.
fn kvs_of(resp: &mvcc::TxnResponse, i: usize) -> &[mvcc::KeyValue] {
    match resp.responses.get(i) {
        Some(mvcc::ResponseOp::Range(r)) => &r.kvs,
        _ => &[],
    }
}

/// The operations the recipes are built from, as the caller behind
/// `token` (every one checked as that caller's own request would be).
/// Lives on one shard: clone it into the tasks it spawns.
#[derive(Clone)]
struct Client {
    shared: Shared,
    hub: Rc<WatchHub>,
    token: Option<String>,
}

/// A watch of this shard's hub for the recipes' own use; removed from the
/// hub when dropped.
struct OwnWatch {
    hub: Rc<WatchHub>,
    stream: u64,
    responses: crate::watch::WatchIn,
}

impl Drop for OwnWatch {
    fn drop(&mut self) {
        self.hub.remove_stream(self.stream);
    }
}

impl OwnWatch {
    /// The next response with events; `Err` once the watch was cancelled
    /// (compaction) or ended.
    async fn next_events(&mut self) -> Result<pb::WatchResponse, Status> {
        loop {
            let Some(resp) = self.responses.next().await else {
                return Err(unknown("lost watcher"));
            };
            if resp.canceled {
                return Err(if resp.compact_revision != 0 {
                    recipe_error(status_of(&ServerError::Mvcc(mvcc::MvccError::Compacted)))
                } else {
                    unknown(&resp.cancel_reason)
                });
            }
            if !resp.events.is_empty() {
                return Ok(resp);
            }
        }
    }
}

fn is_delete(e: &mvccpb::Event) -> bool {
    e.r#type == mvccpb::event::EventType::Delete as i32
}

impl Client {
    /// The lease a session uses: `lease`, or a new one of 60 s for 0
    /// (clientv3's `NewSession`; an unknown lease fails at the put).
    async fn session_lease(&self, lease: i64) -> Result<i64, Status> {
        if lease != 0 {
            return Ok(lease);
        }
        let granted = here(self.shared.owner().lease_grant(0, SESSION_TTL_SECS)).await;
        match granted {
            Ok(((id, _, _), _)) => Ok(id),
            Err(e) => Err(recipe_error(status_of(&e))),
        }
    }

    async fn txn(
        &self,
        compare: mvcc::Compare,
        success: Vec<mvcc::RequestOp>,
        failure: Vec<mvcc::RequestOp>,
    ) -> Result<(mvcc::TxnResponse, HeaderInfo), Status> {
        let txn = mvcc::TxnRequest {
            compare: vec![compare],
            success,
            failure,
        };
        // etcd checks its own client's requests too: a leadership without
        // a key is "key is not provided", never a write of the empty key.
        mvcc::validate_txn(&txn, self.shared.max_txn_ops())
            .map_err(|e| recipe_error(status_of(&ServerError::Mvcc(e))))?;
        match self
            .shared
            .write(mvcc::Request::Txn(txn), self.token.clone())
            .await
        {
            Ok((mvcc::Response::Txn(r), h)) => Ok((r, h)),
            Ok(_) => Err(recipe_error(status_of(&ServerError::Stopped))),
            Err(status) => Err(recipe_error(status)),
        }
    }

    async fn range(
        &self,
        req: mvcc::RangeRequest,
    ) -> Result<(mvcc::RangeResponse, HeaderInfo), Status> {
        match self.shared.range(req, self.token.clone()).await {
            (Ok(r), term) => Ok((r, self.shared.header(term))),
            (Err(e), _) => Err(recipe_error(status_of(&e))),
        }
    }

    async fn delete(&self, key: Bytes) -> Result<Option<pb::ResponseHeader>, Status> {
        let req = mvcc::DeleteRangeRequest {
            key,
            ..Default::default()
        };
        mvcc::validate_delete_range(&req)
            .map_err(|e| recipe_error(status_of(&ServerError::Mvcc(e))))?;
        let token = self.token.clone();
        match self
            .shared
            .write(mvcc::Request::DeleteRange(req), token)
            .await
        {
            Ok((resp, h)) => Ok(h.header(resp.header().revision)),
            Err(status) => Err(recipe_error(status)),
        }
    }

    /// Watches `key` (or the range to `range_end`) from `start` on.
    async fn watch(&self, key: Bytes, range_end: Bytes, start: i64) -> Result<OwnWatch, Status> {
        self.shared
            .authorize(self.token.clone(), || {
                Requirement::Keys(vec![Need::read(&key, &range_end)])
            })
            .await
            .map_err(recipe_error)?;
        let stream = self.hub.new_stream();
        let (out, responses) = crate::watch::watch_channel(&self.hub, stream);
        let watch = OwnWatch {
            hub: self.hub.clone(),
            stream,
            responses,
        };
        let spec = WatchSpec {
            key,
            range_end,
            no_put: false,
            no_delete: false,
            prev_kv: false,
            progress_notify: false,
            fragment: false,
        };
        let id = (watch.stream, 0);
        match register_watch(&self.shared, &self.hub, id, spec, start, out).await {
            Ok((history, upto)) => {
                self.hub.finish_sync(id.0, id.1, &history, upto);
                Ok(watch)
            }
            Err(e) => Err(recipe_error(status_of(&e))),
        }
    }

    /// clientv3 concurrency's `waitDelete`: until `key` is deleted at or
    /// after revision `rev`.
    async fn wait_delete(&self, key: Bytes, rev: i64) -> Result<(), Status> {
        let mut watch = self.watch(key, Bytes::new(), rev).await?;
        loop {
            if watch.next_events().await?.events.iter().any(is_delete) {
                return Ok(());
            }
        }
    }

    /// clientv3 concurrency's `waitDeletes`: until no key under `prefix`
    /// created at or before `max_create_rev` is left; answers the header
    /// of the read that found none.
    async fn wait_deletes(
        &self,
        prefix: &Bytes,
        max_create_rev: i64,
    ) -> Result<Option<pb::ResponseHeader>, Status> {
        loop {
            let mut req = by_create(prefix, false);
            req.max_create_revision = max_create_rev;
            let (resp, h) = self.range(req).await?;
            match resp.kvs.into_iter().next() {
                None => return Ok(h.header(resp.header.revision)),
                Some(last) => self.wait_delete(last.key, resp.header.revision).await?,
            }
        }
    }

    /// Deletes the leadership `key` if it is still the one created at
    /// `rev` (clientv3's `Election.Resign`); answers that txn's header.
    async fn resign(&self, key: &Bytes, rev: i64) -> Result<Option<pb::ResponseHeader>, Status> {
        let delete = mvcc::RequestOp::DeleteRange(mvcc::DeleteRangeRequest {
            key: key.clone(),
            ..Default::default()
        });
        let (resp, h) = self.txn(created_at(key, rev), vec![delete], vec![]).await?;
        Ok(h.header(resp.header.revision))
    }

    /// Puts `value` on the leadership `key` if it is still the one created
    /// at `rev` (clientv3's `Election.Proclaim`).
    async fn proclaim(
        &self,
        key: &Bytes,
        rev: i64,
        lease: i64,
        value: Bytes,
    ) -> Result<Option<pb::ResponseHeader>, Status> {
        let (resp, h) = self
            .txn(created_at(key, rev), vec![put(key, value, lease)], vec![])
            .await?;
        if !resp.succeeded {
            return Err(unknown(NOT_LEADER));
        }
        Ok(h.header(resp.header.revision))
    }

    /// clientv3 concurrency's `Mutex.Lock`: answers the header and the
    /// ownership key once the caller holds the lock.
    async fn lock(&self, name: &[u8], lease: i64) -> Result<lpb::LockResponse, Status> {
        let lease = self.session_lease(lease).await?;
        let prefix = key_prefix(name);
        let key = owner_key(&prefix, lease);
        let owner = mvcc::RequestOp::Range(by_create(&prefix, true));
        // Join the waiters (or find our key from an earlier Lock with the
        // same lease) and learn the holder in the same round trip.
        let (resp, h) = self
            .txn(
                created_at(&key, 0),
                vec![put(&key, Bytes::new(), lease), owner.clone()],
                vec![get(&key), owner],
            )
            .await?;
        let my_rev = if resp.succeeded {
            resp.header.revision
        } else {
            kvs_of(&resp, 0)
                .first()
                .map_or(resp.header.revision, |kv| kv.create_revision)
        };
        let holder = kvs_of(&resp, 1).first().map(|kv| kv.create_revision);
        if holder.is_none_or(|rev| rev == my_rev) {
            return Ok(lpb::LockResponse {
                header: h.header(resp.header.revision),
                key,
            });
        }
        // Wait for every older waiter; a caller that goes away meanwhile
        // leaves the queue (its key is deleted).
        let waiter = self.clone();
        let (wait_prefix, cleanup, cleanup_key) = (prefix.clone(), self.clone(), key.clone());
        let header = unless_abandoned(
            async move { waiter.wait_deletes(&wait_prefix, my_rev - 1).await },
            async move {
                let _ = cleanup.delete(cleanup_key).await;
            },
        )
        .await;
        match header {
            Some(Ok(header)) => Ok(lpb::LockResponse { header, key }),
            Some(Err(e)) => {
                let _ = self.delete(key).await;
                Err(e)
            }
            None => Err(Status::cancelled("context canceled")),
        }
    }

    /// clientv3 concurrency's `Election.Campaign`.
    async fn campaign(&self, req: epb::CampaignRequest) -> Result<epb::CampaignResponse, Status> {
        let lease = self.session_lease(req.lease).await?;
        let prefix = key_prefix(&req.name);
        let key = owner_key(&prefix, lease);
        let (resp, h) = self
            .txn(
                created_at(&key, 0),
                vec![put(&key, req.value.clone(), lease)],
                vec![get(&key)],
            )
            .await?;
        let mut rev = resp.header.revision;
        if !resp.succeeded {
            if let Some(kv) = kvs_of(&resp, 0).first() {
                rev = kv.create_revision;
                if kv.value != req.value {
                    if let Err(e) = self.proclaim(&key, rev, lease, req.value.clone()).await {
                        let _ = self.resign(&key, rev).await;
                        return Err(e);
                    }
                }
            }
        }
        let waiter = self.clone();
        let (wait_prefix, cleanup, cleanup_key) = (prefix.clone(), self.clone(), key.clone());
        let waited = unless_abandoned(
            async move { waiter.wait_deletes(&wait_prefix, rev - 1).await },
            async move {
                let _ = cleanup.resign(&cleanup_key, rev).await;
            },
        )
        .await;
        match waited {
            Some(Ok(_)) => Ok(epb::CampaignResponse {
                header: h.header(resp.header.revision),
                leader: Some(epb::LeaderKey {
                    name: req.name,
                    key,
                    rev,
                    lease,
                }),
            }),
            Some(Err(e)) => Err(e),
            None => Err(Status::cancelled("context canceled")),
        }
    }

    /// clientv3 concurrency's `Election.Leader`.
    async fn leader(&self, name: &[u8]) -> Result<epb::LeaderResponse, Status> {
        let (resp, h) = self.range(by_create(&key_prefix(name), true)).await?;
        let Some(kv) = resp.kvs.into_iter().next() else {
            return Err(unknown(NO_LEADER));
        };
        Ok(epb::LeaderResponse {
            header: h.header(resp.header.revision),
            kv: Some(convert::key_value(kv)),
        })
    }

    /// clientv3 concurrency's `Election.observe`: sends every value the
    /// election's leaders post, in order, until `out` is closed or a read
    /// or watch fails.
    async fn observe(
        &self,
        name: &[u8],
        out: &futures_channel::mpsc::UnboundedSender<Result<epb::LeaderResponse, Status>>,
    ) {
        let prefix = key_prefix(name);
        let send = |header, kv| {
            out.unbounded_send(Ok(epb::LeaderResponse {
                header,
                kv: Some(kv),
            }))
            .is_ok()
        };
        loop {
            let Ok((resp, h)) = self.range(by_create(&prefix, true)).await else {
                return;
            };
            let (header, kv) = match resp.kvs.into_iter().next() {
                Some(kv) => (h.header(resp.header.revision), convert::key_value(kv)),
                None => {
                    // No leader yet: the first put under the prefix is one.
                    let end = Bytes::from(crate::api::http::prefix_end(&prefix));
                    let Ok(mut watch) = self.watch(prefix.clone(), end, resp.header.revision).await
                    else {
                        return;
                    };
                    let found = loop {
                        let Ok(wr) = watch.next_events().await else {
                            return;
                        };
                        let first_put = wr.events.into_iter().find(|e| !is_delete(e));
                        if let Some(kv) = first_put.and_then(|e| e.kv) {
                            let header = wr.header.map(|mut hd| {
                                hd.revision = kv.mod_revision;
                                hd
                            });
                            break (header, kv);
                        }
                    };
                    found
                }
            };
            let from = header.as_ref().map_or(0, |hd| hd.revision) + 1;
            let key = kv.key.clone();
            if !send(header, kv) {
                return;
            }
            // Follow this leader's key until it goes.
            let Ok(mut watch) = self.watch(key, Bytes::new(), from).await else {
                return;
            };
            'leader: loop {
                let Ok(wr) = watch.next_events().await else {
                    return;
                };
                for event in wr.events {
                    if is_delete(&event) {
                        break 'leader;
                    }
                    if let Some(kv) = event.kv {
                        if !send(wr.header, kv) {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// Runs `work` in a task of its own and answers its outcome; when the
/// caller stops waiting (the RPC was cancelled: its future is dropped)
/// before `work` finished, or finished in the moment nobody listened any
/// more, `work` is dropped and `on_abandon` runs instead. `None` only if
/// the task itself went away.
async fn unless_abandoned<T: 'static>(
    work: impl Future<Output = T> + 'static,
    on_abandon: impl Future<Output = ()> + 'static,
) -> Option<T> {
    let (mut answer, outcome) = futures_channel::oneshot::channel();
    glommio::spawn_local(async move {
        let finished = {
            let gone = answer.cancellation();
            futures_lite::future::or(async { Some(work.await) }, async {
                gone.await;
                None
            })
            .await
        };
        let delivered = match finished {
            Some(value) => answer.send(value).is_ok(),
            None => false,
        };
        if !delivered {
            on_abandon.await;
        }
    })
    .detach();
    outcome.await.ok()
}

/// What both services hold: the shard's state, used from inside it.
#[derive(Clone)]
struct Recipes {
    shared: Shared,
    hub: SendWrapper<Rc<WatchHub>>,
}

impl Recipes {
    /// `f`'s future with a [`Client`] for the caller behind `token`,
    /// wrapped for the generated (`Send`) service code: it runs on this
    /// shard, as every task here does.
    fn with_client<R, Fut>(
        &self,
        token: Option<String>,
        f: impl FnOnce(Client) -> Fut,
    ) -> SendWrapper<Fut>
    where
        Fut: Future<Output = Result<R, Status>>,
    {
        SendWrapper::new(f(Client {
            shared: self.shared.clone(),
            hub: (*self.hub).clone(),
            token,
        }))
    }
}

/// etcd's `v3lockpb.Lock` service.
#[derive(Clone)]
pub struct LockService(Recipes);

impl LockService {
    pub(super) fn new(shared: Shared, hub: Rc<WatchHub>) -> LockService {
        LockService(Recipes {
            shared,
            hub: SendWrapper::new(hub),
        })
    }
}

#[tonic::async_trait]
impl lpb::lock_server::Lock for LockService {
    async fn lock(
        &self,
        request: Request<lpb::LockRequest>,
    ) -> Result<Response<lpb::LockResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        let resp = self
            .0
            .with_client(token, |client| async move {
                client.lock(&r.name, r.lease).await
            })
            .await?;
        Ok(Response::new(resp))
    }

    async fn unlock(
        &self,
        request: Request<lpb::UnlockRequest>,
    ) -> Result<Response<lpb::UnlockResponse>, Status> {
        let token = token_of(&request);
        let key = request.into_inner().key;
        let header = self
            .0
            .with_client(token, |client| async move { client.delete(key).await })
            .await?;
        Ok(Response::new(lpb::UnlockResponse { header }))
    }
}

/// etcd's `v3electionpb.Election` service.
#[derive(Clone)]
pub struct ElectionService(Recipes);

impl ElectionService {
    pub(super) fn new(shared: Shared, hub: Rc<WatchHub>) -> ElectionService {
        ElectionService(Recipes {
            shared,
            hub: SendWrapper::new(hub),
        })
    }
}

/// The `leader` of a Proclaim or Resign, which etcd requires.
fn leader_key(leader: Option<&epb::LeaderKey>) -> Result<&epb::LeaderKey, Status> {
    leader.ok_or_else(|| unknown(MISSING_LEADER_KEY))
}

#[tonic::async_trait]
impl epb::election_server::Election for ElectionService {
    type ObserveStream = BoxStream<epb::LeaderResponse>;

    async fn campaign(
        &self,
        request: Request<epb::CampaignRequest>,
    ) -> Result<Response<epb::CampaignResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        let resp = self
            .0
            .with_client(token, |client| async move { client.campaign(r).await })
            .await?;
        Ok(Response::new(resp))
    }

    async fn proclaim(
        &self,
        request: Request<epb::ProclaimRequest>,
    ) -> Result<Response<epb::ProclaimResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        let header = self
            .0
            .with_client(token, |client| async move {
                let leader = leader_key(r.leader.as_ref())?;
                // etcd resumes the election in a session on the leader's
                // lease (a new one for 0) and proclaims with that lease.
                let lease = client.session_lease(leader.lease).await?;
                client
                    .proclaim(&leader.key, leader.rev, lease, r.value.clone())
                    .await
            })
            .await?;
        Ok(Response::new(epb::ProclaimResponse { header }))
    }

    async fn leader(
        &self,
        request: Request<epb::LeaderRequest>,
    ) -> Result<Response<epb::LeaderResponse>, Status> {
        let token = token_of(&request);
        let name = request.into_inner().name;
        let resp = self
            .0
            .with_client(token, |client| async move { client.leader(&name).await })
            .await?;
        Ok(Response::new(resp))
    }

    async fn observe(
        &self,
        request: Request<epb::LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let (out, responses) = futures_channel::mpsc::unbounded();
        let (hang_up, on_hang_up) = futures_channel::oneshot::channel::<()>();
        let token = token_of(&request);
        let name = request.into_inner().name;
        let task = self
            .0
            .with_client(token, |client| async move {
                glommio::spawn_local(async move {
                    // Ends with the client (the response stream holds
                    // `hang_up`) or when a read or watch fails.
                    futures_lite::future::or(client.observe(&name, &out), async {
                        let _ = on_hang_up.await;
                    })
                    .await;
                })
                .detach();
                Ok(())
            })
            .await;
        task?;
        Ok(Response::new(Box::pin(futures_lite::StreamExt::map(
            responses,
            move |r| {
                let _ = &hang_up;
                r
            },
        ))))
    }

    async fn resign(
        &self,
        request: Request<epb::ResignRequest>,
    ) -> Result<Response<epb::ResignResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        let header = self
            .0
            .with_client(token, |client| async move {
                let leader = leader_key(r.leader.as_ref())?;
                client.session_lease(leader.lease).await?;
                client.resign(&leader.key, leader.rev).await
            })
            .await?;
        Ok(Response::new(epb::ResignResponse { header }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_named_as_clientv3_names_them() {
        assert_eq!(lease_hex(0x694d_a21c_7636_6405), "694da21c76366405");
        assert_eq!(lease_hex(-255), "-ff");
        let prefix = key_prefix(b"mylock");
        assert_eq!(&prefix[..], b"mylock/");
        assert_eq!(&owner_key(&prefix, 255)[..], b"mylock/ff");
        assert_eq!(&key_prefix(b"")[..], b"/");
    }

    #[test]
    fn the_holder_is_the_oldest_key_under_the_prefix() {
        let first = by_create(&key_prefix(b"l"), true);
        assert_eq!(&first.key[..], b"l/");
        assert_eq!(&first.range_end[..], b"l0");
        assert_eq!(first.limit, 1);
        assert_eq!(first.sort_target, mvcc::SortTarget::Create);
        assert_eq!(first.sort_order, mvcc::SortOrder::Ascend);
        let last = by_create(&key_prefix(b"l"), false);
        assert_eq!(last.sort_order, mvcc::SortOrder::Descend);
    }

    #[test]
    fn errors_are_unknown_with_etcds_text() {
        let status = recipe_error(Status::not_found("etcdserver: requested lease not found"));
        assert_eq!(status.code(), Code::Unknown);
        assert_eq!(status.message(), "etcdserver: requested lease not found");
    }
}
