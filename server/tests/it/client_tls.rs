//! TLS on the client URLs (etcd's `--cert-file`, `--key-file`,
//! `--trusted-ca-file`, `--client-cert-auth`), exercised with the real
//! `etcdctl`: trusted clients are served, others are refused, and nothing
//! is ever served in plaintext on a TLS port.

use std::path::{Path, PathBuf};

use crate::etcd_peer::{etcdctl, require_etcd};
use crate::support::Server;

struct Pems {
    ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
    /// A client certificate from another CA.
    rogue: (PathBuf, PathBuf),
    /// Client certificates whose common names are `root`, `alice` and
    /// `nobody`.
    root_cn: (PathBuf, PathBuf),
    alice_cn: (PathBuf, PathBuf),
    nobody_cn: (PathBuf, PathBuf),
}

/// Writes `cert.pem`/`key.pem` pairs signed by a fresh CA (or, for the
/// rogue one, by a second CA) into `dir`.
fn pems(dir: &Path) -> Pems {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        let path = dir.join(format!("{name}.pem"));
        std::fs::write(&path, cert.pem()).unwrap();
        (path, Issuer::new(params, key))
    };
    let leaf = |issuer: &Issuer<'_, KeyPair>, name: &str, san: &str| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![san.to_string()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, name.trim_end_matches("-cn"));
        let cert = params.signed_by(&key, issuer).unwrap();
        let (cert_path, key_path) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}-key.pem")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    };
    let (ca_path, issuer) = ca("ca");
    let (_, other) = ca("other-ca");
    Pems {
        ca: ca_path,
        server: leaf(&issuer, "server", "127.0.0.1"),
        client: leaf(&issuer, "client", "client"),
        rogue: leaf(&other, "rogue", "client"),
        root_cn: leaf(&issuer, "root-cn", "client"),
        alice_cn: leaf(&issuer, "alice-cn", "client"),
        nobody_cn: leaf(&issuer, "nobody-cn", "client"),
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// etcdctl over TLS: the server checked against `ca`, the client
/// presenting `cert` (certificate, key).
fn etcdctl_as(
    ep: &str,
    ca: &Path,
    cert: &(PathBuf, PathBuf),
    args: &[&str],
) -> std::process::Output {
    let mut all = vec!["--cacert", s(ca), "--cert", s(&cert.0), "--key", s(&cert.1)];
    all.extend_from_slice(args);
    etcdctl(ep, &all)
}

#[test]
fn client_urls_over_tls_with_client_certificates() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let p = pems(dir.path());
    let server = Server::start_https(
        &dir.path().join("m"),
        &[
            "--cert-file",
            s(&p.server.0),
            "--key-file",
            s(&p.server.1),
            "--trusted-ca-file",
            s(&p.ca),
            "--client-cert-auth",
        ],
    );
    let ep = format!("https://{}", server.client_endpoint());
    let with_cert = |cert: &(PathBuf, PathBuf), args: &[&str]| etcdctl_as(&ep, &p.ca, cert, args);

    let put = with_cert(&p.client, &["put", "secret", "v1"]);
    assert!(put.status.success(), "{put:?}");
    let get = with_cert(&p.client, &["get", "secret"]);
    assert!(get.status.success(), "{get:?}");
    assert_eq!(String::from_utf8_lossy(&get.stdout), "secret\nv1\n");
    let health = with_cert(&p.client, &["endpoint", "health"]);
    assert!(health.status.success(), "{health:?}");

    // No client certificate, one from another CA, or no TLS at all: refused.
    let anonymous = etcdctl(&ep, &["--cacert", s(&p.ca), "put", "secret", "v2"]);
    assert!(!anonymous.status.success(), "{anonymous:?}");
    let rogue = with_cert(&p.rogue, &["put", "secret", "v2"]);
    assert!(!rogue.status.success(), "{rogue:?}");
    let plain = etcdctl(&server.client_endpoint(), &["put", "secret", "v2"]);
    assert!(!plain.status.success(), "{plain:?}");

    // None of them wrote anything.
    let get = with_cert(&p.client, &["get", "secret"]);
    assert_eq!(String::from_utf8_lossy(&get.stdout), "secret\nv1\n");
}

