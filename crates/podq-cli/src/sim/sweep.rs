//! The sensitivity sweep: every cost parameter at x0.5 and x2, one at a time, and how
//! far each moves the result of every configuration.

use anyhow::Result;
use indicatif::ProgressBar;
use podq_sim::{cost::PARAMS, simulate, Workload};

use super::{Case, Setup};
use crate::bench::report;
use crate::bench::usage;

/// The metric a case is judged by: items/s (I/Os per second in `completion`, clat
/// p50 in `latency`, where lower is better).
fn metric(case: &Case, setup: &Setup, params: &podq_sim::CostParams) -> Result<f64> {
    let out = simulate(&setup.topology, params, &case.spec).map_err(|e| usage(e.to_string()))?;
    let seg = &out.segments[0];
    Ok(match case.spec.workload {
        Workload::Latency { .. } => seg.hists.latency.value_at_quantile(0.5) as f64,
        _ => seg.items as f64 / seg.seconds.max(f64::MIN_POSITIVE),
    })
}

/// Runs the sweep and renders its table: per configuration, the parameters sorted by
/// the largest relative change they cause.
pub fn run(cases: &[Case], setup: &Setup, progress: &ProgressBar) -> Result<String> {
    let mut out = format!(
        "podq sim sensitivity: machine {}, each parameter x0.5 and x2 alone; change of items/s (latency: clat p50)\n",
        setup.machine.name
    );
    // Scaling cannot move a parameter that is 0; name them rather than let them pass
    // for parameters that do not matter.
    let zero: Vec<&str> = PARAMS
        .iter()
        .filter(|p| setup.params.get(p.name) == Some(0.0))
        .map(|p| p.name)
        .collect();
    if !zero.is_empty() {
        out.push_str(&format!(
            "not swept, 0 here (set them with --cost to try): {}\n",
            zero.join(", ")
        ));
    }
    for case in cases {
        let base = metric(case, setup, &setup.params)?;
        progress.inc(1);
        // The noise floor: the same run with the next seeds.
        let mut reseeded = Case {
            spec: case.spec.clone(),
        };
        let mut noise = Vec::new();
        for k in 1..=2 {
            reseeded.spec.seed = case.spec.seed.wrapping_add(k);
            noise
                .push(metric(&reseeded, setup, &setup.params)? / base.max(f64::MIN_POSITIVE) - 1.0);
            progress.inc(1);
        }
        let mut rows: Vec<(f64, Vec<String>)> = Vec::new();
        for p in PARAMS {
            let value = setup.params.get(p.name).unwrap_or(0.0);
            let mut changes = Vec::new();
            for factor in [0.5, 2.0] {
                let mut params = setup.params.clone();
                params.set(p.name, value * factor);
                let change = if params.validate().is_err() || value == 0.0 {
                    None
                } else {
                    let m = metric(case, setup, &params)?;
                    Some(m / base.max(f64::MIN_POSITIVE) - 1.0)
                };
                progress.inc(1);
                changes.push(change);
            }
            let size = changes
                .iter()
                .flatten()
                .map(|c| c.abs())
                .fold(0.0, f64::max);
            let cell = |c: Option<f64>| c.map_or("-".to_owned(), |c| format!("{:+.1}%", c * 100.0));
            rows.push((
                size,
                vec![p.name.to_owned(), cell(changes[0]), cell(changes[1])],
            ));
        }
        rows.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1[0].cmp(&b.1[0])));
        let mut rows: Vec<Vec<String>> = rows.into_iter().take(8).map(|(_, r)| r).collect();
        rows.push(vec![
            "(seed +1, +2: noise)".to_owned(),
            format!("{:+.1}%", noise[0] * 100.0),
            format!("{:+.1}%", noise[1] * 100.0),
        ]);
        out.push_str(&format!(
            "\n{} {}{}: base {:.4e}; the 8 parameters that move it most\n{}",
            case.spec.workload.name(),
            case.spec.queue.scope,
            if case.spec.queue.strict {
                " strict"
            } else {
                ""
            },
            base,
            report::table(&["parameter", "x0.5", "x2"], &rows, 1)
        ));
    }
    Ok(out)
}
