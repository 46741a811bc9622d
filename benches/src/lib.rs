//! Criterion micro-benchmarks of gpu-ipc live in `benches/`.

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.
