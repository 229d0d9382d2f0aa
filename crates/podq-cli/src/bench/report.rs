//! Results: the JSON schema, the tables, and fio-style latency percentiles.
//!
//! The JSON schema is documented in `crates/podq-cli/BENCH.md`; every field there is
//! a field here.

use std::fmt::Write as _;

use crate::table::Align;

use hdrhistogram::Histogram;
use podq_topology::Scope;
use serde::Serialize;

use super::alloc_model::AllocCounts;
use super::system::PoolLockCounts;

/// The schema version; bumped when a field changes meaning or disappears (2:
/// `throughput_work` counts runs in `items`, and its producers stop after a number of
/// runs instead of a number of calls).
pub const SCHEMA_VERSION: u32 = 2;

/// Percentiles fio prints for `clat`.
pub const FIO_PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

/// The whole output of one `podq bench` run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// `queue`, `latency`, `completion`, `peers` or `ladder`.
    pub workload: String,
    /// The command line, for reproducing the run.
    pub command: Vec<String>,
    /// What the run ran on.
    pub topology: TopologyInfo,
    /// The effective settings.
    pub settings: serde_json::Value,
    /// One entry per system, configuration, test (and toggle segment).
    pub results: Vec<RunResult>,
    /// podq's best configuration against each peer, when podq and a peer both ran.
    pub ratios: Vec<Ratio>,
    /// What makes figures of this run doubtful (runs far over their budget, a bad
    /// environment value); also printed on stderr.
    pub warnings: Vec<String>,
}

/// The topology of a run.
#[derive(Debug, Serialize)]
pub struct TopologyInfo {
    /// The `--topology` value.
    pub spec: String,
    /// One-line summary.
    pub description: String,
    /// Usable CPUs of the topology (virtual ones on a fake topology).
    pub cpus: usize,
    /// NUMA nodes.
    pub nodes: usize,
    /// The real CPUs the run used.
    pub real_cpus: Vec<usize>,
    /// Whether virtual CPUs were mapped onto fewer real ones.
    pub fake: bool,
}

/// One measured configuration.
#[derive(Debug, Serialize)]
pub struct RunResult {
    /// `queue`, `latency`, `completion`, `throughput_spawn`, `throughput_execute` or
    /// `throughput_work`.
    pub test: &'static str,
    /// `podq`, `rayon`, `tokio-spawn-blocking`, `crossbeam-channel`, `std-mpsc` or
    /// `pernode-threads`.
    pub system: String,
    /// Affinity scope (podq), `null` for peers.
    pub scope: Option<Scope>,
    /// Strict pods (podq), `null` for peers.
    pub strict: Option<bool>,
    /// Segment index of a `--toggle` run, else `null`.
    pub segment: Option<usize>,
    /// Producer threads.
    pub producers: usize,
    /// Items completed (for `completion`: I/Os, each one rpciod and one nfsiod item).
    pub items: u64,
    /// Measured wall time, seconds.
    pub seconds: f64,
    /// `items / seconds`.
    pub items_per_sec: f64,
    /// `queue`: duration of the queue call; `latency`: submit to end of the item;
    /// `completion`: completion posted to nfsiod item done.
    pub latency_ns: LatencySummary,
    /// `latency` only: duration of the submit call (fio's slat).
    pub submit_ns: Option<LatencySummary>,
    /// `completion` only.
    pub completion: Option<CompletionDetail>,
    /// The `throughput_*` tests only.
    pub throughput: Option<super::workloads::throughput::ThroughputDetail>,
    /// `memory_spawn` and `memory_work` only.
    pub memory: Option<super::workloads::memory::MemoryDetail>,
    /// `idle` only.
    pub idle: Option<super::workloads::idle::IdleDetail>,
    /// `queue` only: the producers' and workers' context switches over the rounds.
    pub context_switches: Option<u64>,
    /// Pool lock counters, where the system keeps them (podq).
    pub pool_locks: Option<PoolLockCounts>,
    /// `queue`, `latency` and the `throughput_*` tests on `auto`: what the controller
    /// did over the rounds (`completion` keeps its trace per segment, in
    /// `completion.auto`).
    pub auto: Option<AutoTrace>,
    /// Each round's own figures, in the order the rounds ran (the fields above sum
    /// them); their spread is what the tables show as `min … max`.
    pub rounds: Vec<Round>,
    /// The full distribution, for plots.
    #[serde(skip)]
    pub histogram: Histogram<u64>,
}

impl RunResult {
    /// Its configuration as tables name it (`cpu strict`, `-` for a peer), with its
    /// segment of a `--toggle` run.
    pub fn label(&self) -> String {
        let config = config_label(self.scope, self.strict);
        match self.segment {
            Some(i) => format!("{config} (segment {i})"),
            None => config,
        }
    }

