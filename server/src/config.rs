//! Server configuration: etcd-named command-line flags, a TOML file
//! (`--config FILE`, same names as the flags), and embedded defaults.
//!
//! Precedence: defaults < config file < flags given on the command line.
//! This module only parses and validates; it never starts anything.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

pub use crate::net::Endpoint;

/// Default `--max-request-bytes`, as etcd's (1.5 MiB).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// The longest `--auth-token-ttl` taken: 10 years.
const MAX_AUTH_TOKEN_TTL_SECS: u64 = 10 * 365 * 24 * 3600;
/// Default `--max-concurrent-streams`. etcd 3.4 leaves it unlimited; a
/// bound keeps one connection from monopolising a shard.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 4096;
/// etcd's backend quota when `--quota-backend-bytes` is 0 or unset (2 GiB).
pub const DEFAULT_QUOTA_BACKEND_BYTES: u64 = 2 << 30;

/// The CPUs of a taskset-style list (`0-7`, `8,10,12-15`), ascending and
/// without repeats.
pub fn parse_cpu_list(list: &str) -> Result<Vec<usize>, String> {
    let mut cpus = std::collections::BTreeSet::new();
    for part in list.split(',').map(str::trim) {
        let number = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| format!("{s:?} is not a CPU number"))
        };
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => (number(part)?, number(part)?),
        };
        if first > last {
            return Err(format!("{part:?} ends before it starts"));
        }
        if last >= MAX_CPUS {
            return Err(format!(
                "CPU {last} is beyond the {MAX_CPUS} a CPU set holds"
            ));
        }
        cpus.extend(first..=last);
    }
    if cpus.is_empty() {
        return Err("expected at least one CPU".into());
    }
    Ok(cpus.into_iter().collect())
}

/// CPUs a Linux CPU set (`cpu_set_t`) can name.
pub const MAX_CPUS: usize = 1024;

/// Everything a member needs to start.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// Human-readable member name.
    pub name: String,
    /// Where WAL segments and engine files live. Default: `./<name>.metcd`.
    pub data_dir: Option<PathBuf>,
    /// The seed's curl API.
    pub listen_http_urls: String,
    /// The etcd v3 gRPC API, its JSON gateway and etcd's HTTP endpoints.
    pub listen_client_urls: String,
    pub advertise_client_urls: Option<String>,
    /// etcd's `--listen-metrics-urls`: more URLs serving `/metrics` and
    /// `/health` only (empty: none).
    pub listen_metrics_urls: String,
    /// Peer URLs this member advertises; with the cluster token they
    /// determine its member ID, as in etcd.
    pub initial_advertise_peer_urls: String,
    pub initial_cluster_token: String,
    /// `name=peer-url[,name=peer-url...]`, every member of a new cluster
    /// (etcd's flag). Empty: this member alone (`<name>=<advertise peer URLs>`).
    pub initial_cluster: String,
    /// `new` (bootstrap) or `existing` (join a running cluster).
    pub initial_cluster_state: String,
    /// Where peers reach this member. Default: the host:port of
    /// `--initial-advertise-peer-urls`, only when the cluster has peers.
    pub listen_peer_urls: Option<String>,
    /// Most operations in one txn (etcd's `--max-txn-ops`).
    pub max_txn_ops: usize,
    /// Storage engine: `memory`, `btree` or `lsm` (recorded in the data
    /// dir at first start; another engine is refused later).
    pub engine: String,
    /// Block cache of the btree and lsm engines, in bytes. They read with
    /// O_DIRECT, so this is all the memory their reads get: size it like
    /// a database buffer pool (up to the data size).
    pub engine_cache_bytes: usize,
    /// Executor cores; 0 = every CPU of the set but one (at least one).
    pub shards: usize,
    /// The CPUs shards are pinned to, in taskset's list syntax (`0-7`,
    /// `8,10,12-15`); shard i on the i-th. None: the process's inherited
    /// CPU affinity (taskset, systemd's `CPUAffinity=`, a cpuset).
    pub cpus: Option<String>,
    /// Whether the owner shard (shard 0) accepts client connections too.
    /// None: only while there are fewer than 3 shards; with 3 or more its
    /// core runs only the Raft group (propose, WAL, apply, replies).
    pub owner_accepts_clients: Option<bool>,
    /// Applied entries between two snapshots (then WAL segments are released).
    pub snapshot_count: u64,
    pub heartbeat_interval: u64,
    pub election_timeout: u64,
    pub max_request_bytes: usize,
    /// `periodic` or `revision`.
    pub auto_compaction_mode: String,
    /// etcd's `--metrics`: `basic`, or `extensive` to add gRPC handling
    /// time histograms.
    pub metrics: String,
    /// `0` disables; periodic: hours (`1`) or a duration (`30m`, `10s`);
    /// revision: a number of revisions to keep.
    pub auto_compaction_retention: String,
    /// How long the Raft loop waits for more proposals after the first one
    /// before it writes a group commit (0 = take what is queued, no wait).
    pub wal_batch_window_us: u64,
    /// Most proposals in one group commit.
    pub wal_max_batch: usize,
    pub wal_segment_bytes: u64,
    /// Write WAL frames with O_DSYNC (one I/O per group commit) instead of
    /// write + fdatasync. Both are durable; O_DSYNC was faster here.
    pub wal_dsync: bool,
    /// Proposals waiting for the Raft loop beyond this are refused with
    /// "etcdserver: too many requests".
    pub max_pending_proposals: usize,
    /// glommio locked I/O memory per executor. 3 x this x shards must fit in
    /// `ulimit -l` unless the process has CAP_IPC_LOCK (root does).
    pub io_memory_bytes: usize,
    /// How long an idle shard executor spins before it sleeps in the kernel.
    /// Spinning makes a cross-core hop (a request accepted on one shard and
    /// served by the owner) cost microseconds instead of a wake-up, at the
    /// price of CPU burnt while idle. 0 sleeps at once.
    pub spin_before_park_us: u64,
    /// CPU shares of range work (index walks, value loading, response
    /// encoding) against the write path's 1000 on every shard (1..=1000):
    /// while both have work, reads get shares / (shares + 1000) of a core.
    pub range_cpu_shares: usize,
    /// etcd's backend quota: a write that would take the store past it is
    /// refused and raises the NOSPACE alarm. 0 means etcd's default
    /// (2 GiB), a negative value disables the quota.
    pub quota_backend_bytes: i64,
    /// How often watchers that asked for progress notifications get one
    /// (a duration such as `10m`, `5s`; `0s` disables). etcd's default: 10m.
    pub experimental_watch_progress_notify_interval: String,
    /// Test-only: a file of member IDs whose peer traffic is dropped (see
    /// `peer::Faults`). Never set in production.
    pub experimental_peer_fault_file: Option<PathBuf>,
    /// Peer TLS (etcd's flags): this member's certificate chain and key
    /// (PEM), presented when accepting and when connecting, and the CA
    /// that peer certificates must chain to. With them every peer URL is
    /// `https://`.
    pub peer_cert_file: Option<PathBuf>,
    pub peer_key_file: Option<PathBuf>,
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// Refuse peers that present no certificate of the trusted CA.
    pub peer_client_cert_auth: bool,
    /// Client TLS (etcd's flags): the certificate chain and key (PEM) the
    /// client URLs present; with them every `--listen-client-urls` URL is
    /// `https://`.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The CA client certificates must chain to (with `client_cert_auth`).
    pub trusted_ca_file: Option<PathBuf>,
    /// Refuse clients that present no certificate of the trusted CA.
    pub client_cert_auth: bool,
    /// Log entries a member keeps in memory behind its last snapshot so a
    /// lagging follower catches up from the log instead of a snapshot
    /// (etcd's `--experimental-snapshot-catchup-entries`).
    pub experimental_snapshot_catchup_entries: u64,
    /// etcd's `--experimental-initial-corrupt-check`: before serving, ask
    /// the peers for their KV hash at this member's revision and refuse to
    /// start if one differs.
    pub experimental_initial_corrupt_check: bool,
    /// etcd's `--experimental-corrupt-check-time`: how often the leader
    /// compares the members' KV hashes and raises CORRUPT for a member
    /// that differs (a duration; `0s`, the default, turns it off).
    pub experimental_corrupt_check_time: String,
    /// etcd's `--experimental-enable-lease-checkpoint`: the leader puts
    /// each long lease's remaining TTL through the log, so a new leader or
    /// a restarted member continues from it instead of a full TTL.
    pub experimental_enable_lease_checkpoint: bool,
    /// How often the leader checkpoints (etcd's default: 5m).
    pub experimental_lease_checkpoint_interval: String,
    /// etcd's `--auth-token`: `simple`, or `jwt,pub-key=<file>,
    /// priv-key=<file>,sign-method=<RS256|...>,ttl=<5m>`.
    pub auth_token: String,
    /// etcd's `--auth-token-ttl`: seconds a simple token lives after its
    /// last use.
    pub auth_token_ttl: u64,
    /// etcd's `--bcrypt-cost` (4 to 31) for passwords hashed here.
    pub bcrypt_cost: u32,
    /// etcd's `--strict-reconfig-check`: refuse membership changes that
    /// would leave too few started or reachable members.
    pub strict_reconfig_check: bool,
    /// etcd's `--max-concurrent-streams`: the HTTP/2 streams one client
    /// connection may have open at once (advertised in SETTINGS).
    pub max_concurrent_streams: u32,
    /// etcd's `--cipher-suites`: the TLS 1.2 suites offered to clients and
    /// peers (Go's names, comma-separated; empty: every suite).
    pub cipher_suites: String,
    /// etcd's `--client-crl-file`: client certificates revoked (PEM or DER).
    pub client_crl_file: Option<PathBuf>,
    /// etcd's `--peer-crl-file`: peer certificates revoked.
    pub peer_crl_file: Option<PathBuf>,
    /// etcd's `--peer-cert-allowed-cn`: peers' certificates must carry
    /// this common name (empty: any).
    pub peer_cert_allowed_cn: String,
    /// etcd's `--peer-cert-allowed-hostname`: peers' certificates must be
    /// valid for this host name (empty: any).
    pub peer_cert_allowed_hostname: String,
    /// etcd's `--auto-tls`: https:// client URLs without `--cert-file` use
    /// a self-signed certificate made at the first start
    /// (`<data-dir>/fixtures/client`).
    pub auto_tls: bool,
    /// etcd's `--peer-auto-tls`: https:// peer URLs without
    /// `--peer-cert-file` use a self-signed certificate
    /// (`<data-dir>/fixtures/peer`); peers then check no certificate.
    pub peer_auto_tls: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            name: "default".into(),
            data_dir: None,
            listen_http_urls: "http://127.0.0.1:3379".into(),
            listen_client_urls: "http://127.0.0.1:2379".into(),
            advertise_client_urls: None,
            listen_metrics_urls: String::new(),
            initial_advertise_peer_urls: "http://localhost:2380".into(),
            initial_cluster_token: "etcd-cluster".into(),
            initial_cluster: String::new(),
            initial_cluster_state: "new".into(),
            listen_peer_urls: None,
            max_txn_ops: 128,
            engine: "memory".into(),
            engine_cache_bytes: engine::any::default_cache_bytes(),
            shards: 0,
            cpus: None,
            owner_accepts_clients: None,
            snapshot_count: 100_000,
            heartbeat_interval: 100,
            election_timeout: 1000,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            auto_compaction_mode: "periodic".into(),
            metrics: "basic".into(),
            auto_compaction_retention: "0".into(),
            wal_batch_window_us: 0,
            wal_max_batch: 4096,
            wal_segment_bytes: 64 << 20,
            wal_dsync: true,
            max_pending_proposals: 100_000,
            io_memory_bytes: 1 << 20,
            spin_before_park_us: 0,
            range_cpu_shares: 250,
            quota_backend_bytes: 0,
            experimental_watch_progress_notify_interval: "10m".into(),
            experimental_peer_fault_file: None,
            peer_cert_file: None,
            peer_key_file: None,
            peer_trusted_ca_file: None,
            peer_client_cert_auth: false,
            cert_file: None,
            key_file: None,
            trusted_ca_file: None,
            client_cert_auth: false,
            experimental_snapshot_catchup_entries: 5000,
            experimental_initial_corrupt_check: false,
            experimental_corrupt_check_time: "0s".into(),
            experimental_enable_lease_checkpoint: false,
            experimental_lease_checkpoint_interval: "5m".into(),
            auth_token: "simple".into(),
            auth_token_ttl: 300,
            bcrypt_cost: 10,
            strict_reconfig_check: true,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            cipher_suites: String::new(),
            client_crl_file: None,
            peer_crl_file: None,
            peer_cert_allowed_cn: String::new(),
            peer_cert_allowed_hostname: String::new(),
            auto_tls: false,
            peer_auto_tls: false,
        }
    }
}

