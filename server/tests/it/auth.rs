//! Auth beyond the etcdctl comparison (etcdctl.rs): the state survives
//! kill -9 and restart, tokens do not (they are per process, as etcd's
//! simple tokens), and metcd's own HTTP API and etcd's JSON gateway are
//! guarded by the same permissions as gRPC.

use std::process::{Command, Output};

use crate::etcd_peer::{etcdctl, etcdctl_stdin, require_etcd};
use crate::support::Server;

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(endpoint: &str, args: &[&str]) -> String {
    let o = etcdctl(endpoint, args);
    assert!(o.status.success(), "etcdctl {args:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn fails_with(endpoint: &str, args: &[&str], message: &str) {
    let o = etcdctl(endpoint, args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && stderr.contains(message),
        "etcdctl {args:?} should fail with {message:?}: {}",
        text(&o)
    );
}

/// `curl` with an optional `Authorization` header: (HTTP status, body).
fn curl(method: &str, url: &str, token: Option<&str>, body: Option<&str>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-m", "10", "-w", "\n%{http_code}", "-X", method, url]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: {t}")]);
    }
    if let Some(b) = body {
        cmd.args(["-d", b]);
    }
    let out = cmd.output().expect("curl runs");
    let all = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = all.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn token(client_endpoint: &str, user: &str, password: &str) -> String {
    let (status, body) = curl(
        "POST",
        &format!("http://{client_endpoint}/v3/auth/authenticate"),
        None,
        Some(&format!(r#"{{"name":"{user}","password":"{password}"}}"#)),
    );
    assert_eq!(status, 200, "authenticate: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    v["token"].as_str().expect("a token").to_string()
}

#[test]
fn auth_survives_kill_9_and_guards_every_api() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &[]);
    let ep = server.client_endpoint();
    let http = format!("http://{}", server.addr());
    ok(&ep, &["user", "add", "root:rootpw"]);
    ok(&ep, &["auth", "enable"]);
    let root = ["--user", "root:rootpw"];
    let alice = ["--user", "alice:apw"];
    let with = |who: &[&str; 2], args: &[&str]| -> Vec<String> {
        who.iter().chain(args).map(|s| s.to_string()).collect()
    };
    let run_ok = |who: &[&str; 2], args: &[&str]| {
        let v = with(who, args);
        ok(&ep, &v.iter().map(String::as_str).collect::<Vec<_>>())
    };
    run_ok(&root, &["user", "add", "alice:apw"]);
    run_ok(&root, &["role", "add", "reader"]);
    for prefix in ["k", "/k"] {
        // metcd's HTTP API keys are the whole path, leading slash included.
        let grant = [
            "role",
            "grant-permission",
            "reader",
            "read",
            "--prefix=true",
            prefix,
        ];
        run_ok(&root, &grant);
    }
    run_ok(&root, &["user", "grant-role", "alice", "reader"]);
    run_ok(&root, &["put", "k1", "v1"]);
    run_ok(&root, &["put", "/k1", "v1"]);
    run_ok(&root, &["put", "secret", "s"]);

    // metcd's HTTP API: no token, a reader's token, root's token.
    let (status, body) = curl("GET", &format!("{http}/k1"), None, None);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("etcdserver: user name is empty"), "{body}");
    let reader = token(&ep, "alice", "apw");
    let (status, body) = curl("GET", &format!("{http}/k1"), Some(&reader), None);
    assert_eq!(status, 200, "{body}");
    let (status, body) = curl("GET", &format!("{http}/secret"), Some(&reader), None);
    assert_eq!(
        (status, body.contains("permission denied")),
        (403, true),
        "{body}"
    );
    let (status, body) = curl("PUT", &format!("{http}/k1"), Some(&reader), Some("x"));
    assert_eq!(status, 403, "{body}");
    let (status, body) = curl(
        "PUT",
        &format!("{http}/k2"),
        Some(&token(&ep, "root", "rootpw")),
        Some("v2"),
    );
    assert_eq!(status, 204, "{body}");
    // etcd's JSON gateway takes the token from `Authorization` too.
    let range = |t: Option<&str>| {
        curl(
            "POST",
            &format!("http://{ep}/v3/kv/range"),
            t,
            Some(r#"{"key":"azE="}"#),
        )
    };
    let (status, body) = range(Some(&reader));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""value":"djE=""#), "{body}");
    let (status, body) = range(None);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("user name is empty"), "{body}");

    server.kill9();
    server.restart();
    // Users, roles, grants and the enabled flag are back; tokens are not.
    fails_with(&ep, &["get", "k1"], "etcdserver: user name is empty");
    let got = run_ok(&alice, &["get", "/k", "--prefix"]);
    assert_eq!(got, "/k1\nv1\n/k2\nv2\n");
    let v = with(&alice, &["put", "k1", "x"]);
    fails_with(
        &ep,
        &v.iter().map(String::as_str).collect::<Vec<_>>(),
        "etcdserver: permission denied",
    );
    let (status, body) = curl("GET", &format!("{http}/k1"), Some(&reader), None);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("etcdserver: invalid auth token"), "{body}");
    assert_eq!(
        run_ok(&root, &["role", "get", "reader"]),
        "Role reader\nKV Read:\n\t[/k, /l) (prefix /k)\n\t[k, l) (prefix k)\nKV Write:\n"
    );

    // A password change lands through the log and survives too.
    let o = etcdctl_stdin(
        &ep,
        &[
            "--user",
            "root:rootpw",
            "user",
            "passwd",
            "alice",
            "--interactive=false",
        ],
        b"newpw\n",
    );
    assert!(o.status.success(), "{}", text(&o));
    server.kill9();
    server.restart();
    fails_with(
        &ep,
        &["--user", "alice:apw", "get", "k1"],
        "authentication failed",
    );
    assert_eq!(
        ok(
            &ep,
            &["--user", "alice:newpw", "get", "k1", "--print-value-only"]
        ),
        "v1\n"
    );
}

