//! `gpu_ipc.Semaphore`: a cross-process counting semaphore (the core's `semaphore` module), posted and waited for
//! from the CPU or on a CUDA stream.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_ipc::BackendKind;
use gpu_ipc::host::{Host, HostContext};
use gpu_ipc::legacy::Legacy;
use gpu_ipc::semaphore::{
    AttachOptions, DeadPoster, OwnerOptions, Semaphore as CoreSemaphore, SemaphoreError, SemaphoreOwner, StreamWait,
};
use gpu_ipc::toolkit::door::DoorError;
use gpu_ipc::vmm::Vmm;
use pyo3::prelude::*;

use crate::errors::{ConfigError, semaphore_to_py};
use crate::ring::{Gpu, SLICE, Shared, SlicedError, parse_backend, seconds, wait_in_slices};
use crate::stream::{borrow, stream_handle};

impl SlicedError for SemaphoreError {
    fn is_timeout(&self) -> bool {
        matches!(self, SemaphoreError::Timeout { .. })
    }

    fn timed_out(self, waited: Duration) -> Self {
        match self {
            SemaphoreError::Timeout { .. } => SemaphoreError::Timeout { waited },
            other => other,
        }
    }

    fn into_py(self) -> PyErr {
        semaphore_to_py(self)
    }
}

/// The owner's semaphore (which closes it when dropped) or an importer's handle.
enum Held {
    Owner(SemaphoreOwner),
    Peer(CoreSemaphore),
}

impl Held {
    fn handle(&self) -> &CoreSemaphore {
        match self {
            Held::Owner(owner) => owner.semaphore(),
            Held::Peer(semaphore) => semaphore,
        }
    }
}

/// A cross-process counting semaphore: posts from any process that attached, waits on the CPU or on a CUDA stream.
///
/// ``Semaphore.create(socket, initial=0)`` makes one and serves it at ``socket`` (this process is its owner: closing
/// it ends the semaphore for everyone); ``Semaphore(socket)`` attaches to one. ``backend``: ``"vmm"`` or
/// ``"legacy"`` (a GPU: stream posts and waits on ``device``'s primary context) or ``"host"`` (CPU posts and waits
/// only). A peer becomes a poster with its first post: a peer that has posted and dies without closing poisons the
/// semaphore (``dead_poster="poison"``, the default at ``create``): every waiter, and every newcomer, gets
/// ``PosterDied``, since posts it owed may never come, until the owner calls ``reset()``. With
/// ``dead_poster="ignore"`` the semaphore goes on. A peer that never posted breaks nothing by dying (``posts=False``
/// is no longer needed; it is kept, and makes ``post`` refuse).
///
/// Example::
///
///     # process A
///     with gpu_ipc.Semaphore.create("/tmp/ready.sock", backend="host") as ready:
///         ...
///         ready.post()                    # one more post
///     # process B
///     with gpu_ipc.Semaphore("/tmp/ready.sock", backend="host", wait_for_owner=10) as ready:
///         ready.wait(timeout=5)           # takes one post, or raises Timeout
///
/// On a GPU, ``post(stream=s)`` adds the post once the work queued on ``s`` before it is done, and
/// ``wait_on(s)`` makes ``s`` wait for a post (the CPU returns at once) and returns the wait; ``wait_status(wait)``
/// then says whether a post released it, or raises when the semaphore ended and released it without one (discard
/// that work).
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct Semaphore {
    held: Shared<Held>,
    gpu: Option<Gpu>,
    owner: bool,
    socket: PathBuf,
}

impl Semaphore {
    /// The handle, for one call.
    fn held(&self) -> PyResult<Arc<Held>> {
        self.held.get("semaphore")
    }

    fn stream_of(&self, stream: &Bound<'_, PyAny>) -> PyResult<(u64, &Gpu)> {
        let raw = stream_handle(Some(stream))?.unwrap_or(crate::stream::LEGACY_DEFAULT_STREAM);
        let gpu = self.gpu.as_ref().ok_or_else(|| {
            ConfigError::new_err("the host backend's semaphore has no streams; use a GPU backend for stream posts")
        })?;
        Ok((raw, gpu))
    }
}

