//! `Topology`: the usable CPUs and, for each, its SMT core, LLC, NUMA node and package.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::path::Path;

use serde::Serialize;

use crate::pods::PodLayout;
use crate::source::{DirSource, MemSource, Recorder, Source};
use crate::synthetic::Shape;
use crate::{live, sysfs, CpuSet, Error, Scope};

/// The shard size (in cores) the kernel uses for `cache_shard` unless told otherwise.
pub const DEFAULT_SHARD_SIZE: usize = 8;

/// What is known about one CPU, as given to [`Topology::from_parts`]. Sets always
/// contain the CPU itself.
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

/// What a [`Topology`] knows about one usable CPU: [`CpuFacts`] with its sets borrowed
/// from the topology, which keeps each distinct set once for all the CPUs in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CpuFactsRef<'a> {
    /// Hardware threads of the same core, this one included.
    pub smt: &'a CpuSet,
    /// CPUs sharing the last-level cache, this one included.
    pub llc: &'a CpuSet,
    /// NUMA node.
    pub node: usize,
    /// Physical package (socket).
    pub package: usize,
}

impl CpuFactsRef<'_> {
    /// The facts as owned values.
    pub fn to_facts(&self) -> CpuFacts {
        CpuFacts {
            smt: self.smt.clone(),
            llc: self.llc.clone(),
            node: self.node,
            package: self.package,
        }
    }
}

/// One usable CPU's facts, its sets as indices into [`Topology::groups`].
#[derive(Clone, Copy, Debug)]
struct Slot {
    smt: u32,
    llc: u32,
    node: usize,
    package: usize,
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
#[derive(Clone, Debug)]
pub struct Topology {
    possible: CpuSet,
    usable: CpuSet,
    /// Indexed by CPU number; `Some` exactly for usable CPUs.
    slots: Vec<Option<Slot>>,
    /// The distinct SMT and LLC sets, each kept once: a set per CPU would take n² bits
    /// (1 GiB at the CPU limit with machine-wide groups).
    groups: Vec<CpuSet>,
    shard_size: usize,
    warnings: Vec<String>,
}

/// Serialised as if each CPU held its own facts (`facts`: one entry per CPU number,
/// `null` for CPUs that are not usable).
impl Serialize for Topology {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;

        struct Facts<'a>(&'a Topology);
        impl Serialize for Facts<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq((0..self.0.slots.len()).map(|cpu| self.0.get(cpu)))
            }
        }

        let mut st = serializer.serialize_struct("Topology", 5)?;
        st.serialize_field("possible", &self.possible)?;
        st.serialize_field("usable", &self.usable)?;
        st.serialize_field("facts", &Facts(self))?;
        st.serialize_field("shard_size", &self.shard_size)?;
        st.serialize_field("warnings", &self.warnings)?;
        st.end()
    }
}

/// Builds a topology CPU by CPU, keeping each distinct group once.
struct Builder<'a> {
    usable: &'a CpuSet,
    slots: Vec<Option<Slot>>,
    groups: Vec<CpuSet>,
    /// Indices into `groups` by the sets' hash (the sets themselves are not copied).
    by_hash: HashMap<u64, Vec<u32>>,
    /// Fixed keys: the same input builds the same topology, with no seed read.
    hasher: BuildHasherDefault<DefaultHasher>,
    /// The group the previous CPU joined, SMT and LLC: neighbours mostly share them, so
    /// this is compared before hashing.
    last: [Option<u32>; 2],
}

