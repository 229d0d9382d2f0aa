//! What the stall watchdog reads of the live workqueues: each one and the pools its
//! pool_workqueues use.

use std::sync::Arc;

use super::{live_workqueues, lock, Pwq, WqShared};
use crate::pool::PoolCore;

/// The live workqueues and, per pool, which of them use it.
pub(crate) struct Watched {
    pub(crate) wqs: Vec<Arc<WqShared>>,
    /// Each pool with the indices (in `wqs`) of the workqueues using it.
    pub(crate) pools: Vec<(Arc<PoolCore>, Vec<usize>)>,
}

/// A snapshot of the live workqueues and their pools.
pub(crate) fn watched() -> Watched {
    let wqs = live_workqueues();
    let mut pools: Vec<(Arc<PoolCore>, Vec<usize>)> = Vec::new();
    for (i, wq) in wqs.iter().enumerate() {
        let pwqs: Vec<Arc<Pwq>> = lock(&wq.pwqs).clone();
        for pwq in pwqs {
            let core = &pwq.pool.core;
            match pools.iter_mut().find(|(c, _)| c.id == core.id) {
                Some((_, users)) if users.contains(&i) => {}
                Some((_, users)) => users.push(i),
                None => pools.push((Arc::clone(core), vec![i])),
            }
        }
    }
    Watched { wqs, pools }
}
