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

/// A task local storage map (`BPF_MAP_TYPE_TASK_STORAGE`, Linux 5.11): one value per task,
/// kept in the task itself and freed with it: no count of tasks bounds it, and nothing is left
/// behind by a thread that exits unseen (its lookup costs about a tid-keyed hash map's here,
/// `docs/cost.md`). aya-ebpf 0.3 wraps the inode, socket and cgroup kinds but not this
/// one; the kernel wants it BTF-defined (its key and value types named in the object's BTF), so
/// it is declared as aya-ebpf's `btf_maps` are: a `.maps` struct whose fields' types say what
/// the map is. Declare one with `#[unsafe(link_section = ".maps")]` and
/// `#[unsafe(export_name = "NAME")]`; user space loads it with `allow_unsupported_maps` (aya
/// 0.16 has no type for it, and none is needed: only programs touch it).
#[repr(C)]
pub struct TaskStorage<T> {
    r#type: *const [i32; aya_ebpf::bindings::bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    // The kernel's rules for local storage: no preallocation, no size.
    max_entries: *const [i32; 0],
    map_flags: *const [i32; aya_ebpf::bindings::BPF_F_NO_PREALLOC as usize],
}

// SAFETY: the fields are placeholders the loader reads from BTF, never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    /// The definition the loader reads (the values are in the field types).
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        Self {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    /// The current task's value, created (zeroed) if `create` and absent. `None`: absent, or
    /// it could not be allocated.
    #[inline(always)]
    pub fn current(&self, create: bool) -> Option<*mut T> {
        let flags = if create {
            u64::from(aya_ebpf::bindings::BPF_LOCAL_STORAGE_GET_F_CREATE)
        } else {
            0
        };
        // SAFETY: this map's definition, the current task (a BTF pointer the verifier knows),
        // and no initial value (zeroes).
        let value = unsafe {
            aya_ebpf::helpers::generated::bpf_task_storage_get(
                core::ptr::from_ref(self).cast_mut().cast(),
                aya_ebpf::helpers::generated::bpf_get_current_task_btf(),
                core::ptr::null_mut(),
                flags,
            )
        };
        (!value.is_null()).then_some(value.cast::<T>())
    }

    /// Drops the current task's value, if any.
    #[inline(always)]
    pub fn remove_current(&self) {
        // SAFETY: as in `current`.
        unsafe {
            aya_ebpf::helpers::generated::bpf_task_storage_delete(
                core::ptr::from_ref(self).cast_mut().cast(),
                aya_ebpf::helpers::generated::bpf_get_current_task_btf(),
            );
        }
    }
}