    /// The scopes an `auto` run's rounds ended at, in the order first reached: `cpu`
    /// when every round ended there, `cache_shard in 1 of 2, cpu in 1 of 2` otherwise;
    /// `None` when no round says.
    pub fn auto_ends(&self) -> Option<String> {
        let ends: Vec<Scope> = self
            .rounds
            .iter()
            .filter_map(|r| r.auto_scope_at_end)
            .collect();
        let mut counts: Vec<(Scope, usize)> = Vec::new();
        for end in &ends {
            match counts.iter_mut().find(|(s, _)| s == end) {
                Some((_, n)) => *n += 1,
                None => counts.push((*end, 1)),
            }
        }
        match counts.as_slice() {
            [] => None,
            [(only, _)] => Some(only.to_string()),
            _ => Some(
                counts
                    .iter()
                    .map(|(s, n)| format!("{s} in {n} of {}", ends.len()))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        }
    }
}

/// `n` per 1000 items (0 when no item ran).
pub fn per_kitem(n: u64, items: u64) -> f64 {
    if items == 0 {
        0.0
    } else {
        n as f64 * 1000.0 / items as f64
    }
}

/// One round of one result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Round {
    /// Items completed in the round.
    pub items: u64,
    /// Measured wall time of the round (of its segment, for a toggle run), seconds.
    pub seconds: f64,
    /// Wall time of the whole run including setup, warm-up and teardown, seconds; the
    /// budget check compares it with `--duration`.
    pub wall_seconds: f64,
    /// `items / seconds`.
    pub items_per_sec: f64,
    /// Latency samples (as `latency_ns.count`).
    pub samples: u64,
    /// Median of the round's latency samples.
    pub p50_ns: u64,
    /// 99th percentile of the round's latency samples.
    pub p99_ns: u64,
    /// `completion` only: the round's MB/s.
    pub mb_per_sec: Option<f64>,
    /// `throughput_*` only: the round's accepted calls per second (over `seconds`).
    pub accepted_per_sec: Option<f64>,
    /// `throughput_*` only: the round's calls per second while submitting.
    pub calls_per_sec: Option<f64>,
    /// `throughput_*` and `queue`: the round's context switches per 1000 items run.
    pub switches_per_kitem: Option<f64>,
    /// `memory_*` only: the round's live bytes per queued item.
    pub bytes_per_item: Option<f64>,
    /// `idle` only: the round's CPU time of the idle pools' threads, share of one CPU.
    pub idle_cpu_share: Option<f64>,
    /// `queue`, `latency` and `throughput_*` on `auto`: the scope its controller stood
    /// at when the round ended.
    pub auto_scope_at_end: Option<Scope>,
}

/// The `completion` workload's extra measurements.
#[derive(Debug, Serialize)]
pub struct CompletionDetail {
    /// `items * 4096 / seconds / 1e6`.
    pub mb_per_sec: f64,
    /// Idle share per real CPU over the run (0..1), from `/proc/stat`.
    pub idle_per_cpu: Vec<f64>,
    /// Idle share per NUMA node; empty on a fake topology, whose nodes share real CPUs.
    pub idle_per_node: Vec<f64>,
    /// The allocator model's counters for the run.
    pub allocator: AllocCounts,
    /// Pool lock counters of the `nfsiod` queue (`pool_locks` is `rpciod`'s).
    pub nfsiod_pool_locks: Option<PoolLockCounts>,
    /// Voluntary plus involuntary context switches of the process.
    pub context_switches: u64,
    /// Times a worker saw a different CPU than on its previous item.
    pub migrations: u64,
    /// The CQ placement of a `--cq-move` segment.
    pub placement: Option<String>,
    /// `rpciod`'s `auto` controller over the segment, when its scope is `auto`.
    pub auto: Option<AutoTrace>,
    /// Every I/O accounted for, counted after the producers finished (last segment).
    pub accounting: Option<Accounting>,
    /// When this segment started, seconds since the run's start (0 without `--toggle`).
    pub start_s: f64,
    /// The first round's time series over this segment (`--duration` runs only): MB/s
    /// and idle shares per interval of about a hundredth of the run.
    pub timeline: Vec<TimelinePoint>,
}

/// One interval of a `completion` run's time series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelinePoint {
    /// End of the interval, seconds since the run's start.
    pub t: f64,
    /// MB/s over the interval.
    pub mb_per_sec: f64,
    /// Idle share (0..1) per NUMA node over the interval; per real CPU on a fake
    /// topology, whose nodes share real CPUs (as `idle_per_node`/`idle_per_cpu`).
    pub idle: Vec<f64>,
}

