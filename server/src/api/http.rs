//! The seed's curl API on `--listen-http-urls` (default 127.0.0.1:3379).
//!
//! ```text
//! PUT    /<key>            body = value          -> 204, X-Metcd-Revision
//! GET    /<key>[?rev=N]                          -> 200 value | 404
//! GET    /<key>?prefix[&limit=N&rev=N&keys_only&count_only&sort_order=descend&sort_target=mod]
//! GET    /<key>?range_end=<end> | ?from_key      -> 200 JSON {header, kvs, more, count}
//! DELETE /<key>[?prefix|range_end=<end>|from_key][&prev_kv] -> 200 JSON {header, deleted}
//! POST   /-/compact?revision=N                   -> 200 JSON {header}
//! POST   /-/members/replace?member=<hex id>&peer-urls=<url>[,<url>]
//!                                                -> 200 JSON {member, members}
//!        (replaces a voter in one joint-consensus step; metcd only)
//! GET    /health, /version
//! ```
//!
//! The key is the request path as sent (`/hello` is the key `/hello`, as in
//! raftexample), percent-decoded strictly: a bad escape or non-UTF-8 key is a
//! 400. Paths `/health`, `/version`, `/metrics` and `/-/...` are reserved.
//! Errors are JSON `{"error": <etcd's message>, "code": <gRPC code>}`.
//!
//! This module parses and renders; it never touches MVCC or Raft directly,
//! only through [`Backend`].

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE, DATE};
use hyper::service::Service as _;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::error::to_wire;
use super::grpc::chunked_range::RangeMeta;
use super::grpc::gateway::{self, Gateway};
use super::hyper_io::HyperStream;
use crate::auth::Requirement;
use crate::error::ServerError;
use crate::mvcc::{self, KeyValue};
use crate::owner::Backend;
use crate::tls::PeerStream;

pub const REVISION_HEADER: &str = "x-metcd-revision";

#[derive(Clone)]
pub struct HttpLimits {
    pub max_request_bytes: usize,
    /// Whether etcd auth is on (kept by the owner's apply). While it is,
    /// every key and admin request needs a token in `Authorization` (as
    /// etcd's JSON gateway takes it) with the same permissions gRPC needs.
    pub auth_enabled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

type HttpResponse = Response<Full<Bytes>>;

/// Serves the HTTP API on `listener`, one task per connection.
pub async fn serve(listener: crate::net::Listener, backend: Backend, limits: HttpLimits) {
    super::accept_loop(listener, "http", move |stream| {
        let backend = backend.clone();
        let limits = limits.clone();
        async move {
            let service = hyper::service::service_fn(move |req| {
                let backend = backend.clone();
                let limits = limits.clone();
                async move { Ok::<_, Infallible>(handle(&backend, limits, req).await) }
            });
            // Errors here are the client's (reset, malformed HTTP that hyper
            // already answered with 400): nothing to do but drop the socket.
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(HyperStream::new(PeerStream::from(stream)), service)
                .await;
        }
    })
    .await
}

/// etcd's HTTP/1.1 endpoints on the client URLs (`--listen-client-urls`,
/// shared with gRPC): `/version`, `/health` and `/metrics`, with etcd's
/// bodies and headers; anything else is Go's `404 page not found`.
pub async fn serve_etcd_http1<S>(io: HyperStream<S>, backend: Backend, gateway: Gateway)
where
    S: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let backend = backend.clone();
        let gateway = gateway.clone();
        async move { Ok::<_, Infallible>(client_url_request(&backend, &gateway, req).await) }
    });
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let answer = service.call(req);
        async move { answer.await.map(in_go_framing) }
    });
    // Go writes canonical header names (`Content-Type`); so do we.
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .title_case_headers(true)
        .serve_connection(io, service)
        .await;
}

