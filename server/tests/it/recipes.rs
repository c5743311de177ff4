//! etcd's Lock and Election services through the Rust `etcd-client`
//! (`lock`/`unlock`, `campaign`/`proclaim`/`leader`/`observe`/`resign`):
//! mutual exclusion with contention, hand-over in queue order, release by
//! lease expiry or revoke, a waiter that gives up leaving the queue, and
//! an election followed from start to hand-over.

use std::time::Duration;

use etcd_client::{
    Client, ElectionClient, GetOptions, LeaderKey, LockOptions, ProclaimOptions, ResignOptions,
};

use crate::etcd_client::{connect, runtime, within};
use crate::support::Server;

/// Keys under `prefix`, in create order.
async fn keys_under(c: &mut Client, prefix: &str) -> Vec<String> {
    let resp = c
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_sort(
                etcd_client::SortTarget::Create,
                etcd_client::SortOrder::Ascend,
            )),
        )
        .await
        .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_string())
        .collect()
}

/// Waits (bounded) until `prefix` holds `n` keys.
async fn until_keys(c: &mut Client, prefix: &str, n: usize) -> Vec<String> {
    for _ in 0..200 {
        let keys = keys_under(c, prefix).await;
        if keys.len() == n {
            return keys;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "{prefix}: never {n} keys: {:?}",
        keys_under(c, prefix).await
    );
}

async fn lease(c: &mut Client, ttl: i64) -> i64 {
    c.lease_grant(ttl, None).await.unwrap().id()
}

fn lock_with(lease: i64) -> Option<LockOptions> {
    Some(LockOptions::new().with_lease(lease))
}

#[test]
fn locks_exclude_each_other_and_pass_in_queue_order() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &["--shards", "2"]);
    runtime().block_on(async {
        let mut c = connect(&s).await;
        let (l1, l2, l3) = (
            lease(&mut c, 60).await,
            lease(&mut c, 60).await,
            lease(&mut c, 60).await,
        );
        let held = within("lock 1", c.lock("job", lock_with(l1)))
            .await
            .unwrap();
        assert_eq!(held.key(), format!("job/{l1:x}").as_bytes());
        // The same lease again is the same hold, answered at once.
        let again = within("lock 1 again", c.lock("job", lock_with(l1)))
            .await
            .unwrap();
        assert_eq!(again.key(), held.key());

        // Two more callers, on their own connections, queue up in order.
        let mut second_client = connect(&s).await.lock_client();
        let second = tokio::spawn(async move { second_client.lock("job", lock_with(l2)).await });
        until_keys(&mut c, "job/", 2).await;
        let mut third_client = connect(&s).await.lock_client();
        let third = tokio::spawn(async move { third_client.lock("job", lock_with(l3)).await });
        let queue = until_keys(&mut c, "job/", 3).await;
        assert_eq!(
            queue,
            [
                format!("job/{l1:x}"),
                format!("job/{l2:x}"),
                format!("job/{l3:x}")
            ]
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!second.is_finished() && !third.is_finished(), "held by 1");

        // Unlock hands it to the second only.
        let unlocked = c.unlock(held.key()).await.unwrap();
        let got = within("lock 2", second).await.unwrap().unwrap();
        assert_eq!(got.key(), format!("job/{l2:x}").as_bytes());
        assert_eq!(
            got.header().unwrap().revision(),
            unlocked.header().unwrap().revision(),
            "answered with the read that found no older holder: the unlock's revision"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!third.is_finished(), "held by 2");

        // Revoking the holder's lease releases it too.
        c.lease_revoke(l2).await.unwrap();
        let got = within("lock 3", third).await.unwrap().unwrap();
        assert_eq!(got.key(), format!("job/{l3:x}").as_bytes());
        assert_eq!(keys_under(&mut c, "job/").await, [format!("job/{l3:x}")]);
    });
}

