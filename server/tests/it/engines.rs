//! The on-disk engines behind the etcd API: Maintenance Defragment shrinks
//! the btree file and the data survives it and a restart.

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
