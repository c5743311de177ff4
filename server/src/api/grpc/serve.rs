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

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tonic::codegen::Service;

use super::pb::etcdserverpb::{
    auth_server::AuthServer, cluster_server::ClusterServer, kv_server::KvServer,
    lease_server::LeaseServer, maintenance_server::MaintenanceServer, watch_server::WatchServer,
};
use super::service::{
    AuthService, ClusterService, KvService, LeaseService, MaintenanceService, WatchService,
};
use crate::api::hyper_io::HyperStream;

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

/// The six etcd services of one shard.
#[derive(Clone)]
pub struct Router {
    kv: KvServer<KvService>,
    watch: WatchServer<WatchService>,
    lease: LeaseServer<LeaseService>,
    cluster: ClusterServer<ClusterService>,
    maintenance: MaintenanceServer<MaintenanceService>,
    auth: AuthServer<AuthService>,
}

impl Router {
    pub fn new(services: super::service::Services, max_message_bytes: usize) -> Router {
        Router {
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
        }
    }

    async fn route(
        mut self,
        req: hyper::Request<Incoming>,
    ) -> Result<hyper::Response<ResponseBody>, Infallible> {
        let path = req.uri().path();
        let resp = if path.starts_with("/etcdserverpb.KV/") {
            self.kv.call(req).await
        } else if path.starts_with("/etcdserverpb.Watch/") {
            self.watch.call(req).await
        } else if path.starts_with("/etcdserverpb.Lease/") {
            self.lease.call(req).await
        } else if path.starts_with("/etcdserverpb.Cluster/") {
            self.cluster.call(req).await
        } else if path.starts_with("/etcdserverpb.Maintenance/") {
            self.maintenance.call(req).await
        } else if path.starts_with("/etcdserverpb.Auth/") {
            self.auth.call(req).await
        } else {
            Ok(
                tonic::Status::unimplemented(format!("unknown service {path}"))
                    .into_http::<tonic::body::Body>(),
            )
        };
        let resp = match resp {
            Ok(r) => r,
            Err(never) => match never {},
        };
        Ok(resp.map(|body| body.boxed_unsync()))
    }
}

/// Serves the gRPC API on `listener`: one task per connection, hyper
/// spawns one per stream.
pub async fn serve(listener: glommio::net::TcpListener, router: Router) {
    crate::api::accept_loop(listener, "grpc", move |stream| {
        let router = router.clone();
        async move {
            let service = hyper::service::service_fn(move |req| router.clone().route(req));
            // A failing connection is the client's business (reset, bad
            // preface, protocol error answered with GOAWAY).
            let _ = hyper::server::conn::http2::Builder::new(GlommioExec)
                .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
                .serve_connection(HyperStream(stream), service)
                .await;
        }
    })
    .await
}

/// etcd's default (`--max-concurrent-streams` is unlimited in 3.4, but a
/// bound keeps one connection from monopolising a shard).
const MAX_STREAMS_PER_CONNECTION: u32 = 4096;
