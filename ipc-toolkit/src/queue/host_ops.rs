//! The queue's operations done by the CPU on memory it can reach with atomics: the host backend's "device memory".
//! The same state machine as the kernels' (`kernels/cuda/work_queue.cuh`), transition for transition; see
//! `docs/work-queue.md` for why each step is a compare-and-swap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::layout::{CLOSED, CellState, CellWord, GIVEN_BACK, Geometry, TAKEN, cell, header, lap_delta, worker};
use super::ops::{PushFlags, PushRequest, Reclaimed, Status, Swept, TaskData};
use crate::queue::error::QueueError;
use ipc_core::shm::SharedMemory;

/// Attempts of one operation against other peers' moves before it reports [`Status::Contended`].
const MAX_TRIES: u32 = 4096;

const ACQ: Ordering = Ordering::Acquire;
const ACQ_REL: Ordering = Ordering::AcqRel;

/// A position's cell as one look saw it.
struct Look<'a> {
    /// The position word as read (the enqueue position keeps its closed bit here).
    e: u64,
    /// The position.
    p: u64,
    lap: u64,
    state: &'a AtomicU64,
    /// The state word as read, and unpacked.
    s: u64,
    w: CellWord,
    /// How far the cell's lap is from the position's.
    d: i64,
}

/// A queue in host memory, seen as atomics.
pub(super) struct HostQueue<'a> {
    memory: &'a SharedMemory,
    words: &'a [AtomicU64],
    g: Geometry,
}

impl<'a> HostQueue<'a> {
    /// The queue laid out as `g` in `memory`.
    ///
    /// # Errors
    /// Memory smaller than the layout.
    pub(super) fn new(memory: &'a SharedMemory, g: Geometry) -> Result<Self, QueueError> {
        let words = usize::try_from(g.total_bytes / 8)
            .map_err(|_| QueueError::Layout(format!("{} bytes do not fit this address space", g.total_bytes)))?;
        Ok(Self { memory, words: memory.words(0, words)?, g })
    }

    /// The word at byte `offset`; every offset passed here comes from the geometry, inside `total_bytes`.
    fn word(&self, offset: u64) -> &AtomicU64 {
        &self.words[(offset / 8) as usize]
    }

    fn state(&self, position: u64) -> &AtomicU64 {
        self.word(self.g.cell(position) + cell::STATE)
    }

