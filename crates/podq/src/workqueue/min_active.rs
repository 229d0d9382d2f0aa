//! `min_active` (the kernel's `workqueue_set_min_active`): the per-node floor under the
//! node shares of `max_active`, changed live.

use std::sync::Arc;

use super::WqShared;
use crate::policy;
use crate::{Error, Workqueue};

impl Workqueue {
    /// Changes `min_active`, the per-node forward-progress floor: every node of the
    /// effective cpumask may then run at least `n` items at once, whatever its share of
    /// `max_active` ([`crate::Attrs::min_active`]). Items waiting for a slot are
    /// activated at once if a node's limit rises. The floor survives later attribute
    /// changes; lowering `max_active` below it lowers it too, as in the kernel.
    ///
    /// Refused for ordered workqueues ([`Error::Ordered`]) and above `max_active`
    /// ([`Error::InvalidMinActive`]); the kernel clamps such values instead.
    ///
    /// ```
    /// use podq::{Topology, Workqueue};
    ///
    /// let wq = Workqueue::builder("doc-min-active")
    ///     .topology(Topology::synthetic("2s4c1t")?)
    ///     .max_active(16)
    ///     .build()?;
    /// assert_eq!(wq.attrs().min_active, 8);
    /// wq.set_min_active(12)?;
    /// assert_eq!(wq.attrs().min_active, 12);
    /// assert!(wq.set_min_active(17).is_err()); // above max_active
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_min_active(&self, n: usize) -> Result<(), Error> {
        self.shared().set_min_active(n)
    }
}

