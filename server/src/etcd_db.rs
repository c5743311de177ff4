//! etcd 3.4's backend schema: the bbolt db a member keeps in
//! `member/snap/db` and the file `etcdctl snapshot save` writes. metcd's
//! backups are written in it, so `etcdctl snapshot status` and `etcdctl
//! snapshot restore` (and so etcd itself) take them, and read back from
//! it, so `metcd snapshot restore` takes etcd's backups too.
//!
//! Owns the mapping between etcd's buckets and our engine records; the
//! page format is [`crate::bolt`]'s, the restore procedure
//! [`crate::backup`]'s. Never panics on a backup from elsewhere: a record
//! it cannot map is an error naming it.
//!
//! | bucket | key | value | our record |
//! |---|---|---|---|
//! | `key` | `main BE8 '_' sub BE8` (+`t`: tombstone) | `mvccpb.KeyValue` | `k main sub` |
//! | `meta` | `consistent_index`; `finishedCompactRev`, `scheduledCompactRev` | u64 BE; `main BE8 '_' 0 BE8` | applied index; `mcompact_rev` |
//! | `lease` | ID i64 BE | `leasepb.Lease{ID, TTL, RemainingTTL}` | `lease/<id BE>` = TTL BE (+ remaining BE) |
//! | `auth` | `authEnabled`, `authRevision` | `[0]`/`[1]`; u64 BE | `auth/enabled`, `auth/revision` |
//! | `authUsers`, `authRoles` | name | `authpb.User`, `authpb.Role` | `auth/user/<n>`, `auth/role/<n>` |
//! | `alarm` | `etcdserverpb.AlarmMember` | empty | `alarm/<type u8><member BE>` |
//! | `members`, `members_removed` | member ID in hex | etcd's member JSON; `removed` | `member/<id BE>`, `removed/<id BE>` (export only: a restore takes the membership from its flags) |
//! | `cluster` | `clusterVersion` | e.g. `3.5.0` | (export only) |

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;

use bytes::Bytes;
use engine::{Engine, EngineSnapshot, Scan, WriteBatch};
use prost::Message;

use crate::api::grpc::pb;
use crate::bolt::{self, BoltError, BoltWriter};
use crate::error::{Result, ServerError};
use crate::mvcc::codec;

// Our record names, from the modules that own them.
use crate::alarm::META_PREFIX as ALARM_RECORD;
use crate::apply::LEASE_META as LEASE_RECORD;
use crate::auth::{
    META_ENABLED as AUTH_ENABLED, META_REVISION as AUTH_REVISION, META_ROLE as AUTH_ROLE,
    META_USER as AUTH_USER,
};
use crate::members::META_PREFIX as MEMBER_RECORD;
use crate::mvcc::store::META_COMPACT_REV as COMPACT_REVISION_RECORD;
use crate::node::REMOVED_META as REMOVED_RECORD;

fn failed(what: impl std::fmt::Display) -> ServerError {
    ServerError::Startup(what.to_string())
}

impl From<BoltError> for ServerError {
    fn from(e: BoltError) -> ServerError {
        failed(e)
    }
}

/// `main BE8 '_' sub BE8`, etcd's revision key.
fn revision_key(main: i64, sub: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[..8].copy_from_slice(&main.to_be_bytes());
    k[8] = b'_';
    k[9..].copy_from_slice(&sub.to_be_bytes());
    k
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A proto3 varint field (left out when zero, as Go's marshalling does).
fn put_varint_field(out: &mut Vec<u8>, number: u64, v: u64) {
    if v != 0 {
        put_varint(out, number << 3);
        put_varint(out, v);
    }
}

/// The varint fields 1..=3 of a small message (leasepb.Lease,
/// AlarmMember); other wire types are refused.
fn varint_fields(mut b: &[u8]) -> Option<[u64; 4]> {
    fn varint(b: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(v);
            }
        }
        None
    }
    let mut fields = [0u64; 4];
    while !b.is_empty() {
        let tag = varint(&mut b)?;
        if tag & 7 != 0 {
            return None;
        }
        let value = varint(&mut b)?;
        if let Some(slot) = fields.get_mut(usize::try_from(tag >> 3).ok()?) {
            *slot = value;
        }
    }
    Some(fields)
}

