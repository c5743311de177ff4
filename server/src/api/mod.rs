//! Client-facing APIs. `error` is the one place errors meet the wire.

pub mod error;
pub mod grpc;
pub mod http;
pub mod hyper_io;
