//! `podq monitor`: a live per-workqueue table in the spirit of the kernel's
//! `wq_monitor.py`, with per-node and per-CPU busy/idle from `/proc/stat` (as `mpstat`)
//! and the scheduler counters of the process's threads.
//!
//! Columns per workqueue, cumulative since the queue was made (the `/s`, CPU and thread
//! figures cover the last interval). From the queue's own totals: `total` items
//! started, `/s` started per second, `infl` started − completed, `rpr` repatriations.
//! From the pools the queue uses, summed (pools are shared between queues with equal
//! attributes, so these include other queues' items on shared pools): `cpu_s` CPU
//! seconds in items, `cont%` contended lock acquisitions (enqueue + dequeue), `local%`
//! items run in the LLC they were queued in (same CPU, SMT core or LLC), `p50`/`p99`
//! queue→start latency. When the stats carry no whole-queue latency, the worst pool's
//! percentile is shown, marked `^`: an upper bound of the pools' combined percentile,
//! since no pool has more than the tail's share of items above it.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use podq::control::Request;
use podq::procfs::{self, ProcStat, ThreadSched};
use podq::topology::CpuSet;
use serde::Serialize;
use serde_json::{json, Value};

use crate::target::TargetArgs;

/// Thread rows shown per sample in the table (the busiest); `--json` prints all.
const THREAD_ROWS: usize = 12;

/// `podq monitor` arguments.
#[derive(Args, Debug)]
pub struct MonitorArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Seconds between samples.
    #[arg(long, short = 'i', default_value = "1", value_parser = parse_interval)]
    interval: f64,
    /// Print JSON Lines (one object per workqueue, node, CPU and thread per sample).
    #[arg(long)]
    json: bool,
    /// Stop after this many samples.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Only workqueues whose name contains one of these strings.
    filters: Vec<String>,
}

fn parse_interval(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(s),
        _ => Err(format!("`{text}` is not a number of seconds in (0, 86400]")),
    }
}

/// One workqueue's row.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WqRow {
    /// The workqueue.
    pub name: String,
    /// The scope: the requested one, with what it resolved to for `default` and the
    /// scope chosen for `auto` (`auto (smt)`).
    pub scope: Option<String>,
    /// `auto`: switches made and the last one with its reason.
    pub last_switch: Option<String>,
    /// Items started.
    pub started: Option<u64>,
    /// Items completed.
    pub completed: Option<u64>,
    /// Started per second over the last interval.
    pub started_per_s: Option<f64>,
    /// CPU time spent in items, seconds.
    pub cpu_time_s: Option<f64>,
    /// Repatriations (non-strict pools).
    pub repatriated: Option<u64>,
    /// Lock acquisitions, enqueue + dequeue.
    pub lock_acquisitions: Option<u64>,
    /// Contended acquisitions among them.
    pub lock_contended: Option<u64>,
    /// Items run in the queuer's LLC or closer.
    pub local: Option<u64>,
    /// Items with a known locality.
    pub located: Option<u64>,
    /// Queue→start median, ns.
    pub queue_to_start_p50_ns: Option<u64>,
    /// Queue→start 99th percentile, ns.
    pub queue_to_start_p99_ns: Option<u64>,
    /// Whether the percentiles are the worst pool's (an upper bound).
    pub latency_is_pool_max: bool,
}

impl WqRow {
    /// In flight: started − completed, at least 0.
    pub fn in_flight(&self) -> Option<u64> {
        Some(self.started?.saturating_sub(self.completed?))
    }

    /// Contended share of lock acquisitions, percent.
    pub fn contended_percent(&self) -> Option<f64> {
        let (all, contended) = (self.lock_acquisitions?, self.lock_contended?);
        (all > 0).then(|| 100.0 * contended as f64 / all as f64)
    }

    /// Local share of located items, percent.
    pub fn local_percent(&self) -> Option<f64> {
        let (all, local) = (self.located?, self.local?);
        (all > 0).then(|| 100.0 * local as f64 / all as f64)
    }
}

/// Sums a numeric field over pools; `None` when no pool has it.
fn sum(pools: &[Value], path: &[&str]) -> Option<u64> {
    pools
        .iter()
        .filter_map(|p| path.iter().try_fold(p, |v, k| v.get(k))?.as_u64())
        .fold(None, |acc, v| Some(acc.unwrap_or(0) + v))
}

