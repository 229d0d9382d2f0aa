//! The `--plot` SVG, drawn with plotters: one file, panels stacked as the run has data
//! for them.
//!
//! - Bars: items/s (MB/s for `completion`) per configuration, on a scaled axis, with
//!   whiskers from the slowest to the fastest round.
//! - Queue-call percentiles (`queue`): p50, p90 and p95 per configuration, log time.
//! - Latency percentiles (`latency`, `completion`): latency against the percentile on a
//!   log (1 − p) axis, so that p99 and p99.9 get as much room as the median; a curve
//!   stops at the last percentile its sample count supports (`report::min_samples`).
//! - `completion --toggle`: MB/s and idle share per node over the run, the segment
//!   boundaries marked with the scope that starts there.
//!
//! Every series has its own colour, the same in every panel; podq's are solid, the
//! peers' dashed. Legends sit beside the plots, never on the data.

use anyhow::{anyhow, Result};
use std::ops::Range;

use plotters::chart::MeshStyle;
use plotters::coord::combinators::LogCoord;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::report::{self, human_rate, min_samples, Report, RunResult};

/// Width of the whole plot, pixels.
const WIDTH: u32 = 1100;
/// Width of the legend column beside a panel.
const LEGEND_W: u32 = 280;
/// Height of one bar row.
const ROW_H: u32 = 24;
/// Height of one legend entry.
const ENTRY_H: u32 = 17;
const FONT: &str = "sans-serif";

/// Percentiles a latency curve is drawn through (as many as its samples allow).
const CURVE_PERCENTILES: [f64; 25] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 97.0, 98.0, 99.0, 99.5,
    99.7, 99.8, 99.9, 99.95, 99.97, 99.98, 99.99, 99.995, 99.999,
];

/// Twenty colours that stay apart on white (Tableau's ten and ten darker ones); more
/// series than that continue around the hue circle.
const PALETTE: [(u8, u8, u8); 20] = [
    (0x1f, 0x77, 0xb4),
    (0xff, 0x7f, 0x0e),
    (0x2c, 0xa0, 0x2c),
    (0xd6, 0x27, 0x28),
    (0x94, 0x67, 0xbd),
    (0x8c, 0x56, 0x4b),
    (0xe3, 0x77, 0xc2),
    (0x7f, 0x7f, 0x7f),
    (0xbc, 0xbd, 0x22),
    (0x17, 0xbe, 0xcf),
    (0x39, 0x3b, 0x79),
    (0x63, 0x79, 0x39),
    (0x8c, 0x6d, 0x31),
    (0x84, 0x3c, 0x39),
    (0x7b, 0x41, 0x73),
    (0x31, 0x82, 0xbd),
    (0xe6, 0x55, 0x0d),
    (0x31, 0xa3, 0x54),
    (0x75, 0x6b, 0xb1),
    (0x25, 0x25, 0x25),
];

/// The colour of series `index`.
fn colour(index: usize) -> RGBColor {
    match PALETTE.get(index) {
        Some(&(r, g, b)) => RGBColor(r, g, b),
        None => {
            let hue = (index as f64 * 0.618_034).fract();
            let (r, g, b) = HSLColor(hue, 0.65, 0.40).rgb();
            RGBColor(r, g, b)
        }
    }
}

/// A series: one system in one configuration, drawn alike in every panel.
#[derive(Clone, Debug, PartialEq)]
struct Series {
    name: String,
    colour: RGBColor,
    dashed: bool,
}

/// The series of `results` in the order of their first result.
fn series_of(results: &[&RunResult]) -> Vec<Series> {
    let mut names: Vec<(String, bool)> = Vec::new();
    for r in results {
        let name = series_name(r);
        if !names.iter().any(|(n, _)| *n == name) {
            // podq (and its simulation) solid, peers dashed.
            names.push((name, !r.system.starts_with("podq")));
        }
    }
    names
        .into_iter()
        .enumerate()
        .map(|(i, (name, dashed))| Series {
            name,
            colour: colour(i),
            dashed,
        })
        .collect()
}

fn series_name(r: &RunResult) -> String {
    let config = report::config_label(r.scope, r.strict);
    if config == "-" {
        r.system.clone()
    } else {
        format!("{} {config}", r.system)
    }
}

fn find<'a>(series: &'a [Series], r: &RunResult) -> &'a Series {
    let name = series_name(r);
    series
        .iter()
        .find(|s| s.name == name)
        .expect("every result has a series")
}

