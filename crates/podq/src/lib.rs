//! podq: locality-aware unbound workqueues for user space.

pub use podq_topology as topology;
