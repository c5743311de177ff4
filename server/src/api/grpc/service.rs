//! etcd's v3 services over the shard's [`Backend`]: request validation at
//! the edge (etcd's own checks and messages), conversion, and etcd's
//! response headers, and etcd's auth checks (docs/compatibility.md).
//!
//! The generated traits want `Send + Sync` services and `Send` futures;
//! per-core state is `Rc`, so it sits in a `SendWrapper` and every call's
//! work runs inside one. glommio never moves a task to another thread.

use std::pin::Pin;

use std::rc::Rc;

use send_wrapper::SendWrapper;
use tonic::codegen::tokio_stream::Stream;
use tonic::{Code, Request, Response, Status, Streaming};

use super::convert::{self, HeaderInfo};
use super::pb::etcdserverpb as pb;
use crate::api::error::to_wire;
use crate::auth::{AuthAnswer, AuthApplied, AuthQuery, AuthRequest, Need, Requirement};
use crate::error::ServerError;
use crate::mvcc;
use crate::owner::{Backend, MemberChange};
use crate::watch::{WatchHub, WatchSpec};

/// Identity and limits every service needs.
#[derive(Debug, Clone)]
pub struct MemberInfo {
    pub name: String,
    pub cluster_id: u64,
    pub member_id: u64,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub max_txn_ops: usize,
    /// `--bcrypt-cost` for passwords hashed here.
    pub bcrypt_cost: u32,
    /// Whether auth is on (kept by the owner's apply): while off, requests
    /// skip the permission check's round trip to the owner.
    pub auth_enabled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

pub fn status_of(e: &ServerError) -> Status {
    let wire = to_wire(e);
    Status::new(Code::from_i32(wire.grpc as i32), wire.message)
}

fn mvcc_status(e: mvcc::MvccError) -> Status {
    status_of(&ServerError::Mvcc(e))
}

#[derive(Clone)]
pub(super) struct Shared {
    backend: SendWrapper<Backend>,
    info: std::sync::Arc<MemberInfo>,
}

impl Shared {
    /// `--max-txn-ops`.
    pub(super) fn max_txn_ops(&self) -> usize {
        self.info.max_txn_ops
    }

    pub(super) fn header(&self, term: u64) -> HeaderInfo {
        HeaderInfo {
            cluster_id: self.info.cluster_id,
            member_id: self.info.member_id,
            raft_term: term,
        }
    }

    /// The owner protocol: its questions' futures stay on this core, so
    /// tonic's `Send` futures await them through [`here`].
    pub(super) fn owner(&self) -> &Backend {
        &self.backend
    }

    /// A range by the caller behind `token` (checked on the owner, after
    /// the read barrier when linearizable).
    pub(super) async fn range(
        &self,
        req: mvcc::RangeRequest,
        token: Option<String>,
    ) -> (crate::error::Result<mvcc::RangeResponse>, u64) {
        SendWrapper::new(async move { self.backend.range(req, token).await }).await
    }

    /// A range as [`Shared::range`] reads it, an answer in key order with
    /// its values still to load ([`Backend::range_read`]).
    pub(super) async fn range_read(
        &self,
        req: mvcc::RangeRequest,
        token: Option<String>,
    ) -> (crate::error::Result<crate::owner::RangeRead>, u64) {
        SendWrapper::new(async move { self.backend.range_read(req, token).await }).await
    }

    /// A watcher's history, read on this shard in its reads queue (see
    /// [`Backend::watch_history`]), and the Raft term.
    pub(super) async fn watch_history(
        &self,
        key: bytes::Bytes,
        range_end: bytes::Bytes,
        from_rev: i64,
    ) -> (crate::error::Result<(Vec<mvcc::Event>, i64)>, u64) {
        SendWrapper::new(async move { self.backend.watch_history(key, range_end, from_rev).await })
            .await
    }

    /// A read-only txn by the caller behind `token`, read on this shard
    /// in its reads queue (see [`Backend::read_txn`], [`crate::sched`]).
    pub(super) async fn read_txn(
        &self,
        req: mvcc::TxnRequest,
        token: Option<String>,
    ) -> (crate::error::Result<mvcc::TxnResponse>, u64) {
        SendWrapper::new(async move {
            let backend = (*self.backend).clone();
            crate::sched::off_the_write_path(async move { backend.read_txn(req, token).await })
                .await
                .unwrap_or((Err(ServerError::Stopped), 0))
        })
        .await
    }

    /// etcd's permission check for the caller behind `token` (nothing to
    /// do, and no trip to the owner, while auth is off).
    pub(super) async fn authorize(
        &self,
        token: Option<String>,
        requirement: impl FnOnce() -> Requirement,
    ) -> Result<(), Status> {
        self.check(token, requirement)
            .await
            .map_err(|e| status_of(&e))
    }

    /// [`Backend::authorize`] from inside the per-core world.
    pub(super) async fn check(
        &self,
        token: Option<String>,
        requirement: impl FnOnce() -> Requirement,
    ) -> crate::error::Result<()> {
        SendWrapper::new(async move {
            self.backend
                .authorize(&self.info.auth_enabled, token, requirement)
                .await
        })
        .await
    }

