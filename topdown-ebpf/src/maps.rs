//! Maps and globals: the ABI with user space, whose layouts are in `topdown_common`.

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::bpf_get_smp_processor_id,
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerfEventArray, RingBuf},
    programs::TracePointContext,
};
use topdown_common::{
    CallKey, CallStats, CgroupCounters, CpuState, FIELD_ABSENT, FileAddress, GoStack, GoroutineKey,
    IndirectJump, MAX_COUNTERS, MAX_CPUS, ProbeStats, ShadowStack, SwitchState, TaskCounters,
    kernel_offset, pid_flags, slot_source, unseen_leavers::Arrival,
};
pub(crate) use topdown_ebpf::{TaskStorage, atomic_add, entry_or_zeroed};

/// Counter slots in use per CPU (1..=MAX_COUNTERS).
#[unsafe(no_mangle)]
pub(crate) static NUM_COUNTERS: u32 = 0;
/// Per slot: which fd and which value to read (`topdown_common::slot_source`).
#[unsafe(no_mangle)]
pub(crate) static SLOT_SOURCES: [u32; MAX_COUNTERS] = slot_source::identity();
/// Nonzero: only tasks whose tgid is in `TRACKED` get their own entry (`-p`, `-- CMD`).
#[unsafe(no_mangle)]
pub(crate) static FILTER_TGIDS: u32 = 0;
/// Nonzero: children forked by a tracked process are tracked too (`-- CMD`).
#[unsafe(no_mangle)]
pub(crate) static FOLLOW_FORKS: u32 = 0;
/// Offsets of fields in the classic `sched_process_fork`/`sched_process_exit` records, read by
/// user space from tracefs (their layout changes between kernels).
#[unsafe(no_mangle)]
pub(crate) static FORK_CHILD_PID_OFFSET: u32 = FIELD_ABSENT;
#[unsafe(no_mangle)]
pub(crate) static EXIT_GROUP_DEAD_OFFSET: u32 = FIELD_ABSENT;
/// Offsets of `dst_root`, `dst_id` and `pid` in the classic `cgroup:cgroup_attach_task` record.
#[unsafe(no_mangle)]
pub(crate) static ATTACH_DST_ROOT_OFFSET: u32 = FIELD_ABSENT;
#[unsafe(no_mangle)]
pub(crate) static ATTACH_DST_ID_OFFSET: u32 = FIELD_ABSENT;
#[unsafe(no_mangle)]
pub(crate) static ATTACH_PID_OFFSET: u32 = FIELD_ABSENT;
/// Offset of `state` in the classic `power:cpu_idle` record.
#[unsafe(no_mangle)]
pub(crate) static IDLE_STATE_OFFSET: u32 = FIELD_ABSENT;
/// Nonzero: deltas are also added per cgroup v2 (`--by cgroup`).
#[unsafe(no_mangle)]
pub(crate) static BY_CGROUP: u32 = 0;
/// Zero: no per-task entries (cgroup-only runs triggered on cgroup switches).
#[unsafe(no_mangle)]
pub(crate) static BY_TASK: u32 = 1;
/// Nonzero: a task's name is copied at every reading of it, not only when its entry is made:
/// set by user space when `task:task_rename` (which keeps the names since) cannot be attached.
#[unsafe(no_mangle)]
pub(crate) static COMM_AT_EVERY_READING: u32 = 0;
/// Offsets of `pid` and `newcomm` in the classic `task:task_rename` record.
#[unsafe(no_mangle)]
pub(crate) static RENAME_PID_OFFSET: u32 = FIELD_ABSENT;
#[unsafe(no_mangle)]
pub(crate) static RENAME_COMM_OFFSET: u32 = FIELD_ABSENT;
/// Nonzero: only tasks in the cgroups of `CGROUP_FILTER` or their descendants count (`-G`).
#[unsafe(no_mangle)]
pub(crate) static FILTER_CGROUPS: u32 = 0;
/// Nonzero (`topdown_common::skip_untraced`): sched_switch reads the counters only at switches
/// where the task leaving or the task arriving is traced (filters on, and `KERNEL_OFFSETS`
/// found by user space; see `topdown_common::reading_owner`).
#[unsafe(no_mangle)]
pub(crate) static SKIP_UNTRACED: u32 = 0;
/// Byte offsets of kernel structure fields (`topdown_common::kernel_offset`), from the kernel's
/// BTF: aya-ebpf has no CO-RE relocations for Rust programs.
#[unsafe(no_mangle)]
pub(crate) static KERNEL_OFFSETS: [u32; kernel_offset::COUNT] =
    [FIELD_ABSENT; kernel_offset::COUNT];

