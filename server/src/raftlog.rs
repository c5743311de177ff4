//! How Raft state is laid out in the WAL, and how a recovered WAL plus the
//! engine's durable state become raft-rs storage again.
//!
//! Runtime-free: pure encoding and reconstruction. The WAL itself only sees
//! opaque entry bytes, a state blob (HardState) and snapshot markers
//! (SnapshotMetadata); this module gives them meaning.
//!
//! Encodings (little-endian):
//! - entry: `term u64 | entry_type u8 | context_len u32 | context | data`
//! - state: `term u64 | vote u64 | commit u64`
//! - snapshot marker: `term u64 | n_voters u32 | voters u64* | n_learners u32 | learners u64*`

use bytes::{Buf, BufMut, Bytes};
use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Snapshot, SnapshotMetadata};
use raft::storage::MemStorage;

#[derive(Debug, thiserror::Error)]
#[error("malformed {what} in the WAL at index {index}")]
pub struct DecodeError {
    pub what: &'static str,
    pub index: u64,
}

pub fn encode_entry(e: &Entry, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(13 + e.context.len() + e.data.len());
    out.put_u64_le(e.term);
    out.put_u8(e.entry_type as u8);
    out.put_u32_le(e.context.len() as u32);
    out.extend_from_slice(&e.context);
    out.extend_from_slice(&e.data);
}

pub fn decode_entry(index: u64, mut b: Bytes) -> Result<Entry, DecodeError> {
    let err = DecodeError {
        what: "entry",
        index,
    };
    if b.remaining() < 13 {
        return Err(err);
    }
    let term = b.get_u64_le();
    let entry_type = match b.get_u8() {
        0 => EntryType::EntryNormal,
        1 => EntryType::EntryConfChange,
        2 => EntryType::EntryConfChangeV2,
        _ => return Err(err),
    };
    let context_len = b.get_u32_le() as usize;
    if context_len > b.remaining() {
        return Err(err);
    }
    let context = b.split_to(context_len);
    Ok(Entry {
        index,
        term,
        entry_type,
        context,
        data: b,
        ..Default::default()
    })
}

pub fn encode_hard_state(hs: &HardState) -> [u8; 24] {
    let mut out = [0u8; 24];
    let mut w = &mut out[..];
    w.put_u64_le(hs.term);
    w.put_u64_le(hs.vote);
    w.put_u64_le(hs.commit);
    out
}

pub fn decode_hard_state(mut b: &[u8]) -> Result<HardState, DecodeError> {
    if b.len() != 24 {
        return Err(DecodeError {
            what: "hard state",
            index: 0,
        });
    }
    let term = b.get_u64_le();
    let vote = b.get_u64_le();
    let commit = b.get_u64_le();
    Ok(HardState {
        term,
        vote,
        commit,
        ..Default::default()
    })
}

pub fn encode_snapshot_meta(term: u64, cs: &ConfState) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 8 * (cs.voters.len() + cs.learners.len()));
    out.put_u64_le(term);
    out.put_u32_le(cs.voters.len() as u32);
    cs.voters.iter().for_each(|v| out.put_u64_le(*v));
    out.put_u32_le(cs.learners.len() as u32);
    cs.learners.iter().for_each(|v| out.put_u64_le(*v));
    // A joint configuration (optional tail; absent in older markers).
    if !cs.voters_outgoing.is_empty() || !cs.learners_next.is_empty() {
        out.put_u32_le(cs.voters_outgoing.len() as u32);
        cs.voters_outgoing.iter().for_each(|v| out.put_u64_le(*v));
        out.put_u32_le(cs.learners_next.len() as u32);
        cs.learners_next.iter().for_each(|v| out.put_u64_le(*v));
        out.put_u8(u8::from(cs.auto_leave));
    }
    out
}

pub fn decode_snapshot_meta(index: u64, mut b: &[u8]) -> Result<(u64, ConfState), DecodeError> {
    let err = || DecodeError {
        what: "snapshot marker",
        index,
    };
    let read_ids = |b: &mut &[u8]| -> Result<Vec<u64>, DecodeError> {
        if b.remaining() < 4 {
            return Err(err());
        }
        let n = b.get_u32_le() as usize;
        if b.remaining() < n.saturating_mul(8) {
            return Err(err());
        }
        Ok((0..n).map(|_| b.get_u64_le()).collect())
    };
    if b.remaining() < 8 {
        return Err(err());
    }
    let term = b.get_u64_le();
    let voters = read_ids(&mut b)?;
    let learners = read_ids(&mut b)?;
    let mut cs = ConfState {
        voters,
        learners,
        ..Default::default()
    };
    if b.has_remaining() {
        cs.voters_outgoing = read_ids(&mut b)?;
        cs.learners_next = read_ids(&mut b)?;
        if b.remaining() != 1 {
            return Err(err());
        }
        cs.auto_leave = b.get_u8() != 0;
    }
    Ok((term, cs))
}

