//! A group's leases as clients and peers see them: grants and revokes
//! through the log, keep-alives and TTL queries on the leader's lessor
//! (forwarded there by a follower), the lessor's periodic checkpoints, and
//! the answers to what peers ask this member (lease questions, a learner's
//! promotion, its KV hash).

use super::*;

impl Node {
    /// Grants a lease through the log; `id` 0 lets the member pick one.
    pub async fn lease_grant(&self, id: i64, ttl: i64) -> Result<(i64, i64, i64)> {
        self.check_quota(crate::alarm::LEASE_COST).await?;
        if ttl > crate::lease::MAX_LEASE_TTL {
            return Err(ServerError::Lease(crate::lease::LeaseError::TtlTooLarge));
        }
        let id = if id == 0 { self.new_lease_id() } else { id };
        match self
            .propose(TAG_LEASE_GRANT, &lease_grant_body(id, ttl))
            .await?
        {
            Applied::LeaseGranted { id, ttl, revision } => Ok((id, ttl, revision)),
            _ => Err(ServerError::Stopped),
        }
    }

    /// Revokes a lease through the log, deleting its keys; returns the
    /// revision. A client needs write permission on every attached key.
    pub async fn lease_revoke(&self, id: i64, caller: Caller<'_>) -> Result<i64> {
        let by = match caller {
            Caller::Member => None,
            Caller::Client(token) => Some(self.check_proposal(token, |_| {}, &[id])?),
        };
        let (tag, body) = lease_revoke_body(id, by.as_ref());
        match self.propose(tag, &body).await? {
            Applied::LeaseRevoked { revision } => Ok(revision),
            _ => Err(ServerError::Stopped),
        }
    }

    /// Keep-alive (leader-local, as in etcd): the TTL, or `None` if unknown.
    pub fn lease_keepalive(&self, id: i64) -> Option<i64> {
        let mut lessor = self.lessor.borrow_mut();
        let ttl = lessor.refresh(id, Instant::now())?;
        crate::metrics::count(&self.metrics.leases_renewed);
        let checkpointed = lessor.get(id).is_some_and(|l| l.checkpointed.is_some());
        if checkpointed || self.checkpoints_in_flight.borrow().contains(&id) {
            // The full TTL from now is what a new leader must start from
            // (etcd resets the checkpoint on a keep-alive too).
            self.checkpoint_resets.borrow_mut().insert(id);
        }
        Some(ttl)
    }

    /// Proposes one batch of lease checkpoints and waits for it.
    pub(super) async fn propose_checkpoints(&self, batch: &[(i64, i64)]) -> Result<()> {
        let mut body = Vec::with_capacity(batch.len() * 16);
        for (id, remaining) in batch {
            body.put_i64_le(*id);
            body.put_i64_le(*remaining);
        }
        self.propose(TAG_LEASE_CHECKPOINT, &body).await.map(|_| ())
    }

    /// The leader's periodic checkpoints of the leases in `due`, in
    /// etcd's batches of 1000, each batch's remaining TTLs read when it is
    /// proposed (a keep-alive between batches is not overwritten).
    pub(super) async fn checkpoint_due(&self, due: Vec<i64>, interval: Duration) {
        for ids in due.chunks(LEASE_CHECKPOINT_BATCH) {
            let now = Instant::now();
            let batch: Vec<(i64, i64)> = {
                let lessor = self.lessor.borrow();
                ids.iter()
                    .filter_map(|id| lessor.due_checkpoint(*id, now, interval))
                    .collect()
            };
            self.checkpoints_in_flight
                .borrow_mut()
                .extend(batch.iter().map(|(id, _)| *id));
            let proposed = self.propose_checkpoints(&batch).await;
            let mut in_flight = self.checkpoints_in_flight.borrow_mut();
            for (id, _) in &batch {
                in_flight.remove(id);
            }
            if let Err(e) = proposed {
                log(format_args!("lease checkpoint: {e}"));
                return;
            }
        }
    }

