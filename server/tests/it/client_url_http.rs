//! etcd's HTTP/1.1 endpoints on the client URL, which gRPC shares:
//! `curl 127.0.0.1:2379/version`, `/health` and `/metrics` (Prometheus),
//! compared with a real etcd 3.4 where etcd is exact.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::etcd_peer::{etcdctl, require_etcd, RealEtcd};
use crate::support::Server;

/// (status line, body) of one HTTP/1.0 GET: the server closes the
/// connection after the answer, so no chunked decoding is needed.
pub fn get(endpoint: &str, path: &str) -> (String, String) {
    let (head, body) = request(endpoint, "GET", path);
    (head.lines().next().unwrap().to_string(), body)
}

/// (status line and headers, body) of one HTTP/1.0 request.
fn request(endpoint: &str, method: &str, path: &str) -> (String, String) {
    let wire = format!("{method} {path} HTTP/1.0\r\nHost: {endpoint}\r\n\r\n");
    exchange(endpoint, &format!("{method} {path}"), &wire)
}

/// Sends one HTTP/1.0 request (`wire`, in one write) and reads the answer
/// up to the server's close: (status line and headers, body).
///
/// A reset after a complete answer (its `Content-Length` received) is
/// taken as the close: Go's server does not read the body of an HTTP/1.0
/// request its handler ignored (etcd's gateway 404) before closing, and
/// a close with unread bytes is a RST on Linux. What the client received
/// is the whole answer all the same.
fn exchange(endpoint: &str, what: &str, wire: &str) -> (String, String) {
    let (raw, read) = send(endpoint, wire);
    if let Err(e) = read {
        let complete = e.kind() == std::io::ErrorKind::ConnectionReset && answer_is_complete(&raw);
        assert!(
            complete,
            "{what} to {endpoint}: {e} after {} bytes",
            raw.len()
        );
    }
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

/// Writes `wire` in one write and reads until the server closes: what
/// arrived, and how the read ended.
fn send(endpoint: &str, wire: &str) -> (Vec<u8>, std::io::Result<usize>) {
    let mut s = TcpStream::connect(endpoint).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(wire.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let read = s.read_to_end(&mut raw);
    (raw, read)
}

/// Whether `raw` holds a header block and as many body bytes as its
/// `Content-Length` says.
fn answer_is_complete(raw: &[u8]) -> bool {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..end]);
    let length = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    length.is_some_and(|n| raw.len() - (end + 4) == n)
}

/// The header block with `Date`'s value masked (the clock; where Go
/// writes it is compared) and without `Connection` (where Go and hyper
/// put it differs, and it says nothing about the answer).
fn comparable_head(head: &str) -> String {
    masked_head(head, &["Date"])
}

