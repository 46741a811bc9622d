//! The work queue on a real GPU, between processes (the `work_queue` example program), for both backends: tasks
//! pushed from a kernel and popped by kernels of two other processes; pushed from the CPU and popped by a kernel
//! and by the CPU; a worker SIGKILLed while its kernel pops (its tasks handed out again, none lost, none completed
//! twice); a worker SIGKILLed while it provably holds tasks it popped (every one handed out again: the GPU reclaim
//! path); the CPU side and the demo kernels in one process; and the tasks-per-second bench (one process on its own
//! queue, 1 and 4 worker processes), whose rows are printed and (with `GPU_IPC_RESULTS_DIR` set) appended to
//! `work-queue-<GPU_IPC_RESULTS_TAG>.jsonl` there. Ignored without a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use common::{Proc, field, work_queue};
use gpu_ipc::kernels::work_queue::DemoSums;

const BACKENDS: [&str; 2] = ["legacy", "vmm"];
const FINISH: Duration = Duration::from_secs(120);

fn sock(backend: &str, tag: &str) -> PathBuf {
    common::socket(&format!("gpu-wq-{backend}-{tag}"))
}

fn count(json: &serde_json::Value, key: &str) -> u64 {
    field(json, key).as_u64().unwrap_or_else(|| panic!("{key} is not a number in {json}"))
}

fn sums(json: &serde_json::Value) -> DemoSums {
    serde_json::from_value(field(json, "sums").clone()).unwrap()
}

fn owner(backend: &str, path: &str, tasks: u64, workers: usize, extra: &[&str]) -> Proc {
    let (tasks, workers) = (tasks.to_string(), workers.to_string());
    let args: Vec<&str> = ["owner", "--socket", path, "--tasks", &tasks, "--workers", &workers]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let p = work_queue("owner", backend, &args);
    p.wait_for_line("serving", Duration::from_secs(60));
    p
}

fn worker(name: &str, backend: &str, path: &str, extra: &[&str]) -> Proc {
    let args: Vec<&str> =
        ["worker", "--socket", path, "--name", name].into_iter().chain(extra.iter().copied()).collect();
    work_queue(name, backend, &args)
}

