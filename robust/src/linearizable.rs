//! Linearizability of one key's history as a register with compare-and-set
//! (Wing & Gong's search with Lowe's memoisation, as Porcupine does it).
//!
//! Operations are calls and returns on one time line; the search walks it,
//! trying to place each pending call at the current point, and backtracks
//! when a return comes whose call it could not place. A (linearized set,
//! register state) pair already explored is never explored again; the set
//! is remembered by a 128-bit Zobrist fingerprint, so the memo costs a few
//! words per entry however long the history.
//!
//! An operation whose outcome is unknown returns "never": it may take effect
//! at any point after its call, or not at all. The search succeeds when
//! every operation with a real return is placed.
//!
//! This module knows only registers: the caller turns etcd operations into
//! [`Step`]s (see `check`).

use std::collections::HashSet;

use crate::history::{LeaseId, Nanos, OpId, ValueId};

/// What the register holds: a value and the lease it was put with.
pub type State = Option<(ValueId, LeaseId)>;

/// One operation on the register, with what the client saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Write {
        value: ValueId,
        lease: LeaseId,
    },
    /// A linearizable read that saw `value` (None: absent).
    Read {
        value: Option<ValueId>,
    },
    /// A compare-and-set that succeeded.
    CasSucceeded {
        expect: Option<ValueId>,
        value: ValueId,
        lease: LeaseId,
    },
    /// A compare-and-set whose compare failed, reading `current`.
    CasFailed {
        expect: Option<ValueId>,
        current: Option<ValueId>,
    },
    /// A delete; `deleted` None when its answer is unknown.
    Delete {
        deleted: Option<bool>,
    },
    /// A lease revoked: the key goes if it was put with that lease.
    Revoke {
        lease: LeaseId,
    },
}

impl Step {
    /// The state after this step from `state`, or None if the step could
    /// not have seen what it saw there.
    fn apply(&self, state: State) -> Option<State> {
        let held = state.map(|(v, _)| v);
        match *self {
            Step::Write { value, lease } => Some(Some((value, lease))),
            Step::Read { value } => (held == value).then_some(state),
            Step::CasSucceeded {
                expect,
                value,
                lease,
            } => (held == expect).then_some(Some((value, lease))),
            Step::CasFailed { expect, current } => {
                (held != expect && held == current).then_some(state)
            }
            Step::Delete { deleted } => match deleted {
                Some(d) if d != state.is_some() => None,
                _ => Some(None),
            },
            Step::Revoke { lease } => Some(match state {
                Some((_, l)) if l == lease => None,
                other => other,
            }),
        }
    }
}

#[derive(Clone, Debug)]
pub struct KeyOp {
    pub id: OpId,
    pub invoke: Nanos,
    /// None: unknown outcome, it may take effect any time after `invoke`.
    pub ret: Option<Nanos>,
    pub step: Step,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order exists. Evidence from the longest prefix the search placed:
    /// how many operations it placed, the state then, and the operation
    /// whose return came before it could be placed.
    Illegal {
        placed: usize,
        state: State,
        stuck: OpId,
    },
    /// The search spent its budget of steps.
    Inconclusive {
        steps: u64,
    },
}

const NIL: usize = usize::MAX;

