//! libFuzzer target: `gpu_ipc_fuzz::queue_memory` (docs/fuzzing.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpu_ipc_fuzz::queue_memory(data));
