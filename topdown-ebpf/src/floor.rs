//! The benchmark's floor instrument (`cargo xtask bench`, run by `topdown-floor`).
//!
//! `empty_switch` does nothing: what it adds per context switch is what any `tp_btf/sched_switch`
//! program costs. `filter_switch` does what any process filter must at a switch between
//! untracked tasks (who arrives, and is it or the task leaving tracked), and reads nothing. `empty_uprobe` does nothing either: attached where topdown hooks a Go
//! runtime's goroutine switches, it is what any probe there costs. The others read every counter of this CPU the way topdown's `read_slots`
//! (counters.rs) does, from a map laid out as topdown's (`COUNTERS[cpu * MAX_COUNTERS + fd
//! slot]`, `NUM_COUNTERS`, `SLOT_SOURCES`), into a per-CPU scratch, and do nothing else: what
//! they add is the least any tool reading the same counters at the same points must pay.
//! The attributing ones (`_task`, `_cgroup`) also do the least that attributing a reading
//! takes, which topdown cannot avoid either: the delta since the CPU's last reading, added to
//! a hash-map entry of the leaving task (by tid) or of its cgroup (atomically, as several CPUs
//! add to one cgroup). The `cgroup_switch` ones hang on the cgroup-switch trigger's hooks
//! instead of sched_switch. The `span` ones do the least a span takes beyond its two readings:
//! the start's reading kept per thread, the difference added to a total at the end.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_smp_processor_id},
    macros::{btf_tracepoint, map, perf_event, tracepoint, uprobe, uretprobe},
    maps::{HashMap, PerCpuArray, PerfEventArray},
    programs::{
        BtfTracePointContext, PerfEventContext, ProbeContext, RetProbeContext, TracePointContext,
    },
};
use topdown_common::{MAX_COUNTERS, MAX_CPUS, pid_flags, slot_source};
use topdown_ebpf::{TaskStorage, atomic_add, entry_or_zeroed};

/// Counter slots in use per CPU, as topdown's global of the same name.
#[unsafe(no_mangle)]
static NUM_COUNTERS: u32 = 0;
/// Per slot: which fd and which value to read, as topdown's global of the same name.
#[unsafe(no_mangle)]
static SLOT_SOURCES: [u32; MAX_COUNTERS] = slot_source::identity();

/// Counter fds: index `cpu * MAX_COUNTERS + slot`, as topdown's map of the same name.
#[map]
static COUNTERS: PerfEventArray<u32> = PerfEventArray::new(0);

/// Where the readings go, so the reads are not optimised away.
#[map]
static SCRATCH: PerCpuArray<[u64; MAX_COUNTERS]> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU: the last reading and the delta since it, for the attributing floors.
#[map]
static LAST: PerCpuArray<[u64; MAX_COUNTERS]> = PerCpuArray::with_max_entries(1, 0);
#[map]
static DELTA: PerCpuArray<[u64; MAX_COUNTERS]> = PerCpuArray::with_max_entries(1, 0);

/// The attributing floors' totals: by tid, and by cgroup id (sized by user space).
#[map]
static TASK_TOTALS: HashMap<u32, [u64; MAX_COUNTERS]> = HashMap::with_max_entries(1, 0);
#[map]
static CGROUP_TOTALS: HashMap<u64, [u64; MAX_COUNTERS]> = HashMap::with_max_entries(1, 0);

/// Never written: the zeroed value new entries are copied from.
#[map]
static ZERO: PerCpuArray<[u64; MAX_COUNTERS]> = PerCpuArray::with_max_entries(1, 0);

#[btf_tracepoint(function = "sched_switch")]
pub fn empty_switch(_ctx: BtfTracePointContext) -> i32 {
    0
}

/// `task_struct.pid`'s offset, from the kernel's BTF (`tgid` follows it), for `filter_switch`.
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: u32 = 0;

/// `filter_switch`'s tracked processes, a bit per pid below the kernel's `PID_MAX_LIMIT`: none
/// (the floor's filter lets no switch through, as `-p` of an idle process).
#[unsafe(no_mangle)]
static mut TRACKED_PIDS: [u64; PID_WORDS] = [0; PID_WORDS];
const PID_WORDS: usize = pid_flags::PID_LIMIT as usize / 64;

/// `filter_switch`'s per CPU number: nonzero while a tracked task runs there.
#[unsafe(no_mangle)]
static mut TRACKED_RUNNING: [u64; MAX_CPUS] = [0; MAX_CPUS];