/// Checks one key's operations, starting from `initial`.
pub fn check(ops: &[KeyOp], initial: State, budget_steps: u64) -> Verdict {
    // Entries: 2i is op i's call, 2i+1 its return; `order` is time order
    // (calls before returns at equal times: equal times overlap).
    let n = ops.len();
    let mut order: Vec<usize> = (0..2 * n).collect();
    let time = |e: usize| -> (Nanos, u8) {
        let op = &ops[e / 2];
        if e.is_multiple_of(2) {
            (op.invoke, 0)
        } else {
            (op.ret.unwrap_or(Nanos::MAX), 1)
        }
    };
    order.sort_by_key(|&e| time(e));
    // A doubly linked list over entries in time order; `head` is a sentinel.
    let head = 2 * n;
    let mut next = vec![NIL; 2 * n + 1];
    let mut prev = vec![NIL; 2 * n + 1];
    let mut last = head;
    for &e in &order {
        next[last] = e;
        prev[e] = last;
        last = e;
    }
    let lift = |next: &mut Vec<usize>, prev: &mut Vec<usize>, call: usize| {
        for e in [call, call + 1] {
            next[prev[e]] = next[e];
            if next[e] != NIL {
                prev[next[e]] = prev[e];
            }
        }
    };
    let unlift = |next: &mut Vec<usize>, prev: &mut Vec<usize>, call: usize| {
        for e in [call + 1, call] {
            next[prev[e]] = e;
            if next[e] != NIL {
                prev[next[e]] = e;
            }
        }
    };
    let fingerprints: Vec<u128> = (0..n as u64).map(zobrist).collect();

    let mut state = initial;
    let mut placed_set: u128 = 0;
    let mut placed = 0usize;
    let mut memo: HashSet<(u128, State)> = HashSet::new();
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut best = (0usize, initial, NIL);
    let mut steps = 0u64;
    let mut entry = next[head];
    while entry != NIL {
        steps += 1;
        if steps > budget_steps {
            return Verdict::Inconclusive { steps };
        }
        let op = entry / 2;
        if entry.is_multiple_of(2) {
            if let Some(after) = ops[op].step.apply(state) {
                let set = placed_set ^ fingerprints[op];
                if memo.insert((set, after)) {
                    stack.push((entry, state));
                    state = after;
                    placed_set = set;
                    placed += 1;
                    lift(&mut next, &mut prev, entry);
                    entry = next[head];
                    continue;
                }
            }
            entry = next[entry];
            continue;
        }
        if ops[op].ret.is_none() {
            // Only unknown outcomes are left: each may never have happened.
            return Verdict::Linearizable;
        }
        if placed >= best.0 {
            best = (placed, state, op);
        }
        let Some((call, before)) = stack.pop() else {
            break;
        };
        state = before;
        placed_set ^= fingerprints[call / 2];
        placed -= 1;
        unlift(&mut next, &mut prev, call);
        entry = next[call];
    }
    if next[head] == NIL {
        return Verdict::Linearizable;
    }
    Verdict::Illegal {
        placed: best.0,
        state: best.1,
        stuck: ops.get(best.2).map_or(0, |o| o.id),
    }
}

/// A pseudo-random 128-bit fingerprint of `i` (two rounds of splitmix64).
fn zobrist(i: u64) -> u128 {
    let a = splitmix(i.wrapping_mul(2).wrapping_add(1));
    let b = splitmix(a ^ 0x9E37_79B9_7F4A_7C15);
    ((a as u128) << 64) | b as u128
}

pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(id: OpId, invoke: Nanos, ret: Option<Nanos>, step: Step) -> KeyOp {
        KeyOp {
            id,
            invoke,
            ret,
            step,
        }
    }
    fn write(value: ValueId) -> Step {
        Step::Write { value, lease: 0 }
    }
    fn read(value: Option<ValueId>) -> Step {
        Step::Read { value }
    }

    #[test]
    fn sequential_writes_and_reads_are_linearizable() {
        let ops = [
            op(0, 0, Some(10), write(1)),
            op(1, 20, Some(30), read(Some(1))),
            op(2, 40, Some(50), write(2)),
            op(3, 60, Some(70), read(Some(2))),
        ];
        assert_eq!(check(&ops, None, 1000), Verdict::Linearizable);
    }

    #[test]
    fn a_stale_read_after_a_completed_write_is_illegal() {
        let ops = [
            op(0, 0, Some(10), write(1)),
            op(1, 20, Some(30), write(2)),
            op(2, 40, Some(50), read(Some(1))),
        ];
        match check(&ops, None, 1000) {
            Verdict::Illegal { stuck, .. } => assert_eq!(stuck, 2),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn concurrent_operations_may_take_either_order() {
        // The read overlaps the second write: it may see either value.
        for seen in [1, 2] {
            let ops = [
                op(0, 0, Some(10), write(1)),
                op(1, 20, Some(40), write(2)),
                op(2, 30, Some(50), read(Some(seen))),
            ];
            assert_eq!(check(&ops, None, 1000), Verdict::Linearizable, "{seen}");
        }
    }

    #[test]
    fn an_unknown_write_may_happen_late_or_never() {
        let late = [
            op(0, 0, None, write(1)),
            op(1, 20, Some(30), read(None)),
            op(2, 40, Some(50), read(Some(1))),
        ];
        assert_eq!(check(&late, None, 1000), Verdict::Linearizable);
        let never = [op(0, 0, None, write(1)), op(1, 20, Some(30), read(None))];
        assert_eq!(check(&never, None, 1000), Verdict::Linearizable);
        // But it cannot be seen, undone, and seen again.
        let flip = [
            op(0, 0, None, write(1)),
            op(1, 20, Some(30), read(Some(1))),
            op(2, 40, Some(50), read(None)),
        ];
        assert!(matches!(
            check(&flip, None, 1000),
            Verdict::Illegal { stuck: 2, .. }
        ));
    }

    #[test]
    fn compare_and_set_and_delete_follow_the_register() {
        let ops = [
            op(0, 0, Some(10), write(1)),
            op(
                1,
                20,
                Some(30),
                Step::CasSucceeded {
                    expect: Some(1),
                    value: 2,
                    lease: 0,
                },
            ),
            op(
                2,
                40,
                Some(50),
                Step::CasFailed {
                    expect: Some(1),
                    current: Some(2),
                },
            ),
            op(
                3,
                60,
                Some(70),
                Step::Delete {
                    deleted: Some(true),
                },
            ),
            op(
                4,
                80,
                Some(90),
                Step::Delete {
                    deleted: Some(false),
                },
            ),
        ];
        assert_eq!(check(&ops, None, 1000), Verdict::Linearizable);
        // Two compare-and-sets from the same value cannot both succeed.
        let twice = [
            op(0, 0, Some(10), write(1)),
            op(
                1,
                20,
                Some(40),
                Step::CasSucceeded {
                    expect: Some(1),
                    value: 2,
                    lease: 0,
                },
            ),
            op(
                2,
                20,
                Some(40),
                Step::CasSucceeded {
                    expect: Some(1),
                    value: 3,
                    lease: 0,
                },
            ),
        ];
        assert!(matches!(check(&twice, None, 1000), Verdict::Illegal { .. }));
    }

    #[test]
    fn a_revoke_removes_only_keys_put_with_its_lease() {
        let ops = [
            op(0, 0, Some(10), Step::Write { value: 1, lease: 7 }),
            op(1, 20, Some(30), Step::Revoke { lease: 8 }),
            op(2, 40, Some(50), read(Some(1))),
            op(3, 60, Some(70), Step::Revoke { lease: 7 }),
            op(4, 80, Some(90), read(Some(1))),
        ];
        assert!(matches!(
            check(&ops, None, 1000),
            Verdict::Illegal { stuck: 4, .. }
        ));
    }

    #[test]
    fn the_budget_makes_a_hard_search_inconclusive() {
        // Many concurrent writes and a read nobody wrote: every order is
        // tried before the search can say no.
        let mut ops: Vec<KeyOp> = (0..14)
            .map(|i| op(i, 0, Some(100), write(i as u64)))
            .collect();
        ops.push(op(14, 200, Some(300), read(Some(99))));
        assert!(matches!(
            check(&ops, None, 50),
            Verdict::Inconclusive { .. }
        ));
        assert!(matches!(
            check(&ops, None, 10_000_000),
            Verdict::Illegal { .. }
        ));
    }
}
