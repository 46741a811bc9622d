//! Python exceptions that mirror the core's [`FrameError`], one class per variant, with the core's message text.
//!
//! The classes are defined in Python (`gpu_ipc/_errors.py`) and imported here (`import_exception!`): an argument
//! error derives from both `GpuIpcError` and `ValueError` (`ArgumentError`) or `TypeError` (`ArgumentTypeError`),
//! and their metaclass keeps `help()` to each class's own text. Every class derives from `gpu_ipc.GpuIpcError`. The wrapped layers (`BackendError`, `DriverError`,
//! `RingError`, `WireError`) get one class each, with `NoDriver` and `NoProducer` below them for the two a user acts
//! on. `ReleasedError` and `ClosedError` are this package's own: a frame or slot used after it went back to the
//! ring, or a producer or consumer used after `close()`.

use gpu_ipc::core::backend::BackendError as CoreBackendError;
use gpu_ipc::core::frames::FrameError;
use gpu_ipc::core::wire::WireError as CoreWireError;
use gpu_ipc::driver::DriverError as CoreDriverError;
use gpu_ipc::pool::PoolError;
use gpu_ipc::semaphore::SemaphoreError;
use gpu_ipc::toolkit::door::DoorError;
use gpu_ipc::weights::WeightsError;
use pyo3::prelude::*;
use pyo3::{PyErr, import_exception};

import_exception!(gpu_ipc._errors, GpuIpcError);
import_exception!(gpu_ipc._errors, ArgumentError);
import_exception!(gpu_ipc._errors, ArgumentTypeError);
import_exception!(gpu_ipc._errors, ProducerGone);
import_exception!(gpu_ipc._errors, PeerGone);
import_exception!(gpu_ipc._errors, Evicted);
import_exception!(gpu_ipc._errors, Timeout);
import_exception!(gpu_ipc._errors, GpuWaitGaveUp);
import_exception!(gpu_ipc._errors, AdmissionError);
import_exception!(gpu_ipc._errors, EndOfStream);
import_exception!(gpu_ipc._errors, ForeignToken);
import_exception!(gpu_ipc._errors, ConfigError);
import_exception!(gpu_ipc._errors, StrategyUnavailable);
import_exception!(gpu_ipc._errors, Refused);
import_exception!(gpu_ipc._errors, BackendError);
import_exception!(gpu_ipc._errors, DriverError);
import_exception!(gpu_ipc._errors, NoDriver);
import_exception!(gpu_ipc._errors, RingError);
import_exception!(gpu_ipc._errors, WireError);
import_exception!(gpu_ipc._errors, NoProducer);
import_exception!(gpu_ipc._errors, ReleasedError);
import_exception!(gpu_ipc._errors, ClosedError);
import_exception!(gpu_ipc._errors, NoOwner);
import_exception!(gpu_ipc._errors, OwnerGone);
import_exception!(gpu_ipc._errors, PosterDied);
import_exception!(gpu_ipc._errors, SemaphoreClosed);
import_exception!(gpu_ipc._errors, NotFound);
import_exception!(gpu_ipc._errors, StaleBuffer);
import_exception!(gpu_ipc._errors, NameTaken);
import_exception!(gpu_ipc._errors, PoolFull);