#[pymethods]
impl Semaphore {
    #[new]
    #[pyo3(signature = (socket, backend="vmm", device=0, name="semaphore-peer", posts=true, timeout=5.0, wait_for_owner=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        socket: PathBuf,
        backend: &str,
        device: i32,
        name: &str,
        posts: bool,
        timeout: f64,
        wait_for_owner: f64,
    ) -> PyResult<Self> {
        let backend = parse_backend(backend)?;
        let gpu = Gpu::for_backend(py, backend, device)?;
        let options =
            AttachOptions { name: name.to_owned(), posts, timeout: seconds(timeout)?, ..AttachOptions::default() };
        let give_up = Instant::now() + seconds(wait_for_owner)?;
        // Attaching is tried again while nobody listens yet, in slices, so that Ctrl-C works meanwhile.
        let handle = loop {
            let attached = py.detach(|| match (backend, &gpu) {
                (BackendKind::Host, _) => CoreSemaphore::attach::<Host>(&HostContext, &socket, &options),
                (BackendKind::Legacy, Some(g)) => CoreSemaphore::attach::<Legacy>(&g.ctx, &socket, &options),
                (_, Some(g)) => CoreSemaphore::attach::<Vmm>(&g.ctx, &socket, &options),
                (_, None) => Err(SemaphoreError::NoCudaContext),
            });
            match attached {
                Err(SemaphoreError::Door(DoorError::NoOwner { .. })) if Instant::now() < give_up => {
                    py.check_signals()?;
                    std::thread::sleep(Duration::from_millis(20).min(SLICE));
                }
                other => break other.map_err(semaphore_to_py)?,
            }
        };
        Ok(Self { held: Shared::new(Held::Peer(handle)), gpu, owner: false, socket })
    }

    /// Creates a semaphore holding ``initial`` posts and serves it at ``socket``; this process is its owner.
    /// ``dead_poster``: what the death of a peer that has posted does, ``"poison"`` (the default: the semaphore
    /// breaks until ``reset()``) or ``"ignore"`` (it goes on).
    #[staticmethod]
    #[pyo3(signature = (socket, initial=0, backend="vmm", device=0, dead_poster="poison"))]
    fn create(
        py: Python<'_>,
        socket: PathBuf,
        initial: u64,
        backend: &str,
        device: i32,
        dead_poster: &str,
    ) -> PyResult<Self> {
        let dead_poster = match dead_poster {
            "poison" => DeadPoster::Poison,
            "ignore" => DeadPoster::Ignore,
            other => {
                return Err(crate::errors::ArgumentError::new_err(format!(
                    "unknown dead_poster rule {other:?}; use \"poison\" or \"ignore\""
                )));
            }
        };
        let backend = parse_backend(backend)?;
        let gpu = Gpu::for_backend(py, backend, device)?;
        let options = OwnerOptions { initial, dead_poster, ..OwnerOptions::default() };
        let owner = py
            .detach(|| match (backend, &gpu) {
                (BackendKind::Host, _) => SemaphoreOwner::create_with::<Host>(&HostContext, &socket, &options),
                (BackendKind::Legacy, Some(g)) => SemaphoreOwner::create_with::<Legacy>(&g.ctx, &socket, &options),
                (_, Some(g)) => SemaphoreOwner::create_with::<Vmm>(&g.ctx, &socket, &options),
                (_, None) => Err(SemaphoreError::NoCudaContext),
            })
            .map_err(semaphore_to_py)?;
        Ok(Self { held: Shared::new(Held::Owner(owner)), gpu, owner: true, socket })
    }

    /// Adds ``count`` posts: now, from the CPU; or, with ``stream``, once the work queued on it before is done
    /// (the call returns at once).
    #[pyo3(signature = (count=1, stream=None))]
    fn post(&self, py: Python<'_>, count: u64, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let held = self.held()?;
        match stream {
            None => py.detach(|| held.handle().post(count)),
            Some(stream) => {
                let (raw, gpu) = self.stream_of(stream)?;
                py.detach(|| held.handle().post_on(&borrow(&gpu.ctx, raw), count))
            }
        }
        .map_err(semaphore_to_py)
    }

    /// Waits up to ``timeout`` seconds, on the CPU, for a post and takes it; a wait that times out takes nothing.
    ///
    /// Raises ``Timeout``, or ``PosterDied``, ``OwnerGone``, ``SemaphoreClosed`` as soon as the semaphore ends.
    #[pyo3(signature = (timeout=1.0))]
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let held = self.held()?;
        wait_in_slices(py, seconds(timeout)?, true, |t| held.handle().wait(t))
    }

    /// Takes a post if one is there, without waiting.
    fn try_wait(&self, py: Python<'_>) -> PyResult<bool> {
        let held = self.held()?;
        py.detach(|| held.handle().try_wait()).map_err(semaphore_to_py)
    }

    /// Makes ``stream`` wait for a post (its later work runs once one is taken for it) and returns at once: the
    /// wait, for ``wait_status``.
    fn wait_on(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<SemaphoreWait> {
        let held = self.held()?;
        let (raw, gpu) = self.stream_of(stream)?;
        let wait = py.detach(|| held.handle().wait_on(&borrow(&gpu.ctx, raw))).map_err(semaphore_to_py)?;
        Ok(SemaphoreWait { wait })
    }

    /// Whether the stream wait ``wait`` was released by a post (``False``: not yet). Raises the error that ended
    /// the semaphore when that released it instead (the work queued after it ran without a post: discard it).
    fn wait_status(&self, wait: &SemaphoreWait) -> PyResult<bool> {
        self.held()?.handle().wait_status(&wait.wait).map_err(semaphore_to_py)
    }

    /// Posts not yet taken, minus stream waits still waiting (negative when streams wait for posts).
    #[getter]
    fn value(&self) -> PyResult<i64> {
        Ok(self.held()?.handle().value())
    }

    /// Raises the error that ended the semaphore, if it ended (``PosterDied``, ``OwnerGone``, ``SemaphoreClosed``).
    fn check(&self) -> PyResult<()> {
        self.held()?.handle().check().map_err(semaphore_to_py)
    }

    /// The owner's: makes a semaphore a dead poster poisoned work again, for every peer, and returns its value
    /// afterwards. Posts made before the death and not taken are kept; stream waits the poison released count as
    /// served (``value`` becomes ``max(0, posts - takes)``). An open semaphore is left as it is.
    fn reset(&self) -> PyResult<i64> {
        let held = self.held()?;
        match &*held {
            Held::Owner(owner) => owner.reset().map_err(semaphore_to_py),
            Held::Peer(_) => Err(ConfigError::new_err(
                "only the semaphore's owner (the process that called Semaphore.create) can reset it",
            )),
        }
    }

    /// Whether this process created it (and closing it ends it for everyone).
    #[getter]
    fn owner(&self) -> bool {
        self.owner
    }

    #[getter]
    fn socket(&self) -> PathBuf {
        self.socket.clone()
    }

    fn __repr__(&self) -> String {
        let value = self.held().map(|h| h.handle().value().to_string()).unwrap_or_else(|_| "closed".into());
        format!(
            "Semaphore(socket={:?}, {}, value={value})",
            self.socket.display().to_string(),
            if self.owner { "owner" } else { "attached" }
        )
    }
}

