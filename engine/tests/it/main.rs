//! Integration tests for the engine crate.
#![allow(clippy::unwrap_used)]

mod common;
mod concurrency;
mod gc;
mod memory;
mod model;
mod size;
mod snapfile;
mod wal;
