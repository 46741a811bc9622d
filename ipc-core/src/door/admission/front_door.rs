//! The admission thread's loop: `poll` over the listener and every handshake, accept, expire, evict, advance.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;
use rustix::process::Pid;

use super::handshake::{Failure, Handshake, Stage, read_failure, truncate};
use super::{
    ACCEPT_BACKOFF, ACCEPT_ERROR_BACKOFF, ACCEPTS_PER_ROUND, AdmissionConfig, AdmissionEvent, IDLE_POLL, MAX_PANICS,
    OfferKit, PANIC_WINDOW, Records, SEND_TIMEOUT, SILENT_GRACE,
};
use crate::wire::{
    Attached, ClientHello, MAX_REFUSAL_MESSAGE_BYTES, Message, ObjectKind, PeerCredentials, RefusalCode, Refused,
    RendezvousListener, StatusReport, WireError,
};

/// The thread's state.
pub(super) struct FrontDoor<R: Records> {
    pub(super) listener: RendezvousListener,
    pub(super) records: Arc<R>,
    pub(super) config: AdmissionConfig,
    pub(super) events: mpsc::Sender<AdmissionEvent<R::Id>>,
    pub(super) offers: mpsc::Receiver<(u64, OfferKit<R::Id>)>,
    pub(super) wake: UnixStream,
    /// Written one byte after each event, so that an owner waiting in `poll` (the object door) wakes at once.
    pub(super) news: UnixStream,
    pub(super) pending: Vec<Handshake<R::Id>>,
    pub(super) accept_paused_until: Option<Instant>,
    /// The number of the next hello sent to the producer.
    pub(super) next_token: u64,
    /// The handshake being served (`step`), to refuse it if it sets off a panic.
    pub(super) stepping: Option<usize>,
}

impl<R: Records> FrontDoor<R> {
    /// Sends `event` to the owner and wakes it (a full buffer means a wake-up is pending already; `NOSIGNAL`: an
    /// owner that is gone has closed the other end).
    fn announce(&self, event: AdmissionEvent<R::Id>) {
        let _ = self.events.send(event);
        let _ =
            rustix::net::send(&self.news, &[1], rustix::net::SendFlags::NOSIGNAL | rustix::net::SendFlags::DONTWAIT);
    }

