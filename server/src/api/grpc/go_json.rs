//! The words etcd's JSON gateway uses for a request body it cannot decode.
//!
//! etcd 3.4's gateway (grpc-gateway v1) reads a body with Go's
//! `encoding/json` decoder and golang/protobuf's `jsonpb`; clients and
//! scripts see their error strings verbatim (`invalid character 'o' in
//! literal null (expecting 'u')`, `unexpected EOF`, `illegal base64 data at
//! input byte 0`, `json: cannot unmarshal number into Go value of type
//! []uint8`). serde says the same things differently, so when serde refuses
//! a body this module finds the first problem Go would have reported and
//! words it as Go does.
//!
//! Covered: every syntax error of Go's scanner (a port of its state
//! machine and messages), a top-level value that is not an object, and the
//! etcd request fields by name: bytes (`key`, `range_end`, `value`: strict
//! standard base64), 64-bit integers (a number or a quoted number) and
//! booleans. Anything else keeps serde's message.
//!
//! Also refuses what serde would take and Go does not (unpadded or URL-safe
//! base64 in a bytes field), so a body means the same to both gateways.
//!
//! Must never: refuse what etcd's gateway accepts (fields it does not know
//! by name are left to serde).

use serde_json::Value;

/// Fields of etcd's request messages that are `bytes`.
const BYTES_FIELDS: &[&str] = &["key", "range_end", "value"];
/// Fields that are 64-bit integers (jsonpb takes a number or a quoted one).
const INT_FIELDS: &[&str] = &[
    "lease",
    "limit",
    "revision",
    "min_mod_revision",
    "max_mod_revision",
    "min_create_revision",
    "max_create_revision",
    "ID",
    "TTL",
    "start_revision",
    "watch_id",
    "create_revision",
    "mod_revision",
    "version",
    "memberID",
    "targetID",
];
/// Fields that are booleans.
const BOOL_FIELDS: &[&str] = &[
    "prev_kv",
    "ignore_value",
    "ignore_lease",
    "serializable",
    "keys_only",
    "count_only",
    "physical",
    "progress_notify",
    "fragment",
    "keys",
    "isLearner",
];

/// Enum fields and their Go type names, with the names jsonpb accepts.
const ENUM_FIELDS: &[(&str, &str, &[&str])] = &[
    (
        "sort_order",
        "etcdserverpb.RangeRequest_SortOrder",
        &["NONE", "ASCEND", "DESCEND"],
    ),
    (
        "sort_target",
        "etcdserverpb.RangeRequest_SortTarget",
        &["KEY", "VERSION", "CREATE", "MOD", "VALUE"],
    ),
    (
        "result",
        "etcdserverpb.Compare_CompareResult",
        &["EQUAL", "GREATER", "LESS", "NOT_EQUAL"],
    ),
    (
        "target",
        "etcdserverpb.Compare_CompareTarget",
        &["VERSION", "CREATE", "MOD", "VALUE", "LEASE"],
    ),
    (
        "permType",
        "authpb.Permission_Type",
        &["READ", "WRITE", "READWRITE"],
    ),
    (
        "action",
        "etcdserverpb.AlarmRequest_AlarmAction",
        &["GET", "ACTIVATE", "DEACTIVATE"],
    ),
    (
        "alarm",
        "etcdserverpb.AlarmType",
        &["NONE", "NOSPACE", "CORRUPT"],
    ),
];
/// Repeated message fields.
const MESSAGE_LIST_FIELDS: &[&str] = &["compare", "success", "failure"];
/// Message fields.
const MESSAGE_FIELDS: &[&str] = &[
    "request_range",
    "request_put",
    "request_delete_range",
    "request_txn",
    "create_request",
    "cancel_request",
    "progress_request",
    "perm",
    "options",
];
const MESSAGE_GO_TYPE: &str = "map[string]json.RawMessage";

