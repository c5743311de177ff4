//! etcd's JWT auth tokens (`--auth-token jwt,pub-key=<file>,priv-key=<file>,
//! sign-method=RS256,ttl=5m`): a token is a signed JWS whose claims name
//! the user, the auth revision it was issued at and its expiry. Any member
//! holding the public key checks it without shared state, so a login
//! survives restarts and works on every member — unlike a simple token.
//!
//! Owns the option string, the keys (PEM files as etcd reads them: PKCS#1
//! or PKCS#8 RSA keys, SEC1 or PKCS#8 EC keys, SPKI or PKCS#1 public keys;
//! for HMAC the private key file's bytes are the secret) and the token
//! format; signatures are `ring`'s. Must never decide who may do what:
//! that is [`crate::auth`]'s, from the name and revision answered here.

use crate::der::{certificate_spki, der, tlv, BIT_STRING, OCTET_STRING, SEQUENCE};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _, RsaKeyPair, UnparsedPublicKey};

/// etcd's default JWT lifetime (`ttl` option).
const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// Why a token could not be issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    /// etcd's text, for a member given only the public key.
    #[error("auth: token signing attempted with verify-only key")]
    VerifyOnly,
    #[error("auth: failed to sign the token")]
    Failed,
}

/// The sign methods, by their JWS names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Rs(Sha),
    Ps(Sha),
    Es256,
    Es384,
    Hs(Sha),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sha {
    S256,
    S384,
    S512,
}

impl Method {
    fn parse(name: &str) -> Option<Method> {
        let sha = |bits: &str| match bits {
            "256" => Some(Sha::S256),
            "384" => Some(Sha::S384),
            "512" => Some(Sha::S512),
            _ => None,
        };
        let (family, bits) = (name.get(..2)?, name.get(2..)?);
        Some(match family {
            "RS" => Method::Rs(sha(bits)?),
            "PS" => Method::Ps(sha(bits)?),
            "HS" => Method::Hs(sha(bits)?),
            "ES" if bits == "256" => Method::Es256,
            "ES" if bits == "384" => Method::Es384,
            _ => return None,
        })
    }

    fn name(self) -> String {
        let bits = |s: Sha| match s {
            Sha::S256 => "256",
            Sha::S384 => "384",
            Sha::S512 => "512",
        };
        match self {
            Method::Rs(s) => format!("RS{}", bits(s)),
            Method::Ps(s) => format!("PS{}", bits(s)),
            Method::Hs(s) => format!("HS{}", bits(s)),
            Method::Es256 => "ES256".into(),
            Method::Es384 => "ES384".into(),
        }
    }

    /// The public-key check (`None` for HMAC, checked with the secret).
    fn verification(self) -> Option<&'static dyn signature::VerificationAlgorithm> {
        Some(match self {
            Method::Rs(Sha::S256) => &signature::RSA_PKCS1_2048_8192_SHA256,
            Method::Rs(Sha::S384) => &signature::RSA_PKCS1_2048_8192_SHA384,
            Method::Rs(Sha::S512) => &signature::RSA_PKCS1_2048_8192_SHA512,
            Method::Ps(Sha::S256) => &signature::RSA_PSS_2048_8192_SHA256,
            Method::Ps(Sha::S384) => &signature::RSA_PSS_2048_8192_SHA384,
            Method::Ps(Sha::S512) => &signature::RSA_PSS_2048_8192_SHA512,
            Method::Es256 => &signature::ECDSA_P256_SHA256_FIXED,
            Method::Es384 => &signature::ECDSA_P384_SHA384_FIXED,
            Method::Hs(_) => return None,
        })
    }

    fn rsa_encoding(self) -> &'static dyn signature::RsaEncoding {
        match self {
            Method::Ps(Sha::S256) => &signature::RSA_PSS_SHA256,
            Method::Ps(Sha::S384) => &signature::RSA_PSS_SHA384,
            Method::Ps(Sha::S512) => &signature::RSA_PSS_SHA512,
            Method::Rs(Sha::S384) => &signature::RSA_PKCS1_SHA384,
            Method::Rs(Sha::S512) => &signature::RSA_PKCS1_SHA512,
            _ => &signature::RSA_PKCS1_SHA256,
        }
    }

    fn hmac(self) -> ring::hmac::Algorithm {
        match self {
            Method::Hs(Sha::S384) => ring::hmac::HMAC_SHA384,
            Method::Hs(Sha::S512) => ring::hmac::HMAC_SHA512,
            _ => ring::hmac::HMAC_SHA256,
        }
    }
}