/// Nonzero: function totals are kept per process (`--by function,task`).
#[unsafe(no_mangle)]
pub(crate) static SPLIT_FUNCTIONS_BY_PROCESS: u32 = 0;

#[inline(always)]
pub(crate) fn global(value: &'static u32) -> u32 {
    // SAFETY: reading a static the loader patched; volatile keeps the load.
    unsafe { core::ptr::read_volatile(value) }
}

/// The field at `offset` (one of the `*_OFFSET` globals) of a classic tracepoint's record:
/// `None` where user space found no such field in this kernel's tracefs format, or the read
/// failed.
#[inline(always)]
pub(crate) fn record_field<T>(ctx: &TracePointContext, offset: &'static u32) -> Option<T> {
    let offset = global(offset);
    if offset == FIELD_ABSENT {
        return None;
    }
    // SAFETY: the offset comes from this kernel's tracefs format file.
    unsafe { ctx.read_at::<T>(offset as usize) }.ok()
}

/// One of `KERNEL_OFFSETS` (`index` is a `kernel_offset` constant).
#[inline(always)]
pub(crate) fn kernel_field_offset(index: usize) -> u64 {
    // SAFETY: `index` is a constant below `kernel_offset::COUNT`; volatile as in `global`.
    u64::from(unsafe { core::ptr::read_volatile(KERNEL_OFFSETS.as_ptr().add(index)) })
}

/// `thread_exit_field` offsets, written by user space before the thread-exit program is
/// attached; `FIELD_ABSENT` (or no entry) where the kernel's BTF lacks them.
#[map]
pub(crate) static THREAD_EXIT_FIELDS: Array<u32> =
    Array::with_max_entries(topdown_common::thread_exit_field::COUNT, 0);

/// Counter fds: index `cpu * MAX_COUNTERS + slot`. Sized by user space to possible CPUs.
#[map]
pub(crate) static COUNTERS: PerfEventArray<u32> = PerfEventArray::new(0);

/// Per CPU: the generation of its counter fds. User space makes it odd while it replaces a
/// CPU's fds (after CPU hotplug) and even again when done; readings taken across a change are
/// discarded and the next one is a new baseline. Sized by user space to possible CPUs.
#[map]
pub(crate) static GENERATIONS: Array<u32> = Array::with_max_entries(1, 0);

/// This CPU's counter generation (0 if the map has no entry for it).
#[inline(always)]
pub(crate) fn generation() -> u32 {
    // SAFETY: a helper without preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    match GENERATIONS.get_ptr(cpu) {
        // SAFETY: a map value pointer; volatile because user space writes it concurrently.
        Some(value) => unsafe { core::ptr::read_volatile(value) },
        None => 0,
    }
}

#[map]
pub(crate) static CPU_STATE: PerCpuArray<CpuState> = PerCpuArray::with_max_entries(1, 0);

/// Per-thread totals, keyed by tid. Sized by user space (`--max-tasks`).
#[map]
pub(crate) static TASKS: HashMap<u32, TaskCounters> = HashMap::with_max_entries(32768, 0);

/// Tracked tgids (and the tids of tracked threads created by fork, until they die).
#[map]
pub(crate) static TRACKED: HashMap<u32, u8> = HashMap::with_max_entries(8192, 0);

/// Per pid: in `TRACKED`, and its process left a CPU unseen (`topdown_common::pid_flags`). Set
/// by user space at load (the tracked tgids), kept beside `TRACKED` wherever that changes: what
/// sched_switch tests for every arriving task. A global (.bss), not a map: its words are loaded
/// straight from their address, so the test at every switch costs no map lookup.
#[unsafe(no_mangle)]
pub(crate) static mut PID_FLAGS: [u64; pid_flags::WORDS] = [0; pid_flags::WORDS];

