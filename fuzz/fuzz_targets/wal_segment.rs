#![no_main]

use std::sync::OnceLock;

static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let root = DIR.get_or_init(|| tempfile::tempdir().expect("a scratch directory"));
    let dir = root.path().join("case");
    let _ = std::fs::remove_dir_all(&dir);
    // Errors are the decoders doing their job; only a panic is a finding.
    let _ = engine::fuzzing::wal_segment(&dir, data);
});
