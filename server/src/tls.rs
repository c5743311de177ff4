//! TLS for the peer transport (etcd's `--peer-cert-file`,
//! `--peer-key-file`, `--peer-trusted-ca-file`, `--peer-client-cert-auth`)
//! and for the client URLs (`--cert-file`, `--key-file`,
//! `--trusted-ca-file`, `--client-cert-auth`).
//!
//! This module owns loading the PEM files into rustls configurations and
//! [`PeerStream`], the one stream type the transport reads and writes,
//! plain or encrypted. It must never accept a peer certificate that does
//! not chain to the trusted CA, and never fall back to plaintext when TLS
//! is configured.
//!
//! A member presents its peer certificate both when it accepts and when it
//! connects (as etcd does), so with `--peer-client-cert-auth` both ends are
//! authenticated. Servers are verified by the IP address they are reached
//! at: peer certificates need the member's IP in their subject alternative
//! names (etcd's documentation asks for the same).

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_lite::{AsyncRead, AsyncWrite};
use futures_rustls::{TlsAcceptor, TlsConnector};
use glommio::net::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The peer TLS settings of a member.
#[derive(Clone)]
pub struct PeerTls {
    connector: TlsConnector,
    acceptor: TlsAcceptor,
    client: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls")
    }
}

/// Where a member's peer TLS material lives.
#[derive(Debug, Clone)]
pub struct PeerTlsFiles<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
    /// `None` with `--peer-auto-tls`: members present self-signed
    /// certificates and check none, as etcd's auto TLS peers do.
    pub trusted_ca: Option<&'a Path>,
    /// Require connecting peers to present a certificate of the CA.
    pub client_cert_auth: bool,
    /// `--cipher-suites` (Go's names, comma-separated; empty: all).
    pub cipher_suites: &'a str,
    /// `--peer-crl-file`: peer certificates revoked.
    pub crl: Option<&'a Path>,
    /// `--peer-cert-allowed-cn` (empty: any).
    pub allowed_cn: &'a str,
    /// `--peer-cert-allowed-hostname` (empty: any).
    pub allowed_hostname: &'a str,
}

/// ring's suites, restricted to etcd's `--cipher-suites` (Go's names)
/// when given. As in Go, the list only restricts TLS 1.2: TLS 1.3's
/// suites are not configurable and always offered.
fn provider(cipher_suites: &str) -> Result<Arc<rustls::crypto::CryptoProvider>, String> {
    let mut provider = rustls::crypto::ring::default_provider();
    let wanted = tls12_cipher_suites(cipher_suites)?;
    if !wanted.is_empty() {
        provider
            .cipher_suites
            .retain(|s| s.version() == &rustls::version::TLS13 || wanted.contains(&s.suite()));
    }
    Ok(Arc::new(provider))
}