/// A member record as etcd 3.4's `membership.Member` marshals to JSON.
fn member_json(record: &crate::members::MemberRecord) -> String {
    let list = |urls: &[String]| {
        let quoted: Vec<String> = urls
            .iter()
            .map(|u| serde_json::to_string(u).unwrap_or_default())
            .collect();
        format!("[{}]", quoted.join(","))
    };
    let mut json = format!(
        "{{\"id\":{},\"peerURLs\":{}",
        record.id,
        if record.peer_urls.is_empty() {
            "null".to_owned()
        } else {
            list(&record.peer_urls)
        }
    );
    if record.is_learner {
        json.push_str(",\"isLearner\":true");
    }
    if !record.name.is_empty() {
        json.push_str(&format!(
            ",\"name\":{}",
            serde_json::to_string(&record.name).unwrap_or_default()
        ));
    }
    if !record.client_urls.is_empty() {
        json.push_str(&format!(",\"clientURLs\":{}", list(&record.client_urls)));
    }
    json.push('}');
    json
}

type Bucket = BTreeMap<Vec<u8>, Vec<u8>>;

/// etcd's buckets other than `key`, from our metadata records.
fn metadata_buckets(
    records: &[(Bytes, Bytes)],
    applied_index: u64,
) -> Result<BTreeMap<&'static str, Bucket>> {
    let mut buckets: BTreeMap<&'static str, Bucket> = BTreeMap::new();
    for name in [
        "alarm",
        "auth",
        "authRoles",
        "authUsers",
        "cluster",
        "lease",
        "members",
        "members_removed",
        "meta",
    ] {
        buckets.insert(name, Bucket::new());
    }
    let mut put = |bucket: &'static str, k: Vec<u8>, v: Vec<u8>| {
        if let Some(b) = buckets.get_mut(bucket) {
            b.insert(k, v);
        }
    };
    put(
        "meta",
        b"consistent_index".to_vec(),
        applied_index.to_be_bytes().to_vec(),
    );
    put(
        "cluster",
        b"clusterVersion".to_vec(),
        crate::ETCD_CLUSTER_VERSION.as_bytes().to_vec(),
    );
    for (key, value) in records {
        // Engine keys of the metadata namespace: b'm' ++ name.
        let name = &key[1..];
        if key[..] == *COMPACT_REVISION_RECORD {
            let rev = <[u8; 8]>::try_from(&value[..])
                .map(i64::from_be_bytes)
                .map_err(|_| failed("a malformed compact revision record"))?;
            let at = revision_key(rev, 0).to_vec();
            put("meta", b"finishedCompactRev".to_vec(), at.clone());
            put("meta", b"scheduledCompactRev".to_vec(), at);
        } else if let Some(id) = name.strip_prefix(LEASE_RECORD) {
            let id = <[u8; 8]>::try_from(id).map_err(|_| failed("a malformed lease record"))?;
            let ttl = value.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok());
            let remaining = value.get(8..16).and_then(|b| <[u8; 8]>::try_from(b).ok());
            let ttl = ttl
                .map(i64::from_be_bytes)
                .ok_or_else(|| failed("a lease without TTL"))?;
            let mut lease = Vec::new();
            put_varint_field(&mut lease, 1, i64::from_be_bytes(id) as u64);
            put_varint_field(&mut lease, 2, ttl as u64);
            put_varint_field(
                &mut lease,
                3,
                remaining.map_or(0, i64::from_be_bytes) as u64,
            );
            put("lease", id.to_vec(), lease);
        } else if name == AUTH_ENABLED {
            put(
                "auth",
                b"authEnabled".to_vec(),
                vec![u8::from(value.first() == Some(&1))],
            );
        } else if name == AUTH_REVISION {
            put("auth", b"authRevision".to_vec(), value.to_vec());
        } else if let Some(user) = name.strip_prefix(AUTH_USER) {
            put("authUsers", user.to_vec(), value.to_vec());
        } else if let Some(role) = name.strip_prefix(AUTH_ROLE) {
            put("authRoles", role.to_vec(), value.to_vec());
        } else if let Some(alarm) = name.strip_prefix(ALARM_RECORD) {
            let (&kind, member) = alarm
                .split_first()
                .ok_or_else(|| failed("a malformed alarm record"))?;
            let member = <[u8; 8]>::try_from(member)
                .map(u64::from_be_bytes)
                .map_err(|_| failed("a malformed alarm record"))?;
            let mut key = Vec::new();
            put_varint_field(&mut key, 1, member);
            put_varint_field(&mut key, 2, u64::from(kind));
            put("alarm", key, Vec::new());
        } else if name.starts_with(MEMBER_RECORD) {
            if let Some(record) = crate::members::decode(value) {
                put(
                    "members",
                    format!("{:x}", record.id).into_bytes(),
                    member_json(&record).into_bytes(),
                );
            }
        } else if let Some(id) = name.strip_prefix(REMOVED_RECORD) {
            if let Ok(id) = <[u8; 8]>::try_from(id) {
                put(
                    "members_removed",
                    format!("{:x}", u64::from_be_bytes(id)).into_bytes(),
                    b"removed".to_vec(),
                );
            }
        }
        // Anything else (the Raft configuration) has no place in etcd's
        // backend: a restore takes it from its flags.
    }
    // etcd writes its auth store's revision (1) at its first start; ours
    // is written at the first auth change. Give etcd what it would hold.
    if let Some(auth) = buckets.get_mut("auth") {
        auth.entry(b"authRevision".to_vec())
            .or_insert_with(|| 1u64.to_be_bytes().to_vec());
    }
    Ok(buckets)
}

