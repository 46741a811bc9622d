//! The report's charts, drawn as SVG with `plotters`: title, axis labels, linear or logarithmic axes, one coloured
//! line with points per series, and a legend. SVG only: it needs no fonts (the viewer draws the text) and GitHub
//! shows it in Markdown; plotters' PNG backend would need a font file at run time or in the binary.
//!
//! Points that cannot be drawn (not finite, or not positive on a logarithmic axis) are left out and the axis label
//! says how many; an empty chart is drawn with a placeholder range and says "no data". Same input, same bytes.

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use crate::report::LineChart;

/// Width and height of every chart, in pixels.
const SIZE: (u32, u32) = (900, 540);

/// The series colours, in order (colour-blind-safe Okabe-Ito palette, then repeated).
const COLOURS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(240, 228, 66),
];

/// Why a chart could not be drawn: the plotting library's error, with the chart it was drawing.
#[derive(Debug, thiserror::Error)]
#[error("chart {chart}: {reason}")]
pub struct PlotError {
    /// The chart's file stem.
    pub chart: String,
    /// What the plotting library said.
    pub reason: String,
}

/// Draws `chart` as an SVG document.
///
/// # Errors
/// [`PlotError`]: the plotting library refused a step.
pub fn render_svg(chart: &LineChart) -> Result<String, PlotError> {
    let mut dropped = 0usize;
    let series: Vec<Vec<(f64, f64)>> = chart
        .series
        .iter()
        .map(|s| {
            let kept: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|&(x, y)| drawable(x, chart.x_log) && drawable(y, chart.y_log))
                .collect();
            dropped += s.points.len() - kept.len();
            kept
        })
        .collect();
    let x_range = axis_range(series.iter().flatten().map(|p| p.0), chart.x_log);
    let y_range = axis_range(series.iter().flatten().map(|p| p.1), chart.y_log);
    let empty = series.iter().all(Vec::is_empty);
    let mut x_label = chart.x_label.clone();
    if dropped > 0 {
        x_label.push_str(&format!(" ({dropped} point{} not drawable left out)", if dropped == 1 { "" } else { "s" }));
    }
    let mut title = chart.title.clone();
    if empty {
        title.push_str(" (no data)");
    }
    let labels = Labels { title, x: x_label, y: chart.y_label.clone() };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        let (x0, x1) = x_range;
        let (y0, y1) = y_range;
        match (chart.x_log, chart.y_log) {
            (false, false) => draw(&root, &labels, chart, &series, x0..x1, y0..y1),
            (true, false) => draw(&root, &labels, chart, &series, (x0..x1).log_scale(), y0..y1),
            (false, true) => draw(&root, &labels, chart, &series, x0..x1, (y0..y1).log_scale()),
            (true, true) => draw(&root, &labels, chart, &series, (x0..x1).log_scale(), (y0..y1).log_scale()),
        }?;
        root.present().map_err(|e| PlotError { chart: chart.file_stem.clone(), reason: e.to_string() })?;
    }
    Ok(svg)
}

struct Labels {
    title: String,
    x: String,
    y: String,
}

fn drawable(v: f64, log: bool) -> bool {
    v.is_finite() && (!log || v > 0.0)
}

/// The axis range for `values` (already drawable), with a margin; a placeholder when there are none.
fn axis_range(values: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (min, max) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !min.is_finite() {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        // A factor each side; a single value gets a decade around it.
        if min == max { (min / 3.0, max * 3.0) } else { (min / 1.25, max * 1.25) }
    } else if min == max {
        let pad = if min == 0.0 { 1.0 } else { min.abs() * 0.1 };
        (min - pad, max + pad)
    } else {
        let pad = (max - min) * 0.05;
        // Start at 0 when the data is near it: a bar of bandwidths reads wrong on a cut axis.
        let low = if min >= 0.0 && min <= max - min { 0.0 } else { min - pad };
        (low, max + pad)
    }
}