/// Go's names of the TLS 1.2 suites rustls implements (ECDHE with AEAD).
const GO_CIPHER_SUITES: &[(&str, rustls::CipherSuite)] = &[
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        rustls::CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        rustls::CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// `--cipher-suites` (comma-separated Go names) as rustls suites; empty:
/// no restriction. A suite Go knows that rustls does not implement (CBC,
/// RSA key exchange, 3DES, RC4) is refused by name.
pub fn tls12_cipher_suites(names: &str) -> Result<Vec<rustls::CipherSuite>, String> {
    names
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|name| {
            GO_CIPHER_SUITES
                .iter()
                .find(|(go, _)| *go == name)
                .map(|(_, suite)| *suite)
                .ok_or_else(|| {
                    format!(
                        "unsupported TLS cipher suite {name:?} (metcd offers the ECDHE AEAD suites: {})",
                        GO_CIPHER_SUITES
                            .iter()
                            .map(|(go, _)| *go)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
        })
        .collect()
}

fn invalid(what: &str, path: &Path, e: impl std::fmt::Display) -> String {
    format!("{what} {}: {e}", path.display())
}

/// A PEM certificate chain (`flag` names it in errors).
fn load_chain(flag: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| invalid(flag, path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(flag, path, e))?;
    if chain.is_empty() {
        return Err(invalid(flag, path, "no certificate"));
    }
    Ok(chain)
}

fn load_key(flag: &str, path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| invalid(flag, path, e))
}

/// The CA certificates of a PEM file.
fn load_roots(flag: &str, path: &Path) -> Result<Arc<rustls::RootCertStore>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(path).map_err(|e| invalid(flag, path, e))? {
        let ca = ca.map_err(|e| invalid(flag, path, e))?;
        roots.add(ca).map_err(|e| invalid(flag, path, e))?;
    }
    if roots.is_empty() {
        return Err(invalid(flag, path, "no certificate"));
    }
    Ok(Arc::new(roots))
}

/// The verifier of client (and connecting peer) certificates: webpki, and
/// two of etcd's rules on top.
///
/// - etcd (Go's x509) also takes a client certificate that is itself one
///   of the trusted CA certificates (a self-signed `CN=root` CA presented
///   as the client's own), which webpki refuses as a CA used as an end
///   entity: such a certificate is accepted when it is byte for byte one
///   of `trusted_leaves` and within its validity.
/// - Peers: the allowed common name or host name (`identity`).
#[derive(Debug)]
struct CheckedClientVerifier {
    webpki: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    trusted_leaves: Vec<CertificateDer<'static>>,
    identity: PeerIdentity,
}

impl rustls::server::danger::ClientCertVerifier for CheckedClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.webpki.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.webpki.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.webpki.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        let verified = match self
            .webpki
            .verify_client_cert(end_entity, intermediates, now)
        {
            Ok(verified) => verified,
            Err(refused) => {
                let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
                let is_root = self
                    .trusted_leaves
                    .iter()
                    .any(|r| r.as_ref() == end_entity.as_ref());
                let valid = crate::der::certificate_validity(end_entity)
                    .is_some_and(|(from, until)| from <= now && now <= until);
                if !(is_root && valid) {
                    return Err(refused);
                }
                rustls::server::danger::ClientCertVerified::assertion()
            }
        };
        self.identity.check(end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// The certificate revocation lists of a file (PEM, or one DER list, as
/// Go's `x509.ParseCRL` takes either).
fn load_crls(
    flag: &str,
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateRevocationListDer<'static>>, String> {
    use rustls::pki_types::CertificateRevocationListDer;
    let bytes = std::fs::read(path).map_err(|e| invalid(flag, path, e))?;
    let pem: Vec<CertificateRevocationListDer<'static>> =
        CertificateRevocationListDer::pem_slice_iter(&bytes)
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(flag, path, e))?;
    if !pem.is_empty() {
        return Ok(pem);
    }
    if bytes.first() == Some(&0x30) {
        return Ok(vec![CertificateRevocationListDer::from(bytes)]);
    }
    Err(invalid(flag, path, "no certificate revocation list"))
}

/// A webpki client verifier for `roots`, refusing certificates the CRL
/// file lists (etcd's `--client-crl-file`, `--peer-crl-file`); a
/// certificate whose issuer has no list there passes, as in etcd, which
/// only looks for revoked serial numbers.
fn client_verifier(
    roots: Arc<rustls::RootCertStore>,
    cipher_suites: &str,
    crl: Option<(&str, &Path)>,
    (ca_flag, ca): (&str, &Path),
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
    let mut builder = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots,
        provider(cipher_suites)?,
    );
    if let Some((flag, path)) = crl {
        builder = builder
            .with_crls(load_crls(flag, path)?)
            .allow_unknown_revocation_status();
    }
    builder.build().map_err(|e| invalid(ca_flag, ca, e))
}

