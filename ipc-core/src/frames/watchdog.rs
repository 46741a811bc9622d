//! The thread that notices a dead peer and unblocks the survivor.
//!
//! Each process watches its peers' rendezvous connections (a duplicate of each socket fd) for hang-up, which the
//! kernel signals the moment a process exits or is killed, even before its parent reaps it. The producer then
//! marks the consumer dead in the control block, which poisons that consumer's release counters so that stream
//! waits on them complete; a consumer whose producer vanished poisons the publish counters its own stream may be
//! waiting on, and records that the producer is gone, so its next call returns
//! [`FrameError::ProducerGone`](super::FrameError).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, poll};

/// How often the watchdog looks: a hang-up is acted on within about this long.
const PERIOD: Duration = Duration::from_millis(1);

/// How long after a hang-up the action is repeated. A killed process's queued GPU work can still run while the
/// driver tears its context down, and its stream writes can overwrite the poison the survivor wrote; repeating
/// the poisoning until that work must be gone keeps the survivor's waits released. The repeating needs only the
/// action, not the connection: the watched fd is closed at the hang-up, so under churn the open fds stay bounded
/// by the peers still connected, not by the rate at which peers leave.
const REPEAT_FOR: Duration = Duration::from_secs(10);

/// What to do when a watched peer hangs up: called with `true` at once, then with `false` every period while it
/// returns true, for at most [`REPEAT_FOR`]. It is dropped after its last call (what holds a quarantine on the
/// peer's record, see the producer).
pub(crate) type OnHangUp = Box<dyn FnMut(bool) -> bool + Send>;

struct Watched {
    /// A duplicate of the peer's socket until it hangs up; `None` afterwards.
    fd: Option<OwnedFd>,
    on_hang_up: OnHangUp,
    since: Option<Instant>,
    /// Whether the action asked to be repeated.
    repeat: bool,
}

/// The watchdog thread of one producer or consumer.
pub(crate) struct Watchdog {
    watched: Arc<Mutex<Vec<Watched>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts a watchdog with nothing to watch yet.
    pub(crate) fn start() -> Self {
        let watched: Arc<Mutex<Vec<Watched>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (watched, stop) = (watched.clone(), stop.clone());
            std::thread::Builder::new()
                .name("gpu-ipc-watchdog".into())
                .spawn(move || run(&watched, &stop))
                .map_err(|e| tracing::error!(error = %e, "no watchdog thread: a dead peer may go unnoticed"))
                .ok()
        };
        Self { watched, stop, thread }
    }

    /// Watches `conn` (through a duplicate of its fd) and runs `on_hang_up` when the peer hangs up (see
    /// [`OnHangUp`]).
    pub(crate) fn watch(&self, conn: &impl AsFd, on_hang_up: OnHangUp) -> std::io::Result<()> {
        let fd = conn.as_fd().try_clone_to_owned()?;
        if let Ok(mut list) = self.watched.lock() {
            list.push(Watched { fd: Some(fd), on_hang_up, since: None, repeat: true });
        }
        Ok(())
    }

    /// Stops the thread and waits for it.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(watched: &Mutex<Vec<Watched>>, stop: &AtomicBool) {
    let hang_up = PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR | PollFlags::NVAL;
    let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
    while !stop.load(Ordering::Acquire) {
        if let Ok(mut list) = watched.lock()
            && !list.is_empty()
        {
            // Only the peers still connected are polled; the others are in their repeat window.
            let revents: Vec<PollFlags> = {
                let mut fds: Vec<PollFd<'_>> =
                    list.iter().filter_map(|w| w.fd.as_ref()).map(|fd| PollFd::new(fd, PollFlags::RDHUP)).collect();
                match poll(&mut fds, Some(&zero)) {
                    Ok(n) if n > 0 => fds.iter().map(PollFd::revents).collect(),
                    _ => vec![PollFlags::empty(); fds.len()],
                }
            };
            let mut revents = revents.into_iter();
            let now = Instant::now();
            for w in list.iter_mut() {
                let flags =
                    if w.fd.is_some() { revents.next().unwrap_or(PollFlags::empty()) } else { PollFlags::empty() };
                match w.since {
                    None if flags.intersects(hang_up) => {
                        w.since = Some(now);
                        w.fd = None;
                        w.repeat = (w.on_hang_up)(true);
                    }
                    Some(_) if w.repeat => w.repeat = (w.on_hang_up)(false),
                    _ => {}
                }
            }
            list.retain(|w| w.since.is_none_or(|t| w.repeat && now.duration_since(t) < REPEAT_FOR));
        }
        std::thread::sleep(PERIOD);
    }
}
