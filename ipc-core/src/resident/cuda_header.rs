//! The ring's layout as kernels see it, written as CUDA: `kernels/cuda/gpu_ipc_ring_layout.cuh`, which the device
//! API (`kernels/cuda/gpu_ipc_ring.cuh`) includes, is [`render`]'s output. The Rust definitions are the source: the
//! control block's vocabulary (`crate::ring::layout`: [`POISON`], [`MAX_SLOTS`], [`MAX_CONSUMERS`], the consumer
//! states), the device words ([`super::device_words`]) and every `#[repr(C)]` struct a kernel on the ring reads (the
//! two descriptors, the port's exit words, the frame graphs' frame state), whose fields and doc lines their
//! [`DeviceStruct`] description gives. `scripts/gen-kernels.sh` writes the file (through ipc-core's
//! `ring-layout-header` example) before it compiles the kernels, and `--check` fails when the committed file
//! differs; a unit test here fails too.

use super::consumer_kernel::RingDescriptor;
use super::device_words;
use super::frame_state::GraphFrameState;
use super::producer_kernel::ProducerRingDescriptor;
use super::ring_port::ExitWords;
use crate::resident::STAMP_MASK;
use crate::ring::POISON;
use crate::ring::layout::{ConsumerState, MAX_CONSUMERS, MAX_SLOTS, STATE_MASK};

/// A `#[repr(C)]` struct of `u64` fields that kernels read, as the CUDA struct is written from it (made by the
/// `device_struct!` macro of this module's parent, with the struct itself).
pub trait DeviceStruct {
    /// The CUDA struct's name, e.g. `gpu_ipc_ring_descriptor`.
    const C_NAME: &'static str;
    /// Each field's name and doc lines, in order.
    const FIELDS: &'static [(&'static str, &'static str)];
}

/// Where the generated header lives, from the repository root.
pub const PATH: &str = "kernels/cuda/gpu_ipc_ring_layout.cuh";

/// Width of the header's lines.
const WIDTH: usize = 118;

/// The text of `kernels/cuda/gpu_ipc_ring_layout.cuh`.
pub fn render() -> String {
    let mut out = String::new();
    comment(
        &mut out,
        "",
        "Generated from ipc-core (ipc_core::resident::cuda_header) by scripts/gen-kernels.sh: do not edit. Change the \
         Rust definitions and run the script; `scripts/gen-kernels.sh --check` and a unit test fail while this file \
         differs from them.",
    );
    out.push_str("//\n");
    comment(
        &mut out,
        "",
        "The frame ring's layout as kernels see it: the control block's constants, the device words' layout, and the \
         structs a kernel on the ring reads, each the mirror of a #[repr(C)] Rust struct of u64 fields. Included by \
         gpu_ipc_ring.cuh (the device API); copy both files into your build.",
    );
    out.push_str("\n#ifndef GPU_IPC_RING_LAYOUT_CUH\n#define GPU_IPC_RING_LAYOUT_CUH\n\n");
    out.push_str("typedef unsigned long long gpu_ipc_ring_u64;\n\n");
    let constants: [(&str, &str, String); 7] = [
        (
            "The value a survivor ORs into a dead peer's counters (ipc_core::ring::POISON): above every sequence, so it \
             satisfies every wait.",
            "GPU_IPC_RING_POISON",
            format!("(1ull << {})", POISON.trailing_zeros()),
        ),
        (
            "The bits of a `published` word that hold the frame (s + 1): the stamp rule compares them \
             (ipc_core::resident::STAMP_MASK).",
            "GPU_IPC_RING_STAMP_MASK",
            format!("{STAMP_MASK:#x}ull"),
        ),
        (
            "Most slots a ring can have (ipc_core::ring::layout::MAX_SLOTS).",
            "GPU_IPC_RING_MAX_SLOTS",
            format!("{MAX_SLOTS}ull"),
        ),
        (
            "Most consumers that can be attached at once (ipc_core::ring::layout::MAX_CONSUMERS).",
            "GPU_IPC_RING_MAX_CONSUMERS",
            format!("{MAX_CONSUMERS}ull"),
        ),
        (
            "The device words' layout (ipc_core::resident::device_words): published[i] at 8 i, consumer c's \
             released[i] at GPU_IPC_RING_DEVICE_RELEASED + c GPU_IPC_RING_DEVICE_RECORD + 8 i, in \
             GPU_IPC_RING_DEVICE_BYTES bytes.",
            "GPU_IPC_RING_DEVICE_RELEASED",
            format!("{}ull", device_words::RELEASED),
        ),
        ("", "GPU_IPC_RING_DEVICE_RECORD", format!("{}ull", device_words::RECORD)),
        ("", "GPU_IPC_RING_DEVICE_BYTES", format!("{}ull", device_words::BYTES)),
    ];
    for (doc, name, value) in &constants {
        if !doc.is_empty() {
            comment(&mut out, "", doc);
        }
        out.push_str(&format!("#define {name} {value}\n"));
    }
    comment(
        &mut out,
        "",
        "A consumer record's state word is (epoch << 8) | state (ipc_core::ring::layout::ConsumerState).",
    );
    out.push_str(&format!("#define GPU_IPC_RING_STATE_MASK {STATE_MASK:#x}ull\n"));
    for (name, state) in [
        ("FREE", ConsumerState::Free),
        ("JOINING", ConsumerState::Joining),
        ("LIVE", ConsumerState::Live),
        ("DETACHED", ConsumerState::Detached),
        ("DEAD", ConsumerState::Dead),
    ] {
        out.push_str(&format!("#define GPU_IPC_RING_STATE_{name} {}ull\n", state as u64));
    }
    comment(&mut out, "", "The versions of the descriptors (their VERSION in Rust), in their `version` field.");
    out.push_str(&format!("#define GPU_IPC_RING_DESCRIPTOR_VERSION {}ull\n", RingDescriptor::VERSION));
    out.push_str(&format!("#define GPU_IPC_RING_PRODUCER_DESCRIPTOR_VERSION {}ull\n", ProducerRingDescriptor::VERSION));
    structure::<ExitWords>(&mut out, "ipc_core::resident's ExitWords (the first words of a side's port)");
    structure::<RingDescriptor>(&mut out, "ipc_core::resident::RingDescriptor (Consumer::launch_on_ring)");
    structure::<ProducerRingDescriptor>(
        &mut out,
        "ipc_core::resident::ProducerRingDescriptor (Producer::launch_on_ring)",
    );
    structure::<GraphFrameState>(&mut out, "ipc_core::resident's GraphFrameState (frame graphs)");
    out.push_str("\n#endif // GPU_IPC_RING_LAYOUT_CUH\n");
    out
}

