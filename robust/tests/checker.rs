//! The checker on hand-made histories: a clean one passes, and each
//! anomaly a faulty store could produce (a stale read, a lost write, a
//! duplicate or skipped watch event, a wrong prev_kv, a member answering
//! below what it answered before its restart, a key outliving its revoked
//! lease, diverged members) is flagged by the check that owns it.

use std::collections::{BTreeMap, HashMap};

use robust::check::{check, Options, Report};
use robust::history::{
    Event, EventKind, FinalState, History, Kv, Op, Outcome, Request, Response, WatchRecord,
};

/// Builds a history one sequential operation at a time, keeping a model
/// of the store so the watchers' events and the final states are what a
/// correct store would produce.
struct Builder {
    h: History,
    now: u64,
    revision: i64,
    store: HashMap<String, Kv>,
    log: Vec<Event>,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            h: History::default(),
            now: 0,
            revision: 1,
            store: HashMap::new(),
            log: Vec::new(),
        }
    }

    fn push(&mut self, client: u32, member: usize, request: Request, outcome: Outcome) -> usize {
        self.now += 10;
        self.h.ops.push(Op {
            client,
            member,
            incarnation: 0,
            invoke: self.now,
            ret: self.now + 5,
            request,
            outcome,
        });
        self.now += 10;
        self.h.ops.len() - 1
    }

    fn put_with_lease(&mut self, client: u32, key: &str, value: u64, lease: i64) -> usize {
        self.revision += 1;
        let kv = Kv {
            value,
            mod_revision: self.revision,
            lease,
        };
        let prev = self.store.insert(key.to_string(), kv);
        self.log.push(Event {
            revision: self.revision,
            key: key.to_string(),
            kind: EventKind::Put,
            kv: Some(kv),
            prev,
        });
        let revision = self.revision;
        self.push(
            client,
            client as usize % 3,
            Request::Put {
                key: key.into(),
                value,
                lease,
            },
            Outcome::Ok(Response::Put { revision }),
        )
    }

    fn put(&mut self, client: u32, key: &str, value: u64) -> usize {
        self.put_with_lease(client, key, value, 0)
    }

    fn get(&mut self, client: u32, key: &str, serializable: bool) -> usize {
        let kv = self.store.get(key).copied();
        let revision = self.revision;
        self.push(
            client,
            client as usize % 3,
            Request::Get {
                key: key.into(),
                serializable,
            },
            Outcome::Ok(Response::Get { revision, kv }),
        )
    }

    fn delete(&mut self, client: u32, key: &str) -> usize {
        let prev = self.store.remove(key);
        if prev.is_some() {
            self.revision += 1;
            self.log_delete(key, prev);
        }
        let revision = self.revision;
        self.push(
            client,
            client as usize % 3,
            Request::Delete { key: key.into() },
            Outcome::Ok(Response::Delete {
                revision,
                deleted: i64::from(prev.is_some()),
            }),
        )
    }

    /// A delete event at the current revision.
    fn log_delete(&mut self, key: &str, prev: Option<Kv>) {
        self.log.push(Event {
            revision: self.revision,
            key: key.to_string(),
            kind: EventKind::Delete,
            kv: None,
            prev,
        });
    }

    fn revoke(&mut self, client: u32, lease: i64) -> usize {
        let gone: Vec<String> = self
            .store
            .iter()
            .filter(|(_, kv)| kv.lease == lease)
            .map(|(k, _)| k.clone())
            .collect();
        if !gone.is_empty() {
            self.revision += 1;
        }
        for key in gone {
            let prev = self.store.remove(&key);
            self.log_delete(&key, prev);
        }
        let revision = self.revision;
        self.push(
            client,
            client as usize % 3,
            Request::LeaseRevoke { lease },
            Outcome::Ok(Response::LeaseRevoke { revision }),
        )
    }

    /// Three watchers that saw the whole log, each revision in its own
    /// response, and three members that ended with the model's store.
    fn finish(mut self) -> History {
        for member in 0..3 {
            self.h.watches.push(WatchRecord {
                member,
                events: self
                    .log
                    .iter()
                    .map(|e| (e.revision as u64, e.clone()))
                    .collect(),
                resumed: 0,
            });
            self.h.finals.push(FinalState {
                member,
                revision: self.revision,
                kvs: self
                    .store
                    .iter()
                    .map(|(k, v)| (k.clone(), *v))
                    .collect::<BTreeMap<_, _>>(),
                hash: Some(0xfeed),
            });
        }
        self.h
    }
}

