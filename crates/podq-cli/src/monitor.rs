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
//! queue→start latency, `mayday` calls for a rescuer and items `rescued`. When the
//! stats carry no whole-queue latency, the worst pool's percentile is shown, marked
//! `≤`: an upper bound of the pools' combined percentile, since no pool has more than
//! the tail's share of items above it.
//!
//! On a terminal each sample replaces the previous one (like `top`); piped, samples
//! follow each other, each under a line with its time.

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::procinfo::{self, ProcStat, ThreadSched};
use anyhow::{Context, Result};
use clap::Args;
use podq::control::{escape_controls, Request};
use podq::stats::{Latency, PoolStats};
use podq::topology::{CpuSet, Scope};
use podq::WorkqueueStats;
use serde::Serialize;
use serde_json::{json, Value};

use crate::target::{Session, TargetArgs};

/// Thread rows shown per sample in the table (the busiest); `--json` prints all.
const THREAD_ROWS: usize = 12;

/// What the table's columns mean, for `--help`.
const COLUMNS_HELP: &str = "\
Columns (per workqueue; counts since it was made, rates over the last interval):
  scope    the affinity scope; for `default` and `auto` the scope in force in
           parentheses (`auto (smt)`); an auto queue's switches and the last one's
           reason follow the table
  total    items started
  /s       items started per second
  infl     in flight: started but not finished
  cpu_s    CPU seconds the pools' workers spent in items
  rpr      repatriations: an idle worker that last ran outside its pod woken to run
           there again (non-strict pools)
  cont%    share of pool-lock acquisitions that found the lock held (queue + take)
  local%   share of items run in the LLC they were queued in (same CPU, core or LLC)
  p50 p99  queue -> start latency; `≤` marks the worst pool's figure, an upper bound
           of the queue's own when it uses several pools
  mayday   calls for the rescuer while no worker could be started
  rescued  items the rescuer ran
A queue whose items the stall watchdog found stalled or running long gets a line
below the table with the counts and the last stall; CPU-intensive counts the workers
its pools took out of their running count for an item past 10 ms, and the items
their batches handed back to the worklist then.
cpu_s, cont%, local%, the percentiles, mayday and rescued cover the pools the queue
uses; pools are shared by queues with equal attributes. Then busy/idle per node and
CPU (/proc/stat) and the busiest threads of the process (/proc/PID/task).
On a terminal the screen is redrawn in place; piped, samples are appended.

Examples:
  podq monitor --pid 9464
  podq monitor --pid 9464 -i 500ms rpciod nfsiod
  podq monitor --pid 9464 --json --count 10 > samples.jsonl";

