//! metcd server: shard executors, the Raft group, MVCC and the APIs.
//!
//! Runtime-free parts (`mvcc`, `raftlog`, `ready`, `read_index`, `compactor`, `config`)
//! never import glommio, so the deterministic simulation (`sim`) drives
//! them; `node` (the Raft loop), `api` and `shard` are the only modules
//! that touch the runtime.

pub mod alarm;
pub mod alloc;
pub mod api;
pub mod apply;
pub mod auth;
pub mod backup;
pub mod bolt;
pub mod compactor;
pub mod config;
pub(crate) mod der;
pub mod error;
pub mod etcd_config_file;
pub mod etcd_db;
pub mod flag_docs;
#[doc(hidden)]
pub mod fuzzing;
pub mod groups;
pub mod ids;
pub mod index_file;
pub mod jwt;
pub mod lease;
pub mod members;
pub mod metrics;
pub mod mvcc;
pub mod net;
pub mod node;
pub mod notify;
pub mod owner;
pub mod peer;
pub mod raftlog;
pub mod read_index;
pub mod read_view;
pub mod ready;
pub mod sched;
pub mod shard;
#[doc(hidden)]
pub mod sim;
pub mod stop;
pub mod tls;
pub mod watch;

/// The etcd API version we are compatible with (reported by `/version`).
pub const ETCD_API_VERSION: &str = "3.5.13";
/// `metcd --version`, in the shape of etcd's (`etcd Version: ...`, `Git
/// SHA: ...`, `Go Version: ...`, `Go OS/Arch: ...`).
pub fn version_text() -> String {
    format!(
        "metcd Version: {}\netcd API Version: {}\nGit SHA: {}\nRust Version: {}\nRust OS/Arch: {}/{}\n",
        env!("CARGO_PKG_VERSION"),
        ETCD_API_VERSION,
        env!("METCD_GIT_SHA"),
        env!("METCD_RUSTC_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH,
    )
}

/// The etcd cluster version we report.
pub const ETCD_CLUSTER_VERSION: &str = "3.5.0";