/// Writes `S` as a CUDA struct, each field under its doc lines, after a line that names the Rust struct.
fn structure<S: DeviceStruct>(out: &mut String, rust: &str) {
    out.push('\n');
    comment(out, "", &format!("{} mirrors {rust}.", S::C_NAME));
    out.push_str(&format!("struct {} {{\n", S::C_NAME));
    for (field, doc) in S::FIELDS {
        comment(out, "    ", doc);
        out.push_str(&format!("    gpu_ipc_ring_u64 {field};\n"));
    }
    out.push_str("};\n");
}

/// Writes `text` as `//` lines of at most [`WIDTH`] characters, indented by `indent`: rustdoc's link brackets are
/// dropped (`[`X`](path)` and `[`X`]` become `` `X` ``), line breaks become spaces.
fn comment(out: &mut String, indent: &str, text: &str) {
    let text = plain(text);
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && indent.len() + 3 + line.len() + 1 + word.len() > WIDTH {
            out.push_str(&format!("{indent}// {line}\n"));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&format!("{indent}// {line}\n"));
    }
}

/// `text` without rustdoc's link syntax, and with `crate::` paths as the crate's name (`ipc_core::`).
fn plain(text: &str) -> String {
    without_links(text).replace("crate::", "ipc_core::")
}

