//! etcd's gRPC gateway: the `/v3/...` JSON routes on the client URLs
//! (`curl -X POST http://127.0.0.1:2379/v3/kv/put -d '{"key":"Zm9v",
//! "value":"YmFy"}'`), answered by the same service code as gRPC.
//!
//! JSON as etcd 3.4's gateway writes and reads it (proto3 JSON with the
//! proto field names: 64-bit integers as strings, bytes as base64, enums by
//! name, default values left out; both names and numbers accepted on
//! input). Errors are `{"error":..,"message":..,"code":..}` with the gRPC
//! code and grpc-gateway's HTTP status for it.
//!
//! Owns only the translation. Must never hold state of its own or answer
//! differently from the gRPC services. The streaming RPCs answer one
//! `{"result":..}` line per response: Watch and LeaseKeepAlive (`POST
//! /v3/watch`, `/v3/lease/keepalive`: the body's requests; a watch for as
//! long as the client stays), Snapshot and Election Observe (one request).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use prost::Message;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::codec::Codec;
use tonic::{Code, Status};

use super::pb::etcdserverpb::{
    auth_server::Auth, cluster_server::Cluster, kv_server::Kv, lease_server::Lease,
    maintenance_server::Maintenance, watch_server::Watch, RangeRequest,
};
use super::pb::v3electionpb::election_server::Election;
use super::pb::v3lockpb::lock_server::Lock;
use super::recipes::{ElectionService, LockService};
use super::service::{
    AuthService, BoxStream, ClusterService, KvService, LeaseService, MaintenanceService,
    WatchService,
};

type HttpResponse = Response<Full<Bytes>>;

/// The unary services, shared with the gRPC router.
#[derive(Clone)]
pub struct Gateway {
    pub(super) kv: KvService,
    pub(super) watch: WatchService,
    pub(super) lease: LeaseService,
    pub(super) cluster: ClusterService,
    pub(super) maintenance: MaintenanceService,
    pub(super) auth: AuthService,
    pub(super) lock: LockService,
    pub(super) election: ElectionService,
    /// Largest request body read (`--max-request-bytes` plus gRPC's slack).
    pub(super) max_body_bytes: usize,
    /// Gateway requests in flight at once in this member
    /// ([`take_stream_slot`], `Config::gateway_request_limit`).
    pub(super) max_concurrent_streams: u32,
}

/// Gateway requests in flight in this process. etcd's gateway reaches its
/// server over one internal HTTP/2 connection, so `--max-concurrent-streams`
/// caps every gateway request of the member together, and one over the
/// limit waits until a request or stream ends (etcd's e2e tests rely on it:
/// a 4th request hangs while 3 gateway watches are open with a limit of 3).
static GATEWAY_REQUESTS_IN_FLIGHT: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// How often a gateway request over the limit looks for a free slot (the
/// shards share the count; a request waits only when the operator set a
/// limit and it is reached).
const STREAM_SLOT_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// One gateway request's share of `--max-concurrent-streams`, given back
/// when dropped (a stream's goes with its response body).
pub struct StreamSlot(());

