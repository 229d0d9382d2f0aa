//! What this process may run on: its affinity mask and its cgroup's cpuset. These read
//! the live machine (a system call and `/proc`, `/sys/fs/cgroup`) but keep no state.

use std::fs;
use std::path::{Path, PathBuf};

use crate::{CpuSet, Error};

/// The calling thread's CPU affinity mask (`sched_getaffinity`), of any width: the
/// buffer doubles until the kernel's mask fits, so machines beyond 1024 CPUs work.
pub fn affinity() -> Result<CpuSet, Error> {
    affinity_of(0)
}

/// The CPU affinity mask of thread `tid` (0: the calling thread; a process id names
/// its main thread), of any width, as [`affinity`].
pub fn affinity_of(tid: libc::pid_t) -> Result<CpuSet, Error> {
    let mut words: Vec<libc::c_ulong> = vec![0; 16];
    loop {
        let bytes = std::mem::size_of_val(words.as_slice());
        // SAFETY: `words` is a live, writable buffer of exactly `bytes` bytes, and the
        // kernel writes at most `bytes` bytes into it.
        let rc = unsafe { libc::sched_getaffinity(tid, bytes, words.as_mut_ptr().cast()) };
        if rc >= 0 {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINVAL) && bytes < crate::MAX_CPUS / 8 {
            // The kernel's mask is wider than the buffer.
            words.resize(words.len() * 2, 0);
            continue;
        }
        return Err(Error::Io {
            path: PathBuf::from("sched_getaffinity"),
            source: err,
        });
    }
    let bits = libc::c_ulong::BITS as usize;
    let mut set = CpuSet::new();
    for (i, &word) in words.iter().enumerate() {
        for bit in 0..bits {
            if word & (1 << bit) != 0 {
                set.insert(i * bits + bit);
            }
        }
    }
    Ok(set)
}

/// Binds thread `tid` (0: the calling thread; a process id names its main thread) to
/// `cpus` (`sched_setaffinity`), of any width: the mask passed is as wide as the
/// highest CPU needs, so CPUs beyond 1023 work. An empty set is refused by the kernel
/// (`EINVAL`), as is a set with no CPU the thread may use.
pub fn set_affinity_of(tid: libc::pid_t, cpus: &CpuSet) -> Result<(), Error> {
    let bits = libc::c_ulong::BITS as usize;
    let len = cpus.last().map_or(0, |c| c / bits + 1).max(16);
    let mut words: Vec<libc::c_ulong> = vec![0; len];
    for c in cpus {
        words[c / bits] |= 1 << (c % bits);
    }
    let bytes = std::mem::size_of_val(words.as_slice());
    // SAFETY: `words` is a live buffer of exactly `bytes` bytes, which the kernel only
    // reads.
    let rc = unsafe { libc::sched_setaffinity(tid, bytes, words.as_ptr().cast()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Io {
            path: PathBuf::from("sched_setaffinity"),
            source: std::io::Error::last_os_error(),
        })
    }
}

/// The CPUs of this process's cgroup cpuset (`cpuset.cpus.effective` on cgroup v2,
/// `cpuset.effective_cpus` on v1), found through `/proc/self/cgroup` under
/// `/sys/fs/cgroup`. `None` when there is no readable cpuset: then only the affinity
/// mask limits the process. An empty or unparsable file is also `None`, because the
/// affinity mask (which the kernel keeps within the cpuset) still applies.
pub fn cgroup_cpuset() -> Option<CpuSet> {
    let cgroups = fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_cpuset_in(&cgroups, Path::new("/sys/fs/cgroup"))
}

/// [`cgroup_cpuset`] over a given `/proc/self/cgroup` text and cgroup mount point.
pub fn cgroup_cpuset_in(proc_self_cgroup: &str, mount: &Path) -> Option<CpuSet> {
    for candidate in cpuset_files(proc_self_cgroup, mount) {
        if let Ok(text) = fs::read_to_string(&candidate) {
            if let Ok(set) = CpuSet::parse_list(&text) {
                if !set.is_empty() {
                    return Some(set);
                }
            }
        }
    }
    None
}

/// The files that may hold this process's effective cpuset, most specific first.
fn cpuset_files(proc_self_cgroup: &str, mount: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if controllers.is_empty() {
            files.push(mount.join(rel).join("cpuset.cpus.effective"));
            files.push(
                mount
                    .join("unified")
                    .join(rel)
                    .join("cpuset.cpus.effective"),
            );
        } else if controllers.split(',').any(|c| c == "cpuset") {
            files.push(mount.join("cpuset").join(rel).join("cpuset.effective_cpus"));
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_CPUS;

    #[test]
    fn affinity_is_not_empty() {
        let set = affinity().unwrap();
        assert!(!set.is_empty());
        let online =
            CpuSet::parse_list(&fs::read_to_string("/sys/devices/system/cpu/online").unwrap())
                .unwrap();
        assert!(set.is_subset(&online), "{set} not within online {online}");
    }

    #[test]
    fn set_affinity_round_trips_on_a_thread() {
        let all = affinity().unwrap();
        let first = all.first().unwrap();
        let seen = std::thread::spawn(move || {
            set_affinity_of(0, &CpuSet::single(first)).unwrap();
            let narrowed = affinity().unwrap();
            let refused = set_affinity_of(0, &CpuSet::single(MAX_CPUS - 1)).unwrap_err();
            (narrowed, refused.to_string())
        })
        .join()
        .unwrap();
        assert_eq!(seen.0, CpuSet::single(first));
        assert!(seen.1.contains("sched_setaffinity"), "{}", seen.1);
        assert_eq!(affinity().unwrap(), all, "other threads are not affected");
    }

    #[test]
    fn cgroup_files_for_v1_and_v2() {
        let mount = Path::new("/cg");
        let v2 = cpuset_files("0::/user.slice/a.scope\n", mount);
        assert_eq!(
            v2[0],
            PathBuf::from("/cg/user.slice/a.scope/cpuset.cpus.effective")
        );
        let v1 = cpuset_files("4:memory:/x\n3:cpuset,cpu:/box\n", mount);
        assert_eq!(
            v1,
            vec![PathBuf::from("/cg/cpuset/box/cpuset.effective_cpus")]
        );
    }

    #[test]
    fn cgroup_cpuset_reads_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("jail");
        fs::create_dir_all(&cg).unwrap();
        fs::write(cg.join("cpuset.cpus.effective"), "2-3,8\n").unwrap();
        let set = cgroup_cpuset_in("0::/jail\n", dir.path()).unwrap();
        assert_eq!(set.to_list(), "2-3,8");
        assert_eq!(cgroup_cpuset_in("0::/elsewhere\n", dir.path()), None);
    }
}