/// Draws a `podq bench` report as an SVG document.
pub fn render(report: &Report) -> Result<String> {
    render_titled(report, &format!("podq bench {}", report.workload))
}

/// As [`render`], under another title (`podq sim` draws its reports this way).
pub fn render_titled(report: &Report, title: &str) -> Result<String> {
    let t = &report.topology;
    let rounds = report.results.first().map_or(0, |r| r.rounds.len().max(1));
    let mut lines = vec![format!(
        "topology {} ({}), {rounds} round(s) per configuration",
        t.spec, t.description
    )];
    if t.fake {
        lines.push(format!(
            "fake topology: {} virtual CPUs time-share {} real one(s); timings show the cost of more pools and workers, not distance",
            t.cpus,
            t.real_cpus.len()
        ));
    }
    let results: Vec<&RunResult> = report.results.iter().collect();
    draw(title, &lines, &results, &t.real_cpus)
}

/// Draws `results` under `title` and the `lines` below it. `real_cpus` names the idle
/// lanes of a time series taken on a fake topology.
fn draw(
    title: &str,
    lines: &[String],
    results: &[&RunResult],
    real_cpus: &[usize],
) -> Result<String> {
    let series = series_of(results);
    let mut panels: Vec<Panel> = Vec::new();
    let toggled = results.iter().any(|r| r.segment.is_some());
    // One bar panel per test: their rates differ by orders of magnitude.
    let mut tests: Vec<&str> = Vec::new();
    for r in results {
        if r.test != "latency" && !tests.contains(&r.test) {
            tests.push(r.test);
        }
    }
    for test in tests {
        panels.push(Panel::Bars(
            results.iter().copied().filter(|r| r.test == test).collect(),
        ));
    }
    let queue: Vec<&RunResult> = results
        .iter()
        .copied()
        .filter(|r| r.test == "queue")
        .collect();
    if !queue.is_empty() {
        panels.push(Panel::QueueCalls(queue));
    }
    let timeline: Vec<&RunResult> = results
        .iter()
        .copied()
        .filter(|r| {
            r.segment.is_some()
                && r.completion
                    .as_ref()
                    .is_some_and(|c| !c.timeline.is_empty())
        })
        .collect();
    if toggled && !timeline.is_empty() {
        panels.push(Panel::Timeline(timeline));
    }
    for test in ["latency", "completion"] {
        let curves: Vec<&RunResult> = results
            .iter()
            .copied()
            .filter(|r| r.test == test && r.latency_ns.count >= min_samples(50.0))
            .collect();
        if !curves.is_empty() {
            panels.push(Panel::Percentiles(test, curves));
        }
    }
    let title_h = 40 + 18 * lines.len() as u32;
    let heights: Vec<u32> = panels.iter().map(Panel::height).collect();
    let height = title_h + heights.iter().sum::<u32>().max(60);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let (title_area, mut rest) = root.split_vertically(title_h);
        draw_title(&title_area, title, lines)?;
        if panels.is_empty() {
            rest.draw(&Text::new(
                "no results to plot",
                (20, 20),
                (FONT, 16).into_font(),
            ))
            .map_err(plot_error)?;
        }
        for (panel, h) in panels.iter().zip(heights) {
            let (area, below) = rest.split_vertically(h);
            panel.draw(&area, &series, real_cpus)?;
            rest = below;
        }
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

fn plot_error<E: std::error::Error + Send + Sync + 'static>(e: E) -> anyhow::Error {
    anyhow!("drawing the plot: {e}")
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// A chart on `area` in the plots' style: `caption` above, the margins, and label
/// areas of `x_labels` pixels below and `y_labels` to the left.
fn chart_on<'a, 'b, 'c>(
    area: &'a Area<'c>,
    caption: impl AsRef<str>,
    margin_right: u32,
    x_labels: u32,
    y_labels: u32,
) -> ChartBuilder<'a, 'b, SVGBackend<'c>> {
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(caption, (FONT, 16))
        .margin_top(10)
        .margin_left(20)
        .margin_right(margin_right)
        .x_label_area_size(x_labels)
        .y_label_area_size(y_labels);
    builder
}