    /// Proposes the resets keep-alives asked for; a failed one is asked
    /// again while this member still leads (the next loop turn retries).
    pub(super) async fn reset_checkpoints(&self, ids: Vec<i64>) {
        for ids in ids.chunks(LEASE_CHECKPOINT_BATCH) {
            let batch: Vec<(i64, i64)> = ids.iter().map(|id| (*id, 0)).collect();
            if let Err(e) = self.propose_checkpoints(&batch).await {
                log(format_args!("lease checkpoint reset: {e}"));
                if self.leads_leases() {
                    self.checkpoint_resets
                        .borrow_mut()
                        .extend(ids.iter().copied());
                }
            }
        }
    }

    /// (remaining TTL, granted TTL, keys) of a lease, `None` if unknown.
    pub fn lease_time_to_live(&self, id: i64) -> Option<(i64, i64, Vec<bytes::Bytes>)> {
        let lessor = self.lessor.borrow();
        let state = lessor.get(id)?;
        let remaining = lessor.remaining(id, Instant::now()).unwrap_or(state.ttl);
        Some((remaining, state.ttl, state.keys.iter().cloned().collect()))
    }

    /// A follower's forwarded lease question, answered by the leader.
    pub(super) async fn answer_peer(&self, q: peer::PeerQuery) -> peer::PeerAnswer {
        if let peer::PeerQuery::HashKv(revision) = q {
            return peer::PeerAnswer::HashKv(
                self.hash_kv(revision)
                    .await
                    .map(|h| (h.hash, h.hash_revision, h.revision, h.compact_revision))
                    .map_err(|e| e.to_string()),
            );
        }
        if !self.leads_leases() {
            return peer::PeerAnswer::NotLeader;
        }
        match q {
            peer::PeerQuery::KeepAlive(id) => peer::PeerAnswer::KeepAlive(self.lease_keepalive(id)),
            peer::PeerQuery::TimeToLive(id) => peer::PeerAnswer::TimeToLive(
                self.lease_time_to_live(id)
                    .map(|(remaining, granted, keys)| {
                        (
                            remaining,
                            granted,
                            keys.into_iter().map(|k| k.to_vec()).collect(),
                        )
                    }),
            ),
            peer::PeerQuery::Promote(id) => {
                peer::PeerAnswer::Promoted(self.member_promote(id).await.map_err(|e| e.to_string()))
            }
            peer::PeerQuery::HashKv(_) => peer::PeerAnswer::NotLeader,
        }
    }

    /// Asks the leader a lease question (from a follower).
    pub async fn forward_lease(&self, q: peer::PeerQuery) -> Result<peer::PeerAnswer> {
        let leader = self.status.get().leader;
        if leader == 0 {
            return Err(ServerError::NoLeader);
        }
        // Boxed: the peer call's future is kilobytes, and unboxed it would
        // size every owner command's future (puts included) to match.
        Box::pin(self.within_request_timeout(async {
            self.member
                .transport
                .ask(leader, &q)
                .await
                .map_err(|_| ServerError::NotLeader)
        }))
        .await
    }

    /// `answer`, or `etcdserver: request timed out` after etcd's request
    /// timeout (what may never come back once a peer is involved).
    pub(super) async fn within_request_timeout<T>(
        &self,
        answer: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let timed_out = async {
            glommio::timer::sleep(self.request_timeout).await;
            Err(ServerError::Timeout)
        };
        futures_lite::future::or(answer, timed_out).await
    }

    pub fn leases(&self) -> Vec<i64> {
        self.lessor.borrow().ids().collect()
    }

    /// etcd picks lease IDs from its request-ID generator: positive, unique.
    pub(super) fn new_lease_id(&self) -> i64 {
        loop {
            let id = self.next_id.get().wrapping_add(1);
            self.next_id.set(id);
            let candidate = (id & (i64::MAX as u64)) as i64;
            if candidate != 0 && !self.lessor.borrow().exists(candidate) {
                return candidate;
            }
        }
    }
}
