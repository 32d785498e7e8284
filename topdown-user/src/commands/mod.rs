//! The subcommands, one driver each: what a command parses, runs and writes. The machinery they
//! share lives below them: counting in [`crate::session`], function probes in
//! [`crate::functions`], spans in [`crate::spans`], rendering in [`crate::report`].
//!
//! - [`stat`]: `topdown stat`, a counting run and its final (or `-I` interval) reports.
//! - [`top`]: `topdown top`, the live terminal view (`view` draws the screen, `select` picks
//!   the rows worth naming).
//! - [`serve`]: `topdown serve`, the Prometheus exporter (its series, families, HTTP side,
//!   config file and duty cycle).
//! - [`diff`]: `topdown diff`, comparing JSON results as a regression gate (input, comparison,
//!   Welch's test, renderers).
//! - [`list`]: `topdown list`, the machine, the model `--pmu auto` picks and every counter.
//! - [`check`]: `topdown check`, whether tracing can work here and what to do if not.
//! - [`report`]: `topdown report -i`, a recording rendered again.
//!
//! The hidden `topdown generate` is [`crate::cli::usage`], beside the CLI it documents.

pub mod check;
pub mod diff;
pub mod list;
pub mod report;
pub mod serve;
pub mod stat;
pub mod top;
