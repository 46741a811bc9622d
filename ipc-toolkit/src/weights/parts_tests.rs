//! A weight set on several devices (parts) on the host backend: published and read whole, never a mix of two
//! generations, the retry when a part retired a generation under a slow reader, refusals. The host backend has no
//! devices: the parts' manifests name distinct made-up device UUIDs (`create_on`), which the reader's context
//! lookup is asked for; the pools themselves are host pools.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::manifest::{MANIFEST_PARTS_VERSION, SetParts, TENSOR_ALIGN};
use super::*;
use crate::door::DoorError;
use crate::pool::{AttachOptions, PoolError, PoolImporter};
use gpu_ipc_driver::DeviceUuid;
use ipc_core::host::{Host, HostContext};
use ipc_core::wire::RefusalCode;

const T: Duration = Duration::from_secs(5);

fn device(part: usize) -> DeviceUuid {
    DeviceUuid([0xd0 + part as u8; 16])
}

/// `n` tensors of assorted shapes, spread over `parts` parts unevenly (tensor i on part `i * 7 % parts`, and
/// tensor k on part k for the first parts, so that none is empty).
pub(super) fn spread(n: usize, parts: usize) -> Vec<(String, TensorDesc, usize)> {
    (0..n)
        .map(|i| {
            let desc = match i % 3 {
                0 => TensorDesc::contiguous(DType::F32, [4, 1 + i as u64 % 5]).unwrap(),
                1 => TensorDesc::contiguous(DType::BF16, [8]).unwrap(),
                _ => TensorDesc::contiguous(DType::I64, Vec::<u64>::new()).unwrap(),
            };
            let part = if i < parts { i } else { i * 7 % parts };
            (format!("layers.{i}.weight"), desc, part)
        })
        .collect()
}

pub(super) fn make(
    name: &str,
    tensors: Vec<(String, TensorDesc, usize)>,
    parts: usize,
    keep: usize,
) -> WeightsPartsOwner<Host> {
    let options = WeightsOptions { keep, max_arenas: keep as u32 + 4, ..WeightsOptions::default() };
    WeightsPartsOwner::<Host>::create_on(
        vec![HostContext; parts],
        vec![DeviceUuid::default(); parts],
        (0..parts).map(device).collect(),
        &super::tests::sock(name),
        "model",
        tensors,
        options,
    )
    .unwrap()
}

/// Tensor `index`'s bytes in `generation`: the generation in every 8-byte word's low bytes, the index beside it.
fn pattern(index: usize, generation: u64, len: u64) -> Vec<u8> {
    let word = (generation << 16 | index as u64).to_le_bytes();
    word.iter().copied().cycle().take(len as usize).collect()
}

pub(super) fn publish(owner: &mut WeightsPartsOwner<Host>, tensors: &[(String, TensorDesc, usize)]) -> u64 {
    let next = owner.generation() + 1;
    let data: Vec<Vec<u8>> =
        tensors.iter().enumerate().map(|(i, (_, d, _))| pattern(i, next, d.span_bytes())).collect();
    let refs: Vec<(&str, &[u8])> = tensors.iter().zip(&data).map(|((n, _, _), b)| (n.as_str(), b.as_slice())).collect();
    owner.update(&refs).unwrap()
}

/// Every tensor of `held`, in the publisher's order, holds its bytes of `held`'s generation, on its part.
fn check_whole(held: &HeldParts<Host>, tensors: &[(String, TensorDesc, usize)]) {
    let generation = held.generation();
    let listed: Vec<(usize, &str)> = held.tensors().map(|(part, e)| (part, e.name.as_str())).collect();
    let wanted: Vec<(usize, &str)> = tensors.iter().map(|(n, _, p)| (*p, n.as_str())).collect();
    assert_eq!(listed, wanted, "the publisher's order, each tensor on its part");
    for (k, part) in held.parts().iter().enumerate() {
        assert_eq!(part.generation(), generation, "part {k} holds another generation");
        assert_eq!(part.manifest().device_uuid, device(k));
    }
    for (i, (name, desc, _)) in tensors.iter().enumerate() {
        let mut got = vec![0u8; desc.span_bytes() as usize];
        held.read(name, &mut got).unwrap();
        assert_eq!(got, pattern(i, generation, desc.span_bytes()), "{name} of generation {generation}");
    }
}

