//! Criterion micro-benchmarks of what a weights reader does on the host before it makes a tensor (no GPU needed):
//! decoding and checking the manifest of the benchmark's mixture-of-experts shape (18,771 tensors, the shape of
//! `scripts/weightsbench/shapes.py`), and finding its runs (what `Reader.tensors` cuts one strided view each from).
//! On a GPU the same decode is part of `open()`'s `manifest_us` (tools/scripts/weights-cold.py), with the copy of the
//! manifest's bytes from device memory.

#![forbid(unsafe_code)]
#![allow(clippy::expect_used)]
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_ipc::weights::manifest::TENSOR_ALIGN;
use gpu_ipc::weights::{DType, Manifest, TensorDesc, TensorEntry, find_runs};
use gpu_ipc_driver::DeviceUuid;

/// The MoE's names and shapes: 48 layers x (7 + 128 experts x 3) tensors, the embedding, the norm and the head.
fn moe_shapes() -> Vec<(String, Vec<u64>)> {
    let (h, q, kv, experts, layers, vocab, mlp) = (2048, 4096, 512, 128, 48, 151_936, 256);
    let mut out = vec![("model.embed_tokens.weight".to_owned(), vec![vocab, h])];
    for i in 0..layers {
        let p = format!("model.layers.{i}.");
        for (n, s) in [
            ("self_attn.q_proj.weight", vec![q, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, q]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
            ("mlp.gate.weight", vec![experts, h]),
        ] {
            out.push((format!("{p}{n}"), s));
        }
        for e in 0..experts {
            for (n, s) in [("gate_proj", vec![mlp, h]), ("up_proj", vec![mlp, h]), ("down_proj", vec![h, mlp])] {
                out.push((format!("{p}mlp.experts.{e}.{n}.weight"), s));
            }
        }
    }
    out.push(("model.norm.weight".to_owned(), vec![h]));
    out.push(("lm_head.weight".to_owned(), vec![vocab, h]));
    out
}

/// The MoE's manifest as an owner lays it out (each tensor after the last, aligned), with checksums, encoded.
fn moe_manifest() -> (Vec<u8>, u64) {
    let shapes = moe_shapes();
    let descs: Vec<(String, TensorDesc)> =
        shapes.into_iter().map(|(n, s)| (n, TensorDesc::contiguous(DType::BF16, s).expect("shape"))).collect();
    let mut entries = Vec::with_capacity(descs.len());
    let probe: Vec<TensorEntry> = descs
        .iter()
        .map(|(n, d)| TensorEntry { name: n.clone(), desc: d.clone(), offset: 0, checksum: Some(0) })
        .collect();
    let mut offset = (Manifest::encoded_len("moe", &probe, true) as u64).next_multiple_of(TENSOR_ALIGN);
    for (name, desc) in descs {
        let bytes = desc.span_bytes();
        entries.push(TensorEntry { name, desc, offset, checksum: Some(offset) });
        offset = (offset + bytes).next_multiple_of(TENSOR_ALIGN);
    }
    let manifest = Manifest {
        set_name: "moe".into(),
        generation: 1,
        device_uuid: DeviceUuid([0; 16]),
        arena_bytes: offset,
        entries,
        parts: None,
    };
    (manifest.encode(), offset)
}

fn manifest(c: &mut Criterion) {
    let (bytes, arena) = moe_manifest();
    let decoded = Manifest::decode(&bytes, arena).expect("decode");
    assert_eq!(decoded.entries.len(), 18_771);
    c.bench_function("weights: decode and check an 18,771-tensor manifest (1.5 MB)", |b| {
        b.iter(|| black_box(Manifest::decode(black_box(&bytes), arena).expect("decode")));
    });
    c.bench_function("weights: find the runs of an 18,771-tensor manifest", |b| {
        b.iter(|| black_box(find_runs(black_box(&decoded.entries))));
    });
}

criterion_group!(benches, manifest);
criterion_main!(benches);
