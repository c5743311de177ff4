//! Serving etcd's gRPC API (HTTP/2) on the glommio shard executors, with no
//! tokio runtime: hyper's HTTP/2 server over our `HyperStream`, its tasks
//! spawned with `glommio::spawn_local`, and requests routed by path to the
//! tonic-generated service servers.
//!
//! Must never: hop threads (the services hold per-core state behind
//! `SendWrapper`, which panics on another thread; glommio never moves a
//! task, so it never does).

use std::convert::Infallible;
use std::future::Future;
use std::rc::Rc;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use send_wrapper::SendWrapper;
use tonic::codegen::Service;

use super::chunked_range::{ChunkedBody, MayChunk};
use super::gateway::Gateway;
use super::metrics::{self, Count, Counted, ShardCounters, CANCELED};
use super::pb::etcdserverpb::{
    auth_server::AuthServer, cluster_server::ClusterServer, kv_server::KvServer,
    lease_server::LeaseServer, maintenance_server::MaintenanceServer, watch_server::WatchServer,
};
use super::pb::v3electionpb::election_server::ElectionServer;
use super::pb::v3lockpb::lock_server::LockServer;
use super::recipes::{ElectionService, LockService};
use super::require_leader::{is_stream, no_leader_status, requires_leader, LeaderGuard};
use super::service::{
    AuthService, ClusterService, KvService, LeaseService, MaintenanceService, WatchService,
};
use crate::api::hyper_io::HyperStream;
use crate::tls::PeerStream;

/// Spawns hyper's connection tasks on the current glommio executor.
#[derive(Clone, Copy)]
pub struct GlommioExec;

impl<F> hyper::rt::Executor<F> for GlommioExec
where
    F: Future + 'static,
{
    fn execute(&self, fut: F) {
        glommio::spawn_local(fut).detach();
    }
}

type ResponseBody = UnsyncBoxBody<Bytes, tonic::Status>;

/// The etcd services of one shard.
#[derive(Clone)]
pub struct Router {
    kv: KvServer<KvService>,
    watch: WatchServer<WatchService>,
    lease: LeaseServer<LeaseService>,
    cluster: ClusterServer<ClusterService>,
    maintenance: MaintenanceServer<MaintenanceService>,
    auth: AuthServer<AuthService>,
    lock: LockServer<LockService>,
    election: ElectionServer<ElectionService>,
    leader: SendWrapper<Rc<LeaderGuard>>,
    /// What a request that is not gRPC gets (the JSON gateway, `/version`,
    /// `/health`, `/metrics`): the same as over HTTP/1.1, as etcd's mux.
    http: SendWrapper<Rc<(crate::owner::Backend, Gateway)>>,
    /// This shard's gRPC metrics (etcd's grpc_server_* families).
    counters: Option<ShardCounters>,
}

impl Router {
    pub fn new(
        services: super::service::Services,
        max_message_bytes: usize,
        leader: Rc<LeaderGuard>,
        backend: crate::owner::Backend,
        counters: Option<ShardCounters>,
        max_concurrent_streams: u32,
    ) -> (Router, Gateway) {
        let gateway = Gateway {
            kv: services.kv.clone(),
            watch: services.watch.clone(),
            lease: services.lease.clone(),
            cluster: services.cluster.clone(),
            maintenance: services.maintenance.clone(),
            auth: services.auth.clone(),
            lock: services.lock.clone(),
            election: services.election.clone(),
            max_body_bytes: max_message_bytes,
            max_concurrent_streams,
        };
        let router = Router {
            leader: SendWrapper::new(leader),
            http: SendWrapper::new(Rc::new((backend, gateway.clone()))),
            counters,
            kv: KvServer::new(services.kv)
                .max_decoding_message_size(max_message_bytes)
                .max_encoding_message_size(usize::MAX),
            watch: WatchServer::new(services.watch).max_decoding_message_size(max_message_bytes),
            lease: LeaseServer::new(services.lease).max_decoding_message_size(max_message_bytes),
            cluster: ClusterServer::new(services.cluster)
                .max_decoding_message_size(max_message_bytes),
            maintenance: MaintenanceServer::new(services.maintenance)
                .max_decoding_message_size(max_message_bytes)
                .max_encoding_message_size(usize::MAX),
            auth: AuthServer::new(services.auth).max_decoding_message_size(max_message_bytes),
            lock: LockServer::new(services.lock).max_decoding_message_size(max_message_bytes),
            election: ElectionServer::new(services.election)
                .max_decoding_message_size(max_message_bytes),
        };
        (router, gateway)
    }

