//! Unit tests of the shared-memory owners.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::MemfdFlags;
use rustix::io::Errno;

use super::{ReadOnlyMemory, SharedMemory, SharedObject, ShmError};

#[test]
fn create_map_and_reattach_share_bytes() {
    let first = SharedMemory::create("shm-unit", 4096).unwrap();
    assert_eq!(first.len(), 4096);
    assert_eq!(first.as_ptr() as usize % 4096, 0, "mapping must be page aligned");
    let second = SharedMemory::from_fd(first.try_clone_fd().unwrap(), 4096).unwrap();
    let a = SharedObject::<[AtomicU64; 4]>::new(first).unwrap();
    let b = SharedObject::<[AtomicU64; 4]>::new(second).unwrap();
    a.get()[3].store(0xfeed, Ordering::SeqCst);
    assert_eq!(b.get()[3].load(Ordering::SeqCst), 0xfeed);
    assert_eq!(b.get()[0].load(Ordering::SeqCst), 0, "fresh memfd is zero-filled");
}

#[test]
fn from_fd_rejects_wrong_size_and_missing_seals() {
    let shm = SharedMemory::create("shm-size", 8192).unwrap();
    let err = SharedMemory::from_fd(shm.try_clone_fd().unwrap(), 4096).unwrap_err();
    assert!(matches!(err, ShmError::SizeMismatch { expected: 4096, actual: 8192 }), "{err}");

    let unsealed = rustix::fs::memfd_create("unsealed", MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&unsealed, 4096).unwrap();
    let err = SharedMemory::from_fd(unsealed, 4096).unwrap_err();
    assert!(matches!(err, ShmError::NotSealed { .. }), "{err}");
    assert!(matches!(SharedMemory::create("z", 0), Err(ShmError::ZeroLength { .. })));
}

#[test]
fn byte_copies_round_trip_at_every_alignment_and_leave_neighbours_alone() {
    let shm = SharedMemory::create("shm-bytes", 100).unwrap();
    let pattern: Vec<u8> = (0..64u8).map(|b| b.wrapping_mul(37).wrapping_add(1)).collect();
    for offset in 0..=20 {
        for len in [0, 1, 3, 7, 8, 9, 15, 16, 17, 33, 64] {
            if offset + len > shm.len() {
                continue;
            }
            shm.write_bytes(0, &[0xAA; 100]).unwrap();
            shm.write_bytes(offset, &pattern[..len]).unwrap();
            let mut all = [0u8; 100];
            shm.read_bytes(0, &mut all).unwrap();
            assert!(all[..offset].iter().all(|&b| b == 0xAA), "before {offset}+{len}");
            assert_eq!(&all[offset..offset + len], &pattern[..len], "at {offset}+{len}");
            assert!(all[offset + len..].iter().all(|&b| b == 0xAA), "after {offset}+{len}");
            let mut back = vec![0u8; len];
            shm.read_bytes(offset, &mut back).unwrap();
            assert_eq!(back, &pattern[..len]);
        }
    }
    // The last word reaches past the 100-byte file into the rest of the page: still mapped, still correct.
    shm.write_bytes(97, &[1, 2, 3]).unwrap();
    let mut tail = [0u8; 3];
    shm.read_bytes(97, &mut tail).unwrap();
    assert_eq!(tail, [1, 2, 3]);
    assert!(matches!(shm.write_bytes(98, &[0; 3]), Err(ShmError::OutOfRange { offset: 98, bytes: 3, len: 100 })));
    assert!(matches!(shm.read_bytes(usize::MAX, &mut [0; 2]), Err(ShmError::OutOfRange { .. })));
}

#[test]
fn byte_copies_see_the_atomics_of_a_view_and_of_another_mapping() {
    let shm = SharedMemory::create("shm-bytes-view", 4096).unwrap();
    let other = SharedMemory::from_fd(shm.try_clone_fd().unwrap(), 4096).unwrap();
    let view = SharedObject::<[AtomicU64; 4]>::new(shm).unwrap();
    view.get()[1].store(u64::from_ne_bytes(*b"abcdefgh"), Ordering::Release);
    let mut seen = [0u8; 4];
    other.read_bytes(10, &mut seen).unwrap();
    assert_eq!(&seen, b"cdef");
    other.write_bytes(12, b"XY").unwrap();
    assert_eq!(view.get()[1].load(Ordering::Acquire).to_ne_bytes(), *b"abcdXYgh");
}

