//! The producer's front door: a thread that owns the rendezvous socket and every handshake in flight, so that no
//! client, slow, silent, refused or hostile, can stop the producer or delay a frame.
//!
//! One thread serves every connection with `poll` and a non-blocking reader
//! ([`MessageReader`](crate::wire::MessageReader)), each handshake bounded by its own deadline
//! (`ProducerConfig::handshake_timeout`, from `accept` to `Attached`). At most
//! `ProducerConfig::max_pending_handshakes` connections are in flight; when a new one arrives and there is no
//! room, the oldest connection that has not said a valid hello in 100 ms is closed (a real consumer says hello
//! right after connecting, so only silent clients are evicted); until one has, new connections wait in the
//! listener's backlog. Open fds are thus bounded by that number, plus the
//! listener and one wake-up socket.
//!
//! The thread never touches the GPU, nor the consumer records: once a hello is valid it asks the producer for the offer
//! ([`AdmissionEvent::WantsOffer`]); the producer takes a consumer record and makes the offer (export, IPC events) in
//! one step when it next drains the queue, in `acquire`, `wait_for_consumers` or `admit_pending`, without ever waiting;
//! the thread sends the offer and waits for `Attached`. Taking the record on the producer's own thread, right before
//! the offer leaves, is what keeps a joining consumer from holding the producer back before it has its offer: a record
//! counts in back-pressure from the moment it is taken (the consumer joins at the producer's next frame), and a record
//! taken here while the producer waited for its release would never get the offer that lets the consumer release (the
//! producer serves offers only between frames). Every failure is logged and survived: a refused peer, a failed accept
//! (with a back-off when the process is out of fds), a broken or abandoned handshake. A first message that is not a
//! valid hello is answered with `Refused` (code 1 for another protocol version, 6 for anything else) before the
//! connection is closed, so a client learns why instead of seeing a hang-up. A peer in a PID namespace the producer
//! cannot see (`SO_PEERCRED` pid 0) is admitted with pid 0 in its record: only its connection tells whether it is
//! alive. After `Attached` the thread hands the connection over and nothing reads it again: a consumer's `Detach` is
//! advisory, its ring-level detach (the record's state) is what the producer goes by when it hangs up. A handshake that
//! fails after the producer took a record for it marks the record dead (poisoning its release counters) and reports
//! [`AdmissionEvent::Failed`], so the producer retires the record through the same quarantine as a consumer that died.

mod front_door;
mod handshake;

use front_door::FrontDoor;

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::process::Pid;

use crate::wire::{
    BackendKind, Message, ObjectKind, PeerConnection, PeerCredentials, PeerStatus, RefusalCode, RendezvousListener,
};

/// Panics of the thread's loop survived within [`PANIC_WINDOW`] before it gives up: each fails the handshakes in
/// flight (the one being served when it panicked is refused, code 6, the others see a hang-up and may attach again)
/// and starts the loop afresh on the same socket; a loop that keeps panicking is a bug that some input sets off
/// again and again, and accepting then stops (the socket file goes) rather than panic on.
pub(crate) const MAX_PANICS: u32 = 8;
/// Panics further apart than this do not add up towards [`MAX_PANICS`].
const PANIC_WINDOW: Duration = Duration::from_secs(60);
/// Longest the thread sleeps in `poll` when nothing has a nearer deadline.
const IDLE_POLL: Duration = Duration::from_millis(100);
/// How long accepting pauses after the process ran out of fds (`EMFILE`/`ENFILE`) or memory: the pending
/// connection stays in the kernel's queue, and retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How long accepting pauses after any other accept error, for the same reason.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// Connections accepted per wake-up, so that a flood of connections cannot starve the handshakes in flight.
const ACCEPTS_PER_ROUND: usize = 32;
/// How long a connection may go without a valid hello before it can be closed to make room for a new one (a real
/// client says hello as soon as it connects).
const SILENT_GRACE: Duration = Duration::from_millis(100);
/// Bound on sending the offer or a refusal: the peer's receive buffer is empty at that point (we sent nothing
/// before), so this only matters for a peer that vanished.
const SEND_TIMEOUT: Duration = Duration::from_millis(100);

