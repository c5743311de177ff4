//! The Raft loop of a member's group: ticks, inbound messages, proposals
//! queued by the API, each Ready handled in raft-rs' order (WAL group
//! commit, messages, snapshots, apply), linearizable reads' ReadIndex
//! rounds, and the entries' apply through [`crate::apply`].

use super::*;

impl Node {
    pub(super) async fn run(
        self: &Rc<Self>,
        mut raw: RawNode<MemStorage>,
        mut wal: Wal,
    ) -> Result<()> {
        let mut next_tick = Instant::now() + self.tick_interval;
        let mut entry_buf = Vec::with_capacity(4096);
        loop {
            if self.queue.borrow().is_empty()
                && self.inbound.borrow().is_empty()
                && !self.read_rounds.borrow().has_queued()
                && !raw.has_ready()
                && self.snapshot_done.borrow().is_none()
            {
                let wait = next_tick.saturating_duration_since(Instant::now());
                futures_lite::future::or(self.queue_ready.notified(), glommio::timer::sleep(wait))
                    .await;
            }
            if Instant::now() >= next_tick {
                raw.tick();
                self.retry_read_index(&mut raw);
                next_tick = Instant::now() + self.tick_interval;
            }
            if !self.batch_window.is_zero() {
                let queued = self.queue.borrow().len();
                if queued > 0 && queued < self.max_batch {
                    glommio::timer::sleep(self.batch_window).await;
                }
            }
            self.step_inbound(&mut raw)?;
            for peer in self.member.transport.take_unreachable() {
                raw.report_unreachable(peer);
            }
            if self.member.transport.told_removed() && !self.member.removed.replace(true) {
                self.leave("a peer says this member", Duration::from_millis(100));
            }
            if let Some(target) = self.transfer_to.take() {
                raw.transfer_leader(target);
            }
            if crate::stop::requested() {
                self.stop_step(&mut raw);
            }
            for (peer, ok) in std::mem::take(&mut *self.snapshot_reports.borrow_mut()) {
                let status = if ok {
                    raft::SnapshotStatus::Finish
                } else {
                    raft::SnapshotStatus::Failure
                };
                raw.report_snapshot(peer, status);
            }
            self.propose_queued(&mut raw);
            self.start_read_index(&mut raw);
            self.finish_snapshot(&mut raw, &mut wal).await?;
            self.handle_ready(&mut raw, &mut wal, &mut entry_buf)
                .await?;
            self.refresh_status(&raw, &wal);
            if self.nospace_wanted.take() {
                let node = self.clone();
                glommio::spawn_local(async move { node.raise_nospace().await }).detach();
            }
            let resets = std::mem::take(&mut *self.checkpoint_resets.borrow_mut());
            if !resets.is_empty() {
                let node = self.clone();
                let resets = resets.into_iter().collect();
                glommio::spawn_local(async move { node.reset_checkpoints(resets).await }).detach();
            }
            self.on_role_change(&raw);
            self.maybe_snapshot(wal.bytes_written());
            self.trim_memory_log(&raw)?;
            // Let connections run between group commits.
            glommio::yield_if_needed().await;
        }
    }

    /// Steps what peers sent. Refuses to go on (instead of raft-rs'
    /// panic, etcd's panic loop in seed 001) when the leader believes this
    /// member holds entries it does not: its data dir was wiped or rolled back.
    pub(super) fn step_inbound(&self, raw: &mut RawNode<MemStorage>) -> Result<()> {
        let msgs = std::mem::take(&mut *self.inbound.borrow_mut());
        for m in msgs {
            if m.get_msg_type() == MessageType::MsgHeartbeatResponse {
                self.note_round_trip(m.from);
            }
            if let Some(last) = crate::ready::claims_entries_we_lack(raw, &m) {
                return Err(ServerError::Startup(format!(
                    "leader {:x} says entries up to {} are committed on this member, but its log ends at {last}: \
                     the data dir {} was wiped or restored from an old copy. Refusing to run, as it would break \
                     the cluster's log. Safe procedure (docs/operations.md): on a healthy member \
                     `etcdctl member remove {:x}`, wipe this data dir, add the member back as a learner and start \
                     it with --initial-cluster-state existing",
                    m.from,
                    m.commit,
                    self.dirs.root.display(),
                    self.member.id
                )));
            }
            if m.get_msg_type() == MessageType::MsgSnapshot {
                // Only with its data on disk (the snapshot stream delivers
                // both); a bare one would make us adopt a state we lack.
                let index = m.get_snapshot().get_metadata().index;
                if !self.incoming_snapshots.borrow().contains_key(&index) {
                    if !self.warned_snapshot.replace(true) {
                        log(format_args!(
                            "dropped a snapshot message from {:x} without its data",
                            m.from
                        ));
                    }
                    continue;
                }
            }
            match raw.step(m) {
                Ok(()) | Err(raft::Error::StepPeerNotFound) | Err(raft::Error::StepLocalMsg) => {}
                Err(e) => log(format_args!("dropped a peer message: {e}")),
            }
        }
        Ok(())
    }

