//! The stream-ordered wait of a weight set in parts, on one GPU (both parts on cuda:0), legacy and vmm: a reader
//! process (this test binary again, selected by `GPU_IPC_WEIGHTS_PARTS_WAIT_CHILD`) queues on a stream of cuda:0 a
//! wait for generation 2 (`WeightsPartsReader::wait_on`) and a copy of the status word after it; the owner here
//! publishes generation 2, or is dropped; the reader's `stream.synchronize()` returns, the copy says what released
//! the stream and `wait_status` says `Published`, or `OwnerGone`. Ignored without a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::driver::{Context, DeviceBuffer, DeviceMemory, Stream};
use gpu_ipc::weights::{DType, GONE_BIT, TensorDesc, WeightsOptions, WeightsPartsOwner, WeightsPartsReader};
use gpu_ipc::{BackendKind, GpuBackendVisitor};

/// `BACKEND:SOCKET` in the reader process's environment.
const CHILD: &str = "GPU_IPC_WEIGHTS_PARTS_WAIT_CHILD";

/// Four tensors, alternately on part 0 and part 1.
fn tensors() -> Vec<(String, TensorDesc, usize)> {
    let desc = TensorDesc::contiguous(DType::F32, [64, 16]).unwrap();
    ["embed", "layers.0.w", "layers.1.w", "head"]
        .iter()
        .enumerate()
        .map(|(i, n)| ((*n).into(), desc.clone(), i % 2))
        .collect()
}

/// Publishes `generation`, every byte of every tensor equal to it.
fn update<B: GpuBackend>(owner: &mut WeightsPartsOwner<B>, generation: u64) {
    let bytes = vec![generation as u8; 64 * 16 * 4];
    let all: Vec<(String, TensorDesc, usize)> = tensors();
    let refs: Vec<(&str, &[u8])> = all.iter().map(|(n, _, _)| (n.as_str(), bytes.as_slice())).collect();
    assert_eq!(owner.update(&refs).unwrap(), generation);
}

/// The reader process: every part on cuda:0's context; a stream of cuda:0 waits for generation 2.
struct WaitForGeneration2(PathBuf);

impl GpuBackendVisitor for WaitForGeneration2 {
    type Output = ();
    fn visit<B: GpuBackend>(self) {
        let ctx = Context::for_ordinal(0).unwrap();
        let reader = WeightsPartsReader::<B>::open(&self.0, "model", |_| Ok(ctx.clone()), Duration::from_secs(20));
        let reader = reader.unwrap();
        assert_eq!((reader.part_count(), reader.generation()), (2, 1));
        let stream = Stream::new(&ctx).unwrap();
        let snapshot = DeviceBuffer::alloc(&ctx, 8).unwrap();
        let wait = reader.wait_on(2, &stream).unwrap();
        reader.copy_status_on(&stream, &wait, &snapshot.span()).unwrap();
        println!("QUEUED");
        std::thread::sleep(Duration::from_millis(100));
        assert!(!stream.is_idle().unwrap(), "the stream did not wait for generation 2");
        // Never wait for good: a stream still held 10 s after the owner's move is reported (what the CPU sees of the
        // word says whether the gate marked it or the device did not see the mark).
        let started = Instant::now();
        while !stream.is_idle().unwrap() {
            if started.elapsed() > Duration::from_secs(10) {
                println!("STUCK cpu_word={:#x} status={:?}", wait.word().load(), reader.wait_status(&wait));
                std::process::exit(3);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        stream.synchronize().unwrap();
        let mut word = [0u64; 1];
        snapshot.span().read(0, &mut word).unwrap();
        println!("RELEASED gpu_word={} status={:?}", word[0], reader.wait_status(&wait));
    }
}

#[test]
#[ignore = "child-process entry point; run by the GPU tests of this file, not on its own"]
fn child_process_entry_point() {
    let Ok(role) = std::env::var(CHILD) else { return };
    let (backend, socket) = role.split_once(':').unwrap();
    gpu_ipc::dispatch_gpu(backend.parse().unwrap(), WaitForGeneration2(socket.into())).unwrap();
}

/// The line of `out` that says `tag`, from `tag` on (the reader must print it within a minute). The child's first
/// line follows libtest's "test child_process_entry_point ... " on the same line, so a tag is looked for anywhere.
fn line_of(out: &mut BufReader<ChildStdout>, tag: &str) -> String {
    let started = Instant::now();
    let mut line = String::new();
    loop {
        assert!(!line.contains("STUCK"), "the reader's stream was not released: {}", line.trim());
        if let Some(at) = line.find(tag) {
            return line[at..].trim().to_owned();
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no {tag} line from the reader");
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the reader ended before its {tag} line");
    }
}

#[derive(Clone, Copy)]
enum Ending {
    /// Publishes generation 2.
    Publication,
    /// Goes away (dropped: every part closed).
    OwnerDropped,
}

/// An owner of a set in two parts on cuda:0 with generation 1 published; a reader process whose stream waits for
/// generation 2; then the ending, and what the reader saw.
struct Scenario(Ending, &'static str);

impl GpuBackendVisitor for Scenario {
    type Output = ();
    fn visit<B: GpuBackend>(self) {
        let Scenario(ending, backend) = self;
        let contexts = vec![Context::for_ordinal(0).unwrap(), Context::for_ordinal(0).unwrap()];
        let path = common::socket(&format!("weights-parts-wait-{backend}"));
        let owner = WeightsPartsOwner::<B>::create(contexts, &path, "model", tensors(), WeightsOptions::default());
        let mut owner = owner.unwrap();
        update(&mut owner, 1);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD, format!("{backend}:{}", path.display()))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        line_of(&mut out, "QUEUED");
        std::thread::sleep(Duration::from_millis(500));
        let ended = Instant::now();
        let expected = match ending {
            Ending::Publication => {
                update(&mut owner, 2);
                "RELEASED gpu_word=2 status=Published { newest: 2 }".to_owned()
            }
            Ending::OwnerDropped => {
                // Dropped on a thread: a drop that blocks fails the test instead of hanging it.
                let (done, dropped) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    drop(owner);
                    let _ = done.send(());
                });
                dropped.recv_timeout(Duration::from_secs(10)).expect("dropping the owner did not return within 10 s");
                eprintln!("{backend}: the owner dropped in {:?}", ended.elapsed());
                format!("RELEASED gpu_word={} status=OwnerGone {{ newest: 1 }}", GONE_BIT | 1)
            }
        };
        assert_eq!(line_of(&mut out, "RELEASED"), expected, "{backend}");
        let after = ended.elapsed();
        assert!(after < Duration::from_secs(1), "{backend}: the stream was released {after:?} after the ending");
        assert!(child.wait().unwrap().success(), "{backend}: the reader process failed");
    }
}

fn on_both_backends(ending: Ending) {
    for backend in common::BACKENDS {
        let kind: BackendKind = backend.parse().unwrap();
        gpu_ipc::dispatch_gpu(kind, Scenario(ending, backend)).unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stream_wait_on_a_set_of_parts_is_released_by_the_publication() {
    on_both_backends(Ending::Publication);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stream_wait_on_a_set_of_parts_is_released_as_gone_when_the_owner_is_dropped() {
    on_both_backends(Ending::OwnerDropped);
}
