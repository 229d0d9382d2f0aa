//! The control plane over this process's podq runtime.

use super::registry::DefaultScope;
use super::{ControlError, ControlServer};
use crate::topology::Scope;

/// The runtime's process-wide default scope ([`crate::default_scope`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RuntimeDefaultScope;

impl DefaultScope for RuntimeDefaultScope {
    fn get(&self) -> Scope {
        crate::default_scope()
    }

    fn set(&self, scope: Scope) -> Result<(), ControlError> {
        crate::set_default_scope(scope).map_err(|e| ControlError::Rejected {
            what: "the default scope".into(),
            source: Box::new(e),
        })
    }
}

/// Starts the control server on the default socket path, serving the workqueues made
/// visible with [`Workqueue::expose`](crate::Workqueue::expose) and the process default
/// scope. The server runs until the returned guard is dropped: keep it for as long as
/// the process should be reachable (`let _ = start()?` stops it at once).
///
/// ```no_run
/// use podq::{control, Workqueue};
///
/// let wq = Workqueue::builder("rpciod").build()?;
/// wq.expose()?; // `podq ctl` lists only exposed workqueues
/// let server = control::start()?;
/// println!("podq ctl --socket {} list", server.path().display());
/// // ... the program's work; the server answers until `server` is dropped.
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// The same as `ControlServer::builder().build()`; use the builder to choose the path,
/// the connection limit or the timeouts.
pub fn start() -> Result<ControlServer, ControlError> {
    ControlServer::builder().build()
}