impl Drop for StreamSlot {
    fn drop(&mut self) {
        GATEWAY_REQUESTS_IN_FLIGHT.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// A slot for one gateway request, waiting while `limit` are in flight;
/// `None` (nothing counted) without a limit.
async fn take_stream_slot(limit: u32) -> Option<StreamSlot> {
    use std::sync::atomic::Ordering::{AcqRel, Acquire};
    if limit == u32::MAX {
        return None;
    }
    loop {
        let in_flight = GATEWAY_REQUESTS_IN_FLIGHT.load(Acquire);
        if in_flight < u64::from(limit) {
            let taken = GATEWAY_REQUESTS_IN_FLIGHT.compare_exchange(
                in_flight,
                in_flight + 1,
                AcqRel,
                Acquire,
            );
            if taken.is_ok() {
                return Some(StreamSlot(()));
            }
            continue;
        }
        glommio::timer::sleep(STREAM_SLOT_POLL).await;
    }
}

/// The route of `path` under etcd's gateway prefixes (`/v3/`, and the
/// deprecated `/v3beta/` that etcd 3.4 still serves).
pub fn route(path: &str) -> Option<&str> {
    path.strip_prefix("/v3/")
        .or_else(|| path.strip_prefix("/v3beta/"))
}

/// Whether `route` is one of the streaming routes served
/// ([`Gateway::serve_stream`]).
pub fn is_stream(route: &str) -> bool {
    matches!(
        route,
        "watch" | "lease/keepalive" | "maintenance/snapshot" | "election/observe"
    )
}

impl Gateway {
    /// A streaming route ([`is_stream`]), or `None` when
    /// `route` is not one.
    pub async fn serve_stream(
        &self,
        route: &str,
        body: Incoming,
        authorization: Option<HeaderValue>,
    ) -> Option<Response<StreamOutput>> {
        let slot = take_stream_slot(self.max_concurrent_streams).await;
        let (watch, lease, maintenance) = (&self.watch, &self.lease, &self.maintenance);
        let election = &self.election;
        let answer = match route {
            "election/observe" => {
                self.server_stream(route, body, authorization, |r| {
                    Election::observe(election, r)
                })
                .await
            }
            "maintenance/snapshot" => {
                self.server_stream(route, body, authorization, |r| {
                    Maintenance::snapshot(maintenance, r)
                })
                .await
            }
            "watch" => {
                self.stream(route, body, authorization, |r| Watch::watch(watch, r))
                    .await
            }
            "lease/keepalive" => {
                self.stream(route, body, authorization, |r| {
                    Lease::lease_keep_alive(lease, r)
                })
                .await
            }
            _ => return None,
        };
        Some(answer.map(|mut output| {
            output.slot = slot;
            output
        }))
    }

    /// A bidirectional RPC through the gateway: the body holds one or more
    /// request objects (`{"create_request":{"key":"Zm9v"}}{"progress_request":{}}`
    /// for Watch, `{"ID":"..."}` for LeaseKeepAlive); they go to the stream
    /// as a gRPC client's would, and every response comes back as a
    /// `{"result":..}` line: a LeaseKeepAlive ends after its answers, a
    /// Watch streams until the client hangs up, which ends its watchers.
    async fn stream<Req, Resp, F, Fut>(
        &self,
        route: &str,
        body: Incoming,
        authorization: Option<HeaderValue>,
        rpc: F,
    ) -> Response<StreamOutput>
    where
        Req: DeserializeOwned + Message + Default + Send + 'static,
        Resp: Serialize + Message + Send + 'static,
        F: FnOnce(tonic::Request<tonic::Streaming<Req>>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<BoxStream<Resp>>, Status>>,
    {
        let body = match self.read_body(body).await {
            Ok(b) => b,
            Err(status) => return stream_error(&status),
        };
        let mut frames = VecDeque::new();
        let mut values = serde_json::Deserializer::from_slice(&body).into_iter::<Req>();
        let mut start = 0;
        while let Some(request) = values.next() {
            // Each request object is judged as Go's gateway judges it; a
            // refusal reaches the client as gRPC code Unknown (HTTP 500).
            let rest = &body[start..];
            let why = match request {
                Ok(r) => match super::go_json::explain(route, rest) {
                    None => {
                        frames.push_back(grpc_frame(&r));
                        start = values.byte_offset();
                        continue;
                    }
                    Some(why) => why,
                },
                Err(e) => decode_error(route, rest, &e),
            };
            return stream_error(&Status::unknown(why));
        }
        let decoder = tonic_prost::ProstCodec::<Resp, Req>::default().decoder();
        let input = tonic::Streaming::new_request(
            decoder,
            StreamInput { frames },
            None,
            Some(self.max_body_bytes),
        );
        let answer = rpc(with_token(
            tonic::Request::new(input),
            authorization.as_ref(),
        ))
        .await;
        stream_output(answer)
    }

    /// A server-streaming RPC through the gateway (Snapshot, Observe):
    /// one request object in the body, a `{"result":..}` line per response.
    async fn server_stream<Req, Resp, F, Fut>(
        &self,
        route: &str,
        body: Incoming,
        authorization: Option<HeaderValue>,
        rpc: F,
    ) -> Response<StreamOutput>
    where
        Req: DeserializeOwned + Default,
        Resp: Serialize + Send + 'static,
        F: FnOnce(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<BoxStream<Resp>>, Status>>,
    {
        let body = match self.read_body(body).await {
            Ok(b) => b,
            Err(status) => return stream_error(&status),
        };
        let request = match decode_request::<Req>(route, &body) {
            Ok(r) => r,
            Err(status) => return stream_error(&status),
        };
        let answer = rpc(with_token(
            tonic::Request::new(request),
            authorization.as_ref(),
        ))
        .await;
        stream_output(answer)
    }

    /// Answers one gateway request (`route` from [`route`]), or `None` when
    /// the route is not one of etcd 3.4's unary gateway routes (HashKV has
    /// none in 3.4; the streaming ones go to [`Gateway::serve_stream`]).
    pub async fn serve(
        &self,
        route: &str,
        body: Incoming,
        authorization: Option<HeaderValue>,
    ) -> Option<Response<Either<Full<Bytes>, StreamOutput>>> {
        // Held until the answer is made (a unary answer is sent whole), or
        // with a range's body as long as it is sent.
        let slot = take_stream_slot(self.max_concurrent_streams).await;
        let body = match self.read_body(body).await {
            Ok(b) => b,
            Err(status) => return Some(error_response(&status).map(Either::Left)),
        };
        let body = GatewayRequest {
            route,
            body,
            authorization,
        };
        if route == "kv/range" {
            return Some(range_off_the_write_path(self.kv.clone(), body, slot).await);
        }
        let (kv, lease, cluster) = (&self.kv, &self.lease, &self.cluster);
        let (maintenance, auth) = (&self.maintenance, &self.auth);
        let (lock, election) = (&self.lock, &self.election);
        let b = &body;
        let answer = match route {
            "kv/put" => unary(b, |r| Kv::put(kv, r)).await,
            "kv/deleterange" => unary(b, |r| Kv::delete_range(kv, r)).await,
            "kv/txn" => unary(b, |r| Kv::txn(kv, r)).await,
            "kv/compaction" => unary(b, |r| Kv::compact(kv, r)).await,
            "lease/grant" => unary(b, |r| Lease::lease_grant(lease, r)).await,
            "lease/revoke" | "kv/lease/revoke" => unary(b, |r| Lease::lease_revoke(lease, r)).await,
            "lease/timetolive" | "kv/lease/timetolive" => {
                unary(b, |r| Lease::lease_time_to_live(lease, r)).await
            }
            "lease/leases" | "kv/lease/leases" => unary(b, |r| Lease::lease_leases(lease, r)).await,
            "cluster/member/add" => unary(b, |r| Cluster::member_add(cluster, r)).await,
            "cluster/member/remove" => unary(b, |r| Cluster::member_remove(cluster, r)).await,
            "cluster/member/update" => unary(b, |r| Cluster::member_update(cluster, r)).await,
            "cluster/member/list" => unary(b, |r| Cluster::member_list(cluster, r)).await,
            "cluster/member/promote" => unary(b, |r| Cluster::member_promote(cluster, r)).await,
            "maintenance/alarm" => unary(b, |r| Maintenance::alarm(maintenance, r)).await,
            "maintenance/status" => unary(b, |r| Maintenance::status(maintenance, r)).await,
            "maintenance/defragment" => unary(b, |r| Maintenance::defragment(maintenance, r)).await,
            "maintenance/hash" => unary(b, |r| Maintenance::hash(maintenance, r)).await,
            "maintenance/transfer-leadership" => {
                unary(b, |r| Maintenance::move_leader(maintenance, r)).await
            }
            "auth/enable" => unary(b, |r| Auth::auth_enable(auth, r)).await,
            "auth/disable" => unary(b, |r| Auth::auth_disable(auth, r)).await,
            "auth/authenticate" => unary(b, |r| Auth::authenticate(auth, r)).await,
            "auth/user/add" => unary(b, |r| Auth::user_add(auth, r)).await,
            "auth/user/get" => unary(b, |r| Auth::user_get(auth, r)).await,
            "auth/user/list" => unary(b, |r| Auth::user_list(auth, r)).await,
            "auth/user/delete" => unary(b, |r| Auth::user_delete(auth, r)).await,
            "auth/user/changepw" => unary(b, |r| Auth::user_change_password(auth, r)).await,
            "auth/user/grant" => unary(b, |r| Auth::user_grant_role(auth, r)).await,
            "auth/user/revoke" => unary(b, |r| Auth::user_revoke_role(auth, r)).await,
            "auth/role/add" => unary(b, |r| Auth::role_add(auth, r)).await,
            "auth/role/get" => unary(b, |r| Auth::role_get(auth, r)).await,
            "auth/role/list" => unary(b, |r| Auth::role_list(auth, r)).await,
            "auth/role/delete" => unary(b, |r| Auth::role_delete(auth, r)).await,
            "auth/role/grant" => unary(b, |r| Auth::role_grant_permission(auth, r)).await,
            "auth/role/revoke" => unary(b, |r| Auth::role_revoke_permission(auth, r)).await,
            "lock/lock" => unary(b, |r| Lock::lock(lock, r)).await,
            "lock/unlock" => unary(b, |r| Lock::unlock(lock, r)).await,
            "election/campaign" => unary(b, |r| Election::campaign(election, r)).await,
            "election/proclaim" => unary(b, |r| Election::proclaim(election, r)).await,
            "election/leader" => unary(b, |r| Election::leader(election, r)).await,
            "election/resign" => unary(b, |r| Election::resign(election, r)).await,
            _ => return None,
        };
        Some(answer.map(Either::Left))
    }
}

/// A unary gateway request: its JSON body and its `Authorization` header
/// (an auth token, passed to the service as gRPC metadata, as etcd's
/// gateway does).
struct GatewayRequest<'a> {
    route: &'a str,
    body: Bytes,
    authorization: Option<HeaderValue>,
}

fn with_token<T>(
    mut request: tonic::Request<T>,
    authorization: Option<&HeaderValue>,
) -> tonic::Request<T> {
    if let Some(value) =
        authorization.and_then(|v| tonic::metadata::MetadataValue::try_from(v.as_bytes()).ok())
    {
        request.metadata_mut().insert("authorization", value);
    }
    request
}

/// A gateway Range in the shard's reads queue ([`crate::sched`]), JSON
/// encoding included, as gRPC ranges are. A large answer in key order
/// goes out in chunks as the client reads it
/// ([`super::chunked_range::answer_json`]), holding `slot` until it is
/// sent.
async fn range_off_the_write_path(
    kv: KvService,
    request: GatewayRequest<'_>,
    slot: Option<StreamSlot>,
) -> Response<Either<Full<Bytes>, StreamOutput>> {
    use super::chunked_range::JsonAnswer;
    let request = GatewayRequest {
        route: "kv/range",
        body: request.body,
        authorization: request.authorization,
    };
    let answer = crate::sched::off_the_write_path(async move {
        let range_request = decode_request::<RangeRequest>(request.route, &request.body)?;
        let range_request = with_token(
            tonic::Request::new(range_request),
            request.authorization.as_ref(),
        );
        let answer = kv.range_json(range_request).await?;
        // A whole answer's JSON is encoded here too, in the reads queue.
        Ok(answer.map_whole(|response| unary_answer(Ok(response))))
    })
    .await
    .unwrap_or_else(|| {
        Err(Status::internal(
            "etcdserver: range work could not be scheduled",
        ))
    });
    match answer {
        Ok(JsonAnswer::Whole(response)) => response.map(Either::Left),
        Ok(JsonAnswer::Chunks(chunks)) => {
            json_stream(StreamOutput::chunks(chunks, slot)).map(Either::Right)
        }
        Err(status) => error_response(&status).map(Either::Left),
    }
}

/// Decodes the JSON request (an empty body is the default request, as the
/// gateway treats EOF), runs the RPC and encodes its answer.
async fn unary<Req, Resp, F, Fut>(request: &GatewayRequest<'_>, rpc: F) -> HttpResponse
where
    Req: DeserializeOwned + Default,
    Resp: Serialize,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let authorization = request.authorization.as_ref();
    let request = match decode_request::<Req>(request.route, &request.body) {
        Ok(r) => r,
        Err(status) => return error_response(&status),
    };
    unary_answer(
        rpc(with_token(tonic::Request::new(request), authorization))
            .await
            .map(tonic::Response::into_inner),
    )
}

/// A unary RPC's answer as the gateway writes it: the response's JSON, or
/// the error object.
fn unary_answer<Resp: Serialize>(answer: Result<Resp, Status>) -> HttpResponse {
    match answer {
        Ok(resp) => match serde_json::to_vec(&resp) {
            Ok(json) => {
                let mut resp = json_response(StatusCode::OK, json);
                // The gateway passes the gRPC response's headers on.
                resp.headers_mut().insert(
                    "grpc-metadata-content-type",
                    HeaderValue::from_static("application/grpc"),
                );
                resp
            }
            Err(e) => error_response(&Status::internal(e.to_string())),
        },
        Err(status) => error_response(&status),
    }
}

/// One request object from a unary (or server-streaming) route's body:
/// an empty body is the default request, as the gateway treats EOF.
fn decode_request<Req: DeserializeOwned + Default>(
    route: &str,
    body: &[u8],
) -> Result<Req, Status> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Req::default());
    }
    // Go's decoder reads the first value and ignores what follows; a
    // field named twice counts once, as jsonpb counts it.
    let view = super::go_json::jsonpb_view(route, body);
    match serde_json::Deserializer::from_slice(view.as_deref().unwrap_or(body))
        .into_iter::<Req>()
        .next()
    {
        // What serde takes and Go's gateway would not (unpadded or
        // URL-safe base64, say) is refused as etcd refuses it.
        Some(Ok(r)) => match super::go_json::explain(route, body) {
            None => Ok(r),
            Some(why) => Err(Status::invalid_argument(why)),
        },
        Some(Err(e)) => Err(Status::invalid_argument(decode_error(route, body, &e))),
        None => Ok(Req::default()),
    }
}

