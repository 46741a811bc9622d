//! The producer's front door: a thread that owns the rendezvous socket and every handshake in flight, so that no
//! client, slow, silent, refused or hostile, can stop the producer or delay a frame.
//!
//! One thread serves every connection with `poll` and a non-blocking reader ([`MessageReader`]), each handshake
//! bounded by its own deadline (`ProducerConfig::handshake_timeout`, from `accept` to `Attached`). At most
//! `ProducerConfig::max_pending_handshakes` connections are in flight; when a new one arrives and there is no
//! room, the oldest connection that has not yet said a valid hello is closed (a real consumer says hello right
//! after connecting, so only silent clients are evicted). Open fds are thus bounded by that number, plus the
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

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;
use rustix::process::Pid;

use crate::ring::{ConsumerId, ProducerControl};
use crate::wire::{
    Attached, BackendKind, ClientHello, MAX_REFUSAL_MESSAGE_BYTES, Message, MessageReader, PeerConnection,
    PeerCredentials, RefusalCode, Refused, RendezvousListener, WireError,
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
/// Bound on sending the offer or a refusal: the peer's receive buffer is empty at that point (we sent nothing
/// before), so this only matters for a peer that vanished.
const SEND_TIMEOUT: Duration = Duration::from_millis(100);

/// What the admission thread tells the producer.
pub(crate) enum AdmissionEvent {
    /// A consumer said a valid hello: the producer takes a record for it, makes its offer and hands both over
    /// with [`Admission::offer`] (or why it cannot).
    WantsOffer {
        /// The handshake's number, to answer with.
        token: u64,
        /// The pid to record (`None`: a PID namespace the producer cannot see; the record says 0).
        pid: Option<Pid>,
        /// Its name, for logs.
        name: String,
    },
    /// The handshake is complete: the consumer is attached. Keep `conn` open for its lifetime.
    Attached {
        /// Its record.
        id: ConsumerId,
        /// Its pid (`SO_PEERCRED`); 0 when it is in a PID namespace the producer cannot see (then only the
        /// connection's hang-up tells that it is gone; the full credentials are `conn.peer()`).
        pid: u32,
        /// The connection, whose hang-up says the consumer is gone.
        conn: PeerConnection,
    },
    /// The handshake of record `id` failed after the record was taken; the thread has marked it dead, the
    /// producer retires it.
    Failed {
        /// The record.
        id: ConsumerId,
    },
}

/// The producer's answer to [`AdmissionEvent::WantsOffer`]: the record it took (LIVE, joining at the producer's
/// next frame), the offer and its fds; or the refusal to send instead.
pub(crate) type OfferKit = Result<(ConsumerId, Message, Vec<OwnedFd>), (RefusalCode, String)>;

/// Settings of the admission thread.
pub(crate) struct AdmissionConfig {
    /// The backend of the ring (a hello that wants another is refused).
    pub(crate) backend: BackendKind,
    /// Bound on one handshake, from accept to `Attached`.
    pub(crate) handshake_timeout: Duration,
    /// Connections in flight at most.
    pub(crate) max_pending: usize,
}

/// The producer's handle on its admission thread.
pub(crate) struct Admission {
    /// In a mutex only so that the producer stays `Sync` (only its `&mut self` methods use it).
    events: Mutex<mpsc::Receiver<AdmissionEvent>>,
    offers: mpsc::Sender<(u64, OfferKit)>,
    wake: UnixStream,
    stop: Arc<AtomicBool>,
    /// Set when the thread gave up after [`MAX_PANICS`] panics: what the last one said.
    gave_up: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl Admission {
    /// Starts the thread; it owns `listener` (and so removes the socket file when it ends).
    pub(crate) fn start(
        listener: RendezvousListener,
        ring: Arc<ProducerControl>,
        config: AdmissionConfig,
    ) -> std::io::Result<Self> {
        let (events_tx, events) = mpsc::channel();
        let (offers, offers_rx) = mpsc::channel();
        let (wake, wake_rx) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let gave_up = Arc::new(Mutex::new(None));
        let thread = {
            let stop = stop.clone();
            let gave_up = gave_up.clone();
            let front_door = FrontDoor {
                listener,
                ring,
                config,
                events: events_tx,
                offers: offers_rx,
                wake: wake_rx,
                pending: Vec::new(),
                accept_paused_until: None,
                next_token: 0,
                stepping: None,
            };
            std::thread::Builder::new()
                .name("gpu-ipc-admission".into())
                .spawn(move || front_door.run_surviving_panics(&stop, &gave_up))?
        };
        Ok(Self { events: Mutex::new(events), offers, wake, stop, gave_up, thread: Some(thread) })
    }

    /// `Some(why)` once the thread gave up after [`MAX_PANICS`] panics, or ended in any other way while not told to
    /// stop: no consumer can attach any more.
    pub(crate) fn gave_up(&self) -> Option<String> {
        let why = self.gave_up.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        why.or_else(|| {
            let ended = self.thread.as_ref().is_some_and(JoinHandle::is_finished) && !self.stop.load(Ordering::Acquire);
            ended.then(|| "it ended unexpectedly (a panic while it recovered from one)".to_owned())
        })
    }

    /// The next event, without waiting.
    pub(crate) fn try_next(&self) -> Option<AdmissionEvent> {
        self.events.lock().ok()?.try_recv().ok()
    }

    /// Hands the thread the answer to handshake `token`'s [`AdmissionEvent::WantsOffer`]. When the thread is gone
    /// nobody will send it: returns the record it held, which is then the caller's to give back.
    #[must_use = "a record returned here was never offered: give it back"]
    pub(crate) fn offer(&self, token: u64, kit: OfferKit) -> Option<ConsumerId> {
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
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.wake_up();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where a handshake stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Waiting for the consumer's `ClientHello`.
    Hello,
    /// Hello valid; waiting for the producer to take a record and make the offer (the handshake's number).
    Offer(u64),
    /// Offer sent for record `id`, which the handshake now holds; waiting for `Attached`.
    Attached(ConsumerId),
}

impl Stage {
    fn record(self) -> Option<ConsumerId> {
        match self {
            Self::Hello | Self::Offer(_) => None,
            Self::Attached(id) => Some(id),
        }
    }
}

struct Handshake {
    conn: PeerConnection,
    reader: MessageReader,
    accepted: Instant,
    deadline: Instant,
    stage: Stage,
}

/// Why a handshake ended without a consumer, and what to tell the peer.
struct Failure {
    refusal: Option<RefusalCode>,
    reason: String,
}

impl Failure {
    fn refuse(code: RefusalCode, reason: String) -> Self {
        Self { refusal: Some(code), reason }
    }

    fn silent(reason: String) -> Self {
        Self { refusal: None, reason }
    }
}

impl From<WireError> for Failure {
    fn from(e: WireError) -> Self {
        Self::silent(e.to_string())
    }
}

/// The thread's state.
struct FrontDoor {
    listener: RendezvousListener,
    ring: Arc<ProducerControl>,
    config: AdmissionConfig,
    events: mpsc::Sender<AdmissionEvent>,
    offers: mpsc::Receiver<(u64, OfferKit)>,
    wake: UnixStream,
    pending: Vec<Handshake>,
    accept_paused_until: Option<Instant>,
    /// The number of the next hello sent to the producer.
    next_token: u64,
    /// The handshake being served (`step`), to refuse it if it sets off a panic.
    stepping: Option<usize>,
}

impl FrontDoor {
    /// [`FrontDoor::run`], started afresh after a panic (a bug: every failure a peer can cause is handled without
    /// one) once the handshakes in flight are failed, up to [`MAX_PANICS`] times; then it records why in
    /// `gave_up` and returns, which drops the listener (and removes the socket file).
    fn run_surviving_panics(mut self, stop: &AtomicBool, gave_up: &Mutex<Option<String>>) {
        let mut panics = 0u32;
        let mut last_panic: Option<Instant> = None;
        loop {
            self.stepping = None;
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run(stop)));
            let Err(payload) = run else { return };
            if last_panic.is_some_and(|at| at.elapsed() > PANIC_WINDOW) {
                panics = 0;
            }
            panics += 1;
            last_panic = Some(Instant::now());
            let what = panic_message(payload.as_ref());
            let culprit = self.stepping.take();
            for (index, handshake) in std::mem::take(&mut self.pending).into_iter().enumerate() {
                let failure = if culprit == Some(index) {
                    // Its input set the panic off: attaching again would only do it again.
                    Failure::refuse(
                        RefusalCode::MalformedHello,
                        format!("this handshake made the producer's admission fail ({what}); do not retry it"),
                    )
                } else {
                    Failure::silent(format!("the admission thread panicked: {what}"))
                };
                // A panic here too must not leave the other records LIVE: each failure is on its own.
                let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.fail(handshake, failure)));
                if failed.is_err() {
                    tracing::error!("failing a handshake after a panic of the admission thread panicked too");
                }
            }
            if panics >= MAX_PANICS {
                tracing::error!(panics, last = %what, "the admission thread keeps panicking: it stops accepting consumers");
                if let Ok(mut slot) = gave_up.lock() {
                    *slot = Some(format!("it panicked {panics} times, last: {what}"));
                }
                return;
            }
            tracing::error!(panics, %what, "the admission thread panicked: it failed the handshakes in flight and goes on");
        }
    }

    fn run(&mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            while let Ok((token, kit)) = self.offers.try_recv() {
                self.deliver(token, kit);
            }
            self.expire(Instant::now());
            let (wake, listen, ready) = self.wait();
            if wake {
                let mut sink = [0u8; 64];
                while matches!((&self.wake).read(&mut sink), Ok(n) if n > 0) {}
            }
            // Connections before accepting (the indices are those `wait` saw), highest first: a handshake that
            // ends is swap-removed, which moves only an entry already handled.
            for index in ready.into_iter().rev() {
                self.step(index);
            }
            if listen {
                self.accept_some();
            }
        }
        for handshake in std::mem::take(&mut self.pending) {
            self.fail(handshake, Failure::refuse(RefusalCode::ShuttingDown, "the producer is shutting down".into()));
        }
    }

    /// Polls the wake-up socket, the listener (unless accepting is paused) and every connection in flight, until
    /// something is ready or the nearest deadline. Returns (wake-up, listener ready, ready connection indices).
    fn wait(&mut self) -> (bool, bool, Vec<usize>) {
        let now = Instant::now();
        let accepting = self.accept_paused_until.is_none_or(|t| now >= t);
        if accepting {
            self.accept_paused_until = None;
        }
        let mut until = now + IDLE_POLL;
        for t in self.pending.iter().map(|h| h.deadline).chain(self.accept_paused_until) {
            until = until.min(t);
        }
        let timeout = Timespec::try_from(until.saturating_duration_since(now))
            .unwrap_or(Timespec { tv_sec: 0, tv_nsec: 100_000_000 });
        let input = PollFlags::IN | PollFlags::RDHUP;
        let mut fds = Vec::with_capacity(self.pending.len() + 2);
        fds.push(PollFd::from_borrowed_fd(self.wake.as_fd(), PollFlags::IN));
        fds.push(PollFd::from_borrowed_fd(
            self.listener.as_fd(),
            if accepting { PollFlags::IN } else { PollFlags::empty() },
        ));
        fds.extend(self.pending.iter().map(|h| PollFd::from_borrowed_fd(h.conn.as_fd(), input)));
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) => {}
            Err(Errno::INTR) => return (false, false, Vec::new()),
            Err(e) => {
                tracing::error!(error = %e, "admission poll failed; retrying");
                std::thread::sleep(ACCEPT_ERROR_BACKOFF);
                return (false, false, Vec::new());
            }
        }
        let ready = |fd: &PollFd<'_>| !fd.revents().is_empty();
        let wake = fds.first().is_some_and(ready);
        let listen = accepting && fds.get(1).is_some_and(ready);
        let conns = fds.iter().skip(2).enumerate().filter(|(_, fd)| ready(fd)).map(|(i, _)| i).collect();
        (wake, listen, conns)
    }

    /// Accepts what is waiting, up to [`ACCEPTS_PER_ROUND`]; makes room by evicting silent connections.
    fn accept_some(&mut self) {
        for _ in 0..ACCEPTS_PER_ROUND {
            if self.pending.len() >= self.config.max_pending && !self.evict_oldest_silent() {
                // Every connection in flight said a valid hello: wait for one of them to finish.
                self.accept_paused_until = Some(Instant::now() + ACCEPT_ERROR_BACKOFF);
                return;
            }
            match self.listener.accept(Duration::ZERO) {
                Ok(conn) => {
                    let accepted = Instant::now();
                    self.pending.push(Handshake {
                        conn,
                        reader: MessageReader::new(),
                        accepted,
                        deadline: accepted + self.config.handshake_timeout,
                        stage: Stage::Hello,
                    });
                }
                Err(WireError::Timeout { .. }) => return,
                // The listener has told the peer why (`Refused`, code 4) and logged it.
                Err(WireError::PeerUidMismatch { .. }) => {}
                Err(WireError::PathOs { source, .. })
                    if matches!(source, Errno::MFILE | Errno::NFILE | Errno::NOBUFS | Errno::NOMEM) =>
                {
                    tracing::error!(
                        error = %source,
                        pending = self.pending.len(),
                        "cannot accept a consumer (out of file descriptors or memory); retrying in {ACCEPT_BACKOFF:?}"
                    );
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, "accepting a consumer failed; the producer goes on");
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_ERROR_BACKOFF);
                    return;
                }
            }
        }
    }

    /// Closes the oldest connection that has not said a valid hello; false when there is none.
    fn evict_oldest_silent(&mut self) -> bool {
        let oldest = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, h)| h.stage == Stage::Hello)
            .min_by_key(|(_, h)| h.accepted)
            .map(|(index, _)| index);
        match oldest {
            Some(index) => {
                let handshake = self.pending.swap_remove(index);
                tracing::info!(
                    pid = handshake.conn.peer().pid,
                    max = self.config.max_pending,
                    "closing a connection that said nothing, to make room for a new one"
                );
                true
            }
            None => false,
        }
    }

    /// Fails every handshake whose deadline has passed.
    fn expire(&mut self, now: Instant) {
        let mut index = 0;
        while index < self.pending.len() {
            if self.pending.get(index).is_some_and(|h| now >= h.deadline) {
                let handshake = self.pending.swap_remove(index);
                let reason = format!(
                    "the handshake did not finish within {:?} (stage {:?})",
                    self.config.handshake_timeout, handshake.stage
                );
                self.fail(handshake, Failure::silent(reason));
            } else {
                index += 1;
            }
        }
    }

    /// Reads what connection `index` sent and moves its handshake on.
    fn step(&mut self, index: usize) {
        self.stepping = Some(index);
        let outcome = loop {
            let Some(handshake) = self.pending.get_mut(index) else {
                return;
            };
            let received = match handshake.reader.read_available(handshake.conn.as_fd()) {
                Ok(None) => break Ok(false),
                Ok(Some(received)) => received,
                Err(e) => break Err(read_failure(handshake.stage, e)),
            };
            match self.advance(index, received.message) {
                Ok(false) => {}
                other => break other,
            }
        };
        self.stepping = None;
        self.conclude(index, outcome);
    }

    /// Removes handshake `index` if it finished (`Ok(true)`) or failed.
    fn conclude(&mut self, index: usize, outcome: Result<bool, Failure>) {
        match outcome {
            Ok(false) => {}
            Ok(true) => {
                let handshake = self.pending.swap_remove(index);
                if let Stage::Attached(id) = handshake.stage {
                    let pid = handshake.conn.peer().pid.unwrap_or(0);
                    let _ = self.events.send(AdmissionEvent::Attached { id, pid, conn: handshake.conn });
                }
            }
            Err(failure) => {
                let handshake = self.pending.swap_remove(index);
                self.fail(handshake, failure);
            }
        }
    }

    /// Handles one message of handshake `index`: `Ok(true)` when the consumer is attached.
    fn advance(&mut self, index: usize, message: Message) -> Result<bool, Failure> {
        let Some((stage, peer)) = self.pending.get(index).map(|h| (h.stage, h.conn.peer())) else {
            return Ok(false);
        };
        match (stage, message) {
            (Stage::Hello, Message::ClientHello(hello)) => {
                let pid = self.admit_hello(peer, &hello)?;
                let token = self.next_token;
                self.next_token += 1;
                if let Some(handshake) = self.pending.get_mut(index) {
                    handshake.stage = Stage::Offer(token);
                }
                let _ = self.events.send(AdmissionEvent::WantsOffer { token, pid, name: hello.consumer_name });
                Ok(false)
            }
            (Stage::Attached(id), Message::Attached(Attached { consumer_id })) if consumer_id == id.index() => {
                tracing::debug!(consumer = id.index(), "handshake complete");
                Ok(true)
            }
            (Stage::Attached(_), Message::Refused(refused)) => {
                Err(Failure::silent(format!("the consumer gave up: {}", refused.message)))
            }
            (Stage::Attached(_), Message::Detach(detach)) => {
                Err(Failure::silent(format!("the consumer left during the handshake ({:?})", detach.reason)))
            }
            (Stage::Hello, other) => Err(Failure::refuse(
                RefusalCode::MalformedHello,
                format!("expected a ClientHello, got {}", other.message_type().name()),
            )),
            (stage, other) => {
                Err(Failure::silent(format!("unexpected {} at stage {stage:?}", other.message_type().name())))
            }
        }
    }

    /// Checks a hello; returns the pid its record will hold. A peer whose pid the producer cannot see (another PID
    /// namespace) gets `None` (a record with pid 0), which the ring never declares gone by pid: its connection's
    /// hang-up is what the watchdog acts on.
    fn admit_hello(&self, peer: PeerCredentials, hello: &ClientHello) -> Result<Option<Pid>, Failure> {
        #[cfg(test)]
        if hello.consumer_name == tests::PANIC_NAME {
            panic!("a panic the tests asked for");
        }
        if let Some(wanted) = hello.wanted_backend
            && wanted != self.config.backend
        {
            let message =
                format!("this producer uses the {} backend, the consumer wants {wanted}", self.config.backend);
            return Err(Failure::refuse(RefusalCode::BackendMismatch, message));
        }
        let pid = peer.pid.and_then(|pid| i32::try_from(pid).ok()).and_then(rustix::process::Pid::from_raw);
        match peer.pid {
            None => tracing::info!(
                client_pid = hello.client_pid,
                name = %hello.consumer_name,
                "consumer in another PID namespace (SO_PEERCRED pid 0): its liveness follows its connection"
            ),
            Some(seen) if seen != hello.client_pid => tracing::info!(
                pid = seen,
                client_pid = hello.client_pid,
                name = %hello.consumer_name,
                "consumer in a PID namespace below ours (it names itself by another pid)"
            ),
            Some(_) => {}
        }
        Ok(pid)
    }

    /// Sends the producer's answer to handshake `token`: the offer for the record it took, or its refusal.
    fn deliver(&mut self, token: u64, kit: OfferKit) {
        let Some(index) = self.pending.iter().position(|h| h.stage == Stage::Offer(token)) else {
            // That handshake failed meanwhile: give back the record the producer took for it (the kit's fds just
            // close).
            if let Ok((id, _, _)) = kit {
                self.give_back(id);
            }
            return;
        };
        let outcome = match kit {
            Err((code, reason)) => Err(Failure::refuse(code, reason)),
            Ok((id, message, fds)) => {
                let sent = self.pending.get_mut(index).map(|handshake| {
                    // The record is the handshake's from here: a failure gives it back.
                    handshake.stage = Stage::Attached(id);
                    handshake.conn.send(&message, fds, SEND_TIMEOUT)
                });
                match sent {
                    Some(Err(e)) => Err(Failure::from(e)),
                    // The consumer may have answered already; its bytes wait for the next poll.
                    Some(Ok(())) | None => Ok(()),
                }
            }
        };
        if let Err(failure) = outcome {
            let handshake = self.pending.swap_remove(index);
            self.fail(handshake, failure);
        }
    }

    /// Ends a handshake that did not attach: tells the peer why where that helps, gives its record back, logs.
    fn fail(&self, handshake: Handshake, failure: Failure) {
        let pid = handshake.conn.peer().pid;
        if let Some(code) = failure.refusal {
            let refusal = Refused { code, message: truncate(&failure.reason, MAX_REFUSAL_MESSAGE_BYTES) };
            // Best effort: the peer may be gone already.
            let _ = handshake.conn.send(&Message::Refused(refusal), Vec::new(), SEND_TIMEOUT);
            handshake.conn.discard_unread();
        }
        let record = handshake.stage.record();
        tracing::warn!(pid, consumer = record.map(|id| id.index()), reason = %failure.reason, "a consumer failed to attach");
        // In this order: mark the record dead (a consumer that then finds its connection gone also finds its record
        // no longer LIVE, and knows it was dropped, not that the producer died: it must not poison the ring); hang
        // up; only then announce the record for reuse (a consumer that read its record's epoch while the connection
        // was still open knows that epoch was its own: docs/protocol.md, attaching, step 5).
        if let Some(id) = record
            && let Err(e) = self.ring.mark_consumer_dead(id)
        {
            tracing::warn!(consumer = id.index(), error = %e, "could not mark a failed handshake's record dead");
        }
        drop(handshake);
        if let Some(id) = record {
            let _ = self.events.send(AdmissionEvent::Failed { id });
        }
    }

    /// Marks record `id`, taken for a handshake that failed, dead (poisoning its release counters) and tells the
    /// producer, which retires it.
    fn give_back(&self, id: ConsumerId) {
        if let Err(e) = self.ring.mark_consumer_dead(id) {
            tracing::warn!(consumer = id.index(), error = %e, "could not mark a failed handshake's record dead");
        }
        let _ = self.events.send(AdmissionEvent::Failed { id });
    }
}

