//! [`Semaphore`]: one process's handle (the owner's or an importer's): CPU and stream posts and waits; and the
//! importer's reading of an offer (`import_offer`).

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use std::os::fd::OwnedFd;

use super::block::{PeerRecord, SemaphoreBlock, check_count};
use super::body::{SEMAPHORE_OFFER_FDS, SemaphoreOffer};
use super::error::SemaphoreError;
use super::gpu::GpuSide;
use super::layout::{COUNT_MASK, LAYOUT_VERSION, RecordState, SHARED_BYTES, SemaphoreState};
use super::watchdog::Watchdog;
use crate::door::{self, ObjectKind, ObjectOffer, OwnerLink};
use gpu_ipc_driver::{Context, DevicePtr, DeviceSpan, Stream};
use ipc_core::backend::Backend;
use ipc_core::ring::{WaitMode, bounded_wait};

/// How a CPU-side wait passes time: it spins first (lowest latency), then sleeps in short naps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// How long to spin before napping (default 50 us).
    pub spin: Duration,
    /// Each nap once spinning is over (default 100 us).
    pub nap: Duration,
    /// How often an importer checks its connection to the owner while waiting (default 10 ms; a hang-up is also
    /// seen at once by the handle's watchdog thread).
    pub check_interval: Duration,
}

impl Default for WaitPolicy {
    fn default() -> Self {
        Self {
            spin: Duration::from_micros(50),
            nap: Duration::from_micros(100),
            check_interval: Duration::from_millis(10),
        }
    }
}

/// How a process attaches to a semaphore ([`Semaphore::attach`]).
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// The name the owner's peer list shows (at most 64 bytes).
    pub name: String,
    /// Whether this process may post (default true). **No longer needed**: the owner counts a peer as a poster
    /// from its first post on (the peer marks its record before the post can land), so a peer that only waits
    /// never breaks the semaphore by dying, whatever this says. Kept for compatibility: `false` is a promise not
    /// to post, which [`post`](Semaphore::post) keeps by refusing ([`SemaphoreError::NotAPoster`]).
    pub posts: bool,
    /// Bound on connecting and attaching (default 5 s).
    pub timeout: Duration,
    /// How CPU-side waits pass time.
    pub wait: WaitPolicy,
}

impl Default for AttachOptions {
    fn default() -> Self {
        Self {
            name: "semaphore-peer".into(),
            posts: true,
            timeout: Duration::from_secs(5),
            wait: WaitPolicy::default(),
        }
    }
}

/// A GPU-side wait queued by [`Semaphore::wait_on`]: its ticket, and the device address of the word that says
/// how it was released, for the kernels queued after it ([`status_word`](Self::status_word)); on the CPU, ask
/// [`Semaphore::wait_status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "give the kernels queued after the wait its status_word and ticket, or ask wait_status after the \
              stream's work, to know whether a post or the poison released the wait"]
pub struct StreamWait {
    ticket: u64,
    status_word: DevicePtr,
}

impl StreamWait {
    /// The ticket: the wait is released by post `ticket + 1`.
    pub fn ticket(&self) -> u64 {
        self.ticket
    }

    /// The device address (in the context of the handle that queued the wait) of the semaphore's `posted` word,
    /// for the kernels queued after the wait: pass it and [`ticket`](Self::ticket) to them, and let them read the
    /// word once (`ld.acquire.sys.u64`, or a `volatile` load) and go on only if
    /// [`released_by_post`](Self::released_by_post) holds for it; otherwise the poison released the wait (a poster
    /// died, the owner died or closed) and the kernel must not use the data the post would have announced. The
    /// word is read-only for kernels. `kernels/cuda/gpu_ipc_semaphore.cuh` has the check as a device function.
    pub fn status_word(&self) -> DevicePtr {
        self.status_word
    }

    /// The rule a kernel applies to the word at [`status_word`](Self::status_word): whether a post, not the
    /// poison, released the wait with this ticket. The real count sits in the low 62 bits and only grows, so the
    /// answer does not change once true (until the owner resets a broken semaphore: see `docs/semaphore.md`).
    pub fn released_by_post(&self, word: u64) -> bool {
        (word & COUNT_MASK) > self.ticket
    }
}

