//! Alarms and the backend quota: etcd's `AlarmStore`, its `backendQuota`
//! and the capped and corrupt appliers.
//!
//! Owns: which alarms are active (an alarm type and the member that raised
//! it), their encoding in the log and in MVCC metadata, what an active
//! alarm refuses at apply, and the quota's estimate of what a request adds
//! to the store. Alarms change only by applying a log entry, so every
//! member refuses the same entries.
//!
//! Must never: propose, read the engine, or know the wire types (the node
//! decides when to raise an alarm, the API edge converts).

use std::collections::BTreeSet;

use bytes::{Buf, BufMut, Bytes};

use crate::mvcc;

/// etcd's `AlarmType` (the wire numbers are the enum's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AlarmType {
    /// In a request: any alarm.
    None,
    /// The store reached `--quota-backend-bytes`: writes that add data are
    /// refused until an operator disarms it.
    NoSpace,
    /// A member's data diverged: every write is refused.
    Corrupt,
}

impl AlarmType {
    pub fn from_wire(v: i32) -> Option<AlarmType> {
        match v {
            0 => Some(AlarmType::None),
            1 => Some(AlarmType::NoSpace),
            2 => Some(AlarmType::Corrupt),
            _ => None,
        }
    }

    pub fn wire(self) -> i32 {
        match self {
            AlarmType::None => 0,
            AlarmType::NoSpace => 1,
            AlarmType::Corrupt => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AlarmType::None => "NONE",
            AlarmType::NoSpace => "NOSPACE",
            AlarmType::Corrupt => "CORRUPT",
        }
    }
}

/// etcd's `AlarmRequest.AlarmAction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlarmAction {
    Get,
    Activate,
    Deactivate,
}

impl AlarmAction {
    pub fn from_wire(v: i32) -> Option<AlarmAction> {
        match v {
            0 => Some(AlarmAction::Get),
            1 => Some(AlarmAction::Activate),
            2 => Some(AlarmAction::Deactivate),
            _ => None,
        }
    }
}

/// An Alarm call. etcd 3.4 sends every one through Raft, `Get` included,
/// so it is answered from the state at its place in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlarmRequest {
    pub action: AlarmAction,
    pub member: u64,
    pub alarm: AlarmType,
}

/// One active alarm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AlarmMember {
    pub member: u64,
    pub alarm: AlarmType,
}

impl AlarmMember {
    /// gogoproto's compact text form, as etcd puts it in Status `errors`
    /// (`memberID:<id> alarm:NOSPACE `, with the trailing space).
    pub fn text(&self) -> String {
        format!("memberID:{} alarm:{} ", self.member, self.alarm.name())
    }
}

/// Log body: `[action u8][alarm u8][member u64 LE]`.
pub fn encode(req: &AlarmRequest, out: &mut Vec<u8>) {
    out.put_u8(match req.action {
        AlarmAction::Get => 0,
        AlarmAction::Activate => 1,
        AlarmAction::Deactivate => 2,
    });
    out.put_u8(req.alarm.wire() as u8);
    out.put_u64_le(req.member);
}

pub fn decode(mut data: &[u8]) -> Option<AlarmRequest> {
    if data.len() != 10 {
        return None;
    }
    let action = AlarmAction::from_wire(i32::from(data.get_u8()))?;
    let alarm = AlarmType::from_wire(i32::from(data.get_u8()))?;
    Some(AlarmRequest {
        action,
        member: data.get_u64_le(),
        alarm,
    })
}

/// MVCC metadata prefix of the active alarms (`alarm/<type u8><member BE>`,
/// empty values), so restarts and snapshots carry them.
pub const META_PREFIX: &[u8] = b"alarm/";

fn meta_name(m: &AlarmMember) -> Vec<u8> {
    let mut name = META_PREFIX.to_vec();
    name.put_u8(m.alarm.wire() as u8);
    name.put_u64(m.member);
    name
}

