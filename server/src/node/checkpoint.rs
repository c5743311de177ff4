//! Checkpoints: the engine's (then the WAL's marker, released segments
//! and raft-rs' compacted log) and the key index's that follows each.

use super::*;

/// How long a background checkpoint may take before it is raised to
/// ordinary CPU priority, however few entries came meanwhile (a full
/// checkpoint of 1M keys takes about a second on an idle core).
pub(super) const CHECKPOINT_PATIENCE: Duration = Duration::from_secs(10);

/// The most entries between two checkpoints of the btree engine, whatever
/// `--snapshot-count` says (etcd commits bbolt every 100 ms anyway): a
/// restart re-applies every entry since the engine's last persist, ~8 us
/// each on 2 vCPUs (each write copies its path of nodes), so 100,000
/// entries cost 0.8 s of a restart and 20,000 about 0.2 s. A persist
/// writes only the pages changed since the last (measured filling 500k
/// keys: 34.6k puts/s either way).
pub(super) const BTREE_CHECKPOINT_ENTRIES: u64 = 20_000;

/// A compaction past the key index checkpoint brings the next engine
/// checkpoint forward, at most this often.
pub(super) const FORCED_CHECKPOINT_SPACING: Duration = Duration::from_secs(10);

/// A key index checkpoint to write: a reader of the store, what the
/// checkpoint describes, and the WAL bytes written when it was planned.
pub(super) type PlannedIndexCheckpoint =
    (mvcc::StoreReader<AnyEngine>, mvcc::IndexCheckpointPlan, u64);

/// The state of key index checkpointing (see [`crate::index_file`]).
#[derive(Default)]
pub(super) struct IndexCheckpointing {
    /// Planned with the engine checkpoint in flight.
    planned: Option<PlannedIndexCheckpoint>,
    /// The same, once the engine checkpoint is durable: to be written.
    ready: Option<PlannedIndexCheckpoint>,
    in_flight: bool,
    /// WAL bytes written when the last one was planned, and its size.
    last_written: (u64, u64),
    /// Revision of the last one written (or loaded at start); 0: none.
    written_revision: i64,
    /// When a compaction last brought an engine checkpoint forward.
    forced_at: Option<Instant>,
}

impl IndexCheckpointing {
    /// At start, with the key index loaded from a checkpoint at
    /// `revision` (0: none).
    pub(super) fn loaded(revision: i64) -> IndexCheckpointing {
        IndexCheckpointing {
            written_revision: revision,
            ..IndexCheckpointing::default()
        }
    }
}

