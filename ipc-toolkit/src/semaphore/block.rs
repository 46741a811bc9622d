//! The shared block, validated, and the counting protocol over its atomics: posts, CPU takes, stream tickets,
//! peer records, and what the owner does when a peer leaves.
//!
//! Memory ordering, in one place:
//! - `posted` only grows (posts, refunds and the poison bit). Posts add with `Release`; takers load it with
//!   `Acquire`, so a taker that sees post `t + 1` also sees what the poster wrote before posting (host memory; for
//!   device memory the stream's own ordering does the rest: see `docs/semaphore.md`).
//! - `taken` is changed only by compare-and-swap (`SeqCst`): a CPU take moves it from `t` to `t + 1` only after
//!   seeing `posted > t`; a stream ticket moves it unconditionally, after marking its slot with [`TAKING`], so the
//!   owner can tell a ticket taken by a peer that died in between.
//! - The state word leaves `Open` once, by compare-and-swap, *before* the poison is ORed into `posted`: whoever
//!   sees a poisoned `posted` (a GPU wait that passed) and then reads the state finds the reason.
//! - A peer marks its record [`FLAG_POSTED`] (`SeqCst` `fetch_or`) before its first post is added or queued, so
//!   the owner, reading the flag after the peer's hang-up, counts as a poster every peer whose post could have
//!   landed, and no peer that never posted.
//! - A reset (the owner's, from `Broken` only) writes the fence words, then clears the poison while raising the
//!   count to `taken` by compare-and-swap on `posted`, then moves the state back to `Open`.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::{PeerPid, SemaphoreError};
use super::layout::{
    BROKEN_PID_WORD, BROKEN_RECORD_WORD, COUNT_MASK, DEAD_POSTER_WORD, DeadPoster, FLAG_POSTED, GENERATION_WORD,
    LAYOUT_VERSION, MAGIC, MAGIC_WORD, MAX_PEERS, MAX_PEERS_WORD, MAX_POST, OWNER_PID_WORD, POISON, POSTED_WORD,
    RECORD_FLAGS, RECORD_PID, RECORD_STATE, RECORD_TICKETS, RESET_FROM_WORD, RESET_TO_WORD, RESETS_WORD, RecordState,
    SHARED_BYTES, STATE_WORD, SemaphoreState, SharedWords, TAKEN_WORD, TAKING, TICKETS_PER_PEER, TOTAL_BYTES_WORD,
    VERSION_WORD, record_epoch, record_word, record_word_index,
};
use ipc_core::shm::{SharedMemory, SharedObject};

/// A peer record claimed for one attachment: its index and the epoch of the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerRecord {
    /// Index, `0..MAX_PEERS` (0 is the owner's).
    pub index: u32,
    /// Claim epoch: a stale record (freed and claimed again) is never acted on.
    pub epoch: u32,
}

impl PeerRecord {
    /// Encoding in the header's broken-record word: `epoch << 32 | index`.
    pub const fn to_u64(self) -> u64 {
        ((self.epoch as u64) << 32) | self.index as u64
    }
}

/// What the owner did when a peer's connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// It had detached cleanly; its record is free again.
    Detached,
    /// It never confirmed the offer; its record is free again.
    NeverAttached,
    /// It posted and died without detaching: the semaphore is now broken and poisoned (unless it had already
    /// ended for another reason).
    PosterDied,
    /// It posted and died without detaching, and the semaphore ignores dead posters ([`DeadPoster::Ignore`]): its
    /// unreached stream waits' tickets were given back, as a waiter's, and the semaphore goes on.
    PosterDiedIgnored {
        /// Tickets given back.
        refunded: u64,
    },
    /// It never posted and died: the tickets its GPU-side waits held and no post had reached were given back, so
    /// they swallow no post.
    WaiterDied {
        /// Tickets given back.
        refunded: u64,
    },
    /// The record is not (or no longer) this peer's: nothing done.
    Stale,
}

/// The shared block, validated: what the owner and every peer map.
#[derive(Debug, Clone)]
pub struct SemaphoreBlock {
    object: Arc<SharedObject<SharedWords>>,
    max_peers: u32,
}

