//! `CpuSleep`: the CPU polls the control block with short sleeps in between (cheap on CPU, adds latency).

use super::cpu::{CpuConsumer, CpuProducer};
use super::{ConsumerSide, ProducerSide, Setup, Strategy};
use crate::frames::FrameError;
use crate::ring::WaitMode;
use crate::wire::SyncStrategy;
use gpu_ipc_driver::Context;

/// The `CpuSleep` strategy.
pub(crate) struct CpuSleep;

impl Strategy for CpuSleep {
    fn kind(&self) -> SyncStrategy {
        SyncStrategy::CpuSleep
    }

    fn check(&self, _cuda: Option<&Context>) -> Result<(), FrameError> {
        Ok(())
    }

    fn producer(&self, setup: Setup<'_>) -> Result<Box<dyn ProducerSide>, FrameError> {
        Ok(Box::new(CpuProducer::new(WaitMode::Sleep(setup.sleep_interval))))
    }

    fn consumer(&self, setup: Setup<'_>, _events: &[[u8; 64]]) -> Result<Box<dyn ConsumerSide>, FrameError> {
        Ok(Box::new(CpuConsumer::new(WaitMode::Sleep(setup.sleep_interval))))
    }
}