enum Signer {
    Rsa(RsaKeyPair),
    Ecdsa(EcdsaKeyPair),
    Hmac(ring::hmac::Key),
}

enum Verifier {
    Public(Vec<u8>),
    Hmac(ring::hmac::Key),
}

/// A member's JWT keys and settings.
pub struct JwtTokens {
    method: Method,
    /// `None`: verify-only (no `priv-key`), as etcd allows.
    signer: Option<Signer>,
    verifier: Verifier,
    ttl: Duration,
    rng: SystemRandom,
}

impl std::fmt::Debug for JwtTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtTokens")
            .field("method", &self.method.name())
            .field("verify_only", &self.signer.is_none())
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// What `--auth-token` names: etcd's simple tokens, or JWTs.
#[derive(Debug, Clone, Default)]
pub enum TokenKind {
    #[default]
    Simple,
    Jwt(Arc<JwtTokens>),
}

impl TokenKind {
    /// Parses `--auth-token` (`simple`, or `jwt,<key>=<value>,...`),
    /// reading the key files it names.
    pub fn from_option(option: &str) -> Result<TokenKind, String> {
        let mut parts = option.split(',');
        let kind = parts.next().unwrap_or_default().trim();
        let mut opts: Vec<(&str, &str)> = Vec::new();
        for part in parts {
            let Some((k, v)) = part.split_once('=').filter(|(_, v)| !v.contains('=')) else {
                return Err(format!("invalid token option {part:?} (want key=value)"));
            };
            if opts.iter().any(|(seen, _)| *seen == k) {
                return Err(format!("token option {k:?} given twice"));
            }
            opts.push((k, v));
        }
        match kind {
            "simple" | "" => Ok(TokenKind::Simple),
            "jwt" => JwtTokens::from_options(&opts).map(|t| TokenKind::Jwt(Arc::new(t))),
            other => Err(format!("unknown token type {other:?} (simple or jwt)")),
        }
    }
}

impl JwtTokens {
    fn from_options(opts: &[(&str, &str)]) -> Result<JwtTokens, String> {
        let get = |k: &str| opts.iter().find(|(name, _)| *name == k).map(|(_, v)| *v);
        for (k, _) in opts {
            if !matches!(*k, "pub-key" | "priv-key" | "sign-method" | "ttl") {
                return Err(format!(
                    "unknown JWT option {k:?} (pub-key, priv-key, sign-method, ttl)"
                ));
            }
        }
        let method_name = get("sign-method").unwrap_or_default();
        let method = Method::parse(method_name).ok_or_else(|| {
            format!(
                "sign-method {method_name:?} is not one of RS256, RS384, RS512, PS256, PS384, \
                 PS512, ES256, ES384, HS256, HS384, HS512"
            )
        })?;
        let ttl = match get("ttl") {
            None | Some("") => DEFAULT_TTL,
            Some(t) => parse_go_duration(t).ok_or_else(|| format!("bad ttl {t:?}"))?,
        };
        let read = |opt: &str| -> Result<Option<Vec<u8>>, String> {
            match get(opt) {
                None | Some("") => Ok(None),
                Some(path) => std::fs::read(path)
                    .map(Some)
                    .map_err(|e| format!("{opt} {path}: {e}")),
            }
        };
        let (public, private) = (read("pub-key")?, read("priv-key")?);
        let rng = SystemRandom::new();
        let (signer, verifier) = match method {
            Method::Hs(_) => {
                // etcd refuses a missing or empty secret: anyone could sign.
                let secret = private
                    .filter(|secret| !secret.is_empty())
                    .ok_or("an HMAC sign-method needs a non-empty priv-key (the secret)")?;
                let key = ring::hmac::Key::new(method.hmac(), &secret);
                (Some(Signer::Hmac(key.clone())), Verifier::Hmac(key))
            }
            _ => {
                let signer = match private {
                    None => None,
                    Some(pem) => Some(private_key(method, &pem, &rng)?),
                };
                // As etcd: without pub-key, the private key's own half.
                let public = match (public, &signer) {
                    (Some(pem), _) => public_key(method, &pem)?,
                    (None, Some(Signer::Rsa(key))) => key.public_key().as_ref().to_vec(),
                    (None, Some(Signer::Ecdsa(key))) => key.public_key().as_ref().to_vec(),
                    (None, _) => return Err("pub-key or priv-key is required".into()),
                };
                (signer, Verifier::Public(public))
            }
        };
        let tokens = JwtTokens {
            method,
            signer,
            verifier,
            ttl,
            rng,
        };
        if tokens.signer.is_some() {
            // A key pair that does not match would issue tokens nobody,
            // not even this member, accepts: refuse it at start.
            let probe = tokens
                .sign_at("probe", 1, 0)
                .map_err(|e| format!("cannot sign with priv-key: {e}"))?;
            if tokens.verify_at(&probe, 0).is_none() {
                return Err("priv-key and pub-key are not one key pair".into());
            }
        }
        Ok(tokens)
    }

