//! The ABI shared by the eBPF programs and user space.
//!
//! Everything here is `#[repr(C)]` plain data: the kernel side writes it into BPF maps, user space
//! reads it back with aya. Interpretation (which counter is which event, what the numbers mean)
//! lives entirely in user space; the kernel side only knows "counter slot k of this CPU".
#![no_std]

/// Counter slots per CPU. A model uses the first `n` (set at load time through the
/// `NUM_COUNTERS` global), timing slots of rotating groups included. The largest model, Ice
/// Lake's level 2 with heavy/light operations, takes 26; more than 32 would push a shadow
/// stack's frame array further past what one allocation of a thread's stack should cost.
pub const MAX_COUNTERS: usize = 32;

/// Where each counter slot's value comes from: the fd at index `fd_slot` of this CPU's part of
/// the `COUNTERS` array, and which of the helper's three values (count, enabled or running time).
/// Rotating counter groups (more events than the PMU has counters) need their enabled and running
/// times per task to be scaled in user space, so those times get slots of their own.
pub mod slot_source {
    pub const FIELD_COUNT: u32 = 0;
    pub const FIELD_ENABLED: u32 = 1;
    pub const FIELD_RUNNING: u32 = 2;

    pub const fn encode(fd_slot: u32, field: u32) -> u32 {
        (fd_slot & 0xff) | (field & 0x3) << 8
    }

    pub const fn fd_slot(source: u32) -> u32 {
        source & 0xff
    }

    pub const fn field(source: u32) -> u32 {
        (source >> 8) & 0x3
    }

    /// Slot `i` reads fd `i`'s count: the layout when no group rotates.
    pub const fn identity() -> [u32; super::MAX_COUNTERS] {
        let mut sources = [0; super::MAX_COUNTERS];
        let mut slot = 0;
        while slot < super::MAX_COUNTERS {
            sources[slot] = slot as u32;
            slot += 1;
        }
        sources
    }
}

/// `TASK_DEAD` in `task_struct::__state` (include/linux/sched.h). `sched_switch` passes
/// `prev_state`; a task switching out with this bit set will never run again, which is the
/// moment to hand its totals to user space and free its map entry.
pub const TASK_DEAD: u32 = 0x0080;

/// Offset value meaning "this tracepoint field does not exist on the running kernel".
pub const FIELD_ABSENT: u32 = u32::MAX;

/// Names of the maps and programs, shared so neither side can drift.
pub mod names {
    pub const COUNTERS: &str = "COUNTERS";
    pub const CPU_STATE: &str = "CPU_STATE";
    pub const GENERATIONS: &str = "GENERATIONS";
    pub const TASKS: &str = "TASKS";
    pub const TRACKED: &str = "TRACKED";
    pub const EXITS: &str = "EXITS";

    pub const PROG_SCHED_SWITCH: &str = "sched_switch";
    pub const PROG_FLUSH: &str = "flush";
    pub const PROG_FORK: &str = "process_fork";
    pub const PROG_EXIT: &str = "process_exit";
    pub const PROG_FUNC_ENTRY: &str = "func_entry";
    pub const PROG_FUNC_RETURN: &str = "func_return";
    pub const PROG_FUNC_ENTRY_MULTI: &str = "func_entry_multi";
    pub const PROG_FUNC_RETURN_MULTI: &str = "func_return_multi";
    pub const PROG_FUNC_EXIT: &str = "func_exit";
    pub const PROG_FUNC_EXIT_MULTI: &str = "func_exit_multi";
    pub const PROG_FUNC_CATCH: &str = "func_catch";
    pub const PROG_FUNC_CATCH_MULTI: &str = "func_catch_multi";
    pub const PROG_THREAD_EXIT: &str = "thread_exit";
    pub const PROG_GO_ENTRY: &str = "go_entry";
    pub const PROG_GO_ENTRY_MULTI: &str = "go_entry_multi";
    pub const PROG_GO_EXIT: &str = "go_exit";
    pub const PROG_GO_EXIT_MULTI: &str = "go_exit_multi";
    pub const PROG_GO_RUNTIME: &str = "go_runtime";
    pub const PROG_GO_RUNTIME_MULTI: &str = "go_runtime_multi";
    pub const GO_STACKS: &str = "GO_STACKS";
    pub const STACKS: &str = "STACKS";
    pub const CALLS: &str = "CALLS";
    pub const PROBE_STATS: &str = "PROBE_STATS";
    pub const INDIRECT_JUMPS: &str = "INDIRECT_JUMPS";
    pub const RETURN_TARGETS: &str = "RETURN_TARGETS";
    pub const CGROUPS: &str = "CGROUPS";
    pub const CGROUP_FILTER: &str = "CGROUP_FILTER";
    pub const GLOBAL_BY_CGROUP: &str = "BY_CGROUP";
    pub const GLOBAL_BY_TASK: &str = "BY_TASK";
    pub const PROG_CGROUP_SWITCH: &str = "cgroup_switch";
    pub const PROG_CGROUP_ATTACH: &str = "cgroup_attach";
    pub const PROG_CPU_IDLE: &str = "cpu_idle";
    pub const PROG_TASK_RENAME: &str = "task_rename";
    pub const PROCESS_CGROUPS: &str = "PROCESS_CGROUPS";
    pub const GLOBAL_FILTER_CGROUPS: &str = "FILTER_CGROUPS";
    pub const GLOBAL_SPLIT_FUNCTIONS_BY_PROCESS: &str = "SPLIT_FUNCTIONS_BY_PROCESS";
    pub const HISTOGRAMS: &str = "HISTOGRAMS";
    pub const THREAD_EXIT_FIELDS: &str = "THREAD_EXIT_FIELDS";
    pub const GLOBAL_WEIGHT_SLOT: &str = "WEIGHT_SLOT";
    pub const PROG_USDT_SITE: &str = "usdt_site";
    pub const PROG_USDT_SITE_MULTI: &str = "usdt_site_multi";
    pub const USDT_SITES: &str = "USDT_SITES";
    pub const USDT_HITS: &str = "USDT_HITS";
    pub const SPAN_STACKS: &str = "SPAN_STACKS";
    pub const SPAN_TOTALS: &str = "SPAN_TOTALS";
    pub const SPAN_TEXTS: &str = "SPAN_TEXTS";
    pub const SPAN_KINDS: &str = "SPAN_KINDS";
    pub const SPAN_STATS: &str = "SPAN_STATS";

    /// Every program of the object, for checks that must cover them all (the kernel keeps the
    /// first 15 bytes of each name: `BPF_OBJ_NAME_LEN` is 16 with the NUL).
    pub const PROGRAMS: [&str; 25] = [
        PROG_SCHED_SWITCH,
        PROG_FLUSH,
        PROG_FORK,
        PROG_EXIT,
        PROG_TASK_RENAME,
        PROG_CGROUP_SWITCH,
        PROG_CGROUP_ATTACH,
        PROG_CPU_IDLE,
        PROG_FUNC_ENTRY,
        PROG_FUNC_RETURN,
        PROG_FUNC_ENTRY_MULTI,
        PROG_FUNC_RETURN_MULTI,
        PROG_FUNC_EXIT,
        PROG_FUNC_EXIT_MULTI,
        PROG_FUNC_CATCH,
        PROG_FUNC_CATCH_MULTI,
        PROG_THREAD_EXIT,
        PROG_USDT_SITE,
        PROG_USDT_SITE_MULTI,
        PROG_GO_ENTRY,
        PROG_GO_ENTRY_MULTI,
        PROG_GO_EXIT,
        PROG_GO_EXIT_MULTI,
        PROG_GO_RUNTIME,
        PROG_GO_RUNTIME_MULTI,
    ];