fn checks(h: &History) -> Report {
    check(h, &Options::default())
}

fn flagged(report: &Report) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = report.anomalies.iter().map(|a| a.check).collect();
    names.dedup();
    names
}

/// Puts, reads, a compare-and-set, deletes and a revoked lease, all right.
fn clean() -> Builder {
    let mut b = Builder::new();
    b.put(0, "key/a", 1);
    b.get(1, "key/a", false);
    b.put_with_lease(2, "key/b", 2, 77);
    b.get(0, "key/b", true);
    b.revoke(2, 77);
    b.get(1, "key/b", false);
    b.put(1, "key/a", 3);
    b.delete(0, "key/a");
    b.delete(2, "key/a");
    b.put(2, "key/c", 4);
    b.get(0, "key/c", false);
    b
}

#[test]
fn a_clean_history_passes_every_check() {
    let report = checks(&clean().finish());
    assert!(report.ok(), "{:#?}", report.anomalies);
    assert_eq!(report.keys_checked, 3);
    assert_eq!(report.last_revision, 7);
}

#[test]
fn compare_and_set_both_ways_and_unanswered_writes_pass() {
    let mut b = clean();
    b.put(0, "key/d", 10);
    // A compare on the value that held: succeeded.
    b.revision += 1;
    let kv = Kv {
        value: 11,
        mod_revision: b.revision,
        lease: 0,
    };
    let prev = b.store.insert("key/d".into(), kv);
    b.log.push(Event {
        revision: b.revision,
        key: "key/d".into(),
        kind: EventKind::Put,
        kv: Some(kv),
        prev,
    });
    let revision = b.revision;
    b.push(
        1,
        1,
        Request::Cas {
            key: "key/d".into(),
            expect: Some(10),
            mod_revision: None,
            value: 11,
            lease: 0,
        },
        Outcome::Ok(Response::Cas {
            revision,
            succeeded: true,
            current: None,
        }),
    );
    // A compare on a stale value: failed, reading the current one.
    b.push(
        2,
        2,
        Request::Cas {
            key: "key/d".into(),
            expect: Some(10),
            mod_revision: Some(revision - 1),
            value: 12,
            lease: 0,
        },
        Outcome::Ok(Response::Cas {
            revision,
            succeeded: false,
            current: Some(kv),
        }),
    );
    // A put nobody heard back from, which never happened.
    b.push(
        0,
        0,
        Request::Put {
            key: "key/d".into(),
            value: 13,
            lease: 0,
        },
        Outcome::Unknown("no answer in time".into()),
    );
    b.get(0, "key/d", false);
    let report = checks(&b.finish());
    assert!(report.ok(), "{:#?}", report.anomalies);
    assert_eq!(report.unknown_writes_dropped, 1);
}

#[test]
fn a_stale_linearizable_read_is_flagged() {
    let mut b = Builder::new();
    b.put(0, "key/a", 1);
    let stale_kv = b.store["key/a"];
    b.put(1, "key/a", 2);
    // A member that had not applied the second put answers a linearizable
    // read from its old state, after the put returned.
    let id = b.push(
        2,
        2,
        Request::Get {
            key: "key/a".into(),
            serializable: false,
        },
        Outcome::Ok(Response::Get {
            revision: 2,
            kv: Some(stale_kv),
        }),
    );
    let report = checks(&b.finish());
    let names = flagged(&report);
    assert!(names.contains(&"revision-went-back"), "{names:?}");
    assert!(names.contains(&"not-linearizable"), "{names:?}");
    let evidence = report
        .anomalies
        .iter()
        .find(|a| a.check == "not-linearizable")
        .map(|a| a.detail.clone())
        .unwrap_or_default();
    assert!(evidence.contains(&format!("op #{id} ")), "{evidence}");
}

#[test]
fn a_stale_read_that_names_its_revision_truthfully_still_breaks_the_register() {
    // Same read but at the right revision: only the value is old.
    let mut b = Builder::new();
    b.put(0, "key/a", 1);
    let stale_kv = b.store["key/a"];
    b.put(1, "key/a", 2);
    let revision = b.revision;
    b.push(
        2,
        2,
        Request::Get {
            key: "key/a".into(),
            serializable: false,
        },
        Outcome::Ok(Response::Get {
            revision,
            kv: Some(stale_kv),
        }),
    );
    let names = flagged(&checks(&b.finish()));
    assert!(names.contains(&"stale-read"), "{names:?}");
    assert!(names.contains(&"not-linearizable"), "{names:?}");
}

