//! Model weights between processes (layer 7, on the pool): a whole state_dict in **one arena per generation**,
//! exported once, with a plain-data [`Manifest`] in front of the tensors; readers import the arena once and get
//! every tensor, however many; the owner publishes generation N+1 into an arena no reader holds while readers keep
//! using N, and a reader moves when it chooses.
//!
//! - [`WeightsOwner`]: [`create`](WeightsOwner::create) with the tensors' names and descriptions,
//!   [`stage`](WeightsOwner::stage) (the next generation's arena, writable), [`commit`](WeightsOwner::commit),
//!   [`update`](WeightsOwner::update) (both, from host bytes), [`readers`](WeightsOwner::readers).
//! - [`WeightsReader`]: [`open`](WeightsReader::open), [`held`](WeightsReader::held) (the generation held, as a
//!   [`HeldGeneration`] that keeps its arena pinned while it lives), [`latest`](WeightsReader::latest) (a word in
//!   shared memory), [`refresh`](WeightsReader::refresh), [`wait_for`](WeightsReader::wait_for) (on the CPU),
//!   [`wait_on`](WeightsReader::wait_on) (a CUDA stream waits for a generation, released by the owner's end too)
//!   and [`watch`](WeightsReader::watch) (the same status word, for kernels to read).
//! - [`WeightsPartsOwner`], [`WeightsPartsReader`]: a set on several devices, one part (an ordinary one-device set)
//!   per device, read whole at one generation; the parts reader's [`wait_on`](WeightsPartsReader::wait_on) and
//!   [`watch`](WeightsPartsReader::watch) wait for the set's generation on a part's device. [`OpenedSet::open`]
//!   opens a set of either kind by name, attaching once.
//! - [`find_runs`]: a generation's tensors as [`Run`]s, tensors alike a constant step apart, which one strided view
//!   cuts (the owner lays tensors alike out together, so an ordinary state_dict is a few dozen runs).
//! - [`TensorCopier`]: on a GPU, a whole state_dict copied into a staged arena
//!   ([`StagedGeneration::copy_in`]) or out of a held one ([`HeldGeneration::copy_out`]) with a few launches of
//!   a gather kernel, at the bandwidth of one memcpy; [`BoundCopies`]: the same copies again and again (a
//!   trainer's parameters bound once, published after every step), one launch each.
//!
//! How it works: the arenas are buffers of a [`SharedPool`](crate::pool::SharedPool) named `SET/GENERATION`, one
//! block (one export) each unless arenas fit in freed room; the newest generation is the pool directory's note
//! word; a reader's hold is the pool's pin of that buffer, dropped once the reader has refreshed past it or closed
//! and what it took of it (`held()`) is gone, or when it dies (its connection hangs up), so a generation's memory
//! is reused only when no reader holds it. The manifest
//! is decoded from a private copy and checked whole before a tensor is described. See `docs/weights.md`.

mod arena;
mod checksum;
mod copy;
mod error;
mod gate;
mod io;
pub mod manifest;
mod open;
mod owner;
mod parts;
mod parts_reader;
mod parts_wait;
mod reader;
mod runs;
mod stream_wait;

pub use copy::{BoundCopies, CopyDirection, TensorCopier};
pub use error::WeightsError;
pub use gate::{GONE_BIT, MAX_GENERATION, StatusWord};
pub use io::ArenaBytes;
pub use ipc_core::wire::{DType, TensorDesc};
pub use manifest::{Manifest, ManifestError, SetParts, TensorEntry};
pub use open::OpenedSet;
pub use owner::{ReaderHold, StagedGeneration, WeightsOptions, WeightsOwner};
pub use parts::WeightsPartsOwner;
pub use parts_reader::{HeldParts, WeightsPartsReader};
pub use reader::{HeldGeneration, WeightsReader};
pub use runs::{Run, find_runs};
pub use stream_wait::{GenerationWait, GenerationWaitStatus};

/// The pool buffer name of `set`'s arena of `generation`.
fn arena_name(set: &str, generation: u64) -> String {
    format!("{set}/{generation}")
}

/// The generation of `set` an arena name stands for, if it is one of that set's.
fn generation_of(set: &str, buffer: &str) -> Option<u64> {
    buffer.strip_prefix(set)?.strip_prefix('/')?.parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod parts_tests;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod parts_wait_tests;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod stream_wait_tests;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
