//! The `gpu-ipc` command line.

// Not called from `main` until the doctor subcommand is wired in; its tests use every item.
#[allow(dead_code)]
mod doctor;

fn main() {}