impl WqShared {
    /// [`Workqueue::set_min_active`]; also what the control plane calls.
    pub(super) fn set_min_active(self: &Arc<Self>, n: usize) -> Result<(), Error> {
        if self.ordered {
            return Err(Error::Ordered {
                wq: self.name.clone(),
                what: "min_active",
            });
        }
        let mut cfg = self.config_to_change()?;
        let max_active = cfg.attrs.max_active;
        if !policy::valid_min_active(n, max_active) {
            return Err(Error::InvalidMinActive {
                value: n,
                max_active,
            });
        }
        cfg.attrs.min_active = n;
        let effective = self.table.read().unbound.clone();
        self.store_node_limits(&policy::node_limits_with_floor(
            max_active,
            n,
            &effective,
            &self.topology,
        ));
        drop(cfg);
        for node in &self.nodes {
            self.activate(node);
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::{AtomicUsize, Mutex, Ordering::SeqCst};
    use crate::testing::fake_topology;
    use podq_topology::{CpuSet, Scope};
    use std::time::{Duration, Instant};

    /// The limits of nodes 0 and 1.
    fn node_limits(wq: &Workqueue) -> [usize; 2] {
        let shared = wq.shared();
        [0, 1].map(|node| shared.nodes[shared.node_index[node]].max())
    }

    /// 2 nodes of 4 CPUs, 6 of them in the cpumask (4 on node 0, 2 on node 1).
    fn uneven(name: &str) -> Workqueue {
        Workqueue::builder(name)
            .topology(fake_topology(2, 1, 4, 1))
            .cpumask(CpuSet::parse_list("0-5").unwrap())
            .scope(Scope::Numa)
            .max_active(16)
            .build()
            .unwrap()
    }

    #[test]
    fn raises_and_lowers_the_node_floor() {
        let wq = uneven("min-active-floor");
        // ceil(16*4/6) = 11; ceil(16*2/6) = 6, lifted to the default floor 8.
        assert_eq!(node_limits(&wq), [11, 8]);
        wq.set_min_active(12).unwrap();
        assert_eq!(node_limits(&wq), [12, 12]);
        wq.set_min_active(0).unwrap();
        assert_eq!(node_limits(&wq), [11, 6]);
        assert_eq!(wq.attrs().min_active, 0);
    }

    /// Waits (up to 10 s) until `running` reads `want`.
    fn wait_for(running: &AtomicUsize, want: usize) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        while running.load(SeqCst) != want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        running.load(SeqCst)
    }

    #[test]
    fn a_raised_floor_activates_waiting_items() {
        let wq = Workqueue::builder("min-active-activate")
            .topology(fake_topology(2, 1, 4, 1))
            .cpumask(CpuSet::parse_list("0-5").unwrap())
            .scope(Scope::Numa)
            .max_active(6)
            .build()
            .unwrap();
        // Node 1 holds 2 of the 6 CPUs: its share is ceil(6*2/6) = 2 without a floor.
        wq.set_min_active(0).unwrap();
        assert_eq!(node_limits(&wq), [4, 2]);
        let running = Arc::new(AtomicUsize::new(0));
        let (open, gate) = std::sync::mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (running, gate) = (Arc::clone(&running), Arc::clone(&gate));
                let work = move || {
                    running.fetch_add(1, SeqCst);
                    crate::blocking(|| gate.lock().unwrap().recv().unwrap());
                };
                let (handle, task) = crate::join::pair(work);
                wq.shared()
                    .enqueue_any(crate::entry::Task::Once(task), Some(4), false)
                    .map_err(|_| "refused")
                    .unwrap();
                handle
            })
            .collect();
        assert_eq!(wait_for(&running, 2), 2);
        // The other two wait for a slot.
        #[cfg(feature = "stats")]
        assert_eq!(wq.stats().totals.max_active_waits, 2);
        wq.set_min_active(4).unwrap();
        assert_eq!(wait_for(&running, 4), 4);
        for _ in 0..4 {
            open.send(()).unwrap();
        }
        for handle in handles {
            handle.join().unwrap();
        }
    }

    #[test]
    fn survives_attribute_changes() {
        let wq = uneven("min-active-kept");
        wq.set_min_active(12).unwrap();
        wq.set_scope(Scope::Cpu).unwrap();
        assert_eq!(node_limits(&wq), [12, 12]);
        wq.set_cpumask(CpuSet::parse_list("0-7").unwrap()).unwrap();
        // ceil(16*4/8) = 8 on each node, lifted to 12.
        assert_eq!(node_limits(&wq), [12, 12]);
        assert_eq!(wq.attrs().min_active, 12);
    }

    #[test]
    fn lowering_max_active_lowers_it_for_good() {
        let wq = uneven("min-active-max");
        wq.set_min_active(12).unwrap();
        wq.set_max_active(4).unwrap();
        assert_eq!(wq.attrs().min_active, 4);
        assert_eq!(node_limits(&wq), [4, 4]);
        // As in the kernel, raising max_active again does not bring 12 back.
        wq.set_max_active(16).unwrap();
        assert_eq!(wq.attrs().min_active, 4);
        assert_eq!(node_limits(&wq), [11, 6]);
    }

    #[test]
    fn refuses_bad_values() {
        let wq = uneven("min-active-bad");
        match wq.set_min_active(17) {
            Err(Error::InvalidMinActive {
                value: 17,
                max_active: 16,
            }) => {}
            other => panic!("want InvalidMinActive, got {other:?}"),
        }
        assert_eq!(
            wq.set_min_active(17).unwrap_err().to_string(),
            "invalid min_active 17: must be in 0..=16 (the max_active)"
        );
        assert_eq!(wq.attrs().min_active, 8);
        assert_eq!(node_limits(&wq), [11, 8]);

        let ordered = Workqueue::builder("min-active-ordered")
            .ordered(true)
            .build()
            .unwrap();
        assert!(matches!(
            ordered.set_min_active(1),
            Err(Error::Ordered {
                what: "min_active",
                ..
            })
        ));
    }

    #[test]
    fn builder_default_follows_max_active() {
        let small = Workqueue::builder("min-active-small")
            .max_active(3)
            .build()
            .unwrap();
        assert_eq!(small.attrs().min_active, 3);
        let ordered = Workqueue::builder("min-active-ord")
            .ordered(true)
            .build()
            .unwrap();
        assert_eq!(ordered.attrs().min_active, 1);
    }

    #[test]
    fn builder_option_sets_the_floor_and_is_checked() {
        let wq = Workqueue::builder("min-active-builder")
            .topology(fake_topology(2, 1, 4, 1))
            .cpumask(CpuSet::parse_list("0-5").unwrap())
            .scope(Scope::Numa)
            .max_active(16)
            .min_active(10)
            .build()
            .unwrap();
        assert_eq!(wq.attrs().min_active, 10);
        // ceil(16*4/6) = 11; ceil(16*2/6) = 6, lifted to the floor 10.
        assert_eq!(node_limits(&wq), [11, 10]);

        let err = Workqueue::builder("min-active-builder-high")
            .max_active(4)
            .min_active(5)
            .build()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid min_active 5: must be in 0..=4 (the max_active)"
        );
        let err = Workqueue::builder("min-active-builder-ordered")
            .ordered(true)
            .min_active(1)
            .build()
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Ordered {
                    what: "min_active",
                    ..
                }
            ),
            "{err}"
        );
    }
}
