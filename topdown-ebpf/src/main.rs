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
// The BPF target does not expose `AtomicU64::fetch_add`; the intrinsic lowers to BPF's atomic
// add, which function totals need when two CPUs return from one function at once.
#![allow(internal_features)]
#![feature(core_intrinsics)]

use aya_ebpf::{
    EbpfContext as _,
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST, pt_regs},
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_ancestor_cgroup_id, bpf_get_current_cgroup_id,
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id,
    },
    macros::{btf_tracepoint, map, perf_event, raw_tracepoint, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray, PerfEventArray, RingBuf},
    programs::{
        BtfTracePointContext, PerfEventContext, ProbeContext, RawTracePointContext,
        RetProbeContext, TracePointContext,
    },
};
use aya_log_ebpf::warn;
use topdown_common::{
    CallKey, CallStats, CgroupCounters, CpuState, FIELD_ABSENT, MAX_CGROUP_LEVEL, MAX_COUNTERS,
    MAX_DEPTH, ProbeStats, ROOT_FUNCTION, ShadowStack, TASK_DEAD, TaskCounters, TaskExit,
    flush_mode, slot_source,
};

// Globals user space sets at load time (read volatile so the compiler cannot fold the defaults).

/// Counter slots in use per CPU (1..=MAX_COUNTERS).
#[unsafe(no_mangle)]
static NUM_COUNTERS: u32 = 0;
/// Per slot: which fd and which value to read (`topdown_common::slot_source`).
#[unsafe(no_mangle)]
static SLOT_SOURCES: [u32; MAX_COUNTERS] = slot_source::identity();
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
/// Nonzero: deltas are also added per cgroup v2 (`--by cgroup`).
#[unsafe(no_mangle)]
static BY_CGROUP: u32 = 0;
/// Zero: no per-task entries (cgroup-only runs triggered on cgroup switches).
#[unsafe(no_mangle)]
static BY_TASK: u32 = 1;
/// Nonzero: only tasks in the cgroups of `CGROUP_FILTER` or their descendants count (`-G`).
#[unsafe(no_mangle)]
static FILTER_CGROUPS: u32 = 0;
/// Nonzero: function totals are kept per process (`--by function,task`).
#[unsafe(no_mangle)]
static SPLIT_FUNCTIONS_BY_PROCESS: u32 = 0;

#[inline(always)]
fn global(value: &'static u32) -> u32 {
    // SAFETY: reading a static the loader patched; volatile keeps the load.
    unsafe { core::ptr::read_volatile(value) }
}

/// Counter fds: index `cpu * MAX_COUNTERS + slot`. Sized by user space to possible CPUs.
#[map]
static COUNTERS: PerfEventArray<u32> = PerfEventArray::new(0);

/// Per CPU: the generation of its counter fds. User space makes it odd while it replaces a
/// CPU's fds (after CPU hotplug) and even again when done; readings taken across a change are
/// discarded and the next one is a new baseline. Sized by user space to possible CPUs.
#[map]
static GENERATIONS: Array<u32> = Array::with_max_entries(1, 0);

/// This CPU's counter generation (0 if the map has no entry for it).
#[inline(always)]
fn generation() -> u32 {
    // SAFETY: a helper without preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    match GENERATIONS.get_ptr(cpu) {
        // SAFETY: a map value pointer; volatile because user space writes it concurrently.
        Some(value) => unsafe { core::ptr::read_volatile(value) },
        None => 0,
    }
}

#[map]
static CPU_STATE: PerCpuArray<CpuState> = PerCpuArray::with_max_entries(1, 0);

/// Per-thread totals, keyed by tid. Sized by user space (`--max-tasks`).
#[map]
static TASKS: HashMap<u32, TaskCounters> = HashMap::with_max_entries(32768, 0);

/// Tracked tgids (and the tids of tracked threads created by fork, until they die).
#[map]
static TRACKED: HashMap<u32, u8> = HashMap::with_max_entries(8192, 0);

/// Per-cgroup totals, keyed by cgroup v2 id (the cgroup directory's inode number).
#[map]
static CGROUPS: HashMap<u64, CgroupCounters> = HashMap::with_max_entries(4096, 0);

/// `-G`: the chosen cgroups; a task counts if any of its ancestors (or its own cgroup) is here,
/// so cgroups created during the run are covered without user space noticing them.
#[map]
static CGROUP_FILTER: HashMap<u64, u8> = HashMap::with_max_entries(1024, 0);

