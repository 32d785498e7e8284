//! Function probes: entry pushes a frame holding the thread's virtual counters; return pops it
//! and adds inclusive = virtual now - virtual at entry, exclusive = inclusive - probed callees'
//! inclusive. Virtual counters only advance while the thread is on a CPU, so preemption,
//! migration and sleeping inside a function never add another task's counts to it.

use aya_ebpf::{
    EbpfContext as _,
    bindings::{BPF_NOEXIST, pt_regs},
    helpers::bpf_get_attach_cookie,
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use topdown_common::{CallKey, MAX_COUNTERS, MAX_DEPTH, ProbeStats, ROOT_FUNCTION, ShadowStack};

use crate::{
    counters::{add, current_ids, is_tracked, read_slots},
    maps::{
        CALLS, CPU_STATE, FILTER_TGIDS, NUM_COUNTERS, PROBE_STATS, SPLIT_FUNCTIONS_BY_PROCESS,
        STACKS, TASKS, ZERO_CALL, ZERO_STACK, atomic_add, generation, global,
    },
};

/// How far the stack pointer moves between a function's entry and its return probe: x86-64's
/// `ret` pops the return address; arm64's does not touch sp.
#[cfg(bpf_target_arch = "x86_64")]
const RETURN_SP_ADJUST: u64 = 8;
#[cfg(not(bpf_target_arch = "x86_64"))]
const RETURN_SP_ADJUST: u64 = 0;

#[inline(always)]
fn stack_pointer(regs: *mut pt_regs) -> u64 {
    // SAFETY: the probe context's registers are readable.
    #[cfg(bpf_target_arch = "x86_64")]
    let sp = unsafe { (*regs).rsp };
    #[cfg(bpf_target_arch = "aarch64")]
    let sp = unsafe { (*regs).sp };
    #[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
    let sp: u64 = {
        let _ = regs;
        0
    };
    // Both arches' pt_regs hold the stack pointer as a u64 (`rsp`, `sp`).
    sp
}

/// A frame index the verifier can see is in bounds, with no panic path for the compiler to
/// add. Callers check the range first, but LLVM then drops a plain mask as redundant and indexes
/// with a register the verifier has no bounds for; the volatile read keeps the mask in place.
#[inline(always)]
fn frame_index(index: usize) -> usize {
    const _: () = assert!(MAX_DEPTH.is_power_of_two());
    // SAFETY: reading a local.
    let opaque = unsafe { core::ptr::read_volatile(&index) };
    opaque & (MAX_DEPTH - 1)
}

#[inline(always)]
fn probe_stats() -> Option<&'static mut ProbeStats> {
    // SAFETY: a per-CPU value; probe programs on one CPU may interleave through preemption,
    // which at worst loses an increment of these diagnostic counts.
    PROBE_STATS
        .get_ptr_mut(0)
        .map(|stats| unsafe { &mut *stats })
}

/// The thread's virtual counters into `stack.virtual_now`: its accumulated counts plus what this
/// CPU counted since the thread was switched in. Retries if a context switch interleaved.
#[inline(always)]
fn virtual_counters(stack: &mut ShadowStack, tid: u32) -> bool {
    let Some(state) = CPU_STATE.get_ptr(0) else {
        return false;
    };
    let used = global(&NUM_COUNTERS) as usize;
    let mut attempt = 0;
    while attempt < 3 {
        attempt += 1;
        // SAFETY: a per-CPU map value; read volatile because a switch may change it under us.
        let seq = unsafe { core::ptr::read_volatile(&(*state).seq) };
        // SAFETY: as above.
        if unsafe { (*state).initialized == 0 || (*state).frozen != 0 } {
            return false;
        }
        // Counters being replaced (CPU hotplug), or not yet re-baselined: no reading.
        let counters_generation = generation();
        // SAFETY: as above.
        if counters_generation != unsafe { (*state).generation } {
            return false;
        }
        if read_slots(&mut stack.now).is_none() || generation() != counters_generation {
            return false;
        }
        // SAFETY: map value pointers.
        let task = unsafe { TASKS.get(&tid) };
        let mut slot = 0;
        while slot < MAX_COUNTERS && slot < used {
            let accumulated = task.map_or(0, |task| task.counters[slot]);
            // SAFETY: as above.
            let last = unsafe { (*state).last[slot] };
            stack.virtual_now[slot] = accumulated.wrapping_add(stack.now[slot].wrapping_sub(last));
            slot += 1;
        }
        // SAFETY: as above.
        if unsafe { core::ptr::read_volatile(&(*state).seq) } == seq {
            return true;
        }
    }
    false
}