/// Command-line flags. Every one is optional so the config file can supply it.
#[derive(Debug, Parser, Default)]
#[command(
    name = "metcd",
    disable_version_flag = true,
    // As Go's flag package (etcd's): a flag given twice takes the last value.
    args_override_self = true,
    about = "An etcd-compatible, Raft-replicated key-value server",
    after_help = "Every flag can also be a key of the --config file. Backups: \
                  `metcd snapshot restore|status` (docs/operations.md)."
)]
pub struct Flags {
    /// Print the version (metcd's, the etcd API it serves, git SHA, Rust) and exit.
    #[arg(long)]
    pub version: bool,
    /// TOML config file (keys named as these flags, e.g. `snapshot-count = 10000`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// etcd's YAML config file; with it the other flags are not read.
    #[arg(long)]
    pub config_file: Option<PathBuf>,
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long)]
    pub listen_http_urls: Option<String>,
    #[arg(long)]
    pub listen_client_urls: Option<String>,
    #[arg(long)]
    pub advertise_client_urls: Option<String>,
    #[arg(long)]
    pub listen_metrics_urls: Option<String>,
    #[arg(long)]
    pub initial_advertise_peer_urls: Option<String>,
    #[arg(long)]
    pub initial_cluster_token: Option<String>,
    #[arg(long)]
    pub initial_cluster: Option<String>,
    #[arg(long)]
    pub initial_cluster_state: Option<String>,
    #[arg(long)]
    pub listen_peer_urls: Option<String>,
    #[arg(long)]
    pub max_txn_ops: Option<usize>,
    #[arg(long)]
    pub engine: Option<String>,
    #[arg(long)]
    pub engine_cache_bytes: Option<usize>,
    #[arg(long)]
    pub shards: Option<usize>,
    #[arg(long)]
    pub cpus: Option<String>,
    #[arg(long)]
    pub owner_accepts_clients: Option<bool>,
    #[arg(long)]
    pub snapshot_count: Option<u64>,
    /// Milliseconds.
    #[arg(long)]
    pub heartbeat_interval: Option<u64>,
    /// Milliseconds.
    #[arg(long)]
    pub election_timeout: Option<u64>,
    #[arg(long)]
    pub max_request_bytes: Option<usize>,
    #[arg(long)]
    pub auto_compaction_mode: Option<String>,
    #[arg(long)]
    pub metrics: Option<String>,
    #[arg(long)]
    pub auto_compaction_retention: Option<String>,
    #[arg(long)]
    pub wal_batch_window_us: Option<u64>,
    #[arg(long)]
    pub wal_max_batch: Option<usize>,
    #[arg(long)]
    pub wal_segment_bytes: Option<u64>,
    #[arg(long)]
    pub wal_dsync: Option<bool>,
    #[arg(long)]
    pub max_pending_proposals: Option<usize>,
    #[arg(long)]
    pub io_memory_bytes: Option<usize>,
    #[arg(long)]
    pub spin_before_park_us: Option<u64>,
    #[arg(long)]
    pub range_cpu_shares: Option<usize>,
    #[arg(long, allow_negative_numbers = true)]
    pub quota_backend_bytes: Option<i64>,
    #[arg(long)]
    pub experimental_watch_progress_notify_interval: Option<String>,
    #[arg(long, hide = true)]
    pub experimental_peer_fault_file: Option<PathBuf>,
    #[arg(long)]
    pub peer_cert_file: Option<PathBuf>,
    #[arg(long)]
    pub peer_key_file: Option<PathBuf>,
    #[arg(long)]
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// `--peer-client-cert-auth` alone means true, as in etcd.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub peer_client_cert_auth: Option<bool>,
    #[arg(long)]
    pub cert_file: Option<PathBuf>,
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    #[arg(long)]
    pub trusted_ca_file: Option<PathBuf>,
    /// `--client-cert-auth` alone means true, as in etcd.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub client_cert_auth: Option<bool>,
    #[arg(long)]
    pub experimental_snapshot_catchup_entries: Option<u64>,
    /// `--experimental-initial-corrupt-check` alone means true, as in etcd.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub experimental_initial_corrupt_check: Option<bool>,
    #[arg(long)]
    pub experimental_corrupt_check_time: Option<String>,
    /// `--experimental-enable-lease-checkpoint` alone means true, as in etcd.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub experimental_enable_lease_checkpoint: Option<bool>,
    #[arg(long)]
    pub experimental_lease_checkpoint_interval: Option<String>,
    #[arg(long)]
    pub auth_token: Option<String>,
    /// Seconds.
    #[arg(long)]
    pub auth_token_ttl: Option<u64>,
    #[arg(long)]
    pub bcrypt_cost: Option<u32>,
    /// `--strict-reconfig-check` alone means true, as in etcd.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub strict_reconfig_check: Option<bool>,
    #[arg(long)]
    pub max_concurrent_streams: Option<u32>,
    #[arg(long)]
    pub cipher_suites: Option<String>,
    #[arg(long)]
    pub client_crl_file: Option<PathBuf>,
    #[arg(long)]
    pub peer_crl_file: Option<PathBuf>,
    #[arg(long)]
    pub peer_cert_allowed_cn: Option<String>,
    #[arg(long)]
    pub peer_cert_allowed_hostname: Option<String>,
    /// `--auto-tls` alone means true, as in etcd.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub auto_tls: Option<bool>,
    /// `--peer-auto-tls` alone means true, as in etcd.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub peer_auto_tls: Option<bool>,
}

