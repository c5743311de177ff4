#![allow(clippy::unwrap_used)]

mod auth;
mod client_tls;
mod client_url_http;
mod cluster;
mod cpus;
mod crash;
mod engines;
mod etcd_client;
mod etcd_peer;
mod etcdctl;
mod expensive_ranges;
mod go_clientv3;
mod http_api;
mod index_checkpoint;
mod lease_restart;
mod mvcc_model;
mod operator;
mod python_clients;
mod quota;
mod recipes;
mod recovery;
mod restart_memory;
mod slow_watcher;
mod snapshot_save;
mod support;
mod watch_etcdctl;