/// `etcdctl --user <who> <args>`.
fn as_user(ep: &str, who: &str, args: &[&str]) -> Output {
    let mut all = vec!["--user", who];
    all.extend_from_slice(args);
    etcdctl(ep, &all)
}

fn lease_grant(ep: &str, who: &str) -> String {
    let o = as_user(ep, who, &["lease", "grant", "60"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    // "lease 694da21b2d097b10 granted with TTL(60s)"
    out.split_whitespace()
        .nth(1)
        .expect("a lease id")
        .to_string()
}

fn denied(o: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && stderr.contains("etcdserver: permission denied"),
        "{what} should be refused: {}",
        text(o)
    );
}

/// Leases and values are guarded by the permissions on the keys behind
/// them (outputs checked against etcd 3.4.23 by hand, except where noted):
/// a key may not join a lease holding keys its writer may not write, nor
/// may that lease be revoked by them; a lease's key names are shown only
/// to who may read them all (etcd 3.4.26's CVE-2023-32082 fix; 3.4.23
/// shows them); a delete that returns the old values needs read too.
#[test]
fn leases_and_returned_values_need_permission_on_their_keys() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let ep = server.client_endpoint();
    let http = format!("http://{}", server.addr());
    let (root, alice) = ("root:rootpw", "alice:apw");
    ok(&ep, &["user", "add", "root:rootpw"]);
    ok(&ep, &["user", "add", "alice:apw"]);
    ok(&ep, &["role", "add", "w"]);
    ok(
        &ep,
        &[
            "role",
            "grant-permission",
            "w",
            "readwrite",
            "--prefix=true",
            "a/",
        ],
    );
    ok(
        &ep,
        &[
            "role",
            "grant-permission",
            "w",
            "write",
            "--prefix=true",
            "/w/",
        ],
    );
    ok(&ep, &["user", "grant-role", "alice", "w"]);
    ok(&ep, &["auth", "enable"]);

    let roots = lease_grant(&ep, root);
    let o = as_user(&ep, root, &["put", "secret", "s", "--lease", &roots]);
    assert!(o.status.success(), "{}", text(&o));
    denied(
        &as_user(&ep, alice, &["put", "a/1", "x", "--lease", &roots]),
        "attaching a key to a lease that holds root's key",
    );
    denied(
        &as_user(&ep, alice, &["lease", "revoke", &roots]),
        "revoking a lease that holds root's key",
    );
    denied(
        &as_user(&ep, alice, &["lease", "timetolive", &roots, "--keys"]),
        "listing the keys of a lease that holds root's key",
    );
    let o = as_user(&ep, alice, &["lease", "timetolive", &roots]);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("granted with TTL(60s)"),
        "{}",
        text(&o)
    );
    // Nothing was half-applied: root's key is still there, on its lease.
    let o = as_user(&ep, root, &["lease", "timetolive", &roots, "--keys"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("attached keys([secret])"),
        "{}",
        text(&o)
    );
    let o = as_user(&ep, root, &["get", "a/1"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "", "{}", text(&o));

    // A lease with only her keys is hers to use and revoke.
    let shared = lease_grant(&ep, root);
    let o = as_user(&ep, alice, &["put", "a/1", "x", "--lease", &shared]);
    assert!(o.status.success(), "{}", text(&o));
    let o = as_user(&ep, alice, &["lease", "timetolive", &shared, "--keys"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("attached keys([a/1])"),
        "{}",
        text(&o)
    );
    let o = as_user(&ep, alice, &["lease", "revoke", &shared]);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("revoked"),
        "{}",
        text(&o)
    );
    let o = as_user(&ep, root, &["get", "a/1"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "", "revoke deleted it");

    // metcd's HTTP API: write-only on /w/ may delete, not see the values.
    let t = token(&ep, "alice", "apw");
    let (status, body) = curl("PUT", &format!("{http}/w/x"), Some(&t), Some("v"));
    assert_eq!(status, 204, "{body}");
    let (status, body) = curl("DELETE", &format!("{http}/w/x?prev_kv"), Some(&t), None);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("etcdserver: permission denied"), "{body}");
    let (status, body) = curl(
        "GET",
        &format!("{http}/w/x"),
        Some(&token(&ep, "root", "rootpw")),
        None,
    );
    assert_eq!(
        (status, body.as_str()),
        (200, "v"),
        "the refused delete deleted nothing"
    );
    let (status, body) = curl("DELETE", &format!("{http}/w/x"), Some(&t), None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""deleted":"1""#), "{body}");
}

/// `--auth-token jwt,...` with the test keys in `tests/fixtures/jwt`.
pub fn jwt_flag(method: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt");
    let (public, private) = match method {
        "ES256" => ("ec.pub", "ec.key"),
        _ => ("rsa.pub", "rsa.key"),
    };
    format!("jwt,pub-key={dir}/{public},priv-key={dir}/{private},sign-method={method},ttl=5m")
}

/// The header of a JWT, decoded.
fn jwt_header(token: &str) -> serde_json::Value {
    use base64::Engine as _;
    let b64 = token.split('.').next().unwrap();
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(b64)
        .unwrap();
    serde_json::from_slice(&raw).unwrap()
}

/// JWT tokens (etcd's `--auth-token jwt`): signed, so they outlive a
/// kill -9 and restart (simple tokens do not) and need no server state;
/// any auth change makes older ones stale (`revision of auth store is
/// old`, clients log in again); a forged or foreign token is invalid.
#[test]
fn jwt_tokens_survive_a_restart_and_go_stale_on_auth_changes() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let flag = jwt_flag("ES256");
    let mut server = Server::start(dir.path(), &["--auth-token", &flag]);
    let ep = server.client_endpoint();
    ok(&ep, &["user", "add", "root:rootpw"]);
    ok(&ep, &["auth", "enable"]);
    let put = |ep: &str, token: Option<&str>, value: &str| {
        curl(
            "POST",
            &format!("http://{ep}/v3/kv/put"),
            token,
            Some(&format!(r#"{{"key":"Zm9v","value":"{value}"}}"#)),
        )
    };
    let t1 = token(&ep, "root", "rootpw");
    assert_eq!(jwt_header(&t1)["alg"], "ES256", "{t1}");
    assert_eq!(put(&ep, Some(&t1), "MQ==").0, 200);

    server.restart();
    server.wait_healthy();
    let ep = server.client_endpoint();
    let (status, body) = put(&ep, Some(&t1), "Mg==");
    assert_eq!(status, 200, "the token outlived the restart: {body}");
    // etcdctl logs in for every command; it works against the new process.
    assert_eq!(
        ok(
            &ep,
            &["--user", "root:rootpw", "get", "foo", "--print-value-only"]
        ),
        "2\n"
    );

    // An auth change (the role added) makes t1 stale for key requests.
    ok(&ep, &["--user", "root:rootpw", "role", "add", "r1"]);
    let (status, body) = put(&ep, Some(&t1), "Mw==");
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("etcdserver: revision of auth store is old"),
        "{body}"
    );
    let t2 = token(&ep, "root", "rootpw");
    assert_eq!(put(&ep, Some(&t2), "Mw==").0, 200);

    // Changed bytes, a token signed with another key, an unsigned one
    // (`alg: none`), an HMAC one keyed with the public key: invalid.
    let mut forged = t2.clone();
    forged.insert(forged.find('.').unwrap() + 1, 'x');
    let keys = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt");
    let sign_with = |option: String| match server::jwt::TokenKind::from_option(&option).unwrap() {
        server::jwt::TokenKind::Jwt(t) => t.sign("root", 1_000_000).unwrap(),
        server::jwt::TokenKind::Simple => unreachable!(),
    };
    let other_key = sign_with(format!(
        "jwt,priv-key={keys}/ec-other.key,sign-method=ES256"
    ));
    let hmac_confused = sign_with(format!("jwt,priv-key={keys}/ec.pub,sign-method=HS256"));
    let claims = other_key.split('.').nth(1).unwrap();
    let unsigned = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{claims}.");
    for bad in [
        forged.as_str(),
        other_key.as_str(),
        hmac_confused.as_str(),
        unsigned.as_str(),
        "abc.def.ghi",
        "simple.12",
    ] {
        let (status, body) = put(&ep, Some(bad), "NA==");
        assert_eq!(status, 401, "{bad}: {body}");
        assert!(body.contains("etcdserver: invalid auth token"), "{body}");
    }
    // The value is the last accepted put's.
    assert_eq!(
        ok(
            &ep,
            &["--user", "root:rootpw", "get", "foo", "--print-value-only"]
        ),
        "3\n"
    );
}

/// A member given only the public key checks tokens but cannot issue
/// them: a login answers etcd's error instead of a token.
#[test]
fn a_verify_only_member_refuses_to_issue_tokens() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let keys = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt");
    let flag = format!("jwt,pub-key={keys}/rsa.pub,sign-method=RS256");
    let server = Server::start(dir.path(), &["--auth-token", &flag]);
    let ep = server.client_endpoint();
    ok(&ep, &["user", "add", "root:rootpw"]);
    ok(&ep, &["auth", "enable"]);
    let (status, body) = curl(
        "POST",
        &format!("http://{ep}/v3/auth/authenticate"),
        None,
        Some(r#"{"name":"root","password":"rootpw"}"#),
    );
    assert_eq!(status, 500, "{body}");
    assert!(
        body.contains("auth: token signing attempted with verify-only key"),
        "{body}"
    );
    // It checks tokens the key's owner signed.
    let signer = format!("jwt,priv-key={keys}/rsa.key,sign-method=RS256");
    let server::jwt::TokenKind::Jwt(owner) = server::jwt::TokenKind::from_option(&signer).unwrap()
    else {
        unreachable!()
    };
    let token = owner.sign("root", 1_000_000).unwrap();
    let (status, body) = curl(
        "POST",
        &format!("http://{ep}/v3/kv/put"),
        Some(&token),
        Some(r#"{"key":"Zm9v","value":"YmFy"}"#),
    );
    assert_eq!(status, 200, "{body}");
}
