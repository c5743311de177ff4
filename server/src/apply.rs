//! The state machine a Raft group's log applies to: the encoding of what
//! goes into the log, and the appliers of its entries to MVCC, leases,
//! auth and alarms (etcd's `applierV3`).
//!
//! Owns the rules that make apply deterministic: every member runs the
//! same entry through the same checks against the same applied state, so
//! an entry refused on one member is refused on all (auth revision, alarm,
//! unknown lease), and a refused entry still advances the applied index.
//!
//! Runtime-free, so the simulation ([`crate::sim`]) applies with the same
//! code as `node`: no glommio, no clock (the caller passes `now`), no
//! I/O beyond the engine's, no logging, no metrics (what a caller counts
//! or logs comes back in [`EntryOutcome`]). Must never: answer a client,
//! touch membership (the member's, in `node`), or decide anything from
//! state another member may not have.

use std::time::Instant;

use bytes::{Buf, BufMut};
use engine::Engine;

use crate::error::{Result, ServerError};
use crate::members::{self, MemberRecord};
use crate::mvcc::{self, MvccStore};

/// What an applied proposal produced, for its proposer.
#[derive(Debug)]
pub enum Applied {
    Kv(mvcc::Response),
    LeaseGranted {
        id: i64,
        ttl: i64,
        revision: i64,
    },
    LeaseRevoked {
        revision: i64,
    },
    Published,
    /// A membership change: the members after it.
    Members(Vec<MemberRecord>),
    Auth(crate::auth::AuthApplied),
    /// The alarms an Alarm call changed or asked for.
    Alarms(Vec<crate::alarm::AlarmMember>),
}

/// What goes into the log: `[u64 origin member][u64 proposal id][u8 tag][body]`.
/// Only the member that proposed an entry answers its client.
pub(crate) const HEADER_BYTES: usize = 17;
pub(crate) const TAG_KV: u8 = 1;
pub(crate) const TAG_LEASE_GRANT: u8 = 2;
pub(crate) const TAG_LEASE_REVOKE: u8 = 3;
pub(crate) const TAG_MEMBER_ATTRS: u8 = 4;
pub(crate) const TAG_CONF_RECORD: u8 = 5;
pub(crate) const TAG_MEMBER_PEERS: u8 = 6;
pub(crate) const TAG_AUTH: u8 = 7;
/// A client's KV write: `[ProposedBy][request]` (TAG_KV: metcd's own).
pub(crate) const TAG_KV_AUTHED: u8 = 8;
/// A client's lease revoke: `[ProposedBy][id]` (TAG_LEASE_REVOKE: expiry).
pub(crate) const TAG_LEASE_REVOKE_AUTHED: u8 = 9;
/// An Alarm call (`alarm::encode`).
pub(crate) const TAG_ALARM: u8 = 10;
/// Lease checkpoints: `[(id i64, remaining TTL i64) LE]*`.
pub(crate) const TAG_LEASE_CHECKPOINT: u8 = 11;
/// The user a client's write was checked for at proposal (empty: none, or
/// auth was off), and the auth revision of that check: every member checks
/// again at apply, where a newer auth revision refuses it while auth is on
/// (etcd's `ErrAuthOldRevision`), so a permission revoked or auth enabled
/// in between cannot be outrun.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProposedBy {
    pub(crate) user: String,
    pub(crate) auth_revision: u64,
}

impl ProposedBy {
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_u64_le(self.auth_revision);
        out.put_u32_le(self.user.len() as u32);
        out.extend_from_slice(self.user.as_bytes());
    }

    fn decode(data: &mut bytes::Bytes) -> Option<ProposedBy> {
        if data.len() < 12 {
            return None;
        }
        let auth_revision = data.get_u64_le();
        let len = data.get_u32_le() as usize;
        if data.len() < len {
            return None;
        }
        let user = String::from_utf8(data.split_to(len).to_vec()).ok()?;
        Some(ProposedBy {
            user,
            auth_revision,
        })
    }
}

pub(crate) enum Decoded {
    Kv(mvcc::Request, Option<ProposedBy>),
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke {
        id: i64,
        by: Option<ProposedBy>,
    },
    MemberAttrs(MemberRecord),
    /// The member a conf change adds, promotes or removes (entry context).
    ConfRecord(MemberRecord),
    /// New peer URLs of a member (MemberUpdate).
    MemberPeers(MemberRecord),
    Auth(crate::auth::AuthRequest),
    Alarm(crate::alarm::AlarmRequest),
    LeaseCheckpoint(Vec<(i64, i64)>),
}