/// Draws `mesh` in the plots' style: no light lines, the label and axis fonts.
fn draw_mesh<X, Y>(mesh: &mut MeshStyle<'_, '_, X, Y, SVGBackend<'_>>) -> Result<()>
where
    X: Ranged + ValueFormatter<X::ValueType>,
    Y: Ranged + ValueFormatter<Y::ValueType>,
{
    mesh.light_line_style(TRANSPARENT)
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()
        .map_err(plot_error)
}

fn draw_title(area: &Area<'_>, title: &str, lines: &[String]) -> Result<()> {
    area.draw(&Text::new(
        title.to_owned(),
        (20, 8),
        (FONT, 22).into_font(),
    ))
    .map_err(plot_error)?;
    for (i, line) in lines.iter().enumerate() {
        area.draw(&Text::new(
            line.clone(),
            (20, 38 + 18 * i as i32),
            (FONT, 13).into_font(),
        ))
        .map_err(plot_error)?;
    }
    Ok(())
}

enum Panel<'r> {
    Bars(Vec<&'r RunResult>),
    QueueCalls(Vec<&'r RunResult>),
    Percentiles(&'static str, Vec<&'r RunResult>),
    Timeline(Vec<&'r RunResult>),
}

impl Panel<'_> {
    fn height(&self) -> u32 {
        let legend = |n: usize| 90 + ENTRY_H * n as u32;
        match self {
            Panel::Bars(rows) | Panel::QueueCalls(rows) => 110 + ROW_H * rows.len() as u32,
            Panel::Percentiles(_, curves) => legend(curves.len()).max(460),
            Panel::Timeline(_) => 640,
        }
    }

    fn draw(&self, area: &Area<'_>, series: &[Series], real_cpus: &[usize]) -> Result<()> {
        match self {
            Panel::Bars(rows) => bars(area, rows, series),
            Panel::QueueCalls(rows) => queue_calls(area, rows),
            Panel::Percentiles(test, curves) => percentiles(area, test, curves, series),
            Panel::Timeline(segments) => timeline(area, segments, real_cpus),
        }
    }
}

/// The bar label of a result: its series, and the segment for a toggle run.
fn row_label(r: &RunResult) -> String {
    match r.segment {
        Some(i) => format!("{} (segment {i})", series_name(r)),
        None => series_name(r),
    }
}

/// Pixels a label of `text` needs at 12 px (plotters' estimate for SVG text).
fn label_width(texts: impl Iterator<Item = String>) -> u32 {
    let longest = texts.map(|t| t.chars().count()).max().unwrap_or(4) as u32;
    (longest * 7 + 20).clamp(80, 420)
}

/// An axis with exactly the ticks given (plotters' own key-point wrapper cannot be
/// combined with a label formatter on `f64`).
#[derive(Clone)]
struct Ticked<R> {
    inner: R,
    ticks: Vec<f64>,
}

impl<R: Ranged<ValueType = f64>> Ranged for Ticked<R> {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }
}

fn linear(range: Range<f64>, ticks: Vec<f64>) -> Ticked<RangedCoordf64> {
    Ticked {
        inner: range.into(),
        ticks,
    }
}

/// A log time axis from `lo` to `hi` with [`tick_values`] ticks.
fn log_time(lo: f64, hi: f64) -> Ticked<LogCoord<f64>> {
    Ticked {
        inner: (lo..hi).log_scale().into(),
        ticks: tick_values(lo, hi),
    }
}

/// A y axis of `n` rows with a tick at the middle of each.
fn row_axis(n: usize) -> Ticked<RangedCoordf64> {
    linear(0.0..n as f64, (0..n).map(|i| i as f64 + 0.5).collect())
}

/// The row whose label sits at `y` (rows are drawn from the top).
fn row_of(n: usize, y: f64) -> Option<usize> {
    let from_top = n as f64 - y - 0.5;
    let row = from_top.round();
    ((from_top - row).abs() < 0.25 && row >= 0.0 && row < n as f64).then_some(row as usize)
}

fn bars(area: &Area<'_>, rows: &[&RunResult], series: &[Series]) -> Result<()> {
    let completion = rows.iter().all(|r| r.test == "completion");
    let value = |r: &RunResult| {
        if completion {
            r.completion.as_ref().map_or(0.0, |c| c.mb_per_sec)
        } else {
            r.items_per_sec
        }
    };
    let round_value = |x: &report::Round| {
        if completion {
            x.mb_per_sec.unwrap_or(0.0)
        } else {
            x.items_per_sec
        }
    };
    let unit = if completion { "MB/s" } else { "items/s" };
    let test = rows.first().map_or("", |r| r.test);
    // The axis fits the bars and the whiskers, unless one round is far off the bars
    // (a round of a few items can be): then whiskers past twice the largest bar are
    // cut at the edge, which names the round's value.
    let largest_bar = rows.iter().map(|r| value(r)).fold(0.0, f64::max);
    let largest_round = rows
        .iter()
        .flat_map(|r| r.rounds.iter().map(round_value))
        .fold(0.0, f64::max);
    let max = largest_round
        .min(2.0 * largest_bar)
        .max(largest_bar)
        .max(1e-9);
    let n = rows.len();
    let labels: Vec<String> = rows.iter().map(|r| row_label(r)).collect();
    let title =
        format!("{test}: {unit} (bar: all rounds together; whisker: slowest to fastest round)");
    let mut chart = chart_on(area, title, 40, 45, label_width(labels.iter().cloned()))
        .build_cartesian_2d(0.0..max * 1.08, row_axis(n))
        .map_err(plot_error)?;
    draw_mesh(
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_labels(8)
            .x_label_formatter(&|v| {
                if completion {
                    format!("{v:.0}")
                } else {
                    human_rate(*v)
                }
            })
            .y_label_formatter(&|y| row_of(n, *y).map_or(String::new(), |i| labels[i].clone()))
            .x_desc(unit),
    )?;
    for (i, r) in rows.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        let s = find(series, r);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, y + 0.18), (value(r), y + 0.82)],
                s.colour.mix(if s.dashed { 0.55 } else { 0.9 }).filled(),
            )))
            .map_err(plot_error)?;
        let per_round: Vec<f64> = r.rounds.iter().map(round_value).collect();
        if per_round.len() > 1 {
            let lo = per_round.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = per_round.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let edge = max * 1.08;
            chart
                .draw_series(std::iter::once(ErrorBar::new_horizontal(
                    y + 0.5,
                    lo.min(edge),
                    value(r),
                    hi.min(edge),
                    BLACK.stroke_width(1),
                    8,
                )))
                .map_err(plot_error)?;
            if hi > edge {
                let shown = if completion {
                    format!("{hi:.0}")
                } else {
                    human_rate(hi)
                };
                chart
                    .draw_series(std::iter::once(Text::new(
                        format!("fastest round {shown} →"),
                        (edge, y + 0.95),
                        TextStyle::from((FONT, 11).into_font())
                            .pos(Pos::new(HPos::Right, VPos::Top)),
                    )))
                    .map_err(plot_error)?;
            }
        }
    }
    Ok(())
}

