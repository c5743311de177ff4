//! Reads on the shard that took them: a range, a read-only txn and a
//! watcher's history run against the owner's published read view
//! ([`crate::read_view`]) in the shard's reads queue ([`crate::sched`]),
//! a slice at a time; the owner answers only their gate (the read barrier
//! of a linearizable read, the permission check).
//!
//! Must never: walk or load a read on the owner's behalf, or hold the
//! store's read lock for more than one slice.

use engine::any::AnyEngine;

use super::Backend;
use crate::error::{Result, ServerError};
use crate::mvcc::{self, StoreReader};
use crate::read_view::ReadView;

/// Index keys one slice of a range's walk examines: tens of microseconds
/// under the store's read lock, which the owner's next apply waits for at
/// most.
pub const RANGE_WALK_SLICE: usize = 2048;

/// Values loaded between two yields while finishing a range: a chunk
/// costs tens of microseconds, so a put queued behind a big scan waits
/// about that long, not for the whole scan.
pub const RANGE_LOAD_CHUNK: usize = 256;

impl Backend {
    fn read_view(&self) -> std::sync::Arc<ReadView> {
        match self {
            Backend::Local(node) => node.read_view(),
            Backend::Remote(remote) => remote.view.clone(),
        }
    }

    /// A read's gate ([`crate::read_view`]): passes at once, or after the
    /// owner's read barrier and permission check. Returns the store to
    /// read (taken after the gate, so it holds everything the barrier
    /// waited for) and the Raft term for the response header.
    async fn read_gate(
        &self,
        linearizable: bool,
        token: Option<String>,
        requirement: impl FnOnce() -> crate::auth::Requirement,
    ) -> Result<(StoreReader<AnyEngine>, u64)> {
        let view = self.read_view();
        let term = if view.needs_gate(linearizable) {
            let requirement = requirement();
            let (_, term) = self
                .ask_termed(move |node| async move {
                    if linearizable {
                        node.read_barrier().await?;
                    }
                    node.authorize(token.as_deref(), || requirement)
                })
                .await?;
            term
        } else {
            view.term()
        };
        let reader = view.reader().ok_or(ServerError::Stopped)?;
        Ok((reader, term))
    }

    /// A range, read on this shard ([`crate::read_view`]): the key index
    /// walked in slices, then the values loaded from the walk's snapshot a
    /// chunk at a time, yielding to the write path in between
    /// ([`crate::sched`]). The owner does nothing for it but the gate.
    pub async fn range(
        &self,
        req: mvcc::RangeRequest,
        token: Option<String>,
    ) -> (Result<mvcc::RangeResponse>, u64) {
        let (walked, term) = self.gated_walk(req, token).await;
        let answer = match walked {
            Ok(mvcc::RangeStart::Done(response)) => Ok(response),
            Ok(mvcc::RangeStart::Plan(plan)) => load_whole(plan).await,
            Err(e) => Err(e),
        };
        (answer, term)
    }

    /// A range as [`Backend::range`] reads it, except that an answer whose
    /// order is known without its values (by key; by create or mod
    /// revision or version, and with revision filters, once a pass over
    /// the records has read those) comes back with its values not loaded
    /// ([`mvcc::RangePlan::into_chunked`]): its caller loads and sends
    /// them a chunk at a time. Only a sort by value is read whole.
    pub async fn range_read(
        &self,
        req: mvcc::RangeRequest,
        token: Option<String>,
    ) -> (Result<RangeRead>, u64) {
        let (walked, term) = self.gated_walk(req, token).await;
        let answer = match walked {
            Ok(mvcc::RangeStart::Done(response)) => Ok(RangeRead::Whole(response)),
            Ok(mvcc::RangeStart::Plan(plan)) => chunked_or_whole(plan).await,
            Err(e) => Err(e),
        };
        (answer, term)
    }

