//! The words etcd's JSON gateway uses for a request body it cannot decode.
//!
//! etcd 3.4's gateway (grpc-gateway v1) reads a body with Go's
//! `encoding/json` decoder and golang/protobuf's `jsonpb`; clients and
//! scripts see their error strings verbatim (`invalid character 'o' in
//! literal null (expecting 'u')`, `unexpected EOF`, `illegal base64 data at
//! input byte 0`, `json: cannot unmarshal number into Go value of type
//! []uint8`). serde says the same things differently, so this module finds
//! the first problem Go would report and words it as Go does.
//!
//! Covered: every syntax error of Go's scanner (a port of its state
//! machine and messages), a top-level value that is not an object, and the
//! fields of each routed request message (its schema below, in jsonpb's
//! order: proto field order, oneof members last; proto names and their
//! lowerCamelCase JSON names, the latter winning as in jsonpb): bytes
//! (strict standard base64), 64-bit integers (a number or a quoted
//! number), booleans, strings, enums by name, nested messages. Fields a
//! message does not have are ignored, as jsonpb ignores them. What this
//! module does not judge keeps serde's message.
//!
//! It also refuses what serde would take and Go does not (unpadded or
//! URL-safe base64), so a body means the same to both gateways.
//!
//! Must never: refuse what etcd's gateway accepts.

use serde_json::Value;

