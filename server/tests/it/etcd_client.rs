//! The Rust `etcd-client` crate (tonic/tokio) against metcd: every service
//! metcd serves, 1000 watchers on one stream, and a lease that expires while
//! watched.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, LeaseGrantOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, WatchOptions,
};

use crate::support::Server;

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub async fn connect(s: &Server) -> Client {
    Client::connect([format!("http://{}", s.client_endpoint())], None)
        .await
        .unwrap()
}

/// Bounds every await: a hung server fails the test instead of hanging CI.
pub async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: timed out"))
}

#[test]
fn kv_txn_compact_and_maintenance() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    runtime().block_on(async {
        let mut c = connect(&s).await;
        let put = c.put("foo", "bar", None).await.unwrap();
        let rev1 = put.header().unwrap().revision();
        assert_eq!(rev1, 2, "a fresh store is at revision 1, as etcd's");
        let prev = c
            .put("foo", "baz", Some(PutOptions::new().with_prev_key()))
            .await
            .unwrap();
        assert_eq!(prev.prev_key().unwrap().value(), b"bar");
        let old = c
            .get("foo", Some(GetOptions::new().with_revision(rev1)))
            .await
            .unwrap();
        assert_eq!(old.kvs()[0].value(), b"bar");

        for i in 0..10 {
            c.put(format!("k/{i:02}"), format!("{i}"), None)
                .await
                .unwrap();
        }
        let page = c
            .get(
                "k/",
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_limit(3)
                        .with_sort(SortTarget::Key, SortOrder::Descend),
                ),
            )
            .await
            .unwrap();
        let keys: Vec<&str> = page.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
        assert_eq!(keys, ["k/09", "k/08", "k/07"]);
        assert_eq!(page.count(), 10);
        assert!(page.more());

        // Kubernetes' create and update patterns.
        let create = Txn::new()
            .when([Compare::mod_revision("pod", CompareOp::Equal, 0)])
            .and_then([TxnOp::put("pod", "v1", None)])
            .or_else([TxnOp::get("pod", None)]);
        let r = c.txn(create.clone()).await.unwrap();
        assert!(r.succeeded());
        let created = r.header().unwrap().revision();
        let again = c.txn(create).await.unwrap();
        assert!(!again.succeeded());
        let update = Txn::new()
            .when([Compare::mod_revision("pod", CompareOp::Equal, created)])
            .and_then([TxnOp::put("pod", "v2", None)]);
        assert!(c.txn(update).await.unwrap().succeeded());

        let del = c
            .delete("k/", Some(etcd_client::DeleteOptions::new().with_prefix()))
            .await
            .unwrap();
        assert_eq!(del.deleted(), 10);

        let status = c.status().await.unwrap();
        assert!(status.version().starts_with("3."));
        assert_eq!(status.leader(), status.header().unwrap().member_id());
        let hash1 = c.hash_kv(0).await.unwrap();
        let hash2 = c.hash_kv(0).await.unwrap();
        assert_eq!(hash1.hash(), hash2.hash());
        let whole = c.hash().await.unwrap().hash();
        assert_eq!(c.hash().await.unwrap().hash(), whole, "Hash is stable");
        c.put("changes-the-hash", "x", None).await.unwrap();
        assert_ne!(c.hash().await.unwrap().hash(), whole, "Hash sees a write");
        assert_ne!(
            c.hash_kv(0).await.unwrap().hash(),
            hash1.hash(),
            "HashKV sees a write"
        );
        let members = c.member_list().await.unwrap();
        assert_eq!(members.members().len(), 1);

        let now = c
            .get("foo", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        c.compact(now, None).await.unwrap();
        let err = c
            .get("foo", Some(GetOptions::new().with_revision(rev1)))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("required revision has been compacted"),
            "{err}"
        );
    });
}

#[test]
fn a_thousand_watchers_on_one_stream_see_one_put() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    runtime().block_on(async {
        let mut c = connect(&s).await;
        let (mut watcher, mut stream) = c
            .watch("w/0", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        for i in 1..1000 {
            watcher
                .watch(format!("w/{i}"), Some(WatchOptions::new().with_prefix()))
                .await
                .unwrap();
        }
        // `watch()` consumed the first "created"; 999 more follow.
        let mut created = 1;
        while created < 1000 {
            let resp = within("created", stream.message()).await.unwrap().unwrap();
            if resp.created() {
                created += 1;
            }
        }
        // "w/1" is a prefix of w/1, w/10.., w/100..: count who should see it.
        let key = "w/100";
        let expected = (0..1000)
            .filter(|i| key.starts_with(&format!("w/{i}")))
            .count();
        c.put(key, "x", None).await.unwrap();
        let mut seen = 0;
        while seen < expected {
            let resp = within("events", stream.message()).await.unwrap().unwrap();
            for ev in resp.events() {
                assert_eq!(ev.event_type(), EventType::Put);
                assert_eq!(ev.kv().unwrap().key(), key.as_bytes());
                seen += 1;
            }
        }
        assert_eq!(seen, expected);
        watcher.request_progress().await.unwrap();
        let progress = within("progress", stream.message()).await.unwrap().unwrap();
        assert!(progress.events().is_empty());
        assert!(progress.header().unwrap().revision() >= 2);
    });
}