/// A flag's value refused, and why.
fn invalid_flag(
    flag: &'static str,
    value: impl Into<String>,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        flag,
        value: value.into(),
        reason: reason.into(),
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid --{flag} {value:?}: {reason}")]
    Invalid {
        flag: &'static str,
        value: String,
        reason: String,
    },
}

/// Auto-compaction policy, resolved from mode + retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoCompaction {
    Off,
    /// Keep history newer than this.
    Periodic(Duration),
    /// Keep this many revisions.
    Revision(i64),
}

/// Sets each named field of `$cfg` that `$from` (flags, or etcd's config
/// file) gives: `$from.$field` is the `Option` of the same name.
macro_rules! overlay {
    ($cfg:ident, $from:ident, $($field:ident),* $(,)?) => {
        $( if let Some(v) = $from.$field.take() { $cfg.$field = v; } )*
    };
}
pub(crate) use overlay;

impl Config {
    /// The backend quota in force: None when disabled (a negative flag),
    /// etcd's default for 0.
    pub fn backend_quota(&self) -> Option<u64> {
        match self.quota_backend_bytes {
            q if q < 0 => None,
            0 => Some(DEFAULT_QUOTA_BACKEND_BYTES),
            q => Some(q as u64),
        }
    }

    /// Builds the config from flags, reading `--config` if given.
    pub fn from_flags(mut flags: Flags) -> Result<Config, ConfigError> {
        if let Some(file) = flags.config_file.take() {
            // As etcd: the file replaces the command line.
            let mut cfg = crate::etcd_config_file::load(&file)?;
            cfg.make_paths_absolute()?;
            cfg.validate()?;
            return Ok(cfg);
        }
        let mut cfg = match &flags.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        if let Some(dir) = flags.data_dir.take() {
            cfg.data_dir = Some(dir);
        }
        if let Some(urls) = flags.advertise_client_urls.take() {
            cfg.advertise_client_urls = Some(urls);
        }
        for (from, to) in [
            (&mut flags.peer_cert_file, &mut cfg.peer_cert_file),
            (&mut flags.peer_key_file, &mut cfg.peer_key_file),
            (
                &mut flags.peer_trusted_ca_file,
                &mut cfg.peer_trusted_ca_file,
            ),
            (&mut flags.cert_file, &mut cfg.cert_file),
            (&mut flags.key_file, &mut cfg.key_file),
            (&mut flags.trusted_ca_file, &mut cfg.trusted_ca_file),
            (&mut flags.client_crl_file, &mut cfg.client_crl_file),
            (&mut flags.peer_crl_file, &mut cfg.peer_crl_file),
        ] {
            if let Some(path) = from.take() {
                *to = Some(path);
            }
        }
        if let Some(on) = flags.peer_client_cert_auth.take() {
            cfg.peer_client_cert_auth = on;
        }
        if let Some(on) = flags.client_cert_auth.take() {
            cfg.client_cert_auth = on;
        }
        if let Some(on) = flags.experimental_initial_corrupt_check.take() {
            cfg.experimental_initial_corrupt_check = on;
        }
        if let Some(on) = flags.experimental_enable_lease_checkpoint.take() {
            cfg.experimental_enable_lease_checkpoint = on;
        }
        if let Some(path) = flags.experimental_peer_fault_file.take() {
            cfg.experimental_peer_fault_file = Some(path);
        }
        if let Some(urls) = flags.listen_peer_urls.take() {
            cfg.listen_peer_urls = Some(urls);
        }
        if let Some(cpus) = flags.cpus.take() {
            cfg.cpus = Some(cpus);
        }
        if let Some(on) = flags.owner_accepts_clients.take() {
            cfg.owner_accepts_clients = Some(on);
        }
        overlay!(
            cfg,
            flags,
            name,
            listen_http_urls,
            listen_client_urls,
            listen_metrics_urls,
            initial_advertise_peer_urls,
            initial_cluster_token,
            initial_cluster,
            initial_cluster_state,
            max_txn_ops,
            engine,
            engine_cache_bytes,
            shards,
            snapshot_count,
            heartbeat_interval,
            election_timeout,
            max_request_bytes,
            auto_compaction_mode,
            auto_compaction_retention,
            metrics,
            wal_batch_window_us,
            wal_max_batch,
            wal_segment_bytes,
            wal_dsync,
            max_pending_proposals,
            io_memory_bytes,
            spin_before_park_us,
            range_cpu_shares,
            quota_backend_bytes,
            experimental_watch_progress_notify_interval,
            experimental_snapshot_catchup_entries,
            experimental_corrupt_check_time,
            experimental_lease_checkpoint_interval,
            auth_token,
            auth_token_ttl,
            bcrypt_cost,
            strict_reconfig_check,
            max_concurrent_streams,
            cipher_suites,
            peer_cert_allowed_cn,
            peer_cert_allowed_hostname,
            auto_tls,
            peer_auto_tls,
        );
        cfg.make_paths_absolute()?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Makes every path taken from flags or the config file absolute
    /// against the working directory at start-up, the data dir's default
    /// (`<name>.metcd`) included, so that nothing later resolves a path
    /// relative to anything else (glommio opens files relative to a
    /// descriptor that is not the working directory) and what is printed
    /// is where the files are.
    fn make_paths_absolute(&mut self) -> Result<(), ConfigError> {
        let absolute = |flag: &'static str, path: &Path| {
            std::path::absolute(path)
                .map_err(|e| invalid_flag(flag, path.display().to_string(), e.to_string()))
        };
        self.data_dir = Some(absolute("data-dir", &self.data_dir())?);
        for (flag, path) in [
            ("peer-cert-file", &mut self.peer_cert_file),
            ("peer-key-file", &mut self.peer_key_file),
            ("peer-trusted-ca-file", &mut self.peer_trusted_ca_file),
            ("cert-file", &mut self.cert_file),
            ("key-file", &mut self.key_file),
            ("trusted-ca-file", &mut self.trusted_ca_file),
            ("client-crl-file", &mut self.client_crl_file),
            ("peer-crl-file", &mut self.peer_crl_file),
            (
                "experimental-peer-fault-file",
                &mut self.experimental_peer_fault_file,
            ),
        ] {
            if let Some(p) = path.as_mut() {
                *p = absolute(flag, p)?;
            }
        }
        // `jwt,pub-key=<file>,priv-key=<file>,...`: the two key files.
        let mut options = Vec::new();
        for option in self.auth_token.split(',') {
            match option.split_once('=') {
                Some((k @ ("pub-key" | "priv-key"), file)) if !file.is_empty() => {
                    let file = absolute("auth-token", Path::new(file))?;
                    options.push(format!("{k}={}", file.display()));
                }
                _ => options.push(option.to_string()),
            }
        }
        self.auth_token = options.join(",");
        Ok(())
    }

    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("{}.metcd", self.name)))
    }

    /// Where `--listen-client-urls` listen (etcd's gRPC API): TCP
    /// addresses, `https://` ones with client TLS (checked at load), or
    /// Unix sockets.
    pub fn client_listen_addrs(&self) -> Result<Vec<Endpoint>, ConfigError> {
        parse_endpoints_with("listen-client-urls", &self.listen_client_urls, true)
    }

    /// This member's etcd member ID.
    pub fn member_id(&self) -> u64 {
        let urls = split_list(&self.initial_advertise_peer_urls);
        crate::ids::member_id(&urls, &self.initial_cluster_token)
    }

    /// The members of `--initial-cluster`, IDs derived as etcd does; this
    /// member's name must be among them with exactly its advertised peer URLs.
    pub fn initial_members(&self) -> Result<Vec<InitialMember>, ConfigError> {
        let spec = if self.initial_cluster.trim().is_empty() {
            split_list(&self.initial_advertise_peer_urls)
                .iter()
                .map(|u| format!("{}={u}", self.name))
                .collect::<Vec<_>>()
                .join(",")
        } else {
            self.initial_cluster.clone()
        };
        let invalid = |reason: String| ConfigError::Invalid {
            flag: "initial-cluster",
            value: spec.clone(),
            reason,
        };
        let mut members: Vec<InitialMember> = Vec::new();
        for item in split_list(&spec) {
            let Some((name, url)) = item.split_once('=') else {
                return Err(invalid(format!("`{item}` is not name=peer-url")));
            };
            parse_peer_urls("initial-cluster", url)?;
            match members.iter_mut().find(|m| m.name == name) {
                Some(m) => m.peer_urls.push(url.to_string()),
                None => members.push(InitialMember {
                    name: name.to_string(),
                    id: 0,
                    peer_urls: vec![url.to_string()],
                }),
            }
        }
        for m in &mut members {
            let urls: Vec<&str> = m.peer_urls.iter().map(String::as_str).collect();
            m.id = crate::ids::member_id(&urls, &self.initial_cluster_token);
        }
        let Some(me) = members.iter().find(|m| m.name == self.name) else {
            return Err(invalid(format!(
                "couldn't find local name {:?} in the initial cluster configuration",
                self.name
            )));
        };
        let mut mine: Vec<&str> = split_list(&self.initial_advertise_peer_urls);
        let mut listed: Vec<&str> = me.peer_urls.iter().map(String::as_str).collect();
        mine.sort_unstable();
        listed.sort_unstable();
        if mine != listed {
            return Err(invalid(format!(
                "--initial-cluster has {}={} but --initial-advertise-peer-urls is {}: they must match",
                self.name,
                listed.join(","),
                mine.join(",")
            )));
        }
        let mut ids: Vec<u64> = members.iter().map(|m| m.id).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != members.len() {
            return Err(invalid("two members share the same peer URLs".into()));
        }
        Ok(members)
    }

    /// Where to accept peer connections; empty for a member without peers
    /// unless `--listen-peer-urls` asks for it.
    pub fn peer_listen_addrs(&self) -> Result<Vec<Endpoint>, ConfigError> {
        match &self.listen_peer_urls {
            Some(urls) => parse_peer_urls("listen-peer-urls", urls),
            None if self.initial_members()?.len() > 1 => parse_peer_urls(
                "initial-advertise-peer-urls",
                &self.initial_advertise_peer_urls,
            ),
            None => Ok(Vec::new()),
        }
    }

    /// The socket addresses of `--listen-http-urls` (comma-separated URLs).
    /// The seed HTTP API's addresses; an empty `--listen-http-urls`
    /// turns it off.
    pub fn http_listen_addrs(&self) -> Result<Vec<SocketAddr>, ConfigError> {
        if self.listen_http_urls.trim().is_empty() {
            return Ok(Vec::new());
        }
        parse_urls("listen-http-urls", &self.listen_http_urls)
    }

    /// Where `--listen-metrics-urls` listen: `http://`, or `https://`
    /// with the client URLs' certificate (as etcd), or `unix://`.
    pub fn metrics_listen_addrs(&self) -> Result<Vec<(Endpoint, bool)>, ConfigError> {
        let has_certificate = self.cert_file.is_some() && self.key_file.is_some();
        let mut out = Vec::new();
        for url in split_list(&self.listen_metrics_urls) {
            let https = url.starts_with("https://");
            if https && !has_certificate {
                return Err(invalid_flag(
                    "listen-metrics-urls",
                    url.to_string(),
                    "https:// metrics URLs use the client URLs' --cert-file and --key-file",
                ));
            }
            let endpoints = parse_endpoints_with("listen-metrics-urls", url, true)?;
            out.extend(endpoints.into_iter().map(|endpoint| (endpoint, https)));
        }
        Ok(out)
    }

    /// The cap on the JSON gateway's requests in flight in this member.
    /// etcd's gateway reaches its server over one internal connection, so
    /// an explicit `--max-concurrent-streams` caps every gateway request
    /// together; metcd's default limit (per client connection, where etcd
    /// has none) leaves the gateway uncapped, as etcd's default does.
    pub fn gateway_request_limit(&self) -> u32 {
        if self.max_concurrent_streams == DEFAULT_MAX_CONCURRENT_STREAMS {
            u32::MAX
        } else {
            self.max_concurrent_streams
        }
    }

    /// `None` when progress notifications are off.
    pub fn watch_progress_notify_interval(&self) -> Result<Option<Duration>, ConfigError> {
        optional_interval(
            "experimental-watch-progress-notify-interval",
            &self.experimental_watch_progress_notify_interval,
        )
    }

    /// `None` when the periodic corruption check is off.
    pub fn corrupt_check_interval(&self) -> Result<Option<Duration>, ConfigError> {
        optional_interval(
            "experimental-corrupt-check-time",
            &self.experimental_corrupt_check_time,
        )
    }

    /// How tokens are issued and checked (`--auth-token`, whose key files
    /// are read here, and `--auth-token-ttl`).
    pub fn token_settings(&self) -> Result<crate::auth::TokenSettings, ConfigError> {
        let kind = crate::jwt::TokenKind::from_option(&self.auth_token)
            .map_err(|reason| invalid_flag("auth-token", self.auth_token.clone(), reason))?;
        // Bounded so a token's expiry instant always exists.
        if !(1..=MAX_AUTH_TOKEN_TTL_SECS).contains(&self.auth_token_ttl) {
            return Err(invalid_flag(
                "auth-token-ttl",
                self.auth_token_ttl.to_string(),
                format!("must be between 1 and {MAX_AUTH_TOKEN_TTL_SECS} seconds (10 years)"),
            ));
        }
        Ok(crate::auth::TokenSettings {
            kind,
            simple_ttl: Duration::from_secs(self.auth_token_ttl),
        })
    }

    /// How often the leader checkpoints lease TTLs; `None` when off.
    pub fn lease_checkpoint_interval(&self) -> Result<Option<Duration>, ConfigError> {
        if !self.experimental_enable_lease_checkpoint {
            return Ok(None);
        }
        // Zero means etcd's default here, not off (the flag above is).
        let every = optional_interval(
            "experimental-lease-checkpoint-interval",
            &self.experimental_lease_checkpoint_interval,
        )?;
        Ok(Some(every.unwrap_or(Duration::from_secs(300))))
    }

    pub fn auto_compaction(&self) -> Result<AutoCompaction, ConfigError> {
        let retention = self.auto_compaction_retention.trim();
        let invalid = |reason: &str| ConfigError::Invalid {
            flag: "auto-compaction-retention",
            value: retention.to_string(),
            reason: reason.to_string(),
        };
        if retention.is_empty() || retention == "0" {
            return Ok(AutoCompaction::Off);
        }
        match self.auto_compaction_mode.as_str() {
            "periodic" => {
                let period = parse_retention_duration(retention).ok_or_else(|| {
                    invalid("expected hours (e.g. 1) or a duration (e.g. 30m, 10s, 1h)")
                })?;
                if period.is_zero() {
                    return Ok(AutoCompaction::Off);
                }
                Ok(AutoCompaction::Periodic(period))
            }
            "revision" => {
                let n: i64 = retention
                    .parse()
                    .map_err(|_| invalid("expected a number of revisions"))?;
                if n < 0 {
                    return Err(invalid("must not be negative"));
                }
                Ok(AutoCompaction::Revision(n))
            }
            other => Err(ConfigError::Invalid {
                flag: "auto-compaction-mode",
                value: other.to_string(),
                reason: "expected periodic or revision".into(),
            }),
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !matches!(self.metrics.as_str(), "basic" | "extensive") {
            return Err(invalid_flag(
                "metrics",
                self.metrics.clone(),
                "expected basic or extensive",
            ));
        }
        if let Some(list) = &self.cpus {
            parse_cpu_list(list).map_err(|reason| invalid_flag("cpus", list.clone(), reason))?;
        }
        if !(1..=crate::sched::WRITE_PATH_SHARES).contains(&self.range_cpu_shares) {
            return Err(invalid_flag(
                "range-cpu-shares",
                self.range_cpu_shares.to_string(),
                "expected 1 to 1000",
            ));
        }
        if let Err(reason) = crate::tls::tls12_cipher_suites(&self.cipher_suites) {
            return Err(invalid_flag(
                "cipher-suites",
                self.cipher_suites.clone(),
                reason,
            ));
        }
        if let Err(reason) = self.engine.parse::<engine::any::EngineKind>() {
            return Err(invalid_flag("engine", self.engine.clone(), &reason));
        }
        if self.name.is_empty() {
            return Err(invalid_flag("name", self.name.clone(), "must not be empty"));
        }
        if self.engine_cache_bytes < 1 << 20 {
            return Err(invalid_flag(
                "engine-cache-bytes",
                self.engine_cache_bytes.to_string(),
                "must be at least 1 MiB",
            ));
        }
        self.validate_peer_tls()?;
        self.validate_client_tls()?;
        if !(4..=31).contains(&self.bcrypt_cost) {
            return Err(invalid_flag(
                "bcrypt-cost",
                self.bcrypt_cost.to_string(),
                "must be between 4 and 31",
            ));
        }
        self.token_settings()?;
        if self.max_request_bytes == 0 || self.max_request_bytes > 64 << 20 {
            return Err(invalid_flag(
                "max-request-bytes",
                self.max_request_bytes.to_string(),
                "must be between 1 and 64 MiB",
            ));
        }
        if self.wal_max_batch == 0 {
            return Err(invalid_flag("wal-max-batch", "0", "must be at least 1"));
        }
        if self.wal_segment_bytes < 64 << 10 {
            return Err(invalid_flag(
                "wal-segment-bytes",
                self.wal_segment_bytes.to_string(),
                "must be at least 64 KiB",
            ));
        }
        if self.snapshot_count == 0 {
            return Err(invalid_flag("snapshot-count", "0", "must be at least 1"));
        }
        if self.heartbeat_interval == 0 || self.election_timeout < 5 * self.heartbeat_interval {
            return Err(invalid_flag(
                "election-timeout",
                self.election_timeout.to_string(),
                "must be at least 5 x --heartbeat-interval (as etcd requires)",
            ));
        }
        if self.max_pending_proposals == 0 {
            return Err(invalid_flag(
                "max-pending-proposals",
                "0",
                "must be at least 1",
            ));
        }
        self.http_listen_addrs()?;
        self.client_listen_addrs()?;
        self.metrics_listen_addrs()?;
        self.initial_members()?;
        self.peer_listen_addrs()?;
        if !matches!(self.initial_cluster_state.as_str(), "new" | "existing") {
            return Err(invalid_flag(
                "initial-cluster-state",
                self.initial_cluster_state.clone(),
                "must be `new` or `existing`",
            ));
        }
        self.auto_compaction()?;
        self.watch_progress_notify_interval()?;
        self.corrupt_check_interval()?;
        self.lease_checkpoint_interval()?;
        if self.max_txn_ops == 0 {
            return Err(invalid_flag("max-txn-ops", "0", "must be at least 1"));
        }
        Ok(())
    }
}