pub(crate) fn decode_proposal(mut data: bytes::Bytes) -> Option<(u64, u64, Decoded)> {
    if data.len() < HEADER_BYTES {
        return None;
    }
    let origin = data.get_u64_le();
    let id = data.get_u64_le();
    let tag = data.get_u8();
    let body = match tag {
        TAG_KV => Decoded::Kv(mvcc::codec::decode_shared(&data).ok()?, None),
        TAG_KV_AUTHED => {
            let by = ProposedBy::decode(&mut data)?;
            Decoded::Kv(mvcc::codec::decode_shared(&data).ok()?, Some(by))
        }
        TAG_LEASE_GRANT if data.len() == 16 => Decoded::LeaseGrant {
            id: data.get_i64_le(),
            ttl: data.get_i64_le(),
        },
        TAG_LEASE_REVOKE if data.len() == 8 => Decoded::LeaseRevoke {
            id: data.get_i64_le(),
            by: None,
        },
        TAG_LEASE_REVOKE_AUTHED => {
            let by = ProposedBy::decode(&mut data)?;
            if data.len() != 8 {
                return None;
            }
            Decoded::LeaseRevoke {
                id: data.get_i64_le(),
                by: Some(by),
            }
        }
        TAG_MEMBER_ATTRS => Decoded::MemberAttrs(members::decode(&data)?),
        TAG_CONF_RECORD => Decoded::ConfRecord(members::decode(&data)?),
        TAG_MEMBER_PEERS => Decoded::MemberPeers(members::decode(&data)?),
        TAG_AUTH => Decoded::Auth(crate::auth::decode(&data)?),
        TAG_ALARM => Decoded::Alarm(crate::alarm::decode(&data)?),
        TAG_LEASE_CHECKPOINT if data.len().is_multiple_of(16) => Decoded::LeaseCheckpoint(
            data.chunks_exact(16)
                .map(|mut c| (c.get_i64_le(), c.get_i64_le()))
                .collect(),
        ),
        _ => return None,
    };
    Some((origin, id, body))
}

/// A lease's record: its TTL, then its checkpointed remaining TTL if any
/// (both i64 BE; read back by `restore_leases`).
pub(crate) fn lease_record(ttl: i64, checkpointed: Option<i64>) -> bytes::Bytes {
    let mut v = ttl.to_be_bytes().to_vec();
    if let Some(left) = checkpointed {
        v.extend_from_slice(&left.to_be_bytes());
    }
    bytes::Bytes::from(v)
}

