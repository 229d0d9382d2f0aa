//! `podq ctl`: list workqueues, read and write their attributes, read and change the
//! process default scope — with the kernel's sysfs value strings —, make the process
//! re-read its usable CPUs, and read its stats. Everything the server sends is printed
//! with control characters escaped.

use std::io::Write;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use podq::control::{escape_controls, Param, PoolsView, QueueSummary, Request};
use podq::CpuSet;
use podq::WorkqueueStats;

use crate::target::TargetArgs;

/// `podq ctl` arguments.
#[derive(Args, Debug)]
pub struct CtlArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// List the visible workqueues, their attributes and whether each is frozen.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print one attribute (affinity_scope, affinity_strict, cpumask, max_active,
    /// min_active, nice).
    Get {
        /// The workqueue.
        wq: String,
        /// The attribute.
        attr: String,
    },
    /// Write one attribute; prints the value read back.
    Set {
        /// The workqueue.
        wq: String,
        /// The attribute.
        attr: String,
        /// The value, as written to the kernel's sysfs file (may be negative: `-5`).
        #[arg(allow_hyphen_values = true)]
        value: String,
    },
    /// Print the process default scope, or set it (queues on `default` follow it).
    DefaultScope {
        /// The new default scope (not `default`).
        scope: Option<String>,
    },
    /// Print the process-wide parameters, or one, or set one and print the value read
    /// back: `cpu_intensive_thresh_us` (µs) or `watchdog_thresh` (s), as the kernel's
    /// workqueue module parameters; `0` turns the check off.
    Param {
        /// The parameter (none: all of them, a line each).
        name: Option<String>,
        /// The new value, a decimal integer in the parameter's unit.
        #[arg(allow_hyphen_values = true)]
        value: Option<String>,
    },
    /// Make the process re-read its usable CPUs (online, affinity, cgroup cpuset) and
    /// re-pod its workqueues; prints the usable CPU list.
    Refresh,
    /// Print the stats snapshots (JSON) of every visible workqueue, or of one; their
    /// pools' failure counters (`worker_spawn_failures`, `affinity_failures`, ...) say
    /// what the runtime could not do.
    Stats {
        /// Only this workqueue.
        wq: Option<String>,
    },
    /// Print the state of every visible workqueue, or of one (the kernel's
    /// `show_workqueue_state`): its pool_workqueues (in flight, inactive, plugged,
    /// references), its running items (label, thread, for how long) and its pools
    /// (workers, idle, worklist, how long without progress).
    Dump {
        /// Only this workqueue.
        wq: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the process's worker pools (id, references, nice, idle/workers, cpus,
    /// pod cpus, strict), each visible workqueue's CPU → pool map and default pool,
    /// and its active items against each node's share of max_active (the kernel's
    /// `wq_dump.py`).
    Pools {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `podq ctl`.
pub fn run(args: CtlArgs) -> Result<()> {
    let (request, what) = match &args.action {
        Action::List { .. } => (Request::List, "list".to_owned()),
        Action::Get { wq, attr } => (
            Request::Get {
                queue: wq.clone(),
                attr: attr.clone(),
            },
            format!("get {attr} of {wq}"),
        ),
        Action::Set { wq, attr, value } => (
            Request::Set {
                queue: wq.clone(),
                attr: attr.clone(),
                value: value.clone(),
            },
            format!("set {attr} of {wq}"),
        ),
        Action::DefaultScope { scope: None } => {
            (Request::GetDefaultScope, "get the default scope".to_owned())
        }
        Action::DefaultScope { scope: Some(scope) } => (
            Request::SetDefaultScope {
                value: scope.clone(),
            },
            "set the default scope".to_owned(),
        ),
        Action::Param { name: None, .. } => return print_params(&args.target),
        Action::Param {
            name: Some(name),
            value: None,
        } => (
            Request::GetParam { name: name.clone() },
            format!("get parameter {name}"),
        ),
        Action::Param {
            name: Some(name),
            value: Some(value),
        } => (
            Request::SetParam {
                name: name.clone(),
                value: value.clone(),
            },
            format!("set parameter {name}"),
        ),
        Action::Refresh => (Request::Refresh, "refresh the usable CPUs".to_owned()),
        Action::Stats { wq } => (
            Request::Stats { queue: wq.clone() },
            "read the stats".to_owned(),
        ),
        Action::Dump { wq, .. } => (
            Request::Dump { queue: wq.clone() },
            "dump the workqueue state".to_owned(),
        ),
        Action::Pools { .. } => (Request::Pools, "read the pools".to_owned()),
    };
    let client = args.target.connect()?;
    let reply = args
        .target
        .call_on(client, &request)
        .with_context(|| format!("cannot {what}"))?;
    let mut out = std::io::stdout().lock();
    match args.action {
        Action::List { json } => {
            let queues: Vec<QueueSummary> = reply
                .queues
                .context("the server's list reply has no queues")?
                .iter()
                .map(printable)
                .collect();
            if json {
                let typed: Vec<serde_json::Value> = queues.iter().map(typed).collect();
                serde_json::to_writer_pretty(&mut out, &typed)?;
                writeln!(out)?;
            } else {
                write!(out, "{}", list_table(&queues))?;
            }
        }
        Action::Stats { .. } => {
            let mut stats = reply.stats.context("the server's reply has no stats")?;
            for wq in &mut stats {
                wq.name = escape_controls(&wq.name).into_owned();
                for pool in &mut wq.pools {
                    pool.pod_cpus = escape_controls(&pool.pod_cpus).into_owned();
                }
            }
            serde_json::to_writer_pretty(&mut out, &stats)?;
            writeln!(out)?;
            warn_failures(&stats);
        }
        Action::Dump { json, .. } => {
            let dumps = reply.dump.context("the server's reply has no dump")?;
            // Names and labels come from the process: each line escaped, lines kept.
            let text = if json {
                serde_json::to_string_pretty(&dumps)? + "\n"
            } else {
                dumps.iter().map(ToString::to_string).collect()
            };
            for line in text.lines() {
                writeln!(out, "{}", escape_controls(line))?;
            }
        }
        Action::Pools { json } => {
            let view = reply.pools.context("the server's reply has no pools")?;
            print_pools(&mut out, &view, json)?;
        }
        _ => {
            let value = reply.value.context("the server's reply has no value")?;
            writeln!(out, "{}", escape_controls(&value))?;
            for left in reply.not_repodded.unwrap_or_default() {
                writeln!(
                    out,
                    "not re-podded: {}: {}",
                    escape_controls(&left.workqueue),
                    escape_controls(&left.reason)
                )?;
            }
        }
    }
    Ok(())
}

/// `param` without a name: each parameter and its value, a line each.
fn print_params(target: &TargetArgs) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for param in Param::ALL {
        let request = Request::GetParam {
            name: param.name().to_owned(),
        };
        let reply = target
            .call_on(target.connect()?, &request)
            .with_context(|| format!("cannot get parameter {param}"))?;
        let value = reply.value.context("the server's reply has no value")?;
        writeln!(out, "{param} {}", escape_controls(&value))?;
    }
    Ok(())
}

/// `queue` with every string escaped for the terminal.
/// `list --json`: numbers and booleans as such, and the requested scope apart from
/// the effective one (`default (cache_shard)` becomes `"affinity_scope": "default",
/// "effective_scope": "cache_shard"`). A value that does not parse stays the string
/// the server sent.
fn typed(q: &QueueSummary) -> serde_json::Value {
    let number = |s: &str| {
        s.parse::<i64>()
            .map_or_else(|_| s.into(), serde_json::Value::from)
    };
    let (requested, effective) = match q.affinity_scope.split_once(" (") {
        Some((requested, rest)) => (requested, rest.trim_end_matches(')')),
        None => (q.affinity_scope.as_str(), q.affinity_scope.as_str()),
    };
    serde_json::json!({
        "name": q.name,
        "affinity_scope": requested,
        "effective_scope": effective,
        "affinity_strict": match q.affinity_strict.as_str() {
            "0" => false.into(),
            "1" => true.into(),
            other => serde_json::Value::from(other),
        },
        "cpumask": q.cpumask,
        "max_active": number(&q.max_active),
        "min_active": number(&q.min_active),
        "nice": number(&q.nice),
        "ordered": q.ordered,
        "frozen": q.frozen,
    })
}

fn printable(queue: &QueueSummary) -> QueueSummary {
    let mut q = queue.clone();
    for field in [
        &mut q.name,
        &mut q.affinity_scope,
        &mut q.affinity_strict,
        &mut q.cpumask,
        &mut q.max_active,
        &mut q.min_active,
        &mut q.nice,
    ] {
        *field = escape_controls(field).into_owned();
    }
    q
}

/// One line on stderr per workqueue whose pools could not create worker threads.
fn warn_failures(stats: &[WorkqueueStats]) {
    for wq in stats {
        let failed: u64 = wq.pools.iter().map(|p| p.worker_spawn_failures).sum();
        if failed > 0 {
            eprintln!(
                "warning: workqueue {}: {failed} worker threads could not be created \
                 (each retried after the create cooldown)",
                wq.name
            );
        }
    }
}

/// The `list` table, columns padded to their widest cell.
fn list_table(queues: &[QueueSummary]) -> String {
    let header = [
        "NAME",
        "AFFINITY_SCOPE",
        "STRICT",
        "CPUMASK",
        "MAX_ACTIVE",
        "MIN_ACTIVE",
        "NICE",
        "ORDERED",
        "FROZEN",
    ];
    let rows: Vec<[String; 9]> = queues
        .iter()
        .map(|q| {
            [
                q.name.clone(),
                q.affinity_scope.clone(),
                q.affinity_strict.clone(),
                q.cpumask.clone(),
                q.max_active.clone(),
                q.min_active.clone(),
                q.nice.clone(),
                if q.ordered { "yes" } else { "no" }.to_owned(),
                if q.frozen { "yes" } else { "no" }.to_owned(),
            ]
        })
        .collect();
    crate::table::render(&header, &rows)
}

/// Prints a `pools` reply: tables, or with `json` the reply's JSON. Text from the
/// process (names, CPU lists) is escaped line by line.
pub fn print_pools(out: &mut dyn Write, view: &PoolsView, json: bool) -> Result<()> {
    let text = if json {
        serde_json::to_string_pretty(view)? + "\n"
    } else {
        pools_text(view)
    };
    for line in text.lines() {
        writeln!(out, "{}", escape_controls(line))?;
    }
    Ok(())
}

/// The three tables of `wq_dump.py`: pools, CPU → pool, and `nr_active/max_active`.
fn pools_text(view: &PoolsView) -> String {
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_owned();
    let pools: Vec<[String; 7]> = view
        .pools
        .iter()
        .map(|p| {
            [
                p.id.to_string(),
                p.refs.to_string(),
                p.nice.to_string(),
                format!("{}/{}", p.idle, p.workers),
                p.cpus.clone(),
                p.pod_cpus.clone(),
                yes_no(p.strict),
            ]
        })
        .collect();
    let mut text = String::from("Worker pools\n");
    text += &crate::table::render(
        &[
            "ID",
            "REFS",
            "NICE",
            "IDLE/WORKERS",
            "CPUS",
            "POD_CPUS",
            "STRICT",
        ],
        &pools,
    );
    text += "\nWorkqueue CPU -> pool\n";
    let maps: Vec<[String; 3]> = view
        .workqueues
        .iter()
        .map(|wq| {
            // CPUs grouped by pool, in the order their first CPU appears.
            let mut by_pool: Vec<(u64, Vec<usize>)> = Vec::new();
            for c in &wq.cpu_pools {
                match by_pool.iter_mut().find(|(p, _)| *p == c.pool) {
                    Some((_, cpus)) => cpus.push(c.cpu),
                    None => by_pool.push((c.pool, vec![c.cpu])),
                }
            }
            let map: Vec<String> = by_pool
                .into_iter()
                .map(|(pool, cpus)| {
                    let cpus: CpuSet = cpus.into_iter().collect();
                    format!("{}:{pool}", cpus.to_list())
                })
                .collect();
            [
                wq.name.clone(),
                wq.default_pool.map_or("-".to_owned(), |p| p.to_string()),
                map.join(" "),
            ]
        })
        .collect();
    text += &crate::table::render(&["WORKQUEUE", "DEFAULT", "CPUS:POOL"], &maps);
    text += "\nWorkqueue -> nr_active/max_active per node\n";
    // One column per node any workqueue has, then the counter of spanning pools.
    let mut nodes: Vec<Option<usize>> = Vec::new();
    for n in view.workqueues.iter().flat_map(|wq| &wq.nodes) {
        if !nodes.contains(&n.node) {
            nodes.push(n.node);
        }
    }
    nodes.sort_by_key(|n| n.map_or(usize::MAX, |id| id));
    let mut header: Vec<String> = vec!["WORKQUEUE".into(), "MIN".into(), "MAX".into()];
    header.extend(
        nodes
            .iter()
            .map(|n| n.map_or("SPANNED".to_owned(), |id| format!("NODE{id}"))),
    );
    let limits: Vec<Vec<String>> = view
        .workqueues
        .iter()
        .map(|wq| {
            let mut row = vec![
                wq.name.clone(),
                wq.min_active.to_string(),
                wq.max_active.to_string(),
            ];
            row.extend(nodes.iter().map(|node| {
                wq.nodes
                    .iter()
                    .find(|n| n.node == *node)
                    .map_or("-".to_owned(), |n| format!("{}/{}", n.nr, n.max))
            }));
            row
        })
        .collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut align = vec![crate::table::Align::Left];
    align.resize(header.len(), crate::table::Align::Right);
    text += &crate::table::aligned(&header, &limits, &align, false);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_tables() {
        let view: PoolsView = serde_json::from_value(serde_json::json!({
            "pools": [
                {"id": 3, "refs": 2, "nice": 0, "workers": 2, "idle": 1, "cpus": "0-3",
                 "pod_cpus": "0-1", "strict": false},
                {"id": 4, "refs": 1, "nice": -5, "workers": 0, "idle": 0, "cpus": "2-3",
                 "pod_cpus": "2-3", "strict": true}
            ],
            "workqueues": [
                {"name": "rpciod", "max_active": 1024, "min_active": 8,
                 "cpu_pools": [{"cpu": 0, "pool": 3}, {"cpu": 1, "pool": 3},
                               {"cpu": 2, "pool": 4}, {"cpu": 3, "pool": 4}],
                 "default_pool": 5,
                 "nodes": [{"node": 0, "nr": 3, "max": 512}, {"node": 1, "nr": 0, "max": 512},
                           {"node": null, "nr": 1, "max": 1024}]},
                {"name": "nfsiod", "max_active": 4, "min_active": 4,
                 "cpu_pools": [{"cpu": 0, "pool": 3}], "default_pool": null,
                 "nodes": [{"node": 0, "nr": 0, "max": 4}]}
            ]
        }))
        .unwrap();
        let want = "\
Worker pools
ID  REFS  NICE  IDLE/WORKERS  CPUS  POD_CPUS  STRICT
 3     2     0  1/2           0-3   0-1       no
 4     1    -5  0/0           2-3   2-3       yes

Workqueue CPU -> pool
WORKQUEUE  DEFAULT  CPUS:POOL
rpciod           5  0-1:3 2-3:4
nfsiod           -  0:3

Workqueue -> nr_active/max_active per node
WORKQUEUE  MIN   MAX  NODE0  NODE1  SPANNED
rpciod       8  1024  3/512  0/512   1/1024
nfsiod       4     4    0/4      -        -
";
        assert_eq!(pools_text(&view), want);
        let mut json = Vec::new();
        print_pools(&mut json, &view, true).unwrap();
        let back: PoolsView = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, view);
    }

    #[test]
    fn table_aligns_columns() {
        let q = |name: &str, scope: &str| -> QueueSummary {
            serde_json::from_value(serde_json::json!({
                "name": name, "affinity_scope": scope, "affinity_strict": "0",
                "cpumask": "3", "max_active": "256", "min_active": "8", "nice": "0",
                "ordered": false, "frozen": name == "nfsiod"
            }))
            .unwrap()
        };
        let table = list_table(&[q("rpciod", "default (cache_shard)"), q("nfsiod", "numa")]);
        let want = "\
NAME    AFFINITY_SCOPE         STRICT  CPUMASK  MAX_ACTIVE  MIN_ACTIVE  NICE  ORDERED  FROZEN
rpciod  default (cache_shard)       0        3         256           8     0  no       no
nfsiod  numa                        0        3         256           8     0  no       yes
";
        assert_eq!(table, want);
        let evil = printable(&q("a\x1b[2Jb", "numa\u{9b}1m"));
        assert_eq!(evil.name, r"a\u{1b}[2Jb");
        assert_eq!(evil.affinity_scope, r"numa\u{9b}1m");
    }
}
