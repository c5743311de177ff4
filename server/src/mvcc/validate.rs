//! Request validation done by etcd's API layer *before* a request is
//! proposed (`v3rpc/key.go`: `checkRangeRequest`, `checkPutRequest`,
//! `checkDeleteRequest`, `checkTxnRequest`, `checkIntervals`).
//!
//! These checks are not repeated at apply time (etcd doesn't either): the
//! apply path must cope with any request, these only decide what a client
//! is allowed to propose. Pure functions, no state.

use std::collections::HashSet;

use super::codec::MAX_TXN_DEPTH;
use super::error::MvccError;
use super::types::{DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest};

/// etcd's `checkRangeRequest` (sort enums cannot be invalid here).
pub fn validate_range(r: &RangeRequest) -> Result<(), MvccError> {
    if r.key.is_empty() {
        return Err(MvccError::EmptyKey);
    }
    Ok(())
}

/// etcd's `checkPutRequest`.
pub fn validate_put(p: &PutRequest) -> Result<(), MvccError> {
    if p.key.is_empty() {
        return Err(MvccError::EmptyKey);
    }
    if p.ignore_value && !p.value.is_empty() {
        return Err(MvccError::ValueProvided);
    }
    if p.ignore_lease && p.lease != 0 {
        return Err(MvccError::LeaseProvided);
    }
    Ok(())
}

/// etcd's `checkDeleteRequest`.
pub fn validate_delete_range(d: &DeleteRangeRequest) -> Result<(), MvccError> {
    if d.key.is_empty() {
        return Err(MvccError::EmptyKey);
    }
    Ok(())
}

/// etcd's `checkTxnRequest` followed by `checkIntervals` on both branches,
/// in etcd's order, so the first error reported is etcd's.
///
/// `max_ops` is etcd's `--max-txn-ops` (default 128): no branch nor the
/// compare list may be longer, and a nested txn gets what its parent's
/// longest list left of the budget. On top of etcd, nesting deeper than
/// [`MAX_TXN_DEPTH`] is `TooManyOps` (such a request could not be decoded
/// from the Raft log).
///
/// Duplicate keys: a key put twice on one execution path, or put inside a
/// range deleted on it, is `DuplicateKey`; a put in both branches of one
/// nested txn is fine. As in etcd, a delete's `range_end` is compared
/// literally here, so a delete with `range_end == "\0"` ("to the end")
/// never conflicts with a put — etcd's quirk, kept for compatibility.
pub fn validate_txn(t: &TxnRequest, max_ops: usize) -> Result<(), MvccError> {
    check_txn(t, i64::try_from(max_ops).unwrap_or(i64::MAX), 1)?;
    check_intervals(&t.success)?;
    check_intervals(&t.failure)?;
    Ok(())
}

/// True when every op of both branches is a Range (etcd's
/// `isTxnReadonly`): such a txn writes nothing and need not go through Raft.
pub fn is_txn_readonly(t: &TxnRequest) -> bool {
    t.success
        .iter()
        .chain(&t.failure)
        .all(|op| matches!(op, RequestOp::Range(_)))
}

fn check_txn(t: &TxnRequest, max_ops: i64, depth: usize) -> Result<(), MvccError> {
    if depth > MAX_TXN_DEPTH {
        return Err(MvccError::TooManyOps);
    }
    let opc = t.compare.len().max(t.success.len()).max(t.failure.len());
    let opc = i64::try_from(opc).unwrap_or(i64::MAX);
    if opc > max_ops {
        return Err(MvccError::TooManyOps);
    }
    if t.compare.iter().any(|c| c.key.is_empty()) {
        return Err(MvccError::EmptyKey);
    }
    for op in t.success.iter().chain(&t.failure) {
        match op {
            RequestOp::Range(r) => validate_range(r)?,
            RequestOp::Put(p) => validate_put(p)?,
            RequestOp::DeleteRange(d) => validate_delete_range(d)?,
            RequestOp::Txn(n) => check_txn(n, max_ops - opc, depth + 1)?,
        }
    }
    Ok(())
}

/// A deleted interval: `[begin, end)`, or the single key `begin` if `end`
/// is `None`. Like etcd's `adt` intervals, `end` is compared literally.
type Del<'a> = (&'a [u8], Option<&'a [u8]>);

fn intersects(dels: &[Del<'_>], k: &[u8]) -> bool {
    dels.iter().any(|&(begin, end)| match end {
        None => begin == k,
        Some(end) => begin <= k && k < end,
    })
}

type PutsAndDels<'a> = (HashSet<&'a [u8]>, Vec<Del<'a>>);

/// etcd's `checkIntervals`: this level's deletes first, then children's
/// puts against them (and against earlier siblings' puts and deletes), then
/// this level's puts against everything collected.
fn check_intervals(ops: &[RequestOp]) -> Result<PutsAndDels<'_>, MvccError> {
    let mut dels: Vec<Del<'_>> = ops
        .iter()
        .filter_map(|op| match op {
            RequestOp::DeleteRange(d) if d.range_end.is_empty() => Some((&d.key[..], None)),
            RequestOp::DeleteRange(d) => Some((&d.key[..], Some(&d.range_end[..]))),
            _ => None,
        })
        .collect();

    let mut puts: HashSet<&[u8]> = HashSet::new();
    for op in ops {
        let RequestOp::Txn(t) = op else {
            continue;
        };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for &k in &puts_then {
            if puts.contains(k) || intersects(&dels, k) {
                return Err(MvccError::DuplicateKey);
            }
            puts.insert(k);
        }
        for &k in &puts_else {
            // A key from this child's other branch is fine: only one runs.
            if puts.contains(k) && !puts_then.contains(k) {
                return Err(MvccError::DuplicateKey);
            }
            if intersects(&dels, k) {
                return Err(MvccError::DuplicateKey);
            }
            puts.insert(k);
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }

    for op in ops {
        let RequestOp::Put(p) = op else {
            continue;
        };
        let k = &p.key[..];
        if puts.contains(k) || intersects(&dels, k) {
            return Err(MvccError::DuplicateKey);
        }
        puts.insert(k);
    }
    Ok((puts, dels))
}
