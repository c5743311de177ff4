//! The member registry: which members form the Raft group, with the names
//! and URLs `MemberList` reports. Runtime-free.
//!
//! A member's record starts from `--initial-cluster` (ID, peer URLs; the
//! name only for this member, as etcd shows unstarted members nameless) and
//! is completed when the member publishes its attributes through the log,
//! so every member ends up with the same records (stored in MVCC metadata
//! under `member/<id>`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

/// The metadata name of a member's record.
pub fn meta_name(id: u64) -> Vec<u8> {
    let mut k = b"member/".to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    k
}

pub const META_PREFIX: &[u8] = b"member/";

pub fn encode(record: &MemberRecord) -> Vec<u8> {
    // Serialising a plain struct of strings cannot fail.
    serde_json::to_vec(record).unwrap_or_default()
}

pub fn decode(bytes: &[u8]) -> Option<MemberRecord> {
    serde_json::from_slice(bytes).ok()
}

/// The records of every member, in ID order.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    members: std::collections::BTreeMap<u64, MemberRecord>,
}

impl Registry {
    pub fn upsert(&mut self, record: MemberRecord) {
        self.members.insert(record.id, record);
    }

    /// Merges published attributes (name, client URLs) into a member's
    /// record, keeping the peer URLs the cluster knows. `None` (nothing
    /// changed) for a member that is not in the cluster (any more): a late
    /// publish must not bring a removed member back.
    pub fn publish(&mut self, attrs: MemberRecord) -> Option<MemberRecord> {
        let known = self.members.get_mut(&attrs.id)?;
        known.name = attrs.name;
        known.client_urls = attrs.client_urls;
        Some(known.clone())
    }

    pub fn retain(&mut self, keep: impl Fn(&MemberRecord) -> bool) {
        self.members.retain(|_, m| keep(m));
    }

    pub fn remove(&mut self, id: u64) -> Option<MemberRecord> {
        self.members.remove(&id)
    }

    /// MemberUpdate: new peer URLs; `None` for an unknown member.
    pub fn update_peers(&mut self, id: u64, peer_urls: Vec<String>) -> Option<MemberRecord> {
        let m = self.members.get_mut(&id)?;
        m.peer_urls = peer_urls;
        Some(m.clone())
    }

    pub fn get(&self, id: u64) -> Option<&MemberRecord> {
        self.members.get(&id)
    }

    pub fn all(&self) -> Vec<MemberRecord> {
        self.members.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rec(id: u64, name: &str, client: &[&str]) -> MemberRecord {
        MemberRecord {
            id,
            name: name.into(),
            peer_urls: vec![format!("http://127.0.0.1:{id}")],
            client_urls: client.iter().map(|s| s.to_string()).collect(),
            is_learner: false,
        }
    }

    #[test]
    fn publish_keeps_peer_urls_and_fills_name_and_clients() {
        let mut r = Registry::default();
        r.upsert(rec(1, "", &[]));
        let mut attrs = rec(1, "n1", &["http://127.0.0.1:2379"]);
        attrs.peer_urls = vec!["http://elsewhere:1".into()];
        let merged = r.publish(attrs).unwrap();
        assert_eq!(merged.name, "n1");
        assert_eq!(merged.peer_urls, vec!["http://127.0.0.1:1".to_string()]);
        assert_eq!(
            merged.client_urls,
            vec!["http://127.0.0.1:2379".to_string()]
        );
        assert_eq!(decode(&encode(&merged)), Some(merged));
        assert_eq!(
            r.publish(rec(2, "gone", &[])),
            None,
            "unknown members stay out"
        );
        assert!(r.get(2).is_none());
    }
}
