//! The corruption checks of a group (etcd's `--experimental-initial-corrupt-check`
//! and `--experimental-corrupt-check-time`): this member's KV hash at a
//! revision, the whole store's hash, and comparing hashes with the peers'.

use super::*;

impl Node {
    /// The other members' IDs.
    pub(super) fn peer_ids(&self) -> Vec<u64> {
        let registry = self.member.registry.borrow();
        registry
            .all()
            .iter()
            .map(|m| m.id)
            .filter(|id| *id != self.member.id)
            .collect()
    }

    /// `peer`'s KV hash at `revision`: (hash, its current revision, its
    /// compact revision); None (logged) if it cannot say, as etcd skips
    /// such peers (down, lagging behind the revision, or compacted past it).
    pub(super) async fn peer_hash_kv(&self, peer: u64, revision: i64) -> Option<(u32, i64, i64)> {
        debug_assert!(revision > 0, "a hash check names its revision");
        let asked = Box::pin(self.within_request_timeout(async {
            self.member
                .transport
                .ask(peer, &peer::PeerQuery::HashKv(revision))
                .await
                .map_err(|e| ServerError::BadRequest(e.to_string()))
        }))
        .await;
        match asked {
            Ok(peer::PeerAnswer::HashKv(Ok((hash, hashed, current, compacted)))) => {
                // A hash of another revision compares with nothing.
                (hashed == revision).then_some((hash, current, compacted))
            }
            Ok(peer::PeerAnswer::HashKv(Err(why))) => {
                log(format_args!(
                    "cannot check the hash of peer {peer:x} at revision {revision}: {why}"
                ));
                None
            }
            Ok(_) => None,
            Err(e) => {
                log(format_args!("cannot fetch the hash of peer {peer:x}: {e}"));
                None
            }
        }
    }

    /// etcd's `--experimental-initial-corrupt-check`: a peer that hashes
    /// this member's revision differently, with the same compact revision,
    /// means this member's data diverged: refuse to serve.
    pub(super) async fn check_initial_hash(&self) -> Result<()> {
        let own = self.hash_kv(0).await?;
        let mut mismatches = 0;
        for peer in self.peer_ids() {
            let Some((hash, revision, compact_revision)) =
                self.peer_hash_kv(peer, own.revision).await
            else {
                continue;
            };
            if hash == own.hash {
                continue;
            }
            if compact_revision == own.compact_revision {
                log(format_args!(
                    "{:x}'s hash {} != {peer:x}'s hash {hash} (revision {}, peer revision \
                     {revision}, compact revision {compact_revision})",
                    self.member.id, own.hash, own.revision
                ));
                mismatches += 1;
            } else {
                log(format_args!(
                    "cannot check the hash of peer {peer:x}: it has a different compact \
                     revision {compact_revision} (revision {revision})"
                ));
            }
        }
        if mismatches > 0 {
            return Err(ServerError::Startup(format!(
                "{:x} found data inconsistency with peers (this member's data differs from \
                 theirs: remove it from the cluster, wipe its data dir and add it back, see \
                 docs/operations.md)",
                self.member.id
            )));
        }
        Ok(())
    }

    /// etcd's periodic corruption check, run by the leader: its own hash
    /// at its current revision against every peer's at that revision, its
    /// own again (a change at the same revision is local corruption). A
    /// peer ahead of the leader's revision or compaction, or hashing the
    /// same compacted history differently, gets the CORRUPT alarm (one
    /// member per check, as etcd), which stops every write cluster-wide.
    pub(super) async fn check_peer_hashes(&self) -> Result<()> {
        // Only a leader that knows every committed entry compares: a new
        // one may not have applied what a follower already has.
        if !self.leads_settled.get() {
            return Ok(());
        }
        let term = self.status.get().term;
        let first = self.hash_kv(0).await?;
        let mut answers = Vec::new();
        for peer in self.peer_ids() {
            if let Some(answer) = self.peer_hash_kv(peer, first.revision).await {
                answers.push((peer, answer));
            }
        }
        // Leadership lost meanwhile: followers moved on under another
        // leader, and their revisions say nothing about this member.
        if !self.leads_settled.get() || self.status.get().term != term {
            return Ok(());
        }
        let again = self.hash_kv(0).await?;
        let mut suspect = None;
        if again.hash != first.hash
            && again.revision == first.revision
            && again.compact_revision == first.compact_revision
        {
            suspect = Some(self.member.id);
        }
        for (peer, (hash, revision, compact_revision)) in answers {
            if suspect.is_some() {
                break;
            }
            if revision > again.revision
                || compact_revision > again.compact_revision
                || (compact_revision == first.compact_revision && hash != first.hash)
            {
                log(format_args!(
                    "member {peer:x}'s hash {hash} (revision {revision}, compact revision \
                     {compact_revision}) differs from the leader's {} (revision {}, compact \
                     revision {})",
                    first.hash, first.revision, first.compact_revision
                ));
                suspect = Some(peer);
            }
        }
        let Some(member) = suspect else {
            return Ok(());
        };
        log(format_args!(
            "raising the CORRUPT alarm for member {member:x}"
        ));
        self.alarm(crate::alarm::AlarmRequest {
            action: crate::alarm::AlarmAction::Activate,
            member,
            alarm: crate::alarm::AlarmType::Corrupt,
        })
        .await?;
        Ok(())
    }

    /// The Hash RPC's CRC of the whole store, computed on a thread of its
    /// own from a snapshot (it reads every record).
    pub async fn hash_all(&self) -> Result<(u32, i64)> {
        let snapshot = self.engine.borrow().snapshot();
        let revision = self.mvcc.borrow().current_revision();
        let started = Instant::now();
        let hash = on_a_thread("metcd-hash", move || {
            let mut hash = 0u32;
            engine::EngineSnapshot::scan(
                &snapshot,
                std::ops::Bound::Unbounded,
                std::ops::Bound::Unbounded,
                |k, v| {
                    hash = crc32c::crc32c_append(crc32c::crc32c_append(hash, k), v);
                    engine::Scan::Continue
                },
            )
            .map(|()| hash)
        })
        .await??;
        self.metrics.hash.observe_seconds(started.elapsed());
        Ok((hash, revision))
    }

    /// etcd's HashKV: planned on this core (the index's part), hashed on a
    /// thread of its own, so a large store's hash never stalls the shard.
    pub async fn hash_kv(&self, revision: i64) -> Result<mvcc::HashKv> {
        let started = Instant::now();
        let plan = self.mvcc.borrow().plan_hash_kv(revision)?;
        let hash = on_a_thread("metcd-hash", move || plan.run()).await??;
        self.metrics.hash_rev.observe_seconds(started.elapsed());
        Ok(hash)
    }
}
