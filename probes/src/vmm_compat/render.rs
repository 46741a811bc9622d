//! The probe's text output and its report section.

use std::fmt::Write;

use super::model::{AllocationKind, Attempt, NOT_APPLICABLE, Operation, Outcome, Results, SUCCESS};
use super::verdict::{backend_agreement, disagreements, predict, prediction};
use harness::MeasurementOutput;
use harness::report::{Plots, ReportSection};

/// A result code, short: `ok` for success, the name without `CUDA_ERROR_` otherwise.
pub fn short_code(code: &str) -> String {
    if code == SUCCESS {
        return "ok".to_owned();
    }
    code.strip_prefix("CUDA_ERROR_").unwrap_or(code).to_owned()
}

fn attempt_text(attempt: &Attempt) -> String {
    let code = short_code(&attempt.code);
    match (attempt.outcome, attempt.code.as_str()) {
        (Outcome::Fails, SUCCESS) => format!("{code}, but fails"),
        _ => code,
    }
}

fn mask_names(mask: Option<u64>) -> String {
    let Some(mask) = mask else { return "unknown".to_owned() };
    let names: Vec<&str> = [(1u64, "POSIX_FD"), (2, "WIN32"), (4, "WIN32_KMT"), (8, "FABRIC")]
        .into_iter()
        .filter(|(bit, _)| mask & bit != 0)
        .map(|(_, name)| name)
        .collect();
    if names.is_empty() { "none".to_owned() } else { names.join("|") }
}

fn yes_no(value: Option<bool>) -> &'static str {
    match value {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    }
}

fn mark(results: &Results, allocation: AllocationKind, operation: Operation, attempt: &Attempt) -> &'static str {
    if attempt.outcome == Outcome::NotRun {
        return "";
    }
    match predict(results, allocation, operation) {
        Some(p) if p != (attempt.outcome == Outcome::Works) => " (mispredicted)",
        _ => "",
    }
}

/// The result as text: the device attributes, then one block per allocation with one line per operation.
pub fn render_text(output: &MeasurementOutput<Results>) -> String {
    let r = &output.results;
    let a = &r.attributes;
    let mut s = String::new();
    let _ = writeln!(s, "gpu-ipc probe vmm-compat: {}", output.env.headline(r.device));
    let _ = writeln!(
        s,
        "device: VMM {}, POSIX-fd handles {}, fabric handles {}, memory pools {} (pool handle types {}), IPC events {}, \
         managed memory {}",
        yes_no(a.virtual_memory_management),
        yes_no(a.posix_fd_handles),
        yes_no(a.fabric_handles),
        yes_no(a.memory_pools),
        mask_names(a.mempool_handle_types.map(u64::from)),
        yes_no(a.ipc_events),
        yes_no(a.managed_memory),
    );
    for kind in AllocationKind::ALL {
        let _ = write!(s, "\n{}", kind.label());
        match r.facts(kind) {
            Some(f) => {
                let _ = writeln!(
                    s,
                    ": legacy IPC capable {}, allowed handle types {}",
                    yes_no(f.legacy_ipc_capable),
                    mask_names(f.allowed_handle_types)
                );
            }
            None => s.push('\n'),
        }
        for cell in r.cells.iter().filter(|c| c.allocation == kind) {
            if cell.observed.code == NOT_APPLICABLE {
                continue;
            }
            let _ = write!(
                s,
                "  {:<20} {}{}",
                cell.operation.label(),
                attempt_text(&cell.observed),
                mark(r, kind, cell.operation, &cell.observed)
            );
            if let Some(control) = &cell.same_process {
                let _ = write!(s, "   [same process: {}]", attempt_text(control));
            }
            if !cell.observed.detail.is_empty() && cell.observed.outcome != Outcome::Works {
                let _ = write!(s, "   {}", cell.observed.detail);
            }
            s.push('\n');
        }
    }
    let b = &r.shared_block;
    let _ = writeln!(
        s,
        "\ntwo 4 KiB cuMemAllocs: handles equal {}, same block {}, importer opened them: {}, data through each: {}",
        yes_no(b.handles_equal),
        yes_no(b.same_block),
        if b.open_codes.is_empty() {
            "not tried".to_owned()
        } else {
            b.open_codes.iter().map(|c| short_code(c)).collect::<Vec<_>>().join(", ")
        },
        b.data_ok.iter().map(|d| yes_no(*d)).collect::<Vec<_>>().join(", "),
    );
    for d in disagreements(r) {
        let _ = writeln!(
            s,
            "backend disagreement: {} {} {} but the matrix saw it {}",
            d.backend,
            if d.backend_accepted { "accepts" } else { "refuses" },
            d.allocation.label(),
            if d.matrix_works { "work" } else { "fail" }
        );
    }
    let _ = writeln!(s, "\n{}\n({})", output.verdict.answer, output.verdict.key_figure);
    s
}

fn markdown_matrix(r: &Results) -> String {
    let mut s = String::new();
    let ops: Vec<Operation> = Operation::ALL.into_iter().collect();
    let _ = writeln!(
        s,
        "| allocation | legacy capable | allowed types | {} |",
        ops.iter().map(|o| o.label()).collect::<Vec<_>>().join(" | ")
    );
    let _ = writeln!(s, "|---|---|---|{}", "---|".repeat(ops.len()));
    for kind in AllocationKind::ALL {
        let facts = r.facts(kind);
        let _ = write!(
            s,
            "| {} | {} | {} |",
            kind.label(),
            yes_no(facts.and_then(|f| f.legacy_ipc_capable)),
            mask_names(facts.and_then(|f| f.allowed_handle_types))
        );
        for &op in &ops {
            let text = match r.cell(kind, op) {
                None => "".to_owned(),
                Some(c) if c.observed.code == NOT_APPLICABLE => "n/a".to_owned(),
                Some(c) => {
                    let mut t = attempt_text(&c.observed);
                    if !mark(r, kind, op, &c.observed).is_empty() {
                        t = format!("**{t}** (mispredicted)");
                    }
                    if let Some(control) = &c.same_process {
                        t.push_str(&format!(" / {}", attempt_text(control)));
                    }
                    t
                }
            };
            let _ = write!(s, " {text} |");
        }
        s.push('\n');
    }
    s
}

