//! Reading a topology from a sysfs tree (`sys/devices/system/{cpu,node}`); the rules
//! are documented on [`Topology::from_sysfs`].

use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;

use crate::error::quote;
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
    /// Every distinct set read for a CPU's group (SMT, LLC, package), kept once: CPUs
    /// mostly list the same groups, and one set per CPU would take n² bits (at the CPU
    /// limit with machine-wide lists, 8 KiB per CPU and group).
    shared: HashSet<Rc<CpuSet>>,
}

/// What was read about one CPU before the groups that need all CPUs are settled.
struct Raw {
    smt: Rc<CpuSet>,
    /// `None`: no cache information; the LLC falls back to package ∩ node.
    llc: Option<Rc<CpuSet>>,
}

#[derive(Clone, Debug)]
enum Package {
    Set(Rc<CpuSet>),
    Id(i64),
    Unknown,
}

pub(crate) fn read(src: &dyn Source) -> Result<Topology, Error> {
    Reader {
        src,
        warnings: Vec::new(),
        shared: HashSet::new(),
    }
    .topology()
}

impl Reader<'_> {
    /// The kept copy of `set` (kept now if it is the first).
    fn share(&mut self, set: CpuSet) -> Rc<CpuSet> {
        if let Some(kept) = self.shared.get(&set) {
            return Rc::clone(kept);
        }
        let kept = Rc::new(set);
        self.shared.insert(Rc::clone(&kept));
        kept
    }

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
            .map_err(|_| self.malformed(rel, format!("expected a number, found {}", quote(t))))
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
        let mut package_of = BTreeMap::new();
        let mut no_cache = CpuSet::new();
        let mut no_package_id = CpuSet::new();
        for cpu in &usable {
            let (r, package) = self.cpu(cpu)?;
            if r.llc.is_none() {
                no_cache.insert(cpu);
            }
            if matches!(package, Package::Id(id) if id < 0) {
                no_package_id.insert(cpu);
            }
            raw.insert(cpu, r);
            package_of.insert(cpu, package);
        }
        if !no_package_id.is_empty() {
            self.warnings.push(format!(
                "physical_package_id is -1 for CPUs {no_package_id}"
            ));
        }
        let nodes = self.nodes(&usable)?;
        let packages = packages(&usable, &package_of);
        // Package sets are not needed past here; at the CPU limit they take 8 KiB each.
        drop(package_of);
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
        // The fallback LLC of each (node, package), gathered in one pass.
        let mut fallback: BTreeMap<(usize, usize), CpuSet> = BTreeMap::new();
        if !no_cache.is_empty() {
            for cpu in &usable {
                fallback
                    .entry((nodes[&cpu], packages[&cpu]))
                    .or_default()
                    .insert(cpu);
            }
        }
        drop(self.shared);
        // One CPU's sets at a time: `from_parts` keeps each distinct set once too.
        let facts = raw.into_iter().map(|(cpu, r)| {
            let (node, package) = (nodes[&cpu], packages[&cpu]);
            let llc = r
                .llc
                .map_or_else(|| fallback[&(node, package)].clone(), Rc::unwrap_or_clone);
            let facts = CpuFacts {
                smt: Rc::unwrap_or_clone(r.smt),
                llc,
                node,
                package,
            };
            (cpu, facts)
        });
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
                    return Err(
                        self.malformed(&rel, format!("expected 0 or 1, found {}", quote(other)))
                    )
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

    fn cpu(&mut self, cpu: usize) -> Result<(Raw, Package), Error> {
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
            Some(set) => Package::Set(self.share(set)),
            None => match self.number(&format!("{topo_dir}/physical_package_id"))? {
                Some(id) => Package::Id(id),
                None => Package::Unknown,
            },
        };
        let llc = self.llc(cpu, &smt)?.map(|set| self.share(set));
        Ok((
            Raw {
                smt: self.share(smt),
                llc,
            },
            package,
        ))
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
        // Each node costs one pass over its set's words, however many nodes list a CPU.
        let mut placed = CpuSet::new();
        let mut listed_twice = CpuSet::new();
        for node in nodes {
            let dir = format!("{NODE_DIR}/node{node}");
            let cpus = self
                .first_set(&dir, &[("cpulist", Form::List), ("cpumap", Form::Mask)])?
                .unwrap_or_default()
                .intersection(usable);
            listed_twice = listed_twice.union(&cpus.intersection(&placed));
            for cpu in &cpus.difference(&placed) {
                node_of.insert(cpu, node);
            }
            placed = placed.union(&cpus);
        }
        if !listed_twice.is_empty() {
            self.warnings.push(format!(
                "CPUs {listed_twice} are listed in several NUMA nodes; each takes its lowest"
            ));
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
///
/// "Shares" is: the lower CPU's package set holds it, or both have the same
/// `physical_package_id`, or neither says anything. Rather than scan every lower CPU
/// (quadratic), the lowest candidate of each kind is kept as CPUs go by; a package set
/// costs one pass over its words.
fn packages(usable: &CpuSet, package_of: &BTreeMap<usize, Package>) -> BTreeMap<usize, usize> {
    let mut ids: BTreeMap<usize, usize> = BTreeMap::new();
    // CPU -> the lowest lower CPU whose package set holds it.
    let mut set_sharer: BTreeMap<usize, usize> = BTreeMap::new();
    // Usable CPUs above the current one that no package set has claimed yet.
    let mut unclaimed = usable.clone();
    let mut first_with_id: BTreeMap<i64, usize> = BTreeMap::new();
    let mut first_unknown: Option<usize> = None;
    let mut next = 0;
    for cur in usable {
        unclaimed.remove(cur);
        let package = &package_of[&cur];
        let same_kind = match package {
            Package::Id(id) => first_with_id.get(id).copied(),
            Package::Unknown => first_unknown,
            Package::Set(_) => None,
        };
        let sharer = match (set_sharer.get(&cur).copied(), same_kind) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let id = sharer.map_or_else(
            || {
                next += 1;
                next - 1
            },
            |pre| ids[&pre],
        );
        ids.insert(cur, id);
        match package {
            Package::Set(set) => {
                let claimed = set.intersection(&unclaimed);
                for cpu in &claimed {
                    set_sharer.insert(cpu, cur);
                }
                unclaimed = unclaimed.difference(&claimed);
            }
            Package::Id(id) => {
                first_with_id.entry(*id).or_insert(cur);
            }
            Package::Unknown => {
                first_unknown.get_or_insert(cur);
            }
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The kernel's scan, as it reads: each CPU against every lower one.
    fn naive_packages(
        usable: &CpuSet,
        package_of: &BTreeMap<usize, Package>,
    ) -> BTreeMap<usize, usize> {
        let same = |cur: usize, pre: usize| match (&package_of[&cur], &package_of[&pre]) {
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
                .map_or_else(
                    || {
                        next += 1;
                        next - 1
                    },
                    |pre| ids[&pre],
                );
            ids.insert(cur, id);
        }
        ids
    }

    #[test]
    fn packages_follow_the_lowest_sharer() {
        // 0,1: one set; 2: id 7; 3: in 0's set too late (0's set has no 3) but id 7;
        // 4: unknown; 5: unknown; 6: claimed by 1's set.
        let package_of: BTreeMap<usize, Package> = [
            (0, Package::Set(Rc::new([0, 1].into_iter().collect()))),
            (1, Package::Set(Rc::new([1, 6].into_iter().collect()))),
            (2, Package::Id(7)),
            (3, Package::Id(7)),
            (4, Package::Unknown),
            (5, Package::Unknown),
            (6, Package::Id(9)),
        ]
        .into_iter()
        .collect();
        let usable = CpuSet::first_n(7);
        let ids: Vec<usize> = packages(&usable, &package_of).into_values().collect();
        assert_eq!(ids, vec![0, 0, 1, 1, 2, 2, 0]);
    }

    proptest! {
        #[test]
        fn packages_equal_the_kernel_scan(
            kinds in proptest::collection::vec(
                prop_oneof![
                    proptest::collection::btree_set(0..24usize, 0..6)
                        .prop_map(|s| Package::Set(Rc::new(s.into_iter().collect()))),
                    (-1..3i64).prop_map(Package::Id),
                    Just(Package::Unknown),
                ],
                1..24,
            )
        ) {
            let package_of: BTreeMap<usize, Package> = kinds.into_iter().enumerate().collect();
            let usable: CpuSet = package_of.keys().copied().collect();
            prop_assert_eq!(packages(&usable, &package_of), naive_packages(&usable, &package_of));
        }
    }
}