/// Writes the store `snapshot` sees to `path` (which must not exist) as an
/// etcd 3.4 backend, fsynced; answers its size. Blocking: run it off the
/// shards.
pub fn write_db<S: EngineSnapshot>(snapshot: &S, path: &Path) -> Result<u64> {
    let mut records = Vec::new();
    snapshot.scan(
        Bound::Included(&b"m"[..]),
        Bound::Excluded(&b"n"[..]),
        |k, v| {
            records.push((Bytes::copy_from_slice(k), v.clone()));
            Scan::Continue
        },
    )?;
    let buckets = metadata_buckets(&records, snapshot.applied_index())?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| failed(format!("cannot create {}: {e}", path.display())))?;
    let written = (|| -> Result<u64> {
        let mut w = BoltWriter::new(std::io::BufWriter::with_capacity(1 << 20, file))?;
        let (before_key, after_key): (Vec<_>, Vec<_>) =
            buckets.into_iter().partition(|(name, _)| *name < "key");
        for (name, records) in before_key {
            w.bucket(name.as_bytes())?;
            for (k, v) in records {
                w.put(&k, &v)?;
            }
        }
        w.bucket(b"key")?;
        let (mut key_buf, mut value_buf) = (Vec::new(), Vec::new());
        let mut failure = None;
        snapshot.scan(
            Bound::Included(&b"k"[..]),
            Bound::Excluded(&b"l"[..]),
            |k, v| {
                let outcome = (|| -> Result<()> {
                    let main = k
                        .get(1..9)
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map(i64::from_be_bytes);
                    let sub = k
                        .get(9..17)
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map(u64::from_be_bytes)
                        .and_then(|s| u32::try_from(s).ok());
                    let (Some(main), Some(sub)) = (main, sub) else {
                        return Err(failed(format!("a malformed revision key {k:02x?}")));
                    };
                    let (tombstone, kv) = codec::decode_kv(v, main)
                        .map_err(|e| failed(format!("revision {main}: {e}")))?;
                    codec::etcd_bucket_record(&mut key_buf, &mut value_buf, &kv, sub, tombstone);
                    w.put(&key_buf, &value_buf)?;
                    Ok(())
                })();
                match outcome {
                    Ok(()) => Scan::Continue,
                    Err(e) => {
                        failure = Some(e);
                        Scan::Stop
                    }
                }
            },
        )?;
        if let Some(e) = failure {
            return Err(e);
        }
        for (name, records) in after_key {
            w.bucket(name.as_bytes())?;
            for (k, v) in records {
                w.put(&k, &v)?;
            }
        }
        let (out, size) = w.finish()?;
        let file = out
            .into_inner()
            .map_err(|e| failed(format!("cannot write {}: {e}", path.display())))?;
        file.sync_all()
            .map_err(|e| failed(format!("cannot sync {}: {e}", path.display())))?;
        Ok(size)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(path);
    }
    written
}