/// Serves one of etcd's `--listen-metrics-urls`: `/metrics` and `/health`
/// over HTTP/1.1 (TLS first with `tls`, the client URLs' acceptor, as
/// etcd), and nothing else: the port is for monitoring, and no request
/// reaches the store's data through it.
pub async fn serve_metrics(
    listener: crate::net::Listener,
    backend: Backend,
    tls: Option<futures_rustls::TlsAcceptor>,
) {
    super::accept_loop(listener, "metrics", move |conn| {
        let backend = backend.clone();
        let tls = tls.clone();
        async move {
            let Some(stream) = crate::tls::accept_client(tls.as_ref(), conn).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let backend = backend.clone();
                async move {
                    let path = req.uri().path();
                    let resp = if matches!(path, "/metrics" | "/health") {
                        etcd_http1(&backend, req.method(), path).await
                    } else {
                        go_error(StatusCode::NOT_FOUND, "404 page not found\n")
                    };
                    Ok::<_, Infallible>(in_go_framing(resp))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .title_case_headers(true)
                .serve_connection(HyperStream::new(stream), service)
                .await;
        }
    })
    .await
}

/// One request on a client URL that is not gRPC, over HTTP/1.1 or HTTP/2
/// (etcd's mux serves both the same): the JSON gateway's POST routes, and
/// `/version`, `/health`, `/metrics`.
pub async fn client_url_request(
    backend: &Backend,
    gateway: &Gateway,
    req: Request<Incoming>,
) -> Response<Either<Full<Bytes>, gateway::StreamOutput>> {
    let path = req.uri().path().to_string();
    if req.method() == hyper::Method::POST {
        if let Some(route) = gateway::route(&path) {
            let authorization = req.headers().get(hyper::header::AUTHORIZATION).cloned();
            let body = req.into_body();
            if gateway::is_stream(route) {
                if let Some(resp) = gateway.serve_stream(route, body, authorization).await {
                    return with_cors(resp.map(Either::Right));
                }
                return with_cors(go_error(StatusCode::NOT_FOUND, "Not Found\n").map(Either::Left));
            }
            let resp = match gateway.serve(route, body, authorization).await {
                Some(resp) => resp,
                // Not a route the gateway serves: its mux's 404.
                None => go_error(StatusCode::NOT_FOUND, "Not Found\n").map(Either::Left),
            };
            return with_cors(resp);
        }
    }
    with_cors(etcd_http1(backend, req.method(), &path).await).map(Either::Left)
}

/// etcd's answers to `/version`, `/health` and `/metrics` over HTTP/1.1,
/// headers in the order Go writes them (sorted): `Allow` (405),
/// `Content-Type` and, for Go's `http.Error` (404, 405), `nosniff`. On a
/// client URL etcd adds its CORS headers ([`with_cors`]); its metrics
/// URLs have none.
async fn etcd_http1(backend: &Backend, method: &hyper::Method, path: &str) -> HttpResponse {
    const TEXT: &str = "text/plain; charset=utf-8";
    let get_only = matches!(path, "/version" | "/health");
    let (status, content_type, body) = match path {
        _ if get_only && method != hyper::Method::GET => (
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            Bytes::from_static(b"Method Not Allowed\n"),
        ),
        "/version" => (
            StatusCode::OK,
            JSON_CONTENT_TYPE,
            Bytes::from(version_body()),
        ),
        "/health" => match backend.status().await {
            Ok(report) if report.healthy => {
                count_health(&crate::metrics::HEALTH_SUCCESS);
                (
                    StatusCode::OK,
                    TEXT,
                    Bytes::from_static(br#"{"health":"true"}"#),
                )
            }
            _ => {
                count_health(&crate::metrics::HEALTH_FAILURES);
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    TEXT,
                    Bytes::from_static(br#"{"health":"false"}"#),
                )
            }
        },
        "/metrics" => match backend.metrics().await {
            // etcd's families only: clients of the etcd port compare them
            // with etcd's.
            Ok((page, _)) => (StatusCode::OK, METRICS_CONTENT_TYPE, Bytes::from(page)),
            Err(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                Bytes::from_static(b"metcd is stopping\n"),
            ),
        },
        _ => (
            StatusCode::NOT_FOUND,
            TEXT,
            Bytes::from_static(b"404 page not found\n"),
        ),
    };
    let body_len = body.len();
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    if status == StatusCode::METHOD_NOT_ALLOWED {
        headers.insert("allow", HeaderValue::from_static("GET"));
    }
    if path == "/health" && status != StatusCode::METHOD_NOT_ALLOWED {
        // etcd's health handler sets no type: Go sniffs one and writes it
        // after the length (see `in_go_framing`).
        headers.insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(body_len));
    }
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if matches!(
        status,
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
    ) {
        headers.insert(
            "x-content-type-options",
            HeaderValue::from_static("nosniff"),
        );
    }
    resp
}

fn count_health(counter: &std::sync::atomic::AtomicU64) {
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Go's buffer before it commits to a length: a handler that wrote more
/// (and set no `Content-Length`) is answered chunked.
const GO_BUFFERED_BYTES: u64 = 2048;

/// Go's `net/http` framing and header order, as etcd's client URLs answer
/// (visible with `curl -i`): the handler's headers (sorted by name, as the
/// answers here are built), then `Date`, then `Content-Length` when the
/// whole body fit Go's buffer, else `Transfer-Encoding: chunked` (HTTP/1.1;
/// an HTTP/1.0 answer is then delimited by the close), then a sniffed
/// `Content-Type` (the answers that have one carry it after their own
/// `Content-Length`). hyper would write `Date` last and announce every
/// length it knows, so both are decided here.
fn in_go_framing<B: hyper::body::Body>(resp: Response<B>) -> Response<GoFramed<B>> {
    let (mut parts, body) = resp.into_parts();
    let exact = body.size_hint().exact();
    let announced = parts.headers.contains_key(CONTENT_LENGTH);
    // Go never announces a length on answers that have no body.
    let bodiless = parts.status.is_informational()
        || matches!(
            parts.status,
            StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED
        );
    let fits = exact.filter(|n| *n <= GO_BUFFERED_BYTES && !bodiless);
    // An answer that carries its own `Date` keeps it where it is.
    let mut date = if parts.headers.contains_key(DATE) {
        None
    } else {
        HeaderValue::from_str(&httpdate::fmt_http_date(std::time::SystemTime::now())).ok()
    };
    let mut last_name = None;
    for (name, value) in std::mem::take(&mut parts.headers) {
        // The map yields a name once, then `None` for its further values.
        let Some(name) = name.or_else(|| last_name.clone()) else {
            continue;
        };
        if name == CONTENT_LENGTH {
            if let Some(date) = date.take() {
                parts.headers.append(DATE, date);
            }
        }
        last_name = Some(name.clone());
        parts.headers.append(name, value);
    }
    if let Some(date) = date.take() {
        parts.headers.append(DATE, date);
    }
    if let (Some(length), false) = (fits, announced) {
        parts
            .headers
            .append(CONTENT_LENGTH, HeaderValue::from(length));
    }
    let body = GoFramed {
        inner: body,
        announce_length: announced || fits.is_some(),
    };
    Response::from_parts(parts, body)
}

/// A body whose length hyper learns only when Go would announce it (see
/// [`in_go_framing`]); otherwise it goes chunked.
pub struct GoFramed<B> {
    inner: B,
    announce_length: bool,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for GoFramed<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<B::Data>, B::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        if self.announce_length {
            self.inner.size_hint()
        } else {
            hyper::body::SizeHint::default()
        }
    }
}

/// Go's `http.Error`: plain text and `nosniff`.
fn go_error(status: StatusCode, body: &'static str) -> HttpResponse {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// etcd's client handler allows cross-origin requests; its CORS headers
/// come first (Go writes headers sorted by name).
fn with_cors<B>(mut resp: Response<B>) -> Response<B> {
    let own = std::mem::take(resp.headers_mut());
    let headers = resp.headers_mut();
    headers.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("accept, content-type, authorization"),
    );
    headers.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
    );
    headers.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    headers.extend(own);
    resp
}

