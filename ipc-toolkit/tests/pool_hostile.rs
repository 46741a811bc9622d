//! Careless and hostile clients at a pool's socket and on its block channel, on the host backend.
//!
//! Each test runs an owner that keeps allocating, lets one kind of bad client loose, and then asserts that: the
//! owner's calls never waited on the bad client; a real importer still attaches, finds a buffer allocated after
//! the attack and reads it intact; the bad client holds no pin, no importer record and no fd of the owner once it
//! is gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../ipc-core/tests/common/mod.rs"]
mod common;

use common::door_client::{connect, hung_up_on, open_fds, random_bytes_are_refused};

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ipc_core::host::{Host, HostContext};
use ipc_core::shm::SharedMemory;
use ipc_core::wire::{
    BackendKind, ClientHello, Message, PROTOCOL_VERSION, RefusalCode, WireError, recv_bytes, send_bytes,
};
use ipc_toolkit::door::{DoorError, ObjectKind, attach};
use ipc_toolkit::pool::layout::{BlockId, PINS_HEADER_WORDS};
use ipc_toolkit::pool::{
    AttachOptions, BLOCK_REPLY_BYTES, BlockReply, BlockRequest, PoolConfig, PoolError, PoolImporter, PoolOffer,
    SharedPool,
};

const T: Duration = Duration::from_secs(5);
/// The longest an owner's call may take while bad clients knock (its door and block channel run on their own
/// threads): room for a loaded 2-core CI machine that deschedules the thread.
const MAX_CALL: Duration = Duration::from_millis(500);

/// The fd counts are per process: the tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

/// Polls `condition` for up to three seconds.
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < Duration::from_secs(3), "{what}: not within 3 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `bad_clients` against a pool and checks what the module comment says.
fn survives(name: &str, bad_clients: impl FnOnce(&SharedPool<Host>)) {
    let _turn = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let pool =
        SharedPool::<Host>::create(&HostContext, common::sock("pool-hostile", name), PoolConfig::new(1 << 20)).unwrap();
    let baseline = open_fds();
    bad_clients(&pool);
    let started = Instant::now();
    let after = pool.alloc("after-the-attack", 4096, 256, None).unwrap();
    after.write(0, &[0x5a; 4096]).unwrap();
    assert!(started.elapsed() < MAX_CALL, "an alloc took {:?}", started.elapsed());
    {
        let importer = PoolImporter::<Host>::attach(&HostContext, pool.path(), &AttachOptions::default())
            .unwrap_or_else(|e| panic!("a real importer could not attach: {e}"));
        let view = importer.lookup("after-the-attack").unwrap();
        let mut bytes = vec![0u8; 4096];
        view.read(0, &mut bytes).unwrap();
        assert!(bytes.iter().all(|&b| b == 0x5a));
    }
    pool.free(after).unwrap();
    eventually("the bad clients' records and fds go", || {
        let stats = pool.stats();
        stats.importers == 0 && stats.pending_buffers == 0 && open_fds() <= baseline
    });
}

fn hello(object: ObjectKind, backend: BackendKind) -> Vec<u8> {
    let hello = ClientHello {
        object,
        part: 0,
        protocol_version: PROTOCOL_VERSION,
        client_pid: std::process::id(),
        wanted_backend: Some(backend),
        consumer_name: "hostile".into(),
    };
    Message::ClientHello(hello).encode().unwrap()
}

/// Sends `bytes` and reads until the owner hangs up; returns what it said.
fn answer_to(path: &Path, bytes: &[u8]) -> Vec<u8> {
    let mut stream = connect(path);
    stream.write_all(bytes).unwrap();
    hung_up_on(stream)
}

fn refused_with(answer: &[u8]) -> Option<(RefusalCode, String)> {
    match Message::decode(answer) {
        Ok(Message::Refused(refused)) => Some((refused.code, refused.message)),
        _ => None,
    }
}

