//! etcd's "require leader" contract. Clients that send the gRPC metadata
//! `hasleader: true` (clientv3's `WithRequireLeader`: `etcdctl watch`,
//! Kubernetes' watches) want to hear about a member that lost its leader
//! instead of waiting on it forever (it cannot see new writes):
//!
//! - such a request on a member without a leader fails at once with
//!   `Unavailable` / `etcdserver: no leader`;
//! - such a stream (Watch, LeaseKeepAlive, Snapshot) is ended with that
//!   status once the member has had no leader for three election timeouts
//!   in a row, checked once per election timeout, as etcd's
//!   `monitorLeader` does (reconnecting a stream costs more than refusing a
//!   request, hence the patience).
//!
//! The client then reconnects, usually to another member. Owns the
//! per-shard registry of such streams and its timer; must never delay or
//! touch requests without the metadata.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_channel::oneshot;
use hyper::body::{Body, Frame, SizeHint};

use crate::error::ServerError;
use crate::owner::Backend;

/// The metadata key and value clientv3 sends with `WithRequireLeader`.
const REQUIRE_LEADER_KEY: &str = "hasleader";
const REQUIRE_LEADER_VALUE: &[u8] = b"true";
/// Election timeouts without a leader before streams are ended (etcd's
/// `maxNoLeaderCnt`).
const LEADERLESS_ROUNDS: u32 = 3;

/// The streaming RPCs etcd's stream interceptor guards.
const STREAM_PATHS: [&str; 4] = [
    "/etcdserverpb.Watch/Watch",
    "/etcdserverpb.Lease/LeaseKeepAlive",
    "/etcdserverpb.Maintenance/Snapshot",
    "/v3electionpb.Election/Observe",
];

/// Whether the request carries `hasleader: true`.
pub fn requires_leader(headers: &hyper::HeaderMap) -> bool {
    headers
        .get(REQUIRE_LEADER_KEY)
        .is_some_and(|v| v.as_bytes() == REQUIRE_LEADER_VALUE)
}

pub fn is_stream(path: &str) -> bool {
    STREAM_PATHS.contains(&path)
}

/// One shard's view: is there a leader, and the leader-requiring streams
/// to end when there has been none for a while.
pub struct LeaderGuard {
    backend: Backend,
    streams: RefCell<Vec<oneshot::Sender<()>>>,
    leaderless_rounds: Cell<u32>,
}

impl LeaderGuard {
    /// Starts the shard's monitor (one timer per election timeout).
    pub fn start(backend: Backend, election_timeout: Duration) -> Rc<LeaderGuard> {
        let guard = Rc::new(LeaderGuard {
            backend,
            streams: RefCell::new(Vec::new()),
            leaderless_rounds: Cell::new(0),
        });
        let monitor = Rc::downgrade(&guard);
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(election_timeout).await;
                let Some(guard) = monitor.upgrade() else {
                    return;
                };
                guard.check().await;
            }
        })
        .detach();
        guard
    }

    async fn check(&self) {
        self.streams.borrow_mut().retain(|s| !s.is_canceled());
        if self.has_leader().await {
            self.leaderless_rounds.set(0);
            return;
        }
        let rounds = self.leaderless_rounds.get().saturating_add(1);
        self.leaderless_rounds.set(rounds);
        if rounds >= LEADERLESS_ROUNDS {
            for stream in self.streams.borrow_mut().drain(..) {
                let _ = stream.send(());
            }
        }
    }

    pub async fn has_leader(&self) -> bool {
        matches!(self.backend.leader().await, Ok(leader) if leader != 0)
    }

    /// Wraps a leader-requiring stream's response body so that it ends
    /// with `etcdserver: no leader` when the monitor gives up on the leader.
    pub fn guard_stream<B>(&self, body: B) -> EndsWithoutLeader<B> {
        let (lost, on_lost) = oneshot::channel();
        self.streams.borrow_mut().push(lost);
        EndsWithoutLeader {
            body,
            on_lost: Some(on_lost),
            ended: false,
        }
    }
}

/// gRPC's answer for a member without a leader.
pub fn no_leader_status() -> tonic::Status {
    super::service::status_of(&ServerError::NoLeader)
}

/// The no-leader status as the trailers that end a gRPC response. The
/// message has only printable ASCII, so it needs no percent-encoding.
fn no_leader_trailers() -> hyper::HeaderMap {
    let status = no_leader_status();
    let mut trailers = hyper::HeaderMap::with_capacity(2);
    trailers.insert(
        "grpc-status",
        hyper::header::HeaderValue::from(status.code() as i32),
    );
    if let Ok(message) = hyper::header::HeaderValue::from_str(status.message()) {
        trailers.insert("grpc-message", message);
    }
    trailers
}

/// A response body that forwards its inner body until the leader is given
/// up on, then ends with the no-leader status as trailers. Cuts only
/// between the inner body's frames, which are whole gRPC messages.
pub struct EndsWithoutLeader<B> {
    body: B,
    on_lost: Option<oneshot::Receiver<()>>,
    ended: bool,
}

impl<B> Body for EndsWithoutLeader<B>
where
    B: Body<Data = Bytes, Error = tonic::Status> + Unpin,
{
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        if let Some(on_lost) = this.on_lost.as_mut() {
            match Pin::new(on_lost).poll(cx) {
                Poll::Ready(Ok(())) => {
                    this.ended = true;
                    return Poll::Ready(Some(Ok(Frame::trailers(no_leader_trailers()))));
                }
                // The guard is gone (the shard is stopping): just forward.
                Poll::Ready(Err(_)) => this.on_lost = None,
                Poll::Pending => {}
            }
        }
        let next = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = next {
            this.ended = true;
        }
        next
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