    pub const GLOBAL_NUM_COUNTERS: &str = "NUM_COUNTERS";
    pub const GLOBAL_SLOT_SOURCES: &str = "SLOT_SOURCES";
    pub const GLOBAL_FILTER_TGIDS: &str = "FILTER_TGIDS";
    pub const GLOBAL_PID_FLAGS: &str = "PID_FLAGS";
    pub const GLOBAL_FOLLOW_FORKS: &str = "FOLLOW_FORKS";
    pub const GLOBAL_FORK_CHILD_PID_OFFSET: &str = "FORK_CHILD_PID_OFFSET";
    pub const GLOBAL_EXIT_GROUP_DEAD_OFFSET: &str = "EXIT_GROUP_DEAD_OFFSET";
    pub const GLOBAL_ATTACH_DST_ROOT_OFFSET: &str = "ATTACH_DST_ROOT_OFFSET";
    pub const GLOBAL_ATTACH_DST_ID_OFFSET: &str = "ATTACH_DST_ID_OFFSET";
    pub const GLOBAL_ATTACH_PID_OFFSET: &str = "ATTACH_PID_OFFSET";
    pub const GLOBAL_IDLE_STATE_OFFSET: &str = "IDLE_STATE_OFFSET";
    pub const GLOBAL_SKIP_UNTRACED: &str = "SKIP_UNTRACED";
    pub const GLOBAL_KERNEL_OFFSETS: &str = "KERNEL_OFFSETS";
    pub const GLOBAL_COMM_AT_EVERY_READING: &str = "COMM_AT_EVERY_READING";
    pub const GLOBAL_RENAME_PID_OFFSET: &str = "RENAME_PID_OFFSET";
    pub const GLOBAL_RENAME_COMM_OFFSET: &str = "RENAME_COMM_OFFSET";
}

/// What the `flush` program returns.
pub mod flush_result {
    pub const DONE: u32 = 0;
    /// The per-CPU state map has no entry (cannot happen with a loaded object).
    pub const NO_STATE: u32 = 1;
    /// The CPU's counters could not be read: nothing was attributed.
    pub const UNREADABLE: u32 = 2;
}

/// What the `flush` program does when user space runs it on a CPU.
pub mod flush_mode {
    /// Attribute the delta since the last reading to the task running now.
    pub const ATTRIBUTE: u64 = 0;
    /// Attribute, then freeze the CPU: later switches and flushes change nothing, so user space
    /// can read a final, exactly consistent state.
    pub const FINAL: u64 = 1;
}

/// Per-CPU bookkeeping (a one-entry `PERCPU_ARRAY`). Only the CPU it belongs to writes it.
///
/// Conservation: on every CPU, `total == Σ task deltas + idle + untracked + dropped`, for every
/// counter, at every instant the CPU is not inside a program.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CpuState {
    /// Counter values at the last attribution point (switch or flush). For the task running now,
    /// its virtual counters are `task.counters + (reading now - last)`.
    pub last: [u64; MAX_COUNTERS],
    /// Scratch space for the reading in progress (keeps it off the 512-byte BPF stack).
    pub now: [u64; MAX_COUNTERS],
    /// Everything attributed on this CPU since its baseline reading.
    pub total: [u64; MAX_COUNTERS],
    /// The idle task (pid 0).
    pub idle: [u64; MAX_COUNTERS],
    /// Tasks outside the `-p`/`-- CMD` filter.
    pub untracked: [u64; MAX_COUNTERS],
    /// Deltas of tasks that found the task map full.
    pub dropped: [u64; MAX_COUNTERS],
    /// Deltas whose cgroup found the cgroup map full (`--by cgroup`).
    pub cgroup_dropped: [u64; MAX_COUNTERS],
    /// Leader's enabled/running times at the last reading.
    pub last_enabled_ns: u64,
    pub last_running_ns: u64,
    /// Successful readings.
    pub readings: u64,
    /// Readings where the group had not been running for the whole interval (multiplexed or
    /// descheduled pinned group).
    pub not_running: u64,
    /// Readings that failed (e.g. -EBUSY for a pinned group in error state); their delta is
    /// attributed at the next successful reading.
    pub read_errors: u64,
    /// Task map insertions that failed because the map was full.
    pub task_map_full: u64,
    /// Cgroup map insertions that failed because the map was full.
    pub cgroup_map_full: u64,
    /// Exit records the ring buffer could not take (the entry stays, marked exited).
    pub exit_records_lost: u64,
    /// Bumped by every attribution. Function probes run preemptibly: they read it before and
    /// after computing a task's virtual counters and retry if a switch ran in between.
    pub seq: u64,
    /// Nonzero once the baseline reading has been taken.
    pub initialized: u32,
    /// Nonzero after the final flush: nothing on this CPU changes any more.
    pub frozen: u32,
    /// The `GENERATIONS` value this CPU's baseline was taken under: user space bumps it when it
    /// re-opens the CPU's counters (CPU hotplug), and a new value means "re-baseline".
    pub generation: u32,
    pub _pad: u32,
    /// Processes that moved themselves to another cgroup while the cgroup they left was not
    /// known (`PROCESS_CGROUPS` had no entry): their counts since the CPU's last reading went
    /// to the cgroup they moved to.
    pub unsplit_migrations: u64,
    /// With `SKIP_UNTRACED`: switches sched_switch did not report on this CPU, found at the
    /// next one it did, whose `prev` is not the task the one before saw arrive (see
    /// `reading_owner`). Several in a row count once.
    pub unseen_switches: u64,
    /// Nonzero while a function probe takes a reading (`SKIP_UNTRACED`): probes run with
    /// interrupts on and, on preemptible kernels, preemptibly, so a switch or flush that
    /// interrupts one leaves the state alone and sets it to 2, which tells the probe.
    pub busy: u64,
    /// With `SKIP_UNTRACED`: readings credited to a traced task found running while no reading
    /// covered its arrival (`reading_owner::NONE`: it came in through a switch sched_switch did
    /// not report, after switches between untraced tasks that took none). What ran on the CPU
    /// since its last reading, untraced tasks included, is in that task's counts.
    pub unseen_arrivals: u64,
}

impl CpuState {
    pub const ZERO: Self = Self {
        last: [0; MAX_COUNTERS],
        now: [0; MAX_COUNTERS],
        total: [0; MAX_COUNTERS],
        idle: [0; MAX_COUNTERS],
        untracked: [0; MAX_COUNTERS],
        dropped: [0; MAX_COUNTERS],
        cgroup_dropped: [0; MAX_COUNTERS],
        last_enabled_ns: 0,
        last_running_ns: 0,
        readings: 0,
        not_running: 0,
        read_errors: 0,
        task_map_full: 0,
        cgroup_map_full: 0,
        exit_records_lost: 0,
        seq: 0,
        initialized: 0,
        frozen: 0,
        generation: 0,
        _pad: 0,
        unsplit_migrations: 0,
        unseen_switches: 0,
        busy: 0,
        unseen_arrivals: 0,
    };
}

/// Most CPUs a kernel can have: `NR_CPUS` is at most 8192 (x86's `MAXSMP`; arm64 allows 4096).
pub const MAX_CPUS: usize = 8192;

/// With `SKIP_UNTRACED`, what sched_switch's skip path reads and writes for a CPU, in a global
/// array indexed by CPU number (`SWITCH_STATES`), not in `CpuState`: the CPU's number is three
/// inlined instructions, a per-CPU map's lookup fifteen, at every context switch.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SwitchState {
    /// Whose counts the delta since the CPU's last reading holds, a `reading_owner::pack`ed
    /// kind and tid in one word, so a function probe can claim it with one compare-and-swap.
    pub owner: u64,
    /// The task the last sched_switch on this CPU saw arrive.
    pub arrived: unseen_leavers::Arrival,
    /// To 32 bytes: a CPU's entry is found with a shift.
    pub _pad: u64,
}

