//! The crate's one error type.

use podq_topology::{CpuSet, Scope};

/// Everything a podq call can refuse. Each variant names the value at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A cpumask with no CPU in it.
    #[error("empty cpumask")]
    EmptyCpumask,
    /// A cpumask none of whose CPUs is usable in the workqueue's topology.
    #[error("cpumask {mask} has no CPU usable in this topology (usable: {usable})")]
    NoUsableCpu {
        /// The requested mask.
        mask: CpuSet,
        /// The topology's usable CPUs.
        usable: CpuSet,
    },
    /// `max_active` outside `1..=2048` (the kernel's `WQ_MAX_ACTIVE`).
    #[error("invalid max_active {value}: must be in 1..=2048")]
    InvalidMaxActive {
        /// The requested value.
        value: usize,
    },
    /// `nice` outside `-20..=19`.
    #[error("invalid nice {value}: must be in -20..=19")]
    InvalidNice {
        /// The requested value.
        value: i32,
    },
    /// An attribute that ordered workqueues freeze (`max_active`, `ordered`).
    #[error("workqueue `{wq}` is ordered: {what} cannot change")]
    Ordered {
        /// The workqueue.
        wq: String,
        /// The attribute.
        what: &'static str,
    },
    /// `default` offered as the process-wide default scope.
    #[error("`{scope}` cannot be the process default scope")]
    DefaultScope {
        /// The refused scope.
        scope: Scope,
    },
    /// A CPU number that is not usable in the workqueue's topology.
    #[error("CPU {cpu} is not usable in this topology (usable: {usable})")]
    InvalidCpu {
        /// The CPU.
        cpu: usize,
        /// The topology's usable CPUs.
        usable: CpuSet,
    },
    /// Queueing refused because the workqueue is draining and the caller is not one of
    /// its own items (only chained queueing is accepted while draining).
    #[error("workqueue `{wq}` is draining: only its own items may queue")]
    Draining {
        /// The workqueue.
        wq: String,
    },
    /// An `auto` window shorter than 1 ms.
    #[error("invalid auto window {window:?}: must be at least 1 ms")]
    InvalidAutoWindow {
        /// The requested window.
        window: std::time::Duration,
    },
    /// `auto` controller settings that make no sense.
    #[error("invalid auto config: {reason}")]
    InvalidAutoConfig {
        /// What is wrong.
        reason: String,
    },
    /// A workqueue name that is empty.
    #[error("workqueue name must not be empty")]
    EmptyName,
    /// An operating-system call failed.
    #[error("{call} failed: {source}")]
    Os {
        /// The call.
        call: &'static str,
        /// The error it returned.
        #[source]
        source: std::io::Error,
    },
    /// The topology could not be read or built.
    #[error(transparent)]
    Topology(#[from] podq_topology::Error),

    // The control plane (`crate::control`): each variant's text is what an error reply
    // carries.
    /// No visible workqueue has this name.
    #[error("unknown workqueue `{name}`")]
    UnknownQueue {
        /// The name asked for.
        name: String,
    },
    /// The attribute name is not one of the sysfs files.
    #[error(
        "unknown attribute `{name}` (expected one of affinity_scope, affinity_strict, \
         cpumask, max_active, nice)"
    )]
    UnknownAttr {
        /// The name asked for.
        name: String,
    },
    /// A live visible workqueue already has this name.
    #[error("a visible workqueue named `{name}` already exists")]
    NameTaken {
        /// The name.
        name: String,
    },
    /// The value cannot be written to the attribute.
    #[error("invalid value `{value}` for {attr}: {reason}")]
    InvalidValue {
        /// The attribute (or `default_affinity_scope`).
        attr: &'static str,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The attribute cannot be written on this workqueue.
    #[error("{attr} of workqueue `{queue}` is read-only: {reason}")]
    ReadOnly {
        /// The workqueue.
        queue: String,
        /// The attribute.
        attr: crate::control::Attr,
        /// Why.
        reason: &'static str,
    },
    /// The runtime refused a change that parsed fine.
    #[error("cannot set {what}: {reason}")]
    Rejected {
        /// What was being changed (`affinity_scope of rpciod`).
        what: String,
        /// The runtime's reason.
        reason: String,
    },
    /// A request line is not valid protocol JSON.
    #[error("malformed request: {0}")]
    BadRequest(String),
    /// A request line is longer than the limit.
    #[error("request larger than {limit} bytes")]
    TooLarge {
        /// The limit, [`crate::control::MAX_REQUEST_BYTES`].
        limit: usize,
    },
    /// The server already serves as many connections as it may.
    #[error("too many connections (limit {limit})")]
    Busy {
        /// The connection cap.
        limit: usize,
    },
    /// The connecting process may not use this server.
    #[error(
        "permission denied: peer uid {peer_uid} is neither the server's uid {server_uid} nor root"
    )]
    PeerRefused {
        /// The server's effective uid.
        server_uid: u32,
        /// The peer's uid.
        peer_uid: u32,
    },
    /// The server replied with an error.
    #[error("{0}")]
    Remote(String),
    /// The reply could not be understood.
    #[error("bad reply from the control server: {0}")]
    BadReply(String),
    /// A control socket or file operation failed.
    #[error("{what}: {source}")]
    ControlIo {
        /// What was being done, naming the path.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The socket path or its directory is unusable.
    #[error("control socket {path}: {reason}")]
    SocketPath {
        /// The path.
        path: String,
        /// What is wrong.
        reason: String,
    },

    // Reading procfs (`crate::procfs`).
    /// A procfs or sysfs file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    ProcRead {
        /// The file.
        path: std::path::PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A procfs or sysfs file is not in the expected format.
    #[error("{}: {reason}", path.display())]
    ProcMalformed {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}