    /// One ReadIndex round for every linearizable read queued since the last.
    pub(super) fn start_read_index(&self, raw: &mut RawNode<MemStorage>) {
        self.read_rounds.borrow_mut().start(raw, Instant::now());
    }

    /// A ReadIndex round can be lost (no leader yet, a message dropped, a
    /// leader change): ask again, as etcd does every 500 ms.
    pub(super) fn retry_read_index(&self, raw: &mut RawNode<MemStorage>) {
        let now = Instant::now();
        self.read_rounds.borrow_mut().retry(raw, now, |sent| {
            now.duration_since(sent) >= READ_INDEX_RETRY
        });
    }

    /// A ReadIndex round came back: its reads may go once `index` is applied.
    pub(super) fn read_index_ready(&self, ctx: &[u8], index: u64, applied: u64) {
        let mut ready = Vec::new();
        let answer = self
            .read_rounds
            .borrow_mut()
            .answered(ctx, index, applied, &mut ready);
        if answer == RoundAnswer::Stale {
            crate::metrics::count(&self.metrics.slow_read_indexes);
        }
        for w in ready {
            let _ = w.send(Ok(()));
        }
    }

    pub(super) fn release_reads(&self, applied: u64) {
        let mut ready = Vec::new();
        self.read_rounds.borrow_mut().release(applied, &mut ready);
        for w in ready {
            let _ = w.send(Ok(()));
        }
    }

    /// Leadership changes: the new leader restarts every lease's clock (as
    /// etcd's Promote); reads of a round that will never come back fail.
    pub(super) fn on_role_change(&self, raw: &RawNode<MemStorage>) {
        let leader = raw.raft.state == raft::StateRole::Leader;
        if leader == self.was_leader.get() {
            return;
        }
        self.was_leader.set(leader);
        if leader {
            self.heartbeats_sent.borrow_mut().clear();
            log(format_args!("became leader at term {}", raw.raft.term));
            self.lessor.borrow_mut().promote(Instant::now());
        } else {
            log(format_args!(
                "no longer leader at term {} (leader {:x})",
                raw.raft.term, raw.raft.leader_id
            ));
            let mut failed = Vec::new();
            let rounds = self.read_rounds.borrow_mut().fail_in_flight(&mut failed);
            for _ in 0..rounds {
                crate::metrics::count(&self.metrics.read_indexes_failed);
            }
            for w in failed {
                let _ = w.send(Err(ServerError::LeaderChanged));
            }
        }
    }

    pub(super) fn propose_queued(&self, raw: &mut RawNode<MemStorage>) {
        let batch: Vec<Proposal> = {
            let mut queue = self.queue.borrow_mut();
            // Bound the group commit by count and by bytes, so one Ready
            // always fits in a WAL frame whatever clients send at once.
            let mut bytes = 0usize;
            let n = queue
                .iter()
                .take(self.max_batch)
                .position(|p| {
                    bytes += p.data.len();
                    bytes > MAX_BATCH_BYTES
                })
                .unwrap_or(queue.len().min(self.max_batch))
                .max(1)
                .min(queue.len());
            queue.drain(..n).collect()
        };
        let mut pending = self.pending.borrow_mut();
        for p in batch {
            let proposed = match p.conf {
                Some(cc) => raw.propose_conf_change(p.data, cc),
                None => raw.propose(Vec::new(), p.data),
            };
            match proposed {
                Ok(()) => {
                    pending.insert(p.id, p.reply);
                }
                Err(raft::Error::ProposalDropped) => {
                    let _ = p.reply.send(Err(ServerError::NoLeader));
                }
                Err(e) => {
                    let _ = p.reply.send(Err(ServerError::Raft(e)));
                }
            }
        }
        if !self.queue.borrow().is_empty() {
            // More than one batch queued: come back without sleeping.
            self.queue_ready.notify();
        }
    }

