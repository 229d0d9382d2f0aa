//! `podq bench compare`: two sets of `--json` results side by side, such as the same
//! runs from a build with podq's statistics and one without, taken in alternation.
//!
//! Results are matched by test, system, scope, strictness and segment. For each match
//! the k-th value from the base files is paired with the k-th from the new files (in
//! the order given), so the files of interleaved runs pair up run by run; each pair
//! gives a ratio new / base, and the table shows the median ratio and its spread.
//! Where the results count context switches (`queue`, `throughput`), the table shows
//! each side's median switches per 1000 items too: a closed loop's runs fall into
//! patterns of about two switches an item or fewer, and a ratio taken across patterns
//! says more about the machine's minute than about the builds.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;

use super::report::{human_ns, human_rate, table, SCHEMA_VERSION};
use super::usage;

/// The figure compared for each test, and whether higher is better.
fn figure(test: &str) -> (&'static str, bool) {
    match test {
        "latency" => ("p50_ns", false),
        t if t.starts_with("memory") => ("bytes_per_item", false),
        "idle" => ("idle_cpu_share", false),
        _ => ("items_per_sec", true),
    }
}

/// One matched result.
#[derive(Debug, Serialize, PartialEq)]
pub struct Comparison {
    /// `test system scope` as the tables label it.
    pub key: String,
    /// The figure compared.
    pub metric: &'static str,
    /// Pairs behind the ratio.
    pub pairs: usize,
    /// Median of the base values.
    pub base: f64,
    /// Median of the new values.
    pub new: f64,
    /// Median of the pairs' ratios new / base.
    pub ratio: f64,
    /// Smallest and largest pair ratio.
    pub ratio_min: f64,
    /// See `ratio_min`.
    pub ratio_max: f64,
    /// Whether a higher value is better.
    pub higher_is_better: bool,
    /// Median context switches per 1000 items of the paired base runs, where every
    /// one of them counted its switches.
    pub base_switches_per_1k: Option<f64>,
    /// The same for the new runs.
    pub new_switches_per_1k: Option<f64>,
}

/// The median of `values` (sorted in place); NaN if empty.
pub(super) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn key_of(result: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    let mut key = format!("{} {}", text(&result["test"]), text(&result["system"]));
    if let Some(scope) = result["scope"].as_str() {
        key.push(' ');
        key.push_str(scope);
        if result["strict"] == Value::Bool(true) {
            key.push_str(" strict");
        }
    }
    if let Some(pods) = result["throughput"]["pods"]["pods"]
        .as_u64()
        .or(result["idle"]["pods"].as_u64())
    {
        key.push_str(&format!(" {pods} pods"));
    }
    if let Some(segment) = result["segment"].as_u64() {
        key.push_str(&format!(" (segment {segment})"));
    }
    key
}

fn value_of(result: &Value, metric: &str) -> Option<f64> {
    match metric {
        "p50_ns" => result["latency_ns"]["p50"].as_f64(),
        "bytes_per_item" => result["memory"]["bytes_per_item"].as_f64(),
        "idle_cpu_share" => {
            let idle = &result["idle"];
            Some(idle["cpu_ns"].as_f64()? / 1e9 / idle["window_seconds"].as_f64()?)
        }
        _ => result["items_per_sec"].as_f64(),
    }
}

/// A result's context switches per 1000 items (runs), where it counts them.
fn switches_per_1k(result: &Value) -> Option<f64> {
    let (switches, items) = match result["context_switches"].as_f64() {
        Some(switches) => (switches, result["items"].as_f64()?),
        None => {
            let throughput = &result["throughput"];
            (
                throughput["context_switches"].as_f64()?,
                throughput["runs"].as_f64()?,
            )
        }
    };
    (items > 0.0).then(|| switches * 1000.0 / items)
}

/// One result of one file: the compared figure and the switches per 1000 items.
#[derive(Clone, Copy)]
struct Run {
    value: f64,
    switches_per_1k: Option<f64>,
}

/// The median switches per 1000 items of `runs`, if every one of them counted its
/// switches.
fn median_switches(runs: &[Run]) -> Option<f64> {
    let mut all: Vec<f64> = runs
        .iter()
        .map(|r| r.switches_per_1k)
        .collect::<Option<_>>()?;
    Some(median(&mut all))
}