/// What a field holds, as jsonpb decodes it.
#[derive(Clone, Copy)]
enum Kind {
    Bytes,
    Int64,
    Uint64,
    Bool,
    Str,
    Strs,
    Enum(&'static str, &'static [&'static str]),
    Message(&'static [Field]),
    Messages(&'static [Field]),
    /// Not judged here (serde decides).
    Unchecked,
}

#[derive(Clone, Copy)]
struct Field {
    name: &'static str,
    kind: Kind,
}

const fn f(name: &'static str, kind: Kind) -> Field {
    Field { name, kind }
}

use Kind::{Bool, Bytes, Enum, Int64, Message, Messages, Str, Strs, Uint64, Unchecked};

const SORT_ORDER: Kind = Enum(
    "etcdserverpb.RangeRequest_SortOrder",
    &["NONE", "ASCEND", "DESCEND"],
);
const SORT_TARGET: Kind = Enum(
    "etcdserverpb.RangeRequest_SortTarget",
    &["KEY", "VERSION", "CREATE", "MOD", "VALUE"],
);

static RANGE: [Field; 13] = [
    f("key", Bytes),
    f("range_end", Bytes),
    f("limit", Int64),
    f("revision", Int64),
    f("sort_order", SORT_ORDER),
    f("sort_target", SORT_TARGET),
    f("serializable", Bool),
    f("keys_only", Bool),
    f("count_only", Bool),
    f("min_mod_revision", Int64),
    f("max_mod_revision", Int64),
    f("min_create_revision", Int64),
    f("max_create_revision", Int64),
];
static PUT: [Field; 6] = [
    f("key", Bytes),
    f("value", Bytes),
    f("lease", Int64),
    f("prev_kv", Bool),
    f("ignore_value", Bool),
    f("ignore_lease", Bool),
];
static DELETE_RANGE: [Field; 3] = [f("key", Bytes), f("range_end", Bytes), f("prev_kv", Bool)];
static COMPARE: [Field; 9] = [
    f(
        "result",
        Enum(
            "etcdserverpb.Compare_CompareResult",
            &["EQUAL", "GREATER", "LESS", "NOT_EQUAL"],
        ),
    ),
    f(
        "target",
        Enum(
            "etcdserverpb.Compare_CompareTarget",
            &["VERSION", "CREATE", "MOD", "VALUE", "LEASE"],
        ),
    ),
    f("key", Bytes),
    f("range_end", Bytes),
    // The target_union oneof.
    f("version", Int64),
    f("create_revision", Int64),
    f("mod_revision", Int64),
    f("value", Bytes),
    f("lease", Int64),
];
static REQUEST_OP: [Field; 4] = [
    f("request_range", Message(&RANGE)),
    f("request_put", Message(&PUT)),
    f("request_delete_range", Message(&DELETE_RANGE)),
    f("request_txn", Message(&TXN)),
];
static TXN: [Field; 3] = [
    f("compare", Messages(&COMPARE)),
    f("success", Messages(&REQUEST_OP)),
    f("failure", Messages(&REQUEST_OP)),
];
static COMPACTION: [Field; 2] = [f("revision", Int64), f("physical", Bool)];
static LEASE_GRANT: [Field; 2] = [f("TTL", Int64), f("ID", Int64)];
static LEASE_ID: [Field; 1] = [f("ID", Int64)];
static LEASE_TIME_TO_LIVE: [Field; 2] = [f("ID", Int64), f("keys", Bool)];
static MEMBER_ADD: [Field; 2] = [f("peerURLs", Strs), f("isLearner", Bool)];
static MEMBER_ID: [Field; 1] = [f("ID", Uint64)];
static MEMBER_UPDATE: [Field; 2] = [f("ID", Uint64), f("peerURLs", Strs)];
static ALARM: [Field; 3] = [
    f(
        "action",
        Enum(
            "etcdserverpb.AlarmRequest_AlarmAction",
            &["GET", "ACTIVATE", "DEACTIVATE"],
        ),
    ),
    f("memberID", Uint64),
    f(
        "alarm",
        Enum("etcdserverpb.AlarmType", &["NONE", "NOSPACE", "CORRUPT"]),
    ),
];
static MOVE_LEADER: [Field; 1] = [f("targetID", Uint64)];
static NAME_PASSWORD: [Field; 2] = [f("name", Str), f("password", Str)];
static USER_ADD_OPTIONS: [Field; 1] = [f("no_password", Bool)];
static USER_ADD: [Field; 3] = [
    f("name", Str),
    f("password", Str),
    f("options", Message(&USER_ADD_OPTIONS)),
];
static NAME: [Field; 1] = [f("name", Str)];
static ROLE: [Field; 1] = [f("role", Str)];
static USER_GRANT: [Field; 2] = [f("user", Str), f("role", Str)];
static USER_REVOKE: [Field; 2] = [f("name", Str), f("role", Str)];
static PERMISSION: [Field; 3] = [
    f(
        "permType",
        Enum("authpb.Permission_Type", &["READ", "WRITE", "READWRITE"]),
    ),
    f("key", Bytes),
    f("range_end", Bytes),
];
static ROLE_GRANT: [Field; 2] = [f("name", Str), f("perm", Message(&PERMISSION))];
/// etcd 3.4 has `key` and `range_end` as strings here, 3.5 as bytes.
static ROLE_REVOKE: [Field; 3] = [
    f("role", Str),
    f("key", Unchecked),
    f("range_end", Unchecked),
];
static WATCH_CREATE: [Field; 8] = [
    f("key", Bytes),
    f("range_end", Bytes),
    f("start_revision", Int64),
    f("progress_notify", Bool),
    f("filters", Unchecked),
    f("prev_kv", Bool),
    f("watch_id", Int64),
    f("fragment", Bool),
];
static WATCH_CANCEL: [Field; 1] = [f("watch_id", Int64)];
static WATCH: [Field; 3] = [
    f("create_request", Message(&WATCH_CREATE)),
    f("cancel_request", Message(&WATCH_CANCEL)),
    f("progress_request", Message(&[])),
];

static LOCK: [Field; 2] = [f("name", Bytes), f("lease", Int64)];
static NAME_BYTES: [Field; 1] = [f("name", Bytes)];
static UNLOCK: [Field; 1] = [f("key", Bytes)];
static CAMPAIGN: [Field; 3] = [f("name", Bytes), f("lease", Int64), f("value", Bytes)];
static LEADER_KEY: [Field; 4] = [
    f("name", Bytes),
    f("key", Bytes),
    f("rev", Int64),
    f("lease", Int64),
];
static PROCLAIM: [Field; 2] = [f("leader", Message(&LEADER_KEY)), f("value", Bytes)];
static RESIGN: [Field; 1] = [f("leader", Message(&LEADER_KEY))];

/// The request message of a gateway route (`kv/put`, ...); `None` for a
/// route this module has no schema for (only syntax is judged then).
fn schema(route: &str) -> Option<&'static [Field]> {
    Some(match route {
        "kv/range" => &RANGE,
        "kv/put" => &PUT,
        "kv/deleterange" => &DELETE_RANGE,
        "kv/txn" => &TXN,
        "kv/compaction" => &COMPACTION,
        "lease/grant" => &LEASE_GRANT,
        "lease/revoke" | "kv/lease/revoke" | "lease/keepalive" => &LEASE_ID,
        "lease/timetolive" | "kv/lease/timetolive" => &LEASE_TIME_TO_LIVE,
        "cluster/member/add" => &MEMBER_ADD,
        "cluster/member/remove" | "cluster/member/promote" => &MEMBER_ID,
        "cluster/member/update" => &MEMBER_UPDATE,
        "maintenance/alarm" => &ALARM,
        "maintenance/transfer-leadership" => &MOVE_LEADER,
        "auth/authenticate" | "auth/user/changepw" => &NAME_PASSWORD,
        "auth/user/add" => &USER_ADD,
        "auth/user/get" | "auth/user/delete" | "auth/role/add" => &NAME,
        "auth/role/get" | "auth/role/delete" => &ROLE,
        "auth/user/grant" => &USER_GRANT,
        "auth/user/revoke" => &USER_REVOKE,
        "auth/role/grant" => &ROLE_GRANT,
        "auth/role/revoke" => &ROLE_REVOKE,
        "watch" => &WATCH,
        "lock/lock" => &LOCK,
        "lock/unlock" => &UNLOCK,
        "election/campaign" => &CAMPAIGN,
        "election/proclaim" => &PROCLAIM,
        "election/resign" => &RESIGN,
        "election/leader" | "election/observe" => &NAME_BYTES,
        // Requests without fields: anything in the object is unknown.
        _ => &[],
    })
}

const MESSAGE_GO_TYPE: &str = "map[string]json.RawMessage";

/// Go's message for why the first JSON value of `body`, a request for
/// gateway `route`, does not decode; `None` when Go would take it (or
/// this module cannot tell: the caller keeps serde's verdict).
pub fn explain(route: &str, body: &[u8]) -> Option<String> {
    if let Err(e) = scan(body) {
        return Some(e);
    }
    let value = first_value(body)?;
    match &value {
        Value::Object(_) => message_error(&value, schema(route)?),
        Value::Null => None,
        other => Some(cannot_unmarshal(kind_of(other), MESSAGE_GO_TYPE)),
    }
}

/// The first JSON value of `body` as jsonpb sees it, when that differs
/// from what serde would decode: a field given under both its proto name
/// and its camelCase name is jsonpb's camelCase one alone (serde would
/// decode, and judge, both). `None`: decode `body` as it is.
pub fn jsonpb_view(route: &str, body: &[u8]) -> Option<Vec<u8>> {
    let fields = schema(route)?;
    let mut value = first_value(body)?;
    if !drop_shadowed(&mut value, fields) {
        return None;
    }
    serde_json::to_vec(&value).ok()
}

/// Removes proto-named fields that a camelCase twin shadows, through the
/// known nested messages; whether any was removed.
fn drop_shadowed(v: &mut Value, fields: &[Field]) -> bool {
    let Value::Object(object) = v else {
        return false;
    };
    let mut dropped = false;
    for field in fields {
        let camel = camel(field.name);
        if camel != field.name && object.contains_key(&camel) {
            dropped |= object.remove(field.name).is_some();
        }
        let Some(value) = object.get_mut(&camel) else {
            continue;
        };
        match (field.kind, value) {
            (Message(inner), value) => dropped |= drop_shadowed(value, inner),
            (Messages(inner), Value::Array(items)) => {
                for item in items {
                    dropped |= drop_shadowed(item, inner);
                }
            }
            _ => {}
        }
    }
    dropped
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

/// jsonpb's camelCase JSON name of a proto field (`range_end` →
/// `rangeEnd`; names without `_` are their own).
fn camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// A message's value: an object (or null) whose known fields are judged
/// in jsonpb's order.
fn message_error(v: &Value, fields: &[Field]) -> Option<String> {
    let object = match v {
        Value::Object(o) => o,
        Value::Null => return None,
        other => return Some(cannot_unmarshal(kind_of(other), MESSAGE_GO_TYPE)),
    };
    fields.iter().find_map(|field| {
        // Both names are accepted; with both present the camelCase wins.
        let value = object
            .get(&camel(field.name))
            .or_else(|| object.get(field.name))?;
        field_error(value, field.kind)
    })
}

fn field_error(v: &Value, kind: Kind) -> Option<String> {
    if v.is_null() {
        return None;
    }
    match kind {
        Bytes => bytes_error(v),
        Int64 => int_error(v, "int64"),
        Uint64 => int_error(v, "uint64"),
        Bool => (!v.is_boolean()).then(|| cannot_unmarshal(kind_of(v), "bool")),
        Str => (!v.is_string()).then(|| cannot_unmarshal(kind_of(v), "string")),
        Strs => match v {
            Value::Array(items) => items
                .iter()
                .find(|i| !i.is_string() && !i.is_null())
                .map(|i| cannot_unmarshal(kind_of(i), "string")),
            // jsonpb reads any repeated field as a list of raw values first.
            other => Some(cannot_unmarshal(kind_of(other), "[]json.RawMessage")),
        },
        Enum(go_type, names) => enum_error(v, go_type, names),
        Message(fields) => message_error(v, fields),
        Messages(fields) => match v {
            Value::Array(items) => items.iter().find_map(|i| message_error(i, fields)),
            other => Some(cannot_unmarshal(kind_of(other), "[]json.RawMessage")),
        },
        Unchecked => None,
    }
}

fn enum_error(v: &Value, go_type: &str, names: &[&str]) -> Option<String> {
    match v {
        Value::String(s) if names.contains(&s.as_str()) => None,
        // jsonpb quotes the name's raw JSON text (escapes left as they
        // were): serde's escaping of it is the closest at hand.
        Value::String(s) => {
            let json = serde_json::to_string(s).unwrap_or_default();
            let raw = json.get(1..json.len().saturating_sub(1)).unwrap_or("");
            Some(format!(
                "unknown value {} for enum {go_type}",
                go_quote(raw)
            ))
        }
        Value::Number(n) if n.is_i64() => None,
        Value::Number(n) => Some(cannot_unmarshal(&format!("number {n}"), go_type)),
        other => Some(cannot_unmarshal(kind_of(other), go_type)),
    }
}

fn bytes_error(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => {
            base64_error(s.as_bytes()).map(|at| format!("illegal base64 data at input byte {at}"))
        }
        // Go decodes an array into a byte slice element by element; leave
        // that corner to serde.
        Value::Array(_) => None,
        other => Some(cannot_unmarshal(kind_of(other), "[]uint8")),
    }
}

/// jsonpb drops the quotes of a quoted integer and hands what is inside
/// to `json.Unmarshal`.
fn int_error(v: &Value, go_type: &str) -> Option<String> {
    let text = match v {
        Value::String(s) => {
            if let Err(e) = scan_whole(s.as_bytes()) {
                return Some(e);
            }
            match serde_json::from_str::<Value>(s) {
                Ok(Value::Number(_)) => s.trim().to_string(),
                Ok(other) => return Some(cannot_unmarshal(kind_of(&other), go_type)),
                Err(_) => return None,
            }
        }
        // Go prints the literal as written; serde's rendering is the
        // closest at hand for an unquoted one.
        Value::Number(n) => n.to_string(),
        other => return Some(cannot_unmarshal(kind_of(other), go_type)),
    };
    let fits = match go_type {
        "uint64" => text.parse::<u64>().is_ok(),
        _ => text.parse::<i64>().is_ok(),
    };
    (!fits).then(|| cannot_unmarshal(&format!("number {text}"), go_type))
}

/// Go's `strconv.Quote` (printable characters kept, the rest escaped).
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push_str(&escape_rune(c)),
        }
    }
    out.push('"');
    out
}

