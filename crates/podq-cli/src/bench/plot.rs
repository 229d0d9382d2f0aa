//! A small SVG writer: throughput as horizontal bars, latency as CDF curves on a log
//! time axis. Hand-written because two chart types do not justify a plotting stack.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

use super::report::human_ns;

/// One bar: a configuration and its throughput.
#[derive(Debug, Clone)]
pub struct Bar {
    /// e.g. `podq smt`.
    pub label: String,
    /// Items per second.
    pub value: f64,
}

/// One CDF curve.
#[derive(Debug, Clone)]
pub struct Curve {
    /// e.g. `podq smt`.
    pub label: String,
    /// `(nanoseconds, cumulative fraction)`, ascending.
    pub points: Vec<(f64, f64)>,
}

impl Curve {
    /// The CDF of a histogram, denser in the tail where latency plots are read.
    pub fn of(label: String, h: &Histogram<u64>) -> Curve {
        let mut quantiles: Vec<f64> = (0..=100).map(|i| f64::from(i) / 100.0).collect();
        quantiles.extend([0.995, 0.999, 0.9995, 0.9999]);
        quantiles.sort_by(f64::total_cmp);
        let points = if h.is_empty() {
            Vec::new()
        } else {
            quantiles
                .into_iter()
                .map(|q| (h.value_at_quantile(q).max(1) as f64, q))
                .collect()
        };
        Curve { label, points }
    }
}

const WIDTH: f64 = 860.0;
const LABEL_W: f64 = 230.0;
const ROW_H: f64 = 22.0;
const CDF_H: f64 = 340.0;
const COLORS: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// An SVG document with a bar panel (when `bars` is not empty) above a CDF panel
/// (when `curves` is not empty).
pub fn svg(title: &str, bars: &[Bar], curves: &[Curve]) -> String {
    let bar_h = if bars.is_empty() {
        0.0
    } else {
        60.0 + ROW_H * bars.len() as f64
    };
    let cdf_h = if curves.is_empty() { 0.0 } else { CDF_H };
    let height = 40.0 + bar_h + cdf_h;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    if !bars.is_empty() {
        bar_panel(&mut out, bars, 40.0);
    }
    if !curves.is_empty() {
        cdf_panel(&mut out, curves, 40.0 + bar_h);
    }
    out.push_str("</svg>\n");
    out
}

fn bar_panel(out: &mut String, bars: &[Bar], top: f64) {
    let max = bars.iter().map(|b| b.value).fold(0.0, f64::max).max(1e-9);
    let plot_w = WIDTH - LABEL_W - 110.0;
    let _ = writeln!(
        out,
        r#"<text x="{LABEL_W}" y="{}" font-size="13">throughput (items/s)</text>"#,
        top + 18.0
    );
    for (i, bar) in bars.iter().enumerate() {
        let y = top + 30.0 + ROW_H * i as f64;
        let w = (bar.value / max * plot_w).max(0.0);
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text><rect class="bar" x="{LABEL_W}" y="{}" width="{w:.1}" height="{}" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            LABEL_W - 6.0,
            y + 14.0,
            escape(&bar.label),
            y + 3.0,
            ROW_H - 6.0,
            COLORS[i % COLORS.len()],
            LABEL_W + w + 6.0,
            y + 14.0,
            escape(&super::report::human_rate(bar.value)),
        );
    }
}

fn cdf_panel(out: &mut String, curves: &[Curve], top: f64) {
    let (left, right) = (70.0, WIDTH - 220.0);
    let (y0, y1) = (top + CDF_H - 40.0, top + 30.0);
    let all = curves.iter().flat_map(|c| c.points.iter().map(|p| p.0));
    let lo = all.clone().fold(f64::INFINITY, f64::min).max(1.0);
    let hi = all.fold(1.0, f64::max).max(lo * 10.0);
    let (lo_log, hi_log) = (lo.log10().floor(), hi.log10().ceil());
    let x_of = |ns: f64| left + (ns.log10() - lo_log) / (hi_log - lo_log) * (right - left);
    let y_of = |q: f64| y0 - q * (y0 - y1);
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="{}" font-size="13">completion latency CDF (log time)</text>"#,
        top + 18.0
    );
    let _ = writeln!(
        out,
        r##"<path d="M{left} {y1} L{left} {y0} L{right} {y0}" stroke="#333" fill="none"/>"##
    );
    for decade in (lo_log as i32)..=(hi_log as i32) {
        let x = x_of(10f64.powi(decade));
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{y1}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            y0 + 16.0,
            escape(&human_ns(10f64.powi(decade)))
        );
    }
    for q in [0.0, 0.5, 0.9, 0.99, 1.0] {
        let y = y_of(q);
        let _ = writeln!(
            out,
            r##"<line x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{q}</text>"##,
            left - 6.0,
            y + 4.0
        );
    }
    for (i, curve) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<String> = curve
            .points
            .iter()
            .map(|&(ns, q)| format!("{:.1},{:.1}", x_of(ns), y_of(q)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline class="cdf" points="{}" fill="none" stroke="{color}" stroke-width="1.5"/>"#,
            points.join(" ")
        );
        let ly = y1 + 16.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<rect x="{}" y="{}" width="12" height="3" fill="{color}"/><text x="{}" y="{}">{}</text>"#,
            right + 12.0,
            ly - 4.0,
            right + 30.0,
            ly,
            escape(&curve.label)
        );
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::{new_histogram, record};

    #[test]
    fn svg_is_well_formed_with_one_bar_per_config() {
        let bars: Vec<Bar> = ["podq cpu", "podq smt <strict>", "rayon & co"]
            .iter()
            .enumerate()
            .map(|(i, l)| Bar {
                label: (*l).to_owned(),
                value: 1000.0 * (i + 1) as f64,
            })
            .collect();
        let mut h = new_histogram();
        for v in 1..5000 {
            record(&mut h, v * 37);
        }
        let curves = vec![
            Curve::of("podq smt".into(), &h),
            Curve::of("crossbeam".into(), &h),
        ];
        let text = svg("queue & latency", &bars, &curves);
        let doc = roxmltree::Document::parse(&text).expect("well-formed XML");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        let class_count = |class: &str| {
            doc.descendants()
                .filter(|n| n.attribute("class") == Some(class))
                .count()
        };
        assert_eq!(class_count("bar"), 3);
        assert_eq!(class_count("cdf"), 2);
        // Bars scale to the largest value.
        let widths: Vec<f64> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("bar"))
            .map(|n| n.attribute("width").unwrap().parse().unwrap())
            .collect();
        assert!(widths[0] < widths[1] && widths[1] < widths[2]);
        assert!(text.contains("rayon &amp; co"));
    }

    #[test]
    fn panels_are_optional() {
        let only_bars = svg(
            "t",
            &[Bar {
                label: "a".into(),
                value: 1.0,
            }],
            &[],
        );
        assert!(roxmltree::Document::parse(&only_bars).is_ok());
        assert!(!only_bars.contains("polyline"));
        let empty_curve = svg("t", &[], &[Curve::of("x".into(), &new_histogram())]);
        assert!(roxmltree::Document::parse(&empty_curve).is_ok());
    }
}
