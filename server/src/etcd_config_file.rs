//! etcd's YAML configuration file (`--config-file`), read into a
//! [`Config`] so that an operator's etcd config file starts metcd
//! unchanged. As in etcd, a config file replaces the command line: the
//! other flags are not read.
//!
//! Keys are etcd 3.4's (embed/config.go). Those metcd has are taken; those
//! that only tune etcd's own logging, profiling or v2 API are noted on
//! stderr and ignored; those that would change where data lives or how
//! safely it is written (`wal-dir`, `unsafe-no-fsync`, ...) refuse the
//! start, since ignoring them would be a surprise. Unknown keys are
//! ignored, as etcd's YAML reader ignores them.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::{Config, ConfigError};
use crate::flag_docs::{ETCD_ONLY, ETCD_REFUSED};

/// `client-transport-security` / `peer-transport-security`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
struct Security {
    cert_file: String,
    key_file: String,
    client_cert_auth: bool,
    trusted_ca_file: String,
    auto_tls: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
struct EtcdYaml {
    name: Option<String>,
    data_dir: Option<String>,
    listen_peer_urls: Option<String>,
    listen_client_urls: Option<String>,
    listen_metrics_urls: Option<String>,
    initial_advertise_peer_urls: Option<String>,
    advertise_client_urls: Option<String>,
    initial_cluster: Option<String>,
    initial_cluster_token: Option<String>,
    initial_cluster_state: Option<String>,
    snapshot_count: Option<u64>,
    heartbeat_interval: Option<u64>,
    election_timeout: Option<u64>,
    quota_backend_bytes: Option<i64>,
    max_txn_ops: Option<usize>,
    max_request_bytes: Option<usize>,
    max_concurrent_streams: Option<u32>,
    auto_compaction_mode: Option<String>,
    metrics: Option<String>,
    auto_compaction_retention: Option<String>,
    strict_reconfig_check: Option<bool>,
    auth_token: Option<String>,
    auth_token_ttl: Option<u64>,
    bcrypt_cost: Option<u32>,
    experimental_initial_corrupt_check: Option<bool>,
    /// Go durations travel as nanoseconds in etcd's YAML.
    experimental_corrupt_check_time: Option<u64>,
    experimental_enable_lease_checkpoint: Option<bool>,
    experimental_watch_progress_notify_interval: Option<u64>,
    client_transport_security: Option<Security>,
    peer_transport_security: Option<Security>,
    /// metcd's own: the seed's curl API (off unless the file names it).
    listen_http_urls: Option<String>,
    cipher_suites: Option<Vec<String>>,
    #[serde(flatten)]
    rest: std::collections::BTreeMap<String, serde_yaml::Value>,
}

fn nanos(value: u64) -> String {
    format!("{}ms", value / 1_000_000)
}

fn path(value: String) -> Option<PathBuf> {
    (!value.is_empty()).then(|| PathBuf::from(value))
}

/// Reads an etcd config file into a [`Config`] (defaults for what it
/// does not say).
pub fn load(file: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
        path: file.to_path_buf(),
        source,
    })?;
    let parse = |message: String| ConfigError::Parse {
        path: file.to_path_buf(),
        message,
    };
    let mut y: EtcdYaml = serde_yaml::from_str(&text).map_err(|e| parse(e.to_string()))?;
    let mut cfg = Config::default();
    for (key, value) in &y.rest {
        let unused = match value {
            serde_yaml::Value::Null => true,
            serde_yaml::Value::Bool(on) => !on,
            serde_yaml::Value::String(s) => crate::flag_docs::is_unused_value(s),
            _ => false,
        };
        if ETCD_REFUSED.contains(&key.as_str()) && !unused {
            return Err(parse(format!(
                "{key} is not supported by metcd; remove it to start (see docs/operations.md)"
            )));
        }
        if ETCD_ONLY.iter().any(|(only, _)| only == key) {
            eprintln!(
                "metcd: --config-file {}: ignoring {key} (etcd's own)",
                file.display()
            );
        }
    }
    crate::config::overlay!(
        cfg,
        y,
        name,
        listen_client_urls,
        listen_metrics_urls,
        initial_advertise_peer_urls,
        initial_cluster,
        initial_cluster_token,
        initial_cluster_state,
        snapshot_count,
        heartbeat_interval,
        election_timeout,
        quota_backend_bytes,
        max_txn_ops,
        max_request_bytes,
        max_concurrent_streams,
        auto_compaction_mode,
        auto_compaction_retention,
        metrics,
        strict_reconfig_check,
        auth_token,
        auth_token_ttl,
        bcrypt_cost,
        experimental_initial_corrupt_check,
        experimental_enable_lease_checkpoint,
    );
    cfg.data_dir = y.data_dir.and_then(path);
    cfg.listen_peer_urls = y.listen_peer_urls;
    cfg.advertise_client_urls = y.advertise_client_urls;
    if let Some(suites) = y.cipher_suites {
        cfg.cipher_suites = suites.join(",");
    }
    if let Some(ns) = y.experimental_corrupt_check_time {
        cfg.experimental_corrupt_check_time = nanos(ns);
    }
    if let Some(ns) = y.experimental_watch_progress_notify_interval {
        cfg.experimental_watch_progress_notify_interval = nanos(ns);
    }
    // No seed HTTP API unless the file asks for it (`listen-http-urls`,
    // metcd's own key): an etcd config file describes etcd's ports only,
    // and several members on one host would all want 3379.
    cfg.listen_http_urls = y.listen_http_urls.unwrap_or_default();
    if let Some(s) = y.client_transport_security {
        cfg.auto_tls = s.auto_tls;
        cfg.cert_file = path(s.cert_file);
        cfg.key_file = path(s.key_file);
        cfg.trusted_ca_file = path(s.trusted_ca_file);
        cfg.client_cert_auth = s.client_cert_auth;
    }
    if let Some(s) = y.peer_transport_security {
        cfg.peer_auto_tls = s.auto_tls;
        cfg.peer_cert_file = path(s.cert_file);
        cfg.peer_key_file = path(s.key_file);
        cfg.peer_trusted_ca_file = path(s.trusted_ca_file);
        cfg.peer_client_cert_auth = s.client_cert_auth;
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn load_text(text: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("etcd.yaml");
        std::fs::write(&file, text).unwrap();
        load(&file)
    }

    #[test]
    fn etcds_keys_become_the_config() {
        let cfg = load_text(
            "name: infra1\ndata-dir: infra1.etcd\nlisten-client-urls: http://127.0.0.1:2379\n\
             snapshot-count: 500\nheartbeat-interval: 50\nelection-timeout: 500\n\
             strict-reconfig-check: false\nlogger: zap\nlog-level: info\n\
             experimental-watch-progress-notify-interval: 5000000000\n\
             client-transport-security:\n  cert-file: s.pem\n  key-file: k.pem\n  client-cert-auth: true\n  trusted-ca-file: ca.pem\n\
             some-future-key: 1\n",
        )
        .unwrap();
        assert_eq!(cfg.name, "infra1");
        assert_eq!(cfg.data_dir, Some(PathBuf::from("infra1.etcd")));
        assert_eq!(
            (
                cfg.snapshot_count,
                cfg.heartbeat_interval,
                cfg.election_timeout
            ),
            (500, 50, 500)
        );
        assert!(!cfg.strict_reconfig_check);
        assert_eq!(cfg.experimental_watch_progress_notify_interval, "5000ms");
        assert_eq!(cfg.cert_file, Some(PathBuf::from("s.pem")));
        assert!(cfg.client_cert_auth);
        assert_eq!(cfg.listen_http_urls, "");
    }

    #[test]
    fn a_config_file_written_from_etcds_sample_is_taken() {
        let text = include_str!("../tests/fixtures/etcd-3.4-style.conf.yml");
        let cfg = load_text(text).unwrap();
        assert_eq!(cfg.name, "default");
        assert_eq!(cfg.listen_client_urls, "http://localhost:2379");
        assert_eq!(cfg.initial_advertise_peer_urls, "http://localhost:2380");
        assert!(!cfg.strict_reconfig_check);
        assert_eq!(cfg.cert_file, None);
        // Unused refused keys are fine; used ones are not.
        for used in [
            "force-new-cluster: true",
            "proxy: 'on'",
            "discovery: https://d/x",
        ] {
            let err = load_text(&format!("name: a\n{used}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("is not supported"), "{used}: {err}");
        }
    }

    #[test]
    fn keys_metcd_cannot_honour_refuse_the_start() {
        let err = load_text("name: a\nwal-dir: /wal\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("wal-dir is not supported"), "{err}");
        let err = load_text("name: [\n").unwrap_err().to_string();
        assert!(err.contains("config file"), "{err}");
    }
}