/// What an `auto` controller did over a run (`rpciod`'s, over a `completion` segment).
#[derive(Debug, Serialize)]
pub struct AutoTrace {
    /// The scope in force at the end.
    pub scope_at_end: Scope,
    /// The switches made meanwhile.
    pub switches_made: u64,
    /// Those switches with their reasons, as far as the controller's history reaches
    /// (its last `podq::auto::HISTORY`).
    pub switches: Vec<podq::policy::auto::Switch>,
    /// The controller's window, nanoseconds.
    pub window_ns: u64,
    /// Why it held or switched at its last window (`steady`: no problem seen).
    pub last_reason: podq::policy::auto::Reason,
}

impl AutoTrace {
    /// The switches a controller made after the state `before` (from its start when
    /// `None`) up to `at_end`, as far as its history reaches.
    pub fn between(
        before: Option<&podq::auto::AutoStats>,
        at_end: &podq::auto::AutoStats,
    ) -> AutoTrace {
        let after = before.map_or(0, |s| s.windows);
        AutoTrace {
            scope_at_end: at_end.scope,
            switches_made: at_end
                .switches
                .saturating_sub(before.map_or(0, |s| s.switches)),
            switches: at_end
                .history
                .iter()
                .filter(|s| s.window > after)
                .cloned()
                .collect(),
            window_ns: at_end.window_ns,
            last_reason: at_end.last_reason.clone(),
        }
    }

    /// Folds in the trace of a later run or segment.
    pub fn merge(&mut self, later: AutoTrace) {
        self.switches_made += later.switches_made;
        self.switches.extend(later.switches);
        self.scope_at_end = later.scope_at_end;
        self.last_reason = later.last_reason;
    }
}

/// I/Os and items of a run, once nothing was in flight.
#[derive(Debug, Default, Serialize)]
pub struct Accounting {
    /// Completions the producers posted.
    pub posted: u64,
    /// Completions whose nfsiod item finished.
    pub done: u64,
    /// `rpciod` items queued and finished.
    pub rpciod: [u64; 2],
    /// `nfsiod` items queued and finished.
    pub nfsiod: [u64; 2],
}

impl Accounting {
    fn add(&mut self, other: &Accounting) {
        self.posted += other.posted;
        self.done += other.done;
        for i in 0..2 {
            self.rpciod[i] += other.rpciod[i];
            self.nfsiod[i] += other.nfsiod[i];
        }
    }
}

impl CompletionDetail {
    /// Folds in another run of `other_seconds`; this one lasted `seconds`. The
    /// timeline stays this run's.
    pub fn merge(&mut self, other: CompletionDetail, seconds: f64, other_seconds: f64) {
        let total = (seconds + other_seconds).max(f64::MIN_POSITIVE);
        let weigh = |a: f64, b: f64| (a * seconds + b * other_seconds) / total;
        self.mb_per_sec = weigh(self.mb_per_sec, other.mb_per_sec);
        for (a, b) in self.idle_per_cpu.iter_mut().zip(&other.idle_per_cpu) {
            *a = weigh(*a, *b);
        }
        for (a, b) in self.idle_per_node.iter_mut().zip(&other.idle_per_node) {
            *a = weigh(*a, *b);
        }
        self.allocator.add(&other.allocator);
        if let (Some(a), Some(b)) = (self.nfsiod_pool_locks.as_mut(), other.nfsiod_pool_locks) {
            a.add(&b);
        }
        self.context_switches += other.context_switches;
        self.migrations += other.migrations;
        if let (Some(a), Some(b)) = (self.auto.as_mut(), other.auto) {
            a.merge(b);
        }
        match (self.accounting.as_mut(), other.accounting) {
            (Some(a), Some(b)) => a.add(&b),
            (None, b) => self.accounting = b,
            _ => {}
        }
    }
}

/// A latency distribution in nanoseconds.
#[derive(Debug, Clone, Serialize)]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Smallest sample.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// Largest sample.
    pub max: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 95th percentile.
    pub p95: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// `[percentile, value]` at fio's clat percentiles.
    pub percentiles: Vec<(f64, u64)>,
}

impl LatencySummary {
    /// Summarises a histogram of nanoseconds.
    pub fn of(h: &Histogram<u64>) -> LatencySummary {
        let q = |p: f64| h.value_at_quantile(p / 100.0);
        LatencySummary {
            count: h.len(),
            min: if h.is_empty() { 0 } else { h.min() },
            mean: h.mean(),
            stdev: h.stdev(),
            max: h.max(),
            p50: q(50.0),
            p90: q(90.0),
            p95: q(95.0),
            p99: q(99.0),
            p999: q(99.9),
            percentiles: FIO_PERCENTILES.iter().map(|&p| (p, q(p))).collect(),
        }
    }
}

