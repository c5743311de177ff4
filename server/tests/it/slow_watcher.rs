//! A client that stops reading its watch stream: the member does not hold
//! every event for it. Its watcher stops sending once the stream's queue
//! is full (etcd's slow watchers, `etcd_debugging_mvcc_slow_watcher_total`)
//! and, once the client reads again, re-reads what it missed from
//! history: the client still gets every revision once, in order.

use std::time::Duration;

use etcd_client::{EventType, WatchOptions};

use crate::client_url_http::{get, sample};
use crate::etcd_client::{connect, runtime, within};
use crate::support::Server;

/// One revision each, more than the stream's queue holds (1024) plus what
/// the client's HTTP/2 windows take.
const PUTS: usize = 3000;
const VALUE_BYTES: usize = 8 << 10;

fn slow_watchers(s: &Server) -> f64 {
    sample(
        &get(&s.client_endpoint(), "/metrics").1,
        "etcd_debugging_mvcc_slow_watcher_total",
    )
}

/// Events queued for watch clients that they have not taken.
fn pending_events(s: &Server) -> f64 {
    sample(
        &get(&s.client_endpoint(), "/metrics").1,
        "etcd_debugging_mvcc_pending_events_total",
    )
}

#[test]
fn a_watcher_whose_client_stops_reading_catches_up_from_history() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    runtime().block_on(async {
        let mut watching = connect(&s).await;
        let (_watcher, mut stream) = within(
            "watch",
            watching.watch("/slow/", Some(WatchOptions::new().with_prefix())),
        )
        .await
        .unwrap();
        // Not read from here until every put is acknowledged.
        let mut writer = connect(&s).await;
        let value = vec![b'v'; VALUE_BYTES];
        let mut revisions = Vec::with_capacity(PUTS);
        for i in 0..PUTS {
            let put = within(
                "put",
                writer.put(format!("/slow/{i:05}"), value.clone(), None),
            )
            .await
            .unwrap();
            revisions.push(put.header().unwrap().revision());
        }
        assert_eq!(
            slow_watchers(&s),
            1.0,
            "the unread watcher did not fall behind"
        );
        // Its full queue: one event in each of 1024 responses.
        assert!(pending_events(&s) >= 1024.0, "{}", pending_events(&s));
        let mut got = Vec::with_capacity(PUTS);
        while got.len() < PUTS {
            let resp = within("events", stream.message())
                .await
                .unwrap()
                .expect("the watch stream ended");
            assert!(!resp.canceled(), "cancelled: {}", resp.cancel_reason());
            for e in resp.events() {
                assert_eq!(e.event_type(), EventType::Put);
                let kv = e.kv().unwrap();
                assert_eq!(kv.value().len(), VALUE_BYTES);
                got.push(kv.mod_revision());
            }
        }
        assert_eq!(got, revisions, "every revision once, in order");
        // Caught up, it goes on live.
        let last = within("put", writer.put("/slow/last", "x", None))
            .await
            .unwrap();
        let resp = within("live event", stream.message())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            resp.events()[0].kv().unwrap().mod_revision(),
            last.header().unwrap().revision()
        );
    });
    for _ in 0..200 {
        if slow_watchers(&s) == 0.0 && pending_events(&s) == 0.0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!(
        "after catching up: {} slow watchers, {} pending events",
        slow_watchers(&s),
        pending_events(&s)
    );
}
