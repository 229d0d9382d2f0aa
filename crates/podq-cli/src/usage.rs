//! The one error type that makes `podq` exit with 2: a mistake in the command line
//! (a value that does not parse or is out of range, options that do not go together),
//! as opposed to a failure while running (1: a file, the machine, the environment or
//! the target process at fault).

/// A usage error; `main` exits 2 for it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A usage error with `message`.
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    UsageError(message.into()).into()
}
