//! The pool end to end in one process on the host backend: the owner, its door and block channel, importers.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::*;
use gpu_ipc_driver::DevicePtr;
use ipc_core::backend::Backend;
use ipc_core::host::{Host, HostContext};
use ipc_core::wire::RefusalCode;

fn sock(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-pool-unit-{}-{name}.sock", std::process::id()))
}

fn pool(name: &str, config: PoolConfig) -> SharedPool<Host> {
    SharedPool::<Host>::create(&HostContext, sock(name), config).unwrap()
}

fn importer(pool: &SharedPool<Host>) -> PoolImporter<Host> {
    PoolImporter::<Host>::attach(&HostContext, pool.path(), &AttachOptions::default()).unwrap()
}

/// Polls `condition` for up to two seconds.
fn eventually(mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

#[test]
fn an_importer_finds_buffers_made_before_and_after_it_attached_and_reads_their_bytes() {
    let pool = pool("names", PoolConfig::new(1 << 20));
    let desc = TensorDesc::contiguous(DType::F32, [4, 8]).unwrap();
    let before = pool.alloc("weights/layer0", 128, 256, Some(desc.clone())).unwrap();
    before.write(0, &[7; 128]).unwrap();
    let imp = importer(&pool);
    let after = pool.alloc("weights/layer1", 1000, 4096, None).unwrap();
    after.write(990, b"0123456789").unwrap();
    assert_eq!(after.ptr().raw() % 4096, 0, "aligned as asked");

    let view = imp.lookup("weights/layer0").unwrap();
    assert_eq!((view.len(), view.desc(), view.generation()), (128, Some(&desc), before.generation()));
    let mut bytes = [0u8; 128];
    view.read(0, &mut bytes).unwrap();
    assert_eq!(bytes, [7; 128]);
    let later = imp.lookup("weights/layer1").unwrap();
    let mut tail = [0u8; 10];
    later.read(990, &mut tail).unwrap();
    assert_eq!(&tail, b"0123456789");
    assert!(later.read(995, &mut tail).is_err(), "reads past the buffer are refused");
    assert_eq!(imp.mapped_blocks(), 1, "both lie in the one block mapped at attach");
    assert!(matches!(imp.lookup("weights/layer2"), Err(PoolError::NotFound { .. })));

    let mut names: Vec<String> = imp.list().unwrap().into_iter().map(|i| i.name).collect();
    names.sort();
    assert_eq!(names, ["weights/layer0", "weights/layer1"]);
    // A write through the view is seen by the owner: the same memory.
    view.write(0, &[9; 4]).unwrap();
    let mut seen = [0u8; 4];
    before.read(0, &mut seen).unwrap();
    assert_eq!(seen, [9; 4]);
}

#[test]
fn a_freed_buffer_is_not_reused_while_an_importer_holds_a_view_and_stale_handles_are_refused() {
    let pool = pool("pins", PoolConfig::new(4096));
    let imp = importer(&pool);
    let a = pool.alloc("a", 4096, 256, None).unwrap();
    let (a_ptr, a_gen) = (a.ptr(), a.generation());
    a.write(0, &[1; 4096]).unwrap();
    let view = imp.lookup("a").unwrap();
    assert_eq!(view.pins(), 1);
    pool.free_name("a").unwrap();
    assert!(matches!(imp.lookup("a"), Err(PoolError::NotFound { .. })), "freed names are not found");
    // The handle of the freed buffer is stale now.
    let err = pool.free(a).unwrap_err();
    assert!(matches!(err, PoolError::StaleBuffer { held_generation, current: None, .. } if held_generation == a_gen));
    // The only block is full of the pinned buffer: nothing fits until the view goes.
    let err = pool.alloc("b", 4096, 256, None).unwrap_err();
    assert!(matches!(err, PoolError::OutOfMemory { pending_reuse: 4096, .. }), "{err}");
    let stats = pool.stats();
    assert_eq!((stats.pending_buffers, stats.pending_bytes, stats.free_bytes), (1, 4096, 0));
    assert!(matches!(view.check_current(), Err(PoolError::StaleBuffer { current: None, .. })));
    let mut kept = [0u8; 8];
    view.read(0, &mut kept).unwrap();
    assert_eq!(kept, [1; 8], "the view's bytes are intact");
    drop(view);
    let b = pool.alloc("b", 4096, 256, None).unwrap();
    assert_eq!(b.ptr(), a_ptr, "reused once unpinned");
    // The name reused by a new buffer: an old view would name the new generation.
    pool.free(b).unwrap();
    let c = pool.alloc("a", 256, 256, None).unwrap();
    assert!(c.generation() > a_gen);
    let stats = pool.stats();
    assert_eq!(stats.live_bytes + stats.pending_bytes + stats.free_bytes, stats.capacity_bytes);
    assert_eq!(stats.high_water_bytes, 4096);
}

#[test]
fn a_view_sees_when_its_name_was_given_to_a_new_buffer() {
    let pool = pool("stale", PoolConfig::new(1 << 16));
    let imp = importer(&pool);
    let old = pool.alloc("kv/0", 512, 256, None).unwrap();
    let view = imp.lookup("kv/0").unwrap();
    assert!(view.check_current().is_ok());
    let old_gen = old.generation();
    pool.free(old).unwrap();
    let new = pool.alloc("kv/0", 512, 256, None).unwrap();
    match view.check_current().unwrap_err() {
        PoolError::StaleBuffer { name, held_generation, current } => {
            assert_eq!((name.as_str(), held_generation, current), ("kv/0", old_gen, Some(new.generation())));
        }
        other => panic!("{other}"),
    }
    assert_ne!(view.ptr(), imp.lookup("kv/0").unwrap().ptr(), "the pinned bytes were not given to the new buffer");
}

#[test]
fn a_handle_kept_after_its_buffer_was_freed_refuses_every_use_and_holds_the_bytes_until_dropped() {
    let pool = pool("stale-handle", PoolConfig::new(4096));
    let a = pool.alloc("a", 4096, 256, None).unwrap();
    a.write(0, &[1; 16]).unwrap();
    a.check_current().unwrap();
    pool.free_name("a").unwrap();
    assert!(a.is_freed());
    let stale = |e: PoolError| matches!(e, PoolError::StaleBuffer { ref name, held_generation, current: None } if name == "a" && held_generation == a.generation());
    assert!(stale(a.write(0, &[2; 16]).unwrap_err()), "a write through a freed handle is refused");
    let mut seen = [0u8; 16];
    assert!(stale(a.read(0, &mut seen).unwrap_err()));
    assert!(stale(a.check_current().unwrap_err()));
    // The handle holds the bytes (a span borrowed before the free may still be in use): nothing fits meanwhile.
    assert_eq!(pool.stats().pending_buffers, 1);
    assert!(matches!(pool.alloc("b", 4096, 256, None), Err(PoolError::OutOfMemory { pending_reuse: 4096, .. })));
    let a_gen = a.generation();
    drop(a);
    let b = pool.alloc("a", 4096, 256, None).unwrap();
    assert!(b.generation() > a_gen);
    b.write(0, &[3; 16]).unwrap();
    // A stale handle of a name given to a new buffer says which generation the name holds now.
    let old = pool.alloc("d", 256, 256, None);
    assert!(matches!(old, Err(PoolError::OutOfMemory { .. })), "the block is b's");
    drop(old);
    pool.free(b).unwrap();
    let d = pool.alloc("d", 256, 256, None).unwrap();
    pool.free_name("d").unwrap();
    let e = pool.alloc("d", 256, 256, None).unwrap();
    match d.write(0, &[4; 4]).unwrap_err() {
        PoolError::StaleBuffer { held_generation, current, .. } => {
            assert_eq!((held_generation, current), (d.generation(), Some(e.generation())));
        }
        other => panic!("{other}"),
    }
    assert_ne!(d.ptr(), e.ptr(), "the bytes d's handle holds were not given to e");
}

#[test]
fn a_freed_buffer_is_not_found_at_once_and_goes_back_only_when_unpinned_and_its_handle_is_gone() {
    let pool = pool("reclaim", PoolConfig::sharing_only());
    let imp = importer(&pool);
    let region = Host::allocate(&HostContext, 4096).unwrap();
    let base = ipc_core::backend::SharedRegion::ptr(&region);
    region.write(base.offset(64), b"held").unwrap();
    let shared = pool.share_existing("t", base.offset(64), 4, None).unwrap();
    let watch = shared.reclaim_watch();
    let view = imp.lookup("t").unwrap();
    pool.free(shared).unwrap();
    assert!(watch.is_freed() && !watch.is_reclaimed());
    assert!(matches!(imp.lookup("t"), Err(PoolError::NotFound { .. })), "no new lookup once freed");
    assert!(!imp.list().unwrap().iter().any(|b| b.name == "t"));
    // Pinned: the memory another allocator made stays the pool's, however often the owner polls.
    for _ in 0..3 {
        assert_eq!(pool.reclaim(), 0);
        assert!(!watch.is_reclaimed());
        assert_eq!(pool.stats().shared_allocations, 1);
    }
    let mut seen = [0u8; 4];
    view.read(0, &mut seen).unwrap();
    assert_eq!(&seen, b"held");
    drop(view);
    assert_eq!(pool.reclaim(), 1, "unpinned: it goes back at the next poll");
    assert!(watch.is_reclaimed());
    assert_eq!(pool.stats().shared_allocations, 0);
}

#[test]
fn an_importer_refuses_a_pool_on_another_device_naming_both() {
    let other = gpu_ipc_driver::DeviceUuid([7; 16]);
    let pool = SharedPool::<Host>::create_on(&HostContext, &sock("uuid"), PoolConfig::new(4096), other).unwrap();
    let err = PoolImporter::<Host>::attach(&HostContext, pool.path(), &AttachOptions::default()).unwrap_err();
    match &err {
        PoolError::WrongDevice { offered, here, .. } => {
            assert_eq!((*offered, *here), (other, gpu_ipc_driver::DeviceUuid::default()));
        }
        other => panic!("{other}"),
    }
    let message = err.to_string();
    assert!(
        message.contains(&other.to_string()) && message.contains(&gpu_ipc_driver::DeviceUuid::default().to_string())
    );
    assert!(message.contains("attach from a context on the pool's GPU"), "{message}");
    assert!(eventually(|| pool.stats().importers == 0), "the refused importer is not counted");
}

#[test]
fn the_pool_grows_by_blocks_up_to_its_limit_and_importers_map_new_blocks_on_first_lookup() {
    let mut config = PoolConfig::new(4096);
    config.max_blocks = 3;
    config.grow_bytes = 8192;
    let pool = pool("grow", config);
    let imp = importer(&pool);
    let _a = pool.alloc("a", 4096, 256, None).unwrap();
    let b = pool.alloc("b", 4096, 256, None).unwrap();
    let _c = pool.alloc("c", 10_000, 256, None).unwrap();
    assert_eq!(pool.stats().blocks, 3);
    let err = pool.alloc("d", 8192, 256, None).unwrap_err();
    assert!(matches!(err, PoolError::OutOfMemory { blocks: 3, max_blocks: 3, .. }), "{err}");
    assert_eq!(imp.mapped_blocks(), 1);
    b.write(4000, &[5; 96]).unwrap();
    let view = imp.lookup("b").unwrap();
    let mut seen = [0u8; 96];
    view.read(4000, &mut seen).unwrap();
    assert_eq!(seen, [5; 96]);
    imp.lookup("c").unwrap();
    assert_eq!(imp.mapped_blocks(), 3, "one import per new block, at first lookup");
}

#[test]
fn existing_allocations_are_shared_in_place_one_export_per_allocation() {
    let pool = pool("existing", PoolConfig::sharing_only());
    let imp = importer(&pool);
    let region = Host::allocate(&HostContext, 8192).unwrap();
    let base = ipc_core::backend::SharedRegion::ptr(&region);
    region.write(base.offset(100), b"tensor-one").unwrap();
    region.write(base.offset(5000), b"tensor-two").unwrap();
    let one = pool.share_existing("one", base.offset(100), 10, None).unwrap();
    let _two = pool.share_existing("two", base.offset(5000), 10, None).unwrap();
    assert_eq!(pool.stats().shared_allocations, 1, "two tensors of one allocation: one export");
    assert!(one.write(0, b"x").is_err(), "the owner writes existing memory through its own handle");
    let (v1, v2) = (imp.lookup("one").unwrap(), imp.lookup("two").unwrap());
    let mut seen = [0u8; 10];
    v1.read(0, &mut seen).unwrap();
    assert_eq!(&seen, b"tensor-one");
    v2.read(0, &mut seen).unwrap();
    assert_eq!(&seen, b"tensor-two");
    // Freed while viewed: the allocation stays exported until the last view goes.
    pool.free(one).unwrap();
    pool.free_name("two").unwrap();
    assert_eq!(pool.stats().shared_allocations, 1);
    drop((v1, v2)); // `_two`, a handle of memory shared in place, gives no access to it: it holds nothing
    assert!(eventually(|| pool.stats().shared_allocations == 0));
    // The importer lets go of its mapping at its next lookup.
    assert_eq!(imp.mapped_blocks(), 1);
    assert!(matches!(imp.lookup("one"), Err(PoolError::NotFound { .. })));
    assert_eq!(imp.mapped_blocks(), 0, "the retired allocation is unmapped");
    // Memory the backend cannot find, and a range that runs past its allocation, are refused with the reason.
    let err = pool.share_existing("nowhere", DevicePtr(8), 8, None).unwrap_err();
    assert!(err.to_string().contains("no live region"), "{err}");
    let err = pool.share_existing("long", base.offset(8000), 500, None).unwrap_err();
    assert!(err.to_string().contains("run past the memory mapped there"), "{err}");
    assert!(matches!(pool.alloc("x", 8, 8, None), Err(PoolError::OutOfMemory { max_blocks: 0, .. })));
}

/// The bytes a test writes at offset `i` of a range made of several allocations.
fn span_byte(i: usize) -> u8 {
    (i * 31 % 253) as u8
}

#[test]
fn a_range_over_several_allocations_side_by_side_is_shared_as_one_span_and_read_across_their_boundaries() {
    let page = rustix::param::page_size() as u64;
    let pool = pool("side-by-side", PoolConfig::sharing_only());
    let imp = importer(&pool);
    // Four allocations side by side, as an expandable segment maps them: 2, 1, 3 and 2 pages.
    let sizes = [2 * page, page, 3 * page, 2 * page];
    let region = Host::allocate_side_by_side(&HostContext, &sizes).unwrap();
    let base = ipc_core::backend::SharedRegion::ptr(&region);
    let mut all: Vec<u8> = (0..8 * page as usize).map(span_byte).collect();
    region.write(base, &all).unwrap();
    // Inside the first allocation; over the first two; from the second to the last; all of it.
    let ranges =
        [("inside", 100, 1000), ("two", page + 8, page), ("three", 2 * page + 64, 5 * page), ("all", 0, 8 * page)];
    let mut handles = Vec::new();
    for (name, offset, len) in ranges {
        handles.push(pool.share_existing(name, base.offset(offset), len, None).unwrap());
    }
    assert_eq!(pool.stats().shared_allocations, 4, "one block per run of allocations a range spans");
    for (name, offset, len) in ranges {
        let view = imp.lookup(name).unwrap();
        let mut seen = vec![0u8; len as usize];
        view.read(0, &mut seen).unwrap();
        let wrong = seen.iter().zip(&all[offset as usize..]).filter(|(a, b)| a != b).count();
        assert_eq!(wrong, 0, "{name}: {wrong} wrong bytes");
        // The importer writes over the boundary at 3 pages; the owner sees it there.
        if name == "three" {
            view.write(3 * page - 4 - offset, b"boundary").unwrap();
            let mut back = [0u8; 8];
            region.read(base.offset(3 * page - 4), &mut back).unwrap();
            assert_eq!(&back, b"boundary");
            all[3 * page as usize - 4..3 * page as usize + 4].copy_from_slice(b"boundary");
        }
    }
    // The same run of allocations shared again uses its block; a range that runs past the region is refused.
    let again = pool.share_existing("again", base.offset(page + 16), page, None).unwrap();
    assert_eq!(pool.stats().shared_allocations, 4);
    let err = pool.share_existing("past", base.offset(7 * page), 2 * page, None).unwrap_err();
    assert!(err.to_string().contains("run past the memory mapped there"), "{err}");
    // The allocations stay alive for the importer after the owner's allocator let go of them.
    let view = imp.lookup("all").unwrap();
    drop(region);
    for handle in handles.into_iter().chain([again]) {
        pool.free(handle).unwrap();
    }
    let mut seen = vec![0u8; 8 * page as usize];
    view.read(0, &mut seen).unwrap();
    assert!(seen == all, "the importer's view is intact after the owner let go");
    drop(view);
    assert!(eventually(|| pool.stats().shared_allocations == 0), "every block goes once no view holds it");
}

#[test]
fn an_importer_refuses_a_span_whose_pieces_overlap_leave_gaps_do_not_fit_or_are_too_many() {
    let page = rustix::param::page_size() as u64;
    let region = Host::allocate_side_by_side(&HostContext, &[page, page]).unwrap();
    let export = Host::export_existing(&HostContext, ipc_core::backend::SharedRegion::ptr(&region), 2 * page).unwrap();
    assert_eq!((export.pieces.len(), export.span_bytes(), export.offset), (2, 2 * page, 0));
    let fd = |i: usize| region.memory().try_clone_piece_fd(i).unwrap();
    let piece = |i: usize, offset: u64, size: u64| ipc_core::backend::SpanPiece {
        offset,
        handle: ipc_core::backend::ExportedHandle { bytes: Vec::new(), fd: Some(fd(i)), size },
    };
    let refusal = |pieces| Host::import_span(&HostContext, pieces).unwrap_err().to_string();
    assert!(refusal(vec![piece(0, 0, page), piece(1, page / 2, page)]).contains("overlaps"));
    assert!(refusal(vec![piece(0, 0, page), piece(1, 2 * page, page)]).contains("gap"));
    // A size that is not the memfd's, and one that is not whole pages.
    assert!(refusal(vec![piece(0, 0, page), piece(1, page, 2 * page)]).contains("expected"));
    assert!(refusal(vec![piece(0, 0, page - 8), piece(1, page - 8, page)]).contains("multiple"));
    let many: Vec<_> = (0..=ipc_core::backend::MAX_SPAN_ALLOCATIONS as u64).map(|i| piece(0, i * page, page)).collect();
    assert!(refusal(many).contains("between 1 and"));
    let mut no_fd = vec![piece(0, 0, page), piece(1, page, page)];
    no_fd[1].handle.fd = None;
    assert!(refusal(no_fd).contains("no fd"));
    // And the right pieces map.
    let span = Host::import_span(&HostContext, vec![piece(0, 0, page), piece(1, page, page)]).unwrap();
    assert_eq!(ipc_core::backend::SharedRegion::len(&span), 2 * page);
}

#[test]
fn an_importer_that_leaves_is_forgotten_and_a_view_outlives_its_importer() {
    let pool = pool("gone", PoolConfig::new(4096));
    let a = pool.alloc("a", 4096, 256, None).unwrap();
    a.write(0, &[4; 16]).unwrap();
    let (first, second) = (importer(&pool), importer(&pool));
    assert_eq!(pool.stats().importers, 2);
    let view = first.lookup("a").unwrap();
    drop(first);
    pool.free(a).unwrap();
    // The view keeps its importer (and its pin) alive.
    assert_eq!(pool.stats().pending_buffers, 1);
    let mut seen = [0u8; 16];
    view.read(0, &mut seen).unwrap();
    assert_eq!(seen, [4; 16]);
    drop(second);
    assert!(eventually(|| pool.stats().importers == 1), "the importer that left is forgotten");
    drop(view);
    assert!(eventually(|| pool.stats().importers == 0 && pool.stats().pending_buffers == 0));
    assert!(pool.alloc("b", 4096, 256, None).is_ok());
}

#[test]
fn names_descriptions_and_limits_are_checked_with_the_reason() {
    let mut config = PoolConfig::new(1 << 16);
    config.max_buffers = 3;
    config.max_importers = 1;
    let pool = pool("limits", config);
    let err = pool.alloc("", 8, 8, None).unwrap_err();
    assert!(matches!(err, PoolError::InvalidName { .. }), "{err}");
    let long = "n".repeat(129);
    assert!(matches!(pool.alloc(&long, 8, 8, None), Err(PoolError::InvalidName { .. })));
    assert!(matches!(pool.alloc("z", 0, 8, None), Err(PoolError::InvalidRequest { .. })));
    assert!(matches!(pool.alloc("z", 8, 3, None), Err(PoolError::InvalidRequest { .. })));
    let too_big = TensorDesc::contiguous(DType::F64, [2, 2]).unwrap();
    let err = pool.alloc("t", 16, 8, Some(too_big)).unwrap_err();
    assert!(err.to_string().contains("spans 32 bytes"), "{err}");
    let _x = pool.alloc("x", 8, 8, None).unwrap();
    assert!(matches!(pool.alloc("x", 8, 8, None), Err(PoolError::NameTaken { .. })));
    let _y = pool.alloc("y", 8, 8, None).unwrap();
    let _z = pool.alloc("z", 8, 8, None).unwrap();
    assert!(matches!(pool.alloc("w", 8, 8, None), Err(PoolError::DirectoryFull { limit: 3 })));
    let _first = importer(&pool);
    let err = PoolImporter::<Host>::attach(&HostContext, pool.path(), &AttachOptions::default()).unwrap_err();
    match err {
        PoolError::Door(crate::door::DoorError::Refused { code, message }) => {
            assert_eq!(code, RefusalCode::RingFull);
            assert!(message.contains("at most 1 importers"), "{message}");
        }
        other => panic!("{other}"),
    }
    let err =
        SharedPool::<Host>::create(&HostContext, sock("bad"), PoolConfig { max_buffers: 0, ..PoolConfig::new(8) })
            .unwrap_err();
    assert!(err.to_string().contains("max_buffers 0"), "{err}");
}

#[test]
fn when_the_owner_closes_lookups_say_so_and_views_stay_readable() {
    let pool = pool("close", PoolConfig::new(4096));
    let a = pool.alloc("a", 64, 64, None).unwrap();
    a.write(0, &[3; 64]).unwrap();
    let imp = importer(&pool);
    let view = imp.lookup("a").unwrap();
    drop(a);
    drop(pool);
    match imp.lookup("a").unwrap_err() {
        PoolError::OwnerGone { how, .. } => assert_eq!(how, "closed the pool"),
        other => panic!("{other}"),
    }
    assert!(imp.owner_gone());
    let mut seen = [0u8; 64];
    view.read(0, &mut seen).unwrap();
    assert_eq!(seen, [3; 64], "the memory outlives the owner for the views that hold it");
}

/// A buffer's content in the model check: its generation in every 8 bytes.
fn pattern(generation: u64, len: u64) -> Vec<u8> {
    generation.to_le_bytes().iter().copied().cycle().take(len as usize).collect()
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { name: u8, len: u64, align_log2: u32 },
    Free { name: u8 },
    Lookup { name: u8 },
    DropView { pick: usize },
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0u8..12, 1u64..6000, 0u32..13).prop_map(|(name, len, align_log2)| Op::Alloc { name, len, align_log2 }),
        3 => (0u8..12).prop_map(|name| Op::Free { name }),
        3 => (0u8..12).prop_map(|name| Op::Lookup { name }),
        2 => proptest::prelude::any::<usize>().prop_map(|pick| Op::DropView { pick }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    /// Owner and importer in one process, random alloc/free/lookup/drop: every live buffer keeps its own content
    /// (no two overlap), every view keeps the content of the generation it holds until it is dropped (freed bytes
    /// are never reused under it), and the byte counts add up.
    #[test]
    fn buffers_never_overlap_and_views_are_never_reused_under(ops in proptest::collection::vec(op(), 1..150)) {
        use std::collections::HashMap;
        let pool = pool("model", PoolConfig::new(64 * 1024));
        let imp = importer(&pool);
        let mut live: HashMap<u8, BufferHandle<Host>> = HashMap::new();
        let mut views: Vec<BufferView<Host>> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { name, len, align_log2 } => {
                    match pool.alloc(&format!("b{name}"), len, 1 << align_log2, None) {
                        Ok(handle) => {
                            proptest::prop_assert!(!live.contains_key(&name));
                            proptest::prop_assert_eq!(handle.ptr().raw() % (1u64 << align_log2.max(8)), 0);
                            handle.write(0, &pattern(handle.generation(), len)).unwrap();
                            live.insert(name, handle);
                        }
                        Err(PoolError::NameTaken { .. }) => proptest::prop_assert!(live.contains_key(&name)),
                        Err(PoolError::OutOfMemory { .. }) => {}
                        Err(other) => proptest::prop_assert!(false, "{}", other),
                    }
                }
                Op::Free { name } => match live.remove(&name) {
                    Some(handle) => pool.free(handle).unwrap(),
                    None => {
                        let refused = matches!(pool.free_name(&format!("b{name}")), Err(PoolError::NotFound { .. }));
                        proptest::prop_assert!(refused, "freeing a name that is not live");
                    }
                },
                Op::Lookup { name } => match imp.lookup(&format!("b{name}")) {
                    Ok(view) => {
                        let handle = live.get(&name);
                        proptest::prop_assert_eq!(Some(view.generation()), handle.map(BufferHandle::generation));
                        views.push(view);
                    }
                    Err(PoolError::NotFound { .. }) => proptest::prop_assert!(!live.contains_key(&name)),
                    Err(other) => proptest::prop_assert!(false, "{}", other),
                },
                Op::DropView { pick } if !views.is_empty() => drop(views.swap_remove(pick % views.len())),
                Op::DropView { .. } => {}
            }
            for handle in live.values() {
                let mut bytes = vec![0u8; handle.len() as usize];
                handle.read(0, &mut bytes).unwrap();
                proptest::prop_assert!(bytes == pattern(handle.generation(), handle.len()), "live {} overwritten", handle.name());
            }
            for view in &views {
                let mut bytes = vec![0u8; view.len() as usize];
                view.read(0, &mut bytes).unwrap();
                proptest::prop_assert!(bytes == pattern(view.generation(), view.len()), "view of {} reused", view.name());
            }
            let stats = pool.stats();
            proptest::prop_assert_eq!(stats.live_bytes + stats.pending_bytes + stats.free_bytes, stats.capacity_bytes);
            proptest::prop_assert_eq!(stats.live_buffers as usize, live.len());
        }
        drop(views);
        for (_, handle) in live.drain() {
            pool.free(handle).unwrap();
        }
        let stats = pool.stats();
        proptest::prop_assert_eq!((stats.live_bytes, stats.pending_bytes, stats.free_ranges), (0, 0, 1), "nothing leaks");
    }
}

#[test]
fn the_pool_types_can_be_shared_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<SharedPool<Host>>();
    send_sync::<PoolImporter<Host>>();
    send_sync::<BufferView<Host>>();
    send_sync::<BufferHandle<Host>>();
    send_sync::<ReclaimWatch>();
    send_sync::<PoolStats>();
}