/// The row of one workqueue's stats object (`podq::stats::WorkqueueStats` as JSON).
pub fn wq_row(stats: &Value) -> WqRow {
    let empty = Vec::new();
    let pools = stats
        .get("pools")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
    // The queue's own counts when the stats have them; else the pools' (exact when
    // the queue shares no pool).
    let own = |k: &str| {
        stats
            .get("totals")
            .and_then(|t| t.get(k))
            .and_then(Value::as_u64)
            .or_else(|| sum(pools, &[k]))
    };
    let locality = |k| sum(pools, &["locality", k]);
    let local = add(
        add(locality("same_cpu"), locality("same_smt")),
        locality("same_llc"),
    );
    let located = add(add(local, locality("same_node")), locality("remote"));
    let percentile = |source: &Value, key: &str| {
        source
            .get("queue_to_start_ns")
            .and_then(|l| l.get(key))
            .and_then(Value::as_u64)
    };
    let whole = stats.get("queue_to_start_ns").is_some();
    let (p50, p99) = if whole {
        (percentile(stats, "p50"), percentile(stats, "p99"))
    } else {
        let worst = |key| {
            pools
                .iter()
                .filter(|p| percentile(p, "count").unwrap_or(0) > 0)
                .filter_map(|p| percentile(p, key))
                .max()
        };
        (worst("p50"), worst("p99"))
    };
    let requested = stats
        .get("attrs")
        .and_then(|a| a.get("scope"))
        .and_then(Value::as_str);
    let effective = stats.get("effective_scope").and_then(Value::as_str);
    let auto = stats.get("auto").filter(|a| !a.is_null());
    let scope = match (requested, effective) {
        (Some("default"), Some(e)) if auto.is_some() => Some(format!("default (auto: {e})")),
        (Some(r @ ("default" | "auto")), Some(e)) => Some(format!("{r} ({e})")),
        (Some(r), _) => Some(r.to_owned()),
        (None, e) => e.map(str::to_owned),
    };
    let last_switch = auto.map(|a| {
        let switches = a.get("switches").and_then(Value::as_u64).unwrap_or(0);
        let last = a
            .get("last_switch")
            .cloned()
            .and_then(|s| serde_json::from_value::<podq::policy::auto::Switch>(s).ok());
        match last {
            Some(s) => format!(
                "{switches} switch(es); last at window {}: {} -> {}: {}",
                s.window, s.from, s.to, s.reason
            ),
            None => format!("{switches} switch(es)"),
        }
    });
    WqRow {
        name: stats
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned(),
        scope,
        last_switch,
        started: own("started"),
        completed: own("completed"),
        started_per_s: None,
        cpu_time_s: sum(pools, &["cpu_time_ns"]).map(|ns| ns as f64 / 1e9),
        repatriated: own("repatriated"),
        lock_acquisitions: add(
            sum(pools, &["enqueue_lock", "acquisitions"]),
            sum(pools, &["dequeue_lock", "acquisitions"]),
        ),
        lock_contended: add(
            sum(pools, &["enqueue_lock", "contended"]),
            sum(pools, &["dequeue_lock", "contended"]),
        ),
        local,
        located,
        queue_to_start_p50_ns: p50,
        queue_to_start_p99_ns: p99,
        latency_is_pool_max: !whole && p99.is_some(),
    }
}

/// Busy/idle share of one CPU or node over the interval.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BusyRow {
    /// `node` or `cpu`.
    pub kind: &'static str,
    /// The node or CPU number.
    pub id: usize,
    /// Busy percent (`None` when no tick passed).
    pub busy_pct: Option<f64>,
    /// Idle percent, iowait included.
    pub idle_pct: Option<f64>,
}

/// Per-node then per-CPU busy/idle rows from a `/proc/stat` delta.
pub fn busy_rows(delta: &ProcStat, nodes: &BTreeMap<usize, CpuSet>) -> Vec<BusyRow> {
    let row = |kind, id, times: &procfs::CpuTimes| BusyRow {
        kind,
        id,
        busy_pct: times.busy_percent(),
        idle_pct: times.busy_percent().map(|b| 100.0 - b),
    };
    let mut rows: Vec<BusyRow> = nodes
        .iter()
        .map(|(&node, cpus)| row("node", node, &delta.total_of(cpus)))
        .collect();
    rows.extend(delta.cpus.iter().map(|(&cpu, t)| row("cpu", cpu, t)));
    rows
}

/// One thread's counters over the interval.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ThreadRow {
    /// Thread id.
    pub tid: u32,
    /// Thread name.
    pub name: String,
    /// Voluntary context switches in the interval.
    pub voluntary: u64,
    /// Involuntary context switches in the interval.
    pub involuntary: u64,
    /// Migrations in the interval; `None`: the kernel does not expose them.
    pub migrations: Option<u64>,
    /// CPU time in the interval, ms.
    pub cpu_ms: f64,
}