/// Go's message for why `body` does not decode, or `None` when this
/// module cannot tell (the caller keeps serde's).
pub fn explain(body: &[u8]) -> Option<String> {
    if let Err(e) = scan(body) {
        return Some(e);
    }
    let end = value_end(body)?;
    let value: Value = serde_json::from_slice(&body[..end]).ok()?;
    match &value {
        Value::Object(_) => first_field_error(&value),
        Value::Null => None,
        other => Some(cannot_unmarshal(kind_of(other), MESSAGE_GO_TYPE)),
    }
}

/// A message field's value: an object (or null) whose fields are checked.
fn message_error(v: &Value) -> Option<String> {
    match v {
        Value::Object(_) => first_field_error(v),
        Value::Null => None,
        other => Some(cannot_unmarshal(kind_of(other), MESSAGE_GO_TYPE)),
    }
}

fn enum_error(v: &Value, go_type: &str, names: &[&str]) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) if names.contains(&s.as_str()) => None,
        Value::String(s) => Some(format!("unknown value {s:?} for enum {go_type}")),
        Value::Number(n) if n.is_i64() => None,
        Value::Number(n) => Some(cannot_unmarshal(&format!("number {n}"), go_type)),
        other => Some(cannot_unmarshal(kind_of(other), go_type)),
    }
}

fn cannot_unmarshal(kind: &str, go_type: &str) -> String {
    format!("json: cannot unmarshal {kind} into Go value of type {go_type}")
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The first typed field (in document order, depth first) Go would refuse.
fn first_field_error(v: &Value) -> Option<String> {
    match v {
        Value::Object(fields) => fields.iter().find_map(|(name, value)| {
            let name = name.as_str();
            if let Some((_, go_type, names)) = ENUM_FIELDS.iter().find(|(n, ..)| *n == name) {
                enum_error(value, go_type, names)
            } else if MESSAGE_LIST_FIELDS.contains(&name) {
                match value {
                    Value::Array(items) => items.iter().find_map(message_error),
                    Value::Null => None,
                    other => Some(cannot_unmarshal(kind_of(other), "[]json.RawMessage")),
                }
            } else if MESSAGE_FIELDS.contains(&name) {
                message_error(value)
            } else if BYTES_FIELDS.contains(&name) {
                bytes_error(value)
            } else if INT_FIELDS.contains(&name) {
                int_error(value)
            } else if BOOL_FIELDS.contains(&name) {
                match value {
                    Value::Bool(_) | Value::Null => None,
                    other => Some(cannot_unmarshal(kind_of(other), "bool")),
                }
            } else {
                first_field_error(value)
            }
        }),
        Value::Array(items) => items.iter().find_map(first_field_error),
        _ => None,
    }
}

fn bytes_error(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => {
            base64_error(s.as_bytes()).map(|at| format!("illegal base64 data at input byte {at}"))
        }
        Value::Null => None,
        // Go decodes an array into a byte slice element by element; leave
        // that corner to serde.
        Value::Array(_) => None,
        other => Some(cannot_unmarshal(kind_of(other), "[]uint8")),
    }
}

/// jsonpb drops the quotes of a quoted integer and hands what is inside
/// to `json.Unmarshal`.
fn int_error(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => {
            scan_whole(s.as_bytes())
                .err()
                .or_else(|| match serde_json::from_str::<Value>(s) {
                    Ok(inner) => int_error_unquoted(&inner),
                    Err(_) => None,
                })
        }
        other => int_error_unquoted(other),
    }
}

fn int_error_unquoted(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        // Member IDs are uint64: both widths pass here.
        Value::Number(n) if n.is_i64() || n.is_u64() => None,
        Value::Number(n) => Some(cannot_unmarshal(&format!("number {n}"), "int64")),
        other => Some(cannot_unmarshal(kind_of(other), "int64")),
    }
}

