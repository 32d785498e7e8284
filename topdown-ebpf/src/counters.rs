//! Counter reading and attribution: each reading hands the delta since the previous one to the
//! task that ran in between (and its cgroup), at context switches, cgroup switches, flushes and
//! when a process moves itself to another cgroup.

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_ancestor_cgroup_id, bpf_get_current_cgroup_id, bpf_get_current_pid_tgid,
        bpf_probe_read_kernel, generated::bpf_get_current_comm,
    },
    macros::{btf_tracepoint, perf_event, raw_tracepoint, tracepoint},
    programs::{BtfTracePointContext, PerfEventContext, RawTracePointContext, TracePointContext},
};
use aya_log_ebpf::warn;
use topdown_common::{
    CpuState, MAX_CGROUP_LEVEL, MAX_COUNTERS, SwitchState, TASK_DEAD, TaskCounters, TaskExit,
    flush_mode, flush_result, kernel_offset, pid_flags, reading_owner, skip_untraced,
    unseen_leavers::Arrival,
};

use crate::maps::{
    BY_CGROUP, BY_TASK, CGROUP_FILTER, CGROUPS, COMM_AT_EVERY_READING, COUNTERS, CPU_STATE, EXITS,
    FILTER_CGROUPS, FILTER_TGIDS, IDLE_STATE_OFFSET, NUM_COUNTERS, PROBE_STATS, PROCESS_CGROUPS,
    SKIP_UNTRACED, SLOT_SOURCES, STACKS, TASKS, TRACKED, ZERO_CGROUP, ZERO_TASK, atomic_add,
    atomic_or, atomic_swap, flags_of, generation, global, kernel_field_offset, pid_flags_word,
    record_field, switch_state, untrack,
};

/// Reads every counter slot of this CPU into `out`; returns the enabled and running times of the
/// first counter present on this CPU, or `None` if any read failed. A slot with no fd on this
/// CPU reads as zero (hybrid CPUs only have the fds of their own core type's PMU, so the other
/// type's deltas are zero there).
#[inline(always)]
pub(crate) fn read_slots(out: &mut [u64; MAX_COUNTERS]) -> Option<(u64, u64)> {
    topdown_ebpf::read_counter_slots(
        &COUNTERS,
        global(&NUM_COUNTERS) as usize,
        &SLOT_SOURCES,
        out,
    )
}

/// Reads every counter slot of this CPU into `state.now`. False if any read failed.
#[inline(always)]
pub(crate) fn read_counters(state: &mut CpuState) -> bool {
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
pub(crate) fn add(bucket: &mut [u64; MAX_COUNTERS], delta: &[u64; MAX_COUNTERS], used: usize) {
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        bucket[slot] = bucket[slot].wrapping_add(delta[slot]);
        slot += 1;
    }
}

/// The `TRACKED` value of a process whose last thread has exited but may still run (its exit
/// path can sleep and be switched in again) until its final switch-out (`SKIP_UNTRACED` only).
pub(crate) const TRACKED_EXITING: u8 = 2;

#[inline(always)]
pub(crate) fn is_tracked(tgid: u32) -> bool {
    // SAFETY: the value is only tested for presence.
    unsafe { TRACKED.get(&tgid).is_some() }
}

/// Reads this CPU's counters and gives the delta since the last reading to `tid` (and, with
/// `--by cgroup`, to the cgroup it is in now). Every caller runs with interrupts off
/// (context and cgroup switches, the cgroup-attach tracepoint) or from an IPI (flush), so no
/// two attributions on a CPU interleave.
///
/// `dying`: the task will never run again (its last switch-out): hand its totals to user space
/// and free its entry.
#[inline(always)]
pub(crate) fn attribute(ctx_state: *mut CpuState, tid: u32, tgid: u32, dying: bool) {
    // SAFETY: a per-CPU map value, only touched by programs on this CPU, which do not nest (see
    // above).
    let state = unsafe { &mut *ctx_state };
    let cgroup = if global(&BY_CGROUP) != 0 && tid != 0 {
        // SAFETY: a helper without preconditions.
        unsafe { bpf_get_current_cgroup_id() }
    } else {
        0
    };
    credit(state, tid, tgid, dying, cgroup);
}

