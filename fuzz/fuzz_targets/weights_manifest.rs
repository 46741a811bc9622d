//! libFuzzer target: `gpu_ipc_fuzz::weights_manifest` (docs/fuzzing.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpu_ipc_fuzz::weights_manifest(data));
