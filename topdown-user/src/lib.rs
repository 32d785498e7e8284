//! topdown: exact TopDown (Intel TMA and its AMD/Arm equivalents) per thread, per function and
//! per container, counted with per-CPU perf counter groups read by eBPF at context switches.
//!
//! The module tree follows the pipeline: detect the CPU ([`pmu`]), pick a [`model`], open its
//! counters, attribute deltas in BPF, aggregate, and render a [`report`].

pub mod aggregate;
pub mod bpf;
pub mod cgroup;
pub mod check;
pub mod cli;
pub mod counters;
pub mod error;
pub mod events;
pub mod list;
pub mod model;
pub mod output;
pub mod pmu;
pub mod report;
pub mod schedule;
pub mod serve;
pub mod stat;
pub mod symbols;
pub mod target;
pub mod tracefs;