/// A task's accumulated on-CPU counter deltas (value of the `TASKS` hash, keyed by tid).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TaskCounters {
    pub counters: [u64; MAX_COUNTERS],
    /// Times the task was switched out (or flushed) with counts attributed.
    pub switches: u64,
    pub tgid: u32,
    /// Nonzero when the task died but its exit record could not be sent; user space collects
    /// and deletes such entries.
    pub exited: u32,
    /// `comm` at the last switch-out (it changes at exec).
    pub comm: [u8; 16],
}

impl TaskCounters {
    pub const ZERO: Self = Self {
        counters: [0; MAX_COUNTERS],
        switches: 0,
        tgid: 0,
        exited: 0,
        comm: [0; 16],
    };
}

/// With filters (`-p`, `-- CMD`, `-G`) the sched_switch program reads the counters only at
/// switches where the task leaving or the task arriving is traced, and when a CPU goes idle.
/// Each CPU remembers whose counts the delta since its last reading holds (`SwitchState::owner`):
/// a traced task leaving is credited only if it alone ran since the last reading; any other
/// delta (untraced tasks, idle, or several tasks) goes to `untracked`.
///
/// Not every context switch fires `sched_switch`. Measured on this project's VM kernel
/// (6.18.44-fc, a PVM guest): `/proc/stat` `ctxt` (the scheduler's own switch count) grew 3-15%
/// more than the `sched_switch` events an ftrace instance recorded over the same seconds, with
/// no ring-buffer loss; ftrace and topdown's program missed the same switches; all of them were
/// switches away from the idle task (about half of its switch-outs) or from PID 1's threads
/// (none of their switch-outs fired). The task that arrives at such a switch runs without its
/// switch-in being read. `UNTRACED` makes that recoverable: when the last reading was taken as
/// an untraced task (or idle) arrived, and a traced task is found running instead (at its next
/// switch-out, a flush, or one of its function probes), the delta since that reading is the
/// untraced task's tail and the traced one's own stretch, which is credited to the traced task
/// (what reading at every switch does with the same unseen switch).
///
/// That recovery needs a reading taken as the leaver arrived, and a switch between untraced
/// tasks takes none. So the CPU also remembers the task the last sched_switch saw arrive
/// (`SwitchState::arrived`): when the next one's `prev` is another task, the one that arrived
/// left through a switch nobody saw (counted in `CpuState::unseen_switches`) and its process
/// is marked (`unseen_leavers`, shared by all CPUs); from then on every switch into a marked
/// process is read, so the next unseen switch out of it finds `UNTRACED` with it as the owner,
/// as `--read-every-switch` would (after several unseen switches in a row the traced task gets
/// the tails of all the tasks in between, as it would there too).
///
/// An unseen switch out of a process not marked yet, its first in the run, leaves `NONE`: no
/// reading was taken as it arrived. A traced task found running then (it arrived unseen, or
/// the reading at its arrival failed) is credited with the whole delta since the CPU's last
/// reading, the untraced tasks' stretches in it included, rather than losing its own stretch
/// to `untracked`; each such reading is counted in `CpuState::unseen_arrivals`, so a report
/// says how often a traced task's counts may hold other tasks' too.
pub mod reading_owner {
    /// Nothing known: the delta since the last reading spans several tasks (zeroed state).
    pub const NONE: u32 = 0;
    /// Only the packed tid, a traced task, ran since the last reading: its switch-out reads.
    pub const TRACED: u32 = 1;
    /// The last reading was taken as the packed tid, an untraced task or idle (tid 0),
    /// arrived; it alone ran since, as far as sched_switch saw.
    pub const UNTRACED: u32 = 2;

    /// `SwitchState::owner` of `kind` and `tid`. `NONE` is only ever packed with tid 0, so an
    /// owner of kind `NONE` is 0.
    pub const fn pack(kind: u32, tid: u32) -> u64 {
        ((kind as u64) << 32) | tid as u64
    }

    pub const fn kind(owner: u64) -> u32 {
        (owner >> 32) as u32
    }

    pub const fn tid(owner: u64) -> u32 {
        owner as u32
    }

    /// Whether the traced task `tid`, found running, takes the delta since the CPU's last
    /// reading although that reading did not see it arrive: the reading saw another, untraced
    /// task (or idle) arrive, or saw nobody arrive (`NONE`: switches that took no reading came
    /// between). Either way it came in through a switch sched_switch did not report. An owner
    /// that is `tid` itself, untraced, is not: that task was untraced when it arrived.
    pub const fn claimable_by(owner: u64, tid: u32) -> bool {
        match kind(owner) {
            UNTRACED => self::tid(owner) != tid,
            NONE => true,
            _ => false,
        }
    }
}

/// Values of the `SKIP_UNTRACED` global: whether sched_switch reads the counters at every
/// switch or only at those of traced tasks, and what tells a traced task at a switch.
pub mod skip_untraced {
    /// Every switch is read (no filter, `--read-every-switch`, or no offsets from the BTF).
    pub const OFF: u32 = 0;
    /// Only traced tasks' switches; a task is traced by its cgroup (`-G`), and by its
    /// process's `pid_flags::TRACKED` too if processes are filtered as well.
    pub const BY_TASK: u32 = 1;
    /// Only traced tasks' switches, processes filtered alone (`-p`, `-- CMD`): the arriving
    /// process's `pid_flags` word decides, so the skip path is one test of a few loads.
    pub const BY_PID_FLAGS: u32 = 2;

    /// The value for a session that skips untraced switches (`skip`), filtering processes
    /// (`by_process`) and cgroups (`by_cgroup`).
    pub const fn mode(skip: bool, by_process: bool, by_cgroup: bool) -> u32 {
        match (skip, by_process, by_cgroup) {
            (false, _, _) | (true, false, false) => OFF,
            (true, true, false) => BY_PID_FLAGS,
            (true, _, true) => BY_TASK,
        }
    }
}

/// Two flags per pid, in a global of the BPF object (`PID_FLAGS`): whether the pid is in
/// `TRACKED`, and whether its process left a CPU through a switch sched_switch did not report
/// (`unseen_leavers`). Both ask for a reading at a switch into the process, so sched_switch
/// tests them for every arriving task with one load from the global's address (a map would
/// need a lookup). Flags of pid `p` are bits `2 * (p % 32)` and up of word `p / 32`, for every
/// pid the kernel can give: `PID_MAX_LIMIT` (include/linux/threads.h), 4 Mi on 64-bit kernels,
/// whatever `/proc/sys/kernel/pid_max` is raised to (1 MiB).
pub mod pid_flags {
    /// `PID_MAX_LIMIT` on 64-bit kernels: pids are below it.
    pub const PID_LIMIT: u32 = 4 * 1024 * 1024;
    pub const WORDS: usize = PID_LIMIT as usize / 32;
    /// In `TRACKED` (a tracked tgid, or a tracked thread created by fork).
    pub const TRACKED: u64 = 1;
    /// The process left a CPU unseen: only ever set.
    pub const UNSEEN_LEAVER: u64 = 2;

    /// Index of `pid`'s word. Masked rather than checked: below `WORDS` for any pid the
    /// kernel gives, and the BPF verifier sees the bound.
    pub const fn word(pid: u32) -> usize {
        (pid as usize / 32) & (WORDS - 1)
    }

    /// Where `pid`'s flags start in its word.
    pub const fn shift(pid: u32) -> u32 {
        2 * (pid % 32)
    }

    /// `pid`'s flags in its word `word`.
    pub const fn of(word: u64, pid: u32) -> u64 {
        (word >> shift(pid)) & (TRACKED | UNSEEN_LEAVER)
    }

    /// Sets `flag` for `pid` in `words` (`WORDS` of them).
    pub fn set(words: &mut [u64], pid: u32, flag: u64) {
        if let Some(word) = words.get_mut(word(pid)) {
            *word |= flag << shift(pid);
        }
    }
}

