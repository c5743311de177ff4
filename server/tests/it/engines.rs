//! The on-disk engines behind the etcd API: Maintenance Defragment shrinks
//! the btree file and the data survives it and a restart; big ranges read
//! from a cold block cache after a restart answer as before.

use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{CompactionOptions, DeleteOptions, GetOptions};

use crate::etcd_client::{connect, runtime, within};
use crate::support::Server;

/// The btree data file of the member's live engine directory.
fn btree_file(data: &Path) -> PathBuf {
    let snap = data.join("member").join("snap");
    let current = std::fs::read_to_string(snap.join("db.current")).unwrap();
    snap.join(current.trim()).join("data.btree")
}

#[test]
fn defragment_shrinks_the_btree_file_and_keeps_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("member");
    let mut server = Server::start(&data, &["--engine", "btree", "--snapshot-count", "500"]);
    let value = "x".repeat(1000);
    runtime().block_on(async {
        let mut c = connect(&server).await;
        for i in 0..3000 {
            within("put", c.put(format!("big/{i:05}"), value.clone(), None))
                .await
                .unwrap();
        }
        within(
            "delete",
            c.delete("big/", Some(DeleteOptions::new().with_prefix())),
        )
        .await
        .unwrap();
        let rev = within("put", c.put("kept", "yes", None))
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        within(
            "compact",
            c.compact(rev, Some(CompactionOptions::new().with_physical())),
        )
        .await
        .unwrap();
        // Enough entries for the engine to persist the deletions.
        for i in 0..1000 {
            within("put", c.put(format!("small/{i:04}"), "v", None))
                .await
                .unwrap();
        }
    });
    // The last checkpoint runs in the background; give it a bounded wait.
    let file = btree_file(&data);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !server.log_text().contains("snapshot at applied index 4")
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = std::fs::metadata(&file).unwrap().len();
    runtime().block_on(async {
        let mut c = connect(&server).await;
        within("defragment", c.defragment()).await.unwrap();
    });
    let after = std::fs::metadata(btree_file(&data)).unwrap().len();
    assert!(
        after * 2 < before,
        "defragment left {after} of {before} bytes:\n{}",
        server.log_text()
    );
    assert!(server.log_text().contains("defragmented the btree engine"));
    server.kill9();
    server.restart();
    runtime().block_on(async {
        let mut c = connect(&server).await;
        let kept = within("get", c.get("kept", None)).await.unwrap();
        assert_eq!(kept.kvs()[0].value(), b"yes");
        let small = within(
            "count",
            c.get(
                "small/",
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        )
        .await
        .unwrap();
        assert_eq!(small.count(), 1000);
        let big = within(
            "count",
            c.get(
                "big/",
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        )
        .await
        .unwrap();
        assert_eq!(big.count(), 0);
    });
}

/// Every key-value of the `big/` prefix as the member answers it: the
/// full range, the same keys-only and descending, and a page.
async fn big_prefix_answers(
    c: &mut etcd_client::Client,
) -> Vec<Vec<(Vec<u8>, Vec<u8>, i64, i64, i64)>> {
    let shapes = [
        GetOptions::new().with_prefix(),
        GetOptions::new().with_prefix().with_keys_only(),
        GetOptions::new().with_prefix().with_sort(
            etcd_client::SortTarget::Key,
            etcd_client::SortOrder::Descend,
        ),
        GetOptions::new().with_prefix().with_limit(700),
    ];
    let mut answers = Vec::new();
    for opts in shapes {
        let r = within("range", c.get("big/", Some(opts))).await.unwrap();
        answers.push(
            r.kvs()
                .iter()
                .map(|kv| {
                    let (key, value) = (kv.key().to_vec(), kv.value().to_vec());
                    (
                        key,
                        value,
                        kv.create_revision(),
                        kv.mod_revision(),
                        kv.version(),
                    )
                })
                .collect(),
        );
    }
    answers
}

/// A restarted btree or lsm member reads a big range's values from a cold
/// block cache, looked up a batch at a time (the engine reads the blocks a
/// batch misses together): the answers are the ones it gave before.
fn a_cold_member_answers_big_ranges_as_before(engine: &str) {
    let dir = tempfile::tempdir().unwrap();
    // Checkpoints every 500 entries put most of the store in the engine's
    // files, so the restart replays only a tail into memory.
    let mut server = Server::start(
        &dir.path().join("member"),
        &["--engine", engine, "--snapshot-count", "500"],
    );
    let before = runtime().block_on(async {
        let mut c = connect(&server).await;
        // Over 1 MiB of answer (sent in chunks), with overwritten keys
        // (older revisions in between) and deleted ones.
        for i in 0..2500 {
            let value = format!("{i}-{}", "v".repeat(400 + i % 300));
            within("put", c.put(format!("big/{i:05}"), value, None))
                .await
                .unwrap();
        }
        for i in (0..2500).step_by(7) {
            within("put", c.put(format!("big/{i:05}"), "again", None))
                .await
                .unwrap();
        }
        for i in (0..2500).step_by(11) {
            within("delete", c.delete(format!("big/{i:05}"), None))
                .await
                .unwrap();
        }
        big_prefix_answers(&mut c).await
    });
    assert_eq!(before[0].len(), 2500 - 2500_usize.div_ceil(11), "{engine}");
    assert!(
        before[1].iter().all(|kv| kv.1.is_empty()),
        "{engine}: keys only"
    );
    assert_eq!(before[3].len(), 700, "{engine}: the page");
    server.kill9();
    // The check of a loaded key index against a full rebuild reads every
    // block of the store: without it the cache is cold.
    server.verify_index_checkpoint = false;
    server.restart();
    let after = runtime().block_on(async {
        let mut c = connect(&server).await;
        big_prefix_answers(&mut c).await
    });
    assert!(
        after == before,
        "{engine}: answers differ after the restart"
    );
}

#[test]
fn a_cold_btree_member_answers_big_ranges_as_before() {
    a_cold_member_answers_big_ranges_as_before("btree");
}

#[test]
fn a_cold_lsm_member_answers_big_ranges_as_before() {
    a_cold_member_answers_big_ranges_as_before("lsm");
}
