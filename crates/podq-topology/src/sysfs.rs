//! Reading a topology from a sysfs tree (`sys/devices/system/{cpu,node}`); the rules
//! are documented on [`Topology::from_sysfs`].

use std::collections::BTreeMap;

use crate::source::Source;
use crate::{CpuFacts, CpuSet, Error, Topology};

const CPU_DIR: &str = "sys/devices/system/cpu";
const NODE_DIR: &str = "sys/devices/system/node";

/// How a file's content is parsed.
#[derive(Clone, Copy)]
enum Form {
    List,
    Mask,
}

/// The sysfs reader: one pass over a [`Source`], collecting warnings on the way.
struct Reader<'a> {
    src: &'a dyn Source,
    warnings: Vec<String>,
}

/// What was read about one CPU before the groups that need all CPUs are settled.
struct Raw {
    smt: CpuSet,
    /// `None`: no cache information; the LLC falls back to package ∩ node.
    llc: Option<CpuSet>,
    package: Package,
}

enum Package {
    Set(CpuSet),
    Id(i64),
    Unknown,
}

pub(crate) fn read(src: &dyn Source) -> Result<Topology, Error> {
    Reader {
        src,
        warnings: Vec::new(),
    }
    .topology()
}

impl Reader<'_> {
    fn text(&self, rel: &str) -> Result<Option<String>, Error> {
        let Some(bytes) = self.src.read(rel)? else {
            return Ok(None);
        };
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| self.malformed(rel, "not UTF-8 text".to_owned()))
    }

    fn malformed(&self, rel: &str, reason: String) -> Error {
        Error::Malformed {
            path: self.src.display(rel),
            reason,
        }
    }

    /// Parses `rel` as a cpulist or mask; an unparsable file is an error naming it.
    fn set(&self, rel: &str, form: Form) -> Result<Option<CpuSet>, Error> {
        let Some(text) = self.text(rel)? else {
            return Ok(None);
        };
        let parsed = match form {
            Form::List => CpuSet::parse_list(&text),
            Form::Mask => CpuSet::parse_mask(&text),
        };
        parsed
            .map(Some)
            .map_err(|e| self.malformed(rel, e.to_string()))
    }

    /// The first of `candidates` that exists.
    fn first_set(&self, dir: &str, candidates: &[(&str, Form)]) -> Result<Option<CpuSet>, Error> {
        for &(name, form) in candidates {
            if let Some(set) = self.set(&format!("{dir}/{name}"), form)? {
                return Ok(Some(set));
            }
        }
        Ok(None)
    }

    fn number(&self, rel: &str) -> Result<Option<i64>, Error> {
        let Some(text) = self.text(rel)? else {
            return Ok(None);
        };
        let t = crate::cpuset::trim_sysfs(&text);
        t.parse()
            .map(Some)
            .map_err(|_| self.malformed(rel, format!("expected a number, found `{t}`")))
    }

    fn topology(mut self) -> Result<Topology, Error> {
        let cpu_dirs: CpuSet = self
            .src
            .numbered(CPU_DIR, "cpu")?
            .ok_or_else(|| {
                self.malformed(
                    CPU_DIR,
                    "missing: not a sysfs root (expected sys/devices/system/cpu)".to_owned(),
                )
            })?
            .into_iter()
            .collect();
        let online = self.online(&cpu_dirs)?;
        let possible = self
            .set(&format!("{CPU_DIR}/possible"), Form::List)?
            .unwrap_or_else(|| cpu_dirs.union(&online));
        let ghosts = online.difference(&cpu_dirs);
        if !ghosts.is_empty() {
            self.warnings.push(format!(
                "{CPU_DIR}/online lists CPUs {ghosts} that have no cpuN folder; left out"
            ));
        }
        let usable = online.intersection(&cpu_dirs);
        if usable.is_empty() {
            return Err(self.malformed(CPU_DIR, "no online CPU".to_owned()));
        }

        let mut raw = BTreeMap::new();
        let mut no_cache = CpuSet::new();
        let mut no_package_id = CpuSet::new();
        for cpu in &usable {
            let r = self.cpu(cpu)?;
            if r.llc.is_none() {
                no_cache.insert(cpu);
            }
            if matches!(r.package, Package::Id(id) if id < 0) {
                no_package_id.insert(cpu);
            }
            raw.insert(cpu, r);
        }
        if !no_package_id.is_empty() {
            self.warnings.push(format!(
                "physical_package_id is -1 for CPUs {no_package_id}"
            ));
        }
        let nodes = self.nodes(&usable)?;
        let packages = packages(&usable, &raw);
        if !no_cache.is_empty() {
            let which = if no_cache == usable {
                "any CPU".to_owned()
            } else {
                format!("CPUs {no_cache}")
            };
            self.warnings.push(format!(
                "no cache information for {which}; LLC := CPUs sharing package and NUMA node"
            ));
        }
        let facts: Vec<(usize, CpuFacts)> = raw
            .into_iter()
            .map(|(cpu, r)| {
                let (node, package) = (nodes[&cpu], packages[&cpu]);
                let llc = r.llc.unwrap_or_else(|| {
                    usable
                        .iter()
                        .filter(|c| nodes[c] == node && packages[c] == package)
                        .collect()
                });
                let facts = CpuFacts {
                    smt: r.smt,
                    llc,
                    node,
                    package,
                };
                (cpu, facts)
            })
            .collect();
        let mut topo = Topology::from_parts(possible, usable, facts)?;
        for w in self.warnings {
            topo = topo.with_warning(w);
        }
        Ok(topo)
    }

    fn online(&mut self, cpu_dirs: &CpuSet) -> Result<CpuSet, Error> {
        if let Some(online) = self.set(&format!("{CPU_DIR}/online"), Form::List)? {
            return Ok(online);
        }
        let mut online = CpuSet::new();
        let mut blank = CpuSet::new();
        for cpu in cpu_dirs {
            let rel = format!("{CPU_DIR}/cpu{cpu}/online");
            let Some(text) = self.text(&rel)? else {
                online.insert(cpu);
                continue;
            };
            match crate::cpuset::trim_sysfs(&text) {
                "1" => {
                    online.insert(cpu);
                }
                "0" => {}
                // Some captures hold an empty file; only `0` means offline.
                "" => {
                    blank.insert(cpu);
                    online.insert(cpu);
                }
                other => {
                    return Err(self.malformed(&rel, format!("expected 0 or 1, found `{other}`")))
                }
            }
        }
        if !blank.is_empty() {
            self.warnings.push(format!(
                "cpuN/online is empty for CPUs {blank}; taken as online"
            ));
        }
        Ok(online)
    }

    fn cpu(&mut self, cpu: usize) -> Result<Raw, Error> {
        let topo_dir = format!("{CPU_DIR}/cpu{cpu}/topology");
        let smt = self
            .first_set(
                &topo_dir,
                &[
                    ("thread_siblings_list", Form::List),
                    ("core_cpus_list", Form::List),
                    ("thread_siblings", Form::Mask),
                    ("core_cpus", Form::Mask),
                ],
            )?
            .unwrap_or_else(|| CpuSet::single(cpu));
        let package_set = self.first_set(
            &topo_dir,
            &[
                ("core_siblings_list", Form::List),
                ("package_cpus_list", Form::List),
                ("core_siblings", Form::Mask),
                ("package_cpus", Form::Mask),
            ],
        )?;
        let package = match package_set {
            Some(set) => Package::Set(set),
            None => match self.number(&format!("{topo_dir}/physical_package_id"))? {
                Some(id) => Package::Id(id),
                None => Package::Unknown,
            },
        };
        let llc = self.llc(cpu, &smt)?;
        Ok(Raw { smt, llc, package })
    }

    fn llc(&mut self, cpu: usize, smt: &CpuSet) -> Result<Option<CpuSet>, Error> {
        let cache_dir = format!("{CPU_DIR}/cpu{cpu}/cache");
        let Some(indices) = self.src.numbered(&cache_dir, "index")? else {
            return Ok(None);
        };
        let mut best: Option<(i64, usize, CpuSet)> = None;
        for index in indices {
            let dir = format!("{cache_dir}/index{index}");
            if let Some(kind) = self.text(&format!("{dir}/type"))? {
                if crate::cpuset::trim_sysfs(&kind) == "Instruction" {
                    continue;
                }
            }
            let Some(level) = self.number(&format!("{dir}/level"))? else {
                continue;
            };
            let Some(shared) = self.first_set(
                &dir,
                &[
                    ("shared_cpu_list", Form::List),
                    ("shared_cpu_map", Form::Mask),
                ],
            )?
            else {
                continue;
            };
            let higher = match &best {
                Some((best_level, _, _)) => level > *best_level,
                None => true,
            };
            if higher {
                best = Some((level, index, shared));
            }
        }
        Ok(best.map(|(level, index, shared)| {
            if shared.is_empty() {
                self.warnings.push(format!(
                    "cpu{cpu} index{index} (L{level}) has an empty shared_cpu mask; using thread siblings"
                ));
                smt.clone()
            } else {
                shared
            }
        }))
    }

    /// NUMA node of each usable CPU.
    fn nodes(&mut self, usable: &CpuSet) -> Result<BTreeMap<usize, usize>, Error> {
        let mut node_of: BTreeMap<usize, usize> = BTreeMap::new();
        let Some(nodes) = self.src.numbered(NODE_DIR, "node")? else {
            return Ok(usable.iter().map(|c| (c, 0)).collect());
        };
        let mut listed_in: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for node in nodes {
            let dir = format!("{NODE_DIR}/node{node}");
            let cpus = self
                .first_set(&dir, &[("cpulist", Form::List), ("cpumap", Form::Mask)])?
                .unwrap_or_default();
            for cpu in cpus.intersection(usable).iter() {
                node_of.entry(cpu).or_insert(node);
                listed_in.entry(cpu).or_default().push(node);
            }
        }
        for (cpu, nodes) in listed_in {
            if nodes.len() > 1 {
                self.warnings.push(format!(
                    "cpu{cpu} is listed in several NUMA nodes {nodes:?}; using node{}",
                    nodes[0]
                ));
            }
        }
        for cpu in usable {
            if node_of.contains_key(&cpu) {
                continue;
            }
            let links = self
                .src
                .numbered(&format!("{CPU_DIR}/cpu{cpu}"), "node")?
                .unwrap_or_default();
            let node = match links.first() {
                Some(&node) => {
                    self.warnings.push(format!(
                        "cpu{cpu} is in no node cpulist; using cpu{cpu}/node{node} link"
                    ));
                    node
                }
                None => {
                    self.warnings
                        .push(format!("cpu{cpu} is in no NUMA node; using node0"));
                    0
                }
            };
            node_of.insert(cpu, node);
        }
        Ok(node_of)
    }
}

/// Dense package numbers: a CPU joins the package of the first lower CPU it shares a
/// package with (the kernel's generic builder), so ids follow the lowest CPU.
fn packages(usable: &CpuSet, raw: &BTreeMap<usize, Raw>) -> BTreeMap<usize, usize> {
    let same = |cur: usize, pre: usize| match (&raw[&cur].package, &raw[&pre].package) {
        (_, Package::Set(set)) => set.contains(cur),
        (Package::Id(a), Package::Id(b)) => a == b,
        (Package::Unknown, Package::Unknown) => true,
        _ => false,
    };
    let mut ids: BTreeMap<usize, usize> = BTreeMap::new();
    let mut next = 0;
    for cur in usable {
        let id = usable
            .iter()
            .take_while(|&pre| pre < cur)
            .find(|&pre| same(cur, pre))
            .map(|pre| ids[&pre]);
        let id = id.unwrap_or_else(|| {
            next += 1;
            next - 1
        });
        ids.insert(cur, id);
    }
    ids
}