    /// A token for `username` at auth `revision`, valid for the TTL.
    pub fn sign(&self, username: &str, revision: u64) -> Result<String, SignError> {
        self.sign_at(username, revision, unix_now())
    }

    /// The user and auth revision a valid, unexpired token names.
    pub fn verify(&self, token: &str) -> Option<(String, u64)> {
        self.verify_at(token, unix_now())
    }

    fn sign_at(&self, username: &str, revision: u64, now: u64) -> Result<String, SignError> {
        let signer = self.signer.as_ref().ok_or(SignError::VerifyOnly)?;
        // As jwt-go writes them: JSON objects with sorted keys.
        let header = format!(r#"{{"alg":"{}","typ":"JWT"}}"#, self.method.name());
        let name = serde_json::to_string(username).map_err(|_| SignError::Failed)?;
        let exp = now.saturating_add(self.ttl.as_secs());
        let claims = format!(r#"{{"exp":{exp},"revision":{revision},"username":{name}}}"#);
        let mut token = URL_SAFE_NO_PAD.encode(header);
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(claims));
        let input = token.as_bytes();
        let signature = match signer {
            Signer::Rsa(key) => {
                let mut sig = vec![0; key.public().modulus_len()];
                key.sign(self.method.rsa_encoding(), &self.rng, input, &mut sig)
                    .map_err(|_| SignError::Failed)?;
                sig
            }
            Signer::Ecdsa(key) => key
                .sign(&self.rng, input)
                .map_err(|_| SignError::Failed)?
                .as_ref()
                .to_vec(),
            Signer::Hmac(key) => ring::hmac::sign(key, input).as_ref().to_vec(),
        };
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(signature));
        Ok(token)
    }

    fn verify_at(&self, token: &str, now: u64) -> Option<(String, u64)> {
        let (input, signature) = token.rsplit_once('.')?;
        let (header, claims) = input.split_once('.')?;
        let header: serde_json::Value = serde_json::from_slice(&segment(header)?).ok()?;
        if header.get("alg")?.as_str()? != self.method.name() {
            return None;
        }
        let signature = segment(signature)?;
        match &self.verifier {
            Verifier::Public(key) => UnparsedPublicKey::new(self.method.verification()?, key)
                .verify(input.as_bytes(), &signature)
                .ok()?,
            Verifier::Hmac(key) => ring::hmac::verify(key, input.as_bytes(), &signature).ok()?,
        }
        let claims: serde_json::Value = serde_json::from_slice(&segment(claims)?).ok()?;
        // jwt-go: a token past its `exp` is invalid (one without is not).
        if let Some(exp) = claims.get("exp") {
            if now as f64 > exp.as_f64()? {
                return None;
            }
        }
        let username = claims.get("username")?.as_str()?.to_string();
        let revision = claims.get("revision")?.as_f64()?;
        (revision >= 0.0).then_some((username, revision as u64))
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A JWS segment: base64url, padding optional (jwt-go pads before decoding).
fn segment(s: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(s.trim_end_matches('=')).ok()
}

/// Go's `time.ParseDuration` for the forms a TTL takes (`5m`, `1h30m`,
/// `300s`, `1.5h`, `500ms`).
fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut rest = s.trim();
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut secs = 0.0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_end..];
        secs += n * scale;
    }
    Duration::try_from_secs_f64(secs).ok()
}

