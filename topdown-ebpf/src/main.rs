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
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id},
    macros::{btf_tracepoint, map, raw_tracepoint, tracepoint},
    maps::{HashMap, PerCpuArray, PerfEventArray, RingBuf},
    programs::{BtfTracePointContext, RawTracePointContext, TracePointContext},
};
use aya_log_ebpf::warn;
use topdown_common::{
    CpuState, FIELD_ABSENT, MAX_COUNTERS, TASK_DEAD, TaskCounters, TaskExit, flush_mode,
};

// Globals user space sets at load time (read volatile so the compiler cannot fold the defaults).

/// Counter slots in use per CPU (1..=MAX_COUNTERS).
#[unsafe(no_mangle)]
static NUM_COUNTERS: u32 = 0;
/// Nonzero: only tasks whose tgid is in `TRACKED` get their own entry (`-p`, `-- CMD`).
#[unsafe(no_mangle)]
static FILTER_TGIDS: u32 = 0;
/// Nonzero: children forked by a tracked process are tracked too (`-- CMD`).
#[unsafe(no_mangle)]
static FOLLOW_FORKS: u32 = 0;
/// Offsets of fields in the classic `sched_process_fork`/`sched_process_exit` records, read by
/// user space from tracefs (their layout changes between kernels).
#[unsafe(no_mangle)]
static FORK_CHILD_PID_OFFSET: u32 = FIELD_ABSENT;
#[unsafe(no_mangle)]
static EXIT_PID_OFFSET: u32 = FIELD_ABSENT;
#[unsafe(no_mangle)]
static EXIT_GROUP_DEAD_OFFSET: u32 = FIELD_ABSENT;

#[inline(always)]
fn global(value: &'static u32) -> u32 {
    // SAFETY: reading a static the loader patched; volatile keeps the load.
    unsafe { core::ptr::read_volatile(value) }
}

/// Counter fds: index `cpu * MAX_COUNTERS + slot`. Sized by user space to possible CPUs.
#[map]
static COUNTERS: PerfEventArray<u32> = PerfEventArray::new(0);

#[map]
static CPU_STATE: PerCpuArray<CpuState> = PerCpuArray::with_max_entries(1, 0);

/// Per-thread totals, keyed by tid. Sized by user space (`--max-tasks`).
#[map]
static TASKS: HashMap<u32, TaskCounters> = HashMap::with_max_entries(32768, 0);

/// Tracked tgids (and the tids of tracked threads created by fork, until they die).
#[map]
static TRACKED: HashMap<u32, u8> = HashMap::with_max_entries(8192, 0);

/// Final totals of tasks that died, so their map entries can be freed at once.
#[map]
static EXITS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Reads every counter slot of this CPU into `state.now`. False if any read failed.
#[inline(always)]
fn read_counters(state: &mut CpuState) -> bool {
    let used = global(&NUM_COUNTERS) as usize;
    // SAFETY: a helper without preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let base = cpu.wrapping_mul(MAX_COUNTERS as u32);
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        match COUNTERS.read_value(base + slot as u32) {
            Ok(value) => {
                state.now[slot] = value.counter;
                if slot == 0 {
                    let enabled_delta = value.enabled_nanos.wrapping_sub(state.last_enabled_ns);
                    let running_delta = value.running_nanos.wrapping_sub(state.last_running_ns);
                    if state.initialized != 0 && running_delta < enabled_delta {
                        state.not_running += 1;
                    }
                    state.last_enabled_ns = value.enabled_nanos;
                    state.last_running_ns = value.running_nanos;
                }
            }
            Err(_) => {
                state.read_errors += 1;
                return false;
            }
        }
        slot += 1;
    }
    state.readings += 1;
    true
}

#[inline(always)]
fn add(bucket: &mut [u64; MAX_COUNTERS], delta: &[u64; MAX_COUNTERS], used: usize) {
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        bucket[slot] = bucket[slot].wrapping_add(delta[slot]);
        slot += 1;
    }
}

#[inline(always)]
fn is_tracked(tgid: u32) -> bool {
    // SAFETY: the value is only tested for presence.
    unsafe { TRACKED.get(&tgid).is_some() }
}

