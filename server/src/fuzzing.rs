//! Fuzzing entry points for the server's own decoders: what a WAL record,
//! a committed Raft entry or a peer's frame can hand the apply path. They
//! serve the libFuzzer targets in `fuzz/` (nightly, `cargo fuzz`); the
//! tests below replay seeded random and mutated inputs through them on
//! stable in CI. (The engine's file decoders are in `engine::fuzzing`.)
//!
//! The contract under test: a decoder returns a value or an error; it never
//! panics and never allocates by a length it has not checked against its
//! input. Checksums in the WAL and peer frames sit in front of all of
//! these, so what reaches them is a bug or a collision, not line noise;
//! they must hold anyway.

use bytes::Bytes;
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeV2, EntryType, Message};

use crate::{members, mvcc, raftlog};

/// A WAL entry record as the Raft log reads it back, and the conf change
/// it carries when it says it is one; plus the same bytes as a hard-state
/// record and as a snapshot marker.
pub fn raft_log_records(data: &[u8]) {
    if let Ok(entry) = raftlog::decode_entry(1, Bytes::copy_from_slice(data)) {
        match entry.entry_type {
            EntryType::EntryConfChange => {
                let _ = ConfChange::parse_from_bytes(&entry.data);
            }
            EntryType::EntryConfChangeV2 => {
                let _ = ConfChangeV2::parse_from_bytes(&entry.data);
            }
            EntryType::EntryNormal => {}
        }
        let _ = crate::apply::decode_proposal(entry.context);
    }
    let _ = raftlog::decode_hard_state(data);
    let _ = raftlog::decode_snapshot_meta(1, data);
}

/// A committed entry's data: the proposal header and its body (a KV
/// request, a lease or a member record).
pub fn proposal(data: &[u8]) {
    let _ = crate::apply::decode_proposal(Bytes::copy_from_slice(data));
}

/// A KV request payload (mvcc's log encoding), and the same bytes as a
/// stored key revision.
pub fn kv_request(data: &[u8]) {
    let bytes = Bytes::copy_from_slice(data);
    let _ = mvcc::codec::decode_shared(&bytes);
    let _ = mvcc::codec::decode_kv_key(data);
    let _ = mvcc::codec::decode_kv(&bytes, 1);
}

/// A key index checkpoint file (`member/keyindex`) as a restart reads it,
/// sealed: `data` is the body, the CRC32C that closes the file is added.
pub fn index_checkpoint(data: &[u8]) {
    let _ = mvcc::index_checkpoint::decode(&seal_index_checkpoint(data));
}

fn seal_index_checkpoint(body: &[u8]) -> Vec<u8> {
    let mut sealed = body.to_vec();
    sealed.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    sealed
}

/// A member record (JSON in the log and in MVCC metadata).
pub fn member_record(data: &[u8]) {
    let _ = members::decode(data);
}

/// A JSON gateway body as etcd's Go gateway would judge it (the words of
/// a refusal).
pub fn gateway_json(data: &[u8]) {
    for route in ["kv/txn", "kv/range", "watch", "auth/role/grant"] {
        let _ = crate::api::grpc::go_json::explain(route, data);
    }
}

/// A backup file (an etcd bbolt db from anywhere): its pages as
/// `etcdctl snapshot status` counts them and as a restore maps them.
pub fn etcd_db(data: &[u8]) {
    let _ = crate::etcd_db::figures_from(&data);
    let _ = crate::etcd_db::read_db_from(&data);
}

