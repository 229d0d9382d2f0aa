//! `podq topo`: the pods of every affinity scope, for this machine, a sysfs capture or
//! a synthetic shape.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use podq_topology::{PodsReport, Scope, Topology, DEFAULT_SHARD_SIZE};

/// `cpu:pod` pairs per line of the terminal form, so big machines stay readable.
const CPU_POD_PER_LINE: usize = 16;

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

    /// Print JSON: `{"cpus": [..], "scopes": {"cpu": [[..]], ..}, ..}`.
    #[arg(long)]
    json: bool,

    /// Write the sysfs files podq reads on this machine to FILE.tar.gz, for
    /// `--sysfs-root` to read back elsewhere.
    #[arg(
        long,
        value_name = "FILE.tar.gz",
        conflicts_with_all = ["sysfs_root", "synthetic"]
    )]
    capture: Option<PathBuf>,
}

/// Runs `podq topo`.
pub fn run(args: &Args) -> Result<()> {
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
    let (topo, source) = if let Some(root) = &args.sysfs_root {
        let topo = Topology::from_sysfs(root)
            .with_context(|| format!("reading sysfs capture {}", root.display()))?;
        (topo, format!("capture {}", root.display()))
    } else if let Some(shape) = &args.synthetic {
        let topo = Topology::synthetic(shape).context("building the synthetic machine")?;
        (topo, format!("synthetic {shape}"))
    } else {
        let topo = Topology::live().context("reading this machine's topology")?;
        (topo, "this machine".to_owned())
    };
    let shard_size = usize::try_from(args.shard_size).context("--shard-size is too large")?;
    let topo = topo.with_shard_size(shard_size)?;
    let default = Scope::process_default()?;
    let report = PodsReport::new(&topo, default)?;
    let text = if args.json {
        serde_json::to_string(&report)? + "\n"
    } else {
        render(&report, &topo, &source)
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}

/// The terminal form: a summary, then one section per scope with its pods (CPUs and
/// NUMA node) and the CPU → pod map, like wq_dump.py's "Affinity Scopes".
fn render(report: &PodsReport, topo: &Topology, source: &str) -> String {
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
    let nodes: Vec<String> = topo.nodes().iter().map(usize::to_string).collect();
    let _ = writeln!(s, "nodes       {}", nodes.join(","));
    let _ = writeln!(s, "shard size  {} cores", report.shard_size);
    for w in &report.warnings {
        let _ = writeln!(s, "warning     {w}");
    }
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
