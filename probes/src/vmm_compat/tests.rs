//! Tests of `mod.rs` (kept apart so that the module reads in one screenful more).

use super::model::{AllocationKind, Attempt, Operation, Outcome};
use super::verdict::{disagreements, predict, prediction};
use super::*;
use gpu_ipc::BackendKind;

/// Test data: the first H100 run (driver 580, CUDA 13.0) with the four cells its read-back bug spoiled set to
/// what the rest of the run shows (see `testdata/README.md`): legacy IPC only on `cuMemAlloc` memory,
/// `cuIpcGetMemHandle` on everything else `CUDA_ERROR_INVALID_VALUE`, fds only for POSIX-fd `cuMemCreate`
/// memory, pool export only from the POSIX-fd pool, a fabric `cuMemCreate` refused without IMEX.
const CORRECTED: &str = include_str!("testdata/h100-run2-corrected.json");
/// Test data: that run verbatim, with the four spurious `DATA_MISMATCH` cells.
const RECORDED: &str = include_str!("testdata/h100-run2-recorded.json");

fn load(json: &str) -> MeasurementOutput<Results> {
    let mut output: MeasurementOutput<Results> = serde_json::from_str(json).unwrap();
    output.verdict = verdict::verdict(&output.results);
    output
}

fn documented() -> MeasurementOutput<Results> {
    load(CORRECTED)
}

fn set(results: &mut Results, allocation: AllocationKind, operation: Operation, observed: Attempt) {
    let cell = results.cells.iter_mut().find(|c| c.allocation == allocation && c.operation == operation).unwrap();
    cell.observed = observed;
}

#[test]
fn the_recorded_matrix_is_complete() {
    let r = documented().results;
    for kind in AllocationKind::ALL {
        for op in Operation::ALL {
            assert!(r.cell(kind, op).is_some(), "{kind:?} / {op:?} missing");
        }
    }
    assert_eq!(r.cells.len(), AllocationKind::ALL.len() * Operation::ALL.len());
}

#[test]
fn attributes_predict_all_but_the_fabric_allocation_and_the_pool_fd() {
    let r = documented().results;
    let p = prediction(&r);
    let wrong: Vec<_> = p.mispredictions.iter().map(|m| (m.allocation, m.operation)).collect();
    assert_eq!(
        wrong,
        vec![(AllocationKind::AsyncFdPool, Operation::FdExport), (AllocationKind::VmmFabric, Operation::Allocate)]
    );
    assert_eq!(p.compared - p.right, 2);
    // 9 allocations, 3 export columns on 8 rows, 4 pool exports, 7 imports that ran, 8 events.
    assert_eq!(p.compared, 52, "{p:?}");
    assert_eq!(p.mispredictions[1].observed, "CUDA_ERROR_NOT_PERMITTED");
    assert!(p.mispredictions[1].predicted, "the device says fabric handles are supported");
    // Skipped and not-applicable cells are neither predicted nor counted.
    assert_eq!(predict(&r, AllocationKind::MemAlloc, Operation::PoolImport), None);
    assert_eq!(predict(&r, AllocationKind::VmmFabric, Operation::FdExport), None);
}

#[test]
fn the_backends_capability_checks_agree_with_the_recorded_matrix() {
    let r = documented().results;
    assert_eq!(disagreements(&r), Vec::new());
    let legacy: Vec<_> = r
        .backend_checks
        .iter()
        .filter(|c| c.backend == BackendKind::Legacy && c.accepted)
        .map(|c| c.allocation)
        .collect();
    assert_eq!(legacy, vec![AllocationKind::MemAlloc, AllocationKind::MemAllocSmallPair]);
    assert!(r.backend_checks.iter().any(|c| c.backend == BackendKind::Vmm && c.accepted));
}