/// A peer frame's body: a raft message as the transport parses it.
pub fn peer_message(data: &[u8]) {
    let _ = Message::parse_from_bytes(data);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::mvcc::{
        Compare, CompareResult, CompareTarget, PutRequest, Request, RequestOp, TargetUnion,
        TxnRequest,
    };

    /// A gateway body with every kind of field the explainer checks.
    const GATEWAY_SEED: &[u8] = br#"{"compare":[{"target":"MOD","result":"EQUAL","key":"YQ==","mod_revision":"0"}],"success":[{"request_put":{"key":"YQ==","value":"MQ==","lease":"7","prev_kv":true}}],"failure":[{"request_range":{"key":"Zm9v","sort_order":"DESCEND","limit":5}}]}"#;

    /// Inputs per target; bounded so the test stays in seconds.
    const INPUTS: usize = 3000;

    fn put(key: &str) -> RequestOp {
        RequestOp::Put(PutRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::from_static(b"value"),
            lease: 7,
            prev_kv: true,
            ..Default::default()
        })
    }

    /// A nested txn with every kind of compare: the richest payload.
    fn kv_seed() -> Vec<u8> {
        let compare = |target, union| Compare {
            result: CompareResult::Greater,
            target,
            key: Bytes::from_static(b"k"),
            range_end: Bytes::from_static(b"l"),
            target_union: union,
        };
        let inner = TxnRequest {
            compare: vec![compare(
                CompareTarget::Value,
                TargetUnion::Value(Bytes::from_static(b"v")),
            )],
            success: vec![put("a")],
            failure: vec![],
        };
        let txn = TxnRequest {
            compare: vec![
                compare(CompareTarget::Mod, TargetUnion::ModRevision(3)),
                compare(CompareTarget::Lease, TargetUnion::Lease(9)),
            ],
            success: vec![put("b"), RequestOp::Txn(inner)],
            failure: vec![put("c")],
        };
        let mut out = Vec::new();
        mvcc::codec::encode(&Request::Txn(txn), &mut out);
        out
    }

    /// A small etcd db: key revisions, a lease, a user, the meta records.
    fn db_seed() -> Vec<u8> {
        use engine::Engine as _;
        let store = engine::MemoryEngine::new();
        let mut batch = engine::WriteBatch::new();
        for main in 2..40u64 {
            let kv = mvcc::KeyValue {
                key: Bytes::from(format!("k{main}")),
                create_revision: main as i64,
                mod_revision: main as i64,
                version: 1,
                value: Bytes::from_static(b"v"),
                lease: 0,
            };
            let mut value = Vec::new();
            mvcc::codec::encode_kv(&mut value, &kv, main % 5 == 0);
            let key = [&b"k"[..], &main.to_be_bytes(), &0u64.to_be_bytes()].concat();
            batch.put(key.into(), value.into());
        }
        let lease = [&b"mlease/"[..], &7i64.to_be_bytes()].concat();
        batch.put(lease.into(), Bytes::from(60i64.to_be_bytes().to_vec()));
        batch.set_applied_index(50);
        store.write(batch).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        crate::etcd_db::write_db(&store.snapshot(), &path).unwrap();
        std::fs::read(&path).unwrap()
    }

    /// A key index checkpoint of a store with puts, deletes, several
    /// events per key and a compaction.
    fn index_checkpoint_seed() -> Vec<u8> {
        let engine = engine::MemoryEngine::new();
        let mut store = mvcc::MvccStore::open(engine).unwrap();
        let mut index = 0;
        let mut apply = |store: &mut mvcc::MvccStore<engine::MemoryEngine>, req: Request| {
            index += 1;
            let _ = store.apply(index, &req);
        };
        for i in 0..40 {
            let key = format!("key/{:03}", i % 17);
            apply(
                &mut store,
                Request::Put(PutRequest {
                    key: Bytes::from(key.clone()),
                    value: Bytes::from_static(b"v"),
                    ..Default::default()
                }),
            );
            if i % 7 == 0 {
                apply(
                    &mut store,
                    Request::DeleteRange(mvcc::DeleteRangeRequest {
                        key: Bytes::from(key),
                        ..Default::default()
                    }),
                );
            }
        }
        apply(
            &mut store,
            Request::Compaction(mvcc::CompactionRequest {
                revision: 20,
                physical: false,
            }),
        );
        let mut bytes = Vec::new();
        store
            .reader()
            .encode_index_checkpoint(store.index_checkpoint_plan(1), 8, |chunk| {
                bytes.extend_from_slice(chunk);
                Ok::<_, mvcc::CheckpointError>(())
            })
            .unwrap();
        bytes
    }

    #[test]
    fn seeds_decode_before_they_are_damaged() {
        let ck = index_checkpoint_seed();
        // The harness's sealing reproduces a real file from its body.
        assert_eq!(seal_index_checkpoint(&ck[..ck.len() - 4]), ck);
        let decoded = mvcc::index_checkpoint::decode(&ck).unwrap();
        assert_eq!(decoded.index.len(), 17);
        // Every cut and every flipped byte is refused (the checksum covers
        // all of it), never a panic.
        for cut in 0..ck.len() {
            assert!(
                mvcc::index_checkpoint::decode(&ck[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        for i in 0..ck.len() {
            let mut bad = ck.clone();
            bad[i] ^= 0x20;
            assert!(
                mvcc::index_checkpoint::decode(&bad).is_err(),
                "byte {i} flipped"
            );
        }
        assert!(crate::etcd_db::read_db_from(&db_seed().as_slice()).is_ok());
        // Guards the replay below: its seeds must be valid inputs, or the
        // mutations would only ever exercise the first error path.
        let kv = kv_seed();
        assert!(mvcc::codec::decode(&kv).is_ok());
        let mut proposal = vec![0u8; 16];
        proposal.push(1); // TAG_KV
        proposal.extend_from_slice(&kv);
        assert!(crate::apply::decode_proposal(Bytes::from(proposal)).is_some());
    }

    #[test]
    fn decoders_survive_garbage_and_damage() {
        let kv = kv_seed();
        let mut proposal_bytes = vec![0u8; 16];
        proposal_bytes.push(1);
        proposal_bytes.extend_from_slice(&kv);
        let mut entry = Vec::new();
        let mut e = raft::eraftpb::Entry {
            term: 3,
            entry_type: EntryType::EntryNormal,
            data: Bytes::from(proposal_bytes.clone()),
            context: Bytes::from(proposal_bytes.clone()),
            ..Default::default()
        };
        raftlog::encode_entry(&e, &mut entry);
        let mut cc_entry = Vec::new();
        e.entry_type = EntryType::EntryConfChangeV2;
        e.data = Bytes::from(ConfChangeV2::default().write_to_bytes().unwrap());
        raftlog::encode_entry(&e, &mut cc_entry);
        let member = members::encode(&members::MemberRecord {
            id: 0x8e9e_05c5_2164_694d,
            name: "m1".into(),
            peer_urls: vec!["http://127.0.0.1:2380".into()],
            client_urls: vec!["http://127.0.0.1:2379".into()],
            is_learner: true,
        });
        let db = db_seed();
        let ck = index_checkpoint_seed();
        let ck_body = &ck[..ck.len() - 4];
        let mut rng = engine::fuzzing::Inputs::new(0x853c_49e6_748f_ea9b);
        for _ in 0..INPUTS {
            let noise: Vec<u8> = (0..rng.below(200)).map(|_| rng.next_u64() as u8).collect();
            for f in [
                raft_log_records,
                proposal,
                kv_request,
                member_record,
                peer_message,
                gateway_json,
                etcd_db,
                index_checkpoint,
            ] {
                f(&noise);
            }
            index_checkpoint(&rng.mutate(ck_body));
            etcd_db(&rng.mutate(&db));
            gateway_json(&rng.mutate(GATEWAY_SEED));
            kv_request(&rng.mutate(&kv));
            proposal(&rng.mutate(&proposal_bytes));
            raft_log_records(&rng.mutate(&entry));
            raft_log_records(&rng.mutate(&cc_entry));
            member_record(&rng.mutate(&member));
        }
    }
}
