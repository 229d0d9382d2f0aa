//! Every podq decision as a small pure function over plain values.
//!
//! The threaded runtime (`podq`, which re-exports this crate as `podq::policy`) calls
//! these on its hot paths and the simulator (`podq-sim`) calls the same functions on a
//! virtual clock, so none of them touches a thread, a lock, an atomic, a clock or a
//! global: state the mechanism owns comes in as a value.
//! Kernel names are given where a function mirrors one (see `reference/kernel-workqueue.md`).
//!
//! One module per area of decision; everything is re-exported at the crate root, except
//! the `auto` scope's controller, which keeps its own namespace ([`auto`]).

mod active;
pub mod auto;
mod locality;
mod select;
mod worker;

pub use active::*;
pub use locality::*;
pub use select::*;
pub use worker::*;