/// Processes whose switch-outs sched_switch did not report (`reading_owner`), marked with
/// `pid_flags::UNSEEN_LEAVER` by tgid. By process, not by thread: on the test VM every thread of
/// PID 1 leaves unseen, so one thread's unseen switch covers its siblings too. Marks are only
/// ever set: a process that reuses a dead one's pid only costs a reading at each switch into it,
/// never accuracy, since a reading at a switch is what `--read-every-switch` takes anyway.
pub mod unseen_leavers {
    /// The task the last switch sched_switch reported on a CPU brought in
    /// (`SwitchState::arrived`).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Arrival {
        /// Its `struct task_struct`'s address (sched_switch's `next`): the next switch's `prev`
        /// is compared with it, so the skip path loads no id of `prev`. 0 before the first.
        pub task: u64,
        pub tid: u32,
        pub tgid: u32,
    }

    impl Arrival {
        pub const NONE: Self = Self {
            task: 0,
            tid: 0,
            tgid: 0,
        };

        /// A switch from the task at `prev_task` to `next`, seen on a CPU whose last
        /// reported arrival is `self`, which it updates: returns the tid and tgid of that
        /// arrival if `prev_task` is not it, i.e. it left through a switch sched_switch did not
        /// report. A task's address is its own until its `task_struct` is freed, an RCU grace
        /// period after its last switch-out, so `prev_task` equals `self.task` only if that
        /// task is leaving (or, once in a very long while, a task freed and reallocated at the
        /// same address arrived unseen too: one unseen switch then goes uncounted).
        #[inline(always)]
        pub fn note_switch(&mut self, prev_task: u64, next: Arrival) -> Option<(u32, u32)> {
            if self.task == prev_task {
                *self = next;
                return None;
            }
            let last = *self;
            *self = next;
            (last.task != 0).then_some((last.tid, last.tgid))
        }
    }
}

/// Indexes of `KERNEL_OFFSETS`: byte offsets of kernel structure fields, from the kernel's BTF,
/// that the sched_switch program reads the arriving task's ids and cgroup through.
/// Indexes of `THREAD_EXIT_FIELDS`: the offsets (from the kernel's BTF) through which the
/// thread-exit program tells a thread's own exit from one of its process's group exit.
pub mod thread_exit_field {
    /// `task_struct.signal` (`struct signal_struct *`).
    pub const TASK_SIGNAL: u32 = 0;
    /// `signal_struct.flags` (u32; `SIGNAL_GROUP_EXIT` is `0x4`, include/linux/sched/signal.h).
    pub const SIGNAL_FLAGS: u32 = 1;
    pub const COUNT: u32 = 2;
}

pub mod kernel_offset {
    /// `task_struct.pid`; `tgid` must follow it (both are read as one u64).
    pub const TASK_PID: usize = 0;
    /// `task_struct.cgroups` (`struct css_set *`).
    pub const TASK_CGROUPS: usize = 1;
    /// `css_set.dfl_cgrp` (`struct cgroup *`, the task's cgroup v2).
    pub const CSS_SET_DFL_CGRP: usize = 2;
    /// `cgroup.level` (int, 0 for the root).
    pub const CGROUP_LEVEL: usize = 3;
    /// `cgroup.ancestors` (`struct cgroup *[]`, indexed by level, the cgroup itself last).
    pub const CGROUP_ANCESTORS: usize = 4;
    /// `cgroup.kn` (`struct kernfs_node *`).
    pub const CGROUP_KN: usize = 5;
    /// `kernfs_node.id` (u64: the cgroup id).
    pub const KERNFS_NODE_ID: usize = 6;
    pub const COUNT: usize = 7;
}

/// Deepest cgroup level the `-G` filter looks through (ancestor levels 0..=this).
pub const MAX_CGROUP_LEVEL: i32 = 31;

/// A cgroup's accumulated counter deltas (value of `CGROUPS`, keyed by cgroup v2 id).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CgroupCounters {
    pub counters: [u64; MAX_COUNTERS],
}

/// Sent through the `EXITS` ring buffer when a task switches out for the last time.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TaskExit {
    pub tid: u32,
    pub _pad: u32,
    pub task: TaskCounters,
}

/// Shadow-stack depth per thread: the kernel's `MAX_URETPROBE_DEPTH`. Deeper calls get no
/// return probe from the kernel, so topdown does not push them either (counted as overflows).
pub const MAX_DEPTH: usize = 64;

/// `CallKey::parent` of a call with no probed caller.
pub const ROOT_FUNCTION: u32 = u32::MAX;

/// One active call of a probed function.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Frame {
    /// The function's id (the attach cookie user space gave it).
    pub function: u32,
    /// `frame_flags`: whether the function left by a tail call (the callee's entry then has
    /// this frame's stack pointer) and whether its own uretprobe closes it.
    pub tail_calling: u32,
    /// Stack pointer at entry: frames whose return was skipped (longjmp, exceptions) are found
    /// by comparing it with the stack pointer of later entries and returns.
    pub sp: u64,
    /// The thread's virtual counters at entry.
    pub entry: [u64; MAX_COUNTERS],
    /// Inclusive counts of probed callees that returned, for the exclusive figure.
    pub callees: [u64; MAX_COUNTERS],
    /// Probed callees that returned: each put its probes' whole cost into this frame, which
    /// user space subtracts (`topdown-user`'s `functions::calibration` module).
    pub callee_calls: u64,
}

/// Bits of `Frame::tail_calling`.
pub mod frame_flags {
    /// The function left by a tail call: a callee entering at this frame's stack pointer is
    /// its tail callee, not a sign that this frame's return was skipped.
    pub const TAIL_CALLING: u32 = 1;
    /// The function's returns are caught by a uretprobe, which fires for this frame itself
    /// after its tail callee returned (the kernel chains the two return instances); the tail
    /// callee's return must not close it too.
    pub const URETPROBE: u32 = 2;
    /// A Go function's prologue called `runtime.morestack` from this frame (its entry stack
    /// pointer): the function starts again from its first instruction once the stack has
    /// grown or the goroutine is rescheduled, and that second entry is the same call.
    pub const RESTARTING: u32 = 4;
}

/// An entry probe's attach cookie: the function id, and whether its returns are caught by a
/// uretprobe (bit 32).
pub mod entry_cookie {
    pub const URETPROBE: u64 = 1 << 32;

    pub const fn encode(function: u32, uretprobe: bool) -> u64 {
        function as u64 | if uretprobe { URETPROBE } else { 0 }
    }
}

/// A thread's virtual counters as `base + now` (the CPU's counters), valid while its CPU has
/// taken no reading since (`CpuState::seq` and the counters' generation unchanged, the same
/// CPU): the thread's accumulated counters (its task entry) less the CPU's last reading
/// (`CpuState::last`) change only at a reading. A probe whose thread was not switched out
/// since its last one skips the task entry's lookup (`virtual_counters_cached`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VirtualBase {
    /// Nonzero once filled.
    pub valid: u32,
    pub cpu: u32,
    pub seq: u64,
    pub generation: u32,
    pub _pad: u32,
    pub base: [u64; MAX_COUNTERS],
}

/// A thread's shadow stack (value of `STACKS`, keyed by tid).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ShadowStack {
    pub depth: u32,
    pub _pad: u32,
    /// Scratch for the probe in progress: per thread, so a preempted probe cannot have it
    /// overwritten by another thread's probe on the same CPU.
    pub now: [u64; MAX_COUNTERS],
    pub virtual_now: [u64; MAX_COUNTERS],
    /// What the thread's virtual counters are made of while its CPU takes no reading.
    pub base: VirtualBase,
    pub frames: [Frame; MAX_DEPTH],
}