fn queue_calls(area: &Area<'_>, rows: &[&RunResult]) -> Result<()> {
    let n = rows.len();
    let labels: Vec<String> = rows.iter().map(|r| series_name(r)).collect();
    // (percentile, its value, its marker colour)
    type Mark = (f64, fn(&RunResult) -> u64, RGBColor);
    let marks: [Mark; 3] = [
        (50.0, |r| r.latency_ns.p50, RGBColor(0x1f, 0x77, 0xb4)),
        (90.0, |r| r.latency_ns.p90, RGBColor(0xff, 0x7f, 0x0e)),
        (95.0, |r| r.latency_ns.p95, RGBColor(0xd6, 0x27, 0x28)),
    ];
    let shown = |r: &RunResult, p: f64| r.latency_ns.count >= min_samples(p);
    let values: Vec<f64> = rows
        .iter()
        .flat_map(|r| {
            marks
                .iter()
                .filter(|(p, _, _)| shown(r, *p))
                .map(|(_, v, _)| v(r).max(1) as f64)
        })
        .collect();
    let (lo, hi) = decades(&values);
    let (plot_area, legend_area) = area.split_horizontally(WIDTH - LEGEND_W);
    let mut chart = chart_on(
        &plot_area,
        "queue call duration: p50, p90, p95 per configuration (log scale)",
        20,
        45,
        label_width(labels.iter().cloned()),
    )
    .build_cartesian_2d(log_time(lo, hi), row_axis(n))
    .map_err(plot_error)?;
    draw_mesh(
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_label_formatter(&|v| tick_label(*v))
            .y_label_formatter(&|y| row_of(n, *y).map_or(String::new(), |i| labels[i].clone()))
            .x_desc("duration of the queue call"),
    )?;
    for (i, r) in rows.iter().enumerate() {
        let y = (n - 1 - i) as f64 + 0.5;
        let points: Vec<(f64, RGBColor)> = marks
            .iter()
            .filter(|(p, _, _)| shown(r, *p))
            .map(|(_, v, c)| (v(r).max(1) as f64, *c))
            .collect();
        if let (Some(first), Some(last)) = (points.first(), points.last()) {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(first.0, y), (last.0, y)],
                    BLACK.mix(0.4).stroke_width(1),
                )))
                .map_err(plot_error)?;
        }
        chart
            .draw_series(
                points
                    .iter()
                    .map(|&(x, c)| Circle::new((x, y), 5, c.filled())),
            )
            .map_err(plot_error)?;
    }
    let entries: Vec<(String, RGBColor)> = marks
        .iter()
        .map(|(p, _, c)| (format!("p{p:.0} (needs n ≥ {})", min_samples(*p)), *c))
        .collect();
    for (i, (text, c)) in entries.iter().enumerate() {
        let y = 50 + i as i32 * ENTRY_H as i32;
        legend_area
            .draw(&Circle::new((16, y), 5, c.filled()))
            .map_err(plot_error)?;
        legend_area
            .draw(&Text::new(
                text.clone(),
                (30, y - 7),
                (FONT, 12).into_font(),
            ))
            .map_err(plot_error)?;
    }
    Ok(())
}

