//! Leases: the replicated part (which leases exist, their granted TTL, the
//! keys attached to each) and the leader-local part (when each expires).
//!
//! The replicated state changes only by applying log entries (grant,
//! revoke, and the put/delete events of MVCC), so every member holds the
//! same leases. Expiry times are not replicated: the leader keeps them, and
//! revokes an expired lease by proposing a revoke through the log, as etcd
//! does. After a restart or a leader change every lease gets its full TTL
//! again (etcd's `Promote`), or, with lease checkpoints on, the remaining
//! TTL the leader last checkpointed through the log.
//!
//! Must never: decide anything in apply from a clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::mvcc::{self, EventKind};

/// etcd's `MaxLeaseTTL` (about 285 years).
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    #[error("etcdserver: requested lease not found")]
    NotFound,
    #[error("etcdserver: lease already exists")]
    Exists,
    #[error("etcdserver: too large lease TTL")]
    TtlTooLarge,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseState {
    /// The TTL granted (the request's, raised to the minimum).
    pub ttl: i64,
    /// The remaining TTL of the last checkpoint (etcd's `remainingTTL`),
    /// until a keep-alive resets it: what a new leader starts from.
    pub checkpointed: Option<i64>,
    pub keys: BTreeSet<Bytes>,
}

/// The replicated lease table plus the leader's expiry clock.
#[derive(Debug, Default)]
pub struct Lessor {
    leases: BTreeMap<i64, LeaseState>,
    /// Which lease each key is attached to.
    key_lease: HashMap<Bytes, i64>,
    min_ttl: i64,
    expiry: HashMap<i64, Instant>,
    /// Leases whose revoke was proposed and not applied yet.
    revoking: BTreeSet<i64>,
}

/// etcd's minimum lease TTL: 1.5 election timeouts, in whole seconds.
pub fn min_ttl_secs(election_timeout_ms: u64) -> i64 {
    let ms = election_timeout_ms.saturating_mul(3) / 2;
    ms.div_ceil(1000) as i64
}

impl Lessor {
    pub fn new(min_ttl: i64) -> Self {
        Lessor {
            min_ttl,
            ..Default::default()
        }
    }

    pub fn min_ttl(&self) -> i64 {
        self.min_ttl
    }

    pub fn exists(&self, id: i64) -> bool {
        self.leases.contains_key(&id)
    }

    pub fn get(&self, id: i64) -> Option<&LeaseState> {
        self.leases.get(&id)
    }