/// Per CPU number: the skip path's state (`topdown_common::SwitchState`), zeroed at load.
#[unsafe(no_mangle)]
pub(crate) static mut SWITCH_STATES: [SwitchState; MAX_CPUS] = [SwitchState {
    owner: 0,
    arrived: Arrival::NONE,
    _pad: 0,
}; MAX_CPUS];

/// Per-cgroup totals, keyed by cgroup v2 id (the cgroup directory's inode number).
#[map]
pub(crate) static CGROUPS: HashMap<u64, CgroupCounters> = HashMap::with_max_entries(4096, 0);

/// The cgroup v2 id each process is in, keyed by tgid: found by user space at start, its
/// parent's at fork (corrected at its first reading with the sched-switch trigger), and the
/// destination of every move. It is the cgroup a process leaves when it moves itself, whose
/// counts up to the move belong there. LRU: an evicted or missing entry only costs that split
/// (`CpuState::unsplit_migrations`).
#[map]
pub(crate) static PROCESS_CGROUPS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(32768, 0);

/// `-G`: the chosen cgroups; a task counts if any of its ancestors (or its own cgroup) is here,
/// so cgroups created during the run are covered without user space noticing them.
#[map]
pub(crate) static CGROUP_FILTER: HashMap<u64, u8> = HashMap::with_max_entries(1024, 0);

/// Final totals of tasks that died, so their map entries can be freed at once.
#[map]
pub(crate) static EXITS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Per-thread shadow stacks of probed calls, in the thread's own storage: made (zeroed) at its
/// first probed call, freed with it, so no count of threads bounds them and none is left behind
/// by a thread that exits unseen. Every probed call looks it up twice (entry and return).
#[unsafe(link_section = ".maps")]
#[unsafe(export_name = "STACKS")]
pub(crate) static STACKS: TaskStorage<ShadowStack> = TaskStorage::new();

/// Per-goroutine shadow stacks of probed Go calls, keyed by the goroutine's process and `g`
/// pointer (the runtime reuses a `g` for a later goroutine only after `goexit1`, which deletes
/// its entry; user space deletes those of processes that ended). Sized by user space like
/// `STACKS` (`--max-stacks`); allocated on a goroutine's first probed call.
#[map]
pub(crate) static GO_STACKS: HashMap<GoroutineKey, GoStack> =
    HashMap::with_max_entries(4096, BPF_F_NO_PREALLOC);

/// Never written: the zeroed value new goroutine stacks are copied from. A hash-map insert
/// copies its value from a pointer, and a goroutine's stack fits neither the 512-byte BPF stack
/// nor a per-CPU value (`BPF_F_NO_PREALLOC` only defers the allocation; it does not let an insert
/// go without a value).
#[map]
pub(crate) static ZERO_GO_STACK: Array<GoStack> = Array::with_max_entries(1, 0);

/// Never written: the zeroed values new task and cgroup entries are copied from (with 24
/// counters they no longer fit the 512-byte BPF stack).
#[map]
pub(crate) static ZERO_TASK: PerCpuArray<TaskCounters> = PerCpuArray::with_max_entries(1, 0);
#[map]
pub(crate) static ZERO_CGROUP: PerCpuArray<CgroupCounters> = PerCpuArray::with_max_entries(1, 0);
#[map]
pub(crate) static ZERO_CALL: PerCpuArray<CallStats> = PerCpuArray::with_max_entries(1, 0);

/// Function totals per caller -> callee edge (and per process if asked).
#[map]
pub(crate) static CALLS: HashMap<CallKey, CallStats> = HashMap::with_max_entries(16384, 0);

/// Descriptors of the indirect jumps probed as possible exits, keyed by the index in their
/// attach cookie. Filled by user space before attaching; a jump table's jumps are among them.
#[map]
pub(crate) static INDIRECT_JUMPS: HashMap<u32, IndirectJump> =
    HashMap::with_max_entries(1 << 20, BPF_F_NO_PREALLOC);