impl SemaphoreBlock {
    /// Creates the block with `initial` posts, the owner in record 0, and what a dead poster does.
    pub(crate) fn create(initial: u64, generation: u64, dead_poster: DeadPoster) -> Result<Self, SemaphoreError> {
        if initial > MAX_POST {
            return Err(SemaphoreError::InvalidPost { count: initial, max: MAX_POST });
        }
        let memory = SharedMemory::create("gpu-ipc-semaphore", SHARED_BYTES)?;
        let block = Self { object: Arc::new(SharedObject::new(memory)?), max_peers: MAX_PEERS };
        // Nobody else sees the memfd yet: Relaxed stores, then the magic with Release.
        block.word(VERSION_WORD).store(u64::from(LAYOUT_VERSION), Ordering::Relaxed);
        block.word(TOTAL_BYTES_WORD).store(SHARED_BYTES as u64, Ordering::Relaxed);
        block.word(MAX_PEERS_WORD).store(u64::from(MAX_PEERS), Ordering::Relaxed);
        block.word(OWNER_PID_WORD).store(u64::from(rustix::process::getpid().as_raw_pid() as u32), Ordering::Relaxed);
        block.word(GENERATION_WORD).store(generation, Ordering::Relaxed);
        block.word(POSTED_WORD).store(initial, Ordering::Relaxed);
        block.word(STATE_WORD).store(SemaphoreState::Open as u64, Ordering::Relaxed);
        block.word(DEAD_POSTER_WORD).store(dead_poster as u64, Ordering::Relaxed);
        let owner = record_word_index(0);
        block.word(owner + RECORD_STATE).store(record_word(1, RecordState::Attached), Ordering::Relaxed);
        block.word(owner + RECORD_PID).store(block.owner_pid(), Ordering::Relaxed);
        block.word(MAGIC_WORD).store(MAGIC, Ordering::Release);
        Ok(block)
    }

    /// The owner's record, claimed by [`create`](Self::create).
    pub(crate) const OWNER_RECORD: PeerRecord = PeerRecord { index: 0, epoch: 1 };