#[test]
fn a_waiter_that_gives_up_leaves_the_queue_and_expiry_releases() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    runtime().block_on(async {
        let mut c = connect(&s).await;
        // A short lease: the lock goes when it expires, nobody unlocks.
        let granted = std::time::Instant::now();
        let short = lease(&mut c, 3).await;
        let quitter = lease(&mut c, 60).await;
        let waiter = lease(&mut c, 60).await;
        let held = c.lock("q", lock_with(short)).await.unwrap();

        let mut gives_up = connect(&s).await;
        let gave_up = tokio::time::timeout(
            Duration::from_millis(500),
            gives_up.lock("q", lock_with(quitter)),
        )
        .await;
        assert!(gave_up.is_err(), "the lock is held: the call waits");
        // It had queued (its key was there right after the holder's)...
        let queued_at = held.header().unwrap().revision() + 1;
        let queued = c
            .get(
                format!("q/{quitter:x}"),
                Some(GetOptions::new().with_revision(queued_at)),
            )
            .await
            .unwrap();
        assert_eq!(
            queued.count(),
            1,
            "the waiter's key at revision {queued_at}"
        );
        // ...and its key went with its request: the holder alone is left.
        until_keys(&mut c, "q/", 1).await;
        assert_eq!(keys_under(&mut c, "q/").await, [format!("q/{short:x}")]);

        let got = within("lock after expiry", c.lock("q", lock_with(waiter)))
            .await
            .unwrap();
        assert_eq!(got.key(), format!("q/{waiter:x}").as_bytes());
        assert!(
            granted.elapsed() >= Duration::from_millis(2900),
            "acquired only once the 3 s lease expired ({:?} after its grant)",
            granted.elapsed()
        );
        let gone = c.get(held.key(), None).await.unwrap();
        assert_eq!(gone.count(), 0, "the expired holder's key is gone");
    });
}

#[test]
fn lock_errors_and_a_lock_without_a_lease() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    runtime().block_on(async {
        let mut c = connect(&s).await;
        // No lease: one of 60 s is granted for the call, as etcd's
        // session; nobody keeps it alive.
        let held = c.lock("free", None).await.unwrap();
        let key = c.get(held.key(), None).await.unwrap();
        let attached = key.kvs()[0].lease();
        assert_ne!(attached, 0);
        assert_eq!(held.key(), format!("free/{attached:x}").as_bytes());
        let ttl = c.lease_time_to_live(attached, None).await.unwrap();
        assert_eq!(ttl.granted_ttl(), 60);

        // etcd answers code Unknown with its message here.
        assert_eq!(
            grpc_error(c.lock("x", lock_with(0x7777)).await),
            (UNKNOWN, "etcdserver: requested lease not found".to_string())
        );
        assert_eq!(
            grpc_error(c.unlock("").await),
            (UNKNOWN, "etcdserver: key is not provided".to_string())
        );
        assert_eq!(keys_under(&mut c, "x/").await, Vec::<String>::new());
    });
}

/// gRPC code Unknown: what etcd's Lock and Election servers answer errors with.
const UNKNOWN: i32 = 2;

fn grpc_error<T: std::fmt::Debug>(r: Result<T, etcd_client::Error>) -> (i32, String) {
    match r {
        Err(etcd_client::Error::GRpcStatus(st)) => (st.code() as i32, st.message().to_string()),
        other => panic!("expected a gRPC error: {other:?}"),
    }
}

/// The next observed value, bounded.
async fn observed(stream: &mut etcd_client::ObserveStream) -> (String, i64) {
    let resp = within("observe", stream.message()).await.unwrap().unwrap();
    let kv = resp.kv().unwrap();
    (kv.value_str().unwrap().to_string(), kv.create_revision())
}

