//! The checks a recorded [`History`] must pass, each reporting concrete
//! evidence (operation ids, times, revisions, values) when it fails.
//!
//! The watchers' streams, merged, are the history of every revision (the
//! run keeps no compaction, and every watcher starts at revision 1); the
//! other checks stand on it:
//!
//! - watch: per watcher revisions increase across responses, no event twice,
//!   no revision skipped, every watcher agrees with every other, prev_kv is
//!   the key's previous version;
//! - the log: every acknowledged write is in it at the revision its response
//!   named, nothing refused is, every read saw the key as the log has it at
//!   the read's revision, a revoked lease's keys are gone at the revoke's
//!   revision and never come back with it;
//! - real time: a linearizable operation never answers below a revision
//!   already answered before it started, nor above any write started before
//!   it returned; one client's revisions never go back; one member's
//!   serializable reads never go back (restarts included);
//! - linearizability per key, as a register with compare-and-set
//!   ([`crate::linearizable`]), with unanswered writes placed by the log;
//! - the end: every member at the same revision with the log's state and
//!   the same HashKV.

use std::collections::{BTreeMap, HashMap};

use crate::history::{
    Event, EventKind, History, Kv, LeaseId, Nanos, Op, OpId, Outcome, Request, Response, ValueId,
};
use crate::linearizable::{self, KeyOp, Step, Verdict};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Anomaly {
    pub check: &'static str,
    pub detail: String,
}

#[derive(Debug, Default)]
pub struct Report {
    pub anomalies: Vec<Anomaly>,
    /// Keys whose linearizability search ran out of budget.
    pub inconclusive: Vec<String>,
    pub keys_checked: usize,
    /// The last revision in the merged watch log.
    pub last_revision: i64,
    /// Unknown-outcome writes the log showed to have taken effect / not.
    pub unknown_writes_applied: usize,
    pub unknown_writes_dropped: usize,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.anomalies.is_empty()
    }
}

pub struct Options {
    /// Steps the linearizability search may take per key.
    pub budget_steps: u64,
    /// Evidence lines kept per check (the rest are counted).
    pub max_per_check: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            budget_steps: 5_000_000,
            max_per_check: 20,
        }
    }
}

/// Runs every check on `history`.
pub fn check(history: &History, options: &Options) -> Report {
    let mut report = Report::default();
    let mut out = Anomalies::new(options.max_per_check);
    let log = Log::build(history, &mut out);
    report.last_revision = log.last;
    check_ops_against_log(history, &log, &mut out);
    let effects = Effects::resolve(history, &log, &mut out);
    report.unknown_writes_applied = effects.applied_unknown;
    report.unknown_writes_dropped = effects.dropped_unknown;
    check_real_time(history, &effects, &mut out);
    check_monotonic(history, &mut out);
    check_finals(history, &log, &mut out);
    let (keys, inconclusive) = check_linearizable(history, &effects, options, &mut out);
    report.keys_checked = keys;
    report.inconclusive = inconclusive;
    report.anomalies = out.finish();
    report
}

/// Collects anomalies, keeping the first few of each check in full.
struct Anomalies {
    list: Vec<Anomaly>,
    per_check: HashMap<&'static str, usize>,
    max_per_check: usize,
}

impl Anomalies {
    fn new(max_per_check: usize) -> Anomalies {
        Anomalies {
            list: Vec::new(),
            per_check: HashMap::new(),
            max_per_check,
        }
    }

    fn push(&mut self, check: &'static str, detail: String) {
        let seen = self.per_check.entry(check).or_default();
        *seen += 1;
        if *seen <= self.max_per_check {
            self.list.push(Anomaly { check, detail });
        }
    }

    fn finish(mut self) -> Vec<Anomaly> {
        for (check, n) in &self.per_check {
            if *n > self.max_per_check {
                self.list.push(Anomaly {
                    check,
                    detail: format!("... and {} more", n - self.max_per_check),
                });
            }
        }
        self.list
    }
}