fn typed_response(status: StatusCode, content_type: &'static str, body: Bytes) -> HttpResponse {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

const JSON_CONTENT_TYPE: &str = "application/json";

/// Prometheus' text exposition format, as etcd serves it.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An answer of the seed API: whole, or a big range's JSON in chunks.
type SeedResponse = Response<Either<Full<Bytes>, gateway::StreamOutput>>;

fn whole(resp: HttpResponse) -> SeedResponse {
    resp.map(Either::Left)
}

async fn handle(backend: &Backend, limits: HttpLimits, req: Request<Incoming>) -> SeedResponse {
    match route(backend, limits, req).await {
        Ok(resp) => resp,
        Err(e) => whole(error_response(&e)),
    }
}

async fn route(
    backend: &Backend,
    limits: HttpLimits,
    req: Request<Incoming>,
) -> Result<SeedResponse, ServerError> {
    let path = req.uri().path().to_owned();
    let query = Query::parse(req.uri().query().unwrap_or(""))?;
    match path.as_str() {
        "/health" => return health(backend).await.map(whole),
        "/version" => {
            return Ok(whole(typed_response(
                StatusCode::OK,
                JSON_CONTENT_TYPE,
                Bytes::from(version_body()),
            )))
        }
        "/metrics" => {
            let (mut page, metcd) = backend.metrics().await?;
            page.push_str(&metcd);
            return Ok(whole(typed_response(
                StatusCode::OK,
                METRICS_CONTENT_TYPE,
                Bytes::from(page),
            )));
        }
        "/-/compact" if req.method() == Method::POST => {
            authorize(backend, &limits, &req, || Requirement::Admin).await?;
            return compact(backend, &query).await.map(whole);
        }
        "/-/members/replace" if req.method() == Method::POST => {
            authorize(backend, &limits, &req, || Requirement::Admin).await?;
            return replace_member(backend, &query).await.map(whole);
        }
        p if p.starts_with("/-/") => {
            return Err(ServerError::BadRequest(format!(
                "unknown admin endpoint {p}"
            )));
        }
        _ => {}
    }
    let key = Bytes::from(percent_decode_strict(&path)?);
    // Key requests are checked on the owner (while auth is on) with the
    // permissions a gRPC request of the same shape needs.
    let token = token_of(&req);
    match *req.method() {
        Method::GET | Method::HEAD => get(backend, key, &query, token).await,
        Method::PUT | Method::POST => {
            let value = read_body(req, limits.max_request_bytes).await?;
            put(backend, key, value, token).await.map(whole)
        }
        Method::DELETE => delete(backend, key, &query, token).await.map(whole),
        _ => {
            let mut resp = json_response(
                StatusCode::METHOD_NOT_ALLOWED,
                &json!({"error": format!("method {} is not allowed on keys", req.method()), "code": 3}),
                None,
            );
            resp.headers_mut().insert(
                ALLOW,
                HeaderValue::from_static("GET, HEAD, PUT, POST, DELETE"),
            );
            Ok(whole(resp))
        }
    }
}

/// The simple token in `Authorization`, as etcd's gateway takes it.
fn token_of(req: &Request<Incoming>) -> Option<String> {
    req.headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// etcd's permission check for the token in `Authorization` (nothing to
/// do while auth is off).
async fn authorize(
    backend: &Backend,
    limits: &HttpLimits,
    req: &Request<Incoming>,
    requirement: impl FnOnce() -> Requirement,
) -> Result<(), ServerError> {
    backend
        .authorize(&limits.auth_enabled, token_of(req), requirement)
        .await
}

async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, ServerError> {
    if let Some(len) = req.headers().get(CONTENT_LENGTH) {
        let len: usize = len
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ServerError::BadRequest("invalid Content-Length".into()))?;
        if len > limit {
            return Err(ServerError::RequestTooLarge);
        }
    }
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ServerError::RequestTooLarge),
        Err(e) => Err(ServerError::BadRequest(format!(
            "reading request body: {e}"
        ))),
    }
}

