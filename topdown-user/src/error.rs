//! Failure categories and the exit codes they map to.
//!
//! Errors travel as `anyhow::Error`; the few a user must be able to tell apart by exit status
//! carry a [`Failure`] in their chain, which `main` looks up.

use std::fmt;

/// Why topdown could not do what was asked. Each has its own exit status (see docs/usage.md,
/// Exit status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Bad option values or combinations.
    Usage,
    /// Not root, or missing CAP_BPF / CAP_PERFMON.
    Permission,
    /// BPF or BTF is not available on this kernel, or the programs failed to load.
    BpfUnavailable,
    /// The requested model needs a PMU (or event) this machine does not have.
    PmuUnavailable,
    /// A `-p` pid does not exist.
    NoSuchProcess,
    /// The `-- CMD` command was not found or could not be executed.
    CommandNotFound,
}

impl Failure {
    pub fn exit_code(self) -> u8 {
        match self {
            Failure::Usage => 2,
            Failure::Permission => 3,
            Failure::BpfUnavailable => 4,
            Failure::PmuUnavailable => 5,
            Failure::NoSuchProcess => 6,
            Failure::CommandNotFound => 127,
        }
    }
}

/// An error that is one of the [`Failure`] categories.
#[derive(Debug)]
pub struct Categorized {
    pub failure: Failure,
    pub message: String,
}

impl fmt::Display for Categorized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Categorized {}

/// Builds a categorized error: `Err(fail(Failure::Usage, "..."))?`.
pub fn fail(failure: Failure, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Categorized {
        failure,
        message: message.into(),
    })
}

/// The text of the file at `path`; one that cannot be read is a `failure`, told by `message`.
pub fn read_or_fail(
    path: &str,
    failure: Failure,
    message: impl FnOnce(&std::io::Error) -> String,
) -> anyhow::Result<String> {
    std::fs::read_to_string(path).map_err(|err| fail(failure, message(&err)))
}

/// The category of an error, if any link of its chain has one.
pub fn failure_of(err: &anyhow::Error) -> Option<Failure> {
    err.chain()
        .find_map(|cause| cause.downcast_ref::<Categorized>())
        .map(|categorized| categorized.failure)
}

/// Generic runtime failure exit status.
pub const EXIT_RUNTIME: u8 = 1;
