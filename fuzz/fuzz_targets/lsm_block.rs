#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| engine::fuzzing::lsm_block(data));
