//! `Topology`: the usable CPUs and, for each, its SMT core, LLC, NUMA node and package.

use std::path::Path;

use serde::Serialize;

use crate::pods::PodLayout;
use crate::source::{DirSource, MemSource, Recorder, Source};
use crate::synthetic::Shape;
use crate::{live, sysfs, CpuSet, Error, Scope};

/// The shard size (in cores) the kernel uses for `cache_shard` unless told otherwise.
pub const DEFAULT_SHARD_SIZE: usize = 8;

/// What is known about one CPU. Sets always contain the CPU itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CpuFacts {
    /// Hardware threads of the same core, this one included.
    pub smt: CpuSet,
    /// CPUs sharing the last-level cache, this one included.
    pub llc: CpuSet,
    /// NUMA node.
    pub node: usize,
    /// Physical package (socket).
    pub package: usize,
}

/// A machine as the workqueue code sees it.
///
/// Every group (SMT, LLC, node) is already intersected with the usable CPUs, so pods
/// only ever contain CPUs a worker may run on. This is a departure from the kernel,
/// which builds pods over *possible* CPUs once at boot: user space cannot run on CPUs
/// outside its affinity mask, so podq builds pods over what it can use and re-builds
/// them when that changes.
///
/// ```
/// use podq_topology::{Scope, Topology};
///
/// // Two sockets of four cores with two threads each (x86 numbering: CPU 8 is CPU 0's
/// // sibling), as `podq topo --synthetic 2s4c2t` shows it.
/// let topo = Topology::synthetic("2s4c2t")?;
/// assert_eq!(topo.usable().len(), 16);
/// assert_eq!(topo.nodes(), [0, 1]);
/// let smt = topo.pods(Scope::Smt)?;
/// assert_eq!(smt.len(), 8);
/// assert_eq!(smt.pod_of(8), smt.pod_of(0));
/// assert_eq!(topo.pods(Scope::Numa)?.len(), 2);
/// // This machine as this process may use it: `Topology::live()`.
/// # Ok::<(), podq_topology::Error>(())
/// ```
#[derive(Clone, Debug, Serialize)]
pub struct Topology {
    possible: CpuSet,
    usable: CpuSet,
    /// Indexed by CPU number; `Some` exactly for usable CPUs.
    facts: Vec<Option<CpuFacts>>,
    shard_size: usize,
    warnings: Vec<String>,
}

impl Topology {
    /// Builds a topology from per-CPU facts. `facts` must cover every usable CPU;
    /// facts for other CPUs are ignored. Groups are intersected with `usable`.
    pub fn from_parts(
        possible: CpuSet,
        usable: CpuSet,
        facts: impl IntoIterator<Item = (usize, CpuFacts)>,
    ) -> Result<Topology, Error> {
        if usable.is_empty() {
            return Err(Error::Inconsistent("no usable CPU".to_owned()));
        }
        let possible = possible.union(&usable);
        let size = usable.last().map_or(0, |c| c + 1);
        let mut table: Vec<Option<CpuFacts>> = vec![None; size];
        for (cpu, mut f) in facts {
            if !usable.contains(cpu) {
                continue;
            }
            f.smt = f.smt.intersection(&usable);
            f.smt.insert(cpu);
            f.llc = f.llc.intersection(&usable);
            f.llc.insert(cpu);
            table[cpu] = Some(f);
        }
        if let Some(missing) = usable.iter().find(|&c| table[c].is_none()) {
            return Err(Error::Inconsistent(format!(
                "no facts for usable CPU {missing}"
            )));
        }
        Ok(Topology {
            possible,
            usable,
            facts: table,
            shard_size: DEFAULT_SHARD_SIZE,
            warnings: Vec::new(),
        })
    }

