//! Process hooks: following forks and exits of tracked processes, and cgroup migrations.

use aya_ebpf::{
    macros::{fentry, kprobe, tracepoint},
    programs::{FEntryContext, ProbeContext, TracePointContext},
};
use aya_log_ebpf::warn;
use topdown_common::FIELD_ABSENT;

use crate::{
    counters::{attribute_interruptible, current_ids, is_tracked},
    maps::{
        EXIT_GROUP_DEAD_OFFSET, FILTER_TGIDS, FOLLOW_FORKS, FORK_CHILD_PID_OFFSET, TRACKED, global,
    },
};

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

// ---- Cgroup migrations -----------------------------------------------------------------------
//
// A reading credits its delta to the cgroup `current` is in at that moment. A task that moves
// itself (`echo $$ > cgroup.procs; exec ...`, as container runtimes and systemd do) would have
// everything since its CPU's last reading credited to the cgroup it moves to; so the counters
// are read just before the move, for the task doing it, which is still in the cgroup it leaves.
//
// `cgroup_attach_task(struct cgroup *dst_cgrp, struct task_struct *leader, bool threadgroup)`
// (kernel/cgroup/cgroup.c) runs before any task of the move changes cgroup; the
// `cgroup:cgroup_attach_task` tracepoint fires after `cgroup_migrate`, too late. The hook reads
// for the writer whoever it moves: a reading for the running task is exact at any instant, and it
// covers a thread that moves its whole process (`leader` is then another thread) without reading
// `task_struct` fields. A task moved while asleep needs nothing: its counts were credited at its
// switch-out (with the cgroup-switches trigger too: the event fires when the cgroups of the tasks
// switching differ). Limit: a task moved by another process while it runs on another CPU is not
// split, since a CPU's counters can only be read on that CPU: its counts between its last reading
// and the move go to the cgroup it is in at its next one, the new one.

/// fentry (BPF trampoline): the cheaper hook, where the kernel has it.
#[fentry(function = "cgroup_attach_task")]
pub fn migrate_fentry(_ctx: FEntryContext) -> i32 {
    let (tid, tgid) = current_ids();
    attribute_interruptible(tid, tgid);
    0
}

/// kprobe fallback on the same function (kernels without BPF trampolines).
#[kprobe]
pub fn migrate_kprobe(_ctx: ProbeContext) -> u32 {
    let (tid, tgid) = current_ids();
    attribute_interruptible(tid, tgid);
    0
}