/// A member named in `--initial-cluster`.
#[derive(Debug, Clone, PartialEq)]
pub struct InitialMember {
    pub name: String,
    pub id: u64,
    pub peer_urls: Vec<String>,
}

/// Comma-separated items, trimmed, empty ones dropped.
pub fn split_list(s: &str) -> Vec<&str> {
    s.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// Parses `http://host:port[,http://host:port...]` (the seed API's
/// URLs) into socket addresses.
pub fn parse_urls(flag: &'static str, urls: &str) -> Result<Vec<SocketAddr>, ConfigError> {
    Ok(parse_endpoints_with(flag, urls, false)?
        .iter()
        .filter_map(Endpoint::tcp)
        .collect())
}

/// Peer URLs: `http://`, with peer TLS `https://`, or `unix://`.
pub fn parse_peer_urls(flag: &'static str, urls: &str) -> Result<Vec<Endpoint>, ConfigError> {
    parse_endpoints_with(flag, urls, true)
}

/// `etcd_urls`: etcd's client and peer URLs, which may also be
/// `https://` and `unix://` (`unixs://`, TLS over a Unix socket, is not
/// supported).
fn parse_endpoints_with(
    flag: &'static str,
    urls: &str,
    etcd_urls: bool,
) -> Result<Vec<Endpoint>, ConfigError> {
    let mut out = Vec::new();
    for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let invalid = |reason: &str| ConfigError::Invalid {
            flag,
            value: url.to_string(),
            reason: reason.to_string(),
        };
        if let (true, Some(file)) = (etcd_urls, url.strip_prefix("unix://")) {
            if file.is_empty() {
                return Err(invalid(
                    "a unix:// URL names its socket file, e.g. unix://etcd.sock:1",
                ));
            }
            out.push(Endpoint::Unix(PathBuf::from(file)));
            continue;
        }
        let rest = match url.strip_prefix("http://") {
            Some(rest) => rest,
            None if etcd_urls => url
                .strip_prefix("https://")
                .ok_or_else(|| invalid("expected an http://, https:// or unix:// URL"))?,
            None => return Err(invalid("only http:// URLs are supported")),
        };
        let hostport = rest.trim_end_matches('/');
        let hostport = if let Some(port) = hostport.strip_prefix("localhost:") {
            format!("127.0.0.1:{port}")
        } else {
            hostport.to_string()
        };
        let addr: SocketAddr = hostport
            .parse()
            .map_err(|_| invalid("expected an IP address and port, e.g. http://127.0.0.1:3379"))?;
        out.push(Endpoint::Tcp(addr));
    }
    if out.is_empty() {
        return Err(ConfigError::Invalid {
            flag,
            value: urls.to_string(),
            reason: "no URL given".into(),
        });
    }
    Ok(out)
}

