//! topdown's kernel side: read this CPU's counter group at every context switch and add the delta
//! since the previous reading to the task that is switching out.
//!
//! It does the least it can. It knows counter *slots*, not events: which slot holds `slots` or
//! `topdown-retiring`, what a fraction means, which task is which process name: all of that is
//! user space's business.
//!
//! Invariant (per CPU, per counter): `total == Σ task deltas + idle + untracked + dropped`, because
//! every successful reading hands its whole delta to exactly one bucket. For the task running on a
//! CPU, its *virtual counters* (what it has consumed up to now) are
//! `TASKS[tid].counters + (counter now - CPU_STATE.last)`: function probes read them that way.
//!
//! Modules: `maps` (the maps and load-time globals), `counters` (reading and attribution, and
//! the programs that trigger it), `process` (fork, exit and cgroup-migration hooks), `functions`
//! (function probes), `histogram` (per-call histograms), `usdt` (USDT sites and their argument
//! specs), `spans` (TopDown between a start and an end site), `goroutines` (function probes of
//! Go programs, per goroutine).
#![no_std]
#![no_main]
// The BPF target does not expose `AtomicU64::fetch_add`; the intrinsic lowers to BPF's atomic
// add, which function and cgroup totals need when two CPUs add to one entry at once.
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod counters;
mod functions;
mod goroutines;
mod histogram;
mod maps;
mod process;
mod spans;
mod usdt;

/// `bpf_perf_event_read_value` is GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
