//! The benchmark's floor instrument (`cargo xtask bench`, run by `topdown-floor`).
//!
//! `empty_switch` does nothing: what it adds per context switch is what any `tp_btf/sched_switch`
//! program costs. `empty_uprobe` does nothing either: attached where topdown hooks a Go
//! runtime's goroutine switches, it is what any probe there costs. The others read every counter of this CPU the way topdown's `read_slots`
//! (counters.rs) does, from a map laid out as topdown's (`COUNTERS[cpu * MAX_COUNTERS + fd
//! slot]`, `NUM_COUNTERS`, `SLOT_SOURCES`), into a per-CPU scratch, and do nothing else: what
//! they add is the least any tool reading the same counters at the same points must pay.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::bpf_get_smp_processor_id,
    macros::{btf_tracepoint, map, uprobe, uretprobe},
    maps::{PerCpuArray, PerfEventArray},
    programs::{BtfTracePointContext, ProbeContext, RetProbeContext},
};
use topdown_common::{MAX_COUNTERS, slot_source};

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

#[btf_tracepoint(function = "sched_switch")]
pub fn empty_switch(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_switch")]
pub fn floor_switch(_ctx: BtfTracePointContext) -> i32 {
    read_all();
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

/// The loop of topdown's `counters::read_slots`: one `bpf_perf_event_read_value` per fd,
/// timing slots taken from their counter's reading.
#[inline(always)]
fn read_all() {
    let Some(out) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a map value pointer of this CPU, which nothing else writes meanwhile.
    let out = unsafe { &mut *out };
    // SAFETY: reading a static the loader patched; volatile keeps the load.
    let used = unsafe { core::ptr::read_volatile(&NUM_COUNTERS) } as usize;
    // SAFETY: a helper without preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let base = cpu.wrapping_mul(MAX_COUNTERS as u32);
    let mut value = (0u64, 0u64, 0u64);
    let mut last_fd = u32::MAX;
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        // SAFETY: `slot < MAX_COUNTERS`; volatile so the loader's values are read.
        let source = unsafe { core::ptr::read_volatile(SLOT_SOURCES.as_ptr().add(slot)) };
        let fd_slot = slot_source::fd_slot(source) % MAX_COUNTERS as u32;
        if fd_slot != last_fd {
            value = match COUNTERS.read_value(base + fd_slot) {
                Ok(read) => (read.counter, read.enabled_nanos, read.running_nanos),
                Err(_) => (0, 0, 0),
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
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