/// A Go-style duration flag (`10m`, `5s`, `500ms`; `0` alone too) where
/// zero turns the feature off (`None`).
fn optional_interval(flag: &'static str, value: &str) -> Result<Option<Duration>, ConfigError> {
    let v = value.trim();
    let d = if v == "0" {
        Some(Duration::ZERO)
    } else {
        // A bare number is hours for retention, but no unit is an error
        // for a Go duration.
        parse_retention_duration(v).filter(|_| v.parse::<u64>().is_err())
    };
    let d = d.ok_or_else(|| ConfigError::Invalid {
        flag,
        value: v.to_string(),
        reason: "expected a duration such as 10m, 5s or 500ms".into(),
    })?;
    Ok((!d.is_zero()).then_some(d))
}

/// etcd's periodic retention: a bare number is hours; else a Go-style
/// duration with one unit (`ms`, `s`, `m`, `h`).
fn parse_retention_duration(s: &str) -> Option<Duration> {
    if let Ok(hours) = s.parse::<u64>() {
        return Some(Duration::from_secs(hours.checked_mul(3600)?));
    }
    let split = s.find(|c: char| c.is_ascii_alphabetic())?;
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    if !n.is_finite() || n < 0.0 {
        return None;
    }
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}

fn first_is_https(urls: &str) -> bool {
    split_list(urls)
        .first()
        .is_some_and(|u| u.starts_with("https://"))
}