#[test]
fn a_lease_that_expires_while_watched() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    runtime().block_on(async {
        let mut c = connect(&s).await;
        let lease = c
            .lease_grant(2, Some(LeaseGrantOptions::new().with_id(0x4242)))
            .await
            .unwrap();
        assert_eq!(lease.id(), 0x4242);
        c.put(
            "session",
            "alive",
            Some(PutOptions::new().with_lease(lease.id())),
        )
        .await
        .unwrap();
        // Keep-alive works while we want it.
        let (mut keeper, mut responses) = c.lease_keep_alive(lease.id()).await.unwrap();
        keeper.keep_alive().await.unwrap();
        let ka = within("keepalive", responses.message())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ka.ttl(), 2);
        let ttl = c.lease_time_to_live(lease.id(), None).await.unwrap();
        assert_eq!(ttl.granted_ttl(), 2);
        assert!(c
            .leases()
            .await
            .unwrap()
            .leases()
            .iter()
            .any(|l| l.id() == 0x4242));

        let (_watcher, mut stream) = c
            .watch("session", Some(WatchOptions::new().with_prev_key()))
            .await
            .unwrap();
        // (`watch()` already consumed the "created" response.)
        // Stop keeping it alive; the leader revokes it and the key goes.
        drop(keeper);
        let resp = within("expiry", stream.message()).await.unwrap().unwrap();
        let ev = &resp.events()[0];
        assert_eq!(ev.event_type(), EventType::Delete);
        assert_eq!(ev.prev_kv().unwrap().value(), b"alive");
        assert!(c.get("session", None).await.unwrap().kvs().is_empty());
        let gone = c.lease_time_to_live(0x4242, None).await.unwrap();
        assert_eq!(gone.ttl(), -1);
        let err = c
            .put("x", "y", Some(PutOptions::new().with_lease(0x4242)))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("requested lease not found"), "{err}");
    });
}

/// Kubernetes' reflector: list at a revision, then watch from just after
/// it with progress notifications; nothing between list and watch is lost.
#[test]
fn list_then_watch_from_the_list_revision_with_progress_notify() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("m"),
        &["--experimental-watch-progress-notify-interval", "500ms"],
    );
    runtime().block_on(async {
        let mut c = connect(&s).await;
        for i in 0..5 {
            c.put(format!("/registry/pods/p{i}"), "v", None)
                .await
                .unwrap();
        }
        let list = c
            .get("/registry/pods/", Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        let list_rev = list.header().unwrap().revision();
        assert_eq!(list.kvs().len(), 5);
        // Changes after the list, before the watch starts.
        c.put("/registry/pods/p5", "v", None).await.unwrap();
        c.delete("/registry/pods/p0", None).await.unwrap();
        let (_w, mut stream) = c
            .watch(
                "/registry/pods/",
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(list_rev + 1)
                        .with_progress_notify(),
                ),
            )
            .await
            .unwrap();
        let mut events = Vec::new();
        while events.len() < 2 {
            let resp = within("events", stream.message()).await.unwrap().unwrap();
            for ev in resp.events() {
                events.push((
                    ev.event_type(),
                    ev.kv().unwrap().key_str().unwrap().to_string(),
                ));
            }
        }
        assert_eq!(
            events,
            [
                (EventType::Put, "/registry/pods/p5".to_string()),
                (EventType::Delete, "/registry/pods/p0".to_string())
            ]
        );
        // Idle: a progress notification (no events, the current revision).
        let progress = within("progress notify", stream.message())
            .await
            .unwrap()
            .unwrap();
        assert!(progress.events().is_empty());
        assert_eq!(progress.header().unwrap().revision(), list_rev + 2);
    });
}

/// A watch response larger than --max-request-bytes arrives in fragments
/// when the watcher asked for them (etcd's `fragment`), whole otherwise.
#[test]
fn big_watch_responses_are_fragmented_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &["--max-request-bytes", "16384"]);
    runtime().block_on(async {
        let mut c = connect(&s).await;
        for i in 0..3 {
            c.put(format!("big/{i}"), vec![b'o'; 5000], None)
                .await
                .unwrap();
        }
        let (_f, mut fragmented) = c
            .watch(
                "big/",
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_prev_key()
                        .with_fragment(),
                ),
            )
            .await
            .unwrap();
        let (_w, mut whole) = c
            .watch(
                "big/",
                Some(WatchOptions::new().with_prefix().with_prev_key()),
            )
            .await
            .unwrap();
        // One txn under the request limit; its events with their previous
        // values are twice that, over the limit.
        let ops: Vec<TxnOp> = (0..3)
            .map(|i| TxnOp::put(format!("big/{i}"), vec![b'x'; 5000], None))
            .collect();
        c.txn(Txn::new().and_then(ops)).await.unwrap();
        let mut pieces = Vec::new();
        let mut events = 0;
        while events < 3 {
            let resp = within("fragments", fragmented.message())
                .await
                .unwrap()
                .unwrap();
            events += resp.events().len();
            pieces.push(resp.events().len());
        }
        assert!(pieces.len() > 1, "expected fragments, got {pieces:?}");
        let one = within("whole", whole.message()).await.unwrap().unwrap();
        assert_eq!(one.events().len(), 3);
    });
}