/// Why an engine and a recovered WAL cannot start together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineWalMismatch {
    /// The WAL was released past the engine's applied index (the engine
    /// is older than the WAL: restored from an old copy).
    WalReleasedPastEngine { marker: u64 },
    /// The engine is ahead of everything the WAL holds.
    WalMissing { wal_end: u64 },
}

/// Checks that the WAL can continue the engine's state: its newest
/// marker is at or before the engine's applied index, and it reaches
/// that index.
pub fn check_engine_against_wal(
    recovered: &engine::wal::Recovered,
    engine_applied: u64,
) -> Result<(), EngineWalMismatch> {
    let marker = recovered.snapshot.as_ref().map_or(0, |(i, _)| *i);
    if engine_applied < marker {
        return Err(EngineWalMismatch::WalReleasedPastEngine { marker });
    }
    let wal_end = recovered.last_index();
    if engine_applied > wal_end {
        return Err(EngineWalMismatch::WalMissing { wal_end });
    }
    Ok(())
}

/// A member that died between installing a leader's snapshot as its
/// engine and syncing that snapshot's WAL marker has an engine ahead of the
/// WAL (and possibly of the whole log). `node` keeps the marker's
/// contents beside the engine before installing it (`installed`: index and
/// encoded meta); when they name the engine's applied index, they stand in
/// for the lost marker (found by the simulation: without this such a
/// member refused to start). Returns whether they did.
pub fn adopt_installed_snapshot(
    recovered: &mut engine::wal::Recovered,
    engine_applied: u64,
    installed: Option<(u64, Bytes)>,
) -> bool {
    let marker = recovered.snapshot.as_ref().map_or(0, |(i, _)| *i);
    match installed {
        Some((index, meta)) if index == engine_applied && index > marker => recovered
            .add(engine::wal::Record::Snapshot { index, meta })
            .is_ok(),
        _ => false,
    }
}

/// The durable Raft state rebuilt at start-up.
pub struct RestoredLog {
    pub storage: MemStorage,
    /// The index the state machine has already applied (engine durable index).
    pub applied: u64,
    pub last_index: u64,
    /// Entries of a discarded branch cut after the snapshot.
    pub discarded: usize,
}

/// Rebuilds raft-rs storage from what the WAL recovered.
///
/// `engine_applied` is the applied index the engine recovered with (its
/// snapshot); entries at or below it are already in the state machine.
/// `initial_conf` is used when no snapshot marker carries a conf state yet.
pub fn restore(
    recovered: &engine::wal::Recovered,
    engine_applied: u64,
    initial_conf: &ConfState,
) -> Result<RestoredLog, DecodeError> {
    let storage = MemStorage::new();
    let mut conf = initial_conf.clone();
    let mut snap_index = 0;
    let mut snap_term = 0;
    if let Some((index, meta)) = &recovered.snapshot {
        let (term, cs) = decode_snapshot_meta(*index, meta)?;
        snap_index = *index;
        snap_term = term;
        conf = cs;
    }
    let mut entries = Vec::with_capacity(recovered.entries.len());
    for (index, data) in &recovered.entries {
        entries.push(decode_entry(*index, data.clone())?);
    }
    // The engine may have a newer snapshot than the WAL's marker (crash after
    // the snapshot file, before the marker): start the log there.
    if engine_applied > snap_index {
        if let Some(e) = entries.iter().find(|e| e.index == engine_applied) {
            snap_term = e.term;
            snap_index = engine_applied;
        }
    }
    let mut discarded = 0;
    let mut snapshot = Snapshot::default();
    let mut meta = SnapshotMetadata {
        index: snap_index,
        term: snap_term,
        ..Default::default()
    };
    meta.set_conf_state(conf);
    snapshot.set_metadata(meta);
    let mut hs = match &recovered.state {
        Some(state) => decode_hard_state(state)?,
        None => HardState::default(),
    };
    {
        let mut core = storage.wl();
        if snap_index > 0 {
            core.apply_snapshot(snapshot).map_err(|_| DecodeError {
                what: "snapshot marker",
                index: snap_index,
            })?;
        } else {
            core.set_conf_state(snapshot.get_metadata().get_conf_state().clone());
        }
        let mut live: Vec<Entry> = entries
            .into_iter()
            .filter(|e| e.index > snap_index)
            .collect();
        // Terms never go down along a log. Entries after the snapshot that
        // do are a branch raft-rs discarded when it installed a leader's
        // snapshot over a conflicting log (they were written before the
        // snapshot's marker, and nothing after it overwrote them before a
        // crash): kept, they would make this member's last term look
        // older than it is, and its votes more generous than Raft allows.
        let mut term = snap_term;
        let stale = live.iter().position(|e| {
            let down = e.term < term;
            term = term.max(e.term);
            down
        });
        if let Some(at) = stale {
            discarded = live.len() - at;
            live.truncate(at);
        }
        if let Some(first) = live.first() {
            if first.index != snap_index + 1 {
                return Err(DecodeError {
                    what: "entry (gap after snapshot)",
                    index: first.index,
                });
            }
        }
        core.append(&live).map_err(|_| DecodeError {
            what: "entry",
            index: snap_index,
        })?;
    }
    let last_index = raft::Storage::last_index(&storage).unwrap_or(snap_index);
    // Entries the engine already applied were committed; the persisted
    // commit may lag (it is written with the next group commit).
    hs.commit = hs
        .commit
        .max(engine_applied)
        .max(snap_index)
        .min(last_index);
    hs.term = hs.term.max(snap_term);
    storage.wl().set_hardstate(hs);
    Ok(RestoredLog {
        storage,
        applied: engine_applied.min(last_index),
        last_index,
        discarded,
    })
}

