//! The kernels of the research probes (`kernels/cuda/probe_*.cu`), by name, with the variants of the coherency
//! probe as types, so a probe names the instruction it tests and never spells a kernel name by hand.

use gpu_ipc_driver::{Context, Function, Module};

use crate::image::{self, KernelImage};
use crate::launch::{KernelError, load_module};

/// `gpu_ipc_mem_read(const uint4* src, u64 n_vec, u32 never, u32* sink)`: reads `n_vec` 16-byte vectors.
pub const MEM_READ: &str = "gpu_ipc_mem_read";
/// `gpu_ipc_mem_write(uint4* dst, u64 n_vec, u32 value)`: writes `n_vec` 16-byte vectors.
pub const MEM_WRITE: &str = "gpu_ipc_mem_write";
/// `gpu_ipc_mem_chase(const u64* chain, u64 start, u64 warm_steps, u64 steps, u64* cycles, u64* sink)`: a
/// dependent pointer chase timing each load (one thread).
pub const MEM_CHASE: &str = "gpu_ipc_mem_chase";
/// `gpu_ipc_mem_store_latency(u64* dst, u64 lines, u64 steps, u64* cycles)`: store + `__threadfence()` latency.
pub const MEM_STORE_LATENCY: &str = "gpu_ipc_mem_store_latency";
/// `gpu_ipc_mem_hammer(u32* buf, u64 n_words, u64 seq, u64 duration_ns, u64* stats)`: reads and rewrites the
/// frame pattern of `seq` for a bounded time.
pub const MEM_HAMMER: &str = "gpu_ipc_mem_hammer";
/// `gpu_ipc_mem_wait_flag(const u64* flag, u64 target, u64 timeout_ns, u64* out)`: a bounded GPU-side wait.
pub const MEM_WAIT_FLAG: &str = "gpu_ipc_mem_wait_flag";
/// `gpu_ipc_coh_payload_write(u32* payload, u64 words, u64 round, u64* write_ts)`: the stream-driven writer's
/// payload kernel.
pub const COH_PAYLOAD_WRITE: &str = "gpu_ipc_coh_payload_write";
/// `gpu_ipc_coh_payload_check(const u64* flag, const u32* payload, u64 words, u64 round, u64* seen_ts,
/// u64* results)`: the stream-driven reader's check kernel.
pub const COH_PAYLOAD_CHECK: &str = "gpu_ipc_coh_payload_check";

/// Layout of the coherency probe's shared buffer and results (see `kernels/cuda/probe_coherency.cu`).
pub mod coherency_layout {
    /// Byte offset of the flag (its own 128-byte line).
    pub const FLAG: u64 = 0;
    /// Byte offset of the ack (its own 128-byte line).
    pub const ACK: u64 = 128;
    /// Byte offset of the payload.
    pub const PAYLOAD: u64 = 256;
    /// A flag or ack at or above this value tells a kernel to stop (the host releases waits with it).
    pub const ABORT: u64 = 1 << 62;
    /// Number of u64 result words each kernel writes.
    pub const RESULTS: usize = 6;
    /// Result word: rounds completed.
    pub const R_DONE: usize = 0;
    /// Result word: rounds with at least one stale payload word.
    pub const R_STALE_ROUNDS: usize = 1;
    /// Result word: stale payload words, summed over rounds.
    pub const R_STALE_WORDS: usize = 2;
    /// Result word: 1 when a round timed out (which ends the kernel).
    pub const R_TIMEOUT: usize = 3;
    /// Result word: 1 when the host aborted the kernel.
    pub const R_ABORTED: usize = 4;
    /// Result word: the first stale round, 0 if none.
    pub const R_FIRST_STALE: usize = 5;

    /// The value word `index` of the payload holds in round `round` (the host reference of `coh_value`).
    pub const fn value(round: u64, index: u64) -> u32 {
        let x = (round as u32).wrapping_mul(0x85EB_CA6B) ^ (index as u32).wrapping_mul(0x9E37_79B1) ^ 0x5A5A_5A5A;
        x ^ (x >> 15)
    }
}

macro_rules! variants {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $token:literal, $label:literal;)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(rename_all = "kebab-case")]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every variant, in the order reports list them.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The token in the kernel's name.
            pub const fn token(self) -> &'static str {
                match self { $($name::$variant => $token,)* }
            }

            /// The instruction (or C++ access) as a report names it.
            pub const fn label(self) -> &'static str {
                match self { $($name::$variant => $label,)* }
            }
        }
    };
}