/// podq's best configuration against one peer.
#[derive(Debug, Serialize)]
pub struct Ratio {
    /// `queue`, `latency`, `throughput_spawn`, `throughput_execute` or `throughput_work`.
    pub test: &'static str,
    /// `items_per_sec` (higher is better), `p50_ns` or `p99_ns` (lower is better).
    pub metric: &'static str,
    /// podq's best configuration for this metric, e.g. `smt` or `cache strict`.
    pub podq_config: String,
    /// Its value.
    pub podq: f64,
    /// The peer.
    pub peer: String,
    /// The peer's value.
    pub peer_value: f64,
    /// `podq / peer_value`.
    pub ratio: f64,
    /// Whether this peer is the best peer for the metric.
    pub best_peer: bool,
    /// How many podq configurations `podq_config` was picked from.
    pub podq_configs: usize,
    /// podq on the process default scope, non-strict (the configuration a user gets
    /// without choosing), when it was among those run: its label.
    pub default_config: Option<String>,
    /// Its value.
    pub default_podq: Option<f64>,
    /// `default_podq / peer_value`.
    pub default_ratio: Option<f64>,
    /// The ratio round by round, `podq`'s configuration against the peer: `null`
    /// unless both ran the same number of rounds, at least two.
    pub rounds: Option<RoundRatios>,
}

/// A ratio taken round by round: the k-th round of podq's configuration against the
/// k-th round of the peer. Rounds run interleaved across configurations, so each pair
/// ran in the same minute of the machine's life; the pairs' spread shows how far one
/// round's ratio can be trusted.
#[derive(Debug, Serialize)]
pub struct RoundRatios {
    /// Pairs of rounds.
    pub pairs: usize,
    /// The median of the pairs' ratios.
    pub median: f64,
    /// The smallest pair ratio.
    pub min: f64,
    /// The largest pair ratio.
    pub max: f64,
}

impl RoundRatios {
    /// The pairs' ratios of `podq` against `peer`, by `value` of each round; for a
    /// percentile (`percentile` above 0) only pairs whose rounds both hold enough
    /// samples for it ([`min_samples`]).
    fn of(
        podq: &[Round],
        peer: &[Round],
        value: fn(&Round) -> f64,
        percentile: f64,
    ) -> Option<RoundRatios> {
        if podq.len() != peer.len() || podq.len() < 2 {
            return None;
        }
        let enough = |r: &Round| enough_for(percentile, r.samples);
        let mut pairs: Vec<f64> = podq
            .iter()
            .zip(peer)
            .filter(|(a, b)| enough(a) && enough(b))
            .map(|(a, b)| value(a) / value(b))
            .filter(|r| r.is_finite())
            .collect();
        if pairs.len() < 2 {
            return None;
        }
        let median = super::compare::median(&mut pairs);
        Some(RoundRatios {
            pairs: pairs.len(),
            median,
            min: pairs[0],
            max: pairs[pairs.len() - 1],
        })
    }
}

/// A new empty histogram of nanoseconds (1 ns to 100 s, 3 significant digits).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("bounds are valid")
}

/// Records `ns` into `h`, clamping to the histogram's range.
pub fn record(h: &mut Histogram<u64>, ns: u64) {
    h.saturating_record(ns.max(1));
}

/// The fewest samples for which percentile `p` (in percent) is shown: ten samples must
/// lie beyond it (above it, or below it for percentiles under the median), so
/// `10 / min(p, 100 - p) * 100`. p50 needs 20, p90 100, p95 200, p99 1 000, p99.9
/// 10 000, p99.99 100 000, p1 1 000. With fewer, p99.9 is one of the few largest
/// samples (with 250 samples it is the maximum), which says nothing about the 99.9th
/// percentile; tables print `-` instead.
pub fn min_samples(p: f64) -> u64 {
    let tail = p.min(100.0 - p).max(f64::MIN_POSITIVE) / 100.0;
    (10.0 / tail).round() as u64
}

/// `value` as `human_ns`, or `-` when `count` samples are too few for percentile `p`.
pub fn percentile_cell(count: u64, p: f64, value: u64) -> String {
    if count >= min_samples(p) {
        human_ns(value as f64)
    } else {
        "-".to_owned()
    }
}

/// The rounds' spread as `min … max` in `unit`, or `-` for a single round.
pub fn round_range(values: &[f64], unit: fn(f64) -> String) -> String {
    if values.len() < 2 {
        return "-".to_owned();
    }
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{} … {}", unit(min), unit(max))
}

/// Picks a time unit the way fio does: the largest that keeps `value` above 10000 of
/// the unit below. Returns (name, nanoseconds per unit).
fn fio_unit(max_ns: u64) -> (&'static str, u64) {
    if max_ns >= 10_000_000 {
        ("msec", 1_000_000)
    } else if max_ns >= 10_000 {
        ("usec", 1_000)
    } else {
        ("nsec", 1)
    }
}

/// fio's summary line: `    slat (usec): min=.., max=.., avg=.., stdev=..`.
pub fn fio_summary(name: &str, s: &LatencySummary) -> String {
    let (unit, div) = fio_unit(s.max);
    let d = div as f64;
    format!(
        "    {name} ({unit}): min={}, max={}, avg={:.2}, stdev={:.2}\n",
        s.min / div,
        s.max / div,
        s.mean / d,
        s.stdev / d
    )
}

