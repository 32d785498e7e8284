//! Process hooks: following forks and exits of tracked processes, and cgroup migrations.

use aya_ebpf::{
    bindings::BPF_NOEXIST, helpers::bpf_get_current_cgroup_id, macros::tracepoint,
    programs::TracePointContext,
};
use aya_log_ebpf::warn;

use crate::{
    counters::{
        TRACKED_EXITING, credit, current_ids, interrupted_probe, is_tracked, remember_cgroup,
        settle_current,
    },
    maps::{
        ATTACH_DST_ID_OFFSET, ATTACH_DST_ROOT_OFFSET, ATTACH_PID_OFFSET, BY_CGROUP, BY_TASK,
        CPU_STATE, EXIT_GROUP_DEAD_OFFSET, FILTER_TGIDS, FOLLOW_FORKS, FORK_CHILD_PID_OFFSET,
        PROCESS_CGROUPS, RENAME_COMM_OFFSET, RENAME_PID_OFFSET, SKIP_UNTRACED, TASKS, TRACKED,
        ZERO_TASK, global, record_field, track, untrack,
    },
};

/// Classic `sched:sched_process_fork`: track children of tracked processes (`-- CMD`), and
/// record a new process's cgroup (its parent's) for `cgroup_attach`. Fires before the child can
/// run, so none of its counts are missed.
#[tracepoint(category = "sched", name = "sched_process_fork")]
pub fn process_fork(ctx: TracePointContext) -> i32 {
    let Some(child) = record_field::<i32>(&ctx, &FORK_CHILD_PID_OFFSET) else {
        return 0;
    };
    let child = child as u32;
    if global(&BY_CGROUP) != 0 {
        // A new thread's entry is never read (entries are per process) and ages out of the LRU.
        // SAFETY: a helper without preconditions.
        remember_cgroup(child, unsafe { bpf_get_current_cgroup_id() });
    }
    if global(&FOLLOW_FORKS) == 0 {
        return 0;
    }
    let (_, tgid) = current_ids();
    if is_tracked(tgid) && !track(child) {
        warn!(
            &ctx,
            "topdown: tracked-process map full, child {} not followed", child
        );
    }
    0
}

/// Classic `sched:sched_process_exit`: forget a tracked process once its last thread exits (with
/// `SKIP_UNTRACED`, once that thread is gone: see `TRACKED_EXITING`), so a recycled pid is not
/// tracked by mistake. That thread's last switch-out comes after this, so it
/// gets its task entry here: tasks with entries keep being attributed, and a single-threaded
/// command that never switched out before exiting would otherwise count as untracked.
#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn process_exit(ctx: TracePointContext) -> i32 {
    if global(&FILTER_TGIDS) == 0 {
        return 0;
    }
    let group_dead = record_field::<u8>(&ctx, &EXIT_GROUP_DEAD_OFFSET).unwrap_or(0);
    if group_dead == 0 {
        return 0;
    }
    let (tid, tgid) = current_ids();
    if !is_tracked(tgid) {
        return 0;
    }
    if global(&BY_TASK) != 0
        && let Some(zero) = ZERO_TASK.get_ptr(0)
    {
        // SAFETY: a per-CPU map value nobody writes: all zeroes. An existing entry stays.
        let _ = TASKS.insert(&tid, unsafe { &*zero }, BPF_NOEXIST as u64);
    }
    if global(&SKIP_UNTRACED) != 0 {
        // Still traced at its switches (sched_switch looks up the tgid only, not the task
        // entry: one map lookup less per switch) until its last thread's final switch-out,
        // where `retire` forgets it.
        let _ = TRACKED.insert(&tgid, &TRACKED_EXITING, 0);
    } else {
        untrack(tgid);
    }
    0
}

