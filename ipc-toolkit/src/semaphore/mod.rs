//! A cross-process counting semaphore, with CPU-side and GPU-side (stream) posts and waits.
//!
//! One process owns it ([`SemaphoreOwner`]): it creates the shared block (a sealed memfd of 64-bit atomic words)
//! and serves it through an [`ObjectDoor`](crate::door::ObjectDoor) at a socket path; other processes
//! [`Semaphore::attach`] there. Every handle can [`post`](Semaphore::post) and [`wait`](Semaphore::wait) from the
//! CPU (every wait bounded), and [`post_on`](Semaphore::post_on) and [`wait_on`](Semaphore::wait_on) a CUDA stream.
//!
//! **Counting.** Two monotonic counters: `posted` (posts so far) and `taken` (tickets handed out). Post `t + 1`
//! belongs to ticket `t`. A CPU take moves `taken` from `t` to `t + 1` only when `posted > t`, so a CPU wait that
//! times out leaves no trace. A stream wait cannot take conditionally: it takes ticket `t` at once and queues
//! `cuStreamWaitValue64(posted, t + 1, GEQ)` on the caller's stream (the coherency probe's rule for a host-side
//! writer and a GPU waiter); the stream goes on when post `t + 1` lands.
//!
//! **Stream posts.** A stream post must *add* to `posted` after the stream's earlier work: CUDA 12.9's stream
//! memory operations only store values (no atomic add), and a GPU atomic on host memory is atomic with respect to
//! the CPU's atomics only where the device reports `CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED` (not on a
//! PCIe-attached GPU in an x86 machine). So a stream post is a host function (`cuLaunchHostFunc`) that does the
//! CPU's `fetch_add`: correct on every platform, at the cost of a driver callback per post.
//!
//! **Dead peers.** A peer counts as a poster from its first post (it marks its record before the post can land).
//! A poster that hangs up without detaching breaks the semaphore ([`DeadPoster::Poison`], the default): the owner
//! writes the state `Broken` and ORs the poison `2^62` into `posted`, which releases every GPU-side wait, queued
//! or future; CPU waits return [`SemaphoreError::PosterDied`]; the owner can [`SemaphoreOwner::reset`] it. Under
//! [`DeadPoster::Ignore`] (chosen at creation, kept in the shared block) the semaphore goes on. A peer that never
//! posted and dies has its unreached tickets made good (they would swallow posts). The owner dying: each
//! importer's watchdog sees its connection hang up and writes `OwnerGone` and the poison itself (the memfd stays
//! mapped in every process). A released stream wait tells how it was released, on the GPU to the kernels queued
//! after it ([`StreamWait::status_word`]) and on the CPU ([`Semaphore::wait_status`]).
//!
//! See `docs/semaphore.md` for when to use it, what each death does, and an example.

mod block;
mod body;
mod error;
mod gpu;
mod handle;
pub mod layout;
mod owner;
mod watchdog;

pub use block::{Departure, PeerRecord, SemaphoreBlock};
pub use body::{SEMAPHORE_OFFER_BYTES, SEMAPHORE_OFFER_FDS, SemaphoreOffer};
pub use error::{PeerPid, SemaphoreError};
pub use handle::{AttachOptions, Semaphore, StreamWait, WaitPolicy};
pub use layout::{COUNT_MASK, DeadPoster, MAX_PEERS, MAX_POST, POISON, SemaphoreState, TICKETS_PER_PEER};
pub use owner::{OwnerOptions, SemaphoreOwner};