    /// A write by the caller behind `token` (checked on the owner before it
    /// is proposed, and by every member when it applies).
    pub(super) async fn write(
        &self,
        req: mvcc::Request,
        token: Option<String>,
    ) -> Result<(mvcc::Response, HeaderInfo), Status> {
        let (resp, term) = here(self.owner().write(req, token))
            .await
            .map_err(|e| status_of(&e))?;
        Ok((resp, self.header(term)))
    }
}

/// A future of the per-core world (the owner protocol's: `Rc`s inside)
/// awaited inside one of tonic's `Send` futures. Sound because a shard's
/// tasks never leave its executor's thread.
pub(super) fn here<F: std::future::Future>(future: F) -> SendWrapper<F> {
    SendWrapper::new(future)
}

/// The simple token a request carries: gRPC metadata `token` (clientv3),
/// or `authorization` (etcd's JSON gateway: the `Authorization` header).
pub(super) fn token_of<T>(request: &Request<T>) -> Option<String> {
    let meta = request.metadata();
    meta.get("token")
        .or_else(|| meta.get("authorization"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| {
            let user = request.extensions().get::<super::serve::CertUser>()?;
            Some(crate::auth::certificate_user_token(&user.0))
        })
}

fn range_needs(r: &mvcc::RangeRequest) -> Requirement {
    Requirement::Keys(vec![Need::read(&r.key, &r.range_end)])
}

/// The services of one shard, ready for [`super::serve::Router`].
pub struct Services {
    pub kv: KvService,
    pub lock: super::recipes::LockService,
    pub election: super::recipes::ElectionService,
    pub watch: WatchService,
    pub lease: LeaseService,
    pub cluster: ClusterService,
    pub maintenance: MaintenanceService,
    pub auth: AuthService,
}

impl Services {
    pub fn new(backend: Backend, hub: Rc<WatchHub>, info: MemberInfo) -> Services {
        let shared = Shared {
            backend: SendWrapper::new(backend),
            info: std::sync::Arc::new(info),
        };
        Services {
            kv: KvService(shared.clone()),
            lock: super::recipes::LockService::new(shared.clone(), hub.clone()),
            election: super::recipes::ElectionService::new(shared.clone(), hub.clone()),
            watch: WatchService {
                shared: shared.clone(),
                hub: SendWrapper::new(hub),
            },
            lease: LeaseService(shared.clone()),
            cluster: ClusterService(shared.clone()),
            maintenance: MaintenanceService(shared.clone()),
            auth: AuthService(shared),
        }
    }
}

#[derive(Clone)]
pub struct KvService(Shared);

/// Keys per RangeStream chunk.
const RANGE_STREAM_CHUNK: i64 = 1000;

impl KvService {
    /// A Range for etcd's JSON gateway: the whole answer, or, when it is
    /// large and in key order, its JSON in chunks
    /// ([`super::chunked_range::answer_json`]).
    pub async fn range_json(
        &self,
        request: Request<pb::RangeRequest>,
    ) -> Result<super::chunked_range::JsonAnswer<pb::RangeResponse>, Status> {
        use super::chunked_range::{self as chunked, JsonAnswer};
        let token = token_of(&request);
        let req = convert::range_request(request.into_inner())?;
        mvcc::validate_range(&req).map_err(mvcc_status)?;
        match self.0.range_read(req, token).await {
            (Ok(crate::owner::RangeRead::Whole(r)), term) => Ok(JsonAnswer::Whole(
                convert::range_response(r, &self.0.header(term)),
            )),
            (Ok(crate::owner::RangeRead::Chunked(range)), term) => {
                let ids = self.0.header(term);
                let answer =
                    SendWrapper::new(chunked::answer_json(range, chunked::gateway_shape(ids)))
                        .await
                        .map_err(|e| status_of(&e))?;
                Ok(answer.map_whole(|whole| chunked::gateway_whole(ids, whole)))
            }
            (Err(e), _) => Err(status_of(&e)),
        }
    }
}

#[tonic::async_trait]
impl pb::kv_server::Kv for KvService {
    type RangeStreamStream = BoxStream<pb::RangeResponse>;

    async fn range_stream(
        &self,
        request: Request<pb::RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        let token = token_of(&request);
        let req = convert::range_request(request.into_inner())?;
        mvcc::validate_range(&req).map_err(mvcc_status)?;
        self.0
            .authorize(token.clone(), || range_needs(&req))
            .await?;
        if req.sort_order != mvcc::SortOrder::None && req.sort_order != mvcc::SortOrder::Ascend
            || req.sort_target != mvcc::SortTarget::Key
            || req.count_only
        {
            return Err(Status::invalid_argument(
                "etcdserver: RangeStream returns keys in ascending key order only",
            ));
        }
        // A small channel: the producer waits for the client, so memory is
        // a few chunks whatever the range's size.
        let (out, responses) =
            futures_channel::mpsc::channel::<Result<pb::RangeResponse, Status>>(2);
        let task = SendWrapper::new(stream_range(self.0.clone(), req, token, out));
        // Its ranges in the reads queue, as every range (crate::sched).
        crate::sched::spawn_read(task);
        Ok(Response::new(Box::pin(responses)))
    }

    async fn range(
        &self,
        request: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        let token = token_of(&request);
        let may_chunk = request
            .extensions()
            .get::<super::chunked_range::MayChunk>()
            .is_some();
        let req = convert::range_request(request.into_inner())?;
        mvcc::validate_range(&req).map_err(mvcc_status)?;
        let (read, term) = if may_chunk {
            self.0.range_read(req, token).await
        } else {
            let (whole, term) = self.0.range(req, token).await;
            (whole.map(crate::owner::RangeRead::Whole), term)
        };
        match (read, term) {
            (Ok(crate::owner::RangeRead::Whole(r)), term) => Ok(Response::new(
                convert::range_response(r, &self.0.header(term)),
            )),
            (Ok(crate::owner::RangeRead::Chunked(range)), term) => {
                SendWrapper::new(super::chunked_range::answer(range, self.0.header(term))).await
            }
            (Err(e), _) => Err(status_of(&e)),
        }
    }

    async fn put(
        &self,
        request: Request<pb::PutRequest>,
    ) -> Result<Response<pb::PutResponse>, Status> {
        let token = token_of(&request);
        let req = convert::put_request(request.into_inner());
        mvcc::validate_put(&req).map_err(mvcc_status)?;
        match self.0.write(mvcc::Request::Put(req), token).await? {
            (mvcc::Response::Put(r), h) => Ok(Response::new(convert::put_response(r, &h))),
            _ => Err(status_of(&ServerError::Stopped)),
        }
    }

    async fn delete_range(
        &self,
        request: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        let token = token_of(&request);
        let req = convert::delete_request(request.into_inner());
        mvcc::validate_delete_range(&req).map_err(mvcc_status)?;
        match self.0.write(mvcc::Request::DeleteRange(req), token).await? {
            (mvcc::Response::DeleteRange(r), h) => {
                Ok(Response::new(convert::delete_response(r, &h)))
            }
            _ => Err(status_of(&ServerError::Stopped)),
        }
    }

    async fn txn(
        &self,
        request: Request<pb::TxnRequest>,
    ) -> Result<Response<pb::TxnResponse>, Status> {
        let token = token_of(&request);
        let req = convert::txn_request(request.into_inner())?;
        mvcc::validate_txn(&req, self.0.info.max_txn_ops).map_err(mvcc_status)?;
        if mvcc::is_txn_readonly(&req) {
            return match self.0.read_txn(req, token).await {
                (Ok(r), term) => Ok(Response::new(convert::txn_response(
                    r,
                    &self.0.header(term),
                ))),
                (Err(e), _) => Err(status_of(&e)),
            };
        }
        match self.0.write(mvcc::Request::Txn(req), token).await? {
            (mvcc::Response::Txn(r), h) => Ok(Response::new(convert::txn_response(r, &h))),
            _ => Err(status_of(&ServerError::Stopped)),
        }
    }

    async fn compact(
        &self,
        request: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        let req = mvcc::Request::Compaction(mvcc::CompactionRequest {
            revision: r.revision,
            physical: r.physical,
        });
        match self.0.write(req, token).await? {
            (mvcc::Response::Compaction(c), h) => Ok(Response::new(pb::CompactionResponse {
                header: h.header(c.header.revision),
            })),
            _ => Err(status_of(&ServerError::Stopped)),
        }
    }
}

pub(super) type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn not_yet(what: &str) -> Status {
    Status::unimplemented(format!("metcd: {what} is not implemented yet"))
}

#[derive(Clone)]
pub struct WatchService {
    shared: Shared,
    hub: SendWrapper<Rc<WatchHub>>,
}

#[tonic::async_trait]
impl pb::watch_server::Watch for WatchService {
    type WatchStream = BoxStream<pb::WatchResponse>;

    async fn watch(
        &self,
        request: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let token = token_of(&request);
        let input = request.into_inner();
        let stream = self.hub.new_stream();
        let (out, responses) = crate::watch::watch_channel(&self.hub, stream);
        let shared = self.shared.clone();
        let hub = SendWrapper::new((*self.hub).clone());
        let (hang_up, on_hang_up) = futures_channel::oneshot::channel::<()>();
        // The request side runs as a task of this shard; responses flow
        // through `out` (the hub pushes events there too).
        let task = SendWrapper::new(async move {
            let _open = crate::watch::StreamCount::new();
            let hub = hub.take();
            let mut watch_stream = WatchStream {
                shared,
                hub: hub.clone(),
                stream,
                out,
                next_watch_id: 0,
                token,
            };
            if watch_stream.run(input).await == Input::Finished {
                // As etcd: a client that closed its sending side (grpcurl
                // does after its request) keeps its watches until it goes.
                let _ = on_hang_up.await;
            }
            hub.remove_stream(stream);
        });
        glommio::spawn_local(task).detach();
        // Read on this shard only (hyper's stream task), as every part of
        // the stream.
        Ok(Response::new(Box::pin(futures_lite::StreamExt::map(
            SendWrapper::new(responses),
            move |r| {
                // Held by the response stream: dropped when the client goes.
                let _ = &hang_up;
                Ok(r)
            },
        ))))
    }
}

/// One client's Watch stream: its watchers live in the shard's hub.
struct WatchStream {
    shared: Shared,
    hub: Rc<WatchHub>,
    stream: u64,
    out: crate::watch::WatchOut,
    next_watch_id: i64,
    /// The stream's token: every watch it creates is checked with it.
    token: Option<String>,
}

/// How a Watch stream's request side ended.
#[derive(PartialEq)]
enum Input {
    /// The client closed its sending side; it still reads.
    Finished,
    /// Reset, broken, or nobody reads the answers any more.
    Gone,
}

impl WatchStream {
    async fn run(&mut self, mut input: Streaming<pb::WatchRequest>) -> Input {
        use pb::watch_request::RequestUnion;
        loop {
            let req = match input.message().await {
                Ok(Some(req)) => req,
                Ok(None) => return Input::Finished,
                Err(_) => return Input::Gone,
            };
            match req.request_union {
                Some(RequestUnion::CreateRequest(c)) => self.create(c).await,
                Some(RequestUnion::CancelRequest(c))
                    if self.hub.remove(self.stream, c.watch_id) =>
                {
                    self.send(pb::WatchResponse {
                        header: self.hub.header(self.hub.revision()),
                        watch_id: c.watch_id,
                        canceled: true,
                        ..Default::default()
                    });
                }
                Some(RequestUnion::CancelRequest(_)) => {}
                Some(RequestUnion::ProgressRequest(_)) => {
                    let (rev, _) = self.current().await;
                    // Fan-out runs behind apply: the answer waits until
                    // every event up to `rev` went out.
                    self.hub.fed_up_to(rev).await;
                    // etcd 3.4+: one notification for the stream, watch id
                    // -1, deferred while a watcher of the stream is behind
                    // (it has not sent every event up to `rev`).
                    self.hub.request_progress(self.stream, &self.out, rev);
                }
                None => {}
            }
            if self.out.is_closed() {
                return Input::Gone;
            }
        }
    }

    fn send(&self, resp: pb::WatchResponse) {
        self.out.send(resp);
    }

    async fn current(&self) -> (i64, u64) {
        match here(self.shared.owner().status()).await {
            Ok(report) => {
                let status = report.status;
                self.hub.note_term(status.term);
                self.hub.note_revision(status.revision);
                (status.revision, status.term)
            }
            Err(_) => (self.hub.revision(), 0),
        }
    }

    async fn create(&mut self, c: pb::WatchCreateRequest) {
        // etcd: 0 asks the server to pick; ids count up per stream.
        let watch_id = if c.watch_id != 0 {
            c.watch_id
        } else {
            while self.hub.contains(self.stream, self.next_watch_id) {
                self.next_watch_id += 1;
            }
            self.next_watch_id
        };
        let allowed = self
            .shared
            .authorize(self.token.clone(), || {
                Requirement::Keys(vec![Need::read(&c.key, &c.range_end)])
            })
            .await;
        if allowed.is_err() {
            // etcd 3.4 answers created + canceled with the gRPC error's
            // text as the reason, for the id the client asked for.
            let (rev, _) = self.current().await;
            self.send(pb::WatchResponse {
                header: self.hub.header(rev),
                watch_id: c.watch_id,
                created: true,
                canceled: true,
                cancel_reason: "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
                    .into(),
                ..Default::default()
            });
            return;
        }
        if self.hub.contains(self.stream, watch_id) {
            let (rev, _) = self.current().await;
            self.send(pb::WatchResponse {
                header: self.hub.header(rev),
                watch_id,
                created: true,
                canceled: true,
                cancel_reason: "etcdserver: duplicate watch ID".into(),
                ..Default::default()
            });
            return;
        }
        let spec = WatchSpec {
            key: c.key,
            range_end: c.range_end,
            no_put: c
                .filters
                .contains(&(pb::watch_create_request::FilterType::Noput as i32)),
            no_delete: c
                .filters
                .contains(&(pb::watch_create_request::FilterType::Nodelete as i32)),
            prev_kv: c.prev_kv,
            progress_notify: c.progress_notify,
            fragment: c.fragment,
        };
        let start = c.start_revision.max(0);
        let registered = register_watch(
            &self.shared,
            &self.hub,
            (self.stream, watch_id),
            spec,
            start,
            self.out.clone(),
        )
        .await;
        match registered {
            Ok((events, upto)) => {
                self.send(pb::WatchResponse {
                    header: self.hub.header(upto),
                    watch_id,
                    created: true,
                    ..Default::default()
                });
                self.hub.finish_sync(self.stream, watch_id, &events, upto);
            }
            Err(e) => {
                let (rev, _) = self.current().await;
                let compact_revision = here(self.shared.owner().compact_revision())
                    .await
                    .unwrap_or(0);
                self.send(pb::WatchResponse {
                    header: self.hub.header(rev),
                    watch_id,
                    created: true,
                    ..Default::default()
                });
                let compacted = matches!(e, ServerError::Mvcc(mvcc::MvccError::Compacted));
                self.send(pb::WatchResponse {
                    header: self.hub.header(rev),
                    watch_id,
                    canceled: true,
                    // etcd signals compaction by the revision alone; clients
                    // turn it into "required revision has been compacted".
                    compact_revision: if compacted { compact_revision } else { 0 },
                    cancel_reason: if compacted {
                        String::new()
                    } else {
                        status_of(&e).message().to_string()
                    },
                    ..Default::default()
                });
            }
        }
    }
}

/// Registers watcher `id` (stream, watch id) of `hub` for events from
/// `start` on, holding live ones back, then reads its history up to the
/// owner's current revision: nothing falls in between. Answers the history
/// and the revision it reaches; the caller hands them to
/// [`WatchHub::finish_sync`] once it told its client the watch exists. On
/// an error the watcher is gone again.
pub(super) async fn register_watch(
    shared: &Shared,
    hub: &WatchHub,
    id: (u64, i64),
    spec: WatchSpec,
    start: i64,
    out: crate::watch::WatchOut,
) -> crate::error::Result<(Vec<mvcc::Event>, i64)> {
    let (key, range_end) = (spec.key.clone(), spec.range_end.clone());
    hub.add(id.0, id.1, spec, start, true, out);
    let (history, term) = shared.watch_history(key, range_end, start).await;
    let outcome = match history {
        Ok((events, upto)) => {
            hub.note_term(term);
            hub.note_revision(upto);
            return Ok((events, upto));
        }
        Err(e) => Err(e),
    };
    hub.remove(id.0, id.1);
    outcome
}

#[derive(Clone)]
pub struct LeaseService(Shared);

impl LeaseService {}

#[tonic::async_trait]
impl pb::lease_server::Lease for LeaseService {
    type LeaseKeepAliveStream = BoxStream<pb::LeaseKeepAliveResponse>;

    async fn lease_grant(
        &self,
        request: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        let r = request.into_inner();
        let ((id, ttl, revision), term) = here(self.0.owner().lease_grant(r.id, r.ttl))
            .await
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::LeaseGrantResponse {
            header: self.0.header(term).header(revision),
            id,
            ttl,
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        request: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let token = token_of(&request);
        let id = request.into_inner().id;
        let (revision, term) = here(self.0.owner().lease_revoke(id, token))
            .await
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::LeaseRevokeResponse {
            header: self.0.header(term).header(revision),
        }))
    }

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let mut input = request.into_inner();
        let (out, responses) =
            futures_channel::mpsc::unbounded::<Result<pb::LeaseKeepAliveResponse, Status>>();
        let shared = self.0.clone();
        let task = SendWrapper::new(async move {
            while let Ok(Some(req)) = input.message().await {
                let resp = match shared.owner().lease_keep_alive(req.id).await {
                    // Unknown (expired or revoked) leases answer TTL 0, as etcd.
                    Ok(kept) => Ok(pb::LeaseKeepAliveResponse {
                        header: shared.header(kept.term).header(kept.revision),
                        id: req.id,
                        ttl: kept.answer.unwrap_or(0),
                    }),
                    Err(e) => Err(status_of(&e)),
                };
                let stop = resp.is_err();
                if out.unbounded_send(resp).is_err() || stop {
                    break;
                }
            }
        });
        glommio::spawn_local(task).detach();
        Ok(Response::new(Box::pin(responses)))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        let asked = here(self.0.owner().lease_time_to_live(r.id))
            .await
            .map_err(|e| status_of(&e))?;
        let (found, h, revision) = (asked.answer, self.0.header(asked.term), asked.revision);
        // An unknown lease is TTL -1 (etcdctl: "lease ... already expired").
        let (ttl, granted_ttl, keys) = match found {
            Some((ttl, granted, keys)) => (ttl, granted, keys),
            None => (-1, 0, Vec::new()),
        };
        if r.keys && !keys.is_empty() {
            // Key names are data: only for who may read them all (etcd
            // 3.4.26's fix of CVE-2023-32082).
            let none = bytes::Bytes::new();
            self.0
                .authorize(token, || {
                    Requirement::Keys(keys.iter().map(|k| Need::read(k, &none)).collect())
                })
                .await?;
        }
        Ok(Response::new(pb::LeaseTimeToLiveResponse {
            header: h.header(revision),
            id: r.id,
            ttl,
            granted_ttl,
            keys: if r.keys { keys } else { Vec::new() },
        }))
    }

