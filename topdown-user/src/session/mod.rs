//! The counting session: everything between the command line and a [`crate::report::Report`]
//! that counts, whichever command runs it. Detect the CPU, open its counters, load and attach
//! the BPF side, follow what is traced, and aggregate what it attributed.
//!
//! - [`counting`]: the session `stat`, `top` and `serve` share: model, counter plan, BPF
//!   session, probes, hotplug; [`prepare`](counting::prepare) then start.
//! - [`pmu`]: CPU and PMU detection, so which model `--pmu auto` picks.
//! - [`counters`]: the per-CPU perf counter groups the BPF side reads.
//! - [`tracefs`]: finding tracefs, tracepoint ids and record layouts.
//! - [`bpf`]: the BPF session: loading, attaching, reading the maps and ring buffer back.
//! - [`target`]: what is traced (`-a`, `-p`, `-- CMD`) and how its end is noticed.
//! - [`follow`]: following `-- CMD` into its children so pid-scoped probes reach them.
//! - [`event_loop`]: what the commands' event loops wait on (session fds, process ends).
//! - [`interrupt`]: SIGINT/SIGTERM outside the event loop (symbol reading, calibration).
//! - [`slot_counts`]: per-slot counts, the numbers every step carries before they are named.
//! - [`aggregate`]: what the BPF side attributed, as typed deltas, then as a report.
//! - [`capabilities`]: whether this process may run the BPF session, or count kernel code.
//! - [`unprivileged`]: the same counting without BPF (`stat -- CMD` as a user, `--no-bpf`),
//!   with inherited per-task counters.

pub mod aggregate;
pub mod bpf;
pub mod capabilities;
pub mod counters;
pub mod counting;
pub mod event_loop;
pub mod follow;
pub mod interrupt;
pub mod pmu;
pub mod slot_counts;
pub mod target;
pub mod tracefs;
pub mod unprivileged;
