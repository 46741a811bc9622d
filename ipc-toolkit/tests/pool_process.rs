//! The memory pool between real processes on the host backend: importer children started from this very test
//! binary (`GPU_IPC_POOL_CHILD` selects the role) attach to an owner in the test process.
//!
//! - Churn: the owner allocates and frees 100,000 times while 4 importers look buffers up, write their own quarter
//!   of each and check every word: a word of another generation would mean bytes reused under a view or two live
//!   buffers overlapping. Stale handles are refused on both sides, and nothing leaks.
//! - An importer SIGKILLed while it pins a freed buffer: its pins are dropped and the bytes reused within a second.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

use ipc_core::host::{Host, HostContext};
use ipc_toolkit::pool::{AttachOptions, BufferHandle, BufferView, PoolConfig, PoolError, PoolImporter, SharedPool};

const ROLE: &str = "GPU_IPC_POOL_CHILD";
const SOCKET: &str = "GPU_IPC_POOL_SOCKET";
const WRITER: &str = "GPU_IPC_POOL_WRITER";
/// Allocations and frees the owner makes in the churn test.
const CHURN_OPS: u64 = 100_000;
/// Names the churn draws from.
const NAMES: u64 = 64;
const IMPORTERS: u64 = 4;
const STOP: &str = "stop";

