//! The queue as one process sees it, owner or worker: its memory, who does the operations, and its worker slot;
//! the bounded waits of `push` and `pop`, and kernel launches that teardown waits for.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::engine::Engine;
use super::layout::Geometry;
use super::ops::{PushFlags, PushRequest, Status, TaskData};
use super::task::{Lessor, Task};
use super::{DeviceQueue, MemoryAccess, QueueMemory, QueueStats};
use crate::queue::error::QueueError;
use gpu_ipc_driver::{Context, Event, EventFlags, Function, KernelArg, LaunchConfig, Stream};
use ipc_core::ring::{WaitMode, bounded_wait};

/// Nap between two looks at a full or empty queue.
const NAP: Duration = Duration::from_micros(50);
/// How often a wait checks that the owner is still there.
const LIVENESS_INTERVAL: Duration = Duration::from_millis(5);
/// How long teardown waits for kernels launched through [`Local::launch`].
const GPU_TEARDOWN: Duration = Duration::from_secs(10);

/// One process's handle on a queue.
pub(super) struct Local<R: QueueMemory> {
    engine: Engine,
    pub(super) g: Geometry,
    pub(super) slot: u16,
    cuda: Option<Context>,
    /// Events recorded after kernels launched on the queue, for teardown.
    launched: Mutex<Vec<Event>>,
    /// Dropped last; in an `Arc` so that teardown can leak it on purpose while the GPU may still use it.
    region: Arc<R>,
}

impl<R: QueueMemory> Local<R> {
    pub(super) fn new(region: R, cuda: Option<&Context>, g: Geometry, slot: u16) -> Result<Self, QueueError> {
        let engine = Engine::new(region.access(), cuda, g)?;
        let region = Arc::new(region);
        Ok(Self { engine, g, slot, cuda: cuda.cloned(), launched: Mutex::new(Vec::new()), region })
    }

