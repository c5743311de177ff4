//! The seed's curl API against the real binary: what a user sees with curl,
//! and bad input answered with a clear error while the server keeps serving.

use crate::support::{HttpConn, Server};

fn server() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("m"),
        &["--shards", "2", "--max-request-bytes", "4096"],
    );
    (dir, s)
}

fn assert_still_serving(s: &Server) {
    let mut c = s.conn();
    let r = c.request("PUT", "/alive", b"yes").unwrap();
    assert_eq!(r.status, 204);
    let r = c.request("GET", "/alive", b"").unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "yes"));
}

#[test]
fn put_get_delete_like_the_seed() {
    let (_d, s) = server();
    let mut c = s.conn();
    let put = c.request("PUT", "/hello", b"world").unwrap();
    assert_eq!(put.status, 204);
    let rev1 = put.header_i64("x-metcd-revision").unwrap();
    let get = c.request("GET", "/hello", b"").unwrap();
    assert_eq!(get.status, 200);
    assert_eq!(get.text(), "world");
    assert_eq!(get.header_i64("x-metcd-mod-revision"), Some(rev1));
    assert_eq!(get.header_i64("x-metcd-create-revision"), Some(rev1));
    assert_eq!(get.header_i64("x-metcd-version"), Some(1));

    // Overwrite: one revision per write, version counts.
    let put2 = c.request("PUT", "/hello", b"again").unwrap();
    let rev2 = put2.header_i64("x-metcd-revision").unwrap();
    assert_eq!(rev2, rev1 + 1);
    let get = c.request("GET", "/hello", b"").unwrap();
    assert_eq!(get.text(), "again");
    assert_eq!(get.header_i64("x-metcd-version"), Some(2));
    assert_eq!(get.header_i64("x-metcd-create-revision"), Some(rev1));

    // Read at the old revision.
    let old = c
        .request("GET", &format!("/hello?rev={rev1}"), b"")
        .unwrap();
    assert_eq!((old.status, old.text().as_str()), (200, "world"));

    let del = c.request("DELETE", "/hello", b"").unwrap();
    assert_eq!(del.status, 200);
    let body = del.json();
    assert_eq!(body["deleted"], "1");
    assert_eq!(body["header"]["revision"], (rev2 + 1).to_string());
    let gone = c.request("GET", "/hello", b"").unwrap();
    assert_eq!(gone.status, 404);
    // Deleting nothing does not bump the revision.
    let del = c.request("DELETE", "/hello", b"").unwrap();
    assert_eq!(del.json()["deleted"], "0");
    assert_eq!(del.header_i64("x-metcd-revision"), Some(rev2 + 1));
}

#[test]
fn prefix_range_with_limit_returns_json() {
    let (_d, s) = server();
    let mut c = s.conn();
    for i in 0..5 {
        assert_eq!(
            c.request("PUT", &format!("/dir/k{i}"), format!("v{i}").as_bytes())
                .unwrap()
                .status,
            204
        );
    }
    c.request("PUT", "/dis", b"outside").unwrap();
    let r = c.request("GET", "/dir/?prefix&limit=3", b"").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    let j = r.json();
    let keys: Vec<&str> = j["kvs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kv| kv["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["/dir/k0", "/dir/k1", "/dir/k2"]);
    assert_eq!(j["kvs"][1]["value"], "v1");
    assert_eq!(j["count"], "5");
    assert_eq!(j["more"], true);

    let r = c
        .request("GET", "/dir/?prefix&sort_order=descend&limit=2", b"")
        .unwrap();
    let j = r.json();
    assert_eq!(j["kvs"][0]["key"], "/dir/k4");
    assert_eq!(j["kvs"][1]["key"], "/dir/k3");

    let r = c.request("GET", "/dir/k1?range_end=/dir/k3", b"").unwrap();
    let j = r.json();
    assert_eq!(j["count"], "2");
    assert_eq!(j["more"], false);

    let r = c.request("GET", "/dir/?prefix&count_only", b"").unwrap();
    let j = r.json();
    assert_eq!(j["count"], "5");
    assert!(j["kvs"].as_array().unwrap().is_empty());

    let r = c.request("DELETE", "/dir/?prefix", b"").unwrap();
    assert_eq!(r.json()["deleted"], "5");
    let r = c.request("GET", "/dis", b"").unwrap();
    assert_eq!(r.text(), "outside");
}

#[test]
fn compaction_over_http_and_the_compacted_error() {
    let (_d, s) = server();
    let mut c = s.conn();
    let r1 = c
        .request("PUT", "/c", b"1")
        .unwrap()
        .header_i64("x-metcd-revision")
        .unwrap();
    let r2 = c
        .request("PUT", "/c", b"2")
        .unwrap()
        .header_i64("x-metcd-revision")
        .unwrap();
    c.request("PUT", "/c", b"3").unwrap();
    let r = c
        .request("POST", &format!("/-/compact?revision={r2}"), b"")
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let old = c.request("GET", &format!("/c?rev={r1}"), b"").unwrap();
    assert_eq!(old.status, 400);
    assert_eq!(
        old.json()["error"],
        "etcdserver: mvcc: required revision has been compacted"
    );
    let at = c.request("GET", &format!("/c?rev={r2}"), b"").unwrap();
    assert_eq!((at.status, at.text().as_str()), (200, "2"));
    let future = c.request("GET", "/c?rev=999999", b"").unwrap();
    assert_eq!(
        future.json()["error"],
        "etcdserver: mvcc: required revision is a future revision"
    );
    // Compacting again at the same revision is an error, as in etcd.
    let again = c
        .request("POST", &format!("/-/compact?revision={r2}"), b"")
        .unwrap();
    assert_eq!(again.status, 400);
    assert_eq!(
        again.json()["error"],
        "etcdserver: mvcc: required revision has been compacted"
    );
}

