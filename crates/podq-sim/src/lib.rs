//! podq-sim: a deterministic simulator of many-CPU machines (not yet built).
