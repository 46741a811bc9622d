//! `gpu-ipc report`: runs every probe (without MPS, then under a private MPS daemon) or reads their JSON, and
//! writes the answers: Markdown with the four answers first, then each probe's tables and plots (SVG), and the raw
//! JSON beside them.
//!
//! Each probe renders its own section ([`ReportSection`]) from its runs without and with MPS, and asks for plots
//! through [`Plots`]; this module assembles the document and draws the plots.

/// One probe's part of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportSection {
    /// The probe's name (`overhead`, `coherency`, `vmm-compat`, `crash`).
    pub probe: String,
    /// The question it answers, as a heading.
    pub question: String,
    /// The answer in one line, with its key figure (shown first in the report and in the README).
    pub answer: String,
    /// The section's body: Markdown tables, plot references, method and caveats.
    pub body: String,
}

impl ReportSection {
    /// The section of a probe that has no results to show.
    pub fn missing(probe: &str) -> Self {
        Self {
            probe: probe.to_owned(),
            question: probe.to_owned(),
            answer: format!("no result: the {probe} probe did not run or produced no JSON"),
            body: String::new(),
        }
    }
}

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points `(x, y)`, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A line chart a section asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    /// File name without extension (letters, digits, `-`), unique within the report.
    pub file_stem: String,
    /// Title above the chart.
    pub title: String,
    /// X axis label (with unit).
    pub x_label: String,
    /// Y axis label (with unit).
    pub y_label: String,
    /// Logarithmic x axis.
    pub x_log: bool,
    /// Logarithmic y axis.
    pub y_log: bool,
    /// The lines.
    pub series: Vec<Series>,
}

/// The plots the sections asked for; drawn when the report is written.
#[derive(Debug, Default)]
pub struct Plots {
    /// Charts in the order they were asked for.
    pub charts: Vec<LineChart>,
}

impl Plots {
    /// Records `chart` and returns the Markdown that shows it (`![title](plots/stem.svg)`).
    pub fn line_chart(&mut self, chart: LineChart) -> String {
        let markdown = format!("![{}](plots/{}.svg)", chart.title, chart.file_stem);
        self.charts.push(chart);
        markdown
    }
}

/// Options of `gpu-ipc report`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// A short pass of every probe (each probe's `--quick`).
    #[arg(long)]
    pub quick: bool,
}

/// Runs `gpu-ipc report`; returns the exit status.
pub fn main(_args: &ReportArgs) -> u8 {
    eprintln!("gpu-ipc report: not built yet");
    1
}