/// Final totals of tasks that died, so their map entries can be freed at once.
#[map]
static EXITS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Per-thread shadow stacks of probed calls. Allocated on demand: a stack is ~13 KiB.
#[map]
static STACKS: HashMap<u32, ShadowStack> = HashMap::with_max_entries(4096, BPF_F_NO_PREALLOC);

/// Never written: the zeroed values new task and cgroup entries are copied from (with 24
/// counters they no longer fit the 512-byte BPF stack).
#[map]
static ZERO_TASK: PerCpuArray<TaskCounters> = PerCpuArray::with_max_entries(1, 0);
#[map]
static ZERO_CGROUP: PerCpuArray<CgroupCounters> = PerCpuArray::with_max_entries(1, 0);
#[map]
static ZERO_CALL: PerCpuArray<CallStats> = PerCpuArray::with_max_entries(1, 0);

/// Never written: the zeroed value new shadow stacks are copied from (too big for the stack).
#[map]
static ZERO_STACK: PerCpuArray<ShadowStack> = PerCpuArray::with_max_entries(1, 0);

/// Function totals per caller -> callee edge (and per process if asked).
#[map]
static CALLS: HashMap<CallKey, CallStats> = HashMap::with_max_entries(16384, 0);

#[map]
static PROBE_STATS: PerCpuArray<ProbeStats> = PerCpuArray::with_max_entries(1, 0);

/// `-ENOENT`: no fd at that index. Hybrid CPUs only have the fds of their own core type's PMU;
/// the other type's slots read as zero there, always, so their deltas are zero too.
const ENOENT: i32 = -2;

/// Reads every counter slot of this CPU into `out`; returns the enabled and running times of the
/// first counter present on this CPU, or `None` if any read failed.
#[inline(always)]
fn read_slots(out: &mut [u64; MAX_COUNTERS]) -> Option<(u64, u64)> {
    let used = global(&NUM_COUNTERS) as usize;
    // SAFETY: a helper without preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let base = cpu.wrapping_mul(MAX_COUNTERS as u32);
    let mut times: Option<(u64, u64)> = None;
    let mut value = (0u64, 0u64, 0u64);
    let mut last_fd = u32::MAX;
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        // SAFETY: `slot < MAX_COUNTERS`; volatile so the loader's values are read, not the default.
        let source = unsafe { core::ptr::read_volatile(SLOT_SOURCES.as_ptr().add(slot)) };
        let fd_slot = slot_source::fd_slot(source) % MAX_COUNTERS as u32;
        // Timing slots follow their counter's slot: one helper call serves all three.
        if fd_slot != last_fd {
            value = match COUNTERS.read_value(base + fd_slot) {
                Ok(read) => {
                    if times.is_none() {
                        times = Some((read.enabled_nanos, read.running_nanos));
                    }
                    (read.counter, read.enabled_nanos, read.running_nanos)
                }
                Err(ENOENT) => (0, 0, 0),
                Err(_) => return None,
            };
            last_fd = fd_slot;
        }
        out[slot] = match slot_source::field(source) {
            slot_source::FIELD_ENABLED => value.1,
            slot_source::FIELD_RUNNING => value.2,
            _ => value.0,
        };
        slot += 1;
    }
    Some(times.unwrap_or((0, 0)))
}