fn without_links(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("[`") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find("`]") else {
            out.push_str(&rest[open..]);
            return out;
        };
        out.push_str(&after[..close + 1]);
        rest = &after[close + 2..];
        // A link target right after: `(path)`, possibly broken over lines.
        if let Some(target) = rest.strip_prefix('(')
            && let Some(end) = target.find(')')
        {
            rest = &target[end + 1..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The committed files, embedded when the test is built (a change rebuilds it), so no path is needed at run time.
    const COMMITTED: &str = include_str!("../../../kernels/cuda/gpu_ipc_ring_layout.cuh");
    /// The device API: the header users include, and the files it is split into (one a side, and what both stand on).
    const DEVICE_API: [(&str, &str); 4] = [
        ("gpu_ipc_ring.cuh", include_str!("../../../kernels/cuda/gpu_ipc_ring.cuh")),
        ("gpu_ipc_ring_waits.cuh", include_str!("../../../kernels/cuda/gpu_ipc_ring_waits.cuh")),
        ("gpu_ipc_ring_consumer.cuh", include_str!("../../../kernels/cuda/gpu_ipc_ring_consumer.cuh")),
        ("gpu_ipc_ring_producer.cuh", include_str!("../../../kernels/cuda/gpu_ipc_ring_producer.cuh")),
    ];

    #[test]
    fn the_committed_header_is_what_the_rust_definitions_generate() {
        let committed = COMMITTED;
        assert!(
            committed == render(),
            "{PATH} differs from the ring's layout in ipc-core: run scripts/gen-kernels.sh and commit it"
        );
    }

    #[test]
    fn the_device_api_includes_the_generated_header_and_defines_none_of_it_again() {
        let [(_, api), (_, waits), (_, consumer), (_, producer)] = DEVICE_API;
        assert!(waits.contains("#include \"gpu_ipc_ring_layout.cuh\""));
        for side in [consumer, producer] {
            assert!(side.contains("#include \"gpu_ipc_ring_waits.cuh\""));
        }
        assert!(api.contains("#include \"gpu_ipc_ring_consumer.cuh\""));
        assert!(api.contains("#include \"gpu_ipc_ring_producer.cuh\""));
        let generated = render();
        for (file, text) in DEVICE_API {
            for line in generated.lines() {
                if let Some(define) = line.strip_prefix("#define ") {
                    let name = define.split_whitespace().next().unwrap();
                    assert!(!text.contains(&format!("#define {name} ")), "{name} is defined in {file} too");
                }
                if let Some(name) = line.strip_prefix("struct ") {
                    assert!(!text.contains(&format!("struct {name}")), "{name} is defined in {file} too");
                }
            }
        }
    }

    #[test]
    fn each_struct_lists_its_fields_in_memory_order() {
        let header = render();
        let body = &header[header.find("struct gpu_ipc_ring_descriptor {").unwrap()..];
        let body = &body[..body.find("};").unwrap()];
        let fields: Vec<&str> = body
            .lines()
            .filter_map(|line| line.trim().strip_prefix("gpu_ipc_ring_u64 "))
            .map(|rest| rest.trim_end_matches(';'))
            .collect();
        assert_eq!(fields.len(), RingDescriptor::WORDS);
        assert_eq!(fields[0], "version");
        assert_eq!(fields[12], "abort");
        // Each field lands where its name says: a descriptor of distinct values, in declaration order.
        let d = RingDescriptor {
            version: 0,
            control: 1,
            published_offset: 2,
            published_stride: 3,
            released_offset: 4,
            released_stride: 5,
            slots: 6,
            slot_stride: 7,
            slot_bytes: 8,
            slot_count: 9,
            consumer_index: 10,
            first_sequence: 11,
            abort: 12,
            progress: 13,
            device_words: 14,
        };
        assert_eq!(d.to_words().to_vec(), (0..15).collect::<Vec<u64>>());
        for (i, (name, _)) in RingDescriptor::FIELDS.iter().enumerate() {
            assert_eq!(fields[i], *name);
        }
        let exit: Vec<&str> = ExitWords::FIELDS.iter().map(|(name, _)| *name).collect();
        assert_eq!(exit, ["abort", "heartbeat", "lease_ns", "peer_abort"]);
        assert_eq!(GraphFrameState::WORDS, 4);
    }

    #[test]
    fn comments_lose_rustdocs_link_syntax_and_keep_to_the_width() {
        assert_eq!(plain("see [`RingDescriptor::VERSION`]."), "see `RingDescriptor::VERSION`.");
        assert_eq!(plain("([`device_words`](crate::resident::device_words)) x"), "(`device_words`) x");
        assert_eq!(plain("[`crate::resident::KernelLease`]"), "`ipc_core::resident::KernelLease`");
        assert_eq!(plain("no links"), "no links");
        let mut out = String::new();
        comment(&mut out, "    ", &"word ".repeat(100));
        assert!(out.lines().all(|line| line.len() <= WIDTH && line.starts_with("    // ")), "{out}");
        assert!(render().lines().all(|line| line.len() <= WIDTH));
    }
}
