//! What the kernel counts for threads and CPUs, for `podq monitor`: per-thread context
//! switches, migrations and CPU time (for workers), and per-CPU busy/idle time from
//! `/proc/stat` (as `mpstat` computes it).
//!
//! Thread counters come from the `procfs` crate (`status`, `schedstat`, `stat`), except
//! `se.nr_migrations`, which it does not read: that is only in
//! `/proc/<pid>/task/<tid>/sched` (it needs `CONFIG_SCHED_DEBUG`), parsed here. Per-CPU
//! times are parsed here too: `procfs::KernelStats` gives the `cpuN` lines as a list
//! without their CPU numbers, which are needed once a CPU is offline (`cpu0`, `cpu2`).
//! The parsers are pure functions over the files' text, tested on captured samples.
//!
//! A counter the kernel does not expose is `None` ("unavailable"), never a guess.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use podq_topology::CpuSet;

/// Voluntary plus involuntary context switches of every thread of this process so
/// far, ended ones included (`getrusage(RUSAGE_SELF)`).
pub fn process_context_switches() -> Result<u64> {
    context_switches_of(libc::RUSAGE_SELF)
}

/// Voluntary plus involuntary context switches of the calling thread so far
/// (`getrusage(RUSAGE_THREAD)`).
pub fn thread_context_switches() -> Result<u64> {
    context_switches_of(libc::RUSAGE_THREAD)
}

/// The process's and the calling thread's context switches at one moment: a
/// benchmark's driver thread takes two and counts its workers' switches in between.
#[derive(Clone, Copy, Debug)]
pub struct Switches {
    process: u64,
    driver: u64,
}

impl Switches {
    /// Both counts now.
    pub fn now() -> Result<Switches> {
        Ok(Switches {
            process: process_context_switches()?,
            driver: thread_context_switches()?,
        })
    }

    /// The switches of every thread but the caller (the driver) since `earlier`.
    pub fn since(self, earlier: Switches) -> u64 {
        let process = self.process.saturating_sub(earlier.process);
        process.saturating_sub(self.driver.saturating_sub(earlier.driver))
    }
}

fn context_switches_of(who: libc::c_int) -> Result<u64> {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage.
    let rc = unsafe { libc::getrusage(who, &mut usage) };
    if rc != 0 {
        return Err(anyhow!(
            "getrusage failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok((usage.ru_nvcsw + usage.ru_nivcsw) as u64)
}

/// Scheduler counters of one thread.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ThreadSched {
    /// The thread id.
    pub tid: u32,
    /// The thread's name (`comm`).
    pub name: String,
    /// Times the thread gave up the CPU itself (blocked, slept, yielded).
    pub voluntary_ctxt_switches: u64,
    /// Times the thread was preempted.
    pub nonvoluntary_ctxt_switches: u64,
    /// CPU time in nanoseconds.
    pub cpu_time_ns: u64,
    /// Where `cpu_time_ns` came from.
    pub cpu_time_source: CpuTimeSource,
    /// Migrations between CPUs (`se.nr_migrations`); `None` when the kernel does not
    /// expose it.
    pub migrations: Option<u64>,
}

/// The source of a thread's CPU time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CpuTimeSource {
    /// `schedstat`'s first field: exact nanoseconds of `sum_exec_runtime`.
    Schedstat,
    /// `stat`'s `utime + stime`: clock ticks, converted (coarse).
    StatTicks,
}

/// Parses `se.nr_migrations` from a `sched` text; `None` when absent.
pub fn parse_sched_migrations(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "se.nr_migrations").then(|| value.trim().parse().ok())?
    })
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Reads every thread of process `pid`, sorted by tid. Threads that exit while being
/// read are left out.
pub fn read_threads(pid: u32) -> Result<Vec<ThreadSched>> {
    let pid_i = i32::try_from(pid).map_err(|_| anyhow!("pid {pid} is out of range"))?;
    let process =
        procfs::process::Process::new(pid_i).with_context(|| format!("cannot read /proc/{pid}"))?;
    let tasks = process
        .tasks()
        .with_context(|| format!("cannot read /proc/{pid}/task"))?;
    let mut threads: Vec<ThreadSched> = tasks
        .filter_map(|task| read_task(pid, &task.ok()?).ok())
        .collect();
    threads.sort_by_key(|t| t.tid);
    Ok(threads)
}

