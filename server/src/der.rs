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

/// The fields of an X.509 certificate's TBSCertificate after its optional
/// version: serialNumber, signature, issuer, validity, subject,
/// subjectPublicKeyInfo, ... (each a DER element, in that order).
fn tbs_fields(der: &[u8]) -> Option<&[u8]> {
    let (SEQUENCE, certificate, _) = tlv(der)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = tlv(certificate)? else {
        return None;
    };
    const VERSION: u8 = 0xa0;
    if tbs.first() == Some(&VERSION) {
        return Some(tlv(tbs)?.2);
    }
    Some(tbs)
}

/// The TBSCertificate's fields from the `n`-th on (0: serialNumber).
fn tbs_field(der: &[u8], n: usize) -> Option<&[u8]> {
    let mut fields = tbs_fields(der)?;
    for _ in 0..n {
        fields = tlv(fields)?.2;
    }
    Some(fields)
}

/// The SubjectPublicKeyInfo element (header included) of an X.509
/// certificate: `Certificate ::= SEQUENCE { tbsCertificate SEQUENCE {
/// [0] version OPTIONAL, serialNumber, signature, issuer, validity,
/// subject, subjectPublicKeyInfo, ... }, ... }`.
pub(crate) fn certificate_spki(der: &[u8]) -> Option<&[u8]> {
    let tbs = tbs_field(der, 5)?;
    let (SEQUENCE, _, rest) = tlv(tbs)? else {
        return None;
    };
    Some(&tbs[..tbs.len() - rest.len()])
}

/// The subject's common name of an X.509 certificate, as Go reads it
/// (`Subject.CommonName`: the last CN attribute; UTF8String,
/// PrintableString, IA5String or T61String). `None` when there is none.
pub(crate) fn certificate_common_name(der: &[u8]) -> Option<String> {
    let tbs = tbs_field(der, 4)?;
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

/// A certificate's validity (notBefore, notAfter) in Unix seconds.
pub(crate) fn certificate_validity(der: &[u8]) -> Option<(i64, i64)> {
    let tbs = tbs_field(der, 3)?;
    let (SEQUENCE, validity, _) = tlv(tbs)? else {
        return None;
    };
    let (tag, not_before, rest) = tlv(validity)?;
    let not_before = asn1_time(tag, not_before)?;
    let (tag, not_after, _) = tlv(rest)?;
    Some((not_before, asn1_time(tag, not_after)?))
}

/// UTCTime (`YYMMDDHHMMSSZ`, years 1950-2049) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`) in Unix seconds.
fn asn1_time(tag: u8, text: &[u8]) -> Option<i64> {
    const UTC_TIME: u8 = 0x17;
    const GENERALIZED_TIME: u8 = 0x18;
    let text = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
    let (year, rest) = match (tag, text.len()) {
        (UTC_TIME, 12) => {
            let yy: i64 = text[..2].parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
        }
        (GENERALIZED_TIME, 14) => (text[..4].parse().ok()?, &text[4..]),
        _ => return None,
    };
    let field = |i: usize| -> Option<i64> { rest.get(i..i + 2)?.parse().ok() };
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    // Days from 1970-01-01 to the civil date (H. Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second)
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
    fn reads_the_validity() {
        assert_eq!(asn1_time(0x17, b"700101000000Z"), Some(0));
        assert_eq!(asn1_time(0x17, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(asn1_time(0x18, b"20261127233000Z"), Some(1_795_822_200));
        let (from, until) = certificate_validity(&fixture_der("rsa.crt")).unwrap();
        // `-days 36500`, made in 2026.
        assert!(
            from > 1_700_000_000 && until - from == 36_500 * 86_400,
            "{from} {until}"
        );
    }

    #[test]
    fn damaged_certificates_give_none() {
        let der = fixture_der("rsa.crt");
        for cut in [0, 1, 10, 100, der.len() / 2, der.len() - 1] {
            // A truncated outer length: nothing read past the end.
            let _ = certificate_common_name(&der[..cut]);
            let _ = certificate_spki(&der[..cut]);
            let _ = certificate_validity(&der[..cut]);
        }
        assert_eq!(certificate_common_name(b"\x30\x00"), None);
    }
}