/// etcd's `--auto-tls` and `--peer-auto-tls`: https:// client (peer)
/// URLs without `--cert-file` (`--peer-cert-file`) get a self-signed
/// certificate for their hosts, made once in `<data-dir>/fixtures/client`
/// (`.../peer`, etcd's places) and reused by later starts; the config
/// then names it. Clients must skip verifying it (`etcdctl
/// --insecure-transport=false --insecure-skip-tls-verify`), as with etcd;
/// auto TLS peers check no certificate ([`PeerTls`]).
pub fn auto_tls(cfg: &mut crate::config::Config) -> Result<(), String> {
    if cfg.client_auto_tls() {
        let hosts = cfg.client_listen_addrs().map_err(|e| e.to_string())?;
        let dir = cfg.data_dir().join("fixtures").join("client");
        let (cert, key) = self_signed(&dir, &hosts, "--auto-tls")?;
        cfg.cert_file = Some(cert);
        cfg.key_file = Some(key);
    }
    if cfg.peer_auto_tls_applies() {
        let mut hosts = cfg.peer_listen_addrs().map_err(|e| e.to_string())?;
        if hosts.is_empty() {
            hosts = crate::config::parse_peer_urls(
                "initial-advertise-peer-urls",
                &cfg.initial_advertise_peer_urls,
            )
            .map_err(|e| e.to_string())?;
        }
        let dir = cfg.data_dir().join("fixtures").join("peer");
        let (cert, key) = self_signed(&dir, &hosts, "--peer-auto-tls")?;
        cfg.peer_cert_file = Some(cert);
        cfg.peer_key_file = Some(key);
    }
    Ok(())
}

/// `dir/cert.pem` and `dir/key.pem`, made for `hosts` unless both exist.
fn self_signed(
    dir: &Path,
    hosts: &[crate::net::Endpoint],
    flag: &str,
) -> Result<(std::path::PathBuf, std::path::PathBuf), String> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    let hosts: Vec<String> = hosts
        .iter()
        .filter_map(crate::net::Endpoint::tcp)
        .map(|a| a.ip().to_string())
        .collect();
    let made = |e: rcgen::Error| format!("{flag}: {e}");
    let pair = rcgen::KeyPair::generate().map_err(made)?;
    let mut params = rcgen::CertificateParams::new(hosts).map_err(made)?;
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "etcd");
    let certificate = params.self_signed(&pair).map_err(made)?;
    std::fs::create_dir_all(dir).map_err(|e| invalid(flag, dir, e))?;
    write_private(&key, pair.serialize_pem().as_bytes())?;
    std::fs::write(&cert, certificate.pem()).map_err(|e| invalid(flag, &cert, e))?;
    eprintln!(
        "metcd: {flag}: made a self-signed certificate in {}",
        dir.display()
    );
    Ok((cert, key))
}

/// Writes a key file readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| invalid("key", path, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| invalid("key", path, e))
}

/// Where the client URLs' TLS material lives (etcd's `--cert-file`,
/// `--key-file`, `--trusted-ca-file`, `--client-cert-auth`).
#[derive(Debug, Clone)]
pub struct ClientTlsFiles<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
    pub trusted_ca: Option<&'a Path>,
    /// Require clients to present a certificate of the trusted CA.
    pub client_cert_auth: bool,
    /// `--cipher-suites` (Go's names, comma-separated; empty: all).
    pub cipher_suites: &'a str,
    /// `--client-crl-file`: client certificates revoked.
    pub crl: Option<&'a Path>,
}

/// The TLS acceptor of the client URLs. It offers HTTP/2 (gRPC) and
/// HTTP/1.1 (`/health`, `/metrics`) by ALPN, as etcd does.
pub fn client_url_acceptor(files: &ClientTlsFiles<'_>) -> Result<TlsAcceptor, String> {
    let chain = load_chain("--cert-file", files.cert)?;
    let key = load_key("--key-file", files.key)?;
    // As etcd: a trusted CA alone already makes clients present a
    // certificate of it.
    let client_verifier = match (files.client_cert_auth, files.trusted_ca) {
        (_, Some(ca)) => {
            let roots = load_roots("--trusted-ca-file", ca)?;
            let crl = files.crl.map(|path| ("--client-crl-file", path));
            let webpki =
                client_verifier(roots, files.cipher_suites, crl, ("--trusted-ca-file", ca))?;
            let roots = load_chain("--trusted-ca-file", ca)?;
            Arc::new(CheckedClientVerifier {
                webpki,
                trusted_leaves: roots,
                identity: PeerIdentity::default(),
            })
        }
        (true, None) => return Err("--client-cert-auth needs --trusted-ca-file".into()),
        (false, None) => rustls::server::WebPkiClientVerifier::no_client_auth(),
    };
    let mut server = rustls::ServerConfig::builder_with_provider(provider(files.cipher_suites)?)
        .with_protocol_versions(rustls::DEFAULT_VERSIONS)
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(client_verifier)
        .with_single_cert(chain, key)
        .map_err(|e| invalid("--key-file", files.key, e))?;
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(server)))
}

