//! Function probes (`-u TARGET:FUNC`): TopDown per function and per call-tree edge. From a name
//! the user typed to a symbol, to the instructions where each call ends, to attached uprobes,
//! to the probes' own cost taken out again, to the per-call distributions.
//!
//! - [`symbols`]: which file and offset `-u TARGET:FUNC` names (ELF, PLT, Go, x86 decoding).
//! - [`unwinding`]: which return mechanism a target gets (`--returns`), where unwinding ends.
//! - [`exit_plan`]: where each probed function's calls end, as uprobes and their cookies.
//! - [`probes`]: attaching them with stable function ids, re-attaching, detaching.
//! - [`own_process`]: keeping topdown's own process out of machine-wide probes.
//! - [`calibration`]: the probes' own cost, measured each run and subtracted (`record`: what
//!   the report says of it).
//! - [`distribution`]: per-call distributions, which calls are slow and why.

pub mod calibration;
pub mod distribution;
pub mod exit_plan;
pub mod own_process;
pub mod probes;
pub mod symbols;
pub mod unwinding;