    async fn lease_leases(
        &self,
        _: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        let asked = here(self.0.owner().leases())
            .await
            .map_err(|e| status_of(&e))?;
        let ids = asked.answer;
        Ok(Response::new(pb::LeaseLeasesResponse {
            header: self.0.header(asked.term).header(asked.revision),
            leases: ids.into_iter().map(|id| pb::LeaseStatus { id }).collect(),
        }))
    }
}

#[derive(Clone)]
pub struct ClusterService(Shared);

impl ClusterService {
    /// A membership change by the caller behind `token`: as etcd 3.4's
    /// `checkMembershipOperationPermission`, only root may change the
    /// membership once auth is on (refusals in etcd's gRPC wording:
    /// `etcdserver: user name is empty` / `permission denied`). Checked on
    /// the member that received the request, before anything is proposed.
    async fn change<'a>(
        &'a self,
        token: Option<String>,
        ask: impl FnOnce(
            &'a Backend,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = crate::error::Result<(MemberChange, u64)>> + 'a>,
        >,
    ) -> Result<(MemberChange, Option<pb::ResponseHeader>), Status> {
        self.0
            .check(token, || Requirement::Admin)
            .await
            .map_err(|e| status_of(&e))?;
        let (change, term) = here(ask(self.0.owner())).await.map_err(|e| status_of(&e))?;
        Ok((change, self.0.header(term).header(0)))
    }
}

