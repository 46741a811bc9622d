//! Weight sets between real processes on the host backend: children started from this very test binary
//! (`GPU_IPC_WEIGHTS_CHILD` selects the role) read or own a set.
//!
//! - A reader process holds generation 1 while the owner publishes 2 and 3: its bytes stay those of 1, the owner
//!   reports who holds what, the reader moves when it asks; its exit releases what it held.
//! - A reader SIGKILLed while it holds a retired generation: its hold is dropped and the arena reused within a
//!   second.
//! - The owner SIGKILLed while a reader holds a generation: the reader is told within a second, its tensors still
//!   read correctly.
//! - The owner SIGKILLed while a wait for the next generation is armed on the reader's stream gate: the wait is
//!   released, as "owner gone", within a second.
//! - 1,000 generations published while a reader process switches and checks every tensor and checksum: 0 mixed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use ipc_core::host::{Host, HostContext};
use ipc_toolkit::weights::{
    DType, GenerationWaitStatus, HeldGeneration, TensorDesc, WeightsError, WeightsOptions, WeightsOwner, WeightsReader,
};

const ROLE: &str = "GPU_IPC_WEIGHTS_CHILD";
const SOCKET: &str = "GPU_IPC_WEIGHTS_SOCKET";
const SET: &str = "model";

fn sock(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-weights-process-{}-{name}.sock", std::process::id()))
}

fn tensors() -> Vec<(String, TensorDesc)> {
    (0..24)
        .map(|i| {
            let desc = match i % 3 {
                0 => TensorDesc::contiguous(DType::BF16, [64, 32]),
                1 => TensorDesc::contiguous(DType::F32, [32]),
                _ => TensorDesc::contiguous(DType::U8, [1000]),
            };
            (format!("layers.{}.t{}", i / 3, i % 3), desc.unwrap())
        })
        .collect()
}

/// Tensor `index`'s bytes in `generation`: a byte pattern of both.
fn pattern(generation: u64, index: usize, len: u64) -> Vec<u8> {
    (0..len).map(|k| (generation as u8) ^ (index as u8).wrapping_mul(31) ^ (k as u8)).collect()
}

fn publish(owner: &mut WeightsOwner<Host>) -> u64 {
    let generation = owner.generation() + 1;
    let staged = owner.stage().unwrap();
    let entries = staged.manifest().entries.clone();
    for (i, e) in entries.iter().enumerate() {
        staged.write(&e.name, &pattern(generation, i, e.span_bytes())).unwrap();
    }
    owner.commit().unwrap()
}

/// Every tensor of `held` holds its generation's pattern: `Err` names the first that does not.
fn check(held: &HeldGeneration<Host>) -> Result<(), String> {
    for (i, e) in held.manifest().entries.iter().enumerate() {
        let mut bytes = vec![0u8; e.span_bytes() as usize];
        held.read(&e.name, &mut bytes).map_err(|x| x.to_string())?;
        if bytes != pattern(held.generation(), i, e.span_bytes()) {
            return Err(format!("{} of generation {} holds other bytes", e.name, held.generation()));
        }
    }
    Ok(())
}

fn spawn_child(role: &str, path: &Path) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(SOCKET, path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// The next line of a child's output that starts with `tag`.
fn expect_line(out: &mut BufReader<ChildStdout>, tag: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended before saying {tag}");
        // (libtest prints the child's test name on the same line, before its output.)
        if let Some(at) = line.find(tag) {
            return line[at..].to_owned();
        }
    }
}