/// Reads every counter slot of this CPU into `state.now`. False if any read failed.
#[inline(always)]
fn read_counters(state: &mut CpuState) -> bool {
    // Seqlock against user space replacing this CPU's fds: an odd generation, or one that
    // changed while we read, means the reading may mix old and new counters.
    let before = generation();
    if before & 1 != 0 {
        return false;
    }
    let Some((enabled, running)) = read_slots(&mut state.now) else {
        state.read_errors += 1;
        return false;
    };
    if generation() != before {
        return false;
    }
    if state.initialized != 0 && state.generation != before {
        // New counters: this reading is the new baseline (nothing was counted in between: the
        // CPU was offline).
        state.initialized = 0;
    }
    state.generation = before;
    let enabled_delta = enabled.wrapping_sub(state.last_enabled_ns);
    let running_delta = running.wrapping_sub(state.last_running_ns);
    if state.initialized != 0 && running_delta < enabled_delta {
        state.not_running += 1;
    }
    state.last_enabled_ns = enabled;
    state.last_running_ns = running;
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
    state.seq = state.seq.wrapping_add(1);
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
    // The deltas stay in `state.now` (no copy: 24 counters would not fit the 512-byte stack).
    let delta = &state.now;
    add(&mut state.total, delta, used);

    if tid == 0 {
        add(&mut state.idle, delta, used);
        return;
    }
    if global(&FILTER_CGROUPS) != 0 && !in_chosen_cgroup() {
        add(&mut state.untracked, delta, used);
        return;
    }
    let existing = TASKS.get_ptr_mut(&tid);
    if existing.is_none() && global(&FILTER_TGIDS) != 0 && !is_tracked(tgid) {
        add(&mut state.untracked, delta, used);
        return;
    }
    if global(&BY_CGROUP) != 0 {
        add_to_cgroup(
            &mut state.cgroup_map_full,
            &mut state.cgroup_dropped,
            delta,
            used,
        );
    }
    if global(&BY_TASK) == 0 {
        return;
    }
    let task = match existing {
        Some(task) => task,
        None => {
            let Some(zero) = ZERO_TASK.get_ptr(0) else {
                add(&mut state.dropped, delta, used);
                return;
            };
            // SAFETY: a per-CPU map value nobody writes: all zeroes.
            if TASKS
                .insert(&tid, unsafe { &*zero }, BPF_NOEXIST as u64)
                .is_err()
            {
                state.task_map_full += 1;
                add(&mut state.dropped, delta, used);
                return;
            }
            match TASKS.get_ptr_mut(&tid) {
                Some(task) => task,
                None => {
                    add(&mut state.dropped, delta, used);
                    return;
                }
            }
        }
    };
    // SAFETY: a map value pointer; only the CPU the task runs on writes it.
    let task = unsafe { &mut *task };
    add(&mut task.counters, delta, used);
    task.switches += 1;
    task.tgid = tgid;
    if let Ok(comm) = bpf_get_current_comm() {
        task.comm = comm;
    }
    if dying {
        retire(state, tid, tgid, task);
    }
}

/// `current` is still the task switching out, so this is its cgroup.
#[inline(always)]
fn add_to_cgroup(
    cgroup_map_full: &mut u64,
    cgroup_dropped: &mut [u64; MAX_COUNTERS],
    delta: &[u64; MAX_COUNTERS],
    used: usize,
) {
    // SAFETY: a helper without preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    let entry = match CGROUPS.get_ptr_mut(&cgroup) {
        Some(entry) => entry,
        None => {
            let Some(zero) = ZERO_CGROUP.get_ptr(0) else {
                add(cgroup_dropped, delta, used);
                return;
            };
            // SAFETY: a per-CPU map value nobody writes: all zeroes.
            if CGROUPS
                .insert(&cgroup, unsafe { &*zero }, BPF_NOEXIST as u64)
                .is_err()
            {
                *cgroup_map_full += 1;
                add(cgroup_dropped, delta, used);
                return;
            }
            match CGROUPS.get_ptr_mut(&cgroup) {
                Some(entry) => entry,
                None => {
                    add(cgroup_dropped, delta, used);
                    return;
                }
            }
        }
    };
    // Several CPUs can add to one cgroup at once.
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        // SAFETY: naturally aligned u64s of a live map value.
        unsafe { atomic_add(&raw mut (*entry).counters[slot], delta[slot]) };
        slot += 1;
    }
}

