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
//! differently from the gRPC services. Streaming RPCs (Watch, LeaseKeepAlive,
//! Snapshot) are not served here.

use std::future::Future;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Code, Status};

use super::pb::etcdserverpb::{
    auth_server::Auth, cluster_server::Cluster, kv_server::Kv, lease_server::Lease,
    maintenance_server::Maintenance,
};
use super::service::{AuthService, ClusterService, KvService, LeaseService, MaintenanceService};

type HttpResponse = Response<Full<Bytes>>;

/// The unary services, shared with the gRPC router.
#[derive(Clone)]
pub struct Gateway {
    pub(super) kv: KvService,
    pub(super) lease: LeaseService,
    pub(super) cluster: ClusterService,
    pub(super) maintenance: MaintenanceService,
    pub(super) auth: AuthService,
    /// Largest request body read (`--max-request-bytes` plus gRPC's slack).
    pub(super) max_body_bytes: usize,
}

/// The route of `path` under etcd's gateway prefixes (`/v3/`, and the
/// deprecated `/v3beta/` that etcd 3.4 still serves).
pub fn route(path: &str) -> Option<&str> {
    path.strip_prefix("/v3/")
        .or_else(|| path.strip_prefix("/v3beta/"))
}

impl Gateway {
    /// Answers one gateway request (`route` from [`route`]), or `None` when
    /// the route is not one of etcd 3.4's unary gateway routes (HashKV has
    /// none in 3.4; the streaming ones are not served).
    pub async fn serve(&self, route: &str, body: Incoming) -> Option<HttpResponse> {
        let body = match Limited::new(body, self.max_body_bytes).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return Some(error_response(&Status::invalid_argument(
                    "etcdserver: request is too large",
                )))
            }
        };
        let (kv, lease, cluster) = (&self.kv, &self.lease, &self.cluster);
        let (maintenance, auth) = (&self.maintenance, &self.auth);
        let b = &body;
        Some(match route {
            "kv/range" => unary(b, |r| Kv::range(kv, r)).await,
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
            _ => return None,
        })
    }
}

/// Decodes the JSON request (an empty body is the default request, as the
/// gateway treats EOF), runs the RPC and encodes its answer.
async fn unary<Req, Resp, F, Fut>(body: &Bytes, rpc: F) -> HttpResponse
where
    Req: DeserializeOwned + Default,
    Resp: Serialize,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let request = if body.iter().all(u8::is_ascii_whitespace) {
        Req::default()
    } else {
        match serde_json::from_slice::<Req>(body) {
            Ok(r) => r,
            Err(e) => return error_response(&Status::invalid_argument(e.to_string())),
        }
    };
    match rpc(tonic::Request::new(request)).await {
        Ok(resp) => match serde_json::to_vec(resp.get_ref()) {
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
    let body = GatewayError {
        error: status.message(),
        message: status.message(),
        code: status.code() as i32,
    };
    let json = serde_json::to_vec(&body).unwrap_or_default();
    json_response(http_status(status.code()), json)
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