/// Per result key: the metric, whether higher is better, and the runs in file order.
type Collected = BTreeMap<String, (&'static str, bool, Vec<Run>)>;

/// Every result's figure, by key, in file order.
fn collect(files: &[String]) -> Result<Collected> {
    let mut out = Collected::new();
    for file in files {
        let text =
            std::fs::read_to_string(file).map_err(|e| usage(format!("cannot read {file}: {e}")))?;
        let report: Value = serde_json::from_str(&text)
            .map_err(|e| usage(format!("{file} is not podq bench JSON: {e}")))?;
        if report["schema_version"].as_u64() != Some(u64::from(SCHEMA_VERSION)) {
            return Err(usage(format!(
                "{file}: schema_version {} is not {SCHEMA_VERSION}, the one this podq reads",
                report["schema_version"]
            )));
        }
        let results = report["results"]
            .as_array()
            .with_context(|| format!("{file}: no results array"))?;
        for r in results {
            let test = r["test"].as_str().unwrap_or("");
            let (metric, higher) = figure(test);
            if let Some(value) = value_of(r, metric) {
                out.entry(key_of(r))
                    .or_insert((metric, higher, Vec::new()))
                    .2
                    .push(Run {
                        value,
                        switches_per_1k: switches_per_1k(r),
                    });
            }
        }
    }
    Ok(out)
}

/// Compares the results of `base` and `new` files.
pub fn compare(base: &[String], new: &[String]) -> Result<Vec<Comparison>> {
    if base.is_empty() || new.is_empty() {
        return Err(usage("compare needs --base FILE,... and --new FILE,..."));
    }
    let base = collect(base)?;
    let new = collect(new)?;
    let mut out = Vec::new();
    for (key, (metric, higher, b)) in &base {
        let Some((_, _, n)) = new.get(key) else {
            continue;
        };
        let paired: Vec<(Run, Run)> = b
            .iter()
            .zip(n)
            .filter(|(b, _)| b.value != 0.0)
            .map(|(b, n)| (*b, *n))
            .collect();
        if paired.is_empty() {
            continue;
        }
        let pairs = paired.len();
        let mut ratios: Vec<f64> = paired.iter().map(|(b, n)| n.value / b.value).collect();
        let (base_runs, new_runs): (Vec<Run>, Vec<Run>) = paired.into_iter().unzip();
        out.push(Comparison {
            key: key.clone(),
            metric,
            pairs,
            base: median(&mut base_runs.iter().map(|r| r.value).collect::<Vec<_>>()),
            new: median(&mut new_runs.iter().map(|r| r.value).collect::<Vec<_>>()),
            ratio: median(&mut ratios),
            ratio_min: ratios[0],
            ratio_max: ratios[pairs - 1],
            higher_is_better: *higher,
            base_switches_per_1k: median_switches(&base_runs),
            new_switches_per_1k: median_switches(&new_runs),
        });
    }
    if out.is_empty() {
        return Err(usage(
            "the base and new files have no result in common (same test, system, scope)",
        ));
    }
    Ok(out)
}

/// The table of `compare`.
pub fn render(rows: &[Comparison]) -> String {
    let fmt = |metric: &str, v: f64| match metric {
        "items_per_sec" => human_rate(v),
        "p50_ns" => human_ns(v),
        "bytes_per_item" => format!("{v:.1} B"),
        _ => format!("{:.4}%", v * 100.0),
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|c| {
            let change = (c.ratio - 1.0) * 100.0;
            vec![
                c.key.clone(),
                c.metric.to_owned(),
                c.pairs.to_string(),
                fmt(c.metric, c.base),
                fmt(c.metric, c.new),
                format!("{:.3}x ({change:+.1}%)", c.ratio),
                format!("{:.3}x … {:.3}x", c.ratio_min, c.ratio_max),
                if c.higher_is_better {
                    "higher"
                } else {
                    "lower"
                }
                .to_owned(),
                match (c.base_switches_per_1k, c.new_switches_per_1k) {
                    (Some(b), Some(n)) => format!("{b:.1} → {n:.1}"),
                    _ => "-".to_owned(),
                },
            ]
        })
        .collect();
    format!(
        "new against base: per result the median of the pairs' ratios new / base (k-th base run with k-th new run), and their spread; ctxsw/1k items: each side's median context switches per 1000 items, where the runs count them\n{}",
        table(
            &["result", "metric", "pairs", "base median", "new median", "ratio", "pairs min … max", "better", "ctxsw/1k items"],
            &cells,
            3
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &tempfile::TempDir, name: &str, rates: &[(&str, f64)]) -> String {
        let results: Vec<Value> = rates
            .iter()
            .map(|(scope, rate)| {
                serde_json::json!({"test": "queue", "system": "podq", "scope": scope,
                    "strict": false, "segment": null, "items_per_sec": rate})
            })
            .collect();
        write(dir, name, results)
    }

    fn write(dir: &tempfile::TempDir, name: &str, results: Vec<Value>) -> String {
        let report = serde_json::json!({"schema_version": SCHEMA_VERSION, "results": results});
        let path = dir.path().join(name);
        std::fs::write(&path, report.to_string()).unwrap();
        path.display().to_string()
    }

    /// A `queue` result that counted `switches` over `items`, or a `throughput` one.
    fn switching(test: &str, rate: f64, items: u64, switches: Option<u64>) -> Value {
        let mut r = serde_json::json!({"test": test, "system": "podq", "scope": "system",
            "strict": false, "segment": null, "items_per_sec": rate, "items": items,
            "context_switches": null, "throughput": null});
        if test == "queue" {
            r["context_switches"] = serde_json::json!(switches);
        } else {
            r["throughput"] = serde_json::json!({"runs": items, "context_switches": switches});
        }
        r
    }

    #[test]
    fn pairs_runs_in_order_and_takes_the_median_ratio() {
        let dir = tempfile::tempdir().unwrap();
        let base = [
            file(&dir, "b1", &[("cpu", 100.0), ("system", 50.0)]),
            file(&dir, "b2", &[("cpu", 200.0)]),
            file(&dir, "b3", &[("cpu", 100.0)]),
        ];
        let new = [
            file(&dir, "n1", &[("cpu", 90.0)]),
            file(&dir, "n2", &[("cpu", 220.0)]),
            file(&dir, "n3", &[("cpu", 95.0)]),
        ];
        let rows = compare(&base, &new).unwrap();
        // `system` has no new counterpart.
        assert_eq!(rows.len(), 1);
        let c = &rows[0];
        assert_eq!(c.key, "queue podq cpu");
        assert_eq!(c.pairs, 3);
        // Ratios 0.9, 1.1, 0.95.
        assert!((c.ratio - 0.95).abs() < 1e-12, "{c:?}");
        assert!((c.ratio_min - 0.9).abs() < 1e-12 && (c.ratio_max - 1.1).abs() < 1e-12);
        assert_eq!((c.base, c.new), (100.0, 95.0));
        assert!(render(&rows).contains("0.950x (-5.0%)"));
    }

    #[test]
    fn shows_each_sides_median_switches_per_item_where_every_run_counted_them() {
        let dir = tempfile::tempdir().unwrap();
        // (items, switches per 1000 items) per run: base at 2000, 1000, 2000; new at
        // 500, 500, 1500; the re-queued test's switches 100 times fewer.
        let runs = |name: &str, rate: f64, shape: [(u64, u64); 3], uncounted: Option<usize>| {
            shape
                .iter()
                .enumerate()
                .map(|(i, &(items, per_1k))| {
                    let q = switching("queue", rate, items, Some(items * per_1k / 1000));
                    let counted = (uncounted != Some(i)).then_some(items * per_1k / 100_000);
                    let t = switching("throughput_work", rate, items, counted);
                    write(&dir, &format!("{name}{i}"), vec![q, t])
                })
                .collect::<Vec<String>>()
        };
        let base = runs("b", 100.0, [(2000, 2000), (1000, 1000), (4000, 2000)], None);
        // The new set's second re-queued run did not count its switches.
        let new = runs(
            "n",
            150.0,
            [(2000, 500), (1000, 500), (4000, 1500)],
            Some(1),
        );
        let rows = compare(&base, &new).unwrap();
        let queue = rows.iter().find(|c| c.key == "queue podq system").unwrap();
        assert_eq!(queue.base_switches_per_1k, Some(2000.0));
        assert_eq!(queue.new_switches_per_1k, Some(500.0));
        let work = rows
            .iter()
            .find(|c| c.key == "throughput_work podq system")
            .unwrap();
        assert_eq!(work.base_switches_per_1k, Some(20.0));
        assert_eq!(work.new_switches_per_1k, None, "{work:?}");
        let table = render(&rows);
        assert!(table.contains("2000.0 → 500.0"), "{table}");
    }

    #[test]
    fn refuses_files_of_another_schema_or_with_nothing_in_common() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old");
        std::fs::write(&old, r#"{"schema_version": 1, "results": []}"#).unwrap();
        let old = old.display().to_string();
        let a = file(&dir, "a", &[("cpu", 1.0)]);
        let b = file(&dir, "b", &[("smt", 1.0)]);
        let err = compare(&[old], std::slice::from_ref(&a))
            .unwrap_err()
            .to_string();
        assert!(err.contains("schema_version 1"), "{err}");
        let err = compare(&[a], &[b]).unwrap_err().to_string();
        assert!(err.contains("no result in common"), "{err}");
        let err = compare(&[], &[]).unwrap_err().to_string();
        assert!(err.contains("--base"), "{err}");
    }
}
