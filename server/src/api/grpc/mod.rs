//! etcd's v3 gRPC API (`--listen-client-urls`), served on the shard
//! executors: generated wire types (`pb`), conversions to MVCC's types
//! (`convert`), the services (`service`) and HTTP/2 serving (`serve`).

pub mod convert;
pub mod pb;
pub mod serve;
pub mod service;