/// Only tasks whose counts are attributed to them can have meaningful virtual counters.
#[inline(always)]
fn probed_task() -> Option<(u32, u32)> {
    let (tid, tgid) = current_ids();
    if global(&FILTER_TGIDS) != 0 && !is_tracked(tgid) {
        return None;
    }
    Some((tid, tgid))
}

/// Per-point attach (one perf link per function): kernels without uprobe.multi.
#[uprobe]
pub fn func_entry(ctx: ProbeContext) -> u32 {
    on_entry(&ctx)
}

/// One uprobe.multi link for all functions of a binary (Linux >= 6.6).
#[uprobe(multi)]
pub fn func_entry_multi(ctx: ProbeContext) -> u32 {
    on_entry(&ctx)
}

#[uretprobe]
pub fn func_return(ctx: RetProbeContext) -> u32 {
    on_return(ctx.regs, RETURN_SP_ADJUST)
}

#[uretprobe(multi)]
pub fn func_return_multi(ctx: RetProbeContext) -> u32 {
    on_return(ctx.regs, RETURN_SP_ADJUST)
}

/// A uprobe on a function's exit instruction (`ret`, tail-call `jmp`): the stack pointer is
/// still the one the function had at entry, and no return address was rewritten, so C++
/// exceptions unwind normally and no kernel nesting limit applies.
#[uprobe]
pub fn func_exit(ctx: ProbeContext) -> u32 {
    on_return(ctx.regs, 0)
}

#[uprobe(multi)]
pub fn func_exit_multi(ctx: ProbeContext) -> u32 {
    on_return(ctx.regs, 0)
}

#[inline(always)]
fn on_entry(ctx: &ProbeContext) -> u32 {
    let Some((tid, _)) = probed_task() else {
        return 0;
    };
    // SAFETY: reading the attach cookie of this probe.
    let function = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let sp = stack_pointer(ctx.regs);
    let stack = match STACKS.get_ptr_mut(&tid) {
        Some(stack) => stack,
        None => {
            let Some(zero) = ZERO_STACK.get_ptr(0) else {
                return 0;
            };
            // SAFETY: a map value of the right type.
            if STACKS
                .insert(&tid, unsafe { &*zero }, BPF_NOEXIST as u64)
                .is_err()
            {
                if let Some(stats) = probe_stats() {
                    stats.map_full += 1;
                }
                return 0;
            }
            let Some(stack) = STACKS.get_ptr_mut(&tid) else {
                return 0;
            };
            stack
        }
    };
    // SAFETY: this thread's stack; only its own probes touch it.
    let stack = unsafe { &mut *stack };
    // A live caller's frame has a higher stack pointer than any callee's entry. A frame at or
    // below ours was left without a return (longjmp, exception).
    let mut guard = 0;
    while guard < MAX_DEPTH && stack.depth > 0 {
        guard += 1;
        let top = (stack.depth - 1) as usize;
        if top >= MAX_DEPTH || stack.frames[frame_index(top)].sp > sp {
            break;
        }
        stack.depth -= 1;
        if let Some(stats) = probe_stats() {
            stats.missed_returns += 1;
        }
    }
    let depth = stack.depth as usize;
    if depth >= MAX_DEPTH {
        // The kernel gives this call no return probe either.
        if let Some(stats) = probe_stats() {
            stats.overflows += 1;
        }
        return 0;
    }
    if !virtual_counters(stack, tid) {
        if let Some(stats) = probe_stats() {
            stats.read_failures += 1;
        }
        return 0;
    }
    let frame = &mut stack.frames[frame_index(depth)];
    frame.function = function;
    frame.sp = sp;
    frame.entry = stack.virtual_now;
    frame.callees = [0; MAX_COUNTERS];
    frame.callee_calls = 0;
    stack.depth += 1;
    0
}