/// Function starts whose returns are probed, per probed file: a tail call there keeps the
/// caller's frame open until the callee returns.
#[map]
pub(crate) static RETURN_TARGETS: HashMap<FileAddress, u8> =
    HashMap::with_max_entries(1 << 20, BPF_F_NO_PREALLOC);

#[map]
pub(crate) static PROBE_STATS: PerCpuArray<ProbeStats> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's `SWITCH_STATES` entry. Programs run on one CPU throughout (uprobes with
/// migration disabled), so it stays this CPU's while the program runs.
#[inline(always)]
pub(crate) fn switch_state() -> *mut SwitchState {
    // SAFETY: a helper without preconditions (inlined by the verifier).
    let cpu = unsafe { bpf_get_smp_processor_id() } as usize;
    // SAFETY: masked below `MAX_CPUS`, which no CPU number reaches: an entry of the array.
    unsafe {
        (&raw mut SWITCH_STATES)
            .cast::<SwitchState>()
            .add(cpu & (MAX_CPUS - 1))
    }
}

/// `pid`'s word of `PID_FLAGS`.
#[inline(always)]
pub(crate) fn pid_flags_word(pid: u32) -> *mut u64 {
    // SAFETY: `word` is below `WORDS`: an aligned u64 of a global array.
    unsafe { (&raw mut PID_FLAGS).cast::<u64>().add(pid_flags::word(pid)) }
}

/// `pid`'s flags (`pid_flags`): one load, no map lookup.
#[inline(always)]
pub(crate) fn flags_of(pid: u32) -> u64 {
    // SAFETY: as in `pid_flags_word`; a stale word only moves a change by one switch, as a
    // map's would.
    pid_flags::of(
        unsafe { core::ptr::read_volatile(pid_flags_word(pid)) },
        pid,
    )
}

/// Tracks `pid` (`TRACKED` and `PID_FLAGS`); false if `TRACKED` is full.
#[inline(always)]
pub(crate) fn track(pid: u32) -> bool {
    if TRACKED.insert(&pid, &1, 0).is_err() {
        return false;
    }
    // Several CPUs may change one word at once.
    // SAFETY: an aligned u64 of a global array.
    unsafe {
        atomic_or(
            pid_flags_word(pid),
            pid_flags::TRACKED << pid_flags::shift(pid),
        )
    };
    true
}

/// Stops tracking `pid` (`TRACKED` and `PID_FLAGS`); its other flag stays.
#[inline(always)]
pub(crate) fn untrack(pid: u32) {
    let _ = TRACKED.remove(&pid);
    // SAFETY: as in `track`.
    unsafe {
        atomic_and(
            pid_flags_word(pid),
            !(pid_flags::TRACKED << pid_flags::shift(pid)),
        )
    };
}

/// # Safety
/// `target` must be a valid, 8-byte aligned u64 in a map value.
#[inline(always)]
pub(crate) unsafe fn atomic_or(target: *mut u64, value: u64) {
    use core::intrinsics::{AtomicOrdering, atomic_or};
    // SAFETY: guaranteed by the caller.
    unsafe { atomic_or::<u64, u64, { AtomicOrdering::Relaxed }>(target, value) };
}

/// # Safety
/// `target` must be a valid, 8-byte aligned u64 in a map value.
#[inline(always)]
pub(crate) unsafe fn atomic_and(target: *mut u64, value: u64) {
    use core::intrinsics::{AtomicOrdering, atomic_and};
    // SAFETY: guaranteed by the caller.
    unsafe { atomic_and::<u64, u64, { AtomicOrdering::Relaxed }>(target, value) };
}

/// Stores `new` at `target` and returns what it held.
///
/// # Safety
/// `target` must be a valid, 8-byte aligned u64 in a map value.
#[inline(always)]
pub(crate) unsafe fn atomic_swap(target: *mut u64, new: u64) -> u64 {
    use core::intrinsics::{AtomicOrdering, atomic_xchg};
    // SAFETY: guaranteed by the caller.
    unsafe { atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(target, new) }
}
