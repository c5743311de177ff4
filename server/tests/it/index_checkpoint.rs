//! The key index checkpoint (issue 20, restart time): a restarted member
//! loads `member/keyindex` and reads only the revisions written after it
//! from the engine, and must then hold exactly what a full rebuild holds.
//! Every test server runs with `METCD_VERIFY_INDEX_CHECKPOINT=1` (see
//! support.rs), which makes a start-up that loaded a checkpoint compare it
//! with a full rebuild and refuse to serve on any difference; these tests
//! make sure that path is taken, across compactions and deletes, and that
//! a damaged checkpoint only costs the rebuild.

use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};

use crate::etcd_client::{connect, runtime, within};
use crate::support::Server;

/// Revisions of the key index checkpoints this member logged, in order.
fn checkpoint_revisions(s: &Server) -> Vec<i64> {
    s.log_text()
        .lines()
        .filter_map(|l| l.split("key index checkpoint at revision ").nth(1))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect()
}

/// Waits (bounded) for a key index checkpoint at or past `revision`.
fn wait_for_checkpoint_at(s: &Server, revision: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !checkpoint_revisions(s).iter().any(|r| *r >= revision) {
        assert!(
            Instant::now() < deadline,
            "no key index checkpoint at or past revision {revision}:\n{}",
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn put_range(c: &mut Client, from: usize, to: usize, value: &str) -> i64 {
    put_keys(c, "key/", from, to, value).await
}

/// Puts `{prefix}{i:05}` for `i` in `from..to`; the last revision.
async fn put_keys(c: &mut Client, prefix: &str, from: usize, to: usize, value: &str) -> i64 {
    let mut rev = 0;
    for i in from..to {
        let r = within("put", c.put(format!("{prefix}{i:05}"), value, None))
            .await
            .unwrap();
        rev = r.header().unwrap().revision();
    }
    rev
}

/// Waits (bounded) for a key index checkpoint at or past the compaction
/// at `compacted_at`, writing keys outside `key/` after the first seconds:
/// a key index checkpoint that a compaction overtook while it was written
/// is dropped, and where no checkpoint is forced (an engine whose next
/// checkpoint rewrites the store) the next one comes with more writes.
/// Returns the revision of the last write.
fn checkpoint_past_the_compaction(
    s: &Server,
    rt: &tokio::runtime::Runtime,
    compacted_at: i64,
    mut last_rev: i64,
) -> i64 {
    let began = Instant::now();
    let mut padded = 0usize;
    while !checkpoint_revisions(s).iter().any(|r| *r >= compacted_at) {
        assert!(
            began.elapsed() < Duration::from_secs(60) && padded < 5_000,
            "no key index checkpoint at or past revision {compacted_at}:\n{}",
            s.log_text()
        );
        if began.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        last_rev = rt.block_on(async {
            let mut c = connect(s).await;
            put_keys(&mut c, "pad/", padded, padded + 100, "x").await
        });
        padded += 100;
    }
    last_rev
}

async fn count(c: &mut Client, revision: i64) -> i64 {
    let opts = GetOptions::new()
        .with_prefix()
        .with_count_only()
        .with_revision(revision);
    within("count", c.get("key/", Some(opts)))
        .await
        .unwrap()
        .count()
}

async fn value(c: &mut Client, key: &str) -> Option<(String, i64, i64)> {
    let r = within("get", c.get(key, None)).await.unwrap();
    r.kvs().first().map(|kv| {
        (
            kv.value_str().unwrap().to_owned(),
            kv.create_revision(),
            kv.version(),
        )
    })
}

/// Puts, overwrites, deletes and a compaction, with checkpoints in
/// between; a kill -9; the restart must load the checkpoint (and pass the
/// full-rebuild comparison) and answer as before.
fn restart_from_the_checkpoint(engine: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(
        &dir.path().join("m"),
        &["--engine", engine, "--snapshot-count", "300"],
    );
    let rt = runtime();
    let (compacted_at, last_rev) = rt.block_on(async {
        let mut c = connect(&s).await;
        put_range(&mut c, 0, 600, "one").await;
        // Overwritten keys carry older events; deleted keys tombstones.
        put_range(&mut c, 0, 200, "two").await;
        within("delete", c.delete("key/0010", None)).await.ok();
        for i in 300..350 {
            within("delete", c.delete(format!("key/{i:05}"), None))
                .await
                .unwrap();
        }
        let compact_at = put_range(&mut c, 600, 700, "one").await;
        within("compact", c.compact(compact_at, None))
            .await
            .unwrap();
        // More history after the compaction, some of it past the next
        // checkpoint, so the restart reads newer revisions too.
        put_range(&mut c, 100, 300, "three").await;
        (compact_at, put_range(&mut c, 700, 720, "one").await)
    });
    let last_rev = checkpoint_past_the_compaction(&s, &rt, compacted_at, last_rev);
    let before = rt.block_on(async {
        let mut c = connect(&s).await;
        (
            count(&mut c, 0).await,
            count(&mut c, compacted_at).await,
            value(&mut c, "key/00150").await,
            value(&mut c, "key/00320").await,
        )
    });
    assert_eq!(before.0, 720 - 50, "{engine}: keys now");
    assert_eq!(before.1, 700 - 50, "{engine}: keys at the compaction");
    assert_eq!(
        before.2.as_ref().map(|v| (v.0.as_str(), v.2)),
        Some(("three", 3)),
        "{engine}: an overwritten key"
    );
    assert_eq!(before.3, None, "{engine}: a deleted key");

    s.restart();
    let log = s.log_text();
    assert!(
        log.contains("key index: loaded the checkpoint at revision"),
        "{engine}: the restart did not load the checkpoint:\n{log}"
    );
    assert!(
        log.contains("checked against a full rebuild"),
        "{engine}: the loaded index was not checked:\n{log}"
    );
    let after = rt.block_on(async {
        let mut c = connect(&s).await;
        let status = within("status", c.status()).await.unwrap();
        assert_eq!(status.header().unwrap().revision(), last_rev, "{engine}");
        let got = (
            count(&mut c, 0).await,
            count(&mut c, compacted_at).await,
            value(&mut c, "key/00150").await,
            value(&mut c, "key/00320").await,
        );
        // The next put of a key continues its generation (version) and
        // keeps its creation revision, whether the checkpoint knew them.
        let r = within("put", c.put("key/00150", "four", None))
            .await
            .unwrap();
        assert!(r.header().unwrap().revision() > last_rev);
        let (_, created, version) = value(&mut c, "key/00150").await.unwrap();
        assert_eq!(
            (created, version),
            (before.2.as_ref().unwrap().1, 4),
            "{engine}"
        );
        got
    });
    assert_eq!(after, before, "{engine}: answers after the restart");
}

#[test]
fn a_btree_member_restarts_from_its_key_index_checkpoint() {
    restart_from_the_checkpoint("btree");
}

#[test]
fn an_lsm_member_restarts_from_its_key_index_checkpoint() {
    restart_from_the_checkpoint("lsm");
}

#[test]
fn a_memory_member_restarts_from_its_key_index_checkpoint() {
    restart_from_the_checkpoint("memory");
}

/// A compaction past the last checkpoint makes it useless to a restart (a
/// tombstone compacted away leaves no trace): with the btree engine the
/// next checkpoint comes early, without waiting for `--snapshot-count`.
#[test]
fn a_compaction_brings_the_next_checkpoint_forward() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("m"),
        &["--engine", "btree", "--snapshot-count", "300"],
    );
    let rt = runtime();
    let first = rt.block_on(async {
        let mut c = connect(&s).await;
        put_range(&mut c, 0, 400, "one").await
    });
    wait_for_checkpoint_at(&s, 250);
    let compacted = rt.block_on(async {
        let mut c = connect(&s).await;
        let rev = put_range(&mut c, 0, 50, "two").await;
        within("compact", c.compact(rev, None)).await.unwrap();
        rev
    });
    assert!(compacted > first);
    // 50 entries: far below --snapshot-count; only the compaction can
    // bring a checkpoint.
    wait_for_checkpoint_at(&s, compacted);
}

/// A damaged checkpoint is refused and the index rebuilt from the engine:
/// nothing else changes.
#[test]
fn a_damaged_checkpoint_costs_only_the_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(
        &dir.path().join("m"),
        &["--engine", "lsm", "--snapshot-count", "300"],
    );
    let rt = runtime();
    let rev = rt.block_on(async {
        let mut c = connect(&s).await;
        put_range(&mut c, 0, 400, "one").await
    });
    wait_for_checkpoint_at(&s, 250);
    let path = dir.path().join("m").join("member").join("keyindex");
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    s.kill9();
    std::fs::write(&path, &bytes).unwrap();
    s.restart();
    let log = s.log_text();
    assert!(
        log.contains("key index: rebuilt from every revision in the engine (the key index checkpoint is damaged"),
        "{log}"
    );
    rt.block_on(async {
        let mut c = connect(&s).await;
        assert_eq!(count(&mut c, 0).await, 400);
        let status = within("status", c.status()).await.unwrap();
        assert_eq!(status.header().unwrap().revision(), rev);
    });
}