/// What applying an alarm request changes in the metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaChange {
    Put(Vec<u8>),
    Delete(Vec<u8>),
}

/// Why an active alarm refuses an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NoSpace,
    Corrupt,
}

/// The active alarms.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Alarms {
    active: BTreeSet<(AlarmType, u64)>,
}

impl Alarms {
    /// The alarms recorded under [`META_PREFIX`]; unknown names are
    /// skipped (a newer alarm type this version does not enforce).
    pub fn from_meta(entries: &[(Bytes, Bytes)]) -> Alarms {
        let mut alarms = Alarms::default();
        for (name, _) in entries {
            let Some(mut rest) = name.strip_prefix(META_PREFIX) else {
                continue;
            };
            if rest.len() != 9 {
                continue;
            }
            if let Some(alarm) = AlarmType::from_wire(i32::from(rest.get_u8())) {
                alarms.active.insert((alarm, rest.get_u64()));
            }
        }
        alarms
    }

    pub fn is_active(&self, alarm: AlarmType, member: u64) -> bool {
        self.active.contains(&(alarm, member))
    }

    /// Whether no alarm at all is on (etcd's `/health`).
    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// Whether some member's alarm of this type is on.
    pub fn any(&self, alarm: AlarmType) -> bool {
        self.active
            .range((alarm, 0)..=(alarm, u64::MAX))
            .next()
            .is_some()
    }

    /// Active alarms of type `alarm` (every type for `None`), by type then
    /// member.
    pub fn get(&self, alarm: AlarmType) -> Vec<AlarmMember> {
        self.active
            .iter()
            .filter(|(a, _)| alarm == AlarmType::None || *a == alarm)
            .map(|&(alarm, member)| AlarmMember { member, alarm })
            .collect()
    }

    /// Applies `req` as etcd's applier does: Activate answers with the
    /// alarm (active already or not), Deactivate with the alarm it cleared
    /// (nothing if it was not active), Get with the matching alarms. Like
    /// etcd's store this keeps any type, `None` included (it refuses
    /// nothing but shows in the list).
    pub fn apply(&mut self, req: &AlarmRequest) -> (Vec<AlarmMember>, Option<MetaChange>) {
        let m = AlarmMember {
            member: req.member,
            alarm: req.alarm,
        };
        match req.action {
            AlarmAction::Get => (self.get(req.alarm), None),
            AlarmAction::Activate => {
                let change = self
                    .active
                    .insert((m.alarm, m.member))
                    .then(|| MetaChange::Put(meta_name(&m)));
                (vec![m], change)
            }
            AlarmAction::Deactivate => {
                if self.active.remove(&(m.alarm, m.member)) {
                    (vec![m], Some(MetaChange::Delete(meta_name(&m))))
                } else {
                    (Vec::new(), None)
                }
            }
        }
    }

    /// Whether an active alarm refuses this KV request (etcd's capped
    /// applier under NOSPACE: puts and txns that could put; the corrupt one
    /// under CORRUPT: every write and compaction).
    pub fn refuses_kv(&self, req: &mvcc::Request) -> Option<Refusal> {
        if self.any(AlarmType::Corrupt) {
            return Some(Refusal::Corrupt);
        }
        (self.any(AlarmType::NoSpace) && cost(req) > 0).then_some(Refusal::NoSpace)
    }

    pub fn refuses_lease_grant(&self) -> Option<Refusal> {
        if self.any(AlarmType::Corrupt) {
            Some(Refusal::Corrupt)
        } else if self.any(AlarmType::NoSpace) {
            Some(Refusal::NoSpace)
        } else {
            None
        }
    }

    pub fn refuses_lease_revoke(&self) -> Option<Refusal> {
        self.any(AlarmType::Corrupt).then_some(Refusal::Corrupt)
    }
}

