//! Criterion micro-benchmarks of gpu-ipc live in `benches/`.
