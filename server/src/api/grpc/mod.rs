//! etcd's v3 gRPC API (`--listen-client-urls`), served on the shard
//! executors: generated wire types (`pb`), conversions to MVCC's types
//! (`convert`), the services (`service`), HTTP/2 serving (`serve`) and
//! etcd's require-leader contract for clients that ask for it
//! (`require_leader`), and etcd's JSON gateway routes (`gateway`).

pub mod chunked_range;
pub mod convert;
pub mod gateway;
pub mod go_json;
pub mod metrics;
pub mod pb;
pub mod recipes;
pub mod require_leader;
pub mod serve;
pub mod service;