    /// Reads a sysfs tree: `root` is a directory holding `sys/devices/system/cpu` (and
    /// optionally `node`), such as `/` or an unpacked capture, or a `.tar.gz` of such a
    /// directory with one top folder (what `capture` writes).
    ///
    /// The usable CPUs are the tree's online CPUs; nothing of the machine doing the
    /// reading (its affinity mask, its cgroup) applies. See [`Topology::live`] for that.
    ///
    /// # Reading rules
    ///
    /// The rules, in the order they are tried (each CPU's groups are later intersected
    /// with the usable CPUs, see [`Topology::from_parts`]):
    /// - usable CPUs: `cpu/online`, else every `cpuN` whose `cpuN/online` is not `0` (a
    ///   missing or empty `online` file means online; CPU 0 often has none). Online
    ///   CPUs without a `cpuN` folder are left out, with a warning;
    /// - possible CPUs: `cpu/possible`, else the `cpuN` folders and the online CPUs;
    /// - SMT group: `topology/thread_siblings_list`, `core_cpus_list`, then the hex masks
    ///   `thread_siblings`, `core_cpus`; else the CPU alone. A list wins over its hex twin
    ///   (hand-edited captures exist where the two disagree);
    /// - LLC: among `cache/index*` whose `type` is not `Instruction`, the highest `level`
    ///   (the lowest index on a tie), its `shared_cpu_list` else `shared_cpu_map`; an empty
    ///   map means private to the SMT group. With no cache information the LLC is the CPUs
    ///   sharing both package and NUMA node, which is the kernel's `cpu_coregroup_mask`
    ///   fallback, and a warning says so;
    /// - package: `core_siblings_list`, `package_cpus_list`, the masks `core_siblings`,
    ///   `package_cpus`, else equal `physical_package_id`, else one package. Packages are
    ///   numbered densely by their lowest CPU;
    /// - NUMA node: `node/nodeM/cpulist` (else `cpumap`); a CPU in several nodes takes the
    ///   lowest; a CPU in no node takes its `cpuN/nodeM` link, else node 0. No `node/`
    ///   folder means one node 0. CPU-less nodes are allowed and ignored.
    ///
    /// NUL bytes and missing trailing newlines are tolerated everywhere. A file that
    /// exists but cannot be read or parsed is an error naming it; so is a root without
    /// `sys/devices/system/cpu` or without an online CPU.
    ///
    /// # Limits on hostile input
    /// Each ends the read at once with an error naming the file or entry:
    /// - a `cpuN`, `nodeN` or `indexN` entry with `N` from [`crate::MAX_CPUS`] on;
    /// - a file read that is a symbolic link (links to folders above it are followed),
    ///   a folder, a FIFO or a device (files are opened without blocking and checked
    ///   before reading), or larger than [`crate::MAX_TEXT_BYTES`];
    /// - in an archive: an entry name over 4096 bytes, more than 512 MiB out of the
    ///   decompressor, or more than 256 MiB kept (file contents, names and 128 bytes an
    ///   entry). Only entries below `sys/devices/system`, at most 8 components deep
    ///   (the deepest file read), are kept.
    ///
    /// Error messages quote at most the first 64 characters of rejected text. Memory
    /// grows with the CPUs and their groups: each CPU keeps its SMT and LLC sets, so at
    /// the CPU limit with machine-wide groups a topology takes about 1 GiB. Doubtful but usable input
    /// (fallbacks, CPUs in several nodes) is reported in [`Topology::warnings`].
    pub fn from_sysfs(root: &Path) -> Result<Topology, Error> {
        let meta = std::fs::metadata(root).map_err(|source| Error::Io {
            path: root.to_path_buf(),
            source,
        })?;
        if meta.is_dir() {
            sysfs::read(&DirSource::new(root))
        } else {
            sysfs::read(&MemSource::open(root)?)
        }
    }

    /// Like [`Topology::from_sysfs`] on a `.tar.gz` capture already in memory; `name`
    /// is what errors call it.
    pub fn from_sysfs_archive(name: &Path, archive: &[u8]) -> Result<Topology, Error> {
        sysfs::read(&MemSource::from_archive(name, archive)?)
    }

