//! metcd server: shard executors, the Raft group, MVCC and the APIs.
//!
//! Runtime-free parts (`mvcc`, `raftlog`, `compactor`, `config`) never
//! import glommio, so a simulation can drive them; `node` (the Raft loop),
//! `api` and `shard` are the only modules that touch the runtime.

pub mod alarm;
pub mod alloc;
pub mod api;
pub mod auth;
pub mod backup;
pub mod bolt;
pub mod compactor;
pub mod config;
pub mod error;
pub mod etcd_db;
#[doc(hidden)]
pub mod fuzzing;
pub mod ids;
pub mod jwt;
pub mod lease;
pub mod members;
pub mod metrics;
pub mod mvcc;
pub mod node;
pub mod notify;
pub mod peer;
pub mod raftlog;
pub mod shard;
pub mod tls;
pub mod watch;

/// The etcd API version we are compatible with (reported by `/version`).
pub const ETCD_API_VERSION: &str = "3.5.13";
/// The etcd cluster version we report.
pub const ETCD_CLUSTER_VERSION: &str = "3.5.0";