async fn health(backend: &Backend) -> Result<HttpResponse, ServerError> {
    let healthy = backend.status().await?.healthy;
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Ok(json_response(
        status,
        &json!({"health": healthy.to_string()}),
        None,
    ))
}

/// etcd's `/version` body, fields in etcd's order, plus metcd's version.
fn version_body() -> String {
    format!(
        r#"{{"etcdserver":"{}","etcdcluster":"{}","metcd":"{}"}}"#,
        crate::ETCD_API_VERSION,
        crate::ETCD_CLUSTER_VERSION,
        env!("CARGO_PKG_VERSION"),
    )
}

async fn compact(backend: &Backend, query: &Query) -> Result<HttpResponse, ServerError> {
    let revision = query
        .int("revision")?
        .ok_or_else(|| ServerError::BadRequest("missing ?revision=N".into()))?;
    let req = mvcc::Request::Compaction(mvcc::CompactionRequest {
        revision,
        physical: query.flag("physical"),
    });
    let resp = write(backend, req, None).await?;
    let rev = response_revision(&resp);
    Ok(json_response(
        StatusCode::OK,
        &json!({"header": {"revision": rev.to_string()}}),
        Some(rev),
    ))
}

async fn replace_member(backend: &Backend, query: &Query) -> Result<HttpResponse, ServerError> {
    let member = query
        .str("member")?
        .ok_or_else(|| ServerError::BadRequest("missing ?member=<hex member id>".into()))?;
    let old = u64::from_str_radix(&member, 16).map_err(|_| {
        ServerError::BadRequest(format!("member {member:?} is not a hex member id"))
    })?;
    let peer_urls: Vec<String> = query
        .str("peer-urls")?
        .ok_or_else(|| ServerError::BadRequest("missing &peer-urls=<url>[,<url>]".into()))?
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(String::from)
        .collect();
    let render = |m: &crate::members::MemberRecord| {
        json!({
            "id": format!("{:x}", m.id),
            "name": m.name,
            "peer_urls": m.peer_urls,
            "client_urls": m.client_urls,
            "is_learner": m.is_learner,
        })
    };
    let (change, _) = backend.member_replace(old, peer_urls).await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "member": change.added.as_ref().map(render),
            "members": change.members.iter().map(render).collect::<Vec<_>>(),
        }),
        None,
    ))
}

