//! What a native owner or reader handle stands for: a whole set on one device, or one part of a set on several
//! devices (one handle per part, all sharing the set). The single-device path is one `match` away from the core's
//! types; a part's handle does per part what a whole set's does (stage, copy, describe), while publishing, the
//! generation and the owner's end are the set's.

use std::sync::Arc;

use gpu_ipc::driver::Stream;
use gpu_ipc::weights::{
    ArenaBytes, GenerationWait, GenerationWaitStatus, HeldGeneration, StagedGeneration, WeightsError,
    WeightsOwner as CoreOwner, WeightsPartsOwner as CoreParts, WeightsPartsReader as CoreReaderParts,
    WeightsReader as CoreReader,
};

/// An owner's set: on one device, or in parts.
// One per owner, behind an `Arc`: the one-device set is kept unboxed, as it was before parts.
#[allow(clippy::large_enum_variant)]
pub(crate) enum OwnedSet<B: ArenaBytes> {
    Whole(CoreOwner<B>),
    Parts(CoreParts<B>),
}

impl<B: ArenaBytes> OwnedSet<B> {
    /// Part `part` (the whole set for a set on one device). `part` was checked when the handle was made.
    pub(crate) fn part(&self, part: usize) -> &CoreOwner<B> {
        match self {
            Self::Whole(o) => o,
            Self::Parts(p) => &p.parts()[part.min(p.parts().len().saturating_sub(1))],
        }
    }

    /// Stages the next generation (of every part: a commit publishes them together) and returns part `part`'s.
    pub(crate) fn stage(&mut self, part: usize) -> Result<&StagedGeneration<B>, WeightsError> {
        match self {
            Self::Whole(o) => o.stage(),
            Self::Parts(p) => p
                .stage()?
                .into_iter()
                .nth(part)
                .ok_or_else(|| WeightsError::Invalid(format!("part {part} of a set of parts has nothing staged"))),
        }
    }

    /// Publishes the staged generation (every part's, part 0 last).
    pub(crate) fn commit(&mut self) -> Result<u64, WeightsError> {
        match self {
            Self::Whole(o) => o.commit(),
            Self::Parts(p) => p.commit(),
        }
    }

    /// The newest published generation (the set's).
    pub(crate) fn generation(&self) -> u64 {
        match self {
            Self::Whole(o) => o.generation(),
            Self::Parts(p) => p.generation(),
        }
    }
}

/// A reader's set: on one device, or in parts.
#[allow(clippy::large_enum_variant)]
pub(crate) enum ReadSet<B: ArenaBytes> {
    Whole(CoreReader<B>),
    Parts(CoreReaderParts<B>),
}

impl<B: ArenaBytes> ReadSet<B> {
    /// Part `part` of the generation held (the whole of it for a set on one device).
    pub(crate) fn held(&self, part: usize) -> Arc<HeldGeneration<B>> {
        match self {
            Self::Whole(r) => r.held(),
            Self::Parts(r) => {
                let held = r.held();
                held.parts()[part.min(held.parts().len().saturating_sub(1))].clone()
            }
        }
    }

    /// The set's tensors in the publisher's order: (part, index in that part's manifest).
    pub(crate) fn order(&self) -> Vec<(usize, usize)> {
        match self {
            Self::Whole(r) => (0..r.held().manifest().entries.len()).map(|i| (0, i)).collect(),
            Self::Parts(r) => r.held().order().to_vec(),
        }
    }

    /// Arms the status word of part `part` (the only one, for a set on one device) for `generation`.
    pub(crate) fn watch(&self, generation: u64, part: usize) -> Result<GenerationWait, WeightsError> {
        match self {
            Self::Whole(r) => r.watch(generation),
            Self::Parts(r) => r.watch(generation, part),
        }
    }

    /// Queues on `stream` a wait for `generation` (a set of parts: on the gate of the part on the stream's device).
    pub(crate) fn wait_on(&self, generation: u64, stream: &Stream) -> Result<GenerationWait, WeightsError> {
        match self {
            Self::Whole(r) => r.wait_on(generation, stream),
            Self::Parts(r) => r.wait_on(generation, stream),
        }
    }

    pub(crate) fn wait_status(&self, wait: &GenerationWait) -> GenerationWaitStatus {
        match self {
            Self::Whole(r) => r.wait_status(wait),
            Self::Parts(r) => r.wait_status(wait),
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        match self {
            Self::Whole(r) => r.generation(),
            Self::Parts(r) => r.generation(),
        }
    }

    pub(crate) fn latest(&self) -> Result<u64, WeightsError> {
        match self {
            Self::Whole(r) => r.latest(),
            Self::Parts(r) => r.latest(),
        }
    }

    pub(crate) fn refresh(&mut self) -> Result<u64, WeightsError> {
        match self {
            Self::Whole(r) => r.refresh(),
            Self::Parts(r) => r.refresh(),
        }
    }

    pub(crate) fn wait_for(&self, generation: u64, timeout: Option<std::time::Duration>) -> Result<u64, WeightsError> {
        match self {
            Self::Whole(r) => r.wait_for(generation, timeout),
            Self::Parts(r) => r.wait_for(generation, timeout),
        }
    }

    pub(crate) fn owner_gone(&self) -> bool {
        match self {
            Self::Whole(r) => r.owner_gone(),
            Self::Parts(r) => r.owner_gone(),
        }
    }

    pub(crate) fn set_name(&self) -> &str {
        match self {
            Self::Whole(r) => r.set_name(),
            Self::Parts(r) => r.set_name(),
        }
    }
}