    /// [`FrontDoor::run`], started afresh after a panic (a bug: every failure a peer can cause is handled without
    /// one) once the handshakes in flight are failed, up to [`MAX_PANICS`] times; then it records why in
    /// `gave_up` and returns, which drops the listener (and removes the socket file).
    pub(super) fn run_surviving_panics(mut self, stop: &AtomicBool, gave_up: &Mutex<Option<String>>) {
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
                    self.pending.push(Handshake::new(conn, accepted, accepted + self.config.handshake_timeout));
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

    /// Closes the oldest connection that has not said a valid hello in [`SILENT_GRACE`]; false when there is none.
    /// A connection accepted moments ago may have its hello waiting unread (it was accepted in this round, before a
    /// `poll` could show it): evicting it made a flood of clients that said hello and went quiet lock every new
    /// client out, each closed the instant after it was accepted. Until one is old enough, new connections wait in
    /// the listener's backlog.
    fn evict_oldest_silent(&mut self) -> bool {
        let now = Instant::now();
        let oldest = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, h)| h.stage == Stage::Hello && now.duration_since(h.accepted) >= SILENT_GRACE)
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
            match self.advance(index, received.message, received.version) {
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
                    let without_events = handshake.without_events;
                    self.announce(AdmissionEvent::Attached { id, pid, conn: handshake.conn, without_events });
                } else {
                    // A status request served: close in order.
                    handshake.conn.discard_unread();
                }
            }
            Err(failure) => {
                let handshake = self.pending.swap_remove(index);
                self.fail(handshake, failure);
            }
        }
    }

    /// Handles one message of handshake `index`, received in protocol `version`: `Ok(true)` when the consumer is
    /// attached.
    fn advance(&mut self, index: usize, message: Message, version: u16) -> Result<bool, Failure> {
        let Some((stage, peer)) = self.pending.get(index).map(|h| (h.stage, h.conn.peer())) else {
            return Ok(false);
        };
        match (stage, message) {
            (Stage::Hello, Message::ClientHello(hello)) => {
                // From here on, answers go out in the version agreed with the hello (refusals too).
                if let Some(handshake) = self.pending.get_mut(index) {
                    handshake.version = hello.agreed_version();
                }
                let pid = self.admit_hello(peer, &hello)?;
                let token = self.next_token;
                self.next_token += 1;
                if let Some(handshake) = self.pending.get_mut(index) {
                    handshake.stage = Stage::Offer(token);
                }
                let part = hello.part;
                self.announce(AdmissionEvent::WantsOffer { token, pid, name: hello.consumer_name, peer, part });
                Ok(false)
            }
            (Stage::Attached(id), Message::Attached(Attached { consumer_id })) if consumer_id == R::wire_id(id) => {
                tracing::debug!(record = ?id, "handshake complete");
                Ok(true)
            }
            (Stage::Attached(id), Message::AttachedWithoutEvents(Attached { consumer_id }))
                if consumer_id == R::wire_id(id) && self.records.object() == ObjectKind::Ring =>
            {
                tracing::info!(record = ?id, "handshake complete; the consumer runs the ring without IPC events");
                if let Some(handshake) = self.pending.get_mut(index) {
                    handshake.without_events = true;
                }
                Ok(true)
            }
            (Stage::Attached(_), Message::Refused(refused)) => {
                Err(Failure::silent(format!("the consumer gave up: {}", refused.message)))
            }
            (Stage::Attached(_), Message::Detach(detach)) => {
                Err(Failure::silent(format!("the consumer left during the handshake ({:?})", detach.reason)))
            }
            (Stage::Hello, Message::StatusRequest(_)) => {
                let report = StatusReport {
                    kind: self.records.object(),
                    backend: self.config.backend,
                    owner_pid: std::process::id(),
                    peers: self.records.peers(),
                };
                if let Some(handshake) = self.pending.get(index) {
                    // In the request's version: the asker reads that one.
                    handshake.conn.send_in(version, &Message::StatusReport(report), Vec::new(), SEND_TIMEOUT)?;
                }
                tracing::debug!(pid = peer.pid, "status served");
                // Done: the connection closes without a record ever having been taken.
                Ok(true)
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
        if hello.consumer_name == super::tests::PANIC_NAME {
            panic!("a panic the tests asked for");
        }
        let serves = self.records.object();
        if hello.object != serves {
            let message = format!(
                "this socket serves a {serves}, the client asked for a {}: point it at the {}'s socket",
                hello.object, hello.object
            );
            return Err(Failure::refuse(RefusalCode::WrongObject, message));
        }
        if let Some(words) = self.records.refuse_version(hello.protocol_version) {
            return Err(Failure::refuse(RefusalCode::UnsupportedVersion, words));
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
    fn deliver(&mut self, token: u64, kit: OfferKit<R::Id>) {
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
                    handshake.conn.send_in(handshake.version, &message, fds, SEND_TIMEOUT)
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
    fn fail(&self, handshake: Handshake<R::Id>, failure: Failure) {
        let pid = handshake.conn.peer().pid;
        if let Some(code) = failure.refusal {
            let refusal = Refused { code, message: truncate(&failure.reason, MAX_REFUSAL_MESSAGE_BYTES) };
            // Best effort: the peer may be gone already.
            let _ = handshake.conn.send_in(handshake.version, &Message::Refused(refusal), Vec::new(), SEND_TIMEOUT);
            handshake.conn.discard_unread();
        }
        let record = handshake.stage.record();
        tracing::warn!(pid, record = ?record, reason = %failure.reason, "a peer failed to attach");
        // In this order: mark the record dead (a consumer that then finds its connection gone also finds its record
        // no longer LIVE, and knows it was dropped, not that the producer died: it must not poison the ring); hang
        // up; only then announce the record for reuse (a consumer that read its record's epoch while the connection
        // was still open knows that epoch was its own: docs/protocol.md, attaching, step 5).
        if let Some(id) = record
            && let Err(e) = self.records.mark_dead(id)
        {
            tracing::warn!(record = ?id, error = %e, "could not mark a failed handshake's record dead");
        }
        drop(handshake);
        if let Some(id) = record {
            self.announce(AdmissionEvent::Failed { id });
        }
    }

    /// Marks record `id`, taken for a handshake that failed, dead (poisoning its release counters) and tells the
    /// producer, which retires it.
    fn give_back(&self, id: R::Id) {
        if let Err(e) = self.records.mark_dead(id) {
            tracing::warn!(record = ?id, error = %e, "could not mark a failed handshake's record dead");
        }
        self.announce(AdmissionEvent::Failed { id });
    }
}

/// The text of a panic's payload (`panic!` with a message gives a `&str` or a `String`).
pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
