//! Asymmetric fences: a Dekker pair whose one side runs on every item and whose other
//! side runs rarely. The frequent side ([`light`]) costs nothing at run time: it only
//! keeps the compiler from moving its store past its load. The rare side ([`heavy`])
//! makes the kernel run a full memory barrier on every CPU that runs a thread of this
//! process (`membarrier(2)`, `MEMBARRIER_CMD_PRIVATE_EXPEDITED`), so each light fence
//! that races with it acts as a full one. Then, as with two full fences, of the two
//! sides (each stores, fences, then loads what the other stores) at least one sees the
//! other's store.
//!
//! Used by the CPU-intensive rule: a worker ends each item with a light fence, and the
//! watchdog, before taking a demoted worker's batch, with a heavy one
//! (`pool/README.md`, "Long items"). Under loom both are `SeqCst` fences, which give the
//! pairing the models check.

/// The frequent side's fence, between its store and its load.
#[inline(always)]
pub(crate) fn light() {
    #[cfg(not(loom))]
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(loom)]
    crate::sync::fence(crate::sync::Ordering::SeqCst);
}

// From `linux/membarrier.h`.
#[cfg(not(loom))]
const QUERY: libc::c_int = 0;
#[cfg(not(loom))]
const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
#[cfg(not(loom))]
const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

#[cfg(not(loom))]
fn membarrier(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes a command, flags and a CPU id by value and touches no
    // memory of the caller's.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) }
}

/// Registers the process for [`heavy`], once, and returns whether the kernel agreed.
/// The first call takes milliseconds (the kernel waits for a grace period), so a thread
/// that may fence heavily calls this before the first fence is wanted.
#[cfg(not(loom))]
pub(crate) fn prepare() -> bool {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // Miri runs no system call it does not know: as a kernel without the barrier.
    if cfg!(miri) {
        return false;
    }
    *REGISTERED.get_or_init(|| {
        let wanted = i64::from(PRIVATE_EXPEDITED | REGISTER_PRIVATE_EXPEDITED);
        let supported = membarrier(QUERY);
        supported >= 0
            && supported & wanted == wanted
            && membarrier(REGISTER_PRIVATE_EXPEDITED) == 0
    })
}

/// The rare side's fence, between its store and its load: about 10 µs here, an
/// interrupt to each CPU that runs a thread of the process. Returns `false`, having
/// fenced nothing, where the kernel lacks the barrier (before Linux 4.14, or disabled):
/// the caller must then not rely on the pairing.
#[cfg(not(loom))]
pub(crate) fn heavy() -> bool {
    prepare() && membarrier(PRIVATE_EXPEDITED) == 0
}

/// Loom has no registration.
#[cfg(loom)]
pub(crate) fn prepare() -> bool {
    true
}

/// Loom's stand-in: a `SeqCst` fence, always available.
#[cfg(loom)]
pub(crate) fn heavy() -> bool {
    crate::sync::fence(crate::sync::Ordering::SeqCst);
    true
}

#[cfg(all(test, not(loom)))]
mod tests {
    /// The barrier is there on the kernels podq runs on (4.14 and later), and the
    /// registration is kept: later calls work as the first.
    #[test]
    fn the_heavy_fence_is_available() {
        assert!(super::prepare(), "membarrier registration refused");
        assert!(super::heavy(), "membarrier(PRIVATE_EXPEDITED) refused");
        assert!(super::heavy());
    }
}