impl Config {
    /// Peer TLS is all three files or none, and then every peer URL is
    /// https:// (and without them, none is).
    fn validate_peer_tls(&self) -> Result<(), ConfigError> {
        let files = [
            ("peer-cert-file", &self.peer_cert_file),
            ("peer-key-file", &self.peer_key_file),
            ("peer-trusted-ca-file", &self.peer_trusted_ca_file),
        ];
        let given = files.iter().filter(|(_, f)| f.is_some()).count();
        let auto = given == 0 && self.peer_auto_tls_applies();
        if given != 0 && given != files.len() {
            let (flag, _) = files
                .iter()
                .find(|(_, f)| f.is_none())
                .copied()
                .unwrap_or(files[0]);
            return Err(ConfigError::Invalid {
                flag,
                value: String::new(),
                reason:
                    "peer TLS needs --peer-cert-file, --peer-key-file and --peer-trusted-ca-file"
                        .into(),
            });
        }
        let tls = given != 0 || auto;
        let mut urls: Vec<(&'static str, &str)> = split_list(&self.initial_advertise_peer_urls)
            .into_iter()
            .map(|u| ("initial-advertise-peer-urls", u))
            .collect();
        for item in split_list(&self.initial_cluster) {
            if let Some((_, url)) = item.split_once('=') {
                urls.push(("initial-cluster", url));
            }
        }
        if let Some(listen) = &self.listen_peer_urls {
            urls.extend(
                split_list(listen)
                    .into_iter()
                    .map(|u| ("listen-peer-urls", u)),
            );
        }
        for (flag, url) in urls {
            let https = url.starts_with("https://");
            if https != tls {
                return Err(ConfigError::Invalid {
                    flag,
                    value: url.to_string(),
                    reason: if tls {
                        "with --peer-cert-file every peer URL must be https://".into()
                    } else {
                        "https:// peer URLs need --peer-cert-file, --peer-key-file and \
                         --peer-trusted-ca-file"
                            .into()
                    },
                });
            }
        }
        Ok(())
    }

    /// Client TLS is a certificate and key (and a CA with
    /// `--client-cert-auth`), and then every listen client URL is https://
    /// (and without them, none is).
    fn validate_client_tls(&self) -> Result<(), ConfigError> {
        let tls = match (&self.cert_file, &self.key_file) {
            (Some(_), Some(_)) => true,
            // With --auto-tls the URLs say: https:// ones get a made
            // certificate, http:// ones stay plaintext (auto-tls unused).
            (None, None) => self.client_auto_tls(),
            (None, Some(_)) => {
                return Err(invalid_flag(
                    "cert-file",
                    "",
                    "--key-file needs --cert-file",
                ))
            }
            (Some(_), None) => {
                return Err(invalid_flag("key-file", "", "--cert-file needs --key-file"))
            }
        };
        if self.client_cert_auth && (!tls || self.trusted_ca_file.is_none()) {
            return Err(invalid_flag(
                "client-cert-auth",
                "true",
                "needs --cert-file, --key-file and --trusted-ca-file",
            ));
        }
        if self.trusted_ca_file.is_some() && !tls {
            return Err(invalid_flag(
                "trusted-ca-file",
                "",
                "needs --cert-file and --key-file",
            ));
        }
        // The seed's curl API has no client certificates: where clients
        // must authenticate, it may only be reachable from this host.
        if self.trusted_ca_file.is_some() {
            for addr in self.http_listen_addrs()? {
                if !addr.ip().is_loopback() {
                    return Err(invalid_flag(
                        "listen-http-urls",
                        addr.to_string(),
                        "the HTTP API has no client authentication: with \
                         --trusted-ca-file it must listen on loopback only",
                    ));
                }
            }
        }
        for url in split_list(&self.listen_client_urls) {
            if url.starts_with("https://") != tls {
                return Err(invalid_flag(
                    "listen-client-urls",
                    url,
                    if tls {
                        "with --cert-file every listen client URL must be https://"
                    } else {
                        "https:// client URLs need --cert-file and --key-file (or --auto-tls)"
                    },
                ));
            }
        }
        Ok(())
    }

    /// `--auto-tls` makes a certificate: asked for, none given, and the
    /// client URLs are https:// (the validation keeps them all alike).
    pub fn client_auto_tls(&self) -> bool {
        self.auto_tls && self.cert_file.is_none() && first_is_https(&self.listen_client_urls)
    }

    /// `--peer-auto-tls` makes a certificate (as [`Config::client_auto_tls`]).
    pub fn peer_auto_tls_applies(&self) -> bool {
        self.peer_auto_tls
            && self.peer_cert_file.is_none()
            && first_is_https(&self.initial_advertise_peer_urls)
    }

    /// The client TLS files, when configured.
    pub fn client_tls_files(&self) -> Option<crate::tls::ClientTlsFiles<'_>> {
        Some(crate::tls::ClientTlsFiles {
            cert: self.cert_file.as_deref()?,
            key: self.key_file.as_deref()?,
            trusted_ca: self.trusted_ca_file.as_deref(),
            client_cert_auth: self.client_cert_auth,
            cipher_suites: &self.cipher_suites,
            crl: self.client_crl_file.as_deref(),
        })
    }

