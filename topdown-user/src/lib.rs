//! topdown: exact TopDown (Intel TMA and its AMD/Arm equivalents) per thread, per function and
//! per container, counted with per-CPU perf counter groups read by eBPF at context switches.
//!
//! The tree groups the code by capability, so each is found from the file tree alone:
//!
//! - [`commands`]: one driver per subcommand (`stat`, `top`, `serve`, `diff`, `list`,
//!   `check`): what it parses, runs and writes.
//! - [`session`]: the counting session every counting command runs: detect the CPU ([`pmu`](
//!   session::pmu)), pick a [`model`] (the `topdown-model` crate), open its counters,
//!   attribute deltas in BPF, aggregate; and the same without BPF (`unprivileged`).
//! - [`functions`]: function probes (`-u`): symbols, exit points, return mechanisms, attaching,
//!   the probes' own cost, per-call distributions.
//! - [`spans`]: units of work a program marks itself: spans between USDT sites (`usdt`), the
//!   PostgreSQL preset.
//! - [`cgroup`]: cgroup v2 paths, ids and container names.
//! - [`report`]: the result of a run as data, and its renderers.
//! - [`ui`]: `-o` files and terminal progress.
//! - [`cli`], [`error`]: the command line and the failures that map to exit codes.

/// `Type { field: combine(a.field, b.field), .. }` for each named field: the statistics
/// structs of counts are summed and differenced field by field.
macro_rules! fieldwise {
    ($combine:path, $type:ident { $($field:ident),+ $(,)? }, $a:expr, $b:expr) => {
        $type {
            $($field: $combine($a.$field, $b.$field)),+
        }
    };
}

pub mod cgroup;
pub mod cli;
pub mod commands;
pub mod error;
pub mod functions;
pub mod report;
pub mod session;
pub mod spans;
pub mod ui;

// The models, their counter groups and `-e` specs live in the `topdown-model` crate; these
// re-exports keep `crate::model`, `crate::schedule` and `crate::events` paths working here.
pub use topdown_model::{events, groups, model, schedule};