async fn write(
    backend: &Backend,
    req: mvcc::Request,
    token: Option<String>,
) -> Result<mvcc::Response, ServerError> {
    backend
        .write(req, token)
        .await
        .map(|(response, _)| response)
}

async fn put(
    backend: &Backend,
    key: Bytes,
    value: Bytes,
    token: Option<String>,
) -> Result<HttpResponse, ServerError> {
    let put = mvcc::PutRequest {
        key,
        value,
        ..Default::default()
    };
    mvcc::validate_put(&put)?;
    let resp = write(backend, mvcc::Request::Put(put), token).await?;
    let rev = response_revision(&resp);
    let mut out = Response::new(Full::new(Bytes::new()));
    *out.status_mut() = StatusCode::NO_CONTENT;
    set_revision(&mut out, rev);
    Ok(out)
}

/// Range end from the query: `prefix`, `range_end=...` or `from_key`.
fn range_end(key: &[u8], query: &Query) -> Result<Option<Bytes>, ServerError> {
    if query.flag("prefix") {
        return Ok(Some(Bytes::from(prefix_end(key))));
    }
    if query.flag("from_key") {
        return Ok(Some(Bytes::from_static(b"\0")));
    }
    match query.get("range_end") {
        Some(end) => Ok(Some(Bytes::from(end.to_vec()))),
        None => Ok(None),
    }
}

/// etcd's `GetPrefixRangeEnd`: the smallest key greater than every key with
/// this prefix; "\0" (= to the end) when no such key exists.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.last_mut() {
        if *last < 0xff {
            *last += 1;
            return end;
        }
        end.pop();
    }
    vec![0]
}

