//! Expensive reads never block writes (the product card's promise): on a
//! one-shard member, where every request shares one core, a stream of puts
//! keeps being acknowledged while clients scan a large prefix back to
//! back (every scan answers the whole prefix at one revision), or while
//! watchers read that prefix's whole history (each gets every event once,
//! in order), and a progress notification never names a revision whose
//! events have not gone out yet.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use etcd_client::{Client, GetOptions, Txn, TxnOp, WatchOptions};

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
        prefill(&mut c).await;

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

/// Puts [`SCANNED_KEYS`] keys of 256 bytes under `/scan/`, 128 per txn.
/// Returns the revision after them.
async fn prefill(c: &mut Client) -> i64 {
    let value = "v".repeat(256);
    let keys: Vec<String> = (0..SCANNED_KEYS).map(|i| format!("/scan/{i:06}")).collect();
    let mut revision = 0;
    for chunk in keys.chunks(128) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|k| TxnOp::put(k.as_str(), value.as_str(), None))
            .collect();
        let done = within("prefill", c.txn(Txn::new().and_then(ops)))
            .await
            .unwrap();
        revision = done.header().unwrap().revision();
    }
    revision
}

const HISTORY_READERS: usize = 3;
/// Whole-history watches each reader creates at most.
const MAX_HISTORIES_EACH: usize = 200;
/// Puts between two progress requests of the live watcher.
const PROGRESS_EVERY: usize = 30;

#[test]
fn puts_are_acknowledged_while_watchers_read_long_histories_on_one_shard() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &["--shards", "1"]);
    runtime().block_on(async {
        let mut c = connect(&s).await;
        let prefilled = prefill(&mut c).await;
        let (mut live, mut live_events) = within(
            "live watch",
            c.watch("/w/", Some(WatchOptions::new().with_prefix())),
        )
        .await
        .unwrap();

        let writing = Arc::new(AtomicBool::new(true));
        let histories_during_puts = Arc::new(AtomicUsize::new(0));
        let mut readers = Vec::new();
        for _ in 0..HISTORY_READERS {
            let mut reader = connect(&s).await;
            let (writing, during) = (writing.clone(), histories_during_puts.clone());
            readers.push(tokio::spawn(async move {
                for _ in 0..MAX_HISTORIES_EACH {
                    if !writing.load(Ordering::Acquire) {
                        break;
                    }
                    let options = WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(1)
                        .with_prev_key();
                    let (mut watcher, mut events) =
                        within("history watch", reader.watch("/scan/", Some(options)))
                            .await
                            .unwrap();
                    let mut seen = Vec::with_capacity(SCANNED_KEYS);
                    while seen.len() < SCANNED_KEYS {
                        let resp = within("history", events.message())
                            .await
                            .unwrap()
                            .expect("the history stream ended early");
                        assert!(!resp.canceled(), "history watch canceled: {resp:?}");
                        for e in resp.events() {
                            let kv = e.kv().unwrap();
                            seen.push((kv.mod_revision(), kv.key().to_vec()));
                        }
                    }
                    assert_eq!(seen.len(), SCANNED_KEYS, "every prefilled key once");
                    assert!(
                        seen.windows(2).all(|w| w[0] < w[1]),
                        "history in revision order, each event once"
                    );
                    assert_eq!(seen.last().unwrap().0, prefilled);
                    watcher.cancel().await.unwrap();
                    if writing.load(Ordering::Acquire) {
                        during.fetch_add(1, Ordering::AcqRel);
                    }
                }
            }));
        }
        // Puts start once the first history reads are in flight.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut delivered = Vec::new();
        for i in 0..PUTS {
            let put = within(
                "put while reading history",
                c.put(format!("/w/{i}"), "x", None),
            )
            .await
            .unwrap();
            let rev = put.header().unwrap().revision();
            if i % PROGRESS_EVERY != PROGRESS_EVERY - 1 {
                continue;
            }
            // Everything up to the acknowledged put arrives before the
            // progress notification that covers it.
            live.request_progress().await.unwrap();
            loop {
                let resp = within("live watch", live_events.message())
                    .await
                    .unwrap()
                    .expect("the live watch ended");
                if resp.events().is_empty() && !resp.created() && !resp.canceled() {
                    let progress = resp.header().unwrap().revision();
                    assert!(
                        progress >= rev,
                        "progress at {progress} after a put at {rev}"
                    );
                    assert_eq!(
                        delivered.last(),
                        Some(&rev),
                        "progress at {progress} came before the event of the put at {rev}"
                    );
                    break;
                }
                delivered.extend(resp.events().iter().map(|e| e.kv().unwrap().mod_revision()));
            }
        }
        writing.store(false, Ordering::Release);
        for reader in readers {
            reader.await.unwrap();
        }
        let during = histories_during_puts.load(Ordering::Acquire);
        assert!(
            during >= HISTORY_READERS,
            "history reads were in flight while the {PUTS} puts ran: {during} completed"
        );
        while delivered.len() < PUTS {
            let resp = within("live watch", live_events.message())
                .await
                .unwrap()
                .expect("the live watch ended");
            delivered.extend(resp.events().iter().map(|e| e.kv().unwrap().mod_revision()));
        }
        let want: Vec<i64> = (prefilled + 1..=prefilled + PUTS as i64).collect();
        assert_eq!(
            delivered, want,
            "the live watcher saw every put once, in order"
        );
    });
}

const BIG_KEYS: usize = 1500;
const BIG_VALUE: usize = 64 << 10;

/// Key `i`'s value in [`a_large_range_is_sent_without_holding_it_whole`].
fn big_value(i: usize) -> Vec<u8> {
    (0..BIG_VALUE)
        .map(|j| b'a' + ((i + j) % 26) as u8)
        .collect()
}