    /// Routes one request. Kept small (the router is shared, not cloned,
    /// and the awaited calls are boxed): hyper moves this future into the
    /// stream's task, and its size is copied for every request.
    async fn route(
        self: Rc<Self>,
        req: hyper::Request<Incoming>,
    ) -> Result<hyper::Response<ResponseBody>, Infallible> {
        if !is_grpc(req.headers()) {
            let http = Rc::clone(&self.http);
            let resp = Box::pin(crate::api::http::client_url_request(&http.0, &http.1, req)).await;
            // Either boxes its bodies' errors: a chunked range's (or a
            // stream's) failure ends the answer as a gRPC internal error.
            let boxed = |body: http_body_util::Either<_, _>| {
                body.map_err(|e| tonic::Status::internal(e.to_string()))
                    .boxed_unsync()
            };
            return Ok(resp.map(boxed));
        }
        if let Some(c) = self.counters {
            let version = req.headers().get("client-api-version");
            let stream = is_stream(req.uri().path());
            c.counters
                .client_request(c.shard, version.map(|v| v.as_bytes()), stream);
        }
        let leader_required = requires_leader(req.headers());
        if leader_required && !Box::pin(SendWrapper::new(self.leader.has_leader())).await {
            return Ok(no_leader_status()
                .into_http::<tonic::body::Body>()
                .map(|body| body.boxed_unsync()));
        }
        let guard_stream = leader_required && is_stream(req.uri().path());
        // Counted from here, as etcd's interceptors count after the
        // leader check.
        let since = std::time::Instant::now();
        let counted = self
            .counters
            .and_then(|c| Some((c, metrics::method_of(req.uri().path())?)));
        if let Some((c, method)) = counted {
            c.counters.started(c.shard, method);
        }
        let mut req =
            req.map(|body| Counted::new(body, counted.map(|(c, m)| (c, m, Count::Received))));
        let resp = if req.uri().path() == RANGE_PATH {
            req.extensions_mut().insert(MayChunk);
            range_off_the_write_path(self.dispatch(req)).await
        } else {
            match self.dispatch(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            }
        };
        let resp = match counted {
            // A refusal before any answer: its status is in the headers.
            Some((c, method)) if metrics::status_of(resp.headers()).is_some() => {
                let code = metrics::status_of(resp.headers()).unwrap_or(CANCELED);
                c.counters.handled(c.shard, method, code, since);
                resp.map(|body| body.boxed_unsync())
            }
            Some((c, method)) => resp.map(|body| {
                Counted::new(body, Some((c, method, Count::SentAndHandled { since })))
                    .boxed_unsync()
            }),
            None => resp.map(|body| body.boxed_unsync()),
        };
        if guard_stream {
            return Ok(resp.map(|body| self.leader.guard_stream(body).boxed_unsync()));
        }
        Ok(resp)
    }

    /// The service's boxed future for `req`, chosen by path. A tonic
    /// server takes `&mut self` only to clone its shared state into the
    /// future it returns, so a clone of the one server asked is enough.
    fn dispatch(
        &self,
        req: hyper::Request<Counted<Incoming>>,
    ) -> std::pin::Pin<
        Box<dyn Future<Output = Result<hyper::Response<tonic::body::Body>, Infallible>> + Send>,
    > {
        let path = req.uri().path();
        if path.starts_with("/etcdserverpb.KV/") {
            self.kv.clone().call(req)
        } else if path.starts_with("/etcdserverpb.Watch/") {
            self.watch.clone().call(req)
        } else if path.starts_with("/etcdserverpb.Lease/") {
            self.lease.clone().call(req)
        } else if path.starts_with("/etcdserverpb.Cluster/") {
            self.cluster.clone().call(req)
        } else if path.starts_with("/etcdserverpb.Maintenance/") {
            self.maintenance.clone().call(req)
        } else if path.starts_with("/etcdserverpb.Auth/") {
            self.auth.clone().call(req)
        } else if path.starts_with("/v3lockpb.Lock/") {
            self.lock.clone().call(req)
        } else if path.starts_with("/v3electionpb.Election/") {
            self.election.clone().call(req)
        } else {
            let status = tonic::Status::unimplemented(format!("unknown service {path}"));
            Box::pin(std::future::ready(Ok(
                status.into_http::<tonic::body::Body>()
            )))
        }
    }
}

const RANGE_PATH: &str = "/etcdserverpb.KV/Range";

/// A Range call run in the shard's reads queue ([`crate::sched`]) to the
/// end of its encoding: the service (index walk, values, conversion) and
/// tonic's protobuf encoding of the answer, collected there, so that
/// neither a big range's walk nor its encoding runs on the write path.
/// The connection's task only sends the encoded bytes. A big answer in
/// key order is instead encoded chunk by chunk in that queue as the
/// client reads it ([`super::chunked_range`]).
async fn range_off_the_write_path(
    call: std::pin::Pin<
        Box<dyn Future<Output = Result<hyper::Response<tonic::body::Body>, Infallible>> + Send>,
    >,
) -> hyper::Response<tonic::body::Body> {
    let encoded = crate::sched::off_the_write_path(async move {
        let resp = match call.await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        let (mut parts, body) = resp.into_parts();
        if let Some(chunked) = parts.extensions.remove::<ChunkedBody>() {
            if let Some(body) = chunked.take() {
                return hyper::Response::from_parts(parts, body);
            }
        }
        match body.collect().await {
            Ok(collected) => hyper::Response::from_parts(parts, encoded_body(collected)),
            Err(status) => status.into_http(),
        }
    })
    .await;
    encoded.unwrap_or_else(|| {
        tonic::Status::internal("etcdserver: range work could not be scheduled").into_http()
    })
}