    pub fn ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.leases.keys().copied()
    }

    /// Applies a grant. Returns the TTL granted.
    pub fn grant(&mut self, id: i64, ttl: i64, now: Instant) -> Result<i64, LeaseError> {
        if ttl > MAX_LEASE_TTL {
            return Err(LeaseError::TtlTooLarge);
        }
        if id <= 0 || self.leases.contains_key(&id) {
            return Err(LeaseError::Exists);
        }
        let ttl = ttl.max(self.min_ttl);
        self.restore(id, ttl, None, now);
        Ok(ttl)
    }

    /// Restores a lease read from storage (attachments come from MVCC).
    pub fn restore(&mut self, id: i64, ttl: i64, checkpointed: Option<i64>, now: Instant) {
        self.leases.insert(
            id,
            LeaseState {
                ttl,
                checkpointed,
                keys: BTreeSet::new(),
            },
        );
        self.start_clock(id, now);
    }

    /// Applies a checkpoint: the lease's remaining TTL as the leader saw
    /// it (0 clears it: a keep-alive gave a full TTL). Returns the lease's
    /// record after it, `None` for an unknown lease.
    pub fn checkpoint(&mut self, id: i64, remaining: i64) -> Option<&LeaseState> {
        let state = self.leases.get_mut(&id)?;
        state.checkpointed = (remaining > 0).then_some(remaining.min(state.ttl));
        Some(state)
    }

    /// The leader's checkpoints due now: (lease, remaining TTL) of every
    /// lease that will outlive `interval` (etcd checkpoints only those),
    /// in ID order.
    pub fn checkpoints_due(&self, now: Instant, interval: Duration) -> Vec<(i64, i64)> {
        self.leases
            .keys()
            .filter_map(|id| self.due_checkpoint(*id, now, interval))
            .collect()
    }

    /// `id`'s checkpoint (lease, remaining TTL) if it is due: the lease
    /// exists and will outlive `interval`.
    pub fn due_checkpoint(&self, id: i64, now: Instant, interval: Duration) -> Option<(i64, i64)> {
        let left = self.remaining(id, now)?;
        (left > interval.as_secs() as i64).then_some((id, left))
    }

    /// Starts a lease's expiry clock from its checkpointed remaining TTL,
    /// or its full TTL.
    fn start_clock(&mut self, id: i64, now: Instant) {
        if let Some(state) = self.leases.get(&id) {
            let secs = state.checkpointed.unwrap_or(state.ttl).max(0) as u64;
            self.expiry.insert(id, now + Duration::from_secs(secs));
        }
    }

    /// Applies a revoke: removes the lease and returns its keys (which the
    /// caller deletes in the same log entry).
    pub fn revoke(&mut self, id: i64) -> Result<Vec<Bytes>, LeaseError> {
        let state = self.leases.remove(&id).ok_or(LeaseError::NotFound)?;
        self.expiry.remove(&id);
        self.revoking.remove(&id);
        for k in &state.keys {
            self.key_lease.remove(k);
        }
        Ok(state.keys.into_iter().collect())
    }

    /// Follows attachments through applied MVCC changes.
    pub fn on_events(&mut self, events: &[mvcc::Event]) {
        for e in events {
            if let Some(old) = self.key_lease.remove(&e.kv.key) {
                if let Some(l) = self.leases.get_mut(&old) {
                    l.keys.remove(&e.kv.key);
                }
            }
            if e.kind == EventKind::Put && e.kv.lease != 0 {
                self.attach(e.kv.key.clone(), e.kv.lease);
            }
        }
    }

    pub fn attach(&mut self, key: Bytes, id: i64) {
        if let Some(l) = self.leases.get_mut(&id) {
            l.keys.insert(key.clone());
            self.key_lease.insert(key, id);
        }
    }

    /// Keep-alive: the lease lives another full TTL. `None` if unknown.
    pub fn refresh(&mut self, id: i64, now: Instant) -> Option<i64> {
        let ttl = self.leases.get(&id)?.ttl;
        self.expiry
            .insert(id, now + Duration::from_secs(ttl.max(0) as u64));
        Some(ttl)
    }

    /// A new leader takes over the expiry clock: every lease gets a full
    /// TTL from now (etcd's Promote), since the old leader's refreshes
    /// were never replicated, or its last checkpointed remaining TTL.
    pub fn promote(&mut self, now: Instant) {
        self.revoking.clear();
        let ids: Vec<i64> = self.leases.keys().copied().collect();
        for id in ids {
            self.start_clock(id, now);
        }
    }

    /// Seconds left, rounded up as etcd reports them; `None` if unknown.
    pub fn remaining(&self, id: i64, now: Instant) -> Option<i64> {
        self.leases.get(&id)?;
        let at = self.expiry.get(&id)?;
        let left = at.saturating_duration_since(now);
        Some(left.as_secs() as i64 + i64::from(left.subsec_nanos() > 0))
    }

    /// Expired leases not yet being revoked; marks them as being revoked.
    pub fn take_expired(&mut self, now: Instant, limit: usize) -> Vec<i64> {
        let mut out: Vec<i64> = self
            .expiry
            .iter()
            .filter(|(id, at)| **at <= now && !self.revoking.contains(id))
            .map(|(id, _)| *id)
            .collect();
        out.sort_unstable();
        out.truncate(limit);
        self.revoking.extend(out.iter().copied());
        out
    }

    /// A revoke proposal failed: let the expiry loop try again.
    pub fn revoke_failed(&mut self, id: i64) {
        self.revoking.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn put(key: &str, lease: i64) -> mvcc::Event {
        mvcc::Event {
            kind: EventKind::Put,
            kv: mvcc::KeyValue {
                key: Bytes::copy_from_slice(key.as_bytes()),
                lease,
                ..Default::default()
            },
            prev_kv: None,
            prev_kv_unread: false,
        }
    }

    #[test]
    fn a_checkpointed_lease_keeps_its_remaining_ttl_across_a_promotion() {
        let t0 = Instant::now();
        let mut l = Lessor::new(2);
        l.grant(7, 60, t0).unwrap();
        l.grant(8, 3, t0).unwrap();
        let later = t0 + Duration::from_secs(20);
        // Only leases that outlive the interval are checkpointed.
        assert_eq!(
            l.checkpoints_due(later, Duration::from_secs(5)),
            vec![(7, 40)]
        );
        assert_eq!(l.checkpoint(7, 40).unwrap().checkpointed, Some(40));
        assert!(l.checkpoint(9, 40).is_none());
        // A new leader starts from the checkpoint, not a full TTL.
        let promoted = later + Duration::from_secs(1);
        l.promote(promoted);
        assert_eq!(l.remaining(7, promoted), Some(40));
        assert_eq!(l.remaining(8, promoted), Some(3));
        // A keep-alive's reset checkpoint gives the full TTL back.
        l.checkpoint(7, 0);
        l.promote(promoted);
        assert_eq!(l.remaining(7, promoted), Some(60));
        // Restored from a record with a checkpoint: that one counts.
        let mut r = Lessor::new(2);
        r.restore(7, 60, Some(12), t0);
        assert_eq!(r.remaining(7, t0), Some(12));
    }

    #[test]
    fn min_ttl_matches_etcd() {
        // etcd's defaults: 1000 ms election timeout -> 2 s minimum.
        assert_eq!(min_ttl_secs(1000), 2);
        assert_eq!(min_ttl_secs(5000), 8);
    }

    #[test]
    fn grant_attach_move_revoke() {
        let now = Instant::now();
        let mut l = Lessor::new(2);
        assert_eq!(l.grant(7, 1, now), Ok(2));
        assert_eq!(l.grant(7, 10, now), Err(LeaseError::Exists));
        assert_eq!(
            l.grant(8, MAX_LEASE_TTL + 1, now),
            Err(LeaseError::TtlTooLarge)
        );
        l.grant(8, 10, now).unwrap();
        l.on_events(&[put("a", 7), put("b", 7), put("c", 8)]);
        // "b" moves to lease 8, "a" is overwritten without a lease.
        l.on_events(&[put("b", 8), put("a", 0)]);
        assert_eq!(l.get(7).unwrap().keys.len(), 0);
        let mut keys = l.revoke(8).unwrap();
        keys.sort();
        assert_eq!(
            keys,
            vec![Bytes::from_static(b"b"), Bytes::from_static(b"c")]
        );
        assert_eq!(l.revoke(8), Err(LeaseError::NotFound));
    }

    #[test]
    fn expiry_and_keepalive() {
        let t0 = Instant::now();
        let mut l = Lessor::new(1);
        l.grant(1, 5, t0).unwrap();
        assert_eq!(l.remaining(1, t0 + Duration::from_millis(1500)), Some(4));
        assert!(l.take_expired(t0 + Duration::from_secs(4), 10).is_empty());
        assert_eq!(l.refresh(1, t0 + Duration::from_secs(4)), Some(5));
        assert!(l.take_expired(t0 + Duration::from_secs(8), 10).is_empty());
        assert_eq!(l.take_expired(t0 + Duration::from_secs(9), 10), vec![1]);
        // Marked: not handed out twice while its revoke is in flight.
        assert!(l.take_expired(t0 + Duration::from_secs(10), 10).is_empty());
        l.revoke_failed(1);
        assert_eq!(l.take_expired(t0 + Duration::from_secs(10), 10), vec![1]);
    }
}