/// etcd's rules for the other combinations: a trusted CA alone already
/// requires client certificates; a certificate and key alone encrypt and
/// serve anyone.
#[test]
fn a_trusted_ca_requires_client_certificates_and_none_serves_anyone() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let p = pems(dir.path());
    let server_files = ["--cert-file", s(&p.server.0), "--key-file", s(&p.server.1)];
    let with_ca = Server::start_https(
        &dir.path().join("with-ca"),
        &[&server_files[..], &["--trusted-ca-file", s(&p.ca)]].concat(),
    );
    let ep = format!("https://{}", with_ca.client_endpoint());
    let anonymous = etcdctl(&ep, &["--cacert", s(&p.ca), "put", "k", "v"]);
    assert!(!anonymous.status.success(), "{anonymous:?}");
    let trusted = etcdctl_as(&ep, &p.ca, &p.client, &["put", "k", "v"]);
    assert!(trusted.status.success(), "{trusted:?}");

    let open = Server::start_https(&dir.path().join("open"), &server_files);
    let ep = format!("https://{}", open.client_endpoint());
    let anonymous = etcdctl(&ep, &["--cacert", s(&p.ca), "put", "k", "v"]);
    assert!(anonymous.status.success(), "{anonymous:?}");
    // The client still checks the server: without the CA it refuses.
    let unverified = etcdctl(&ep, &["put", "k", "v"]);
    assert!(!unverified.status.success(), "{unverified:?}");
}

/// With `--client-cert-auth` and auth on, a request without a token is
/// the user its client certificate's common name names (etcd's
/// AuthInfoFromTLS; Kubernetes' API servers authenticate this way); a
/// token still wins; a name that is no user has no permission. Without
/// `--client-cert-auth` (a trusted CA alone) the name is not a user.
#[test]
fn the_client_certificate_names_the_user_with_client_cert_auth() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let p = pems(dir.path());
    let tls = [
        "--cert-file",
        s(&p.server.0),
        "--key-file",
        s(&p.server.1),
        "--trusted-ca-file",
        s(&p.ca),
    ];
    let server = Server::start_https(
        &dir.path().join("m"),
        &[&tls[..], &["--client-cert-auth"]].concat(),
    );
    let ep = format!("https://{}", server.client_endpoint());
    let run = |ep: &str, cert: &(PathBuf, PathBuf), args: &[&str]| {
        let o = etcdctl_as(ep, &p.ca, cert, args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        (o.status.success(), text)
    };
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "alice:apw"],
        &["role", "add", "r"],
        &["role", "grant-permission", "r", "readwrite", "hoo"],
        &["user", "grant-role", "alice", "r"],
        &["auth", "enable"],
    ] {
        let (ok, text) = run(&ep, &p.client, args);
        assert!(ok, "{args:?}: {text}");
    }
    const DENIED: &str = "Error: etcdserver: permission denied";
    let (ok, text) = run(&ep, &p.root_cn, &["put", "foo", "bar"]);
    assert!(ok, "root by certificate: {text}");
    let (ok, text) = run(&ep, &p.root_cn, &["user", "list"]);
    assert!(ok && text.contains("alice"), "root by certificate: {text}");
    let (ok, text) = run(&ep, &p.alice_cn, &["put", "hoo", "bar"]);
    assert!(ok, "alice by certificate: {text}");
    let (ok, text) = run(&ep, &p.alice_cn, &["put", "baz", "bar"]);
    assert!(!ok && text.contains(DENIED), "alice by certificate: {text}");
    let (ok, text) = run(&ep, &p.alice_cn, &["user", "list"]);
    assert!(!ok && text.contains(DENIED), "alice by certificate: {text}");
    let (ok, text) = run(&ep, &p.nobody_cn, &["get", "hoo"]);
    assert!(!ok && text.contains(DENIED), "no such user: {text}");
    let (ok, text) = run(
        &ep,
        &p.alice_cn,
        &["--user", "root:rootpw", "put", "baz", "x"],
    );
    assert!(ok, "the token wins over the certificate: {text}");
    let (ok, text) = run(&ep, &p.root_cn, &["get", "baz", "--print-value-only"]);
    assert!(ok && text == "x\n", "{text}");
    drop(server);

    // A trusted CA alone: certificates are required, but name no user.
    let server = Server::start_https(&dir.path().join("m"), &tls);
    let ep = format!("https://{}", server.client_endpoint());
    let (ok, text) = run(&ep, &p.root_cn, &["get", "hoo"]);
    assert!(
        !ok && text.contains("Error: etcdserver: user name is empty"),
        "{text}"
    );
}

