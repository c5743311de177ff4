//! etcd's v3 wire API as Rust types and tonic service stubs, generated at
//! build time (`build.rs`) from `proto/etcd/api/**`.
//!
//! - [`mvccpb`]: `KeyValue`, `Event`.
//! - [`authpb`]: `User`, `Role`, `Permission`, `UserAddOptions`.
//! - [`etcdserverpb`]: every request/response message plus, per service
//!   (KV, Watch, Lease, Cluster, Maintenance, Auth), a server module
//!   (`kv_server::{Kv, KvServer}`, `watch_server::{Watch, WatchServer}`, …:
//!   the trait to implement and the tower service wrapping it) and a client
//!   module (`kv_client::KvClient`, …, over any `tonic::client::GrpcService`;
//!   no tonic transport is compiled in).
//! - [`v3lockpb`], [`v3electionpb`]: the Lock and Election services.
//!
//! The modules must stay siblings: generated code names other packages
//! as `super::mvccpb::…` / `super::authpb::…`.

/// Package `mvccpb`: stored key-values and watch events.
#[allow(clippy::all, clippy::pedantic, clippy::nursery, rustdoc::all)]
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
    include!(concat!(env!("OUT_DIR"), "/mvccpb.serde.rs"));
}

/// Package `authpb`: users, roles and permissions.
#[allow(clippy::all, clippy::pedantic, clippy::nursery, rustdoc::all)]
pub mod authpb {
    tonic::include_proto!("authpb");
    include!(concat!(env!("OUT_DIR"), "/authpb.serde.rs"));
}

/// Package `etcdserverpb`: the client-facing services and their messages.
#[allow(clippy::all, clippy::pedantic, clippy::nursery, rustdoc::all)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.serde.rs"));
}

/// Package `v3lockpb`: the Lock service (etcd's server-side mutex recipe).
#[allow(clippy::all, clippy::pedantic, clippy::nursery, rustdoc::all)]
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
    include!(concat!(env!("OUT_DIR"), "/v3lockpb.serde.rs"));
}

/// Package `v3electionpb`: the Election service (etcd's server-side
/// leader election recipe).
#[allow(clippy::all, clippy::pedantic, clippy::nursery, rustdoc::all)]
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
    include!(concat!(env!("OUT_DIR"), "/v3electionpb.serde.rs"));
}

#[cfg(test)]
mod tests {
    //! Byte-exact encodings written by hand from etcd's field numbers and
    //! wire types, so a wrong field number or scalar type fails here.

    use super::etcdserverpb::{
        compare, range_request, request_op, watch_request, Compare, PutRequest, PutResponse,
        RangeRequest, RequestOp, ResponseHeader, WatchCreateRequest, WatchRequest,
    };
    use super::mvccpb::KeyValue;
    use prost::Message;

    /// Encodes `msg`, checks the bytes, and checks that decoding `expected`
    /// gives `msg` back.
    fn assert_wire<M: Message + Default + PartialEq + std::fmt::Debug>(msg: &M, expected: &[u8]) {
        assert_eq!(msg.encode_to_vec(), expected, "encoding of {msg:?}");
        let decoded = M::decode(expected);
        assert_eq!(decoded.as_ref(), Ok(msg), "decoding into {msg:?}");
    }

    #[test]
    fn put_request_matches_etcd_field_numbers() {
        let put = PutRequest {
            key: bytes::Bytes::from_static(b"foo"),
            value: bytes::Bytes::from_static(b"bar"),
            lease: 5,
            prev_kv: true,
            ..Default::default()
        };
        #[rustfmt::skip]
        let expected = [
            0x0a, 3, b'f', b'o', b'o', // 1 key: bytes
            0x12, 3, b'b', b'a', b'r', // 2 value: bytes
            0x18, 5,                   // 3 lease: int64
            0x20, 1,                   // 4 prev_kv: bool
        ];
        assert_wire(&put, &expected);

        let put = PutRequest {
            key: bytes::Bytes::from_static(b"k"),
            ignore_value: true,
            ignore_lease: true,
            ..Default::default()
        };
        #[rustfmt::skip]
        let expected = [
            0x0a, 1, b'k', // 1 key
            0x28, 1,       // 5 ignore_value: bool
            0x30, 1,       // 6 ignore_lease: bool
        ];
        assert_wire(&put, &expected);
    }