#[test]
fn a_backend_that_accepts_what_the_matrix_saw_fail_is_a_disagreement() {
    let mut r = documented().results;
    set(&mut r, AllocationKind::MemAlloc, Operation::LegacyImport, Attempt::fails("CUDA_ERROR_INVALID_VALUE", ""));
    set(&mut r, AllocationKind::VmmPosixFd, Operation::FdImport, Attempt::fails("DATA_MISMATCH", ""));
    let d = disagreements(&r);
    assert_eq!(d.len(), 2);
    assert_eq!((d[0].backend, d[0].allocation), (BackendKind::Legacy, AllocationKind::MemAlloc));
    assert!(d[0].backend_accepted && !d[0].matrix_works);
    assert_eq!(d[1].backend, BackendKind::Vmm);
    assert!(verdict::verdict(&r).answer.contains("disagree with the matrix on 2 allocation(s)"));
}

#[test]
fn a_child_that_died_or_an_import_not_run_is_not_a_backend_disagreement() {
    use super::verdict::{backend_agreement, matrix_says};
    let mut r = documented().results;
    set(&mut r, AllocationKind::MemAlloc, Operation::LegacyImport, Attempt::fails("CHILD_DIED", "killed"));
    set(&mut r, AllocationKind::VmmPosixFd, Operation::FdImport, Attempt::not_run("no second process"));
    assert_eq!(matrix_says(&r, BackendKind::Legacy, AllocationKind::MemAlloc), None);
    assert_eq!(matrix_says(&r, BackendKind::Vmm, AllocationKind::VmmPosixFd), None);
    // A refused export is a judgement even without an import.
    assert_eq!(matrix_says(&r, BackendKind::Legacy, AllocationKind::Managed), Some(false));
    let a = backend_agreement(&r);
    assert_eq!((a.compared, a.not_comparable, a.disagreements.len()), (7, 2, 0));
    let v = verdict::verdict(&r);
    assert!(v.answer.ends_with("the backends' capability checks agree with the matrix."), "{}", v.answer);
    assert!(v.key_figure.ends_with("backend checks: 7/7 agree, 2 not comparable"), "{}", v.key_figure);
}

/// The first GPU run, as recorded: four imports read `DATA_MISMATCH` although their exports and the
/// importer's own reads worked. The verdict must say exactly that, never "no allocation".
#[test]
fn the_recorded_run_is_described_as_it_was() {
    let output = load(RECORDED);
    let v = &output.verdict;
    assert!(!v.answer.contains("no allocation"), "{}", v.answer);
    assert!(
        v.answer.starts_with(
            "Legacy IPC was exported from cuMemAlloc 2 MiB, 2 x cuMemAlloc 4 KiB but the import in another \
             process failed (DATA_MISMATCH); a POSIX fd (cuMemExportToShareableHandle) was exported from \
             cuMemCreate, POSIX_FD but the import in another process failed (DATA_MISMATCH); pool export was \
             exported from cuMemAllocFromPoolAsync, POSIX-fd pool but the import in another process failed \
             (DATA_MISMATCH); fabric handles did not (CUDA_ERROR_NOT_PERMITTED at allocate)"
        ),
        "{}",
        v.answer
    );
    // What the record says is what the verdict counts: the four mismatches are mispredictions, and the
    // backends that accept those routes disagree with it.
    assert!(v.answer.contains("predicted 46 of 52 cells"), "{}", v.answer);
    assert!(v.answer.contains("disagree with the matrix on 3 allocation(s)"), "{}", v.answer);
    // Everything but those four cells is the corrected test data.
    let corrected = documented().results;
    let differ: Vec<_> = output
        .results
        .cells
        .iter()
        .filter(|c| corrected.cell(c.allocation, c.operation) != Some(*c))
        .map(|c| (c.allocation, c.operation, c.observed.code.as_str()))
        .collect();
    assert_eq!(
        differ,
        vec![
            (AllocationKind::MemAlloc, Operation::LegacyImport, "DATA_MISMATCH"),
            (AllocationKind::MemAllocSmallPair, Operation::LegacyImport, "DATA_MISMATCH"),
            (AllocationKind::AsyncFdPool, Operation::PoolImport, "DATA_MISMATCH"),
            (AllocationKind::VmmPosixFd, Operation::FdImport, "DATA_MISMATCH"),
        ]
    );
    let text = render_text(&output);
    assert!(text.contains("legacy import        DATA_MISMATCH (mispredicted)"), "{text}");
}

