//! Criterion micro-benchmarks of gpu-ipc (in `benches/`) and what they share: criterion's settings and the GPU
//! benches' skip ([`harness`]), the helper processes of the cross-process benches ([`peer`]), the memory benches'
//! chain and launch arithmetic ([`memory`]), and the Markdown summary of a run ([`report`], printed by the
//! `bench-summary` binary). Order statistics are the measurement tooling's one type,
//! `harness::stats::Distribution`. See docs/benchmarks.md, "Micro-benchmarks".

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

pub mod harness;
pub mod memory;
pub mod peer;
pub mod report;
