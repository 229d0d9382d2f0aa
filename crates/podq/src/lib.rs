//! podq: locality-aware unbound workqueues for user space.

pub use podq_topology as topology;

pub mod control;
pub mod procfs;