/// Where Go's strict standard base64 decoder stops (`CorruptInputError`):
/// `None` when `s` decodes.
fn base64_error(s: &[u8]) -> Option<usize> {
    fn value(c: u8) -> Option<u8> {
        match c {
            b'A'..=b'Z' => Some(c - b'A'),
            b'a'..=b'z' => Some(c - b'a' + 26),
            b'0'..=b'9' => Some(c - b'0' + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    // Go skips '\r' and '\n' anywhere in the input.
    let is_newline = |c: u8| c == b'\r' || c == b'\n';
    let mut si = 0;
    while si < s.len() {
        // One quantum of four symbols.
        let mut j = 0;
        while j < 4 {
            while si < s.len() && is_newline(s[si]) {
                si += 1;
            }
            if si == s.len() {
                return match j {
                    0 => None,
                    // Padding is required: a short last quantum is corrupt.
                    _ => Some(si - j),
                };
            }
            let c = s[si];
            si += 1;
            if value(c).is_some() {
                j += 1;
                continue;
            }
            if c != b'=' {
                return Some(si - 1);
            }
            // Padding: only as the third or fourth symbol.
            match j {
                0 | 1 => return Some(si - 1),
                2 => {
                    // "==" expected: skip newlines, then the second '='.
                    while si < s.len() && is_newline(s[si]) {
                        si += 1;
                    }
                    if si == s.len() {
                        return Some(s.len());
                    }
                    if s[si] != b'=' {
                        return Some(si - 1);
                    }
                    si += 1;
                }
                _ => {}
            }
            while si < s.len() && is_newline(s[si]) {
                si += 1;
            }
            if si < s.len() {
                // Trailing garbage after the padding.
                return Some(si);
            }
            // Non-zero trailing bits are accepted (StdEncoding is not
            // Strict): done.
            return None;
        }
    }
    None
}

/// The end of the first JSON value in `body` (Go's decoder reads one value
/// and ignores what follows).
fn value_end(body: &[u8]) -> Option<usize> {
    let mut de = serde_json::Deserializer::from_slice(body).into_iter::<serde::de::IgnoredAny>();
    de.next()?.ok()?;
    Some(de.byte_offset())
}

/// `json.Unmarshal`'s validity check: exactly one value, nothing but
/// spaces after it.
fn scan_whole(body: &[u8]) -> Result<(), String> {
    let mut s = Scanner::default();
    for (i, &c) in body.iter().enumerate() {
        if let Step::End = s.step(c)? {
            // A number ends at the byte after it, which is then still to
            // be read as trailing input.
            let rest = if s.ended_by_delimiter {
                &body[i..]
            } else {
                &body[i + 1..]
            };
            return match rest.iter().find(|c| !is_space(**c)) {
                Some(&c) => Err(invalid(c, "after top-level value")),
                None => Ok(()),
            };
        }
    }
    if s.in_value() || !s.started {
        return Err("unexpected end of JSON input".into());
    }
    Ok(())
}

/// Go's scanner over the first value of `body`: `Err` with Go's message at
/// the first syntax error, or `unexpected EOF` when the body ends inside
/// the value.
fn scan(body: &[u8]) -> Result<(), String> {
    let mut s = Scanner::default();
    for &c in body {
        match s.step(c)? {
            Step::Continue => {}
            Step::End => return Ok(()),
        }
    }
    if s.in_value() {
        return Err("unexpected EOF".into());
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parse {
    ObjectKey,
    ObjectValue,
    ArrayValue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    BeginValue,
    BeginValueOrEmpty,
    BeginStringOrEmpty,
    BeginString,
    EndValue,
    InString,
    InStringEsc,
    InStringEscU(u8),
    Neg,
    Zero,
    One,
    Dot,
    Dot0,
    E,
    ESign,
    E0,
    /// Inside a literal: the rest to expect and its name.
    Literal(&'static [u8], &'static str),
}

#[derive(Debug)]
struct Scanner {
    state: State,
    parse: Vec<Parse>,
    started: bool,
    /// The top-level value was a number, ended by the byte after it.
    ended_by_delimiter: bool,
}

impl Default for Scanner {
    fn default() -> Self {
        Scanner {
            state: State::BeginValue,
            parse: Vec::new(),
            started: false,
            ended_by_delimiter: false,
        }
    }
}

enum Step {
    Continue,
    /// The top-level value ended with this byte (a delimiter after a
    /// number, or the value's own last byte).
    End,
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

/// Go's `quoteChar`.
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => r"'\''".into(),
        b'"' => "'\"'".into(),
        _ => {
            let ch = char::from(c);
            let quoted = match ch {
                '\x07' => r"\a".to_string(),
                '\x08' => r"\b".to_string(),
                '\x0c' => r"\f".to_string(),
                '\n' => r"\n".to_string(),
                '\r' => r"\r".to_string(),
                '\t' => r"\t".to_string(),
                '\x0b' => r"\v".to_string(),
                '\\' => r"\\".to_string(),
                c if c.is_control() => {
                    if (c as u32) < 0x80 {
                        format!(r"\x{:02x}", c as u32)
                    } else {
                        format!(r"\u{:04x}", c as u32)
                    }
                }
                c => c.to_string(),
            };
            format!("'{quoted}'")
        }
    }
}

fn invalid(c: u8, context: &str) -> String {
    format!("invalid character {} {context}", quote_char(c))
}

impl Scanner {
    /// Whether input ending here leaves a value unfinished (a top-level
    /// number is finished by the end of input).
    fn in_value(&self) -> bool {
        use State::*;
        let finished_number = self.parse.is_empty() && matches!(self.state, Zero | One | Dot0 | E0);
        self.started && !finished_number
    }

    /// After a complete value: where the scanner goes next.
    fn end_value(&mut self) -> Step {
        match self.parse.last() {
            None => Step::End,
            Some(_) => {
                self.state = State::EndValue;
                Step::Continue
            }
        }
    }

    fn step(&mut self, c: u8) -> Result<Step, String> {
        use State::*;
        match self.state {
            BeginValueOrEmpty | BeginValue => {
                if is_space(c) {
                    return Ok(Step::Continue);
                }
                if self.state == BeginValueOrEmpty && c == b']' {
                    return self.end_container(c);
                }
                self.started = true;
                self.state = match c {
                    b'{' => {
                        self.parse.push(Parse::ObjectKey);
                        BeginStringOrEmpty
                    }
                    b'[' => {
                        self.parse.push(Parse::ArrayValue);
                        BeginValueOrEmpty
                    }
                    b'"' => InString,
                    b'-' => Neg,
                    b'0' => Zero,
                    b'1'..=b'9' => One,
                    b't' => Literal(b"rue", "true"),
                    b'f' => Literal(b"alse", "false"),
                    b'n' => Literal(b"ull", "null"),
                    _ => return Err(invalid(c, "looking for beginning of value")),
                };
                Ok(Step::Continue)
            }
            BeginStringOrEmpty | BeginString => {
                if is_space(c) {
                    return Ok(Step::Continue);
                }
                if self.state == BeginStringOrEmpty && c == b'}' {
                    return self.end_container(c);
                }
                if c == b'"' {
                    self.state = InString;
                    return Ok(Step::Continue);
                }
                Err(invalid(c, "looking for beginning of object key string"))
            }
            EndValue => self.after_value(c),
            InString => {
                match c {
                    b'"' => return Ok(self.end_value()),
                    b'\\' => self.state = InStringEsc,
                    c if c < 0x20 => return Err(invalid(c, "in string literal")),
                    _ => {}
                }
                Ok(Step::Continue)
            }
            InStringEsc => {
                self.state = match c {
                    b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => InString,
                    b'u' => InStringEscU(0),
                    _ => return Err(invalid(c, "in string escape code")),
                };
                Ok(Step::Continue)
            }
            InStringEscU(n) => {
                if !c.is_ascii_hexdigit() {
                    return Err(invalid(c, "in \\u hexadecimal character escape"));
                }
                self.state = if n == 3 {
                    InString
                } else {
                    InStringEscU(n + 1)
                };
                Ok(Step::Continue)
            }
            Neg => {
                self.state = match c {
                    b'0' => Zero,
                    b'1'..=b'9' => One,
                    _ => return Err(invalid(c, "in numeric literal")),
                };
                Ok(Step::Continue)
            }
            One if c.is_ascii_digit() => Ok(Step::Continue),
            Zero | One => match c {
                b'.' => {
                    self.state = Dot;
                    Ok(Step::Continue)
                }
                b'e' | b'E' => {
                    self.state = E;
                    Ok(Step::Continue)
                }
                _ => self.number_ended(c),
            },
            Dot => {
                if !c.is_ascii_digit() {
                    return Err(invalid(c, "after decimal point in numeric literal"));
                }
                self.state = Dot0;
                Ok(Step::Continue)
            }
            Dot0 => match c {
                b'0'..=b'9' => Ok(Step::Continue),
                b'e' | b'E' => {
                    self.state = E;
                    Ok(Step::Continue)
                }
                _ => self.number_ended(c),
            },
            E => {
                self.state = match c {
                    b'+' | b'-' => ESign,
                    b'0'..=b'9' => E0,
                    _ => return Err(invalid(c, "in exponent of numeric literal")),
                };
                Ok(Step::Continue)
            }
            ESign => {
                if !c.is_ascii_digit() {
                    return Err(invalid(c, "in exponent of numeric literal"));
                }
                self.state = E0;
                Ok(Step::Continue)
            }
            E0 => {
                if c.is_ascii_digit() {
                    return Ok(Step::Continue);
                }
                self.number_ended(c)
            }
            Literal(rest, name) => {
                let Some((&want, more)) = rest.split_first() else {
                    return Ok(self.end_value());
                };
                if c != want {
                    return Err(invalid(
                        c,
                        &format!("in literal {name} (expecting {})", quote_char(want)),
                    ));
                }
                if more.is_empty() {
                    return Ok(self.end_value());
                }
                self.state = Literal(more, name);
                Ok(Step::Continue)
            }
        }
    }

    /// A number ends at the first byte that cannot continue it; that byte
    /// is then read as what follows the value.
    fn number_ended(&mut self, c: u8) -> Result<Step, String> {
        match self.end_value() {
            Step::End => {
                self.ended_by_delimiter = true;
                Ok(Step::End)
            }
            Step::Continue => self.after_value(c),
        }
    }

    fn after_value(&mut self, c: u8) -> Result<Step, String> {
        if is_space(c) {
            return Ok(Step::Continue);
        }
        match self.parse.last().copied() {
            Some(Parse::ObjectKey) => {
                if c == b':' {
                    if let Some(top) = self.parse.last_mut() {
                        *top = Parse::ObjectValue;
                    }
                    self.state = State::BeginValue;
                    return Ok(Step::Continue);
                }
                Err(invalid(c, "after object key"))
            }
            Some(Parse::ObjectValue) => match c {
                b',' => {
                    if let Some(top) = self.parse.last_mut() {
                        *top = Parse::ObjectKey;
                    }
                    self.state = State::BeginString;
                    Ok(Step::Continue)
                }
                b'}' => self.end_container(c),
                _ => Err(invalid(c, "after object key:value pair")),
            },
            Some(Parse::ArrayValue) => match c {
                b',' => {
                    self.state = State::BeginValue;
                    Ok(Step::Continue)
                }
                b']' => self.end_container(c),
                _ => Err(invalid(c, "after array element")),
            },
            None => Ok(Step::End),
        }
    }

    fn end_container(&mut self, _c: u8) -> Result<Step, String> {
        self.parse.pop();
        Ok(self.end_value())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Each body and the message etcd 3.4.23's gateway answered for it on
    /// `/v3/kv/put` (captured with curl against a real etcd).
    #[test]
    fn explains_bodies_as_etcds_gateway_does() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                "notjson",
                Some("invalid character 'o' in literal null (expecting 'u')"),
            ),
            (r#"{"key":"#, Some("unexpected EOF")),
            (
                r#"{"key":"zz"}"#,
                Some("illegal base64 data at input byte 0"),
            ),
            (
                r#"{"key":123}"#,
                Some("json: cannot unmarshal number into Go value of type []uint8"),
            ),
            (
                r#"{"key":"Zm9v","value":"YmFy","lease":"abc"}"#,
                Some("invalid character 'a' looking for beginning of value"),
            ),
            (
                "[]",
                Some(
                    "json: cannot unmarshal array into Go value of type map[string]json.RawMessage",
                ),
            ),
            (
                r#"{"key":"Zm9v","value":"YmFy","prev_kv":"yes"}"#,
                Some("json: cannot unmarshal string into Go value of type bool"),
            ),
            (r#"{"key":"Zm9v","bogus":1}"#, None),
            (
                r#"{"key":"Zm9vYg"}"#,
                Some("illegal base64 data at input byte 4"),
            ),
            (
                r#"{"key":"Zm9v","sort_order":"BAD"}"#,
                Some(r#"unknown value "BAD" for enum etcdserverpb.RangeRequest_SortOrder"#),
            ),
            (
                r#"{"compare":{}}"#,
                Some("json: cannot unmarshal object into Go value of type []json.RawMessage"),
            ),
            (
                r#"{"compare":[1]}"#,
                Some("json: cannot unmarshal number into Go value of type map[string]json.RawMessage"),
            ),
            (
                r#"{"success":[{"request_put":{"key":1}}]}"#,
                Some("json: cannot unmarshal number into Go value of type []uint8"),
            ),
            (r#"{"ID":"12345678901234567890"}"#, None),
            (r#"{"key":"Zm9v","sort_order":"DESCEND","limit":"5"}"#, None),
            (r#"{"key":"Zm9v"} trailing"#, None),
        ];
        for (body, want) in cases {
            assert_eq!(explain(body.as_bytes()).as_deref(), *want, "body {body}");
        }
    }

    #[test]
    fn syntax_errors_use_gos_contexts() {
        let err = |b: &str| scan(b.as_bytes()).err();
        assert_eq!(
            err(r#"{"a" 1}"#).as_deref(),
            Some("invalid character '1' after object key")
        );
        assert_eq!(
            err(r#"{"a":1 "b":2}"#).as_deref(),
            Some("invalid character '\"' after object key:value pair")
        );
        assert_eq!(
            err("[1 2]").as_deref(),
            Some("invalid character '2' after array element")
        );
        assert_eq!(
            err("{1:2}").as_deref(),
            Some("invalid character '1' looking for beginning of object key string")
        );
        assert_eq!(
            err("\"a\u{1}\"").as_deref(),
            Some("invalid character '\\x01' in string literal")
        );
        assert_eq!(
            err(r#""\q""#).as_deref(),
            Some("invalid character 'q' in string escape code")
        );
        assert_eq!(
            err("-x").as_deref(),
            Some("invalid character 'x' in numeric literal")
        );
        assert_eq!(
            err("1.x").as_deref(),
            Some("invalid character 'x' after decimal point in numeric literal")
        );
        assert_eq!(
            err("tru").as_deref(),
            Some("unexpected EOF"),
            "a literal cut short"
        );
        assert_eq!(
            err("trux").as_deref(),
            Some("invalid character 'x' in literal true (expecting 'e')")
        );
        assert_eq!(err("  {\"a\":[1,{\"b\":null}]}  x"), None);
        assert_eq!(err("12 "), None);
        assert_eq!(err("{}"), None);
        assert_eq!(err("[]"), None);
    }

    #[test]
    fn base64_is_strict_standard_with_padding() {
        assert_eq!(base64_error(b"Zm9v"), None);
        assert_eq!(base64_error(b"Zm8="), None);
        assert_eq!(base64_error(b"Zg=="), None);
        assert_eq!(base64_error(b""), None);
        assert_eq!(base64_error(b"zz"), Some(0));
        assert_eq!(base64_error(b"Zm9vYg"), Some(4));
        assert_eq!(base64_error(b"Zm9-"), Some(3), "URL-safe alphabet");
        assert_eq!(base64_error(b"Zg=a"), Some(2));
        assert_eq!(base64_error(b"Zg==Zg=="), Some(4));
        assert_eq!(base64_error(b"Z==="), Some(1));
    }
}