/// What an etcd backend holds, as `etcdctl snapshot status` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DbFigures {
    /// CRC32C over every bucket's name, then its keys and values in order.
    pub hash: u32,
    /// The main revision of the last key in `key`.
    pub revision: i64,
    /// Records over all buckets.
    pub total_keys: u64,
    /// Pages below the high-water mark times the page size (`Tx.Size()`).
    pub total_size: u64,
}

/// etcdctl's `snapshot status` figures of the db in `path`.
pub fn figures(path: &Path) -> Result<DbFigures> {
    let file = std::fs::File::open(path)
        .map_err(|e| failed(format!("cannot open {}: {e}", path.display())))?;
    figures_from(&file)
}

/// [`figures`] of a db from any page source.
pub fn figures_from(db: &dyn bolt::Pages) -> Result<DbFigures> {
    let mut crc = 0u32;
    let mut revision = 0i64;
    let mut total_keys = 0u64;
    let info = bolt::read_from(db, |bucket, record| {
        match record {
            None => crc = crc32c::crc32c_append(crc, bucket),
            Some((k, v)) => {
                crc = crc32c::crc32c_append(crc, k);
                crc = crc32c::crc32c_append(crc, v);
                total_keys += 1;
                if bucket == b"key" {
                    if let Some(main) = k.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
                        revision = i64::from_be_bytes(main);
                    }
                }
            }
        }
        Ok(())
    })?;
    Ok(DbFigures {
        hash: crc,
        revision,
        total_keys,
        total_size: info.pages * info.page_size,
    })
}

/// The db's consistent index (`meta/consistent_index`; 0 when absent).
pub fn consistent_index(path: &Path) -> Result<u64> {
    let mut index = 0u64;
    bolt::read(path, |bucket, record| {
        if let (b"meta", Some((b"consistent_index", v))) = (bucket, record) {
            index = <[u8; 8]>::try_from(v).map_or(u64::MAX, u64::from_be_bytes);
        }
        Ok(())
    })?;
    Ok(index)
}

/// Reads the etcd backend in `path` into a memory engine holding our
/// records (keys with their revisions, compaction, leases, auth, alarms;
/// not the membership), at the backend's consistent index.
pub fn read_db(path: &Path) -> Result<engine::MemoryEngine> {
    let file = std::fs::File::open(path)
        .map_err(|e| failed(format!("cannot open {}: {e}", path.display())))?;
    read_db_from(&file)
}

/// [`read_db`] from any page source.
pub fn read_db_from(db: &dyn bolt::Pages) -> Result<engine::MemoryEngine> {
    const BATCH: usize = 4096;
    let store = engine::MemoryEngine::new();
    let mut batch = WriteBatch::new();
    let (applied_index, meta) = map_db(db, |key, value| {
        batch.put(key, value);
        if batch.ops().len() >= BATCH {
            store.write(std::mem::replace(&mut batch, WriteBatch::new()))?;
        }
        Ok(())
    })?;
    for (k, v) in meta {
        batch.put(k, v);
    }
    batch.set_applied_index(applied_index);
    store.write(batch)?;
    Ok(store)
}

/// The etcd backend in `path` written as a snapshot file at `out` (the
/// records [`read_db`] would hold), streamed: a backup of any size is
/// converted without holding its store. Answers the file's length.
pub fn convert_db(path: &Path, out: &Path) -> Result<u64> {
    // The file's header names the applied index before any record: read it
    // first, then stream the records (the db is read twice: bolt::read
    // walks every bucket).
    let applied_index = consistent_index(path)?;
    let file = std::fs::File::open(path)
        .map_err(|e| failed(format!("cannot open {}: {e}", path.display())))?;
    let mut writer = engine::snapfile::StreamWriter::create(out, applied_index)?;
    let (mapped_index, meta) = map_db(&file, |key, value| Ok(writer.put(&key, &value)?))?;
    if mapped_index != applied_index {
        return Err(failed(format!(
            "{} changed while it was read (consistent index {applied_index}, then {mapped_index})",
            path.display()
        )));
    }
    for (k, v) in meta {
        writer.put(&k, &v)?;
    }
    Ok(writer.finish()?)
}