/// Records the cgroup `tgid` is in (see `PROCESS_CGROUPS`), writing only when it changed. Not
/// called on every reading (the record is kept by the start-up scan, forks and moves), only
/// where it costs nothing that matters: moves, forks and a thread's first reading.
#[inline(always)]
pub(crate) fn remember_cgroup(tgid: u32, cgroup: u64) {
    // SAFETY: the value is copied out at once.
    if unsafe { PROCESS_CGROUPS.get(&tgid) }.copied() != Some(cgroup) {
        let _ = PROCESS_CGROUPS.insert(&tgid, &cgroup, 0);
    }
}

/// Reads the counters and leaves the delta since the last reading in `state.now`, already added
/// to `state.total`. False if there is no delta to hand out: frozen, the reading failed (its
/// delta goes to the next one), or this was the baseline.
#[inline(always)]
fn take_delta(state: &mut CpuState) -> bool {
    if state.frozen != 0 || !read_counters(state) {
        return false;
    }
    let used = global(&NUM_COUNTERS) as usize;
    state.seq = state.seq.wrapping_add(1);
    if state.initialized == 0 {
        // Baseline: nothing before this instant belongs to the run.
        state.last = state.now;
        state.initialized = 1;
        return false;
    }
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        let slot_delta = state.now[slot].wrapping_sub(state.last[slot]);
        state.last[slot] = state.now[slot];
        state.now[slot] = slot_delta;
        slot += 1;
    }
    // The deltas stay in `state.now` (no copy: 32 counters would not fit the 512-byte stack).
    add(&mut state.total, &state.now, used);
    true
}