    pub(super) async fn handle_ready(
        self: &Rc<Self>,
        raw: &mut RawNode<MemStorage>,
        wal: &mut Wal,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        crate::ready::handle_ready(raw, &mut NodeReady { node: self, wal }, buf).await
    }

    /// Adopts a leader's snapshot: its data file becomes the engine (and
    /// the newest checkpoint on disk), MVCC, leases and members are rebuilt
    /// from it, raft-rs' storage restarts at its index, and the WAL gets a
    /// marker there (written with this Ready's sync).
    pub(super) async fn install_snapshot(
        &self,
        raw: &mut RawNode<MemStorage>,
        wal: &mut Wal,
        snap: raft::eraftpb::Snapshot,
    ) -> Result<()> {
        let meta = snap.get_metadata().clone();
        let index = meta.index;
        let Some(file) = self.incoming_snapshots.borrow_mut().remove(&index) else {
            return Err(ServerError::Startup(format!(
                "raft applies a snapshot at index {index} whose data never arrived"
            )));
        };
        // The marker's contents go beside the engine first: if the member
        // dies before this Ready's sync writes the marker, the engine is
        // ahead of the WAL and start-up adopts them (raftlog).
        let marker = raftlog::encode_snapshot_meta(meta.term, meta.get_conf_state());
        write_installed_snapshot(&self.dirs, index, &marker)?;
        let engine = self.engine_dir.install_snapshot_file(&file).await?;
        // Tests only: die as kill -9 would between the install and the marker.
        fail::fail_point!("node::snapshot_installed", |_| std::process::abort());
        if engine.applied_index() != index {
            return Err(ServerError::Startup(format!(
                "the snapshot for index {index} holds applied index {}",
                engine.applied_index()
            )));
        }
        let mvcc = MvccStore::open(engine.clone())?;
        let min_ttl = self.lessor.borrow().min_ttl();
        let (lessor, auth, alarms) =
            crate::apply::restore_beside_mvcc(&mvcc, min_ttl, Instant::now())?;
        let conf = meta.get_conf_state().clone();
        let mut registry = Registry::default();
        load_member_records(&mvcc, &mut registry)?;
        // Bootstrap members that never published have no record yet: keep
        // what this member knew of them.
        for m in self.member.registry.borrow().all() {
            if registry.get(m.id).is_none() {
                registry.upsert(m);
            }
        }
        registry.retain(|m| conf.voters.contains(&m.id) || conf.learners.contains(&m.id));
        for m in registry.all() {
            connect_peer(&self.member.transport, &m);
        }
        *self.engine.borrow_mut() = engine;
        *self.mvcc.borrow_mut() = mvcc;
        *self.lessor.borrow_mut() = lessor;
        *self.alarms.borrow_mut() = alarms;
        self.auth_flag
            .borrow()
            .store(auth.enabled(), std::sync::atomic::Ordering::Release);
        let mut auth = auth;
        auth.adopt_tokens(std::mem::take(&mut *self.auth.borrow_mut()));
        *self.auth.borrow_mut() = auth;
        *self.member.registry.borrow_mut() = registry;
        self.solo
            .set(conf.voters == [self.member.id] && conf.learners.is_empty());
        self.learner.set(conf.learners.contains(&self.member.id));
        self.publish_read_view();
        raw.store().wl().apply_snapshot(snap)?;
        wal.append_snapshot(index, &marker);
        self.last_snapshot_index.set(index);
        let mut terms = self.applied_terms.borrow_mut();
        terms.note(index, meta.term);
        terms.forget_before(index);
        drop(terms);
        let stale: Vec<u64> = self
            .incoming_snapshots
            .borrow()
            .keys()
            .copied()
            .filter(|i| *i < index)
            .collect();
        for i in stale {
            if let Some(path) = self.incoming_snapshots.borrow_mut().remove(&i) {
                let _ = std::fs::remove_file(path);
            }
        }
        let revision = self.mvcc.borrow().current_revision();
        self.feed_watchers(&crate::watch::Feed::Restored { revision });
        log(format_args!(
            "installed the leader's snapshot at index {index} (term {}, revision {revision}); \
             watchers re-read the events it covers",
            meta.term
        ));
        Ok(())
    }

