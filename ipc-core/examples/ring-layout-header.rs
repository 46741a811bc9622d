//! Prints `kernels/cuda/gpu_ipc_ring_layout.cuh`, the ring's layout as kernels see it, from its Rust definitions
//! (`ipc_core::resident::cuda_header`). `scripts/gen-kernels.sh` runs it before it compiles the kernels; by hand:
//! `cargo run -p ipc-core --example ring-layout-header > kernels/cuda/gpu_ipc_ring_layout.cuh`.

fn main() {
    print!("{}", ipc_core::resident::cuda_header::render());
}