async fn get(
    backend: &Backend,
    key: Bytes,
    query: &Query,
    token: Option<String>,
) -> Result<SeedResponse, ServerError> {
    let end = range_end(&key, query)?;
    let is_range =
        end.is_some() || query.has("limit") || query.flag("count_only") || query.flag("keys_only");
    let req = mvcc::RangeRequest {
        key,
        range_end: end.unwrap_or_default(),
        limit: query.int("limit")?.unwrap_or(0),
        revision: query.int("rev")?.unwrap_or(0),
        keys_only: query.flag("keys_only"),
        count_only: query.flag("count_only"),
        sort_order: match query.str("sort_order")?.as_deref() {
            None | Some("none") => mvcc::SortOrder::None,
            Some("ascend") => mvcc::SortOrder::Ascend,
            Some("descend") => mvcc::SortOrder::Descend,
            Some(other) => {
                return Err(ServerError::BadRequest(format!(
                    "invalid sort_order {other:?}"
                )))
            }
        },
        sort_target: match query.str("sort_target")?.as_deref() {
            None | Some("key") => mvcc::SortTarget::Key,
            Some("version") => mvcc::SortTarget::Version,
            Some("create") => mvcc::SortTarget::Create,
            Some("mod") => mvcc::SortTarget::Mod,
            Some("value") => mvcc::SortTarget::Value,
            Some(other) => {
                return Err(ServerError::BadRequest(format!(
                    "invalid sort_target {other:?}"
                )))
            }
        },
        serializable: query.flag("serializable"),
        ..Default::default()
    };
    mvcc::validate_range(&req)?;
    let backend = backend.clone();
    // In the shard's reads queue, JSON encoding included (crate::sched).
    crate::sched::off_the_write_path(
        async move { range_answer(&backend, req, token, is_range).await },
    )
    .await
    .unwrap_or(Err(ServerError::Stopped))
}

async fn range_answer(
    backend: &Backend,
    req: mvcc::RangeRequest,
    token: Option<String>,
    is_range: bool,
) -> Result<SeedResponse, ServerError> {
    use super::grpc::chunked_range::{self as chunked, JsonAnswer};
    if is_range {
        let range = match backend.range_read(req, token).await.0? {
            crate::owner::RangeRead::Whole(resp) => {
                let meta = RangeMeta {
                    revision: resp.header.revision,
                    more: resp.more,
                    count: resp.count,
                };
                return Ok(whole(range_json(&resp.kvs, meta)));
            }
            crate::owner::RangeRead::Chunked(range) => range,
        };
        let rev = range.revision;
        let answer = chunked::answer_json(range, seed_range_shape()).await?;
        return Ok(match answer {
            JsonAnswer::Whole((kvs, meta)) => whole(range_json(kvs.as_slice(), meta)),
            JsonAnswer::Chunks(chunks) => {
                let mut resp = Response::new(gateway::StreamOutput::chunks(chunks, None));
                resp.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static(JSON_CONTENT_TYPE));
                resp.headers_mut()
                    .insert(REVISION_HEADER, HeaderValue::from(rev));
                resp.map(Either::Right)
            }
        });
    }
    let resp = backend.range(req, token).await.0?;
    let rev = resp.header.revision;
    match resp.kvs.first() {
        Some(kv) => {
            let mut out = Response::new(Full::new(kv.value.clone()));
            set_revision(&mut out, rev);
            let h = out.headers_mut();
            h.insert(
                "x-metcd-create-revision",
                HeaderValue::from(kv.create_revision),
            );
            h.insert("x-metcd-mod-revision", HeaderValue::from(kv.mod_revision));
            h.insert("x-metcd-version", HeaderValue::from(kv.version));
            Ok(out)
        }
        None => Ok(json_response(
            StatusCode::NOT_FOUND,
            &json!({"error": "key not found", "code": 5}),
            Some(rev),
        )),
    }
    .map(whole)
}