fn member_pb(m: crate::members::MemberRecord) -> pb::Member {
    pb::Member {
        id: m.id,
        name: m.name,
        peer_ur_ls: m.peer_urls,
        client_ur_ls: m.client_urls,
        is_learner: m.is_learner,
    }
}

#[tonic::async_trait]
impl pb::cluster_server::Cluster for ClusterService {
    async fn member_add(
        &self,
        request: Request<pb::MemberAddRequest>,
    ) -> Result<Response<pb::MemberAddResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        // etcd parses the URLs before it looks at the caller.
        crate::node::check_new_member_urls(&r.peer_ur_ls).map_err(|e| status_of(&e))?;
        let (change, header) = self
            .change(token, |owner| {
                Box::pin(owner.member_add(r.peer_ur_ls, r.is_learner))
            })
            .await?;
        Ok(Response::new(pb::MemberAddResponse {
            header,
            member: change.added.map(member_pb),
            members: change.members.into_iter().map(member_pb).collect(),
        }))
    }

    async fn member_remove(
        &self,
        request: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        let token = token_of(&request);
        let (change, header) = self
            .change(token, |owner| {
                Box::pin(owner.member_remove(request.into_inner().id))
            })
            .await?;
        Ok(Response::new(pb::MemberRemoveResponse {
            header,
            members: change.members.into_iter().map(member_pb).collect(),
        }))
    }

    async fn member_update(
        &self,
        request: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        let (change, header) = self
            .change(token, |owner| {
                Box::pin(owner.member_update(r.id, r.peer_ur_ls))
            })
            .await?;
        Ok(Response::new(pb::MemberUpdateResponse {
            header,
            members: change.members.into_iter().map(member_pb).collect(),
        }))
    }

    async fn member_list(
        &self,
        _: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        let (members, term) = here(self.0.owner().members())
            .await
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::MemberListResponse {
            header: self.0.header(term).header(0),
            members: members.into_iter().map(member_pb).collect(),
        }))
    }

    async fn member_promote(
        &self,
        request: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        let token = token_of(&request);
        let (change, header) = self
            .change(token, |owner| {
                Box::pin(owner.member_promote(request.into_inner().id))
            })
            .await?;
        Ok(Response::new(pb::MemberPromoteResponse {
            header,
            members: change.members.into_iter().map(member_pb).collect(),
        }))
    }
}