/// Thread rows from two samples, busiest first; threads new since `before` count from 0.
pub fn thread_rows(before: &HashMap<u32, ThreadSched>, now: &[ThreadSched]) -> Vec<ThreadRow> {
    let mut rows: Vec<ThreadRow> = now
        .iter()
        .map(|t| {
            let b = before.get(&t.tid);
            let since = |f: fn(&ThreadSched) -> u64| f(t).saturating_sub(b.map_or(0, f));
            ThreadRow {
                tid: t.tid,
                name: t.name.clone(),
                voluntary: since(|t| t.voluntary_ctxt_switches),
                involuntary: since(|t| t.nonvoluntary_ctxt_switches),
                migrations: t
                    .migrations
                    .map(|m| m.saturating_sub(b.and_then(|b| b.migrations).unwrap_or(0))),
                cpu_ms: since(|t| t.cpu_time_ns) as f64 / 1e6,
            }
        })
        .collect();
    rows.sort_by(|a, b| b.cpu_ms.total_cmp(&a.cpu_ms).then(a.tid.cmp(&b.tid)));
    rows
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

/// Nanoseconds in a short human unit.
fn duration_ns(ns: Option<u64>, upper_bound: bool) -> String {
    let Some(ns) = ns else {
        return "-".to_owned();
    };
    let text = match ns {
        0..=9_999 => format!("{ns}ns"),
        10_000..=9_999_999 => format!("{:.1}us", ns as f64 / 1e3),
        _ => format!("{:.1}ms", ns as f64 / 1e6),
    };
    if upper_bound {
        format!("^{text}")
    } else {
        text
    }
}

/// The table for one sample.
pub fn render_table(wqs: &[WqRow], busy: &[BusyRow], threads: &[ThreadRow]) -> String {
    let header = [
        "WORKQUEUE",
        "scope",
        "total",
        "/s",
        "infl",
        "cpu_s",
        "rpr",
        "cont%",
        "local%",
        "p50",
        "p99",
    ];
    let rows: Vec<[String; 11]> = wqs
        .iter()
        .map(|w| {
            [
                w.name.clone(),
                w.scope.clone().unwrap_or_else(|| "-".into()),
                opt(w.started),
                w.started_per_s.map_or("-".into(), |r| format!("{r:.0}")),
                opt(w.in_flight()),
                w.cpu_time_s.map_or("-".into(), |s| format!("{s:.3}")),
                opt(w.repatriated),
                pct(w.contended_percent()),
                pct(w.local_percent()),
                duration_ns(w.queue_to_start_p50_ns, w.latency_is_pool_max),
                duration_ns(w.queue_to_start_p99_ns, w.latency_is_pool_max),
            ]
        })
        .collect();
    let mut out = crate::table::render(&header, &rows);
    for w in wqs {
        if let Some(last) = &w.last_switch {
            out.push_str(&format!("{} auto: {last}\n", w.name));
        }
    }
    let rows: Vec<[String; 3]> = busy
        .iter()
        .map(|b| {
            [
                format!("{}{}", b.kind, b.id),
                pct(b.busy_pct),
                pct(b.idle_pct),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&crate::table::render(&["CPU", "busy%", "idle%"], &rows));
    let rows: Vec<[String; 6]> = threads
        .iter()
        .take(THREAD_ROWS)
        .map(|t| {
            [
                t.tid.to_string(),
                t.name.clone(),
                format!("{:.1}", t.cpu_ms),
                t.voluntary.to_string(),
                t.involuntary.to_string(),
                t.migrations.map_or("unavailable".into(), |m| m.to_string()),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&crate::table::render(
        &["TID", "THREAD", "cpu_ms", "vcsw", "ivcsw", "migr"],
        &rows,
    ));
    out
}

/// Runs `podq monitor`.
pub fn run(args: MonitorArgs) -> Result<()> {
    let mut client = args.target.connect()?;
    let pid = u32::try_from(client.server_credentials()?.pid)
        .context("the control server reported no process id")?;
    let interval = Duration::from_secs_f64(args.interval);
    let stats_request = Request::Stats { queue: None };
    let mut prev_stat = procfs::read_proc_stat()?;
    let nodes = procfs::read_node_cpus(&prev_stat)?;
    let mut prev_threads: HashMap<u32, ThreadSched> = procfs::read_threads(pid)
        .with_context(|| format!("cannot read the threads of process {pid}"))?
        .into_iter()
        .map(|t| (t.tid, t))
        .collect();
    // A first stats sample, so the first printed one already has rates.
    let mut prev_started: HashMap<String, u64> = client
        .call(&stats_request)
        .context("cannot read stats")?
        .stats
        .unwrap_or_default()
        .iter()
        .map(wq_row)
        .filter_map(|w| Some((w.name, w.started?)))
        .collect();
    let mut last = Instant::now();
    let mut out = std::io::stdout().lock();
    let mut sample = 0u64;
    while args.count.map_or(true, |n| sample < n) {
        thread::sleep(interval);
        sample += 1;
        let reply = client
            .call(&stats_request)
            .context("cannot read stats (has the process exited?)")?;
        let elapsed = last.elapsed().as_secs_f64();
        last = Instant::now();
        let mut wqs: Vec<WqRow> = reply
            .stats
            .context("the server's stats reply has no stats")?
            .iter()
            .map(wq_row)
            .filter(|w| args.filters.is_empty() || args.filters.iter().any(|f| w.name.contains(f)))
            .collect();
        for w in &mut wqs {
            if let Some(started) = w.started {
                if let Some(before) = prev_started.insert(w.name.clone(), started) {
                    w.started_per_s = Some(started.saturating_sub(before) as f64 / elapsed);
                }
            }
        }
        let stat = procfs::read_proc_stat()?;
        let busy = busy_rows(&stat.since(&prev_stat), &nodes);
        prev_stat = stat;
        let threads_now = match procfs::read_threads(pid) {
            Ok(t) => t,
            Err(e) => bail!("cannot read the threads of process {pid}: {e}"),
        };
        let threads = thread_rows(&prev_threads, &threads_now);
        prev_threads = threads_now.into_iter().map(|t| (t.tid, t)).collect();
        if args.json {
            let timestamp = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let mut line = |kind: &str, body: Value| -> Result<()> {
                let mut object = json!({ "timestamp": timestamp, "kind": kind });
                if let (Some(o), Value::Object(b)) = (object.as_object_mut(), body) {
                    o.extend(b);
                }
                writeln!(out, "{object}")?;
                Ok(())
            };
            for w in &wqs {
                let mut body = serde_json::to_value(w)?;
                body["in_flight"] = json!(w.in_flight());
                line("workqueue", body)?;
            }
            for b in &busy {
                line(
                    b.kind,
                    json!({ "id": b.id, "busy_pct": b.busy_pct, "idle_pct": b.idle_pct }),
                )?;
            }
            for t in &threads {
                line("thread", serde_json::to_value(t)?)?;
            }
        } else {
            writeln!(out, "{}", render_table(&wqs, &busy, &threads))?;
        }
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(started: u64, completed: u64, p99: u64) -> Value {
        json!({
            "id": 1, "pod_cpus": "0-1", "strict": false,
            "queued": started + 2, "started": started, "completed": completed,
            "panicked": 0, "cancelled": 0, "repatriated": 3,
            "workers_created": 2, "workers_reaped": 0, "workers": 2, "idle": 1,
            "max_active_waits": 0,
            "enqueue_lock": { "acquisitions": 100, "contended": 10, "wait_ns": 5 },
            "dequeue_lock": { "acquisitions": 100, "contended": 30, "wait_ns": 5 },
            "locality": { "same_cpu": 5, "same_smt": 0, "same_llc": 3, "same_node": 2, "remote": 0 },
            "queue_to_start_ns": { "count": started, "min": 1, "mean": 2.0, "stdev": 0.0,
                                   "max": p99, "p50": p99 / 2, "p90": p99, "p99": p99, "p999": p99 },
            "run_time_ns": { "count": 0, "min": 0, "mean": 0.0, "stdev": 0.0, "max": 0,
                             "p50": 0, "p90": 0, "p99": 0, "p999": 0 },
            "cpu_time_ns": 1_500_000_000u64
        })
    }

    #[test]
    fn rows_sum_pools() {
        let stats = json!({ "name": "rpciod", "pools": [pool(10, 7, 4000), pool(20, 20, 9000)] });
        let row = wq_row(&stats);
        assert_eq!(row.name, "rpciod");
        assert_eq!(row.started, Some(30));
        assert_eq!(row.in_flight(), Some(3));
        assert_eq!(row.cpu_time_s, Some(3.0));
        assert_eq!(row.repatriated, Some(6));
        // The queue's own totals win over the shared pools' counts.
        let mut own = stats.clone();
        own["totals"] = json!({ "started": 12, "completed": 11, "repatriated": 1 });
        let row = wq_row(&own);
        assert_eq!(
            (row.started, row.in_flight(), row.repatriated),
            (Some(12), Some(1), Some(1))
        );
        let row = wq_row(&stats);
        assert_eq!(row.contended_percent(), Some(20.0));
        assert_eq!(row.local_percent(), Some(80.0));
        assert_eq!(row.queue_to_start_p99_ns, Some(9000));
        assert_eq!(row.queue_to_start_p50_ns, Some(4500));
        assert!(row.latency_is_pool_max);
        // A whole-queue latency, when the stats have one, is used as is.
        let mut stats = stats;
        stats["queue_to_start_ns"] = json!({ "p50": 100, "p99": 700 });
        let row = wq_row(&stats);
        assert_eq!(row.queue_to_start_p99_ns, Some(700));
        assert!(!row.latency_is_pool_max);
    }

    #[test]
    fn auto_shows_its_scope_and_last_switch() {
        let stats = json!({
            "name": "rpciod",
            "attrs": { "scope": "auto" },
            "effective_scope": "system",
            "auto": {
                "scope": "system", "switches": 1,
                "last_switch": {
                    "window": 12, "from": "cache_shard", "to": "system", "strict": false,
                    "reason": { "kind": "imbalance", "saturated_cpus": 8, "idle_cpus": 8,
                                "saturated_busy": 0.9, "idle_busy": 0.0 }
                }
            },
            "pools": []
        });
        let row = wq_row(&stats);
        assert_eq!(row.scope.as_deref(), Some("auto (system)"));
        assert_eq!(
            row.last_switch.as_deref(),
            Some("1 switch(es); last at window 12: cache_shard -> system: imbalance: 8 CPUs 90% busy, 8 CPUs 0% busy")
        );
        let table = render_table(&[row], &[], &[]);
        assert!(table.contains("auto (system)"), "{table}");
        assert!(table.contains("rpciod auto: 1 switch(es)"), "{table}");
        let fixed = wq_row(&json!({ "name": "q", "attrs": { "scope": "smt" },
                                    "effective_scope": "smt", "pools": [] }));
        assert_eq!(fixed.scope.as_deref(), Some("smt"));
        assert_eq!(fixed.last_switch, None);
    }

    #[test]
    fn missing_fields_show_as_unknown() {
        let row = wq_row(&json!({ "name": "empty", "pools": [] }));
        assert_eq!(row.started, None);
        assert_eq!(row.in_flight(), None);
        assert_eq!(row.contended_percent(), None);
        let table = render_table(&[row], &[], &[]);
        assert!(
            table.lines().nth(1).unwrap().starts_with("empty"),
            "{table}"
        );
        assert!(table.contains(" -"), "{table}");
    }

    #[test]
    fn busy_and_thread_rows() {
        let text = |user0, idle0, user1, idle1| {
            format!(
                "cpu 0 0 0 0 0 0 0 0\ncpu0 {user0} 0 0 {idle0} 0 0 0 0\ncpu1 {user1} 0 0 {idle1} 0 0 0 0\n"
            )
        };
        let before = procfs::parse_proc_stat(&text(0, 0, 0, 0)).unwrap();
        let after = procfs::parse_proc_stat(&text(75, 25, 0, 100)).unwrap();
        let nodes = BTreeMap::from([(0, CpuSet::first_n(2))]);
        let rows = busy_rows(&after.since(&before), &nodes);
        assert_eq!(
            rows[0],
            BusyRow {
                kind: "node",
                id: 0,
                busy_pct: Some(37.5),
                idle_pct: Some(62.5)
            }
        );
        assert_eq!(rows[1].busy_pct, Some(75.0));
        assert_eq!(rows[2].idle_pct, Some(100.0));

        let t = |tid, cpu, vol, migr| ThreadSched {
            tid,
            name: format!("w{tid}"),
            voluntary_ctxt_switches: vol,
            nonvoluntary_ctxt_switches: 1,
            cpu_time_ns: cpu,
            cpu_time_source: procfs::CpuTimeSource::Schedstat,
            migrations: migr,
        };
        let before = HashMap::from([(1, t(1, 1_000_000, 5, Some(2)))]);
        let rows = thread_rows(
            &before,
            &[t(1, 3_000_000, 9, Some(4)), t(2, 5_000_000, 1, None)],
        );
        assert_eq!(rows[0].tid, 2, "busiest first");
        assert_eq!(rows[0].migrations, None);
        assert_eq!(rows[1].cpu_ms, 2.0);
        assert_eq!(rows[1].voluntary, 4);
        assert_eq!(rows[1].migrations, Some(2));
        let table = render_table(&[], &[], &rows);
        assert!(table.contains("unavailable"), "{table}");
    }

    #[test]
    fn interval_must_be_positive() {
        assert_eq!(parse_interval("0.5"), Ok(0.5));
        for bad in ["0", "-1", "x", "inf", "NaN"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
    }
}