/// What a handle shares with the stream posts it queued: the block, its record, and (for an importer) the
/// connection, which must stay open until the last queued post has landed.
pub(super) struct PeerSide {
    pub(super) block: SemaphoreBlock,
    pub(super) record: PeerRecord,
    pub(super) posts: bool,
    /// The connection to the owner; `None` in the owner's own handle.
    pub(super) link: Option<Arc<OwnerLink>>,
}

impl Drop for PeerSide {
    fn drop(&mut self) {
        // An importer leaves cleanly: the owner sees `Detached` when the connection closes (right after this) and
        // breaks nothing. The owner may not have seen `Attached` yet.
        if self.link.is_some() {
            let (block, record) = (&self.block, self.record);
            let _ = block.move_record(record, RecordState::Attached, RecordState::Detached)
                || block.move_record(record, RecordState::Offered, RecordState::Detached);
        }
    }
}

/// The GPU side, made on the first stream wait, and where the next ticket slot search starts.
#[derive(Default)]
struct GpuState {
    side: Option<GpuSide>,
    hint: usize,
}

/// A process's handle on a cross-process counting semaphore: the owner's ([`SemaphoreOwner::semaphore`]) or an
/// importer's ([`Semaphore::attach`]). `Send + Sync`: share it between threads with an `Arc`.
///
/// [`SemaphoreOwner::semaphore`]: super::SemaphoreOwner::semaphore
pub struct Semaphore {
    peer: Arc<PeerSide>,
    cuda: Option<Context>,
    gpu: Mutex<GpuState>,
    watchdog: Option<Watchdog>,
    policy: WaitPolicy,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("record", &self.peer.record)
            .field("posts", &self.peer.posts)
            .field("value", &self.value())
            .finish_non_exhaustive()
    }
}

impl Semaphore {
    pub(super) fn new(peer: PeerSide, cuda: Option<Context>, policy: WaitPolicy) -> Result<Self, SemaphoreError> {
        let watchdog = match &peer.link {
            Some(link) => Some(Watchdog::start(Arc::clone(link), peer.block.clone())?),
            None => None,
        };
        Ok(Self { peer: Arc::new(peer), cuda, gpu: Mutex::default(), watchdog, policy })
    }

    /// Attaches to the semaphore served at `socket`. `ctx` is the CUDA context stream waits use (a GPU backend's;
    /// the host backend's handle does CPU posts and waits, and stream posts on any stream).
    ///
    /// # Errors
    /// [`SemaphoreError::Door`] (nothing listens there: start the owner first; refused; timed out), or an offer or
    /// shared block that is not a semaphore's.
    pub fn attach<B: Backend>(
        ctx: &B::Context,
        socket: &Path,
        options: &AttachOptions,
    ) -> Result<Self, SemaphoreError> {
        let (mut peer, link) =
            door::attach(socket, ObjectKind::Semaphore, None, &options.name, options.timeout, |offer, fds| {
                import_offer(offer, fds, options.posts)
            })?;
        tracing::info!(socket = %socket.display(), record = peer.record.index, "attached to a semaphore");
        peer.link = Some(Arc::new(link));
        let semaphore = Self::new(peer, B::cuda_context(ctx).cloned(), options.wait)?;
        // A semaphore a dead poster broke is still served (its owner may reset it): a newcomer learns why it
        // does not work, in the semaphore's words, and leaves cleanly (dropping the handle detaches).
        semaphore.peer.block.check()?;
        Ok(semaphore)
    }

    /// The shared block (its counters and state, for inspection).
    pub fn block(&self) -> &SemaphoreBlock {
        &self.peer.block
    }

    /// This handle's peer record.
    pub fn record(&self) -> PeerRecord {
        self.peer.record
    }

    /// Posts not yet taken, minus GPU-side waits still waiting (negative when streams wait for posts).
    pub fn value(&self) -> i64 {
        self.peer.block.value()
    }

    /// `Ok` while the semaphore works; else why not. A stream user calls it (or [`wait_status`](Self::wait_status))
    /// after the work queued behind a [`wait_on`](Self::wait_on) to learn whether the poison released it.
    ///
    /// # Errors
    /// [`SemaphoreError::PosterDied`], [`SemaphoreError::OwnerGone`], [`SemaphoreError::Closed`].
    pub fn check(&self) -> Result<(), SemaphoreError> {
        self.liveness()?;
        self.peer.block.check()
    }

    /// An importer notices the owner's hang-up itself too (its watchdog may not have run yet).
    fn liveness(&self) -> Result<(), SemaphoreError> {
        if let Some(link) = &self.peer.link
            && link.owner_gone()
        {
            self.peer.block.end(SemaphoreState::OwnerGone);
            return self.peer.block.check();
        }
        Ok(())
    }

