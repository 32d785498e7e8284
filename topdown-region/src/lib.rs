//! TopDown for code its owner can change: a program reads its own counters around named
//! regions, without root and without a uprobe trap per call.
//!
//! The counters are the model's (`topdown-model`, the same models and formulas as the
//! `topdown` tool), opened for each thread that begins a region (perf_event_open, pid 0,
//! cpu -1). They are read in user space when every counter's perf mmap page allows it
//! (`rdpmc` on x86_64, `mrs` on arm64; Intel's SLOTS + PERF_METRICS decoded per
//! perf-topdown.txt) and with `read()` otherwise (software and tracepoint counters, VMs,
//! rdpmc disabled); [`thread_path`] says which and why. Regions nest; each has per-thread
//! calls and inclusive/exclusive counts; misuse is counted, never fatal. [`report::to_json`]
//! writes topdown's JSON schema, so `topdown report -i FILE` renders the regions.
//!
//! ```no_run
//! topdown_region::init(topdown_region::Config {
//!     model: "intel-icl".into(),
//!     ..Default::default()
//! })
//! .ok(); // without counters the regions still count calls; thread_path() says why
//! {
//!     let _parse = topdown_region::region("parse");
//!     // ... work ...
//! }
//! let snapshot = topdown_region::snapshot();
//! eprint!("{}", topdown_region::report::summary(&snapshot));
//! ```
//!
//! Regions shorter than a few microseconds are not worth measuring this way: out-of-order
//! execution overlaps the code around the reads (perf-topdown.txt: "instrumenting individual
//! basic blocks is definitely too fine grained").

pub mod counters;
pub mod decode;
pub mod ffi;
pub mod hw;
pub mod mmap_page;
pub mod regions;
pub mod report;
pub mod setup;

pub use counters::ReadPath;
pub use regions::{
    MAX_DEPTH, Misuse, Region, RegionEdge, RegionTotals, Snapshot, ThreadRecord, begin, end, init,
    region, snapshot, thread_path,
};
pub use setup::Config;
