//! The member's background tasks: lease expiry and checkpoints,
//! auto-compaction, periodic corruption checks, the start-up publish.

use super::*;

/// The leader's expiry clock: revokes expired leases through the log.
pub(super) async fn expire_leases(node: Rc<Node>) {
    loop {
        glommio::timer::sleep(LEASE_CHECK_INTERVAL).await;
        if node.fatal.borrow().is_some() {
            return;
        }
        if !node.is_leader() {
            // Only the leader's clock decides (etcd's rule).
            continue;
        }
        let expired = node.lessor.borrow_mut().take_expired(Instant::now(), 64);
        for id in expired {
            let node = node.clone();
            glommio::spawn_local(async move {
                match node.lease_revoke(id, Caller::Member).await {
                    Ok(_) => crate::metrics::count(&node.metrics.leases_expired),
                    Err(ServerError::Lease(_)) => {}
                    Err(e) => {
                        log(format_args!("revoking expired lease {id:x}: {e}"));
                        node.lessor.borrow_mut().revoke_failed(id);
                    }
                }
            })
            .detach();
        }
    }
}

/// etcd's lease checkpoints: every `every`, the leader puts the remaining
/// TTL of each lease that outlives the interval through the log, so a new
/// leader or a restarted member starts it from there, not from a full TTL.
pub(super) async fn checkpoint_leases(node: Rc<Node>, every: Duration) {
    loop {
        glommio::timer::sleep(every).await;
        if node.fatal.borrow().is_some() || node.member.removed.get() {
            return;
        }
        if !node.leads_leases() {
            continue;
        }
        let due = node.lessor.borrow().checkpoints_due(Instant::now(), every);
        if !due.is_empty() {
            node.checkpoint_due(due.into_iter().map(|(id, _)| id).collect(), every)
                .await;
        }
    }
}

/// Proposes compactions when the auto-compaction policy says so; they go
/// through the log like any client's, so every member compacts at the same
/// revision.
pub(super) async fn auto_compact(node: Rc<Node>, mut compactor: Compactor) {
    if compactor.policy() == crate::config::AutoCompaction::Off {
        return;
    }
    loop {
        glommio::timer::sleep(compactor.tick_interval()).await;
        if node.fatal.borrow().is_some() {
            return;
        }
        let status = node.status();
        if let Some(revision) =
            compactor.tick(Instant::now(), status.revision, status.compact_revision)
        {
            let req = mvcc::Request::Compaction(mvcc::CompactionRequest {
                revision,
                physical: false,
            });
            match node.write(req, Caller::Member).await {
                Ok(_) => log(format_args!(
                    "auto-compaction: compacted to revision {revision}"
                )),
                Err(e) => log(format_args!(
                    "auto-compaction to revision {revision} failed: {e}"
                )),
            }
        }
    }
}

/// Every `every`, on the leader, while no CORRUPT alarm is on: see
/// [`Node::check_peer_hashes`]. Each check reads the whole store (on a
/// thread of its own, as the HashKV RPC does): keep the interval in
/// minutes on large stores.
pub(super) async fn check_corruption_periodically(node: Rc<Node>, every: Duration) {
    loop {
        glommio::timer::sleep(every).await;
        if node.fatal.borrow().is_some() || node.member.removed.get() {
            return;
        }
        let corrupt = node.alarms.borrow().any(crate::alarm::AlarmType::Corrupt);
        if !node.is_leader() || corrupt {
            continue;
        }
        if let Err(e) = node.check_peer_hashes().await {
            log(format_args!("corruption check: {e}"));
        }
    }
}

/// Publishes this member's name and client URLs through the log once a
/// leader exists, at every start, as etcd does; then the member serves
/// clients ([`Node::serving`]). Applying its own publish means it has
/// applied every entry committed before this start, so nothing it answers
/// from now on is older than what it answered before a crash (its durable
/// commit index may lag what it had applied and answered).
pub(super) async fn publish_attributes(node: Rc<Node>) {
    loop {
        if node.fatal.borrow().is_some() {
            return;
        }
        if node.status().leader != 0 {
            match node
                .propose(TAG_MEMBER_ATTRS, &members::encode(&node.member.my_attrs))
                .await
            {
                Ok(_) => break,
                Err(e) => log(format_args!("publishing member attributes: {e}")),
            }
        }
        glommio::timer::sleep(Duration::from_millis(200)).await;
    }
    // etcd's start-up lines, which tools (etcd's e2e harness among them)
    // wait for: the cluster version, the publish, then serving.
    log(format_args!(
        "enabled capabilities for version {}",
        crate::ETCD_CLUSTER_VERSION
            .rsplit_once('.')
            .map_or(crate::ETCD_CLUSTER_VERSION, |(major_minor, _)| major_minor)
    ));
    log(format_args!(
        "published {{Name:{} ClientURLs:[{}]}} to cluster {:x}",
        node.member.my_attrs.name,
        node.member.my_attrs.client_urls.join(" "),
        node.member.cluster_id
    ));
    node.member.serving.set(true);
    // Recovery's buffers (the WAL read, the replayed tail) are freed by now;
    // give their pages back rather than holding the start-up peak forever.
    crate::alloc::release_freed_memory();
    StartupPhases::ready();
    log(format_args!("ready to serve client requests"));
}
