//! `etcdctl snapshot save` against metcd: the stream arrives whole, ends
//! with etcd's SHA-256 trailer over everything before it, holds metcd's
//! snapshot format, and no temporary file stays behind on the server.

use sha2::Digest;

use crate::etcd_peer::etcdctl;
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
    assert_eq!(&body[..8], b"METCDSNP");
    // The snapshot file's own length closes the body; the file's footer
    // checksum then verifies (engine::snapfile::read).
    let len = u64::from_le_bytes(body[body.len() - 8..].try_into().unwrap()) as usize;
    let snap = dir.path().join("extracted.snap");
    std::fs::write(&snap, &body[..len]).unwrap();
    let data = engine::snapfile::read(&snap).unwrap();
    assert!(data.entries.len() > 3000, "{} entries", data.entries.len());
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
