//! The control plane over this process's podq runtime.

use super::{start_with, ControlServer, DefaultScope};
use crate::topology::Scope;
use crate::Error;

/// The runtime's process-wide default scope ([`crate::default_scope`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct RuntimeDefaultScope;

impl DefaultScope for RuntimeDefaultScope {
    fn get(&self) -> Scope {
        crate::default_scope()
    }

    fn set(&self, scope: Scope) -> Result<(), Error> {
        crate::set_default_scope(scope).map_err(|e| Error::Rejected {
            what: "the default scope".into(),
            reason: e.to_string(),
        })
    }
}

/// Starts the control server on the default socket path, serving the workqueues made
/// visible with [`Workqueue::expose`](crate::Workqueue::expose) and the process default
/// scope. The server runs until the returned value is dropped.
pub fn start() -> Result<ControlServer, Error> {
    start_with(RuntimeDefaultScope)
}