impl<'a> Builder<'a> {
    fn new(usable: &'a CpuSet) -> Builder<'a> {
        Builder {
            usable,
            slots: vec![None; usable.last().map_or(0, |c| c + 1)],
            groups: Vec::new(),
            by_hash: HashMap::new(),
            hasher: BuildHasherDefault::default(),
            last: [None; 2],
        }
    }

    /// Records `cpu`'s facts, its groups intersected with the usable CPUs and holding
    /// `cpu`; CPUs that are not usable are ignored.
    fn add(&mut self, cpu: usize, facts: &CpuFacts) {
        if !self.usable.contains(cpu) {
            return;
        }
        let smt = self.group(0, cpu, &facts.smt);
        let llc = self.group(1, cpu, &facts.llc);
        self.slots[cpu] = Some(Slot {
            smt,
            llc,
            node: facts.node,
            package: facts.package,
        });
    }

    /// The index of `raw ∩ usable ∪ {cpu}` in `groups`, added if new; `kind` picks the
    /// previous CPU's group to try first.
    fn group(&mut self, kind: usize, cpu: usize, raw: &CpuSet) -> u32 {
        let mut set = raw.intersection(self.usable);
        set.insert(cpu);
        if let Some(last) = self.last[kind] {
            if self.groups[last as usize] == set {
                return last;
            }
        }
        let hash = self.hasher.hash_one(&set);
        let same = self.by_hash.entry(hash).or_default();
        let index = match same.iter().find(|&&i| self.groups[i as usize] == set) {
            Some(&i) => i,
            None => {
                // At most two groups per CPU, and CPUs are below `MAX_CPUS`.
                let i = u32::try_from(self.groups.len()).expect("fewer groups than CPUs × 2");
                self.groups.push(set);
                same.push(i);
                i
            }
        };
        self.last[kind] = Some(index);
        index
    }
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
        let mut builder = Builder::new(&usable);
        for (cpu, f) in facts {
            builder.add(cpu, &f);
        }
        let Builder { slots, groups, .. } = builder;
        if let Some(missing) = usable.iter().find(|&c| slots[c].is_none()) {
            return Err(Error::Inconsistent(format!(
                "no facts for usable CPU {missing}"
            )));
        }
        Ok(Topology {
            possible,
            usable,
            slots,
            groups,
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
    /// grows with the CPUs and their distinct groups: each distinct SMT, LLC or package
    /// set is kept once (a bitmap up to its highest CPU), so machine-wide groups at the
    /// CPU limit cost a few MiB, while 32 Ki two-thread cores numbered x86-style (each
    /// core's set reaching past CPU 32 Ki) cost about 200 MiB. Doubtful but usable input
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
        let facts = usable.iter().map(|c| (c, self.facts(c).to_facts()));
        let mut t = Topology::from_parts(self.possible.clone(), usable.clone(), facts)?;
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
    pub fn facts(&self, cpu: usize) -> CpuFactsRef<'_> {
        self.get(cpu)
            .unwrap_or_else(|| panic!("CPU {cpu} is not usable in this topology"))
    }

    /// Facts of `cpu`, if usable.
    pub fn get(&self, cpu: usize) -> Option<CpuFactsRef<'_>> {
        let slot = self.slots.get(cpu).copied().flatten()?;
        Some(CpuFactsRef {
            smt: &self.groups[slot.smt as usize],
            llc: &self.groups[slot.llc as usize],
            node: slot.node,
            package: slot.package,
        })
    }

    /// NUMA node of a usable CPU.
    pub fn node_of(&self, cpu: usize) -> Option<usize> {
        self.slots.get(cpu).copied().flatten().map(|s| s.node)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(smt: &[usize], llc: &[usize], node: usize) -> CpuFacts {
        CpuFacts {
            smt: smt.iter().copied().collect(),
            llc: llc.iter().copied().collect(),
            node,
            package: 0,
        }
    }

    /// CPUs that list the same group share one copy; a CPU missing from its own list,
    /// or listing unusable CPUs, gets a group of its own.
    #[test]
    fn equal_groups_are_kept_once() {
        let usable: CpuSet = [0, 1, 2, 3, 5].into_iter().collect();
        let topo = Topology::from_parts(
            CpuSet::first_n(6),
            usable,
            [
                (0, facts(&[0, 1], &[0, 1, 2, 3], 0)),
                (1, facts(&[0, 1], &[0, 1, 2, 3], 0)),
                (2, facts(&[2, 3, 4], &[0, 1, 2, 3], 0)),
                (3, facts(&[2], &[0, 1, 2, 3, 4], 0)),
                (4, facts(&[4], &[4], 1)),
                (5, facts(&[], &[5], 1)),
            ],
        )
        .unwrap();
        // {0,1}, {0,1,2,3}, {2,3}, {5}: CPU 3's {2} ∪ {3} and CPU 2's {2,3,4} ∩ usable
        // are the same set, and so are the LLCs of CPUs 0 to 3 once CPU 4 is dropped.
        assert_eq!(topo.groups.len(), 4);
        assert_eq!(topo.facts(3).smt.to_list(), "2-3");
        assert_eq!(topo.facts(2).smt.to_list(), "2-3");
        assert_eq!(topo.facts(3).llc.to_list(), "0-3");
        assert_eq!(topo.facts(5).smt.to_list(), "5");
        assert!(topo.get(4).is_none());
        assert_eq!(topo.facts(1).to_facts(), facts(&[0, 1], &[0, 1, 2, 3], 0));
    }

    /// The JSON form has one `facts` entry per CPU number, `null` where not usable, as
    /// when each CPU held its own sets.
    #[test]
    fn serialises_facts_per_cpu() {
        let usable: CpuSet = [0, 2].into_iter().collect();
        let topo = Topology::from_parts(
            usable.clone(),
            usable,
            [(0, facts(&[0], &[0, 2], 0)), (2, facts(&[2], &[0, 2], 1))],
        )
        .unwrap();
        let json = serde_json::to_value(&topo).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "possible": [0, 2],
                "usable": [0, 2],
                "facts": [
                    {"smt": [0], "llc": [0, 2], "node": 0, "package": 0},
                    null,
                    {"smt": [2], "llc": [0, 2], "node": 1, "package": 0},
                ],
                "shard_size": 8,
                "warnings": [],
            })
        );
    }
}
