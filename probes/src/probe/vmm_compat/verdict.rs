//! The pure part of the probe: what the pointer and device attributes predict for each cell, where the matrix
//! disagrees, whether the backends' own checks agree with it, and the one-sentence answer.

use gpu_ipc::core::driver::sys;

use super::model::{AllocationKind, Operation, Outcome, Results};
use crate::probe::Verdict;

/// A cell whose observation differs from what the attributes predicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misprediction {
    /// The row.
    pub allocation: AllocationKind,
    /// The column.
    pub operation: Operation,
    /// What the attributes said (true: it works).
    pub predicted: bool,
    /// The code observed.
    pub observed: String,
}

/// How well the attributes predicted the matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prediction {
    /// Cells both predicted and observed (not skipped).
    pub compared: usize,
    /// Of those, the ones predicted right.
    pub right: usize,
    /// The ones predicted wrong.
    pub mispredictions: Vec<Misprediction>,
}

/// A backend whose own check disagrees with the matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disagreement {
    /// `legacy` or `vmm`.
    pub backend: String,
    /// The allocation.
    pub allocation: AllocationKind,
    /// What the backend said.
    pub backend_accepted: bool,
    /// What the matrix observed for that backend's import between two processes.
    pub matrix_works: bool,
}

fn has(mask: Option<u64>, bit: sys::CUmemAllocationHandleType) -> Option<bool> {
    mask.map(|m| m & u64::from(bit) != 0)
}

