//! Where the shared sysfs fixtures are, for the tests of every crate (included with
//! `#[path]`, so there is one copy).

use std::path::PathBuf;

/// The shared fixtures: `$PODQ_FIXTURES`, else `<repo>/../shared/fixtures/sysfs`
/// (every crate's manifest is two levels below the repository root).
pub fn fixtures_dir() -> PathBuf {
    let dir = match std::env::var_os("PODQ_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/sysfs"),
    };
    assert!(
        dir.is_dir(),
        "sysfs fixtures not found at {}: put the shared fixtures next to the checkout \
         (../shared/fixtures/sysfs) or set PODQ_FIXTURES",
        dir.display()
    );
    dir
}
