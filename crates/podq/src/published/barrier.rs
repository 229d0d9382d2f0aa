//! Asymmetric fences: a reader side that costs a compiler fence and a writer side that
//! costs a system call. `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` runs a full
//! memory barrier on every CPU that runs a thread of this process, so a reader's
//! program order stands in for a fence: whatever it wrote before its compiler fence is
//! visible to the writer after the call, or it reads after the fence what the writer
//! wrote before the call. Where the kernel lacks the command (before Linux 4.14) or
//! refuses to register it, both sides are `SeqCst` fences, a pair the language
//! orders. Under loom and Miri, which cannot run the system call, too.

#[cfg(not(any(loom, miri)))]
use std::sync::atomic::compiler_fence;

use crate::sync::fence;
use crate::sync::Ordering::SeqCst;

/// The fence pair one `Published` uses, chosen once when it is built.
#[derive(Debug)]
pub(super) struct Barrier {
    /// I: whether the process is registered for expedited membarriers (never under
    /// loom and Miri).
    #[cfg_attr(any(loom, miri), allow(dead_code))]
    expedited: bool,
}

impl Barrier {
    pub(super) fn new() -> Barrier {
        Barrier {
            expedited: expedited_registered(),
        }
    }

    /// The reader's side, between its announcing store and its load of the value.
    #[inline(always)]
    pub(super) fn light(&self) {
        #[cfg(not(any(loom, miri)))]
        if self.expedited {
            compiler_fence(SeqCst);
            return;
        }
        fence(SeqCst);
    }

    /// The writer's side, between its store of the new value and its loads of the
    /// readers' announcements.
    pub(super) fn heavy(&self) {
        #[cfg(not(any(loom, miri)))]
        if self.expedited {
            // After a successful registration the command does not fail (membarrier(2));
            // should the registration be gone (a forked child's fresh process), register
            // again. Without the barrier, readers that skipped their fence would be
            // unprotected, so a failure of both is fatal.
            if membarrier(libc::MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0
                && (membarrier(libc::MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0
                    || membarrier(libc::MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0)
            {
                panic!(
                    "podq: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after \
                     registration: {}",
                    std::io::Error::last_os_error()
                );
            }
            return;
        }
        fence(SeqCst);
    }
}

/// Whether this process is registered for `MEMBARRIER_CMD_PRIVATE_EXPEDITED`
/// (registering it on the first call).
#[cfg(not(any(loom, miri)))]
fn expedited_registered() -> bool {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REGISTERED.get_or_init(|| {
        let supported = membarrier(libc::MEMBARRIER_CMD_QUERY);
        supported > 0
            && supported & libc::c_long::from(libc::MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0
            && membarrier(libc::MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
    })
}

/// The membarrier system call with no flags: its return value.
#[cfg(not(any(loom, miri)))]
fn membarrier(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes no pointers.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) }
}

#[cfg(any(loom, miri))]
fn expedited_registered() -> bool {
    false
}
