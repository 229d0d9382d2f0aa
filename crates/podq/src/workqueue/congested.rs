//! [`Workqueue::congested`] (`workqueue_congested`): whether an item queued on a CPU
//! would wait, for callers that want back-pressure.

use std::sync::Arc;

use super::{lock, Hold, Table};
use crate::{Error, Workqueue};

impl Workqueue {
    /// Whether an item queued on the pod of `cpu` now would wait before it starts: the
    /// pod's pool_workqueue has items waiting for an active slot (or is plugged behind
    /// an older one, for ordered workqueues, or the workqueue is frozen), its node's share of `max_active` is used
    /// up, or its pool's worklist already holds items no worker has taken. An advisory
    /// snapshot, unsynchronised as in the kernel (which looks at the inactive list
    /// only). A CPU outside the workqueue's effective cpumask is refused
    /// ([`Error::InvalidCpu`]).
    ///
    /// ```
    /// use std::sync::mpsc;
    ///
    /// let wq = podq::Workqueue::builder("doc-congested").ordered(true).build()?;
    /// let cpu = wq.topology().usable().first().unwrap();
    /// assert!(!wq.congested(cpu)?);
    /// let (open, gate) = mpsc::channel::<()>();
    /// let blocker = wq.spawn(move || gate.recv());
    /// let waiting = wq.spawn(|| ());
    /// assert!(wq.congested(cpu)?, "the second item waits behind the first");
    /// open.send(())?;
    /// blocker.join().unwrap()?;
    /// waiting.join().unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn congested(&self, cpu: usize) -> Result<bool, Error> {
        let wq = self.shared();
        let table: Arc<Table> = wq.table.load();
        let pwq = match table.cpu_pwq.get(cpu) {
            Some(Some(pwq)) if table.unbound.contains(cpu) => pwq,
            _ => {
                return Err(Error::InvalidCpu {
                    cpu,
                    usable: table.unbound.clone(),
                })
            }
        };
        let waiting = {
            let st = lock(&pwq.state);
            !st.inactive.is_empty() || st.hold == Hold::Plugged || st.frozen
        };
        Ok(waiting || wq.nodes[pwq.node].is_full() || pwq.pool.core.worklist_len() > 0)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::mpsc;

    use crate::testing::fake_topology;
    use crate::{Error, Workqueue};

    #[test]
    fn a_full_node_congests_and_a_cpu_outside_the_mask_is_refused() {
        let wq = Workqueue::builder("congested-full")
            .topology(fake_topology(1, 1, 2, 1))
            .cpumask(podq_topology::CpuSet::single(0))
            .max_active(1)
            .build()
            .unwrap();
        assert!(!wq.congested(0).unwrap());
        let (open, gate) = mpsc::channel::<()>();
        let (started_tx, started) = mpsc::channel::<()>();
        let blocker = wq.spawn(move || {
            started_tx.send(()).unwrap();
            gate.recv().unwrap();
        });
        started.recv().unwrap();
        assert!(wq.congested(0).unwrap(), "max_active 1 is taken");
        open.send(()).unwrap();
        blocker.join().unwrap();
        wq.flush();
        assert!(!wq.congested(0).unwrap());
        match wq.congested(1) {
            Err(Error::InvalidCpu { cpu: 1, usable }) => assert_eq!(usable.to_list(), "0"),
            other => panic!("want InvalidCpu, got {other:?}"),
        }
        assert!(wq.congested(99).is_err());
    }
}