    fn may_post(&self, count: u64) -> Result<(), SemaphoreError> {
        if !self.peer.posts {
            return Err(SemaphoreError::NotAPoster);
        }
        check_count(count)
    }

    /// Adds `count` posts now, from the CPU.
    ///
    /// # Errors
    /// A handle attached with `posts = false`; a count outside `1..=MAX_POST`; a semaphore that no longer works.
    pub fn post(&self, count: u64) -> Result<(), SemaphoreError> {
        self.may_post(count)?;
        self.peer.block.post_as(self.peer.record, count)
    }

    /// Takes a post if one is there, without waiting.
    ///
    /// # Errors
    /// A semaphore that no longer works.
    pub fn try_wait(&self) -> Result<bool, SemaphoreError> {
        self.liveness()?;
        self.peer.block.try_take()
    }

    /// Waits, from the CPU, up to `timeout` for a post and takes it: spinning for [`WaitPolicy::spin`], then
    /// napping. A wait that times out takes nothing.
    ///
    /// # Errors
    /// [`SemaphoreError::Timeout`]; [`SemaphoreError::PosterDied`], [`SemaphoreError::OwnerGone`] or
    /// [`SemaphoreError::Closed`] as soon as the semaphore ends (within a second of a peer's death).
    pub fn wait(&self, timeout: Duration) -> Result<(), SemaphoreError> {
        let start = Instant::now();
        let deadline = start + timeout;
        let block = &self.peer.block;
        let interval = self.policy.check_interval;
        let spun = bounded_wait(
            (start + self.policy.spin).min(deadline),
            WaitMode::Spin,
            interval,
            || block.try_take(),
            || self.liveness(),
            |waited| SemaphoreError::Timeout { waited },
        );
        match spun {
            Err(SemaphoreError::Timeout { .. }) if Instant::now() < deadline => {}
            done => return done,
        }
        bounded_wait(
            deadline,
            WaitMode::Sleep(self.policy.nap),
            interval,
            || block.try_take(),
            || self.liveness(),
            |_| SemaphoreError::Timeout { waited: start.elapsed() },
        )
    }

    /// Queues on `stream` a wait for a post: the stream's later work runs once a post is taken for it (or once
    /// the semaphore ends: see [`wait_status`](Self::wait_status)). Returns at once. The wait's ticket is taken
    /// now, so posts are served to CPU and stream waiters in the order they asked.
    ///
    /// # Errors
    /// No CUDA context ([`SemaphoreError::NoCudaContext`]), a stream of another context, a device without 64-bit
    /// stream memory operations, [`SemaphoreError::TooManyStreamWaits`], a semaphore that no longer works, or the
    /// driver's error (the ticket is then given back).
    pub fn wait_on(&self, stream: &Stream) -> Result<StreamWait, SemaphoreError> {
        self.liveness()?;
        let Some(ctx) = &self.cuda else { return Err(SemaphoreError::NoCudaContext) };
        let mut gpu = self.gpu.lock().unwrap_or_else(PoisonError::into_inner);
        let GpuState { side, hint } = &mut *gpu;
        let side = match side {
            Some(side) => side,
            None => side.insert(GpuSide::new(ctx, &self.peer.block)?),
        };
        if !side.same_context(stream) {
            return Err(SemaphoreError::WrongContext);
        }
        let block = &self.peer.block;
        let ticket = block.take_ticket(self.peer.record, hint)?;
        let wait = StreamWait { ticket, status_word: side.status_word() };
        if block.posted() > ticket {
            // Already posted, as the CPU sees (an acquire load): the stream needs no wait.
            return Ok(wait);
        }
        if let Err(e) = side.queue_wait(stream, ticket) {
            block.give_back(self.peer.record, ticket);
            return Err(e);
        }
        Ok(wait)
    }

    /// How a stream wait was released: `Ok(true)` by a post, `Ok(false)` not yet (the stream still waits), or the
    /// error that ended the semaphore, in which case the poison released it and the work queued after it ran
    /// without a post (discard its results).
    ///
    /// # Errors
    /// [`SemaphoreError::PosterDied`], [`SemaphoreError::OwnerGone`], [`SemaphoreError::Closed`].
    pub fn wait_status(&self, wait: &StreamWait) -> Result<bool, SemaphoreError> {
        let _ = self.liveness();
        self.peer.block.ticket_released(wait.ticket)
    }