fn and(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

/// What the recorded attributes predict for a cell: `Some(true)` works, `Some(false)` fails, `None` when they
/// say nothing (an attribute unknown, or an operation that does not apply).
///
/// The rules are the documented meaning of the attributes: `IS_LEGACY_CUDA_IPC_CAPABLE` for the legacy
/// operations, the `ALLOWED_HANDLE_TYPES` bits (and the device's handle-type support) for the fd, fabric and pool
/// exports, the device attributes for the allocations themselves and for IPC events.
pub fn predict(results: &Results, allocation: AllocationKind, operation: Operation) -> Option<bool> {
    let a = &results.attributes;
    let posix = u64::from(sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if operation == Operation::Allocate {
        return match allocation {
            AllocationKind::MemAlloc | AllocationKind::MemAllocSmallPair | AllocationKind::PinnedHost => Some(true),
            AllocationKind::AsyncDefaultPool => a.memory_pools,
            AllocationKind::AsyncFdPool => {
                and(a.memory_pools, a.mempool_handle_types.map(|m| u64::from(m) & posix != 0))
            }
            AllocationKind::VmmNoHandle => a.virtual_memory_management,
            AllocationKind::VmmPosixFd => and(a.virtual_memory_management, a.posix_fd_handles),
            AllocationKind::VmmFabric => and(a.virtual_memory_management, a.fabric_handles),
            AllocationKind::Managed => a.managed_memory,
        };
    }
    if operation == Operation::IpcEvent {
        return a.ipc_events;
    }
    let facts = results.facts(allocation)?;
    let allowed = facts.allowed_handle_types;
    match operation {
        Operation::LegacyExport | Operation::LegacyImport | Operation::LegacyOpenTwice => facts.legacy_ipc_capable,
        Operation::FdExport | Operation::FdImport | Operation::FdImportTwice => {
            and(has(allowed, sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), a.posix_fd_handles.or(Some(true)))
        }
        Operation::FabricExport | Operation::FabricImport => {
            and(has(allowed, sys::CU_MEM_HANDLE_TYPE_FABRIC), a.fabric_handles.or(Some(true)))
        }
        Operation::PoolExport | Operation::PoolExportPointer | Operation::PoolImport if allocation.is_pool() => {
            has(allowed, sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        }
        _ => None,
    }
}

/// Compares every observed cell with its prediction.
pub fn prediction(results: &Results) -> Prediction {
    let mut out = Prediction { compared: 0, right: 0, mispredictions: Vec::new() };
    for cell in &results.cells {
        if cell.observed.outcome == Outcome::NotRun {
            continue;
        }
        let Some(predicted) = predict(results, cell.allocation, cell.operation) else { continue };
        out.compared += 1;
        if predicted == (cell.observed.outcome == Outcome::Works) {
            out.right += 1;
        } else {
            out.mispredictions.push(Misprediction {
                allocation: cell.allocation,
                operation: cell.operation,
                predicted,
                observed: cell.observed.code.clone(),
            });
        }
    }
    out
}

/// True when the matrix saw `operation` work on `allocation` between two processes.
pub fn works(results: &Results, allocation: AllocationKind, operation: Operation) -> bool {
    results.cell(allocation, operation).is_some_and(|c| c.observed.outcome == Outcome::Works)
}

/// The backends' checks that disagree with the matrix: the legacy backend must accept exactly the allocations
/// whose legacy import worked, the vmm backend must accept exactly when the POSIX-fd VMM import worked.
pub fn disagreements(results: &Results) -> Vec<Disagreement> {
    results
        .backend_checks
        .iter()
        .filter_map(|check| {
            let operation = if check.backend == "legacy" { Operation::LegacyImport } else { Operation::FdImport };
            let matrix_works = works(results, check.allocation, operation);
            (matrix_works != check.accepted).then(|| Disagreement {
                backend: check.backend.clone(),
                allocation: check.allocation,
                backend_accepted: check.accepted,
                matrix_works,
            })
        })
        .collect()
}

fn kinds_where(results: &Results, operation: Operation) -> Vec<AllocationKind> {
    AllocationKind::ALL.into_iter().filter(|&k| works(results, k, operation)).collect()
}

fn list(kinds: &[AllocationKind]) -> String {
    if kinds.is_empty() {
        return "no allocation".to_owned();
    }
    kinds.iter().map(|k| k.label()).collect::<Vec<_>>().join(", ")
}

/// The answer: where each route worked, and how many cells the attributes predicted.
pub fn verdict(results: &Results) -> Verdict {
    let p = prediction(results);
    let legacy = kinds_where(results, Operation::LegacyImport);
    let fd = kinds_where(results, Operation::FdImport);
    let pool = kinds_where(results, Operation::PoolImport);
    let fabric = match results.cell(AllocationKind::VmmFabric, Operation::FabricImport) {
        Some(c) if c.observed.outcome == Outcome::Works => "fabric handles worked".to_owned(),
        _ => {
            let refusal = [Operation::Allocate, Operation::FabricExport, Operation::FabricImport]
                .into_iter()
                .filter_map(|op| results.cell(AllocationKind::VmmFabric, op))
                .find(|c| c.observed.outcome == Outcome::Fails)
                .map_or_else(|| "not tried".to_owned(), |c| format!("{} at {}", c.observed.code, c.operation.label()));
            format!("fabric handles did not ({refusal})")
        }
    };
    let disagree = disagreements(results);
    let backends = if results.backend_checks.is_empty() {
        String::new()
    } else if disagree.is_empty() {
        "; the backends' capability checks agree with the matrix".to_owned()
    } else {
        format!("; the backends' capability checks disagree with the matrix on {} allocation(s)", disagree.len())
    };
    let answer = format!(
        "Legacy IPC worked across processes on {}; a POSIX fd (cuMemExportToShareableHandle) on {}; pool export on \
         {}; {fabric}; the pointer and device attributes predicted {} of {} cells{backends}.",
        list(&legacy),
        list(&fd),
        list(&pool),
        p.right,
        p.compared,
    );
    let key_figure = format!(
        "attributes predicted {}/{} observed cells ({} misprediction(s)); backend checks: {}/{} agree",
        p.right,
        p.compared,
        p.mispredictions.len(),
        results.backend_checks.len() - disagree.len(),
        results.backend_checks.len(),
    );
    Verdict { answer, key_figure }
}