    /// A range's gate ([`crate::read_view`]: once a linearizable read may
    /// go and the caller may read), then its key-index walk; and the Raft
    /// term.
    async fn gated_walk(
        &self,
        req: mvcc::RangeRequest,
        token: Option<String>,
    ) -> (Result<mvcc::RangeStart<Snapshot>>, u64) {
        let gate = self
            .read_gate(!req.serializable, token, || {
                crate::auth::Requirement::Keys(vec![crate::auth::Need::read(
                    &req.key,
                    &req.range_end,
                )])
            })
            .await;
        match gate {
            Ok((reader, term)) => (walk(&reader, req).await, term),
            Err(e) => (Err(e), 0),
        }
    }

    /// A txn without writes, read on this shard from the applied state
    /// (etcd serves these without a log entry too), after the gate of a
    /// linearizable read.
    pub async fn read_txn(
        &self,
        req: mvcc::TxnRequest,
        token: Option<String>,
    ) -> (Result<mvcc::TxnResponse>, u64) {
        let gate = self
            .read_gate(true, token, || {
                let mut needs = Vec::new();
                crate::auth::txn_needs(&req, &mut needs);
                crate::auth::Requirement::Keys(needs)
            })
            .await;
        match gate {
            Ok((reader, term)) => (reader.read_txn(&req).map_err(ServerError::from), term),
            Err(e) => (Err(e), 0),
        }
    }

    /// A watcher's history: the events of `[key, range_end)` from
    /// `from_rev` up to the current revision, and that revision (see
    /// [`StoreReader::begin_history`]). Read on this shard from the read
    /// view, in its reads queue a slice at a time; the owner does nothing
    /// for it. (The watcher's permission was checked when it was created;
    /// a watch is never linearizable, as in etcd.) Also answers the Raft
    /// term for the response header.
    pub async fn watch_history(
        &self,
        key: bytes::Bytes,
        range_end: bytes::Bytes,
        from_rev: i64,
    ) -> (Result<(Vec<mvcc::Event>, i64)>, u64) {
        let view = self.read_view();
        let Some(reader) = view.reader() else {
            return (Err(ServerError::Stopped), 0);
        };
        let read = crate::sched::off_the_write_path(async move {
            let mut walk = reader.begin_history(key, range_end, from_rev)?;
            while !reader.walk_history(&mut walk, WATCH_HISTORY_SLICE)? {
                crate::sched::end_of_slice().await;
            }
            Ok(walk.finish())
        })
        .await
        .unwrap_or(Err(ServerError::Stopped));
        (read, view.term())
    }
}

/// Key revisions one slice of a watcher's history reads under the store's
/// read lock: each costs a decode and, for its previous value, an index
/// lookup and an engine read (about a microsecond), so the owner's next
/// apply waits a few hundred microseconds at most.
const WATCH_HISTORY_SLICE: usize = 256;

/// The engine snapshot a range's values are read from.
pub type Snapshot = <AnyEngine as engine::Engine>::Snapshot;

/// A range read by [`Backend::range_read`].
pub enum RangeRead {
    /// The whole answer, values loaded.
    Whole(mvcc::RangeResponse),
    /// An answer in key order, its values still to load.
    Chunked(mvcc::ChunkedRange<Snapshot>),
}

/// A range's key-index walk, in slices.
async fn walk(
    reader: &StoreReader<AnyEngine>,
    req: mvcc::RangeRequest,
) -> Result<mvcc::RangeStart<Snapshot>> {
    let mut walk = reader.begin_range(req)?;
    while !reader.walk_range(&mut walk, RANGE_WALK_SLICE)? {
        crate::sched::end_of_slice().await;
    }
    Ok(walk.finish())
}

/// A plan's answer to send in chunks, once its order is known (read in
/// slices), or whole.
async fn chunked_or_whole(mut plan: mvcc::RangePlan<Snapshot>) -> Result<RangeRead> {
    while !plan.order(RANGE_LOAD_CHUNK)? {
        crate::sched::end_of_slice().await;
    }
    match plan.into_chunked() {
        mvcc::Chunking::Chunked(chunked) => Ok(RangeRead::Chunked(chunked)),
        mvcc::Chunking::Whole(plan) => load_whole(plan).await.map(RangeRead::Whole),
    }
}

