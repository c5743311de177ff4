//! `etcdctl snapshot save` against metcd: the stream arrives whole, ends
//! with etcd's SHA-256 trailer over everything before it, holds an etcd
//! backend db that etcdctl reads (`snapshot status`, `snapshot restore`,
//! and etcd 3.4 serves it), and no temporary file stays behind on the
//! server; metcd restores etcd's backups too.

use sha2::Digest;

use crate::etcd_peer::{etcdctl, etcdctl_ok as ctl_ok, hashkv_at};
use crate::support::Server;

#[test]
fn etcdctl_snapshot_save_streams_a_verified_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("m"), &[]);
    let e = s.client_endpoint();
    for i in 0..2000 {
        if i % 500 == 0 {
            let out = etcdctl(&e, &["put", &format!("k{i}"), &"x".repeat(1000)]);
            assert!(out.status.success());
        }
    }
    // Enough data for several 1 MiB chunks.
    let mut c = s.conn();
    for i in 0..3000 {
        let r = c
            .request("PUT", &format!("/bulk/{i:05}"), &vec![b'v'; 1000])
            .unwrap();
        assert_eq!(r.status, 204);
    }
    let file = dir.path().join("backup.db");
    let out = etcdctl(&e, &["snapshot", "save", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("Snapshot saved at"), "{printed}");
    let bytes = std::fs::read(&file).unwrap();
    assert!(bytes.len() > 3_000_000, "only {} bytes", bytes.len());
    let (body, trailer) = bytes.split_at(bytes.len() - 32);
    assert_eq!(trailer, &sha2::Sha256::digest(body)[..], "sha256 trailer");
    assert_eq!(
        body.len() % 512,
        0,
        "etcd's clients want whole 512-byte pages"
    );
    // etcdctl reads it as the bbolt db it is (its integrity check passes)
    // and counts what metcd holds; `metcd snapshot status` prints the
    // same line.
    let revision = json(&ctl_ok(&e, &["get", "k0", "-w", "json"]))["header"]["revision"]
        .as_i64()
        .unwrap();
    let theirs = ctl_ok(
        &e,
        &["snapshot", "status", file.to_str().unwrap(), "-w", "json"],
    );
    let figures = json(&theirs);
    assert_eq!(figures["revision"].as_i64(), Some(revision), "{theirs}");
    assert_eq!(figures["totalSize"].as_u64(), Some(body.len() as u64));
    assert!(figures["totalKey"].as_u64().unwrap() > 3004, "{theirs}");
    assert_eq!(metcd_status(&file, "json"), theirs);
    assert_eq!(
        metcd_status(&file, "table"),
        ctl_ok(
            &e,
            &["snapshot", "status", file.to_str().unwrap(), "-w", "table"]
        )
    );
    let leftovers: Vec<_> = std::fs::read_dir(s.data_dir.join("member/snap"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("backup-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "backup files left on the server: {leftovers:?}"
    );
}

/// `metcd snapshot status <backup> -w <format>`'s output.
fn metcd_status(backup: &std::path::Path, format: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_metcd"))
        .args(["snapshot", "status", backup.to_str().unwrap(), "-w", format])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// `metcd snapshot restore <backup> --data-dir <dir> [...]`.
fn restore(backup: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_metcd"))
        .arg("snapshot")
        .arg("restore")
        .arg(backup)
        .args(args)
        .output()
        .unwrap()
}

/// The backup/restore procedure of seed 001 (`etcdctl snapshot save`,
/// then a restore into a fresh data dir): keys with their revisions and
/// history (HashKV equal), leases, users come back; the membership is the
/// new flags' (the old member is gone); the engine may change; revisions
/// continue; an existing dir or a damaged backup is refused and leaves
/// nothing behind; the restored member survives kill -9.
#[test]
fn a_backup_restores_into_a_new_member() {
    let dir = tempfile::tempdir().unwrap();
    let old_peer = "http://127.0.0.9:2399";
    let s = Server::start(
        &dir.path().join("old"),
        &[
            "--engine",
            "btree",
            "--initial-advertise-peer-urls",
            old_peer,
        ],
    );
    let e = s.client_endpoint();
    ctl_ok(&e, &["put", "foo", "v1"]);
    ctl_ok(&e, &["put", "foo", "v2"]);
    ctl_ok(&e, &["put", "bar", "x"]);
    ctl_ok(&e, &["del", "bar"]);
    let lease = json(&ctl_ok(&e, &["lease", "grant", "600", "-w", "json"]))["ID"]
        .as_i64()
        .unwrap();
    let lease_hex = format!("{lease:x}");
    ctl_ok(&e, &["put", "leased", "l", "--lease", &lease_hex]);
    ctl_ok(&e, &["user", "add", "alice:pw"]);
    let before = json(&ctl_ok(&e, &["get", "foo", "-w", "json"]));
    let revision = before["header"]["revision"].as_i64().unwrap();
    let hash_of = |ep: &str| hashkv_at(ep, revision);
    let old_hash = hash_of(&e);
    let backup = dir.path().join("backup.db");
    ctl_ok(&e, &["snapshot", "save", backup.to_str().unwrap()]);
    drop(s);

    // `metcd snapshot status`, etcdctl's figures for it.
    let figures = json(&metcd_status(&backup, "json"));
    assert_eq!(figures["revision"].as_i64(), Some(revision));
    assert_eq!(
        figures["totalSize"].as_u64(),
        Some(std::fs::metadata(&backup).unwrap().len() - 32)
    );
    assert!(figures["totalKey"].as_u64().unwrap() > 5, "{figures}");

    // A damaged backup is refused, and no data dir is left.
    let mut damaged = std::fs::read(&backup).unwrap();
    damaged[100] ^= 0xff;
    let bad = dir.path().join("bad.db");
    std::fs::write(&bad, &damaged).unwrap();
    let bad_dir = dir.path().join("from-bad");
    let out = restore(&bad, &["--data-dir", bad_dir.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("integrity check failed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!bad_dir.exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("restoring"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // A db without etcd's trailer (copied from a member's member/snap/db)
    // needs --skip-hash-check, as with etcdctl.
    let whole = std::fs::read(&backup).unwrap();
    let raw = dir.path().join("raw.db");
    std::fs::write(&raw, &whole[..whole.len() - 32]).unwrap();
    let raw_dir = dir.path().join("from-raw");
    let raw_args = ["--data-dir", raw_dir.to_str().unwrap()];
    assert!(!restore(&raw, &raw_args).status.success());
    let out = restore(&raw, &[&raw_args[..], &["--skip-hash-check"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(raw_dir.join("member").join("wal").is_dir());
    // What is no db at all is refused by status too.
    let cut = dir.path().join("cut.db");
    std::fs::write(&cut, &whole[..100]).unwrap();
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_metcd"))
        .args(["snapshot", "status", cut.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!status.status.success());

    let new_dir = dir.path().join("new");
    let args = ["--data-dir", new_dir.to_str().unwrap(), "--engine", "lsm"];
    let out = restore(&backup, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("revision {revision}")));
    let again = restore(&backup, &args);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));

    let mut s = Server::start(&new_dir, &["--engine", "lsm"]);
    let e = s.client_endpoint();
    let after = json(&ctl_ok(&e, &["get", "foo", "-w", "json"]));
    assert_eq!(after["kvs"], before["kvs"], "foo with its revisions");
    assert_eq!(after["header"]["revision"].as_i64(), Some(revision));
    assert_eq!(hash_of(&e), old_hash, "the same history");
    assert_eq!(ctl_ok(&e, &["get", "bar"]), "");
    assert!(ctl_ok(&e, &["lease", "list"]).contains(&lease_hex));
    let leased = json(&ctl_ok(&e, &["get", "leased", "-w", "json"]));
    assert_eq!(leased["kvs"][0]["lease"].as_i64(), Some(lease));
    assert!(ctl_ok(&e, &["user", "list"]).contains("alice"));
    // The new membership: this member alone, with the flags' peer URL.
    let members = ctl_ok(&e, &["member", "list"]);
    assert_eq!(members.lines().count(), 1, "{members}");
    assert!(
        members.contains("http://localhost:2380") && !members.contains(old_peer),
        "{members}"
    );
    // Revisions go on from the backup's.
    let put = json(&ctl_ok(&e, &["put", "next", "1", "-w", "json"]));
    assert_eq!(put["header"]["revision"].as_i64(), Some(revision + 1));

    s.restart();
    let e = s.client_endpoint();
    assert_eq!(ctl_ok(&e, &["get", "foo", "--print-value-only"]), "v2\n");
    assert_eq!(ctl_ok(&e, &["get", "next", "--print-value-only"]), "1\n");
}

/// A history with everything a backup carries: overwrites, a delete, a
/// compaction, a lease with a key, a user, a role. Answers the revision.
fn write_history(e: &str) -> i64 {
    ctl_ok(e, &["put", "foo", "v1"]);
    ctl_ok(e, &["put", "foo", "v2"]);
    ctl_ok(e, &["put", "bar", "x"]);
    ctl_ok(e, &["del", "bar"]);
    ctl_ok(e, &["put", "baz", "1"]);
    ctl_ok(e, &["compaction", "3"]);
    let lease = json(&ctl_ok(e, &["lease", "grant", "600", "-w", "json"]))["ID"]
        .as_i64()
        .unwrap();
    ctl_ok(e, &["put", "leased", "l", "--lease", &format!("{lease:x}")]);
    ctl_ok(e, &["role", "add", "reader"]);
    ctl_ok(e, &["user", "add", "alice:pw"]);
    ctl_ok(e, &["user", "grant-role", "alice", "reader"]);
    for i in 0..300 {
        ctl_ok(e, &["put", &format!("many/{i:03}"), &"m".repeat(i)]);
    }
    json(&ctl_ok(e, &["get", "foo", "-w", "json"]))["header"]["revision"]
        .as_i64()
        .unwrap()
}

/// What a user reads back after a restore: every key with its revisions,
/// the leases, users and roles.
fn observed(e: &str) -> (serde_json::Value, String, String, String, String) {
    let all = json(&ctl_ok(e, &["get", "", "--prefix", "-w", "json"]));
    let leases = ctl_ok(e, &["lease", "list"]);
    (
        all["kvs"].clone(),
        leases.lines().skip(1).collect::<Vec<_>>().join("\n"),
        ctl_ok(e, &["user", "list"]),
        ctl_ok(e, &["role", "list"]),
        ctl_ok(e, &["user", "get", "alice"]),
    )
}

/// Migration both ways: a metcd backup restored by `etcdctl snapshot
/// restore` is served by etcd 3.4 with the same keys, revisions, history
/// (HashKV), leases, users and roles; an etcd 3.4 backup restored by
/// `metcd snapshot restore` is served by metcd the same way.
#[test]
fn backups_move_between_metcd_and_etcd() {
    crate::etcd_peer::require_etcd();
    let dir = tempfile::tempdir().unwrap();

    let m = Server::start(&dir.path().join("metcd"), &[]);
    let revision = write_history(&m.client_endpoint());
    let metcd_view = observed(&m.client_endpoint());
    let metcd_hash = hashkv_at(&m.client_endpoint(), revision);
    let from_metcd = dir.path().join("from-metcd.db");
    ctl_ok(
        &m.client_endpoint(),
        &["snapshot", "save", from_metcd.to_str().unwrap()],
    );
    drop(m);
    let etcd =
        crate::etcd_peer::RealEtcd::restored_from(&dir.path().join("etcd-restored"), &from_metcd);
    assert_eq!(
        observed(&etcd.endpoint),
        metcd_view,
        "etcd serving metcd's backup"
    );
    assert_eq!(hashkv_at(&etcd.endpoint, revision), metcd_hash);
    let put = json(&ctl_ok(&etcd.endpoint, &["put", "next", "1", "-w", "json"]));
    assert_eq!(put["header"]["revision"].as_i64(), Some(revision + 1));
    drop(etcd);

    let etcd = crate::etcd_peer::RealEtcd::start(&dir.path().join("etcd"));
    let revision = write_history(&etcd.endpoint);
    let etcd_view = observed(&etcd.endpoint);
    let etcd_hash = hashkv_at(&etcd.endpoint, revision);
    let from_etcd = dir.path().join("from-etcd.db");
    ctl_ok(
        &etcd.endpoint,
        &["snapshot", "save", from_etcd.to_str().unwrap()],
    );
    // The same figures for etcd's own file from both tools.
    assert_eq!(
        metcd_status(&from_etcd, "json"),
        ctl_ok(
            &etcd.endpoint,
            &[
                "snapshot",
                "status",
                from_etcd.to_str().unwrap(),
                "-w",
                "json"
            ]
        )
    );
    drop(etcd);
    let data = dir.path().join("metcd-restored");
    let out = restore(&from_etcd, &["--data-dir", data.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = Server::start(&data, &[]);
    assert_eq!(
        observed(&m.client_endpoint()),
        etcd_view,
        "metcd serving etcd's backup"
    );
    assert_eq!(hashkv_at(&m.client_endpoint(), revision), etcd_hash);
    let put = json(&ctl_ok(
        &m.client_endpoint(),
        &["put", "next", "1", "-w", "json"],
    ));
    assert_eq!(put["header"]["revision"].as_i64(), Some(revision + 1));
}

/// Seed 001's restore procedure with etcd's own tool: `etcdctl snapshot
/// restore backup.db --data-dir X` (here with its defaults, which are
/// metcd's), then start the server on X. metcd builds its member from the
/// restored db (etcd's files kept as `member.etcd`) and serves the same
/// keys, history and users; a later start finds a metcd member. A running
/// etcd member's data dir is refused with the safe procedure instead.
#[test]
fn metcd_starts_on_what_etcdctl_snapshot_restore_wrote() {
    crate::etcd_peer::require_etcd();
    let dir = tempfile::tempdir().unwrap();
    let m = Server::start(&dir.path().join("old"), &[]);
    let revision = write_history(&m.client_endpoint());
    let view = observed(&m.client_endpoint());
    let hash = hashkv_at(&m.client_endpoint(), revision);
    let backup = dir.path().join("backup.db");
    ctl_ok(
        &m.client_endpoint(),
        &["snapshot", "save", backup.to_str().unwrap()],
    );
    drop(m);

    let restored = dir.path().join("restored");
    crate::etcd_peer::etcdctl_restore(&backup, &restored, &[]);
    let mut m = Server::start(&restored, &[]);
    assert!(
        m.log_text().contains("etcdctl snapshot restore"),
        "{}",
        m.log_text()
    );
    let kept = restored.join("member.etcd");
    assert!(kept.join("snap").join("db").exists());
    assert!(kept.join("adopted-by-metcd").exists());
    assert!(!dir.path().join("restored.adopting").exists());
    let e = m.client_endpoint();
    assert_eq!(observed(&e), view);
    assert_eq!(hashkv_at(&e, revision), hash);
    let members = ctl_ok(&e, &["member", "list"]);
    assert_eq!(members.lines().count(), 1, "{members}");
    assert!(
        members.contains("default, http://localhost:2380"),
        "{members}"
    );
    let put = json(&ctl_ok(&e, &["put", "next", "1", "-w", "json"]));
    assert_eq!(put["header"]["revision"].as_i64(), Some(revision + 1));
    m.restart();
    let e = m.client_endpoint();
    assert_eq!(ctl_ok(&e, &["get", "next", "--print-value-only"]), "1\n");
    assert_eq!(m.log_text().matches("etcdctl snapshot restore").count(), 1);
    drop(m);

    // A data dir a running etcd wrote: refused, and left as it was.
    let etcd = crate::etcd_peer::RealEtcd::start(&dir.path().join("etcd"));
    ctl_ok(&etcd.endpoint, &["put", "a", "1"]);
    let data = etcd.data_dir.clone();
    drop(etcd);
    let before: Vec<_> = std::fs::read_dir(data.join("member"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut refused = Server::start_unchecked(&data, &[]);
    let status = refused.wait_exit(std::time::Duration::from_secs(30));
    assert!(status.is_some_and(|s| !s.success()), "{status:?}");
    assert!(
        refused.log_text().contains("is an etcd member's data dir"),
        "{}",
        refused.log_text()
    );
    assert!(
        refused.log_text().contains("etcdctl snapshot save"),
        "{}",
        refused.log_text()
    );
    let after: Vec<_> = std::fs::read_dir(data.join("member"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(before, after);
    assert!(!data.join("member.etcd").exists());
}