/// The merged watch log: every revision's events and each key's versions.
struct Log {
    by_revision: BTreeMap<i64, Vec<Event>>,
    /// Per key: (revision, the key's version from then on).
    versions: HashMap<String, Vec<(i64, Option<Kv>)>>,
    /// Where each written value went in: revision and key.
    written: HashMap<ValueId, (i64, String)>,
    last: i64,
}

impl Log {
    fn build(h: &History, out: &mut Anomalies) -> Log {
        let mut by_revision: BTreeMap<i64, Vec<Event>> = BTreeMap::new();
        let mut source: BTreeMap<i64, usize> = BTreeMap::new();
        let mut per_watcher: Vec<BTreeMap<i64, Vec<Event>>> = Vec::new();
        for (w, watch) in h.watches.iter().enumerate() {
            let mut mine: BTreeMap<i64, Vec<Event>> = BTreeMap::new();
            let mut last: Option<(u64, i64)> = None;
            for (batch, e) in &watch.events {
                if let Some((last_batch, last_rev)) = last {
                    let back = if *batch == last_batch {
                        e.revision < last_rev
                    } else {
                        e.revision <= last_rev
                    };
                    if back {
                        out.push(
                            "watch-order",
                            format!(
                                "watcher {w} on member {}: revision {} delivered after {last_rev}",
                                watch.member, e.revision
                            ),
                        );
                    }
                }
                last = Some((*batch, e.revision));
                let at = mine.entry(e.revision).or_default();
                if at.iter().any(|x| x.key == e.key) {
                    out.push(
                        "watch-duplicate",
                        format!(
                            "watcher {w} on member {}: key {} at revision {} delivered twice",
                            watch.member, e.key, e.revision
                        ),
                    );
                    continue;
                }
                at.push(e.clone());
            }
            for (rev, events) in &mut mine {
                events.sort_by(|a, b| a.key.cmp(&b.key));
                match by_revision.get(rev) {
                    None => {
                        by_revision.insert(*rev, events.clone());
                        source.insert(*rev, w);
                    }
                    Some(theirs) if theirs != events => out.push(
                        "watch-disagree",
                        format!(
                            "revision {rev}: watcher {w} (member {}) saw {events:?}, watcher {} saw {theirs:?}",
                            watch.member, source[rev]
                        ),
                    ),
                    Some(_) => {}
                }
            }
            per_watcher.push(mine);
        }
        let last = by_revision.keys().next_back().copied().unwrap_or(1);
        for (w, mine) in per_watcher.iter().enumerate() {
            let upto = h.watches[w].last_revision();
            let missed: Vec<i64> = by_revision
                .range(..=upto)
                .map(|(r, _)| *r)
                .filter(|r| !mine.contains_key(r))
                .collect();
            if let Some(first) = missed.first() {
                out.push(
                    "watch-gap",
                    format!(
                        "watcher {w} on member {} skipped {} revision(s) it should have delivered (it reached {upto}), first {first}",
                        h.watches[w].member,
                        missed.len()
                    ),
                );
            }
        }
        let mut expected = 2;
        for rev in by_revision.keys() {
            if *rev != expected {
                out.push(
                    "watch-gap",
                    format!(
                        "no watcher delivered revision(s) {expected}..{} (a revision with no event)",
                        rev - 1
                    ),
                );
            }
            expected = rev + 1;
        }

        let mut current: HashMap<String, Kv> = HashMap::new();
        let mut versions: HashMap<String, Vec<(i64, Option<Kv>)>> = HashMap::new();
        let mut written = HashMap::new();
        for (rev, events) in &by_revision {
            for e in events {
                let before = current.get(&e.key).copied();
                if e.prev != before {
                    out.push(
                        "watch-prev-kv",
                        format!(
                            "revision {rev} key {}: prev_kv {:?}, but the key's previous version is {before:?}",
                            e.key, e.prev
                        ),
                    );
                }
                let after = match e.kind {
                    EventKind::Put => {
                        let Some(kv) = e.kv else {
                            out.push("watch-event", format!("revision {rev}: a put without kv"));
                            continue;
                        };
                        if kv.mod_revision != *rev {
                            out.push(
                                "watch-event",
                                format!(
                                    "revision {rev} key {}: the put's mod_revision is {}",
                                    e.key, kv.mod_revision
                                ),
                            );
                        }
                        if let Some((r, k)) = written.insert(kv.value, (*rev, e.key.clone())) {
                            out.push(
                                "write-twice",
                                format!(
                                    "value v{} written at revision {r} (key {k}) and again at {rev} (key {})",
                                    kv.value, e.key
                                ),
                            );
                        }
                        current.insert(e.key.clone(), kv);
                        Some(kv)
                    }
                    EventKind::Delete => {
                        if before.is_none() {
                            out.push(
                                "watch-event",
                                format!("revision {rev}: delete of absent key {}", e.key),
                            );
                        }
                        current.remove(&e.key);
                        None
                    }
                };
                versions
                    .entry(e.key.clone())
                    .or_default()
                    .push((*rev, after));
            }
        }
        Log {
            by_revision,
            versions,
            written,
            last,
        }
    }