/// Why a body did not decode, in the words of etcd's Go gateway where
/// [`super::go_json`] knows them, else serde's.
fn decode_error(route: &str, body: &[u8], e: &serde_json::Error) -> String {
    super::go_json::explain(route, body).unwrap_or_else(|| e.to_string())
}

impl Gateway {
    /// The whole request body, or why it could not be read: over the size
    /// limit, or the client's connection failed mid-body.
    async fn read_body(&self, body: Incoming) -> Result<Bytes, Status> {
        match Limited::new(body, self.max_body_bytes).collect().await {
            Ok(b) => Ok(b.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                Err(Status::invalid_argument("etcdserver: request is too large"))
            }
            Err(e) => Err(Status::cancelled(e.to_string())),
        }
    }
}

/// One gRPC message frame: uncompressed flag, big-endian length, bytes.
fn grpc_frame<M: Message>(msg: &M) -> Bytes {
    let len = msg.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    msg.encode_raw(&mut buf);
    buf.freeze()
}

/// A stream (Watch, LeaseKeepAlive, Snapshot) that failed before it began:
/// the unary error shape.
fn stream_error(status: &Status) -> Response<StreamOutput> {
    let (http, json) = error_json(status);
    error_alone(http, Bytes::from(json))
}

/// A streaming route's answer that is one error body and nothing else.
fn error_alone(http: StatusCode, body: Bytes) -> Response<StreamOutput> {
    let mut resp = Response::new(StreamOutput {
        lines: None,
        error: Some(body),
        slot: None,
    });
    *resp.status_mut() = http;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A streaming RPC's answer as the gateway sends it: a `{"result":..}` line
/// per response, an `{"error":..}` line if the stream fails. An RPC that
/// fails before its first response (a refused caller) gets that line alone
/// with the code's HTTP status: grpc-gateway v1 only learns of the failure
/// from the stream's first receive. (A body it cannot decode never reaches
/// the RPC: that is the unary error shape, [`stream_error`].)
fn stream_output<Resp: Serialize + Send + 'static>(
    answer: Result<tonic::Response<BoxStream<Resp>>, Status>,
) -> Response<StreamOutput> {
    let stream = match answer {
        Ok(stream) => stream,
        Err(status) => return error_alone(http_status(status.code()), error_line(&status)),
    };
    let lines = futures_lite::StreamExt::map(stream.into_inner(), |item| {
        Ok(match item {
            Ok(resp) => result_line(&resp),
            Err(status) => error_line(&status),
        })
    });
    json_stream(StreamOutput {
        lines: Some(Box::pin(lines)),
        error: None,
        slot: None,
    })
}