variants! {
    /// How the reader polls the flag.
    FlagLoad {
        /// An ordinary C++ load: the compiler may hoist it out of the polling loop.
        Plain = "plain", "plain load";
        /// `ld.volatile.global`.
        Volatile = "volatile", "ld.volatile";
        /// `ld.relaxed.sys.global`.
        RelaxedSys = "relaxedsys", "ld.relaxed.sys";
        /// `ld.acquire.gpu.global`.
        AcquireGpu = "acquiregpu", "ld.acquire.gpu";
        /// `ld.acquire.sys.global`.
        AcquireSys = "acquiresys", "ld.acquire.sys";
    }
}

variants! {
    /// How the reader loads the payload after seeing the flag.
    PayloadLoad {
        /// Ordinary C++ loads (`ld.global`, cached in L1).
        Plain = "plain", "plain loads";
        /// `ld.volatile.global`.
        Volatile = "volatile", "ld.volatile";
    }
}

variants! {
    /// How the writer publishes the flag after writing the payload with plain stores.
    FlagStore {
        /// An ordinary C++ store.
        Plain = "plain", "plain store";
        /// `st.volatile.global`.
        Volatile = "volatile", "st.volatile";
        /// `__threadfence()` (`fence.sc.gpu`), then an ordinary store.
        Threadfence = "threadfence", "__threadfence(); store";
        /// `st.release.gpu.global`.
        ReleaseGpu = "releasegpu", "st.release.gpu";
        /// `st.release.sys.global`.
        ReleaseSys = "releasesys", "st.release.sys";
    }
}

/// The reader kernel that polls with `load`, reads the payload with `payload`, with `__threadfence()` between the
/// two when `fence`.
pub fn coherency_reader(load: FlagLoad, payload: PayloadLoad, fence: bool) -> String {
    let fence = if fence { "fence" } else { "nofence" };
    format!("gpu_ipc_coh_read_{}_{}_{fence}", load.token(), payload.token())
}

/// The writer kernel that publishes the flag with `store`.
pub fn coherency_writer(store: FlagStore) -> String {
    format!("gpu_ipc_coh_write_{}", store.token())
}

/// Every probe kernel's name.
pub fn kernel_names() -> Vec<String> {
    let mut names: Vec<String> = [
        MEM_READ,
        MEM_WRITE,
        MEM_CHASE,
        MEM_STORE_LATENCY,
        MEM_HAMMER,
        MEM_WAIT_FLAG,
        COH_PAYLOAD_WRITE,
        COH_PAYLOAD_CHECK,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for &load in FlagLoad::ALL {
        for &payload in PayloadLoad::ALL {
            for fence in [false, true] {
                names.push(coherency_reader(load, payload, fence));
            }
        }
    }
    names.extend(FlagStore::ALL.iter().map(|&s| coherency_writer(s)));
    names
}

/// The embedded module loaded in one context, from which probes take kernels by name.
#[derive(Debug)]
pub struct ProbeKernels {
    module: Module,
    image: &'static KernelImage,
}

impl ProbeKernels {
    /// Loads the image that suits the context's device (`GPU_IPC_FORCE_PTX=1` forces the PTX).
    ///
    /// # Errors
    /// As [`crate::launch::load_module`].
    pub fn load(ctx: &Context) -> Result<Self, KernelError> {
        let (module, image) = load_module(ctx, image::force_ptx_from_env())?;
        Ok(Self { module, image })
    }

    /// The kernel called `name`.
    ///
    /// # Errors
    /// `CUDA_ERROR_NOT_FOUND` for a name the image lacks.
    pub fn function(&self, name: &str) -> Result<Function, KernelError> {
        Ok(self.module.function(name)?)
    }

    /// The image that was loaded (its bytes are what `cuobjdump -sass` reads).
    pub fn image(&self) -> &'static KernelImage {
        self.image
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same vectors as `coh_value` in `kernels/cuda/probe_coherency.cu` computes.
    #[test]
    fn coherency_values_differ_between_rounds_in_every_word() {
        for index in 0..2048u64 {
            for round in 1..64u64 {
                assert_ne!(coherency_layout::value(round, index), coherency_layout::value(round + 1, index));
            }
        }
        assert_eq!(coherency_layout::value(0, 0), 0x5A5A_5A5A ^ (0x5A5A_5A5A >> 15));
    }

    #[test]
    fn variant_names() {
        assert_eq!(
            coherency_reader(FlagLoad::AcquireSys, PayloadLoad::Plain, false),
            "gpu_ipc_coh_read_acquiresys_plain_nofence"
        );
        assert_eq!(coherency_writer(FlagStore::ReleaseSys), "gpu_ipc_coh_write_releasesys");
        assert_eq!(kernel_names().len(), 8 + 20 + 5);
    }
}