    /// The key's version at `revision`.
    fn at(&self, key: &str, revision: i64) -> Option<Kv> {
        let versions = self.versions.get(key)?;
        let i = versions.partition_point(|(r, _)| *r <= revision);
        if i == 0 {
            None
        } else {
            versions[i - 1].1
        }
    }

    fn events_at(&self, revision: i64) -> &[Event] {
        self.by_revision
            .get(&revision)
            .map_or(&[][..], |v| v.as_slice())
    }
}

/// Acknowledged operations against the log; refused writes absent from it.
fn check_ops_against_log(h: &History, log: &Log, out: &mut Anomalies) {
    for (id, op) in h.ops.iter().enumerate() {
        if let Some(value) = op.request.written_value() {
            let applied = log.written.get(&value);
            match (&op.outcome, applied) {
                (Outcome::Failed(_), Some((r, _))) => out.push(
                    "refused-write-applied",
                    format!("{}: in the log at revision {r}", h.describe(id)),
                ),
                (Outcome::Unknown(_), Some((_, k))) if Some(k.as_str()) != op.request.key() => out
                    .push(
                        "write-wrong-key",
                        format!("{}: its value is in the log under {k}", h.describe(id)),
                    ),
                _ => {}
            }
        }
        let Some(resp) = op.ok() else { continue };
        let rev = resp.revision();
        if rev > log.last && !matches!(op.request, Request::LeaseGrant { .. }) {
            out.push(
                "revision-beyond-log",
                format!(
                    "{}: answered revision {rev}, the watchers' log ends at {}",
                    h.describe(id),
                    log.last
                ),
            );
            continue;
        }
        let expect_put =
            |value: ValueId, key: &str, out: &mut Anomalies| match log.written.get(&value) {
                Some((r, k)) if *r == rev && k == key => {}
                Some((r, k)) => out.push(
                    "ack-write-mismatch",
                    format!("{}: the log has it at revision {r} key {k}", h.describe(id)),
                ),
                None => out.push(
                    "ack-write-lost",
                    format!(
                        "{}: acknowledged, but no watcher ever delivered it",
                        h.describe(id)
                    ),
                ),
            };
        match (&op.request, resp) {
            (Request::Put { key, value, .. }, Response::Put { .. }) => expect_put(*value, key, out),
            (
                Request::Cas {
                    key, value, expect, ..
                },
                Response::Cas {
                    succeeded, current, ..
                },
            ) => {
                if *succeeded {
                    expect_put(*value, key, out);
                } else {
                    let at = log.at(key, rev);
                    if *current != at || current.map(|kv| kv.value) == *expect {
                        out.push(
                            "stale-read",
                            format!(
                                "{}: the compare failed reading {current:?}; the log has {at:?} at revision {rev}",
                                h.describe(id)
                            ),
                        );
                    }
                }
            }
            (Request::Get { key, .. }, Response::Get { kv, .. }) => {
                let at = log.at(key, rev);
                if *kv != at {
                    out.push(
                        "stale-read",
                        format!("{}: the log has {at:?} at revision {rev}", h.describe(id)),
                    );
                }
            }
            (Request::Delete { key }, Response::Delete { deleted, .. }) => {
                let deleted_here = log
                    .events_at(rev)
                    .iter()
                    .any(|e| e.key == *key && e.kind == EventKind::Delete);
                let fine = match deleted {
                    0 => log.at(key, rev).is_none(),
                    _ => deleted_here,
                };
                if !fine {
                    out.push(
                        "ack-delete-mismatch",
                        format!(
                            "{}: the log at revision {rev} has {:?}",
                            h.describe(id),
                            log.events_at(rev)
                        ),
                    );
                }
            }
            (Request::LeaseRevoke { lease }, Response::LeaseRevoke { .. }) => {
                for (key, versions) in &log.versions {
                    if log.at(key, rev).is_some_and(|kv| kv.lease == *lease) {
                        out.push(
                            "lease-outlived",
                            format!(
                                "{}: key {key} still holds lease {lease:x} at revision {rev}",
                                h.describe(id)
                            ),
                        );
                    }
                    let after = versions.partition_point(|(r, _)| *r <= rev);
                    if let Some((r, _)) = versions[after..]
                        .iter()
                        .find(|(_, kv)| kv.is_some_and(|kv| kv.lease == *lease))
                    {
                        out.push(
                            "lease-outlived",
                            format!(
                                "{}: key {key} put with the revoked lease {lease:x} at revision {r}",
                                h.describe(id)
                            ),
                        );
                    }
                }
            }
            (Request::LeaseGrant { .. }, Response::LeaseGrant { .. }) => {}
            (req, resp) => out.push(
                "recorder",
                format!("op #{id}: response {resp:?} to request {req:?}"),
            ),
        }
    }
}

