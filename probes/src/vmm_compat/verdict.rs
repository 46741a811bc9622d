//! The pure part of the probe: what the pointer and device attributes predict for each cell, where the matrix
//! disagrees, whether the backends' own checks agree with it, and the one-sentence answer.

use gpu_ipc::BackendKind;
use gpu_ipc::driver::HandleTypes;

use super::model::{AllocationKind, CHILD_DIED, CHILD_TIMEOUT, Operation, Outcome, Results};
use harness::Verdict;

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
    pub backend: BackendKind,
    /// The allocation.
    pub allocation: AllocationKind,
    /// What the backend said.
    pub backend_accepted: bool,
    /// What the matrix observed for that backend's import between two processes.
    pub matrix_works: bool,
}

fn has(mask: Option<u64>, types: HandleTypes) -> Option<bool> {
    mask.map(|m| HandleTypes::from_bits(m).contains(types))
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
    let posix = HandleTypes::POSIX_FD.bits();
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
            and(has(allowed, HandleTypes::POSIX_FD), a.posix_fd_handles.or(Some(true)))
        }
        Operation::FabricExport | Operation::FabricImport => {
            and(has(allowed, HandleTypes::FABRIC), a.fabric_handles.or(Some(true)))
        }
        Operation::PoolExport | Operation::PoolExportPointer | Operation::PoolImport if allocation.is_pool() => {
            has(allowed, HandleTypes::POSIX_FD)
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

/// The export and import columns a backend's check stands for.
fn backend_route(backend: BackendKind) -> (Operation, Operation) {
    if backend == BackendKind::Legacy {
        (Operation::LegacyExport, Operation::LegacyImport)
    } else {
        (Operation::FdExport, Operation::FdImport)
    }
}

/// What the matrix says about a backend's route on an allocation: `Some(true)` when the export and the import
/// between two processes worked, `Some(false)` when the export failed or the import failed with a CUDA result or
/// a data mismatch, `None` when it cannot say: the cells did not run (no second process, an earlier step failed),
/// or the importing child died or hung, which is a failure of the probe's process, not of the route.
pub fn matrix_says(results: &Results, backend: BackendKind, allocation: AllocationKind) -> Option<bool> {
    let (export, import) = backend_route(backend);
    match results.cell(allocation, export)?.observed.outcome {
        Outcome::Fails => return Some(false),
        Outcome::NotRun => return None,
        Outcome::Works => {}
    }
    let import = &results.cell(allocation, import)?.observed;
    match import.outcome {
        Outcome::Works => Some(true),
        Outcome::Fails if import.code == CHILD_DIED || import.code == CHILD_TIMEOUT => None,
        Outcome::Fails => Some(false),
        Outcome::NotRun => None,
    }
}

/// How the backends' checks compare with the matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendAgreement {
    /// Checks the matrix could judge.
    pub compared: usize,
    /// Checks it could not (see [`matrix_says`]).
    pub not_comparable: usize,
    /// The compared checks that disagree.
    pub disagreements: Vec<Disagreement>,
}

/// Compares every backend check the matrix can judge: the legacy backend must accept exactly the allocations
/// whose legacy export and import worked, the vmm backend exactly when the POSIX-fd VMM export and import did.
pub fn backend_agreement(results: &Results) -> BackendAgreement {
    let mut out = BackendAgreement { compared: 0, not_comparable: 0, disagreements: Vec::new() };
    for check in &results.backend_checks {
        let Some(matrix_works) = matrix_says(results, check.backend, check.allocation) else {
            out.not_comparable += 1;
            continue;
        };
        out.compared += 1;
        if matrix_works != check.accepted {
            out.disagreements.push(Disagreement {
                backend: check.backend,
                allocation: check.allocation,
                backend_accepted: check.accepted,
                matrix_works,
            });
        }
    }
    out
}

/// The backends' checks that disagree with what the matrix could judge.
pub fn disagreements(results: &Results) -> Vec<Disagreement> {
    backend_agreement(results).disagreements
}

fn kinds_where(results: &Results, operation: Operation) -> Vec<AllocationKind> {
    AllocationKind::ALL.into_iter().filter(|&k| works(results, k, operation)).collect()
}