    #[test]
    fn range_request_matches_etcd_field_numbers() {
        let range = RangeRequest {
            key: bytes::Bytes::from_static(b"a"),
            range_end: bytes::Bytes::from_static(b"b"),
            limit: 10,
            revision: 300,
            sort_order: range_request::SortOrder::Descend as i32,
            sort_target: range_request::SortTarget::Mod as i32,
            serializable: true,
            keys_only: true,
            count_only: true,
            min_mod_revision: 11,
            max_mod_revision: 12,
            min_create_revision: 13,
            max_create_revision: -1,
        };
        #[rustfmt::skip]
        let expected = [
            0x0a, 1, b'a',   // 1 key: bytes
            0x12, 1, b'b',   // 2 range_end: bytes
            0x18, 10,        // 3 limit: int64
            0x20, 0xac, 0x02, // 4 revision: int64 (300 as varint)
            0x28, 2,         // 5 sort_order: DESCEND
            0x30, 3,         // 6 sort_target: MOD
            0x38, 1,         // 7 serializable
            0x40, 1,         // 8 keys_only
            0x48, 1,         // 9 count_only
            0x50, 11,        // 10 min_mod_revision
            0x58, 12,        // 11 max_mod_revision
            0x60, 13,        // 12 min_create_revision
            // 13 max_create_revision: int64 -1 is a 10-byte varint (not zigzag)
            0x68, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert_wire(&range, &expected);
    }

    #[test]
    fn txn_compare_and_oneofs_match_etcd_field_numbers() {
        let cmp = Compare {
            result: compare::CompareResult::NotEqual as i32,
            target: compare::CompareTarget::Value as i32,
            key: bytes::Bytes::from_static(b"k"),
            range_end: bytes::Bytes::from_static(b"z"),
            target_union: Some(compare::TargetUnion::Value(bytes::Bytes::from_static(b"v"))),
        };
        let encoded = cmp.encode_to_vec();
        #[rustfmt::skip]
        let head = [
            0x08, 3,         // 1 result: NOT_EQUAL
            0x10, 3,         // 2 target: VALUE
            0x1a, 1, b'k',   // 3 key
        ];
        let value = [0x3a, 1, b'v']; // 7 value (oneof target_union)
        let range_end = [0x82, 0x04, 1, b'z']; // 64 range_end: two-byte tag
                                               // prost writes the oneof after the plain fields; accept either order
                                               // but require exactly these fields.
        let a = [&head[..], &value[..], &range_end[..]].concat();
        let b = [&head[..], &range_end[..], &value[..]].concat();
        assert!(encoded == a || encoded == b, "{encoded:02x?}");
        assert_eq!(Compare::decode(&a[..]).as_ref(), Ok(&cmp));

        let op = RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: bytes::Bytes::from_static(b"k"),
                ..Default::default()
            })),
        };
        assert_wire(&op, &[0x12, 3, 0x0a, 1, b'k']); // 2 request_put

        let watch = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: bytes::Bytes::from_static(b"k"),
                    prev_kv: true,
                    watch_id: 7,
                    ..Default::default()
                },
            )),
        };
        #[rustfmt::skip]
        assert_wire(&watch, &[
            0x0a, 7,         // 1 create_request
            0x0a, 1, b'k',   //   1 key
            0x30, 1,         //   6 prev_kv
            0x38, 7,         //   7 watch_id
        ]);
    }

    #[test]
    fn cross_package_types_match_etcd_field_numbers() {
        let resp = PutResponse {
            header: Some(ResponseHeader {
                cluster_id: 1,
                member_id: 2,
                revision: 3,
                raft_term: 4,
            }),
            prev_kv: Some(KeyValue {
                key: bytes::Bytes::from_static(b"k"),
                create_revision: 5,
                mod_revision: 6,
                version: 7,
                value: bytes::Bytes::from_static(b"v"),
                lease: 8,
            }),
        };
        #[rustfmt::skip]
        assert_wire(&resp, &[
            0x0a, 8, 0x08, 1, 0x10, 2, 0x18, 3, 0x20, 4,  // 1 header
            0x12, 14,                                     // 2 prev_kv: mvccpb.KeyValue
            0x0a, 1, b'k', 0x10, 5, 0x18, 6, 0x20, 7,
            0x2a, 1, b'v', 0x30, 8,
        ]);
    }
}
