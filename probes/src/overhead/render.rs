//! The overhead probe's text output and its section of the report.

use super::model::{AttachPoint, Comparison, FirstImport, KindResults, Results, human};
use super::verdict::FINDING_RULE;

use harness::MeasurementOutput;
use harness::report::{LineChart, Plots, ReportSection, Series};

/// The result as text.
pub fn render_text(output: &MeasurementOutput<Results>) -> String {
    let r = &output.results;
    let mut out = format!("gpu-ipc probe overhead: {} ({} runs per measurement)\n\n", output.env.headline(0), r.runs);
    out.push_str(&format!("{}\n{}\n\n", output.verdict.answer, output.verdict.key_figure));
    out.push_str(&comparison_table(&r.comparisons));
    out.push('\n');
    out.push_str(&attach_table(&r.attach, &r.first_imports));
    for note in &r.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}

pub(super) fn comparison_table(comparisons: &[Comparison]) -> String {
    let mut out = String::from(
        "| metric | local | imported | local value | imported value | difference | noise band | measurable |\n\
         |---|---|---|---:|---:|---:|---:|---|\n",
    );
    for c in comparisons {
        out.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:+.2}% | {:.2}% | {} |\n",
            c.metric,
            c.local.label(),
            c.imported.label(),
            c.local_value,
            c.imported_value,
            100.0 * c.difference,
            100.0 * c.noise,
            if c.is_finding() { "yes" } else { "no" }
        ));
    }
    out
}

pub(super) fn attach_table(attach: &[AttachPoint], firsts: &[FirstImport]) -> String {
    let mut out = String::from(
        "| backend | size | attach p50 ms | attach p99 ms | attach max ms | detach p50 ms | detach p99 ms | reps |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for a in attach {
        out.push_str(&format!(
            "| {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |\n",
            a.backend.name(),
            human(a.bytes),
            a.attach_ms.p50,
            a.attach_ms.p99,
            a.attach_ms.max,
            a.detach_ms.p50,
            a.detach_ms.p99,
            a.attach_ms.count
        ));
    }
    if !firsts.is_empty() {
        out.push_str(
            "\n| backend | size | fresh processes | CUDA context p50 ms | first import p50 ms (max) | second import p50 ms |\n\
             |---|---:|---:|---:|---:|---:|\n",
        );
        for f in firsts {
            out.push_str(&format!(
                "| {} | {} | {} | {:.1} | {:.3} ({:.3}) | {:.3} |\n",
                f.backend.name(),
                human(f.bytes),
                f.first_attach_ms.count,
                f.context_ms.p50,
                f.first_attach_ms.p50,
                f.first_attach_ms.max,
                f.second_attach_ms.p50
            ));
        }
    }
    out
}

/// The report's section, from the runs without and with MPS.
pub fn report_section(
    no_mps: Option<&MeasurementOutput<Results>>,
    mps: Option<&MeasurementOutput<Results>>,
    plots: &mut Plots,
) -> ReportSection {
    let Some(main) = no_mps.or(mps) else { return ReportSection::missing("overhead") };
    let mut body = String::from(
        "The same kernels (`kernels/cuda/probe_memory.cu`) on each kind of memory: 16-byte vector reads and writes \
         (grid-stride, enough launches per run to take milliseconds, timed with events), a one-thread dependent \
         pointer chase over a random cycle of 128-byte lines (each load timed with `clock64`, converted with the \
         kernel's own `%globaltimer`), and a store followed by `__threadfence()`. Each figure is the median of several \
         runs; the noise band is the larger relative spread (max - min) / median of the two kinds compared.\n\n",
    );
    body.push_str(&format!("Rule: {FINDING_RULE}; the column \"measurable\" applies it.\n\n"));
    for (name, run) in [("Without MPS", no_mps), ("With MPS", mps)] {
        let Some(run) = run else { continue };
        let r = &run.results;
        let suffix = if run.env.mps { "mps" } else { "no-mps" };
        body.push_str(&format!("### {name}\n\n{}\n\n{}\n", run.verdict.key_figure, comparison_table(&r.comparisons)));
        let mut chart = |stem: &str,
                         title: &str,
                         x_label: &str,
                         y_label: &str,
                         y_log: bool,
                         f: &dyn Fn(&KindResults) -> Vec<(f64, f64)>| {
            plots.line_chart(LineChart {
                file_stem: format!("overhead-{stem}-{suffix}"),
                title: format!("{title} ({name})"),
                x_label: x_label.to_owned(),
                y_label: y_label.to_owned(),
                x_log: true,
                y_log,
                series: r.kinds.iter().map(|k| Series { name: k.kind.label().to_owned(), points: f(k) }).collect(),
            })
        };
        let read = chart("read-bandwidth", "Read bandwidth vs size", "bytes read per kernel", "GB/s", true, &|k| {
            k.bandwidth.iter().map(|p| (p.bytes as f64, p.read_gbps.summary.p50)).collect()
        });
        let write =
            chart("write-bandwidth", "Write bandwidth vs size", "bytes written per kernel", "GB/s", true, &|k| {
                k.bandwidth.iter().map(|p| (p.bytes as f64, p.write_gbps.summary.p50)).collect()
            });
        let latency = chart(
            "load-latency",
            "Dependent-load latency vs working set",
            "working set (bytes)",
            "ns per load (median)",
            false,
            &|k| k.latency.iter().map(|p| (p.bytes as f64, p.load_ns.summary.p50)).collect(),
        );
        body.push_str(&format!("\n{read}\n\n{write}\n\n{latency}\n\n"));
        body.push_str("Load latency distributions (all per-load samples of all runs, ns):\n\n| memory | working set | p50 | p99 | max | samples |\n|---|---:|---:|---:|---:|---:|\n");
        for k in &r.kinds {
            for p in &k.latency {
                if let Some(d) = p.load_ns.samples {
                    body.push_str(&format!(
                        "| {} | {} ({}) | {:.0} | {:.0} | {:.0} | {} |\n",
                        k.kind.label(),
                        human(p.bytes),
                        p.level,
                        d.p50,
                        d.p99,
                        d.max,
                        d.count
                    ));
                }
            }
        }
        body.push_str("\nAttach (import + map) and detach cost:\n\n");
        body.push_str(&attach_table(&r.attach, &r.first_imports));
        for note in &r.notes {
            body.push_str(&format!("\nNote: {note}\n"));
        }
        body.push('\n');
    }
    ReportSection {
        probe: "overhead".to_owned(),
        question: "Is memory imported from another process slower for kernels than the process's own memory?"
            .to_owned(),
        answer: format!("{} {}", main.verdict.answer, main.verdict.key_figure),
        body,
    }
}