/// Reads the scheduler counters of one task of process `pid`.
fn read_task(pid: u32, task: &procfs::process::Task) -> Result<ThreadSched> {
    let tid = u32::try_from(task.tid)?;
    let dir = PathBuf::from(format!("/proc/{pid}/task/{tid}"));
    let status = task
        .status()
        .with_context(|| format!("cannot read {}/status", dir.display()))?;
    let switches = |v: Option<u64>, name: &str| {
        v.ok_or_else(|| anyhow!("{}/status: no `{name}` line", dir.display()))
    };
    let voluntary = switches(status.voluntary_ctxt_switches, "voluntary_ctxt_switches")?;
    let nonvoluntary = switches(
        status.nonvoluntary_ctxt_switches,
        "nonvoluntary_ctxt_switches",
    )?;
    let (cpu_time_ns, cpu_time_source) = match task.schedstat() {
        Ok(s) => (s.sum_exec_runtime, CpuTimeSource::Schedstat),
        // Kernels without CONFIG_SCHEDSTATS: fall back to tick-based accounting.
        Err(_) => {
            let stat = task
                .stat()
                .with_context(|| format!("cannot read {}/stat", dir.display()))?;
            let ticks = stat.utime + stat.stime;
            (
                ticks.saturating_mul(1_000_000_000 / clock_ticks_per_second()),
                CpuTimeSource::StatTicks,
            )
        }
    };
    let migrations = fs::read_to_string(dir.join("sched"))
        .ok()
        .and_then(|text| parse_sched_migrations(&text));
    Ok(ThreadSched {
        tid,
        name: status.name,
        voluntary_ctxt_switches: voluntary,
        nonvoluntary_ctxt_switches: nonvoluntary,
        cpu_time_ns,
        cpu_time_source,
        migrations,
    })
}

/// The clock tick rate (`_SC_CLK_TCK`), for tick-based counters.
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions; it returns -1 for unknown names.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&hz| hz > 0).unwrap_or(100)
}

/// The time columns of one `cpu` line of `/proc/stat`, in clock ticks. Guest time is
/// already counted in `user`/`nice` by the kernel, so it is not kept separately.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CpuTimes {
    /// Normal processes in user mode.
    pub user: u64,
    /// Niced processes in user mode.
    pub nice: u64,
    /// Kernel mode.
    pub system: u64,
    /// Idle.
    pub idle: u64,
    /// Idle with I/O outstanding.
    pub iowait: u64,
    /// Hard interrupts.
    pub irq: u64,
    /// Soft interrupts.
    pub softirq: u64,
    /// Stolen by the hypervisor.
    pub steal: u64,
}

impl CpuTimes {
    /// Ticks spent doing something (everything but idle and iowait).
    pub fn busy(&self) -> u64 {
        self.user + self.nice + self.system + self.irq + self.softirq + self.steal
    }

    /// Ticks spent idle (idle and iowait).
    pub fn idle_all(&self) -> u64 {
        self.idle + self.iowait
    }

    /// The counters from `earlier` to `self`. Each saturates at zero: the kernel's
    /// iowait may step backwards.
    pub fn since(&self, earlier: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user.saturating_sub(earlier.user),
            nice: self.nice.saturating_sub(earlier.nice),
            system: self.system.saturating_sub(earlier.system),
            idle: self.idle.saturating_sub(earlier.idle),
            iowait: self.iowait.saturating_sub(earlier.iowait),
            irq: self.irq.saturating_sub(earlier.irq),
            softirq: self.softirq.saturating_sub(earlier.softirq),
            steal: self.steal.saturating_sub(earlier.steal),
        }
    }

    /// Adds another CPU's counters (to total a node).
    pub fn add(&self, other: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user + other.user,
            nice: self.nice + other.nice,
            system: self.system + other.system,
            idle: self.idle + other.idle,
            iowait: self.iowait + other.iowait,
            irq: self.irq + other.irq,
            softirq: self.softirq + other.softirq,
            steal: self.steal + other.steal,
        }
    }

    /// Busy share in percent, over these (delta) counters; `None` when no tick passed.
    pub fn busy_percent(&self) -> Option<f64> {
        let total = self.busy() + self.idle_all();
        (total > 0).then(|| 100.0 * self.busy() as f64 / total as f64)
    }
}

