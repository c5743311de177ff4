//! The routing table of several Raft groups in one member
//! (docs/groups.md): which group a key belongs to, and which groups a
//! range or a request touches.
//!
//! Owns the table's rules: group 0 (`default`) holds every key no prefix
//! claims; the longest matching prefix wins; names and prefixes are
//! validated once, here. Pure: no I/O, no runtime, no knowledge of Raft.
//! Must never: route one key to two groups, or call a range one group's
//! when it may hold keys of another.

use bytes::Bytes;

use crate::mvcc;

/// A group's number: 0 is `default`, the others count from 1 in table order.
pub type GroupId = u16;

/// The group every key no prefix claims belongs to.
pub const DEFAULT_GROUP: &str = "default";
/// At most this many groups, `default` included (a [`GroupSet`] is a bitmask).
pub const MAX_GROUPS: usize = 64;
const MAX_NAME_BYTES: usize = 32;

/// One configured group: its name and the key prefixes it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    pub name: String,
    pub prefixes: Vec<Bytes>,
}

impl GroupSpec {
    /// The flag form: `NAME=PREFIX[,PREFIX...]`.
    pub fn parse_flag(text: &str) -> Result<GroupSpec, TableError> {
        let (name, prefixes) = text
            .split_once('=')
            .ok_or_else(|| TableError::BadFlag(text.to_owned()))?;
        Ok(GroupSpec {
            name: name.to_owned(),
            prefixes: prefixes
                .split(',')
                .map(|p| Bytes::copy_from_slice(p.as_bytes()))
                .collect(),
        })
    }
}

/// What is wrong with a table, said so an operator can fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("--group {0:?}: expected NAME=PREFIX[,PREFIX...]")]
    BadFlag(String),
    #[error("group name {0:?}: 1 to 32 of a-z, 0-9, '_' and '-'")]
    BadName(String),
    #[error("group {0:?} is the group of every other key; it takes no prefixes")]
    DefaultNamed(String),
    #[error("group {0:?} is named twice")]
    DuplicateName(String),
    #[error("group {0:?} has no prefixes")]
    NoPrefixes(String),
    #[error("group {0:?} has an empty prefix (every key is already in group \"default\")")]
    EmptyPrefix(String),
    #[error("prefix {prefix:?} is given twice (groups {first:?} and {second:?})")]
    DuplicatePrefix {
        prefix: String,
        first: String,
        second: String,
    },
    #[error("{0} groups; at most {max} with \"default\"", max = MAX_GROUPS)]
    TooMany(usize),
}

/// A set of groups (bit i: group i).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupSet(u64);

impl GroupSet {
    pub fn one(id: GroupId) -> GroupSet {
        GroupSet(1 << id)
    }

    pub fn insert(&mut self, id: GroupId) {
        self.0 |= 1 << id;
    }

    pub fn union(self, other: GroupSet) -> GroupSet {
        GroupSet(self.0 | other.0)
    }

    pub fn contains(self, id: GroupId) -> bool {
        self.0 & (1 << id) != 0
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The only group, if there is exactly one.
    pub fn single(self) -> Option<GroupId> {
        (self.len() == 1).then(|| self.0.trailing_zeros() as GroupId)
    }

    pub fn iter(self) -> impl Iterator<Item = GroupId> {
        (0..MAX_GROUPS as GroupId).filter(move |id| self.contains(*id))
    }
}

/// The table: `default` and the configured groups.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RoutingTable {
    /// Group i + 1.
    groups: Vec<GroupSpec>,
    /// Every prefix with its group.
    prefixes: Vec<(Bytes, GroupId)>,
    /// Where the owner of a key may change, in key order: every prefix
    /// and the first key after its space.
    boundaries: Vec<Bytes>,
}

impl RoutingTable {
    /// The table of one group, `default`: today's etcd semantics.
    pub fn single() -> RoutingTable {
        RoutingTable::default()
    }

