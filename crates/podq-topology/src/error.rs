//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong reading or building a topology. Each variant names
/// the text, file or shape at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A cpulist (`0-3,8`) could not be parsed.
    #[error("malformed cpulist `{text}`: {reason}")]
    CpuList {
        /// The offending text.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A hex cpumask (`0000ffff`) could not be parsed.
    #[error("malformed cpumask `{text}`: {reason}")]
    CpuMask {
        /// The offending text.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A scope name is not one of the kernel's.
    #[error("unknown affinity scope `{text}`: {reason}")]
    Scope {
        /// The offending text.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An environment variable holds a bad value.
    #[error("environment variable {var}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// A file could not be read (the cause is the error's `source()`).
    #[error("cannot read {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written (the cause is the error's `source()`).
    #[error("cannot write {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A sysfs file was read but its content makes no sense.
    #[error("{}: {reason}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A synthetic shape string could not be understood.
    #[error("bad synthetic shape `{shape}`: {reason}")]
    Shape {
        /// The offending shape.
        shape: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The parts given to build a topology are inconsistent.
    #[error("inconsistent topology: {0}")]
    Inconsistent(String),
    /// A parameter is out of range.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// The parameter.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}