    /// Queues on `stream` a copy of the word that tells how `wait` was released into `dst` (8 bytes of device
    /// memory, in this handle's context), so that the kernels queued after it on `stream` read the verdict from
    /// ordinary device memory: a post released the wait iff [`StreamWait::released_by_post`] holds for the `u64`
    /// at `dst` (`(word & COUNT_MASK) > ticket`). Queue it right after [`wait_on`](Self::wait_on) on the same
    /// stream: the copy runs once the wait is released, so it sees the post or the poison that released it.
    /// (Kernels may instead read [`StreamWait::status_word`] themselves.)
    ///
    /// # Errors
    /// [`SemaphoreError::NoCudaContext`]; no stream wait queued by this handle yet (nothing registered:
    /// [`SemaphoreError::NoCudaContext`] too); `dst` not 8 bytes, or the driver's error.
    pub fn copy_status_on(
        &self,
        stream: &Stream,
        wait: &StreamWait,
        dst: &DeviceSpan<'_>,
    ) -> Result<(), SemaphoreError> {
        let gpu = self.gpu.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(side) = &gpu.side else { return Err(SemaphoreError::NoCudaContext) };
        if !side.same_context(stream) {
            return Err(SemaphoreError::WrongContext);
        }
        tracing::trace!(ticket = wait.ticket, "semaphore: status word copied after a stream wait");
        side.copy_status(stream, dst)
    }

    /// Queues on `stream` a post of `count`: it lands once the stream's earlier work is done (a host function,
    /// `cuLaunchHostFunc`, adds it from a driver thread). Returns at once; the handle may be dropped before it
    /// lands (the connection to the owner then stays open until it has).
    ///
    /// # Errors
    /// As [`post`](Self::post), or the driver's error.
    pub fn post_on(&self, stream: &Stream, count: u64) -> Result<(), SemaphoreError> {
        self.may_post(count)?;
        self.check()?;
        // A poster from now on: if this process dies before the post lands, the post is owed.
        self.peer.block.mark_poster(self.peer.record);
        let peer = Arc::clone(&self.peer);
        stream.launch_host_fn(move || peer.block.add_posts(count))?;
        Ok(())
    }
}

impl Drop for Semaphore {
    fn drop(&mut self) {
        // The watchdog first (it holds the connection), then the GPU side (never unregistered under a stream that
        // may still poll it); the record is detached when the last queued post has landed (`PeerSide`).
        self.watchdog = None;
        let state = std::mem::take(self.gpu.get_mut().unwrap_or_else(PoisonError::into_inner));
        if let Some(side) = state.side {
            side.close(&self.peer.block);
        }
    }
}

/// Reads a semaphore offer (the importer's side of [`crate::door::attach`]): the body, the one fd, the shared
/// block, and the record offered. `posts: false` only makes this handle refuse to post.
fn import_offer(offer: &ObjectOffer, fds: Vec<OwnedFd>, posts: bool) -> Result<PeerSide, SemaphoreError> {
    let body = SemaphoreOffer::decode(&offer.body)?;
    if body.layout_version != LAYOUT_VERSION {
        return Err(SemaphoreError::LayoutVersion { found: u64::from(body.layout_version), expected: LAYOUT_VERSION });
    }
    if fds.len() != SEMAPHORE_OFFER_FDS {
        return Err(SemaphoreError::Corrupt { what: "offer fd count", value: fds.len() as u64 });
    }
    if body.shared_bytes != SHARED_BYTES as u64 {
        return Err(SemaphoreError::Corrupt { what: "offer shared_bytes", value: body.shared_bytes });
    }
    let Some(fd) = fds.into_iter().next() else {
        return Err(SemaphoreError::Corrupt { what: "offer fd count", value: 0 });
    };
    let block = SemaphoreBlock::attach(fd)?;
    if body.max_peers != block.max_peers() || body.generation != block.generation() {
        return Err(SemaphoreError::Corrupt { what: "offer (max_peers or generation)", value: body.generation });
    }
    let record = PeerRecord { index: body.record, epoch: body.epoch };
    if record.index == 0 || !block.record_is(record, RecordState::Offered) {
        return Err(SemaphoreError::Corrupt { what: "offered record", value: u64::from(record.index) });
    }
    Ok(PeerSide { block, record, posts, link: None })
}