/// A range's answer: `{"count":..,"header":{"revision":..},"kvs":[..],"more":..}`.
fn range_body(kvs: Value, meta: RangeMeta) -> Value {
    json!({
        "header": {"revision": meta.revision.to_string()},
        "kvs": kvs,
        "more": meta.more,
        "count": meta.count.to_string(),
    })
}

fn range_json(kvs: &[KeyValue], meta: RangeMeta) -> HttpResponse {
    let kvs = Value::Array(kvs.iter().map(kv_json).collect());
    json_response(StatusCode::OK, &range_body(kvs, meta), Some(meta.revision))
}

/// [`range_json`]'s bytes, written around the key-values by
/// [`super::grpc::chunked_range::answer_json`] for a big range.
fn seed_range_shape() -> super::grpc::chunked_range::JsonShape {
    super::grpc::chunked_range::JsonShape {
        around: Box::new(|meta| {
            let empty = serde_json::to_vec(&range_body(Value::Array(Vec::new()), meta))?;
            let Some(at) = empty.windows(KVS_EMPTY.len()).position(|w| w == KVS_EMPTY) else {
                return Err(serde::ser::Error::custom(
                    "no key-values in the answer's JSON",
                ));
            };
            let (head, tail) = empty.split_at(at + KVS_EMPTY.len() - 1);
            let mut tail = tail.to_vec();
            tail.push(b'\n');
            Ok((head.to_vec(), tail))
        }),
        write_kv: |buf, kv| serde_json::to_writer(buf, &kv_json(kv)),
    }
}

/// Where the key-values go in [`range_body`]'s JSON.
const KVS_EMPTY: &[u8] = b"\"kvs\":[]";

async fn delete(
    backend: &Backend,
    key: Bytes,
    query: &Query,
    token: Option<String>,
) -> Result<HttpResponse, ServerError> {
    let del = mvcc::DeleteRangeRequest {
        range_end: range_end(&key, query)?.unwrap_or_default(),
        key,
        prev_kv: query.flag("prev_kv"),
    };
    mvcc::validate_delete_range(&del)?;
    let resp = write(backend, mvcc::Request::DeleteRange(del), token).await?;
    let rev = response_revision(&resp);
    let mvcc::Response::DeleteRange(d) = &resp else {
        return Err(ServerError::Stopped);
    };
    let mut body =
        json!({"header": {"revision": rev.to_string()}, "deleted": d.deleted.to_string()});
    if !d.prev_kvs.is_empty() {
        body["prev_kvs"] = Value::Array(d.prev_kvs.iter().map(kv_json).collect());
    }
    Ok(json_response(StatusCode::OK, &body, Some(rev)))
}

fn response_revision(resp: &mvcc::Response) -> i64 {
    resp.header().revision
}

fn kv_json(kv: &KeyValue) -> Value {
    let mut v = json!({
        "key": String::from_utf8_lossy(&kv.key),
        "create_revision": kv.create_revision.to_string(),
        "mod_revision": kv.mod_revision.to_string(),
        "version": kv.version.to_string(),
    });
    if !kv.value.is_empty() {
        match std::str::from_utf8(&kv.value) {
            Ok(s) => v["value"] = Value::String(s.to_owned()),
            Err(_) => v["value_base64"] = Value::String(base64_encode(&kv.value)),
        }
    }
    if kv.lease != 0 {
        v["lease"] = Value::String(kv.lease.to_string());
    }
    v
}

fn base64_encode(data: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn set_revision(resp: &mut HttpResponse, rev: i64) {
    resp.headers_mut()
        .insert(REVISION_HEADER, HeaderValue::from(rev));
}

fn json_response(status: StatusCode, body: &Value, rev: Option<i64>) -> HttpResponse {
    let mut bytes = serde_json::to_vec(body).unwrap_or_default();
    bytes.push(b'\n');
    let mut resp = typed_response(status, JSON_CONTENT_TYPE, Bytes::from(bytes));
    if let Some(rev) = rev {
        set_revision(&mut resp, rev);
    }
    resp
}

fn error_response(e: &ServerError) -> HttpResponse {
    let wire = to_wire(e);
    let status = StatusCode::from_u16(wire.http).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(
        status,
        &json!({"error": wire.message, "code": wire.grpc as i32}),
        None,
    )
}

/// Strict percent-decoding: every `%` must be followed by two hex digits,
/// and the result must be UTF-8 (keys are shown as text in JSON).
pub fn percent_decode_strict(s: &str) -> Result<Vec<u8>, ServerError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    ServerError::BadRequest(format!(
                        "invalid percent-encoding at byte {i} of {s:?}"
                    ))
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    if std::str::from_utf8(&out).is_err() {
        return Err(ServerError::BadRequest(format!(
            "key {s:?} is not valid UTF-8 after percent-decoding"
        )));
    }
    Ok(out)
}