/// When each operation took effect, as far as the history says: the
/// response's revision, or for an unanswered write the revision the log
/// shows it at; unanswered writes the log does not have never happened.
struct Effects {
    /// Per op: Some(revision) for an answered linearizable operation or an
    /// unanswered write the log has; None otherwise.
    revision: Vec<Option<i64>>,
    /// Per op: the latest time it can have taken effect (its return, or for
    /// an unanswered write in the log the first return of an operation
    /// that answered at or after its revision).
    deadline: Vec<Option<Nanos>>,
    /// Per op: it wrote (a put, a successful compare-and-set, a delete that
    /// deleted, a revoke that deleted keys).
    wrote: Vec<bool>,
    /// Per op: an unanswered delete or revoke that may have made a revision
    /// of the log (several candidates for it).
    maybe: Vec<bool>,
    /// Every revision of the log with the earliest invoke of an operation
    /// that can have made it, by invoke.
    made: Vec<(Nanos, i64)>,
    applied_unknown: usize,
    dropped_unknown: usize,
}

fn is_linearizable(op: &Op) -> bool {
    !matches!(
        op.request,
        Request::Get {
            serializable: true,
            ..
        }
    )
}

impl Effects {
    fn resolve(h: &History, log: &Log, out: &mut Anomalies) -> Effects {
        let n = h.ops.len();
        let mut revision = vec![None; n];
        let mut deadline = vec![None; n];
        let mut wrote = vec![false; n];
        let mut maybe = vec![false; n];
        let (mut applied_unknown, mut dropped_unknown) = (0, 0);
        for (id, op) in h.ops.iter().enumerate() {
            match &op.outcome {
                Outcome::Ok(resp) if is_linearizable(op) => {
                    revision[id] = Some(resp.revision());
                    deadline[id] = Some(op.ret);
                    wrote[id] = match resp {
                        Response::Put { .. } => true,
                        Response::Cas { succeeded, .. } => *succeeded,
                        Response::Delete { deleted, .. } => *deleted > 0,
                        // A revoke writes when it deleted keys: said below,
                        // where the log's revisions find their operations.
                        _ => false,
                    };
                }
                Outcome::Unknown(_) => {
                    if let Some(value) = op.request.written_value() {
                        if let Some((r, _)) = log.written.get(&value) {
                            revision[id] = Some(*r);
                            wrote[id] = true;
                            applied_unknown += 1;
                        } else {
                            dropped_unknown += 1;
                        }
                    }
                }
                _ => {}
            }
        }

        // Which operation made each revision of the log: a put by its value,
        // a delete by an answered delete or revoke at that revision, else by
        // the unanswered deletes of that key and revokes of that lease.
        let mut by_value: HashMap<ValueId, OpId> = HashMap::new();
        let mut answered_delete: HashMap<(i64, &str), OpId> = HashMap::new();
        let mut answered_revoke: HashMap<(i64, LeaseId), OpId> = HashMap::new();
        let mut unknown_deletes: HashMap<&str, Vec<OpId>> = HashMap::new();
        let mut unknown_revokes: HashMap<LeaseId, Vec<OpId>> = HashMap::new();
        for (id, op) in h.ops.iter().enumerate() {
            if let Some(v) = op.request.written_value() {
                by_value.insert(v, id);
            }
            match (&op.request, &op.outcome) {
                (Request::Delete { key }, Outcome::Ok(Response::Delete { revision, deleted }))
                    if *deleted > 0 =>
                {
                    answered_delete.insert((*revision, key.as_str()), id);
                }
                (Request::Delete { key }, Outcome::Unknown(_)) => {
                    unknown_deletes.entry(key.as_str()).or_default().push(id)
                }
                (Request::LeaseRevoke { lease }, Outcome::Ok(resp)) => {
                    answered_revoke.insert((resp.revision(), *lease), id);
                }
                (Request::LeaseRevoke { lease }, Outcome::Unknown(_)) => {
                    unknown_revokes.entry(*lease).or_default().push(id)
                }
                _ => {}
            }
        }
        let mut made: Vec<(Nanos, i64)> = Vec::new();
        for (rev, events) in &log.by_revision {
            let Some(e) = events.first() else { continue };
            let makers: Vec<OpId> = match e.kind {
                EventKind::Put => {
                    e.kv.and_then(|kv| by_value.get(&kv.value))
                        .into_iter()
                        .copied()
                        .collect()
                }
                EventKind::Delete => {
                    let lease = e.prev.map_or(0, |kv| kv.lease);
                    if let Some(id) = answered_delete
                        .get(&(*rev, e.key.as_str()))
                        .or(answered_revoke.get(&(*rev, lease)))
                    {
                        vec![*id]
                    } else {
                        let deletes = unknown_deletes.get(e.key.as_str());
                        let revokes = unknown_revokes.get(&lease).filter(|_| lease != 0);
                        deletes
                            .into_iter()
                            .chain(revokes)
                            .flatten()
                            .copied()
                            .collect()
                    }
                }
            };
            match makers.as_slice() {
                [] => out.push(
                    "write-nobody-issued",
                    format!("revision {rev}: {events:?} matches no operation of any client"),
                ),
                [one] if matches!(h.ops[*one].outcome, Outcome::Unknown(_)) => {
                    if h.ops[*one].request.written_value().is_none() {
                        revision[*one] = Some(*rev);
                        wrote[*one] = true;
                    }
                }
                [one] if matches!(h.ops[*one].request, Request::LeaseRevoke { .. }) => {
                    wrote[*one] = true;
                }
                several => {
                    for id in several {
                        maybe[*id] = matches!(h.ops[*id].outcome, Outcome::Unknown(_));
                    }
                }
            }
            if let Some(first) = makers.iter().map(|id| h.ops[*id].invoke).min() {
                made.push((first, *rev));
            }
        }
        made.sort_unstable();

        // First return of an answered operation at or after each revision.
        let mut answered: Vec<(i64, Nanos)> = (0..n)
            .filter(|&id| h.ops[id].ok().is_some() && deadline[id].is_some())
            .filter_map(|id| Some((revision[id]?, h.ops[id].ret)))
            .collect();
        answered.sort_unstable();
        let mut suffix_min = vec![Nanos::MAX; answered.len() + 1];
        for i in (0..answered.len()).rev() {
            suffix_min[i] = suffix_min[i + 1].min(answered[i].1);
        }
        for (id, op) in h.ops.iter().enumerate() {
            if matches!(op.outcome, Outcome::Unknown(_)) {
                if let Some(r) = revision[id] {
                    let i = answered.partition_point(|(rev, _)| *rev < r);
                    let t = suffix_min[i];
                    deadline[id] = (t != Nanos::MAX).then_some(t);
                }
            }
        }
        Effects {
            revision,
            deadline,
            wrote,
            maybe,
            made,
            applied_unknown,
            dropped_unknown,
        }
    }
}