fn list(kinds: &[AllocationKind]) -> String {
    kinds.iter().map(|k| k.label()).collect::<Vec<_>>().join(", ")
}

/// The distinct codes of `operation`'s failed cells on `kinds`, short.
fn failure_codes(results: &Results, kinds: &[AllocationKind], operation: Operation) -> String {
    let mut codes: Vec<String> = Vec::new();
    for &kind in kinds {
        if let Some(c) = results.cell(kind, operation).filter(|c| c.observed.outcome == Outcome::Fails) {
            let code = c.observed.code.strip_prefix("CUDA_ERROR_").unwrap_or(&c.observed.code).to_owned();
            if !codes.contains(&code) {
                codes.push(code);
            }
        }
    }
    codes.join("/")
}

/// One route's clause: where its import worked between two processes, and, honestly, where it was exported but
/// the import failed or did not run, or that every export was refused, or that it was not tried.
pub fn route(results: &Results, subject: &str, exports: &[Operation], import: Operation) -> String {
    let exported: Vec<AllocationKind> =
        AllocationKind::ALL.into_iter().filter(|&k| exports.iter().all(|&op| works(results, k, op))).collect();
    let worked = kinds_where(results, import);
    let failed: Vec<AllocationKind> = exported
        .iter()
        .copied()
        .filter(|&k| results.cell(k, import).is_some_and(|c| c.observed.outcome == Outcome::Fails))
        .collect();
    if !worked.is_empty() {
        let mut clause = format!("{subject} worked across processes on {}", list(&worked));
        if !failed.is_empty() {
            clause.push_str(&format!(
                " (exported but not imported on {}: {})",
                list(&failed),
                failure_codes(results, &failed, import)
            ));
        }
        return clause;
    }
    if !failed.is_empty() {
        return format!(
            "{subject} was exported from {} but the import in another process failed ({})",
            list(&exported),
            failure_codes(results, &failed, import)
        );
    }
    if !exported.is_empty() {
        return format!("{subject} was exported from {}, but no import in another process ran", list(&exported));
    }
    let tried = AllocationKind::ALL
        .into_iter()
        .any(|k| exports.iter().any(|&op| results.cell(k, op).is_some_and(|c| c.observed.outcome == Outcome::Fails)));
    if tried { format!("{subject} was refused on every allocation tried") } else { format!("{subject} was not tried") }
}

/// The answer: where each route worked, and how many cells the attributes predicted.
pub fn verdict(results: &Results) -> Verdict {
    let p = prediction(results);
    let legacy = route(results, "Legacy IPC", &[Operation::LegacyExport], Operation::LegacyImport);
    let fd = route(results, "a POSIX fd (cuMemExportToShareableHandle)", &[Operation::FdExport], Operation::FdImport);
    let pool =
        route(results, "pool export", &[Operation::PoolExport, Operation::PoolExportPointer], Operation::PoolImport);
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
    let agreement = backend_agreement(results);
    let disagree = agreement.disagreements.len();
    let backends = if results.backend_checks.is_empty() {
        String::new()
    } else if agreement.compared == 0 {
        "; the backends' capability checks could not be compared with the matrix (no import between two processes \
         ran)"
            .to_owned()
    } else if disagree == 0 {
        "; the backends' capability checks agree with the matrix".to_owned()
    } else {
        format!("; the backends' capability checks disagree with the matrix on {disagree} allocation(s)")
    };
    let answer = format!(
        "{legacy}; {fd}; {pool}; {fabric}; the pointer and device attributes predicted {} of {} cells{backends}.",
        p.right, p.compared,
    );
    let not_compared = if agreement.not_comparable == 0 {
        String::new()
    } else {
        format!(", {} not comparable", agreement.not_comparable)
    };
    let key_figure = format!(
        "attributes predicted {}/{} observed cells ({} misprediction(s)); backend checks: {}/{} agree{not_compared}",
        p.right,
        p.compared,
        p.mispredictions.len(),
        agreement.compared - disagree,
        agreement.compared,
    );
    Verdict { answer, key_figure }
}
