//! Plain Rust mirrors of etcd v3's KV protobuf messages (`etcdserverpb` and
//! `mvccpb`), plus the MVCC apply outcome (changes for watchers).
//!
//! Field names follow etcd's `.proto` files so the API layer can map them
//! one-to-one. Keys and values are [`Bytes`]; revisions, versions and lease
//! IDs are `i64` like etcd. These types own no behaviour beyond trivial
//! accessors: the rules live in [`super::store`], the wire format of the
//! Raft log in [`super::codec`].
//!
//! Enum discriminants are etcd's protobuf numbers (`as_i32`/`from_i32`), so
//! a gRPC or JSON gateway can convert without a lookup table of its own.

use bytes::Bytes;

/// `mvccpb.KeyValue`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValue {
    pub key: Bytes,
    /// Revision of the put that created the key's current generation.
    pub create_revision: i64,
    /// Revision of the last modification.
    pub mod_revision: i64,
    /// Number of puts since the generation was created (1 on create).
    pub version: i64,
    pub value: Bytes,
    /// Lease ID attached to the key, 0 for none.
    pub lease: i64,
}

/// `RangeRequest.SortOrder`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum SortOrder {
    #[default]
    None = 0,
    Ascend = 1,
    Descend = 2,
}

/// `RangeRequest.SortTarget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum SortTarget {
    #[default]
    Key = 0,
    Version = 1,
    Create = 2,
    Mod = 3,
    Value = 4,
}

/// `Compare.CompareResult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum CompareResult {
    #[default]
    Equal = 0,
    Greater = 1,
    Less = 2,
    NotEqual = 3,
}

/// `Compare.CompareTarget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum CompareTarget {
    #[default]
    Version = 0,
    Create = 1,
    Mod = 2,
    Value = 3,
    Lease = 4,
}

macro_rules! proto_enum {
    ($ty:ident { $($variant:ident = $n:literal),* $(,)? }) => {
        impl $ty {
            /// The etcd protobuf number of this value.
            pub fn as_i32(self) -> i32 {
                self as i32
            }

            /// The value for an etcd protobuf number, `None` if unknown.
            pub fn from_i32(n: i32) -> Option<Self> {
                match n {
                    $($n => Some($ty::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

proto_enum!(SortOrder { None = 0, Ascend = 1, Descend = 2 });
proto_enum!(SortTarget { Key = 0, Version = 1, Create = 2, Mod = 3, Value = 4 });
proto_enum!(CompareResult { Equal = 0, Greater = 1, Less = 2, NotEqual = 3 });
proto_enum!(CompareTarget { Version = 0, Create = 1, Mod = 2, Value = 3, Lease = 4 });

/// `ResponseHeader`, reduced to what MVCC knows; the API layer adds
/// `cluster_id`, `member_id` and `raft_term`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResponseHeader {
    /// The store revision when the request completed.
    pub revision: i64,
}

/// The smallest key after `key`: `key` with a zero byte appended. A range
/// `[key, key_after(key))` holds exactly `key`; a paged scan resumes there.
pub fn key_after(key: &[u8]) -> Vec<u8> {
    let mut next = Vec::with_capacity(key.len() + 1);
    next.extend_from_slice(key);
    next.push(0);
    next
}

/// `RangeRequest`.
///
/// Key range rules (etcd's): `range_end` empty means the single key `key`;
/// `range_end == b"\0"` means every key `>= key`; otherwise `[key, range_end)`,
/// which is empty when `range_end <= key`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeRequest {
    pub key: Bytes,
    pub range_end: Bytes,
    /// Maximum number of keys returned; `<= 0` means no limit.
    pub limit: i64,
    /// Revision to read at; `<= 0` means the current revision.
    pub revision: i64,
    pub sort_order: SortOrder,
    pub sort_target: SortTarget,
    /// Served by the local member without a quorum read (API layer concern).
    pub serializable: bool,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: i64,
    pub max_mod_revision: i64,
    pub min_create_revision: i64,
    pub max_create_revision: i64,
}

/// `RangeResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeResponse {
    pub header: ResponseHeader,
    pub kvs: Vec<KeyValue>,
    /// More keys match than `limit` allowed to return.
    pub more: bool,
    /// Number of keys in the range at the read revision (ignores `limit` and
    /// the min/max revision filters, like etcd).
    pub count: i64,
}

/// `PutRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PutRequest {
    pub key: Bytes,
    pub value: Bytes,
    pub lease: i64,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

/// `PutResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PutResponse {
    pub header: ResponseHeader,
    pub prev_kv: Option<KeyValue>,
}

/// `DeleteRangeRequest` (same key range rules as [`RangeRequest`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeleteRangeRequest {
    pub key: Bytes,
    pub range_end: Bytes,
    pub prev_kv: bool,
}

/// `DeleteRangeResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeleteRangeResponse {
    pub header: ResponseHeader,
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

/// `Compare.target_union`.
///
/// Like etcd, the union is independent of [`Compare::target`]: when its
/// variant does not match the target, the comparison uses zero (or the empty
/// value), exactly as etcd's `compareKV` does with an unset oneof.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetUnion {
    Version(i64),
    CreateRevision(i64),
    ModRevision(i64),
    Value(Bytes),
    Lease(i64),
}

impl Default for TargetUnion {
    fn default() -> Self {
        TargetUnion::Version(0)
    }
}

/// `Compare`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Compare {
    pub result: CompareResult,
    pub target: CompareTarget,
    pub key: Bytes,
    pub range_end: Bytes,
    pub target_union: TargetUnion,
}