#[derive(Clone)]
pub struct MaintenanceService(Shared);

impl MaintenanceService {
    /// etcd 3.4's Maintenance admin check; its refusals keep the auth
    /// package's own wording (`auth: permission denied`, gRPC Unknown).
    async fn admin_only(&self, token: Option<String>) -> Result<(), Status> {
        match self.0.check(token, || Requirement::Admin).await {
            Ok(()) => Ok(()),
            Err(ServerError::Auth(e)) => Err(status_of(&ServerError::Auth(e.for_maintenance()))),
            Err(e) => Err(status_of(&e)),
        }
    }
}

#[tonic::async_trait]
impl pb::maintenance_server::Maintenance for MaintenanceService {
    type SnapshotStream = BoxStream<pb::SnapshotResponse>;

    async fn alarm(
        &self,
        request: Request<pb::AlarmRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        use crate::alarm::{AlarmAction, AlarmRequest, AlarmType};
        let r = request.into_inner();
        // Values outside the enums: etcd's applier treats an unknown
        // action as none (answers no alarms) and stores an unknown type
        // as is; neither can do anything here, so they are answered
        // without a log entry.
        let (Some(action), Some(alarm)) = (
            AlarmAction::from_wire(r.action),
            AlarmType::from_wire(r.alarm),
        ) else {
            return Ok(Response::new(pb::AlarmResponse::default()));
        };
        let req = AlarmRequest {
            action,
            member: r.member_id,
            alarm,
        };
        let alarms = here(self.0.owner().alarm(req))
            .await
            .map_err(|e| status_of(&e))?;
        // etcd's answer carries no header (its alarm applier never fills
        // one): `{}` when there is no alarm.
        Ok(Response::new(pb::AlarmResponse {
            header: None,
            alarms: alarms
                .into_iter()
                .map(|a| pb::AlarmMember {
                    member_id: a.member,
                    alarm: a.alarm.wire(),
                })
                .collect(),
        }))
    }

    async fn status(
        &self,
        _: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let crate::owner::StatusReport {
            status,
            db_size,
            alarms,
            ..
        } = here(self.0.owner().status())
            .await
            .map_err(|e| status_of(&e))?;
        let leader = status.leader;
        let mut errors = Vec::new();
        if leader == 0 {
            errors.push(ServerError::NoLeader.to_string());
        }
        errors.extend(alarms.iter().map(|a| a.text()));
        Ok(Response::new(pb::StatusResponse {
            header: self.0.header(status.term).header(status.revision),
            version: crate::ETCD_API_VERSION.to_string(),
            db_size: i64::try_from(db_size.total_bytes).unwrap_or(i64::MAX),
            leader,
            raft_index: status.committed_index,
            raft_term: status.term,
            raft_applied_index: status.applied_index,
            errors,
            db_size_in_use: i64::try_from(db_size.in_use_bytes).unwrap_or(i64::MAX),
            is_learner: status.is_learner,
        }))
    }

    async fn defragment(
        &self,
        request: Request<pb::DefragmentRequest>,
    ) -> Result<Response<pb::DefragmentResponse>, Status> {
        self.admin_only(token_of(&request)).await?;
        here(self.0.owner().defragment())
            .await
            .map_err(|e| status_of(&e))?;
        let status = here(self.0.owner().status())
            .await
            .map_err(|e| status_of(&e))?
            .status;
        Ok(Response::new(pb::DefragmentResponse {
            header: self.0.header(status.term).header(status.revision),
        }))
    }

