//! Binary encodings owned by MVCC: the Raft log payload of a write
//! [`Request`], and the engine value of one stored key revision.
//!
//! Both are compact and deterministic (one request has exactly one
//! encoding: canonical LEB128 varints, zigzag for signed integers, fixed
//! field order) and start with a format version byte so a later release can
//! change them. Decoding never panics and never trusts a length: every
//! length or count must fit in the bytes that remain, and txn nesting is
//! bounded by [`MAX_TXN_DEPTH`], so hostile input costs at most memory
//! proportional to its own size.
//!
//! Request layout (version 1): `version, tag, body`; tags 1 Put, 2
//! DeleteRange, 3 Txn, 4 Compaction. Bodies:
//! - Put: `flags(prev_kv=1, ignore_value=2, ignore_lease=4), key, value, lease`
//! - DeleteRange: `flags(prev_kv=1), key, range_end`
//! - Range (txn op): `flags(serializable=1, keys_only=2, count_only=4),
//!   sort_order, sort_target, key, range_end, limit, revision,
//!   min_mod, max_mod, min_create, max_create`
//! - Txn: `n, n × compare, n, n × op, n, n × op` (success then failure);
//!   op = `tag(1 Range, 2 Put, 3 DeleteRange, 4 Txn), body`
//! - Compare: `result, target, union tag(0 Version, 1 Create, 2 Mod,
//!   3 Value, 4 Lease), union payload, key, range_end`
//! - Compaction: `flags(physical=1), revision`
//!
//! where byte strings are `uvarint len, bytes`, `i64`s zigzag varints and
//! enums one byte holding etcd's protobuf number.

use bytes::Bytes;

use super::types::{
    CompactionRequest, Compare, CompareResult, CompareTarget, DeleteRangeRequest, KeyValue,
    PutRequest, RangeRequest, Request, RequestOp, SortOrder, SortTarget, TargetUnion, TxnRequest,
};

/// Format version of the Raft log payload written by [`encode`].
pub const FORMAT_VERSION: u8 = 1;

/// Deepest txn nesting [`decode`] accepts (a top-level txn is depth 1).
/// [`super::validate_txn`] rejects deeper requests before they are proposed,
/// so every committed entry decodes.
pub const MAX_TXN_DEPTH: usize = 64;

/// Why a Raft log payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("mvcc codec: empty input")]
    Empty,
    #[error("mvcc codec: unsupported format version {0}")]
    Version(u8),
    #[error("mvcc codec: truncated input")]
    Truncated,
    #[error("mvcc codec: invalid {0}")]
    Invalid(&'static str),
    #[error("mvcc codec: txn nesting deeper than {MAX_TXN_DEPTH}")]
    TooDeep,
    #[error("mvcc codec: {0} trailing bytes")]
    Trailing(usize),
}

const REQ_PUT: u8 = 1;
const REQ_DELETE_RANGE: u8 = 2;
const REQ_TXN: u8 = 3;
const REQ_COMPACTION: u8 = 4;

const OP_RANGE: u8 = 1;
const OP_PUT: u8 = 2;
const OP_DELETE_RANGE: u8 = 3;
const OP_TXN: u8 = 4;

const PUT_PREV_KV: u8 = 1;
const PUT_IGNORE_VALUE: u8 = 2;
const PUT_IGNORE_LEASE: u8 = 4;
const DEL_PREV_KV: u8 = 1;
const RANGE_SERIALIZABLE: u8 = 1;
const RANGE_KEYS_ONLY: u8 = 2;
const RANGE_COUNT_ONLY: u8 = 4;
const COMPACT_PHYSICAL: u8 = 1;

const TU_VERSION: u8 = 0;
const TU_CREATE: u8 = 1;
const TU_MOD: u8 = 2;
const TU_VALUE: u8 = 3;
const TU_LEASE: u8 = 4;

/// Appends the encoding of `req` to `out`.
pub fn encode(req: &Request, out: &mut Vec<u8>) {
    // Room for it all at once: grown push by push, a 1 MiB value is copied
    // into a buffer of twice its size by the varint pushed after it.
    out.reserve(size_bound(req));
    out.push(FORMAT_VERSION);
    match req {
        Request::Put(p) => {
            out.push(REQ_PUT);
            put_put(out, p);
        }
        Request::DeleteRange(d) => {
            out.push(REQ_DELETE_RANGE);
            put_delete(out, d);
        }
        Request::Txn(t) => {
            out.push(REQ_TXN);
            put_txn(out, t);
        }
        Request::Compaction(c) => {
            out.push(REQ_COMPACTION);
            out.push(if c.physical { COMPACT_PHYSICAL } else { 0 });
            put_ivarint(out, c.revision);
        }
    }
}

