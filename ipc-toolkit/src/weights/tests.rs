//! The weights' owner and reader in one process on the host backend, and the manifest's checks against hostile
//! bytes. Between processes: `ipc-toolkit/tests/weights_process.rs`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::manifest::{MANIFEST_HEADER_BYTES, MAX_TENSORS, TENSOR_ALIGN};
use super::*;
use crate::pool::{PoolConfig, SharedPool};
use gpu_ipc_driver::DeviceUuid;
use ipc_core::host::{Host, HostContext};

pub(super) fn sock(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-weights-{}-{name}.sock", std::process::id()))
}

pub(super) fn tensors() -> Vec<(String, TensorDesc)> {
    vec![
        ("embed.weight".into(), TensorDesc::contiguous(DType::BF16, [16, 8]).unwrap()),
        ("layers.0.norm".into(), TensorDesc::contiguous(DType::F32, [8]).unwrap()),
        ("layers.0.proj.weight".into(), TensorDesc::strided(DType::F16, [4, 8], [1, 4]).unwrap()),
        ("step".into(), TensorDesc::contiguous(DType::I64, Vec::<u64>::new()).unwrap()),
    ]
}

/// Every tensor's bytes for `generation`: a pattern of the generation and the tensor's index.
fn bytes_for(layout: &Manifest, generation: u64) -> Vec<(String, Vec<u8>)> {
    layout
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            (e.name.clone(), vec![(generation as u8).wrapping_mul(7).wrapping_add(i as u8); e.span_bytes() as usize])
        })
        .collect()
}

pub(super) fn publish(owner: &mut WeightsOwner<Host>) -> u64 {
    let next = owner.generation() + 1;
    let data = bytes_for(owner.layout(), next);
    let refs: Vec<(&str, &[u8])> = data.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
    owner.update(&refs).unwrap()
}

/// Checks that every tensor of `held` holds `generation`'s bytes.
fn check_held(held: &HeldGeneration<Host>, generation: u64) {
    assert_eq!(held.generation(), generation);
    for (name, want) in bytes_for(held.manifest(), generation) {
        let mut got = vec![0u8; want.len()];
        held.read(&name, &mut got).unwrap();
        assert_eq!(got, want, "{name} of generation {generation}");
    }
}

/// Each tensor's name, description and offset: a manifest without its generation and checksums.
fn placement(m: &Manifest) -> Vec<(String, TensorDesc, u64)> {
    m.entries.iter().map(|e| (e.name.clone(), e.desc.clone(), e.offset)).collect()
}

pub(super) fn open(path: &PathBuf, set: &str) -> WeightsReader<Host> {
    WeightsReader::<Host>::open(&HostContext, path, set, Duration::from_secs(5)).unwrap()
}

#[test]
fn a_reader_gets_every_tensor_and_moves_only_when_it_refreshes() {
    let path = sock("basic");
    let options = WeightsOptions { checksums: true, ..WeightsOptions::default() };
    let mut owner = WeightsOwner::<Host>::create(&HostContext, &path, "model", tensors(), options).unwrap();
    assert_eq!(publish(&mut owner), 1);
    let mut reader = open(&path, "model");
    let first = reader.held();
    check_held(&first, 1);
    assert_eq!(first.verify().unwrap(), 4);
    assert_eq!(first.entry("layers.0.proj.weight").unwrap().desc.strides(), Some(&[1u64, 4][..]));
    assert_eq!(first.manifest().device_uuid, DeviceUuid::default());
    for entry in &first.manifest().entries {
        assert_eq!(entry.offset % TENSOR_ALIGN, 0);
    }

    assert_eq!(publish(&mut owner), 2);
    assert_eq!(publish(&mut owner), 3);
    assert_eq!((reader.latest().unwrap(), reader.generation()), (3, 1));
    // Generation 1 was retired while the reader held it: its bytes are intact, and the owner says who holds it.
    check_held(&first, 1);
    // (The door records the reader's `Attached` on its own thread, a moment after `open` returned.)
    let deadline = Instant::now() + Duration::from_secs(5);
    while owner.readers().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let holds = owner.readers();
    assert_eq!(holds.len(), 1);
    assert_eq!(holds[0].generations, vec![1]);
    assert_eq!(owner.arenas(), 3);

    assert_eq!(reader.refresh().unwrap(), 3);
    check_held(&reader.held(), 3);
    assert_eq!(reader.held().verify().unwrap(), 4);
    // The old generation is still held by `first`; once it goes, its arena is reused by the next generation.
    assert_eq!(owner.readers()[0].generations, vec![1, 3]);
    drop(first);
    assert_eq!(owner.readers()[0].generations, vec![3]);
    assert_eq!(publish(&mut owner), 4);
    assert_eq!(owner.arenas(), 2, "generation 1's and 2's arenas were reused, not kept");
    assert_eq!(reader.wait_for(4, Some(Duration::from_millis(10))).unwrap(), 4);
    assert!(matches!(
        reader.wait_for(5, Some(Duration::from_millis(20))),
        Err(WeightsError::Timeout { wanted: 5, latest: 4, .. })
    ));

    drop(reader);
    let deadline = Instant::now() + Duration::from_secs(2);
    while !owner.readers().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(owner.readers().is_empty());
}