    pub(super) fn send(self: &Rc<Self>, mut msgs: Vec<Message>) {
        if msgs.is_empty() {
            return;
        }
        self.note_heartbeats(&msgs);
        if msgs
            .iter()
            .any(|m| m.get_msg_type() == MessageType::MsgSnapshot)
        {
            let (snapshots, rest): (Vec<Message>, Vec<Message>) = msgs
                .into_iter()
                .partition(|m| m.get_msg_type() == MessageType::MsgSnapshot);
            msgs = rest;
            for m in snapshots {
                self.start_snapshot_send(m);
            }
        }
        self.member.transport.send(msgs);
    }

    /// Counts heartbeats sent later than twice the heartbeat interval after
    /// the previous one to the same peer, as etcd's leader counts them: a
    /// sign that it is too loaded (or its disk too slow) to keep followers
    /// from starting elections.
    pub(super) fn note_heartbeats(&self, msgs: &[Message]) {
        let mut sent = self.heartbeats_sent.borrow_mut();
        let now = Instant::now();
        for m in msgs {
            if m.get_msg_type() != MessageType::MsgHeartbeat {
                continue;
            }
            if let Some((last, _)) = sent.insert(m.to, (now, true)) {
                if now.duration_since(last) > 2 * self.tick_interval {
                    crate::metrics::count(&self.metrics.heartbeat_send_failures);
                }
            }
        }
    }

    /// A heartbeat's response came from `peer`: the round trip since the
    /// heartbeat went out (etcd's `peer_round_trip_time_seconds`, which
    /// etcd measures with probes of its own; metcd's leader uses the
    /// heartbeats it sends anyway).
    pub(super) fn note_round_trip(&self, peer: u64) {
        let mut sent = self.heartbeats_sent.borrow_mut();
        let Some((at, awaited)) = sent.get_mut(&peer) else {
            return;
        };
        if std::mem::take(awaited) {
            self.metrics
                .peer_round_trips
                .borrow_mut()
                .entry(peer)
                .or_default()
                .observe_seconds(at.elapsed());
        }
    }

    /// raft-rs asked for a snapshot to a follower that lags behind the log
    /// kept in memory. Its data is a snapshot file of the engine at its
    /// applied index (the metadata is rewritten to that index, term and
    /// membership), streamed on its own connection by a separate task.
    pub(super) fn start_snapshot_send(self: &Rc<Self>, msg: Message) {
        let to = msg.to;
        if !self.snapshot_sends.borrow_mut().insert(to) {
            return;
        }
        let node = self.clone();
        glommio::spawn_local(async move {
            let path = node.dirs.snap.join(format!("outgoing-{to:016x}.snap.tmp"));
            let result = node.send_snapshot(msg, &path).await;
            let _ = std::fs::remove_file(&path);
            match &result {
                Ok(index) => log(format_args!("sent a snapshot at index {index} to {to:x}")),
                Err(e) => log(format_args!("sending a snapshot to {to:x} failed: {e}")),
            }
            node.snapshot_sends.borrow_mut().remove(&to);
            node.snapshot_reports
                .borrow_mut()
                .push((to, result.is_ok()));
            node.queue_ready.notify();
        })
        .detach();
    }