    /// Maps a block received from the owner and validates its header.
    ///
    /// # Errors
    /// A memfd of the wrong size or without seals ([`SemaphoreError::Shm`]), another magic, layout version or size,
    /// or a peer count out of range.
    pub fn attach(fd: OwnedFd) -> Result<Self, SemaphoreError> {
        let memory = SharedMemory::from_fd(fd, SHARED_BYTES)?;
        let object = Arc::new(SharedObject::<SharedWords>::new(memory)?);
        let words = object.get();
        let magic = words[MAGIC_WORD].load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(SemaphoreError::BadMagic { found: magic });
        }
        let version = words[VERSION_WORD].load(Ordering::Relaxed);
        if version != u64::from(LAYOUT_VERSION) {
            return Err(SemaphoreError::LayoutVersion { found: version, expected: LAYOUT_VERSION });
        }
        let total = words[TOTAL_BYTES_WORD].load(Ordering::Relaxed);
        if total != SHARED_BYTES as u64 {
            return Err(SemaphoreError::Corrupt { what: "total_bytes", value: total });
        }
        let peers = words[MAX_PEERS_WORD].load(Ordering::Relaxed);
        let max_peers = match u32::try_from(peers) {
            Ok(n) if (1..=MAX_PEERS).contains(&n) => n,
            _ => return Err(SemaphoreError::Corrupt { what: "max_peers", value: peers }),
        };
        let rule = words[DEAD_POSTER_WORD].load(Ordering::Relaxed);
        if DeadPoster::from_raw(rule).is_none() {
            return Err(SemaphoreError::Corrupt { what: "dead_poster", value: rule });
        }
        Ok(Self { object, max_peers })
    }

    fn word(&self, index: usize) -> &AtomicU64 {
        // Every caller passes a constant of the layout or a record word below `record_word_index(max_peers)`,
        // which the layout's assertions keep inside the block.
        &self.object.get()[index]
    }

    fn record_word(&self, record: PeerRecord, field: usize) -> &AtomicU64 {
        self.word(record_word_index(record.index) + field)
    }

    /// The mapping, shareable: what a stream registration and a queued host function keep alive.
    pub fn shared(&self) -> &Arc<SharedObject<SharedWords>> {
        &self.object
    }

    /// Records in use.
    pub fn max_peers(&self) -> u32 {
        self.max_peers
    }

    /// The owner's pid, from the header.
    pub fn owner_pid(&self) -> u64 {
        self.word(OWNER_PID_WORD).load(Ordering::Relaxed)
    }

    /// The owner's generation, from the header.
    pub fn generation(&self) -> u64 {
        self.word(GENERATION_WORD).load(Ordering::Relaxed)
    }

    /// What the death of a peer that has posted does, as the owner chose at creation.
    pub fn dead_poster(&self) -> DeadPoster {
        // Validated when the block was attached; a peer that rewrote it since gets the default rule.
        DeadPoster::from_raw(self.word(DEAD_POSTER_WORD).load(Ordering::Relaxed)).unwrap_or_default()
    }

    /// How many times the owner has reset the semaphore.
    pub fn resets(&self) -> u64 {
        self.word(RESETS_WORD).load(Ordering::Acquire)
    }

    /// The state word, decoded (`None`: a value no owner writes).
    pub fn state(&self) -> Option<SemaphoreState> {
        SemaphoreState::from_raw(self.word(STATE_WORD).load(Ordering::Acquire))
    }

    /// `Ok` while the semaphore is open; else the error that says why it is not.
    ///
    /// # Errors
    /// [`SemaphoreError::PosterDied`], [`SemaphoreError::OwnerGone`], [`SemaphoreError::Closed`], or
    /// [`SemaphoreError::Corrupt`] for a state word no owner writes.
    pub fn check(&self) -> Result<(), SemaphoreError> {
        let raw = self.word(STATE_WORD).load(Ordering::Acquire);
        match SemaphoreState::from_raw(raw) {
            Some(SemaphoreState::Open) => Ok(()),
            Some(SemaphoreState::Broken) => Err(self.poster_died()),
            Some(SemaphoreState::OwnerGone) => Err(SemaphoreError::OwnerGone { owner_pid: self.owner_pid() }),
            Some(SemaphoreState::Closed) => Err(SemaphoreError::Closed),
            Some(SemaphoreState::Uninitialised) | None => Err(SemaphoreError::Corrupt { what: "state", value: raw }),
        }
    }

    /// The error that names the poster whose death broke the semaphore (the last time it broke).
    fn poster_died(&self) -> SemaphoreError {
        let pid = self.word(BROKEN_PID_WORD).load(Ordering::Relaxed);
        let record = self.word(BROKEN_RECORD_WORD).load(Ordering::Relaxed) as u32;
        let pid = PeerPid(u32::try_from(pid).ok().filter(|&p| p != 0));
        SemaphoreError::PosterDied { pid, record }
    }

    /// Makes a broken semaphore work again (the owner's [`reset`](super::SemaphoreOwner::reset)): posts nobody
    /// took are kept; the stream waits the poison released keep their tickets, which now count as served (no post
    /// is owed to them, and a stream wait not yet evaluated passes at once). So `posted` becomes
    /// `max(posted, taken)` without the poison and the value `max(0, posted - taken)`. Returns the value after the
    /// reset. A semaphore that is open is left as it is.
    ///
    /// # Errors
    /// A semaphore that ended for another reason than a dead poster (closed, owner gone), or a corrupt state word.
    pub(crate) fn reset(&self) -> Result<i64, SemaphoreError> {
        match self.check() {
            Ok(()) => return Ok(self.value()),
            Err(SemaphoreError::PosterDied { .. }) => {}
            Err(other) => return Err(other),
        }
        let posted = self.word(POSTED_WORD);
        let mut word = posted.load(Ordering::SeqCst);
        loop {
            let count = word & COUNT_MASK;
            let taken = self.taken();
            // Tickets [count, taken) were released by the poison: `wait_status` keeps saying so.
            self.word(RESET_FROM_WORD).store(count, Ordering::SeqCst);
            self.word(RESET_TO_WORD).store(taken.max(count), Ordering::SeqCst);
            match posted.compare_exchange(word, count.max(taken), Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break,
                Err(now) => word = now,
            }
        }
        self.word(RESETS_WORD).fetch_add(1, Ordering::SeqCst);
        // Only the owner resets, and nothing else moves the state out of `Broken`.
        let _ = self.word(STATE_WORD).compare_exchange(
            SemaphoreState::Broken as u64,
            SemaphoreState::Open as u64,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        Ok(self.value())
    }

    /// Ends the semaphore for `reason` (if it is still open) and poisons `posted`, which releases every GPU-side
    /// wait, queued or future. Returns whether this call ended it. Idempotent: the poison is ORed in every time.
    pub(crate) fn end(&self, reason: SemaphoreState) -> bool {
        let ended = self
            .word(STATE_WORD)
            .compare_exchange(SemaphoreState::Open as u64, reason as u64, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        self.word(POSTED_WORD).fetch_or(POISON, Ordering::SeqCst);
        ended
    }

    /// Posts so far (the real count, without the poison bit).
    pub fn posted(&self) -> u64 {
        self.word(POSTED_WORD).load(Ordering::Acquire) & COUNT_MASK
    }

    /// Tickets handed out so far (CPU takes and GPU-side waits).
    pub fn taken(&self) -> u64 {
        self.word(TAKEN_WORD).load(Ordering::Acquire)
    }

    /// Posts not yet taken, minus GPU-side waits still waiting: negative when streams wait for posts.
    pub fn value(&self) -> i64 {
        let taken = self.taken();
        let posted = self.posted();
        let value = i128::from(posted) - i128::from(taken);
        i64::try_from(value).unwrap_or(if value < 0 { i64::MIN } else { i64::MAX })
    }

    /// Adds `count` posts as `record`'s peer, which is marked as a poster first.
    ///
    /// # Errors
    /// A count outside `1..=MAX_POST`; a semaphore that is not open.
    pub(crate) fn post_as(&self, record: PeerRecord, count: u64) -> Result<(), SemaphoreError> {
        check_count(count)?;
        self.check()?;
        self.mark_poster(record);
        self.add_posts(count);
        Ok(())
    }

    /// Marks `record`'s peer as one that has posted, before its first post can land (a crash in between leaves
    /// it counted as a poster, the safe side). Once set, the flag stays until the record is freed.
    pub(crate) fn mark_poster(&self, record: PeerRecord) {
        if record.index < self.max_peers {
            let flags = self.record_word(record, RECORD_FLAGS);
            if flags.load(Ordering::Relaxed) & FLAG_POSTED == 0 {
                flags.fetch_or(FLAG_POSTED, Ordering::SeqCst);
            }
        }
    }

    /// Whether `record`'s peer has posted.
    pub fn has_posted(&self, record: PeerRecord) -> bool {
        record.index < self.max_peers
            && self.record_word(record, RECORD_FLAGS).load(Ordering::Acquire) & FLAG_POSTED != 0
    }

    /// The addition itself, for a post already checked (a stream's post runs it later, from a host function).
    pub(crate) fn add_posts(&self, count: u64) {
        self.word(POSTED_WORD).fetch_add(count, Ordering::Release);
    }

    /// Takes one post if one is there, without waiting. `Ok(false)`: none is (or GPU-side waits queued earlier
    /// will take every one there is).
    ///
    /// # Errors
    /// A semaphore that is not open.
    pub fn try_take(&self) -> Result<bool, SemaphoreError> {
        self.check()?;
        let taken = self.word(TAKEN_WORD);
        let mut t = taken.load(Ordering::SeqCst);
        loop {
            if self.posted() <= t {
                return Ok(false);
            }
            match taken.compare_exchange_weak(t, t + 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Ok(true),
                Err(now) => t = now,
            }
        }
    }

    /// Takes a ticket for a GPU-side wait of `record`'s peer, recorded in one of its slots: post `t + 1` is
    /// ticket `t`'s. `hint` is where the search for a free slot starts (updated for the next call).
    ///
    /// # Errors
    /// Every slot of the record holds a ticket no post has reached yet; a semaphore that is not open.
    pub(crate) fn take_ticket(&self, record: PeerRecord, hint: &mut usize) -> Result<u64, SemaphoreError> {
        self.check()?;
        let slot = self.free_slot(record, hint)?;
        let taken = self.word(TAKEN_WORD);
        loop {
            let t = taken.load(Ordering::SeqCst);
            // No peer takes 2^62 tickets: a count that high was written by a broken or hostile peer, and `t + 1`
            // would overflow or run into the `TAKING` mark.
            if t >= COUNT_MASK {
                return Err(SemaphoreError::Corrupt { what: "taken", value: t });
            }
            slot.store((t + 1) | TAKING, Ordering::SeqCst);
            if taken.compare_exchange(t, t + 1, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                slot.store(t + 1, Ordering::Release);
                return Ok(t);
            }
        }
    }

    /// Gives back ticket `t` of `record` that no GPU-side wait will use (queuing the wait failed): as a departed
    /// waiter's tickets, it is made good with one post, and its slot is freed.
    pub(crate) fn give_back(&self, record: PeerRecord, ticket: u64) {
        for slot in self.slots(record) {
            if slot.compare_exchange(ticket + 1, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                self.add_posts(1);
                return;
            }
        }
    }

    /// Whether a post reached ticket `t` (`Ok(true)`), not yet (`Ok(false)`), or the semaphore ended first, in
    /// which case a GPU-side wait on it was released by the poison (the error).
    ///
    /// # Errors
    /// Why the semaphore is no longer open, when no post reached the ticket.
    pub fn ticket_released(&self, ticket: u64) -> Result<bool, SemaphoreError> {
        let from = self.word(RESET_FROM_WORD).load(Ordering::SeqCst);
        let to = self.word(RESET_TO_WORD).load(Ordering::SeqCst);
        if (from..to).contains(&ticket) {
            // The poison released it before the last reset raised the count past it.
            return Err(self.poster_died());
        }
        if self.posted() > ticket {
            return Ok(true);
        }
        self.check().map(|()| false)
    }

    fn slots(&self, record: PeerRecord) -> impl Iterator<Item = &AtomicU64> {
        let first = record_word_index(record.index) + RECORD_TICKETS;
        (first..first + TICKETS_PER_PEER).map(|i| self.word(i))
    }

    fn free_slot(&self, record: PeerRecord, hint: &mut usize) -> Result<&AtomicU64, SemaphoreError> {
        let posted = self.posted();
        let first = record_word_index(record.index) + RECORD_TICKETS;
        for step in 0..TICKETS_PER_PEER {
            let i = (*hint + step) % TICKETS_PER_PEER;
            let slot = self.word(first + i);
            let value = slot.load(Ordering::Acquire);
            // Empty, or a ticket a post has reached (only this peer writes its slots while it is attached).
            if value == 0 || (value & TAKING == 0 && value <= posted) {
                *hint = (i + 1) % TICKETS_PER_PEER;
                return Ok(slot);
            }
        }
        Err(SemaphoreError::TooManyStreamWaits { limit: TICKETS_PER_PEER })
    }

    /// Whether `record` is in `state` in its epoch.
    pub(crate) fn record_is(&self, record: PeerRecord, state: RecordState) -> bool {
        record.index < self.max_peers
            && self.record_word(record, RECORD_STATE).load(Ordering::Acquire) == record_word(record.epoch, state)
    }

    /// Moves `record` from `from` to `to` in its epoch; false when it is not in `from` (or not this epoch's).
    pub(crate) fn move_record(&self, record: PeerRecord, from: RecordState, to: RecordState) -> bool {
        record.index < self.max_peers
            && self
                .record_word(record, RECORD_STATE)
                .compare_exchange(
                    record_word(record.epoch, from),
                    record_word(record.epoch, to),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// Whether `record`'s peer has posted, and how many of its stream waits no post has reached yet (for `gpu-ipc ps`).
    pub(crate) fn peer_summary(&self, record: PeerRecord) -> (bool, usize) {
        if record.index >= self.max_peers {
            return (false, 0);
        }
        let posts = self.has_posted(record);
        let posted = self.posted();
        let queued = self.slots(record).filter(|slot| slot.load(Ordering::Acquire) & !TAKING > posted).count();
        (posts, queued)
    }

    /// Claims a free record for a connecting peer (the owner's side): `Offered` in a new epoch, with its pid.
    ///
    /// # Errors
    /// [`SemaphoreError::Full`] when every record is in use.
    pub(crate) fn claim_record(&self, pid: Option<u32>) -> Result<PeerRecord, SemaphoreError> {
        for index in 1..self.max_peers {
            let state = self.word(record_word_index(index) + RECORD_STATE);
            let word = state.load(Ordering::Acquire);
            if RecordState::from_raw(word) != Some(RecordState::Free) {
                continue;
            }
            let epoch = record_epoch(word).wrapping_add(1).max(1);
            let record = PeerRecord { index, epoch };
            // Cleared while free, before anyone can see the record as offered.
            self.clear_record(record);
            self.record_word(record, RECORD_PID).store(u64::from(pid.unwrap_or(0)), Ordering::Relaxed);
            if state
                .compare_exchange(word, record_word(epoch, RecordState::Offered), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(record);
            }
        }
        Err(SemaphoreError::Full { max: self.max_peers })
    }

    fn clear_record(&self, record: PeerRecord) {
        self.record_word(record, RECORD_FLAGS).store(0, Ordering::Relaxed);
        for slot in self.slots(record) {
            slot.store(0, Ordering::Relaxed);
        }
    }

    /// The owner's side of a peer's connection ending: frees its record, and breaks the semaphore (a peer that
    /// has posted and did not detach, under [`DeadPoster::Poison`]) or gives back its GPU-side waits' tickets (a
    /// peer that never posted, or any peer under [`DeadPoster::Ignore`]).
    pub(crate) fn peer_gone(&self, record: PeerRecord) -> Departure {
        if record.index == 0 || record.index >= self.max_peers {
            return Departure::Stale;
        }
        let word = self.record_word(record, RECORD_STATE).load(Ordering::Acquire);
        if record_epoch(word) != record.epoch {
            return Departure::Stale;
        }
        let departure = match RecordState::from_raw(word) {
            Some(RecordState::Offered) => Departure::NeverAttached,
            Some(RecordState::Detached) => Departure::Detached,
            Some(RecordState::Attached) if self.has_posted(record) && self.dead_poster() == DeadPoster::Poison => {
                let pid = self.record_word(record, RECORD_PID).load(Ordering::Relaxed);
                // The owner's door thread is the only writer of these two words: written before the state, read
                // after it.
                self.word(BROKEN_PID_WORD).store(pid, Ordering::Relaxed);
                self.word(BROKEN_RECORD_WORD).store(record.to_u64(), Ordering::Relaxed);
                self.end(SemaphoreState::Broken);
                Departure::PosterDied
            }
            Some(RecordState::Attached) => {
                let posted = self.has_posted(record);
                let refunded = self.unreached_tickets(record);
                if refunded > 0 {
                    self.add_posts(refunded);
                }
                if posted { Departure::PosterDiedIgnored { refunded } } else { Departure::WaiterDied { refunded } }
            }
            Some(RecordState::Free) | None => return Departure::Stale,
        };
        self.clear_record(record);
        self.record_word(record, RECORD_STATE).store(record_word(record.epoch, RecordState::Free), Ordering::Release);
        departure
    }

    /// Tickets of a departed peer that no post has reached: each would swallow a post. At most `taken - posted`
    /// (only tickets handed out and unreached count), whatever the record holds.
    fn unreached_tickets(&self, record: PeerRecord) -> u64 {
        let posted = self.posted();
        let taken = self.taken();
        let mut tickets: Vec<u64> = Vec::with_capacity(TICKETS_PER_PEER);
        for slot in self.slots(record) {
            let value = slot.load(Ordering::Acquire);
            let Some(ticket) = (value & !TAKING).checked_sub(1) else { continue };
            if ticket < posted || ticket >= taken {
                // A post reached it (used, or indistinguishable from used), or it was never handed out (a slot
                // marked by a peer that died before its compare-and-swap, or garbage).
                continue;
            }
            // Died taking it: the ticket was handed out (a CPU take never takes an unreached ticket); it was this
            // peer's unless another peer recorded it.
            if value & TAKING == 0 || !self.held_elsewhere(record, ticket) {
                tickets.push(ticket);
            }
        }
        // A ticket counts once, however many slots name it (only garbage names one twice).
        tickets.sort_unstable();
        tickets.dedup();
        tickets.len() as u64
    }

    fn held_elsewhere(&self, record: PeerRecord, ticket: u64) -> bool {
        (0..self.max_peers).filter(|&i| i != record.index).any(|index| {
            self.slots(PeerRecord { index, epoch: 0 }).any(|slot| slot.load(Ordering::Acquire) & !TAKING == ticket + 1)
        })
    }
}

/// `Ok` for a post count in `1..=MAX_POST`.
pub(crate) fn check_count(count: u64) -> Result<(), SemaphoreError> {
    if (1..=MAX_POST).contains(&count) { Ok(()) } else { Err(SemaphoreError::InvalidPost { count, max: MAX_POST }) }
}

#[cfg(test)]
#[path = "block_tests.rs"]
mod tests;