fn differences(a: &Results, b: &Results) -> Vec<String> {
    a.cells
        .iter()
        .filter_map(|ca| {
            let cb = b.cell(ca.allocation, ca.operation)?;
            (ca.observed.code != cb.observed.code).then(|| {
                format!(
                    "{} / {}: {} without MPS, {} with",
                    ca.allocation.label(),
                    ca.operation.label(),
                    short_code(&ca.observed.code),
                    short_code(&cb.observed.code)
                )
            })
        })
        .collect()
}

/// The report's section, from the runs without and with MPS.
pub fn report_section(
    no_mps: Option<&MeasurementOutput<Results>>,
    mps: Option<&MeasurementOutput<Results>>,
    _plots: &mut Plots,
) -> ReportSection {
    let Some(main) = no_mps.or(mps) else { return ReportSection::missing("vmm-compat") };
    let r = &main.results;
    let p = prediction(r);
    let mut body = String::new();
    let _ = writeln!(
        body,
        "Measured on {} ({}{}).\n",
        main.env.headline(r.device),
        if no_mps.is_some() { "without MPS" } else { "with MPS" },
        if main.quick { ", quick pass" } else { "" }
    );
    let _ = writeln!(
        body,
        "Each cell is the CUDA result of the operation between two processes, then `/` the same import in the \
         exporting process (the control). `ok` means the calls succeeded and a known pattern crossed both ways \
         (the importer read the exporter's words and wrote its own, which the exporter read back).\n"
    );
    body.push_str(&markdown_matrix(r));
    let _ = writeln!(
        body,
        "\n**Prediction.** `CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`, `CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES` \
         and the device attributes predicted {} of {} observed cells.",
        p.right, p.compared
    );
    for m in &p.mispredictions {
        let _ = writeln!(
            body,
            "- {} / {}: predicted to {}, observed {}",
            m.allocation.label(),
            m.operation.label(),
            if m.predicted { "work" } else { "fail" },
            short_code(&m.observed)
        );
    }
    let agreement = backend_agreement(r);
    let disagree = agreement.disagreements;
    let _ = writeln!(
        body,
        "\n**Backends.** The legacy and vmm backends' own capability checks agree with the matrix on {} of {} \
         allocations it could judge{}.",
        agreement.compared - disagree.len(),
        agreement.compared,
        if agreement.not_comparable == 0 {
            String::new()
        } else {
            format!(
                " ({} more could not be judged: the import between two processes did not run, or its child died)",
                agreement.not_comparable
            )
        }
    );
    for d in &disagree {
        let _ = writeln!(
            body,
            "- {} backend {} {}, but the matrix saw it {}",
            d.backend,
            if d.backend_accepted { "accepts" } else { "refuses" },
            d.allocation.label(),
            if d.matrix_works { "work" } else { "fail" }
        );
    }
    let b = &r.shared_block;
    let _ = writeln!(
        body,
        "\n**Small allocations.** Two 4 KiB `cuMemAlloc`s: handles equal: {}; same block: {}; the importer opened \
         them with {}; each one's own data seen through its mapping: {}.",
        yes_no(b.handles_equal),
        yes_no(b.same_block),
        if b.open_codes.is_empty() {
            "nothing".to_owned()
        } else {
            b.open_codes.iter().map(|c| format!("`{}`", short_code(c))).collect::<Vec<_>>().join(", ")
        },
        b.data_ok.iter().map(|d| yes_no(*d)).collect::<Vec<_>>().join(", ")
    );
    if let (Some(a), Some(m)) = (no_mps, mps) {
        let diff = differences(&a.results, &m.results);
        if diff.is_empty() {
            let _ = writeln!(body, "\n**MPS.** The matrix under MPS is identical.");
        } else {
            let _ = writeln!(body, "\n**MPS.** {} cell(s) differ under MPS:", diff.len());
            for d in diff {
                let _ = writeln!(body, "- {d}");
            }
        }
    }
    let _ = writeln!(
        body,
        "\n**Method.** The exporter makes each allocation (2 MiB, the VMM granularity; 4 KiB for the pair; 64 KiB \
         host and managed), records its pointer attributes, writes a pattern, and runs each export; a child \
         process (a fresh `gpu-ipc helper` per allocation) imports each handle (64 bytes as JSON, or the fd \
         with `SCM_RIGHTS`), checks the pattern, writes its own, synchronises and replies with per-operation result \
         codes; the exporter reads the child's pattern back as soon as the reply arrives, then writes its pattern \
         again and runs the same import in its own process (the control), read back the same way. Every wait has \
         a deadline; a child that dies or hangs is a cell result. The legacy and vmm backends are run \
         through the project's own API on the same allocations."
    );
    ReportSection {
        probe: "vmm-compat".to_owned(),
        question: "What can be shared how?".to_owned(),
        answer: format!("{} ({})", main.verdict.answer, main.verdict.key_figure),
        body,
    }
}