/// Parsed query string; values percent-decoded (`+` is a space).
struct Query(Vec<(String, Vec<u8>)>);

impl Query {
    fn parse(q: &str) -> Result<Query, ServerError> {
        let mut pairs = Vec::new();
        for part in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            let v = v.replace('+', " ");
            pairs.push((k.to_owned(), percent_decode_strict(&v)?));
        }
        Ok(Query(pairs))
    }

    fn get(&self, name: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// `?x`, `?x=true`, `?x=1` are true; absent, `false`, `0` are false.
    fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some(v) if v.is_empty() || v == b"true" || v == b"1")
    }

    fn str(&self, name: &str) -> Result<Option<String>, ServerError> {
        self.get(name)
            .map(|v| {
                String::from_utf8(v.to_vec())
                    .map_err(|_| ServerError::BadRequest(format!("invalid {name}")))
            })
            .transpose()
    }

    fn int(&self, name: &str) -> Result<Option<i64>, ServerError> {
        self.str(name)?
            .map(|v| {
                v.parse::<i64>().map_err(|_| {
                    ServerError::BadRequest(format!("invalid {name}={v:?}: expected an integer"))
                })
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A big range's JSON, written around its key-values in chunks, is the
    /// bytes the whole answer has: with and without `more`, text and binary
    /// values, leases, and no key-values at all.
    #[test]
    fn a_chunked_range_is_the_whole_ranges_json() {
        let kv = |key: &str, value: &[u8], lease| KeyValue {
            key: Bytes::from(key.to_string()),
            create_revision: 2,
            mod_revision: 5,
            version: 3,
            value: Bytes::from(value.to_vec()),
            lease,
        };
        let kvs = [
            kv("/a", b"text", 0),
            kv("/b", b"\xff\x00", 7),
            kv("/c", b"", 0),
        ];
        for (n, more) in [(0, false), (1, true), (3, false), (3, true)] {
            let meta = RangeMeta {
                revision: 9,
                more,
                count: 40,
            };
            let shape = seed_range_shape();
            let (mut json, tail) = (shape.around)(meta).unwrap();
            for (i, kv) in kvs[..n].iter().enumerate() {
                if i > 0 {
                    json.push(b',');
                }
                (shape.write_kv)(&mut json, kv).unwrap();
            }
            json.extend_from_slice(&tail);
            let whole = range_json(&kvs[..n], meta);
            let whole = futures_lite::future::block_on(whole.into_body().collect())
                .unwrap()
                .to_bytes();
            assert_eq!(
                String::from_utf8_lossy(&json),
                String::from_utf8_lossy(&whole),
                "{n} key-values, more {more}"
            );
        }
    }

    #[test]
    fn strict_percent_decoding() {
        assert_eq!(percent_decode_strict("/a%20b").unwrap(), b"/a b");
        assert!(percent_decode_strict("/a%zz").is_err());
        assert!(percent_decode_strict("/a%2").is_err());
        assert!(percent_decode_strict("/a%ff").is_err());
        assert!(percent_decode_strict("/a%+f").is_err());
        assert_eq!(
            percent_decode_strict("/%E4%BD%A0").unwrap(),
            "/你".as_bytes()
        );
    }

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/a"), b"/b");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn base64_matches_rfc4648() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foo"), "Zm9v");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
    }
}