    pub(super) async fn send_snapshot(&self, mut msg: Message, path: &Path) -> Result<u64> {
        // raft-rs names the commit index; the engine has applied it, or
        // will within a loop turn.
        let wanted = msg.get_snapshot().get_metadata().index;
        let deadline = Instant::now() + self.request_timeout;
        while self.engine.borrow().applied_index() < wanted {
            if Instant::now() > deadline {
                return Err(ServerError::Timeout);
            }
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
        // No await between these: the engine view, the term and the
        // membership all describe the same applied index.
        let snapshot = self.engine.borrow().snapshot();
        let index = engine::EngineSnapshot::applied_index(&snapshot);
        let term = self.raft_store.term(index)?;
        let conf = self.raft_store.initial_state()?.conf_state;
        {
            let meta = msg.mut_snapshot().mut_metadata();
            meta.index = index;
            meta.term = term;
            meta.set_conf_state(conf);
        }
        engine::memory::write_snapshot_file_off_core(snapshot, path, engine::any::Urgency::Waited)
            .await?;
        self.member
            .transport
            .send_snapshot(&msg, path)
            .await
            .map_err(|e| ServerError::Startup(format!("snapshot stream: {e}")))?;
        Ok(index)
    }

    pub(super) fn apply_entries(
        &self,
        raw: &mut RawNode<MemStorage>,
        entries: Vec<Entry>,
    ) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut mvcc = self.mvcc.borrow_mut();
        mvcc.set_read_prev_for_watchers(crate::watch::prev_kv_watched());
        let mut pending = self.pending.borrow_mut();
        let mut events = Vec::new();
        // Before the watch hubs subscribe (the start-up replay), nobody reads
        // events: collecting a whole replayed tail's would cost hundreds of
        // MiB that the allocator then keeps.
        let watched = !self.watch_subscribers.borrow().is_empty();
        // Whether a write that adds data applied (etcd's quota applier
        // checks those after applying them).
        let mut grew = false;
        let mut terms = self.applied_terms.borrow_mut();
        for entry in entries {
            let _slow = SlowApply::timing(&self.metrics);
            terms.note(entry.index, entry.term);
            if entry.entry_type != EntryType::EntryNormal {
                let (origin, id, result) = self.apply_membership(raw, &mut mvcc, &entry)?;
                if origin == self.member.id {
                    if let Some(reply) = pending.remove(&id) {
                        let _ = reply.send(result);
                    }
                }
                continue;
            }
            if entry.data.is_empty() {
                // Leader no-ops (and, later, conf changes) still advance the
                // applied index so replay stays idempotent.
                mvcc.apply_noop(entry.index)?;
                continue;
            }
            let Some((origin, id, decoded)) = decode_proposal(entry.data.clone()) else {
                // Every member sees the same bytes and does the same: skip
                // it (a request from a newer format, say) rather than stop
                // the member at every restart.
                log(format_args!(
                    "entry {} holds no request this version understands; skipped",
                    entry.index
                ));
                mvcc.apply_noop(entry.index)?;
                continue;
            };
            let result = match decoded {
                Decoded::MemberPeers(update) => {
                    let updated = self
                        .member
                        .registry
                        .borrow_mut()
                        .update_peers(update.id, update.peer_urls);
                    match updated {
                        Some(record) => {
                            mvcc.put_meta(
                                entry.index,
                                &members::meta_name(record.id),
                                bytes::Bytes::from(members::encode(&record)),
                            )?;
                            connect_peer(&self.member.transport, &record);
                            Ok(Applied::Members(self.member.registry.borrow().all()))
                        }
                        None => {
                            mvcc.apply_noop(entry.index)?;
                            Err(ServerError::Membership("etcdserver: member not found"))
                        }
                    }
                }
                Decoded::MemberAttrs(attrs) => {
                    let merged = self.member.registry.borrow_mut().publish(attrs);
                    match merged {
                        Some(merged) => mvcc.put_meta(
                            entry.index,
                            &members::meta_name(merged.id),
                            bytes::Bytes::from(members::encode(&merged)),
                        )?,
                        None => mvcc.apply_noop(entry.index)?,
                    }
                    Ok(Applied::Published)
                }
                decoded => {
                    let compacting =
                        matches!(decoded, Decoded::Kv(mvcc::Request::Compaction(_), _))
                            .then(Instant::now);
                    let mut lessor = self.lessor.borrow_mut();
                    let mut auth = self.auth.borrow_mut();
                    let mut alarms = self.alarms.borrow_mut();
                    // Each entry's own time: a batch (a start-up catch-up) may
                    // take long, and lease TTLs and tokens count from here.
                    let context = ApplyContext {
                        now: Instant::now(),
                        replayed_commit_index: self.replayed_commit_index,
                    };
                    let mut machine = StateMachine {
                        mvcc: &mut mvcc,
                        lessor: &mut lessor,
                        auth: &mut auth,
                        alarms: &mut alarms,
                    };
                    let outcome = machine.apply(
                        entry.index,
                        decoded,
                        &context,
                        watched.then_some(&mut events),
                    )?;
                    if let (Some(started), Some(stats)) = (compacting, mvcc.take_compaction_stats())
                    {
                        self.metrics.note_compaction(started.elapsed(), stats);
                    }
                    grew |= outcome.grew;
                    match &outcome.result {
                        Ok(Applied::LeaseGranted { ttl, .. }) => {
                            crate::metrics::count(&self.metrics.leases_granted);
                            self.metrics.lease_ttls.observe((*ttl).max(0) as f64);
                        }
                        Ok(Applied::LeaseRevoked { .. }) => {
                            crate::metrics::count(&self.metrics.leases_revoked)
                        }
                        Ok(Applied::Auth(_)) => self
                            .auth_flag
                            .borrow()
                            .store(auth.enabled(), std::sync::atomic::Ordering::Release),
                        Ok(Applied::Alarms(now_active)) => {
                            if let Some(raised) = outcome.alarm_changed {
                                log(format_args!(
                                    "alarm {}: {}",
                                    if raised { "raised" } else { "disarmed" },
                                    now_active
                                        .iter()
                                        .map(|a| a.text())
                                        .collect::<String>()
                                        .trim_end()
                                ));
                            }
                        }
                        _ => {}
                    }
                    outcome.result
                }
            };
            if origin == self.member.id {
                if let Some(reply) = pending.remove(&id) {
                    let _ = reply.send(result);
                }
            }
        }
        drop(pending);
        drop(mvcc);
        if !events.is_empty() {
            self.feed_watchers(&crate::watch::Feed::Events(events.into()));
        }
        if grew
            && self
                .backend_quota
                .is_some_and(|quota| self.db_size().total_bytes >= quota)
        {
            // etcd's apply-time quota check: a write took the store past
            // the quota (writes admitted together at proposal overshoot).
            self.nospace_wanted.set(true);
        }
        Ok(())
    }
}