/// Puts read the previous value only while some watcher wants `prev_kv`;
/// watchers created while puts stream in (on whichever shard their
/// connection lands) must still get every previous value right, the
/// first events after their creation included.
#[test]
fn prev_kv_watchers_created_under_writes_get_every_previous_value() {
    use std::collections::HashMap;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    runtime().block_on(async {
        let mut writer = connect(&s).await;
        let puts = 800usize;
        let writes = tokio::spawn(async move {
            // revision -> (key, value), in write order.
            let mut log = Vec::with_capacity(puts);
            for n in 0..puts {
                let (key, value) = (format!("hot/{}", n % 8), format!("v{n}"));
                let resp = within("put", writer.put(key.clone(), value.clone(), None))
                    .await
                    .unwrap();
                log.push((resp.header().unwrap().revision(), key, value));
            }
            log
        });
        let mut streams = Vec::new();
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(15)).await;
            let mut c = connect(&s).await;
            let (watcher, stream) = within(
                "watch",
                c.watch(
                    "hot/",
                    Some(WatchOptions::new().with_prefix().with_prev_key()),
                ),
            )
            .await
            .unwrap();
            streams.push((c, watcher, stream));
        }
        let log = writes.await.unwrap();
        let last_rev = log.last().unwrap().0;
        let by_rev: HashMap<i64, (String, String)> = log
            .iter()
            .map(|(r, k, v)| (*r, (k.clone(), v.clone())))
            .collect();
        // The revision of each key's write before revision `r`.
        let previous = |key: &str, r: i64| {
            log.iter()
                .filter(|(rev, k, _)| k == key && *rev < r)
                .map(|(rev, _, v)| (*rev, v.clone()))
                .next_back()
        };
        let mut checked = 0;
        for (_c, _w, mut stream) in streams {
            let mut seen = 0i64;
            while seen < last_rev {
                let resp = within("events", stream.message()).await.unwrap().unwrap();
                for ev in resp.events() {
                    let kv = ev.kv().unwrap();
                    let rev = kv.mod_revision();
                    assert!(rev > seen, "revision {rev} after {seen}");
                    seen = rev;
                    let (key, value) = &by_rev[&rev];
                    assert_eq!(
                        (kv.key_str().unwrap(), kv.value_str().unwrap()),
                        (&key[..], &value[..])
                    );
                    let want = previous(key, rev);
                    let got = ev
                        .prev_kv()
                        .map(|p| (p.mod_revision(), p.value_str().unwrap().to_string()));
                    assert_eq!(got, want, "prev_kv of {key} at revision {rev}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 0, "the watchers saw no event");
    });
}

/// The events a watch of `key` delivers after its client closed the
/// sending side of the stream (dropping etcd-client's `Watcher` does;
/// grpcurl does after its request).
async fn events_after_half_close(endpoint: &str, key: &str) -> Vec<(bool, Vec<u8>)> {
    let mut c = Client::connect([format!("http://{endpoint}")], None)
        .await
        .unwrap();
    let (watcher, mut stream) = within("watch", c.watch(key, None)).await.unwrap();
    drop(watcher);
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.put(key, "1", None).await.unwrap();
    c.delete(key, None).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let Some(resp) = within("events", stream.message()).await.unwrap() else {
            break;
        };
        for e in resp.events() {
            let kv = e.kv().unwrap();
            seen.push((e.event_type() == EventType::Put, kv.value().to_vec()));
        }
    }
    seen
}

/// etcd keeps a watch whose client closed its sending side: events still
/// arrive until the client goes. So does metcd (it used to drop the
/// stream's watchers at the half-close).
#[test]
fn a_half_closed_watch_stream_keeps_delivering_as_etcds() {
    crate::etcd_peer::require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let etcd = crate::etcd_peer::RealEtcd::start(&dir.path().join("etcd"));
    let s = Server::start(&dir.path().join("m"), &[]);
    let want = vec![(true, b"1".to_vec()), (false, Vec::new())];
    runtime().block_on(async {
        assert_eq!(events_after_half_close(&etcd.endpoint, "hc").await, want);
        assert_eq!(
            events_after_half_close(&s.client_endpoint(), "hc").await,
            want
        );
    });
}
