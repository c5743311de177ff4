//! Linearizable reads through Raft's ReadIndex, batched into rounds: every
//! read queued since the last round shares the next one; a round's reads
//! go once the member applied the index the leader confirmed.
//!
//! Runtime-free: the caller passes the time (any `Copy` instant) and gets
//! back the waiters to answer, so the glommio Raft loop (`node`) and
//! the deterministic simulation (`sim.rs`) share this bookkeeping. It must
//! never answer a waiter itself, read a clock or do I/O.

use std::collections::BTreeMap;

use bytes::{Buf, BufMut};
use raft::storage::MemStorage;
use raft::RawNode;

/// What became of a ReadState handed back by raft-rs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundAnswer {
    /// Another member's round (the leader tracks every member's).
    NotOurs,
    /// Ours, but answered already (it was sent again) or given up on.
    Stale,
    /// Ours: its reads went out or wait for apply.
    Taken,
}

/// The ReadIndex rounds of one member.
#[derive(Debug)]
pub struct ReadRounds<W, T> {
    member: u64,
    queued: Vec<W>,
    next_round: u64,
    /// Rounds sent, by round number, with when last sent.
    in_flight: BTreeMap<u64, (T, Vec<W>)>,
    /// Reads whose index is known, waiting for apply to reach it.
    applying: Vec<(u64, W)>,
}

impl<W, T: Copy> ReadRounds<W, T> {
    pub fn new(member: u64) -> Self {
        ReadRounds {
            member,
            queued: Vec::new(),
            next_round: 0,
            in_flight: BTreeMap::new(),
            applying: Vec::new(),
        }
    }

    /// Queues a read for the next round.
    pub fn queue(&mut self, waiter: W) {
        self.queued.push(waiter);
    }

    pub fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    /// Starts one round for every read queued since the last.
    pub fn start(&mut self, raw: &mut RawNode<MemStorage>, now: T) {
        if self.queued.is_empty() {
            return;
        }
        self.next_round = self.next_round.wrapping_add(1);
        raw.read_index(self.context(self.next_round));
        let waiters = std::mem::take(&mut self.queued);
        self.in_flight.insert(self.next_round, (now, waiters));
    }

    /// A round can be lost (no leader yet, a message dropped, a leader
    /// change): asks again for each round `due` says waited long enough.
    pub fn retry(&mut self, raw: &mut RawNode<MemStorage>, now: T, due: impl Fn(T) -> bool) {
        let member = self.member;
        for (round, (sent, _)) in self.in_flight.iter_mut() {
            if due(*sent) {
                *sent = now;
                raw.read_index(round_context(member, *round));
            }
        }
    }

    /// A round came back at `index`: its reads go into `ready` if `applied`
    /// reached it, otherwise they wait for [`ReadRounds::release`].
    pub fn answered(
        &mut self,
        ctx: &[u8],
        index: u64,
        applied: u64,
        ready: &mut Vec<W>,
    ) -> RoundAnswer {
        let mut ctx = ctx;
        if ctx.len() != 16 || ctx.get_u64_le() != self.member {
            return RoundAnswer::NotOurs;
        }
        let Some((_, waiters)) = self.in_flight.remove(&ctx.get_u64_le()) else {
            return RoundAnswer::Stale;
        };
        for w in waiters {
            if index <= applied {
                ready.push(w);
            } else {
                self.applying.push((index, w));
            }
        }
        RoundAnswer::Taken
    }

    /// Moves the reads whose index `applied` reached into `ready`.
    pub fn release(&mut self, applied: u64, ready: &mut Vec<W>) {
        if self.applying.iter().all(|(index, _)| *index > applied) {
            return;
        }
        for (index, w) in std::mem::take(&mut self.applying) {
            if index <= applied {
                ready.push(w);
            } else {
                self.applying.push((index, w));
            }
        }
    }

    /// This member stopped leading: its rounds in flight will never come
    /// back. Returns how many rounds failed; their reads go into `failed`.
    pub fn fail_in_flight(&mut self, failed: &mut Vec<W>) -> usize {
        let rounds = self.in_flight.len();
        for (_, (_, waiters)) in std::mem::take(&mut self.in_flight) {
            failed.extend(waiters);
        }
        rounds
    }

    fn context(&self, round: u64) -> Vec<u8> {
        round_context(self.member, round)
    }
}

/// The leader tracks rounds by context across all members, so a context
/// names the member as well as the round.
fn round_context(member: u64, round: u64) -> Vec<u8> {
    let mut ctx = Vec::with_capacity(16);
    ctx.put_u64_le(member);
    ctx.put_u64_le(round);
    ctx
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::eraftpb::ConfState;

    fn solo_leader() -> RawNode<MemStorage> {
        let storage = MemStorage::new_with_conf_state(ConfState::from((vec![1], vec![])));
        let cfg = raft::Config {
            id: 1,
            ..Default::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut raw = RawNode::new(&cfg, storage, &logger).expect("raft node");
        raw.campaign().expect("campaign");
        raw
    }

    #[test]
    fn reads_queued_together_share_one_round_and_wait_for_apply() {
        let mut raw = solo_leader();
        let mut rounds: ReadRounds<&str, u32> = ReadRounds::new(1);
        rounds.queue("a");
        rounds.queue("b");
        rounds.start(&mut raw, 0);
        rounds.queue("c");
        assert!(rounds.has_queued());
        let mut ready = Vec::new();
        // Round 1 answered at index 5 while 3 is applied: both wait.
        let ctx = round_context(1, 1);
        assert_eq!(rounds.answered(&ctx, 5, 3, &mut ready), RoundAnswer::Taken);
        assert!(ready.is_empty());
        rounds.release(4, &mut ready);
        assert!(ready.is_empty());
        rounds.release(5, &mut ready);
        assert_eq!(ready, ["a", "b"]);
        // The same round again, and another member's: nothing happens.
        assert_eq!(rounds.answered(&ctx, 5, 5, &mut ready), RoundAnswer::Stale);
        assert_eq!(
            rounds.answered(&round_context(2, 1), 5, 5, &mut ready),
            RoundAnswer::NotOurs
        );
        assert_eq!(ready.len(), 2);
    }

    #[test]
    fn only_due_rounds_are_asked_again_and_a_lost_lead_fails_them_all() {
        let mut raw = solo_leader();
        let mut rounds: ReadRounds<u8, u32> = ReadRounds::new(1);
        rounds.queue(1);
        rounds.start(&mut raw, 10);
        rounds.queue(2);
        rounds.start(&mut raw, 20);
        rounds.retry(&mut raw, 30, |sent| sent <= 10);
        let sent: Vec<u32> = rounds.in_flight.values().map(|(t, _)| *t).collect();
        assert_eq!(sent, [30, 20]);
        let mut failed = Vec::new();
        assert_eq!(rounds.fail_in_flight(&mut failed), 2);
        assert_eq!(failed, [1, 2]);
        let mut ready = Vec::new();
        assert_eq!(
            rounds.answered(&round_context(1, 1), 1, 1, &mut ready),
            RoundAnswer::Stale
        );
    }
}