fn sock(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-pool-process-{}-{name}.sock", std::process::id()))
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// xorshift64: the same sequence on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A word of a buffer as its writer leaves it: the generation, and who wrote it (0 the owner, `k` importer `k`,
/// which writes only quarter `k - 1`).
fn word(generation: u64, writer: u64) -> [u8; 8] {
    (generation << 8 | writer).to_le_bytes()
}

/// Who writes a buffer's first word: the owner, last, once the rest is written (so an importer that looks a
/// buffer up before its owner filled it sees it is not ready, rather than bytes of a buffer freed before).
const READY: u64 = 0xfe;

fn fill(generation: u64, writer: u64, len: usize) -> Vec<u8> {
    word(generation, writer).iter().copied().cycle().take(len).collect()
}

/// The owner's initial content of a new buffer: its words, then the ready word, with a fence between.
fn initialise(handle: &BufferHandle<Host>) {
    let len = handle.len() as usize;
    handle.write(8, &fill(handle.generation(), 0, len - 8)).unwrap();
    fence(Ordering::Release);
    handle.write(0, &word(handle.generation(), READY)).unwrap();
}

/// Checks every word of a buffer's bytes: the ready word, then each word's generation and a writer allowed in its
/// quarter.
fn check(bytes: &[u8], generation: u64) -> Result<(), String> {
    let quarter = bytes.len() / 4;
    for (i, chunk) in bytes.chunks_exact(8).enumerate() {
        let value = u64::from_le_bytes(chunk.try_into().unwrap());
        let (found, writer) = (value >> 8, value & 0xff);
        let allowed = if i == 0 { READY } else { (i * 8 / quarter) as u64 + 1 };
        let writer_ok = writer == allowed || (i > 0 && writer == 0);
        if found != generation || !writer_ok {
            return Err(format!("word {i} is {value:#x}: generation {found} writer {writer}, expected {generation}"));
        }
    }
    Ok(())
}

/// Whether the owner has finished filling the buffer behind `view` (then an acquire fence orders what follows).
fn ready(view: &BufferView<Host>) -> bool {
    let mut first = [0u8; 8];
    view.read(0, &mut first).unwrap();
    let ready = first == word(view.generation(), READY);
    fence(Ordering::Acquire);
    ready
}

fn spawn_child(role: &str, path: &Path, writer: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(SOCKET, path)
        .env(WRITER, writer.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The value of `key=` in a child's result line.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace().find_map(|kv| kv.strip_prefix(&format!("{key}="))).unwrap().parse().unwrap()
}

/// Not a test of its own: the body of the child processes the other tests start. Without the role variable (a
/// plain `--ignored` run) it does nothing.
#[test]
#[ignore = "child-process entry point; run by the cross-process tests, not on its own"]
fn child_process_entry_point() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let path = PathBuf::from(std::env::var(SOCKET).unwrap());
    let writer: u64 = std::env::var(WRITER).unwrap().parse().unwrap();
    let options = AttachOptions { name: format!("{role}-{writer}"), timeout: Duration::from_secs(10) };
    let pool = PoolImporter::<Host>::attach(&HostContext, &path, &options).unwrap();
    match role.as_str() {
        "churn" => churn_importer(&pool, writer),
        "pinner" => {
            let view = pool.lookup("victim").unwrap();
            println!("PINNED pins={}", view.pins());
            std::thread::sleep(Duration::from_secs(60));
        }
        other => panic!("unknown role {other}"),
    }
}

/// Looks up random names until the owner allocates [`STOP`]: checks every word, writes its own quarter, checks
/// again, and keeps some views a while to see them go stale.
fn churn_importer(pool: &PoolImporter<Host>, writer: u64) {
    let mut rng = Rng(0x5151_0000 + writer);
    let mut held: Vec<BufferView<Host>> = Vec::new();
    let (mut lookups, mut not_found, mut not_ready, mut stale, mut bytes_checked) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let read_check = |view: &BufferView<Host>| {
        if !ready(view) {
            return 0;
        }
        let mut bytes = vec![0u8; view.len() as usize];
        view.read(0, &mut bytes).unwrap();
        check(&bytes, view.generation()).unwrap_or_else(|e| panic!("importer {writer}, `{}`: {e}", view.name()));
        bytes.len() as u64
    };
    for round in 0u64.. {
        if pool.lookup(STOP).is_ok() {
            break;
        }
        if round.is_multiple_of(8) {
            // Leave the owner some of the two CI cores: its churn is what the test counts.
            std::thread::sleep(Duration::from_micros(300));
        }
        let name = format!("buf{}", rng.next() % NAMES);
        match pool.lookup(&name) {
            Ok(view) => {
                lookups += 1;
                let checked = read_check(&view);
                if checked > 0 {
                    // Its own quarter, but for the ready word.
                    let quarter = view.len() / 4;
                    let start = ((writer - 1) * quarter).max(8);
                    let bytes = fill(view.generation(), writer, (writer * quarter - start) as usize);
                    view.write(start, &bytes).unwrap();
                    bytes_checked += checked + read_check(&view);
                } else {
                    not_ready += 1;
                }
                if rng.next().is_multiple_of(4) {
                    held.push(view);
                }
            }
            Err(PoolError::NotFound { .. }) => not_found += 1,
            Err(other) => panic!("importer {writer}: {other}"),
        }
        if held.len() > 8 {
            let old = held.remove(0);
            match old.check_current() {
                Ok(()) => {}
                Err(PoolError::StaleBuffer { held_generation, current, .. }) => {
                    assert_eq!(held_generation, old.generation());
                    assert_ne!(current, Some(old.generation()));
                    stale += 1;
                }
                Err(other) => panic!("importer {writer}: {other}"),
            }
            // Stale or not, its bytes are still its own.
            bytes_checked += read_check(&old);
        }
    }
    println!(
        "RESULT lookups={lookups} not_found={not_found} not_ready={not_ready} stale={stale} bytes={bytes_checked}"
    );
}

#[test]
fn churn_with_four_importer_processes_keeps_every_buffer_intact_and_leaks_nothing() {
    let path = sock("churn");
    let pool = SharedPool::<Host>::create(&HostContext, &path, PoolConfig::new(256 * 1024)).unwrap();
    let baseline = open_fds();
    let children: Vec<Child> = (1..=IMPORTERS).map(|k| spawn_child("churn", &path, k)).collect();
    let start = Instant::now();
    while pool.stats().importers < IMPORTERS as u32 {
        assert!(start.elapsed() < Duration::from_secs(20), "the importers did not attach");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let mut live: HashMap<u64, BufferHandle<Host>> = HashMap::new();
    let (mut allocs, mut frees, mut out_of_memory, mut stale_refused) = (0u64, 0u64, 0u64, 0u64);
    let owner_check = |handle: &BufferHandle<Host>| {
        let mut bytes = vec![0u8; handle.len() as usize];
        handle.read(0, &mut bytes).unwrap();
        check(&bytes, handle.generation()).unwrap_or_else(|e| panic!("owner, `{}`: {e}", handle.name()));
    };
    while allocs + frees < CHURN_OPS {
        let index = rng.next() % NAMES;
        let name = format!("buf{index}");
        match live.remove(&index) {
            Some(handle) => {
                owner_check(&handle);
                if rng.next().is_multiple_of(16) {
                    // Freed by name: the handle is stale now and must be refused.
                    pool.free_name(&name).unwrap();
                    let generation = handle.generation();
                    match pool.free(handle) {
                        Err(PoolError::StaleBuffer { held_generation, .. }) if held_generation == generation => {
                            stale_refused += 1;
                        }
                        other => panic!("a stale handle was not refused: {other:?}"),
                    }
                } else {
                    pool.free(handle).unwrap();
                }
                frees += 1;
            }
            None => {
                let len = 32 * (1 + rng.next() % 128);
                let align = 1 << (8 + rng.next() % 5);
                match pool.alloc(&name, len, align, None) {
                    Ok(handle) => {
                        assert_eq!(handle.ptr().raw() % align, 0);
                        initialise(&handle);
                        live.insert(index, handle);
                        allocs += 1;
                    }
                    Err(PoolError::OutOfMemory { .. }) => out_of_memory += 1,
                    Err(other) => panic!("alloc: {other}"),
                }
            }
        }
    }
    let churn_time = start.elapsed();
    let stop = pool.alloc(STOP, 8, 8, None).unwrap();
    let (mut lookups, mut stale) = (0, 0);
    for mut child in children {
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        assert!(child.wait().unwrap().success(), "an importer failed:\n{out}");
        let line =
            out.lines().find(|l| l.contains("RESULT")).unwrap_or_else(|| panic!("no result from a child:\n{out}"));
        assert!(field(line, "lookups") > 100 && field(line, "bytes") > 0, "{line}");
        lookups += field(line, "lookups");
        stale += field(line, "stale");
    }
    eprintln!(
        "churn: {allocs} allocs, {frees} frees ({stale_refused} stale handles refused, {out_of_memory} out of memory) \
         in {churn_time:?}; importers: {lookups} lookups checked, {stale} views seen stale"
    );
    assert!(stale_refused > 0, "the owner never tried a stale handle");
    assert!(stale > 0, "no importer ever held a view across a free");
    for (_, handle) in live.drain() {
        owner_check(&handle);
        pool.free(handle).unwrap();
    }
    pool.free(stop).unwrap();
    // The importers are gone: nothing pinned, one free range, no importer's fd or mapping left.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = pool.stats();
        let settled = stats.importers == 0 && stats.pending_buffers == 0 && open_fds() <= baseline;
        if settled {
            assert_eq!((stats.live_buffers, stats.live_bytes, stats.free_ranges), (0, 0, 1), "{stats:?}");
            assert_eq!(stats.free_bytes, stats.capacity_bytes);
            break;
        }
        assert!(Instant::now() < deadline, "leaked: {stats:?}, {} fds open, {baseline} before", open_fds());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_importer_killed_while_it_pins_a_freed_buffer_releases_it_within_a_second() {
    let path = sock("sigkill");
    let pool = SharedPool::<Host>::create(&HostContext, &path, PoolConfig::new(64 * 1024)).unwrap();
    let victim = pool.alloc("victim", 64 * 1024, 256, None).unwrap();
    let mut child = spawn_child("pinner", &path, 1);
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("PINNED") {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "the child ended before pinning");
    }
    assert_eq!(field(&line, "pins"), 1);
    pool.free(victim).unwrap();
    let stats = pool.stats();
    assert_eq!((stats.pending_buffers, stats.pending_bytes, stats.importers), (1, 64 * 1024, 1));
    assert!(matches!(pool.alloc("next", 64 * 1024, 256, None), Err(PoolError::OutOfMemory { .. })));
    child.kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    child.wait().unwrap();
    loop {
        let stats = pool.stats();
        if stats.pending_buffers == 0 && stats.importers == 0 {
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(1), "the dead importer's pin held on: {stats:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("the dead importer's pins were dropped {:?} after the SIGKILL", killed.elapsed());
    assert!(pool.alloc("next", 64 * 1024, 256, None).is_ok(), "its bytes are reusable");
}