/// The owner's side of the records the front door hands out: what the socket serves, and how a record taken for a
/// handshake that then failed is marked dead (a ring poisons the consumer's release counters; a toolkit object
/// forgets the peer).
pub trait Records: Send + Sync + 'static {
    /// A record: a ring's `ConsumerId`, a toolkit object's peer number.
    type Id: Copy + Eq + std::fmt::Debug + Send + 'static;
    /// What the socket serves; a hello that names another kind is refused (`WrongObject`).
    fn object(&self) -> ObjectKind;
    /// The number the offer gives the peer, which its `Attached` must repeat.
    fn wire_id(id: Self::Id) -> u32;
    /// Marks record `id` dead: its handshake failed after the record was taken.
    ///
    /// # Errors
    /// Why it could not be marked (logged; the record is retired anyway).
    fn mark_dead(&self, id: Self::Id) -> Result<(), String>;
    /// Who is attached, as the owner knows it: the answer to a `StatusRequest` (`gpu-ipc ps`).
    fn peers(&self) -> Vec<PeerStatus>;
    /// The words of a refusal (`Refused` code 1) for a client whose hello announces protocol version `speaks`, when
    /// that is too old for what the socket serves (a ring of tensors needs version 2); `None` serves it. Default:
    /// every version this build speaks is enough.
    fn refuse_version(&self, speaks: u16) -> Option<String> {
        let _ = speaks;
        None
    }
}

/// What the admission thread tells the producer.
pub enum AdmissionEvent<I> {
    /// A consumer said a valid hello: the producer takes a record for it, makes its offer and hands both over
    /// with [`Admission::offer`] (or why it cannot).
    WantsOffer {
        /// The handshake's number, to answer with.
        token: u64,
        /// The pid to record (`None`: a PID namespace the producer cannot see; the record says 0).
        pid: Option<Pid>,
        /// Its name, for logs.
        name: String,
        /// Its credentials (`SO_PEERCRED`).
        peer: PeerCredentials,
        /// The part of a pool made of parts it asked for (`ClientHello::part`; 0 for everything else).
        part: u32,
    },
    /// The handshake is complete: the consumer is attached. Keep `conn` open for its lifetime.
    Attached {
        /// Its record.
        id: I,
        /// Its pid (`SO_PEERCRED`); 0 when it is in a PID namespace the producer cannot see (then only the
        /// connection's hang-up tells that it is gone; the full credentials are `conn.peer()`).
        pid: u32,
        /// The connection, whose hang-up says the consumer is gone.
        conn: PeerConnection,
        /// It said `AttachedWithoutEvents` (rings only): it could not open the ring's IPC events, and runs the ring
        /// without them.
        without_events: bool,
    },
    /// The handshake of record `id` failed after the record was taken; the thread has marked it dead, the
    /// producer retires it.
    Failed {
        /// The record.
        id: I,
    },
}

/// The producer's answer to [`AdmissionEvent::WantsOffer`]: the record it took (LIVE, joining at the producer's
/// next frame), the offer and its fds; or the refusal to send instead.
pub type OfferKit<I> = Result<(I, Message, Vec<OwnedFd>), (RefusalCode, String)>;

/// Settings of the admission thread.
pub struct AdmissionConfig {
    /// The backend of the ring (a hello that wants another is refused).
    pub backend: BackendKind,
    /// Bound on one handshake, from accept to `Attached`.
    pub handshake_timeout: Duration,
    /// Connections in flight at most.
    pub max_pending: usize,
}

