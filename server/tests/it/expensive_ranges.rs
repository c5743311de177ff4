//! Expensive ranges never block writes (the product card's promise): on a
//! one-shard member, where every request shares one core, a stream of puts
//! keeps being acknowledged while clients scan a large prefix back to
//! back, and every scan answers the whole prefix at one revision.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use etcd_client::{GetOptions, Txn, TxnOp};

use crate::etcd_client::{connect, runtime, within};
use crate::support::Server;

const SCANNED_KEYS: usize = 10_000;
const SCANNERS: usize = 3;
const PUTS: usize = 300;
/// Scans each scanner does at most (the loop's bound if puts stalled).
const MAX_SCANS_EACH: usize = 2_000;

#[test]
fn puts_are_acknowledged_while_large_ranges_run_on_one_shard() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &["--shards", "1"]);
    runtime().block_on(async {
        let mut c = connect(&s).await;
        let value = "v".repeat(256);
        let keys: Vec<String> = (0..SCANNED_KEYS).map(|i| format!("/scan/{i:06}")).collect();
        for chunk in keys.chunks(128) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|k| TxnOp::put(k.as_str(), value.as_str(), None))
                .collect();
            within("prefill", c.txn(Txn::new().and_then(ops)))
                .await
                .unwrap();
        }

        let writing = Arc::new(AtomicBool::new(true));
        let scans_during_puts = Arc::new(AtomicUsize::new(0));
        let mut scanners = Vec::new();
        for _ in 0..SCANNERS {
            let mut scanner = connect(&s).await;
            let (writing, during) = (writing.clone(), scans_during_puts.clone());
            scanners.push(tokio::spawn(async move {
                let mut revisions = Vec::new();
                for _ in 0..MAX_SCANS_EACH {
                    if !writing.load(Ordering::Acquire) {
                        break;
                    }
                    let got = within(
                        "scan",
                        scanner.get("/scan/", Some(GetOptions::new().with_prefix())),
                    )
                    .await
                    .unwrap();
                    assert_eq!(got.kvs().len(), SCANNED_KEYS, "a scan missed keys");
                    assert_eq!(got.count(), SCANNED_KEYS as i64);
                    revisions.push(got.header().unwrap().revision());
                    if writing.load(Ordering::Acquire) {
                        during.fetch_add(1, Ordering::AcqRel);
                    }
                }
                revisions
            }));
        }
        // Puts start once the first scans are in flight.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut last_rev = 0;
        for i in 0..PUTS {
            let put = within("put while scanning", c.put(format!("/w/{i}"), "x", None))
                .await
                .unwrap();
            let rev = put.header().unwrap().revision();
            assert!(rev > last_rev, "revisions go up: {rev} after {last_rev}");
            last_rev = rev;
        }
        writing.store(false, Ordering::Release);
        for scanner in scanners {
            let revisions = scanner.await.unwrap();
            assert!(
                revisions.windows(2).all(|w| w[0] <= w[1]),
                "one client's scans never go back in revision: {revisions:?}"
            );
        }
        let during = scans_during_puts.load(Ordering::Acquire);
        assert!(
            during >= SCANNERS,
            "scans were in flight while the {PUTS} puts ran: {during} completed"
        );
        let written = within(
            "read back",
            c.get(
                "/w/",
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        )
        .await
        .unwrap();
        assert_eq!(
            written.count(),
            PUTS as i64,
            "every acknowledged put is there"
        );
    });
}