    async fn hash(
        &self,
        request: Request<pb::HashRequest>,
    ) -> Result<Response<pb::HashResponse>, Status> {
        self.admin_only(token_of(&request)).await?;
        let ((hash, revision), term) = here(self.0.owner().hash())
            .await
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::HashResponse {
            header: self.0.header(term).header(revision),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<pb::HashKvRequest>,
    ) -> Result<Response<pb::HashKvResponse>, Status> {
        self.admin_only(token_of(&request)).await?;
        let rev = request.into_inner().revision;
        let (h, term) = here(self.0.owner().hash_kv(rev))
            .await
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::HashKvResponse {
            header: self.0.header(term).header(h.revision),
            hash: h.hash,
            compact_revision: h.compact_revision,
        }))
    }

    /// Streams a consistent snapshot of the whole store in chunks, then
    /// etcd's trailer: the SHA-256 of everything before it, which etcdctl
    /// checks and which needs the body to be a multiple of 512 bytes (bolt
    /// pages in etcd). Body = metcd's snapshot file (engine::snapfile) ++
    /// zero padding ++ the snapshot file's length (u64 LE); see
    /// docs/compatibility.md.
    async fn snapshot(
        &self,
        request: Request<pb::SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        self.admin_only(token_of(&request)).await?;
        // etcd 3.4 sends no header on Snapshot responses.
        let (path, size) = here(self.0.owner().backup())
            .await
            .map_err(|e| status_of(&e))?;
        let (out, responses) =
            futures_channel::mpsc::channel::<Result<pb::SnapshotResponse, Status>>(4);
        let task = SendWrapper::new(stream_backup(path, size, out));
        glommio::spawn_local(task).detach();
        Ok(Response::new(Box::pin(responses)))
    }

    async fn move_leader(
        &self,
        request: Request<pb::MoveLeaderRequest>,
    ) -> Result<Response<pb::MoveLeaderResponse>, Status> {
        let target = request.into_inner().target_id;
        let ((), term) = here(self.0.owner().move_leader(target))
            .await
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::MoveLeaderResponse {
            header: self.0.header(term).header(0),
        }))
    }

    async fn downgrade(
        &self,
        _: Request<pb::DowngradeRequest>,
    ) -> Result<Response<pb::DowngradeResponse>, Status> {
        Err(not_yet("Downgrade"))
    }
}

/// Produces RangeStream chunks: repeated limited Ranges at the revision of
/// the first one, each starting just after the previous chunk's last key.
async fn stream_range(
    shared: Shared,
    mut req: mvcc::RangeRequest,
    token: Option<String>,
    mut out: futures_channel::mpsc::Sender<Result<pb::RangeResponse, Status>>,
) {
    use futures_lite::future::poll_fn;
    let wanted = if req.limit > 0 { req.limit } else { i64::MAX };
    let mut sent = 0i64;
    let mut total = None;
    loop {
        req.limit = RANGE_STREAM_CHUNK.min(wanted - sent);
        let (chunk, term) = match shared.range(req.clone(), token.clone()).await {
            (Ok(r), term) => (r, term),
            (Err(e), _) => {
                let _ = out.start_send(Err(status_of(&e)));
                return;
            }
        };
        // Later chunks read at the first chunk's revision, and every chunk
        // reports that revision: the stream is one point in time.
        if req.revision <= 0 {
            req.revision = chunk.header.revision;
        }
        let total = *total.get_or_insert(chunk.count);
        sent += chunk.kvs.len() as i64;
        let last_key = chunk.kvs.last().map(|kv| kv.key.clone());
        // `more` as Range reports it (keys exist past this chunk), while the
        // stream itself stops at the request's limit.
        let more = chunk.more;
        let go_on = more && sent < wanted;
        let mut resp = convert::range_response(chunk, &shared.header(term));
        if let Some(h) = resp.header.as_mut() {
            h.revision = req.revision;
        }
        resp.more = more;
        resp.count = total;
        if poll_fn(|cx| out.poll_ready(cx)).await.is_err() || out.start_send(Ok(resp)).is_err() {
            return;
        }
        match (go_on, last_key) {
            (true, Some(last)) => {
                req.key = crate::mvcc::key_after(&last).into();
                if req.range_end.is_empty() {
                    return;
                }
            }
            _ => return,
        }
    }
}

/// Sends the backup file in chunks (bounded memory: a small channel and one
/// chunk in flight), then the SHA-256 trailer, and deletes the file.
async fn stream_backup(
    path: std::path::PathBuf,
    size: u64,
    mut out: futures_channel::mpsc::Sender<Result<pb::SnapshotResponse, Status>>,
) {
    use futures_lite::future::poll_fn;
    use sha2::Digest;
    const CHUNK: u64 = 1 << 20;
    let mut hasher = sha2::Sha256::new();
    // As etcd 3.4: `remaining_bytes` counts the db bytes still to come, and
    // the SHA-256 travels alone after them (remaining 0).
    let mut sent = 0u64;
    let result: Result<(), String> = async {
        let file = glommio::io::BufferedFile::open(&path)
            .await
            .map_err(|e| e.to_string())?;
        while sent < size {
            let len = CHUNK.min(size - sent);
            let chunk = file
                .read_at(sent, len as usize)
                .await
                .map_err(|e| e.to_string())?;
            if chunk.is_empty() {
                return Err(format!("backup file {} ended early", path.display()));
            }
            hasher.update(&chunk[..]);
            sent += chunk.len() as u64;
            let msg = pb::SnapshotResponse {
                header: None,
                remaining_bytes: size - sent,
                blob: bytes::Bytes::copy_from_slice(&chunk),
            };
            poll_fn(|cx| out.poll_ready(cx))
                .await
                .map_err(|e| e.to_string())?;
            out.start_send(Ok(msg)).map_err(|e| e.to_string())?;
        }
        let _ = file.close().await;
        let msg = pb::SnapshotResponse {
            header: None,
            remaining_bytes: 0,
            blob: hasher.finalize().to_vec().into(),
        };
        poll_fn(|cx| out.poll_ready(cx))
            .await
            .map_err(|e| e.to_string())?;
        out.start_send(Ok(msg)).map_err(|e| e.to_string())?;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        let _ = out.start_send(Err(Status::internal(format!("snapshot: {e}"))));
    }
    let _ = std::fs::remove_file(&path);
}

/// etcd's Auth service: changes go through the log (passwords hashed here,
/// off the shard's core), reads are answered by the owner; both need root
/// while auth is on.
#[derive(Clone)]
pub struct AuthService(Shared);

