#![no_main]

// Errors are the decoders doing their job; only a panic is a finding.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = engine::fuzzing::wal_segment(&engine::fuzzing::scratch_dir(), data);
});