fn draw<XS, YS>(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    labels: &Labels,
    chart: &LineChart,
    series: &[Vec<(f64, f64)>],
    x: XS,
    y: YS,
) -> Result<(), PlotError>
where
    XS: AsRangedCoord<Value = f64>,
    YS: AsRangedCoord<Value = f64>,
    XS::CoordDescType: ValueFormatter<f64>,
    YS::CoordDescType: ValueFormatter<f64>,
{
    let err = |e: &dyn std::fmt::Display| PlotError { chart: chart.file_stem.clone(), reason: e.to_string() };
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut ctx = ChartBuilder::on(root)
        .caption(&labels.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(x, y)
        .map_err(|e| err(&e))?;
    ctx.configure_mesh()
        .x_desc(labels.x.as_str())
        .y_desc(labels.y.as_str())
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(|e| err(&e))?;
    for (n, (points, spec)) in series.iter().zip(&chart.series).enumerate() {
        let colour = COLOURS[n % COLOURS.len()];
        ctx.draw_series(LineSeries::new(points.iter().copied(), colour.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(spec.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        ctx.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled()))).map_err(|e| err(&e))?;
    }
    if !chart.series.is_empty() {
        ctx.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::report::Series;

    fn chart(x_log: bool, y_log: bool, series: Vec<Series>) -> LineChart {
        LineChart {
            file_stem: "t".into(),
            title: "Visibility latency & polling".into(),
            x_label: "poll interval (ns)".into(),
            y_label: "latency (us)".into(),
            x_log,
            y_log,
            series,
        }
    }

    fn series(name: &str, points: &[(f64, f64)]) -> Series {
        Series { name: name.into(), points: points.to_vec() }
    }

    /// Well-formed enough for a browser: one root, every element closed (a small tag balance check; no XML crate
    /// in the tree).
    fn assert_well_formed(svg: &str) {
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        let mut stack = Vec::new();
        let mut rest = svg;
        while let Some(start) = rest.find('<') {
            let end = rest[start..].find('>').expect("a tag is closed") + start;
            let tag = &rest[start + 1..end];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop(), Some(name.trim().to_owned()), "balanced tags");
            } else if !tag.ends_with('/') && !tag.starts_with('?') && !tag.starts_with('!') {
                stack.push(tag.split_whitespace().next().unwrap_or("").to_owned());
            }
            rest = &rest[end + 1..];
        }
        assert!(stack.is_empty(), "unclosed: {stack:?}");
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "no non-finite coordinates");
    }

    #[test]
    fn a_chart_has_title_axes_and_legend() {
        let c = chart(
            true,
            false,
            vec![
                series("ld.acquire.sys", &[(1.0, 2.0), (10.0, 1.5), (100.0, 1.2)]),
                series("volatile", &[(1.0, 3.0), (10.0, 2.5), (100.0, 2.0)]),
            ],
        );
        let svg = render_svg(&c).unwrap();
        assert_well_formed(&svg);
        assert!(svg.contains("Visibility latency &amp; polling"), "the title, escaped");
        assert!(svg.contains("poll interval (ns)") && svg.contains("latency (us)"));
        assert!(svg.contains("ld.acquire.sys") && svg.contains("volatile"));
        assert!(svg.contains("#0072B2") || svg.contains("rgb(0,114,178)"), "the first colour");
        assert_eq!(render_svg(&c).unwrap(), svg, "deterministic");
    }

    #[test]
    fn log_axes_leave_out_zero_and_negative_values() {
        let c =
            chart(true, true, vec![series("a", &[(0.0, 1.0), (-1.0, 2.0), (1.0, 0.0), (2.0, 4.0), (4.0, f64::NAN)])]);
        let svg = render_svg(&c).unwrap();
        assert_well_formed(&svg);
        assert!(svg.contains("(4 points not drawable left out)"), "{svg}");
        let only_bad = chart(false, true, vec![series("a", &[(1.0, -1.0), (2.0, 0.0)])]);
        let svg = render_svg(&only_bad).unwrap();
        assert_well_formed(&svg);
        assert!(svg.contains("(no data)"));
    }

    #[test]
    fn empty_and_degenerate_charts_draw() {
        for (x_log, y_log) in [(false, false), (true, true)] {
            assert_well_formed(&render_svg(&chart(x_log, y_log, Vec::new())).unwrap());
            assert_well_formed(&render_svg(&chart(x_log, y_log, vec![series("empty", &[])])).unwrap());
            assert_well_formed(&render_svg(&chart(x_log, y_log, vec![series("one", &[(5.0, 5.0)])])).unwrap());
        }
        assert_well_formed(
            &render_svg(&chart(false, false, vec![series("neg", &[(-3.0, -2.0), (3.0, -1.0)])])).unwrap(),
        );
    }

    #[test]
    fn ranges() {
        assert_eq!(axis_range([].into_iter(), true), (1.0, 10.0));
        assert_eq!(axis_range([].into_iter(), false), (0.0, 1.0));
        assert_eq!(axis_range([0.0].into_iter(), false), (-1.0, 1.0));
        assert_eq!(axis_range([10.0, 20.0].into_iter(), false), (0.0, 20.5));
        assert_eq!(axis_range([100.0, 110.0].into_iter(), false), (99.5, 110.5));
        let (lo, hi) = axis_range([2.0, 8.0].into_iter(), true);
        assert!((lo - 1.6).abs() < 1e-12 && (hi - 10.0).abs() < 1e-12);
    }
}