/// A streamed gateway answer with the headers the gateway sends: JSON,
/// and the gRPC response's content type passed on.
fn json_stream(output: StreamOutput) -> Response<StreamOutput> {
    let mut resp = Response::new(output);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp.headers_mut().insert(
        "grpc-metadata-content-type",
        HeaderValue::from_static("application/grpc"),
    );
    resp
}

/// The request side of a gateway stream: the decoded requests as gRPC
/// frames, then closed, as etcd's gateway closes its sending side once the
/// body is used up (a LeaseKeepAlive answer then ends; a Watch keeps its
/// watches until the client goes).
struct StreamInput {
    frames: VecDeque<Bytes>,
}

impl Body for StreamInput {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let _ = cx;
        Poll::Ready(this.frames.pop_front().map(|frame| Ok(Frame::data(frame))))
    }
}

/// What a gateway stream sends, line by line (or chunk by chunk).
type Lines = Pin<Box<dyn futures_lite::Stream<Item = Result<Bytes, Status>> + Send>>;

/// The answer of a gateway stream: a `{"result":..}` line per response
/// (or one error object); dropping it (the client hung up) drops the
/// service's response stream, so a watch's watchers go.
pub struct StreamOutput {
    /// Its lines (or chunks); an error ends the body with it, which cuts
    /// the connection or resets the stream.
    lines: Option<Lines>,
    /// A refusal before streaming began, as its whole body.
    error: Option<Bytes>,
    /// This stream's share of `--max-concurrent-streams`.
    slot: Option<StreamSlot>,
}