/// A range's values, loaded in slices, and its answer.
async fn load_whole(mut plan: mvcc::RangePlan<Snapshot>) -> Result<mvcc::RangeResponse> {
    while !plan.load(RANGE_LOAD_CHUNK)? {
        crate::sched::end_of_slice().await;
    }
    Ok(plan.finish()?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use crate::config::Config;
    use crate::node::Node;
    use glommio::{LocalExecutorBuilder, Placement};
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::Duration;

    /// A member of its own on this executor, serving, with `keys` keys
    /// under `k/`.
    async fn member_with_keys(cfg: &Config, keys: usize) -> Backend {
        let node = Node::start(cfg).await.unwrap();
        while !node.serving() {
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
        let backend = Backend::Local(node);
        let puts: Vec<_> = (0..keys)
            .map(|i| {
                mvcc::RequestOp::Put(mvcc::PutRequest {
                    key: bytes::Bytes::from(format!("k/{i:06}")),
                    value: bytes::Bytes::from_static(b"v"),
                    ..mvcc::PutRequest::default()
                })
            })
            .collect();
        for ops in puts.chunks(cfg.max_txn_ops) {
            let txn = mvcc::TxnRequest {
                success: ops.to_vec(),
                ..mvcc::TxnRequest::default()
            };
            let written = backend.write(mvcc::Request::Txn(txn), None).await;
            assert!(written.is_ok(), "{:?}", written.err());
        }
        backend
    }

    /// A range's index walk runs in slices in the reads queue: work the
    /// write path has ready meanwhile runs between two slices, not after
    /// the whole walk. (A count-only range loads no values: the walk is
    /// all its work, and without slices it is one synchronous call.)
    #[test]
    fn a_range_walk_lets_ready_write_path_work_run_between_slices() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            data_dir: Some(dir.path().to_path_buf()),
            listen_peer_urls: Some("http://127.0.0.1:0".into()),
            ..Config::default()
        };
        let keys = 5 * RANGE_WALK_SLICE;
        LocalExecutorBuilder::new(Placement::Unbound)
            .make()
            .unwrap()
            .run(async move {
                crate::sched::install(cfg.range_cpu_shares);
                let backend = member_with_keys(&cfg, keys).await;
                // Write-path work that is always ready again after a short
                // turn (as a connection with requests queued): it counts
                // its turns.
                let turns = Rc::new(Cell::new(0u64));
                let stop = Rc::new(Cell::new(false));
                let ticker = glommio::spawn_local({
                    let (turns, stop) = (turns.clone(), stop.clone());
                    async move {
                        while !stop.get() {
                            turns.set(turns.get() + 1);
                            glommio::executor().yield_task_queue_now().await;
                        }
                    }
                });
                let req = mvcc::RangeRequest {
                    key: bytes::Bytes::from_static(b"k/"),
                    range_end: bytes::Bytes::from_static(b"k0"),
                    // Every key answered: a walk key by key (a count alone
                    // takes whole leaves of the index at a time).
                    keys_only: true,
                    serializable: true,
                    ..mvcc::RangeRequest::default()
                };
                let seen = turns.clone();
                let (reply, turns_during_walk) = crate::sched::off_the_write_path(async move {
                    let before = seen.get();
                    let reply = backend.range(req, None).await;
                    (reply, seen.get() - before)
                })
                .await
                .unwrap();
                stop.set(true);
                ticker.await;
                let (response, _) = reply;
                assert_eq!(response.unwrap().count, keys as i64);
                assert!(
                    turns_during_walk >= 1,
                    "the write path never ran during a walk of {keys} keys"
                );
            });
    }
}