/// Waits until the owner's door has recorded `n` readers as attached (a child says it opened the set a moment
/// before the door's thread sees its `Attached`).
fn wait_for_readers(owner: &WeightsOwner<Host>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while owner.readers().len() < n {
        assert!(Instant::now() < deadline, "{} readers attached, {n} expected", owner.readers().len());
        std::thread::sleep(Duration::from_millis(2));
    }
}

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
    if role == "owner" {
        let options = WeightsOptions { checksums: true, ..WeightsOptions::default() };
        let mut owner = WeightsOwner::<Host>::create(&HostContext, &path, SET, tensors(), options).unwrap();
        publish(&mut owner);
        println!("PUBLISHED generation=1");
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let mut reader = WeightsReader::<Host>::open(&HostContext, &path, SET, Duration::from_secs(10)).unwrap();
    match role.as_str() {
        "holder" => {
            let held = reader.held();
            check(&held).unwrap();
            println!("HELD generation={}", held.generation());
            // Until the owner says so (a line on stdin), then: still the same bytes? Then move.
            let mut go = String::new();
            std::io::stdin().read_line(&mut go).unwrap();
            check(&held).unwrap();
            let latest = reader.latest().unwrap();
            reader.refresh().unwrap();
            check(&reader.held()).unwrap();
            println!("MOVED from={} to={} latest={latest}", held.generation(), reader.generation());
            drop(held);
            let mut done = String::new();
            std::io::stdin().read_line(&mut done).unwrap();
        }
        "pinner" => {
            println!("HELD generation={}", reader.generation());
            std::thread::sleep(Duration::from_secs(60));
        }
        "switcher" => {
            let (mut switches, mut checks) = (0u64, 0u64);
            while reader.generation() < 1000 {
                let before = reader.generation();
                if reader.refresh().unwrap() != before {
                    switches += 1;
                }
                let held = reader.held();
                check(&held).unwrap_or_else(|e| panic!("MIXED {e}"));
                assert_eq!(held.verify().unwrap(), 24);
                checks += 1;
            }
            println!("RESULT switches={switches} checks={checks} mixed=0");
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn a_reader_process_holds_its_generation_while_the_owner_publishes_two_more() {
    let path = sock("holder");
    let mut owner =
        WeightsOwner::<Host>::create(&HostContext, &path, SET, tensors(), WeightsOptions::default()).unwrap();
    publish(&mut owner);
    let (mut child, mut out) = spawn_child("holder", &path);
    assert_eq!(field(&expect_line(&mut out, "HELD"), "generation"), 1);
    wait_for_readers(&owner, 1);
    publish(&mut owner);
    publish(&mut owner);
    let holds = owner.readers();
    assert_eq!(holds.len(), 1);
    assert_eq!((holds[0].generations.clone(), holds[0].pid), (vec![1], Some(child.id())));
    assert_eq!(owner.arenas(), 3, "generation 1 is retired but held: its arena is not reused");
    let mut stdin = child.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, b"go\n").unwrap();
    let moved = expect_line(&mut out, "MOVED");
    assert_eq!((field(&moved, "from"), field(&moved, "to"), field(&moved, "latest")), (1, 3, 3));
    let deadline = Instant::now() + Duration::from_secs(2);
    while owner.readers().first().map(|h| h.generations.clone()) != Some(vec![3]) {
        assert!(Instant::now() < deadline, "{:?}", owner.readers());
        std::thread::sleep(Duration::from_millis(5));
    }
    std::io::Write::write_all(&mut stdin, b"done\n").unwrap();
    assert!(child.wait().unwrap().success());
    publish(&mut owner);
    let deadline = Instant::now() + Duration::from_secs(2);
    while !owner.readers().is_empty() {
        assert!(Instant::now() < deadline, "{:?}", owner.readers());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(owner.arenas(), 2, "once nobody held generation 1, its arena went back");
}

#[test]
fn a_reader_killed_while_it_holds_a_retired_generation_releases_it_within_a_second() {
    let path = sock("sigkill-reader");
    let options = WeightsOptions { keep: 1, max_arenas: 2, ..WeightsOptions::default() };
    let mut owner = WeightsOwner::<Host>::create(&HostContext, &path, SET, tensors(), options).unwrap();
    publish(&mut owner);
    let (mut child, mut out) = spawn_child("pinner", &path);
    expect_line(&mut out, "HELD");
    wait_for_readers(&owner, 1);
    publish(&mut owner);
    // Two arenas at most: the reader holds 1, 2 is the newest; a third cannot be staged while it lives.
    assert!(matches!(owner.stage(), Err(WeightsError::ArenasHeld { .. })));
    assert_eq!(owner.readers()[0].generations, vec![1]);
    child.kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    child.wait().unwrap();
    while !owner.readers().is_empty() || owner.arenas() > 1 {
        assert!(killed.elapsed() < Duration::from_secs(1), "the dead reader's hold stayed: {:?}", owner.readers());
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("the dead reader's generation was released {:?} after the SIGKILL", killed.elapsed());
    assert_eq!(publish(&mut owner), 3, "its arena is reused");
}

#[test]
fn the_owner_killed_is_seen_within_a_second_and_held_tensors_still_read() {
    let path = sock("sigkill-owner");
    let (mut child, mut out) = spawn_child("owner", &path);
    expect_line(&mut out, "PUBLISHED");
    let reader = WeightsReader::<Host>::open(&HostContext, &path, SET, Duration::from_secs(10)).unwrap();
    let held = reader.held();
    check(&held).unwrap();
    assert_eq!(reader.latest().unwrap(), 1);
    child.kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    child.wait().unwrap();
    let seen = loop {
        match reader.wait_for(2, Some(Duration::from_millis(50))) {
            Err(WeightsError::OwnerGone { .. }) => break killed.elapsed(),
            Err(WeightsError::Timeout { .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(killed.elapsed() < Duration::from_secs(1), "the owner's death was not seen");
    };
    eprintln!("the owner's death was seen {seen:?} after the SIGKILL");
    assert!(matches!(reader.latest(), Err(WeightsError::OwnerGone { .. })));
    check(&held).unwrap();
    assert_eq!(held.verify().unwrap(), 24);
}

#[test]
fn the_owner_killed_releases_a_pending_generation_wait_as_gone_within_a_second() {
    let path = sock("sigkill-owner-gate");
    let (mut child, mut out) = spawn_child("owner", &path);
    expect_line(&mut out, "PUBLISHED");
    let reader = WeightsReader::<Host>::open(&HostContext, &path, SET, Duration::from_secs(10)).unwrap();
    let wait = reader.watch(2).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(reader.wait_status(&wait), GenerationWaitStatus::Waiting);
    child.kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    child.wait().unwrap();
    while reader.wait_status(&wait) == GenerationWaitStatus::Waiting {
        assert!(killed.elapsed() < Duration::from_secs(1), "the wait was not released by the owner's death");
        std::thread::sleep(Duration::from_micros(100));
    }
    eprintln!("the pending wait was released {:?} after the SIGKILL", killed.elapsed());
    assert_eq!(reader.wait_status(&wait), GenerationWaitStatus::OwnerGone { newest: 1 });
    drop(reader);
    assert_eq!(wait.word().load() & !ipc_toolkit::weights::GONE_BIT, 1, "the word outlives the reader");
}

#[test]
fn a_thousand_generations_switched_by_a_reader_process_show_no_mixed_read() {
    let path = sock("switches");
    let options = WeightsOptions { checksums: true, ..WeightsOptions::default() };
    let mut owner = WeightsOwner::<Host>::create(&HostContext, &path, SET, tensors(), options).unwrap();
    publish(&mut owner);
    let (mut child, mut out) = spawn_child("switcher", &path);
    let started = Instant::now();
    wait_for_readers(&owner, 1);
    while owner.generation() < 1000 {
        publish(&mut owner);
    }
    let mut rest = String::new();
    let line = expect_line(&mut out, "RESULT");
    out.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "{line}{rest}");
    assert!(field(&line, "switches") >= 1 && field(&line, "checks") >= field(&line, "switches"), "{line}");
    eprintln!("{} in {:?}", line.trim(), started.elapsed());
}