#[test]
fn an_election_from_campaign_to_hand_over() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &["--shards", "2"]);
    runtime().block_on(async {
        let mut c = connect(&s).await;
        let (l1, l2) = (lease(&mut c, 60).await, lease(&mut c, 60).await);
        let mut watcher = connect(&s).await.election_client();
        let mut observe = watcher.observe("svc").await.unwrap();
        assert_eq!(
            grpc_error(c.leader("svc").await),
            (UNKNOWN, "election: no leader".to_string())
        );

        let won = within("campaign 1", c.campaign("svc", "node-1", l1))
            .await
            .unwrap();
        let leader: LeaderKey = won.leader().unwrap().clone();
        assert_eq!(leader.key(), format!("svc/{l1:x}").as_bytes());
        assert_eq!(leader.lease(), l1);
        assert_eq!(leader.rev(), won.header().unwrap().revision());
        assert_eq!(
            observed(&mut observe).await,
            ("node-1".into(), leader.rev())
        );

        c.proclaim(
            "node-1:v2",
            Some(ProclaimOptions::new().with_leader(leader.clone())),
        )
        .await
        .unwrap();
        assert_eq!(
            observed(&mut observe).await,
            ("node-1:v2".into(), leader.rev())
        );
        let now = c.leader("svc").await.unwrap();
        assert_eq!(now.kv().unwrap().value(), b"node-1:v2");

        // A second candidate waits for the leader.
        let mut other: ElectionClient = connect(&s).await.election_client();
        let candidate = tokio::spawn(async move { other.campaign("svc", "node-2", l2).await });
        until_keys(&mut c, "svc/", 2).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!candidate.is_finished(), "node-1 leads");

        // A stale leadership cannot proclaim; an empty one is refused.
        let stale = LeaderKey::new()
            .with_name("svc")
            .with_key(leader.key())
            .with_rev(leader.rev() - 1)
            .with_lease(l1);
        assert_eq!(
            grpc_error(
                c.proclaim("x", Some(ProclaimOptions::new().with_leader(stale)))
                    .await
            ),
            (UNKNOWN, "election: not leader".to_string())
        );
        assert_eq!(
            grpc_error(c.resign(None).await),
            (UNKNOWN, "\"leader\" field must be provided".to_string())
        );

        c.resign(Some(ResignOptions::new().with_leader(leader.clone())))
            .await
            .unwrap();
        let won = within("campaign 2", candidate).await.unwrap().unwrap();
        let second = won.leader().unwrap();
        assert_eq!(second.key(), format!("svc/{l2:x}").as_bytes());
        assert_eq!(
            observed(&mut observe).await,
            ("node-2".into(), second.rev())
        );
        assert_eq!(
            c.leader("svc").await.unwrap().kv().unwrap().value(),
            b"node-2"
        );

        // A leadership without a key is refused, never a write of "".
        let keyless = LeaderKey::new().with_name("svc").with_lease(l1);
        assert_eq!(
            grpc_error(
                c.proclaim("x", Some(ProclaimOptions::new().with_leader(keyless)))
                    .await
            ),
            (UNKNOWN, "etcdserver: key is not provided".to_string())
        );

        // A campaigner that gives up while node-2 leads resigns: its key
        // goes. Without a lease it campaigns on a 60 s one of its own.
        let mut quitter = connect(&s).await;
        let gave_up =
            tokio::time::timeout(Duration::from_millis(500), quitter.campaign("svc", "q", 0)).await;
        assert!(gave_up.is_err(), "node-2 leads: the campaign waits");
        let left = until_keys(&mut c, "svc/", 1).await;
        assert_eq!(left, [format!("svc/{l2:x}")]);

        // The observer hangs up: its watches go with it.
        drop(observe);
        drop(watcher);
        let mut watchers = f64::NAN;
        for _ in 0..200 {
            watchers = watcher_total(&s);
            if watchers == 0.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert_eq!(watchers, 0.0, "watchers left after the observer went");
    });
}

/// `etcd_debugging_mvcc_watcher_total` from the member's `/metrics`.
fn watcher_total(s: &Server) -> f64 {
    let page = s.conn().request("GET", "/metrics", b"").unwrap().text();
    page.lines()
        .find_map(|l| {
            l.strip_prefix("etcd_debugging_mvcc_watcher_total ")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no watcher total in {page}"))
}