/// Key of `CALLS`: one caller -> callee edge, per process if asked.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallKey {
    pub function: u32,
    /// The probed caller's id, or `ROOT_FUNCTION`.
    pub parent: u32,
    /// The process, or 0 when functions are not split by process.
    pub tgid: u32,
    pub _pad: u32,
}

/// Totals of one `CallKey`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CallStats {
    pub calls: u64,
    /// Of `calls`, those that ended by unwinding (an exception or panic caught above them, a
    /// thread cancelled or leaving through `pthread_exit`): closed when the unwinding ended.
    pub unwound: u64,
    pub inclusive: [u64; MAX_COUNTERS],
    pub exclusive: [u64; MAX_COUNTERS],
    /// Returns of probed callees during these calls (their probes' cost is in `inclusive`).
    pub callee_calls: u64,
}

/// Per-CPU counts of function-probe anomalies (a one-entry `PERCPU_ARRAY`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProbeStats {
    /// Entries not pushed because the stack was `MAX_DEPTH` deep.
    pub overflows: u64,
    /// Frames discarded because their end was never seen (longjmp, `exit()` inside a probed
    /// function, unwinding with no catch point probed): not in any total.
    pub missed_returns: u64,
    /// Returns that matched no frame.
    pub unmatched_returns: u64,
    /// Shadow stacks or call entries that did not fit their maps.
    pub map_full: u64,
    /// Probe hits whose counter reading failed or kept racing with context switches, or (with
    /// `SKIP_UNTRACED`) whose traced task was running without its counts since arriving being
    /// known (`reading_owner`): none of these calls is in any total.
    pub read_failures: u64,
    /// Calls closed at a tail-call jump because the callee's end cannot be known (its returns
    /// are not probed): their inclusive figure stops at the jump.
    pub tail_calls_cut: u64,
    /// Calls in every total but in no per-call histogram: their bucket was new and `HISTOGRAMS`
    /// was full (`--max-buckets`).
    pub histogram_full: u64,
    /// Go: a goroutine with open frames found running on another thread than the one it was
    /// last seen on, without its leaving that one seen (`goroutines` in topdown-ebpf): what
    /// it ran there since its last switch-in is not in its calls.
    pub goroutine_switches_lost: u64,
}

/// Exit-instruction probes: what the attach cookie of a probe on an exit instruction says.
/// Bits 0..32: the function id whose frame it closes (`ROOT_FUNCTION`: a return-only point in
/// a function that is not probed itself, which only closes frames that tail-called into it);
/// bits 32..34: the kind; bits 34..: the `INDIRECT_JUMPS` key of an indirect jump.
pub mod exit_point {
    /// `ret`: closes the function's frame, then the frames of tail callers at the same stack
    /// pointer, innermost first.
    pub const RETURN: u64 = 0;
    /// A direct jump to a function whose returns are probed: marks the frame `tail_calling`.
    pub const TAIL_CALL: u64 = 1;
    /// A direct jump to a function whose end cannot be known: closes the frame here, counted
    /// in `ProbeStats::tail_calls_cut`.
    pub const CUT: u64 = 2;
    /// A jump through a register or memory: a tail call or a jump table, decided at run time
    /// from its `IndirectJump` descriptor.
    pub const INDIRECT: u64 = 3;

    pub const fn encode(function: u32, kind: u64, index: u32) -> u64 {
        function as u64 | (kind & 3) << 32 | (index as u64) << 34
    }
    pub const fn function(cookie: u64) -> u32 {
        cookie as u32
    }
    pub const fn kind(cookie: u64) -> u64 {
        (cookie >> 32) & 3
    }
    pub const fn index(cookie: u64) -> u32 {
        (cookie >> 34) as u32
    }
}

/// Registers of an indirect jump's operand, as word indices into x86-64 `struct pt_regs`
/// (arch/x86/include/asm/ptrace.h: r15 r14 r13 r12 bp bx r11 r10 r9 r8 ax cx dx si di orig_ax
/// ip cs flags sp ss), so BPF reads them from the probe's registers.
pub mod pt_regs_word {
    pub const NONE: u8 = 0xff;
    /// `ip`: in a uprobe program it holds the probed instruction's address.
    pub const IP: u8 = 16;
    pub const SP: u8 = 19;
    pub const COUNT: u8 = 21;
}

/// One indirect jump that leaves its function (an exit point) when its target lies outside
/// the function's own code, the function's cold fragments included (a jump table otherwise).
/// Addresses are the file's own virtual addresses: BPF converts the run-time target with
/// `address + (target - ip)`, which holds for any load address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndirectJump {
    /// The frame it closes (`ROOT_FUNCTION` for return-only points).
    pub function: u32,
    /// Index of the file, for `RETURN_TARGETS`.
    pub file: u32,
    /// `pt_regs_word` indices (`NONE` when absent).
    pub base: u8,
    pub index: u8,
    pub scale: u8,
    /// Nonzero: the target is read from memory at the operand's address; zero: the register
    /// is the target.
    pub memory: u8,
    pub _pad: u32,
    /// For rip-relative operands, relative to the jump's own address.
    pub displacement: i64,
    /// The jump's address in the file.
    pub address: u64,
    /// End of the file's highest loaded segment: a target beyond is in another mapping.
    pub file_end: u64,
    /// The function's code: `[start, end)` pairs (unused pairs are empty).
    pub ranges: [[u64; 2]; MAX_FUNCTION_RANGES],
}

/// The function body plus up to three cold fragments.
pub const MAX_FUNCTION_RANGES: usize = 4;

/// Key of `RETURN_TARGETS`: a function start in a probed file whose returns are probed, so a
/// tail call into it can leave the caller's frame open until it returns.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileAddress {
    pub file: u32,
    pub _pad: u32,
    pub address: u64,
}

/// Per-call histograms: each probed call's inclusive count of the weight counter (`slots`;
/// `cpu-clock` ns in the software model) picks a bucket, which adds up the calls and every
/// counter of the calls in it, so each bucket has a TopDown split of its own.
///
/// The layout is bpftrace's `hist(n, 2)` (its `log2` helper with k = 2) less bpftrace's bucket
/// for negative values: a value `v` below 4 has a bucket of its own, `[v, v + 1)`; any other
/// lies in the power-of-two range `[2^e, 2^(e+1))` with `e = floor(log2 v)` >= 2, split in 4
/// equal sub-buckets of width `2^(e-2)`, and `v` is in sub-bucket `x = (v >> (e-2)) & 3`:
/// `[(4 + x) << (e-2), (5 + x) << (e-2))`. Bucket indexes count up with the values: `v` for
/// `v < 4`, then `4 (e - 1) + x`, 0 to 251 (bpftrace's index is this plus one).
pub mod histogram {
    /// Linear sub-buckets per power of two: `2^SUB_BITS` (bpftrace's `k`).
    pub const SUB_BITS: u32 = 2;
    const SUB_BUCKETS: u64 = 1 << SUB_BITS;
    /// Bucket indexes: 0..BUCKETS.
    pub const BUCKETS: u32 = 252;

    /// `HistogramKey::kind` of a probed function's calls (`owner`: its id).
    pub const FUNCTION: u32 = 0;

    /// `floor(log2 v)` for `v > 0`, by halving the search range: no loop the verifier has to
    /// unroll, and no count-leading-zeros, which BPF has no instruction for.
    #[inline(always)]
    pub const fn log2(value: u64) -> u32 {
        let mut v = value;
        let mut log = 0;
        let mut step = 32;
        while step > 0 {
            if v >= 1 << step {
                v >>= step;
                log += step;
            }
            step /= 2;
        }
        log
    }

    /// The bucket index of `value`.
    #[inline(always)]
    pub const fn bucket(value: u64) -> u32 {
        if value < SUB_BUCKETS {
            return value as u32;
        }
        let e = log2(value);
        let sub = ((value >> (e - SUB_BITS)) & (SUB_BUCKETS - 1)) as u32;
        ((e - SUB_BITS + 1) << SUB_BITS) + sub
    }

