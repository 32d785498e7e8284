//! topdown: exact TopDown (Intel TMA and its AMD/Arm equivalents) per thread, per function and
//! per container, counted with per-CPU perf counter groups read by eBPF at context switches.
//!
//! The module tree follows the pipeline: detect the CPU ([`pmu`](session::pmu)), pick a [`model`]
//! (the `topdown-model` crate), open its counters, attribute deltas in BPF, aggregate, and render a
//! [`report`].

pub mod cgroup;
pub mod check;
pub mod cli;
pub mod diff;
pub mod error;
pub mod functions;
pub mod list;
pub mod report;
pub mod serve;
pub mod session;
pub mod spans;
pub mod stat;
pub mod top;
pub mod ui;

// The models, their counter groups and `-e` specs live in the `topdown-model` crate; these
// re-exports keep `crate::model`, `crate::schedule` and `crate::events` paths working here.
pub use topdown_model::{events, groups, model, schedule};