/// No linearizable answer below what was answered before it started, no
/// answer above every write started before it returned.
fn check_real_time(h: &History, effects: &Effects, out: &mut Anomalies) {
    let with_rev: Vec<OpId> = (0..h.ops.len())
        .filter(|&id| effects.revision[id].is_some())
        .collect();
    let rev = |id: OpId| effects.revision[id].unwrap_or(0);

    // Sweep 1: ops by invoke against answered ops by return.
    let mut by_ret: Vec<OpId> = with_rev
        .iter()
        .copied()
        .filter(|&id| h.ops[id].ok().is_some())
        .collect();
    by_ret.sort_by_key(|&id| h.ops[id].ret);
    let mut by_invoke = with_rev.clone();
    by_invoke.sort_by_key(|&id| h.ops[id].invoke);
    let mut i = 0;
    let mut highest: Option<OpId> = None;
    for &b in &by_invoke {
        while i < by_ret.len() && h.ops[by_ret[i]].ret < h.ops[b].invoke {
            let a = by_ret[i];
            if highest.is_none_or(|x| rev(a) > rev(x)) {
                highest = Some(a);
            }
            i += 1;
        }
        let Some(a) = highest else { continue };
        let back = if effects.wrote[b] {
            rev(b) <= rev(a)
        } else {
            rev(b) < rev(a)
        };
        if back {
            out.push(
                "revision-went-back",
                format!(
                    "{} took effect at revision {}, but {} had already answered revision {} before it started",
                    h.describe(b),
                    rev(b),
                    h.describe(a),
                    rev(a)
                ),
            );
        }
    }

    // Sweep 2: answered ops by return against the log's revisions by the
    // invoke of the operation that made them.
    let mut j = 0;
    let mut newest = 1i64;
    for &b in &by_ret {
        while j < effects.made.len() && effects.made[j].0 < h.ops[b].ret {
            newest = newest.max(effects.made[j].1);
            j += 1;
        }
        if rev(b) > newest {
            out.push(
                "revision-from-the-future",
                format!(
                    "{} answered revision {}, but no write started before it returned made more than {newest}",
                    h.describe(b),
                    rev(b)
                ),
            );
        }
    }
}

