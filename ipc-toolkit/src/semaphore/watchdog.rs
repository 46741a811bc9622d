//! An importer's watchdog: a thread that sleeps in `poll` on the connection to the owner and, the moment it hangs
//! up, ends the semaphore as `OwnerGone` and poisons `posted`, so that this process's queued GPU-side waits (and
//! every other process's) are released even if no CPU call of this process ever looks again.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags, eventfd, poll};
use rustix::io::Errno;

use super::block::SemaphoreBlock;
use super::error::SemaphoreError;
use super::layout::SemaphoreState;
use crate::door::OwnerLink;

/// The watchdog thread and the eventfd that stops it.
pub(super) struct Watchdog {
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts watching `link` for the owner's hang-up.
    pub(super) fn start(link: Arc<OwnerLink>, block: SemaphoreBlock) -> Result<Self, SemaphoreError> {
        let thread_error = |source| SemaphoreError::Thread { what: "watchdog", source };
        let stop = eventfd(0, EventfdFlags::CLOEXEC).map_err(|e| thread_error(e.into()))?;
        let stopped = stop.try_clone().map_err(thread_error)?;
        let thread = std::thread::Builder::new()
            .name("gpu-ipc-semaphore-watchdog".into())
            .spawn(move || watch(&link, &block, &stopped))
            .map_err(thread_error)?;
        Ok(Self { stop, thread: Some(thread) })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Err(error) = rustix::io::write(&self.stop, &1u64.to_ne_bytes()) {
            // The thread would not wake: leave it (it ends when the owner hangs up or the process exits).
            tracing::warn!(%error, "semaphore: could not stop the watchdog");
            return;
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn watch(link: &OwnerLink, block: &SemaphoreBlock, stop: &OwnedFd) {
    loop {
        let mut fds = [PollFd::new(link, PollFlags::IN | PollFlags::RDHUP), PollFd::new(stop, PollFlags::IN)];
        match poll(&mut fds, None) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(error) => {
                tracing::warn!(%error, "semaphore: the watchdog cannot poll; the owner's death is seen by CPU calls only");
                return;
            }
        }
        if !fds[1].revents().is_empty() {
            return;
        }
        if fds[0].revents().is_empty() {
            continue;
        }
        if link.owner_gone() {
            if block.end(SemaphoreState::OwnerGone) {
                tracing::warn!(owner_pid = block.owner_pid(), "semaphore owner gone: poisoned, GPU waits released");
            }
            return;
        }
        // The owner said something after the offer (it never does): do not spin on it.
        std::thread::sleep(Duration::from_millis(10));
    }
}
