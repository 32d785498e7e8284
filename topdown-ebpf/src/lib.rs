// topdown-user names this crate as a build-dependency (cargo then rebuilds the eBPF object
// when its sources change). The programs are in main.rs (topdown's) and floor.rs (the
// benchmark's floor); what both must do the same way is here.
#![no_std]
// Built for the host too (as topdown-user's build-dependency), on stable and beside std: the
// atomic intrinsic and the panic handler are the BPF build's only.
#![cfg_attr(
    target_arch = "bpf",
    allow(internal_features),
    feature(core_intrinsics)
)]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_smp_processor_id, generated::bpf_loop},
    maps::{HashMap, PerfEventArray},
};
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

/// # Safety
/// `target` must be a valid, 8-byte aligned u64 in a map value.
#[cfg(target_arch = "bpf")]
#[inline(always)]
pub unsafe fn atomic_add(target: *mut u64, value: u64) {
    use core::intrinsics::{AtomicOrdering, atomic_xadd};
    // SAFETY: guaranteed by the caller.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(target, value) };
}

/// Both programs' (no code path of theirs panics: the verifier would refuse the loop).
#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// `map[key]`, inserted as a copy of `zero()` (a map value of zeroes nobody writes: entries are
/// too big for the stack) when absent. Another CPU may insert the same key first (the insert
/// fails then): the lookup after it finds that entry. `None`: the map is full.
#[inline(always)]
pub fn entry_or_zeroed<K, V>(
    map: &HashMap<K, V>,
    key: &K,
    zero: impl FnOnce() -> Option<*const V>,
) -> Option<*mut V> {
    if let Some(entry) = map.get_ptr_mut(key) {
        return Some(entry);
    }
    let zero = zero()?;
    // SAFETY: `zero` points at a live map value of the entry's type.
    let _ = map.insert(key, unsafe { &*zero }, BPF_NOEXIST as u64);
    map.get_ptr_mut(key)
}

/// A step of `repeat`: called with the step's index and the context; returns 0 to go on, 1 to
/// stop.
pub type Step = extern "C" fn(u64, *mut core::ffi::c_void) -> i64;

/// Runs `step` up to `count` times on `context` through `bpf_loop` (Linux 5.17): the verifier
/// walks the step once, where an unrolled loop of as many steps costs it most of its
/// instruction budget.
#[inline(always)]
pub fn repeat<C>(count: u32, step: Step, context: &mut C) {
    // SAFETY: `step` has the callback signature bpf_loop expects, and `context` outlives the
    // call.
    unsafe {
        bpf_loop(
            count,
            step as *mut core::ffi::c_void,
            (context as *mut C).cast(),
            0,
        );
    }
}