/// Hands the delta since the last reading to `tid` and, with `--by cgroup`, to `cgroup`.
#[inline(always)]
pub(crate) fn credit(state: &mut CpuState, tid: u32, tgid: u32, dying: bool, cgroup: u64) {
    if !take_delta(state) {
        return;
    }
    let used = global(&NUM_COUNTERS) as usize;
    let delta = &state.now;

    if tid == 0 {
        add(&mut state.idle, delta, used);
        return;
    }
    if global(&FILTER_CGROUPS) != 0 && !in_chosen_cgroup() {
        add(&mut state.untracked, delta, used);
        return;
    }
    let existing = if global(&BY_TASK) != 0 {
        TASKS.get_ptr_mut(&tid)
    } else {
        None
    };
    if existing.is_none() && global(&FILTER_TGIDS) != 0 && !is_tracked(tgid) {
        add(&mut state.untracked, delta, used);
        return;
    }
    if global(&BY_CGROUP) != 0 {
        add_to_cgroup(
            cgroup,
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
            if global(&BY_CGROUP) != 0 {
                // A new thread: also what corrects a process started straight into another
                // cgroup (clone3 CLONE_INTO_CGROUP), which the fork hook recorded in its
                // parent's.
                remember_cgroup(tgid, cgroup);
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
    // The name is taken when the entry is made (a zeroed entry, also one the exit hook made)
    // and kept by `task_rename` from then on: copying it at every reading (the helper, then
    // two copies of the name) cost ~85 ns of the ~350 ns program with `--pmu software` here,
    // more than the task entry's lookup and update together.
    if task.comm[0] == 0 || global(&COMM_AT_EVERY_READING) != 0 {
        // SAFETY: the helper writes at most 16 bytes, NUL-terminated, into the map value's.
        unsafe { bpf_get_current_comm(task.comm.as_mut_ptr().cast(), task.comm.len() as u32) };
    }
    if dying {
        retire(state, tid, tgid, task);
    }
}

/// Adds the delta to `cgroup`: the one the task it belongs to ran in (a switch runs before the
/// next task is current; a self-move is credited to the cgroup it leaves).
#[inline(always)]
pub(crate) fn add_to_cgroup(
    cgroup: u64,
    cgroup_map_full: &mut u64,
    cgroup_dropped: &mut [u64; MAX_COUNTERS],
    delta: &[u64; MAX_COUNTERS],
    used: usize,
) {
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
pub(crate) fn in_chosen_cgroup() -> bool {
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
pub(crate) fn retire(state: &mut CpuState, tid: u32, tgid: u32, task: &mut TaskCounters) {
    match EXITS.reserve::<TaskExit>(0) {
        Some(mut record) => {
            let exit = record.as_mut_ptr();
            // SAFETY: the reserved record, written in place: a `TaskExit` built by value is a
            // 296-byte copy on the stack, which took sched_switch's frame from 184 to 448 bytes
            // (of the 512 a BPF function may have).
            unsafe {
                (*exit).tid = tid;
                (*exit)._pad = 0;
                core::ptr::copy_nonoverlapping(
                    task as *const TaskCounters,
                    &raw mut (*exit).task,
                    1,
                );
            }
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
        untrack(tid);
    }
    // SAFETY: the value is copied out at once.
    if unsafe { TRACKED.get(&tgid) }.copied() == Some(TRACKED_EXITING) {
        // The process's last thread has exited: forget the process now that it is gone.
        untrack(tgid);
    }
    // Calls still open on a dead thread's shadow stack will never return. The stack goes with
    // the thread (task storage); `tid` is the current task, whose last switch this is.
    if let Some(stack) = STACKS.current(false)
        && let Some(stats) = PROBE_STATS.get_ptr_mut(0)
    {
        // SAFETY: a per-CPU value; only this thread's probes and its last switch touch its
        // stack.
        unsafe { (*stats).missed_returns += u64::from((*stack).depth) };
    }
    crate::spans::retire_current_thread();
}

#[inline(always)]
pub(crate) fn current_ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    (pid_tgid as u32, (pid_tgid >> 32) as u32)
}

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)`: `current` is still `prev`.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    let skip = global(&SKIP_UNTRACED);
    if skip == skip_untraced::OFF {
        let Some(state) = CPU_STATE.get_ptr_mut(0) else {
            return 0;
        };
        let (tid, tgid) = current_ids();
        attribute(state, tid, tgid, dying(&ctx));
        return 0;
    }
    if skip == skip_untraced::BY_PID_FLAGS && skips_by_pid_flags(&ctx) {
        return 0;
    }
    let switch = switch_state();
    let pid_field = kernel_field_offset(kernel_offset::TASK_PID);
    let next: u64 = ctx.arg(2);
    let prev: u64 = ctx.arg(1);
    let (next_tid, next_tgid) = task_ids(next, pid_field);
    // Both of the arriving process's flags in one load.
    let next_flags = flags_of(next_tgid);
    let arrival = Arrival {
        task: next,
        tid: next_tid,
        tgid: next_tgid,
    };
    let Some(state) = CPU_STATE.get_ptr_mut(0) else {
        return 0;
    };
    let dying = dying(&ctx);
    let read_switch = note_switch(state, switch, prev, arrival, next_flags);
    // SAFETY: this CPU's entry; programs on a CPU do not nest (see `attribute`).
    let owner = unsafe { (*switch).owner };
    let next_traced = arriving(next, next_tid, next_flags);
    // Idle arriving (tid 0) is read too: its `PID_FLAGS` say so (`read_switch`).
    if reading_owner::kind(owner) == reading_owner::NONE && !read_switch && !dying && !next_traced {
        // The common case of `-G` (`skip_untraced::BY_TASK`): nobody traced, no reading, and
        // the delta since the last one already spans several tasks.
        return 0;
    }
    if interrupted_probe(state) {
        return 0;
    }
    let (tid, tgid) = current_ids();
    let credit = delta_belongs_to(owner, tid, tgid);
    count_unseen_arrival(state, owner, credit);
    // A CPU going idle is read (costing nothing anyone waits for): half of the switches away
    // from idle do not fire sched_switch here (`reading_owner`), and a traced task woken on an
    // idle CPU is then credited from this reading on. So is a process whose switch-outs go
    // unseen (`unseen_leavers`), for a traced task that follows it unseen, and a switch that
    // found an unseen one (the reading then knows who arrives).
    if !credit && !next_traced && !read_switch && next_tid != 0 {
        // Nobody traced: no reading. The delta since the last one now spans `next` too.
        // SAFETY: as above.
        unsafe { (*switch).owner = reading_owner::pack(reading_owner::NONE, 0) };
        if dying {
            // SAFETY: as in `attribute`.
            retire_unread(unsafe { &mut *state }, tid, tgid);
        }
        return 0;
    }
    settle(state, tid, tgid, dying, None, credit, next_tid, next_traced);
    0
}

/// The skip path of `-p` (`skip_untraced::BY_PID_FLAGS`), the common case, in one test of the
/// bits that ask for more: the arriving process is tracked or asks to be read (idle always
/// does), a reading is owned (an owner of kind `NONE` is 0), the task leaving dies, or it is
/// not the one that arrived last (it came in unseen). True if the switch needs nothing more
/// (its arrival is kept). A test per condition costs LLVM's booleans and spills, 40
/// instructions more here; so would values kept for the rest of sched_switch, so it reads its
/// own (volatile: not merged with the rest's loads, which then do not stay live through here).
#[inline(always)]
fn skips_by_pid_flags(ctx: &BtfTracePointContext) -> bool {
    let switch = switch_state();
    let args = ctx.as_ptr() as *const u64;
    // SAFETY: sched_switch's arguments (see `sched_switch`), at constant offsets of its context.
    let (prev, next, prev_state) = unsafe {
        (
            core::ptr::read_volatile(args.add(1)),
            core::ptr::read_volatile(args.add(2)),
            core::ptr::read_volatile(args.add(3)),
        )
    };
    let (next_tid, next_tgid) = task_ids(next, kernel_field_offset(kernel_offset::TASK_PID));
    // SAFETY: this CPU's entry; programs on a CPU do not nest (see `attribute`).
    let (owner, last_task) = unsafe { ((*switch).owner, (*switch).arrived.task) };
    let wanted = flags_of(next_tgid) | owner | (prev_state & u64::from(TASK_DEAD));
    // `prev` is a pointer to the verifier, so compared, not mixed into `wanted`.
    if wanted != 0 || last_task != prev {
        return false;
    }
    // SAFETY: as above.
    unsafe {
        (*switch).arrived = Arrival {
            task: next,
            tid: next_tid,
            tgid: next_tgid,
        }
    };
    true
}

/// Whether sched_switch's `prev` is dying: its last switch-out (`prev_state`, the fourth
/// argument, has `TASK_DEAD`).
#[inline(always)]
fn dying(ctx: &BtfTracePointContext) -> bool {
    let prev_state: u64 = ctx.arg(3);
    prev_state as u32 & TASK_DEAD != 0
}

/// True if a function probe on this CPU is taking a reading (`recover_reading`), which this
/// program interrupted: it then leaves the state alone (its delta goes to a later reading) and
/// tells the probe so. Only a flush's IPI or, on preemptible kernels, a switch can land in that
/// window of a few hundred instructions; a task dying at such a switch keeps its entry (its
/// counts stay in the report, as a task not known to have exited).
#[inline(always)]
pub(crate) fn interrupted_probe(state: *mut CpuState) -> bool {
    // SAFETY: as in `attribute`; the probe cannot run until this program is done.
    unsafe {
        if (*state).busy == 0 {
            return false;
        }
        (*state).busy = 2;
    }
    true
}

/// From a function probe of `tid`, a traced task running although the CPU's last reading saw
/// another traced task arrive (that one left unseen, and the delta spans both): reads the
/// counters, gives that delta to `untracked` and makes `tid` the owner, so the task's calls
/// and counts from here on are its own. False if no reading was taken.
#[inline(always)]
pub(crate) fn recover_reading(state_ptr: *mut CpuState, tid: u32) -> bool {
    // SAFETY: an aligned u64 of a live per-CPU map value; atomic against a preempted probe
    // of another task on this CPU.
    if unsafe { atomic_swap(&raw mut (*state_ptr).busy, 1) } != 0 {
        return false;
    }
    // SAFETY: as in `attribute`; interrupting programs leave it alone while `busy`.
    let state = unsafe { &mut *state_ptr };
    let read = take_delta(state);
    if read {
        add(
            &mut state.untracked,
            &state.now,
            global(&NUM_COUNTERS) as usize,
        );
        // SAFETY: this CPU's entry; interrupting programs leave it alone while `busy`.
        unsafe { (*switch_state()).owner = reading_owner::pack(reading_owner::TRACED, tid) };
    }
    // SAFETY: as above.
    if unsafe { atomic_swap(&raw mut (*state_ptr).busy, 0) } != 1 {
        // A switch or flush ran meanwhile: who runs now is not known.
        // SAFETY: as above.
        unsafe { (*switch_state()).owner = reading_owner::pack(reading_owner::NONE, 0) };
        return false;
    }
    read
}

/// Whether the delta since the last reading goes to `tid` (`current`), given the CPU's
/// `owner`: it does when `tid` is the traced task the last reading saw arrive; when that
/// reading saw an untraced task (or idle) arrive and `tid`, traced, is running instead, an
/// arrival sched_switch did not report; and when no reading saw anyone arrive (`NONE`) and
/// `tid` is traced, the same unseen arrival after switches that took no reading, counted by
/// `count_unseen_arrival` (`reading_owner`).
#[inline(always)]
pub(crate) fn delta_belongs_to(owner: u64, tid: u32, tgid: u32) -> bool {
    if reading_owner::kind(owner) == reading_owner::TRACED {
        return reading_owner::tid(owner) == tid;
    }
    // A traced task that arrived unseen: the stretches before it and its own are one delta.
    reading_owner::claimable_by(owner, tid) && current_is_traced(tid, tgid)
}

/// Counts a reading credited (`credit`) although no reading saw its task arrive (`owner` is
/// `NONE`): `CpuState::unseen_arrivals`.
#[inline(always)]
pub(crate) fn count_unseen_arrival(state: *mut CpuState, owner: u64, credit: bool) {
    if credit && reading_owner::kind(owner) == reading_owner::NONE {
        // SAFETY: as in `attribute`; a probe adds to it atomically (`probed_task`).
        unsafe { (*state).unseen_arrivals += 1 };
    }
}

/// Keeps `SwitchState::arrived` at a switch from the task at `prev_task` to `next`: when the task
/// that arrived last is not `prev_task`, it left through a switch sched_switch did not report,
/// counted in `unseen_switches`, and its process is marked `UNSEEN_LEAVER` in `PID_FLAGS` (idle
/// needs no mark: a switch to it is always read). True if the switch is to be read
/// (`topdown_common::reading_owner`): `next_flags` (`next`'s process's) has the mark (idle's
/// always has), or `prev_task` arrived unseen (it may be traced, with no reading at its
/// arrival: `delta_belongs_to`). Loads and stores only, no map lookup: it runs at every
/// switch, skipped ones included.
#[inline(always)]
fn note_switch(
    state: *mut CpuState,
    switch: *mut SwitchState,
    prev_task: u64,
    next: Arrival,
    next_flags: u64,
) -> bool {
    // SAFETY: as in `attribute`.
    let unseen = unsafe { (*switch).arrived.note_switch(prev_task, next) };
    if let Some((tid, tgid)) = unseen {
        // SAFETY: as in `attribute`.
        unsafe { (*state).unseen_switches += 1 };
        if tid != 0 {
            mark_unseen_leaver(tgid);
        }
        return true;
    }
    next_flags & pid_flags::UNSEEN_LEAVER != 0
}

/// Marks `tgid` `UNSEEN_LEAVER`, unless marked: a store to the shared word only the first
/// time, not at each unseen switch.
#[inline(always)]
fn mark_unseen_leaver(tgid: u32) {
    if flags_of(tgid) & pid_flags::UNSEEN_LEAVER == 0 {
        // Several CPUs may mark one word at once.
        // SAFETY: an aligned u64 of a global array.
        unsafe {
            atomic_or(
                pid_flags_word(tgid),
                pid_flags::UNSEEN_LEAVER << pid_flags::shift(tgid),
            )
        };
    }
}

/// Under `SKIP_UNTRACED`, a reading on behalf of `current` (`tid`): the delta goes to it (through
/// `attribute`, or `credit` with `cgroup` when given) if `credit` (`delta_belongs_to`);
/// otherwise to `untracked`, idle time included (idle cannot be told apart from untraced tasks:
/// not every switch to and from it is read). Then `owner` names the task that runs from here
/// on, `next_tid`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn settle(
    state_ptr: *mut CpuState,
    tid: u32,
    tgid: u32,
    dying: bool,
    cgroup: Option<u64>,
    credit: bool,
    next_tid: u32,
    next_traced: bool,
) {
    // SAFETY: as in `attribute`.
    let state = unsafe { &mut *state_ptr };
    let seq = state.seq;
    if credit {
        match cgroup {
            Some(cgroup) => self::credit(state, tid, tgid, dying, cgroup),
            None => attribute(state_ptr, tid, tgid, dying),
        }
    } else {
        if take_delta(state) {
            add(
                &mut state.untracked,
                &state.now,
                global(&NUM_COUNTERS) as usize,
            );
        }
        if dying {
            retire_unread(state, tid, tgid);
        }
    }
    // SAFETY: as above; `attribute` is done with it.
    let state = unsafe { &mut *state_ptr };
    let owner = if state.seq == seq {
        // No reading (failed, or frozen): the next delta spans whatever runs until then.
        reading_owner::pack(reading_owner::NONE, 0)
    } else if next_traced {
        reading_owner::pack(reading_owner::TRACED, next_tid)
    } else {
        reading_owner::pack(reading_owner::UNTRACED, next_tid)
    };
    // SAFETY: this CPU's entry; programs on a CPU do not nest (see `attribute`).
    unsafe { (*switch_state()).owner = owner };
}

/// `settle` for a reading that is not a context switch (flush, a self-move to another cgroup):
/// `current` keeps running, and whether it is traced is decided again (it may have just moved
/// into or out of a chosen cgroup).
#[inline(always)]
pub(crate) fn settle_current(state: *mut CpuState, tid: u32, tgid: u32, cgroup: Option<u64>) {
    // SAFETY: this CPU's entry; programs on a CPU do not nest (see `attribute`).
    let owner = unsafe { (*switch_state()).owner };
    let credit = delta_belongs_to(owner, tid, tgid);
    count_unseen_arrival(state, owner, credit);
    let traced = current_is_traced(tid, tgid);
    settle(state, tid, tgid, false, cgroup, credit, tid, traced);
}

/// A task dying at a switch that takes no reading for it: its entry, if it has one, is still
/// handed to user space and freed (its counts since the last reading go to `untracked`).
#[inline(always)]
fn retire_unread(state: &mut CpuState, tid: u32, tgid: u32) {
    if tid == 0 {
        return;
    }
    if let Some(task) = TASKS.get_ptr_mut(&tid) {
        // SAFETY: a map value pointer; only the CPU the task runs on writes it.
        retire(state, tid, tgid, unsafe { &mut *task });
    }
}

/// A task's tid and tgid, read from its `struct task_struct` (a sched_switch argument) at
/// `pid_field`, the offset user space found in the kernel's BTF (`kernel_offset::TASK_PID`).
#[inline(always)]
fn task_ids(task: u64, pid_field: u64) -> (u32, u32) {
    // `task` is a BTF pointer (tp_btf argument) and the offset a constant of the frozen
    // .rodata, so the verifier checks these loads against `struct task_struct` and turns them
    // into fault-safe loads: cheaper than a `bpf_probe_read_kernel` call on every switch.
    // `tgid` follows `pid` (user space checks it).
    let pid = task.wrapping_add(pid_field);
    // SAFETY: as above; a bad address reads as zero instead of faulting.
    unsafe {
        (
            core::ptr::read_volatile(pid as *const u32),
            core::ptr::read_volatile((pid + 4) as *const u32),
        )
    }
}

/// Whether the arriving task `next` (`tid`, from `task_ids`; `flags`: its process's
/// `PID_FLAGS`) is traced.
#[inline(always)]
fn arriving(next: u64, tid: u32, flags: u64) -> bool {
    // The tgid alone: a task with an entry but no tracked tgid (the last thread of an exiting
    // process) keeps its tgid tracked until it is gone (`TRACKED_EXITING`). First, as the
    // skip path of `-p` ends here; idle (tgid 0) is never tracked.
    if global(&FILTER_TGIDS) != 0 && flags & pid_flags::TRACKED == 0 {
        return false;
    }
    tid != 0 && (global(&FILTER_CGROUPS) == 0 || task_in_chosen_cgroup(next))
}

/// The same decision as `arriving`, for `current`.
#[inline(always)]
pub(crate) fn current_is_traced(tid: u32, tgid: u32) -> bool {
    if tid == 0 || (global(&FILTER_TGIDS) != 0 && !has_entry_or_is_tracked(tid, tgid)) {
        return false;
    }
    global(&FILTER_CGROUPS) == 0 || in_chosen_cgroup()
}

/// Tracked by process, or given an entry by the exit hook after its process stopped being
/// tracked (see `process_exit`): `credit` attributes to both.
#[inline(always)]
fn has_entry_or_is_tracked(tid: u32, tgid: u32) -> bool {
    // SAFETY: tested for presence only.
    is_tracked(tgid) || unsafe { TASKS.get(&tid) }.is_some()
}

/// `bpf_probe_read_kernel` of a `T` at `base` + the kernel offset `index`.
#[inline(always)]
fn read_kernel<T>(base: u64, index: usize) -> Option<T> {
    let address = base.wrapping_add(kernel_field_offset(index));
    // SAFETY: the helper checks the address; a bad one is an error, not a fault.
    unsafe { bpf_probe_read_kernel(address as *const T) }.ok()
}

/// `in_chosen_cgroup` for any task: what `bpf_get_current_ancestor_cgroup_id` does for `current`
/// (kernel/bpf/helpers.c: `task_dfl_cgroup`, `cgroup_ancestor`, `cgroup_id`), through
/// `task->cgroups->dfl_cgrp->ancestors[level]->kn->id`.
#[inline(always)]
fn task_in_chosen_cgroup(task: u64) -> bool {
    // A field that cannot be read answers "not in a chosen cgroup".
    chosen_ancestor_of(task).unwrap_or(false)
}

#[inline(always)]
fn chosen_ancestor_of(task: u64) -> Option<bool> {
    let css_set = read_kernel::<u64>(task, kernel_offset::TASK_CGROUPS)?;
    let cgroup = read_kernel::<u64>(css_set, kernel_offset::CSS_SET_DFL_CGRP)?;
    let level = read_kernel::<i32>(cgroup, kernel_offset::CGROUP_LEVEL)?;
    let mut at = 0;
    while at <= MAX_CGROUP_LEVEL && at <= level {
        let slot = cgroup.wrapping_add(8 * at as u64);
        let ancestor = read_kernel::<u64>(slot, kernel_offset::CGROUP_ANCESTORS)?;
        let node = read_kernel::<u64>(ancestor, kernel_offset::CGROUP_KN)?;
        let id = read_kernel::<u64>(node, kernel_offset::KERNFS_NODE_ID)?;
        // SAFETY: tested for presence only.
        if unsafe { CGROUP_FILTER.get(&id) }.is_some() {
            return Some(true);
        }
        at += 1;
    }
    Some(false)
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

/// `power:cpu_idle`, with the cgroup-switch trigger only: the `cgroup-switches` event never
/// runs its program for a switch away from the idle task (measured on Linux 6.18: `perf record
/// -e cgroup-switches` has no sample whose task is the idle task), so without this the time a
/// CPU idles would go to the cgroup of the next task that leaves it. The CPU is read when it
/// enters idle (what ran since the last reading was the root cgroup's: a switch from any other
/// cgroup to idle is a cgroup switch, read then) and when it leaves idle (that was idle).
/// Both run on an idle CPU, where the reading costs nothing anyone waits for but the wake-up.
#[tracepoint(category = "power", name = "cpu_idle")]
pub fn cpu_idle(ctx: TracePointContext) -> i32 {
    let Some(idle_state) = record_field::<u32>(&ctx, &IDLE_STATE_OFFSET) else {
        return 0;
    };
    let Some(state) = CPU_STATE.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: as in `attribute`: this runs with interrupts off in the idle loop.
    let state = unsafe { &mut *state };
    if idle_state == PWR_EVENT_EXIT {
        credit(state, 0, 0, false, 0);
    } else {
        // SAFETY: a helper without preconditions; the idle task is in the root cgroup.
        let root = unsafe { bpf_get_current_cgroup_id() };
        credit(state, UNKNOWN_TASK, UNKNOWN_TASK, false, root);
    }
    0
}

/// `state` of `power:cpu_idle` when the CPU leaves idle (`PWR_EVENT_EXIT`, `(u32)-1`).
const PWR_EVENT_EXIT: u32 = u32::MAX;

/// A task id no task has: deltas of root-cgroup tasks whose ids are not known (`cpu_idle`). Not
/// tracked under `-p`, and never given an entry (the cgroup-switch trigger keeps none).
const UNKNOWN_TASK: u32 = u32::MAX;

/// Run by user space on each CPU (BPF_PROG_TEST_RUN with BPF_F_TEST_RUN_ON_CPU), never attached:
/// gives the running task its counts up to now, so reports are complete even for a task that
/// never leaves its CPU. arg 0 is a `flush_mode`.
#[raw_tracepoint(tracepoint = "topdown_flush")]
pub fn flush(ctx: RawTracePointContext) -> i32 {
    let Some(state) = CPU_STATE.get_ptr_mut(0) else {
        return flush_result::NO_STATE as i32;
    };
    let mode: u64 = ctx.arg(0);
    let (tid, tgid) = current_ids();
    if global(&SKIP_UNTRACED) != 0 {
        if !interrupted_probe(state) {
            settle_current(state, tid, tgid, None);
        }
    } else {
        attribute(state, tid, tgid, false);
    }
    // SAFETY: as in `attribute`.
    let state = unsafe { &mut *state };
    if mode == flush_mode::FINAL {
        state.frozen = 1;
    }
    if state.initialized == 0 {
        warn!(&ctx, "topdown: counters unreadable on this CPU at flush");
        return flush_result::UNREADABLE as i32;
    }
    flush_result::DONE as i32
}