/// Reads this CPU's counters and gives the delta since the last reading to `tid`.
///
/// `dying`: the task will never run again (its last switch-out): hand its totals to user space
/// and free its entry.
#[inline(always)]
fn attribute(ctx_state: *mut CpuState, tid: u32, tgid: u32, dying: bool) {
    // SAFETY: a per-CPU map value, only touched by programs on this CPU, which do not nest
    // (sched_switch runs with interrupts off; the flush runs from an IPI or with preemption off).
    let state = unsafe { &mut *ctx_state };
    if state.frozen != 0 || !read_counters(state) {
        return;
    }
    let used = global(&NUM_COUNTERS) as usize;
    if state.initialized == 0 {
        // Baseline: nothing before this instant belongs to the run.
        state.last = state.now;
        state.initialized = 1;
        return;
    }
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        let slot_delta = state.now[slot].wrapping_sub(state.last[slot]);
        state.last[slot] = state.now[slot];
        state.now[slot] = slot_delta;
        slot += 1;
    }
    let delta = state.now;
    add(&mut state.total, &delta, used);

    if tid == 0 {
        add(&mut state.idle, &delta, used);
        return;
    }
    let task = match TASKS.get_ptr_mut(&tid) {
        Some(task) => task,
        None => {
            if global(&FILTER_TGIDS) != 0 && !is_tracked(tgid) {
                add(&mut state.untracked, &delta, used);
                return;
            }
            let mut fresh = TaskCounters::ZERO;
            fresh.tgid = tgid;
            if TASKS.insert(&tid, &fresh, BPF_NOEXIST as u64).is_err() {
                state.task_map_full += 1;
                add(&mut state.dropped, &delta, used);
                return;
            }
            match TASKS.get_ptr_mut(&tid) {
                Some(task) => task,
                None => {
                    add(&mut state.dropped, &delta, used);
                    return;
                }
            }
        }
    };
    // SAFETY: a map value pointer; only the CPU the task runs on writes it.
    let task = unsafe { &mut *task };
    add(&mut task.counters, &delta, used);
    task.switches += 1;
    task.tgid = tgid;
    if let Ok(comm) = bpf_get_current_comm() {
        task.comm = comm;
    }
    if dying {
        retire(state, tid, tgid, task);
    }
}

/// Sends a dead task's totals to user space and frees its entry.
#[inline(always)]
fn retire(state: &mut CpuState, tid: u32, tgid: u32, task: &mut TaskCounters) {
    match EXITS.reserve::<TaskExit>(0) {
        Some(mut record) => {
            record.write(TaskExit {
                tid,
                _pad: 0,
                task: *task,
            });
            record.submit(0);
            let _ = TASKS.remove(&tid);
        }
        None => {
            // User space collects entries marked exited when it scans the map.
            task.exited = 1;
            state.exit_records_lost += 1;
        }
    }
    if tid != tgid {
        // A thread's tid may have been added by the fork hook; the process stays tracked by tgid.
        let _ = TRACKED.remove(&tid);
    }
}

#[inline(always)]
fn current_ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    (pid_tgid as u32, (pid_tgid >> 32) as u32)
}

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)`: `current` is still `prev`.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    let Some(state) = CPU_STATE.get_ptr_mut(0) else {
        return 0;
    };
    let prev_state: u64 = ctx.arg(3);
    let (tid, tgid) = current_ids();
    attribute(state, tid, tgid, prev_state as u32 & TASK_DEAD != 0);
    0
}

/// Run by user space on each CPU (BPF_PROG_TEST_RUN with BPF_F_TEST_RUN_ON_CPU), never attached:
/// gives the running task its counts up to now, so reports are complete even for a task that
/// never leaves its CPU. arg 0 is a `flush_mode`.
#[raw_tracepoint(tracepoint = "topdown_flush")]
pub fn flush(ctx: RawTracePointContext) -> i32 {
    let Some(state) = CPU_STATE.get_ptr_mut(0) else {
        return 1;
    };
    let mode: u64 = ctx.arg(0);
    let (tid, tgid) = current_ids();
    attribute(state, tid, tgid, false);
    // SAFETY: as in `attribute`.
    let state = unsafe { &mut *state };
    if mode == flush_mode::FINAL {
        state.frozen = 1;
    }
    if state.initialized == 0 {
        warn!(&ctx, "topdown: counters unreadable on this CPU at flush");
        return 2;
    }
    0
}

/// Classic `sched:sched_process_fork`: track children of tracked processes (`-- CMD`). Fires
/// before the child can run, so none of its counts are missed.
#[tracepoint(category = "sched", name = "sched_process_fork")]
pub fn process_fork(ctx: TracePointContext) -> i32 {
    let offset = global(&FORK_CHILD_PID_OFFSET);
    if global(&FOLLOW_FORKS) == 0 || offset == FIELD_ABSENT {
        return 0;
    }
    let (_, tgid) = current_ids();
    if !is_tracked(tgid) {
        return 0;
    }
    // SAFETY: the offset comes from this kernel's tracefs format file.
    if let Ok(child) = unsafe { ctx.read_at::<i32>(offset as usize) } {
        if TRACKED.insert(&(child as u32), &1, 0).is_err() {
            warn!(&ctx, "topdown: tracked-process map full, child {} not followed", child);
        }
    }
    0
}

/// Classic `sched:sched_process_exit`: forget a tracked process once its last thread exits, so a
/// recycled pid is not tracked by mistake. Tasks that already have entries keep being attributed.
#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn process_exit(ctx: TracePointContext) -> i32 {
    let group_dead_offset = global(&EXIT_GROUP_DEAD_OFFSET);
    if global(&FILTER_TGIDS) == 0 || group_dead_offset == FIELD_ABSENT {
        return 0;
    }
    // SAFETY: the offset comes from this kernel's tracefs format file.
    let group_dead = unsafe { ctx.read_at::<u8>(group_dead_offset as usize) }.unwrap_or(0);
    if group_dead != 0 {
        let (_, tgid) = current_ids();
        let _ = TRACKED.remove(&tgid);
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// `bpf_perf_event_read_value` is GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
