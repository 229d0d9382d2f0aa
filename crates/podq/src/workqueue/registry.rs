//! The process-wide registries of workqueues: live workqueues (for `stats::all()`,
//! default-scope changes and refresh), pools by key (for sharing), topology ids, and
//! the process default scope.

use crate::sync::unmodelled::{AtomicUsize, Mutex};
use crate::sync::Ordering::SeqCst;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};

use podq_topology::{Scope, Topology};

use super::WqShared;
use crate::attrs::PoolKey;
use crate::pool::Pool;
use crate::sync::lock;
use crate::Error;

/// A: the next workqueue id (`Relaxed`: an id only has to be unique).
pub(super) static NEXT_WQ_ID: AtomicUsize = AtomicUsize::new(1);
/// A: the next pool id (`Relaxed`, as `NEXT_WQ_ID`).
pub(super) static NEXT_POOL_ID: AtomicUsize = AtomicUsize::new(0);

/// G: live workqueues, for `stats::all()` and default-scope changes.
pub(super) fn registry() -> &'static Mutex<Vec<Weak<WqShared>>> {
    static WQS: OnceLock<Mutex<Vec<Weak<WqShared>>>> = OnceLock::new();
    WQS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Live pools by their key and their thread options' identity.
pub(super) type PoolsByKey = HashMap<(PoolKey, u64), Weak<Pool>>;

/// G: live pools by key and thread options (`ThreadOptions::id`), for sharing (taken
/// under `config`, in `pool_for`).
pub(super) fn pools() -> &'static Mutex<PoolsByKey> {
    static POOLS: OnceLock<Mutex<PoolsByKey>> = OnceLock::new();
    POOLS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Topologies seen so far (G), by their description, for pool keys.
pub(super) fn topology_id(topology: &Topology) -> u64 {
    static IDS: OnceLock<Mutex<HashMap<String, u64>>> = OnceLock::new();
    let text = format!("{topology:?}");
    let mut ids = lock(IDS.get_or_init(|| Mutex::new(HashMap::new())));
    let next = ids.len() as u64;
    *ids.entry(text).or_insert(next)
}

pub(crate) fn live_workqueues() -> Vec<Arc<WqShared>> {
    lock(registry()).iter().filter_map(Weak::upgrade).collect()
}

/// The process default scope: set by `set_default_scope`, else from
/// `PODQ_DEFAULT_AFFINITY_SCOPE`, else `cache_shard`. A bad environment value is warned
/// about once, on stderr, when the default is first needed: the error hook is about
/// pools, and may not be set yet.
fn default_cell() -> &'static Mutex<Scope> {
    static DEFAULT: OnceLock<Mutex<Scope>> = OnceLock::new();
    DEFAULT.get_or_init(|| {
        let scope = env_default().unwrap_or_else(|e| {
            eprintln!(
                "podq: warning: {e}; using `{}` as the default scope",
                Scope::BUILTIN_DEFAULT
            );
            Scope::BUILTIN_DEFAULT
        });
        Mutex::new(scope)
    })
}

pub(super) fn env_default() -> Result<Scope, Error> {
    let value = std::env::var(podq_topology::DEFAULT_SCOPE_ENV).ok();
    let scope = Scope::default_from_env_value(value.as_deref())?;
    crate::auto::available(scope)?;
    Ok(scope)
}

/// The process-wide default affinity scope that workqueues with `Scope::Default`
/// follow: the last [`set_default_scope`], else `PODQ_DEFAULT_AFFINITY_SCOPE`, else
/// `cache_shard`. A bad environment value reads as `cache_shard`, with one warning on
/// stderr for the process, and [`WorkqueueBuilder::build`](crate::WorkqueueBuilder::build) refuses workqueues on
/// `Scope::Default` while it is set.
pub fn default_scope() -> Scope {
    *lock(default_cell())
}

/// Sets the process-wide default scope; every live workqueue on `Scope::Default`
/// switches to it at once (queued items finish on their old pools). `Default` itself is
/// refused; `Auto` makes those workqueues choose their scope themselves, each with its
/// own controller (see [`crate::auto`]), and is refused without the `stats` feature
/// ([`Error::AutoNeedsStats`]).
///
/// ```
/// use podq::{Scope, Workqueue};
///
/// let follows = Workqueue::builder("doc-follows").build()?; // on Scope::Default
/// let fixed = Workqueue::builder("doc-fixed").scope(Scope::Cpu).build()?;
/// let before = podq::default_scope();
/// podq::set_default_scope(Scope::Numa)?;
/// assert_eq!(follows.effective_scope(), Scope::Numa);
/// assert_eq!(fixed.effective_scope(), Scope::Cpu);
/// assert!(podq::set_default_scope(Scope::Default).is_err());
/// podq::set_default_scope(before)?;
/// # Ok::<(), podq::Error>(())
/// ```
pub fn set_default_scope(scope: Scope) -> Result<(), Error> {
    if scope == Scope::Default {
        return Err(Error::DefaultScope { scope });
    }
    crate::auto::available(scope)?;
    static SERIAL: Mutex<()> = Mutex::new(());
    let _serial = lock(&SERIAL);
    *lock(default_cell()) = scope;
    for wq in live_workqueues() {
        let mut cfg = lock(&wq.config);
        // One being torn down gets no new pools: `WqHandle::drop` sets `destroyed` (the
        // SeqCst store this load pairs with) and then passes through `config`, so under
        // it the flag is final; a change made before it is retired by the teardown.
        if wq.destroyed.load(SeqCst) {
            continue;
        }
        if cfg.attrs.scope == Scope::Default {
            let attrs = cfg.attrs.clone();
            let released = wq.apply(&mut cfg, attrs)?;
            drop(cfg);
            drop(released);
        }
    }
    if scope == Scope::Auto {
        crate::auto::wake_sampler()?;
    }
    Ok(())
}
