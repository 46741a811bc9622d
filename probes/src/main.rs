//! The `gpu-ipc` command line.
fn main() {}