impl AuthService {
    /// What a UserAdd or UserChangePassword stores: the hash the client
    /// sent (etcd 3.5's `hashedPassword`), else the bcrypt of its password.
    /// A caller who may not make the change is refused before bcrypt is
    /// paid for.
    async fn stored_password(
        &self,
        token: &Option<String>,
        password: String,
        hashed: String,
    ) -> Result<bytes::Bytes, Status> {
        self.0
            .authorize(token.clone(), || Requirement::Admin)
            .await?;
        if hashed.is_empty() {
            hash_password(password, self.0.info.bcrypt_cost).await
        } else {
            Ok(bytes::Bytes::from(hashed))
        }
    }

    async fn change(
        &self,
        token: Option<String>,
        req: AuthRequest,
    ) -> Result<(AuthApplied, Option<pb::ResponseHeader>), Status> {
        let (applied, term, revision) = here(self.0.owner().auth_change(token, req))
            .await
            .map_err(|e| status_of(&e))?;
        Ok((applied, self.0.header(term).header(revision)))
    }

    /// A change whose answer is just the header.
    async fn header_of(
        &self,
        token: Option<String>,
        req: AuthRequest,
    ) -> Result<Option<pb::ResponseHeader>, Status> {
        self.change(token, req).await.map(|(_, header)| header)
    }

    async fn query(
        &self,
        token: Option<String>,
        query: AuthQuery,
    ) -> Result<(AuthAnswer, Option<pb::ResponseHeader>), Status> {
        let (answer, term, revision) = here(self.0.owner().auth_query(token, query))
            .await
            .map_err(|e| status_of(&e))?;
        Ok((answer, self.0.header(term).header(revision)))
    }

    async fn names(
        &self,
        token: Option<String>,
        query: AuthQuery,
    ) -> Result<(Vec<String>, Option<pb::ResponseHeader>), Status> {
        match self.query(token, query).await? {
            (AuthAnswer::Names(names) | AuthAnswer::Roles(names), header) => Ok((names, header)),
            _ => Err(status_of(&ServerError::Stopped)),
        }
    }
}

/// Threads that run bcrypt for the whole process, and how many hashes may
/// wait for them: a flood of logins queues a bounded amount of work, then
/// gets etcd's "too many requests", and never costs a shard its core.
const BCRYPT_THREADS: usize = 2;
const BCRYPT_QUEUE: usize = 64;

type HashJob = Box<dyn FnOnce() + Send>;

fn bcrypt_pool() -> Result<&'static std::sync::mpsc::SyncSender<HashJob>, Status> {
    static POOL: std::sync::OnceLock<Result<std::sync::mpsc::SyncSender<HashJob>, String>> =
        std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let (jobs, queue) = std::sync::mpsc::sync_channel::<HashJob>(BCRYPT_QUEUE);
        let queue = std::sync::Arc::new(std::sync::Mutex::new(queue));
        for n in 0..BCRYPT_THREADS {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("metcd-bcrypt-{n}"))
                .spawn(move || loop {
                    // The lock is held only while waiting for a job.
                    let next = queue.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    match next {
                        // A panicking job must not take its worker along.
                        Ok(job) => {
                            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                        }
                        Err(_) => return,
                    }
                })
                .map_err(|e| format!("etcdserver: password hashing: {e}"))?;
        }
        Ok(jobs)
    })
    .as_ref()
    .map_err(|e| Status::internal(e.clone()))
}

/// Runs bcrypt (tens of milliseconds by design) on the hashing threads:
/// never on a shard, whose other requests would wait for it.
async fn off_core<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Status> {
    let (tx, rx) = futures_channel::oneshot::channel();
    let job: HashJob = Box::new(move || {
        let _ = tx.send(work());
    });
    match bcrypt_pool()?.try_send(job) {
        Ok(()) => {}
        Err(std::sync::mpsc::TrySendError::Full(_)) => {
            return Err(status_of(&ServerError::TooManyRequests))
        }
        Err(std::sync::mpsc::TrySendError::Disconnected(_)) => {
            return Err(Status::internal("etcdserver: password hashing stopped"))
        }
    }
    rx.await
        .map_err(|_| Status::internal("etcdserver: password hashing failed"))
}

/// A bcrypt hash in Go's `$2a$` form, as etcd stores it.
async fn hash_password(password: String, cost: u32) -> Result<bytes::Bytes, Status> {
    off_core(move || bcrypt::hash_with_result(password, cost))
        .await?
        .map(|h| bytes::Bytes::from(h.format_for_version(bcrypt::Version::TwoA)))
        .map_err(|e| Status::internal(format!("etcdserver: password hashing: {e}")))
}

/// etcd's simple token: 16 random lowercase letters (the applying
/// members append the entry's index).
fn token_prefix() -> Result<String, Status> {
    let mut raw = [0u8; 16];
    getrandom::getrandom(&mut raw)
        .map_err(|e| Status::internal(format!("etcdserver: token: {e}")))?;
    Ok(raw.iter().map(|b| char::from(b'a' + b % 26)).collect())
}

#[tonic::async_trait]
impl pb::auth_server::Auth for AuthService {
    async fn auth_enable(
        &self,
        request: Request<pb::AuthEnableRequest>,
    ) -> Result<Response<pb::AuthEnableResponse>, Status> {
        let header = self
            .header_of(token_of(&request), AuthRequest::Enable)
            .await?;
        Ok(Response::new(pb::AuthEnableResponse { header }))
    }

    async fn auth_disable(
        &self,
        request: Request<pb::AuthDisableRequest>,
    ) -> Result<Response<pb::AuthDisableResponse>, Status> {
        let header = self
            .header_of(token_of(&request), AuthRequest::Disable)
            .await?;
        Ok(Response::new(pb::AuthDisableResponse { header }))
    }

    async fn auth_status(
        &self,
        request: Request<pb::AuthStatusRequest>,
    ) -> Result<Response<pb::AuthStatusResponse>, Status> {
        match self.query(token_of(&request), AuthQuery::Status).await? {
            (AuthAnswer::Status { enabled, revision }, header) => {
                Ok(Response::new(pb::AuthStatusResponse {
                    header,
                    enabled,
                    auth_revision: revision,
                }))
            }
            _ => Err(status_of(&ServerError::Stopped)),
        }
    }

