//! Which helper role runs where: the one dispatch of the bench's helper processes (`gpu-ipc helper` with a role
//! `bench-*`) to the file that plays it. Above the rows, so that no row calls back up into a hub.

use std::os::fd::OwnedFd;
use std::time::Duration;

use super::consumer::{OursConsumer, study_consumer};
use super::graphs::GraphConsumer;
use super::resident::ResidentConsumer;
use super::rows::RowSpec;
use super::shared::PublishStamps;
use super::tasks::{BenchTask, ConsumerMessage, ConsumerPlan, Setup};
use harness::MeasurementError;
use harness::child::{Channel, ChildTask};

/// Runs a bench child: a consumer, a three-stage row's middle stage, or an imported-buffer row's exporter.
///
/// # Errors
/// Anything that stops it; the caller reports it to the parent.
pub fn child(task: ChildTask, channel: &Channel) -> Result<(), MeasurementError> {
    match task.decode().map_err(|source| MeasurementError::Malformed { what: "bench task".to_owned(), source })? {
        BenchTask::Consumer(plan) => consumer_child(plan, channel),
        BenchTask::Stage(plan) => super::stage::child(&plan, channel),
        BenchTask::Exporter(plan) => super::memory::exporter_child(&plan, channel),
    }
}

/// Runs a `bench-consumer` child.
fn consumer_child(plan: ConsumerPlan, channel: &Channel) -> Result<(), MeasurementError> {
    let (setup, mut fds): (Setup, Vec<OwnedFd>) = channel.recv(Duration::from_secs(30))?;
    if fds.is_empty() {
        return Err(MeasurementError::Missing("the producer sent no publish-stamp memfd"));
    }
    let stamps = PublishStamps::open(fds.remove(0))?;
    let report = match plan.spec {
        RowSpec::Ours { backend, .. } | RowSpec::ThreeStage { backend, .. } | RowSpec::Paced { backend, .. } => {
            gpu_ipc::dispatch_gpu(backend, OursConsumer { plan: &plan, stamps: &stamps })
                .unwrap_or_else(|e| Err(e.into()))?
        }
        RowSpec::Graphs { backend, .. } => {
            gpu_ipc::dispatch_gpu(backend, GraphConsumer { plan: &plan }).unwrap_or_else(|e| Err(e.into()))?
        }
        RowSpec::Resident { backend, .. } => {
            gpu_ipc::dispatch_gpu(backend, ResidentConsumer { plan: &plan }).unwrap_or_else(|e| Err(e.into()))?
        }
        RowSpec::Study { design } => study_consumer(&plan, design, &setup, fds, &stamps, channel)?,
        RowSpec::SingleProcess
        | RowSpec::SingleProcessPipelined { .. }
        | RowSpec::SingleProcessMemOps { .. }
        | RowSpec::Bandwidth
        | RowSpec::Memory { .. }
        | RowSpec::Imported { .. }
        | RowSpec::Kernel { .. } => {
            return Err(MeasurementError::Missing("the references and the memory rows run without a consumer process"));
        }
    };
    channel.send(&ConsumerMessage::Report(report), Vec::new())?;
    Ok(())
}