#[inline(always)]
fn on_return(regs: *mut pt_regs, sp_adjust: u64) -> u32 {
    let Some((tid, tgid)) = probed_task() else {
        return 0;
    };
    let Some(stack) = STACKS.get_ptr_mut(&tid) else {
        return 0;
    };
    // SAFETY: this thread's stack; only its own probes touch it.
    let stack = unsafe { &mut *stack };
    let entry_sp = stack_pointer(regs).wrapping_sub(sp_adjust);
    // Frames deeper than the returning one lost their returns.
    let mut guard = 0;
    while guard < MAX_DEPTH && stack.depth > 0 {
        guard += 1;
        let top = (stack.depth - 1) as usize;
        if top >= MAX_DEPTH || stack.frames[frame_index(top)].sp >= entry_sp {
            break;
        }
        stack.depth -= 1;
        if let Some(stats) = probe_stats() {
            stats.missed_returns += 1;
        }
    }
    let depth = stack.depth as usize;
    let matches =
        depth > 0 && depth <= MAX_DEPTH && stack.frames[frame_index(depth - 1)].sp == entry_sp;
    if !matches {
        if let Some(stats) = probe_stats() {
            stats.unmatched_returns += 1;
        }
        return 0;
    }
    if !virtual_counters(stack, tid) {
        // Drop the frame: its numbers cannot be known.
        stack.depth -= 1;
        if let Some(stats) = probe_stats() {
            stats.read_failures += 1;
        }
        return 0;
    }
    let used = global(&NUM_COUNTERS) as usize;
    let top = depth - 1;
    // Indexing goes through get()/get_mut(): a bounds-check panic would leave the program
    // without an exit, which the verifier rejects.
    let frame = &stack.frames[frame_index(top)];
    let function = frame.function;
    let callee_calls = frame.callee_calls;
    // Scratch reuse (the BPF stack is 512 bytes): `now` becomes the inclusive figure and
    // `virtual_now` the exclusive one.
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        let inclusive = stack.virtual_now[slot].wrapping_sub(frame.entry[slot]);
        stack.now[slot] = inclusive;
        stack.virtual_now[slot] = inclusive.wrapping_sub(frame.callees[slot]);
        slot += 1;
    }
    stack.depth -= 1;
    let parent = if top > 0 {
        let caller = &mut stack.frames[frame_index(top - 1)];
        add(&mut caller.callees, &stack.now, used);
        caller.callee_calls += 1;
        caller.function
    } else {
        ROOT_FUNCTION
    };
    let key = CallKey {
        function,
        parent,
        tgid: if global(&SPLIT_FUNCTIONS_BY_PROCESS) != 0 {
            tgid
        } else {
            0
        },
        _pad: 0,
    };
    let stats = match CALLS.get_ptr_mut(&key) {
        Some(stats) => stats,
        None => {
            if let Some(zero) = ZERO_CALL.get_ptr(0) {
                // SAFETY: a per-CPU map value nobody writes: all zeroes.
                let _ = CALLS.insert(&key, unsafe { &*zero }, BPF_NOEXIST as u64);
            }
            match CALLS.get_ptr_mut(&key) {
                Some(stats) => stats,
                None => {
                    if let Some(stats) = probe_stats() {
                        stats.map_full += 1;
                    }
                    return 0;
                }
            }
        }
    };
    // Two CPUs may update one function's totals at once: add atomically (BPF atomic add).
    // SAFETY: naturally aligned u64 fields of a live map value.
    unsafe { atomic_add(&raw mut (*stats).calls, 1) };
    // SAFETY: as above.
    unsafe { atomic_add(&raw mut (*stats).callee_calls, callee_calls) };
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        // SAFETY: as above.
        unsafe {
            atomic_add(&raw mut (*stats).inclusive[slot], stack.now[slot]);
            atomic_add(&raw mut (*stats).exclusive[slot], stack.virtual_now[slot]);
        }
        slot += 1;
    }
    0
}
