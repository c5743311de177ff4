#![allow(clippy::unwrap_used)]

mod crash;
mod http_api;
mod mvcc_model;
mod recovery;
mod support;