#[test]
fn a_route_that_works_on_some_allocations_names_the_others() {
    let mut r = documented().results;
    set(&mut r, AllocationKind::MemAllocSmallPair, Operation::LegacyImport, Attempt::fails("DATA_MISMATCH", ""));
    let v = verdict::verdict(&r);
    assert!(
        v.answer.starts_with(
            "Legacy IPC worked across processes on cuMemAlloc 2 MiB (exported but not imported on 2 x \
             cuMemAlloc 4 KiB: DATA_MISMATCH);"
        ),
        "{}",
        v.answer
    );
    // Exports that all failed, and exports whose imports never ran, are said as such.
    let mut r = documented().results;
    for kind in [AllocationKind::MemAlloc, AllocationKind::MemAllocSmallPair] {
        set(&mut r, kind, Operation::LegacyImport, Attempt::not_run("no second process in this run"));
    }
    set(&mut r, AllocationKind::VmmPosixFd, Operation::FdExport, Attempt::fails("CUDA_ERROR_INVALID_VALUE", ""));
    set(&mut r, AllocationKind::VmmPosixFd, Operation::FdImport, Attempt::not_run("the fd export failed"));
    let v = verdict::verdict(&r);
    assert!(
        v.answer.starts_with(
            "Legacy IPC was exported from cuMemAlloc 2 MiB, 2 x cuMemAlloc 4 KiB, but no import in another \
             process ran; a POSIX fd (cuMemExportToShareableHandle) was refused on every allocation tried;"
        ),
        "{}",
        v.answer
    );
}

#[test]
fn verdict_names_the_routes_and_the_prediction_count() {
    let v = documented().verdict;
    assert!(
        v.answer.starts_with(
            "Legacy IPC worked across processes on cuMemAlloc 2 MiB, 2 x cuMemAlloc 4 KiB; a POSIX fd \
             (cuMemExportToShareableHandle) worked across processes on cuMemCreate, POSIX_FD; pool export \
             worked across processes on cuMemAllocFromPoolAsync, POSIX-fd pool; fabric handles did not \
             (CUDA_ERROR_NOT_PERMITTED at allocate)"
        ),
        "{}",
        v.answer
    );
    assert!(v.answer.contains("predicted 50 of 52 cells"), "{}", v.answer);
    assert!(v.answer.ends_with("the backends' capability checks agree with the matrix."), "{}", v.answer);
    assert_eq!(
        v.key_figure,
        "attributes predicted 50/52 observed cells (2 misprediction(s)); backend checks: 9/9 agree"
    );
}

#[test]
fn a_data_mismatch_counts_as_a_failure_not_a_success() {
    let mut r = documented().results;
    let mut mismatch = Attempt::fails("DATA_MISMATCH", "the importer did not read the exporter's pattern");
    mismatch.code = "CUDA_SUCCESS".to_owned();
    set(&mut r, AllocationKind::MemAllocSmallPair, Operation::LegacyImport, mismatch);
    let p = prediction(&r);
    assert!(p.mispredictions.iter().any(|m| m.allocation == AllocationKind::MemAllocSmallPair));
    assert!(!verdict::works(&r, AllocationKind::MemAllocSmallPair, Operation::LegacyImport));
}

#[test]
fn an_empty_matrix_still_renders() {
    let mut output = documented();
    output.results = Results::default();
    output.verdict = verdict::verdict(&output.results);
    assert!(output.verdict.answer.starts_with("Legacy IPC was not tried;"), "{}", output.verdict.answer);
    assert!(!output.verdict.answer.contains("no allocation"), "{}", output.verdict.answer);
    assert!(output.verdict.answer.contains("predicted 0 of 0 cells"));
    let text = render_text(&output);
    assert!(text.contains("cuMemAlloc 2 MiB"));
}