/// `-log10(1 - p)`: 0 for p0, 1 for p90, 2 for p99, 3 for p99.9.
fn nines(p: f64) -> f64 {
    -(1.0 - p / 100.0).log10()
}

fn percentiles(
    area: &Area<'_>,
    test: &str,
    curves: &[&RunResult],
    series: &[Series],
) -> Result<()> {
    let points: Vec<Vec<(f64, f64)>> = curves
        .iter()
        .map(|r| {
            CURVE_PERCENTILES
                .iter()
                .filter(|&&p| r.latency_ns.count >= min_samples(p))
                .map(|&p| {
                    let ns = r.histogram.value_at_quantile(p / 100.0).max(1) as f64;
                    (nines(p), ns)
                })
                .collect()
        })
        .collect();
    let values: Vec<f64> = points.iter().flatten().map(|p| p.1).collect();
    let (lo, hi) = decades(&values);
    let most = points.iter().flatten().map(|p| p.0).fold(2.0, f64::max);
    // nines(99.9) is 3.0000000000000004: no extra decade for rounding.
    let most = (most - 1e-9).ceil();
    let x_ticks: Vec<f64> = [0.0, nines(50.0)]
        .into_iter()
        .chain((1..=most as u32).map(f64::from))
        .collect();
    let what = if test == "latency" {
        "latency: submit to end of item"
    } else {
        "completion: I/O posted to nfsiod item done"
    };
    let (plot_area, legend_area) = area.split_horizontally(WIDTH - LEGEND_W);
    let mut chart = chart_on(
        &plot_area,
        format!("{what}, by percentile (a curve ends where its n stops supporting it)"),
        20,
        50,
        80,
    )
    .build_cartesian_2d(linear(0.0..most, x_ticks), log_time(lo, hi))
    .map_err(plot_error)?;
    draw_mesh(
        chart
            .configure_mesh()
            .x_label_formatter(&|x| percentile_label(*x))
            .y_label_formatter(&|v| tick_label(*v))
            .x_desc("percentile (log scale of 1 − p)")
            .y_desc("latency (log scale)"),
    )?;
    for (r, pts) in curves.iter().zip(&points) {
        let s = find(series, r);
        let style = s.colour.stroke_width(2);
        if s.dashed {
            chart
                .draw_series(DashedLineSeries::new(pts.clone(), 7, 4, style))
                .map_err(plot_error)?;
        } else {
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(plot_error)?;
        }
    }
    let entries: Vec<(&Series, String)> = curves
        .iter()
        .map(|r| {
            let s = find(series, r);
            (s, format!("{} (n={})", row_label(r), r.latency_ns.count))
        })
        .collect();
    legend(&legend_area, &entries)
}

/// Draws legend entries (a line sample and a label) from the top of `area`.
fn legend(area: &Area<'_>, entries: &[(&Series, String)]) -> Result<()> {
    for (i, (s, text)) in entries.iter().enumerate() {
        let y = 50 + i as i32 * ENTRY_H as i32;
        let style = s.colour.stroke_width(2);
        let line = vec![(6, y), (34, y)];
        if s.dashed {
            area.draw(&DashedPathElement::new(line, 7, 4, style))
                .map_err(plot_error)?;
        } else {
            area.draw(&PathElement::new(line, style))
                .map_err(plot_error)?;
        }
        area.draw(&Text::new(
            text.clone(),
            (42, y - 7),
            (FONT, 12).into_font(),
        ))
        .map_err(plot_error)?;
    }
    Ok(())
}