/// Decodes a payload written by [`encode`], copying `buf` once; the
/// request's byte strings share that single copy.
pub fn decode(buf: &[u8]) -> Result<Request, DecodeError> {
    decode_shared(&Bytes::copy_from_slice(buf))
}

/// Like [`decode`], but the request's byte strings are slices of `buf`
/// (no copy). Note they keep all of `buf` alive while they live.
pub fn decode_shared(buf: &Bytes) -> Result<Request, DecodeError> {
    let mut r = Reader::shared(buf);
    let version = r.u8().map_err(|_| DecodeError::Empty)?;
    if version != FORMAT_VERSION {
        return Err(DecodeError::Version(version));
    }
    let req = match r.u8()? {
        REQ_PUT => Request::Put(r.put()?),
        REQ_DELETE_RANGE => Request::DeleteRange(r.delete()?),
        REQ_TXN => Request::Txn(r.txn(1)?),
        REQ_COMPACTION => {
            let flags = r.flags(COMPACT_PHYSICAL)?;
            Request::Compaction(CompactionRequest {
                revision: r.ivarint()?,
                physical: flags & COMPACT_PHYSICAL != 0,
            })
        }
        _ => return Err(DecodeError::Invalid("request tag")),
    };
    r.finish()?;
    Ok(req)
}

/// Room for the encoding of `req`: its bytes fields plus a generous
/// allowance per field and operation for tags, flags and varints (a
/// reservation, not a limit: the encoding grows past it if it must).
fn size_bound(req: &Request) -> usize {
    /// Per field or operation: tags, flags and varints never take more.
    const FIXED: usize = 24;
    fn ops(ops: &[RequestOp]) -> usize {
        ops.iter()
            .map(|op| match op {
                RequestOp::Range(r) => r.key.len() + r.range_end.len() + 4 * FIXED,
                RequestOp::Put(p) => p.key.len() + p.value.len() + FIXED,
                RequestOp::DeleteRange(d) => d.key.len() + d.range_end.len() + FIXED,
                RequestOp::Txn(t) => txn(t),
            })
            .sum::<usize>()
            + FIXED
    }
    fn txn(t: &TxnRequest) -> usize {
        let compares: usize = t
            .compare
            .iter()
            .map(|c| {
                let value = match &c.target_union {
                    TargetUnion::Value(v) => v.len(),
                    _ => 0,
                };
                c.key.len() + c.range_end.len() + value + FIXED
            })
            .sum();
        compares + ops(&t.success) + ops(&t.failure) + FIXED
    }
    FIXED
        + match req {
            Request::Put(p) => p.key.len() + p.value.len(),
            Request::DeleteRange(d) => d.key.len() + d.range_end.len(),
            Request::Txn(t) => txn(t),
            Request::Compaction(_) => 0,
        }
}

fn put_put(out: &mut Vec<u8>, p: &PutRequest) {
    let mut flags = 0;
    if p.prev_kv {
        flags |= PUT_PREV_KV;
    }
    if p.ignore_value {
        flags |= PUT_IGNORE_VALUE;
    }
    if p.ignore_lease {
        flags |= PUT_IGNORE_LEASE;
    }
    out.push(flags);
    put_bytes(out, &p.key);
    put_bytes(out, &p.value);
    put_ivarint(out, p.lease);
}

fn put_delete(out: &mut Vec<u8>, d: &DeleteRangeRequest) {
    out.push(if d.prev_kv { DEL_PREV_KV } else { 0 });
    put_bytes(out, &d.key);
    put_bytes(out, &d.range_end);
}

fn put_range(out: &mut Vec<u8>, r: &RangeRequest) {
    let mut flags = 0;
    if r.serializable {
        flags |= RANGE_SERIALIZABLE;
    }
    if r.keys_only {
        flags |= RANGE_KEYS_ONLY;
    }
    if r.count_only {
        flags |= RANGE_COUNT_ONLY;
    }
    out.push(flags);
    out.push(r.sort_order as u8);
    out.push(r.sort_target as u8);
    put_bytes(out, &r.key);
    put_bytes(out, &r.range_end);
    for v in [
        r.limit,
        r.revision,
        r.min_mod_revision,
        r.max_mod_revision,
        r.min_create_revision,
        r.max_create_revision,
    ] {
        put_ivarint(out, v);
    }
}

