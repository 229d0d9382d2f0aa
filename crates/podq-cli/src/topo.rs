//! `podq topo`: the pods of every affinity scope, for this machine, a sysfs capture or
//! a synthetic shape.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use podq_topology::{CpuSet, PodsReport, Scope, Topology, DEFAULT_SHARD_SIZE};
use serde::Serialize;

use crate::usage::usage;

/// `cpu:pod` pairs per line of the terminal form, so big machines stay readable.
const CPU_POD_PER_LINE: usize = 16;

/// The version of `--json`'s layout; bumped when a field changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 1;

/// `--json`: the pods report with what it was computed from.
#[derive(Serialize)]
struct JsonReport<'a> {
    /// [`SCHEMA_VERSION`].
    schema_version: u32,
    /// `live`, `sysfs:PATH` or `synthetic:SHAPE`.
    source: &'a str,
    #[serde(flatten)]
    report: &'a PodsReport,
}

/// Options of `podq topo`.
#[derive(clap::Args)]
pub struct Args {
    /// Read a sysfs capture instead of this machine: a directory holding
    /// `sys/devices/system/cpu`, or a `.tar.gz` of one (as `--capture` writes).
    #[arg(long, value_name = "DIR|FILE.tar.gz", conflicts_with = "synthetic")]
    sysfs_root: Option<PathBuf>,

    /// Use a synthetic machine, e.g. `2s24c2t`, `2s4l8c2t`, `2s2n12c2t:linear`
    /// (sockets, nodes per socket, LLCs per node, cores per LLC, threads per core).
    #[arg(long, value_name = "SHAPE")]
    synthetic: Option<String>,

    /// The `cache_shard` target size in cores (at least 1).
    #[arg(
        long,
        value_name = "N",
        default_value_t = DEFAULT_SHARD_SIZE as u64,
        value_parser = clap::value_parser!(u64).range(1..=u32::MAX as u64)
    )]
    shard_size: u64,

    /// Print JSON: `{"schema_version": 1, "source": "live", "cpus": [..], "scopes":
    /// {"cpu": [[..]], ..}, ..}`.
    #[arg(long)]
    json: bool,

    /// Show only this scope (`default`: the one it resolves to).
    #[arg(long, value_name = "NAME")]
    scope: Option<Scope>,

    /// One line per scope (pods, CPUs per pod, nodes) instead of every pod and the
    /// CPU → pod map: for big machines.
    #[arg(long, conflicts_with = "json")]
    summary: bool,

    /// Write the sysfs files podq reads on this machine to FILE.tar.gz, for
    /// `--sysfs-root` to read back elsewhere.
    #[arg(
        long,
        value_name = "FILE.tar.gz",
        conflicts_with_all = ["sysfs_root", "synthetic"]
    )]
    capture: Option<PathBuf>,

    /// Show a running process's worker pools instead, as `podq ctl --pid N pools`
    /// does: read from its control server.
    #[arg(
        long,
        value_name = "N",
        conflicts_with_all = ["sysfs_root", "synthetic", "capture", "summary", "scope", "socket"]
    )]
    pid: Option<u32>,

    /// As `--pid`, through this control socket.
    #[arg(
        long,
        value_name = "PATH",
        conflicts_with_all = ["sysfs_root", "synthetic", "capture", "summary", "scope"]
    )]
    socket: Option<PathBuf>,
}

