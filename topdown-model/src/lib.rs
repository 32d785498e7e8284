//! topdown's TopDown models, kept apart from the kernel side: which counters each
//! microarchitecture needs and how they are encoded ([`model`]), how those counters are grouped
//! and planned onto a PMU's counters ([`groups`], [`schedule`]), how raw counts become level-1/
//! level-2 fractions ([`model::Evaluator`], resolved once per report against the plan's slots;
//! [`model::evaluate()`] for one set of named counts), and the `-e` event specs users add
//! ([`events`]).
//!
//! Nothing here opens a counter or touches BPF: the `topdown` binary does that with what
//! [`model::Model::counters`] and [`schedule::plan`] say. Imports run one way:
//! [`groups`] <- [`model`] <- [`schedule`]; [`events`] stands alone and [`model`] uses its
//! parsed events.
//!
//! # Example
//!
//! Ice Lake's level 1 from one set of counts (the `level-1` vector of
//! `tests/golden/intel-icl.json`, formulas of perf's `icl-metrics.json`):
//!
//! ```
//! use topdown_model::model::{Counts, evaluate, model_by_name};
//!
//! let model = model_by_name("intel-icl", &[])?;
//! let counts: Counts = [
//!     ("slots", 1000),
//!     ("topdown-retiring", 400),
//!     ("topdown-bad-spec", 100),
//!     ("topdown-fe-bound", 200),
//!     ("topdown-be-bound", 300),
//!     ("INT_MISC.UOP_DROPPING", 50),
//!     ("INT_MISC.CLEARS_COUNT", 10),
//! ]
//! .into_iter()
//! .map(|(name, value)| (name.to_owned(), value))
//! .collect();
//!
//! let result = evaluate(model.as_ref(), &counts, 1);
//! // Frontend = fe/SUM - UOP_DROPPING/slots = 200/1000 - 50/1000;
//! // Backend = be/SUM + 5 * CLEARS_COUNT/slots = 300/1000 + 5 * 10/1000;
//! // Retiring = 400/1000; Bad speculation is what is left.
//! let expected = [
//!     ("frontend_bound", 0.15),
//!     ("backend_bound", 0.35),
//!     ("retiring", 0.40),
//!     ("bad_speculation", 0.10),
//! ];
//! for (metric, value) in expected {
//!     let actual = result.metrics[metric].expect(metric);
//!     assert!((actual - value).abs() < 1e-12, "{metric}: {actual}");
//! }
//! // One pinned group counted everything: nothing was scaled.
//! assert!(result.estimated.is_empty());
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod events;
pub mod groups;
pub mod model;
pub mod named;
pub mod schedule;