/// The least a process filter (`-p`) does at a switch between untracked tasks: who arrives
/// (its tgid, from its `task_struct`), whether its process is tracked (its bit in a global
/// indexed by pid), and whether the task leaving is (its CPU's word); no reading. A tracked
/// task arriving or leaving would be read; none is.
#[btf_tracepoint(function = "sched_switch")]
pub fn filter_switch(ctx: BtfTracePointContext) -> i32 {
    let next: u64 = ctx.arg(2);
    // SAFETY: a constant of the frozen .rodata; `next` is a BTF pointer, so the verifier
    // turns the load at the pid's offset into a fault-safe one (as topdown's `task_ids`).
    let tgid = unsafe {
        let offset = u64::from(core::ptr::read_volatile(&TASK_PID_OFFSET));
        core::ptr::read_volatile((next.wrapping_add(offset) + 4) as *const u32)
    };
    // SAFETY: indexes masked into the arrays (below `PID_LIMIT` and `MAX_CPUS` anyway).
    unsafe {
        let word = core::ptr::read_volatile(
            (&raw const TRACKED_PIDS)
                .cast::<u64>()
                .add((tgid as usize / 64) & (PID_WORDS - 1)),
        );
        let cpu = bpf_get_smp_processor_id() as usize & (MAX_CPUS - 1);
        let running = (&raw mut TRACKED_RUNNING).cast::<u64>().add(cpu);
        if (word >> (tgid % 64)) & 1 != 0 || core::ptr::read_volatile(running) != 0 {
            // Where topdown would read; never taken here.
            core::ptr::write_volatile(running, word);
        }
    }
    0
}

#[btf_tracepoint(function = "sched_switch")]
pub fn floor_switch(_ctx: BtfTracePointContext) -> i32 {
    read_all();
    0
}

/// Reads, then adds the delta since this CPU's last reading to the leaving task's entry:
/// the least per-task attribution costs (`topdown stat -a`).
#[btf_tracepoint(function = "sched_switch")]
pub fn floor_switch_task(_ctx: BtfTracePointContext) -> i32 {
    read_all();
    if let Some(delta) = take_delta() {
        add_to_task(delta);
    }
    0
}

/// Reads, then adds the delta to the leaving task's cgroup's entry: the least per-cgroup
/// attribution costs.
#[btf_tracepoint(function = "sched_switch")]
pub fn floor_switch_cgroup(_ctx: BtfTracePointContext) -> i32 {
    read_all();
    if let Some(delta) = take_delta() {
        add_to_cgroup(delta);
    }
    0
}

/// Both: what `--by cgroup --trigger sched-switch` keeps (per-task entries too).
#[btf_tracepoint(function = "sched_switch")]
pub fn floor_switch_task_cgroup(_ctx: BtfTracePointContext) -> i32 {
    read_all();
    if let Some(delta) = take_delta() {
        add_to_task(delta);
        add_to_cgroup(delta);
    }
    0
}

/// The cgroup-switch trigger's hooks: the `cgroup-switches` software event (period 1) and
/// `power:cpu_idle` (idle entry and exit), reading ...
#[perf_event]
pub fn floor_cgroup_switch(_ctx: PerfEventContext) -> u32 {
    read_all();
    0
}

#[tracepoint(category = "power", name = "cpu_idle")]
pub fn floor_cpu_idle(_ctx: TracePointContext) -> i32 {
    read_all();
    0
}

/// ... and adding the delta to the leaving task's cgroup's entry.
#[perf_event]
pub fn floor_cgroup_switch_cgroup(_ctx: PerfEventContext) -> u32 {
    read_all();
    if let Some(delta) = take_delta() {
        add_to_cgroup(delta);
    }
    0
}

#[tracepoint(category = "power", name = "cpu_idle")]
pub fn floor_cpu_idle_cgroup(_ctx: TracePointContext) -> i32 {
    read_all();
    if let Some(delta) = take_delta() {
        add_to_cgroup(delta);
    }
    0
}

#[uprobe]
pub fn empty_uprobe(_ctx: ProbeContext) -> u32 {
    0
}

#[uprobe]
pub fn floor_entry(_ctx: ProbeContext) -> u32 {
    read_all();
    0
}

#[uretprobe]
pub fn floor_return(_ctx: RetProbeContext) -> u32 {
    read_all();
    0
}

/// The same, attached with one uprobe.multi link per binary (Linux >= 6.6), as topdown
/// attaches its probes where the kernel can.
#[uprobe(multi)]
pub fn floor_entry_multi(_ctx: ProbeContext) -> u32 {
    read_all();
    0
}

#[uretprobe(multi)]
pub fn floor_return_multi(_ctx: RetProbeContext) -> u32 {
    read_all();
    0
}

/// A span's same-work floor (`topdown-floor --span-start/--span-end`): what any span must do
/// beyond reading the counters at both ends. The start keeps the thread's reading (in the
/// thread's storage, as topdown keeps its span stacks, made on its first span); the end reads
/// again, finds that reading and adds the difference and one span to the span's total,
/// atomically (threads on several CPUs end spans of one kind). No key, no nesting, no virtual
/// counters.
#[unsafe(link_section = ".maps")]
#[unsafe(export_name = "SPAN_OPEN")]
static SPAN_OPEN: TaskStorage<[u64; MAX_COUNTERS]> = TaskStorage::new();
/// The span's total: the counters' differences, then the number of spans.
#[map]
static SPAN_TOTAL: HashMap<u32, [u64; MAX_COUNTERS + 1]> = HashMap::with_max_entries(1, 0);
#[map]
static ZERO_SPAN_TOTAL: PerCpuArray<[u64; MAX_COUNTERS + 1]> = PerCpuArray::with_max_entries(1, 0);