/// Runs `podq topo`.
pub fn run(args: &Args) -> Result<()> {
    if args.pid.is_some() || args.socket.is_some() {
        return process_pools(args);
    }
    if let Some(out) = &args.capture {
        let (topo, files) = Topology::capture(std::path::Path::new("/"), out, "podq-capture")
            .with_context(|| format!("capturing sysfs into {}", out.display()))?;
        eprintln!(
            "wrote {files} files ({} online CPUs) to {}",
            topo.usable().len(),
            out.display()
        );
        return Ok(());
    }
    // A shape on the command line that does not parse is a usage error (2); a
    // capture or machine that cannot be read is a failure (1).
    let (topo, source) = if let Some(root) = &args.sysfs_root {
        let topo = Topology::from_sysfs(root)
            .with_context(|| format!("reading sysfs capture {}", root.display()))?;
        (topo, format!("sysfs:{}", root.display()))
    } else if let Some(shape) = &args.synthetic {
        let topo =
            Topology::synthetic(shape).map_err(|e| usage(format!("--synthetic {shape}: {e}")))?;
        (topo, format!("synthetic:{shape}"))
    } else {
        let topo = Topology::live().context("reading this machine's topology")?;
        (topo, "live".to_owned())
    };
    let shard_size = usize::try_from(args.shard_size).context("--shard-size is too large")?;
    let topo = topo.with_shard_size(shard_size)?;
    let default = Scope::process_default()?;
    let mut report = PodsReport::new(&topo, default)?;
    if let Some(scope) = args.scope {
        let scope = if scope == Scope::Default {
            default
        } else {
            scope
        };
        report.scopes.retain(|s, _| *s == scope);
        report.pod_nodes.retain(|s, _| *s == scope);
    }
    let text = if args.json {
        let json = JsonReport {
            schema_version: SCHEMA_VERSION,
            source: &source,
            report: &report,
        };
        serde_json::to_string(&json)? + "\n"
    } else if args.summary {
        summary(&report, &topo, &source)
    } else {
        render(&report, &topo, &source)
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}

/// `--pid N` / `--socket PATH`: the process's pools, as `podq ctl pools` prints them.
fn process_pools(args: &Args) -> Result<()> {
    let target = crate::target::TargetArgs {
        pid: args.pid,
        socket: args.socket.clone(),
    };
    let client = target.connect()?;
    let reply = target
        .call_on(client, &podq::control::Request::Pools)
        .context("cannot read the pools")?;
    let view = reply.pools.context("the server's reply has no pools")?;
    let mut out = std::io::stdout().lock();
    crate::ctl::print_pools(&mut out, &view, args.json)
}

/// Warnings that differ only in their numbers (one per CPU, say) as the first of each
/// kind and how many more there are, in order of first appearance.
fn collapse(warnings: &[String]) -> Vec<String> {
    let kind = |w: &str| -> String {
        let mut key = String::new();
        for c in w.chars() {
            if c.is_ascii_digit() {
                if !key.ends_with('#') {
                    key.push('#');
                }
            } else {
                key.push(c);
            }
        }
        key
    };
    let mut groups: Vec<(String, &str, usize)> = Vec::new();
    for w in warnings {
        let k = kind(w);
        match groups.iter_mut().find(|(key, _, _)| *key == k) {
            Some((_, _, n)) => *n += 1,
            None => groups.push((k, w, 0)),
        }
    }
    groups
        .into_iter()
        .map(|(_, first, more)| match more {
            0 => first.to_owned(),
            n => format!("{first} (and {n} more like it)"),
        })
        .collect()
}

/// The lines every terminal form starts with.
fn heading(report: &PodsReport, topo: &Topology, source: &str) -> String {
    let mut s = String::new();
    let usable = topo.usable();
    let _ = writeln!(s, "source      {source}");
    let _ = writeln!(
        s,
        "cpus        {} usable: {} (possible {})",
        usable.len(),
        usable,
        topo.possible()
    );
    let nodes: CpuSet = topo.nodes().into_iter().collect();
    let _ = writeln!(s, "nodes       {} ({})", nodes, nodes.len());
    let _ = writeln!(s, "shard size  {} cores", report.shard_size);
    for w in collapse(&report.warnings) {
        let _ = writeln!(s, "warning     {w}");
    }
    s
}

/// `--summary`: one row per scope.
fn summary(report: &PodsReport, topo: &Topology, source: &str) -> String {
    let mut s = heading(report, topo, source);
    let rows: Vec<[String; 5]> = report
        .scopes
        .iter()
        .map(|(scope, pods)| {
            let sizes = pods.iter().map(Vec::len);
            let (lo, hi) = (sizes.clone().min().unwrap_or(0), sizes.max().unwrap_or(0));
            let nodes: CpuSet = report.pod_nodes[scope].iter().flatten().copied().collect();
            [
                format!(
                    "{}{}",
                    scope.name(),
                    if *scope == report.default_scope {
                        " (default)"
                    } else {
                        ""
                    }
                ),
                pods.len().to_string(),
                if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo}-{hi}")
                },
                if nodes.is_empty() {
                    "-".to_owned()
                } else {
                    nodes.to_string()
                },
                pods.first().map_or("-".to_owned(), |p| {
                    p.iter().copied().collect::<CpuSet>().to_string()
                }),
            ]
        })
        .collect();
    s.push('\n');
    s.push_str(&crate::table::render(
        &["scope", "pods", "cpus/pod", "nodes", "first pod"],
        &rows,
    ));
    s
}

/// The terminal form: a summary, then one section per scope with its pods (CPUs and
/// NUMA node) and the CPU → pod map, like wq_dump.py's "Affinity Scopes".
fn render(report: &PodsReport, topo: &Topology, source: &str) -> String {
    let mut s = heading(report, topo, source);
    for (scope, pods) in &report.scopes {
        let nodes = &report.pod_nodes[scope];
        let default = if *scope == report.default_scope {
            " (default)"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "\n{}{default}: {} pod{}",
            scope.name().to_uppercase(),
            pods.len(),
            if pods.len() == 1 { "" } else { "s" }
        );
        let _ = writeln!(s, "  {:>4}  {:>4}  {:>5}  cpus", "pod", "node", "count");
        for (i, pod) in pods.iter().enumerate() {
            let node = nodes[i].map_or("-".to_owned(), |n| n.to_string());
            let set: podq_topology::CpuSet = pod.iter().copied().collect();
            let _ = writeln!(s, "  {i:>4}  {node:>4}  {:>5}  {set}", pod.len());
        }
        let mut cpu_pod: Vec<(usize, usize)> = pods
            .iter()
            .enumerate()
            .flat_map(|(i, pod)| pod.iter().map(move |&c| (c, i)))
            .collect();
        cpu_pod.sort_unstable();
        let map: Vec<String> = cpu_pod.iter().map(|(c, p)| format!("{c}:{p}")).collect();
        for (i, line) in map.chunks(CPU_POD_PER_LINE).enumerate() {
            let label = if i == 0 { "cpu:pod" } else { "" };
            let _ = writeln!(s, "  {label:<7}  {}", line.join(" "));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_warnings_collapse_by_kind() {
        let warnings: Vec<String> = (0..5)
            .map(|c| format!("cpu{c} is in no node cpulist; using cpu{c}/node0 link"))
            .chain(["no cache information for CPUs 0-4; LLC := CPUs sharing package".to_owned()])
            .chain(["cpu17 is in no node cpulist; using cpu17/node1 link".to_owned()])
            .collect();
        assert_eq!(
            collapse(&warnings),
            [
                "cpu0 is in no node cpulist; using cpu0/node0 link (and 5 more like it)",
                "no cache information for CPUs 0-4; LLC := CPUs sharing package",
            ]
        );
        assert!(collapse(&[]).is_empty());
    }
}
