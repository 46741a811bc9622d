//! libFuzzer target: `gpu_ipc_fuzz::object_offers` (docs/fuzzing.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpu_ipc_fuzz::object_offers(data));