/// `podq monitor` arguments.
#[derive(Args, Debug)]
#[command(after_long_help = COLUMNS_HELP)]
pub struct MonitorArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Time between samples: seconds (`2`, `0.5`) or a duration (`500ms`, `1m`), at
    /// most a day.
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
    let seconds = text.parse::<f64>().ok().or_else(|| {
        humantime::parse_duration(text)
            .ok()
            .map(|d| d.as_secs_f64())
    });
    match seconds {
        Some(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(s),
        _ => Err(format!(
            "`{text}` is not an interval above 0 and at most a day: seconds (0.5) or a duration (500ms, 2s, 1m)"
        )),
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
    /// The stall watchdog: stalls and long items found, and the last stall (`None`
    /// while it found nothing).
    pub watchdog: Option<String>,
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
    /// Calls for a rescuer while no worker could be started.
    pub maydays: Option<u64>,
    /// Items run by rescuers.
    pub rescued: Option<u64>,
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

/// Sums a field over pools; `None` when there is no pool.
fn sum(pools: &[PoolStats], field: impl Fn(&PoolStats) -> u64) -> Option<u64> {
    (!pools.is_empty()).then(|| pools.iter().map(field).sum())
}

/// The row of one workqueue's stats snapshot. The stats carry no whole-queue latency,
/// so the percentiles are the worst pool's (an upper bound, marked `≤`).
pub fn wq_row(stats: &WorkqueueStats) -> WqRow {
    let pools = &stats.pools;
    let local = sum(pools, |p| {
        p.locality.same_cpu + p.locality.same_smt + p.locality.same_llc
    });
    let located =
        sum(pools, |p| p.locality.same_node + p.locality.remote).and_then(|far| Some(far + local?));
    let worst = |quantile: fn(&Latency) -> u64| {
        pools
            .iter()
            .filter(|p| p.queue_to_start_ns.count > 0)
            .map(|p| quantile(&p.queue_to_start_ns))
            .max()
    };
    let p99 = worst(|l| l.p99);
    let effective = stats.effective_scope;
    let scope = match stats.attrs.scope {
        Scope::Default if stats.auto.is_some() => format!("default (auto: {effective})"),
        requested @ (Scope::Default | Scope::Auto) => format!("{requested} ({effective})"),
        requested => requested.to_string(),
    };
    let last_switch = stats.auto.as_ref().map(|a| match &a.last_switch {
        Some(s) => format!(
            "{} switch(es); last at window {}: {} -> {}: {}",
            a.switches, s.window, s.from, s.to, s.reason
        ),
        None => format!("{} switch(es)", a.switches),
    });
    let found = &stats.watchdog;
    let out_of_count = sum(pools, |p| p.cpu_intensive).unwrap_or(0);
    let handed_back = sum(pools, |p| p.handed_back).unwrap_or(0);
    let watchdog = (found.stalls > 0 || found.long_items > 0 || out_of_count > 0).then(|| {
        let last = found
            .last_stall
            .as_ref()
            .map_or(String::new(), |s| format!("; last: {s}"));
        let handed_back = if handed_back > 0 {
            format!(" ({handed_back} item(s) handed back)")
        } else {
            String::new()
        };
        escape_controls(&format!(
            "{} stall(s), {} long item(s), {out_of_count} CPU-intensive{handed_back}{last}",
            found.stalls, found.long_items
        ))
        .into_owned()
    });
    WqRow {
        name: escape_controls(&stats.name).into_owned(),
        scope: Some(scope),
        last_switch,
        watchdog,
        started: Some(stats.totals.started),
        completed: Some(stats.totals.completed),
        started_per_s: None,
        cpu_time_s: sum(pools, |p| p.cpu_time_ns).map(|ns| ns as f64 / 1e9),
        repatriated: Some(stats.totals.repatriated),
        lock_acquisitions: sum(pools, |p| {
            p.enqueue_lock.acquisitions + p.dequeue_lock.acquisitions
        }),
        lock_contended: sum(pools, |p| {
            p.enqueue_lock.contended + p.dequeue_lock.contended
        }),
        local,
        located,
        queue_to_start_p50_ns: worst(|l| l.p50),
        queue_to_start_p99_ns: p99,
        latency_is_pool_max: p99.is_some(),
        maydays: sum(pools, |p| p.maydays),
        rescued: sum(pools, |p| p.rescued),
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
    let row = |kind, id, times: &procinfo::CpuTimes| BusyRow {
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

/// Nanoseconds scaled to their unit with three significant digits at most (`850 ns`,
/// `5.4 µs`, `115 µs`, `3.0 ms`); `≤` marks an upper bound.
fn duration_ns(ns: Option<u64>, upper_bound: bool) -> String {
    let Some(ns) = ns else {
        return "-".to_owned();
    };
    let ns = ns as f64;
    let (value, unit) = if ns < 1e3 {
        (ns, "ns")
    } else if ns < 1e6 {
        (ns / 1e3, "µs")
    } else if ns < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, "s")
    };
    let text = if unit == "ns" || value >= 100.0 {
        format!("{value:.0} {unit}")
    } else {
        format!("{value:.1} {unit}")
    };
    if upper_bound {
        format!("≤{text}")
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
        "mayday",
        "rescued",
    ];
    let rows: Vec<[String; 13]> = wqs
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
                opt(w.maydays),
                opt(w.rescued),
            ]
        })
        .collect();
    let mut out = crate::table::render(&header, &rows);
    for w in wqs {
        if let Some(last) = &w.last_switch {
            out.push_str(&format!("{} auto: {last}\n", w.name));
        }
        if let Some(found) = &w.watchdog {
            out.push_str(&format!("{} watchdog: {found}\n", w.name));
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

/// Where samples go: redrawn in place on a terminal (like `top`), appended when piped.
struct Screen {
    redraw: bool,
    pid: u32,
    interval: Duration,
}

impl Screen {
    /// The line above each sample: what is watched, how often, and when.
    fn heading(&self, sample: u64, now: SystemTime) -> String {
        format!(
            "podq monitor: pid {}, every {}, {} (sample {sample})",
            self.pid,
            humantime::format_duration(self.interval),
            humantime::format_rfc3339_seconds(now)
        )
    }

    fn show(&self, out: &mut impl Write, sample: u64, table: &str) -> std::io::Result<()> {
        let text = format!("{}\n\n{table}", self.heading(sample, SystemTime::now()));
        if self.redraw {
            // Home, then each line cleared to its end and the rest of the screen below
            // the sample: no flicker from clearing the whole screen first.
            write!(out, "\x1b[H")?;
            for line in text.lines() {
                writeln!(out, "{line}\x1b[K")?;
            }
            write!(out, "\x1b[J")
        } else {
            writeln!(out, "{text}")
        }
    }
}

/// The filters that match no workqueue name.
fn unmatched<'a>(filters: &'a [String], names: &[String]) -> Vec<&'a str> {
    filters
        .iter()
        .filter(|f| !names.iter().any(|n| n.contains(f.as_str())))
        .map(String::as_str)
        .collect()
}

/// Runs `podq monitor`.
pub fn run(args: MonitorArgs) -> Result<()> {
    let mut session = Session::open(args.target.clone())?;
    let pid = session.pid();
    let interval = Duration::from_secs_f64(args.interval);
    let stats_request = Request::Stats { queue: None };
    let mut prev_stat = procinfo::read_proc_stat()?;
    let nodes = procinfo::read_node_cpus(&prev_stat)?;
    let mut prev_threads: HashMap<u32, ThreadSched> = procinfo::read_threads(pid)
        .with_context(|| format!("cannot read the threads of process {pid}"))?
        .into_iter()
        .map(|t| (t.tid, t))
        .collect();
    // A first stats sample, so the first printed one already has rates.
    let first: Vec<WqRow> = session
        .call(&stats_request)
        .context("cannot read stats")?
        .stats
        .unwrap_or_default()
        .iter()
        .map(wq_row)
        .collect();
    let names: Vec<String> = first.iter().map(|w| w.name.clone()).collect();
    for filter in unmatched(&args.filters, &names) {
        eprintln!(
            "podq: warning: no workqueue's name contains `{filter}` (visible: {})",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        );
    }
    let mut prev_started: HashMap<String, u64> = first
        .into_iter()
        .filter_map(|w| Some((w.name, w.started?)))
        .collect();
    let screen = Screen {
        redraw: !args.json && std::io::stdout().is_terminal(),
        pid,
        interval,
    };
    let mut last = Instant::now();
    let mut out = std::io::stdout().lock();
    let mut sample = 0u64;
    while args.count.map_or(true, |n| sample < n) {
        thread::sleep(interval);
        sample += 1;
        let reply = session.call(&stats_request).context("cannot read stats")?;
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
        let stat = procinfo::read_proc_stat()?;
        let busy = busy_rows(&stat.since(&prev_stat), &nodes);
        prev_stat = stat;
        let threads_now = procinfo::read_threads(pid)
            .with_context(|| format!("cannot read the threads of process {pid}"))?;
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
            screen.show(&mut out, sample, &render_table(&wqs, &busy, &threads))?;
        }
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Field by field: the snapshot types are meant to grow (`non_exhaustive`).
    #[allow(clippy::field_reassign_with_default)]
    fn pool(started: u64, completed: u64, p99: u64) -> PoolStats {
        let mut p = PoolStats::default();
        p.id = 1;
        p.pod_cpus = "0-1".into();
        p.totals.started = started;
        p.totals.completed = completed;
        p.totals.repatriated = 3;
        p.enqueue_lock.acquisitions = 100;
        p.enqueue_lock.contended = 10;
        p.dequeue_lock.acquisitions = 100;
        p.dequeue_lock.contended = 30;
        p.locality.same_cpu = 5;
        p.locality.same_llc = 3;
        p.locality.same_node = 2;
        p.queue_to_start_ns.count = started;
        p.queue_to_start_ns.p50 = p99 / 2;
        p.queue_to_start_ns.p99 = p99;
        p.cpu_time_ns = 1_500_000_000;
        p
    }

    /// A snapshot as the server sends it, with the queue's own totals.
    fn wq(name: &str, pools: Vec<PoolStats>, started: u64, completed: u64) -> WorkqueueStats {
        serde_json::from_value(json!({
            "name": name,
            "attrs": { "scope": "cache", "strict": false, "cpumask": [0, 1], "nice": 0,
                       "max_active": 256, "ordered": false },
            "effective_scope": "cache",
            "totals": { "queued": started, "started": started, "completed": completed,
                        "panicked": 0, "cancelled": 0, "repatriated": 1,
                        "max_active_waits": 0 },
            "pools": pools,
        }))
        .unwrap()
    }

    #[test]
    fn rows_sum_pools() {
        let stats = wq(
            "rpciod",
            vec![pool(10, 7, 4000), pool(20, 20, 9000)],
            12,
            11,
        );
        let row = wq_row(&stats);
        assert_eq!(row.name, "rpciod");
        assert_eq!(row.cpu_time_s, Some(3.0));
        // The queue's own totals, not the shared pools' counts.
        assert_eq!(
            (row.started, row.in_flight(), row.repatriated),
            (Some(12), Some(1), Some(1))
        );
        assert_eq!(row.contended_percent(), Some(20.0));
        assert_eq!(row.local_percent(), Some(80.0));
        assert_eq!(row.queue_to_start_p99_ns, Some(9000));
        assert_eq!(row.queue_to_start_p50_ns, Some(4500));
        assert!(row.latency_is_pool_max);
        // Names from the server are escaped before they reach the table.
        let row = wq_row(&wq("evil\x1b]0;x\x07", vec![], 0, 0));
        assert_eq!(row.name, r"evil\u{1b}]0;x\u{7}");
    }

    #[test]
    fn auto_shows_its_scope_and_last_switch() {
        let mut stats = wq("rpciod", Vec::new(), 0, 0);
        stats.attrs.scope = Scope::Auto;
        stats.effective_scope = Scope::System;
        let switch = json!({
            "window": 12, "from": "cache_shard", "to": "system", "strict": false,
            "reason": { "kind": "imbalance", "saturated_cpus": 8, "idle_cpus": 8,
                        "saturated_busy": 0.9, "idle_busy": 0.0 }
        });
        stats.auto = Some(
            serde_json::from_value(json!({
                "scope": "system", "strict": false, "windows": 40, "switches": 1,
                "switch_failures": 0, "last_switch": switch, "history": [switch],
                "last_reason": { "kind": "steady" }, "window_ns": 100_000_000
            }))
            .unwrap(),
        );
        let row = wq_row(&stats);
        assert_eq!(row.scope.as_deref(), Some("auto (system)"));
        assert_eq!(
            row.last_switch.as_deref(),
            Some("1 switch(es); last at window 12: cache_shard -> system: imbalance: 8 CPUs 90% busy, 8 CPUs 0% busy")
        );
        let table = render_table(&[row], &[], &[]);
        assert!(table.contains("auto (system)"), "{table}");
        assert!(table.contains("rpciod auto: 1 switch(es)"), "{table}");
        let fixed = wq_row(&wq("q", Vec::new(), 0, 0));
        assert_eq!(fixed.scope.as_deref(), Some("cache"));
        assert_eq!(fixed.last_switch, None);
    }

    #[test]
    fn missing_fields_show_as_unknown() {
        let row = wq_row(&wq("empty", vec![], 0, 0));
        assert_eq!(row.cpu_time_s, None);
        assert_eq!(row.contended_percent(), None);
        assert_eq!(row.queue_to_start_p99_ns, None);
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
        let before = procinfo::parse_proc_stat(&text(0, 0, 0, 0)).unwrap();
        let after = procinfo::parse_proc_stat(&text(75, 25, 0, 100)).unwrap();
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
            cpu_time_source: procinfo::CpuTimeSource::Schedstat,
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
        assert_eq!(parse_interval("500ms"), Ok(0.5));
        assert_eq!(parse_interval("2m"), Ok(120.0));
        assert_eq!(parse_interval("1day"), Ok(86_400.0));
        for bad in ["0", "-1", "x", "inf", "NaN", "0s", "2days", "86401"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_scale_like_bench() {
        assert_eq!(duration_ns(Some(850), false), "850 ns");
        assert_eq!(duration_ns(Some(5_375), true), "≤5.4 µs");
        assert_eq!(duration_ns(Some(114_700), false), "115 µs");
        assert_eq!(duration_ns(Some(3_014_700), true), "≤3.0 ms");
        assert_eq!(duration_ns(Some(2_500_000_000), false), "2.5 s");
        assert_eq!(duration_ns(None, false), "-");
    }

    #[test]
    fn watchdog_findings_follow_the_table() {
        let mut stats = wq("nfsiod", vec![pool(1, 1, 10)], 1, 1);
        let quiet = wq_row(&stats);
        assert_eq!(quiet.watchdog, None);
        assert!(!render_table(&[quiet], &[], &[]).contains("watchdog"));
        stats.watchdog = serde_json::from_value(json!({
            "stalls": 1, "long_items": 2, "first_long_items": [],
            "last_stall": { "pool": 4, "kind": { "Pending": { "items": 3 } },
                            "stalled_for": { "secs": 31, "nanos": 0 } },
        }))
        .unwrap();
        let table = render_table(&[wq_row(&stats)], &[], &[]);
        assert!(
            table.contains(
                "nfsiod watchdog: 1 stall(s), 2 long item(s), 0 CPU-intensive; last: pool 4 \
                 stalled: 3 items pending and none started for 31s\n"
            ),
            "{table}"
        );
        // A pool's worker out of the count for a long item is a finding too.
        let mut computing = wq("crunch", vec![pool(1, 1, 10)], 1, 1);
        computing.pools[0].cpu_intensive = 3;
        let table = render_table(&[wq_row(&computing)], &[], &[]);
        assert!(
            table.contains("crunch watchdog: 0 stall(s), 0 long item(s), 3 CPU-intensive\n"),
            "{table}"
        );
        computing.pools[0].handed_back = 5;
        let table = render_table(&[wq_row(&computing)], &[], &[]);
        assert!(
            table.contains("3 CPU-intensive (5 item(s) handed back)\n"),
            "{table}"
        );
    }

    #[test]
    fn rescue_counters_are_shown() {
        let mut p = pool(10, 10, 1000);
        p.maydays = 4;
        p.rescued = 3;
        let row = wq_row(&wq("rpciod", vec![p, pool(5, 5, 1000)], 15, 15));
        assert_eq!((row.maydays, row.rescued), (Some(4), Some(3)));
        let table = render_table(&[row], &[], &[]);
        let header = table.lines().next().unwrap();
        assert!(header.ends_with("mayday  rescued"), "{table}");
        assert!(
            table.lines().nth(1).unwrap().ends_with("4        3"),
            "{table}"
        );
    }

    #[test]
    fn filters_matching_nothing_are_named() {
        let names = ["rpciod".to_owned(), "nfsiod".to_owned()];
        let filters = ["rpc".to_owned(), "xprtiod".to_owned(), "iod".to_owned()];
        assert_eq!(unmatched(&filters, &names), ["xprtiod"]);
        assert!(unmatched(&[], &names).is_empty());
    }

    #[test]
    fn samples_redraw_in_place_only_on_a_terminal() {
        let screen = |redraw| Screen {
            redraw,
            pid: 42,
            interval: Duration::from_millis(500),
        };
        let at = UNIX_EPOCH + Duration::from_secs(1_764_585_000);
        assert_eq!(
            screen(false).heading(3, at),
            "podq monitor: pid 42, every 500ms, 2025-12-01T10:30:00Z (sample 3)"
        );
        let mut piped = Vec::new();
        screen(false).show(&mut piped, 1, "A  B\n1  2\n").unwrap();
        let piped = String::from_utf8(piped).unwrap();
        assert!(!piped.contains('\x1b'), "{piped:?}");
        assert!(piped.ends_with("\n\nA  B\n1  2\n\n"), "{piped:?}");
        let mut tty = Vec::new();
        screen(true).show(&mut tty, 1, "A  B\n1  2\n").unwrap();
        let tty = String::from_utf8(tty).unwrap();
        assert!(tty.starts_with("\x1b[Hpodq monitor: pid 42"), "{tty:?}");
        assert!(tty.contains("1  2\x1b[K\n"), "{tty:?}");
        assert!(tty.ends_with("\x1b[J"), "{tty:?}");
    }
}
