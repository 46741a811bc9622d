//! A pool made of parts on the host backend: one socket, each importer served the part its hello names.

use std::path::PathBuf;

use super::*;
use crate::door::DoorError;
use gpu_ipc_driver::DeviceUuid;
use ipc_core::host::{Host, HostContext};
use ipc_core::wire::RefusalCode;

fn sock(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-pool-parts-{}-{name}.sock", std::process::id()))
}

fn parts(name: &str, n: usize) -> Vec<SharedPool<Host>> {
    let parts = (0..n).map(|_| (HostContext, PoolConfig::new(1 << 16), DeviceUuid::default())).collect();
    SharedPool::<Host>::create_parts_on(&sock(name), parts).unwrap()
}

fn attach(path: &std::path::Path, part: u32) -> Result<PoolImporter<Host>, PoolError> {
    let options = AttachOptions { name: format!("part-{part}"), ..AttachOptions::default() };
    PoolImporter::<Host>::attach_part(&HostContext, path, &options, part)
}

#[test]
fn each_importer_is_served_the_part_it_names_through_one_socket() {
    let pools = parts("three", 3);
    let path = pools[0].path().to_path_buf();
    for (i, pool) in pools.iter().enumerate() {
        assert_eq!((pool.part(), pool.path()), (i as u32, path.as_path()));
        let buffer = pool.alloc("b", 64, 256, None).unwrap();
        buffer.write(0, &[i as u8 + 1; 64]).unwrap();
        std::mem::forget(buffer);
        pool.set_note(10 + i as u64);
    }
    let importers: Vec<_> = (0..3).map(|part| attach(&path, part).unwrap()).collect();
    for (i, importer) in importers.iter().enumerate() {
        assert_eq!(importer.note(), 10 + i as u64, "part {i}'s own note word");
        let mut bytes = [0u8; 64];
        importer.lookup("b").unwrap().read(0, &mut bytes).unwrap();
        assert_eq!(bytes, [i as u8 + 1; 64], "part {i}'s own buffer");
    }
    // Each part lists its own peers; the door's status lists them all, each with its part.
    for (i, pool) in pools.iter().enumerate() {
        // The door records an attach after the importer's `Attached`, on its own thread.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while pool.peers().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let names: Vec<String> = pool.peers().into_iter().map(|p| p.name).collect();
        assert_eq!(names, [format!("part-{i}")]);
    }
    let report = crate::door::status(&path, std::time::Duration::from_secs(2)).unwrap();
    let mut details: Vec<String> = report.peers.iter().map(|p| p.detail.clone()).collect();
    details.sort();
    assert!(details[0].starts_with("part 0: note 10; holds"), "{details:?}");
    assert!(details[2].starts_with("part 2: note 12; holds"), "{details:?}");
}

#[test]
fn a_part_that_does_not_exist_is_refused_and_a_pool_served_whole_refuses_any_part() {
    let pools = parts("two", 2);
    let error = attach(pools[0].path(), 7).unwrap_err();
    let PoolError::Door(DoorError::Refused { code, message }) = &error else { panic!("{error}") };
    assert_eq!(*code, RefusalCode::WrongObject);
    assert!(message.contains("part 7 asked of a pool of 2 parts (0 to 1)"), "{message}");
    assert!(pools.iter().all(|p| p.peers().is_empty()));

    let whole = SharedPool::<Host>::create(&HostContext, sock("whole"), PoolConfig::new(1 << 16)).unwrap();
    let error = attach(whole.path(), 1).unwrap_err();
    let PoolError::Door(DoorError::Refused { code, message }) = &error else { panic!("{error}") };
    assert_eq!(*code, RefusalCode::WrongObject);
    assert!(message.contains("not made of parts"), "{message}");
    assert!(attach(whole.path(), 0).is_ok());
}

#[test]
fn the_socket_closes_with_the_last_part_and_importers_see_the_owner_gone() {
    let mut pools = parts("close", 2);
    let path = pools[0].path().to_path_buf();
    let one = attach(&path, 1).unwrap();
    let zero = attach(&path, 0).unwrap();
    let last = pools.pop().unwrap();
    drop(pools);
    assert!(zero.owner_gone(), "part 0's directory says closed");
    drop(last);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while !one.owner_gone() {
        assert!(std::time::Instant::now() < deadline, "part 1's importer never saw the owner go");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!path.exists(), "the socket file is removed");
}
