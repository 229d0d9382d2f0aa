//! What the stall watchdog reads of a pool.

use super::PoolCore;

impl PoolCore {
    /// Items on the worklist now (active, not yet taken by a worker).
    pub(crate) fn worklist_len(&self) -> usize {
        self.worklist.len()
    }
}
