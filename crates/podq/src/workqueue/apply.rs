//! Attribute changes (`apply_workqueue_attrs`): `policy::plan` decides, this applies
//! the plan (prepare, then commit; see `workqueue/README.md`), and `max_active`
//! changes, which only move the node limits.

use crate::sync::Ordering::{Relaxed, SeqCst};
use std::sync::{Arc, Weak};

use super::registry::{default_scope, pools, NEXT_POOL_ID};
use super::{Config, Hold, Pwq, Released, Table, WqShared};
use crate::attrs::{self, PoolKey};
use crate::auto::{self, AutoRun};
use crate::policy;
use crate::pool::Pool;
use crate::sync::{lock, MutexGuard};
use crate::{Attrs, Error, Scope};

impl WqShared {
    pub(super) fn change(self: &Arc<Self>, edit: impl FnOnce(&mut Attrs)) -> Result<(), Error> {
        let mut cfg = self.config_to_change()?;
        let mut attrs = cfg.attrs.clone();
        edit(&mut attrs);
        let released = self.apply(&mut cfg, attrs)?;
        let on_auto = cfg.auto.is_some();
        drop(cfg);
        drop(released);
        if on_auto {
            auto::wake_sampler()?;
        }
        Ok(())
    }

    /// `apply_workqueue_attrs`: prepare everything (errors leave no trace), then commit
    /// by adding the new pwqs to the flush list, swapping the table, and retiring old
    /// pwqs that are already empty. Old pwqs keep their items and finish them.
    ///
    /// Returns what the change released, for the caller to drop after unlocking
    /// `config`: dropping the last pwq of a pool stops and joins its workers, which
    /// must not happen under a lock an item might want.
    pub(super) fn apply(
        self: &Arc<Self>,
        cfg: &mut Config,
        attrs: Attrs,
    ) -> Result<Released, Error> {
        // Prepare.
        attrs::validate(&attrs)?;
        // `auto` chooses the concrete scope and strictness the plan is made for; the
        // requested attributes (`auto` included) are what the workqueue keeps.
        let usable = self.usable_now();
        let requested = attrs.scope.resolve(default_scope());
        // Ordered workqueues have one pool whatever the scope: nothing to choose.
        let auto = if requested == Scope::Auto && !self.ordered {
            let effective =
                policy::hotplug_cpumask(&attrs.cpumask, &usable, self.topology.usable())?;
            Some(AutoRun::plan(
                cfg.auto.as_ref(),
                &self.auto_settings,
                cfg.effective_scope,
                attrs.strict,
                &self.topology,
                &effective,
            )?)
        } else {
            None
        };
        let planned = match &auto {
            Some(run) => Attrs {
                scope: run.scope(),
                strict: run.strict(),
                ..attrs.clone()
            },
            None if requested == Scope::Auto => Attrs {
                scope: cfg.effective_scope,
                ..attrs.clone()
            },
            None => attrs.clone(),
        };
        let old_table = self.table.load();
        let mut old: Vec<Arc<Pwq>> = Vec::new();
        for pwq in old_table
            .cpu_pwq
            .iter()
            .flatten()
            .chain(old_table.dfl.iter())
        {
            if !old.iter().any(|p| Arc::ptr_eq(p, pwq)) {
                old.push(Arc::clone(pwq));
            }
        }
        let old_keys: Vec<PoolKey> = old.iter().map(|p| p.pool.core.key.clone()).collect();
        let current = policy::Current {
            pools: &old_keys,
            pwqs_alive: !lock(&self.pwqs).is_empty(),
        };
        let shape = policy::WqShape {
            topology: &self.topology,
            topology_id: self.topology_id,
            ordered: self.ordered,
            idle_timeout: self.idle_timeout,
            default_scope: default_scope(),
        };
        let plan = policy::plan(&current, &planned, &usable, &shape)?;
        let mut fresh: Vec<Arc<Pwq>> = Vec::new();
        let pwqs: Vec<Arc<Pwq>> = plan
            .pools
            .iter()
            .map(|planned| {
                if let Some(i) = planned.reused {
                    return Arc::clone(&old[i]);
                }
                let node = planned
                    .node
                    .map_or(self.nodes.len() - 1, |n| self.node_index[n]);
                let pwq = Arc::new(Pwq::new(
                    Arc::clone(self),
                    self.pool_for(&planned.key),
                    node,
                    plan.plugged,
                ));
                fresh.push(Arc::clone(&pwq));
                pwq
            })
            .collect();
        let cpu_pwq: Vec<Option<Arc<Pwq>>> = plan
            .cpu_pool
            .iter()
            .map(|p| p.map(|i| Arc::clone(&pwqs[i])))
            .collect();
        let dfl = Arc::clone(&pwqs[0]);
        let effective = plan.effective.clone();
        let scope = plan.scope;
        let table = Arc::new(Table {
            cpu_pwq,
            dfl: Some(dfl),
            unbound: effective.clone(),
        });
        // Commit.
        lock(&self.pwqs).extend(fresh.iter().cloned());
        let old_table = self.table.replace(Arc::clone(&table));
        let mut retired = Vec::new();
        let in_new = |p: &Arc<Pwq>| {
            table
                .cpu_pwq
                .iter()
                .flatten()
                .chain(table.dfl.iter())
                .any(|q| Arc::ptr_eq(p, q))
        };
        {
            let mut list = lock(&self.pwqs);
            list.retain(|p| {
                if in_new(p) {
                    return true;
                }
                if p.leave_table() {
                    retired.push(Arc::clone(p));
                    return false;
                }
                let known = cfg
                    .retired
                    .iter()
                    .any(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(p)));
                if !known {
                    cfg.retired
                        .push((Arc::downgrade(p), Arc::clone(&p.pool.core)));
                }
                true
            });
        }
        cfg.retired.retain(|(w, _)| w.strong_count() > 0);
        cfg.attrs = attrs;
        cfg.effective_scope = scope;
        cfg.auto = auto;
        self.store_node_limits(&plan.limits);
        self.unplug_oldest();
        for node in &self.nodes {
            self.activate(node);
        }
        Ok(Released {
            _table: old_table,
            _pwqs: retired,
        })
    }

    /// The shared pool for `key`, created if none is alive.
    pub(super) fn pool_for(&self, key: &PoolKey) -> Arc<Pool> {
        let mut pools = lock(pools());
        let shared_key = (key.clone(), self.threads.id);
        if let Some(pool) = pools.get(&shared_key).and_then(Weak::upgrade) {
            return pool;
        }
        pools.retain(|_, p| p.strong_count() > 0);
        let id = NEXT_POOL_ID.fetch_add(1, Relaxed) as u64;
        let pool = Arc::new(Pool::new(
            id,
            key.clone(),
            Arc::clone(&self.topology),
            &self.cpu_map,
            self.idle_timeout,
            Arc::clone(&self.threads),
        ));
        pools.insert(shared_key, Arc::downgrade(&pool));
        pool
    }

    /// Stores the node shares of `max_active` (`wq_update_node_max_active`).
    pub(super) fn store_node_limits(&self, limits: &policy::NodeLimits) {
        for &(node, max) in &limits.per_node {
            self.nodes[self.node_index[node]].set_max(max);
        }
        self.nodes[self.nodes.len() - 1].set_max(limits.fallback);
    }

    /// Ordered workqueues: lets the oldest live pwq activate (`unplug_oldest_pwq`).
    pub(super) fn unplug_oldest(&self) {
        if !self.ordered {
            return;
        }
        let Some(oldest) = lock(&self.pwqs).first().cloned() else {
            return;
        };
        let mut st = lock(&oldest.state);
        if st.hold != Hold::Plugged {
            return;
        }
        st.hold = Hold::Open;
        let node = &self.nodes[oldest.node];
        oldest.repend(&mut st);
        oldest.set_gate(&st);
        drop(st);
        self.activate(node);
    }

    /// The `config` lock for an attribute change, refused once teardown marked the
    /// workqueue destroyed: only the control plane can still reach it then (a request
    /// that looked it up before the last handle's drop hid it), and a change would make
    /// pools that nothing stops. Teardown marks it under this lock, so a change that
    /// got the lock first is complete, and its retired pwqs are seen, before teardown
    /// goes on.
    pub(super) fn config_to_change(&self) -> Result<MutexGuard<'_, Config>, Error> {
        let cfg = lock(&self.config);
        if self.destroyed.load(SeqCst) {
            return Err(Error::Destroyed {
                wq: self.name.clone(),
            });
        }
        Ok(cfg)
    }

    /// [`Workqueue::set_max_active`](crate::Workqueue::set_max_active); also what the control plane calls.
    pub(super) fn set_max_active(&self, n: usize) -> Result<(), Error> {
        let wq = self;
        if wq.ordered {
            return Err(Error::Ordered {
                wq: wq.name.clone(),
                what: "max_active",
            });
        }
        if !policy::valid_max_active(n) {
            return Err(Error::InvalidMaxActive { value: n });
        }
        let mut cfg = wq.config_to_change()?;
        cfg.attrs.max_active = n;
        cfg.attrs.min_active = cfg.attrs.min_active.min(n);
        let effective = wq.table.read().unbound.clone();
        wq.store_node_limits(&policy::node_limits_with_floor(
            n,
            cfg.attrs.min_active,
            &effective,
            &wq.topology,
        ));
        drop(cfg);
        for node in &wq.nodes {
            wq.activate(node);
        }
        Ok(())
    }
}