/// The `clat` block fio prints: min/max/avg/stdev and the percentile table.
pub fn fio_clat(name: &str, s: &LatencySummary) -> String {
    let mut out = fio_summary(name, s);
    let largest = s.percentiles.last().map_or(0, |&(_, v)| v);
    let (unit, div) = fio_unit(largest);
    let _ = writeln!(out, "     {name} percentiles ({unit}):");
    for row in s.percentiles.chunks(4) {
        let cells: Vec<String> = row
            .iter()
            .map(|&(p, v)| {
                if s.count >= min_samples(p) {
                    format!("{p:5.2}th=[{:5}]", v / div)
                } else {
                    format!("{p:5.2}th=[{:>5}]", "-")
                }
            })
            .collect();
        let _ = writeln!(out, "     | {},", cells.join(", "));
    }
    // fio ends the last row without a comma.
    if out.ends_with(",\n") {
        out.truncate(out.len() - 2);
        out.push('\n');
    }
    out
}

/// Nanoseconds for people: `850 ns`, `12.3 µs`, `4.56 ms`, `1.20 s`.
pub fn human_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.3} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.3} ms", ns / 1e6)
    } else {
        format!("{:.3} s", ns / 1e9)
    }
}

/// A rate for people: `812.4 k`, `1.234 M`.
pub fn human_rate(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.3} M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} k", x / 1e3)
    } else {
        format!("{x:.1}")
    }
}

/// As [`table`], with the last column left-aligned too: a column of prose.
pub fn table_ending_in_text(headers: &[&str], rows: &[Vec<String>], left: usize) -> String {
    let last = headers.len().saturating_sub(1);
    aligned_where(headers, rows, |i| i < left || i == last)
}

/// Aligns `rows` under `headers` with a rule; the first `left` columns are
/// left-aligned, the rest right-aligned (numbers).
pub fn table(headers: &[&str], rows: &[Vec<String>], left: usize) -> String {
    aligned_where(headers, rows, |i| i < left)
}

/// `rows` under `headers` with a rule, column `i` left-aligned where `left(i)`.
fn aligned_where(headers: &[&str], rows: &[Vec<String>], left: impl Fn(usize) -> bool) -> String {
    let align: Vec<Align> = (0..headers.len())
        .map(|i| if left(i) { Align::Left } else { Align::Right })
        .collect();
    crate::table::aligned(headers, rows, &align, true)
}

/// Whether `samples` are enough for `percentile` ([`min_samples`]); any number is,
/// for a metric that is no percentile (0).
fn enough_for(percentile: f64, samples: u64) -> bool {
    percentile == 0.0 || samples >= min_samples(percentile)
}

/// One metric [`ratios`] compares.
struct Metric {
    test: &'static str,
    name: &'static str,
    /// The figure of a result, and of one of its rounds.
    value: fn(&RunResult) -> f64,
    round_value: fn(&Round) -> f64,
    higher_better: bool,
    /// The percentile the metric is, 0 if none: results (and rounds) with too few
    /// samples for it (see [`min_samples`]) take no part.
    percentile: f64,
}

/// podq's best configuration against each peer, for the `queue`, `throughput` and
/// `latency` tests, with podq on the default scope (non-strict) beside it when that
/// configuration ran. `defaults`: the default scope first, then the scopes whose pods
/// are the same on the run's topology, whose runs stand for it when it did not run.
pub fn ratios(results: &[RunResult], defaults: &[Scope]) -> Vec<Ratio> {
    let rate = |test| Metric {
        test,
        name: "items_per_sec",
        value: |r| r.items_per_sec,
        round_value: |r| r.items_per_sec,
        higher_better: true,
        percentile: 0.0,
    };
    let latency = |name, value, round_value, percentile| Metric {
        test: "latency",
        name,
        value,
        round_value,
        higher_better: false,
        percentile,
    };
    let metrics = [
        rate("queue"),
        rate("throughput_spawn"),
        rate("throughput_execute"),
        rate("throughput_work"),
        latency(
            "p50_ns",
            |r| r.latency_ns.p50 as f64,
            |r| r.p50_ns as f64,
            50.0,
        ),
        latency(
            "p99_ns",
            |r| r.latency_ns.p99 as f64,
            |r| r.p99_ns as f64,
            99.0,
        ),
    ];
    let mut out = Vec::new();
    for Metric {
        test,
        name: metric,
        value,
        round_value,
        higher_better,
        percentile,
    } in metrics
    {
        let better = |a: f64, b: f64| if higher_better { a > b } else { a < b };
        let enough = |r: &RunResult| enough_for(percentile, r.latency_ns.count);
        let of_test = || {
            results
                .iter()
                .filter(|r| r.test == test && r.segment.is_none() && enough(r))
        };
        let Some(podq) = of_test().filter(|r| r.system == "podq").reduce(|a, b| {
            if better(value(b), value(a)) {
                b
            } else {
                a
            }
        }) else {
            continue;
        };
        let podq_configs = of_test().filter(|r| r.system == "podq").count();
        let default = defaults.iter().find_map(|&scope| {
            of_test()
                .find(|r| r.system == "podq" && r.scope == Some(scope) && r.strict != Some(true))
        });
        let peers: Vec<&RunResult> = of_test().filter(|r| r.system != "podq").collect();
        let best = peers
            .iter()
            .copied()
            .reduce(|a, b| if better(value(b), value(a)) { b } else { a });
        for peer in &peers {
            out.push(Ratio {
                test,
                metric,
                podq_config: config_label(podq.scope, podq.strict),
                podq: value(podq),
                peer: peer.system.clone(),
                peer_value: value(peer),
                ratio: value(podq) / value(peer),
                best_peer: best.is_some_and(|b| std::ptr::eq(b, *peer)),
                podq_configs,
                default_config: default.map(|d| config_label(d.scope, d.strict)),
                default_podq: default.map(value),
                default_ratio: default.map(|d| value(d) / value(peer)),
                rounds: RoundRatios::of(&podq.rounds, &peer.rounds, round_value, percentile),
            });
        }
    }
    out
}