/// A member answering a range of ~96 MiB to etcdctl, or its JSON to curl
/// through the gateway (HTTP/1.1 and HTTP/2) or the seed HTTP API, never
/// holds the answer whole: its peak resident memory during each read grows by less
/// than half the answer (answering it whole, values plus their encoding,
/// took about twice the answer: +228 MiB to etcdctl). Each client gets
/// every key and value, in order.
#[test]
fn a_large_range_is_sent_without_holding_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    runtime().block_on(async {
        let mut c = connect(&s).await;
        // 16 values of 64 KiB per txn: 1 MiB, under --max-request-bytes.
        for first in (0..BIG_KEYS).step_by(16) {
            let ops: Vec<TxnOp> = (first..(first + 16).min(BIG_KEYS))
                .map(|i| TxnOp::put(format!("/big/{i:06}"), big_value(i), None))
                .collect();
            within("fill", c.txn(Txn::new().and_then(ops)))
                .await
                .unwrap();
        }
    });
    let pid = s.pid().unwrap();
    let status = || std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = |field: &str| -> u64 {
        let status = status();
        let line = status.lines().find_map(|l| l.strip_prefix(field)).unwrap();
        line.trim().trim_end_matches("kB").trim().parse().unwrap()
    };
    // How much the member's resident memory peaked above where it was
    // while `read` ran.
    let peak_growth = |read: &mut dyn FnMut()| {
        let before = kib("VmRSS:");
        // Resets the peak (VmHWM) to the current resident size.
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
        read();
        (kib("VmHWM:").saturating_sub(before), before)
    };
    let answer_kib = (BIG_KEYS * BIG_VALUE / 1024) as u64;
    let (grown, before) = peak_growth(&mut || etcdctl_reads_every_big_key(&s));
    assert!(
        grown < answer_kib / 2,
        "resident memory grew by {grown} KiB while sending a {answer_kib} KiB answer \
         (from {before} KiB)"
    );
    let (grown, before) = peak_growth(&mut || seed_api_reads_every_big_key(&s));
    assert!(
        grown < answer_kib / 2,
        "seed API: resident memory grew by {grown} KiB while sending a {answer_kib} KiB \
         answer as JSON (from {before} KiB)"
    );
    for http in ["--http1.1", "--http2-prior-knowledge"] {
        let (grown, before) = peak_growth(&mut || curl_reads_every_big_key(&s, http));
        assert!(
            grown < answer_kib / 2,
            "{http}: resident memory grew by {grown} KiB while sending a {answer_kib} KiB \
             answer as JSON (from {before} KiB)"
        );
    }
}

/// `GET /big/?prefix` on the seed HTTP API, its revision header as the
/// answer's.
fn seed_api_reads_every_big_key(s: &Server) {
    let headers = tempfile::NamedTempFile::new().unwrap();
    let headers_path = headers.path().to_string_lossy().to_string();
    let url = format!("http://{}/big/?prefix", s.addr());
    let answer = curl_json(&["-D", &headers_path, &url]);
    let headers = std::fs::read_to_string(headers.path()).unwrap();
    let revision = answer["header"]["revision"].as_str().unwrap();
    assert!(
        headers
            .lines()
            .any(|l| l.trim_end() == format!("x-metcd-revision: {revision}")),
        "{headers}"
    );
    let kvs = answer["kvs"].as_array().unwrap();
    assert_eq!(kvs.len(), BIG_KEYS);
    assert_eq!(answer["count"], BIG_KEYS.to_string());
    assert_eq!(answer["more"], false);
    for (i, kv) in kvs.iter().enumerate() {
        assert_eq!(kv["key"], format!("/big/{i:06}"), "key {i}");
        assert!(
            kv["value"].as_str().unwrap().as_bytes() == big_value(i),
            "value of key {i}"
        );
    }
}

fn etcdctl_reads_every_big_key(s: &Server) {
    let out = crate::etcd_peer::etcdctl_with(
        &s.client_endpoint(),
        &["--command-timeout=120s"],
        &["get", "--prefix", "/big/"],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // etcdctl prints each key and its value on lines of their own.
    let mut lines = out.stdout.split(|b| *b == b'\n');
    for i in 0..BIG_KEYS {
        assert_eq!(
            lines.next().unwrap(),
            format!("/big/{i:06}").as_bytes(),
            "key {i}"
        );
        assert!(lines.next().unwrap() == big_value(i), "value of key {i}");
    }
}

/// What curl gets with `args`, as JSON (it must succeed).
fn curl_json(args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "120"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `/v3/kv/range` of the prefix `/big/` through the JSON gateway.
fn curl_reads_every_big_key(s: &Server, http: &str) {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let body = format!(
        r#"{{"key":"{}","range_end":"{}"}}"#,
        b64(b"/big/"),
        b64(b"/big0")
    );
    let url = format!("http://{}/v3/kv/range", s.client_endpoint());
    let answer = curl_json(&[http, "-X", "POST", &url, "-d", &body]);
    let kvs = answer["kvs"].as_array().unwrap();
    assert_eq!(kvs.len(), BIG_KEYS, "{http}");
    assert_eq!(answer["count"], BIG_KEYS.to_string(), "{http}");
    for (i, kv) in kvs.iter().enumerate() {
        assert_eq!(
            kv["key"],
            b64(format!("/big/{i:06}").as_bytes()),
            "{http}: key {i}"
        );
        assert!(
            kv["value"] == b64(&big_value(i)),
            "{http}: value of key {i}"
        );
    }
}