/// The header block without `Connection`, the values of the `masked`
/// headers replaced by `<masked>`.
fn masked_head(head: &str, masked: &[&str]) -> String {
    head.lines()
        .filter(|l| !l.starts_with("Connection:"))
        .map(|l| match l.split_once(':') {
            Some((name, _)) if masked.contains(&name) => format!("{name}: <masked>"),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The status line and headers of one HTTP/1.1 request (closing after
/// it), as `curl -i` shows them, with `Content-Length`'s value masked (the
/// IDs in a gateway answer differ in length); the body, possibly
/// chunked, is dropped.
fn head_of_http11(endpoint: &str, method: &str, path: &str, body: &str) -> String {
    let wire = format!(
        "{method} {path} HTTP/1.1\r\nHost: {endpoint}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    // The read's end is not looked at: only the header block is wanted.
    let (raw, _) = send(endpoint, &wire);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, _) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{method} {path} to {endpoint}: no header block in {text:?}"));
    masked_head(head, &["Date", "Content-Length"])
}

/// The metric families a page declares: its `# HELP` and `# TYPE` lines.
fn declarations(page: &str) -> Vec<&str> {
    page.lines().filter(|l| l.starts_with("# ")).collect()
}

/// The value of an unlabelled sample.
pub fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{page}"))
}

/// A real etcd 3.4 and a metcd (two shards), each with its own data dir
/// in the returned temporary dir.
fn etcd_and_metcd() -> (tempfile::TempDir, RealEtcd, Server) {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let etcd = RealEtcd::start(&dir.path().join("etcd"));
    let metcd = Server::start(&dir.path().join("metcd"), &["--shards", "2"]);
    (dir, etcd, metcd)
}

#[test]
fn version_health_and_metrics_on_the_client_url_as_etcd_serves_them() {
    let (_dir, etcd, metcd) = etcd_and_metcd();
    let ep = metcd.client_endpoint();

    // gRPC keeps working on the same port (several connections: each shard
    // accepts some).
    for i in 0..4 {
        let out = etcdctl(&ep, &["put", &format!("k{i}"), "v"]);
        assert!(out.status.success(), "{out:?}");
    }

    for (path, want_status) in [("/health", "200 OK"), ("/nope", "404 Not Found")] {
        let (theirs, ours) = (get(&etcd.endpoint, path), get(&ep, path));
        assert!(theirs.0.ends_with(want_status), "etcd {path}: {theirs:?}");
        assert!(ours.0.ends_with(want_status), "metcd {path}: {ours:?}");
        assert_eq!(ours.1, theirs.1, "body of {path}");
    }

    // Status line and headers byte for byte (Go's canonical names and
    // order), bodies too: GET /health, Go's 404, and the 405 etcd gives
    // any method but GET on /health and /version.
    for (method, path) in [
        ("GET", "/health"),
        ("GET", "/nope"),
        ("POST", "/health"),
        ("POST", "/version"),
        ("PUT", "/health"),
    ] {
        let (theirs, ours) = (
            request(&etcd.endpoint, method, path),
            request(&ep, method, path),
        );
        assert_eq!(
            (comparable_head(&ours.0), &ours.1),
            (comparable_head(&theirs.0), &theirs.1),
            "{method} {path}: metcd (left) differs from etcd (right)"
        );
    }

    // etcd's fields in etcd's order, then metcd's own.
    let (status, body) = get(&ep, "/version");
    assert!(status.ends_with("200 OK"), "{status}");
    let theirs = get(&etcd.endpoint, "/version").1;
    let field_names = |b: &str| -> Vec<String> {
        b.split('"')
            .skip(1)
            .step_by(4)
            .map(str::to_string)
            .collect()
    };
    assert_eq!(field_names(&theirs), ["etcdserver", "etcdcluster"]);
    assert_eq!(field_names(&body), ["etcdserver", "etcdcluster", "metcd"]);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["etcdserver"], server::ETCD_API_VERSION);

    // Every family metcd serves is declared exactly as etcd declares it.
    let (status, ours) = get(&ep, "/metrics");
    assert!(status.ends_with("200 OK"), "{status}");
    let theirs = get(&etcd.endpoint, "/metrics").1;
    let etcd_declares = declarations(&theirs);
    let ours_declared = declarations(&ours);
    assert!(ours_declared.len() >= 30, "{ours}");
    for d in ours_declared {
        assert!(etcd_declares.contains(&d), "etcd does not declare {d:?}");
    }
    assert_eq!(sample(&ours, "etcd_server_has_leader"), 1.0);
    assert_eq!(sample(&ours, "etcd_server_is_leader"), 1.0);
    assert_eq!(sample(&ours, "etcd_server_leader_changes_seen_total"), 1.0);
    assert_eq!(sample(&ours, "etcd_debugging_mvcc_keys_total"), 4.0);
    assert!(sample(&ours, "etcd_disk_wal_fsync_duration_seconds_count") >= 4.0);
    let committed = sample(&ours, "etcd_server_proposals_committed_total");

    // The figures move with the work done.
    let out = etcdctl(&ep, &["put", "k9", "v"]);
    assert!(out.status.success(), "{out:?}");
    let after = get(&ep, "/metrics").1;
    assert!(sample(&after, "etcd_server_proposals_committed_total") > committed);
    assert_eq!(sample(&after, "etcd_debugging_mvcc_keys_total"), 5.0);

    // Go's framing over HTTP/1.1: `Date` after the handler's headers, then
    // `Content-Length` for a body that fit its 2048-byte buffer, else
    // chunked (the metrics page, a large gateway answer).
    let big = "x".repeat(3000);
    for (method, path, body) in [
        ("GET", "/health", String::new()),
        ("GET", "/metrics", String::new()),
        ("GET", "/nope", String::new()),
        (
            "POST",
            "/v3/kv/put",
            format!(r#"{{"key":"Yg==","value":"{big}"}}"#),
        ),
        ("POST", "/v3/kv/range", r#"{"key":"Yg=="}"#.to_string()),
        (
            "POST",
            "/v3/kv/range",
            r#"{"key":"Yg==","count_only":true}"#.to_string(),
        ),
        (
            "POST",
            "/v3/kv/range",
            r#"{"key":"Yg==","revision":"-1"}"#.to_string(),
        ),
        ("POST", "/v3/kv/range", "{".to_string()),
    ] {
        let theirs = head_of_http11(&etcd.endpoint, method, path, &body);
        let ours = head_of_http11(&ep, method, path, &body);
        assert_eq!(
            ours, theirs,
            "{method} {path}: metcd (left) differs from etcd (right)"
        );
    }
}

/// (status line, body) of one HTTP/1.0 POST with a JSON body.
fn post(endpoint: &str, path: &str, json: &str) -> (String, String) {
    post_as(endpoint, path, json, None)
}

/// [`post`] with etcd's gateway token header (`Authorization: <token>`).
fn post_as(endpoint: &str, path: &str, json: &str, token: Option<&str>) -> (String, String) {
    let auth = token.map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
    let wire = format!(
        "POST {path} HTTP/1.0\r\nHost: {endpoint}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
        json.len()
    );
    let (head, body) = exchange(endpoint, &format!("POST {path}"), &wire);
    (head.lines().next().unwrap().to_string(), body)
}

/// The member and cluster ids differ between two servers (derived from
/// each one's peer URL); everything else etcd's gateway writes is compared.
fn mask_ids(json: &str) -> String {
    let mut out = json.to_string();
    for field in ["\"cluster_id\":\"", "\"member_id\":\""] {
        let mut masked = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(at) = rest.find(field) {
            masked.push_str(&rest[..at + field.len()]);
            rest = &rest[at + field.len()..];
            let end = rest.find('"').unwrap_or(rest.len());
            masked.push_str("<id>");
            rest = &rest[end..];
        }
        masked.push_str(rest);
        out = masked;
    }
    out
}

/// Each `(path, body)` POSTed to etcd and then to metcd: the same status
/// line and the same JSON, ids masked.
fn same_answers(etcd: &str, metcd: &str, steps: &[(&str, &str)]) {
    for (path, json) in steps {
        let theirs = post(etcd, path, json);
        let ours = post(metcd, path, json);
        assert_eq!(
            (ours.0.as_str(), mask_ids(&ours.1)),
            (theirs.0.as_str(), mask_ids(&theirs.1)),
            "POST {path} {json}: metcd (left) differs from etcd (right)"
        );
    }
}

/// etcd's gRPC gateway (`curl -XPOST http://127.0.0.1:2379/v3/kv/put -d
/// '{"key":"Zm9v","value":"YmFy"}'`): the same requests against etcd 3.4
/// and metcd give the same status and the same JSON, errors included.
#[test]
fn gateway_json_routes_match_etcd() {
    let (_dir, etcd, metcd) = etcd_and_metcd();
    let ep = metcd.client_endpoint();
    let steps: &[(&str, &str)] = &[
        ("/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#),
        (
            "/v3/kv/put",
            r#"{"key":"Zm9v","value":"YmF6","prev_kv":true}"#,
        ),
        ("/v3/kv/range", r#"{"key":"Zm9v"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","count_only":true}"#),
        ("/v3/kv/range", r#"{"key":"bm8="}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","revision":"99"}"#),
        (
            "/v3/kv/range",
            r#"{"key":"AA==","range_end":"AA==","keys_only":true,"unknown":1}"#,
        ),
        (
            "/v3/kv/range",
            r#"{"key":"Zm9v","sort_order":"DESCEND","sort_target":"MOD"}"#,
        ),
        ("/v3/kv/range", ""),
        ("/v3/kv/put", r#"{"key":"Zm9v","lease":"123"}"#),
        (
            "/v3/kv/txn",
            r#"{"compare":[{"target":"MOD","key":"YQ==","mod_revision":"0"}],"success":[{"request_put":{"key":"YQ==","value":"MQ=="}}]}"#,
        ),
        (
            "/v3/kv/txn",
            r#"{"compare":[{"target":"VALUE","key":"Zm9v","value":"MQ=="}],"success":[{"request_range":{"key":"Zm9v"}}],"failure":[{"request_range":{"key":"Zm9v"}}]}"#,
        ),
        (
            "/v3/kv/txn",
            r#"{"success":[{"request_put":{"key":"YQ=="}},{"request_put":{"key":"YQ=="}}]}"#,
        ),
        ("/v3/kv/deleterange", r#"{"key":"Zm9v","prev_kv":true}"#),
        ("/v3/kv/compaction", r#"{"revision":"2"}"#),
        ("/v3/kv/compaction", r#"{"revision":"2"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","revision":"1"}"#),
        ("/v3/lease/timetolive", r#"{"ID":"1"}"#),
        ("/v3/kv/lease/revoke", r#"{"ID":"1"}"#),
        ("/v3/lease/leases", "{}"),
        ("/v3/maintenance/alarm", "{}"),
        ("/v3/cluster/member/remove", r#"{"ID":"1234"}"#),
        ("/v3/maintenance/hashkv", "{}"),
        ("/v3beta/kv/range", r#"{"key":"YQ=="}"#),
    ];
    same_answers(&etcd.endpoint, &ep, steps);
}

/// With auth on, the gateway's root-only routes (membership changes,
/// Defragment, Hash, HashKV, Snapshot) refuse a caller without a token and
/// a caller without the root role with etcd 3.4's status and JSON, and the
/// routes etcd leaves open (MemberList, Status, Alarm, MoveLeader) answer
/// them as etcd does.
#[test]
fn gateway_admin_only_routes_refuse_as_etcd() {
    let (_dir, etcd, metcd) = etcd_and_metcd();
    let ep = metcd.client_endpoint();
    let token = |endpoint: &str, user: &str, password: &str| -> String {
        let body = format!(r#"{{"name":"{user}","password":"{password}"}}"#);
        let (status, answer) = post(endpoint, "/v3/auth/authenticate", &body);
        assert!(status.ends_with("200 OK"), "{status} {answer}");
        let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
        v["token"].as_str().unwrap().to_string()
    };
    let mut alice = Vec::new();
    for endpoint in [&etcd.endpoint, &ep] {
        for args in [
            &["user", "add", "root:rootpw"][..],
            &["user", "add", "alice:apw"],
            &["auth", "enable"],
        ] {
            let o = etcdctl(endpoint, args);
            assert!(o.status.success(), "{args:?}: {o:?}");
        }
        alice.push(token(endpoint, "alice", "apw"));
    }
    let routes: &[(&str, &str)] = &[
        (
            "/v3/cluster/member/add",
            r#"{"peerURLs":["http://127.0.0.1:1"],"isLearner":true}"#,
        ),
        ("/v3/cluster/member/add", r#"{"peerURLs":["nope"]}"#),
        (
            "/v3/cluster/member/update",
            r#"{"ID":"1234","peerURLs":["http://127.0.0.1:2"]}"#,
        ),
        ("/v3/cluster/member/remove", r#"{"ID":"1234"}"#),
        ("/v3/cluster/member/promote", r#"{"ID":"1234"}"#),
        ("/v3/maintenance/defragment", "{}"),
        ("/v3/maintenance/hash", "{}"),
        ("/v3/maintenance/hashkv", "{}"),
        ("/v3/maintenance/snapshot", "{}"),
        ("/v3/maintenance/alarm", "{}"),
        (
            "/v3/maintenance/transfer-leadership",
            r#"{"targetID":"1234"}"#,
        ),
    ];
    for (path, json) in routes {
        for who in [None, Some((&alice[0], &alice[1]))] {
            let theirs = post_as(&etcd.endpoint, path, json, who.map(|w| w.0.as_str()));
            let ours = post_as(&ep, path, json, who.map(|w| w.1.as_str()));
            let caller = if who.is_some() { "alice" } else { "no user" };
            assert_eq!(
                (ours.0.as_str(), mask_ids(&ours.1)),
                (theirs.0.as_str(), mask_ids(&theirs.1)),
                "POST {path} {json} as {caller}: metcd (left) differs from etcd (right)"
            );
        }
    }
    // Nothing got through: each cluster still has its one member.
    for endpoint in [&etcd.endpoint, &ep] {
        let root = token(endpoint, "root", "rootpw");
        let (_, list) = post_as(endpoint, "/v3/cluster/member/list", "{}", Some(&root));
        let v: serde_json::Value = serde_json::from_str(&list).unwrap();
        assert_eq!(v["members"].as_array().map(Vec::len), Some(1), "{list}");
    }
}

/// Bodies etcd's gateway cannot decode get Go's own words (its JSON
/// scanner, `jsonpb`, strict base64), with the same status and code; what
/// it accepts despite oddities (unknown fields, trailing bytes after the
/// first value) is accepted too, and what it refuses that serde alone
/// would take (unpadded or URL-safe base64) is refused.
#[test]
fn gateway_malformed_bodies_are_refused_in_etcds_words() {
    let (_dir, etcd, metcd) = etcd_and_metcd();
    let ep = metcd.client_endpoint();
    let steps: &[(&str, &str)] = &[
        ("/v3/kv/put", "notjson"),
        ("/v3/kv/put", r#"{"key":"#),
        ("/v3/kv/put", r#"{"key":"zz"}"#),
        ("/v3/kv/put", r#"{"key":123}"#),
        (
            "/v3/kv/put",
            r#"{"key":"Zm9v","value":"YmFy","lease":"abc"}"#,
        ),
        ("/v3/kv/put", "[]"),
        ("/v3/kv/put", r#""str""#),
        ("/v3/kv/put", "42"),
        (
            "/v3/kv/put",
            r#"{"key":"Zm9v","value":"YmFy","prev_kv":"yes"}"#,
        ),
        ("/v3/kv/put", r#"{"key":"Zm9v"} trailing"#),
        ("/v3/kv/put", r#"{"key":"Zm9v",}"#),
        ("/v3/kv/put", r#"{"key" "Zm9v"}"#),
        ("/v3/kv/put", r#"{"key":"Zm9vYg"}"#),
        ("/v3/kv/put", r#"{"key":"Zm9-"}"#),
        ("/v3/kv/put", r#"{"key":"Zm9v","lease":1.5}"#),
        ("/v3/kv/put", r#"{"key":"Zm9v","lease":true}"#),
        ("/v3/kv/put", r#"{"key":"Zm9v","lease":""}"#),
        ("/v3/kv/put", r#"{"key":"Zm9v","lease":"1 2"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","limit":"x"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","serializable":1}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","range_end":{}}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","sort_order":"BAD"}"#),
        ("/v3/kv/txn", r#"{"compare":[{"key":"zz"}]}"#),
        ("/v3/kv/txn", r#"{"compare":{}}"#),
        ("/v3/kv/txn", r#"{"compare":[1]}"#),
        ("/v3/kv/txn", r#"{"success":[{"request_put":{"key":1}}]}"#),
        ("/v3/lease/grant", r#"{"TTL":"x"}"#),
        ("/v3/lease/grant", "nope"),
        // Fields a message does not have are ignored; a field's camelCase
        // name is judged too; jsonpb's order is the proto's.
        ("/v3/kv/put", r#"{"key":"Zm9v","extra":{"key":"raw"}}"#),
        ("/v3/kv/put", r#"{"key":"Zm9v","sort_order":"BAD"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","rangeEnd":"x"}"#),
        (
            "/v3/kv/range",
            r#"{"key":"Zm9v","range_end":"x","rangeEnd":"Zm9w"}"#,
        ),
        ("/v3/kv/put", r#"{"lease":"x","value":"zz"}"#),
        ("/v3/kv/put", r#"{"key":"Zm9v","lease":"-"}"#),
        ("/v3/kv/put", r#"{"key":"Zm9v","lease":"1.5"}"#),
        ("/v3/kv/put", r#"{"key":"Zm9v","lease":"tru"}"#),
        ("/v3/cluster/member/remove", r#"{"ID":"-1"}"#),
        (
            "/v3/auth/role/grant",
            r#"{"name":"r","perm":{"permType":"ALL"}}"#,
        ),
        (
            "/v3/kv/txn",
            r#"{"success":[{"requestPut":{"key":"Zm9vYg"}}]}"#,
        ),
        ("/v3/kv/range", r#"{"key":"Zm9v","sort_order":"B\u0001D"}"#),
        ("/v3/cluster/member/add", r#"{"peerURLs":"http://x"}"#),
        ("/v3/cluster/member/add", r#"{"peerURLs":[1]}"#),
        ("/v3/auth/user/add", r#"{"name":5}"#),
        ("/v3/maintenance/alarm", r#"{"action":"BAD"}"#),
    ];
    same_answers(&etcd.endpoint, &ep, steps);
}

/// Standard base64 (the gateway's `bytes`), for reading blobs back.
fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        other => panic!("not base64: {other}"),
    };
    let symbols: Vec<u8> = s.bytes().filter(|c| *c != b'=').map(value).collect();
    let mut out = Vec::with_capacity(symbols.len() * 3 / 4);
    for chunk in symbols.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, v)| n | u32::from(*v) << (18 - 6 * i));
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// `curl -XPOST .../v3/maintenance/snapshot`: one `{"result":..}` line per
/// chunk, as etcd's gateway streams it (no header, as etcd 3.4), the data's
/// `remaining_bytes` counting down to 0 (left out then, as proto3 JSON
/// does), the SHA-256 alone on the last line, and the blobs together are
/// the snapshot with its trailer intact.
#[test]
fn gateway_snapshot_streams_result_lines() {
    use sha2::Digest;
    let (_dir, etcd, metcd) = etcd_and_metcd();
    let ep = metcd.client_endpoint();
    for endpoint in [&etcd.endpoint, &ep] {
        assert!(
            post(endpoint, "/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#)
                .0
                .ends_with("200 OK")
        );
    }
    let fields = |line: &str| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let mut keys: Vec<String> = v["result"].as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    let (status, theirs) = post(&etcd.endpoint, "/v3/maintenance/snapshot", "{}");
    assert!(status.ends_with("200 OK"), "{status}");
    let (status, ours) = post(&ep, "/v3/maintenance/snapshot", "{}");
    assert!(status.ends_with("200 OK"), "{status}");
    let lines: Vec<&str> = ours.lines().collect();
    // etcd's last line is the SHA-256 alone; ours too.
    assert_eq!(
        fields(lines[lines.len() - 1]),
        fields(theirs.lines().last().unwrap())
    );
    assert_eq!(fields(lines[lines.len() - 1]), ["blob"]);
    let mut blob = Vec::new();
    let mut remaining = Vec::new();
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let r = &v["result"];
        remaining.push(
            r["remaining_bytes"]
                .as_str()
                .map_or(0, |s| s.parse::<u64>().unwrap()),
        );
        blob.extend(base64_decode(r["blob"].as_str().unwrap_or("")));
    }
    assert!(remaining.len() >= 2, "{remaining:?}");
    assert!(
        remaining.windows(2).all(|w| w[0] > w[1] || w[1] == 0),
        "{remaining:?}"
    );
    assert_eq!(remaining.last(), Some(&0), "{remaining:?}");
    let sha_line: serde_json::Value = serde_json::from_str(lines[lines.len() - 1]).unwrap();
    assert_eq!(
        base64_decode(sha_line["result"]["blob"].as_str().unwrap()).len(),
        32
    );
    assert!(blob.len() > 32);
    let (data, trailer) = blob.split_at(blob.len() - 32);
    assert_eq!(
        sha2::Sha256::digest(data).as_slice(),
        trailer,
        "the snapshot's SHA-256 trailer"
    );
    // A body the gateway cannot decode is refused before streaming, in
    // etcd's words.
    let theirs = post(&etcd.endpoint, "/v3/maintenance/snapshot", "nope");
    let ours = post(&ep, "/v3/maintenance/snapshot", "nope");
    assert_eq!(ours, theirs);
}

/// Runs `curl -s -i -XPOST <url> -d <body>` for at most `secs`: what a
/// gateway watch prints while it runs.
fn curl_watch(endpoint: &str, path: &str, body: &str, secs: u32) -> std::process::Child {
    std::process::Command::new("curl")
        .args(["-s", "-i", "-m", &secs.to_string(), "-XPOST"])
        .arg(format!("http://{endpoint}{path}"))
        .args(["-d", body])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// What a `curl -i` printed, without its `Date` header and with the ids
/// (and so `Content-Length`) masked, then how it ended (`exit Some(28)`: still streaming at its `-m`).
fn curl_output(curl: std::process::Child) -> String {
    let out = curl.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("Date:"))
        .map(|l| match l.strip_prefix("Content-Length: ") {
            Some(_) => "Content-Length: <n>".to_string(),
            None => mask_ids(l),
        })
        .collect::<Vec<_>>()
        .join("\n");
    format!("{text}\nexit {:?}", out.status.code())
}

/// `curl -XPOST .../v3/watch -d '{"create_request":{"key":"Zm9v"}}'`, as
/// etcd's documentation shows it: the same lines as etcd 3.4 (created, then
/// one line per event, prev_kv and a progress request included), and the
/// watchers go away when the client hangs up.
#[test]
fn gateway_watch_streams_as_etcds() {
    let (_dir, etcd, metcd) = etcd_and_metcd();
    let ep = metcd.client_endpoint();
    let watches = [
        (
            "/v3/watch",
            r#"{"create_request":{"key":"Zm9v","prev_kv":true}}"#,
        ),
        (
            "/v3/watch",
            r#"{"create_request":{"key":"Zm9v","start_revision":"1"}}{"progress_request":{}}"#,
        ),
        (
            "/v3beta/watch",
            r#"{"create_request":{"key":"Zm9v","filters":["NOPUT"]}}"#,
        ),
    ];
    let mut seen = Vec::new();
    for endpoint in [&etcd.endpoint, &ep] {
        let children: Vec<_> = watches
            .iter()
            .map(|(path, body)| curl_watch(endpoint, path, body, 4))
            .collect();
        std::thread::sleep(Duration::from_millis(1000));
        for (path, body) in [
            ("/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#),
            ("/v3/kv/put", r#"{"key":"Zm9v","value":"YmF6"}"#),
            ("/v3/kv/deleterange", r#"{"key":"Zm9v"}"#),
        ] {
            assert!(post(endpoint, path, body).0.ends_with("200 OK"));
        }
        let outputs: Vec<String> = children.into_iter().map(curl_output).collect();
        seen.push(outputs);
    }
    for (i, (ours, theirs)) in seen[1].iter().zip(&seen[0]).enumerate() {
        assert!(theirs.contains("\"events\""), "etcd watch {i}: {theirs}");
        assert_eq!(
            ours, theirs,
            "watch {i}: metcd (left) differs from etcd (right)"
        );
    }
    // The clients hung up: their streams and watchers are gone.
    until_sample(&ep, "etcd_debugging_mvcc_watcher_total", 0.0);
}

/// `curl -XPOST .../v3/lease/keepalive -d '{"ID":"1234"}'`: one
/// `{"result":..}` line per keep-alive, the remaining TTL for a granted
/// lease and none (TTL 0, left out) for an unknown one, and then the
/// answer ends, as etcd 3.4's.
#[test]
fn gateway_lease_keepalive_as_etcds() {
    let (_dir, etcd, metcd) = etcd_and_metcd();
    let ep = metcd.client_endpoint();
    let mut seen = Vec::new();
    for endpoint in [&etcd.endpoint, &ep] {
        let granted = post(endpoint, "/v3/lease/grant", r#"{"ID":"1234","TTL":"60"}"#);
        assert!(granted.0.ends_with("200 OK"), "{granted:?}");
        let outputs: Vec<String> = [r#"{"ID":"1234"}"#, r#"{"ID":"999"}"#]
            .iter()
            .map(|body| curl_output(curl_watch(endpoint, "/v3/lease/keepalive", body, 2)))
            .collect();
        seen.push(outputs);
    }
    assert!(
        seen[0][0].contains(r#""ID":"1234","TTL":"#),
        "{:?}",
        seen[0]
    );
    // The answer ends once the body's requests are answered.
    assert!(seen[0][0].ends_with("exit Some(0)"), "{:?}", seen[0]);
    assert_eq!(seen[1], seen[0], "metcd (left) differs from etcd (right)");
}

/// etcd's Lock and Election services through the gateway (`/v3/lock/*`,
/// `/v3/election/*`): the same answers as etcd 3.4 for the same steps
/// (leases chosen by the client so both name their keys alike), errors
/// with etcd's words and code 2; then the streaming part — an observer, a
/// campaigner that waits until the leader resigns, and a lock waiter that
/// hangs up and so leaves the queue — prints the same lines and leaves the
/// same keys, and every watcher the recipes used is gone afterwards.
#[test]
fn gateway_lock_and_election_match_etcd() {
    let (_dir, etcd, metcd) = etcd_and_metcd();
    let ep = metcd.client_endpoint();
    // "l" = bA==, "l/1234" = bC8xMjM0, "e" = ZQ==, "e/1234" = ZS8xMjM0.
    let steps: &[(&str, &str)] = &[
        ("/v3/lease/grant", r#"{"ID":"4660","TTL":"300"}"#),
        ("/v3/lease/grant", r#"{"ID":"4661","TTL":"300"}"#),
        ("/v3/lock/lock", r#"{"name":"bA==","lease":"4660"}"#),
        // The same lease again: already held, nothing written.
        ("/v3/lock/lock", r#"{"name":"bA==","lease":"4660"}"#),
        ("/v3/lock/unlock", r#"{"key":"bC8xMjM0"}"#),
        ("/v3/lock/unlock", r#"{"key":"bC8xMjM0"}"#),
        ("/v3beta/lock/lock", r#"{"name":"bA==","lease":"4661"}"#),
        ("/v3/lock/unlock", r#"{"key":"bC8xMjM1"}"#),
        ("/v3/lock/lock", r#"{"name":"bA==","lease":"999"}"#),
        ("/v3/lock/unlock", "{}"),
        ("/v3/lock/lock", r#"{"name":1}"#),
        ("/v3/election/leader", r#"{"name":"ZQ=="}"#),
        (
            "/v3/election/campaign",
            r#"{"name":"ZQ==","lease":"4660","value":"djE="}"#,
        ),
        // Campaigning again with another value proclaims it.
        (
            "/v3/election/campaign",
            r#"{"name":"ZQ==","lease":"4660","value":"djI="}"#,
        ),
        ("/v3/election/leader", r#"{"name":"ZQ=="}"#),
        (
            "/v3/election/proclaim",
            r#"{"leader":{"name":"ZQ==","key":"ZS8xMjM0","rev":"6","lease":"4660"},"value":"djM="}"#,
        ),
        (
            "/v3/election/proclaim",
            r#"{"leader":{"name":"ZQ==","key":"ZS8xMjM0","rev":"3","lease":"4660"},"value":"eA=="}"#,
        ),
        ("/v3/election/proclaim", r#"{"value":"eA=="}"#),
        ("/v3/election/leader", r#"{"name":"ZQ=="}"#),
        ("/v3/election/resign", "{}"),
        (
            "/v3/election/resign",
            r#"{"leader":{"name":"ZQ==","key":"ZS8xMjM0","rev":"6","lease":"4660"}}"#,
        ),
        ("/v3/election/leader", r#"{"name":"ZQ=="}"#),
        ("/v3/election/campaign", r#"{"name":"ZQ==","lease":"77"}"#),
        ("/v3/election/proclaim", r#"{"leader":{"rev":"x"}}"#),
        ("/v3/kv/range", r#"{"key":"AA==","range_end":"AA=="}"#),
    ];
    same_answers(&etcd.endpoint, &ep, steps);

    // Each step waits for the last one's effect, so both servers see the
    // same order of writes (and revisions).
    let mut seen = Vec::new();
    for endpoint in [&etcd.endpoint, &ep] {
        let observer = curl_watch(endpoint, "/v3/election/observe", r#"{"name":"ZQ=="}"#, 5);
        until_sample(endpoint, "etcd_debugging_mvcc_watcher_total", 1.0);
        let campaign = r#"{"name":"ZQ==","lease":"4660","value":"YQ=="}"#;
        assert!(post(endpoint, "/v3/election/campaign", campaign)
            .0
            .ends_with("200 OK"));
        let waiting = curl_watch(
            endpoint,
            "/v3/election/campaign",
            r#"{"name":"ZQ==","lease":"4661","value":"Yg=="}"#,
            4,
        );
        until_count(endpoint, ("ZS8=", "ZTA="), 2);
        // Holds "l", then a waiter that gives up after 1 s.
        assert!(post(
            endpoint,
            "/v3/lock/lock",
            r#"{"name":"bA==","lease":"4661"}"#
        )
        .0
        .ends_with("200 OK"));
        let gives_up = curl_watch(
            endpoint,
            "/v3/lock/lock",
            r#"{"name":"bA==","lease":"4660"}"#,
            1,
        );
        until_count(endpoint, ("bC8=", "bDA="), 2);
        let gave_up = curl_output(gives_up);
        until_count(endpoint, ("bC8=", "bDA="), 1);
        let resign = r#"{"leader":{"name":"ZQ==","key":"ZS8xMjM0","rev":"10","lease":"4660"}}"#;
        let resigned = post(endpoint, "/v3/election/resign", resign);
        let keys = post(
            endpoint,
            "/v3/kv/range",
            r#"{"key":"AA==","range_end":"AA==","keys_only":true}"#,
        );
        seen.push([
            curl_output(observer),
            curl_output(waiting),
            gave_up,
            format!("{} {}", resigned.0, mask_ids(&resigned.1)),
            format!("{} {}", keys.0, mask_ids(&keys.1)),
        ]);
    }
    for (i, (ours, theirs)) in seen[1].iter().zip(&seen[0]).enumerate() {
        assert_eq!(
            ours, theirs,
            "part {i}: metcd (left) differs from etcd (right)"
        );
    }
    assert!(
        seen[0][0].contains("Yg=="),
        "the observer saw the hand-over: {}",
        seen[0][0]
    );
    until_sample(&ep, "etcd_debugging_mvcc_watcher_total", 0.0);
}

/// Waits (bounded) until the keys from `range.0` to `range.1` (base64)
/// number `n`.
fn until_count(endpoint: &str, range: (&str, &str), n: u64) {
    let body = format!(
        r#"{{"key":"{}","range_end":"{}","count_only":true}}"#,
        range.0, range.1
    );
    let mut count = 0;
    for _ in 0..400 {
        let (_, json) = post(endpoint, "/v3/kv/range", &body);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        // proto3 JSON leaves a zero count out.
        count = v["count"].as_str().map_or(0, |c| c.parse().unwrap());
        if count == n {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("{endpoint}: {count} keys in {range:?}, waited for {n}");
}

/// Waits (bounded) until the unlabelled sample `name` on `/metrics` is
/// `value`.
fn until_sample(endpoint: &str, name: &str, value: f64) {
    for _ in 0..400 {
        if sample(&get(endpoint, "/metrics").1, name) == value {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("{endpoint}: {name} never {value}");
}

/// etcd's gRPC metrics (go-grpc-prometheus: started, handled by code,
/// messages received and sent, per method): the same series as etcd 3.4
/// (its grpc.health.v1 service aside, which metcd does not serve), and
/// the same counts for the same etcdctl commands, failures included; and
/// its MVCC counters (ranges, puts, deletes, txns, live keys).
#[test]
fn grpc_metrics_count_as_etcds() {
    use std::collections::BTreeMap;
    let (_dir, etcd, metcd) = etcd_and_metcd();
    let ep = metcd.client_endpoint();
    let mvcc_ops = [
        "etcd_mvcc_put_total",
        "etcd_mvcc_delete_total",
        "etcd_mvcc_range_total",
        "etcd_mvcc_txn_total",
        "etcd_debugging_mvcc_put_total",
        "etcd_debugging_mvcc_delete_total",
        "etcd_debugging_mvcc_range_total",
        "etcd_debugging_mvcc_txn_total",
        "etcd_debugging_mvcc_keys_total",
    ];
    let grpc_series = |endpoint: &str| -> BTreeMap<String, f64> {
        let (status, page) = get(endpoint, "/metrics");
        assert!(status.ends_with("200 OK"), "{status}");
        page.lines()
            .filter(|l| {
                (l.starts_with("grpc_server_") && !l.contains("grpc.health.v1"))
                    || mvcc_ops.iter().any(|m| l.starts_with(&format!("{m} ")))
            })
            .map(|l| {
                let (series, value) = l.rsplit_once(' ').unwrap();
                (series.to_string(), value.parse().unwrap())
            })
            .collect()
    };
    let before = (grpc_series(&etcd.endpoint), grpc_series(&ep));
    assert_eq!(
        before.1.keys().collect::<Vec<_>>(),
        before.0.keys().collect::<Vec<_>>(),
        "metcd (left) and etcd (right) list different gRPC series"
    );
    for args in [
        &["put", "foo", "bar"][..],
        &["get", "foo"],
        &["get", "foo", "--rev=99"],
        &["del", "foo"],
        &["endpoint", "status"],
        &["lease", "grant", "10"],
        &["member", "list"],
        &["compaction", "999"],
    ] {
        for endpoint in [&etcd.endpoint, &ep] {
            let _ = etcdctl(endpoint, args);
        }
    }
    // A txn: its compare is read in a store transaction of its own, then
    // the put and the get of its branch in another.
    for endpoint in [&etcd.endpoint, &ep] {
        let o = crate::etcd_peer::etcdctl_stdin(
            endpoint,
            &["txn"],
            b"create(\"t\") = \"0\"\n\nput t 1\nget t\n\n\n",
        );
        assert!(o.status.success(), "{o:?}");
    }
    let delta = |before: &BTreeMap<String, f64>, after: BTreeMap<String, f64>| {
        after
            .into_iter()
            .filter_map(|(k, v)| {
                let d = v - before.get(&k).copied().unwrap_or(0.0);
                (d != 0.0).then_some((k, d))
            })
            .collect::<BTreeMap<_, _>>()
    };
    let theirs = delta(&before.0, grpc_series(&etcd.endpoint));
    let ours = delta(&before.1, grpc_series(&ep));
    assert!(
        ours.keys()
            .any(|k| k.contains("grpc_code=\"OutOfRange\",grpc_method=\"Range\"")),
        "{ours:#?}"
    );
    assert_eq!(ours.get("etcd_mvcc_txn_total"), Some(&1.0), "{ours:#?}");
    assert_eq!(
        ours.get("etcd_debugging_mvcc_keys_total"),
        Some(&1.0),
        "{ours:#?}"
    );
    assert_eq!(
        ours, theirs,
        "metcd (left) and etcd (right) counted differently"
    );
}

/// `--listen-metrics-urls` (etcd's flag): a port that serves `/metrics`
/// and `/health` as etcd's does, and nothing else — not `/version`, not
/// the JSON gateway, so a monitoring port never reaches the data.
#[test]
fn metrics_urls_serve_metrics_and_health_only_as_etcds() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let (theirs, ours) = (crate::support::free_port(), crate::support::free_port());
    let flag = |port: u16| format!("http://127.0.0.1:{port}");
    let etcd = RealEtcd::spawn_with(
        &dir.path().join("etcd"),
        &["--listen-metrics-urls", &flag(theirs)],
    );
    let mut etcd = etcd;
    etcd.wait_healthy();
    let metcd = Server::start(
        &dir.path().join("metcd"),
        &["--shards", "2", "--listen-metrics-urls", &flag(ours)],
    );
    let (theirs, ours) = (format!("127.0.0.1:{theirs}"), format!("127.0.0.1:{ours}"));
    let put = etcdctl(&metcd.client_endpoint(), &["put", "k", "v"]);
    assert!(put.status.success(), "{put:?}");
    for (method, path) in [
        ("GET", "/health"),
        ("GET", "/version"),
        ("GET", "/nope"),
        ("POST", "/v3/kv/range"),
    ] {
        let (t, o) = (request(&theirs, method, path), request(&ours, method, path));
        assert_eq!(
            (comparable_head(&o.0), &o.1),
            (comparable_head(&t.0), &t.1),
            "{method} {path} on the metrics URL: metcd (left) differs from etcd (right)"
        );
    }
    // A lease granted, renewed once and revoked, as etcd's lessor counts.
    let ep = metcd.client_endpoint();
    let grant = etcdctl(&ep, &["lease", "grant", "60"]);
    let grant = String::from_utf8_lossy(&grant.stdout).to_string();
    let id = grant
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    for args in [
        &["lease", "keep-alive", "--once", &id][..],
        &["lease", "revoke", &id],
    ] {
        let out = etcdctl(&ep, args);
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    let (status, body) = get(&ours, "/metrics");
    assert!(status.ends_with("200 OK"), "{status}");
    for family in ["granted", "renewed", "revoked"] {
        let line = format!("\netcd_debugging_lease_{family}_total 1\n");
        assert!(body.contains(&line), "{line:?} in:\n{body}");
    }
    let successes = body
        .lines()
        .find_map(|l| l.strip_prefix("etcd_server_health_success "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(
        successes >= Some(1),
        "the GET /health above counts: {successes:?}"
    );
    assert!(body.contains("etcd_server_has_leader 1"), "{body}");
    // One put: revision 2, as etcd's store counts.
    assert!(
        body.contains("\netcd_debugging_mvcc_current_revision 2\n"),
        "{body}"
    );
    assert!(body.contains("\nos_fd_used "), "{body}");
}

/// An explicit `--max-concurrent-streams` caps the JSON gateway's requests
/// of the member together, as etcd's gateway shares its one connection to
/// the server: with a limit of 2 and two gateway watches open, a range
/// waits; when a watch's client goes, the range is answered.
#[test]
fn gateway_requests_share_an_explicit_stream_limit_as_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let metcd = Server::start(&dir.path().join("m"), &["--max-concurrent-streams", "2"]);
    let ep = metcd.client_endpoint();
    let post = |path: &str, body: &str| {
        let mut s = TcpStream::connect(&ep).unwrap();
        let wire = format!(
            "POST {path} HTTP/1.1\r\nHost: {ep}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(wire.as_bytes()).unwrap();
        s
    };
    // What arrives until `needle` does (bounded by `limit`), or the
    // read's error when nothing arrived in time.
    let read_until = |s: &mut TcpStream, needle: &str, limit: Duration| {
        s.set_read_timeout(Some(limit)).unwrap();
        let mut got = String::new();
        let mut buf = [0u8; 4096];
        while !got.contains(needle) {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(e) if got.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        Ok(got)
    };
    let mut watches: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut w = post("/v3/watch", r#"{"create_request":{"key":"Zm9v"}}"#);
            let created = read_until(&mut w, "\"created\":true", Duration::from_secs(10)).unwrap();
            assert!(created.contains("\"created\":true"), "{created}");
            w
        })
        .collect();
    let mut range = post("/v3/kv/range", r#"{"key":"Zm9v"}"#);
    let waited = read_until(&mut range, "\"header\"", Duration::from_secs(1));
    assert!(
        waited.as_ref().is_err_and(|e| matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )),
        "a third gateway request was answered over a limit of 2: {waited:?}"
    );
    drop(watches.pop());
    let answer = read_until(&mut range, "\"header\"", Duration::from_secs(10)).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.contains("\"header\""), "{answer}");
}

/// etcd's watch metrics: a watch stream open counts in
/// `etcd_debugging_mvcc_watch_stream_total` while it lives, and each event
/// sent to a watcher once in `etcd_debugging_mvcc_events_total`, the same
/// on metcd as on etcd 3.4 for the same watches and puts.
#[test]
fn watch_stream_and_event_counts_as_etcds() {
    use etcd_client::{Client, WatchOptions};
    let (_dir, etcd, metcd) = etcd_and_metcd();
    let mut seen = Vec::new();
    for endpoint in [etcd.endpoint.clone(), metcd.client_endpoint()] {
        let page = || get(&endpoint, "/metrics").1;
        let events_before = sample(&page(), "etcd_debugging_mvcc_events_total");
        let streams_before = sample(&page(), "etcd_debugging_mvcc_watch_stream_total");
        crate::etcd_client::runtime().block_on(async {
            let mut c = Client::connect([format!("http://{endpoint}")], None)
                .await
                .unwrap();
            // Two watchers on one stream: each put under w/ is sent twice.
            let (mut watcher, mut stream) = c
                .watch("w/", Some(WatchOptions::new().with_prefix()))
                .await
                .unwrap();
            watcher
                .watch("w/1", Some(WatchOptions::new().with_watch_id(7)))
                .await
                .unwrap();
            // The client took the first watch's `created` itself.
            let mut created = 0;
            while created < 1 {
                let resp = crate::etcd_client::within("created", stream.message())
                    .await
                    .unwrap()
                    .unwrap();
                created += usize::from(resp.created());
            }
            until_sample(
                &endpoint,
                "etcd_debugging_mvcc_watch_stream_total",
                streams_before + 1.0,
            );
            for key in ["w/1", "w/2", "w/1", "x"] {
                c.put(key, "v", None).await.unwrap();
            }
            let mut events = 0;
            while events < 5 {
                let resp = crate::etcd_client::within("events", stream.message())
                    .await
                    .unwrap()
                    .unwrap();
                events += resp.events().len();
            }
            let sent = sample(&page(), "etcd_debugging_mvcc_events_total") - events_before;
            seen.push((events, sent));
        });
        // The client is gone: so is its stream.
        until_sample(
            &endpoint,
            "etcd_debugging_mvcc_watch_stream_total",
            streams_before,
        );
    }
    assert_eq!(seen[0], (5, 5.0), "etcd 3.4 itself");
    assert_eq!(seen[1], seen[0], "metcd (right) against etcd (left)");
}

/// A lease left to expire counts once in
/// `etcd_debugging_server_lease_expired_total` on the member that revoked
/// it, as on etcd 3.4; a revoked one does not. Both grants count in
/// `etcd_debugging_lease_ttl_total`, printed as etcd prints it.
#[test]
fn an_expired_lease_counts_as_etcds() {
    let (_dir, etcd, metcd) = etcd_and_metcd();
    let mut ttls = Vec::new();
    for endpoint in [etcd.endpoint.clone(), metcd.client_endpoint()] {
        let expired = || {
            sample(
                &get(&endpoint, "/metrics").1,
                "etcd_debugging_server_lease_expired_total",
            )
        };
        assert_eq!(expired(), 0.0, "{endpoint}");
        let out = etcdctl(&endpoint, &["lease", "grant", "100"]);
        let revoked = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_string();
        assert!(etcdctl(&endpoint, &["lease", "revoke", &revoked])
            .status
            .success());
        assert!(etcdctl(&endpoint, &["lease", "grant", "2"])
            .status
            .success());
        until_sample(&endpoint, "etcd_debugging_server_lease_expired_total", 1.0);
        let page = get(&endpoint, "/metrics").1;
        let histogram: Vec<String> = page
            .lines()
            .filter(|l| l.contains("etcd_debugging_lease_ttl_total"))
            .map(str::to_string)
            .collect();
        ttls.push(histogram);
    }
    assert!(ttls[0]
        .iter()
        .any(|l| l == "etcd_debugging_lease_ttl_total_sum 102"));
    assert_eq!(ttls[1], ttls[0], "metcd (left) against etcd (right)");
}

/// A compaction, a defragmentation, a backup and a HashKV, after three
/// puts, count in etcd 3.4's families for them on metcd as on etcd (etcd
/// counts compacted keys only in full batches of 1000, so that count is
/// metcd's alone); client requests and their bytes are counted by client
/// version; nothing failed or waits. Every family etcd then serves that
/// metcd does not is named in docs/operations.md with the reason.
#[test]
fn compaction_defrag_backup_and_hash_count_as_etcds() {
    let (dir, etcd, metcd) = etcd_and_metcd();
    let mut pages = Vec::new();
    let mut requests = Vec::new();
    let kinds = ["unary", "stream"].map(|kind| {
        format!("etcd_server_client_requests_total{{client_api_version=\"3.4\",type=\"{kind}\"}}")
    });
    for (n, endpoint) in [etcd.endpoint.clone(), metcd.client_endpoint()]
        .into_iter()
        .enumerate()
    {
        // Starting a server may have asked it something already.
        let counts = |page: &str| {
            kinds.clone().map(|kind| {
                page.lines()
                    .find_map(|l| l.strip_prefix(kind.as_str())?.strip_prefix(' '))
                    .map_or(0.0, |v| v.parse::<f64>().unwrap())
            })
        };
        let before = counts(&get(&endpoint, "/metrics").1);
        for value in ["1", "2", "3"] {
            crate::etcd_peer::etcdctl_ok(&endpoint, &["put", "a", value]);
        }
        crate::etcd_peer::etcdctl_ok(&endpoint, &["compact", "3"]);
        crate::etcd_peer::etcdctl_ok(&endpoint, &["defrag"]);
        let backup = dir.path().join(format!("backup-{n}.db"));
        crate::etcd_peer::etcdctl_ok(&endpoint, &["snapshot", "save", backup.to_str().unwrap()]);
        crate::etcd_peer::etcdctl_ok(&endpoint, &["endpoint", "hashkv"]);
        let page = get(&endpoint, "/metrics").1;
        let after = counts(&page);
        requests.push([after[0] - before[0], after[1] - before[1]]);
        pages.push(page);
    }
    // etcdctl's calls: 3 puts, compact, defrag and hashkv; the Snapshot
    // stream.
    assert_eq!(requests[0], [6.0, 1.0], "etcd 3.4 itself");
    assert_eq!(
        requests[1], requests[0],
        "metcd (right) against etcd (left)"
    );
    let (theirs, ours) = (&pages[0], &pages[1]);
    for (name, want) in [
        ("etcd_debugging_mvcc_total_put_size_in_bytes", 6.0),
        (
            "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count",
            1.0,
        ),
        (
            "etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds_count",
            1.0,
        ),
        ("etcd_disk_backend_defrag_duration_seconds_count", 1.0),
        ("etcd_disk_defrag_inflight", 0.0),
        ("etcd_disk_backend_snapshot_duration_seconds_count", 1.0),
        ("etcd_mvcc_hash_rev_duration_seconds_count", 1.0),
        ("etcd_mvcc_hash_duration_seconds_count", 0.0),
        ("etcd_debugging_auth_revision", 1.0),
        ("etcd_debugging_mvcc_pending_events_total", 0.0),
        ("etcd_server_read_indexes_failed_total", 0.0),
        ("etcd_server_slow_read_indexes_total", 0.0),
        ("etcd_server_heartbeat_send_failures_total", 0.0),
    ] {
        assert_eq!(sample(theirs, name), want, "etcd 3.4 itself: {name}");
        assert_eq!(sample(ours, name), want, "metcd: {name}");
    }
    // Revision 2 (the first put) is the one compaction 3 deletes.
    assert_eq!(
        sample(ours, "etcd_debugging_mvcc_db_compaction_keys_total"),
        1.0
    );
    for page in [theirs, ours] {
        for name in [
            "etcd_disk_wal_write_bytes_total",
            "etcd_network_client_grpc_received_bytes_total",
            "etcd_network_client_grpc_sent_bytes_total",
        ] {
            assert!(sample(page, name) > 0.0, "{name} in:\n{page}");
        }
        // The backup went to the client: more than a page of bytes.
        assert!(sample(page, "etcd_network_client_grpc_sent_bytes_total") > 4096.0);
    }

    let families = |page: &str| -> std::collections::BTreeSet<String> {
        page.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .map(str::to_string)
            .collect()
    };
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .unwrap();
    let documented = |family: &str| {
        docs.contains(&format!("`{family}`"))
            || docs
                .split('`')
                .filter_map(|d| d.strip_suffix('*'))
                .any(|prefix| family.starts_with(prefix))
    };
    let ours = families(ours);
    let undocumented: Vec<String> = families(theirs)
        .difference(&ours)
        .filter(|f| !documented(f))
        .cloned()
        .collect();
    assert!(
        undocumented.is_empty(),
        "etcd serves these, metcd does not, docs/operations.md does not say why: {undocumented:?}"
    );
}

/// `--metrics extensive` (etcd's flag) adds each gRPC method's handling
/// time; the default, `basic`, does not; anything else is refused at start.
#[test]
fn metrics_extensive_adds_grpc_handling_times() {
    let dir = tempfile::tempdir().unwrap();
    let extensive = Server::start(&dir.path().join("x"), &["--metrics", "extensive"]);
    let basic = Server::start(&dir.path().join("b"), &[]);
    for s in [&extensive, &basic] {
        crate::etcd_peer::etcdctl_ok(&s.client_endpoint(), &["put", "k", "v"]);
    }
    let put = "{grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}";
    let page = get(&extensive.client_endpoint(), "/metrics").1;
    assert_eq!(
        sample(&page, &format!("grpc_server_handling_seconds_count{put}")),
        1.0
    );
    assert!(sample(&page, &format!("grpc_server_handling_seconds_sum{put}")) > 0.0);
    assert!(!get(&basic.client_endpoint(), "/metrics")
        .1
        .contains("grpc_server_handling_seconds"));
    let out =
        crate::support::run_metcd_to_exit_with(&dir.path().join("bad"), &["--metrics", "all"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("expected basic or extensive"), "{stderr}");
}