pub(crate) fn lease_record_name(id: i64) -> Vec<u8> {
    let mut k = LEASE_META.to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// Every lease a request would attach keys to (puts of both txn branches).
pub(crate) fn leases_used(req: &mvcc::Request, out: &mut Vec<i64>) {
    fn op(o: &mvcc::RequestOp, out: &mut Vec<i64>) {
        match o {
            mvcc::RequestOp::Put(p) if p.lease != 0 && !p.ignore_lease => out.push(p.lease),
            mvcc::RequestOp::Txn(t) => t.success.iter().chain(&t.failure).for_each(|o| op(o, out)),
            _ => {}
        }
    }
    match req {
        mvcc::Request::Put(p) if p.lease != 0 && !p.ignore_lease => out.push(p.lease),
        mvcc::Request::Txn(t) => t.success.iter().chain(&t.failure).for_each(|o| op(o, out)),
        _ => {}
    }
}

/// The apply-time check of a client's write: the same on every member (the
/// user named in the entry, never a token; the applied auth state and
/// leases). While auth is on, a change of the auth state since the
/// proposer's check refuses it (etcd's `ErrAuthOldRevision`); so does what
/// the proposer's check would refuse now. With auth off nothing is built:
/// every client write passes here.
pub(crate) fn check_at_apply(
    auth: &crate::auth::AuthStore,
    lessor: &crate::lease::Lessor,
    by: &ProposedBy,
    collect: impl FnOnce(&mut Vec<crate::auth::Need>),
    leases: &[i64],
) -> std::result::Result<(), crate::auth::AuthError> {
    if !auth.enabled() {
        return Ok(());
    }
    let mut needs = Vec::new();
    collect(&mut needs);
    lease_needs(lessor, leases, &mut needs);
    if needs.is_empty() {
        return Ok(());
    }
    if by.auth_revision < auth.revision() {
        return Err(crate::auth::AuthError::AuthOldRevision);
    }
    auth.check(Some(&by.user), &crate::auth::Requirement::Keys(needs))
}

/// Write permission on every key attached to `leases` (unknown leases
/// have none).
pub(crate) fn lease_needs(
    lessor: &crate::lease::Lessor,
    leases: &[i64],
    out: &mut Vec<crate::auth::Need>,
) {
    for lease in leases {
        if let Some(state) = lessor.get(*lease) {
            out.extend(state.keys.iter().map(crate::auth::Need::write));
        }
    }
}

/// Leases' metadata records: `lease/<id i64 BE>` = [`lease_record`].
pub(crate) const LEASE_META: &[u8] = b"lease/";

/// One log entry's bytes: `[u64 origin member][u64 proposal id][u8 tag][body]`.
pub(crate) fn proposal(origin: u64, id: u64, tag: u8, body: &[u8]) -> Vec<u8> {
    let mut data = Vec::with_capacity(HEADER_BYTES + body.len());
    data.put_u64_le(origin);
    data.put_u64_le(id);
    data.put_u8(tag);
    data.extend_from_slice(body);
    data
}

/// A KV write's entry body and tag: a client's names who proposed it
/// (checked again at apply), the member's own does not.
pub(crate) fn kv_body(req: &mvcc::Request, by: Option<&ProposedBy>) -> (u8, Vec<u8>) {
    let mut body = Vec::with_capacity(64);
    let tag = proposer_first(by, &mut body, TAG_KV_AUTHED, TAG_KV);
    mvcc::codec::encode(req, &mut body);
    (tag, body)
}

/// Starts `body` with who proposed it, if a client did: the entry's tag
/// is then `authed`, `plain` otherwise.
fn proposer_first(by: Option<&ProposedBy>, body: &mut Vec<u8>, authed: u8, plain: u8) -> u8 {
    match by {
        Some(by) => {
            by.encode(body);
            authed
        }
        None => plain,
    }
}

/// A lease grant's entry body.
pub(crate) fn lease_grant_body(id: i64, ttl: i64) -> Vec<u8> {
    let mut body = Vec::with_capacity(16);
    body.put_i64_le(id);
    body.put_i64_le(ttl);
    body
}

/// A lease revoke's entry body and tag: a client's names who asked
/// (checked again at apply), the member's own (an expiry) does not.
pub(crate) fn lease_revoke_body(id: i64, by: Option<&ProposedBy>) -> (u8, Vec<u8>) {
    let mut body = Vec::with_capacity(32);
    let tag = proposer_first(by, &mut body, TAG_LEASE_REVOKE_AUTHED, TAG_LEASE_REVOKE);
    body.put_i64_le(id);
    (tag, body)
}

/// What applying one entry did, besides the state it changed.
pub(crate) struct EntryOutcome {
    /// The answer for the entry's proposer.
    pub result: Result<Applied>,
    /// A write that may add data applied (etcd's quota applier checks the
    /// store's size after those).
    pub grew: bool,
    /// An alarm was raised (`Some(true)`) or disarmed (`Some(false)`).
    pub alarm_changed: Option<bool>,
}

impl EntryOutcome {
    fn answer(result: Result<Applied>) -> EntryOutcome {
        EntryOutcome {
            result,
            grew: false,
            alarm_changed: None,
        }
    }
}

/// What the applier of an entry reads besides the entry.
pub(crate) struct ApplyContext {
    /// The time leases granted now count from (on this member; their
    /// expiry is the leader's decision, proposed through the log).
    pub now: Instant,
    /// The log index known committed at start: an Authenticate entry up to
    /// it is replayed, not new, and must not bring its token back.
    pub replayed_commit_index: u64,
}

/// The applied state of one Raft group, borrowed for a batch of entries.
pub(crate) struct StateMachine<'a, E: Engine> {
    pub mvcc: &'a mut MvccStore<E>,
    pub lessor: &'a mut crate::lease::Lessor,
    pub auth: &'a mut crate::auth::AuthStore,
    pub alarms: &'a mut crate::alarm::Alarms,
}