/// One client's answers never go back (its operations are sequential),
/// nor do one member's serializable reads, across its restarts. A slot whose
/// member was replaced (a membership change) holds another member after:
/// its answers start again.
fn check_monotonic(h: &History, out: &mut Anomalies) {
    let mut last_by_client: HashMap<(u32, u32), OpId> = HashMap::new();
    let mut order: Vec<OpId> = (0..h.ops.len()).collect();
    order.sort_by_key(|&id| h.ops[id].invoke);
    for &id in &order {
        let op = &h.ops[id];
        let Some(resp) = op.ok() else { continue };
        let who = (op.client, op.incarnation);
        if let Some(&prev) = last_by_client.get(&who) {
            let before = h.ops[prev].ok().map_or(0, Response::revision);
            if resp.revision() < before {
                out.push(
                    "client-revision-went-back",
                    format!(
                        "{} after {} (same client)",
                        h.describe(id),
                        h.describe(prev)
                    ),
                );
            }
        }
        last_by_client.insert(who, id);
    }

    let member = |id: OpId| (h.ops[id].member, h.ops[id].incarnation);
    let mut serializable: Vec<OpId> = (0..h.ops.len())
        .filter(|&id| {
            h.ops[id].ok().is_some()
                && matches!(
                    h.ops[id].request,
                    Request::Get {
                        serializable: true,
                        ..
                    }
                )
        })
        .collect();
    serializable.sort_by_key(|&id| (member(id), h.ops[id].invoke));
    let mut by_ret = serializable.clone();
    by_ret.sort_by_key(|&id| (member(id), h.ops[id].ret));
    let rev = |id: OpId| h.ops[id].ok().map_or(0, Response::revision);
    let mut i = 0;
    let mut highest: Option<OpId> = None;
    let mut current = (usize::MAX, u32::MAX);
    for &b in &serializable {
        if member(b) != current {
            current = member(b);
            highest = None;
            while i < by_ret.len() && member(by_ret[i]) < current {
                i += 1;
            }
        }
        while i < by_ret.len()
            && member(by_ret[i]) == current
            && h.ops[by_ret[i]].ret < h.ops[b].invoke
        {
            let a = by_ret[i];
            if highest.is_none_or(|x| rev(a) > rev(x)) {
                highest = Some(a);
            }
            i += 1;
        }
        if let Some(a) = highest {
            if rev(b) < rev(a) {
                out.push(
                    "member-revision-went-back",
                    format!(
                        "member {}: {} answered below {}, which returned before it started",
                        current.0,
                        h.describe(b),
                        h.describe(a)
                    ),
                );
            }
        }
    }
}