#[test]
fn stage_and_commit_publish_what_was_written_in_place() {
    let path = sock("stage");
    let mut owner =
        WeightsOwner::<Host>::create(&HostContext, &path, "m", tensors(), WeightsOptions::default()).unwrap();
    let staged = owner.stage().unwrap();
    assert_eq!(staged.generation(), 1);
    for (name, bytes) in bytes_for(staged.manifest(), 1) {
        staged.write(&name, &bytes).unwrap();
    }
    assert!(matches!(staged.write("step", &[0; 3]), Err(WeightsError::Mismatch { .. })));
    assert!(matches!(staged.write("nope", &[0; 3]), Err(WeightsError::UnknownTensor { .. })));
    assert_eq!(owner.commit().unwrap(), 1);
    assert!(matches!(owner.commit(), Err(WeightsError::Invalid(_))));
    let reader = open(&path, "m");
    check_held(&reader.held(), 1);
    assert_eq!(reader.held().verify().unwrap(), 0, "no checksums asked for");
}

#[test]
fn update_refuses_missing_unknown_and_repeated_tensors() {
    let path = sock("update");
    let mut owner =
        WeightsOwner::<Host>::create(&HostContext, &path, "m", tensors(), WeightsOptions::default()).unwrap();
    let data = bytes_for(owner.layout(), 1);
    let mut refs: Vec<(&str, &[u8])> = data.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
    let all = refs.clone();
    refs.pop();
    assert!(matches!(owner.update(&refs), Err(WeightsError::Mismatch { ref name, .. }) if name == "step"));
    refs.push(all[0]);
    assert!(matches!(owner.update(&refs), Err(WeightsError::Mismatch { .. })));
    assert!(matches!(owner.update(&[("ghost", &[][..])]), Err(WeightsError::UnknownTensor { .. })));
    assert_eq!(owner.generation(), 0);
    assert_eq!(owner.update(&all).unwrap(), 1);
}

#[test]
fn a_wrong_set_name_is_refused_naming_the_set_served() {
    let path = sock("wrong-name");
    let mut owner =
        WeightsOwner::<Host>::create(&HostContext, &path, "llama", tensors(), WeightsOptions::default()).unwrap();
    publish(&mut owner);
    let e = WeightsReader::<Host>::open(&HostContext, &path, "mistral", Duration::from_secs(2)).unwrap_err();
    assert!(matches!(e, WeightsError::NoSuchSet { .. }), "{e}");
    assert!(e.to_string().contains("publishes llama"), "{e}");
}

#[test]
fn the_owner_closing_is_seen_and_held_generations_stay_readable() {
    let path = sock("owner-gone");
    let mut owner =
        WeightsOwner::<Host>::create(&HostContext, &path, "m", tensors(), WeightsOptions::default()).unwrap();
    publish(&mut owner);
    let mut reader = open(&path, "m");
    let held = reader.held();
    drop(owner);
    let started = Instant::now();
    assert!(matches!(reader.latest(), Err(WeightsError::OwnerGone { .. })));
    assert!(matches!(reader.refresh(), Err(WeightsError::OwnerGone { .. })));
    assert!(matches!(reader.wait_for(2, None), Err(WeightsError::OwnerGone { .. })));
    assert!(started.elapsed() < Duration::from_secs(1));
    check_held(&held, 1);
}