/// The CPU lines of `/proc/stat`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcStat {
    /// The `cpu` line: every CPU together.
    pub all: CpuTimes,
    /// The `cpuN` lines, by CPU number (offline CPUs have none).
    pub cpus: BTreeMap<usize, CpuTimes>,
}

impl ProcStat {
    /// Per-CPU and total counters from `earlier` to `self`; CPUs missing from either
    /// sample (hotplugged meanwhile) are left out.
    pub fn since(&self, earlier: &ProcStat) -> ProcStat {
        ProcStat {
            all: self.all.since(&earlier.all),
            cpus: self
                .cpus
                .iter()
                .filter_map(|(cpu, now)| Some((*cpu, now.since(earlier.cpus.get(cpu)?))))
                .collect(),
        }
    }

    /// The sum over the CPUs of `cpus` present in this sample.
    pub fn total_of(&self, cpus: &CpuSet) -> CpuTimes {
        cpus.iter()
            .filter_map(|cpu| self.cpus.get(&cpu))
            .fold(CpuTimes::default(), |sum, t| sum.add(t))
    }
}

/// Parses the `cpu` lines of a `/proc/stat` text. Lines with fewer than the eight
/// columns used here (kernels before 2.6.11) are refused.
pub fn parse_proc_stat(text: &str) -> Result<ProcStat, String> {
    let mut stat = ProcStat::default();
    let mut saw_all = false;
    for line in text.lines().filter(|l| l.starts_with("cpu")) {
        let mut words = line.split_whitespace();
        let label = words.next().unwrap_or_default();
        let values: Vec<u64> = words
            .take(8)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| format!("`{label}` line has a non-numeric column: `{line}`"))?;
        let [user, nice, system, idle, iowait, irq, softirq, steal] = values[..] else {
            return Err(format!("`{label}` line has fewer than 8 columns: `{line}`"));
        };
        let times = CpuTimes {
            user,
            nice,
            system,
            idle,
            iowait,
            irq,
            softirq,
            steal,
        };
        match &label[3..] {
            "" => {
                stat.all = times;
                saw_all = true;
            }
            n => {
                let cpu = n.parse().map_err(|_| format!("bad CPU label `{label}`"))?;
                stat.cpus.insert(cpu, times);
            }
        }
    }
    if !saw_all {
        return Err("no `cpu` line".into());
    }
    Ok(stat)
}

/// Reads `/proc/stat`.
pub fn read_proc_stat() -> Result<ProcStat> {
    let path = Path::new("/proc/stat");
    parse_proc_stat(&read(path)?).map_err(|reason| anyhow!("{}: {reason}", path.display()))
}