impl StreamOutput {
    /// A body of `chunks`, holding `slot` until it is sent; an error ends
    /// it (the connection is cut or the stream reset).
    pub fn chunks(
        chunks: futures_channel::mpsc::Receiver<Result<Bytes, Status>>,
        slot: Option<StreamSlot>,
    ) -> StreamOutput {
        StreamOutput {
            lines: Some(Box::pin(chunks)),
            error: None,
            slot,
        }
    }
}

fn result_line<T: Serialize>(resp: &T) -> Bytes {
    let mut line = b"{\"result\":".to_vec();
    if serde_json::to_writer(&mut line, resp).is_err() {
        return error_line(&Status::internal("cannot encode the response as JSON"));
    }
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

/// grpc-gateway v1's in-stream error object.
#[derive(Serialize)]
struct StreamError<'a> {
    grpc_code: i32,
    http_code: u16,
    message: &'a str,
    http_status: &'a str,
}

fn error_line(status: &Status) -> Bytes {
    let http = http_status(status.code());
    let error = StreamError {
        grpc_code: status.code() as i32,
        http_code: http.as_u16(),
        message: status.message(),
        http_status: http.canonical_reason().unwrap_or(""),
    };
    let mut line = b"{\"error\":".to_vec();
    let _ = serde_json::to_writer(&mut line, &error);
    // No delimiter after it, unlike a result line: grpc-gateway v1 writes
    // the error chunk alone and ends the stream.
    line.push(b'}');
    Bytes::from(line)
}

