//! Every podq decision as a small pure function over plain values.
//!
//! The threaded runtime (`podq`, which re-exports this crate as `podq::policy`) calls
//! these on its hot paths and the simulator (`podq-sim`) calls the same functions on a
//! virtual clock, so none of them touches a thread, a lock, an atomic, a clock or a
//! global: state the mechanism owns comes in as a value, times as the caller's clock
//! values, and a side effect the decision depends on (taking a node slot, asking whether
//! creation is cooling down) as a closure the caller passes.
//! Kernel names are given where a function mirrors one (see `reference/kernel-workqueue.md`).
//!
//! One module per area of decision; everything is re-exported at the crate root:
//! attributes, active limits and admission, the attribute-change plan and hotplug
//! fallbacks, pool keys, CPU and pwq selection, workers (kick, spin, reap), rescue, and
//! locality. The `auto` scope's controller keeps its own namespace ([`auto`]).

mod active;
mod attrs;
pub mod auto;
mod batch;
mod locality;
mod plan;
mod pool;
mod rescue;
mod select;
mod worker;

pub use active::*;
pub use attrs::*;
pub use batch::*;
pub use locality::*;
pub use plan::*;
pub use pool::*;
pub use rescue::*;
pub use select::*;
pub use worker::*;
