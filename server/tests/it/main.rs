#![allow(clippy::unwrap_used)]

mod crash;
mod http_api;
mod support;
