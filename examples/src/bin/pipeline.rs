//! A three-stage pipeline, one process per stage, each stage with its own backend and sync strategy:
//!
//! ```text
//! pipeline verify    --socket /tmp/b.sock --backend vmm                                   # C: checks every frame
//! pipeline transform --upstream /tmp/a.sock --socket /tmp/b.sock --backend vmm --sync gpu-stream-ops   # B
//! pipeline generate  --socket /tmp/a.sock --backend vmm --sync ipc-event --frames 10000  # A: publishes frames
//! ```
//! A publishes pattern frames; B, a `Stage`, publishes each frame with every bit inverted (`--xor MASK`) into its
//! own ring; C checks that every word of every frame is the inverse of A's frame of that number. The end of A's
//! stream reaches C as a clean end (exit 0 everywhere). `--backend host` runs the same without a GPU (CPU
//! strategies, 640x480 frames unless `--width`/`--height` say otherwise). Start them in any order within
//! `--attach-timeout` (30 s); B gives its own ring the frame size it is given, which must be A's.
//!
//! Exit status: 0 done (C: every frame verified, the stream ended cleanly or `--frames` were read); 1 an error, or
//! mismatched words, or frames out of order (C); 3 no CUDA driver (use `--backend host`); 4 the upstream producer
//! died (B; C without `--reattach`, or when no producer came back); 6 B's consumer is gone (without
//! `--wait-for-downstream`). What each stage sees when another dies: docs/pipelines.md.

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpu_ipc_examples::pipeline::generate::{GenerateArgs, generate};
use gpu_ipc_examples::pipeline::transform::{TransformArgs, exit_for_stage, transform};
use gpu_ipc_examples::pipeline::verify::{VerifyArgs, verify};
use gpu_ipc_examples::{EXIT_PRODUCER_GONE, exit_for, print_summary};

/// One stage of a frame pipeline: generate -> transform -> verify.
#[derive(Debug, Parser)]
#[command(version, after_help = gpu_ipc_examples::exit::HELP)]
struct Args {
    #[command(subcommand)]
    role: Role,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// A: publish pattern frames into a ring (waiting for a consumer whenever none is attached).
    Generate(GenerateArgs),
    /// B: a stage from the ring at --upstream into its own ring at --socket, every word XORed with --xor.
    Transform(TransformArgs),
    /// C: read the last ring and check every word of every frame end to end.
    Verify(VerifyArgs),
}

fn main() -> ExitCode {
    match Args::parse().role {
        Role::Generate(args) => {
            let json = args.common.json;
            match generate(args) {
                Ok(s) => {
                    print_summary(json, &s, |s| {
                        format!(
                            "generate: {} frames of {} bytes in {:.3} s: {:.1} frames/s; {} consumer(s) lost, waited \
                             for one {} time(s)",
                            s.frames, s.frame_bytes, s.seconds, s.fps, s.consumers_lost, s.consumer_waits
                        )
                    });
                    ExitCode::SUCCESS
                }
                Err(e) => failed("generate", &e),
            }
        }
        Role::Transform(args) => {
            let json = args.common.json;
            match transform(args) {
                Ok(Ok(s)) => {
                    print_summary(json, &s, |s| {
                        format!(
                            "transform: {} frames (upstream {} on) XORed with {} in {:.3} s: {:.1} frames/s; the \
                             upstream stream ended after {} frames",
                            s.frames,
                            s.first_upstream,
                            s.xor,
                            s.seconds,
                            s.fps,
                            s.upstream_published.unwrap_or(0)
                        )
                    });
                    ExitCode::SUCCESS
                }
                Ok(Err(e)) => {
                    let (code, line) = exit_for_stage(&e);
                    eprintln!("{line}");
                    ExitCode::from(code)
                }
                Err(e) => failed("transform", &e),
            }
        }
        Role::Verify(args) => {
            let json = args.common.json;
            match verify(args) {
                Ok(s) => {
                    print_summary(json, &s, |s| {
                        format!(
                            "{}: {} frames in {} attachment(s), {} mismatched words, {} out of order{}{}",
                            s.name,
                            s.frames,
                            s.attachments.len(),
                            s.mismatched_words,
                            s.out_of_order,
                            s.end_of_stream_after
                                .map(|n| format!("; end of stream after {n} frames"))
                                .unwrap_or_default(),
                            s.producer_gone.as_deref().map(|g| format!("; {g}")).unwrap_or_default()
                        )
                    });
                    if s.mismatched_words != 0 || s.out_of_order != 0 {
                        ExitCode::from(gpu_ipc_examples::exit::EXIT_FAILURE)
                    } else if s.producer_gone.is_some() {
                        ExitCode::from(EXIT_PRODUCER_GONE)
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Err(e) => failed("verify", &e),
            }
        }
    }
}

fn failed(role: &str, e: &gpu_ipc::core::frames::FrameError) -> ExitCode {
    let (code, line) = exit_for(role, e);
    eprintln!("{line}");
    ExitCode::from(code)
}