    /// The cell of the position in `position_word`, as it is now.
    fn look(&self, position_word: &AtomicU64) -> Look<'_> {
        let e = position_word.load(ACQ);
        let p = e & !CLOSED;
        let lap = self.g.lap(p);
        let state = self.state(p);
        let s = state.load(ACQ);
        let w = CellWord::unpack(s);
        Look { e, p, lap, state, s, w, d: lap_delta(w.lap, lap) }
    }

    fn cas(word: &AtomicU64, current: u64, new: u64) -> bool {
        word.compare_exchange(current, new, ACQ_REL, ACQ).is_ok()
    }

    fn count(&self, slot: u16, counter: u64) {
        self.word(self.g.worker_entry(slot) + counter).fetch_add(1, Ordering::Relaxed);
    }

    /// Writes the header (the memory must be zero: every cell EMPTY in lap 0).
    pub(super) fn init(&self) {
        for (i, value) in self.g.header_words().into_iter().enumerate() {
            self.word(8 * i as u64).store(value, Ordering::Release);
        }
    }

    /// Pushes `requests` in order, stopping at the first that does not go in.
    pub(super) fn push(&self, slot: u16, requests: &[PushRequest<'_>], flags: PushFlags) -> Vec<(Status, u64)> {
        let mut done = Vec::with_capacity(requests.len());
        for request in requests {
            let outcome = self.push_one(slot, request, flags);
            done.push(outcome);
            if outcome.0 != Status::Ok {
                break;
            }
        }
        done
    }

    fn push_one(&self, slot: u16, request: &PushRequest<'_>, flags: PushFlags) -> (Status, u64) {
        let enqueue = self.word(header::ENQUEUE);
        for _ in 0..MAX_TRIES {
            let Look { e, p, lap, state, s, w, d } = self.look(enqueue);
            let closed = e & CLOSED;
            if closed != 0 && !flags.force {
                return (Status::Closed, 0);
            }
            match w.state {
                Some(CellState::Empty) if d == 0 => {
                    let writing = CellWord::pack(lap, CellState::Writing, slot);
                    if !Self::cas(state, s, writing) {
                        continue;
                    }
                    let _ = enqueue.compare_exchange(e, (p + 1) | closed, ACQ_REL, ACQ);
                    let id = request.id.unwrap_or(p);
                    let at = self.g.cell(p);
                    self.word(at + cell::ID).store(id, Ordering::Relaxed);
                    let len = request.record.len() as u64;
                    self.word(at + cell::ATTEMPT).store(u64::from(request.attempt) | len << 32, Ordering::Relaxed);
                    // In range: the record fits the cell (checked by the caller), the cell fits the memory.
                    if self.memory.write_bytes((at + cell::RECORD) as usize, request.record).is_err() {
                        return (Status::Contended, id);
                    }
                    if !Self::cas(state, writing, CellWord::pack(lap, CellState::Full, 0)) {
                        return (Status::LeaseLost, id);
                    }
                    if flags.count {
                        self.count(slot, worker::PUSHED);
                    }
                    return (Status::Ok, id);
                }
                Some(CellState::Sealed) if d >= 0 => return (Status::Closed, 0),
                // Position `p` was claimed (or is long done): help the enqueue position past it.
                _ if d >= 0 => {
                    let _ = enqueue.compare_exchange(e, (p + 1) | closed, ACQ_REL, ACQ);
                }
                // The task of the previous lap is still in this cell.
                Some(state) if d == -1 && state != CellState::Empty => return (Status::Full, 0),
                _ => {}
            }
        }
        (Status::Contended, 0)
    }

    /// Pops up to `max` tasks; the status says why it stopped when it got fewer.
    pub(super) fn pop(&self, slot: u16, max: usize) -> (Vec<TaskData>, Status) {
        let mut tasks = Vec::new();
        while tasks.len() < max {
            match self.pop_one(slot) {
                Ok(task) => tasks.push(task),
                Err(status) => return (tasks, status),
            }
        }
        (tasks, Status::Ok)
    }

    fn pop_one(&self, slot: u16) -> Result<TaskData, Status> {
        let dequeue = self.word(header::DEQUEUE);
        for _ in 0..MAX_TRIES {
            let Look { p, lap, state, s, w, d, .. } = self.look(dequeue);
            match w.state {
                Some(CellState::Full)
                    if d == 0 && Self::cas(state, s, CellWord::pack(lap, CellState::Leased, slot)) =>
                {
                    let _ = dequeue.compare_exchange(p, p + 1, ACQ_REL, ACQ);
                    self.count(slot, worker::POPPED);
                    return Ok(self.read_task(p));
                }
                // Another pop won the cell: look again.
                Some(CellState::Full) if d == 0 => {}
                Some(CellState::Sealed) if d == 0 => return Err(Status::Closed),
                Some(CellState::Writing) if d == 0 => return Err(Status::Empty),
                Some(CellState::Empty) if d == 0 => {
                    let e = self.word(header::ENQUEUE).load(ACQ);
                    if e & CLOSED == 0 {
                        return Err(Status::Empty);
                    }
                    // Tasks taken back from a gone worker may still come: not drained yet.
                    if self.word(header::RECLAIMING).load(ACQ) != 0 {
                        return Err(Status::Empty);
                    }
                    if e & !CLOSED <= p && Self::cas(state, s, CellWord::pack(lap, CellState::Sealed, 0)) {
                        return Err(Status::Closed);
                    }
                }
                // Position `p` was popped (leased, done, or a push abandoned): help the dequeue position past it.
                _ if d >= 1 || (d == 0 && w.state == Some(CellState::Leased)) => {
                    let _ = dequeue.compare_exchange(p, p + 1, ACQ_REL, ACQ);
                }
                // The previous lap's task is still in this cell: nothing was pushed at `p` yet.
                _ if d == -1 => return Err(Status::Empty),
                _ => {}
            }
        }
        Err(Status::Contended)
    }

    /// The task in the cell of `position` (leased by the caller, so nobody writes it).
    fn read_task(&self, position: u64) -> TaskData {
        let at = self.g.cell(position);
        let id = self.word(at + cell::ID).load(Ordering::Relaxed);
        let attempt_len = self.word(at + cell::ATTEMPT).load(Ordering::Relaxed);
        let len = ((attempt_len >> 32) as usize).min(self.g.record_bytes as usize);
        let mut record = vec![0; len];
        // In range: `len` is at most the record size, which the cell holds.
        let _ = self.memory.read_bytes((at + cell::RECORD) as usize, &mut record);
        TaskData { position, id, attempt: attempt_len as u32, record }
    }

    /// Completes the leases of `positions` held by `slot`; `true` where the lease was still `slot`'s.
    pub(super) fn complete(&self, slot: u16, positions: &[u64], count: bool) -> Vec<bool> {
        positions
            .iter()
            .map(|&p| {
                let lap = self.g.lap(p);
                let leased = CellWord::pack(lap, CellState::Leased, slot);
                let done = Self::cas(self.state(p), leased, CellWord::pack(lap + 1, CellState::Empty, 0));
                if done && count {
                    self.count(slot, worker::COMPLETED);
                }
                done
            })
            .collect()
    }

    /// Hands the leases of `positions` held by `slot` to the owner: LEASED(L, slot) to LEASED(L, GIVEN_BACK), one
    /// compare-and-swap each; `true` where the lease was still `slot`'s.
    pub(super) fn give_back(&self, slot: u16, positions: &[u64]) -> Vec<bool> {
        positions
            .iter()
            .map(|&p| {
                let lap = self.g.lap(p);
                let leased = CellWord::pack(lap, CellState::Leased, slot);
                Self::cas(self.state(p), leased, CellWord::pack(lap, CellState::Leased, GIVEN_BACK))
            })
            .collect()
    }

    /// The owner's sweep (see [`Engine::sweep`](super::engine::Engine::sweep)): `seen` holds, per cell, the LEASED
    /// word the last pass saw there and when it first saw it.
    pub(super) fn sweep(&self, seen: &mut Vec<(u64, Instant)>, lease: Duration, max: usize) -> Swept {
        let now = Instant::now();
        seen.resize(self.g.capacity as usize, (0, now));
        let mut swept = Swept::default();
        for (index, (seen_word, since)) in seen.iter_mut().enumerate() {
            let state = self.word(self.g.cells_offset + index as u64 * u64::from(self.g.cell_bytes) + cell::STATE);
            let s = state.load(ACQ);
            let w = CellWord::unpack(s);
            match w.state {
                Some(CellState::Writing) => swept.census.writing += 1,
                Some(CellState::Full) => swept.census.full += 1,
                Some(CellState::Leased) => swept.census.leased += 1,
                _ => {}
            }
            if w.state != Some(CellState::Leased) || w.holder == TAKEN {
                continue;
            }
            if w.holder != GIVEN_BACK {
                if *seen_word != s {
                    (*seen_word, *since) = (s, now);
                    continue;
                }
                if now.saturating_duration_since(*since) < lease {
                    continue;
                }
            }
            if swept.stolen.len() >= max {
                swept.more = true;
                continue;
            }
            if Self::cas(state, s, CellWord::pack(w.lap, CellState::Leased, TAKEN)) {
                swept.stolen.push(self.read_task((w.lap << self.g.capacity_log2) | index as u64));
            }
        }
        swept
    }

    /// The word at byte `offset`.
    pub(super) fn word_at(&self, offset: u64) -> u64 {
        self.word(offset).load(ACQ)
    }

    /// Takes over up to `max` of `dead`'s leases for `owner` and turns its unfinished pushes into holes.
    pub(super) fn reclaim(&self, owner: u16, dead: u16, max: usize) -> Reclaimed {
        let mut reclaimed = Reclaimed::default();
        for index in 0..self.g.capacity {
            let state = self.word(self.g.cells_offset + index * u64::from(self.g.cell_bytes) + cell::STATE);
            let s = state.load(ACQ);
            let w = CellWord::unpack(s);
            if w.holder != dead {
                continue;
            }
            let position = (w.lap << self.g.capacity_log2) | index;
            match w.state {
                Some(CellState::Leased) if reclaimed.stolen.len() >= max => reclaimed.more = true,
                Some(CellState::Leased) if Self::cas(state, s, CellWord::pack(w.lap, CellState::Leased, owner)) => {
                    reclaimed.stolen.push(self.read_task(position));
                }
                Some(CellState::Writing) if Self::cas(state, s, CellWord::pack(w.lap + 1, CellState::Empty, 0)) => {
                    reclaimed.abandoned += 1;
                    self.word(header::ABANDONED).fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        reclaimed
    }

    /// Adds `value` to the header counter at `offset`.
    pub(super) fn add(&self, offset: u64, value: u64) {
        self.word(offset).fetch_add(value, Ordering::Relaxed);
    }

    /// Closes the queue to pushes.
    pub(super) fn close(&self) {
        self.word(header::ENQUEUE).fetch_or(CLOSED, ACQ_REL);
    }

    /// The header and the worker table, word by word.
    pub(super) fn snapshot(&self) -> Vec<u64> {
        (0..self.g.cells_offset / 8).map(|i| self.word(8 * i).load(ACQ)).collect()
    }

    /// The first 64 bytes of the header.
    pub(super) fn header(&self) -> [u64; 8] {
        std::array::from_fn(|i| self.word(8 * i as u64).load(ACQ))
    }
}

#[cfg(test)]
#[path = "host_ops_tests.rs"]
#[allow(clippy::unwrap_used)]
mod tests;