fn timeline(area: &Area<'_>, segments: &[&RunResult], real_cpus: &[usize]) -> Result<()> {
    let details: Vec<&report::CompletionDetail> = segments
        .iter()
        .filter_map(|r| r.completion.as_ref())
        .collect();
    let points: Vec<&report::TimelinePoint> = details.iter().flat_map(|c| &c.timeline).collect();
    let (top, bottom) = area.split_vertically(330);
    let end = points.last().map_or(1.0, |p| p.t).max(1e-3);
    let mb_max = points
        .iter()
        .map(|p| p.mb_per_sec)
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.1;
    let boundaries: Vec<(f64, String)> = segments
        .iter()
        .zip(&details)
        .map(|(r, c)| (c.start_s, report::config_label(r.scope, r.strict)))
        .collect();
    let per_cpu = details.first().is_some_and(|c| c.idle_per_node.is_empty());
    let (plot_top, legend_top) = top.split_horizontally(WIDTH - LEGEND_W);
    let mut chart = chart_on(
        &plot_top,
        "completion throughput over the run (rpciod's scope changes live at each dashed line)",
        20,
        45,
        80,
    )
    .build_cartesian_2d(0.0..end, 0.0..mb_max)
    .map_err(plot_error)?;
    draw_mesh(
        chart
            .configure_mesh()
            .x_label_formatter(&|t| format!("{t:.1} s"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .x_desc("time since the run started (first round)")
            .y_desc("MB/s"),
    )?;
    mark_segments(&mut chart, &boundaries, mb_max)?;
    chart
        .draw_series(LineSeries::new(
            points.iter().map(|p| (p.t, p.mb_per_sec)),
            colour(0).stroke_width(2),
        ))
        .map_err(plot_error)?;
    legend_top
        .draw(&Text::new(
            "MB/s per interval (about 1/100 of the run)",
            (6, 50),
            (FONT, 12).into_font(),
        ))
        .map_err(plot_error)?;

    let lanes = points.first().map_or(0, |p| p.idle.len());
    let (plot_bottom, legend_bottom) = bottom.split_horizontally(WIDTH - LEGEND_W);
    let mut chart = chart_on(
        &plot_bottom,
        if per_cpu {
            "idle share per real CPU (the fake topology's nodes share them)"
        } else {
            "idle share per NUMA node"
        },
        20,
        45,
        80,
    )
    .build_cartesian_2d(0.0..end, 0.0..100.0)
    .map_err(plot_error)?;
    draw_mesh(
        chart
            .configure_mesh()
            .x_label_formatter(&|t| format!("{t:.1} s"))
            .y_label_formatter(&|v| format!("{v:.0}%"))
            .x_desc("time since the run started (first round)")
            .y_desc("idle"),
    )?;
    mark_segments(&mut chart, &boundaries, 100.0)?;
    let lane_series: Vec<Series> = (0..lanes)
        .map(|i| Series {
            name: if per_cpu {
                format!("real CPU {}", real_cpus.get(i).copied().unwrap_or(i))
            } else {
                format!("node {i}")
            },
            colour: colour(i + 1),
            dashed: false,
        })
        .collect();
    for (i, s) in lane_series.iter().enumerate() {
        chart
            .draw_series(LineSeries::new(
                points
                    .iter()
                    .filter_map(|p| p.idle.get(i).map(|x| (p.t, x * 100.0))),
                s.colour.stroke_width(2),
            ))
            .map_err(plot_error)?;
    }
    let entries: Vec<(&Series, String)> = lane_series.iter().map(|s| (s, s.name.clone())).collect();
    legend(&legend_bottom, &entries)
}

/// Dashed vertical lines at segment starts, each labelled with its scope.
fn mark_segments<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    boundaries: &[(f64, String)],
    top: f64,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    for (t, scope) in boundaries {
        chart
            .draw_series(std::iter::once(DashedPathElement::new(
                vec![(*t, 0.0), (*t, top)],
                6,
                4,
                BLACK.mix(0.6).stroke_width(1),
            )))
            .map_err(|e| anyhow!("drawing the plot: {e}"))?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!(" {scope}"),
                (*t, top * 0.98),
                (FONT, 13).into_font(),
            )))
            .map_err(|e| anyhow!("drawing the plot: {e}"))?;
    }
    Ok(())
}

/// The decades around `values`, at least one decade wide.
fn decades(values: &[f64]) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(0.0, f64::max);
    if !lo.is_finite() || hi <= 0.0 {
        return (1.0, 1e3);
    }
    let lo = 10f64.powf(lo.max(1.0).log10().floor());
    let hi = 10f64.powf(hi.log10().ceil()).max(lo * 10.0);
    (lo, hi)
}