impl Body for StreamOutput {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(error) = this.error.take() {
            return Poll::Ready(Some(Ok(Frame::data(error))));
        }
        let Some(lines) = this.lines.as_mut() else {
            return Poll::Ready(None);
        };
        match lines.as_mut().poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(line))) => Poll::Ready(Some(Ok(Frame::data(line)))),
            Poll::Ready(Some(Err(status))) => {
                this.lines = None;
                Poll::Ready(Some(Err(status)))
            }
            Poll::Ready(None) => {
                this.lines = None;
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.error.is_none() && self.lines.is_none()
    }

    /// A refusal has a known length (sent with Content-Length, as Go does
    /// for a short answer); a stream is chunked.
    fn size_hint(&self) -> SizeHint {
        match (&self.lines, &self.error) {
            (None, Some(error)) => SizeHint::with_exact(error.len() as u64),
            (None, None) => SizeHint::with_exact(0),
            (Some(_), _) => SizeHint::default(),
        }
    }
}

fn json_response(status: StatusCode, json: Vec<u8>) -> HttpResponse {
    let mut resp = Response::new(Full::new(Bytes::from(json)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

#[derive(Serialize)]
struct GatewayError<'a> {
    error: &'a str,
    message: &'a str,
    code: i32,
}

fn error_response(status: &Status) -> HttpResponse {
    let (http, json) = error_json(status);
    json_response(http, json)
}

/// The gateway's error object and HTTP status for a gRPC status.
fn error_json(status: &Status) -> (StatusCode, Vec<u8>) {
    let body = GatewayError {
        error: status.message(),
        message: status.message(),
        code: status.code() as i32,
    };
    (
        http_status(status.code()),
        serde_json::to_vec(&body).unwrap_or_default(),
    )
}

/// grpc-gateway v1's HTTP status for a gRPC code (etcd 3.4 ships v1).
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::pb::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
    use super::super::pb::mvccpb::KeyValue;

    /// The exact JSON etcd 3.4's gateway wrote for this range (captured
    /// from `curl -XPOST .../v3/kv/range -d '{"key":"Zm9v"}'`).
    #[test]
    fn a_range_response_is_written_as_etcds_gateway_writes_it() {
        let resp = RangeResponse {
            header: Some(ResponseHeader {
                cluster_id: 2_037_210_783_374_497_686,
                member_id: 13_195_394_291_058_371_180,
                revision: 3,
                raft_term: 2,
            }),
            kvs: vec![KeyValue {
                key: "foo".into(),
                create_revision: 2,
                mod_revision: 3,
                version: 2,
                value: "bar".into(),
                lease: 0,
            }],
            more: false,
            count: 1,
        };
        assert_eq!(
            serde_json::to_string(&resp).unwrap(),
            r#"{"header":{"cluster_id":"2037210783374497686","member_id":"13195394291058371180","revision":"3","raft_term":"2"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"3","version":"2","value":"YmFy"}],"count":"1"}"#
        );
    }

    #[test]
    fn requests_accept_strings_numbers_and_enum_names() {
        let r: RangeRequest = serde_json::from_str(
            r#"{"key":"Zm9v","revision":"7","limit":2,"sort_order":"DESCEND","sort_target":1}"#,
        )
        .unwrap();
        assert_eq!(&r.key[..], b"foo");
        assert_eq!(
            (r.revision, r.limit, r.sort_order, r.sort_target),
            (7, 2, 2, 1)
        );
        assert!(serde_json::from_str::<RangeRequest>(r#"{"revision":"abc"}"#).is_err());
    }
}