    pub(super) fn access(&self) -> MemoryAccess<'_> {
        self.region.access()
    }

    pub(super) fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(super) fn region(&self) -> &R {
        &self.region
    }

    fn check_len(&self, record: &[u8]) -> Result<(), QueueError> {
        if record.len() > self.g.record_bytes as usize {
            return Err(QueueError::RecordTooLarge { len: record.len(), max: self.g.record_bytes });
        }
        Ok(())
    }

    /// One try at pushing `record` as a new task.
    pub(super) fn try_push(&self, record: &[u8]) -> Result<Option<u64>, QueueError> {
        self.check_len(record)?;
        let request = PushRequest { record, id: None, attempt: 0 };
        let outcome = self.engine.push(self.access(), self.slot, &[request], PushFlags::NEW)?;
        match outcome.first().copied().unwrap_or((Status::Contended, 0)) {
            (Status::Ok, id) => Ok(Some(id)),
            (Status::Full | Status::Contended | Status::Empty, _) => Ok(None),
            (Status::Closed, _) => Err(QueueError::Closed),
            (Status::LeaseLost, id) => Err(QueueError::LeaseLost { id }),
        }
    }

    /// Pushes `record`, waiting while the queue is full until `timeout` passes or `alive` fails.
    pub(super) fn push(
        &self,
        record: &[u8],
        timeout: Duration,
        alive: impl FnMut() -> Result<(), QueueError>,
    ) -> Result<u64, QueueError> {
        let mut id = None;
        bounded_wait(
            Instant::now() + timeout,
            WaitMode::Sleep(NAP),
            LIVENESS_INTERVAL,
            || {
                id = self.try_push(record)?;
                Ok(id.is_some())
            },
            alive,
            |waited| QueueError::Full { waited },
        )?;
        id.ok_or(QueueError::Full { waited: timeout })
    }

    /// Pushes records as new tasks, in order, as many as go in now (one kernel launch per batch on the GPU);
    /// returns their ids.
    pub(super) fn try_push_many(&self, records: &[&[u8]]) -> Result<Vec<u64>, QueueError> {
        for record in records {
            self.check_len(record)?;
        }
        let requests: Vec<PushRequest<'_>> =
            records.iter().map(|record| PushRequest { record, id: None, attempt: 0 }).collect();
        let outcome = self.engine.push(self.access(), self.slot, &requests, PushFlags::NEW)?;
        let mut ids = Vec::with_capacity(outcome.len());
        for (status, id) in outcome {
            match status {
                Status::Ok => ids.push(id),
                Status::Closed if ids.is_empty() => return Err(QueueError::Closed),
                Status::LeaseLost => return Err(QueueError::LeaseLost { id }),
                _ => break,
            }
        }
        Ok(ids)
    }

    /// One try at popping up to `max` tasks; `Closed` only when none was popped.
    pub(super) fn try_pop_many(&self, max: usize) -> Result<Vec<TaskData>, QueueError> {
        let (tasks, status) = self.engine.pop(self.access(), self.slot, max.max(1))?;
        if tasks.is_empty() && status == Status::Closed {
            return Err(QueueError::Closed);
        }
        Ok(tasks)
    }

    /// Pops up to `max` tasks, waiting while the queue is empty until `timeout` passes or `alive` fails.
    pub(super) fn pop_many(
        &self,
        max: usize,
        timeout: Duration,
        alive: impl FnMut() -> Result<(), QueueError>,
    ) -> Result<Vec<TaskData>, QueueError> {
        let mut tasks = Vec::new();
        bounded_wait(
            Instant::now() + timeout,
            WaitMode::Sleep(NAP),
            LIVENESS_INTERVAL,
            || {
                tasks = self.try_pop_many(max)?;
                Ok(!tasks.is_empty())
            },
            alive,
            |waited| QueueError::Timeout { waited },
        )?;
        Ok(tasks)
    }

    pub(super) fn task(&self, data: TaskData) -> Task<'_> {
        Task::new(self, data)
    }

    pub(super) fn complete_all(&self, tasks: Vec<Task<'_>>) -> Result<(), QueueError> {
        super::task::complete_all(self, tasks)
    }

    pub(super) fn stats(&self) -> Result<QueueStats, QueueError> {
        self.engine.stats(self.access(), &self.g)
    }

    pub(super) fn close(&self) -> Result<(), QueueError> {
        self.engine.close(self.access())
    }

    /// The queue for this process's kernels.
    pub(super) fn device_queue(&self) -> Result<DeviceQueue<'_>, QueueError> {
        match self.access() {
            MemoryAccess::Device(span) => Ok(DeviceQueue { span, worker: self.slot }),
            MemoryAccess::Host(_) => Err(QueueError::NeedsGpu { what: "a kernel on the queue" }),
        }
    }

    /// Launches `kernel` with the queue and this process's worker slot as its first two arguments, then `args`;
    /// teardown waits (bounded) for it before the queue's memory goes.
    pub(super) fn launch(
        &self,
        kernel: &Function,
        stream: &Stream,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<(), QueueError> {
        let queue = self.device_queue()?;
        let all: Vec<KernelArg<'_>> = [KernelArg::Span(queue.span()), KernelArg::U32(u32::from(queue.worker()))]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        kernel.launch_typed(stream, config, &all)?;
        let event = Event::new(stream.context(), EventFlags::default())?;
        event.record(stream)?;
        let mut launched = self.launched.lock().unwrap_or_else(PoisonError::into_inner);
        launched.retain(|e| !e.is_complete().unwrap_or(false));
        launched.push(event);
        Ok(())
    }

    /// Whether every kernel launched through [`Local::launch`] has finished, waiting until `deadline`.
    fn settle(&self, deadline: Instant) -> bool {
        let launched = self.launched.lock().unwrap_or_else(PoisonError::into_inner);
        let done = || -> Result<bool, QueueError> { Ok(launched.iter().all(|e| e.is_complete().unwrap_or(true))) };
        bounded_wait(
            deadline,
            WaitMode::Sleep(Duration::from_millis(1)),
            Duration::ZERO,
            done,
            || Ok(()),
            |waited| QueueError::GpuBusy { waited },
        )
        .is_ok()
    }
}

impl<R: QueueMemory> Lessor for Local<R> {
    fn complete(&self, positions: &[u64]) -> Result<Vec<bool>, QueueError> {
        self.engine.complete(self.access(), self.slot, positions, true)
    }

    fn give_back(&self, positions: &[u64]) -> Result<Vec<bool>, QueueError> {
        self.engine.give_back(self.access(), self.slot, positions)
    }
}

impl<R: QueueMemory> Drop for Local<R> {
    fn drop(&mut self) {
        if self.cuda.is_none() {
            return;
        }
        if !self.settle(Instant::now() + GPU_TEARDOWN) || !self.engine.settled() {
            tracing::error!(
                "kernels on the work queue did not finish within {GPU_TEARDOWN:?}: leaking its memory rather than \
                 freeing it under the GPU"
            );
            std::mem::forget(self.region.clone());
        }
    }
}