/// etcd's `--peer-cert-allowed-cn` and `--peer-cert-allowed-hostname`:
/// a peer's verified certificate must also carry this common name, or be
/// valid for this host name (its SANs, as Go's `VerifyHostname`). Checked
/// on both ends of a peer connection, as etcd's `VerifyPeerCertificate`.
#[derive(Debug, Clone, Default)]
struct PeerIdentity {
    cn: Option<String>,
    hostname: Option<ServerName<'static>>,
}

impl PeerIdentity {
    fn is_set(&self) -> bool {
        self.cn.is_some() || self.hostname.is_some()
    }

    /// A refusal is logged here, with etcd's words (`client certificate
    /// authentication failed`, what etcd's e2e tests wait for on the
    /// refusing member) and which check failed, and answered as a name
    /// mismatch, so the peer is sent TLS's `bad_certificate` alert, as
    /// Go's `VerifyPeerCertificate` refusal is (etcd's e2e test waits for
    /// the refused member to log `remote error: tls: bad certificate`).
    fn check(&self, cert: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        let refused = |why: &str| {
            let cn = crate::der::certificate_common_name(cert).unwrap_or_default();
            eprintln!(
                "metcd: peer: rejected connection: client certificate authentication failed \
                 (certificate CN {cn:?}: {why})"
            );
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
        };
        if let Some(cn) = &self.cn {
            if crate::der::certificate_common_name(cert).as_deref() != Some(cn.as_str()) {
                return Err(refused("CommonName authentication failed"));
            }
        }
        if let Some(name) = &self.hostname {
            let parsed = rustls::server::ParsedCertificate::try_from(cert)?;
            rustls::client::verify_server_name(&parsed, name)
                .map_err(|_| refused("HostName authentication failed"))?;
        }
        Ok(())
    }
}

/// Takes any server certificate (`--peer-auto-tls` only), checking the
/// handshake's signatures with it.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The verifier of the members this one connects to: webpki (by the IP
/// dialled), then the allowed name.
#[derive(Debug)]
struct PeerServerVerifier {
    webpki: Arc<rustls::client::WebPkiServerVerifier>,
    identity: PeerIdentity,
}

