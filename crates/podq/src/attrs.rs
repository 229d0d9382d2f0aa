//! Workqueue attributes (the kernel's sysfs files, defined in `podq-policy`), their
//! checks, and the key that makes pools shared.

use crate::policy::{self, PlanError};
pub use crate::policy::{Attrs, PoolKey};
use crate::Error;

/// Checks the values of `attrs` that do not depend on the topology.
pub(crate) fn validate(attrs: &Attrs) -> Result<(), Error> {
    if attrs.cpumask.is_empty() {
        return Err(Error::EmptyCpumask);
    }
    crate::auto::available(attrs.scope)?;
    if !policy::NICE_RANGE.contains(&attrs.nice) {
        return Err(Error::InvalidNice { value: attrs.nice });
    }
    if !policy::valid_max_active(attrs.max_active) {
        return Err(Error::InvalidMaxActive {
            value: attrs.max_active,
        });
    }
    if !policy::valid_min_active(attrs.min_active, attrs.max_active) {
        return Err(Error::InvalidMinActive {
            value: attrs.min_active,
            max_active: attrs.max_active,
        });
    }
    Ok(())
}

impl From<PlanError> for Error {
    fn from(e: PlanError) -> Error {
        match e {
            PlanError::NoUsableCpu { mask, usable } => Error::NoUsableCpu { mask, usable },
            PlanError::Topology(e) => Error::Topology(e),
        }
    }
}