/// True if the current task's cgroup or one of its ancestors was chosen with `-G`.
#[inline(always)]
fn in_chosen_cgroup() -> bool {
    let mut level = 0;
    while level <= MAX_CGROUP_LEVEL {
        // SAFETY: a helper without preconditions; 0 means "no ancestor at this level".
        let ancestor = unsafe { bpf_get_current_ancestor_cgroup_id(level) };
        if ancestor == 0 {
            return false;
        }
        // SAFETY: tested for presence only.
        if unsafe { CGROUP_FILTER.get(&ancestor) }.is_some() {
            return true;
        }
        level += 1;
    }
    false
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
    // Calls still open on a dead thread's shadow stack will never return.
    // SAFETY: only this thread's probes and its last switch touch its stack.
    if let Some(stack) = unsafe { STACKS.get(&tid) } {
        let open = u64::from(stack.depth);
        if let Some(stats) = PROBE_STATS.get_ptr_mut(0) {
            // SAFETY: a per-CPU map value.
            unsafe { (*stats).missed_returns += open };
        }
        let _ = STACKS.remove(&tid);
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

/// `--by cgroup` alone: run only when the CPU switches between cgroups (the
/// `cgroup-switches` software event with period 1, as perf's bperf_cgroup does) instead of at
/// every context switch. The event fires before the switch, so `current` is still the task
/// leaving, and the delta covers everything its cgroup ran since the last cgroup switch. Idle
/// runs in the root cgroup and is not told apart from it in this mode.
#[perf_event]
pub fn cgroup_switch(_ctx: PerfEventContext) -> u32 {
    let Some(state) = CPU_STATE.get_ptr_mut(0) else {
        return 0;
    };
    let (tid, tgid) = current_ids();
    attribute(state, tid, tgid, false);
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
    if let Ok(child) = unsafe { ctx.read_at::<i32>(offset as usize) }
        && TRACKED.insert(&(child as u32), &1, 0).is_err()
    {
        warn!(
            &ctx,
            "topdown: tracked-process map full, child {} not followed", child
        );
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

// ---- Function probes -------------------------------------------------------------------------
//
// Entry pushes a frame holding the thread's virtual counters; return pops it and adds
// inclusive = virtual now - virtual at entry, exclusive = inclusive - probed callees'
// inclusive. Virtual counters only advance while the thread is on a CPU, so preemption,
// migration and sleeping inside a function never add another task's counts to it.

/// How far the stack pointer moves between a function's entry and its return probe: x86-64's
/// `ret` pops the return address; arm64's does not touch sp.
#[cfg(bpf_target_arch = "x86_64")]
const RETURN_SP_ADJUST: u64 = 8;
#[cfg(not(bpf_target_arch = "x86_64"))]
const RETURN_SP_ADJUST: u64 = 0;

#[inline(always)]
fn stack_pointer(regs: *mut pt_regs) -> u64 {
    // SAFETY: the probe context's registers are readable.
    #[cfg(bpf_target_arch = "x86_64")]
    let sp = unsafe { (*regs).rsp };
    #[cfg(bpf_target_arch = "aarch64")]
    let sp = unsafe { (*regs).sp };
    #[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
    let sp: u64 = {
        let _ = regs;
        0
    };
    // Both arches' pt_regs hold the stack pointer as a u64 (`rsp`, `sp`).
    sp
}

/// A frame index the verifier can see is in bounds, with no panic path for the compiler to
/// add. Callers check the range first, but LLVM then drops a plain mask as redundant and indexes
/// with a register the verifier has no bounds for; the volatile read keeps the mask in place.
#[inline(always)]
fn frame_index(index: usize) -> usize {
    const _: () = assert!(MAX_DEPTH.is_power_of_two());
    // SAFETY: reading a local.
    let opaque = unsafe { core::ptr::read_volatile(&index) };
    opaque & (MAX_DEPTH - 1)
}

#[inline(always)]
fn probe_stats() -> Option<&'static mut ProbeStats> {
    // SAFETY: a per-CPU value; probe programs on one CPU may interleave through preemption,
    // which at worst loses an increment of these diagnostic counts.
    PROBE_STATS
        .get_ptr_mut(0)
        .map(|stats| unsafe { &mut *stats })
}

/// The thread's virtual counters into `stack.virtual_now`: its accumulated counts plus what this
/// CPU counted since the thread was switched in. Retries if a context switch interleaved.
#[inline(always)]
fn virtual_counters(stack: &mut ShadowStack, tid: u32) -> bool {
    let Some(state) = CPU_STATE.get_ptr(0) else {
        return false;
    };
    let used = global(&NUM_COUNTERS) as usize;
    let mut attempt = 0;
    while attempt < 3 {
        attempt += 1;
        // SAFETY: a per-CPU map value; read volatile because a switch may change it under us.
        let seq = unsafe { core::ptr::read_volatile(&(*state).seq) };
        // SAFETY: as above.
        if unsafe { (*state).initialized == 0 || (*state).frozen != 0 } {
            return false;
        }
        // Counters being replaced (CPU hotplug), or not yet re-baselined: no reading.
        let counters_generation = generation();
        // SAFETY: as above.
        if counters_generation != unsafe { (*state).generation } {
            return false;
        }
        if read_slots(&mut stack.now).is_none() || generation() != counters_generation {
            return false;
        }
        // SAFETY: map value pointers.
        let task = unsafe { TASKS.get(&tid) };
        let mut slot = 0;
        while slot < MAX_COUNTERS && slot < used {
            let accumulated = task.map_or(0, |task| task.counters[slot]);
            // SAFETY: as above.
            let last = unsafe { (*state).last[slot] };
            stack.virtual_now[slot] = accumulated.wrapping_add(stack.now[slot].wrapping_sub(last));
            slot += 1;
        }
        // SAFETY: as above.
        if unsafe { core::ptr::read_volatile(&(*state).seq) } == seq {
            return true;
        }
    }
    false
}

/// Only tasks whose counts are attributed to them can have meaningful virtual counters.
#[inline(always)]
fn probed_task() -> Option<(u32, u32)> {
    let (tid, tgid) = current_ids();
    if global(&FILTER_TGIDS) != 0 && !is_tracked(tgid) {
        return None;
    }
    Some((tid, tgid))
}

/// Per-point attach (one perf link per function): kernels without uprobe.multi.
#[uprobe]
pub fn func_entry(ctx: ProbeContext) -> u32 {
    on_entry(&ctx)
}

/// One uprobe.multi link for all functions of a binary (Linux >= 6.6).
#[uprobe(multi)]
pub fn func_entry_multi(ctx: ProbeContext) -> u32 {
    on_entry(&ctx)
}

#[uretprobe]
pub fn func_return(ctx: RetProbeContext) -> u32 {
    on_return(ctx.regs, RETURN_SP_ADJUST)
}

#[uretprobe(multi)]
pub fn func_return_multi(ctx: RetProbeContext) -> u32 {
    on_return(ctx.regs, RETURN_SP_ADJUST)
}

/// A uprobe on a function's exit instruction (`ret`, tail-call `jmp`): the stack pointer is
/// still the one the function had at entry, and no return address was rewritten, so C++
/// exceptions unwind normally and no kernel nesting limit applies.
#[uprobe]
pub fn func_exit(ctx: ProbeContext) -> u32 {
    on_return(ctx.regs, 0)
}

#[uprobe(multi)]
pub fn func_exit_multi(ctx: ProbeContext) -> u32 {
    on_return(ctx.regs, 0)
}

#[inline(always)]
fn on_entry(ctx: &ProbeContext) -> u32 {
    let Some((tid, _)) = probed_task() else {
        return 0;
    };
    // SAFETY: reading the attach cookie of this probe.
    let function = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let sp = stack_pointer(ctx.regs);
    let stack = match STACKS.get_ptr_mut(&tid) {
        Some(stack) => stack,
        None => {
            let Some(zero) = ZERO_STACK.get_ptr(0) else {
                return 0;
            };
            // SAFETY: a map value of the right type.
            if STACKS
                .insert(&tid, unsafe { &*zero }, BPF_NOEXIST as u64)
                .is_err()
            {
                if let Some(stats) = probe_stats() {
                    stats.map_full += 1;
                }
                return 0;
            }
            let Some(stack) = STACKS.get_ptr_mut(&tid) else {
                return 0;
            };
            stack
        }
    };
    // SAFETY: this thread's stack; only its own probes touch it.
    let stack = unsafe { &mut *stack };
    // A live caller's frame has a higher stack pointer than any callee's entry. A frame at or
    // below ours was left without a return (longjmp, exception).
    let mut guard = 0;
    while guard < MAX_DEPTH && stack.depth > 0 {
        guard += 1;
        let top = (stack.depth - 1) as usize;
        if top >= MAX_DEPTH || stack.frames[frame_index(top)].sp > sp {
            break;
        }
        stack.depth -= 1;
        if let Some(stats) = probe_stats() {
            stats.missed_returns += 1;
        }
    }
    let depth = stack.depth as usize;
    if depth >= MAX_DEPTH {
        // The kernel gives this call no return probe either.
        if let Some(stats) = probe_stats() {
            stats.overflows += 1;
        }
        return 0;
    }
    if !virtual_counters(stack, tid) {
        if let Some(stats) = probe_stats() {
            stats.read_failures += 1;
        }
        return 0;
    }
    let frame = &mut stack.frames[frame_index(depth)];
    frame.function = function;
    frame.sp = sp;
    frame.entry = stack.virtual_now;
    frame.callees = [0; MAX_COUNTERS];
    stack.depth += 1;
    0
}

#[inline(always)]
fn on_return(regs: *mut pt_regs, sp_adjust: u64) -> u32 {
    let Some((tid, tgid)) = probed_task() else {
        return 0;
    };
    let Some(stack) = STACKS.get_ptr_mut(&tid) else {
        return 0;
    };
    // SAFETY: this thread's stack; only its own probes touch it.
    let stack = unsafe { &mut *stack };
    let entry_sp = stack_pointer(regs).wrapping_sub(sp_adjust);
    // Frames deeper than the returning one lost their returns.
    let mut guard = 0;
    while guard < MAX_DEPTH && stack.depth > 0 {
        guard += 1;
        let top = (stack.depth - 1) as usize;
        if top >= MAX_DEPTH || stack.frames[frame_index(top)].sp >= entry_sp {
            break;
        }
        stack.depth -= 1;
        if let Some(stats) = probe_stats() {
            stats.missed_returns += 1;
        }
    }
    let depth = stack.depth as usize;
    let matches =
        depth > 0 && depth <= MAX_DEPTH && stack.frames[frame_index(depth - 1)].sp == entry_sp;
    if !matches {
        if let Some(stats) = probe_stats() {
            stats.unmatched_returns += 1;
        }
        return 0;
    }
    if !virtual_counters(stack, tid) {
        // Drop the frame: its numbers cannot be known.
        stack.depth -= 1;
        if let Some(stats) = probe_stats() {
            stats.read_failures += 1;
        }
        return 0;
    }
    let used = global(&NUM_COUNTERS) as usize;
    let top = depth - 1;
    // Indexing goes through get()/get_mut(): a bounds-check panic would leave the program
    // without an exit, which the verifier rejects.
    let frame = &stack.frames[frame_index(top)];
    let function = frame.function;
    // Scratch reuse (the BPF stack is 512 bytes): `now` becomes the inclusive figure and
    // `virtual_now` the exclusive one.
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        let inclusive = stack.virtual_now[slot].wrapping_sub(frame.entry[slot]);
        stack.now[slot] = inclusive;
        stack.virtual_now[slot] = inclusive.wrapping_sub(frame.callees[slot]);
        slot += 1;
    }
    stack.depth -= 1;
    let parent = if top > 0 {
        let caller = &mut stack.frames[frame_index(top - 1)];
        add(&mut caller.callees, &stack.now, used);
        caller.function
    } else {
        ROOT_FUNCTION
    };
    let key = CallKey {
        function,
        parent,
        tgid: if global(&SPLIT_FUNCTIONS_BY_PROCESS) != 0 {
            tgid
        } else {
            0
        },
        _pad: 0,
    };
    let stats = match CALLS.get_ptr_mut(&key) {
        Some(stats) => stats,
        None => {
            if let Some(zero) = ZERO_CALL.get_ptr(0) {
                // SAFETY: a per-CPU map value nobody writes: all zeroes.
                let _ = CALLS.insert(&key, unsafe { &*zero }, BPF_NOEXIST as u64);
            }
            match CALLS.get_ptr_mut(&key) {
                Some(stats) => stats,
                None => {
                    if let Some(stats) = probe_stats() {
                        stats.map_full += 1;
                    }
                    return 0;
                }
            }
        }
    };
    // Two CPUs may update one function's totals at once: add atomically (BPF atomic add).
    // SAFETY: naturally aligned u64 fields of a live map value.
    unsafe { atomic_add(&raw mut (*stats).calls, 1) };
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        // SAFETY: as above.
        unsafe {
            atomic_add(&raw mut (*stats).inclusive[slot], stack.now[slot]);
            atomic_add(&raw mut (*stats).exclusive[slot], stack.virtual_now[slot]);
        }
        slot += 1;
    }
    0
}

/// # Safety
/// `target` must be a valid, 8-byte aligned u64 in a map value.
#[inline(always)]
unsafe fn atomic_add(target: *mut u64, value: u64) {
    use core::intrinsics::{AtomicOrdering, atomic_xadd};
    // SAFETY: guaranteed by the caller.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(target, value) };
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