#[test]
fn garbage_a_ring_hello_and_the_wrong_backend_are_refused_with_the_reason() {
    survives("refusals", |pool| {
        random_bytes_are_refused(pool.path());
        let (code, message) =
            refused_with(&answer_to(pool.path(), &hello(ObjectKind::Ring, BackendKind::Host))).unwrap();
        assert_eq!(code, RefusalCode::WrongObject);
        assert!(message.contains("pool"), "{message}");
        let (code, _) = refused_with(&answer_to(pool.path(), &hello(ObjectKind::Pool, BackendKind::Vmm))).unwrap();
        assert_eq!(code, RefusalCode::BackendMismatch);
        // Half a hello, then a hang-up.
        let mut half = hello(ObjectKind::Pool, BackendKind::Host);
        half.truncate(30);
        drop({
            let mut stream = connect(pool.path());
            stream.write_all(&half).unwrap();
            stream
        });
    });
}

#[test]
fn silent_clients_and_a_thousand_rapid_connections_keep_no_importer_out() {
    survives("silent", |pool| {
        let silent: Vec<UnixStream> = (0..100).map(|_| connect(pool.path())).collect();
        for _ in 0..1000 {
            drop(UnixStream::connect(pool.path()).unwrap());
        }
        let importer = PoolImporter::<Host>::attach(&HostContext, pool.path(), &AttachOptions::default()).unwrap();
        assert_eq!(importer.mapped_blocks(), 1);
        drop(silent);
    });
}

