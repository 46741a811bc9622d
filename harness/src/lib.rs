//! What the probes and the pipeline benchmark stand on, so that they share one way of doing each thing:
//!
//! - [`child`]: helper processes (a copy of the `gpu-ipc` binary started as `gpu-ipc helper`) and the channel to
//!   them;
//! - [`gpu`]: the GPU set-up every measuring process makes (a context, the pattern kernels, a stream);
//! - [`env`](mod@env): where a measurement ran, from the machine's CUDA facts ([`cuda`]) and [`mps`];
//! - [`run`]: the options, the JSON envelope and the run-and-print loop every probe and benchmark shares;
//! - [`progress`], [`stats`], [`regions`]: progress on stderr, distributions, memory of either backend;
//! - [`mps`]: whether MPS is active, and a private MPS daemon for one run;
//! - [`report`] and [`plot`]: the report's vocabulary (a probe's section, the charts it asks for) and the SVG plots;
//! - [`exit`]: the one table of exit statuses; [`fact`]: a fact or why it could not be read; [`process`]: small
//!   process helpers.

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

pub mod child;
pub mod cuda;
pub mod env;
pub mod exit;
pub mod fact;
pub mod gpu;
pub mod mps;
pub mod plot;
pub mod process;
pub mod progress;
pub mod regions;
pub mod report;
pub mod run;
pub mod stats;

pub use run::{CommonArgs, MeasurementError, MeasurementOutput, SCHEMA_VERSION, Verdict, execute};