#[test]
fn oversized_body_is_413_and_nothing_is_written() {
    let (_d, s) = server();
    let mut c = s.conn();
    let big = vec![b'x'; 5000];
    let r = c.request("PUT", "/big", &big).unwrap();
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"], "etcdserver: request is too large");
    // Chunked (no Content-Length) bodies are limited too.
    let mut c2 = s.conn();
    let mut msg = b"PUT /big2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    msg.extend_from_slice(format!("{:x}\r\n", big.len()).as_bytes());
    msg.extend_from_slice(&big);
    msg.extend_from_slice(b"\r\n0\r\n\r\n");
    c2.send_raw(&msg).unwrap();
    let r = c2.read_response(false).unwrap();
    assert_eq!(r.status, 413);
    let mut c3 = s.conn();
    assert_eq!(c3.request("GET", "/big", b"").unwrap().status, 404);
    assert_eq!(c3.request("GET", "/big2", b"").unwrap().status, 404);
    // Just under the limit is fine.
    let ok = vec![b'y'; 4000];
    assert_eq!(c3.request("PUT", "/fits", &ok).unwrap().status, 204);
    assert_still_serving(&s);
}

#[test]
fn bad_keys_and_methods_get_clear_errors() {
    let (_d, s) = server();
    let mut c = s.conn();
    let r = c.request("GET", "/bad%zzkey", b"").unwrap();
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("percent-encoding"),
        "{}",
        r.text()
    );
    let r = c.request("PUT", "/bad%ff", b"v").unwrap();
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"].as_str().unwrap().contains("UTF-8"),
        "{}",
        r.text()
    );
    let r = c.request("PATCH", "/k", b"v").unwrap();
    assert_eq!(r.status, 405);
    assert!(r.headers.get("allow").unwrap().contains("PUT"));
    let r = c.request("GET", "/k?limit=abc&prefix", b"").unwrap();
    assert_eq!(r.status, 400);
    let r = c.request("GET", "/k?rev=", b"").unwrap();
    assert_eq!(r.status, 400);
    // A percent-encoded key round-trips.
    assert_eq!(c.request("PUT", "/sp%20ace", b"v").unwrap().status, 204);
    let r = c.request("GET", "/sp%20ace?prefix", b"").unwrap();
    assert_eq!(r.json()["kvs"][0]["key"], "/sp ace");
    assert_still_serving(&s);
}

#[test]
fn malformed_http_does_not_hurt_the_server() {
    let (_d, s) = server();
    for garbage in [
        &b"\x00\x01\x02 garbage \xff\xfe\r\n\r\n"[..],
        b"GET /x HTTP/1.1\r\nContent-Length: nope\r\n\r\n",
        b"PUT /x HTTP/9.9\r\n\r\n",
        b"GET /\xc3\x28 HTTP/1.1\r\nHost: x\r\n\r\n",
    ] {
        let mut c = HttpConn::connect(&s.addr()).unwrap();
        c.send_raw(garbage).unwrap();
        // Either a 4xx answer or a closed connection; never a 2xx, never a crash.
        if let Ok(r) = c.read_response(false) {
            assert!(
                (400..500).contains(&r.status),
                "{garbage:?} -> {}",
                r.status
            );
        }
    }
    assert_still_serving(&s);
}

#[test]
fn health_and_version() {
    let (_d, s) = server();
    let mut c = s.conn();
    let r = c.request("GET", "/health", b"").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["health"], "true");
    let v = c.request("GET", "/version", b"").unwrap().json();
    assert!(v["etcdserver"].as_str().unwrap().starts_with("3."));
    assert_eq!(v["metcd"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn data_dir_is_locked_against_a_second_process() {
    let (_d, s) = server();
    let out = crate::support::run_metcd_to_exit(&s.data_dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("locked by another metcd"), "{err}");
    assert_still_serving(&s);
}

#[test]
fn periodic_auto_compaction_compacts_old_history() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("m"),
        &[
            "--auto-compaction-mode",
            "periodic",
            "--auto-compaction-retention",
            "1s",
        ],
    );
    let mut c = s.conn();
    let first = c
        .request("PUT", "/ac", b"1")
        .unwrap()
        .header_i64("x-metcd-revision")
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let mut i = 0;
    loop {
        i += 1;
        c.request("PUT", "/ac", format!("{i}").as_bytes()).unwrap();
        let r = c.request("GET", &format!("/ac?rev={first}"), b"").unwrap();
        if r.status == 400 {
            assert_eq!(
                r.json()["error"],
                "etcdserver: mvcc: required revision has been compacted"
            );
            break;
        }
        assert_eq!(r.status, 200);
        assert!(
            std::time::Instant::now() < deadline,
            "history was never compacted:\n{}",
            s.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(s
        .log_text()
        .contains("auto-compaction: compacted to revision"));
    // The newest value is untouched.
    let r = c.request("GET", "/ac", b"").unwrap();
    assert_eq!(r.text(), format!("{i}"));
}