    /// The peer TLS files, when configured.
    pub fn peer_tls_files(&self) -> Option<crate::tls::PeerTlsFiles<'_>> {
        Some(crate::tls::PeerTlsFiles {
            cert: self.peer_cert_file.as_deref()?,
            key: self.peer_key_file.as_deref()?,
            trusted_ca: self.peer_trusted_ca_file.as_deref(),
            client_cert_auth: self.peer_client_cert_auth,
            cipher_suites: &self.cipher_suites,
            crl: self.peer_crl_file.as_deref(),
            allowed_cn: &self.peer_cert_allowed_cn,
            allowed_hostname: &self.peer_cert_allowed_hostname,
        })
    }

    /// The storage engine (validated at load).
    pub fn engine_kind(&self) -> engine::any::EngineKind {
        self.engine.parse().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn engine_cache_bytes_has_a_floor() {
        let load = |v: &str| {
            Config::from_flags(Flags::parse_from(["metcd", "--engine-cache-bytes", v]))
                .map_err(|e| e.to_string())
        };
        assert_eq!(load("268435456").unwrap().engine_cache_bytes, 256 << 20);
        let err = load("4096").unwrap_err();
        assert!(err.contains("at least 1 MiB"), "{err}");
        let default = Config::default().engine_cache_bytes;
        assert_eq!(default, engine::any::default_cache_bytes());
        assert!((64 << 20..=1 << 30).contains(&default), "{default}");
    }

    /// A config from command-line flags (after `metcd --name n1`).
    fn load(args: &[&str]) -> Result<Config, String> {
        let mut all = vec!["metcd", "--name", "n1"];
        all.extend_from_slice(args);
        Config::from_flags(Flags::parse_from(all)).map_err(|e| e.to_string())
    }

    #[test]
    fn quota_and_corruption_check_flags_read_as_etcds() {
        let quota = |args: &[&str]| load(args).unwrap().backend_quota();
        assert_eq!(quota(&[]), Some(DEFAULT_QUOTA_BACKEND_BYTES));
        assert_eq!(quota(&["--quota-backend-bytes", "0"]), Some(2 << 30));
        assert_eq!(quota(&["--quota-backend-bytes", "-1"]), None);
        assert_eq!(quota(&["--quota-backend-bytes=16777216"]), Some(16 << 20));
        let every = |args: &[&str]| load(args).map(|c| c.corrupt_check_interval().unwrap());
        assert_eq!(every(&[]), Ok(None));
        assert_eq!(
            every(&["--experimental-corrupt-check-time", "5m"]),
            Ok(Some(Duration::from_secs(300)))
        );
        assert_eq!(
            every(&["--experimental-corrupt-check-time", "0s"]),
            Ok(None)
        );
        let err = load(&["--experimental-corrupt-check-time", "5"]).unwrap_err();
        assert!(err.contains("experimental-corrupt-check-time"), "{err}");
        assert!(
            load(&["--experimental-initial-corrupt-check"])
                .unwrap()
                .experimental_initial_corrupt_check
        );
        let checkpoints = |args: &[&str]| load(args).unwrap().lease_checkpoint_interval().unwrap();
        assert_eq!(checkpoints(&[]), None);
        assert_eq!(
            checkpoints(&["--experimental-enable-lease-checkpoint"]),
            Some(Duration::from_secs(300))
        );
        assert_eq!(
            checkpoints(&[
                "--experimental-enable-lease-checkpoint=true",
                "--experimental-lease-checkpoint-interval",
                "1s"
            ]),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn peer_tls_flags_go_together_with_https_peer_urls() {
        let https = ["--initial-advertise-peer-urls", "https://127.0.0.1:2380"];
        let err = load(&https).unwrap_err();
        assert!(err.contains("need --peer-cert-file"), "{err}");
        let files = [
            "--peer-cert-file",
            "c.pem",
            "--peer-key-file",
            "k.pem",
            "--peer-trusted-ca-file",
            "ca.pem",
        ];
        let err = load(&files).unwrap_err();
        assert!(err.contains("must be https://"), "{err}");
        let err = load(&[&https[..], &files[..2]].concat()).unwrap_err();
        assert!(err.contains("peer-key-file"), "{err}");
        let cfg = load(&[&https[..], &files[..], &["--peer-client-cert-auth"]].concat()).unwrap();
        assert!(cfg.peer_client_cert_auth);
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            cfg.peer_tls_files().unwrap().trusted_ca,
            Some(cwd.join("ca.pem").as_path())
        );
        assert!(load(&["--listen-client-urls", "https://127.0.0.1:2379"]).is_err());
    }

    #[test]
    fn client_tls_flags_go_together_with_https_client_urls() {
        let https = ["--listen-client-urls", "https://127.0.0.1:2379"];
        let err = load(&https).unwrap_err();
        assert!(err.contains("need --cert-file and --key-file"), "{err}");
        let files = ["--cert-file", "c.pem", "--key-file", "k.pem"];
        let err = load(&files).unwrap_err();
        assert!(err.contains("must be https://"), "{err}");
        let err = load(&[&https[..], &files[..2]].concat()).unwrap_err();
        assert!(err.contains("--cert-file needs --key-file"), "{err}");
        let err = load(&[&https[..], &files[..], &["--client-cert-auth"]].concat()).unwrap_err();
        assert!(err.contains("--trusted-ca-file"), "{err}");
        let cfg = load(
            &[
                &https[..],
                &files[..],
                &["--client-cert-auth", "--trusted-ca-file", "ca.pem"],
            ]
            .concat(),
        )
        .unwrap();
        let tls = cfg.client_tls_files().unwrap();
        assert!(tls.client_cert_auth);
        let ca = std::env::current_dir().unwrap().join("ca.pem");
        assert_eq!(tls.trusted_ca, Some(ca.as_path()));
        assert_eq!(
            cfg.client_listen_addrs().unwrap(),
            [Endpoint::Tcp("127.0.0.1:2379".parse().unwrap())]
        );
        assert!(load(&[]).unwrap().client_tls_files().is_none());
        let open_http = ["--listen-http-urls", "http://0.0.0.0:3379"];
        let ca = ["--trusted-ca-file", "ca.pem"];
        let err = load(&[&https[..], &files[..], &ca[..], &open_http[..]].concat()).unwrap_err();
        assert!(err.contains("loopback only"), "{err}");
        assert!(load(&[&https[..], &files[..], &open_http[..]].concat()).is_ok());
        let off = ["--listen-http-urls", ""];
        let cfg = load(&[&https[..], &files[..], &ca[..], &off[..]].concat()).unwrap();
        assert!(cfg.http_listen_addrs().unwrap().is_empty());
    }

    #[test]
    fn a_repeated_flag_takes_its_last_value_as_in_etcd() {
        // etcd's own e2e harness passes `--client-cert-auth` twice.
        let flags = Flags::parse_from([
            "metcd",
            "--name",
            "a",
            "--name",
            "b",
            "--strict-reconfig-check",
            "--strict-reconfig-check=false",
        ]);
        let cfg = Config::from_flags(flags).unwrap();
        assert_eq!(cfg.name, "b");
        assert!(!cfg.strict_reconfig_check);
    }

    #[test]
    fn every_path_is_made_absolute_at_start() {
        let cwd = std::env::current_dir().unwrap();
        let flags = Flags::parse_from([
            "metcd",
            "--data-dir",
            "x/y",
            "--listen-client-urls",
            "https://127.0.0.1:2379",
            "--cert-file",
            "c.pem",
            "--key-file",
            "/abs/k.pem",
            "--auth-token",
            // Relative to the crate (cargo runs unit tests there).
            "jwt,pub-key=tests/fixtures/jwt/rsa.pub,priv-key=tests/../tests/fixtures/jwt/rsa.key,sign-method=RS256",
        ]);
        let cfg = Config::from_flags(flags).unwrap();
        assert_eq!(cfg.data_dir(), cwd.join("x/y"));
        assert_eq!(cfg.cert_file, Some(cwd.join("c.pem")));
        assert_eq!(cfg.key_file, Some(PathBuf::from("/abs/k.pem")));
        assert_eq!(
            cfg.auth_token,
            format!(
                "jwt,pub-key={},priv-key={},sign-method=RS256",
                cwd.join("tests/fixtures/jwt/rsa.pub").display(),
                cwd.join("tests/../tests/fixtures/jwt/rsa.key").display()
            )
        );
    }

    #[test]
    fn flags_override_file_and_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "snapshot-count = 500\nname = \"from-file\"\nwal-batch-window-us = 50\n",
        )
        .unwrap();
        let flags =
            Flags::parse_from(["metcd", "--config", file.to_str().unwrap(), "--name", "n1"]);
        let cfg = Config::from_flags(flags).unwrap();
        assert_eq!(cfg.name, "n1");
        assert_eq!(cfg.snapshot_count, 500);
        assert_eq!(cfg.wal_batch_window_us, 50);
        assert_eq!(cfg.max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
        // Relative paths are made absolute once, against the working
        // directory at start-up.
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(cfg.data_dir(), cwd.join("n1.metcd"));
    }

    #[test]
    fn cpu_lists_in_taskset_syntax() {
        assert_eq!(parse_cpu_list("0-3").unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(parse_cpu_list("8,10,12-13").unwrap(), vec![8, 10, 12, 13]);
        assert_eq!(parse_cpu_list("3, 1-2,3").unwrap(), vec![1, 2, 3]);
        for bad in ["", "a", "3-1", "1-", "0-2000", "1,,2"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?} taken");
        }
        assert_eq!(
            load(&["--cpus", "2-3"]).unwrap().cpus.as_deref(),
            Some("2-3")
        );
        let refused = load(&["--cpus", "3-1"]).unwrap_err().to_string();
        assert!(refused.contains("cpus"), "{refused}");
        assert_eq!(
            load(&["--owner-accepts-clients", "false"])
                .unwrap()
                .owner_accepts_clients,
            Some(false)
        );
    }

    #[test]
    fn range_cpu_shares_are_checked_and_read_from_a_profile() {
        assert_eq!(load(&[]).unwrap().range_cpu_shares, 250);
        assert_eq!(
            load(&["--range-cpu-shares", "1000"])
                .unwrap()
                .range_cpu_shares,
            1000
        );
        for bad in ["0", "1001"] {
            let err = load(&["--range-cpu-shares", bad]).unwrap_err();
            assert!(err.contains("range-cpu-shares"), "{err}");
            assert!(err.contains("expected 1 to 1000"), "{err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "range-cpu-shares = 100\n").unwrap();
        assert_eq!(Config::from_file(&file).unwrap().range_cpu_shares, 100);
    }

    #[test]
    fn unknown_file_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "snapshot-cuont = 5\n").unwrap();
        let err = Config::from_file(&file).unwrap_err().to_string();
        assert!(err.contains("snapshot-cuont"), "{err}");
    }

    #[test]
    fn retention_parsing() {
        let mut cfg = Config::default();
        assert_eq!(cfg.auto_compaction().unwrap(), AutoCompaction::Off);
        cfg.auto_compaction_retention = "1".into();
        assert_eq!(
            cfg.auto_compaction().unwrap(),
            AutoCompaction::Periodic(Duration::from_secs(3600))
        );
        cfg.auto_compaction_retention = "30m".into();
        assert_eq!(
            cfg.auto_compaction().unwrap(),
            AutoCompaction::Periodic(Duration::from_secs(1800))
        );
        cfg.auto_compaction_mode = "revision".into();
        cfg.auto_compaction_retention = "1000".into();
        assert_eq!(
            cfg.auto_compaction().unwrap(),
            AutoCompaction::Revision(1000)
        );
        cfg.auto_compaction_retention = "ten".into();
        assert!(cfg.auto_compaction().is_err());
    }

    #[test]
    fn urls() {
        let addrs = parse_urls("x", "http://127.0.0.1:3379,http://localhost:4000").unwrap();
        assert_eq!(addrs.len(), 2);
        assert!(parse_urls("x", "https://1.2.3.4:1").is_err());
        assert!(parse_urls("x", "http://nohost").is_err());
        // The seed API is TCP only; etcd's URLs may name Unix sockets, by
        // host and path as etcd names them.
        assert!(parse_urls("x", "unix://etcd.unix:1").is_err());
        assert_eq!(
            parse_peer_urls(
                "x",
                "unix://etcd.unix:1,unix:///run/e.sock,https://127.0.0.1:2"
            )
            .unwrap(),
            vec![
                Endpoint::Unix("etcd.unix:1".into()),
                Endpoint::Unix("/run/e.sock".into()),
                Endpoint::Tcp("127.0.0.1:2".parse().unwrap()),
            ]
        );
        assert!(parse_peer_urls("x", "unix://").is_err());
        assert!(parse_peer_urls("x", "unixs://etcd.unix:1").is_err());
    }

    #[test]
    fn shipped_profiles_parse() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tuning");
        for entry in std::fs::read_dir(root).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let cfg = Config::from_file(&path).unwrap();
                cfg.validate().unwrap();
            }
        }
    }
}