/// Maps the etcd backend `db` to our records: each key revision, in
/// ascending order of our keys, goes to `put_key` as it is read; answers
/// the backend's consistent index and the metadata records (compaction,
/// leases, auth, alarms; sorted, and after every key revision in our
/// order, so a sorted store can take them last).
fn map_db(
    db: &dyn bolt::Pages,
    mut put_key: impl FnMut(Bytes, Bytes) -> Result<()>,
) -> Result<(u64, Vec<(Bytes, Bytes)>)> {
    let mut applied_index = 0u64;
    let mut compacted = 0i64;
    let mut meta: Vec<(Bytes, Bytes)> = Vec::new();
    let mut record = |name: &[u8], value: Vec<u8>| {
        let mut k = b"m".to_vec();
        k.extend_from_slice(name);
        meta.push((k.into(), value.into()));
    };
    let mut failure: Option<ServerError> = None;
    bolt::read_from(db, |bucket, entry| {
        let Some((k, v)) = entry else {
            return Ok(());
        };
        let mapped = (|| -> Result<()> {
            match bucket {
                b"key" => {
                    let malformed = || failed(format!("a malformed revision key {k:02x?}"));
                    let tombstone = match k.len() {
                        17 => false,
                        18 if k[17] == b't' => true,
                        _ => return Err(malformed()),
                    };
                    let main = i64::from_be_bytes(<[u8; 8]>::try_from(&k[..8]).unwrap_or_default());
                    let sub =
                        u64::from_be_bytes(<[u8; 8]>::try_from(&k[9..17]).unwrap_or_default());
                    if k[8] != b'_' || main <= 0 || sub > u64::from(u32::MAX) {
                        return Err(malformed());
                    }
                    let pb = pb::mvccpb::KeyValue::decode(v)
                        .map_err(|e| failed(format!("revision {main}: {e}")))?;
                    let kv = crate::mvcc::KeyValue {
                        key: pb.key,
                        create_revision: pb.create_revision,
                        mod_revision: main,
                        version: pb.version,
                        value: pb.value,
                        lease: pb.lease,
                    };
                    let mut value = Vec::new();
                    codec::encode_kv(&mut value, &kv, tombstone);
                    let mut key = Vec::with_capacity(17);
                    key.push(b'k');
                    key.extend_from_slice(&(main as u64).to_be_bytes());
                    key.extend_from_slice(&sub.to_be_bytes());
                    put_key(key.into(), value.into())?;
                }
                b"meta" => match k {
                    b"consistent_index" => {
                        applied_index = <[u8; 8]>::try_from(v)
                            .map(u64::from_be_bytes)
                            .map_err(|_| failed("a malformed consistent_index"))?;
                    }
                    // A scheduled compaction past the finished one was cut
                    // short: etcd finishes it at its next start, so its
                    // history below the scheduled revision is no longer
                    // whole. Take the later of the two, as etcd ends up.
                    b"finishedCompactRev" | b"scheduledCompactRev" => {
                        let main = v
                            .get(..8)
                            .and_then(|b| <[u8; 8]>::try_from(b).ok())
                            .map(i64::from_be_bytes)
                            .ok_or_else(|| failed("a malformed compaction revision"))?;
                        compacted = compacted.max(main);
                    }
                    _ => {}
                },
                b"lease" => {
                    let [_, id, ttl, remaining] =
                        varint_fields(v).ok_or_else(|| failed("a malformed lease"))?;
                    let mut name = LEASE_RECORD.to_vec();
                    name.extend_from_slice(&(id as i64).to_be_bytes());
                    let remaining = (remaining != 0).then_some(remaining as i64);
                    record(
                        &name,
                        crate::apply::lease_record(ttl as i64, remaining).to_vec(),
                    );
                }
                b"auth" => match k {
                    b"authEnabled" => record(AUTH_ENABLED, vec![u8::from(v == [1])]),
                    b"authRevision" => record(AUTH_REVISION, v.to_vec()),
                    _ => {}
                },
                b"authUsers" => record(&[AUTH_USER, k].concat(), v.to_vec()),
                b"authRoles" => record(&[AUTH_ROLE, k].concat(), v.to_vec()),
                b"alarm" => {
                    let [_, member, kind, _] =
                        varint_fields(k).ok_or_else(|| failed("a malformed alarm"))?;
                    let mut name = ALARM_RECORD.to_vec();
                    name.push(u8::try_from(kind).map_err(|_| failed("an unknown alarm"))?);
                    name.extend_from_slice(&member.to_be_bytes());
                    record(&name, Vec::new());
                }
                // The membership comes from the restore's flags; the
                // cluster version from the members that run.
                _ => {}
            }
            Ok(())
        })();
        match mapped {
            Ok(()) => Ok(()),
            Err(e) => {
                failure = Some(e);
                Err(BoltError::Invalid("stopped".into()))
            }
        }
    })
    .map_err(|e| failure.take().unwrap_or_else(|| e.into()))?;
    if let Some(e) = failure {
        return Err(e);
    }
    if compacted > 0 {
        meta.push((
            Bytes::from_static(COMPACT_REVISION_RECORD),
            Bytes::copy_from_slice(&compacted.to_be_bytes()),
        ));
    }
    // Metadata records sort after every key revision (b'm' > b'k').
    meta.sort();
    Ok((applied_index, meta))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn small_messages_encode_and_decode_as_protobuf() {
        let mut lease = Vec::new();
        put_varint_field(&mut lease, 1, 0x1234_5678_9abc);
        put_varint_field(&mut lease, 2, 60);
        put_varint_field(&mut lease, 3, 0);
        assert_eq!(varint_fields(&lease), Some([0, 0x1234_5678_9abc, 60, 0]));
        assert_eq!(
            varint_fields(&[0x0a, 0x01, 0x00]),
            None,
            "a length-delimited field"
        );
        assert_eq!(varint_fields(&[0x08, 0xff]), None, "a truncated varint");
    }

    #[test]
    fn members_marshal_as_etcd_does() {
        let record = crate::members::MemberRecord {
            id: 0x8e9e05c52164694d,
            name: "default".into(),
            peer_urls: vec!["http://localhost:2380".into()],
            client_urls: vec!["http://localhost:2379".into()],
            is_learner: false,
        };
        assert_eq!(
            member_json(&record),
            "{\"id\":10276657743932975437,\"peerURLs\":[\"http://localhost:2380\"],\
             \"name\":\"default\",\"clientURLs\":[\"http://localhost:2379\"]}"
        );
        let learner = crate::members::MemberRecord {
            is_learner: true,
            name: String::new(),
            client_urls: Vec::new(),
            ..record
        };
        assert_eq!(
            member_json(&learner),
            "{\"id\":10276657743932975437,\"peerURLs\":[\"http://localhost:2380\"],\
             \"isLearner\":true}"
        );
    }

    fn all_records(e: &engine::MemoryEngine) -> Vec<(Bytes, Bytes)> {
        let mut out = Vec::new();
        e.snapshot()
            .scan(Bound::Unbounded, Bound::Unbounded, |k, v| {
                out.push((Bytes::copy_from_slice(k), v.clone()));
                Scan::Continue
            })
            .unwrap();
        out
    }

    /// Our records through an etcd db and back: every key revision
    /// (tombstones included), the compaction, leases (checkpointed or not),
    /// auth and alarms come back as they were; the membership does not
    /// (a restore takes it from its flags), and etcdctl's figures count
    /// every bucket's records.
    #[test]
    fn a_store_round_trips_through_an_etcd_db() {
        let store = engine::MemoryEngine::new();
        let mut batch = WriteBatch::new();
        let mut expected = Vec::new();
        for main in 2..400i64 {
            for sub in 0..2u64 {
                let tombstone = main % 7 == 0 && sub == 1;
                let kv = crate::mvcc::KeyValue {
                    key: Bytes::from(format!("key/{}", main % 50)),
                    create_revision: main - main % 3,
                    mod_revision: main,
                    version: main % 3 + 1,
                    value: Bytes::from(vec![b'v'; (main % 300) as usize]),
                    lease: if main % 11 == 0 { 0x1234 } else { 0 },
                };
                let mut value = Vec::new();
                codec::encode_kv(&mut value, &kv, tombstone);
                let mut key = vec![b'k'];
                key.extend_from_slice(&(main as u64).to_be_bytes());
                key.extend_from_slice(&sub.to_be_bytes());
                expected.push((Bytes::from(key), Bytes::from(value)));
            }
        }
        let meta = |name: &[u8], value: &[u8]| {
            (
                Bytes::from([b"m", name].concat()),
                Bytes::copy_from_slice(value),
            )
        };
        let mut lease = LEASE_RECORD.to_vec();
        lease.extend_from_slice(&0x1234i64.to_be_bytes());
        let mut checkpointed = LEASE_RECORD.to_vec();
        checkpointed.extend_from_slice(&0x99i64.to_be_bytes());
        let mut alarm = ALARM_RECORD.to_vec();
        alarm.push(1);
        alarm.extend_from_slice(&7u64.to_be_bytes());
        let user = pb::authpb::User {
            name: b"alice".to_vec().into(),
            password: b"$2a$10$hash".to_vec().into(),
            roles: vec!["reader".into()],
            ..Default::default()
        }
        .encode_to_vec();
        let role = pb::authpb::Role {
            name: b"reader".to_vec().into(),
            ..Default::default()
        }
        .encode_to_vec();
        expected.extend([
            meta(&alarm, b""),
            meta(AUTH_ENABLED, &[1]),
            meta(AUTH_REVISION, &9u64.to_be_bytes()),
            meta(b"auth/role/reader", &role),
            meta(b"auth/user/alice", &user),
            meta(&COMPACT_REVISION_RECORD[1..], &5i64.to_be_bytes()),
            meta(&lease, &600i64.to_be_bytes()),
            meta(
                &checkpointed,
                &[30i64.to_be_bytes(), 12i64.to_be_bytes()].concat(),
            ),
        ]);
        expected.sort();
        for (k, v) in &expected {
            batch.put(k.clone(), v.clone());
        }
        // Records etcd's restore replaces, and our Raft configuration.
        let member = crate::members::MemberRecord {
            id: 0xabc,
            name: "m1".into(),
            peer_urls: vec!["http://127.0.0.1:2380".into()],
            client_urls: vec![],
            is_learner: false,
        };
        batch.put(
            Bytes::from([&b"m"[..], &crate::members::meta_name(0xabc)].concat()),
            crate::members::encode(&member).into(),
        );
        batch.put(
            Bytes::from_static(b"mraft/conf"),
            Bytes::from_static(b"conf"),
        );
        batch.set_applied_index(42);
        store.write(batch).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        let size = write_db(&store.snapshot(), &db).unwrap();
        assert_eq!(std::fs::metadata(&db).unwrap().len(), size);
        let f = figures(&db).unwrap();
        assert_eq!(f.revision, 399);
        assert_eq!(f.total_size, size);
        // key revisions + alarm, 2 auth, role, user, cluster version,
        // 2 leases, the member, consistent index and 2 compaction records.
        assert_eq!(f.total_keys, 398 * 2 + 1 + 2 + 1 + 1 + 1 + 2 + 1 + 3);

        let back = read_db(&db).unwrap();
        assert_eq!(engine::Engine::applied_index(&back), 42);
        assert_eq!(all_records(&back), expected);
        // Streamed straight into a snapshot file (a restore), the same
        // records at the same index, never held in a store.
        let streamed = dir.path().join("restore.snap");
        let len = convert_db(&db, &streamed).unwrap();
        assert_eq!(std::fs::metadata(&streamed).unwrap().len(), len);
        let data = engine::snapfile::read(&streamed).unwrap();
        assert_eq!(data.applied_index, 42);
        assert_eq!(data.entries, expected);
        std::fs::remove_file(&db).unwrap();
        let again = write_db(&back.snapshot(), &db).unwrap();
        assert!(again > 0);
        assert!(
            write_db(&back.snapshot(), &db).is_err(),
            "never over a file"
        );
    }
}