impl Node {
    /// Starts a checkpoint of the engine once `snapshot-count` entries were
    /// applied since the last one and, for an engine whose checkpoint
    /// rewrites the whole store, the WAL has grown by the last checkpoint's
    /// size since it started (each WAL byte pays for at most one checkpoint
    /// byte; recovery replays at most about a store's worth of log). It runs
    /// as its own task, at the lowest CPU priority (the engine's
    /// `Urgency::Background`), so the loop keeps committing, until
    /// another spacing's worth of entries has been applied meanwhile (see
    /// [`Node::hurry_a_lagging_checkpoint`]).
    pub(super) fn maybe_snapshot(self: &Rc<Self>, wal_bytes: u64) {
        self.maybe_write_index_checkpoint();
        let applied = self.engine.borrow().applied_index();
        self.hurry_a_lagging_checkpoint(applied);
        let (wal_bytes_then, rewritten) = self.snapshot_pacing.get();
        let counted = applied >= self.last_snapshot_index.get() + self.checkpoint_spacing();
        let forced = !counted && self.compaction_wants_checkpoint(applied);
        let due = counted || forced;
        if self.snapshot_in_flight.get()
            || !due
            || self
                .snapshot_retry_at
                .get()
                .is_some_and(|t| Instant::now() < t)
        {
            return;
        }
        // A checkpoint that rewrites the store waits until the WAL has
        // written as much as the last one did (so checkpoints cost at most
        // what the writes do); one that writes only what changed does not.
        let engine = self.engine.borrow().clone();
        let rewrites_store = engine.checkpoint_rewrites_store();
        if rewrites_store && wal_bytes < wal_bytes_then.saturating_add(rewritten) {
            return;
        }
        self.snapshot_retry_at.set(None);
        self.snapshot_in_flight.set(true);
        if forced {
            self.index_checkpointing.borrow_mut().forced_at = Some(Instant::now());
        }
        self.snapshot_started.set(Some(Instant::now()));
        // Only the memory engine's checkpoint is background work (btree
        // and lsm persists keep ordinary priority: they hold locks).
        let background = engine.kind() == engine::any::EngineKind::Memory;
        self.snapshot_hurry_at
            .set(background.then(|| applied.saturating_add(self.checkpoint_spacing())));
        let rewrites = if rewrites_store {
            engine::Engine::size(&engine).total_bytes
        } else {
            0
        };
        self.snapshot_pacing_pending
            .set(Some((wal_bytes, rewrites)));
        {
            // The key index as it stands now is what the engine checkpoint
            // holds: written once that is durable (see finish_snapshot).
            let mvcc = self.mvcc.borrow();
            let mut ick = self.index_checkpointing.borrow_mut();
            ick.planned = Some((
                mvcc.reader(),
                mvcc.index_checkpoint_plan(self.member.cluster_id),
                wal_bytes,
            ));
        }
        let node = self.clone();
        glommio::spawn_local(async move {
            let started = Instant::now();
            let result = node
                .engine_dir
                .checkpoint(&engine)
                .await
                .map_err(ServerError::from);
            node.metrics
                .backend_commit
                .observe_seconds(started.elapsed());
            *node.snapshot_done.borrow_mut() = Some(result);
            node.queue_ready.notify();
        })
        .detach();
    }

    /// Raises the checkpoint in flight to ordinary CPU priority once
    /// `applied` reaches its hurry point: on cores kept busy by the shards
    /// (and, on a small machine, the clients), a checkpoint at the lowest
    /// priority can starve for as long as the writes last, and everything
    /// applied meanwhile is log a restart replays (half a million entries
    /// once, filling 1M keys on 2 vCPUs). Also once it has run for
    /// [`CHECKPOINT_PATIENCE`] whatever was applied: a member that went
    /// quiet with its last checkpoint starved by other processes would
    /// otherwise replay that checkpoint's log at every restart until it
    /// finished. Once per checkpoint.
    pub(super) fn hurry_a_lagging_checkpoint(&self, applied: u64) {
        let Some(at) = self.snapshot_hurry_at.get() else {
            return;
        };
        let running_for = self
            .snapshot_started
            .get()
            .map_or(Duration::ZERO, |t| t.elapsed());
        if !self.snapshot_in_flight.get() || (applied < at && running_for < CHECKPOINT_PATIENCE) {
            return;
        }
        let meanwhile = (applied + self.checkpoint_spacing()).saturating_sub(at);
        let hurried = engine::any::hurry_background_work();
        if !matches!(hurried, Ok(0)) {
            // Once: raised, or refused (no privilege). With no thread
            // registered yet, the next turn asks again.
            self.snapshot_hurry_at.set(None);
        }
        match hurried {
            Ok(0) => {}
            Ok(_) => log(format_args!(
                "checkpoint still running after {:.1} s and {meanwhile} more applied entries: \
                 raised to ordinary CPU priority",
                running_for.as_secs_f64(),
            )),
            Err(e) => log(format_args!(
                "checkpoint still running after {:.1} s: could not raise its CPU priority \
                 ({e}; needs root or CAP_SYS_NICE), a restart may replay more log",
                running_for.as_secs_f64()
            )),
        }
    }

    /// Entries between two engine checkpoints: `--snapshot-count`, and at
    /// most [`BTREE_CHECKPOINT_ENTRIES`] for the btree engine.
    pub(super) fn checkpoint_spacing(&self) -> u64 {
        if self.engine.borrow().kind() == engine::any::EngineKind::Btree {
            self.snapshot_count.min(BTREE_CHECKPOINT_ENTRIES)
        } else {
            self.snapshot_count
        }
    }

