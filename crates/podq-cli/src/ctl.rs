//! `podq ctl`: list workqueues, read and write their attributes, read and change the
//! process default scope — with the kernel's sysfs value strings —, make the process
//! re-read its usable CPUs, and read its stats. Everything the server sends is printed
//! with control characters escaped.

use std::io::Write;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use podq::control::{escape_controls, QueueSummary, Request};
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
        Action::Refresh => (Request::Refresh, "refresh the usable CPUs".to_owned()),
        Action::Stats { wq } => (
            Request::Stats { queue: wq.clone() },
            "read the stats".to_owned(),
        ),
        Action::Dump { wq, .. } => (
            Request::Dump { queue: wq.clone() },
            "dump the workqueue state".to_owned(),
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

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