/// Every member ends at the same revision with the log's state and hash.
fn check_finals(h: &History, log: &Log, out: &mut Anomalies) {
    for f in &h.finals {
        if f.revision != log.last {
            out.push(
                "final-state",
                format!(
                    "member {} ended at revision {}, the log at {}",
                    f.member, f.revision, log.last
                ),
            );
        }
        let expected: BTreeMap<String, Kv> = log
            .versions
            .keys()
            .filter_map(|k| Some((k.clone(), log.at(k, f.revision)?)))
            .collect();
        if f.kvs != expected {
            let differ: Vec<&String> = expected
                .keys()
                .chain(f.kvs.keys())
                .filter(|k| expected.get(*k) != f.kvs.get(*k))
                .take(5)
                .collect();
            out.push(
                "final-state",
                format!(
                    "member {} at revision {}: keys {differ:?} differ from the log",
                    f.member, f.revision
                ),
            );
        }
    }
    let hashes: Vec<(usize, u32)> = h
        .finals
        .iter()
        .filter_map(|f| Some((f.member, f.hash?)))
        .collect();
    if hashes.windows(2).any(|w| w[0].1 != w[1].1) {
        out.push(
            "final-hash",
            format!("HashKV differs between members (member, hash): {hashes:x?}"),
        );
    }
}