#[test]
fn a_thousand_switches_never_show_a_mix_of_two_generations() {
    let path = sock("switches");
    let options = WeightsOptions { checksums: true, keep: 2, ..WeightsOptions::default() };
    let mut owner = WeightsOwner::<Host>::create(&HostContext, &path, "m", tensors(), options).unwrap();
    publish(&mut owner);
    let reader_path = path.clone();
    let (opened_tx, opened) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut reader = open(&reader_path, "m");
        let _ = opened_tx.send(());
        let (mut switches, mut checked) = (0u64, 0u64);
        while reader.generation() < 1000 {
            let before = reader.generation();
            if reader.refresh().unwrap() != before {
                switches += 1;
            }
            let held = reader.held();
            // Every tensor of the held generation carries that generation's pattern, and its checksum.
            check_held(&held, held.generation());
            assert_eq!(held.verify().unwrap(), 4);
            checked += 1;
        }
        (switches, checked)
    });
    // The reader attaches before the owner runs through its generations (a loaded machine let the owner reach 1,000
    // first: 0 switches to check).
    opened.recv_timeout(Duration::from_secs(10)).expect("the reader opened the set");
    while owner.generation() < 1000 {
        publish(&mut owner);
    }
    let (switches, checked) = reader.join().unwrap();
    assert!(switches >= 1 && checked >= switches, "{switches} switches, {checked} checks");
    println!("{switches} switches, {checked} whole-generation checks, 0 mixed");
    assert!(owner.arenas() <= 3, "{} arenas", owner.arenas());
}

#[test]
fn nineteen_thousand_tensors_round_trip_in_one_import() {
    let path = sock("moe");
    let tensors: Vec<(String, TensorDesc)> = (0..19_000)
        .map(|i| {
            let (layer, expert, proj) = (i / 384, i / 3 % 128, ["gate", "up", "down"][i % 3]);
            let name = format!("model.layers.{layer}.mlp.experts.{expert}.{proj}_proj.weight");
            (name, TensorDesc::contiguous(DType::BF16, [4, 8]).unwrap())
        })
        .collect();
    let options = WeightsOptions { max_arenas: 4, ..WeightsOptions::default() };
    let started = Instant::now();
    let mut owner = WeightsOwner::<Host>::create(&HostContext, &path, "moe", tensors, options).unwrap();
    let staged = owner.stage().unwrap();
    let names: Vec<String> = staged.manifest().entries.iter().map(|e| e.name.clone()).collect();
    for (i, name) in names.iter().enumerate() {
        staged.write(name, &[(i % 251) as u8; 64]).unwrap();
    }
    owner.commit().unwrap();
    let published = started.elapsed();
    let started = Instant::now();
    let reader = open(&path, "moe");
    let opened = started.elapsed();
    let held = reader.held();
    assert_eq!(held.manifest().entries.len(), 19_000);
    let mut bytes = [0u8; 64];
    for (i, name) in names.iter().enumerate() {
        held.read(name, &mut bytes).unwrap();
        assert_eq!(bytes, [(i % 251) as u8; 64], "{name}");
    }
    let manifest_bytes = held.manifest().encode().len();
    println!(
        "19,000 tensors: manifest {manifest_bytes} bytes, laid out and published in {published:?}, opened (attach, one import, manifest checked) in {opened:?}"
    );
    assert!(manifest_bytes > 19_000 * (MANIFEST_HEADER_BYTES / 4));
}