    /// The values of bucket `index`: `[low, high)`. The last bucket's `high` would be 2^64: it
    /// is `u64::MAX`, and holds `u64::MAX` too.
    pub const fn bounds(index: u32) -> (u64, u64) {
        if index < SUB_BUCKETS as u32 {
            return (index as u64, index as u64 + 1);
        }
        let index = if index >= BUCKETS { BUCKETS - 1 } else { index };
        let e = (index >> SUB_BITS) + SUB_BITS - 1;
        let sub = (index & (SUB_BUCKETS as u32 - 1)) as u64;
        let width = 1u64 << (e - SUB_BITS);
        let low = (SUB_BUCKETS + sub) * width;
        (low, low.saturating_add(width))
    }
}

/// Key of `HISTOGRAMS`: one bucket of one owner's per-call histogram.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HistogramKey {
    /// What the calls are of (`histogram::FUNCTION`).
    pub kind: u32,
    /// The function's id (the attach cookie user space gave it).
    pub owner: u32,
    /// The process, or 0 when functions are not split by process.
    pub tgid: u32,
    /// `histogram::bucket` of the calls' weight.
    pub bucket: u32,
}

/// Value of `HISTOGRAMS`: the calls of one bucket.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HistogramBucket {
    pub calls: u64,
    /// Returns of probed callees during these calls (for the probes' cost, as `CallStats`).
    pub callee_calls: u64,
    /// Sums of the calls' inclusive counts, per counter slot.
    pub counters: [u64; MAX_COUNTERS],
}

impl HistogramBucket {
    pub const ZERO: Self = Self {
        calls: 0,
        callee_calls: 0,
        counters: [0; MAX_COUNTERS],
    };
}

/// USDT probes (SystemTap SDT notes) and spans between them: `-U`, `--span`, `--postgres`.
///
/// Every probed site (a USDT site, or a function entry or return the spans need) has one
/// attach cookie, the index of its [`UsdtSite`] in `USDT_SITES`: user space parses the
/// notes' argument specs (`8@%rbx`, `-4@-20(%rbp)`, `$5`, ...) into [`UsdtArg`]s, and the BPF
/// side only evaluates them.
pub mod usdt {
    /// Arguments one site may decode: a span's key and, for notes, a value and a condition.
    pub const SITE_ARGS: usize = 2;
    /// Spans open at once on one thread; a start beyond is counted in `SpanStats::overflows`.
    pub const MAX_SPAN_DEPTH: usize = 8;
    /// Bytes of a string key kept (the rest is cut: two strings equal up to here are one key).
    pub const TEXT_BYTES: usize = 256;
    /// Span kinds (`--span` and the presets together).
    pub const MAX_SPAN_KINDS: usize = 64;

    /// What a site does when it fires (`UsdtSite::action`).
    pub mod action {
        /// Counts a hit of probe `UsdtSite::id` (`-U`).
        pub const HIT: u32 = 0;
        /// Opens a span of kind `id` on the thread.
        pub const START: u32 = 1;
        /// Closes the innermost open span of kind `id`.
        pub const END: u32 = 2;
        /// Closes every open span of kind `id` (`ANY_KIND`: of every kind) as abandoned.
        pub const ABORT: u32 = 3;
        /// Sets the thread's note to `args[0]` if it is 0, or if `args[1]` is present and
        /// nonzero (a forced update).
        pub const NOTE_SET: u32 = 4;
        /// Clears the thread's note if `args[0]` equals `args[1]`.
        pub const NOTE_CLEAR: u32 = 5;
    }

    /// `UsdtSite::id` of an abort that closes spans of every kind.
    pub const ANY_KIND: u32 = u32::MAX;

    /// How a start site keys its span (`UsdtSite::key`).
    pub mod key_mode {
        /// One key for every span of the kind.
        pub const NONE: u32 = 0;
        /// `args[0]`, an integer.
        pub const INTEGER: u32 = 1;
        /// The string `args[0]` points to, up to `TEXT_BYTES`.
        pub const STRING: u32 = 2;
        /// The thread's note at the span's end if nonzero (a query id), else the string.
        pub const NOTE_OR_STRING: u32 = 3;
    }

    /// Bits of `SpanKind::flags`.
    pub mod kind_flags {
        /// A start of this kind while one is open on the thread (deeper in its stack) belongs
        /// to the open one: it opens nothing, and its end closes nothing (a query's execution
        /// inside the query).
        pub const ABSORB_NESTED: u32 = 1;
        /// Spans of this kind run in a helper (a parallel worker): their counts are folded into
        /// the entry of the same key, and they are not calls.
        pub const WORKER: u32 = 2;
    }

    /// What an argument is (`UsdtArg::kind`).
    pub mod arg_kind {
        pub const NONE: u8 = 0;
        /// `value` itself (`$5`).
        pub const CONSTANT: u8 = 1;
        /// Register `base` (a `pt_regs_word`), shifted right by `shift` bits (`%ah`).
        pub const REGISTER: u8 = 2;
        /// Memory at `value + base + index * scale` (`-20(%rbp)`, `(%rax,%rcx,8)`); a `base` of
        /// `pt_regs_word::IP` makes it relative to the site's own address (a symbol: `value` is
        /// the symbol's address minus the site's, both in the file).
        pub const MEMORY: u8 = 3;
    }