/// Finishes the owner and the workers; checks that every task was completed once and the workers' tasks add up.
fn every_task_once(backend: &str, owner: Proc, workers: Vec<Proc>, tasks: u64) {
    let (status, _, json) = owner.finish(FINISH);
    assert!(status.success(), "{backend} owner: {json}");
    let stats = field(&json, "stats");
    assert_eq!((count(stats, "completed"), count(stats, "lost")), (tasks, 0), "{backend}: {json}");
    let mut total = DemoSums::default();
    for w in workers {
        let (status, _, json) = w.finish(FINISH);
        assert!(status.success(), "{backend} worker: {json}");
        assert_eq!(count(&json, "bad_records"), 0, "{backend}: {json}");
        total = total.merge(sums(&json));
    }
    assert_eq!(total, DemoSums::of_range(0, tasks), "{backend}: the workers' tasks are exactly those pushed");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tasks_pushed_by_a_kernel_are_popped_by_kernels_of_two_other_processes() {
    const TASKS: u64 = 500_000;
    for backend in BACKENDS {
        let path = sock(backend, "kernels");
        let p = path.to_str().unwrap();
        let owner = owner(backend, p, TASKS, 2, &["--push", "kernel", "--capacity", "65536"]);
        let workers = vec![
            worker("kernel-a", backend, p, &["--pop", "kernel"]),
            worker("kernel-b", backend, p, &["--pop", "kernel", "--work-rounds", "16"]),
        ];
        every_task_once(backend, owner, workers, TASKS);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tasks_pushed_from_the_cpu_are_popped_by_a_kernel_and_by_the_cpu() {
    // Without MPS the CPU worker's operations (a kernel launch per batch) wait for time slices beside the other
    // process's persistent kernel: a smaller run.
    const TASKS: u64 = 20_000;
    for backend in BACKENDS {
        let path = sock(backend, "mixed");
        let p = path.to_str().unwrap();
        let owner = owner(backend, p, TASKS, 2, &["--record-bytes", "64"]);
        let workers =
            vec![worker("kernel", backend, p, &["--pop", "kernel"]), worker("cpu", backend, p, &["--batch", "256"])];
        every_task_once(backend, owner, workers, TASKS);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_worker_killed_while_its_kernel_pops_loses_no_task() {
    const TASKS: u64 = 1_000_000;
    for backend in BACKENDS {
        let path = sock(backend, "kill");
        let p = path.to_str().unwrap();
        let owner = owner(backend, p, TASKS, 2, &["--push", "kernel", "--capacity", "65536", "--reclaim-ms", "500"]);
        // Slow work, so that both kernels are still popping when the victim dies.
        let survivor = worker("survivor", backend, p, &["--pop", "kernel", "--work-rounds", "2000"]);
        let mut victim = worker("victim", backend, p, &["--pop", "kernel", "--work-rounds", "2000", "--wait-go"]);
        victim.wait_for_line("ready", FINISH);
        victim.write_line("go");
        std::thread::sleep(Duration::from_millis(1500));
        victim.kill9();
        let (status, _, json) = owner.finish(FINISH);
        assert!(status.success(), "{backend} owner: {json}");
        let stats = field(&json, "stats");
        assert_eq!((count(stats, "completed"), count(stats, "lost")), (TASKS, 0), "{backend}: {json}");
        // Whether the victim still held tasks when it died depends on how far its kernel got while the driver tore
        // its context down (a killed process's kernel may finish the tasks in hand): what must hold either way is
        // the accounting above and that every task taken back went to the survivor.
        eprintln!("{backend}: redelivered after the kill: {}", count(stats, "redelivered"));
        let (status, _, json) = survivor.finish(FINISH);
        assert!(status.success(), "{backend} survivor: {json}");
        assert_eq!(count(&json, "bad_records"), 0, "{backend}: {json}");
        assert_eq!(count(&json, "redelivered"), count(stats, "redelivered"), "{backend}: the survivor took them all");
        victim.finish(FINISH);
    }
}

/// A victim that pops tasks in device memory (through the queue's own kernels), says it holds them, and is
/// SIGKILLed before completing any: the owner's GPU reclaim path must take every one of them back, and a kernel in
/// another process completes them.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_worker_killed_while_it_provably_holds_tasks_has_every_one_handed_out_again() {
    const TASKS: u64 = 1_000_000;
    const HELD: u64 = 8;
    for backend in BACKENDS {
        let path = sock(backend, "kill-held");
        let p = path.to_str().unwrap();
        // The owner starts pushing once one worker (the victim) is there; the queue holds 65,536, so it is still
        // pushing when the survivor joins.
        let owner = owner(backend, p, TASKS, 1, &["--push", "kernel", "--capacity", "65536", "--reclaim-ms", "200"]);
        // The victim first: it holds its tasks before the survivor starts, so a fast survivor cannot drain the
        // queue (and the owner close it) before the victim's first pop. The survivor then gets the victim's tasks
        // back from the owner's sweep.
        let held = HELD.to_string();
        let mut victim = worker("victim", backend, p, &["--stall-after", "0", "--hold", &held]);
        victim.wait_for_line(&format!("holding {HELD} tasks"), FINISH);
        let survivor = worker("survivor", backend, p, &["--pop", "kernel", "--work-rounds", "2000"]);
        victim.kill9();
        let (status, _, json) = owner.finish(FINISH);
        assert!(status.success(), "{backend} owner: {json}");
        let stats = field(&json, "stats");
        assert_eq!(
            (count(stats, "pushed"), count(stats, "completed"), count(stats, "lost")),
            (TASKS, TASKS, 0),
            "{backend}: {json}"
        );
        let redelivered = count(stats, "redelivered");
        assert!(redelivered >= HELD, "{backend}: the victim held {HELD}, {redelivered} were handed out again: {json}");
        let (status, _, json) = survivor.finish(FINISH);
        assert!(status.success(), "{backend} survivor: {json}");
        assert_eq!(count(&json, "bad_records"), 0, "{backend}: {json}");
        assert_eq!(count(&json, "redelivered"), redelivered, "{backend}: the survivor took them all");
        assert_eq!(sums(&json), DemoSums::of_range(0, TASKS), "{backend}: the survivor completed every task");
        victim.finish(FINISH);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kernels_popping_in_one_and_four_processes_against_one_process_on_its_own_queue() {
    for backend in BACKENDS {
        let (status, _, json) = work_queue("bench", backend, &["bench", "--tasks", "1000000", "--workers", "1,4"])
            .finish(Duration::from_secs(300));
        assert!(status.success(), "{backend} bench: {json}");
        let rows = field(&json, "rows").as_array().unwrap();
        let shape: Vec<(String, u64)> =
            rows.iter().map(|r| (field(r, "mode").as_str().unwrap().to_owned(), count(r, "workers"))).collect();
        assert_eq!(shape, [("local".into(), 1), ("processes".into(), 1), ("processes".into(), 4)], "{json}");
        for row in rows {
            assert_eq!(field(row, "ok"), true, "{backend}: {row}");
            assert!(field(row, "tasks_per_s").as_f64().unwrap() > 0.0, "{backend}: {row}");
            println!("work queue {backend}: {row}");
        }
        if let Ok(dir) = std::env::var("GPU_IPC_RESULTS_DIR") {
            let tag = std::env::var("GPU_IPC_RESULTS_TAG").unwrap_or_else(|_| "run".into());
            let path = PathBuf::from(dir).join(format!("work-queue-{tag}.jsonl"));
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
            writeln!(file, "{}", serde_json::json!({ "backend": backend, "rows": rows })).unwrap();
        }
    }
}

/// The CPU side on a GPU backend, in one process (the queue's own kernels do every operation; the owner alone, since
/// a legacy allocation cannot be imported by the process that exported it): pushes, a batch popped and completed,
/// a completion refused for a task completed already, the counters; then the demo kernels pushing and popping
/// through the owner's handle, and closing.
fn cpu_side_in_one_process<B: gpu_ipc::queue::QueueBackend>(ctx: &B::Context, gpu: &gpu_ipc_examples::work_queue::Gpu) {
    use gpu_ipc::queue::{QueueConfig, QueueError, WorkQueue};
    let t = Duration::from_secs(10);
    let path = sock(B::KIND.name(), "one-process");
    let queue = WorkQueue::<B>::create(ctx, &path, QueueConfig::new(64, 24)).unwrap();
    let ids: Vec<u64> = (0..3u8).map(|i| queue.push(&[i; 24], t).unwrap()).collect();
    assert_eq!(ids, [0, 1, 2]);
    let records: Vec<Vec<u8>> = (3..10u8).map(|i| vec![i; 8]).collect();
    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    assert_eq!(queue.try_push_many(&refs).unwrap(), (3..10).collect::<Vec<u64>>());
    assert!(matches!(queue.push(&[0; 25], t), Err(QueueError::RecordTooLarge { .. })));
    let mut got = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let task = queue.pop(t).unwrap();
        got.push((task.id(), task.record().to_vec()));
        tasks.push(task);
    }
    let expected: Vec<(u64, Vec<u8>)> =
        (0..10u8).map(|i| (u64::from(i), if i < 3 { vec![i; 24] } else { vec![i; 8] })).collect();
    assert_eq!(got, expected);
    queue.complete_many(tasks).unwrap();
    assert!(matches!(queue.pop(Duration::from_millis(50)), Err(QueueError::Timeout { .. })));
    let stats = queue.stats().unwrap();
    assert_eq!((stats.pushed, stats.popped, stats.completed, stats.in_hand, stats.queued), (10, 10, 10, 0, 0));
    // The demo kernels through the same handle: a kernel pushes into the 64 cells, nobody pops, so 64 go in.
    gpu.kernels.reset().unwrap();
    let (config, args) = gpu.kernels.producer_launch(100, 1000, 24, 256, Duration::from_millis(200)).unwrap();
    queue.launch(gpu.kernels.producer(), &gpu.stream, config, &args).unwrap();
    assert!(gpu.kernels.wait(&gpu.stream, t).unwrap());
    assert_eq!(gpu.kernels.producer_result().unwrap(), (64, 936));
    // Then a kernel pops them all, and the closed queue ends it.
    queue.close().unwrap();
    let (config, args) = gpu.kernels.worker_launch(1, 0, t);
    queue.launch(gpu.kernels.worker(), &gpu.stream, config, &args).unwrap();
    assert!(gpu.kernels.wait(&gpu.stream, t).unwrap());
    let result = gpu.kernels.worker_result().unwrap();
    assert_eq!(result.sums.count, 64, "{result:?}");
    assert_eq!((result.bad_records, result.lease_lost, result.timed_out_warps), (0, 0, 0), "{result:?}");
    assert!(matches!(queue.pop(Duration::from_millis(100)), Err(QueueError::Closed)));
    let stats = queue.wait_until_done(t).unwrap();
    assert_eq!((stats.pushed, stats.completed, stats.lost), (74, 74, 0));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_cpu_side_and_the_kernels_on_a_gpu_in_one_process() {
    let gpu = gpu_ipc_examples::work_queue::Gpu::open(0).unwrap();
    cpu_side_in_one_process::<gpu_ipc::legacy::Legacy>(&gpu.ctx, &gpu);
    cpu_side_in_one_process::<gpu_ipc::vmm::Vmm>(&gpu.ctx, &gpu);
}
