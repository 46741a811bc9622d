//! The report's vocabulary: what a probe gives the report ([`ReportSection`]) and the charts it asks for
//! ([`Plots`], drawn by [`crate::plot`]). It sits below the probes so that a probe names its section without
//! knowing how the report is assembled.

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
    ///
    /// A stem with other characters than letters, digits and `-` has them replaced by `-`; a stem already taken
    /// gets `-2`, `-3`, ... appended; the Markdown names the file that will be written.
    pub fn line_chart(&mut self, mut chart: LineChart) -> String {
        chart.file_stem = self.unique_stem(&chart.file_stem);
        let alt = chart.title.replace(['[', ']'], "");
        let markdown = format!("![{alt}](plots/{}.svg)", chart.file_stem);
        self.charts.push(chart);
        markdown
    }

    fn unique_stem(&self, wanted: &str) -> String {
        let clean: String =
            wanted.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
        let base = if clean.is_empty() { "chart".to_owned() } else { clean };
        let taken = |stem: &str| self.charts.iter().any(|c| c.file_stem == stem);
        if !taken(&base) {
            return base;
        }
        (2..).map(|n| format!("{base}-{n}")).find(|stem| !taken(stem)).unwrap_or(base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_stems_are_cleaned_and_unique() {
        let mut plots = Plots::default();
        let chart = |stem: &str| LineChart {
            file_stem: stem.to_owned(),
            title: "Read [bandwidth]".to_owned(),
            x_label: String::new(),
            y_label: String::new(),
            x_log: false,
            y_log: false,
            series: Vec::new(),
        };
        assert_eq!(plots.line_chart(chart("bw")), "![Read bandwidth](plots/bw.svg)");
        assert_eq!(plots.line_chart(chart("bw")), "![Read bandwidth](plots/bw-2.svg)");
        assert_eq!(plots.line_chart(chart("a b/../c")), "![Read bandwidth](plots/a-b----c.svg)");
        assert_eq!(plots.line_chart(chart("")), "![Read bandwidth](plots/chart.svg)");
        let stems: Vec<_> = plots.charts.iter().map(|c| c.file_stem.as_str()).collect();
        assert_eq!(stems, ["bw", "bw-2", "a-b----c", "chart"]);
    }
}
