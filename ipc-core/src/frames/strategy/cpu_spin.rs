//! `CpuSpin`: the CPU busy-polls the control block (lowest latency; one core busy per waiting side).

use super::cpu::{CpuConsumer, CpuProducer};
use super::{ConsumerSide, ProducerSide, Setup, Strategy};
use crate::frames::FrameError;
use crate::ring::WaitMode;
use crate::wire::SyncStrategy;
use gpu_ipc_driver::Context;

/// The `CpuSpin` strategy.
pub(crate) struct CpuSpin;

impl Strategy for CpuSpin {
    fn kind(&self) -> SyncStrategy {
        SyncStrategy::CpuSpin
    }

    fn check(&self, _cuda: Option<&Context>) -> Result<(), FrameError> {
        Ok(())
    }

    fn producer(&self, _setup: Setup<'_>) -> Result<Box<dyn ProducerSide>, FrameError> {
        Ok(Box::new(CpuProducer::new(WaitMode::Spin)))
    }

    fn consumer(&self, _setup: Setup<'_>, _events: &[[u8; 64]]) -> Result<Box<dyn ConsumerSide>, FrameError> {
        Ok(Box::new(CpuConsumer::new(WaitMode::Spin)))
    }
}