/// Polls `condition` for up to two seconds.
fn until(condition: impl Fn() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < Duration::from_secs(2), "not within 2 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Opens the set, recording the device UUIDs the context lookup is asked for.
pub(super) fn open(owner: &WeightsPartsOwner<Host>) -> (WeightsPartsReader<Host>, Vec<DeviceUuid>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = asked.clone();
    let reader = WeightsPartsReader::<Host>::open(
        owner.path(),
        "model",
        move |uuid| {
            seen.lock().unwrap().push(uuid);
            Ok(HostContext)
        },
        T,
    )
    .unwrap();
    let asked = asked.lock().unwrap().clone();
    (reader, asked)
}

#[test]
fn sets_of_two_and_three_parts_are_read_whole_each_tensor_on_its_part_in_the_publishers_order() {
    for parts in [2, 3] {
        let tensors = spread(11, parts);
        let mut owner = make(&format!("whole-{parts}"), tensors.clone(), parts, 2);
        assert_eq!(owner.parts().len(), parts);
        assert_eq!(publish(&mut owner, &tensors), 1);
        let (mut reader, asked) = open(&owner);
        // Part 0's device as its (host) offer names it, then every other part's as part 0's manifest names it.
        let mut expected = vec![DeviceUuid::default()];
        expected.extend((1..parts).map(device));
        assert_eq!(asked, expected);
        assert_eq!((reader.part_count(), reader.generation()), (parts, 1));
        check_whole(&reader.held(), &tensors);
        let kept = reader.held();
        assert_eq!(publish(&mut owner, &tensors), 2);
        assert_eq!(reader.latest().unwrap(), 2);
        assert_eq!(reader.refresh().unwrap(), 2);
        check_whole(&reader.held(), &tensors);
        check_whole(&kept, &tensors); // what was held before still reads generation 1
        assert_eq!(kept.generation(), 1);
        // Each part knows its reader and the generations it holds (the door records an attach on its own thread).
        until(|| owner.readers().iter().all(|part| part.len() == 1));
        let holds = owner.readers();
        assert_eq!(holds.len(), parts);
        for (k, part) in holds.iter().enumerate() {
            assert_eq!(part.len(), 1, "part {k}: {part:?}");
            assert_eq!(part[0].generations, [1, 2], "part {k}");
            let name =
                if k == 0 { "weights reader of model".to_owned() } else { format!("weights reader of model part {k}") };
            assert_eq!(part[0].name, name);
        }
    }
}

#[test]
fn a_reader_refreshing_while_the_owner_publishes_never_holds_a_mix_of_two_generations() {
    let tensors = spread(9, 3);
    let mut owner = make("nomix", tensors.clone(), 3, 2);
    publish(&mut owner, &tensors);
    let (mut reader, _) = open(&owner);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checker = {
        let (done, tensors) = (done.clone(), tensors.clone());
        std::thread::spawn(move || {
            let mut checked = 0u32;
            let mut moved = 0u32;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let before = reader.generation();
                reader.refresh().unwrap();
                moved += u32::from(reader.generation() != before);
                check_whole(&reader.held(), &tensors);
                checked += 1;
            }
            (checked, moved)
        })
    };
    for _ in 0..300 {
        publish(&mut owner, &tensors);
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let (checked, moved) = checker.join().unwrap();
    assert!(checked > 0 && moved > 0, "the reader checked {checked} times and moved {moved} times");
}

#[test]
fn a_part_that_retired_the_generation_under_a_slow_reader_is_loaded_at_the_newer_one() {
    let tensors = spread(6, 2);
    let mut owner = make("retired", tensors.clone(), 2, 1);
    publish(&mut owner, &tensors);
    let reader = open(&owner).0;
    publish(&mut owner, &tensors); // generation 2 on both parts
    // The owner moves on part by part, as commit does (the higher parts first): part 1 publishes 3 and 4 (and
    // retires 2, keep 1), part 0 publishes 3 (and still keeps 2 beside it).
    let write_all = |part: &mut WeightsOwner<Host>| {
        let staged = part.stage().unwrap();
        for entry in staged.manifest().entries.clone() {
            staged.write(&entry.name, &vec![0xee; entry.span_bytes() as usize]).unwrap();
        }
        part.commit().unwrap()
    };
    assert_eq!(write_all(owner.part_mut(1)), 3);
    assert_eq!(write_all(owner.part_mut(1)), 4);
    assert_eq!(write_all(owner.part_mut(0)), 3);
    // A reader slow enough to have read the note 2 finds part 0's arena of 2 but not part 1's: it takes the newer
    // generation on every part, never 2 on one and another on the other.
    let (parts, _) = reader.load(2, false).unwrap();
    let generations: Vec<u64> = parts.iter().map(|p| p.generation()).collect();
    assert_eq!(generations, [3, 3]);
}

#[test]
fn a_reader_of_one_device_refuses_a_set_of_parts_and_the_parts_reader_refuses_a_set_on_one_device() {
    let tensors = spread(4, 2);
    let mut owner = make("refuse", tensors.clone(), 2, 2);
    publish(&mut owner, &tensors);
    let e = WeightsReader::<Host>::open(&HostContext, owner.path(), "model", T).unwrap_err();
    assert!(matches!(e, WeightsError::Parts { .. }), "{e}");
    assert!(e.to_string().contains("lies on 2 devices, one part each"), "{e}");
    // What a reader of a release before parts meets: a manifest of format version 2, which it refuses.
    let layout = owner.parts()[1].layout().encode();
    assert_eq!(&layout[8..10], &MANIFEST_PARTS_VERSION.to_le_bytes());

    let mut single = WeightsOwner::<Host>::create(
        &HostContext,
        super::tests::sock("refuse-single"),
        "model",
        super::tests::tensors(),
        WeightsOptions::default(),
    )
    .unwrap();
    super::tests::publish(&mut single);
    let e = WeightsPartsReader::<Host>::open(single.path(), "model", |_| Ok(HostContext), T).unwrap_err();
    assert!(matches!(e, WeightsError::Parts { .. }) && e.to_string().contains("open it with WeightsReader"), "{e}");
    assert!(single.readers().is_empty() || single.readers().iter().all(|r| r.generations.is_empty()));
}

#[test]
fn a_peer_asking_for_a_part_the_set_does_not_have_is_refused_and_ps_lists_each_part() {
    let tensors = spread(4, 2);
    let mut owner = make("hostile", tensors.clone(), 2, 2);
    publish(&mut owner, &tensors);
    let options = AttachOptions { name: "hostile".into(), ..AttachOptions::default() };
    let e = PoolImporter::<Host>::attach_part(&HostContext, owner.path(), &options, 7).unwrap_err();
    let PoolError::Door(DoorError::Refused { code, message }) = &e else { panic!("{e}") };
    assert_eq!(*code, RefusalCode::WrongObject);
    assert!(message.contains("part 7 asked of a pool of 2 parts"), "{message}");

    let (_reader, _) = open(&owner);
    until(|| owner.readers().iter().all(|part| part.len() == 1));
    let report = crate::door::status(owner.path(), T).unwrap();
    let mut details: Vec<String> = report.peers.iter().map(|p| p.detail.clone()).collect();
    details.sort();
    assert_eq!(details.len(), 2, "{details:?}");
    assert!(details[0].starts_with("part 0: note 1; holds 1 views of 1 buffers: model/1"), "{details:?}");
    assert!(details[1].starts_with("part 1: note 1; holds 1 views of 1 buffers: model/1"), "{details:?}");
}

#[test]
fn the_owners_end_is_seen_on_every_part_and_held_tensors_stay_readable() {
    let tensors = spread(5, 2);
    let mut owner = make("gone", tensors.clone(), 2, 2);
    publish(&mut owner, &tensors);
    let (reader, _) = open(&owner);
    let held = reader.held();
    let started = Instant::now();
    drop(owner);
    while !reader.owner_gone() {
        assert!(started.elapsed() < Duration::from_secs(1), "the owner's end not seen within 1 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(matches!(reader.latest(), Err(WeightsError::OwnerGone { .. })));
    check_whole(&held, &tensors);
}

#[test]
fn an_owner_refuses_parts_it_cannot_serve() {
    let desc = TensorDesc::contiguous(DType::F32, [2]).unwrap();
    let one = vec![("a".to_owned(), desc.clone(), 0)];
    let make = |name: &str, parts: usize, tensors: Vec<(String, TensorDesc, usize)>| {
        WeightsPartsOwner::<Host>::create(
            vec![HostContext; parts],
            super::tests::sock(name),
            "m",
            tensors,
            WeightsOptions::default(),
        )
    };
    let e = make("one-part", 1, one.clone()).unwrap_err();
    assert!(e.to_string().contains("1 parts: 2 to 256"), "{e}");
    let e = make("empty-part", 2, one).unwrap_err();
    assert!(e.to_string().contains("part 1 holds no tensor"), "{e}");
    let e = make("no-such-part", 2, vec![("a".into(), desc.clone(), 0), ("b".into(), desc, 5)]).unwrap_err();
    assert!(e.to_string().contains("tensor \"b\" on part 5 of 2"), "{e}");
}

/// A part's manifest to break: part 1 of 2, two entries.
fn part_manifest() -> Manifest {
    let entries: Vec<TensorEntry> = ["x", "y"]
        .iter()
        .map(|n| TensorEntry {
            name: (*n).to_owned(),
            desc: TensorDesc::contiguous(DType::F32, [4]).unwrap(),
            offset: 0,
            checksum: None,
        })
        .collect();
    let parts = SetParts { part: 1, devices: vec![device(0), device(1)], set_tensors: 5, positions: vec![4, 1] };
    let mut m = Manifest {
        set_name: "m".into(),
        generation: 2,
        device_uuid: device(1),
        arena_bytes: 0,
        entries,
        parts: Some(parts),
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
fn a_parts_manifest_round_trips_and_every_broken_parts_section_is_refused() {
    let m = part_manifest();
    let bytes = m.encode();
    assert_eq!(&bytes[8..10], &MANIFEST_PARTS_VERSION.to_le_bytes());
    assert_eq!(Manifest::decode(&bytes, m.arena_bytes).unwrap(), m);
    for end in 0..bytes.len() {
        assert!(Manifest::decode(&bytes[..end], m.arena_bytes).is_err(), "prefix {end}");
    }
    let broken = |edit: &dyn Fn(&mut SetParts, &mut Manifest)| {
        let mut bad = part_manifest();
        let mut parts = bad.parts.clone().unwrap();
        edit(&mut parts, &mut bad);
        bad.parts = Some(parts);
        Manifest::decode(&bad.encode(), bad.arena_bytes).unwrap_err().to_string()
    };
    let e = broken(&|p, _| p.part = 2);
    assert!(e.contains("manifest field part: 2 of a set of 2 parts"), "{e}");
    assert!(
        broken(&|p, m| {
            p.devices.truncate(1);
            p.part = 0;
            m.device_uuid = device(0);
        })
        .contains("1: 2 to 256")
    );
    assert!(broken(&|p, _| p.positions = vec![1, 1]).contains("given to two tensors"));
    assert!(broken(&|p, _| p.positions = vec![5, 0]).contains("beyond the set's 5 tensors"));
    assert!(broken(&|p, _| p.set_tensors = 1).contains("this part alone has 2"));
    assert!(broken(&|_, m| m.device_uuid = device(0)).contains("not the header's device UUID"));
}

#[test]
fn a_set_opened_without_saying_its_kind_is_attached_once_whole_or_in_parts() {
    // A set of parts: part 0 attached once (a reader that tried it as one device first would show twice).
    let tensors = spread(9, 3);
    let mut owner = make("opened-parts", tensors.clone(), 3, 2);
    publish(&mut owner, &tensors);
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = asked.clone();
    let lookup = move |uuid| {
        seen.lock().unwrap().push(uuid);
        Ok(HostContext)
    };
    let OpenedSet::Parts(reader) = OpenedSet::<Host>::open(owner.path(), "model", lookup, T).unwrap() else {
        panic!("a set of 3 parts opened as one device");
    };
    check_whole(&reader.held(), &tensors);
    // Asked once for each part: part 0's device as its offer names it (the host pool's), then parts 1 and 2 as the
    // manifest names them.
    assert_eq!(*asked.lock().unwrap(), [DeviceUuid::default(), device(1), device(2)]);
    until(|| owner.readers().iter().all(|part| part.len() == 1));
    std::thread::sleep(Duration::from_millis(20)); // a second attach, if any, would show by now
    assert!(owner.readers().iter().all(|part| part.len() == 1), "{:?}", owner.readers());
    drop(reader);

    // A set on one device: a one-device reader, on the one attachment.
    let path = super::tests::sock("opened-whole");
    let mut whole =
        WeightsOwner::<Host>::create(&HostContext, &path, "model", super::tests::tensors(), WeightsOptions::default())
            .unwrap();
    super::tests::publish(&mut whole);
    let OpenedSet::Whole(reader) = OpenedSet::<Host>::open(&path, "model", |_| Ok(HostContext), T).unwrap() else {
        panic!("a set on one device opened as parts");
    };
    assert_eq!(reader.generation(), 1);
    until(|| whole.readers().len() == 1);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(whole.readers().len(), 1);
    assert_eq!(whole.readers()[0].name, "weights reader of model");
}