#[test]
fn text_shows_codes_controls_and_mispredictions() {
    let text = render_text(&documented());
    assert!(text.contains("cuMemAlloc 2 MiB: legacy IPC capable yes, allowed handle types none"), "{text}");
    assert!(text.contains("cuMemCreate, POSIX_FD: legacy IPC capable no, allowed handle types POSIX_FD"), "{text}");
    let line = text.lines().find(|l| l.trim_start().starts_with("legacy import") && l.contains("INVALID_CONTEXT"));
    assert!(line.is_some_and(|l| l.contains("ok") && l.contains("[same process: INVALID_CONTEXT]")), "{text}");
    assert!(text.contains("allocate             NOT_PERMITTED (mispredicted)"), "{text}");
    assert!(text.contains("cuIpcGetMemHandle    INVALID_VALUE"), "{text}");
    // Not-applicable cells are left out of the text.
    assert!(!text.contains("NOT_APPLICABLE"), "{text}");
    assert!(text.contains("two 4 KiB cuMemAllocs: handles equal no, same block no"), "{text}");
}

#[test]
fn report_section_has_the_question_the_matrix_and_the_method() {
    let output = documented();
    let mut plots = Plots::default();
    let section = report_section(Some(&output), None, &mut plots);
    assert_eq!(section.probe, "vmm-compat");
    assert_eq!(section.question, "What can be shared how?");
    assert!(section.answer.contains("50/52"), "{}", section.answer);
    assert!(section.body.contains("| allocation | legacy capable | allowed types | allocate | cuIpcGetMemHandle |"));
    assert!(
        section.body.contains("| cuMemAlloc 2 MiB | yes | none | ok | ok | ok / INVALID_CONTEXT |"),
        "{}",
        section.body
    );
    assert!(section.body.contains("**NOT_PERMITTED** (mispredicted)"), "{}", section.body);
    assert!(section.body.contains("predicted 50 of 52 observed cells"));
    assert!(section.body.contains("agree with the matrix on 9 of 9"));
    assert!(section.body.contains("**Method.**"));
    assert!(plots.charts.is_empty());
    assert_eq!(report_section(None, None, &mut plots), ReportSection::missing("vmm-compat"));
}

#[test]
fn report_lists_cells_that_differ_under_mps() {
    let output = documented();
    let mut under_mps = output.clone();
    set(
        &mut under_mps.results,
        AllocationKind::Managed,
        Operation::IpcEvent,
        Attempt::fails("CUDA_ERROR_NOT_SUPPORTED", ""),
    );
    let section = report_section(Some(&output), Some(&under_mps), &mut Plots::default());
    assert!(section.body.contains("1 cell(s) differ under MPS"), "{}", section.body);
    assert!(
        section.body.contains("managed (cuMemAllocManaged) / IPC event beside: ok without MPS, NOT_SUPPORTED with")
    );
    let same = report_section(Some(&output), Some(&output), &mut Plots::default());
    assert!(same.body.contains("The matrix under MPS is identical."));
}

#[test]
fn results_survive_a_json_round_trip() {
    let output = documented();
    let json = serde_json::to_string(&output).unwrap();
    let back: MeasurementOutput<Results> = serde_json::from_str(&json).unwrap();
    assert_eq!(back.results, output.results);
    assert_eq!(back.verdict, output.verdict);
    assert!(json.contains("\"operation\":\"legacy-open-twice\""));
    assert!(json.contains("\"outcome\":\"not-run\""));
}