    /// Like [`Topology::from_sysfs`] on a tree given as files: each path is relative to
    /// the root (`sys/devices/system/cpu/online`, ...) with its content. Directories
    /// are implied by the paths; links cannot be expressed.
    pub fn from_sysfs_files(
        files: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> Result<Topology, Error> {
        sysfs::read(&MemSource::from_files(files))
    }

    /// This machine as this process sees it: `/sys` read from `/`, with the usable CPUs
    /// narrowed to online ∩ this thread's affinity mask ∩ the cgroup's effective cpuset
    /// (when readable).
    pub fn live() -> Result<Topology, Error> {
        let topo = Topology::from_sysfs(Path::new("/"))?;
        let mut allowed = live::affinity()?;
        if let Some(cpuset) = live::cgroup_cpuset() {
            allowed = allowed.intersection(&cpuset);
        }
        topo.restrict(&allowed)
    }

    /// A synthetic machine from a shape such as `2s24c2t`, `2s4l8c2t` or
    /// `2s2n12c2t:linear` (grammar in [`Shape`]).
    pub fn synthetic(shape: &str) -> Result<Topology, Error> {
        Shape::parse(shape)?.topology()
    }

    /// Writes the sysfs files that [`Topology::from_sysfs`] reads from `root`
    /// (normally `/`) into a `.tar.gz` at `out` with top folder `top`, which
    /// `from_sysfs` reads back. Returns the topology read and the number of files.
    pub fn capture(root: &Path, out: &Path, top: &str) -> Result<(Topology, usize), Error> {
        if top.is_empty() || top.contains('/') || top == "." || top == ".." {
            return Err(Error::Invalid {
                what: "capture folder name",
                reason: format!("`{top}` must be one non-empty path component"),
            });
        }
        let recorder = Recorder::new(DirSource::new(root));
        let topo = sysfs::read(&recorder as &dyn Source)?;
        let files = recorder.write_archive(out, top)?;
        Ok((topo, files))
    }

    /// Sets the `cache_shard` target size in cores (the kernel's
    /// `workqueue.cache_shard_size`). Zero is refused with an error, where the kernel
    /// raises it to 1 with a warning: a bad setting should not pass silently.
    pub fn with_shard_size(mut self, cores: usize) -> Result<Topology, Error> {
        if cores == 0 {
            return Err(Error::Invalid {
                what: "shard size",
                reason: "must be at least 1 core".to_owned(),
            });
        }
        self.shard_size = cores;
        Ok(self)
    }

    /// Adds a note about something read that was doubtful but not fatal.
    pub fn with_warning(mut self, warning: impl Into<String>) -> Topology {
        self.warnings.push(warning.into());
        self
    }

    /// Keeps only the usable CPUs that are also in `cpus` (an affinity mask or cgroup
    /// cpuset). An empty result is an error.
    pub fn restrict(&self, cpus: &CpuSet) -> Result<Topology, Error> {
        let usable = self.usable.intersection(cpus);
        if usable.is_empty() {
            return Err(Error::Inconsistent(format!(
                "none of the usable CPUs {} is in {}",
                self.usable, cpus
            )));
        }
        let facts: Vec<(usize, CpuFacts)> =
            usable.iter().map(|c| (c, self.facts(c).clone())).collect();
        let mut t = Topology::from_parts(self.possible.clone(), usable, facts)?;
        t.shard_size = self.shard_size;
        t.warnings.clone_from(&self.warnings);
        Ok(t)
    }

    /// All CPUs the machine could ever have (sysfs `possible`), at least the usable ones.
    pub fn possible(&self) -> &CpuSet {
        &self.possible
    }

    /// The CPUs work may run on.
    pub fn usable(&self) -> &CpuSet {
        &self.usable
    }

    /// The `cache_shard` target size in cores.
    pub fn shard_size(&self) -> usize {
        self.shard_size
    }

    /// Notes about doubtful input (e.g. no cache information, so the LLC was guessed).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Facts of a usable CPU.
    ///
    /// # Panics
    /// If `cpu` is not usable; use [`Topology::get`] for a checked lookup.
    pub fn facts(&self, cpu: usize) -> &CpuFacts {
        self.get(cpu)
            .unwrap_or_else(|| panic!("CPU {cpu} is not usable in this topology"))
    }

    /// Facts of `cpu`, if usable.
    pub fn get(&self, cpu: usize) -> Option<&CpuFacts> {
        self.facts.get(cpu).and_then(Option::as_ref)
    }

    /// NUMA node of a usable CPU.
    pub fn node_of(&self, cpu: usize) -> Option<usize> {
        self.get(cpu).map(|f| f.node)
    }

    /// The nodes that have usable CPUs, ascending.
    pub fn nodes(&self) -> Vec<usize> {
        let mut nodes: Vec<usize> = self.usable.iter().map(|c| self.facts(c).node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// The usable CPUs of `node`.
    pub fn node_cpus(&self, node: usize) -> CpuSet {
        self.usable
            .iter()
            .filter(|&c| self.facts(c).node == node)
            .collect()
    }

    /// The pods of a concrete scope. `Scope::Default` must be resolved by the caller
    /// (see [`Scope::resolve`]); passing it is an error.
    pub fn pods(&self, scope: Scope) -> Result<PodLayout, Error> {
        PodLayout::build(self, scope)
    }
}
