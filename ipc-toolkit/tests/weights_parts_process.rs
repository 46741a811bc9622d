//! A weight set on several devices (here three host parts) between real processes: the owner, a child started
//! from this very test binary (`GPU_IPC_WEIGHTS_PARTS_CHILD`), is SIGKILLed while this process holds a
//! generation of every part: the reader is told within a second and every tensor it holds still reads correctly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ipc_core::host::{Host, HostContext};
use ipc_toolkit::weights::{
    DType, HeldParts, TensorDesc, WeightsError, WeightsOptions, WeightsPartsOwner, WeightsPartsReader,
};

const ROLE: &str = "GPU_IPC_WEIGHTS_PARTS_CHILD";
const SOCKET: &str = "GPU_IPC_WEIGHTS_PARTS_SOCKET";
const SET: &str = "model";
const PARTS: usize = 3;

/// 12 tensors, tensor i on part i % 3.
fn tensors() -> Vec<(String, TensorDesc, usize)> {
    (0..12)
        .map(|i| {
            (format!("layers.{i}.weight"), TensorDesc::contiguous(DType::F32, [16, 1 + i]).unwrap(), i as usize % PARTS)
        })
        .collect()
}

fn pattern(generation: u64, index: usize, len: u64) -> Vec<u8> {
    (0..len).map(|k| (generation as u8) ^ (index as u8).wrapping_mul(29) ^ (k as u8)).collect()
}

/// Every tensor of `held`, in the publisher's order, holds its pattern; checksums too.
fn check(held: &HeldParts<Host>) {
    let all = tensors();
    let names: Vec<&str> = held.tensors().map(|(_, e)| e.name.as_str()).collect();
    assert_eq!(names, all.iter().map(|(n, _, _)| n.as_str()).collect::<Vec<_>>());
    for (i, (name, desc, part)) in all.iter().enumerate() {
        assert_eq!(held.entry(name).unwrap().0, *part);
        let mut bytes = vec![0u8; desc.span_bytes() as usize];
        held.read(name, &mut bytes).unwrap();
        assert_eq!(bytes, pattern(held.generation(), i, desc.span_bytes()), "{name}");
    }
    assert_eq!(held.verify().unwrap(), all.len());
}

/// Not a test of its own: the owner child the other test starts. Without the role variable it does nothing.
#[test]
#[ignore = "child-process entry point; run by the cross-process test, not on its own"]
fn child_process_entry_point() {
    let Ok(_role) = std::env::var(ROLE) else { return };
    let path = PathBuf::from(std::env::var(SOCKET).unwrap());
    let options = WeightsOptions { checksums: true, ..WeightsOptions::default() };
    let mut owner =
        WeightsPartsOwner::<Host>::create(vec![HostContext; PARTS], &path, SET, tensors(), options).unwrap();
    let data: Vec<(String, Vec<u8>)> =
        tensors().into_iter().enumerate().map(|(i, (n, d, _))| (n, pattern(1, i, d.span_bytes()))).collect();
    let refs: Vec<(&str, &[u8])> = data.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
    owner.update(&refs).unwrap();
    println!("PUBLISHED generation=1");
    if _role != "stepping" {
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    // Stepped by the test through stdin: "next" publishes the next generation, "end" drops the owner.
    for line in std::io::stdin().lines() {
        match line.unwrap().trim() {
            "next" => {
                let next = owner.generation() + 1;
                let data: Vec<(String, Vec<u8>)> = tensors()
                    .into_iter()
                    .enumerate()
                    .map(|(i, (n, d, _))| (n, pattern(next, i, d.span_bytes())))
                    .collect();
                let refs: Vec<(&str, &[u8])> = data.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
                owner.update(&refs).unwrap();
                println!("PUBLISHED generation={next}");
            }
            _ => break,
        }
    }
    drop(owner);
    println!("DROPPED");
    std::thread::sleep(Duration::from_secs(60));
}

/// Polls `word` until `condition` holds, for at most a second; returns how long it took.
fn within_a_second(what: &str, word: impl Fn() -> u64, condition: impl Fn(u64) -> bool) -> Duration {
    let started = Instant::now();
    while !condition(word()) {
        assert!(started.elapsed() < Duration::from_secs(1), "{what}: the word is still {:#x} after a second", word());
        std::thread::sleep(Duration::from_millis(1));
    }
    started.elapsed()
}

#[test]
fn a_watch_on_every_part_follows_the_owner_process_and_is_marked_gone_when_it_drops_the_set() {
    let path = std::env::temp_dir().join(format!("gpu-ipc-weights-parts-watch-{}.sock", std::process::id()));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
        .env(ROLE, "stepping")
        .env(SOCKET, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut said = |tag: &str| {
        let mut line = String::new();
        while !line.contains(tag) {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the owner ended before saying {tag}");
        }
    };
    said("PUBLISHED generation=1");
    let reader = WeightsPartsReader::<Host>::open(&path, SET, |_| Ok(HostContext), Duration::from_secs(10)).unwrap();
    let waits: Vec<_> = (0..PARTS).map(|part| reader.watch(2, part).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(50));
    assert!(waits.iter().all(|w| w.word().load() == 1), "a word moved before generation 2");
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "next").unwrap();
    said("PUBLISHED generation=2");
    for wait in &waits {
        within_a_second("generation 2", || wait.word().load(), |w| w == 2);
    }
    let waits: Vec<_> = (0..PARTS).map(|part| reader.watch(3, part).unwrap()).collect();
    writeln!(stdin, "end").unwrap();
    said("DROPPED");
    for wait in &waits {
        let took =
            within_a_second("the owner's end", || wait.word().load(), |w| w & ipc_toolkit::weights::GONE_BIT != 0);
        eprintln!("marked gone {took:?} after the owner said it dropped the set");
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn the_owner_of_a_set_of_parts_killed_is_seen_within_a_second_and_every_held_tensor_still_reads() {
    let path = std::env::temp_dir().join(format!("gpu-ipc-weights-parts-process-{}.sock", std::process::id()));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
        .env(ROLE, "owner")
        .env(SOCKET, &path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("PUBLISHED") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the owner ended before publishing");
    }
    let reader = WeightsPartsReader::<Host>::open(&path, SET, |_| Ok(HostContext), Duration::from_secs(10)).unwrap();
    assert_eq!(reader.part_count(), PARTS);
    let held = reader.held();
    check(&held);
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
    assert!(reader.owner_gone());
    check(&held);
}