/// `RequestOp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOp {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
}

/// `ResponseOp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseOp {
    Range(RangeResponse),
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
}

/// `TxnRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

/// `TxnResponse`.
///
/// As in etcd, the header of a *nested* txn response has revision 0 (etcd
/// never fills it); the top-level one carries the store revision.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnResponse {
    pub header: ResponseHeader,
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
}

/// `CompactionRequest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompactionRequest {
    pub revision: i64,
    /// The client waits for the physical deletion; MVCC always compacts
    /// physically within the same apply, so this only matters to the API.
    pub physical: bool,
}

/// `CompactionResponse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompactionResponse {
    pub header: ResponseHeader,
}

/// A write request that goes through the Raft log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
    Compaction(CompactionRequest),
}

/// The response to a [`Request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compaction(CompactionResponse),
}

impl Response {
    pub fn header(&self) -> &ResponseHeader {
        match self {
            Response::Put(r) => &r.header,
            Response::DeleteRange(r) => &r.header,
            Response::Txn(r) => &r.header,
            Response::Compaction(r) => &r.header,
        }
    }
}

/// `mvccpb.Event.EventType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    Put = 0,
    Delete = 1,
}

/// One change made by an applied request, as a watcher sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// For a put, the new KeyValue. For a delete, only `key` and
    /// `mod_revision` (the delete's revision) are set, like etcd.
    pub kv: KeyValue,
    /// What an etcd watcher with `prev_kv` would get: the key's value at
    /// revision `kv.mod_revision - 1` (before the whole request), and `None`
    /// for a create (`create_revision == mod_revision`) or a key absent then.
    pub prev_kv: Option<KeyValue>,
    /// The put did not read the key's previous value (no watcher wanted
    /// `prev_kv` when it was applied, and the request did not need it):
    /// `prev_kv` is `None` without meaning "no previous value". A watcher
    /// that wants `prev_kv` re-reads such an event from history.
    pub prev_kv_unread: bool,
}

/// What [`super::MvccStore::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyOutcome {
    pub response: Response,
    /// Every change, in order (sub-revision order within the revision).
    pub events: Vec<Event>,
}

/// The result of [`super::MvccStore::hash_kv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HashKv {
    pub hash: u32,
    /// The revision the hash covers.
    pub hash_revision: i64,
    /// The store's current revision.
    pub revision: i64,
    pub compact_revision: i64,
}