/// The producer's handle on its admission thread.
pub struct Admission<R: Records> {
    /// In a mutex only so that the producer stays `Sync` (only its `&mut self` methods use it).
    events: Mutex<mpsc::Receiver<AdmissionEvent<R::Id>>>,
    offers: mpsc::Sender<(u64, OfferKit<R::Id>)>,
    wake: UnixStream,
    /// Readable when events are waiting (see [`Admission::news`]).
    news: UnixStream,
    stop: Arc<AtomicBool>,
    /// Set when the thread gave up after [`MAX_PANICS`] panics: what the last one said.
    gave_up: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl<R: Records> Admission<R> {
    /// Starts the thread; it owns `listener` (and so removes the socket file when it ends).
    pub fn start(listener: RendezvousListener, records: Arc<R>, config: AdmissionConfig) -> std::io::Result<Self> {
        let (events_tx, events) = mpsc::channel();
        let (offers, offers_rx) = mpsc::channel();
        let (wake, wake_rx) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        let (news_tx, news) = UnixStream::pair()?;
        news_tx.set_nonblocking(true)?;
        news.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let gave_up = Arc::new(Mutex::new(None));
        let thread = {
            let stop = stop.clone();
            let gave_up = gave_up.clone();
            let front_door = FrontDoor {
                listener,
                records,
                config,
                events: events_tx,
                offers: offers_rx,
                wake: wake_rx,
                news: news_tx,
                pending: Vec::new(),
                accept_paused_until: None,
                next_token: 0,
                stepping: None,
            };
            std::thread::Builder::new()
                .name("gpu-ipc-admission".into())
                .spawn(move || front_door.run_surviving_panics(&stop, &gave_up))?
        };
        Ok(Self { events: Mutex::new(events), offers, wake, news, stop, gave_up, thread: Some(thread) })
    }

    /// `Some(why)` once the thread gave up after `MAX_PANICS` (8) panics, or ended in any other way while not told to
    /// stop: no consumer can attach any more.
    pub fn gave_up(&self) -> Option<String> {
        let why = self.gave_up.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        why.or_else(|| {
            let ended = self.thread.as_ref().is_some_and(JoinHandle::is_finished) && !self.stop.load(Ordering::Acquire);
            ended.then(|| "it ended unexpectedly (a panic while it recovered from one)".to_owned())
        })
    }

    /// A socket that turns readable when the thread sends an event: an owner that waits in `poll` for other
    /// things too (the object door) adds it to wake at once; [`Admission::try_next`] drains it.
    pub fn news(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.news)
    }

    /// The next event, without waiting.
    pub fn try_next(&self) -> Option<AdmissionEvent<R::Id>> {
        let mut sink = [0u8; 64];
        while matches!(rustix::net::recv(&self.news, &mut sink, rustix::net::RecvFlags::DONTWAIT), Ok((n, _)) if n > 0)
        {
        }
        self.events.lock().ok()?.try_recv().ok()
    }

    /// Hands the thread the answer to handshake `token`'s [`AdmissionEvent::WantsOffer`]. When the thread is gone
    /// nobody will send it: returns the record it held, which is then the caller's to give back.
    #[must_use = "a record returned here was never offered: give it back"]
    pub fn offer(&self, token: u64, kit: OfferKit<R::Id>) -> Option<R::Id> {
        match self.offers.send((token, kit)) {
            Ok(()) => {
                self.wake_up();
                None
            }
            Err(mpsc::SendError((_, kit))) => kit.ok().map(|(id, _, _)| id),
        }
    }

    fn wake_up(&self) {
        // A full buffer means a wake-up is already pending: nothing lost. `send` with `MSG_NOSIGNAL`: a thread that
        // already ended has closed the other end, and a plain write would raise SIGPIPE in the application.
        let _ = rustix::net::send(&self.wake, &[1], rustix::net::SendFlags::NOSIGNAL);
    }

    /// Stops the thread and waits for it (the socket file is gone when this returns).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.wake_up();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<R: Records> Drop for Admission<R> {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests;