crate::closable!(
    Semaphore,
    held,
    "Detaches (an importer) or closes the semaphore for everyone (the owner). Idempotent."
);

/// A stream wait queued by ``Semaphore.wait_on``: ask ``Semaphore.wait_status`` how it was released.
#[pyclass(frozen, module = "gpu_ipc._gpu_ipc")]
pub struct SemaphoreWait {
    wait: StreamWait,
}

#[pymethods]
impl SemaphoreWait {
    /// The wait's ticket: post number ``ticket + 1`` releases it.
    #[getter]
    fn ticket(&self) -> u64 {
        self.wait.ticket()
    }

    /// The device address of the word that says how the wait was released, for kernels queued after it: a post
    /// released it iff ``(word & ((1 << 62) - 1)) > ticket`` (``released_by_post``). Read-only for kernels.
    #[getter]
    fn status_word(&self) -> u64 {
        self.wait.status_word().raw()
    }

    /// Whether ``word`` (the value read at ``status_word``) says a post, not the poison, released this wait.
    fn released_by_post(&self, word: u64) -> bool {
        self.wait.released_by_post(word)
    }

    fn __repr__(&self) -> String {
        format!("SemaphoreWait(ticket={})", self.wait.ticket())
    }
}

impl Drop for Semaphore {
    fn drop(&mut self) {
        if self.held.made_elsewhere() {
            // A forked child's copy: CUDA is not usable here, and the context is the parent's to release.
            std::mem::forget(self.gpu.take());
        }
    }
}