fn put_compare(out: &mut Vec<u8>, c: &Compare) {
    out.push(c.result as u8);
    out.push(c.target as u8);
    match &c.target_union {
        TargetUnion::Version(v) => {
            out.push(TU_VERSION);
            put_ivarint(out, *v);
        }
        TargetUnion::CreateRevision(v) => {
            out.push(TU_CREATE);
            put_ivarint(out, *v);
        }
        TargetUnion::ModRevision(v) => {
            out.push(TU_MOD);
            put_ivarint(out, *v);
        }
        TargetUnion::Value(v) => {
            out.push(TU_VALUE);
            put_bytes(out, v);
        }
        TargetUnion::Lease(v) => {
            out.push(TU_LEASE);
            put_ivarint(out, *v);
        }
    }
    put_bytes(out, &c.key);
    put_bytes(out, &c.range_end);
}

fn put_ops(out: &mut Vec<u8>, ops: &[RequestOp]) {
    put_uvarint(out, ops.len() as u64);
    for op in ops {
        match op {
            RequestOp::Range(r) => {
                out.push(OP_RANGE);
                put_range(out, r);
            }
            RequestOp::Put(p) => {
                out.push(OP_PUT);
                put_put(out, p);
            }
            RequestOp::DeleteRange(d) => {
                out.push(OP_DELETE_RANGE);
                put_delete(out, d);
            }
            RequestOp::Txn(t) => {
                out.push(OP_TXN);
                put_txn(out, t);
            }
        }
    }
}

fn put_txn(out: &mut Vec<u8>, t: &TxnRequest) {
    put_uvarint(out, t.compare.len() as u64);
    for c in &t.compare {
        put_compare(out, c);
    }
    put_ops(out, &t.success);
    put_ops(out, &t.failure);
}

