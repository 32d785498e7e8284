// topdown-user names this crate as a build-dependency (cargo then rebuilds the eBPF object
// when its sources change). The programs are in main.rs (topdown's) and floor.rs (the
// benchmark's floor); what both must do the same way is here.
#![no_std]

use aya_ebpf::{helpers::bpf_get_smp_processor_id, maps::PerfEventArray};
use topdown_common::{MAX_COUNTERS, slot_source};

/// `bpf_perf_event_read_value`'s error for a slot with no event on this CPU (a hybrid CPU's
/// other core type): read as zero.
const ENOENT: i32 = -2;

/// Reads the first `used` counter slots of this CPU into `out`, each from the fd slot and field
/// `sources` gives (`COUNTERS[cpu * MAX_COUNTERS + fd slot]`): one helper call per fd, its
/// timing slots taken from the same reading. Returns the enabled and running times of the first
/// counter present on this CPU, or `None` if a read failed.
#[inline(always)]
pub fn read_counter_slots(
    counters: &PerfEventArray<u32>,
    used: usize,
    sources: &[u32; MAX_COUNTERS],
    out: &mut [u64; MAX_COUNTERS],
) -> Option<(u64, u64)> {
    // SAFETY: a helper without preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let base = cpu.wrapping_mul(MAX_COUNTERS as u32);
    let mut times: Option<(u64, u64)> = None;
    let mut value = (0u64, 0u64, 0u64);
    let mut last_fd = u32::MAX;
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        // SAFETY: `slot < MAX_COUNTERS`; volatile so the loader's values are read, not the default.
        let source = unsafe { core::ptr::read_volatile(sources.as_ptr().add(slot)) };
        let fd_slot = slot_source::fd_slot(source) % MAX_COUNTERS as u32;
        // Timing slots follow their counter's slot: one helper call serves all three.
        if fd_slot != last_fd {
            value = match counters.read_value(base + fd_slot) {
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