#[test]
fn tensors_alike_are_laid_out_together_a_constant_step_apart_in_the_given_order() {
    // A mixture of experts' order: gate, up (alike) and down (another shape) interleaved, a scalar per layer, a
    // norm; the last tensor has the first one's shape.
    let mut tensors = vec![("embed".to_owned(), TensorDesc::contiguous(DType::BF16, [10, 8]).unwrap())];
    for layer in 0..2 {
        tensors.push((format!("{layer}.norm"), TensorDesc::contiguous(DType::F32, [8]).unwrap()));
        for e in 0..3 {
            for (proj, shape) in [("gate", [4, 8]), ("up", [4, 8]), ("down", [8, 4])] {
                tensors.push((format!("{layer}.{e}.{proj}"), TensorDesc::contiguous(DType::BF16, shape).unwrap()));
            }
        }
        tensors.push((format!("{layer}.step"), TensorDesc::contiguous(DType::I64, Vec::<u64>::new()).unwrap()));
    }
    tensors.push(("head".to_owned(), TensorDesc::contiguous(DType::BF16, [10, 8]).unwrap()));
    let path = sock("grouped");
    let owner =
        WeightsOwner::<Host>::create(&HostContext, &path, "moe", tensors.clone(), WeightsOptions::default()).unwrap();
    let layout = owner.layout();
    let names: Vec<&str> = layout.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, tensors.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), "the given order");
    let offsets = |pick: &dyn Fn(&str) -> bool| -> Vec<u64> {
        layout.entries.iter().filter(|e| pick(&e.name)).map(|e| e.offset).collect()
    };
    let first = layout.entries[0].offset;
    assert_eq!(first, (layout.encode().len() as u64).next_multiple_of(TENSOR_ALIGN));
    // Groups in the order of their first tensor: embed and head, the norms, gate and up, down, the scalars.
    assert_eq!(offsets(&|n| n == "embed" || n == "head"), [first, first + 256]);
    assert_eq!(offsets(&|n| n.ends_with("norm")), [first + 512, first + 768]);
    let alike = offsets(&|n| n.ends_with("gate") || n.ends_with("up"));
    assert_eq!(alike, (0..12).map(|k| first + 1024 + 256 * k).collect::<Vec<_>>());
    let down = offsets(&|n| n.ends_with("down"));
    assert_eq!(down, (0..6).map(|k| first + 1024 + 12 * 256 + 256 * k).collect::<Vec<_>>());
    assert_eq!(offsets(&|n| n.ends_with("step")), [first + 1024 + 18 * 256, first + 1024 + 19 * 256]);
    assert_eq!(layout.arena_bytes, first + 1024 + 20 * 256);
}

#[test]
fn every_generation_staged_in_a_reused_arena_carries_its_own_manifest() {
    // keep 1: each update retires the one before, whose manifest the next generation reuses.
    let path = sock("recycled");
    let options = WeightsOptions { keep: 1, checksums: true, ..WeightsOptions::default() };
    let mut owner = WeightsOwner::<Host>::create(&HostContext, &path, "m", tensors(), options).unwrap();
    publish(&mut owner);
    let mut reader = open(&path, "m");
    for generation in 2..=6 {
        assert_eq!(publish(&mut owner), generation);
        assert_eq!(reader.refresh().unwrap(), generation);
        let held = reader.held();
        check_held(&held, generation);
        let manifest = held.manifest();
        assert_eq!(manifest.generation, generation);
        assert_eq!(placement(manifest), placement(owner.layout()));
        assert_eq!(held.verify().unwrap(), 4, "generation {generation}'s own checksums");
        assert_eq!(owner.staged().map(StagedGeneration::generation), None);
    }
    let staged = owner.stage().unwrap();
    assert!(staged.manifest().entries.iter().all(|e| e.checksum == Some(0)), "checksums are filled in at commit");
}

#[test]
fn a_manifest_a_reader_overwrote_does_not_outlive_its_generation() {
    // A reader's mapping of an arena is writable (a GPU mapping cannot be made read-only for it): one writes its
    // generation's manifest with two tensors' offsets swapped, a manifest that still decodes, and leaves. With keep
    // 1 the arenas alternate, so later generations are staged in that arena again: each must carry the owner's
    // manifest, not the one the reader left there.
    let path = sock("overwritten");
    let options = WeightsOptions { keep: 1, ..WeightsOptions::default() };
    let mut owner = WeightsOwner::<Host>::create(&HostContext, &path, "m", tensors(), options).unwrap();
    publish(&mut owner);
    let hostile = open(&path, "m");
    let held = hostile.held();
    let mut swapped = held.manifest().clone();
    let (a, b) = (swapped.entries[0].offset, swapped.entries[1].offset);
    (swapped.entries[0].offset, swapped.entries[1].offset) = (b, a);
    held.view().write(0, &swapped.encode()).unwrap();
    drop(held);
    drop(hostile);
    publish(&mut owner);
    let mut reader = open(&path, "m");
    for generation in 3..=6 {
        assert_eq!(publish(&mut owner), generation);
        assert_eq!(reader.refresh().unwrap(), generation);
        let held = reader.held();
        assert_eq!(placement(held.manifest()), placement(owner.layout()), "generation {generation}'s manifest");
        check_held(&held, generation);
    }
}

