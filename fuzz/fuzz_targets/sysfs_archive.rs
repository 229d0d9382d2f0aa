//! Fuzz target `sysfs_archive`: the checks are shared with the corpus replay test.
#![no_main]

#[path = "../../crates/podq-topology/tests/fuzz_checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::sysfs_archive(data));
