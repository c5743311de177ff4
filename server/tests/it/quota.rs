//! etcd's backend quota and NOSPACE alarm, as an operator meets them:
//! a store filled up to `--quota-backend-bytes` refuses writes with etcd's
//! error and raises the alarm; the alarm survives a crash; etcd's recovery
//! procedure (compact, defrag, `alarm disarm`) brings writes back. The
//! comparison with a real etcd at the same steps is the `nospace` scenario
//! of `etcdctl.rs` (a quota of one byte, so both refuse at the same put).

use std::time::{Duration, Instant};

use crate::etcd_peer::etcdctl;
use crate::support::Server;

const NOSPACE: &str = "etcdserver: mvcc: database space exceeded";
const QUOTA: usize = 2 << 20;
const VALUE_BYTES: usize = 100 << 10;

fn ctl(ep: &str, args: &[&str]) -> (bool, String) {
    let out = etcdctl(ep, args);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn put_from_stdin(ep: &str, key: &str, value: &[u8]) -> (bool, String) {
    let out = crate::etcd_peer::etcdctl_with(ep, &[], &["put", key], Some(value));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// `endpoint status -w json`: (member id, revision, dbSize, errors).
fn status(ep: &str) -> (u64, i64, u64, Vec<String>) {
    let (ok, text) = ctl(ep, &["endpoint", "status", "-w", "json"]);
    assert!(ok, "endpoint status: {text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let st = &v[0]["Status"];
    let errors = st["errors"]
        .as_array()
        .map(|a| a.iter().map(|e| e.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    (
        st["header"]["member_id"].as_u64().unwrap(),
        st["header"]["revision"].as_i64().unwrap(),
        st["dbSize"].as_u64().unwrap(),
        errors,
    )
}

/// Fills `key` with new revisions of a 100 KiB value until the quota
/// refuses one; returns how many were acknowledged and the last value.
fn fill_until_refused(ep: &str, key: &str) -> (usize, Vec<u8>) {
    let mut last = Vec::new();
    // 2 MiB of quota holds about 20 such revisions; 60 attempts bound it.
    for i in 0..60usize {
        let value: Vec<u8> = (0..VALUE_BYTES)
            .map(|b| b'a' + ((b * 7 + i) % 26) as u8)
            .collect();
        let (ok, text) = put_from_stdin(ep, key, &value);
        if !ok {
            assert!(text.contains(NOSPACE), "put {i} failed otherwise: {text}");
            return (i, last);
        }
        last = value;
    }
    panic!("60 puts of 100 KiB never reached a 2 MiB quota");
}

fn wait_serving(ep: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if ctl(ep, &["get", "probe"]).0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("metcd at {ep} did not serve again");
}

fn nospace_alarm_lifecycle(engine: &str) {
    let dir = tempfile::tempdir().unwrap();
    let quota = QUOTA.to_string();
    let mut server = Server::start(
        &dir.path().join("m"),
        &["--engine", engine, "--quota-backend-bytes", &quota],
    );
    let ep = server.client_endpoint();
    let (member, _, _, errors) = status(&ep);
    assert!(errors.is_empty(), "a fresh member has no alarm: {errors:?}");

    let (acknowledged, last) = fill_until_refused(&ep, "fill");
    // Each revision stays until a compaction: ~20 fit in 2 MiB.
    assert!(
        (10..=21).contains(&acknowledged),
        "{acknowledged} puts of 100 KiB fitted a 2 MiB quota"
    );
    let alarm = format!("memberID:{member} alarm:NOSPACE");
    let (ok, list) = ctl(&ep, &["alarm", "list"]);
    assert!(ok && list.trim() == alarm, "alarm list: {list}");
    let (_, revision, db_size, errors) = status(&ep);
    assert_eq!(errors, vec![format!("{alarm} ")]);
    assert!(
        db_size >= (acknowledged * VALUE_BYTES) as u64,
        "dbSize {db_size}"
    );
    // etcd's /health is false while an alarm is on.
    let health = server.conn().request("GET", "/health", b"").unwrap();
    assert_eq!(health.status, 503, "{}", health.text());

    // Reads, read-only txns and deletes go on; anything that adds data is
    // refused, even a few bytes, and nothing of it is applied.
    let (ok, got) = ctl(&ep, &["get", "fill", "--print-value-only"]);
    assert!(
        ok && got.trim_end().as_bytes() == last,
        "the last acknowledged value is kept"
    );
    let (ok, text) = ctl(&ep, &["put", "small", "v"]);
    assert!(!ok && text.contains(NOSPACE), "{text}");
    let (ok, text) = ctl(&ep, &["lease", "grant", "30"]);
    assert!(!ok && text.contains(NOSPACE), "{text}");
    let out = crate::etcd_peer::etcdctl_with(&ep, &[], &["txn"], Some(b"\nget small\n\n\n"));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(ctl(&ep, &["get", "small"]), (true, String::new()));
    assert_eq!(status(&ep).1, revision, "a refused write took no revision");

    // The alarm is in the log and the store: it survives kill -9.
    server.respawn_unchecked();
    wait_serving(&ep);
    let (ok, list) = ctl(&ep, &["alarm", "list"]);
    assert!(ok && list.trim() == alarm, "after restart: {list}");
    let (ok, text) = ctl(&ep, &["put", "small", "v"]);
    assert!(!ok && text.contains(NOSPACE), "after restart: {text}");

    // etcd's procedure: compact away the history, defragment, disarm.
    let rev = revision.to_string();
    assert!(ctl(&ep, &["compaction", &rev]).0);
    let (ok, text) = ctl(&ep, &["defrag"]);
    assert!(ok, "{text}");
    let (_, _, db_size, _) = status(&ep);
    assert!(
        db_size < (QUOTA / 2) as u64,
        "one 100 KiB revision left, yet dbSize is {db_size}"
    );
    let (ok, text) = ctl(&ep, &["alarm", "disarm"]);
    assert!(
        ok && text.trim() == alarm,
        "disarm prints what it disarmed: {text}"
    );
    assert_eq!(ctl(&ep, &["alarm", "list"]), (true, String::new()));
    assert_eq!(ctl(&ep, &["put", "newkey", "123"]), (true, "OK\n".into()));
    let health = server.conn().request("GET", "/health", b"").unwrap();
    assert_eq!(health.status, 200, "{}", health.text());
}

#[test]
fn the_nospace_alarm_stops_growth_and_etcds_procedure_clears_it() {
    nospace_alarm_lifecycle("memory");
}

#[test]
fn the_nospace_alarm_with_the_btree_engine() {
    nospace_alarm_lifecycle("btree");
}

#[test]
fn the_nospace_alarm_with_the_lsm_engine() {
    nospace_alarm_lifecycle("lsm");
}

/// A negative quota disables it, as etcd's: the same fill goes through.
#[test]
fn a_negative_quota_disables_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("m"), &["--quota-backend-bytes", "-1"]);
    let ep = server.client_endpoint();
    let value = vec![b'x'; VALUE_BYTES];
    for i in 0..30 {
        let (ok, text) = put_from_stdin(&ep, "fill", &value);
        assert!(ok, "put {i}: {text}");
    }
    assert_eq!(ctl(&ep, &["alarm", "list"]), (true, String::new()));
}

/// CORRUPT (raised here by hand through the JSON gateway, as an operator
/// or a corruption check would): every write is refused with etcd's
/// `etcdserver: corrupt cluster` (DataLoss, HTTP 500), reads go on, and
/// deactivating it brings writes back.
#[test]
fn a_corrupt_alarm_refuses_every_write_until_deactivated() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("m"), &[]);
    let ep = server.client_endpoint();
    let (member, ..) = status(&ep);
    let gateway = |path: &str, body: String| {
        let mut c = crate::support::HttpConn::connect(&ep).unwrap();
        let r = c.request("POST", path, body.as_bytes()).unwrap();
        (r.status, r.text())
    };
    assert_eq!(ctl(&ep, &["put", "k", "v"]), (true, "OK\n".into()));
    let activate = format!(r#"{{"action":"ACTIVATE","memberID":"{member}","alarm":"CORRUPT"}}"#);
    let (code, body) = gateway("/v3/maintenance/alarm", activate);
    assert_eq!(
        (code, body),
        (
            200,
            format!(r#"{{"alarms":[{{"memberID":"{member}","alarm":"CORRUPT"}}]}}"#)
        )
    );
    let refused = r#"{"error":"etcdserver: corrupt cluster","message":"etcdserver: corrupt cluster","code":15}"#;
    for (path, body) in [
        ("/v3/kv/put", r#"{"key":"aw==","value":"dw=="}"#),
        ("/v3/kv/deleterange", r#"{"key":"aw=="}"#),
        ("/v3/kv/compaction", r#"{"revision":"1"}"#),
        ("/v3/lease/grant", r#"{"TTL":"30"}"#),
    ] {
        assert_eq!(
            gateway(path, body.to_string()),
            (500, refused.to_string()),
            "{path}"
        );
    }
    let (ok, got) = ctl(&ep, &["get", "k", "--print-value-only"]);
    assert_eq!((ok, got.as_str()), (true, "v\n"), "reads go on");
    let (ok, text) = ctl(&ep, &["alarm", "list"]);
    assert_eq!(
        (ok, text),
        (true, format!("memberID:{member} alarm:CORRUPT \n"))
    );
    let deactivate =
        format!(r#"{{"action":"DEACTIVATE","memberID":"{member}","alarm":"CORRUPT"}}"#);
    assert_eq!(gateway("/v3/maintenance/alarm", deactivate).0, 200);
    assert_eq!(ctl(&ep, &["del", "k"]), (true, "1\n".into()));
}