#[test]
fn a_future_write_seal_leaves_the_owner_writing_and_peers_reading_only() {
    let owner = SharedMemory::create("shm-future-write", 4096).unwrap();
    owner.seal_future_writes().unwrap();
    let words = owner.words(1, 3).unwrap();
    words[2].store(0xabcd, Ordering::Release);
    assert!(matches!(owner.words(511, 2), Err(ShmError::OutOfRange { offset: 4088, bytes: 16, len: 4096 })));
    assert!(matches!(owner.words(usize::MAX, 1), Err(ShmError::OutOfRange { .. })));
    // Nobody can map it writable any more.
    let err = SharedMemory::from_fd(owner.try_clone_fd().unwrap(), 4096).unwrap_err();
    assert!(matches!(err, ShmError::Map { source: Errno::PERM, .. }), "{err}");
    let reader = ReadOnlyMemory::from_fd(owner.try_clone_fd().unwrap(), 4096).unwrap();
    assert_eq!(reader.load(3), Some(0xabcd));
    words[2].store(7, Ordering::Release);
    assert_eq!(reader.load(3), Some(7), "the reader sees the owner's later writes");
    assert_eq!((reader.load(511).is_some(), reader.load(512), reader.load(usize::MAX)), (true, None, None));
    let err = ReadOnlyMemory::from_fd(owner.try_clone_fd().unwrap(), 8192).unwrap_err();
    assert!(matches!(err, ShmError::SizeMismatch { expected: 8192, actual: 4096 }), "{err}");
}

#[test]
fn memfds_side_by_side_are_one_range_here_and_in_a_peer_that_maps_their_pieces() {
    let page = rustix::param::page_size();
    let owner = SharedMemory::create_side_by_side("shm-side", &[2 * page, page, 3 * page]).unwrap();
    assert_eq!(owner.len(), 6 * page);
    assert_eq!(owner.pieces(), vec![(0, 2 * page), (2 * page, page), (3 * page, 3 * page)]);
    // Bytes written across both boundaries.
    let pattern: Vec<u8> = (0..4 * page).map(|i| (i * 7 % 251) as u8).collect();
    owner.write_bytes(page + 5, &pattern).unwrap();
    assert!(matches!(owner.try_clone_fd(), Err(ShmError::SideBySide { pieces: 3 })));
    // A peer maps the three memfds side by side too, and sees the same bytes at the same offsets.
    let fds = (0..3).map(|i| owner.try_clone_piece_fd(i).unwrap());
    let peer = SharedMemory::side_by_side(fds.zip([2 * page, page, 3 * page]).collect()).unwrap();
    let mut seen = vec![0u8; pattern.len()];
    peer.read_bytes(page + 5, &mut seen).unwrap();
    assert_eq!(seen, pattern);
    // Each memfd holds its own part: the middle one, mapped alone, starts where the range's third page does.
    let middle = SharedMemory::from_fd(owner.try_clone_piece_fd(1).unwrap(), page).unwrap();
    let mut first = [0u8; 8];
    middle.read_bytes(0, &mut first).unwrap();
    assert_eq!(first, pattern[page - 5..page + 3]);
    assert!(owner.try_clone_piece_fd(3).is_err());
    // Pieces in another order put other bytes at those offsets (the order is the peer's to keep).
    let fds = [2, 1, 0].map(|i| owner.try_clone_piece_fd(i).unwrap());
    let swapped = SharedMemory::side_by_side(fds.into_iter().zip([3 * page, page, 2 * page]).collect()).unwrap();
    swapped.read_bytes(page + 5, &mut seen).unwrap();
    assert_ne!(seen, pattern);
}

#[test]
fn memfds_side_by_side_are_checked_one_by_one() {
    let page = rustix::param::page_size();
    let owner = SharedMemory::create_side_by_side("shm-side-check", &[page, page]).unwrap();
    let pair =
        |a: usize, b: usize| vec![(owner.try_clone_piece_fd(0).unwrap(), a), (owner.try_clone_piece_fd(1).unwrap(), b)];
    assert!(matches!(SharedMemory::side_by_side(pair(page, 2 * page)), Err(ShmError::SizeMismatch { .. })));
    assert!(matches!(SharedMemory::side_by_side(pair(page, 100)), Err(ShmError::NotWholePages { len: 100, .. })));
    assert!(matches!(SharedMemory::side_by_side(Vec::new()), Err(ShmError::ZeroLength { .. })));
    let unsealed = rustix::fs::memfd_create("unsealed", MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&unsealed, page as u64).unwrap();
    let mixed = vec![(owner.try_clone_piece_fd(0).unwrap(), page), (unsealed, page)];
    assert!(matches!(SharedMemory::side_by_side(mixed), Err(ShmError::NotSealed { .. })));
    assert!(matches!(SharedMemory::create_side_by_side("odd", &[page, 12]), Err(ShmError::NotWholePages { .. })));
    // One piece is an ordinary mapping.
    let one = SharedMemory::side_by_side(vec![(owner.try_clone_piece_fd(1).unwrap(), page)]).unwrap();
    assert!(one.try_clone_fd().is_ok() && one.pieces() == vec![(0, page)]);
}

#[test]
fn view_that_does_not_fit_is_refused() {
    let shm = SharedMemory::create("shm-small", 16).unwrap();
    let err = SharedObject::<[AtomicU64; 4]>::new(shm).unwrap_err();
    assert!(matches!(err, ShmError::ViewDoesNotFit { len: 16, size: 32, .. }), "{err}");
}
