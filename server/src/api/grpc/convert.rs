//! Conversions between etcd's protobuf messages (`pb`) and MVCC's plain
//! types. Pure data mapping: no rules live here except rejecting enum values
//! etcd does not define (etcd's server rejects them the same way).

use bytes::Bytes;
use tonic::Status;

use super::pb::etcdserverpb as pb;
use super::pb::mvccpb;
use crate::mvcc;

fn bytes(v: impl Into<Bytes>) -> Bytes {
    v.into()
}

fn bad_enum(what: &str, n: i32) -> Status {
    Status::invalid_argument(format!("etcdserver: invalid {what} {n}"))
}

pub fn range_request(r: pb::RangeRequest) -> Result<mvcc::RangeRequest, Status> {
    Ok(mvcc::RangeRequest {
        key: bytes(r.key),
        range_end: bytes(r.range_end),
        limit: r.limit,
        revision: r.revision,
        sort_order: mvcc::SortOrder::from_i32(r.sort_order)
            .ok_or_else(|| bad_enum("sort order", r.sort_order))?,
        sort_target: mvcc::SortTarget::from_i32(r.sort_target)
            .ok_or_else(|| bad_enum("sort target", r.sort_target))?,
        serializable: r.serializable,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    })
}

pub fn put_request(r: pb::PutRequest) -> mvcc::PutRequest {
    mvcc::PutRequest {
        key: bytes(r.key),
        value: bytes(r.value),
        lease: r.lease,
        prev_kv: r.prev_kv,
        ignore_value: r.ignore_value,
        ignore_lease: r.ignore_lease,
    }
}

pub fn delete_request(r: pb::DeleteRangeRequest) -> mvcc::DeleteRangeRequest {
    mvcc::DeleteRangeRequest {
        key: bytes(r.key),
        range_end: bytes(r.range_end),
        prev_kv: r.prev_kv,
    }
}

fn compare(c: pb::Compare) -> Result<mvcc::Compare, Status> {
    use pb::compare::TargetUnion as P;
    let target_union = match c.target_union {
        Some(P::Version(v)) => mvcc::TargetUnion::Version(v),
        Some(P::CreateRevision(v)) => mvcc::TargetUnion::CreateRevision(v),
        Some(P::ModRevision(v)) => mvcc::TargetUnion::ModRevision(v),
        Some(P::Value(v)) => mvcc::TargetUnion::Value(bytes(v)),
        Some(P::Lease(v)) => mvcc::TargetUnion::Lease(v),
        // proto3 drops a zero oneof member's presence only when unset: an
        // absent union compares against the target's zero value.
        None => match c.target {
            3 => mvcc::TargetUnion::Value(Bytes::new()),
            1 => mvcc::TargetUnion::CreateRevision(0),
            2 => mvcc::TargetUnion::ModRevision(0),
            4 => mvcc::TargetUnion::Lease(0),
            _ => mvcc::TargetUnion::Version(0),
        },
    };
    Ok(mvcc::Compare {
        result: mvcc::CompareResult::from_i32(c.result)
            .ok_or_else(|| bad_enum("compare result", c.result))?,
        target: mvcc::CompareTarget::from_i32(c.target)
            .ok_or_else(|| bad_enum("compare target", c.target))?,
        key: bytes(c.key),
        range_end: bytes(c.range_end),
        target_union,
    })
}

fn request_op(op: pb::RequestOp) -> Result<mvcc::RequestOp, Status> {
    use pb::request_op::Request as P;
    Ok(match op.request {
        Some(P::RequestRange(r)) => mvcc::RequestOp::Range(range_request(r)?),
        Some(P::RequestPut(r)) => mvcc::RequestOp::Put(put_request(r)),
        Some(P::RequestDeleteRange(r)) => mvcc::RequestOp::DeleteRange(delete_request(r)),
        Some(P::RequestTxn(r)) => mvcc::RequestOp::Txn(txn_request(r)?),
        None => {
            return Err(Status::invalid_argument(
                "etcdserver: request op has no request",
            ))
        }
    })
}

pub fn txn_request(t: pb::TxnRequest) -> Result<mvcc::TxnRequest, Status> {
    Ok(mvcc::TxnRequest {
        compare: t
            .compare
            .into_iter()
            .map(compare)
            .collect::<Result<_, _>>()?,
        success: t
            .success
            .into_iter()
            .map(request_op)
            .collect::<Result<_, _>>()?,
        failure: t
            .failure
            .into_iter()
            .map(request_op)
            .collect::<Result<_, _>>()?,
    })
}

pub fn key_value(kv: mvcc::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value,
        lease: kv.lease,
    }
}

/// The parts of etcd's `ResponseHeader` the member knows.
#[derive(Debug, Clone, Copy)]
pub struct HeaderInfo {
    pub cluster_id: u64,
    pub member_id: u64,
    pub raft_term: u64,
}

impl HeaderInfo {
    pub fn header(&self, revision: i64) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: self.raft_term,
        })
    }
}

pub fn range_response(r: mvcc::RangeResponse, h: &HeaderInfo) -> pb::RangeResponse {
    pb::RangeResponse {
        header: h.header(r.header.revision),
        kvs: r.kvs.into_iter().map(key_value).collect(),
        more: r.more,
        count: r.count,
    }
}

pub fn put_response(r: mvcc::PutResponse, h: &HeaderInfo) -> pb::PutResponse {
    pb::PutResponse {
        header: h.header(r.header.revision),
        prev_kv: r.prev_kv.map(key_value),
    }
}

pub fn delete_response(r: mvcc::DeleteRangeResponse, h: &HeaderInfo) -> pb::DeleteRangeResponse {
    pb::DeleteRangeResponse {
        header: h.header(r.header.revision),
        deleted: r.deleted,
        prev_kvs: r.prev_kvs.into_iter().map(key_value).collect(),
    }
}

pub fn txn_response(r: mvcc::TxnResponse, h: &HeaderInfo) -> pb::TxnResponse {
    pb::TxnResponse {
        header: h.header(r.header.revision),
        succeeded: r.succeeded,
        responses: r.responses.into_iter().map(response_op).collect(),
    }
}

/// Responses nested in a txn carry etcd's quirk: their header holds only
/// the revision MVCC gave them (no cluster, member or term).
fn response_op(op: mvcc::ResponseOp) -> pb::ResponseOp {
    use pb::response_op::Response as P;
    let nested = HeaderInfo {
        cluster_id: 0,
        member_id: 0,
        raft_term: 0,
    };
    let response = match op {
        mvcc::ResponseOp::Range(r) => P::ResponseRange(range_response(r, &nested)),
        mvcc::ResponseOp::Put(r) => P::ResponsePut(put_response(r, &nested)),
        mvcc::ResponseOp::DeleteRange(r) => P::ResponseDeleteRange(delete_response(r, &nested)),
        mvcc::ResponseOp::Txn(r) => P::ResponseTxn(txn_response(r, &nested)),
    };
    pb::ResponseOp {
        response: Some(response),
    }
}
