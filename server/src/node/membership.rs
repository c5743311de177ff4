//! Membership: conf changes applied, the etcd checks before a change
//! (`--strict-reconfig-check`), the member API (add, remove, promote,
//! replace, update, move leader), and leaving when removed.

use super::*;

impl Node {
    /// Applies a committed membership change: raft-rs' configuration, the
    /// member registry, the transport, and the ConfState kept in MVCC
    /// metadata (so a restart resumes with it). Returns the proposer's
    /// (member, proposal id) and its answer.
    pub(super) fn apply_membership(
        &self,
        raw: &mut RawNode<MemStorage>,
        mvcc: &mut MvccStore<AnyEngine>,
        entry: &Entry,
    ) -> Result<(u64, u64, Result<Applied>)> {
        let cc = match entry.entry_type {
            EntryType::EntryConfChange if entry.data.is_empty() => {
                mvcc.apply_noop(entry.index)?;
                return Ok((0, 0, Err(ServerError::Stopped)));
            }
            EntryType::EntryConfChange => ConfChange::parse_from_bytes(&entry.data).map(|c| {
                let mut v2 = ConfChangeV2::default();
                v2.set_changes(vec![single_change(c.get_change_type(), c.node_id)].into());
                v2
            }),
            _ => ConfChangeV2::parse_from_bytes(&entry.data),
        };
        let (origin, id, record) = match decode_proposal(entry.context.clone()) {
            Some((origin, id, Decoded::ConfRecord(r))) => (origin, id, Some(r)),
            Some((origin, id, _)) => (origin, id, None),
            None => (0, 0, None),
        };
        // An empty ConfChangeV2 is raft-rs' "leave the joint configuration"
        // (proposed by the leader after a joint change): applied like any.
        let cc = match cc {
            Ok(cc) => cc,
            Err(e) => {
                log(format_args!(
                    "undecodable membership change at index {}: {e}",
                    entry.index
                ));
                mvcc.apply_noop(entry.index)?;
                return Ok((origin, id, Err(ServerError::Stopped)));
            }
        };
        let before = raw.store().initial_state()?.conf_state;
        let cs = match raw.apply_conf_change(&cc) {
            Ok(cs) => cs,
            Err(e) => {
                log(format_args!(
                    "membership change at index {} refused by raft: {e}",
                    entry.index
                ));
                mvcc.apply_noop(entry.index)?;
                return Ok((origin, id, Err(ServerError::Raft(e))));
            }
        };
        raw.store().wl().set_conf_state(cs.clone());
        mvcc.put_meta(
            entry.index,
            CONF_META,
            bytes::Bytes::from(raftlog::encode_snapshot_meta(0, &cs)),
        )?;
        let mut registry = self.member.registry.borrow_mut();
        for change in cc.get_changes() {
            let member = change.node_id;
            match change.get_change_type() {
                ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                    let mut rec = record
                        .clone()
                        .filter(|r| r.id == member)
                        .or_else(|| registry.get(member).cloned())
                        .unwrap_or(MemberRecord {
                            id: member,
                            name: String::new(),
                            peer_urls: Vec::new(),
                            client_urls: Vec::new(),
                            is_learner: false,
                        });
                    if let Some(known) = registry.get(member) {
                        // A promotion keeps what the member published.
                        rec.name = known.name.clone();
                        rec.client_urls = known.client_urls.clone();
                    }
                    rec.is_learner = change.get_change_type() == ConfChangeType::AddLearnerNode;
                    mvcc.put_meta(
                        entry.index,
                        &members::meta_name(member),
                        bytes::Bytes::from(members::encode(&rec)),
                    )?;
                    connect_peer(&self.member.transport, &rec);
                    registry.upsert(rec);
                }
                ConfChangeType::RemoveNode => {
                    registry.remove(member);
                    mvcc.delete_meta(entry.index, &members::meta_name(member))?;
                }
            }
        }
        // A member leaving through a joint configuration still counts for
        // the outgoing quorum until the joint state is left: keep talking to
        // it (and keep running, if it is us) until then.
        let in_conf = |m: u64| conf_holds(&cs, m);
        for peer in self.member.transport.peers() {
            if !in_conf(peer) {
                self.member.transport.remove_peer(peer);
            }
        }
        // Whoever left every configuration is gone for good: its peer
        // connections are refused as removed from now on.
        let left = before
            .voters
            .iter()
            .chain(&before.learners)
            .chain(&before.voters_outgoing)
            .chain(&before.learners_next)
            .copied()
            .filter(|m| !in_conf(*m))
            .collect::<std::collections::BTreeSet<u64>>();
        for member in left {
            let mut name = REMOVED_META.to_vec();
            name.extend_from_slice(&member.to_be_bytes());
            mvcc.put_meta(entry.index, &name, bytes::Bytes::new())?;
            self.member.removed_members.borrow_mut().insert(member);
        }
        if !in_conf(self.member.id) {
            self.member.removed.set(true);
        }
        self.solo
            .set(cs.voters == [self.member.id] && cs.learners.is_empty());
        self.learner.set(cs.learners.contains(&self.member.id));
        self.read_view.borrow().set_solo(self.solo.get());
        log(format_args!(
            "membership at index {}: voters {:x?}, learners {:x?}{}",
            entry.index,
            cs.voters,
            cs.learners,
            if cs.voters_outgoing.is_empty() {
                String::new()
            } else {
                format!(" (joint with outgoing voters {:x?})", cs.voters_outgoing)
            }
        ));
        if self.member.removed.get() {
            // Long enough for the answer to the client to go out first.
            self.leave("this member", Duration::from_millis(500));
        }
        Ok((origin, id, Ok(Applied::Members(registry.all()))))
    }

    /// One turn of a requested stop (crate::stop): a leader of other
    /// voters first hands leadership to the most caught-up one and waits
    /// (bounded) until it has stepped down; then the process exits. Every
    /// acknowledged write is already durable in the WAL.
    pub(super) fn stop_step(&self, raw: &mut RawNode<MemStorage>) {
        let leading = raw.raft.state == raft::StateRole::Leader;
        let Some(since) = self.member.stopping_since.get() else {
            self.member.stopping_since.set(Some(Instant::now()));
            let successor = leading
                .then(|| most_caught_up_voter(raw, self.member.id))
                .flatten();
            match successor {
                Some(target) => {
                    log(format_args!(
                        "leader {:x} is stopping: transferring leadership to {target:x}",
                        self.member.id
                    ));
                    raw.transfer_leader(target);
                }
                None => {
                    if leading {
                        log(format_args!(
                            "skipped leadership transfer for single voting member cluster"
                        ));
                    }
                    self.stopped();
                }
            }
            return;
        };
        if !leading {
            log(format_args!(
                "leadership transfer finished: {:x} leads",
                raw.raft.leader_id
            ));
            self.stopped();
        } else if since.elapsed() > self.member.stop_transfer_limit {
            log(format_args!(
                "leadership transfer did not finish within {:?}; stopping anyway",
                self.member.stop_transfer_limit
            ));
            self.stopped();
        }
    }

    pub(super) fn stopped(&self) -> ! {
        log(format_args!(
            "member {:x} stopped (applied index {})",
            self.member.id,
            self.status.get().applied_index
        ));
        crate::stop::exit(0)
    }

    /// Stops the process (status 0) after `grace`: this member was removed
    /// from the cluster. `who` says how it learned it.
    pub(super) fn leave(&self, who: &str, grace: Duration) {
        log(format_args!(
            "{who} ({:x}) was removed from the cluster; stopping",
            self.member.id
        ));
        glommio::spawn_local(async move {
            glommio::timer::sleep(grace).await;
            std::process::exit(0);
        })
        .detach();
    }

    /// MemberAdd: a new voter or learner with these peer URLs; its ID is
    /// derived as etcd's (peer URLs, cluster token and the current time).
    pub async fn member_add(
        &self,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<(MemberRecord, Vec<MemberRecord>)> {
        self.may_add_member(is_learner)?;
        let record = self.new_member_record(peer_urls, is_learner)?;
        let kind = if is_learner {
            ConfChangeType::AddLearnerNode
        } else {
            ConfChangeType::AddNode
        };
        let all = self.change_membership(kind, &record).await?;
        Ok((record, all))
    }

    /// Validates a new member's peer URLs (etcd's checks and messages) and
    /// derives its ID.
    pub(super) fn new_member_record(
        &self,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<MemberRecord> {
        check_new_member_urls(&peer_urls)?;
        // etcd's ID for a runtime add: the peer URLs and the Unix second,
        // no cluster name (`membership.NewMember("", urls, "", &now)`); so
        // the same URLs added twice within a second collide on the ID, and
        // the checks run in etcd's order (removed ID, ID, URLs, learners).
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let urls: Vec<&str> = peer_urls.iter().map(String::as_str).collect();
        let id = crate::ids::member_id(&urls, &now.to_string());
        if self.member.removed_members.borrow().contains(&id) {
            return Err(ServerError::Membership("etcdserver: member not found"));
        }
        let members = self.members();
        if members.iter().any(|m| m.id == id) {
            return Err(ServerError::Membership(
                "etcdserver: member ID already exist",
            ));
        }
        if members
            .iter()
            .any(|m| m.peer_urls.iter().any(|u| peer_urls.contains(u)))
        {
            return Err(ServerError::Membership(
                "etcdserver: Peer URLs already exists",
            ));
        }
        if is_learner && members.iter().filter(|m| m.is_learner).count() >= MAX_LEARNERS {
            return Err(ServerError::Membership(
                "etcdserver: too many learner members in cluster",
            ));
        }
        Ok(MemberRecord {
            id,
            name: String::new(),
            peer_urls,
            client_urls: Vec::new(),
            is_learner,
        })
    }

    /// MemberRemove.
    pub async fn member_remove(&self, id: u64) -> Result<Vec<MemberRecord>> {
        self.may_remove_member(id)?;
        let record = self.known_member(id).await?;
        self.change_membership(ConfChangeType::RemoveNode, &record)
            .await
    }

    /// MemberPromote: a learner becomes a voter once it has caught up (etcd's
    /// rule: its log within 10% of the leader's). Decided on the leader.
    pub async fn member_promote(&self, id: u64) -> Result<Vec<MemberRecord>> {
        let promoted = self.promote_as_leader(id).await;
        match &promoted {
            Ok(_) => crate::metrics::count(&self.metrics.learners_promoted),
            Err(ServerError::NotLeader) => {}
            Err(e) => self.metrics.note_promote_failure(&e.to_string()),
        }
        promoted
    }

    pub(super) async fn promote_as_leader(&self, id: u64) -> Result<Vec<MemberRecord>> {
        let record = self.known_member(id).await?;
        if !record.is_learner {
            return Err(ServerError::Membership(
                "etcdserver: can only promote a learner member",
            ));
        }
        if !self.is_leader() {
            return Err(ServerError::NotLeader);
        }
        let ready = {
            let progress = self.progress.borrow();
            let leader = progress.get(&self.member.id).copied().unwrap_or(0);
            let learner = progress.get(&id).copied().unwrap_or(0);
            learner as f64 >= leader as f64 * 0.9 && learner > 0
        };
        if !ready {
            return Err(ServerError::Membership(
                "etcdserver: can only promote a learner member which is in sync with leader",
            ));
        }
        // etcd's IsReadyToPromoteMember: the promoted learner counts as a
        // started voter of the new configuration.
        let (voters, started) = self.started_voters(None);
        if self.member.strict_reconfig && started + 1 < quorum(voters + 1) {
            return Err(ServerError::Membership(NOT_ENOUGH_STARTED));
        }
        self.change_membership(ConfChangeType::AddNode, &record)
            .await
    }

    /// Replaces a voter with a new one in a single joint-consensus step
    /// (ConfChangeV2 entering `old ∪ new` and leaving it automatically):
    /// the cluster never runs with fewer voters than before. The new member
    /// starts with `--initial-cluster-state existing`; until it has caught
    /// up the joint quorum needs it, so start it right away.
    pub async fn member_replace(
        &self,
        old: u64,
        peer_urls: Vec<String>,
    ) -> Result<(MemberRecord, Vec<MemberRecord>)> {
        let leaving = self.known_member(old).await?;
        if leaving.is_learner {
            return Err(ServerError::Membership(
                "etcdserver: can only replace a voting member",
            ));
        }
        let record = self.new_member_record(peer_urls, false)?;
        let add = single_change(ConfChangeType::AddNode, record.id);
        let remove = single_change(ConfChangeType::RemoveNode, old);
        let mut cc = ConfChangeV2::default();
        cc.set_transition(raft::eraftpb::ConfChangeTransition::Auto);
        cc.set_changes(vec![add, remove].into());
        match self
            .propose_with(TAG_CONF_RECORD, &members::encode(&record), Some(cc))
            .await?
        {
            Applied::Members(all) => Ok((record, all)),
            _ => Err(ServerError::Stopped),
        }
    }

    /// MemberUpdate: new peer URLs (no Raft configuration change).
    pub async fn member_update(
        &self,
        id: u64,
        peer_urls: Vec<String>,
    ) -> Result<Vec<MemberRecord>> {
        let mut record = self.known_member(id).await?;
        if peer_urls.is_empty()
            || crate::config::parse_peer_urls("peer-urls", &peer_urls.join(",")).is_err()
        {
            return Err(ServerError::Membership(
                "etcdserver: given member URLs are invalid",
            ));
        }
        record.peer_urls = peer_urls;
        match self
            .propose(TAG_MEMBER_PEERS, &members::encode(&record))
            .await?
        {
            Applied::Members(all) => Ok(all),
            _ => Err(ServerError::Stopped),
        }
    }

    /// MoveLeader: hands leadership to `target` and waits (bounded) until
    /// it leads.
    pub async fn move_leader(&self, target: u64) -> Result<()> {
        if !self.is_leader() {
            return Err(ServerError::NotLeader);
        }
        match self.member.registry.borrow().get(target) {
            Some(m) if !m.is_learner => {}
            _ => return Err(ServerError::Membership("etcdserver: bad leader transferee")),
        }
        if target == self.member.id {
            return Ok(());
        }
        self.transfer_to.set(Some(target));
        self.queue_ready.notify();
        let deadline = Instant::now() + self.request_timeout;
        while Instant::now() < deadline {
            if self.status.get().leader == target {
                return Ok(());
            }
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        Err(ServerError::Membership(
            "etcdserver: request timed out, leader transfer took too long",
        ))
    }

    /// Voting members other than `except`, and how many of them have
    /// started (published their name), etcd's `IsStarted`.
    pub(super) fn started_voters(&self, except: Option<u64>) -> (usize, usize) {
        let members = self.member.registry.borrow().all();
        let voters = members
            .iter()
            .filter(|m| !m.is_learner && Some(m.id) != except);
        voters.fold((0, 0), |(n, started), m| {
            (n + 1, started + usize::from(!m.name.is_empty()))
        })
    }

    pub(super) fn voter_ids(&self) -> Vec<u64> {
        let registry = self.member.registry.borrow();
        registry
            .all()
            .iter()
            .filter(|m| !m.is_learner)
            .map(|m| m.id)
            .collect()
    }

    /// Whether the link to voter `peer` has been up for etcd's health
    /// interval (this member counts as connected to itself).
    pub(super) fn connected_long_enough(&self, peer: u64) -> bool {
        peer == self.member.id
            || self
                .member
                .transport
                .connected_since(peer)
                .is_some_and(|t| t.elapsed() >= RECONFIG_HEALTH_INTERVAL)
    }

    /// etcd's strict reconfiguration check for MemberAdd (`mayAddMember`):
    /// a new voter must not leave the cluster without a quorum of started
    /// members (adding a second member to a single one is allowed: the
    /// restore procedure), and every voter must have been reachable for
    /// the health interval.
    pub(super) fn may_add_member(&self, is_learner: bool) -> Result<()> {
        if !self.member.strict_reconfig {
            return Ok(());
        }
        if !is_learner {
            let (voters, started) = self.started_voters(None);
            let restoring_a_single_member = started == 1 && voters == 1;
            if !restoring_a_single_member && started < quorum(voters + 1) {
                return Err(ServerError::Membership(NOT_ENOUGH_STARTED));
            }
        }
        if !self
            .voter_ids()
            .iter()
            .all(|&v| self.connected_long_enough(v))
        {
            return Err(ServerError::Membership(UNHEALTHY));
        }
        Ok(())
    }

    /// etcd's strict reconfiguration check for MemberRemove
    /// (`mayRemoveMember`): removing a voter must leave a quorum of started
    /// members; removing one that is down is safe; otherwise the voters
    /// reachable for the health interval, minus the removed one, must still
    /// be a quorum. Learners go freely.
    pub(super) fn may_remove_member(&self, id: u64) -> Result<()> {
        if !self.member.strict_reconfig {
            return Ok(());
        }
        let is_learner = self
            .member
            .registry
            .borrow()
            .get(id)
            .is_some_and(|m| m.is_learner);
        if is_learner {
            return Ok(());
        }
        let (voters, started) = self.started_voters(Some(id));
        if started < quorum(voters) {
            return Err(ServerError::Membership(NOT_ENOUGH_STARTED));
        }
        if id != self.member.id && self.member.transport.connected_since(id).is_none() {
            return Ok(());
        }
        let voters = self.voter_ids();
        let active = voters
            .iter()
            .filter(|&&v| self.connected_long_enough(v))
            .count();
        if active.saturating_sub(1) < quorum(voters.len().saturating_sub(1)) {
            return Err(ServerError::Membership(UNHEALTHY));
        }
        Ok(())
    }

    /// The member `id` as the cluster knows it now: a member this one has
    /// not heard of yet may have been added by an entry it has still to
    /// apply (a MemberAdd answered by another member a moment ago), so it
    /// looks again after a read barrier before answering "not found".
    pub(super) async fn known_member(&self, id: u64) -> Result<MemberRecord> {
        let lookup = || self.member.registry.borrow().get(id).cloned();
        if let Some(record) = lookup() {
            return Ok(record);
        }
        // A failed barrier (no leader, a learner) leaves the local answer.
        let _ = self.read_barrier().await;
        lookup().ok_or(ServerError::Membership("etcdserver: member not found"))
    }

    pub(super) async fn change_membership(
        &self,
        kind: ConfChangeType,
        record: &MemberRecord,
    ) -> Result<Vec<MemberRecord>> {
        let mut cc = ConfChangeV2::default();
        cc.set_changes(vec![single_change(kind, record.id)].into());
        match self
            .propose_with(TAG_CONF_RECORD, &members::encode(record), Some(cc))
            .await?
        {
            Applied::Members(all) => Ok(all),
            _ => Err(ServerError::Stopped),
        }
    }
}

/// Points the transport at a member's peer URLs (not at this member).
pub(super) fn connect_peer(transport: &Rc<Transport>, member: &MemberRecord) {
    if member.peer_urls.is_empty() {
        return;
    }
    match crate::config::parse_peer_urls("peer-urls", &member.peer_urls.join(",")) {
        Ok(addrs) => transport.add_peer(member.id, addrs),
        Err(e) => log(format_args!("member {:x}: {e}", member.id)),
    }
}

/// Whether `member` is in `cs`, on either side of a joint configuration.
pub(crate) fn conf_holds(cs: &ConfState, member: u64) -> bool {
    [
        &cs.voters,
        &cs.learners,
        &cs.voters_outgoing,
        &cs.learners_next,
    ]
    .iter()
    .any(|ids| ids.contains(&member))
}

pub(crate) fn single_change(kind: ConfChangeType, member: u64) -> ConfChangeSingle {
    let mut single = ConfChangeSingle::default();
    single.set_change_type(kind);
    single.node_id = member;
    single
}

/// Overlays the member records kept in MVCC metadata on `registry`.
pub(super) fn load_member_records(
    mvcc: &MvccStore<AnyEngine>,
    registry: &mut Registry,
) -> Result<()> {
    for (_, value) in mvcc.meta_with_prefix(members::META_PREFIX)? {
        if let Some(record) = members::decode(&value) {
            registry.upsert(record);
        }
    }
    Ok(())
}

/// The voter other than `me` whose log matches the leader's furthest (a
/// leader's view; `None` when it is the only voter).
pub(super) fn most_caught_up_voter(raw: &RawNode<MemStorage>, me: u64) -> Option<u64> {
    let prs = raw.raft.prs();
    let voters: Vec<u64> = prs.conf().voters().ids().iter().collect();
    voters
        .into_iter()
        .filter(|id| *id != me)
        .filter_map(|id| prs.get(id).map(|p| (p.matched, id)))
        .max()
        .map(|(_, id)| id)
}

/// A MemberAdd's peer URLs as etcd checks them (before anything else,
/// the caller's permission included), in its words.
pub fn check_new_member_urls(peer_urls: &[String]) -> Result<()> {
    if peer_urls.is_empty()
        || crate::config::parse_peer_urls("peer-urls", &peer_urls.join(",")).is_err()
    {
        return Err(ServerError::Membership(
            "etcdserver: given member URLs are invalid",
        ));
    }
    Ok(())
}