pub(crate) fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_ivarint(out: &mut Vec<u8>, v: i64) {
    // Zigzag so small negative numbers (lease -1, revision -1) stay short.
    put_uvarint(out, ((v << 1) ^ (v >> 63)) as u64);
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_uvarint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Initial capacity for a decoded list: lists grow by push, so a forged
/// count costs nothing before the elements are actually present.
const MAX_PREALLOC: usize = 16;

/// A bounds-checked cursor. With `shared` set, byte strings are zero-copy
/// slices of it; otherwise they are copied out of `buf`.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    shared: Option<&'a Bytes>,
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn shared(buf: &'a Bytes) -> Self {
        Reader {
            buf,
            shared: Some(buf),
            pos: 0,
        }
    }

    pub(crate) fn borrowed(buf: &'a [u8]) -> Self {
        Reader {
            buf,
            shared: None,
            pos: 0,
        }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        let b = *self.buf.get(self.pos).ok_or(DecodeError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    fn flags(&mut self, allowed: u8) -> Result<u8, DecodeError> {
        let f = self.u8()?;
        if f & !allowed != 0 {
            return Err(DecodeError::Invalid("flags"));
        }
        Ok(f)
    }

    pub(crate) fn uvarint(&mut self) -> Result<u64, DecodeError> {
        let mut v: u64 = 0;
        for i in 0..10u32 {
            let b = self.u8()?;
            // The 10th byte may only carry the top bit of a u64.
            if i == 9 && b > 1 {
                return Err(DecodeError::Invalid("varint overflow"));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                // A trailing zero group is an overlong (non-canonical) form;
                // rejecting it keeps one value = one encoding.
                if b == 0 && i > 0 {
                    return Err(DecodeError::Invalid("overlong varint"));
                }
                return Ok(v);
            }
        }
        Err(DecodeError::Invalid("varint overflow"))
    }

    pub(crate) fn ivarint(&mut self) -> Result<i64, DecodeError> {
        let v = self.uvarint()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    /// A length or element count: it can never exceed the bytes left,
    /// because every element takes at least one byte.
    fn len(&mut self) -> Result<usize, DecodeError> {
        let n = self.uvarint()?;
        match usize::try_from(n) {
            Ok(n) if n <= self.remaining() => Ok(n),
            _ => Err(DecodeError::Truncated),
        }
    }

    /// A length-prefixed byte string, borrowed; returns it with its offset.
    fn prefixed(&mut self) -> Result<(usize, &'a [u8]), DecodeError> {
        let n = self.len()?;
        let start = self.pos;
        let s = self
            .buf
            .get(start..start + n)
            .ok_or(DecodeError::Truncated)?;
        self.pos += n;
        Ok((start, s))
    }

    pub(crate) fn slice(&mut self) -> Result<&'a [u8], DecodeError> {
        Ok(self.prefixed()?.1)
    }

    pub(crate) fn bytes(&mut self) -> Result<Bytes, DecodeError> {
        let (start, s) = self.prefixed()?;
        Ok(self.to_bytes(start, s))
    }

    /// Everything left, as a byte string.
    pub(crate) fn rest(&mut self) -> Bytes {
        let start = self.pos;
        let s = self.buf.get(start..).unwrap_or_default();
        self.pos = self.buf.len();
        self.to_bytes(start, s)
    }

    fn to_bytes(&self, start: usize, s: &[u8]) -> Bytes {
        match self.shared {
            Some(b) if !s.is_empty() => b.slice(start..start + s.len()),
            Some(_) => Bytes::new(),
            None => Bytes::copy_from_slice(s),
        }
    }

    fn put(&mut self) -> Result<PutRequest, DecodeError> {
        let flags = self.flags(PUT_PREV_KV | PUT_IGNORE_VALUE | PUT_IGNORE_LEASE)?;
        Ok(PutRequest {
            key: self.bytes()?,
            value: self.bytes()?,
            lease: self.ivarint()?,
            prev_kv: flags & PUT_PREV_KV != 0,
            ignore_value: flags & PUT_IGNORE_VALUE != 0,
            ignore_lease: flags & PUT_IGNORE_LEASE != 0,
        })
    }

    fn delete(&mut self) -> Result<DeleteRangeRequest, DecodeError> {
        let flags = self.flags(DEL_PREV_KV)?;
        Ok(DeleteRangeRequest {
            key: self.bytes()?,
            range_end: self.bytes()?,
            prev_kv: flags & DEL_PREV_KV != 0,
        })
    }

    fn range(&mut self) -> Result<RangeRequest, DecodeError> {
        let flags = self.flags(RANGE_SERIALIZABLE | RANGE_KEYS_ONLY | RANGE_COUNT_ONLY)?;
        let sort_order =
            SortOrder::from_i32(i32::from(self.u8()?)).ok_or(DecodeError::Invalid("sort order"))?;
        let sort_target = SortTarget::from_i32(i32::from(self.u8()?))
            .ok_or(DecodeError::Invalid("sort target"))?;
        Ok(RangeRequest {
            key: self.bytes()?,
            range_end: self.bytes()?,
            limit: self.ivarint()?,
            revision: self.ivarint()?,
            min_mod_revision: self.ivarint()?,
            max_mod_revision: self.ivarint()?,
            min_create_revision: self.ivarint()?,
            max_create_revision: self.ivarint()?,
            sort_order,
            sort_target,
            serializable: flags & RANGE_SERIALIZABLE != 0,
            keys_only: flags & RANGE_KEYS_ONLY != 0,
            count_only: flags & RANGE_COUNT_ONLY != 0,
        })
    }

    fn compare(&mut self) -> Result<Compare, DecodeError> {
        let result = CompareResult::from_i32(i32::from(self.u8()?))
            .ok_or(DecodeError::Invalid("compare result"))?;
        let target = CompareTarget::from_i32(i32::from(self.u8()?))
            .ok_or(DecodeError::Invalid("compare target"))?;
        let target_union = match self.u8()? {
            TU_VERSION => TargetUnion::Version(self.ivarint()?),
            TU_CREATE => TargetUnion::CreateRevision(self.ivarint()?),
            TU_MOD => TargetUnion::ModRevision(self.ivarint()?),
            TU_VALUE => TargetUnion::Value(self.bytes()?),
            TU_LEASE => TargetUnion::Lease(self.ivarint()?),
            _ => return Err(DecodeError::Invalid("compare target union")),
        };
        Ok(Compare {
            result,
            target,
            key: self.bytes()?,
            range_end: self.bytes()?,
            target_union,
        })
    }

    fn ops(&mut self, depth: usize) -> Result<Vec<RequestOp>, DecodeError> {
        let n = self.len()?;
        let mut ops = Vec::with_capacity(n.min(MAX_PREALLOC));
        for _ in 0..n {
            ops.push(match self.u8()? {
                OP_RANGE => RequestOp::Range(self.range()?),
                OP_PUT => RequestOp::Put(self.put()?),
                OP_DELETE_RANGE => RequestOp::DeleteRange(self.delete()?),
                OP_TXN => RequestOp::Txn(self.txn(depth + 1)?),
                _ => return Err(DecodeError::Invalid("txn op tag")),
            });
        }
        Ok(ops)
    }

    fn txn(&mut self, depth: usize) -> Result<TxnRequest, DecodeError> {
        if depth > MAX_TXN_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        let n = self.len()?;
        let mut compare = Vec::with_capacity(n.min(MAX_PREALLOC));
        for _ in 0..n {
            compare.push(self.compare()?);
        }
        let success = self.ops(depth)?;
        let failure = self.ops(depth)?;
        Ok(TxnRequest {
            compare,
            success,
            failure,
        })
    }
}

/// Format version of a stored key revision (engine value).
const KV_FORMAT_VERSION: u8 = 1;
const KV_TOMBSTONE: u8 = 1;

/// Appends the engine value of one key revision:
/// `version, flags(tombstone=1), key` and, unless a tombstone,
/// `create_revision, version, lease, value...` (value runs to the end).
/// `mod_revision` is not stored: it is the main revision in the engine key.
pub(crate) fn encode_kv(out: &mut Vec<u8>, kv: &KeyValue, tombstone: bool) {
    out.push(KV_FORMAT_VERSION);
    out.push(if tombstone { KV_TOMBSTONE } else { 0 });
    put_bytes(out, &kv.key);
    if !tombstone {
        put_ivarint(out, kv.create_revision);
        put_ivarint(out, kv.version);
        put_ivarint(out, kv.lease);
        out.extend_from_slice(&kv.value);
    }
}

/// Appends a key revision as etcd stores it in bbolt's `key` bucket, the
/// bytes etcd's `HashKV` hashes: the key is `main (8 BE) '_' sub (8 BE)`,
/// plus `'t'` for a tombstone; the value is the `mvccpb.KeyValue` protobuf
/// (zero fields omitted, in field order), a tombstone's holding only its
/// key. Used so our hashes equal etcd's for the same history.
pub(crate) fn etcd_bucket_record(
    key_out: &mut Vec<u8>,
    value_out: &mut Vec<u8>,
    kv: &KeyValue,
    sub: u32,
    tombstone: bool,
) {
    key_out.clear();
    key_out.extend_from_slice(&kv.mod_revision.to_be_bytes());
    key_out.push(b'_');
    key_out.extend_from_slice(&i64::from(sub).to_be_bytes());
    if tombstone {
        key_out.push(b't');
    }
    value_out.clear();
    put_proto_bytes(value_out, 1, &kv.key);
    if tombstone {
        return;
    }
    put_proto_int(value_out, 2, kv.create_revision);
    put_proto_int(value_out, 3, kv.mod_revision);
    put_proto_int(value_out, 4, kv.version);
    put_proto_bytes(value_out, 5, &kv.value);
    put_proto_int(value_out, 6, kv.lease);
}

fn put_proto_int(out: &mut Vec<u8>, number: u64, v: i64) {
    if v != 0 {
        put_uvarint(out, number << 3);
        // protobuf int64: two's complement as a 64-bit varint.
        put_uvarint(out, v as u64);
    }
}

fn put_proto_bytes(out: &mut Vec<u8>, number: u64, b: &[u8]) {
    if !b.is_empty() {
        put_uvarint(out, (number << 3) | 2);
        put_uvarint(out, b.len() as u64);
        out.extend_from_slice(b);
    }
}

/// The tombstone flag and key of a stored key revision, without copying.
pub(crate) fn decode_kv_key(buf: &[u8]) -> Result<(bool, &[u8]), DecodeError> {
    let mut r = Reader::borrowed(buf);
    let tombstone = kv_header(&mut r)?;
    Ok((tombstone, r.slice()?))
}

/// Decodes a stored key revision; byte strings are slices of `buf`.
pub(crate) fn decode_kv(buf: &Bytes, mod_revision: i64) -> Result<(bool, KeyValue), DecodeError> {
    let mut r = Reader::shared(buf);
    let tombstone = kv_header(&mut r)?;
    let key = r.bytes()?;
    if tombstone {
        r.finish()?;
        return Ok((
            true,
            KeyValue {
                key,
                mod_revision,
                ..KeyValue::default()
            },
        ));
    }
    Ok((
        false,
        KeyValue {
            key,
            create_revision: r.ivarint()?,
            version: r.ivarint()?,
            lease: r.ivarint()?,
            value: r.rest(),
            mod_revision,
        },
    ))
}

fn kv_header(r: &mut Reader<'_>) -> Result<bool, DecodeError> {
    let version = r.u8()?;
    if version != KV_FORMAT_VERSION {
        return Err(DecodeError::Version(version));
    }
    Ok(r.flags(KV_TOMBSTONE)? & KV_TOMBSTONE != 0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn varint_edges_roundtrip_and_reject_overlong() {
        for v in [0u64, 1, 127, 128, 300, u64::MAX / 2, u64::MAX] {
            let mut out = Vec::new();
            put_uvarint(&mut out, v);
            let mut r = Reader::borrowed(&out);
            assert_eq!(r.uvarint().unwrap(), v);
            assert_eq!(r.remaining(), 0);
        }
        for v in [0i64, -1, 1, i64::MIN, i64::MAX] {
            let mut out = Vec::new();
            put_ivarint(&mut out, v);
            assert_eq!(Reader::borrowed(&out).ivarint().unwrap(), v);
        }
        // 0 encoded in two bytes is overlong.
        assert!(Reader::borrowed(&[0x80, 0x00]).uvarint().is_err());
        // 11 continuation bytes overflow.
        assert!(Reader::borrowed(&[0xff; 11]).uvarint().is_err());
        assert!(
            Reader::borrowed(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02])
                .uvarint()
                .is_err()
        );
    }

    /// A 1 MiB value is encoded into a buffer sized once for it (grown
    /// push by push, the varint after the value doubled it to 2 MiB), in a
    /// put and in a txn, and decodes back.
    #[test]
    fn a_large_value_is_encoded_without_doubling_the_buffer() {
        let put = PutRequest {
            key: Bytes::from_static(b"/registry/configmaps/big"),
            value: Bytes::from(vec![7u8; 1 << 20]),
            lease: i64::MAX,
            prev_kv: true,
            ignore_value: false,
            ignore_lease: false,
        };
        let txn = TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal,
                target: CompareTarget::Mod,
                key: put.key.clone(),
                range_end: Bytes::new(),
                target_union: TargetUnion::ModRevision(i64::MIN),
            }],
            success: vec![RequestOp::Put(put.clone())],
            failure: vec![RequestOp::Range(RangeRequest {
                key: put.key.clone(),
                limit: i64::MIN,
                revision: i64::MIN,
                ..RangeRequest::default()
            })],
        };
        for req in [Request::Put(put), Request::Txn(txn)] {
            let mut out = Vec::new();
            encode(&req, &mut out);
            assert!(out.capacity() <= size_bound(&req), "{req:?}");
            assert!(out.capacity() < out.len() + 4096, "{}", out.capacity());
            assert_eq!(decode(&out).unwrap(), req);
        }
    }

    #[test]
    fn kv_roundtrip() {
        let kv = KeyValue {
            key: Bytes::from_static(b"k"),
            create_revision: 3,
            mod_revision: 9,
            version: 2,
            value: Bytes::from_static(b"value"),
            lease: -5,
        };
        let mut out = Vec::new();
        encode_kv(&mut out, &kv, false);
        let buf = Bytes::from(out);
        assert_eq!(decode_kv(&buf, 9).unwrap(), (false, kv.clone()));
        assert_eq!(decode_kv_key(&buf).unwrap(), (false, &b"k"[..]));

        let mut out = Vec::new();
        encode_kv(&mut out, &kv, true);
        let buf = Bytes::from(out);
        let (tomb, got) = decode_kv(&buf, 11).unwrap();
        assert!(tomb);
        assert_eq!(got.key, kv.key);
        assert_eq!(got.mod_revision, 11);
        assert!(decode_kv(&Bytes::from_static(&[2, 0]), 1).is_err());
    }

    #[test]
    fn too_deep_txn_is_rejected() {
        let mut t = TxnRequest::default();
        for _ in 0..MAX_TXN_DEPTH {
            t = TxnRequest {
                success: vec![RequestOp::Txn(t)],
                ..TxnRequest::default()
            };
        }
        let mut out = Vec::new();
        encode(&Request::Txn(t.clone()), &mut out);
        assert_eq!(decode(&out).unwrap_err(), DecodeError::TooDeep);
        // One level less is fine.
        let RequestOp::Txn(inner) = t.success.pop().unwrap() else {
            unreachable!()
        };
        let mut out = Vec::new();
        encode(&Request::Txn(inner.clone()), &mut out);
        assert_eq!(decode(&out).unwrap(), Request::Txn(inner));
    }
}