    /// Whether a compaction went past the last key index checkpoint's
    /// revision (a restart could not use it: see
    /// [`MvccStore::open_with_index_checkpoint`]) and a checkpoint should
    /// come early. Not for an engine whose checkpoint rewrites the whole
    /// store (its pacing rules), and at most every
    /// [`FORCED_CHECKPOINT_SPACING`].
    pub(super) fn compaction_wants_checkpoint(&self, applied: u64) -> bool {
        let ick = self.index_checkpointing.borrow();
        if ick.in_flight
            || ick.ready.is_some()
            || applied <= self.last_snapshot_index.get()
            || self.engine.borrow().checkpoint_rewrites_store()
            || ick
                .forced_at
                .is_some_and(|t| t.elapsed() < FORCED_CHECKPOINT_SPACING)
        {
            return false;
        }
        self.mvcc.borrow().compact_revision() > ick.written_revision
    }

    /// Starts writing the key index checkpoint of the last durable engine
    /// checkpoint on a thread of its own, unless one is being written or
    /// the last one is recent enough: each byte of it is paid for by at
    /// least one byte of WAL since the last (a restart reads at most about
    /// that much more), or a compaction made the last one unusable.
    pub(super) fn maybe_write_index_checkpoint(self: &Rc<Self>) {
        let mut ick = self.index_checkpointing.borrow_mut();
        if ick.in_flight {
            return;
        }
        let Some((reader, plan, wal_bytes)) = ick.ready.take() else {
            return;
        };
        let (wal_then, size) = ick.last_written;
        let compacted_past = plan.compact_revision > ick.written_revision;
        if ick.written_revision > 0 && !compacted_past && wal_bytes < wal_then.saturating_add(size)
        {
            return;
        }
        ick.in_flight = true;
        drop(ick);
        let node = self.clone();
        let root = self.dirs.root.clone();
        glommio::spawn_local(async move {
            let result = on_a_thread("keyindex", move || {
                crate::index_file::write(&root, &reader, plan)
            })
            .await;
            let mut ick = node.index_checkpointing.borrow_mut();
            ick.in_flight = false;
            match result {
                Ok(Ok(w)) => {
                    ick.last_written = (wal_bytes, w.bytes);
                    ick.written_revision = w.plan.revision;
                    log(format_args!(
                        "key index checkpoint at revision {} (applied index {}): {} keys, \
                         {:.1} MiB in {:.0} ms",
                        w.plan.revision,
                        w.plan.applied_index,
                        w.keys,
                        w.bytes as f64 / f64::from(1 << 20),
                        w.took.as_secs_f64() * 1e3
                    ));
                }
                Ok(Err(e)) => log(format_args!(
                    "key index checkpoint not written (the next checkpoint tries again): {e}"
                )),
                Err(e) => log(format_args!("key index checkpoint not written: {e}")),
            }
        })
        .detach();
    }

    /// Drops applied entries from the in-memory Raft log between
    /// checkpoints. The WAL keeps them for recovery until the next
    /// checkpoint; memory only needs what peers may still ask for: nothing
    /// on a single member, `catch_up_entries` behind the slowest peer's
    /// match (learners included) otherwise. Before, the log kept every
    /// entry since the last checkpoint (up to `snapshot-count`, 100,000 by
    /// default: tens of MB at 1000-client put rates, all of it freshly
    /// faulted-in memory). Also while a checkpoint is being written (it may
    /// take long at background priority): its completion finds the term at
    /// its index in `applied_terms`.
    pub(super) fn trim_memory_log(&self, raw: &RawNode<MemStorage>) -> Result<()> {
        let applied = raw.raft.raft_log.applied;
        let keep_from = if self.solo.get() {
            applied
        } else {
            let mut wanted = applied;
            if raw.raft.state == raft::StateRole::Leader {
                for (id, progress) in raw.raft.prs().iter() {
                    if *id != raw.raft.id {
                        wanted = wanted.min(progress.matched + 1);
                    }
                }
            }
            wanted.saturating_sub(self.catch_up_entries)
        };
        let store = raw.store();
        // In steps, so the entries kept (a peer's catch-up tail) are not
        // shifted on every turn.
        let step = (self.snapshot_count / 4).clamp(64, 4096);
        if keep_from >= store.first_index()? + step {
            store.wl().compact(keep_from)?;
        }
        Ok(())
    }