/// A collected gRPC answer as a body again. One with neither data nor
/// trailers (an error answered in the headers, gRPC's "trailers-only")
/// must stay an ended body, so the headers go out with END_STREAM: a Go
/// client reads the status there only then.
fn encoded_body(collected: http_body_util::Collected<Bytes>) -> tonic::body::Body {
    let trailers = collected.trailers().cloned();
    let data = collected.to_bytes();
    if data.is_empty() && trailers.is_none() {
        return tonic::body::Body::empty();
    }
    let frames: Vec<Result<_, Infallible>> = (!data.is_empty())
        .then(|| hyper::body::Frame::data(data))
        .into_iter()
        .chain(trailers.map(hyper::body::Frame::trailers))
        .map(Ok)
        .collect();
    tonic::body::Body::new(http_body_util::StreamBody::new(futures_lite::stream::iter(
        frames,
    )))
}

/// Serves the gRPC API on `listener`: one task per connection, hyper
/// spawns one per stream. As etcd does on its client URLs, a connection
/// that does not open with the HTTP/2 preface is HTTP/1.1 and gets etcd's
/// `/version`, `/health` and `/metrics` ([`crate::api::http::serve_etcd_http1`]).
///
/// With `tls` (`--cert-file`) every connection is TLS first; one that
/// fails the handshake is dropped, never served in plaintext.
pub async fn serve(
    listener: crate::net::Listener,
    router: Router,
    gateway: Gateway,
    backend: crate::owner::Backend,
    tls: Option<futures_rustls::TlsAcceptor>,
    cert_users: bool,
    max_concurrent_streams: u32,
) {
    crate::api::accept_loop(listener, "grpc", move |conn| {
        let router = router.clone();
        let gateway = gateway.clone();
        let backend = backend.clone();
        let tls = tls.clone();
        async move {
            let Some(mut stream) = crate::tls::accept_client(tls.as_ref(), conn).await else {
                return;
            };
            let cert_user = match &stream {
                PeerStream::Server(s) if cert_users => s
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(|cert| crate::der::certificate_common_name(cert))
                    .map(|name| CertUser(std::sync::Arc::from(name))),
                _ => None,
            };
            let Ok(head) = read_preface(&mut stream).await else {
                return;
            };
            if head != H2_PREFACE {
                let io = HyperStream::with_replay(stream, head);
                crate::api::http::serve_etcd_http1(io, backend, gateway).await;
                return;
            }
            let router = Rc::new(router);
            let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                if let Some(user) = &cert_user {
                    req.extensions_mut().insert(user.clone());
                }
                router.clone().route(req)
            });
            // A failing connection is the client's business (reset, bad
            // preface, protocol error answered with GOAWAY).
            let _ = hyper::server::conn::http2::Builder::new(GlommioExec)
                .max_concurrent_streams(max_concurrent_streams)
                // etcd's gRPC server sends no `date`; formatting and
                // encoding one per response is work nobody reads.
                .auto_date_header(false)
                .serve_connection(HyperStream::with_replay(stream, head), service)
                .await;
        }
    })
    .await
}

/// The user a verified client certificate names (its subject's common
/// name), given to every gRPC request of its connection: with
/// `--client-cert-auth`, a request without a token is this user's, as in
/// etcd. The JSON gateway's requests never carry it (etcd ignores the
/// certificate of a gateway request too).
#[derive(Clone, Debug)]
pub struct CertUser(pub std::sync::Arc<str>);

/// Whether an HTTP/2 request is gRPC (etcd's test: its content type
/// names `application/grpc`); the others are the JSON gateway's and
/// etcd's HTTP endpoints.
fn is_grpc(headers: &hyper::HeaderMap) -> bool {
    headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/grpc"))
}

/// What every HTTP/2 connection with prior knowledge (gRPC) starts with.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads the connection's first bytes: the whole HTTP/2 preface, or up to
/// the first byte that differs from it (then it is HTTP/1).
async fn read_preface(stream: &mut PeerStream) -> std::io::Result<Vec<u8>> {
    use futures_lite::AsyncReadExt;
    let mut head = vec![0u8; H2_PREFACE.len()];
    let mut n = 0;
    while n < head.len() && head[..n] == H2_PREFACE[..n] {
        let got = stream.read(&mut head[n..]).await?;
        if got == 0 {
            break;
        }
        n += got;
    }
    head.truncate(n);
    Ok(head)
}