/// Where each recent term's entries begin in the applied log, so the term
/// of an applied index stays known after raft-rs' in-memory log dropped the
/// entry: a checkpoint that finishes while the log was trimmed behind it
/// needs that term for its WAL marker. Terms only grow along the log, so
/// this is a short ordered list (one item per leader change).
#[derive(Debug, Default)]
pub struct TermStarts {
    starts: std::collections::VecDeque<(u64, u64)>,
}

impl TermStarts {
    /// Records that the entry at `index` (applied in log order) has `term`.
    pub fn note(&mut self, index: u64, term: u64) {
        if self.starts.back().is_none_or(|&(_, last)| last != term) {
            self.starts.push_back((index, term));
        }
    }

    /// The term of the applied entry at `index`, if this list reaches back
    /// that far.
    pub fn term_at(&self, index: u64) -> Option<u64> {
        let (start, _) = *self.starts.front()?;
        if index < start {
            return None;
        }
        self.starts
            .iter()
            .rev()
            .find(|(start, _)| *start <= index)
            .map(|&(_, term)| term)
    }

    /// Drops what no index at or after `index` needs.
    pub fn forget_before(&mut self, index: u64) {
        while self.starts.len() >= 2 && self.starts[1].0 <= index {
            self.starts.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn entry_roundtrip() {
        let e = Entry {
            term: 7,
            entry_type: EntryType::EntryConfChange,
            context: Bytes::from_static(b"ctx"),
            data: Bytes::from_static(b"payload"),
            ..Default::default()
        };
        let mut buf = Vec::new();
        encode_entry(&e, &mut buf);
        let mut d = decode_entry(42, Bytes::from(buf)).unwrap();
        assert_eq!(d.index, 42);
        d.index = 0;
        assert_eq!(d, e);
        assert!(decode_entry(1, Bytes::from_static(b"short")).is_err());
    }

    #[test]
    fn snapshot_meta_roundtrip() {
        let cs = ConfState {
            voters: vec![1, 2, 3],
            learners: vec![9],
            ..Default::default()
        };
        let b = encode_snapshot_meta(5, &cs);
        assert_eq!(decode_snapshot_meta(10, &b).unwrap(), (5, cs));
        assert!(decode_snapshot_meta(10, &b[..b.len() - 1]).is_err());
        let joint = ConfState {
            voters: vec![1, 2, 4],
            voters_outgoing: vec![1, 2, 3],
            auto_leave: true,
            ..Default::default()
        };
        let b = encode_snapshot_meta(6, &joint);
        assert_eq!(decode_snapshot_meta(11, &b).unwrap(), (6, joint));
        assert!(decode_snapshot_meta(11, &b[..b.len() - 1]).is_err());
    }

    #[test]
    fn a_discarded_branch_after_an_installed_snapshot_does_not_come_back() {
        use engine::wal::{Record, Recovered};
        let conf = ConfState::from((vec![1, 2, 3], vec![]));
        let entry = |index: u64, term: u64| {
            let e = Entry {
                index,
                term,
                ..Default::default()
            };
            let mut buf = Vec::new();
            encode_entry(&e, &mut buf);
            Record::Entry {
                index,
                data: Bytes::from(buf),
            }
        };
        let marker = |index: u64, term: u64| Record::Snapshot {
            index,
            meta: Bytes::from(encode_snapshot_meta(term, &conf)),
        };
        // A partitioned old leader's log (term 2 up to 10); a leader of
        // term 4 installs a snapshot at 6: 7..10 are a discarded branch.
        let mut r = Recovered::default();
        for i in 1..=10 {
            r.add(entry(i, 2)).unwrap();
        }
        r.add(marker(6, 4)).unwrap();
        let restored = restore(&r, 6, &conf).unwrap();
        assert_eq!((restored.last_index, restored.discarded), (6, 4));
        // The member's own checkpoint at 6: the entries after it are live.
        let mut r = Recovered::default();
        for i in 1..=10 {
            r.add(entry(i, 4)).unwrap();
        }
        r.add(marker(6, 4)).unwrap();
        assert_eq!(restore(&r, 6, &conf).unwrap().last_index, 10);
        // New entries after an installed snapshot stay; a term that goes
        // down later cuts only from there.
        let mut r = Recovered::default();
        r.add(marker(6, 4)).unwrap();
        for (i, t) in [(7, 4), (8, 5), (9, 3)] {
            r.add(entry(i, t)).unwrap();
        }
        assert_eq!(restore(&r, 6, &conf).unwrap().last_index, 8);
    }

    #[test]
    fn a_start_refuses_an_engine_the_wal_cannot_continue() {
        use engine::wal::{Record, Recovered};
        let mut r = Recovered::default();
        for index in 1..=20 {
            let data = Bytes::from_static(b"e");
            r.add(Record::Entry { index, data }).unwrap();
        }
        let meta = Bytes::from(encode_snapshot_meta(1, &ConfState::default()));
        r.add(Record::Snapshot { index: 10, meta }).unwrap();
        for engine_applied in [10, 15, 20] {
            assert_eq!(check_engine_against_wal(&r, engine_applied), Ok(()));
        }
        assert_eq!(
            check_engine_against_wal(&r, 9),
            Err(EngineWalMismatch::WalReleasedPastEngine { marker: 10 })
        );
        assert_eq!(
            check_engine_against_wal(&r, 21),
            Err(EngineWalMismatch::WalMissing { wal_end: 20 })
        );
    }

    #[test]
    fn a_kept_marker_stands_in_only_for_the_engine_it_was_kept_for() {
        use engine::wal::{Record, Recovered};
        let meta = Bytes::from(encode_snapshot_meta(
            3,
            &ConfState::from((vec![1, 2, 3], vec![])),
        ));
        let log = |last: u64| {
            let mut r = Recovered::default();
            for i in 1..=last {
                let data = Bytes::from_static(b"e");
                r.add(Record::Entry { index: i, data }).unwrap();
            }
            r
        };
        // The engine ahead of the whole log: the log restarts after it.
        let mut r = log(40);
        assert!(adopt_installed_snapshot(
            &mut r,
            100,
            Some((100, meta.clone()))
        ));
        assert_eq!(r.snapshot.as_ref().map(|(i, _)| *i), Some(100));
        assert!(r.entries.is_empty());
        assert_eq!(r.last_index(), 100);
        // Within a longer (stale) log: entries it covers go, later ones stay.
        let mut r = log(120);
        assert!(adopt_installed_snapshot(
            &mut r,
            100,
            Some((100, meta.clone()))
        ));
        assert_eq!(r.entries.first().map(|(i, _)| *i), Some(101));
        // Kept for another engine state, or older than the WAL's marker: not used.
        let mut r = log(40);
        assert!(!adopt_installed_snapshot(
            &mut r,
            90,
            Some((100, meta.clone()))
        ));
        assert!(!adopt_installed_snapshot(&mut r, 90, None));
        r.add(Record::Snapshot {
            index: 100,
            meta: meta.clone(),
        })
        .unwrap();
        assert!(!adopt_installed_snapshot(&mut r, 100, Some((100, meta))));
        assert_eq!(r.snapshot.as_ref().map(|(i, _)| *i), Some(100));
    }

    #[test]
    fn term_starts_answer_for_every_index_they_cover() {
        let mut terms = TermStarts::default();
        assert_eq!(terms.term_at(1), None);
        for (index, term) in [(5, 2), (6, 2), (7, 2), (8, 3), (9, 5), (10, 5)] {
            terms.note(index, term);
        }
        assert_eq!(terms.term_at(4), None, "before the first noted entry");
        assert_eq!(terms.term_at(5), Some(2));
        assert_eq!(terms.term_at(7), Some(2));
        assert_eq!(terms.term_at(8), Some(3));
        assert_eq!(terms.term_at(9), Some(5));
        assert_eq!(terms.term_at(10), Some(5));
        terms.forget_before(8);
        assert_eq!(terms.term_at(7), None, "forgotten");
        assert_eq!(terms.term_at(8), Some(3));
        assert_eq!(terms.term_at(10), Some(5));
        terms.forget_before(100);
        assert_eq!(terms.term_at(100), Some(5), "the last start always stays");
        assert_eq!(terms.term_at(8), None);
    }
}