#[test]
fn a_readers_later_generations_of_one_layout_take_the_checked_entries_and_a_changed_manifest_is_decoded() {
    let path = sock("same-layout");
    let mut owner =
        WeightsOwner::<Host>::create(&HostContext, &path, "m", tensors(), WeightsOptions::default()).unwrap();
    publish(&mut owner);
    let mut reader = open(&path, "m");
    let first = reader.held();
    for generation in 2..=5 {
        assert_eq!(publish(&mut owner), generation);
        assert_eq!(reader.refresh().unwrap(), generation);
        let held = reader.held();
        check_held(&held, generation);
        assert_eq!(held.manifest().generation, generation);
        assert!(held.shares_layout_with(&first), "generation {generation} decoded again");
    }
    // The owner (or whatever wrote the arena) moves a tensor inside the arena: other bytes, so decoded and checked
    // anew, and its own index.
    let staged = owner.stage().unwrap();
    let mut moved = staged.manifest().clone();
    moved.entries[1].offset += moved.entries[1].desc.dtype().size_bytes();
    staged.handle().write(0, &moved.encode()).unwrap();
    let generation = owner.commit().unwrap();
    assert_eq!(reader.refresh().unwrap(), generation);
    let held = reader.held();
    assert!(!held.shares_layout_with(&first));
    assert_eq!(held.manifest().entries[1].offset, moved.entries[1].offset);
    // The same bytes but generation 0 are decoded, and refused.
    let staged = owner.stage().unwrap();
    let mut encoded = staged.manifest().encode();
    Manifest::set_encoded_generation(&mut encoded, 0).unwrap();
    staged.handle().write(0, &encoded).unwrap();
    owner.commit().unwrap();
    let e = reader.refresh().unwrap_err();
    assert!(matches!(e, WeightsError::Manifest { source: ManifestError::BadField { .. }, .. }), "{e}");
    assert_eq!(reader.generation(), generation);
}

#[test]
fn a_later_arena_too_small_for_the_held_layout_is_refused_though_its_manifest_is_the_same() {
    // A hostile owner with a pool of its own: generation 1 a proper arena, generation 2 the same manifest (but for
    // the generation) in an arena too small for the tensors it describes.
    let path = sock("small-arena");
    let layout = sample();
    let pool = SharedPool::<Host>::create(&HostContext, &path, PoolConfig::new(layout.arena_bytes * 4)).unwrap();
    let mut first = layout.clone();
    first.generation = 1;
    pool.alloc(&arena_name("m", 1), layout.arena_bytes, TENSOR_ALIGN, None).unwrap().write(0, &first.encode()).unwrap();
    pool.set_note(1);
    let mut reader = open(&path, "m");
    let mut second = layout.clone();
    second.generation = 2;
    let encoded = second.encode();
    let small = pool.alloc(&arena_name("m", 2), encoded.len() as u64, TENSOR_ALIGN, None).unwrap();
    small.write(0, &encoded).unwrap();
    pool.set_note(2);
    let e = reader.refresh().unwrap_err();
    assert!(matches!(e, WeightsError::Manifest { source: ManifestError::ArenaTooSmall { .. }, .. }), "{e}");
    assert_eq!(reader.generation(), 1);
}

/// A valid manifest of a few tensors, to break.
fn sample() -> Manifest {
    let mut m = Manifest {
        set_name: "m".into(),
        generation: 3,
        device_uuid: DeviceUuid([7; 16]),
        arena_bytes: 0,
        entries: tensors()
            .into_iter()
            .map(|(name, desc)| TensorEntry { name, desc, offset: 0, checksum: Some(9) })
            .collect(),
        parts: None,
    };
    let mut at = (m.encode().len() as u64).next_multiple_of(TENSOR_ALIGN);
    for e in &mut m.entries {
        e.offset = at;
        at = (at + e.span_bytes()).next_multiple_of(TENSOR_ALIGN);
    }
    m.arena_bytes = at;
    m
}

