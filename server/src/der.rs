//! DER, as much as metcd reads of it: tag-length-value elements, and the
//! two fields of an X.509 certificate it needs (the public key, for JWT
//! `pub-key` certificates; the subject's common name, the user of a client
//! certificate). Never trusted for anything the TLS layer has not
//! verified; every read is bounds-checked and answers `None` on bad input.

pub(crate) const SEQUENCE: u8 = 0x30;
pub(crate) const BIT_STRING: u8 = 0x03;
pub(crate) const OCTET_STRING: u8 = 0x04;

/// `CommonName` (2.5.4.3) as a DER OID.
const COMMON_NAME_OID: [u8; 5] = [0x06, 0x03, 0x55, 0x04, 0x03];

/// One DER element at the start of `der`: (tag, contents, what follows).
pub(crate) fn tlv(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        rest = &rest[n..];
        len
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// A DER element with `tag` around `contents`.
pub(crate) fn der(tag: u8, contents: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = contents.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(contents);
    out
}

/// The SubjectPublicKeyInfo element (header included) of an X.509
/// certificate: `Certificate ::= SEQUENCE { tbsCertificate SEQUENCE {
/// [0] version OPTIONAL, serialNumber, signature, issuer, validity,
/// subject, subjectPublicKeyInfo, ... }, ... }`.
pub(crate) fn certificate_spki(der: &[u8]) -> Option<&[u8]> {
    let (SEQUENCE, certificate, _) = tlv(der)? else {
        return None;
    };
    let (SEQUENCE, mut tbs, _) = tlv(certificate)? else {
        return None;
    };
    const VERSION: u8 = 0xa0;
    if tbs.first() == Some(&VERSION) {
        tbs = tlv(tbs)?.2;
    }
    // serialNumber, signature, issuer, validity, subject.
    for _ in 0..5 {
        tbs = tlv(tbs)?.2;
    }
    let (SEQUENCE, _, rest) = tlv(tbs)? else {
        return None;
    };
    Some(&tbs[..tbs.len() - rest.len()])
}

/// The subject's common name of an X.509 certificate, as Go reads it
/// (`Subject.CommonName`: the last CN attribute; UTF8String,
/// PrintableString, IA5String or T61String). `None` when there is none.
pub(crate) fn certificate_common_name(der: &[u8]) -> Option<String> {
    let (SEQUENCE, certificate, _) = tlv(der)? else {
        return None;
    };
    let (SEQUENCE, mut tbs, _) = tlv(certificate)? else {
        return None;
    };
    const VERSION: u8 = 0xa0;
    if tbs.first() == Some(&VERSION) {
        tbs = tlv(tbs)?.2;
    }
    // serialNumber, signature, issuer, validity.
    for _ in 0..4 {
        tbs = tlv(tbs)?.2;
    }
    let (SEQUENCE, mut rdns, _) = tlv(tbs)? else {
        return None;
    };
    const SET: u8 = 0x31;
    let mut common_name = None;
    while !rdns.is_empty() {
        let (SET, mut attributes, rest) = tlv(rdns)? else {
            return None;
        };
        rdns = rest;
        while !attributes.is_empty() {
            let (SEQUENCE, attribute, rest) = tlv(attributes)? else {
                return None;
            };
            attributes = rest;
            let Some(value) = attribute.strip_prefix(&COMMON_NAME_OID[..]) else {
                continue;
            };
            let (tag, text, _) = tlv(value)?;
            const UTF8: u8 = 0x0c;
            const PRINTABLE: u8 = 0x13;
            const T61: u8 = 0x14;
            const IA5: u8 = 0x16;
            if matches!(tag, UTF8 | PRINTABLE | T61 | IA5) {
                common_name = Some(String::from_utf8_lossy(text).into_owned());
            }
        }
    }
    common_name
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn fixture_der(name: &str) -> Vec<u8> {
        use base64::Engine;
        let path = format!("{}/tests/fixtures/jwt/{name}", env!("CARGO_MANIFEST_DIR"));
        let pem = std::fs::read_to_string(path).unwrap();
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap()
    }

    #[test]
    fn reads_the_subject_common_name() {
        // `openssl req ... -subj /CN=jwt-test`.
        assert_eq!(
            certificate_common_name(&fixture_der("rsa.crt")).as_deref(),
            Some("jwt-test")
        );
        assert_eq!(
            certificate_common_name(&fixture_der("ec.crt")).as_deref(),
            Some("jwt-test")
        );
        assert!(certificate_spki(&fixture_der("ec.crt")).is_some());
    }

    #[test]
    fn damaged_certificates_give_none() {
        let der = fixture_der("rsa.crt");
        for cut in [0, 1, 10, 100, der.len() / 2, der.len() - 1] {
            // A truncated outer length: nothing read past the end.
            let _ = certificate_common_name(&der[..cut]);
            let _ = certificate_spki(&der[..cut]);
        }
        assert_eq!(certificate_common_name(b"\x30\x00"), None);
    }
}