/// Ticks of a log time axis: every decade, and 2 and 5 within it when the axis spans
/// fewer than three decades (so that it never has fewer than four labels).
fn tick_values(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi / lo).log10().round() as i32;
    let steps: &[f64] = if span < 3 { &[1.0, 2.0, 5.0] } else { &[1.0] };
    let first = lo.log10().round() as i32;
    (first..=first + span)
        .flat_map(|d| steps.iter().map(move |s| s * 10f64.powi(d)))
        .filter(|&v| v >= lo * 0.999 && v <= hi * 1.001)
        .collect()
}

/// A tick of a log time axis: `1 µs`, `20 µs`, `500 ms`.
fn tick_label(ns: f64) -> String {
    let (div, unit) = if ns >= 1e9 {
        (1e9, "s")
    } else if ns >= 1e6 {
        (1e6, "ms")
    } else if ns >= 1e3 {
        (1e3, "µs")
    } else {
        (1.0, "ns")
    };
    format!("{} {unit}", (ns / div).round())
}

/// A tick of the percentile axis: `p50`, `p90`, `p99.9`.
fn percentile_label(x: f64) -> String {
    if x == 0.0 {
        return "p0".to_owned();
    }
    let p = 100.0 * (1.0 - 10f64.powf(-x));
    let text = format!("{p:.4}");
    format!("p{}", text.trim_end_matches('0').trim_end_matches('.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::{new_histogram, record, LatencySummary, Round, TopologyInfo};
    use podq_topology::Scope;

    fn result(test: &'static str, system: &str, scope: Option<Scope>, samples: u64) -> RunResult {
        let mut h = new_histogram();
        for i in 1..=samples {
            record(&mut h, 1_000 + i * 37);
        }
        let round = |rate: f64| Round {
            items: samples,
            seconds: 1.0,
            wall_seconds: 1.1,
            items_per_sec: rate,
            samples,
            p50_ns: 2_000,
            p99_ns: 9_000,
            mb_per_sec: None,
            accepted_per_sec: None,
            calls_per_sec: None,
            switches_per_kitem: None,
            bytes_per_item: None,
            idle_cpu_share: None,
            auto_scope_at_end: None,
        };
        RunResult {
            test,
            system: system.to_owned(),
            scope,
            strict: scope.map(|_| false),
            segment: None,
            producers: 2,
            items: samples,
            seconds: 2.0,
            items_per_sec: 5e5,
            latency_ns: LatencySummary::of(&h),
            submit_ns: None,
            completion: None,
            throughput: None,
            memory: None,
            idle: None,
            context_switches: None,
            pool_locks: None,
            auto: None,
            rounds: vec![round(4e5), round(6e5)],
            histogram: h,
        }
    }

    fn report(results: Vec<RunResult>, fake: bool) -> Report {
        Report {
            schema_version: report::SCHEMA_VERSION,
            workload: "ladder".into(),
            command: Vec::new(),
            topology: TopologyInfo {
                spec: if fake { "fake:2s4c2t" } else { "live" }.into(),
                description: "16 CPUs, 2 node(s), 2 LLC(s), SMT2".into(),
                cpus: 16,
                nodes: 2,
                real_cpus: vec![0, 1],
                fake,
            },
            settings: serde_json::Value::Null,
            results,
            ratios: Vec::new(),
            warnings: Vec::new(),
        }
    }

    fn texts(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).expect("well-formed SVG");
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| n.text().unwrap_or("").trim().to_owned())
            .collect()
    }

    /// Polylines drawn in `colour` (upper-case hex, as plotters writes it).
    fn strokes(svg: &str, colour: &str) -> usize {
        let doc = roxmltree::Document::parse(svg).unwrap();
        doc.descendants()
            .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke") == Some(colour))
            .count()
    }

    #[test]
    fn every_panel_has_titles_ticks_and_sample_counts() {
        let svg = render(&report(
            vec![
                result("queue", "podq", Some(Scope::Cpu), 500),
                result("queue", "rayon", None, 500),
                result("latency", "podq", Some(Scope::Cpu), 12_000),
                result("latency", "rayon", None, 1_500),
            ],
            true,
        ))
        .unwrap();
        let texts = texts(&svg);
        let has = |t: &str| texts.iter().any(|x| x == t);
        let contains = |t: &str| texts.iter().any(|x| x.contains(t));
        for t in [
            "podq cpu",
            "rayon",
            "items/s",
            "percentile (log scale of 1 − p)",
            "latency (log scale)",
            "podq cpu (n=12000)",
            "rayon (n=1500)",
            "p50",
            "p99",
            "p99.9",
            "1 µs",
            "p95 (needs n ≥ 200)",
        ] {
            assert!(has(t), "no text `{t}` in {texts:?}");
        }
        assert!(contains("queue: items/s"), "{texts:?}");
        assert!(contains("fake topology: 16 virtual CPUs"), "{texts:?}");
        // rayon's 1 500 samples reach p99 but not p99.9; podq's 12 000 reach p99.9:
        // only p99.99 (100 000 needed) is beyond both, so the axis ends at p99.9.
        assert!(!has("p99.99"), "{texts:?}");
    }

    #[test]
    fn series_have_their_own_colours_podq_solid_peers_dashed() {
        let results: Vec<RunResult> = Scope::CONCRETE
            .iter()
            .map(|&s| result("latency", "podq", Some(s), 2_000))
            .chain(
                ["rayon", "tokio-spawn-blocking", "std-mpsc"]
                    .map(|p| result("latency", p, None, 2_000)),
            )
            .collect();
        let svg = render(&report(results, false)).unwrap();
        let hex = |i: usize| {
            let RGBColor(r, g, b) = colour(i);
            format!("#{r:02X}{g:02X}{b:02X}")
        };
        for i in 0..6 {
            // A podq curve is one polyline, its legend sample another.
            assert_eq!(strokes(&svg, &hex(i)), 2, "podq series {i}");
        }
        for i in 6..9 {
            // A dashed curve is drawn dash by dash.
            assert!(strokes(&svg, &hex(i)) > 4, "peer series {i}");
        }
    }

    #[test]
    fn bars_carry_whiskers_from_the_rounds() {
        let svg = render(&report(
            vec![result("queue", "podq", Some(Scope::Smt), 100)],
            false,
        ))
        .unwrap();
        let texts = texts(&svg);
        // The scaled axis: 600 k is the fastest round, so the axis runs past it.
        assert!(texts.iter().any(|t| t == "600.0 k"), "{texts:?}");
        assert!(texts
            .iter()
            .any(|t| t.contains("whisker: slowest to fastest round")));
        assert!(!texts.iter().any(|t| t.starts_with("fastest round")));
        // A round far off the bars does not squash them: its whisker is cut at the
        // edge, which names it.
        let mut wild = result("queue", "podq", Some(Scope::Smt), 100);
        wild.rounds[1].items_per_sec = 9e7;
        let svg = render(&report(vec![wild], false)).unwrap();
        let texts = self::texts(&svg);
        assert!(
            texts.iter().any(|t| t == "fastest round 90.000 M →"),
            "{texts:?}"
        );
        assert!(texts.iter().any(|t| t == "1.000 M"), "{texts:?}");
        assert!(
            !texts
                .iter()
                .any(|t| t.ends_with(" M") && t.starts_with("9")),
            "{texts:?}"
        );
    }

    #[test]
    fn ticks_and_labels() {
        assert_eq!(tick_label(1_000.0), "1 µs");
        assert_eq!(tick_label(20_000_000.0), "20 ms");
        assert_eq!(tick_label(500.0), "500 ns");
        assert_eq!(tick_values(1e3, 1e4), [1e3, 2e3, 5e3, 1e4]);
        assert_eq!(tick_values(1e2, 1e6), [1e2, 1e3, 1e4, 1e5, 1e6]);
        assert_eq!(decades(&[2_500.0, 180_000.0]), (1e3, 1e6));
        assert_eq!(decades(&[]), (1.0, 1e3));
        assert_eq!(percentile_label(nines(50.0)), "p50");
        assert_eq!(percentile_label(2.0), "p99");
        assert_eq!(percentile_label(3.0), "p99.9");
        assert_eq!(percentile_label(0.0), "p0");
    }

    #[test]
    fn rows_map_back_to_their_labels() {
        // Three rows: the first is drawn at the top (y 2..3).
        assert_eq!(row_of(3, 2.5), Some(0));
        assert_eq!(row_of(3, 0.5), Some(2));
        assert_eq!(row_of(3, 3.5), None);
    }

    #[test]
    fn colours_are_distinct_for_many_series() {
        let colours: Vec<RGBColor> = (0..40).map(colour).collect();
        for (i, a) in colours.iter().enumerate() {
            for b in &colours[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