#[uprobe]
pub fn floor_span_start(_ctx: ProbeContext) -> u32 {
    span_start();
    0
}

#[uprobe]
pub fn floor_span_end(_ctx: ProbeContext) -> u32 {
    span_end();
    0
}

#[uprobe(multi)]
pub fn floor_span_start_multi(_ctx: ProbeContext) -> u32 {
    span_start();
    0
}

#[uprobe(multi)]
pub fn floor_span_end_multi(_ctx: ProbeContext) -> u32 {
    span_end();
    0
}

#[inline(always)]
fn span_start() {
    let Some(open) = SPAN_OPEN.current(true) else {
        return;
    };
    // SAFETY: this thread's entry; only its own probes write it. Read last: what comes after
    // the reading is inside the span.
    let open = unsafe { &mut *open };
    let _ = topdown_ebpf::read_counter_slots(&COUNTERS, used(), &SLOT_SOURCES, open);
}

#[inline(always)]
fn span_end() {
    // Read first: what comes before the reading is inside the span.
    read_all();
    let (Some(open), Some(now)) = (SPAN_OPEN.current(false), SCRATCH.get_ptr(0)) else {
        return;
    };
    // SAFETY: the entry is only read, and only this thread's probes write it.
    let open = unsafe { &*open };
    // The span kind, on the stack: a `&0` pointed at the .rodata word of `NUM_COUNTERS`
    // (also zero when compiled), which the loader patches (docs/development.md).
    let kind = 0u32;
    let Some(total) = entry_or_zeroed(&SPAN_TOTAL, &kind, || ZERO_SPAN_TOTAL.get_ptr(0)) else {
        return;
    };
    // SAFETY: this CPU's scratch value, written by `read_all` above.
    let now = unsafe { &*now };
    let used = used();
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        // SAFETY: a naturally aligned u64 of a live map value.
        unsafe { atomic_add(&raw mut (*total)[slot], now[slot].wrapping_sub(open[slot])) };
        slot += 1;
    }
    // SAFETY: as above.
    unsafe { atomic_add(&raw mut (*total)[MAX_COUNTERS], 1) };
}

/// topdown's `counters::read_slots` (the same function, `topdown_ebpf::read_counter_slots`):
/// one `bpf_perf_event_read_value` per fd, timing slots taken from their counter's reading.
#[inline(always)]
fn read_all() {
    let Some(out) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a map value pointer of this CPU, which nothing else writes meanwhile.
    let out = unsafe { &mut *out };
    // SAFETY: reading a static the loader patched; volatile keeps the load.
    let used = unsafe { core::ptr::read_volatile(&NUM_COUNTERS) } as usize;
    let _ = topdown_ebpf::read_counter_slots(&COUNTERS, used, &SLOT_SOURCES, out);
}

/// The delta between this reading (`SCRATCH`) and the last (`LAST`), which it replaces.
#[inline(always)]
fn take_delta() -> Option<&'static [u64; MAX_COUNTERS]> {
    let (Some(now), Some(last), Some(delta)) = (
        SCRATCH.get_ptr(0),
        LAST.get_ptr_mut(0),
        DELTA.get_ptr_mut(0),
    ) else {
        return None;
    };
    // SAFETY: map value pointers of this CPU, which nothing else writes meanwhile.
    let (now, last, delta) = unsafe { (&*now, &mut *last, &mut *delta) };
    let used = used();
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        delta[slot] = now[slot].wrapping_sub(last[slot]);
        last[slot] = now[slot];
        slot += 1;
    }
    Some(delta)
}

/// Adds `delta` to the leaving task's entry (only its CPU writes it).
#[inline(always)]
fn add_to_task(delta: &[u64; MAX_COUNTERS]) {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(entry) = entry(&TASK_TOTALS, &tid) else {
        return;
    };
    let used = used();
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        // SAFETY: a live map value.
        unsafe { (*entry)[slot] = (*entry)[slot].wrapping_add(delta[slot]) };
        slot += 1;
    }
}

/// Adds `delta` to the current task's cgroup's entry, atomically: several CPUs add to one.
#[inline(always)]
fn add_to_cgroup(delta: &[u64; MAX_COUNTERS]) {
    // SAFETY: a helper without preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    let Some(entry) = entry(&CGROUP_TOTALS, &cgroup) else {
        return;
    };
    let used = used();
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        // SAFETY: a naturally aligned u64 of a live map value.
        unsafe { atomic_add(&raw mut (*entry)[slot], delta[slot]) };
        slot += 1;
    }
}

/// `map[key]`, inserted zeroed if absent.
#[inline(always)]
fn entry<K>(map: &HashMap<K, [u64; MAX_COUNTERS]>, key: &K) -> Option<*mut [u64; MAX_COUNTERS]> {
    entry_or_zeroed(map, key, || ZERO.get_ptr(0))
}

#[inline(always)]
fn used() -> usize {
    // SAFETY: reading a static the loader patched; volatile keeps the load.
    unsafe { core::ptr::read_volatile(&NUM_COUNTERS) as usize }
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
