//! metcd's fault suite (issue 19): concurrent etcd clients against a real
//! three-member cluster while members are killed, paused and partitioned;
//! their history is checked for linearizability and etcd's watch
//! guarantees.
//!
//! - [`history`]: what the clients did and saw (plain data);
//! - [`check`]: every check on a history, with evidence;
//! - [`linearizable`]: the per-key register search the checks use;
//! - [`cluster`]: the `metcd` processes and the faults done to them;
//! - [`workload`]: clients, watchers, faults and convergence, on tokio.
//!
//! A client of the v3 API like `bench`: nothing here knows `server`
//! internals, so the same suite can run against etcd.
//!
//! ```
//! use robust::check::{check, Options};
//! use robust::history::{History, Op, Outcome, Request, Response};
//!
//! // One client put v1 and read it back; no watcher recorded anything, so
//! // the acknowledged put is missing from the log: a lost write.
//! let put = Op {
//!     client: 0, member: 0, incarnation: 0, invoke: 0, ret: 10,
//!     request: Request::Put { key: "key/00".into(), value: 1, lease: 0 },
//!     outcome: Outcome::Ok(Response::Put { revision: 2 }),
//! };
//! let history = History { ops: vec![put], ..History::default() };
//! let report = check(&history, &Options::default());
//! assert!(report.anomalies.iter().any(|a| a.check == "revision-beyond-log"));
//! ```

pub mod check;
pub mod cluster;
pub mod history;
pub mod linearizable;
pub mod workload;