/// Adds every exception class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("GpuIpcError", py.get_type::<GpuIpcError>())?;
    m.add("ArgumentError", py.get_type::<ArgumentError>())?;
    m.add("ArgumentTypeError", py.get_type::<ArgumentTypeError>())?;
    m.add("ProducerGone", py.get_type::<ProducerGone>())?;
    m.add("PeerGone", py.get_type::<PeerGone>())?;
    m.add("Evicted", py.get_type::<Evicted>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("GpuWaitGaveUp", py.get_type::<GpuWaitGaveUp>())?;
    m.add("AdmissionError", py.get_type::<AdmissionError>())?;
    m.add("EndOfStream", py.get_type::<EndOfStream>())?;
    m.add("ForeignToken", py.get_type::<ForeignToken>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("StrategyUnavailable", py.get_type::<StrategyUnavailable>())?;
    m.add("Refused", py.get_type::<Refused>())?;
    m.add("BackendError", py.get_type::<BackendError>())?;
    m.add("DriverError", py.get_type::<DriverError>())?;
    m.add("NoDriver", py.get_type::<NoDriver>())?;
    m.add("RingError", py.get_type::<RingError>())?;
    m.add("WireError", py.get_type::<WireError>())?;
    m.add("NoProducer", py.get_type::<NoProducer>())?;
    m.add("ReleasedError", py.get_type::<ReleasedError>())?;
    m.add("ClosedError", py.get_type::<ClosedError>())?;
    m.add("NoOwner", py.get_type::<NoOwner>())?;
    m.add("OwnerGone", py.get_type::<OwnerGone>())?;
    m.add("PosterDied", py.get_type::<PosterDied>())?;
    m.add("SemaphoreClosed", py.get_type::<SemaphoreClosed>())?;
    m.add("NotFound", py.get_type::<NotFound>())?;
    m.add("StaleBuffer", py.get_type::<StaleBuffer>())?;
    m.add("NameTaken", py.get_type::<NameTaken>())?;
    m.add("PoolFull", py.get_type::<PoolFull>())?;
    Ok(())
}

/// What `CUDA_ERROR_NOT_INITIALIZED` means most often from Python: a forked child of a process that used CUDA.
const FORKED_CHILD_HINT: &str = " (a child forked from a process that used CUDA cannot use it: start the child as a \
    new process instead, multiprocessing.get_context(\"spawn\") or \"forkserver\", or subprocess)";

/// Whether `e` is the driver's `CUDA_ERROR_NOT_INITIALIZED` (3).
fn is_not_initialized(e: &CoreDriverError) -> bool {
    matches!(e, CoreDriverError::Call { code: 3, .. })
}

fn is_no_driver(e: &CoreDriverError) -> bool {
    matches!(e, CoreDriverError::LibraryNotFound { .. })
}

/// The Python exception for `e`, with the core's message and, where the variant has them, its fields as
/// attributes (`EndOfStream.published`, `.past_end`; `Timeout.what`, `.waited` in seconds; `ProducerGone.pid`;
/// `Evicted.consumer`).
pub fn to_py(e: FrameError) -> PyErr {
    let mut message = e.to_string();
    if let FrameError::Backend(CoreBackendError::Driver(d)) | FrameError::Driver(d) = &e
        && is_not_initialized(d)
    {
        message.push_str(FORKED_CHILD_HINT);
    }
    let attrs: Vec<(&str, Attr)> = match &e {
        FrameError::EndOfStream { published, past_end } => {
            vec![("published", Attr::Int(*published)), ("past_end", Attr::OptInt(*past_end))]
        }
        FrameError::Timeout { what, waited } => {
            vec![("what", Attr::Str(what.clone())), ("waited", Attr::Float(waited.as_secs_f64()))]
        }
        FrameError::ProducerGone { pid, .. } => vec![("pid", Attr::Int(u64::from(*pid)))],
        FrameError::Evicted { consumer } => vec![("consumer", Attr::Int(u64::from(*consumer)))],
        _ => Vec::new(),
    };
    let err = match &e {
        FrameError::ProducerGone { .. } => ProducerGone::new_err(message),
        FrameError::PeerGone => PeerGone::new_err(message),
        FrameError::Evicted { .. } => Evicted::new_err(message),
        FrameError::Timeout { .. } => Timeout::new_err(message),
        FrameError::GpuWaitGaveUp { .. } => GpuWaitGaveUp::new_err(message),
        FrameError::Admission(_) => AdmissionError::new_err(message),
        FrameError::EndOfStream { .. } => EndOfStream::new_err(message),
        FrameError::ForeignToken { .. } => ForeignToken::new_err(message),
        FrameError::Config(_) => ConfigError::new_err(message),
        FrameError::StrategyUnavailable { .. } => StrategyUnavailable::new_err(message),
        FrameError::Refused(_) => Refused::new_err(message),
        FrameError::Backend(CoreBackendError::Driver(d)) | FrameError::Driver(d) if is_no_driver(d) => {
            NoDriver::new_err(message)
        }
        FrameError::Backend(_) => BackendError::new_err(message),
        FrameError::Driver(_) => DriverError::new_err(message),
        FrameError::Ring(_) => RingError::new_err(message),
        FrameError::Wire(CoreWireError::NoProducer { .. }) => NoProducer::new_err(message),
        FrameError::Wire(CoreWireError::Refused { .. }) => Refused::new_err(message),
        FrameError::Wire(CoreWireError::Timeout { .. }) => Timeout::new_err(message),
        FrameError::Wire(_) => WireError::new_err(message),
        _ => GpuIpcError::new_err(message),
    };
    with_attrs(err, attrs)
}

/// `err` with `attrs` set on the exception value.
fn with_attrs(err: PyErr, attrs: Vec<(&str, Attr)>) -> PyErr {
    if !attrs.is_empty() {
        Python::attach(|py| {
            let value = err.value(py);
            for (name, attr) in attrs {
                let _ = match attr {
                    Attr::Int(v) => value.setattr(name, v),
                    Attr::OptInt(v) => value.setattr(name, v),
                    Attr::Float(v) => value.setattr(name, v),
                    Attr::Str(v) => value.setattr(name, v),
                };
            }
        });
    }
    err
}

/// The Python exception for a semaphore's error, with the core's message: `PosterDied` (`.pid`, `.record`),
/// `OwnerGone`, `SemaphoreClosed`, `Timeout` (`.what`, `.waited`), `NoOwner` and `Refused` from its door,
/// `StrategyUnavailable` (no 64-bit stream memory operations), `ValueError` for a post count out of range,
/// `ConfigError` for a misuse (a pure waiter posting, a stream of another context, too many stream waits).
pub fn semaphore_to_py(e: SemaphoreError) -> PyErr {
    let message = e.to_string();
    match e {
        SemaphoreError::PosterDied { pid, record } => with_attrs(
            PosterDied::new_err(message),
            vec![("pid", Attr::OptInt(pid.0.map(u64::from))), ("record", Attr::Int(u64::from(record)))],
        ),
        SemaphoreError::OwnerGone { .. } => OwnerGone::new_err(message),
        SemaphoreError::Closed => SemaphoreClosed::new_err(message),
        SemaphoreError::Timeout { waited } => with_attrs(
            Timeout::new_err(message),
            vec![("what", Attr::Str("a post".into())), ("waited", Attr::Float(waited.as_secs_f64()))],
        ),
        SemaphoreError::InvalidPost { .. } => ArgumentError::new_err(message),
        SemaphoreError::NoStreamMemOps => StrategyUnavailable::new_err(message),
        SemaphoreError::Door(door) => door_to_py(door),
        SemaphoreError::Driver(d) => to_py(FrameError::Driver(d)),
        SemaphoreError::NotAPoster
        | SemaphoreError::NoCudaContext
        | SemaphoreError::WrongContext
        | SemaphoreError::TooManyStreamWaits { .. }
        | SemaphoreError::Full { .. } => ConfigError::new_err(message),
        _ => GpuIpcError::new_err(message),
    }
}

/// The Python exception for a pool's error, with the core's message: `NotFound`, `StaleBuffer` (`.name`,
/// `.held_generation`, `.current`), `NameTaken`, `PoolFull`, `OwnerGone`, `Timeout`, `BackendError` (memory this
/// backend cannot share, with what to do instead; a pool on another GPU), `NoOwner` and `Refused` from its door,
/// `ValueError` for an invalid name, request or configuration.
pub fn pool_to_py(e: PoolError) -> PyErr {
    let message = e.to_string();
    match e {
        PoolError::NotFound { name } => with_attrs(NotFound::new_err(message), vec![("name", Attr::Str(name))]),
        PoolError::StaleBuffer { name, held_generation, current } => with_attrs(
            StaleBuffer::new_err(message),
            vec![
                ("name", Attr::Str(name)),
                ("held_generation", Attr::Int(held_generation)),
                ("current", Attr::OptInt(current)),
            ],
        ),
        PoolError::NameTaken { .. } => NameTaken::new_err(message),
        PoolError::OutOfMemory { .. } | PoolError::DirectoryFull { .. } | PoolError::TooManyAllocations { .. } => {
            PoolFull::new_err(message)
        }
        PoolError::OwnerGone { .. } => OwnerGone::new_err(message),
        PoolError::Timeout { what, waited } => with_attrs(
            Timeout::new_err(message),
            vec![("what", Attr::Str(what.into())), ("waited", Attr::Float(waited.as_secs_f64()))],
        ),
        PoolError::Backend(_) | PoolError::WrongDevice { .. } => BackendError::new_err(message),
        PoolError::Door(door) => door_to_py(door),
        PoolError::InvalidName { .. } | PoolError::InvalidRequest { .. } | PoolError::Config(_) => {
            ArgumentError::new_err(message)
        }
        PoolError::Wire(_) | PoolError::Protocol { .. } => WireError::new_err(message),
        _ => GpuIpcError::new_err(message),
    }
}

/// The Python exception for a weight set's error: `OwnerGone`, `Timeout`, `NotFound` (no such set or tensor),
/// `WireError` (a manifest refused), `ArgumentError`, the pool's otherwise.
pub fn weights_to_py(e: WeightsError) -> PyErr {
    let message = e.to_string();
    match e {
        WeightsError::Pool(pool) => pool_to_py(pool),
        WeightsError::ArenasHeld { .. } => PoolFull::new_err(message),
        WeightsError::OwnerGone { .. } => OwnerGone::new_err(message),
        WeightsError::Timeout { waited, .. } => with_attrs(
            Timeout::new_err(message),
            vec![("what", Attr::Str("a generation".into())), ("waited", Attr::Float(waited.as_secs_f64()))],
        ),
        WeightsError::NoSuchSet { .. } | WeightsError::UnknownTensor { .. } => NotFound::new_err(message),
        WeightsError::Manifest { .. } => WireError::new_err(message),
        WeightsError::Mismatch { .. } | WeightsError::Invalid(_) => ArgumentError::new_err(message),
        _ => GpuIpcError::new_err(message),
    }
}

/// The Python exception for a shared object's door (attaching to a semaphore or a pool).
pub fn door_to_py(e: DoorError) -> PyErr {
    let message = e.to_string();
    match e {
        DoorError::NoOwner { .. } => NoOwner::new_err(message),
        DoorError::Refused { .. } => Refused::new_err(message),
        DoorError::Wire(CoreWireError::Timeout { .. }) => Timeout::new_err(message),
        _ => WireError::new_err(message),
    }
}

/// A value set as an attribute on an exception.
enum Attr {
    Int(u64),
    OptInt(Option<u64>),
    Float(f64),
    Str(String),
}

/// The Python exception for a driver error outside the frame API (streams, events of this package).
pub fn driver_to_py(e: CoreDriverError) -> PyErr {
    to_py(FrameError::Driver(e))
}