impl<E: Engine> StateMachine<'_, E> {
    /// Applies one decoded entry at `index`: its effects and the applied
    /// index together, or only the applied index when it is refused (the
    /// refusal, the same on every member, goes to its proposer). `events`
    /// gets the watch events, if anybody watches. `Err` is fatal: the
    /// member cannot go on (the engine failed).
    pub fn apply(
        &mut self,
        index: u64,
        decoded: Decoded,
        ctx: &ApplyContext,
        events: Option<&mut Vec<mvcc::Event>>,
    ) -> Result<EntryOutcome> {
        let result = match decoded {
            Decoded::Kv(req, by) => return self.apply_kv(index, &req, by.as_ref(), events),
            Decoded::LeaseGrant { id, ttl } => self.grant_lease(index, id, ttl, ctx.now)?,
            Decoded::LeaseCheckpoint(checkpoints) => {
                let mut records = Vec::with_capacity(checkpoints.len());
                for (id, remaining) in checkpoints {
                    if let Some(state) = self.lessor.checkpoint(id, remaining) {
                        let record = lease_record(state.ttl, state.checkpointed);
                        records.push((lease_record_name(id), Some(record)));
                    }
                }
                self.mvcc.write_meta(index, records)?;
                Ok(Applied::Published)
            }
            Decoded::Alarm(req) => {
                let (alarms, change) = self.alarms.apply(&req);
                match &change {
                    Some(crate::alarm::MetaChange::Put(name)) => {
                        self.mvcc.put_meta(index, name, bytes::Bytes::new())?
                    }
                    Some(crate::alarm::MetaChange::Delete(name)) => {
                        self.mvcc.delete_meta(index, name)?
                    }
                    None => self.mvcc.apply_noop(index)?,
                }
                return Ok(EntryOutcome {
                    result: Ok(Applied::Alarms(alarms)),
                    grew: false,
                    alarm_changed: change
                        .is_some()
                        .then_some(req.action == crate::alarm::AlarmAction::Activate),
                });
            }
            Decoded::Auth(crate::auth::AuthRequest::Authenticate { .. })
                if index <= ctx.replayed_commit_index =>
            {
                self.mvcc.apply_noop(index)?;
                Err(ServerError::Stopped)
            }
            Decoded::Auth(req) => match self.auth.apply(&req, index, ctx.now) {
                Ok((applied, changes)) => {
                    self.mvcc.write_meta(index, changes)?;
                    Ok(Applied::Auth(applied))
                }
                Err(e) => {
                    self.mvcc.apply_noop(index)?;
                    Err(ServerError::Auth(e))
                }
            },
            Decoded::LeaseRevoke { id, by } => self.revoke_lease(index, id, by.as_ref(), events)?,
            Decoded::ConfRecord(_) | Decoded::MemberAttrs(_) | Decoded::MemberPeers(_) => {
                self.mvcc.apply_noop(index)?;
                Err(ServerError::BadRequest(
                    "a membership record outside a conf change".into(),
                ))
            }
        };
        Ok(EntryOutcome::answer(result))
    }

    fn apply_kv(
        &mut self,
        index: u64,
        req: &mvcc::Request,
        by: Option<&ProposedBy>,
        events: Option<&mut Vec<mvcc::Event>>,
    ) -> Result<EntryOutcome> {
        let mut used = Vec::new();
        leases_used(req, &mut used);
        let refusal = if let Some(refusal) = self.alarms.refuses_kv(req) {
            Some(refusal.into())
        } else if let Some(e) = by.and_then(|by| {
            let collect = |needs: &mut Vec<_>| crate::auth::kv_needs(req, needs);
            check_at_apply(self.auth, self.lessor, by, collect, &used).err()
        }) {
            Some(ServerError::Auth(e))
        } else if used.iter().any(|l| !self.lessor.exists(*l)) {
            Some(ServerError::Lease(crate::lease::LeaseError::NotFound))
        } else {
            None
        };
        if let Some(refusal) = refusal {
            self.mvcc.apply_noop(index)?;
            return Ok(EntryOutcome::answer(Err(refusal)));
        }
        match self.mvcc.apply(index, req) {
            Ok(outcome) => {
                self.lessor.on_events(&outcome.events);
                if let Some(events) = events {
                    events.extend(outcome.events);
                }
                Ok(EntryOutcome {
                    result: Ok(Applied::Kv(outcome.response)),
                    grew: crate::alarm::cost(req) > 0,
                    alarm_changed: None,
                })
            }
            Err(e) if e.is_fatal() => Err(e.into()),
            Err(e) => Ok(EntryOutcome::answer(Err(ServerError::Mvcc(e)))),
        }
    }

    fn grant_lease(
        &mut self,
        index: u64,
        id: i64,
        ttl: i64,
        now: Instant,
    ) -> Result<Result<Applied>> {
        let granted = match self.alarms.refuses_lease_grant() {
            Some(refusal) => Err(refusal.into()),
            None => self.lessor.grant(id, ttl, now).map_err(ServerError::Lease),
        };
        Ok(match granted {
            Ok(ttl) => {
                self.mvcc
                    .put_meta(index, &lease_record_name(id), lease_record(ttl, None))?;
                Ok(Applied::LeaseGranted {
                    id,
                    ttl,
                    revision: self.mvcc.current_revision(),
                })
            }
            Err(e) => {
                self.mvcc.apply_noop(index)?;
                Err(e)
            }
        })
    }

    /// Revokes a lease and deletes its keys, all at one revision, as
    /// etcd's revoke.
    fn revoke_lease(
        &mut self,
        index: u64,
        id: i64,
        by: Option<&ProposedBy>,
        events: Option<&mut Vec<mvcc::Event>>,
    ) -> Result<Result<Applied>> {
        let refused = match self.alarms.refuses_lease_revoke() {
            Some(refusal) => Err(refusal.into()),
            None => by
                .map_or(Ok(()), |by| {
                    check_at_apply(self.auth, self.lessor, by, |_| {}, &[id])
                })
                .map_err(ServerError::Auth),
        };
        let keys = match refused.and_then(|()| self.lessor.revoke(id).map_err(ServerError::Lease)) {
            Ok(keys) => keys,
            Err(e) => {
                self.mvcc.apply_noop(index)?;
                return Ok(Err(e));
            }
        };
        if !keys.is_empty() {
            let txn = mvcc::TxnRequest {
                compare: Vec::new(),
                success: keys
                    .into_iter()
                    .map(|key| {
                        mvcc::RequestOp::DeleteRange(mvcc::DeleteRangeRequest {
                            key,
                            range_end: bytes::Bytes::new(),
                            prev_kv: false,
                        })
                    })
                    .collect(),
                failure: Vec::new(),
            };
            match self.mvcc.apply(index, &mvcc::Request::Txn(txn)) {
                Ok(outcome) => {
                    if let Some(events) = events {
                        events.extend(outcome.events);
                    }
                }
                Err(e) if e.is_fatal() => return Err(e.into()),
                // The deletes cannot be refused (no compares, plain keys);
                // the lease is gone either way, on every member alike.
                Err(_) => {}
            }
        }
        self.mvcc.delete_meta(index, &lease_record_name(id))?;
        Ok(Ok(Applied::LeaseRevoked {
            revision: self.mvcc.current_revision(),
        }))
    }
}

