//! A weight set in two parts (one socket), legacy and vmm: the owner publishes 3 generations of 40 tensors spread
//! over the parts while a reader process (this test binary again, selected by `GPU_IPC_WEIGHTS_PARTS_CHILD`) opens
//! the set with each part on the device whose UUID its manifest names, checks every tensor's bytes and device for
//! each generation, and reports. With two GPUs the parts lie on cuda:0 and cuda:1 (the `two_gpus` tests); on one GPU
//! both parts lie on cuda:0, which runs the same protocol (two pools, two attaches, one generation on every part)
//! on the one device a machine of one GPU has.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::socket;
use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::driver::{Context, Device};
use gpu_ipc::legacy::Legacy;
use gpu_ipc::pool::PoolError;
use gpu_ipc::vmm::Vmm;
use gpu_ipc::weights::{ArenaBytes, DType, TensorDesc, WeightsOptions, WeightsPartsOwner, WeightsPartsReader};

const ROLE: &str = "GPU_IPC_WEIGHTS_PARTS_CHILD";
const SOCKET: &str = "GPU_IPC_WEIGHTS_PARTS_SOCKET";
/// Each part's device ordinal in the owner, comma-separated (the reader checks the UUIDs its manifests name).
const ORDINALS: &str = "GPU_IPC_WEIGHTS_PARTS_ORDINALS";

/// 40 tensors, tensor i on device i % 2.
fn tensors() -> Vec<(String, TensorDesc, usize)> {
    (0..40u64)
        .map(|i| (format!("layers.{i}.w"), TensorDesc::contiguous(DType::BF16, [64, 8 + i]).unwrap(), i as usize % 2))
        .collect()
}

fn pattern(generation: u64, index: usize, len: u64) -> Vec<u8> {
    (0..len).map(|k| (generation as u8).wrapping_mul(13) ^ (index as u8) ^ (k as u8)).collect()
}

/// The context of the device with `uuid` in this process.
fn context_for(uuid: gpu_ipc::driver::DeviceUuid) -> Result<Context, PoolError> {
    let device = Device::with_uuid(uuid).map_err(|e| PoolError::Unsupported(e.to_string()))?;
    let device = device.ok_or_else(|| PoolError::Unsupported(format!("no device {uuid} in this process")))?;
    Context::for_ordinal(device.ordinal()).map_err(|e| PoolError::Unsupported(e.to_string()))
}

fn read_generations<B: ArenaBytes + GpuBackend<Context = Context>>(path: &std::path::Path, ordinals: &[i32]) {
    let mut reader = WeightsPartsReader::<B>::open(path, "model", context_for, Duration::from_secs(20)).unwrap();
    let devices: Vec<_> = ordinals.iter().map(|&o| Device::get(o).unwrap().uuid().unwrap()).collect();
    for generation in 1..=3u64 {
        reader.wait_for(generation, Some(Duration::from_secs(20))).unwrap();
        reader.refresh().unwrap();
        let held = reader.held();
        for (k, part) in held.parts().iter().enumerate() {
            assert_eq!(part.manifest().device_uuid, devices[k], "part {k} on cuda:{}", ordinals[k]);
        }
        for (i, (name, desc, device)) in tensors().iter().enumerate() {
            let (part, _) = held.entry(name).unwrap();
            assert_eq!(part, *device);
            let mut bytes = vec![0u8; desc.span_bytes() as usize];
            held.read(name, &mut bytes).unwrap();
            assert_eq!(bytes, pattern(held.generation(), i, desc.span_bytes()), "{name}");
        }
        println!("CHECKED generation={}", held.generation());
    }
}

#[test]
#[ignore = "child-process entry point; run by the two-GPU tests, not on its own"]
fn child_process_entry_point() {
    let Ok(backend) = std::env::var(ROLE) else { return };
    let path = std::path::PathBuf::from(std::env::var(SOCKET).unwrap());
    let ordinals: Vec<i32> = std::env::var(ORDINALS).unwrap().split(',').map(|o| o.parse().unwrap()).collect();
    match backend.as_str() {
        "legacy" => read_generations::<Legacy>(&path, &ordinals),
        _ => read_generations::<Vmm>(&path, &ordinals),
    }
}

/// Serves the set with part k on cuda:`ordinals[k]` and checks that a reader process reads 3 generations whole.
fn publish_to_a_reader_process<B: ArenaBytes + GpuBackend<Context = Context>>(backend: &str, ordinals: [i32; 2]) {
    let count = Device::count().unwrap();
    let needs = ordinals.iter().max().unwrap() + 1;
    assert!(count >= needs, "this test needs {needs} GPU(s); this machine has {count}");
    let contexts: Vec<Context> = ordinals.iter().map(|&o| Context::for_ordinal(o).unwrap()).collect();
    let path = socket(&format!("weights-parts-{backend}-{}{}", ordinals[0], ordinals[1]));
    let mut owner =
        WeightsPartsOwner::<B>::create(contexts, &path, "model", tensors(), WeightsOptions::default()).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
        .env(ROLE, backend)
        .env(SOCKET, &path)
        .env(ORDINALS, ordinals.map(|o| o.to_string()).join(","))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    for generation in 1..=3u64 {
        let data: Vec<(String, Vec<u8>)> = tensors()
            .into_iter()
            .enumerate()
            .map(|(i, (n, d, _))| (n, pattern(generation, i, d.span_bytes())))
            .collect();
        let refs: Vec<(&str, &[u8])> = data.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
        assert_eq!(owner.update(&refs).unwrap(), generation);
        let mut line = String::new();
        while !line.contains("CHECKED") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the reader ended before checking generation {generation}");
        }
        assert!(line.contains(&format!("generation={generation}")), "{line}");
    }
    let _ = child.stdin.take().map(|mut s| s.flush());
    assert!(child.wait().unwrap().success());
}

/// Tests that need two GPUs (scripts/gpu-suite.sh runs the `two_gpus` modules where it finds two).
mod two_gpus {
    use super::*;

    #[test]
    #[ignore = "needs two CUDA GPUs: a weight set with a part on cuda:0 and one on cuda:1"]
    fn a_set_on_two_gpus_is_read_by_another_process_each_tensor_on_its_device_legacy() {
        publish_to_a_reader_process::<Legacy>("legacy", [0, 1]);
    }

    #[test]
    #[ignore = "needs two CUDA GPUs: a weight set with a part on cuda:0 and one on cuda:1"]
    fn a_set_on_two_gpus_is_read_by_another_process_each_tensor_on_its_device_vmm() {
        publish_to_a_reader_process::<Vmm>("vmm", [0, 1]);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: a weight set in two parts, both on cuda:0"]
fn a_set_in_two_parts_on_one_gpu_is_read_by_another_process_legacy() {
    publish_to_a_reader_process::<Legacy>("legacy", [0, 0]);
}

#[test]
#[ignore = "needs a CUDA GPU: a weight set in two parts, both on cuda:0"]
fn a_set_in_two_parts_on_one_gpu_is_read_by_another_process_vmm() {
    publish_to_a_reader_process::<Vmm>("vmm", [0, 0]);
}