/// What ends a handshake whose connection could not be read: before a valid hello the peer is told why (a
/// version this build does not speak: `Refused` code 1; anything else malformed: code 6), unless it is gone or
/// the socket failed; after the hello the connection is just closed.
/// The text of a panic's payload (`panic!` with a message gives a `&str` or a `String`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

fn read_failure(stage: Stage, error: WireError) -> Failure {
    match (stage, error) {
        (Stage::Hello, WireError::UnsupportedVersion { found, supported }) => Failure::refuse(
            RefusalCode::UnsupportedVersion,
            format!(
                "this producer speaks wire protocol version {supported} only, the message was version {found}: \
                 use a consumer of the same gpu-ipc protocol version"
            ),
        ),
        (Stage::Hello, error @ (WireError::PeerHungUp { .. } | WireError::Os { .. })) => Failure::from(error),
        (Stage::Hello, error) => Failure::refuse(RefusalCode::MalformedHello, format!("malformed hello: {error}")),
        (_, error) => Failure::from(error),
    }
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default().to_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    use super::MAX_PANICS;
    use crate::fake::{HostContext, HostFake};
    use crate::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig};
    use crate::wire::{FrameGeometry, PixelFormat, SyncStrategy};

    /// A consumer of this name makes the admission thread panic on its hello (test builds only).
    pub(crate) const PANIC_NAME: &str = "panic-the-admission-thread";

    fn producer(tag: &str) -> (Producer<HostFake>, PathBuf) {
        let path = std::env::temp_dir().join(format!("gpu-ipc-admission-{tag}-{}.sock", std::process::id()));
        let geometry = FrameGeometry::new(64, 16, PixelFormat::Rgba8).unwrap();
        let config = ProducerConfig::new(&path, geometry, 2, SyncStrategy::CpuSpin);
        (Producer::<HostFake>::create(&HostContext, config).unwrap(), path)
    }

    /// Attaches as `name` on another thread; the producer admits meanwhile, for at most `limit`.
    fn attach_as(producer: &mut Producer<HostFake>, path: &Path, name: &str, limit: Duration) -> Result<(), String> {
        let (path, name) = (path.to_path_buf(), name.to_owned());
        let attacher = std::thread::spawn(move || {
            let options = AttachOptions { name, timeout: Duration::from_secs(2), ..AttachOptions::default() };
            Consumer::<HostFake>::attach(&HostContext, &path, &options).map(drop).map_err(|e| e.to_string())
        });
        let end = Instant::now() + limit;
        while !attacher.is_finished() && Instant::now() < end {
            let _ = producer.admit_pending();
            std::thread::sleep(Duration::from_millis(1));
        }
        attacher.join().unwrap()
    }

    #[test]
    fn a_panic_of_the_admission_thread_fails_that_handshake_and_the_next_consumer_attaches() {
        let (mut producer, path) = producer("panic-once");
        let started = Instant::now();
        let refused = attach_as(&mut producer, &path, PANIC_NAME, Duration::from_secs(5));
        assert!(refused.is_err(), "the handshake that set off the panic fails");
        assert!(started.elapsed() < Duration::from_secs(2), "at once, not at a deadline: {:?}", started.elapsed());
        for i in 0..3 {
            attach_as(&mut producer, &path, &format!("after-{i}"), Duration::from_secs(5)).unwrap();
        }
        producer.admit_pending().unwrap();
        assert!(path.exists(), "the socket stays");
    }

    #[test]
    fn an_admission_thread_that_keeps_panicking_stops_accepting_and_says_so() {
        let (mut producer, path) = producer("panic-always");
        for _ in 0..MAX_PANICS {
            assert!(attach_as(&mut producer, &path, PANIC_NAME, Duration::from_secs(5)).is_err());
        }
        let end = Instant::now() + Duration::from_secs(5);
        let error = loop {
            match producer.admit_pending() {
                Err(e) => break e,
                Ok(()) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
                Ok(()) => panic!("admit_pending never reported the stopped admission thread"),
            }
        };
        assert!(matches!(error, FrameError::Admission(ref why) if why.contains("8 times")), "{error}");
        assert!(!path.exists(), "the socket file goes with the listener");
        assert!(attach_as(&mut producer, &path, "late", Duration::from_secs(5)).is_err());
        // The producer itself goes on.
        let lease = producer.acquire(None, Duration::from_secs(1)).unwrap();
        producer.publish(lease, None).unwrap();
    }

    fn connect(path: &Path) -> crate::wire::PeerConnection {
        use crate::wire::{PeerConnection, PeerPolicy};
        PeerConnection::connect_with(path, Duration::from_secs(2), &PeerPolicy::SameUser).unwrap()
    }

    /// Sends a hello as `name` on `conn`.
    fn say_hello(conn: &crate::wire::PeerConnection, name: &str) {
        use crate::wire::{ClientHello, Message, PROTOCOL_VERSION};
        let hello = ClientHello {
            protocol_version: PROTOCOL_VERSION,
            client_pid: std::process::id(),
            wanted_backend: None,
            consumer_name: name.to_owned(),
        };
        conn.send(&Message::ClientHello(hello), Vec::new(), Duration::from_secs(1)).unwrap();
    }

    fn raw_hello(path: &Path, name: &str) -> crate::wire::PeerConnection {
        let conn = connect(path);
        say_hello(&conn, name);
        conn
    }

    /// When the thread gives up, records the producer had already offered (taken, LIVE) must come back: an offer
    /// still in the channel, a handshake it never ended. (Found by review: 2 of 30 trials held the producer up.)
    #[test]
    fn records_offered_when_the_thread_gives_up_are_given_back() {
        let mut stuck_trials = Vec::new();
        for trial in 0..12 {
            let path = std::env::temp_dir().join(format!("gpu-ipc-admission-leak-{trial}-{}.sock", std::process::id()));
            let geometry = FrameGeometry::new(64, 16, PixelFormat::Rgba8).unwrap();
            let mut config = ProducerConfig::new(&path, geometry, 2, SyncStrategy::CpuSpin);
            config.max_pending_handshakes = 128;
            let mut producer = Producer::<HostFake>::create(&HostContext, config).unwrap();
            for _ in 0..MAX_PANICS - 1 {
                assert!(attach_as(&mut producer, &path, PANIC_NAME, Duration::from_secs(5)).is_err());
            }
            let p = path.clone();
            let clients = std::thread::spawn(move || {
                // Accepted first, so served last in a round: its hello panics after the others got offers.
                let first = connect(&p);
                std::thread::sleep(Duration::from_millis(30));
                let others: Vec<_> = (0..15).map(|i| raw_hello(&p, &format!("c{i}"))).collect();
                say_hello(&first, PANIC_NAME);
                std::thread::sleep(Duration::from_millis(200));
                (first, others)
            });
            while !clients.is_finished() {
                let _ = producer.admit_pending();
            }
            let _keep_open = clients.join().unwrap();
            let end = Instant::now() + Duration::from_secs(5);
            while producer.admit_pending().is_ok() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(producer.admit_pending().is_err(), "trial {trial}: the thread gave up");
            producer.wait_for_consumers(0, Duration::ZERO).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            // No consumer is attached: frames must flow.
            for _ in 0..6 {
                match producer.acquire(None, Duration::from_millis(300)) {
                    Ok(lease) => producer.publish(lease, None).unwrap(),
                    Err(e) => {
                        stuck_trials.push(format!("trial {trial}: {e}"));
                        break;
                    }
                }
            }
        }
        assert!(stuck_trials.is_empty(), "a LIVE record nobody holds: {stuck_trials:#?}");
    }

    #[test]
    fn the_handshake_that_set_off_a_panic_is_refused_not_told_to_retry() {
        let (mut producer, path) = producer("panic-refused");
        let error = attach_as(&mut producer, &path, PANIC_NAME, Duration::from_secs(5)).unwrap_err();
        assert!(error.contains("do not retry"), "{error}");
        assert!(!error.contains("attach again"), "{error}");
    }
}