/// The applied state beside MVCC, rebuilt from its records in MVCC at a
/// start or after a leader's snapshot is installed: the lease table (every
/// lease a full TTL from `now`), the auth state and the alarms.
pub(crate) fn restore_beside_mvcc<E: Engine>(
    mvcc: &MvccStore<E>,
    min_lease_ttl: i64,
    now: Instant,
) -> Result<(
    crate::lease::Lessor,
    crate::auth::AuthStore,
    crate::alarm::Alarms,
)> {
    Ok((
        restore_leases(mvcc, min_lease_ttl, now)?,
        restore_auth(mvcc)?,
        restore_alarms(mvcc)?,
    ))
}

/// Rebuilds the lease table: leases from their records, attachments from
/// the keys' `lease` fields. Every lease starts a full TTL (etcd's Promote).
fn restore_leases<E: Engine>(
    mvcc: &MvccStore<E>,
    min_ttl: i64,
    now: Instant,
) -> Result<crate::lease::Lessor> {
    let mut lessor = crate::lease::Lessor::new(min_ttl);
    for (name, value) in mvcc.meta_with_prefix(LEASE_META)? {
        let field = |at: usize| {
            value
                .get(at..at + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
        };
        let (Ok(id), Some(ttl), 8 | 16) = (
            <[u8; 8]>::try_from(&name[LEASE_META.len()..]),
            field(0),
            value.len(),
        ) else {
            return Err(ServerError::Mvcc(mvcc::MvccError::Corrupt(format!(
                "bad lease record {name:02x?}"
            ))));
        };
        let checkpointed = field(8).map(i64::from_be_bytes);
        lessor.restore(
            i64::from_be_bytes(id),
            i64::from_be_bytes(ttl),
            checkpointed,
            now,
        );
    }
    // Which keys hold a lease is only in their records: read them all, but
    // only when some lease exists, and a page at a time (one range of the
    // whole store would hold every value at once: 256 MiB per 1M keys).
    if lessor.ids().next().is_none() {
        return Ok(lessor);
    }
    const PAGE: i64 = 4096;
    let mut from = bytes::Bytes::from_static(b"\0");
    loop {
        let page = mvcc.range(&mvcc::RangeRequest {
            key: from,
            range_end: bytes::Bytes::from_static(b"\0"),
            limit: PAGE,
            ..Default::default()
        })?;
        let Some(last) = page.kvs.last() else { break };
        from = mvcc::key_after(&last.key).into();
        for kv in page.kvs.into_iter().filter(|kv| kv.lease != 0) {
            lessor.attach(kv.key, kv.lease);
        }
        if !page.more {
            break;
        }
    }
    Ok(lessor)
}

/// The active alarms, from their records.
fn restore_alarms<E: Engine>(mvcc: &MvccStore<E>) -> Result<crate::alarm::Alarms> {
    let records = mvcc.meta_with_prefix(crate::alarm::META_PREFIX)?;
    Ok(crate::alarm::Alarms::from_meta(&records))
}

/// Rebuilds the auth state (users, roles, the enabled flag) from its records.
fn restore_auth<E: Engine>(mvcc: &MvccStore<E>) -> Result<crate::auth::AuthStore> {
    let records = mvcc.meta_with_prefix(crate::auth::META_PREFIX)?;
    crate::auth::AuthStore::restore(&records)
        .map_err(|e| ServerError::Mvcc(mvcc::MvccError::Corrupt(e)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use crate::auth::{AuthError, AuthRequest, AuthStore, KeyPermission, Need, PermType};
    use bytes::Bytes;

    /// root, and alice whose role may write `a*` only; auth on.
    fn auth_store() -> AuthStore {
        let mut s = AuthStore::default();
        let now = Instant::now();
        for req in [
            AuthRequest::UserAdd {
                name: "root".into(),
                hashed_password: Bytes::from_static(b"h"),
                no_password: false,
            },
            AuthRequest::UserGrantRole {
                user: "root".into(),
                role: crate::auth::ROOT.into(),
            },
            AuthRequest::UserAdd {
                name: "alice".into(),
                hashed_password: Bytes::from_static(b"h"),
                no_password: false,
            },
            AuthRequest::RoleAdd { name: "w".into() },
            AuthRequest::RoleGrantPermission {
                name: "w".into(),
                perm: KeyPermission {
                    perm_type: PermType::Write,
                    key: Bytes::from_static(b"a"),
                    range_end: Bytes::from_static(b"b"),
                },
            },
            AuthRequest::UserGrantRole {
                user: "alice".into(),
                role: "w".into(),
            },
            AuthRequest::Enable,
        ] {
            s.apply(&req, 1, now).unwrap();
        }
        s
    }

    fn put(key: &'static str, lease: i64) -> mvcc::Request {
        mvcc::Request::Put(mvcc::PutRequest {
            key: Bytes::from_static(key.as_bytes()),
            value: Bytes::from_static(b"v"),
            lease,
            ..Default::default()
        })
    }

    fn at_apply(
        auth: &AuthStore,
        lessor: &crate::lease::Lessor,
        by: &ProposedBy,
        req: &mvcc::Request,
    ) -> std::result::Result<(), AuthError> {
        let mut used = Vec::new();
        leases_used(req, &mut used);
        let collect = |needs: &mut Vec<Need>| crate::auth::kv_needs(req, needs);
        check_at_apply(auth, lessor, by, collect, &used)
    }

    #[test]
    fn a_write_is_checked_again_at_apply_against_the_applied_auth_state() {
        let mut auth = auth_store();
        let mut lessor = crate::lease::Lessor::new(1);
        let now = Instant::now();
        lessor.grant(7, 60, now).unwrap();
        lessor.attach(Bytes::from_static(b"zebra"), 7);
        let alice = ProposedBy {
            user: "alice".into(),
            auth_revision: auth.revision(),
        };
        assert_eq!(at_apply(&auth, &lessor, &alice, &put("apple", 0)), Ok(()));
        assert_eq!(
            at_apply(&auth, &lessor, &alice, &put("zoo", 0)),
            Err(AuthError::PermissionDenied)
        );
        // Attaching to a lease that holds a key alice may not write is
        // refused (etcd's checkLeasePuts); so is revoking it.
        assert_eq!(
            at_apply(&auth, &lessor, &alice, &put("apple", 7)),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(
            check_at_apply(&auth, &lessor, &alice, |_| {}, &[7]),
            Err(AuthError::PermissionDenied)
        );
        // An unknown lease has no keys: the lease check is not the one
        // that refuses (the apply then answers "lease not found").
        assert_eq!(check_at_apply(&auth, &lessor, &alice, |_| {}, &[8]), Ok(()));
        // Any auth change between the proposer's check and the apply
        // refuses the write, whatever it changed.
        auth.apply(&AuthRequest::RoleAdd { name: "x".into() }, 2, now)
            .unwrap();
        assert_eq!(
            at_apply(&auth, &lessor, &alice, &put("apple", 0)),
            Err(AuthError::AuthOldRevision)
        );
        let fresh = ProposedBy {
            user: "alice".into(),
            auth_revision: auth.revision(),
        };
        assert_eq!(at_apply(&auth, &lessor, &fresh, &put("apple", 0)), Ok(()));
        // With auth turned off by then, nothing is refused.
        auth.apply(&AuthRequest::Disable, 3, now).unwrap();
        assert_eq!(at_apply(&auth, &lessor, &alice, &put("zoo", 7)), Ok(()));
        // A write proposed while auth was off (no user) and applied after
        // it was turned on is refused: enabling moved the revision.
        let anonymous = ProposedBy {
            user: String::new(),
            auth_revision: auth.revision(),
        };
        auth.apply(&AuthRequest::Enable, 4, now).unwrap();
        assert_eq!(
            at_apply(&auth, &lessor, &anonymous, &put("apple", 0)),
            Err(AuthError::AuthOldRevision)
        );
        // ... and one that names nobody at the current revision, too.
        let nobody = ProposedBy {
            user: String::new(),
            auth_revision: auth.revision(),
        };
        assert_eq!(
            at_apply(&auth, &lessor, &nobody, &put("apple", 0)),
            Err(AuthError::UserEmpty)
        );
    }

    #[test]
    fn authed_entries_carry_their_proposer_through_the_log_encoding() {
        let by = ProposedBy {
            user: "alice".into(),
            auth_revision: 42,
        };
        let mut body = Vec::new();
        by.encode(&mut body);
        mvcc::codec::encode(&put("apple", 0), &mut body);
        let mut entry = Vec::new();
        entry.put_u64_le(3);
        entry.put_u64_le(9);
        entry.put_u8(TAG_KV_AUTHED);
        entry.extend_from_slice(&body);
        match decode_proposal(Bytes::from(entry.clone())) {
            Some((3, 9, Decoded::Kv(req, Some(got)))) => {
                assert_eq!(got, by);
                assert_eq!(req, put("apple", 0));
            }
            _ => panic!("the authed write did not decode"),
        }
        // A user name longer than the entry is refused, not read past.
        let cut = HEADER_BYTES + 12 + 2;
        assert!(decode_proposal(Bytes::from(entry[..cut].to_vec())).is_none());

        let mut revoke = Vec::new();
        revoke.put_u64_le(3);
        revoke.put_u64_le(10);
        revoke.put_u8(TAG_LEASE_REVOKE_AUTHED);
        by.encode(&mut revoke);
        revoke.put_i64_le(7);
        match decode_proposal(Bytes::from(revoke)) {
            Some((
                3,
                10,
                Decoded::LeaseRevoke {
                    id: 7,
                    by: Some(got),
                },
            )) => assert_eq!(got, by),
            _ => panic!("the authed revoke did not decode"),
        }
    }
}