/// The DER blocks of a PEM file, with their labels.
fn pem_blocks(pem: &[u8]) -> Vec<(String, Vec<u8>)> {
    let text = String::from_utf8_lossy(pem);
    let mut blocks = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines().map(str::trim) {
        if let Some(label) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        {
            current = Some((label.to_string(), String::new()));
        } else if line.starts_with("-----END ") {
            if let Some((label, body)) = current.take() {
                if let Ok(der) = STANDARD.decode(body) {
                    blocks.push((label, der));
                }
            }
        } else if let Some((_, body)) = current.as_mut() {
            // Skip PEM headers (`Proc-Type: ...`); encrypted keys fail later.
            if !line.contains(':') {
                body.push_str(line);
            }
        }
    }
    blocks
}

/// id-ecPublicKey, 1.2.840.10045.2.1, as a DER element.
const EC_PUBLIC_KEY_OID: [u8; 9] = [0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];

/// DER of the algorithm OIDs a SubjectPublicKeyInfo names.
const RSA_ENCRYPTION_OID: [u8; 11] = [
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
];
const P256_OID: [u8; 10] = [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const P384_OID: [u8; 7] = [0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];

/// The key bytes ring verifies with — an RSA public key (PKCS#1) or an
/// EC point — from `PUBLIC KEY` (SPKI) or `RSA PUBLIC KEY` PEM; a key of
/// another kind than `method` signs with is refused, as etcd refuses it.
fn public_key(method: Method, pem: &[u8]) -> Result<Vec<u8>, String> {
    let wanted: &[&[u8]] = match method {
        Method::Rs(_) | Method::Ps(_) => &[&RSA_ENCRYPTION_OID],
        Method::Es256 => &[&EC_PUBLIC_KEY_OID, &P256_OID],
        Method::Es384 => &[&EC_PUBLIC_KEY_OID, &P384_OID],
        Method::Hs(_) => &[],
    };
    for (label, der) in pem_blocks(pem) {
        // A certificate stands for the key it certifies, as in etcd
        // (jwt-go parses either).
        let spki_der = match label.as_str() {
            "RSA PUBLIC KEY" if matches!(method, Method::Rs(_) | Method::Ps(_)) => return Ok(der),
            "PUBLIC KEY" => Some(der.as_slice()),
            "CERTIFICATE" => Some(
                certificate_spki(&der)
                    .ok_or_else(|| "pub-key: not a DER X.509 certificate".to_string())?,
            ),
            _ => None,
        };
        if let Some(spki_der) = spki_der {
            let (algorithm, key) = spki(spki_der)
                .ok_or_else(|| "pub-key: not a DER SubjectPublicKeyInfo".to_string())?;
            if !wanted.iter().all(|oid| contains(algorithm, oid)) {
                return Err(format!(
                    "pub-key is not a key for sign-method {}",
                    method.name()
                ));
            }
            return Ok(key.to_vec());
        }
    }
    Err(format!(
        "pub-key: no public key PEM block for {}",
        method.name()
    ))
}

/// (algorithm identifier contents, key bytes) of a SubjectPublicKeyInfo.
fn spki(der: &[u8]) -> Option<(&[u8], &[u8])> {
    let (SEQUENCE, spki, _) = tlv(der)? else {
        return None;
    };
    let (SEQUENCE, algorithm, rest) = tlv(spki)? else {
        return None;
    };
    let (BIT_STRING, bits, _) = tlv(rest)? else {
        return None;
    };
    let (&0, key) = bits.split_first()? else {
        return None;
    };
    Some((algorithm, key))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn private_key(method: Method, pem: &[u8], rng: &SystemRandom) -> Result<Signer, String> {
    let rejected = |e: ring::error::KeyRejected| format!("priv-key: {e}");
    for (label, der) in pem_blocks(pem) {
        match (method, label.as_str()) {
            (Method::Rs(_) | Method::Ps(_), "RSA PRIVATE KEY") => {
                return RsaKeyPair::from_der(&der)
                    .map(Signer::Rsa)
                    .map_err(rejected)
            }
            (Method::Rs(_) | Method::Ps(_), "PRIVATE KEY") => {
                return RsaKeyPair::from_pkcs8(&der)
                    .map(Signer::Rsa)
                    .map_err(rejected)
            }
            (Method::Es256 | Method::Es384, "PRIVATE KEY" | "EC PRIVATE KEY") => {
                let alg = if method == Method::Es256 {
                    &signature::ECDSA_P256_SHA256_FIXED_SIGNING
                } else {
                    &signature::ECDSA_P384_SHA384_FIXED_SIGNING
                };
                let pkcs8 = if label == "EC PRIVATE KEY" {
                    sec1_to_pkcs8(&der).ok_or("priv-key: not a DER SEC1 EC private key")?
                } else {
                    der
                };
                return EcdsaKeyPair::from_pkcs8(alg, &pkcs8, rng)
                    .map(Signer::Ecdsa)
                    .map_err(rejected);
            }
            _ => {}
        }
    }
    Err(format!(
        "priv-key: no private key PEM block for {}",
        method.name()
    ))
}

/// Wraps a SEC1 `ECPrivateKey` (OpenSSL's `EC PRIVATE KEY`) in PKCS#8,
/// the form ring reads, taking the curve from its parameters.
fn sec1_to_pkcs8(sec1: &[u8]) -> Option<Vec<u8>> {
    let (SEQUENCE, fields, _) = tlv(sec1)? else {
        return None;
    };
    // version, privateKey, then [0] parameters (the curve's OID).
    let (_, _, rest) = tlv(fields)?;
    let (_, _, mut rest) = tlv(rest)?;
    let curve = loop {
        let (tag, contents, next) = tlv(rest)?;
        if tag == 0xa0 {
            break contents;
        }
        rest = next;
    };
    let mut algorithm = EC_PUBLIC_KEY_OID.to_vec();
    algorithm.extend_from_slice(curve);
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend_from_slice(&der(SEQUENCE, &algorithm));
    body.extend_from_slice(&der(OCTET_STRING, sec1));
    Some(der(SEQUENCE, &body))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn fixture(name: &str) -> String {
        format!("{}/tests/fixtures/jwt/{name}", env!("CARGO_MANIFEST_DIR"))
    }

    fn tokens(option: &str) -> Arc<JwtTokens> {
        match TokenKind::from_option(option).unwrap() {
            TokenKind::Jwt(t) => t,
            TokenKind::Simple => panic!("not jwt: {option}"),
        }
    }

    #[test]
    fn signs_and_verifies_with_every_key_kind() {
        let rsa = format!(
            "jwt,pub-key={},priv-key={},sign-method=RS256,ttl=10m",
            fixture("rsa.pub"),
            fixture("rsa.key")
        );
        let pss = format!(
            "jwt,pub-key={},priv-key={},sign-method=PS384",
            fixture("rsa.pub"),
            fixture("rsa-pkcs8.key")
        );
        let ec = format!(
            "jwt,pub-key={},priv-key={},sign-method=ES256",
            fixture("ec.pub"),
            fixture("ec.key")
        );
        let hmac = format!("jwt,priv-key={},sign-method=HS256", fixture("rsa.key"));
        // etcd's own e2e setup: the server certificate as pub-key.
        let rsa_cert = format!(
            "jwt,pub-key={},priv-key={},sign-method=RS256",
            fixture("rsa.crt"),
            fixture("rsa.key")
        );
        let ec_cert = format!(
            "jwt,pub-key={},priv-key={},sign-method=ES256",
            fixture("ec.crt"),
            fixture("ec.key")
        );
        for option in [rsa, pss, ec, hmac, rsa_cert, ec_cert] {
            let t = tokens(&option);
            let token = t.sign_at("alice", 7, 1000).unwrap();
            assert_eq!(token.split('.').count(), 3, "{option}");
            assert_eq!(
                t.verify_at(&token, 1000),
                Some(("alice".to_string(), 7)),
                "{option}"
            );
            // Expired after its TTL; any changed byte is refused.
            assert_eq!(t.verify_at(&token, 1000 + t.ttl.as_secs() + 1), None);
            let mut forged = token.clone().into_bytes();
            let mid = token.find('.').unwrap() + 2;
            forged[mid] = if forged[mid] == b'A' { b'B' } else { b'A' };
            assert_eq!(t.verify_at(&String::from_utf8(forged).unwrap(), 1000), None);
        }
    }

    #[test]
    fn the_token_is_a_jws_as_jwt_go_writes_it() {
        let t = tokens(&format!(
            "jwt,pub-key={},priv-key={},sign-method=RS256,ttl=5m",
            fixture("rsa.pub"),
            fixture("rsa.key")
        ));
        let token = t.sign_at("root", 3, 1_700_000_000).unwrap();
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(
            segment(parts[0]).unwrap(),
            br#"{"alg":"RS256","typ":"JWT"}"#
        );
        assert_eq!(
            segment(parts[1]).unwrap(),
            br#"{"exp":1700000300,"revision":3,"username":"root"}"#
        );
        // Another method's token is not this member's.
        let ec = tokens(&format!(
            "jwt,pub-key={},priv-key={},sign-method=ES256",
            fixture("ec.pub"),
            fixture("ec.key")
        ));
        assert_eq!(ec.verify_at(&token, 1_700_000_000), None);
    }

    #[test]
    fn options_are_checked_at_start() {
        assert!(matches!(
            TokenKind::from_option("simple"),
            Ok(TokenKind::Simple)
        ));
        let verify_only = tokens(&format!(
            "jwt,pub-key={},sign-method=RS256",
            fixture("rsa.pub")
        ));
        assert_eq!(verify_only.sign("x", 1), Err(SignError::VerifyOnly));
        for (option, why) in [
            ("nope", "unknown token type"),
            ("jwt,sign-method=RS256", "pub-key or priv-key is required"),
            ("jwt,sign-method=HS256", "non-empty priv-key"),
            (
                "jwt,priv-key=/dev/null,sign-method=HS256",
                "non-empty priv-key",
            ),
            (
                "jwt,pub-key=/nonexistent,sign-method=RS256",
                "pub-key /nonexistent",
            ),
            ("jwt,sign-method=XX1", "sign-method"),
            ("jwt,sign-method=RS256,bogus=1", "unknown JWT option"),
            ("jwt,sign-method", "invalid token option"),
            ("jwt,ttl=1m,ttl=2m", "given twice"),
        ] {
            let err = TokenKind::from_option(option).unwrap_err();
            assert!(err.contains(why), "{option}: {err}");
        }
        let mismatched = format!(
            "jwt,pub-key={},priv-key={},sign-method=ES256",
            fixture("ec.pub"),
            fixture("ec-other.key")
        );
        assert!(TokenKind::from_option(&mismatched)
            .unwrap_err()
            .contains("not one key pair"));
        // A public key of another kind than the sign-method's.
        let wrong_kind = format!("jwt,pub-key={},sign-method=RS256", fixture("ec.pub"));
        assert!(TokenKind::from_option(&wrong_kind)
            .unwrap_err()
            .contains("not a key for sign-method RS256"));
        // The private key alone is enough: its public half checks.
        for (key, method) in [("rsa.key", "RS512"), ("ec.key", "ES256")] {
            let t = tokens(&format!(
                "jwt,priv-key={},sign-method={method}",
                fixture(key)
            ));
            let token = t.sign_at("bob", 2, 10).unwrap();
            assert_eq!(t.verify_at(&token, 10), Some(("bob".to_string(), 2)));
        }
        assert_eq!(parse_go_duration("99999999999999999999h"), None);
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("300s"), Some(Duration::from_secs(300)));
        assert_eq!(parse_go_duration("5x"), None);
    }
}