/// Over TLS, curl negotiates HTTP/2 (ALPN), and etcd's JSON gateway and
/// its HTTP endpoints answer there as over HTTP/1.1 (etcd's mux tells gRPC
/// from the rest by content type); gRPC on the same port still works.
#[test]
fn the_json_gateway_answers_over_http2() {
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let p = pems(dir.path());
    let server = Server::start_https(
        &dir.path().join("m"),
        &["--cert-file", s(&p.server.0), "--key-file", s(&p.server.1)],
    );
    let base = format!("https://{}", server.client_endpoint());
    let curl = |http: &str, path: &str, body: Option<&str>| -> (String, String) {
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-s", "-m", "10", "--cacert", s(&p.ca), http])
            .args(["-w", "\n%{http_version} %{http_code}"]);
        if let Some(b) = body {
            cmd.args(["-XPOST", "-d", b]);
        }
        let o = cmd.arg(format!("{base}{path}")).output().unwrap();
        let all = String::from_utf8_lossy(&o.stdout).into_owned();
        let (answer, status) = all.rsplit_once('\n').unwrap();
        (status.to_string(), answer.to_string())
    };
    let (status, put) = curl(
        "--http2",
        "/v3/kv/put",
        Some(r#"{"key":"Zm9v","value":"YmFy"}"#),
    );
    assert_eq!(status, "2 200", "{put}");
    assert!(put.contains(r#""revision":"2""#), "{put}");
    for (path, body) in [
        ("/v3/kv/range", Some(r#"{"key":"Zm9v"}"#)),
        ("/v3/kv/range", Some("nope")),
        ("/v3/nosuch", Some("{}")),
        ("/version", None),
        ("/health", None),
    ] {
        let (h2_status, h2) = curl("--http2", path, body);
        let (h1_status, h1) = curl("--http1.1", path, body);
        assert_eq!(
            h2_status.replace("2 ", ""),
            h1_status.replace("1.1 ", ""),
            "{path}: {h2} / {h1}"
        );
        assert!(h2_status.starts_with("2 "), "{path}: {h2_status}");
        assert_eq!(h2, h1, "{path} over HTTP/2 and HTTP/1.1");
    }
    // gRPC on the same connection kind.
    let get = etcdctl(
        &base,
        &["--cacert", s(&p.ca), "get", "foo", "--print-value-only"],
    );
    assert_eq!(String::from_utf8_lossy(&get.stdout), "bar\n", "{get:?}");
}

/// A client certificate that is itself a trusted CA certificate (a
/// self-signed `CN=root` CA, as etcd's own test setups use) is taken, as
/// etcd takes it, and names its user; an untrusted self-signed one is not.
#[test]
fn a_trusted_ca_certificate_is_taken_as_a_client_certificate() {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let p = pems(dir.path());
    let self_signed = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "root");
        let cert = params.self_signed(&key).unwrap();
        let (cert_path, key_path) = (
            dir.path().join(format!("{name}.pem")),
            dir.path().join(format!("{name}-key.pem")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    };
    let trusted_root = self_signed("root-ca");
    let untrusted_root = self_signed("other-root-ca");
    let bundle = dir.path().join("bundle.pem");
    let ca = std::fs::read_to_string(&p.ca).unwrap();
    let root = std::fs::read_to_string(&trusted_root.0).unwrap();
    std::fs::write(&bundle, format!("{ca}{root}")).unwrap();
    let server = Server::start_https(
        &dir.path().join("m"),
        &[
            "--cert-file",
            s(&p.server.0),
            "--key-file",
            s(&p.server.1),
            "--trusted-ca-file",
            s(&bundle),
            "--client-cert-auth",
        ],
    );
    let ep = format!("https://{}", server.client_endpoint());
    let run = |cert: &(PathBuf, PathBuf), args: &[&str]| etcdctl_as(&ep, &p.ca, cert, args);
    for args in [&["user", "add", "root:rootpw"][..], &["auth", "enable"]] {
        let o = run(&trusted_root, args);
        assert!(o.status.success(), "{args:?}: {o:?}");
    }
    // CN=root: the root user, without a password.
    let o = run(&trusted_root, &["user", "list"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "root\n");
    let o = run(&untrusted_root, &["user", "list"]);
    assert!(!o.status.success(), "an untrusted self-signed CA: {o:?}");
}

/// `--cipher-suites` (Go's names) restricts the TLS 1.2 suites a client
/// may use, as in etcd; TLS 1.3 stays available (Go does not make it
/// configurable); a suite metcd does not implement refuses the start.
#[test]
fn cipher_suites_restrict_tls12() {
    let dir = tempfile::tempdir().unwrap();
    let p = pems(dir.path());
    let server = Server::start_https(
        &dir.path().join("m"),
        &[
            "--cert-file",
            s(&p.server.0),
            "--key-file",
            s(&p.server.1),
            "--cipher-suites",
            "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        ],
    );
    let handshake = |args: &[&str]| {
        let o = std::process::Command::new("openssl")
            .args([
                "s_client",
                "-connect",
                &server.client_endpoint(),
                "-CAfile",
                s(&p.ca),
            ])
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    let (ok, out) = handshake(&["-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"]);
    assert!(ok && out.contains("ECDHE-ECDSA-AES256-GCM-SHA384"), "{out}");
    let (ok, out) = handshake(&["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"]);
    assert!(!ok, "a suite left out was negotiated: {out}");
    let (ok, out) = handshake(&["-tls1_3"]);
    assert!(ok && out.contains("TLSv1.3"), "{out}");

    let o = crate::support::run_metcd_to_exit_with(
        &dir.path().join("n"),
        &["--cipher-suites", "TLS_RSA_WITH_AES_128_CBC_SHA"],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("unsupported TLS cipher suite \"TLS_RSA_WITH_AES_128_CBC_SHA\""),
        "{err}"
    );
}

/// `--client-crl-file` (etcd's flag): a client certificate the list
/// revokes is refused at the handshake, another of the same CA is served.
#[test]
fn revoked_client_certificates_are_refused() {
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, IsCa, Issuer,
        KeyIdMethod, KeyPair, RevokedCertParams, SerialNumber,
    };
    require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let ca = write("ca.pem", ca_cert.pem());
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |name: &str, san: &str, serial: u64| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![san.to_string()]).unwrap();
        params.serial_number = Some(SerialNumber::from(serial));
        let cert = params.signed_by(&key, &issuer).unwrap();
        (
            write(&format!("{name}.pem"), cert.pem()),
            write(&format!("{name}-key.pem"), key.serialize_pem()),
        )
    };
    let server = leaf("server", "127.0.0.1", 1);
    let good = leaf("good", "client", 2);
    let revoked = leaf("revoked", "client", 3);
    let crl = CertificateRevocationListParams {
        this_update: rcgen::date_time_ymd(2020, 1, 1),
        next_update: rcgen::date_time_ymd(2099, 1, 1),
        crl_number: SerialNumber::from(1u64),
        issuing_distribution_point: None,
        revoked_certs: vec![RevokedCertParams {
            serial_number: SerialNumber::from(3u64),
            revocation_time: rcgen::date_time_ymd(2021, 1, 1),
            reason_code: None,
            invalidity_date: None,
        }],
        key_identifier_method: KeyIdMethod::Sha256,
    }
    .signed_by(&issuer)
    .unwrap();
    let crl = write("revoked.crl", crl.pem().unwrap());
    let member = Server::start_https(
        &dir.path().join("m"),
        &[
            "--cert-file",
            s(&server.0),
            "--key-file",
            s(&server.1),
            "--trusted-ca-file",
            s(&ca),
            "--client-cert-auth",
            "--client-crl-file",
            s(&crl),
        ],
    );
    let ep = format!("https://{}", member.client_endpoint());
    let put = |cert: &(PathBuf, PathBuf)| etcdctl_as(&ep, &ca, cert, &["put", "k", "v"]);
    let o = put(&good);
    assert!(o.status.success(), "{o:?}");
    let o = put(&revoked);
    assert!(
        !o.status.success(),
        "a revoked certificate was served: {o:?}"
    );
}

/// etcd's `--auto-tls`: https:// client URLs without a certificate get a
/// self-signed one, made once in `<data-dir>/fixtures/client` and kept
/// across restarts; clients that skip verification are served, others
/// refuse the server.
#[test]
fn auto_tls_makes_and_keeps_a_self_signed_certificate() {
    require_etcd();
    // etcdctl 3.4 speaks TLS only when told, and then may skip checks.
    const SKIP: [&str; 2] = ["--insecure-transport=false", "--insecure-skip-tls-verify"];
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_https(&dir.path().join("m"), &["--auto-tls"]);
    let ep = format!("https://{}", server.client_endpoint());
    let cert = dir.path().join("m/fixtures/client/cert.pem");
    let made = std::fs::read(&cert).unwrap();
    let o = etcdctl(&ep, &[SKIP[0], SKIP[1], "put", "k", "v"]);
    assert!(o.status.success(), "{o:?}");
    let o = etcdctl(&ep, &["--insecure-transport=false", "get", "k"]);
    assert!(
        !o.status.success(),
        "an unverifiable server was trusted: {o:?}"
    );
    server.restart();
    assert_eq!(
        std::fs::read(&cert).unwrap(),
        made,
        "the certificate is kept"
    );
    let o = etcdctl(&ep, &[SKIP[0], SKIP[1], "get", "k", "--print-value-only"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "v\n", "{o:?}");
}