    /// After a checkpoint is durable: mark it in the WAL, drop the covered
    /// entries from memory and release WAL segments it makes unnecessary.
    pub(super) async fn finish_snapshot(
        &self,
        raw: &mut RawNode<MemStorage>,
        wal: &mut Wal,
    ) -> Result<()> {
        let Some(result) = self.snapshot_done.borrow_mut().take() else {
            return Ok(());
        };
        self.snapshot_in_flight.set(false);
        self.snapshot_hurry_at.set(None);
        let pacing = self.snapshot_pacing_pending.take();
        let took = self
            .snapshot_started
            .take()
            .map_or(Duration::ZERO, |t| t.elapsed());
        let planned = self.index_checkpointing.borrow_mut().planned.take();
        let index = match result {
            Ok(index) => index,
            Err(e) => {
                // The WAL still holds everything: a failed checkpoint only
                // delays segment release. Try again later.
                log(format_args!(
                    "snapshot failed, retrying in {SNAPSHOT_RETRY:?}: {e}"
                ));
                self.snapshot_retry_at
                    .set(Some(Instant::now() + SNAPSHOT_RETRY));
                return Ok(());
            }
        };
        if index <= self.last_snapshot_index.get() {
            // A leader's snapshot was installed meanwhile, past this one.
            return Ok(());
        }
        let started = Instant::now();
        let store = raw.store().clone();
        let known = store.term(index).ok();
        let Some(term) = known.or_else(|| self.applied_terms.borrow().term_at(index)) else {
            // Cannot happen for an applied index; if it did, a marker with a
            // guessed term could mislead recovery. The WAL keeps everything.
            log(format_args!(
                "snapshot at applied index {index}: its term is unknown; not marked, \
                 retrying in {SNAPSHOT_RETRY:?}"
            ));
            self.snapshot_retry_at
                .set(Some(Instant::now() + SNAPSHOT_RETRY));
            return Ok(());
        };
        let conf = store.initial_state()?.conf_state;
        wal.append_snapshot(index, &raftlog::encode_snapshot_meta(term, &conf));
        wal.sync().await?;
        // With peers, keep a tail of the log in memory for followers that
        // lag a little (a snapshot transfer would be needed otherwise).
        let keep_from = if !self.solo.get() {
            index.saturating_sub(self.catch_up_entries)
        } else {
            index
        };
        if keep_from > store.first_index()? {
            store.wl().compact(keep_from)?;
        }
        let marked = started.elapsed();
        // The files go in the background (in order; see `Wal::release_through`).
        let count = wal.release_through(index);
        if let Some(why) = wal.take_unlink_failure() {
            log(format_args!(
                "could not delete released WAL segments (retried at the next snapshot): {why}"
            ));
        }
        self.last_snapshot_index.set(index);
        if let Some(planned) = planned.filter(|(_, plan, _)| plan.applied_index <= index) {
            self.index_checkpointing.borrow_mut().ready = Some(planned);
        }
        self.applied_terms.borrow_mut().forget_before(index);
        // Only a checkpoint that rewrote the store sets the pace: the next
        // full one waits for as much WAL since it, deltas between or not.
        if let Some(pacing) = pacing.filter(|(_, rewrote)| *rewrote > 0) {
            self.snapshot_pacing.set(pacing);
        }
        log(format_args!(
            "snapshot at applied index {index} (term {term}) written in {:.0} ms; released \
             {count} WAL segment(s) (marker {:.1} ms)",
            took.as_secs_f64() * 1e3,
            marked.as_secs_f64() * 1e3,
        ));
        Ok(())
    }
}