impl rustls::client::danger::ServerCertVerifier for PeerServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let verified = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        self.identity.check(end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

impl PeerTls {
    /// Loads the certificate chain, key and CA; errors name the file.
    pub fn load(files: &PeerTlsFiles<'_>) -> Result<PeerTls, String> {
        let chain = load_chain("--peer-cert-file", files.cert)?;
        let key = load_key("--peer-key-file", files.key)?;
        let versions = rustls::DEFAULT_VERSIONS;
        let Some(trusted_ca) = files.trusted_ca else {
            return PeerTls::unverified(files, chain, key);
        };
        let roots = load_roots("--peer-trusted-ca-file", trusted_ca)?;
        let identity = PeerIdentity {
            cn: (!files.allowed_cn.is_empty()).then(|| files.allowed_cn.to_string()),
            hostname: match files.allowed_hostname {
                "" => None,
                name => Some(
                    ServerName::try_from(name.to_string())
                        .map_err(|e| format!("--peer-cert-allowed-hostname {name:?}: {e}"))?,
                ),
            },
        };
        // As etcd: an allowed name can only be checked on a certificate,
        // so it makes connecting members present one.
        let client_verifier = if files.client_cert_auth || identity.is_set() {
            let webpki = client_verifier(
                roots.clone(),
                files.cipher_suites,
                files.crl.map(|path| ("--peer-crl-file", path)),
                ("--peer-trusted-ca-file", trusted_ca),
            )?;
            Arc::new(CheckedClientVerifier {
                webpki,
                trusted_leaves: Vec::new(),
                identity: identity.clone(),
            })
        } else {
            rustls::server::WebPkiClientVerifier::no_client_auth()
        };
        let server = rustls::ServerConfig::builder_with_provider(provider(files.cipher_suites)?)
            .with_protocol_versions(versions)
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| invalid("--peer-key-file", files.key, e))?;
        let server_verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            roots,
            provider(files.cipher_suites)?,
        )
        .build()
        .map_err(|e| invalid("--peer-trusted-ca-file", trusted_ca, e))?;
        let client = rustls::ClientConfig::builder_with_provider(provider(files.cipher_suites)?)
            .with_protocol_versions(versions)
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PeerServerVerifier {
                webpki: server_verifier,
                identity,
            }))
            .with_client_auth_cert(chain, key)
            .map_err(|e| invalid("--peer-key-file", files.key, e))?;
        let client = Arc::new(client);
        Ok(PeerTls {
            connector: TlsConnector::from(client.clone()),
            acceptor: TlsAcceptor::from(Arc::new(server)),
            client,
        })
    }

    /// `--peer-auto-tls`: encrypted, not authenticated (etcd's auto TLS
    /// peers skip verifying each other): no client certificates asked,
    /// any server certificate taken, the handshake signatures still
    /// checked.
    fn unverified(
        files: &PeerTlsFiles<'_>,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<PeerTls, String> {
        let provider = provider(files.cipher_suites)?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(rustls::DEFAULT_VERSIONS)
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| invalid("--peer-key-file", files.key, e))?;
        let client = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(rustls::DEFAULT_VERSIONS)
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_client_auth_cert(chain, key)
            .map_err(|e| invalid("--peer-key-file", files.key, e))?;
        let client = Arc::new(client);
        Ok(PeerTls {
            connector: TlsConnector::from(client.clone()),
            acceptor: TlsAcceptor::from(Arc::new(server)),
            client,
        })
    }

    /// The TLS handshake of an outgoing connection to `addr`.
    pub async fn connect(
        &self,
        addr: &std::net::SocketAddr,
        tcp: TcpStream,
    ) -> io::Result<PeerStream> {
        let name = ServerName::IpAddress(addr.ip().into());
        let stream = self.connector.connect(name, tcp).await?;
        Ok(PeerStream::Client(Box::new(stream)))
    }

    /// The TLS handshake of an accepted connection. A refused handshake's
    /// alert (`bad_certificate` for a peer whose name is not allowed) is
    /// sent before the connection closes, so the refused member logs why,
    /// as etcd's does ([`HandshakeBuffered`]).
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<PeerStream> {
        let stream = accept_sending_alerts(&self.acceptor, tcp).await?;
        Ok(PeerStream::Server(Box::new(stream)))
    }

    /// For the blocking probe of a joining member.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        self.client.clone()
    }
}

/// A server-side TLS handshake on `tcp` whose refusal's alert reaches the
/// other end before the connection closes ([`HandshakeBuffered`]), as Go's
/// TLS server sends it (a refused etcd peer or client logs `remote error:
/// tls: bad certificate`, not an EOF).
pub async fn accept_sending_alerts(
    acceptor: &TlsAcceptor,
    tcp: TcpStream,
) -> io::Result<futures_rustls::server::TlsStream<HandshakeBuffered>> {
    let buffered = HandshakeBuffered {
        inner: tcp,
        pending: Vec::new(),
        sent: 0,
        handshaking: true,
    };
    match acceptor.accept(buffered).into_fallible().await {
        Ok(mut stream) => {
            stream.get_mut().0.handshaking = false;
            Ok(stream)
        }
        Err((e, mut io)) => {
            let sent = futures_lite::future::poll_fn(|cx| io.poll_send_and_flush(cx));
            let _ = glommio::timer::timeout(ALERT_SEND_LIMIT, async { Ok(sent.await) }).await;
            Err(e)
        }
    }
}

/// How long a refused handshake's alert may take to leave.
const ALERT_SEND_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The TCP stream under a server-side TLS handshake. While it handshakes,
/// writes are taken into a buffer at once and sent as the socket takes
/// them: the TLS library writes a refused handshake's alert once, as a last
/// gasp, and drops it if the socket is not ready (glommio's sockets write
/// through io_uring, so the first poll of a write is usually not ready);
/// kept here, the caller can still send it. After the handshake, writes go
/// straight to the socket once anything left is sent.
pub struct HandshakeBuffered {
    inner: TcpStream,
    pending: Vec<u8>,
    sent: usize,
    handshaking: bool,
}

