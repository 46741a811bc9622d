//! `gpu-ipc doctor`: tells a user whether CUDA IPC will work on this machine, and if not, why and what to do.
//!
//! The doctor gathers facts in two halves: [`system`] reads the machine without CUDA (kernel, namespaces, Yama,
//! `/dev/shm`, WSL, containers, MPS, the NVIDIA kernel module and device nodes); the CUDA half queries the driver and
//! each device's attributes, then runs an end-to-end self-test per backend. [`report`] holds the facts, derives
//! findings and a verdict from them with pure functions, and [`render`] prints the result as text or JSON and maps
//! the verdict to the exit code. `docs/doctor.md` explains every check and finding.

pub mod cuda;
pub mod render;
pub mod report;
pub mod selftest;
pub mod socket;
pub mod system;
