//! How output reaches the user, whatever it is: files given with `-o` and progress on a
//! terminal. Neither knows what a report is (the man pages and `diff` results go through
//! [`output`] too); both keep a failed or piped run's output exactly what it would be without
//! them.
//!
//! - [`output`]: `-o FILE` written beside FILE and renamed over it only once complete.
//! - [`progress`]: progress bars on stderr, drawn only when stderr is a terminal.

pub mod output;
pub mod progress;

/// `a, b, c`: paths as messages list them.
pub fn path_list(paths: &[std::path::PathBuf]) -> String {
    paths
        .iter()
        .map(|path| path.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