#[test]
fn an_acknowledged_write_missing_from_the_log_is_lost() {
    let mut b = clean();
    let lost = b.put(0, "key/lost", 50);
    b.put(1, "key/c", 51);
    // Every watcher and every member lost the acknowledged put.
    let lost_revision = b.revision - 1;
    b.log.retain(|e| e.revision != lost_revision);
    b.store.remove("key/lost");
    let report = checks(&b.finish());
    let names = flagged(&report);
    assert!(names.contains(&"ack-write-lost"), "{names:?}");
    assert!(names.contains(&"watch-gap"), "{names:?}");
    assert!(report
        .anomalies
        .iter()
        .any(|a| a.detail.contains(&format!("op #{lost} "))));
}

#[test]
fn a_duplicate_watch_event_is_flagged() {
    let mut h = clean().finish();
    let again = h.watches[1].events[3].clone();
    h.watches[1].events.insert(4, (again.0 + 100, again.1));
    let names = flagged(&checks(&h));
    assert!(
        names.contains(&"watch-order") || names.contains(&"watch-duplicate"),
        "{names:?}"
    );
}

#[test]
fn a_watcher_that_skips_a_revision_is_flagged() {
    let mut h = clean().finish();
    h.watches[2].events.remove(2);
    let report = checks(&h);
    let names = flagged(&report);
    assert_eq!(names, vec!["watch-gap"], "{:#?}", report.anomalies);
    assert!(report.anomalies[0].detail.contains("member 2"));
}

#[test]
fn a_wrong_prev_kv_is_flagged() {
    let mut h = clean().finish();
    for w in &mut h.watches {
        // The second put of key/a claims the key was absent before it.
        if let Some((_, e)) = w
            .events
            .iter_mut()
            .find(|(_, e)| e.key == "key/a" && e.prev.is_some())
        {
            e.prev = None;
        }
    }
    assert_eq!(flagged(&checks(&h)), vec!["watch-prev-kv"]);
}

#[test]
fn watchers_that_disagree_are_flagged() {
    let mut h = clean().finish();
    if let Some(kv) = h.watches[0].events[0].1.kv.as_mut() {
        kv.value = 999;
    }
    assert!(flagged(&checks(&h)).contains(&"watch-disagree"));
}

#[test]
fn a_restarted_member_answering_below_what_it_answered_is_flagged() {
    let mut b = clean();
    b.get(3, "key/c", true); // client 3 is on member 0
    let before = b.revision;
    // Member 0 restarts and, before catching up, serves another client a
    // serializable read from an older revision.
    let old = before - 2;
    let id = b.push(
        6,
        0,
        Request::Get {
            key: "key/zz".into(),
            serializable: true,
        },
        Outcome::Ok(Response::Get {
            revision: old,
            kv: None,
        }),
    );
    let report = checks(&b.finish());
    assert_eq!(flagged(&report), vec!["member-revision-went-back"]);
    assert!(report.anomalies[0].detail.contains(&format!("op #{id} ")));
}

#[test]
fn a_key_that_outlives_its_revoked_lease_is_flagged() {
    let mut b = Builder::new();
    b.put_with_lease(0, "key/a", 1, 9);
    b.put(0, "key/b", 2);
    // The revoke answers, but key/a stays.
    let revision = b.revision;
    b.push(
        1,
        1,
        Request::LeaseRevoke { lease: 9 },
        Outcome::Ok(Response::LeaseRevoke { revision }),
    );
    b.get(2, "key/a", false);
    let names = flagged(&checks(&b.finish()));
    assert!(names.contains(&"lease-outlived"), "{names:?}");
    assert!(names.contains(&"not-linearizable"), "{names:?}");
}

#[test]
fn members_that_end_apart_are_flagged() {
    let mut h = clean().finish();
    h.finals[1].hash = Some(0xbad);
    h.finals[2].kvs.clear();
    let names = flagged(&checks(&h));
    assert!(names.contains(&"final-hash"), "{names:?}");
    assert!(names.contains(&"final-state"), "{names:?}");
}

#[test]
fn a_refused_write_that_took_effect_is_flagged() {
    let mut b = clean();
    b.put(0, "key/e", 70);
    if let Some(op) = b.h.ops.last_mut() {
        op.outcome = Outcome::Failed("NotFound: etcdserver: requested lease not found".into());
    }
    assert!(flagged(&checks(&b.finish())).contains(&"refused-write-applied"));
}