/// etcd's estimate of the bytes a stored key costs beyond key and value.
const KV_OVERHEAD: u64 = 256;
/// etcd's estimate of the bytes a lease costs.
pub const LEASE_COST: u64 = 64;

fn put_cost(p: &mvcc::PutRequest) -> u64 {
    KV_OVERHEAD + (p.key.len() + p.value.len()) as u64
}

fn ops_cost(ops: &[mvcc::RequestOp]) -> u64 {
    ops.iter()
        .map(|op| match op {
            mvcc::RequestOp::Put(p) => put_cost(p),
            mvcc::RequestOp::Txn(t) => txn_cost(t),
            mvcc::RequestOp::Range(_) | mvcc::RequestOp::DeleteRange(_) => 0,
        })
        .sum()
}

/// The larger branch, as etcd's `costTxn` (which stops at the top level;
/// puts in nested txns count here too, so they cannot slip past a full
/// store).
fn txn_cost(t: &mvcc::TxnRequest) -> u64 {
    ops_cost(&t.success).max(ops_cost(&t.failure))
}

/// What `req` may add to the store, as etcd's quota estimates it: 0 for
/// requests that only read or delete.
pub fn cost(req: &mvcc::Request) -> u64 {
    match req {
        mvcc::Request::Put(p) => put_cost(p),
        mvcc::Request::Txn(t) => txn_cost(t),
        mvcc::Request::DeleteRange(_) | mvcc::Request::Compaction(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(action: AlarmAction, member: u64, alarm: AlarmType) -> AlarmRequest {
        AlarmRequest {
            action,
            member,
            alarm,
        }
    }

    fn put(key: &'static str, value: &'static str) -> mvcc::RequestOp {
        mvcc::RequestOp::Put(mvcc::PutRequest {
            key: Bytes::from_static(key.as_bytes()),
            value: Bytes::from_static(value.as_bytes()),
            lease: 0,
            prev_kv: false,
            ignore_value: false,
            ignore_lease: false,
        })
    }

    fn delete(key: &'static str) -> mvcc::RequestOp {
        mvcc::RequestOp::DeleteRange(mvcc::DeleteRangeRequest {
            key: Bytes::from_static(key.as_bytes()),
            range_end: Bytes::new(),
            prev_kv: false,
        })
    }

    fn txn(success: Vec<mvcc::RequestOp>, failure: Vec<mvcc::RequestOp>) -> mvcc::TxnRequest {
        mvcc::TxnRequest {
            compare: Vec::new(),
            success,
            failure,
        }
    }

    #[test]
    fn activation_and_deactivation_answer_what_they_changed_and_persist_it() {
        let mut alarms = Alarms::default();
        let (changed, meta) = alarms.apply(&req(AlarmAction::Activate, 7, AlarmType::NoSpace));
        let seven = AlarmMember {
            member: 7,
            alarm: AlarmType::NoSpace,
        };
        assert_eq!(changed, vec![seven]);
        let Some(MetaChange::Put(name)) = meta else {
            panic!("activation stores the alarm: {meta:?}");
        };
        // Activating again changes nothing; etcd answers with the alarm.
        assert_eq!(
            alarms.apply(&req(AlarmAction::Activate, 7, AlarmType::NoSpace)),
            (vec![seven], None)
        );
        alarms.apply(&req(AlarmAction::Activate, 3, AlarmType::Corrupt));
        assert_eq!(
            alarms.apply(&req(AlarmAction::Get, 0, AlarmType::None)).0,
            vec![
                seven,
                AlarmMember {
                    member: 3,
                    alarm: AlarmType::Corrupt
                }
            ]
        );
        assert_eq!(
            alarms
                .apply(&req(AlarmAction::Get, 0, AlarmType::NoSpace))
                .0,
            vec![seven]
        );
        // A restart reads the same set back from the metadata.
        let mut reloaded = Alarms::from_meta(&[(Bytes::from(name.clone()), Bytes::new())]);
        reloaded.apply(&req(AlarmAction::Activate, 3, AlarmType::Corrupt));
        assert_eq!(reloaded, alarms);

        let (changed, meta) = alarms.apply(&req(AlarmAction::Deactivate, 7, AlarmType::NoSpace));
        assert_eq!(changed, vec![seven]);
        assert_eq!(meta, Some(MetaChange::Delete(name)));
        assert!(!alarms.is_active(AlarmType::NoSpace, 7));
        // etcd stores a NONE alarm too: listed, refusing nothing.
        let none = AlarmMember {
            member: 9,
            alarm: AlarmType::None,
        };
        assert_eq!(
            alarms
                .apply(&req(AlarmAction::Activate, 9, AlarmType::None))
                .0,
            vec![none]
        );
        assert!(alarms.get(AlarmType::None).contains(&none));
        assert_eq!(alarms.refuses_lease_grant(), Some(Refusal::Corrupt));
        assert_eq!(seven.text(), "memberID:7 alarm:NOSPACE ");
    }

    #[test]
    fn nospace_refuses_what_adds_data_and_corrupt_refuses_every_write() {
        let mut alarms = Alarms::default();
        let put_req = mvcc::Request::Put(match put("k", "v") {
            mvcc::RequestOp::Put(p) => p,
            _ => unreachable!(),
        });
        let deleting_txn = mvcc::Request::Txn(txn(vec![delete("a")], vec![delete("b")]));
        let putting_on_failure = mvcc::Request::Txn(txn(vec![delete("a")], vec![put("b", "")]));
        let nested_put = mvcc::Request::Txn(txn(
            vec![mvcc::RequestOp::Txn(txn(vec![put("c", "")], Vec::new()))],
            Vec::new(),
        ));
        assert_eq!(alarms.refuses_kv(&put_req), None);
        assert_eq!(alarms.refuses_lease_grant(), None);

        alarms.apply(&req(AlarmAction::Activate, 1, AlarmType::NoSpace));
        assert_eq!(alarms.refuses_kv(&put_req), Some(Refusal::NoSpace));
        assert_eq!(
            alarms.refuses_kv(&putting_on_failure),
            Some(Refusal::NoSpace)
        );
        assert_eq!(alarms.refuses_kv(&nested_put), Some(Refusal::NoSpace));
        assert_eq!(alarms.refuses_kv(&deleting_txn), None);
        assert_eq!(alarms.refuses_lease_grant(), Some(Refusal::NoSpace));
        assert_eq!(alarms.refuses_lease_revoke(), None);

        alarms.apply(&req(AlarmAction::Activate, 2, AlarmType::Corrupt));
        assert_eq!(alarms.refuses_kv(&deleting_txn), Some(Refusal::Corrupt));
        assert_eq!(alarms.refuses_lease_revoke(), Some(Refusal::Corrupt));
    }

    #[test]
    fn costs_follow_etcds_estimates() {
        let t = txn(vec![put("ab", "cde")], vec![put("a", ""), put("b", "")]);
        // max(256 + 5, 2 * (256 + 1))
        assert_eq!(cost(&mvcc::Request::Txn(t)), 514);
        assert_eq!(
            cost(&mvcc::Request::Txn(txn(vec![delete("a")], Vec::new()))),
            0
        );
    }

    #[test]
    fn log_bodies_round_trip_and_junk_is_refused() {
        for r in [
            req(AlarmAction::Get, 0, AlarmType::None),
            req(AlarmAction::Activate, u64::MAX, AlarmType::NoSpace),
            req(AlarmAction::Deactivate, 42, AlarmType::Corrupt),
        ] {
            let mut body = Vec::new();
            encode(&r, &mut body);
            assert_eq!(decode(&body), Some(r));
        }
        assert_eq!(decode(&[1, 9, 0, 0, 0, 0, 0, 0, 0, 0]), None);
        assert_eq!(decode(&[1, 1, 0]), None);
    }
}