/// The Raft loop's effects for [`crate::ready::handle_ready`]: the real
/// transport, WAL, state machine and read waiters of this member.
pub(super) struct NodeReady<'a> {
    node: &'a Rc<Node>,
    wal: &'a mut Wal,
}

impl crate::ready::ReadyHost for NodeReady<'_> {
    fn send(&mut self, msgs: Vec<Message>) {
        self.node.send(msgs);
    }

    async fn install_snapshot(
        &mut self,
        raw: &mut RawNode<MemStorage>,
        snap: raft::eraftpb::Snapshot,
    ) -> Result<()> {
        self.node.metrics.snapshot_applying.set(true);
        let installed = self.node.install_snapshot(raw, self.wal, snap).await;
        self.node.metrics.snapshot_applying.set(false);
        installed
    }

    fn read_index_ready(&mut self, ctx: &[u8], index: u64, applied: u64) {
        self.node.read_index_ready(ctx, index, applied);
    }

    fn apply(&mut self, raw: &mut RawNode<MemStorage>, entries: Vec<Entry>) -> Result<()> {
        self.node.apply_entries(raw, entries)
    }

    fn log_entry(&mut self, index: u64, record: &[u8]) {
        self.wal.append_entry(index, record);
    }

    fn log_state(&mut self, record: &[u8]) {
        self.wal.append_state(record);
    }

    async fn sync_log(&mut self) -> Result<()> {
        let started = Instant::now();
        self.wal.sync().await?;
        self.node
            .metrics
            .wal_fsync
            .observe_seconds(started.elapsed());
        Ok(())
    }

    fn release_reads(&mut self, applied: u64) {
        self.node.release_reads(applied);
    }
}

/// Times one entry's apply: one slower than [`crate::metrics::SLOW_APPLY`]
/// counts in `etcd_server_slow_apply_total`.
pub(super) struct SlowApply<'a> {
    metrics: &'a crate::metrics::NodeMetrics,
    started: Instant,
}

impl<'a> SlowApply<'a> {
    fn timing(metrics: &'a crate::metrics::NodeMetrics) -> Self {
        SlowApply {
            metrics,
            started: Instant::now(),
        }
    }
}

impl Drop for SlowApply<'_> {
    fn drop(&mut self) {
        if self.started.elapsed() > crate::metrics::SLOW_APPLY {
            crate::metrics::count(&self.metrics.slow_applies);
        }
    }
}