    /// One decoded argument spec.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct UsdtArg {
        pub kind: u8,
        /// Bytes: 1, 2, 4 or 8.
        pub size: u8,
        /// Nonzero: sign-extended from `size` bytes (a negative size in the spec).
        pub signed: u8,
        /// `pt_regs_word` indices (`pt_regs_word::NONE` when absent).
        pub base: u8,
        pub index: u8,
        pub scale: u8,
        pub shift: u8,
        pub _pad: u8,
        pub value: i64,
    }

    /// One probed site: the value of `USDT_SITES` at its attach cookie.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct UsdtSite {
        /// An `action` constant.
        pub action: u32,
        /// The probe (`HIT`) or span kind (the others).
        pub id: u32,
        /// A `key_mode` constant (`START`).
        pub key: u32,
        pub _pad: u32,
        pub args: [UsdtArg; SITE_ARGS],
    }

    /// A span kind's behaviour (`SPAN_KINDS`, by kind id).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct SpanKind {
        pub flags: u32,
    }

    /// A string key as read from user memory (8-byte aligned: it is hashed by words).
    #[repr(C, align(8))]
    #[derive(Clone, Copy, Debug)]
    pub struct SpanText {
        /// Bytes in `bytes`, without the terminating NUL.
        pub len: u32,
        pub _pad: u32,
        pub bytes: [u8; TEXT_BYTES],
    }

    /// One open span.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct SpanFrame {
        pub kind: u32,
        /// Starts of its own kind absorbed inside it (`kind_flags::ABSORB_NESTED`), whose ends
        /// are still to come.
        pub absorbed: u32,
        /// Stack pointer at the start: a later start higher up the stack (or at the same
        /// place, of the same kind) means this span's end was skipped (longjmp, an error).
        pub sp: u64,
        /// A `key_mode` constant.
        pub key_mode: u32,
        /// Nonzero: `key` is a sign-extended integer.
        pub signed: u32,
        /// The integer key, or the string's hash.
        pub key: u64,
        /// The thread's virtual counters at the start.
        pub entry: [u64; super::MAX_COUNTERS],
        pub text: SpanText,
    }

    /// A thread's open spans and note (value of `SPAN_STACKS`, keyed by tid).
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct SpanStack {
        pub depth: u32,
        pub _pad: u32,
        /// Set and cleared by note sites (PostgreSQL's query id, as `pg_stat_activity` has it).
        pub note: u64,
        /// Scratch for the probe in progress (per thread, as in `ShadowStack`).
        pub now: [u64; super::MAX_COUNTERS],
        pub virtual_now: [u64; super::MAX_COUNTERS],
        /// What the thread's virtual counters are made of while its CPU takes no reading.
        pub base: super::VirtualBase,
        pub frames: [SpanFrame; MAX_SPAN_DEPTH],
    }

    /// Bits of `SpanKey::flags`.
    pub mod span_flags {
        /// Spans whose end never came: closed at a later start or an abort.
        pub const ABANDONED: u32 = 1;
        /// Spans of a `kind_flags::WORKER` kind.
        pub const WORKER: u32 = 2;
    }

    /// What `SpanKey::key` is.
    pub mod key_type {
        pub const NONE: u32 = 0;
        pub const UNSIGNED: u32 = 1;
        pub const SIGNED: u32 = 2;
        /// A hash of a string in `SPAN_TEXTS` (`text_hash`).
        pub const TEXT: u32 = 3;
        /// The thread's note (a query id).
        pub const NOTE: u32 = 4;
    }

    /// Key of `SPAN_TOTALS`: a span kind and key, and one bucket of its per-span histogram.
    ///
    /// The totals are kept per bucket (`super::histogram::bucket` of the span's count of the
    /// weight counter, as a function's calls): a kind and key's totals are the sum of its
    /// buckets, and its buckets are its distribution, for the one map lookup a span's end
    /// needs anyway. The bucket takes what was padding: the key stays 24 bytes.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub struct SpanKey {
        pub kind: u32,
        /// `span_flags`.
        pub flags: u32,
        /// `key_type`.
        pub key_type: u32,
        /// `super::histogram::bucket` of the spans' weight.
        pub bucket: u32,
        pub key: u64,
    }

    /// Totals of one `SpanKey`: the spans of one kind, key and bucket.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct SpanTotals {
        pub spans: u64,
        /// A `SPAN_TEXTS` hash of one span's string (the first seen), for keys that are not
        /// strings themselves; 0 when none was read.
        pub text: u64,
        /// From start to end (or to where an abandoned span was closed), nested spans included.
        pub counters: [u64; super::MAX_COUNTERS],
    }

    /// Per-CPU counts of span anomalies (a one-entry `PERCPU_ARRAY`); summed over the CPUs,
    /// the span diagnostics that reports carry as they are.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    #[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
    pub struct SpanStats {
        /// Starts not recorded: `MAX_SPAN_DEPTH` spans were open on the thread.
        pub overflows: u64,
        /// Ends with no open span of their kind (started before counting began, or absorbed).
        pub unmatched_ends: u64,
        /// Starts and ends whose counters could not be read (as `ProbeStats::read_failures`):
        /// not in any total.
        pub read_failures: u64,
        /// Span stacks or totals that did not fit their maps (raise `--max-stacks`,
        /// `--max-spans`).
        pub map_full: u64,
        /// Arguments whose memory could not be read (the key is then 0 or empty).
        pub arg_read_failures: u64,
        /// Spans still open when their thread exited: not in any total.
        pub open_at_exit: u64,
    }

    /// The hash of a string key (`SpanKey::key` for `key_type::TEXT`): FNV-1a's constants over
    /// the string's 8-byte little-endian words (the last one zero-padded), seeded with its
    /// length, so the BPF side hashes 256 bytes in 32 steps.
    pub const HASH_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    pub const HASH_PRIME: u64 = 0x0000_0100_0000_01b3;
}

/// Go goroutines (`-u` on a Go binary): shadow stacks keyed by the goroutine (its `g`
/// pointer), whose frames' stack pointers are kept relative to the goroutine's stack top, and
/// whose counters run only while it runs on a thread.
pub mod go_layout {
    /// `runtime.g.stack.hi` (`g` starts with `stack stack`, `stack` is `{lo, hi uintptr}`):
    /// the same from Go 1.17 on; user space checks it against the binary's DWARF when present.
    pub const G_STACK_HI: u64 = 8;
    /// `runtime.gobuf.sp` and `runtime.gobuf.g` (`gobuf` is `{sp, pc, g, ...}`).
    pub const GOBUF_SP: u64 = 0;
    pub const GOBUF_G: u64 = 16;
}

/// The runtime functions the `go_runtime` program hooks, as its attach cookie.
pub mod go_hook {
    /// `runtime.gogo(buf *gobuf)` (ABI0, `buf` at 8(SP)): a goroutine joins the thread.
    pub const GOGO: u64 = 1;
    /// `runtime.mcall(fn)`: the goroutine in R14 leaves for the scheduler's stack.
    pub const MCALL: u64 = 2;
    /// `runtime.morestack`: called from a function's prologue (goroutine in R14, that
    /// function's entry stack pointer at 8(SP)); the goroutine leaves, and the function starts
    /// again once its stack has grown.
    pub const MORESTACK: u64 = 3;
    /// `runtime.goexit1`: the goroutine in R14 ends (normally, or by `runtime.Goexit`).
    pub const GOEXIT: u64 = 4;
}

/// Key of `GO_STACKS`: a goroutine is its `g` pointer within its process (every Go process
/// allocates its `g`s at the same addresses).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GoroutineKey {
    pub g: u64,
    pub tgid: u32,
    pub _pad: u32,
}

/// A goroutine's shadow stack and virtual counters (value of `GO_STACKS`, keyed by
/// `GoroutineKey`). Frame stack pointers are `SP - g.stack.hi` (wrapping): the order of frames is
/// kept, and a stack copied elsewhere gives the same values.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GoStack {
    pub stack: ShadowStack,
    /// The thread the goroutine runs on with `clock` as its offset; 0 while it is off every
    /// thread (then `clock` holds its counters).
    pub thread: u32,
    pub _pad: u32,
    /// Running: the goroutine's virtual counters minus its thread's; off a thread: its
    /// virtual counters.
    pub clock: [u64; MAX_COUNTERS],
    /// Its virtual counters when it last joined a thread.
    pub joined: [u64; MAX_COUNTERS],
}

