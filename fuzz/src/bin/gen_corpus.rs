//! Writes the seed corpus, `corpus/<target>/seed-NN`, from the encoders (`fuzz/src/lib.rs`, `seeds`): run by
//! hand after a wire change, `cargo run --release --bin gen-corpus` in `fuzz/` (scripts/fuzz.sh says when).
#![allow(clippy::expect_used)]

use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (target, seeds) in gpu_ipc_fuzz::seeds() {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).expect("the corpus folder");
        for entry in std::fs::read_dir(&dir).expect("the corpus folder").flatten() {
            if entry.file_name().to_string_lossy().starts_with("seed-") {
                std::fs::remove_file(entry.path()).expect("an old seed removed");
            }
        }
        for (i, seed) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), seed).expect("a seed written");
        }
        println!("{target}: {} seeds, {} bytes", seeds.len(), seeds.iter().map(Vec::len).sum::<usize>());
    }
}