/// One character as Go's quoting writes it.
fn escape_rune(c: char) -> String {
    match c {
        '\x07' => r"\a".to_string(),
        '\x08' => r"\b".to_string(),
        '\x0c' => r"\f".to_string(),
        '\n' => r"\n".to_string(),
        '\r' => r"\r".to_string(),
        '\t' => r"\t".to_string(),
        '\x0b' => r"\v".to_string(),
        c if (c as u32) < 0x20 || c == '\x7f' => format!(r"\x{:02x}", c as u32),
        // Go's unicode.IsPrint: no controls, and no spaces but U+0020.
        c if c.is_control() || (c.is_whitespace() && c != ' ') || c == '\u{ad}' => {
            if (c as u32) <= 0xffff {
                format!(r"\u{:04x}", c as u32)
            } else {
                format!(r"\U{:08x}", c as u32)
            }
        }
        c => c.to_string(),
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

/// The first JSON value in `body` (Go's decoder reads one value and
/// ignores what follows).
fn first_value(body: &[u8]) -> Option<Value> {
    serde_json::Deserializer::from_slice(body)
        .into_iter::<Value>()
        .next()?
        .ok()
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
    // Go's `eof()` feeds a space: a value cut short inside a literal or a
    // number says so in that literal's words.
    if s.started {
        if let Step::End = s.step(b' ')? {
            return Ok(());
        }
        if !s.in_value() {
            return Ok(());
        }
    }
    Err("unexpected end of JSON input".into())
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

/// Go's `quoteChar`: the byte as a character in single quotes.
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => r"'\''".into(),
        b'"' => "'\"'".into(),
        b'\\' => r"'\\'".into(),
        _ => format!("'{}'", escape_rune(char::from(c))),
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
        let cases: &[(&str, &str, Option<&str>)] = &[
            (
                "kv/put",
                "notjson",
                Some("invalid character 'o' in literal null (expecting 'u')"),
            ),
            ("kv/put", r#"{"key":"#, Some("unexpected EOF")),
            (
                "kv/put",
                r#"{"key":"zz"}"#,
                Some("illegal base64 data at input byte 0"),
            ),
            (
                "kv/put",
                r#"{"key":123}"#,
                Some("json: cannot unmarshal number into Go value of type []uint8"),
            ),
            (
                "kv/put",
                r#"{"key":"Zm9v","value":"YmFy","lease":"abc"}"#,
                Some("invalid character 'a' looking for beginning of value"),
            ),
            (
                "kv/put",
                "[]",
                Some(
                    "json: cannot unmarshal array into Go value of type map[string]json.RawMessage",
                ),
            ),
            (
                "kv/put",
                r#"{"key":"Zm9v","value":"YmFy","prev_kv":"yes"}"#,
                Some("json: cannot unmarshal string into Go value of type bool"),
            ),
            ("kv/put", r#"{"key":"Zm9v","bogus":1}"#, None),
            (
                "kv/put",
                r#"{"key":"Zm9vYg"}"#,
                Some("illegal base64 data at input byte 4"),
            ),
            (
                "kv/range",
                r#"{"key":"Zm9v","sort_order":"BAD"}"#,
                Some(r#"unknown value "BAD" for enum etcdserverpb.RangeRequest_SortOrder"#),
            ),
            (
                "kv/txn",
                r#"{"compare":{}}"#,
                Some("json: cannot unmarshal object into Go value of type []json.RawMessage"),
            ),
            (
                "kv/txn",
                r#"{"compare":[1]}"#,
                Some("json: cannot unmarshal number into Go value of type map[string]json.RawMessage"),
            ),
            (
                "kv/txn",
                r#"{"success":[{"request_put":{"key":1}}]}"#,
                Some("json: cannot unmarshal number into Go value of type []uint8"),
            ),
            (
                "kv/txn",
                r#"{"success":[{"requestPut":{"key":"Zm9vYg"}}]}"#,
                Some("illegal base64 data at input byte 4"),
            ),
            ("cluster/member/remove", r#"{"ID":"12345678901234567890"}"#, None),
            (
                "cluster/member/remove",
                r#"{"ID":"-1"}"#,
                Some("json: cannot unmarshal number -1 into Go value of type uint64"),
            ),
            (
                "kv/range",
                r#"{"key":"Zm9v","sort_order":"DESCEND","limit":"5"}"#,
                None,
            ),
            ("kv/put", r#"{"key":"Zm9v"} trailing"#, None),
            // Fields a message does not have are ignored, as jsonpb does.
            ("kv/put", r#"{"key":"Zm9v","extra":{"key":"raw"}}"#, None),
            ("kv/put", r#"{"key":"Zm9v","sort_order":"BAD"}"#, None),
            // The camelCase name wins over the proto name.
            (
                "kv/range",
                r#"{"key":"Zm9v","range_end":"x","rangeEnd":"Zm9w"}"#,
                None,
            ),
            (
                "kv/range",
                r#"{"key":"Zm9v","rangeEnd":"x"}"#,
                Some("illegal base64 data at input byte 0"),
            ),
            // jsonpb's order is the proto's, not the body's.
            (
                "kv/put",
                r#"{"lease":"x","value":"zz"}"#,
                Some("illegal base64 data at input byte 0"),
            ),
            (
                "kv/put",
                r#"{"key":"Zm9v","lease":"-"}"#,
                Some("invalid character ' ' in numeric literal"),
            ),
            (
                "kv/put",
                r#"{"key":"Zm9v","lease":""}"#,
                Some("unexpected end of JSON input"),
            ),
            (
                "kv/put",
                r#"{"key":"Zm9v","lease":"1.5"}"#,
                Some("json: cannot unmarshal number 1.5 into Go value of type int64"),
            ),
            (
                "kv/put",
                r#"{"key":"Zm9v","lease":"1 2"}"#,
                Some("invalid character '2' after top-level value"),
            ),
            (
                "auth/role/grant",
                r#"{"name":"r","perm":{"permType":"ALL"}}"#,
                Some(r#"unknown value "ALL" for enum authpb.Permission_Type"#),
            ),
            ("auth/role/revoke", r#"{"role":"r","key":"plain"}"#, None),
            (
                "kv/range",
                r#"{"key":"Zm9v","sort_order":"B\u0001D"}"#,
                Some(r#"unknown value "B\\u0001D" for enum etcdserverpb.RangeRequest_SortOrder"#),
            ),
            (
                "cluster/member/add",
                r#"{"peerURLs":"http://x"}"#,
                Some("json: cannot unmarshal string into Go value of type []json.RawMessage"),
            ),
            (
                "watch",
                r#"{"create_request":{"key":"Zm9v","start_revision":true}}"#,
                Some("json: cannot unmarshal bool into Go value of type int64"),
            ),
        ];
        for (route, body, want) in cases {
            assert_eq!(
                explain(route, body.as_bytes()).as_deref(),
                *want,
                "{route} {body}"
            );
        }
    }

    #[test]
    fn a_camel_case_twin_shadows_the_proto_name_as_in_jsonpb() {
        let view = |route: &str, body: &str| {
            jsonpb_view(route, body.as_bytes()).map(|b| String::from_utf8(b).unwrap())
        };
        assert_eq!(
            view(
                "kv/range",
                r#"{"key":"Zm9v","range_end":"x","rangeEnd":"Zm9w"}"#
            )
            .as_deref(),
            Some(r#"{"key":"Zm9v","rangeEnd":"Zm9w"}"#)
        );
        assert_eq!(
            view(
                "kv/txn",
                r#"{"success":[{"requestPut":{"key":"YQ==","prev_kv":"x","prevKv":true}}]}"#
            )
            .as_deref(),
            Some(r#"{"success":[{"requestPut":{"key":"YQ==","prevKv":true}}]}"#)
        );
        assert_eq!(
            view("kv/range", r#"{"key":"Zm9v","range_end":"Zm9w"}"#),
            None
        );
        assert_eq!(view("kv/range", "nope"), None);
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