/// Per key, as a register with compare-and-set.
fn check_linearizable(
    h: &History,
    effects: &Effects,
    options: &Options,
    out: &mut Anomalies,
) -> (usize, Vec<String>) {
    let mut per_key: BTreeMap<&str, Vec<KeyOp>> = BTreeMap::new();
    let mut leases_of_key: HashMap<&str, Vec<LeaseId>> = HashMap::new();
    for (id, op) in h.ops.iter().enumerate() {
        let known = |step: Step| KeyOp {
            id,
            invoke: op.invoke,
            ret: effects.deadline[id],
            step,
        };
        let step = match (&op.request, &op.outcome) {
            (_, Outcome::Failed(_)) => None,
            (Request::Put { value, lease, .. }, Outcome::Ok(_)) => Some(Step::Write {
                value: *value,
                lease: *lease,
            }),
            (
                Request::Put { value, lease, .. } | Request::Cas { value, lease, .. },
                Outcome::Unknown(_),
            ) => effects.revision[id].map(|_| Step::Write {
                value: *value,
                lease: *lease,
            }),
            (
                Request::Get {
                    serializable: false,
                    ..
                },
                Outcome::Ok(Response::Get { kv, .. }),
            ) => Some(Step::Read {
                value: kv.map(|kv| kv.value),
            }),
            (
                Request::Cas {
                    expect,
                    value,
                    lease,
                    ..
                },
                Outcome::Ok(Response::Cas {
                    succeeded, current, ..
                }),
            ) => Some(if *succeeded {
                Step::CasSucceeded {
                    expect: *expect,
                    value: *value,
                    lease: *lease,
                }
            } else {
                Step::CasFailed {
                    expect: *expect,
                    current: current.map(|kv| kv.value),
                }
            }),
            (Request::Delete { .. }, Outcome::Ok(Response::Delete { deleted, .. })) => {
                Some(Step::Delete {
                    deleted: Some(*deleted > 0),
                })
            }
            (Request::Delete { .. }, Outcome::Unknown(_))
                if effects.revision[id].is_some() || effects.maybe[id] =>
            {
                Some(Step::Delete { deleted: None })
            }
            _ => None,
        };
        if let (Some(step), Some(key)) = (step, op.request.key()) {
            if let Step::Write { lease, .. } | Step::CasSucceeded { lease, .. } = step {
                if lease != 0 {
                    leases_of_key.entry(key).or_default().push(lease);
                }
            }
            per_key.entry(key).or_default().push(known(step));
        }
    }
    // A revoke touches every key ever put with its lease.
    for (id, op) in h.ops.iter().enumerate() {
        let Request::LeaseRevoke { lease } = op.request else {
            continue;
        };
        let unknown_without_effect = matches!(op.outcome, Outcome::Unknown(_))
            && effects.revision[id].is_none()
            && !effects.maybe[id];
        if matches!(op.outcome, Outcome::Failed(_)) || unknown_without_effect {
            continue;
        }
        for (key, leases) in &leases_of_key {
            if leases.contains(&lease) {
                if let Some(ops) = per_key.get_mut(key) {
                    ops.push(KeyOp {
                        id,
                        invoke: op.invoke,
                        ret: effects.deadline[id],
                        step: Step::Revoke { lease },
                    });
                }
            }
        }
    }
    let mut inconclusive = Vec::new();
    for (key, ops) in &per_key {
        match linearizable::check(ops, None, options.budget_steps) {
            Verdict::Linearizable => {}
            Verdict::Inconclusive { steps } => {
                inconclusive.push(format!("{key} ({} ops, {steps} steps)", ops.len()))
            }
            Verdict::Illegal {
                placed,
                state,
                stuck,
            } => out.push(
                "not-linearizable",
                format!(
                    "key {key}: no order of its {} operations explains what clients saw; the longest explained prefix places {placed}, leaving the key at {}, and then {} must have taken effect but cannot",
                    ops.len(),
                    match state {
                        Some((v, l)) => format!("v{v} (lease {l:x})"),
                        None => "absent".to_string(),
                    },
                    h.describe(stuck)
                ),
            ),
        }
    }
    (per_key.len(), inconclusive)
}