    /// Validates `groups` (docs/groups.md, "The table").
    pub fn new(groups: Vec<GroupSpec>) -> Result<RoutingTable, TableError> {
        if groups.len() + 1 > MAX_GROUPS {
            return Err(TableError::TooMany(groups.len() + 1));
        }
        let mut prefixes: Vec<(Bytes, GroupId)> = Vec::new();
        for (i, g) in groups.iter().enumerate() {
            let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-".contains(c);
            if g.name.is_empty() || g.name.len() > MAX_NAME_BYTES || !g.name.chars().all(valid) {
                return Err(TableError::BadName(g.name.clone()));
            }
            if g.name == DEFAULT_GROUP {
                return Err(TableError::DefaultNamed(g.name.clone()));
            }
            if groups[..i].iter().any(|o| o.name == g.name) {
                return Err(TableError::DuplicateName(g.name.clone()));
            }
            if g.prefixes.is_empty() {
                return Err(TableError::NoPrefixes(g.name.clone()));
            }
            for p in &g.prefixes {
                if p.is_empty() {
                    return Err(TableError::EmptyPrefix(g.name.clone()));
                }
                if let Some((_, other)) = prefixes.iter().find(|(q, _)| q == p) {
                    return Err(TableError::DuplicatePrefix {
                        prefix: String::from_utf8_lossy(p).into_owned(),
                        first: groups[*other as usize - 1].name.clone(),
                        second: g.name.clone(),
                    });
                }
                prefixes.push((p.clone(), i as GroupId + 1));
            }
        }
        let mut boundaries: Vec<Bytes> = prefixes
            .iter()
            .flat_map(|(p, _)| [Some(p.clone()), space_end(p)])
            .flatten()
            .collect();
        boundaries.sort();
        boundaries.dedup();
        Ok(RoutingTable {
            groups,
            prefixes,
            boundaries,
        })
    }

    /// Groups, `default` included.
    pub fn group_count(&self) -> usize {
        self.groups.len() + 1
    }

    /// Whether only `default` exists.
    pub fn is_single(&self) -> bool {
        self.groups.is_empty()
    }

    pub fn name(&self, id: GroupId) -> &str {
        match id {
            0 => DEFAULT_GROUP,
            i => self.groups.get(i as usize - 1).map_or("?", |g| &g.name),
        }
    }

    /// The group `key` belongs to: the longest prefix of it in the table,
    /// else `default`.
    pub fn group_of(&self, key: &[u8]) -> GroupId {
        let mut best: Option<(usize, GroupId)> = None;
        for (p, id) in &self.prefixes {
            if key.starts_with(p) && best.is_none_or(|(len, _)| p.len() > len) {
                best = Some((p.len(), *id));
            }
        }
        best.map_or(0, |(_, id)| id)
    }

    /// The groups `[key, range_end)` may hold keys of, with etcd's
    /// conventions: an empty `range_end` is the key alone, `"\0"` every key
    /// from `key` on. A range that holds no key (`range_end` ≤ `key`) is
    /// `key`'s group's, which answers it empty.
    pub fn groups_of_range(&self, key: &[u8], range_end: &[u8]) -> GroupSet {
        let mut set = GroupSet::one(self.group_of(key));
        let unbounded = range_end == b"\0";
        if range_end.is_empty() || (!unbounded && range_end <= key) {
            return set;
        }
        // The owner is the same from one boundary to the next, so the
        // owners in the range are `key`'s and those of the boundaries
        // inside it.
        let from = self.boundaries.partition_point(|b| b.as_ref() <= key);
        for b in &self.boundaries[from..] {
            if !unbounded && b.as_ref() >= range_end {
                break;
            }
            set.insert(self.group_of(b));
        }
        set
    }

    /// The groups a write or a Txn touches: every key range it reads or
    /// writes, as auth collects them (every compare and every op of both
    /// branches, nested Txns included). A compaction is group 0's (it
    /// names group 0's revision; docs/groups.md, "Compaction"), and so is
    /// a Txn that touches no key at all (etcd answers it with a header).
    pub fn groups_of_request(&self, req: &mvcc::Request) -> GroupSet {
        let mut ranges = Vec::new();
        crate::auth::kv_needs(req, &mut ranges);
        let set = (ranges.iter())
            .map(|r| self.groups_of_range(&r.key, &r.range_end))
            .fold(GroupSet::default(), GroupSet::union);
        if set.is_empty() {
            GroupSet::one(0)
        } else {
            set
        }
    }