impl HandshakeBuffered {
    /// Writes what the buffer holds (nothing to do once it is empty, the
    /// case of every write after the handshake).
    fn poll_send_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.sent..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.sent += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.pending.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Sends the buffer, then flushes the socket.
    fn poll_send_and_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.poll_send_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.inner).poll_flush(cx),
            other => other,
        }
    }
}

impl AsyncRead for HandshakeBuffered {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for HandshakeBuffered {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.handshaking {
            this.pending.extend_from_slice(buf);
            // Started now; the handshake's flush finishes it.
            if let Poll::Ready(Err(e)) = this.poll_send_pending(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        match this.poll_send_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_write(cx, buf),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_send_and_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.poll_send_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_close(cx),
            other => other,
        }
    }
}

/// A peer or client connection, plain or TLS, or on a Unix socket.
pub enum PeerStream {
    Plain(TcpStream),
    Unix(glommio::net::UnixStream),
    Client(Box<futures_rustls::client::TlsStream<TcpStream>>),
    Server(Box<futures_rustls::server::TlsStream<HandshakeBuffered>>),
}

impl From<crate::net::Accepted> for PeerStream {
    fn from(conn: crate::net::Accepted) -> Self {
        match conn {
            crate::net::Accepted::Tcp(s) => PeerStream::Plain(s),
            crate::net::Accepted::Unix(s) => PeerStream::Unix(s),
        }
    }
}

/// A connection accepted on a client-facing URL (client or metrics):
/// TLS first with `acceptor`, plaintext without. `None` when it must not
/// be served: a refused handshake (the client's problem; the alert said
/// why) or a Unix socket where TLS is due (the configuration refuses TLS
/// with unix:// URLs, so it cannot happen).
pub async fn accept_client(
    acceptor: Option<&TlsAcceptor>,
    conn: crate::net::Accepted,
) -> Option<PeerStream> {
    match (acceptor, conn) {
        (None, conn) => Some(PeerStream::from(conn)),
        (Some(_), crate::net::Accepted::Unix(_)) => None,
        (Some(acceptor), crate::net::Accepted::Tcp(tcp)) => accept_sending_alerts(acceptor, tcp)
            .await
            .ok()
            .map(|s| PeerStream::Server(Box::new(s))),
    }
}

impl AsyncRead for PeerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            PeerStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            PeerStream::Client(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            PeerStream::Server(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for PeerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            PeerStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            PeerStream::Client(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            PeerStream::Server(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            PeerStream::Unix(s) => Pin::new(s).poll_flush(cx),
            PeerStream::Client(s) => Pin::new(s.as_mut()).poll_flush(cx),
            PeerStream::Server(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_close(cx),
            PeerStream::Unix(s) => Pin::new(s).poll_close(cx),
            PeerStream::Client(s) => Pin::new(s.as_mut()).poll_close(cx),
            PeerStream::Server(s) => Pin::new(s.as_mut()).poll_close(cx),
        }
    }
}

/// Go's wording of a TLS alert the other end sent (`remote error: tls:
/// bad certificate`), for logs operators and etcd's tests grep; `None` for
/// any other error.
pub fn go_remote_alert(e: &std::io::Error) -> Option<&'static str> {
    use rustls::AlertDescription as A;
    let mut source: Option<&(dyn std::error::Error + 'static)> =
        e.get_ref().map(|inner| inner as _);
    while let Some(err) = source {
        if let Some(rustls::Error::AlertReceived(alert)) = err.downcast_ref::<rustls::Error>() {
            return Some(match alert {
                A::BadCertificate => "remote error: tls: bad certificate",
                A::UnknownCA => "remote error: tls: unknown certificate authority",
                A::CertificateExpired => "remote error: tls: expired certificate",
                A::CertificateRevoked => "remote error: tls: revoked certificate",
                A::HandshakeFailure => "remote error: tls: handshake failure",
                A::CertificateRequired => "remote error: tls: certificate required",
                _ => "remote error: tls: alert",
            });
        }
        source = err.source();
    }
    None
}
