//! One Raft `Ready`, handled in the order that keeps a member's promises:
//! what is sent before and after the local sync, what is applied when,
//! what goes into the WAL and which of it is synced.
//!
//! Runtime-free (sans-IO): every effect goes through a [`ReadyHost`]. The
//! glommio Raft loop (`node`) and the deterministic simulation
//! (`sim.rs`, fake network, disk and clock) both run this one function, so
//! the simulation exercises the production ordering, not a copy of it.
//!
//! It also holds the raft-rs configuration every member runs with, so the
//! simulation's members are configured as the real ones are.
//!
//! This module must never do I/O, read a clock or spawn tasks itself.

use raft::eraftpb::{Entry, Message, Snapshot};
use raft::storage::MemStorage;
use raft::RawNode;

use crate::error::ServerError;

/// raft-rs' configuration for member `id`: one tick per heartbeat,
/// `election_tick` ticks to an election, pre-vote and check-quorum (etcd's
/// defaults), 1 MiB appends, 256 in flight.
pub fn raft_config(id: u64, applied: u64, election_tick: usize) -> raft::Config {
    raft::Config {
        id,
        election_tick,
        heartbeat_tick: 1,
        applied,
        max_size_per_msg: 1 << 20,
        max_inflight_msgs: 256,
        check_quorum: true,
        pre_vote: true,
        ..Default::default()
    }
}

/// What handling a Ready needs from the member around it.
///
/// The futures are polled on the member's own thread (thread-per-core), so
/// they need not be `Send`; hence the allowed lint.
#[allow(async_fn_in_trait)]
pub trait ReadyHost {
    /// Hands messages to the transport (never blocks on the network).
    fn send(&mut self, msgs: Vec<Message>);
    /// Adopts a leader's snapshot: state machine, raft-rs storage, and a
    /// WAL marker written with this Ready's sync.
    async fn install_snapshot(
        &mut self,
        raw: &mut RawNode<MemStorage>,
        snap: Snapshot,
    ) -> Result<(), ServerError>;
    /// A ReadIndex round came back: its reads may go once `index` is applied.
    fn read_index_ready(&mut self, ctx: &[u8], index: u64, applied: u64);
    /// Applies committed entries to the state machine, in order, and
    /// answers the proposals among them that this member made.
    fn apply(
        &mut self,
        raw: &mut RawNode<MemStorage>,
        entries: Vec<Entry>,
    ) -> Result<(), ServerError>;
    /// Buffers an entry record for the next sync.
    fn log_entry(&mut self, index: u64, record: &[u8]);
    /// Buffers a HardState record for the next sync.
    fn log_state(&mut self, record: &[u8]);
    /// Writes and syncs everything buffered: the group commit.
    async fn sync_log(&mut self) -> Result<(), ServerError>;
    /// Releases linearizable reads waiting for `applied`.
    fn release_reads(&mut self, applied: u64);
}

/// Handles the Ready raft-rs has, if any.
///
/// Order (each step's reason beside it): messages that need no local
/// persistence go out first, so followers append while we sync; a snapshot
/// is installed before anything applies on top of it; committed entries
/// (raft-rs hands out only locally persisted ones) apply before the sync;
/// new entries and the HardState are synced in one group commit before the
/// messages that promise them (votes, append responses) go out; the commit
/// index advanced by `advance` is logged but synced with the next frame:
/// recovery tolerates a lagging commit, and a restarted member serves only
/// after its start-up publish applied, past anything it answered before.
pub async fn handle_ready<H: ReadyHost>(
    raw: &mut RawNode<MemStorage>,
    host: &mut H,
    buf: &mut Vec<u8>,
) -> Result<(), ServerError> {
    if !raw.has_ready() {
        return Ok(());
    }
    let mut ready = raw.ready();
    host.send(ready.take_messages());
    if !ready.snapshot().is_empty() {
        host.install_snapshot(raw, ready.snapshot().clone()).await?;
    }
    let applied = raw.raft.raft_log.applied;
    for rs in ready.take_read_states() {
        host.read_index_ready(&rs.request_ctx, rs.index, applied);
    }
    host.apply(raw, ready.take_committed_entries())?;
    step_down_if_removed(raw);
    if !ready.entries().is_empty() {
        for e in ready.entries() {
            crate::raftlog::encode_entry(e, buf);
            host.log_entry(e.index, buf);
        }
        raw.store().wl().append(ready.entries())?;
    }
    if let Some(hs) = ready.hs() {
        host.log_state(&crate::raftlog::encode_hard_state(hs));
        raw.store().wl().set_hardstate(hs.clone());
    }
    // The group commit: one frame, one fdatasync for the whole Ready.
    host.sync_log().await?;
    host.send(ready.take_persisted_messages());
    let mut light = raw.advance(ready);
    host.send(light.take_messages());
    if let Some(commit) = light.commit_index() {
        let hs = {
            let mut core = raw.store().wl();
            core.mut_hard_state().commit = commit;
            core.hard_state().clone()
        };
        host.log_state(&crate::raftlog::encode_hard_state(&hs));
    }
    host.apply(raw, light.take_committed_entries())?;
    step_down_if_removed(raw);
    raw.advance_apply();
    host.release_reads(raw.raft.raft_log.applied);
    Ok(())
}

/// The log end of this member when a leader's heartbeat says entries past
/// it are committed here: the member lost entries it acknowledged (its data
/// dir was wiped or rolled back, or its disk lied about a sync). raft-rs
/// would panic stepping it; the caller refuses to go on instead.
pub fn claims_entries_we_lack(raw: &RawNode<MemStorage>, m: &Message) -> Option<u64> {
    let last = raw.raft.raft_log.last_index();
    (m.get_msg_type() == raft::eraftpb::MessageType::MsgHeartbeat
        && m.term >= raw.raft.term
        && m.commit > last)
        .then_some(last)
}

/// A leader that applied its own removal is in no configuration: raft-rs
/// would panic looking up its own progress when it next persists entries
/// (found by the simulation, seed 1 with membership changes). It steps
/// down at once, as etcd's raft means to ("step down (for sanity)"); the
/// member then leaves (node), and the remaining voters elect a leader.
/// A removed member never campaigns: raft-rs only lets members of the
/// configuration do that. Same term, so the HardState `advance` checks
/// stays as it was; the messages it queued as leader are dropped, as raft-rs
/// refuses a follower that queued messages after a Ready (and followers
/// hear of the commit from the next leader).
fn step_down_if_removed(raw: &mut RawNode<MemStorage>) {
    if raw.raft.state == raft::StateRole::Leader && raw.raft.prs().get(raw.raft.id).is_none() {
        let term = raw.raft.term;
        raw.raft.become_follower(term, raft::INVALID_ID);
        raw.raft.msgs.clear();
    }
}
