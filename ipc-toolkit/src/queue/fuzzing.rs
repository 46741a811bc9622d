//! The queue's host operations on memory a fuzzer chose (feature `fuzzing`): a worker reads the cells, counters and
//! records of memory every other worker can write, so a hostile or broken peer can leave anything there.

use super::host_ops::HostQueue;
use super::layout::{Geometry, header};
use super::ops::{PushFlags, PushRequest, stats_of};
use ipc_core::shm::SharedMemory;

/// Runs a script of queue operations on a small queue whose memory starts as `data`: bytes 0 to 2 pick the
/// capacity (2 to 16), record size (1 to 64) and worker slots (2 to 8), byte 3 the number of operations (up to
/// 15, three bytes each); the rest of `data` is the memory's first bytes.
///
/// # Panics
/// When an operation breaks its promise: a task whose record is longer than the record size, or more tasks than
/// asked for (an out-of-range index panics by itself).
pub fn queue_memory(data: &[u8]) {
    let [capacity, record, workers, ops, rest @ ..] = data else { return };
    let capacity = 2u64 << (capacity % 4);
    let record_bytes = 1 + u32::from(record % 64);
    let max_workers = 2 + u32::from(workers % 7);
    let Ok(g) = Geometry::new(capacity, record_bytes, max_workers) else { return };
    let script_len = usize::from(ops % 16) * 3;
    let (script, image) = rest.split_at(script_len.min(rest.len()));
    let Ok(len) = usize::try_from(g.total_bytes) else { return };
    let Ok(memory) = SharedMemory::create("gpu-ipc-fuzz-queue", len) else { return };
    let _ = memory.write_bytes(0, image.get(..image.len().min(len)).unwrap_or_default());
    let Ok(queue) = HostQueue::new(&memory, g) else { return };
    let payload = [0xa5u8; 64];
    let mut popped = Vec::new();
    for op in script.chunks_exact(3) {
        let (code, slot, arg) = (op[0] % 7, u16::from(op[1]) % max_workers as u16, op[2]);
        match code {
            0 => {
                let max = 1 + usize::from(arg % 4);
                let (tasks, _) = queue.pop(slot, max);
                assert!(tasks.len() <= max, "{} tasks popped of {max} asked for", tasks.len());
                for task in &tasks {
                    assert!(task.record.len() <= record_bytes as usize, "a record of {} bytes", task.record.len());
                }
                popped.extend(tasks.into_iter().map(|t| t.position));
            }
            1 => {
                let mut positions = std::mem::take(&mut popped);
                positions.push(u64::from(arg) << (arg % 48));
                assert_eq!(queue.complete(slot, &positions, arg % 2 == 0).len(), positions.len());
            }
            2 => {
                let reclaimed = queue.reclaim(0, slot, usize::from(arg % 4));
                assert!(reclaimed.stolen.len() <= usize::from(arg % 4));
                for task in &reclaimed.stolen {
                    assert!(task.record.len() <= record_bytes as usize, "a record of {} bytes", task.record.len());
                }
            }
            3 => {
                let len = usize::from(arg) % (record_bytes as usize + 1);
                let request = PushRequest { record: &payload[..len], id: None, attempt: u32::from(arg) };
                let flags = if arg % 2 == 0 { PushFlags::NEW } else { PushFlags::AGAIN };
                let outcomes = queue.push(slot, &[request, request], flags);
                assert!((1..=2).contains(&outcomes.len()), "{} outcomes of 2 pushes", outcomes.len());
            }
            4 => queue.close(),
            5 => {
                let stats = stats_of(&queue.snapshot(), &g);
                let _ = (stats.queued, stats.in_hand);
            }
            _ => {
                let _ = g.check_header(&queue.header());
                queue.add(header::REDELIVERED, u64::from(arg));
            }
        }
    }
}

/// Inputs for [`queue_memory`] that the queue's own operations made: a queue of 8 cells of 16-byte records and 4
/// worker slots, initialised, with tasks pushed, one of them leased, then scripts that pop, complete, reclaim,
/// push and close on it.
pub fn queue_memory_seeds() -> Vec<Vec<u8>> {
    // capacity 2 << 2 = 8, record 1 + 15 = 16 bytes, 2 + 2 = 4 worker slots.
    let (capacity, record, workers) = (2u8, 15u8, 2u8);
    let Ok(g) = Geometry::new(8, 16, 4) else { return Vec::new() };
    let Ok(len) = usize::try_from(g.total_bytes) else { return Vec::new() };
    let Ok(memory) = SharedMemory::create("gpu-ipc-fuzz-queue-seed", len) else { return Vec::new() };
    let Ok(queue) = HostQueue::new(&memory, g) else { return Vec::new() };
    queue.init();
    for (i, record) in [&b"first task"[..], b"second", b"third record 16b"].into_iter().enumerate() {
        let request = PushRequest { record, id: Some(100 + i as u64), attempt: 0 };
        let _ = queue.push(0, &[request], PushFlags::NEW);
    }
    let _ = queue.pop(1, 1);
    let mut image = vec![0u8; len];
    let _ = memory.read_bytes(0, &mut image);
    let scripts: [&[u8]; 4] = [
        &[],
        // pop 2 as worker 2, complete them, stats.
        &[0, 2, 1, 1, 2, 0, 5, 0, 0],
        // reclaim worker 1's lease, push, close, pop until closed, header check.
        &[2, 1, 3, 3, 1, 8, 4, 0, 0, 0, 3, 3, 6, 0, 1],
        // push 3 records of 16 bytes as worker 3, pop them, complete.
        &[3, 3, 16, 3, 3, 16, 3, 3, 16, 0, 2, 3, 1, 2, 0],
    ];
    scripts.iter().map(|s| [&[capacity, record, workers, (s.len() / 3) as u8][..], s, &image].concat()).collect()
}