#[test]
fn a_manifest_decodes_to_what_was_encoded() {
    let m = sample();
    let bytes = m.encode();
    assert_eq!(Manifest::declared_len(&bytes).unwrap(), bytes.len() as u64);
    assert_eq!(Manifest::decode(&bytes, m.arena_bytes).unwrap(), m);
}

#[test]
fn every_truncation_of_a_manifest_is_refused() {
    let bytes = sample().encode();
    for len in 0..bytes.len() {
        let cut = bytes.get(..len).unwrap();
        assert!(Manifest::decode(cut, u64::MAX).is_err(), "{len} bytes accepted");
    }
    // A header that claims more than there is.
    assert!(matches!(Manifest::decode(&bytes[..bytes.len() - 1], u64::MAX), Err(ManifestError::Truncated { .. })));
}

/// Offsets of fields in `sample()`'s encoding.
const COUNT_AT: usize = 12;
const ARENA_AT: usize = 32;
/// The first entry: right after the 64-byte header and the one-byte set name.
const ENTRY0: usize = 65;

fn refused(bytes: &[u8], mapped: u64) -> ManifestError {
    Manifest::decode(bytes, mapped).unwrap_err()
}

#[test]
fn a_manifest_of_no_tensors_with_the_checksums_bit_is_refused() {
    // Found by the `weights_manifest` fuzz target: accepted, it encoded back without the bit (two encodings of one
    // manifest).
    let bytes: [u8; 72] = [
        71, 73, 80, 67, 87, 71, 84, 83, 1, 0, 1, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 67, 0, 72, 0, 0, 0, 0, 0, 0, 0, 0, 7,
        0, 0, 0, 0, 0, 0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 8, 0, 0, 0, 0, 0, 0, 0, 18, 0, 0, 0, 115,
        116, 101, 112,
    ];
    let e = refused(&bytes, u64::MAX);
    assert!(matches!(e, ManifestError::BadField { .. }), "{e}");
    let mut clear = bytes;
    clear[10] = 0;
    assert_eq!(Manifest::decode(&clear, u64::MAX).expect("the same manifest without the bit").encode(), clear);
}

#[test]
fn a_declared_length_no_manifest_of_its_count_can_have_is_refused_before_anything_is_copied() {
    // A hostile owner's header claiming 64 GiB of manifest in an arena as large: a reader copied (allocated) the
    // whole claim before decoding it, and an allocation that large aborted the process.
    let m = sample();
    let good = m.encode();
    let header = &good[..MANIFEST_HEADER_BYTES];
    assert_eq!(Manifest::declared_len(header).unwrap(), good.len() as u64);
    let count = m.entries.len() as u32;
    let most = Manifest::most_bytes(1, count);
    assert!(most >= good.len() as u64);
    for claim in [most + 1, 64 << 30, u64::MAX] {
        let mut h = header.to_vec();
        h[24..32].copy_from_slice(&claim.to_le_bytes());
        let e = Manifest::declared_len(&h).unwrap_err();
        assert!(e.to_string().contains("more than a manifest of"), "{e}");
    }
    let mut h = header.to_vec();
    h[24..32].copy_from_slice(&most.to_le_bytes());
    assert_eq!(Manifest::declared_len(&h).unwrap(), most);
    // The largest manifest of the most tensors, every name and dimension at its limit, is about 1.2 GB.
    assert!(Manifest::most_bytes(2, MAX_TENSORS) < 5 << 29);
    h[COUNT_AT..COUNT_AT + 4].copy_from_slice(&(MAX_TENSORS + 1).to_le_bytes());
    assert!(matches!(Manifest::declared_len(&h), Err(ManifestError::BadField { .. })));
}

