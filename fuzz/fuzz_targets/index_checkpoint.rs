#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| server::fuzzing::index_checkpoint(data));