/// The CPUs of each NUMA node from `/sys/devices/system/node/node<N>/cpulist`. A
/// kernel without NUMA support has no such files: then every CPU of `/proc/stat` is
/// node 0.
pub fn read_node_cpus(stat: &ProcStat) -> Result<BTreeMap<usize, CpuSet>> {
    let root = Path::new("/sys/devices/system/node");
    let mut nodes = BTreeMap::new();
    if let Ok(entries) = fs::read_dir(root) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(node) = name
                .to_str()
                .and_then(|n| n.strip_prefix("node"))
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            let path = entry.path().join("cpulist");
            let cpus =
                CpuSet::parse_list(&read(&path)?).with_context(|| format!("{}", path.display()))?;
            nodes.insert(node, cpus);
        }
    }
    if nodes.is_empty() {
        nodes.insert(0, stat.cpus.keys().copied().collect());
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from a 6.18 kernel (bash, pid 5089).
    const SCHED: &str = "bash (5089, #threads: 1)\n\
        -------------------------------------------------------------------\n\
        se.exec_start                                :        446756.590326\n\
        se.vruntime                                  :         16222.193818\n\
        se.sum_exec_runtime                          :            45.640854\n\
        se.nr_migrations                             :                   18\n\
        nr_switches                                  :                  110\n\
        nr_voluntary_switches                        :                   90\n";
    const PROC_STAT: &str = "cpu  7978 0 2588 77843 235 0 21 9 0 0\n\
        cpu0 3750 0 1171 39363 37 0 3 2 0 0\n\
        cpu1 4227 0 1416 38479 197 0 18 6 0 0\n\
        intr 139576 0 0 0\n\
        ctxt 257514\n";

    #[test]
    fn the_drivers_own_switches_are_left_out() {
        let before = Switches {
            process: 100,
            driver: 10,
        };
        let after = Switches {
            process: 180,
            driver: 25,
        };
        assert_eq!(after.since(before), 65);
    }

    #[test]
    fn sched_migrations_parse() {
        assert_eq!(parse_sched_migrations(SCHED), Some(18));
        assert_eq!(parse_sched_migrations("nr_switches : 3\n"), None);
        assert_eq!(parse_sched_migrations("se.nr_migrations : many\n"), None);
    }

    #[test]
    fn proc_stat_parses_and_deltas() {
        let before = parse_proc_stat(PROC_STAT).unwrap();
        assert_eq!(before.cpus.len(), 2);
        assert_eq!(before.all.user, 7978);
        assert_eq!(before.cpus[&1].iowait, 197);
        assert_eq!(before.cpus[&1].steal, 6);
        let after_text = PROC_STAT
            .replace("cpu0 3750 0 1171 39363", "cpu0 3780 0 1181 39423")
            .replace("cpu1 4227 0 1416 38479 197", "cpu1 4227 0 1416 38579 190");
        let after = parse_proc_stat(&after_text).unwrap();
        let delta = after.since(&before);
        // cpu0: 40 busy ticks, 60 idle; cpu1: 100 idle, iowait went back (saturates).
        assert_eq!(delta.cpus[&0].busy(), 40);
        assert_eq!(delta.cpus[&0].busy_percent(), Some(40.0));
        assert_eq!(delta.cpus[&1].busy_percent(), Some(0.0));
        assert_eq!(delta.cpus[&1].iowait, 0);
        let node = delta.total_of(&CpuSet::first_n(2));
        assert_eq!(node.busy_percent(), Some(20.0));
        assert_eq!(CpuTimes::default().busy_percent(), None);
    }

    #[test]
    fn proc_stat_errors_are_named() {
        assert!(parse_proc_stat("intr 1\n")
            .unwrap_err()
            .contains("no `cpu` line"));
        let err = parse_proc_stat("cpu 1 2 3\n").unwrap_err();
        assert!(err.contains("fewer than 8"), "{err}");
        let err = parse_proc_stat("cpu 1 2 3 4 5 6 7 8\ncpuX 1 2 3 4 5 6 7 8\n").unwrap_err();
        assert!(err.contains("`cpuX`"), "{err}");
        let err = parse_proc_stat("cpu 1 2 3 x 5 6 7 8\n").unwrap_err();
        assert!(err.contains("non-numeric"), "{err}");
    }

    #[test]
    fn live_reads_work_on_this_machine() {
        let me = std::process::id();
        let threads = read_threads(me).unwrap();
        let main = threads.iter().find(|t| t.tid == me).unwrap();
        assert!(main.voluntary_ctxt_switches + main.nonvoluntary_ctxt_switches > 0);
        assert!(main.cpu_time_ns > 0);
        let stat = read_proc_stat().unwrap();
        assert!(!stat.cpus.is_empty());
        let nodes = read_node_cpus(&stat).unwrap();
        let covered = nodes.values().fold(CpuSet::new(), |all, n| all.union(n));
        assert!(stat.cpus.keys().all(|&c| covered.contains(c)));
    }
}