#[test]
fn requests_and_replies_cross_as_json() {
    use super::importer::{ChildMessage, ImportReply, ImportRequest, Pattern, Step, pattern_words};
    let request = ImportRequest::Pool {
        pointer: vec![7; 64],
        pattern: Pattern { expect: 1, write: 2, words: 1024 },
        exporter_ptr: None,
    };
    let json = serde_json::to_string(&request).unwrap();
    assert!(json.starts_with("{\"request\":\"pool\""), "{json}");
    assert_eq!(serde_json::from_str::<ImportRequest>(&json).unwrap(), request);
    assert_eq!(serde_json::from_str::<ImportRequest>("{\"request\":\"done\"}").unwrap(), ImportRequest::Done);
    let reply = ChildMessage::Reply(ImportReply {
        steps: vec![Step { code: "CUDA_SUCCESS".into(), call: String::new(), read_ok: Some(true), address: Some(1) }],
    });
    let back: ChildMessage = serde_json::from_str(&serde_json::to_string(&reply).unwrap()).unwrap();
    assert!(matches!(back, ChildMessage::Reply(r) if r.steps[0].works()));
    let failure: ChildMessage = serde_json::from_str("{\"error\":\"no device\"}").unwrap();
    assert!(matches!(failure, ChildMessage::Failure(f) if f.error == "no device"));
    assert_eq!(pattern_words(u32::MAX, 3), vec![u32::MAX, 0, 1]);
}

#[test]
fn short_codes() {
    assert_eq!(render::short_code("CUDA_SUCCESS"), "ok");
    assert_eq!(render::short_code("CUDA_ERROR_INVALID_VALUE"), "INVALID_VALUE");
    assert_eq!(render::short_code("CHILD_DIED"), "CHILD_DIED");
    assert_eq!(Attempt::works().outcome, Outcome::Works);
}

/// The real matrix in this process (no child: the test binary is not `gpu-ipc`), checked against the
/// backends run through the project's API; the cross-process matrix runs in `tests/vmm_compat_cli.rs`.
#[test]
#[ignore = "needs a CUDA GPU"]
fn backends_agree_with_the_in_process_matrix() {
    let ctx = Context::for_ordinal(0).unwrap();
    let r = matrix::run_matrix(&ctx, 0, &Progress::silent(), false);
    let works = |k, op| r.cell(k, op).is_some_and(|c| c.observed.outcome == Outcome::Works);
    let control_works =
        |k, op| r.cell(k, op).and_then(|c| c.same_process.as_ref()).is_some_and(|a| a.outcome == Outcome::Works);
    // Documented facts.
    assert!(works(AllocationKind::MemAlloc, Operation::LegacyExport));
    assert_eq!(
        r.cell(AllocationKind::VmmPosixFd, Operation::LegacyExport).unwrap().observed.code,
        "CUDA_ERROR_INVALID_VALUE"
    );
    assert!(works(AllocationKind::VmmPosixFd, Operation::FdExport));
    assert!(
        control_works(AllocationKind::VmmPosixFd, Operation::FdImport),
        "{:?}",
        r.cell(AllocationKind::VmmPosixFd, Operation::FdImport)
    );
    assert!(
        !control_works(AllocationKind::MemAlloc, Operation::LegacyImport),
        "a legacy handle opened in its own process"
    );
    assert_eq!(r.facts(AllocationKind::MemAlloc).unwrap().legacy_ipc_capable, Some(true));
    assert_eq!(r.facts(AllocationKind::VmmPosixFd).unwrap().allowed_handle_types, Some(1));
    // Without a child every import is NOT_RUN, never a failure.
    assert_eq!(r.cell(AllocationKind::MemAlloc, Operation::LegacyImport).unwrap().observed.outcome, Outcome::NotRun);
    // The backends agree with the exports the matrix saw.
    for check in &r.backend_checks {
        let matrix = if check.backend == BackendKind::Legacy {
            works(check.allocation, Operation::LegacyExport)
        } else {
            works(AllocationKind::VmmPosixFd, Operation::FdExport)
                && control_works(AllocationKind::VmmPosixFd, Operation::FdImport)
        };
        assert_eq!(check.accepted, matrix, "{check:?}");
    }
    assert!(
        r.backend_checks
            .iter()
            .any(|c| c.backend == BackendKind::Legacy && c.allocation == AllocationKind::MemAlloc && c.accepted)
    );
    assert!(r.backend_checks.iter().any(|c| c.backend == BackendKind::Vmm && c.accepted));
}
