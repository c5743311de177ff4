//! Start-up: recovery from the data dir (engine, WAL and key index read
//! alongside), its phases logged with their time and memory, and the
//! member started.

use super::*;

/// Where a start-up's time and memory went, logged phase by phase
/// (`start-up: read the WAL 812 ms, RSS 301 MiB`) so an operator sees what
/// a restart costs and why.
pub(super) struct StartupPhases {
    last: Instant,
}

/// When the first member start-up of this process began.
static STARTUP_BEGAN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

impl StartupPhases {
    pub(super) fn begin() -> StartupPhases {
        let now = Instant::now();
        STARTUP_BEGAN.get_or_init(|| now);
        StartupPhases { last: now }
    }

    pub(super) fn done(&mut self, phase: &str) {
        let now = Instant::now();
        log(format_args!(
            "start-up: {phase} {} ms, RSS {} MiB",
            (now - self.last).as_millis(),
            resident_mib()
        ));
        self.last = now;
    }

    /// Logs the whole start-up: from its beginning to serving clients
    /// (the replay of committed entries and the publish included).
    pub(super) fn ready() {
        if let Some(began) = STARTUP_BEGAN.get() {
            log(format_args!(
                "start-up: serving after {} ms, RSS {} MiB",
                began.elapsed().as_millis(),
                resident_mib()
            ));
        }
    }
}

/// This process's resident memory (0 where /proc cannot say).
pub(super) fn resident_mib() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf reads a constant of the system; no pointers.
    let page_bytes = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    pages * page_bytes / (1 << 20)
}

/// Logs where the key index came from at start-up; the checkpoint's
/// revision when it came from one.
pub(super) fn report_index_source(source: &mvcc::IndexSource) -> Option<i64> {
    match source {
        mvcc::IndexSource::Checkpoint {
            revision,
            keys,
            revisions_after,
        } => {
            log(format_args!(
                "key index: loaded the checkpoint at revision {revision} ({keys} keys) and \
                 {revisions_after} newer revisions from the engine"
            ));
            Some(*revision)
        }
        mvcc::IndexSource::Rebuilt { why: Some(why) } => {
            log(format_args!(
                "key index: rebuilt from every revision in the engine ({why})"
            ));
            None
        }
        mvcc::IndexSource::Rebuilt { why: None } => None,
    }
}

/// What a start-up reads beside the engine: the WAL, and the key index
/// checkpoint decoded (not yet checked against the engine).
pub(super) struct ReadAlongside {
    wal: std::result::Result<wal::Recovered, engine::Error>,
    wal_took: Duration,
    index_checkpoint: Option<crate::mvcc::DecodedIndexCheckpoint>,
    index_took: Duration,
}

pub(super) fn read_wal_and_index_checkpoint(dirs: &DataDirs) -> ReadAlongside {
    let began = Instant::now();
    let wal = wal::recover(&dirs.wal);
    let wal_took = began.elapsed();
    let began = Instant::now();
    let index_checkpoint = crate::index_file::read(&dirs.root)
        .map(|bytes| crate::mvcc::DecodedIndexCheckpoint::decode(&bytes));
    ReadAlongside {
        wal,
        wal_took,
        index_checkpoint,
        index_took: began.elapsed(),
    }
}

/// The peer TLS configuration, when `--peer-cert-file` and friends are set.
pub(super) fn peer_tls(cfg: &Config) -> Result<Option<crate::tls::PeerTls>> {
    cfg.peer_tls_files()
        .map(|files| crate::tls::PeerTls::load(&files).map_err(ServerError::Startup))
        .transpose()
}