/// Classic `task:task_rename` (`__set_task_comm`: exec, `prctl(PR_SET_NAME)`, a write to
/// `/proc/PID/comm`), attached when tasks have entries: keeps a task's name in its entry,
/// which takes the name only when it is made (`counters::credit`). The renamed task need not
/// be `current` (a write to another task's `comm`), hence the record's `pid`. The name is a
/// few bytes of the entry no reading writes, so a rename on another CPU while the task runs
/// cannot tear its counts.
#[tracepoint(category = "task", name = "task_rename")]
pub fn task_rename(ctx: TracePointContext) -> i32 {
    let Some(pid) = record_field::<i32>(&ctx, &RENAME_PID_OFFSET) else {
        return 0;
    };
    let Some(task) = TASKS.get_ptr_mut(&(pid as u32)) else {
        return 0;
    };
    if let Some(comm) = record_field::<[u8; 16]>(&ctx, &RENAME_COMM_OFFSET) {
        // SAFETY: a live map value.
        unsafe { (*task).comm = comm };
    }
    0
}

// ---- Cgroup migrations -----------------------------------------------------------------------
//
// A reading credits its delta to the cgroup `current` is in at that moment. A process that moves
// itself (`echo $$ > cgroup.procs; exec ...`, as container runtimes and systemd do) would have
// everything since its CPU's last reading (with the cgroup-switch trigger: since the CPU's last
// cgroup switch, other tasks and idle included) credited to the cgroup it moves to. So when it
// moves, the counters are read and the delta goes to the cgroup it left.
//
// The classic `cgroup:cgroup_attach_task` tracepoint fires in the mover's context right after
// the move (kernel/cgroup/cgroup.c, `cgroup_attach_task` -> TRACE_CGROUP_PATH, with interrupts
// off under `trace_cgroup_path_lock`), so `current` is already in the new cgroup; the one it
// left is the process's entry in `PROCESS_CGROUPS`. The tracepoint is used instead of a kprobe
// or fentry before the move because it exists on every kernel with tracepoints: kprobes and
// BPF trampolines are compiled out or forbidden on some (these test VMs among them).
//
// Limit: a process moved by another process while it runs on another CPU is not split, since a
// CPU's counters can only be read on that CPU: its counts between its last reading and the move
// go to the cgroup it is in at its next reading, the new one. A process moved while asleep needs
// nothing: its counts were credited at its switch-out.

/// Classic `cgroup:cgroup_attach_task`, only attached when cgroups are counted.
#[tracepoint(category = "cgroup", name = "cgroup_attach_task")]
pub fn cgroup_attach(ctx: TracePointContext) -> i32 {
    let (Some(root), Some(destination), Some(moved)) = (
        record_field::<i32>(&ctx, &ATTACH_DST_ROOT_OFFSET),
        record_field::<u64>(&ctx, &ATTACH_DST_ID_OFFSET),
        record_field::<i32>(&ctx, &ATTACH_PID_OFFSET),
    ) else {
        return 0;
    };
    // Hierarchy 0 is cgroup v2; the others are v1 hierarchies, whose moves do not change the
    // v2 cgroup.
    if root != 0 {
        return 0;
    }
    let moved = moved as u32;
    let (tid, tgid) = current_ids();
    // `pid` is the moved thread group's leader (cgroup.procs) or the moved thread
    // (cgroup.threads).
    if moved != tgid && moved != tid {
        // Moved by someone else: from now on it is in `destination`.
        remember_cgroup(moved, destination);
        return 0;
    }
    let Some(state) = CPU_STATE.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: the value is copied out at once.
    let left = unsafe { PROCESS_CGROUPS.get(&tgid) }.copied();
    if global(&SKIP_UNTRACED) != 0 {
        // Always a reading: the task may have just entered or left a chosen cgroup (`-G`), and
        // from here on its counts are judged by where it is now.
        if !interrupted_probe(state) {
            if left.is_none() {
                // SAFETY: as below.
                unsafe { (*state).unsplit_migrations += 1 };
            }
            settle_current(state, tid, tgid, Some(left.unwrap_or(destination)));
        }
    } else {
        // SAFETY: a per-CPU map value; this program runs with interrupts off, like the switches.
        let state = unsafe { &mut *state };
        match left {
            Some(left) if left != destination => credit(state, tid, tgid, false, left),
            Some(_) => {}
            None => state.unsplit_migrations += 1,
        }
    }
    remember_cgroup(tgid, destination);
    0
}