#[test]
fn hostile_manifests_are_refused_with_what_is_wrong() {
    let m = sample();
    let good = m.encode();
    let put = |at: usize, value: &[u8]| {
        let mut b = good.clone();
        b[at..at + value.len()].copy_from_slice(value);
        b
    };
    let show = |e: ManifestError| e.to_string();

    assert!(matches!(refused(&put(0, b"PICKLE!!"), u64::MAX), ManifestError::BadMagic { .. }));
    assert!(matches!(refused(&put(8, &3u16.to_le_bytes()), u64::MAX), ManifestError::UnsupportedVersion { found: 3 }));
    // An arena larger than what is mapped.
    let e = refused(&good, m.arena_bytes - 1);
    assert!(matches!(e, ManifestError::ArenaTooSmall { .. }), "{e}");
    // Offsets past the extent (the arena claims less), and an offset that overflows.
    let e = refused(&put(ARENA_AT, &(m.entries[0].offset + 1).to_le_bytes()), u64::MAX);
    assert!(matches!(e, ManifestError::OutOfBounds { index: 0, .. }), "{}", show(e));
    let e = refused(&put(ENTRY0 + 8, &(u64::MAX - 1).to_le_bytes()), u64::MAX);
    assert!(matches!(e, ManifestError::OutOfBounds { index: 0, .. } | ManifestError::Misaligned { .. }), "{}", show(e));
    let e = refused(&put(ENTRY0 + 8, &(u64::MAX - 255).to_le_bytes()), u64::MAX);
    assert!(matches!(e, ManifestError::OutOfBounds { index: 0, .. }), "{}", show(e));
    // A tensor inside the manifest itself.
    let e = refused(&put(ENTRY0 + 8, &0u64.to_le_bytes()), u64::MAX);
    assert!(matches!(e, ManifestError::OutOfBounds { index: 0, start, .. } if start > 0), "{}", show(e));
    // Unknown element type.
    let e = refused(&put(ENTRY0 + 2, &999u16.to_le_bytes()), u64::MAX);
    assert!(matches!(e, ManifestError::UnknownDType { code: 999, .. }), "{}", show(e));
    // Shapes whose span overflows, and a zero extent.
    let e = refused(&put(ENTRY0 + 16, &(1u64 << 62).to_le_bytes()), u64::MAX);
    assert!(matches!(e, ManifestError::BadTensor { .. }), "{}", show(e));
    let e = refused(&put(ENTRY0 + 16, &0u64.to_le_bytes()), u64::MAX);
    assert!(matches!(e, ManifestError::BadTensor { .. }), "{}", show(e));
    // Too many dimensions.
    let e = refused(&put(ENTRY0 + 4, &[9]), u64::MAX);
    assert!(matches!(e, ManifestError::BadField { .. }), "{}", show(e));
    // A count the bytes cannot hold, and a huge one.
    let e = refused(&put(COUNT_AT, &1000u32.to_le_bytes()), u64::MAX);
    assert!(matches!(e, ManifestError::Truncated { .. }), "{}", show(e));
    let e = refused(&put(COUNT_AT, &u32::MAX.to_le_bytes()), u64::MAX);
    assert!(matches!(e, ManifestError::BadField { .. }), "{}", show(e));
    // Generation 0, unknown flags, a bad set name length.
    assert!(matches!(refused(&put(16, &0u64.to_le_bytes()), u64::MAX), ManifestError::BadField { .. }));
    assert!(matches!(refused(&put(10, &4u16.to_le_bytes()), u64::MAX), ManifestError::BadField { .. }));
    assert!(matches!(refused(&put(56, &0u16.to_le_bytes()), u64::MAX), ManifestError::BadField { .. }));
    // A name that is not UTF-8.
    let last = good.len() - 1;
    assert!(matches!(refused(&put(last, &[0xff]), u64::MAX), ManifestError::BadField { .. }));
    // Misaligned for its element size (bf16: 2 bytes).
    let e = refused(&put(ENTRY0 + 8, &(m.entries[0].offset + 1).to_le_bytes()), u64::MAX);
    assert!(matches!(e, ManifestError::Misaligned { align: 2, .. }), "{}", show(e));
    // Trailing bytes.
    let mut long = good.clone();
    long.push(0);
    assert!(matches!(refused(&long, u64::MAX), ManifestError::TrailingBytes { .. } | ManifestError::Truncated { .. }));
    // Duplicate names.
    let mut dup = m.clone();
    dup.entries[1].name = dup.entries[0].name.clone();
    dup.entries[1].offset = dup.entries[0].offset;
    let mut bytes = dup.encode();
    let len = bytes.len() as u64;
    bytes[24..32].copy_from_slice(&len.to_le_bytes());
    let e = refused(&bytes, u64::MAX);
    assert!(matches!(e, ManifestError::DuplicateName { first: 0, second: 1, .. }), "{}", show(e));
}