    async fn authenticate(
        &self,
        request: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        let r = request.into_inner();
        let hash = match self
            .query(None, AuthQuery::PasswordHash(r.name.clone()))
            .await?
        {
            (AuthAnswer::PasswordHash(hash), _) => hash,
            _ => return Err(status_of(&ServerError::Stopped)),
        };
        let password = r.password;
        let matches = off_core(move || {
            std::str::from_utf8(&hash)
                .ok()
                .and_then(|h| bcrypt::verify(password, h).ok())
                .unwrap_or(false)
        })
        .await?;
        if !matches {
            return Err(status_of(&ServerError::Auth(
                crate::auth::AuthError::AuthFailed,
            )));
        }
        let req = AuthRequest::Authenticate {
            name: r.name,
            token_prefix: token_prefix()?,
        };
        match self.change(None, req).await? {
            (AuthApplied::Token(token), header) => {
                Ok(Response::new(pb::AuthenticateResponse { header, token }))
            }
            _ => Err(status_of(&ServerError::Stopped)),
        }
    }

    async fn user_add(
        &self,
        request: Request<pb::AuthUserAddRequest>,
    ) -> Result<Response<pb::AuthUserAddResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        let no_password = r.options.is_some_and(|o| o.no_password);
        let hashed_password = if no_password {
            bytes::Bytes::new()
        } else {
            self.stored_password(&token, r.password, r.hashed_password)
                .await?
        };
        let req = AuthRequest::UserAdd {
            name: r.name,
            hashed_password,
            no_password,
        };
        let header = self.header_of(token, req).await?;
        Ok(Response::new(pb::AuthUserAddResponse { header }))
    }

    async fn user_get(
        &self,
        request: Request<pb::AuthUserGetRequest>,
    ) -> Result<Response<pb::AuthUserGetResponse>, Status> {
        let token = token_of(&request);
        let (roles, header) = self
            .names(token, AuthQuery::UserGet(request.into_inner().name))
            .await?;
        Ok(Response::new(pb::AuthUserGetResponse { header, roles }))
    }

    async fn user_list(
        &self,
        request: Request<pb::AuthUserListRequest>,
    ) -> Result<Response<pb::AuthUserListResponse>, Status> {
        let (users, header) = self.names(token_of(&request), AuthQuery::UserList).await?;
        Ok(Response::new(pb::AuthUserListResponse { header, users }))
    }

    async fn user_delete(
        &self,
        request: Request<pb::AuthUserDeleteRequest>,
    ) -> Result<Response<pb::AuthUserDeleteResponse>, Status> {
        let token = token_of(&request);
        let req = AuthRequest::UserDelete {
            name: request.into_inner().name,
        };
        let header = self.header_of(token, req).await?;
        Ok(Response::new(pb::AuthUserDeleteResponse { header }))
    }

    async fn user_change_password(
        &self,
        request: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Result<Response<pb::AuthUserChangePasswordResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        let hashed_password = self
            .stored_password(&token, r.password, r.hashed_password)
            .await?;
        let req = AuthRequest::UserChangePassword {
            name: r.name,
            hashed_password,
        };
        let header = self.header_of(token, req).await?;
        Ok(Response::new(pb::AuthUserChangePasswordResponse { header }))
    }

    async fn user_grant_role(
        &self,
        request: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Result<Response<pb::AuthUserGrantRoleResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        let header = self
            .header_of(
                token,
                AuthRequest::UserGrantRole {
                    user: r.user,
                    role: r.role,
                },
            )
            .await?;
        Ok(Response::new(pb::AuthUserGrantRoleResponse { header }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Result<Response<pb::AuthUserRevokeRoleResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        let header = self
            .header_of(
                token,
                AuthRequest::UserRevokeRole {
                    name: r.name,
                    role: r.role,
                },
            )
            .await?;
        Ok(Response::new(pb::AuthUserRevokeRoleResponse { header }))
    }

    async fn role_add(
        &self,
        request: Request<pb::AuthRoleAddRequest>,
    ) -> Result<Response<pb::AuthRoleAddResponse>, Status> {
        let token = token_of(&request);
        let req = AuthRequest::RoleAdd {
            name: request.into_inner().name,
        };
        let header = self.header_of(token, req).await?;
        Ok(Response::new(pb::AuthRoleAddResponse { header }))
    }

    async fn role_get(
        &self,
        request: Request<pb::AuthRoleGetRequest>,
    ) -> Result<Response<pb::AuthRoleGetResponse>, Status> {
        let token = token_of(&request);
        match self
            .query(token, AuthQuery::RoleGet(request.into_inner().role))
            .await?
        {
            (AuthAnswer::Permissions(perms), header) => {
                Ok(Response::new(pb::AuthRoleGetResponse {
                    header,
                    perm: perms.iter().map(crate::auth::permission_pb).collect(),
                }))
            }
            _ => Err(status_of(&ServerError::Stopped)),
        }
    }

    async fn role_list(
        &self,
        request: Request<pb::AuthRoleListRequest>,
    ) -> Result<Response<pb::AuthRoleListResponse>, Status> {
        let (roles, header) = self.names(token_of(&request), AuthQuery::RoleList).await?;
        Ok(Response::new(pb::AuthRoleListResponse { header, roles }))
    }

    async fn role_delete(
        &self,
        request: Request<pb::AuthRoleDeleteRequest>,
    ) -> Result<Response<pb::AuthRoleDeleteResponse>, Status> {
        let token = token_of(&request);
        let req = AuthRequest::RoleDelete {
            role: request.into_inner().role,
        };
        let header = self.header_of(token, req).await?;
        Ok(Response::new(pb::AuthRoleDeleteResponse { header }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<pb::AuthRoleGrantPermissionResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        let Some(perm) = r.perm else {
            // etcd's gRPC edge refuses a grant without a permission.
            return Err(Status::invalid_argument("etcdserver: permission not given"));
        };
        let perm_type = crate::auth::PermType::from_i32(perm.perm_type)
            .ok_or_else(|| Status::invalid_argument("etcdserver: invalid permission type"))?;
        let req = AuthRequest::RoleGrantPermission {
            name: r.name,
            perm: crate::auth::KeyPermission {
                perm_type,
                key: perm.key,
                range_end: perm.range_end,
            },
        };
        let header = self.header_of(token, req).await?;
        Ok(Response::new(pb::AuthRoleGrantPermissionResponse {
            header,
        }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<pb::AuthRoleRevokePermissionResponse>, Status> {
        let token = token_of(&request);
        let r = request.into_inner();
        let req = AuthRequest::RoleRevokePermission {
            role: r.role,
            key: r.key,
            range_end: r.range_end,
        };
        let header = self.header_of(token, req).await?;
        Ok(Response::new(pb::AuthRoleRevokePermissionResponse {
            header,
        }))
    }
}