/// `cache`, `cache strict`, or `-` for peers.
pub fn config_label(scope: Option<Scope>, strict: Option<bool>) -> String {
    super::system::QueueConfig { scope, strict }.label()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary_of(values: impl IntoIterator<Item = u64>) -> LatencySummary {
        let mut h = new_histogram();
        for v in values {
            record(&mut h, v);
        }
        LatencySummary::of(&h)
    }

    #[test]
    fn fio_block_has_every_percentile_in_rows_of_four() {
        let s = summary_of((1..=10_000).map(|i| i * 100));
        let text = fio_clat("clat", &s);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("    clat (usec): min=0, max=100"),
            "{text}"
        );
        assert_eq!(lines[1], "     clat percentiles (usec):");
        // 17 percentiles: four full rows and one with 99.99th alone.
        assert_eq!(lines.len(), 2 + 5);
        assert!(
            lines[2].starts_with("     |  1.00th=[   10],  5.00th=[   50]"),
            "{text}"
        );
        assert!(lines[2].ends_with(','), "{text}");
        // 10 000 samples are too few for the 99.99th (it needs 100 000).
        assert!(lines[6].starts_with("     | 99.99th=[    -]"), "{text}");
        assert!(!lines[6].ends_with(','), "{text}");
        for p in ["50.00th", "99.50th", "99.90th", "99.95th"] {
            assert!(text.contains(p), "{p} missing in {text}");
        }
    }

    #[test]
    fn fio_units_follow_magnitude() {
        let small = fio_clat("clat", &summary_of([100, 200, 300]));
        assert!(small.contains("clat (nsec): min=100, max=300"), "{small}");
        assert!(small.contains("percentiles (nsec)"), "{small}");
        let micro = fio_clat("clat", &summary_of([20_000, 30_000]));
        assert!(micro.contains("clat (usec): min=20, max=30"), "{micro}");
    }

    #[test]
    fn summary_percentiles_are_ordered() {
        let s = summary_of((1..=1000).map(|i| i * 10));
        assert_eq!(s.count, 1000);
        assert_eq!(s.min, 10);
        assert!(s.p50 <= s.p90 && s.p90 <= s.p95 && s.p95 <= s.p99 && s.p99 <= s.max);
        assert!((4_990..=5_010).contains(&s.p50), "{}", s.p50);
        assert_eq!(s.percentiles.len(), FIO_PERCENTILES.len());
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(
            &["system", "items/s"],
            &[
                vec!["podq".into(), "1.0 M".into()],
                vec!["crossbeam-channel".into(), "12.5 k".into()],
            ],
            1,
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0].len(), lines[3].len());
        assert!(lines[2].starts_with("podq   "));
        assert!(lines[2].ends_with(" 1.0 M"));
    }

    fn result(
        test: &'static str,
        system: &str,
        scope: Option<Scope>,
        rate: f64,
        p50: u64,
    ) -> RunResult {
        let mut h = new_histogram();
        for _ in 0..1_000 {
            record(&mut h, p50);
        }
        RunResult {
            test,
            system: system.to_owned(),
            scope,
            strict: scope.map(|_| false),
            segment: None,
            producers: 1,
            items: 1,
            seconds: 1.0,
            items_per_sec: rate,
            latency_ns: LatencySummary::of(&h),
            submit_ns: None,
            completion: None,
            throughput: None,
            memory: None,
            idle: None,
            context_switches: None,
            pool_locks: None,
            auto: None,
            rounds: Vec::new(),
            histogram: h,
        }
    }

    #[test]
    fn an_auto_runs_rounds_say_where_each_ended() {
        let mut r = result("throughput_spawn", "podq", Some(Scope::Auto), 1.0, 1);
        assert_eq!(r.auto_ends(), None, "no round says");
        let ended = |scope| Round {
            auto_scope_at_end: Some(scope),
            ..round(1.0, 1, 1)
        };
        r.rounds = vec![ended(Scope::CacheShard), ended(Scope::CacheShard)];
        assert_eq!(r.auto_ends().as_deref(), Some("cache_shard"));
        r.rounds = vec![
            ended(Scope::Cpu),
            ended(Scope::CacheShard),
            ended(Scope::Cpu),
        ];
        assert_eq!(
            r.auto_ends().as_deref(),
            Some("cpu in 2 of 3, cache_shard in 1 of 3")
        );
    }

    #[test]
    fn ratios_compare_podqs_best_with_each_peer() {
        let results = vec![
            result("queue", "podq", Some(Scope::Cpu), 900.0, 1),
            result("queue", "podq", Some(Scope::System), 300.0, 1),
            result("queue", "rayon", None, 600.0, 1),
            result("queue", "crossbeam-channel", None, 450.0, 1),
            result("latency", "podq", Some(Scope::Smt), 1.0, 4_000),
            result("latency", "podq", Some(Scope::Cache), 1.0, 9_000),
            result("latency", "rayon", None, 1.0, 8_000),
        ];
        let r = ratios(&results, &[Scope::System]);
        let queue: Vec<&Ratio> = r.iter().filter(|x| x.metric == "items_per_sec").collect();
        assert_eq!(queue.len(), 2);
        assert!(queue
            .iter()
            .all(|x| x.podq_config == "cpu" && x.podq == 900.0));
        let rayon = queue.iter().find(|x| x.peer == "rayon").unwrap();
        assert!(rayon.best_peer);
        assert!((rayon.ratio - 1.5).abs() < 1e-9);
        assert!(
            !queue
                .iter()
                .find(|x| x.peer == "crossbeam-channel")
                .unwrap()
                .best_peer
        );
        // Lower is better for latency: podq's best p50 is smt's.
        let p50 = r.iter().find(|x| x.metric == "p50_ns").unwrap();
        assert_eq!(p50.podq_config, "smt");
        assert!(p50.best_peer && p50.ratio < 0.6, "{p50:?}");
        // Too few samples for p99: no p99 rows.
        let mut few = results;
        for r in &mut few {
            r.latency_ns.count = 999;
        }
        assert!(ratios(&few, &[Scope::System])
            .iter()
            .all(|x| x.metric != "p99_ns"));
        assert!(ratios(&few, &[Scope::System])
            .iter()
            .any(|x| x.metric == "p50_ns"));
        let results = few;
        // No podq result: no ratios.
        assert!(ratios(&results[2..4], &[Scope::System]).is_empty());
        // The same-configuration ratio: podq system (300) against rayon (600).
        assert_eq!(rayon.podq_configs, 2);
        assert_eq!(rayon.default_config.as_deref(), Some("system"));
        assert_eq!(rayon.default_ratio, Some(0.5));
        // No default-scope row among the latency results (smt, cache).
        assert!(p50.default_config.is_none() && p50.default_ratio.is_none());
    }

    #[test]
    fn a_scope_with_the_default_scopes_pods_stands_for_it() {
        let results = vec![
            result("queue", "podq", Some(Scope::Cpu), 900.0, 1),
            result("queue", "podq", Some(Scope::System), 300.0, 1),
            result("queue", "rayon", None, 600.0, 1),
        ];
        // `cache_shard` did not run; `system` has its pods.
        let r = ratios(&results, &[Scope::CacheShard, Scope::System]);
        assert_eq!(r[0].default_config.as_deref(), Some("system"));
        assert_eq!(r[0].default_ratio, Some(0.5));
        // Without such a scope there is no default row.
        let r = ratios(&results, &[Scope::CacheShard]);
        assert!(r[0].default_config.is_none() && r[0].default_ratio.is_none());
        // The default scope's own run comes first when both ran.
        let mut both = results;
        both.push(result("queue", "podq", Some(Scope::CacheShard), 450.0, 1));
        let r = ratios(&both, &[Scope::CacheShard, Scope::System]);
        assert_eq!(r[0].default_config.as_deref(), Some("cache_shard"));
        assert_eq!(r[0].default_ratio, Some(0.75));
    }

    fn round(rate: f64, p50: u64, samples: u64) -> Round {
        Round {
            items: 1,
            seconds: 1.0,
            wall_seconds: 1.0,
            items_per_sec: rate,
            samples,
            p50_ns: p50,
            p99_ns: p50,
            mb_per_sec: None,
            accepted_per_sec: None,
            calls_per_sec: None,
            switches_per_kitem: None,
            bytes_per_item: None,
            idle_cpu_share: None,
            auto_scope_at_end: None,
        }
    }

    #[test]
    fn ratios_pair_the_rounds_in_order() {
        let mut podq = result("queue", "podq", Some(Scope::Cpu), 900.0, 1);
        podq.rounds = [800.0, 900.0, 1200.0].map(|r| round(r, 1, 100)).to_vec();
        let mut peer = result("queue", "rayon", None, 600.0, 1);
        peer.rounds = [400.0, 1000.0, 600.0].map(|r| round(r, 1, 100)).to_vec();
        let r = ratios(&[podq, peer], &[Scope::System]);
        let pairs = r[0].rounds.as_ref().expect("three pairs");
        // 800/400, 900/1000, 1200/600: paired in order, not sorted first.
        assert_eq!(pairs.pairs, 3);
        assert!((pairs.median - 2.0).abs() < 1e-12, "{pairs:?}");
        assert!((pairs.min - 0.9).abs() < 1e-12 && (pairs.max - 2.0).abs() < 1e-12);

        // Rounds that do not pair (counts differ, or a single round): none.
        let mut podq = result("queue", "podq", Some(Scope::Cpu), 900.0, 1);
        podq.rounds = vec![round(1.0, 1, 100); 3];
        let mut peer = result("queue", "rayon", None, 600.0, 1);
        peer.rounds = vec![round(1.0, 1, 100); 2];
        assert!(ratios(&[podq, peer], &[Scope::System])[0].rounds.is_none());
        let mut podq = result("queue", "podq", Some(Scope::Cpu), 900.0, 1);
        podq.rounds = vec![round(1.0, 1, 100)];
        let mut peer = result("queue", "rayon", None, 600.0, 1);
        peer.rounds = vec![round(1.0, 1, 100)];
        assert!(ratios(&[podq, peer], &[Scope::System])[0].rounds.is_none());
    }

    #[test]
    fn round_ratios_of_a_percentile_skip_rounds_with_too_few_samples() {
        let mut podq = result("latency", "podq", Some(Scope::Cpu), 1.0, 1_000);
        podq.rounds = vec![
            round(1.0, 1_000, 30),
            round(1.0, 3_000, 5),
            round(1.0, 2_000, 30),
        ];
        let mut peer = result("latency", "rayon", None, 1.0, 2_000);
        peer.rounds = vec![
            round(1.0, 2_000, 30),
            round(1.0, 1_000, 30),
            round(1.0, 1_000, 30),
        ];
        let r = ratios(&[podq, peer], &[Scope::System]);
        let p50 = r.iter().find(|x| x.metric == "p50_ns").unwrap();
        // The second pair has 5 samples on podq's side, fewer than p50's 20.
        let pairs = p50.rounds.as_ref().unwrap();
        assert_eq!(pairs.pairs, 2);
        assert!((pairs.min - 0.5).abs() < 1e-12 && (pairs.max - 2.0).abs() < 1e-12);
        // p99 needs 1 000 per round: no round qualifies.
        let p99 = r.iter().find(|x| x.metric == "p99_ns").unwrap();
        assert!(p99.rounds.is_none());
    }

    #[test]
    fn percentiles_need_ten_samples_above_them() {
        assert_eq!(
            [50.0, 90.0, 95.0, 99.0, 99.9, 99.99, 1.0, 10.0].map(min_samples),
            [20, 100, 200, 1_000, 10_000, 100_000, 1_000, 100]
        );
        assert_eq!(percentile_cell(999, 99.0, 5_000), "-");
        assert_eq!(percentile_cell(1_000, 99.0, 5_000), "5.000 µs");
        assert_eq!(percentile_cell(1, 50.0, 5_000), "-");
        // fio's block blanks what 250 samples cannot tell: p99 and above.
        let text = fio_clat("clat", &summary_of((1..=250).map(|i| i * 1000)));
        assert!(text.contains("95.00th=[  238]"), "{text}");
        assert!(text.contains("99.00th=[    -]"), "{text}");
        assert!(text.contains("99.99th=[    -]"), "{text}");
    }

    #[test]
    fn round_ranges() {
        assert_eq!(round_range(&[3e5], human_rate), "-");
        assert_eq!(
            round_range(&[3e5, 2.5e5, 2.8e5], human_rate),
            "250.0 k … 300.0 k"
        );
    }

    #[test]
    fn human_units() {
        assert_eq!(human_ns(850.0), "850 ns");
        assert_eq!(human_ns(12_300.0), "12.300 µs");
        assert_eq!(human_rate(1_234_000.0), "1.234 M");
        assert_eq!(human_rate(812_400.0), "812.4 k");
    }
}