#[test]
fn a_hostile_arena_is_refused_and_the_reader_keeps_what_it_held() {
    let path = sock("hostile-arena");
    let mut owner =
        WeightsOwner::<Host>::create(&HostContext, &path, "m", tensors(), WeightsOptions::default()).unwrap();
    publish(&mut owner);
    let mut reader = open(&path, "m");
    // The owner (or whatever wrote the arena) puts a tensor past the arena's end.
    let staged = owner.stage().unwrap();
    let mut bad = staged.manifest().clone();
    bad.entries[0].offset = bad.arena_bytes;
    staged.handle().write(0, &bad.encode()).unwrap();
    owner.commit().unwrap();
    let e = reader.refresh().unwrap_err();
    assert!(
        matches!(e, WeightsError::Manifest { generation: 2, source: ManifestError::OutOfBounds { .. }, .. }),
        "{e}"
    );
    assert_eq!(reader.generation(), 1);
    check_held(&reader.held(), 1);
    // Garbage where the manifest should be.
    let staged = owner.stage().unwrap();
    staged.handle().write(0, &[0xab; 64]).unwrap();
    owner.commit().unwrap();
    let e = reader.refresh().unwrap_err();
    assert!(matches!(e, WeightsError::Manifest { source: ManifestError::BadMagic { .. }, .. }), "{e}");
    let _ = Arc::strong_count(&reader.held());
}

#[test]
fn random_publications_refreshes_and_holds_never_reuse_a_held_arena() {
    // A model check of generations and their arenas: 3 readers, each holding up to 3 generations it took, and an
    // owner publishing, in 3 x 3,000 random steps. After every step every held generation still reads its own
    // bytes (an arena reused while held would read another's), each reader's refresh lands on the newest, and the
    // owner's arenas stay within what is held plus what it keeps; when readers hold too many, the owner's refusal
    // (`max_arenas`) is the only error, and it passes once they let go.
    for seed in [0x1234_5678_9abc_def1u64, 0x0f0f_1e1e_2d2d_3c3c, 0x7777_3333_5555_1111] {
        let path = sock(&format!("model-{seed:x}"));
        let options = WeightsOptions { keep: 2, max_arenas: 6, ..WeightsOptions::default() };
        let mut owner = WeightsOwner::<Host>::create(&HostContext, &path, "m", tensors(), options).unwrap();
        publish(&mut owner);
        let mut readers: Vec<WeightsReader<Host>> = (0..3).map(|_| open(&path, "m")).collect();
        let mut holds: Vec<Vec<Arc<HeldGeneration<Host>>>> = vec![Vec::new(); 3];
        let mut random = crate::test_random::below(seed);
        let mut refused = 0;
        for step in 0..3_000 {
            let k = random(3) as usize;
            match random(4) {
                0 => {
                    let next = owner.generation() + 1;
                    let data = bytes_for(owner.layout(), next);
                    let refs: Vec<(&str, &[u8])> = data.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
                    match owner.update(&refs) {
                        Ok(generation) => assert_eq!(generation, next, "seed {seed:#x}, step {step}"),
                        // Every arena it may make is held: refused until a reader lets go.
                        Err(WeightsError::ArenasHeld { .. }) => refused += 1,
                        Err(e) => panic!("seed {seed:#x}, step {step}: {e}"),
                    }
                }
                1 => {
                    assert_eq!(readers[k].refresh().unwrap(), owner.generation(), "seed {seed:#x}, step {step}");
                }
                2 if holds[k].len() < 3 => holds[k].push(readers[k].held()),
                _ => {
                    if !holds[k].is_empty() {
                        let at = random(holds[k].len() as u64) as usize;
                        holds[k].remove(at);
                    }
                }
            }
            for held in holds.iter().flatten() {
                check_held(held, held.generation());
            }
            let mut held: Vec<u64> = holds.iter().flatten().map(|h| h.generation()).collect();
            held.extend(readers.iter().map(WeightsReader::generation));
            held.sort_unstable();
            held.dedup();
            assert!(owner.arenas() <= held.len() + 2, "seed {seed:#x}, step {step}: {} arenas", owner.arenas());
        }
        assert!(owner.generation() > 100, "seed {seed:#x}: only {} generations", owner.generation());
        println!(
            "seed {seed:#x}: {} generations, {refused} refused while readers held every arena",
            owner.generation()
        );
    }
}