    /// The groups' names, comma-separated, in group order: what a refusal
    /// names.
    pub fn describe(&self, set: GroupSet) -> String {
        set.iter()
            .map(|id| self.name(id))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The first key after every key starting with `prefix`, or None when no
/// key is (a prefix of 0xff bytes only).
fn space_end(prefix: &[u8]) -> Option<Bytes> {
    let keep = prefix.iter().rposition(|b| *b != 0xff)?;
    let mut end = prefix[..=keep].to_vec();
    end[keep] += 1;
    Some(Bytes::from(end))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn spec(name: &str, prefixes: &[&[u8]]) -> GroupSpec {
        GroupSpec {
            name: name.to_owned(),
            prefixes: prefixes.iter().map(|p| Bytes::copy_from_slice(p)).collect(),
        }
    }

    fn kubernetes() -> RoutingTable {
        RoutingTable::new(vec![
            spec("events", &[b"/registry/events/"]),
            spec("pods", &[b"/registry/pods/"]),
            spec("system-pods", &[b"/registry/pods/kube-system/"]),
        ])
        .unwrap()
    }

    #[test]
    fn keys_go_to_their_longest_prefix_and_the_rest_to_default() {
        let t = kubernetes();
        assert_eq!(t.group_of(b"/registry/events/default/e1"), 1);
        assert_eq!(t.group_of(b"/registry/pods/default/p"), 2);
        assert_eq!(t.group_of(b"/registry/pods/kube-system/dns"), 3);
        assert_eq!(t.group_of(b"/registry/pods/kube-systemx"), 2);
        assert_eq!(t.group_of(b"/registry/configmaps/c"), 0);
        assert_eq!(t.group_of(b"/registry/events"), 0);
        assert_eq!(t.group_of(b""), 0);
        assert_eq!(t.name(3), "system-pods");
        assert_eq!(t.name(0), "default");
        assert_eq!(RoutingTable::single().group_of(b"/registry/events/x"), 0);
    }

    #[test]
    fn ranges_touch_every_group_they_may_hold_keys_of() {
        let t = kubernetes();
        let names = |key: &[u8], end: &[u8]| t.describe(t.groups_of_range(key, end));
        // Kubernetes' LIST of one resource stays in its group.
        assert_eq!(names(b"/registry/events/", b"/registry/events0"), "events");
        assert_eq!(
            names(b"/registry/pods/", b"/registry/pods0"),
            "pods, system-pods"
        );
        assert_eq!(
            names(
                b"/registry/pods/kube-system/",
                b"/registry/pods/kube-system0"
            ),
            "system-pods"
        );
        // Every key, and every key from a point on.
        assert_eq!(names(b"\0", b"\0"), "default, events, pods, system-pods");
        assert_eq!(names(b"/registry/q", b"\0"), "default");
        // One key; an empty range.
        assert_eq!(names(b"/registry/events/x", b""), "events");
        assert_eq!(names(b"/registry/z", b"/registry/a"), "default");
        // A range that ends right at a prefix does not hold it.
        assert_eq!(names(b"/registry/a", b"/registry/events/"), "default");
        assert_eq!(
            names(b"/registry/a", b"/registry/events/\0"),
            "default, events"
        );
    }

    #[test]
    fn a_request_touches_every_part_of_it() {
        let t = kubernetes();
        let put = |k: &'static [u8]| {
            mvcc::RequestOp::Put(mvcc::PutRequest {
                key: Bytes::from_static(k),
                ..Default::default()
            })
        };
        let txn = mvcc::TxnRequest {
            compare: vec![mvcc::Compare {
                result: mvcc::CompareResult::Equal,
                target: mvcc::CompareTarget::Mod,
                key: Bytes::from_static(b"/registry/pods/default/p"),
                range_end: Bytes::new(),
                target_union: mvcc::TargetUnion::ModRevision(0),
            }],
            success: vec![put(b"/registry/pods/default/p")],
            failure: vec![mvcc::RequestOp::Txn(mvcc::TxnRequest {
                compare: Vec::new(),
                success: vec![put(b"/registry/events/e")],
                failure: Vec::new(),
            })],
        };
        let set = t.groups_of_request(&mvcc::Request::Txn(txn.clone()));
        assert_eq!(t.describe(set), "events, pods");
        assert_eq!(set.single(), None);
        // Kubernetes' optimistic update: compare and put of one key.
        let one = mvcc::TxnRequest {
            failure: Vec::new(),
            ..txn
        };
        assert_eq!(
            t.groups_of_request(&mvcc::Request::Txn(one)).single(),
            Some(2)
        );
        let compact = mvcc::Request::Compaction(mvcc::CompactionRequest::default());
        assert_eq!(t.groups_of_request(&compact).single(), Some(0));
        // A Txn of nothing (or of empty Txns) is group 0's, not nobody's.
        let empty = mvcc::TxnRequest {
            compare: Vec::new(),
            success: vec![mvcc::RequestOp::Txn(mvcc::TxnRequest {
                compare: Vec::new(),
                success: Vec::new(),
                failure: Vec::new(),
            })],
            failure: Vec::new(),
        };
        assert_eq!(
            t.groups_of_request(&mvcc::Request::Txn(empty)).single(),
            Some(0)
        );
    }

    #[test]
    fn bad_tables_are_refused_with_what_is_wrong() {
        let refused = |groups: Vec<GroupSpec>| RoutingTable::new(groups).unwrap_err().to_string();
        assert_eq!(
            refused(vec![spec("Events", &[b"/e/"])]),
            "group name \"Events\": 1 to 32 of a-z, 0-9, '_' and '-'"
        );
        assert!(refused(vec![spec("default", &[b"/e/"])]).contains("takes no prefixes"));
        assert_eq!(
            refused(vec![spec("a", &[b"/a/"]), spec("a", &[b"/b/"])]),
            "group \"a\" is named twice"
        );
        assert_eq!(refused(vec![spec("a", &[])]), "group \"a\" has no prefixes");
        assert!(refused(vec![spec("a", &[b""])]).contains("empty prefix"));
        assert_eq!(
            refused(vec![spec("a", &[b"/x/"]), spec("b", &[b"/y/", b"/x/"])]),
            "prefix \"/x/\" is given twice (groups \"a\" and \"b\")"
        );
        let many = (0..64).map(|i| spec(&format!("g{i}"), &[format!("/{i}/").as_bytes()]));
        assert!(refused(many.collect()).contains("at most 64"));
        assert_eq!(
            GroupSpec::parse_flag("events=/registry/events/,/e/").unwrap(),
            spec("events", &[b"/registry/events/", b"/e/"])
        );
        assert!(GroupSpec::parse_flag("events").is_err());
    }

    /// Keys of a small alphabet, so prefixes and ranges meet often.
    fn key() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(0xff)], 0..4)
    }

    fn table() -> impl Strategy<Value = RoutingTable> {
        proptest::collection::vec(proptest::collection::vec(key(), 1..3), 0..4).prop_filter_map(
            "a valid table",
            |groups| {
                let specs = groups
                    .into_iter()
                    .enumerate()
                    .map(|(i, prefixes)| GroupSpec {
                        name: format!("g{i}"),
                        prefixes: prefixes.into_iter().map(Bytes::from).collect(),
                    })
                    .collect();
                RoutingTable::new(specs).ok()
            },
        )
    }

    /// Every key of the alphabet up to `len` bytes, in order, with `c`:
    /// where the space of a prefix ending in `b` ends.
    fn all_keys(len: usize) -> Vec<Vec<u8>> {
        let mut keys = vec![Vec::new()];
        let mut last = vec![Vec::new()];
        for _ in 0..len {
            last = last
                .iter()
                .flat_map(|k: &Vec<u8>| {
                    [b'a', b'b', b'c', 0xff].map(|c| {
                        let mut k = k.clone();
                        k.push(c);
                        k
                    })
                })
                .collect();
            keys.extend(last.iter().cloned());
        }
        keys.sort();
        keys
    }

    proptest! {
        /// The groups of a range are exactly the groups of the keys in it
        /// (keys of up to 5 bytes: prefixes have at most 3, so every
        /// owner change shows within them).
        #[test]
        fn a_range_touches_exactly_the_groups_of_its_keys(
            t in table(),
            start in key(),
            end in key(),
            unbounded in any::<bool>(),
        ) {
            let end = if unbounded { vec![0] } else { end };
            let got = t.groups_of_range(&start, &end);
            let mut expected = GroupSet::one(t.group_of(&start));
            for k in all_keys(5) {
                let inside = k >= start && (unbounded || k < end);
                if inside && !end.is_empty() {
                    expected.insert(t.group_of(&k));
                }
            }
            prop_assert_eq!(got, expected);
        }
    }
}