#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::HistogramKey {}
    unsafe impl aya::Pod for super::HistogramBucket {}
    unsafe impl aya::Pod for super::usdt::UsdtSite {}
    unsafe impl aya::Pod for super::usdt::SpanKind {}
    unsafe impl aya::Pod for super::usdt::SpanKey {}
    unsafe impl aya::Pod for super::usdt::SpanTotals {}
    unsafe impl aya::Pod for super::usdt::SpanText {}
    unsafe impl aya::Pod for super::usdt::SpanStats {}
    unsafe impl aya::Pod for super::CgroupCounters {}
    unsafe impl aya::Pod for super::CallKey {}
    unsafe impl aya::Pod for super::CallStats {}
    unsafe impl aya::Pod for super::ProbeStats {}
    unsafe impl aya::Pod for super::IndirectJump {}
    unsafe impl aya::Pod for super::FileAddress {}
    // SAFETY: plain old data, every bit pattern is valid.
    unsafe impl aya::Pod for super::CpuState {}
    unsafe impl aya::Pod for super::TaskCounters {}
    unsafe impl aya::Pod for super::TaskExit {}
    unsafe impl aya::Pod for super::GoStack {}
    unsafe impl aya::Pod for super::GoroutineKey {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{vec, vec::Vec};

    use super::histogram::{BUCKETS, bounds, bucket, log2};

    #[test]
    fn log2_is_the_highest_set_bit() {
        for shift in 0..64 {
            let power = 1u64 << shift;
            assert_eq!(log2(power), shift);
            assert_eq!(log2(power | (power >> 1)), shift);
            assert_eq!(log2(power.wrapping_mul(2).wrapping_sub(1)), shift);
        }
    }

    /// Every bucket's bounds hold exactly the values `bucket` gives it, with no gap or overlap
    /// from 0 to u64::MAX: checked at both ends and the middle of every bucket.
    #[test]
    fn buckets_tile_the_values_in_order() {
        let mut next_low = 0;
        for index in 0..BUCKETS {
            let (low, high) = bounds(index);
            assert_eq!(low, next_low, "bucket {index}");
            assert!(high > low, "bucket {index}");
            assert_eq!(bucket(low), index);
            assert_eq!(bucket(high - 1), index);
            assert_eq!(bucket(low + (high - low) / 2), index);
            next_low = high;
        }
        assert_eq!(next_low, u64::MAX);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    /// The layout written out: single values below 4, then four equal parts of each power of
    /// two (bpftrace's `hist(n, 2)`: 225 = 0b11100001 is its index 28, ours 27).
    #[test]
    fn the_layout_is_four_linear_parts_per_power_of_two() {
        let buckets: Vec<(u64, u64)> = (0..12).map(bounds).collect();
        assert_eq!(
            buckets,
            [
                (0, 1),
                (1, 2),
                (2, 3),
                (3, 4),
                (4, 5),
                (5, 6),
                (6, 7),
                (7, 8),
                (8, 10),
                (10, 12),
                (12, 14),
                (14, 16)
            ]
        );
        assert_eq!(bucket(225), 27);
        assert_eq!(bounds(27), (224, 256));
        assert_eq!(bounds(bucket(10)), (10, 12));
        assert_eq!(bounds(bucket(1000)), (896, 1024));
        assert_eq!(bounds(bucket(1 << 40)), (1 << 40, 5 << 38));
    }

    use super::pid_flags::{self, UNSEEN_LEAVER};
    use super::unseen_leavers::Arrival;

    /// The arrival of the task (tid, tgid) in the tests: its tid stands for its address.
    fn arrival((tid, tgid): (u32, u32)) -> Arrival {
        Arrival {
            task: 0x1000 + u64::from(tid),
            tid,
            tgid,
        }
    }

    fn marked(flags: &[u64], tgid: u32) -> bool {
        pid_flags::of(flags[pid_flags::word(tgid)], tgid) & UNSEEN_LEAVER != 0
    }

    /// One CPU running `schedule` (tid, tgid) in turn, where sched_switch reports no switch away
    /// from a task of tgid `silent` (as with PID 1's threads on the test VM): the switches it
    /// does report go through `note_switch` as the sched_switch program does, marking every
    /// task found to have left unseen except idle. Returns the filter, the unseen switches
    /// found, and for each step whether a switch into it was reported while its process was
    /// marked (so read).
    fn replay(schedule: &[(u32, u32)], silent: u32) -> (Vec<u64>, u64, Vec<bool>) {
        let mut arrived = Arrival::NONE;
        let mut filter = vec![0; pid_flags::WORDS];
        let mut unseen = 0;
        let mut read = vec![false];
        for pair in schedule.windows(2) {
            let (prev, next) = (pair[0], pair[1]);
            if prev.1 == silent && prev.0 != 0 {
                read.push(false);
                continue;
            }
            if let Some((tid, tgid)) = arrived.note_switch(arrival(prev).task, arrival(next)) {
                unseen += 1;
                if tid != 0 {
                    pid_flags::set(&mut filter, tgid, UNSEEN_LEAVER);
                }
            }
            read.push(marked(&filter, next.1));
        }
        (filter, unseen, read)
    }

    #[test]
    fn a_process_leaving_unseen_is_marked_and_read_at_its_next_arrival() {
        let idle = (0, 0);
        let init_a = (60, 1);
        let init_b = (68, 1);
        let traced = (5000, 5000);
        let other = (7000, 7000);
        let schedule = [
            other, init_a, traced, other, init_b, traced, idle, init_a, other,
        ];
        let (filter, unseen, read) = replay(&schedule, 1);
        // init_a -> traced and init_b -> traced were not reported (init_a -> other at the end
        // is not followed by any switch, so it is not found).
        assert_eq!(unseen, 2);
        assert!(marked(&filter, 1));
        assert!(!marked(&filter, traced.1) && !marked(&filter, other.1));
        // The first arrival of PID 1 is not known to need a reading; after its first unseen
        // switch-out every arrival of any of its threads is read.
        assert_eq!(
            read,
            [false, false, false, false, true, false, false, true, false]
        );
    }

    #[test]
    fn idle_and_a_cpu_first_switch_mark_nothing() {
        let idle = (0, 0);
        let task = (300, 300);
        // Idle leaves unseen once (idle -> task not reported): counted, not marked.
        let other = (77, 77);
        let mut arrived = Arrival::NONE;
        assert_eq!(
            arrived.note_switch(arrival((42, 42)).task, arrival(idle)),
            None,
            "first switch"
        );
        assert_eq!(
            arrived.note_switch(arrival(task).task, arrival(other)),
            Some(idle)
        );
        assert_eq!(
            arrived.note_switch(arrival(other).task, arrival(idle)),
            None
        );
    }

    /// The sched_switch program's one-test skip path is only for processes filtered alone: a
    /// cgroup filter needs the walk, and no skipping without a filter or with it turned off.
    #[test]
    fn skip_mode_follows_the_filters() {
        use super::skip_untraced::{BY_PID_FLAGS, BY_TASK, OFF, mode};
        assert_eq!(mode(true, true, false), BY_PID_FLAGS);
        assert_eq!(mode(true, true, true), BY_TASK);
        assert_eq!(mode(true, false, true), BY_TASK);
        assert_eq!(mode(true, false, false), OFF);
        for (by_process, by_cgroup) in [(false, false), (true, false), (false, true), (true, true)]
        {
            assert_eq!(mode(false, by_process, by_cgroup), OFF);
        }
    }

    /// Each pid's two flags are its own: no neighbour's, no other flag, up to the kernel's limit.
    #[test]
    fn pid_flags_are_per_pid_and_per_flag() {
        use pid_flags::{PID_LIMIT, TRACKED, WORDS, of, set, word};
        let mut flags = vec![0; WORDS];
        let marks = [
            (1, UNSEEN_LEAVER),
            (31, TRACKED),
            (32, TRACKED),
            (32, UNSEEN_LEAVER),
            (300_000, TRACKED),
            (PID_LIMIT - 1, UNSEEN_LEAVER),
        ];
        for (pid, flag) in marks {
            set(&mut flags, pid, flag);
        }
        let found: Vec<(u32, u64)> = (0..PID_LIMIT)
            .filter_map(|pid| Some((pid, of(flags[word(pid)], pid))).filter(|(_, f)| *f != 0))
            .collect();
        assert_eq!(
            found,
            [
                (1, UNSEEN_LEAVER),
                (31, TRACKED),
                (32, TRACKED | UNSEEN_LEAVER),
                (300_000, TRACKED),
                (PID_LIMIT - 1, UNSEEN_LEAVER),
            ]
        );
        assert_eq!(PID_LIMIT - 1, 4_194_303);
        assert_eq!(flags.len() * 8, 1024 * 1024);
    }

    /// Who may take a delta whose reading did not see them arrive: any traced task after
    /// `NONE`, any but the arrival after `UNTRACED`, nobody after `TRACED` (only its owner,
    /// which the callers test first).
    #[test]
    fn an_unseen_arrival_claims_only_what_no_reading_gave_another() {
        use super::reading_owner::{NONE, TRACED, UNTRACED, claimable_by, pack};
        let tid = 4242;
        assert!(claimable_by(pack(NONE, 0), tid));
        assert!(claimable_by(pack(UNTRACED, 0), tid), "idle arrived");
        assert!(claimable_by(pack(UNTRACED, 7), tid));
        assert!(
            !claimable_by(pack(UNTRACED, tid), tid),
            "it arrived untraced"
        );
        assert!(!claimable_by(pack(TRACED, 7), tid), "another traced task's");
        assert!(
            !claimable_by(pack(TRACED, tid), tid),
            "its own, not a claim"
        );
    }
}