impl Node {
    /// Recovers the member from its data dir and starts the Raft loop and
    /// the auto-compactor on the current executor.
    pub async fn start(cfg: &Config) -> Result<Rc<Node>> {
        let mut phases = StartupPhases::begin();
        let dirs = DataDirs::new(&cfg.data_dir());
        for dir in [&dirs.root, &dirs.wal, &dirs.snap] {
            create_dir_durable(dir)?;
        }
        // Backup streams interrupted by a crash are never part of the state.
        if let Ok(entries) = std::fs::read_dir(&dirs.snap) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("backup-") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let engine_dir = EngineDir::open(&dirs.snap, cfg.engine_kind())?
            .with_cache_bytes(cfg.engine_cache_bytes);
        // The WAL and the key index checkpoint do not depend on the engine:
        // they are read and decoded on a thread of their own while the
        // engine loads (each takes 0.05-1 s for a store of 1M keys).
        let (engine, alongside) = std::thread::scope(|scope| {
            let reader = std::thread::Builder::new()
                .name("metcd-recover".into())
                .spawn_scoped(scope, || read_wal_and_index_checkpoint(&dirs));
            let engine = engine_dir.open_engine();
            let alongside = match reader {
                Ok(reader) => reader.join().map_err(|_| {
                    ServerError::Startup("the thread reading the WAL panicked".into())
                }),
                // No thread to be had: read them here, after the engine.
                Err(_) => Ok(read_wal_and_index_checkpoint(&dirs)),
            };
            (engine, alongside)
        });
        let engine = engine?;
        let engine_applied = engine.applied_index();
        let alongside = alongside?;
        phases.done("open the engine");
        log(format_args!(
            "start-up: alongside it: read the WAL {} ms, decode the key index checkpoint {} ms",
            alongside.wal_took.as_millis(),
            alongside.index_took.as_millis()
        ));
        let mut recovered = alongside.wal?;
        let index_checkpoint = alongside.index_checkpoint;
        if raftlog::adopt_installed_snapshot(
            &mut recovered,
            engine_applied,
            read_installed_snapshot(&dirs),
        ) {
            // Wal::open writes the adopted marker into its first frame.
            log(format_args!(
                "the engine holds a leader's snapshot at index {engine_applied} whose WAL marker was lost \
                 in a crash; its marker kept in member/{INSTALLED_SNAPSHOT} stands in"
            ));
        }
        if let Some((path, offset)) = &recovered.truncated {
            log(format_args!(
                "wal: cut a torn tail in {} at offset {offset} (an unacknowledged group commit)",
                path.display()
            ));
        }
        let initial = cfg
            .initial_members()
            .map_err(|e| ServerError::Startup(e.to_string()))?;
        let (cluster_id, id) = resolve_identity(cfg)?;
        let all_ids: Vec<u64> = initial.iter().map(|m| m.id).collect();
        let joining = cfg.initial_cluster_state == "existing";
        // A new cluster starts with all of --initial-cluster as voters. A
        // joining member starts from the membership its peers reported
        // (the bootstrap voters are in no log entry it could replay); the
        // leader's log then brings it up to date.
        let join_roster: Vec<MemberRecord> = if joining {
            std::fs::read(dirs.root.join("member").join("join-members.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let initial_conf = if joining {
            ConfState {
                voters: join_roster
                    .iter()
                    .filter(|m| !m.is_learner)
                    .map(|m| m.id)
                    .collect(),
                learners: join_roster
                    .iter()
                    .filter(|m| m.is_learner)
                    .map(|m| m.id)
                    .collect(),
                ..Default::default()
            }
        } else {
            ConfState {
                voters: all_ids.clone(),
                ..Default::default()
            }
        };
        match raftlog::check_engine_against_wal(&recovered, engine_applied) {
            Ok(()) => {}
            Err(raftlog::EngineWalMismatch::WalReleasedPastEngine { marker }) => {
                return Err(ServerError::Startup(format!(
                    "the WAL was released up to index {marker} but the newest snapshot in {} is at {engine_applied}: \
                     the snapshot directory is older than the WAL (restored from an old backup?); restore both together",
                    dirs.snap.display()
                )));
            }
            Err(raftlog::EngineWalMismatch::WalMissing { wal_end }) => {
                return Err(ServerError::Startup(format!(
                    "the snapshot in {} is at index {engine_applied} but the WAL ends at {wal_end}: WAL data is missing; \
                     restore this member from a backup or re-add it to its cluster",
                    dirs.snap.display(),
                )));
            }
        }
        let restored = raftlog::restore(&recovered, engine_applied, &initial_conf)?;
        if restored.discarded > 0 {
            log(format_args!(
                "dropped {} log entries after the snapshot: a branch the leader's snapshot replaced \
                 (their terms go down)",
                restored.discarded
            ));
        }
        phases.done("restore the raft log");
        let never_started = recovered.state.is_none()
            && recovered.entries.is_empty()
            && recovered.snapshot.is_none()
            && engine_applied == 0;
        if !joining && never_started {
            // etcd bootstraps a new cluster's log with its ConfChange
            // entries at term 1, so its first leader is elected at term 2
            // and every response header of a fresh cluster says
            // `raft_term: 2`. Starting at term 1 gives clients the same
            // numbers (our bootstrap voters live in the ConfState instead).
            restored.storage.wl().mut_hard_state().term = 1;
        }
        let (mvcc, index_source) =
            MvccStore::open_with_decoded_checkpoint(engine.clone(), index_checkpoint, cluster_id)?;
        let checkpoint_revision = report_index_source(&index_source);
        if checkpoint_revision.is_some()
            && std::env::var_os("METCD_VERIFY_INDEX_CHECKPOINT").is_some()
        {
            mvcc.verify_index().map_err(|e| {
                ServerError::Startup(format!(
                    "METCD_VERIFY_INDEX_CHECKPOINT: the checkpoint loaded wrong: {e}"
                ))
            })?;
            log(format_args!(
                "key index: checked against a full rebuild (METCD_VERIFY_INDEX_CHECKPOINT)"
            ));
        }
        phases.done("load the key index");
        // Membership changes applied into the engine are newer than any
        // WAL snapshot marker (the engine is at or past it).
        if let Some(cs) = conf_kept_in(&mvcc, engine_applied)? {
            restored.storage.wl().set_conf_state(cs);
        }
        let conf = restored.storage.initial_state()?.conf_state;
        let single_voter = conf.voters == [id] && conf.learners.is_empty();
        let in_conf = conf.voters.contains(&id) || conf.learners.contains(&id);
        let unknown = conf.voters.is_empty() && conf.learners.is_empty();
        if !in_conf && !unknown {
            return Err(ServerError::Startup(format!(
                "member {id:x} (from --initial-advertise-peer-urls and --initial-cluster-token) is not in the \
                 cluster this data dir belongs to (members {:x?}); start it with the flags it was created with",
                conf.voters
            )));
        }
        // Only committed entries are sure to apply before peers are heard.
        let catch_up_to = if single_voter {
            restored.last_index
        } else {
            restored.storage.initial_state()?.hard_state.commit
        };
        let (lessor, mut auth, alarms) = crate::apply::restore_beside_mvcc(
            &mvcc,
            crate::lease::min_ttl_secs(cfg.election_timeout),
            Instant::now(),
        )?;
        auth.set_token_settings(
            cfg.token_settings()
                .map_err(|e| ServerError::Startup(e.to_string()))?,
        );
        phases.done("restore leases, auth, alarms");
        let wal = Wal::open(
            &dirs.wal,
            WalOptions {
                segment_bytes: cfg.wal_segment_bytes,
                preallocate: true,
                dsync: cfg.wal_dsync,
            },
            &recovered,
        )
        .await?;
        log(format_args!(
            "recovered {} log entries after snapshot index {}, applied index {}, revision {}",
            recovered.entries.len(),
            recovered.snapshot.as_ref().map_or(0, |(i, _)| *i),
            restored.applied,
            mvcc.current_revision(),
        ));
        drop(recovered);
        phases.done("open the WAL");

        let raft_cfg = crate::ready::raft_config(
            id,
            restored.applied,
            (cfg.election_timeout / cfg.heartbeat_interval).max(2) as usize,
        );
        raft_cfg.validate()?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let removed_members: std::collections::HashSet<u64> = mvcc
            .meta_with_prefix(REMOVED_META)?
            .into_iter()
            .filter_map(|(name, _)| {
                let id: [u8; 8] = name.get(REMOVED_META.len()..)?.try_into().ok()?;
                Some(u64::from_be_bytes(id))
            })
            .collect();
        let raft_store = restored.storage.clone();
        let mut raw = RawNode::new(&raft_cfg, restored.storage, &logger)?;
        if single_voter {
            // A one-voter group elects itself at once.
            raw.campaign()?;
        }
        let mut registry = Registry::default();
        for m in &join_roster {
            registry.upsert(m.clone());
        }
        for m in initial.iter().filter(|_| !joining) {
            registry.upsert(MemberRecord {
                id: m.id,
                name: String::new(),
                peer_urls: m.peer_urls.clone(),
                client_urls: Vec::new(),
                is_learner: false,
            });
        }
        load_member_records(&mvcc, &mut registry)?;
        registry.retain(|m| {
            conf.voters.contains(&m.id)
                || conf.learners.contains(&m.id)
                || (conf.voters.is_empty() && conf.learners.is_empty())
        });
        let my_attrs = MemberRecord {
            id,
            name: cfg.name.clone(),
            peer_urls: crate::config::split_list(&cfg.initial_advertise_peer_urls)
                .into_iter()
                .map(String::from)
                .collect(),
            client_urls: crate::config::split_list(
                cfg.advertise_client_urls
                    .as_deref()
                    .unwrap_or(&cfg.listen_client_urls),
            )
            .into_iter()
            .map(String::from)
            .collect(),
            is_learner: false,
        };
        let peer_addrs = cfg
            .peer_listen_addrs()
            .map_err(|e| ServerError::Startup(e.to_string()))?;
        // Always there (idle without peers), so a member added later is
        // reachable; inbound needs --listen-peer-urls on a single member.
        let faults = peer::Faults::new(cfg.experimental_peer_fault_file.clone());
        let tls = peer_tls(cfg)?;
        let transport = Transport::new(id, cluster_id, faults.clone(), tls.clone());
        for m in registry.all() {
            connect_peer(&transport, &m);
        }

        let boot_nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let member = Rc::new(Member {
            id,
            cluster_id,
            registry: RefCell::new(registry),
            my_attrs,
            transport,
            stopping_since: Cell::new(None),
            serving: Cell::new(false),
            strict_reconfig: cfg.strict_reconfig_check,
            stop_transfer_limit: Duration::from_millis(2 * cfg.election_timeout),
            removed: Cell::new(false),
            removed_members: RefCell::new(removed_members),
        });
        let node = Rc::new(Node {
            member,
            metrics: Default::default(),
            progress: RefCell::new(HashMap::new()),
            transfer_to: Cell::new(None),
            inbound: RefCell::new(Vec::new()),
            read_rounds: RefCell::new(ReadRounds::new(id)),
            solo: Cell::new(single_voter),
            learner: Cell::new(conf.learners.contains(&id)),
            was_leader: Cell::new(false),
            heartbeats_sent: RefCell::new(HashMap::new()),
            leads_settled: Cell::new(false),
            request_timeout: REQUEST_TIMEOUT_BASE + Duration::from_millis(2 * cfg.election_timeout),
            mvcc: RefCell::new(mvcc),
            engine: RefCell::new(engine),
            engine_dir,
            raft_store: raft_store.clone(),
            incoming_snapshots: RefCell::new(HashMap::new()),
            snapshot_sends: RefCell::new(Default::default()),
            snapshot_reports: RefCell::new(Vec::new()),
            catch_up_entries: cfg.experimental_snapshot_catchup_entries,
            last_snapshot_index: Cell::new(engine_applied),
            dirs,
            queue: RefCell::new(Vec::new()),
            queue_ready: Notify::default(),
            pending: RefCell::new(HashMap::new()),
            // Unique across restarts: entries replayed from an earlier run
            // must never match a proposal of this run.
            next_id: Cell::new(boot_nanos),
            fatal: RefCell::new(None),
            status: Cell::new(NodeStatus::default()),
            lessor: RefCell::new(lessor),
            auth: RefCell::new(auth),
            replayed_commit_index: catch_up_to,
            auth_flag: RefCell::new(Default::default()),
            read_view: RefCell::new(std::sync::Arc::new(crate::read_view::ReadView::new(
                Default::default(),
            ))),
            watch_subscribers: RefCell::new(Vec::new()),
            snapshot_done: RefCell::new(None),
            warned_snapshot: Cell::new(false),
            snapshot_in_flight: Cell::new(false),
            snapshot_retry_at: Cell::new(None),
            snapshot_started: Cell::new(None),
            snapshot_hurry_at: Cell::new(None),
            snapshot_pacing: Cell::new((0, 0)),
            snapshot_pacing_pending: Cell::new(None),
            index_checkpointing: RefCell::new(IndexCheckpointing::loaded(
                checkpoint_revision.unwrap_or(0),
            )),
            applied_terms: RefCell::new(raftlog::TermStarts::default()),
            max_request_bytes: cfg.max_request_bytes,
            max_pending: cfg.max_pending_proposals,
            backend_quota: cfg.backend_quota(),
            alarms: RefCell::new(alarms),
            nospace_proposed_at: Cell::new(None),
            nospace_wanted: Cell::new(false),
            checkpoint_resets: RefCell::new(Default::default()),
            checkpoints_in_flight: RefCell::new(Default::default()),
            max_batch: cfg.wal_max_batch,
            batch_window: Duration::from_micros(cfg.wal_batch_window_us),
            snapshot_count: cfg.snapshot_count,
            tick_interval: Duration::from_millis(cfg.heartbeat_interval),
        });
        node.refresh_status(&raw, &wal);
        let weak = Rc::downgrade(&node);
        let deliver: peer::Deliver = Rc::new(move |m: Message| {
            if let Some(node) = weak.upgrade() {
                node.inbound.borrow_mut().push(m);
                node.queue_ready.notify();
            }
        });
        node.publish_read_view();
        let weak = Rc::downgrade(&node);
        let roster: peer::Roster = Rc::new(move || {
            weak.upgrade()
                .map(|node| node.members())
                .unwrap_or_default()
        });
        let weak = Rc::downgrade(&node);
        let deliver_snapshot = Rc::new(move |m: Message, file: PathBuf| {
            if let Some(node) = weak.upgrade() {
                let index = m.get_snapshot().get_metadata().index;
                if let Some(old) = node.incoming_snapshots.borrow_mut().insert(index, file) {
                    let _ = std::fs::remove_file(old);
                }
                node.inbound.borrow_mut().push(m);
                node.queue_ready.notify();
            }
        });
        let weak = Rc::downgrade(&node);
        let query: peer::QueryHandler = Rc::new(move |q: peer::PeerQuery| {
            let node = weak.upgrade();
            Box::pin(async move {
                match node {
                    Some(node) => node.answer_peer(q).await,
                    None => peer::PeerAnswer::NotLeader,
                }
            })
        });
        let weak = Rc::downgrade(&node);
        let is_removed = Rc::new(move |member: u64| {
            weak.upgrade()
                .is_some_and(|node| node.member.removed_members.borrow().contains(&member))
        });
        let inbound = Rc::new(peer::Inbound {
            is_removed,
            deliver,
            roster,
            faults: faults.clone(),
            snapshot_dir: node.dirs.snap.clone(),
            deliver_snapshot,
            query,
            traffic: node.member.transport.traffic(),
        });
        for addr in peer_addrs {
            // A member killed a moment ago may still hold the port.
            crate::net::retry_while_in_use(|| {
                peer::listen(addr.clone(), id, cluster_id, inbound.clone(), tls.clone())
            })
            .map_err(|e| ServerError::Startup(format!("cannot listen for peers on {addr}: {e}")))?;
        }
        let looped = node.clone();
        glommio::spawn_local(async move {
            if let Err(e) = looped.run(raw, wal).await {
                looped.fail(format!("raft loop stopped: {e}"));
            }
        })
        .detach();
        let compactor = Compactor::new(
            cfg.auto_compaction()
                .map_err(|e| ServerError::Startup(e.to_string()))?,
        );
        glommio::spawn_local(auto_compact(node.clone(), compactor)).detach();
        glommio::spawn_local(expire_leases(node.clone())).detach();
        glommio::spawn_local(publish_attributes(node.clone())).detach();
        node.wait_applied(catch_up_to).await?;
        if cfg.experimental_initial_corrupt_check {
            node.check_initial_hash().await?;
        }
        let corrupt_check = cfg
            .corrupt_check_interval()
            .map_err(|e| ServerError::Startup(e.to_string()))?;
        if let Some(every) = corrupt_check {
            glommio::spawn_local(check_corruption_periodically(node.clone(), every)).detach();
        }
        let lease_checkpoints = cfg
            .lease_checkpoint_interval()
            .map_err(|e| ServerError::Startup(e.to_string()))?;
        if let Some(every) = lease_checkpoints {
            glommio::spawn_local(checkpoint_leases(node.clone(), every)).detach();
        }
        Ok(node)
    }
}