#[test]
fn a_flood_of_hellos_that_never_confirm_keeps_no_importer_out() {
    // One thread keeps 64 connections that each say a valid hello and then nothing, opening a new one as soon as
    // the owner drops one. An importer's connection used to be closed as "silent" the moment it was accepted (its
    // hello unread yet), every time; now it waits its turn in the listener's backlog.
    survives("hello-flood", |pool| {
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut held: Vec<UnixStream> = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    held.retain_mut(|s| !closed_by_peer(s));
                    while held.len() < 64 {
                        let Ok(s) = UnixStream::connect(pool.path()) else { break };
                        let hello = hello(ObjectKind::Pool, BackendKind::Host);
                        if send_bytes(s.as_fd(), &hello, Vec::new(), T).is_ok() && s.set_nonblocking(true).is_ok() {
                            held.push(s);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
            std::thread::sleep(Duration::from_millis(300));
            for round in 0..3 {
                let started = Instant::now();
                let attached = PoolImporter::<Host>::attach(&HostContext, pool.path(), &AttachOptions::default());
                let importer = attached.unwrap_or_else(|e| panic!("round {round}: {e} after {:?}", started.elapsed()));
                assert_eq!(importer.mapped_blocks(), 1);
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    });
}

#[test]
fn attached_peers_that_send_a_byte_at_a_time_do_not_slow_an_attach() {
    // 60 attached importers each send one byte every 2 ms (never a whole message). The owner's watch of attached
    // peers waited up to 1 ms for the rest of a message on each, every round: new attaches took 45-62 ms.
    survives("dribble", |pool| {
        let links: Vec<_> = (0..60).map(|_| attach_raw(pool.path())).collect();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (_, _, link) in &links {
                        let _ = rustix::net::send(link, &[0x47], rustix::net::SendFlags::DONTWAIT);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
            std::thread::sleep(Duration::from_millis(50));
            let started = Instant::now();
            for _ in 0..20 {
                let importer = PoolImporter::<Host>::attach(&HostContext, pool.path(), &AttachOptions::default());
                drop(importer.unwrap());
            }
            let took = started.elapsed();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(took < Duration::from_millis(600), "20 attaches took {took:?}");
        });
        drop(links);
    });
}

/// Whether the owner closed `stream` (a non-blocking one): what it sent is read and dropped, fds and all.
fn closed_by_peer(stream: &mut UnixStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match std::io::Read::read(stream, &mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// Attaches by hand and keeps the offer's fds: directory, pin table, block channel.
fn attach_raw(path: &Path) -> (PoolOffer, Vec<OwnedFd>, ipc_toolkit::door::OwnerLink) {
    let (made, link) = attach(path, ObjectKind::Pool, Some(BackendKind::Host), "raw", T, |offer, fds| {
        Ok::<_, DoorError>((PoolOffer::decode(&offer.body).unwrap(), fds))
    })
    .unwrap();
    (made.0, made.1, link)
}

#[test]
fn a_client_that_takes_the_offer_and_never_confirms_is_dropped() {
    survives("no-attached", |pool| {
        let stream = connect(pool.path());
        send_bytes(stream.as_fd(), &hello(ObjectKind::Pool, BackendKind::Host), Vec::new(), T).unwrap();
        let offer = ipc_core::wire::recv_message(stream.as_fd(), T).unwrap();
        assert!(matches!(offer.message, Message::ObjectOffer(_)));
        assert_eq!(offer.fds.len(), 3);
        eventually("the offered importer counts", || pool.stats().importers == 1);
        // It never says Attached: the handshake's bound ends it, and its record goes.
        eventually("the silent importer is dropped", || pool.stats().importers == 0);
        drop((stream, offer));
    });
}

#[test]
fn garbage_on_the_block_channel_ends_that_importer_only() {
    survives("channel", |pool| {
        let honest = PoolImporter::<Host>::attach(&HostContext, pool.path(), &AttachOptions::default()).unwrap();
        let (_offer, fds, link) = attach_raw(pool.path());
        let channel = &fds[2];
        // A request for a block that does not exist is answered "gone".
        let ghost = BlockId { index: 3, serial: 77 };
        send_bytes(channel.as_fd(), &BlockRequest { block: ghost }.encode(), Vec::new(), T).unwrap();
        let mut reply = [0u8; BLOCK_REPLY_BYTES];
        let got = recv_bytes(channel.as_fd(), &mut reply, T).unwrap();
        assert_eq!(BlockReply::decode(&reply, got.len()).unwrap(), BlockReply::Gone { block: ghost });
        assert_eq!(pool.stats().importers, 2);
        // Garbage: the owner hangs up the channel and forgets the importer; the honest one goes on.
        send_bytes(channel.as_fd(), &[0xff; 16], Vec::new(), T).unwrap();
        let err = recv_bytes(channel.as_fd(), &mut reply, T).unwrap_err();
        assert!(matches!(err, WireError::PeerHungUp { .. }), "{err}");
        eventually("the garbage sender is forgotten", || pool.stats().importers == 1);
        let _fresh = pool.alloc("fresh", 64, 64, None).unwrap();
        assert!(honest.lookup("fresh").is_ok());
        drop((fds, link));
    });
}

#[test]
fn a_client_that_asks_and_never_reads_its_replies_is_dropped() {
    survives("flood", |pool| {
        let (_offer, fds, link) = attach_raw(pool.path());
        let request = BlockRequest { block: BlockId { index: 0, serial: 1 } }.encode();
        // Each grant carries an fd: the owner must not pile them up for a client that never reads.
        let started = Instant::now();
        let mut sent = 0;
        let cut_off = loop {
            if started.elapsed() > Duration::from_secs(3) {
                break false;
            }
            match send_bytes(fds[2].as_fd(), &request, Vec::new(), Duration::from_millis(50)) {
                Ok(()) => sent += 1,
                Err(_) => break true,
            }
        };
        // Its replies (each with an fd) filled its socket: the owner stopped sending and hung up.
        assert!(cut_off && sent > 10, "{sent} requests went out, cut off: {cut_off}");
        eventually("the flooding importer is dropped", || pool.stats().importers == 0);
        drop((fds, link));
    });
}

#[test]
fn pins_a_hostile_importer_writes_only_hold_bytes_while_it_lives() {
    survives("pins", |pool| {
        let victim = pool.alloc("victim", 1 << 20, 256, None).unwrap();
        let (offer, mut fds, link) = attach_raw(pool.path());
        let pins = SharedMemory::from_fd(fds.remove(1), offer.pins_bytes as usize).unwrap();
        // Pin every slot, with a count no honest importer reaches.
        for word in pins.words(PINS_HEADER_WORDS, offer.geometry.entry_slots as usize).unwrap() {
            word.store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
        }
        pool.free(victim).unwrap();
        assert!(matches!(pool.alloc("next", 1 << 20, 256, None), Err(PoolError::OutOfMemory { .. })));
        drop((fds, link, pins));
        eventually("the hostile pins stop counting", || pool.stats().pending_buffers == 0);
        assert!(pool.alloc("next", 1 << 20, 256, None).is_ok());
        pool.free_name("next").unwrap();
    });
}
