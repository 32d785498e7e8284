//! Function probes: entry pushes a frame holding the thread's virtual counters; return pops it
//! and adds inclusive = virtual now - virtual at entry, exclusive = inclusive - probed callees'
//! inclusive. Virtual counters only advance while the thread is on a CPU, so preemption,
//! migration and sleeping inside a function never add another task's counts to it.

use aya_ebpf::{
    EbpfContext as _,
    bindings::pt_regs,
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_task, bpf_get_smp_processor_id,
        bpf_probe_read_kernel, bpf_probe_read_user,
    },
    macros::{tracepoint, uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use topdown_common::{
    CallKey, FileAddress, MAX_COUNTERS, MAX_DEPTH, MAX_FUNCTION_RANGES, ProbeStats, ROOT_FUNCTION,
    ShadowStack, VirtualBase, entry_cookie, exit_point, frame_flags, histogram as histogram_kind,
    pt_regs_word, reading_owner, thread_exit_field,
};

use crate::{
    counters::{add, current_ids, current_is_traced, is_tracked, read_slots, recover_reading},
    histogram,
    maps::{
        CALLS, CPU_STATE, FILTER_TGIDS, INDIRECT_JUMPS, NUM_COUNTERS, PROBE_STATS, RETURN_TARGETS,
        SKIP_UNTRACED, SPLIT_FUNCTIONS_BY_PROCESS, STACKS, TASKS, THREAD_EXIT_FIELDS, ZERO_CALL,
        atomic_add, atomic_swap, entry_or_zeroed, generation, global, switch_state,
    },
};
use topdown_ebpf::repeat;

/// How far the stack pointer moves between a function's entry and its return probe: x86-64's
/// `ret` pops the return address; arm64's does not touch sp.
#[cfg(bpf_target_arch = "x86_64")]
const RETURN_SP_ADJUST: u64 = 8;
#[cfg(not(bpf_target_arch = "x86_64"))]
const RETURN_SP_ADJUST: u64 = 0;

#[inline(always)]
pub(crate) fn stack_pointer(regs: *mut pt_regs) -> u64 {
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
pub(crate) fn frame_index(index: usize) -> usize {
    const _: () = assert!(MAX_DEPTH.is_power_of_two());
    // SAFETY: reading a local.
    let opaque = unsafe { core::ptr::read_volatile(&index) };
    opaque & (MAX_DEPTH - 1)
}

#[inline(always)]
pub(crate) fn probe_stats() -> Option<&'static mut ProbeStats> {
    // SAFETY: a per-CPU value; probe programs on one CPU may interleave through preemption,
    // which at worst loses an increment of these diagnostic counts.
    PROBE_STATS
        .get_ptr_mut(0)
        .map(|stats| unsafe { &mut *stats })
}

/// The thread's virtual counters into `virtual_now` (`now` is scratch): its accumulated counts
/// plus what this CPU counted since the thread was switched in. Retries if a context switch
/// interleaved. Span probes (`spans`) read them the same way.
#[inline(always)]
pub(crate) fn virtual_counters(
    now: &mut [u64; MAX_COUNTERS],
    virtual_now: &mut [u64; MAX_COUNTERS],
    tid: u32,
) -> bool {
    read_virtual(now, virtual_now, Some(tid), None)
}

/// `virtual_counters`, through the thread's `VirtualBase`: while its CPU has taken no reading
/// since the base was made, `virtual_now` is `base + now` and the task entry is not looked up
/// (the same values: the entry and `CpuState::last` change only at a reading). Otherwise the
/// entry is read and the base made again. The current thread's: its tid is asked of the kernel
/// only then, as probes ask for it only where their mode needs it (`task_is_probed`).
#[inline(always)]
pub(crate) fn virtual_counters_cached(
    now: &mut [u64; MAX_COUNTERS],
    virtual_now: &mut [u64; MAX_COUNTERS],
    base: &mut VirtualBase,
) -> bool {
    read_virtual(now, virtual_now, None, Some(base))
}

/// Both: `accumulated - last` per slot (into `base`, or `virtual_now` itself), then `+ now`.
/// `tid`: the current thread's, or `None` to ask for it if the task entry is needed.
#[inline(always)]
fn read_virtual(
    now: &mut [u64; MAX_COUNTERS],
    virtual_now: &mut [u64; MAX_COUNTERS],
    tid: Option<u32>,
    mut base: Option<&mut VirtualBase>,
) -> bool {
    let Some(state) = CPU_STATE.get_ptr(0) else {
        return false;
    };
    let used = global(&NUM_COUNTERS) as usize;
    // SAFETY: a helper without preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
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
        if read_slots(now).is_none() || generation() != counters_generation {
            return false;
        }
        let cached = base.as_ref().is_some_and(|base| {
            base.valid != 0
                && base.cpu == cpu
                && base.seq == seq
                && base.generation == counters_generation
        });
        if !cached {
            let tid = tid.unwrap_or_else(|| current_ids().0);
            // SAFETY: map value pointers.
            let task = unsafe { TASKS.get(&tid) };
            let mut slot = 0;
            while slot < MAX_COUNTERS && slot < used {
                let accumulated = task.map_or(0, |task| task.counters[slot]);
                // SAFETY: as above.
                let last = unsafe { (*state).last[slot] };
                let slot_base = accumulated.wrapping_sub(last);
                match base.as_mut() {
                    Some(base) => base.base[slot] = slot_base,
                    None => virtual_now[slot] = slot_base,
                }
                slot += 1;
            }
        }
        // SAFETY: as above.
        if unsafe { core::ptr::read_volatile(&(*state).seq) } != seq {
            if let Some(base) = base.as_mut() {
                base.valid = 0;
            }
            continue;
        }
        if let Some(base) = base.as_mut() {
            base.valid = 1;
            base.cpu = cpu;
            base.seq = seq;
            base.generation = counters_generation;
        }
        let mut slot = 0;
        while slot < MAX_COUNTERS && slot < used {
            let slot_base = match base.as_ref() {
                Some(base) => base.base[slot],
                None => virtual_now[slot],
            };
            virtual_now[slot] = slot_base.wrapping_add(now[slot]);
            slot += 1;
        }
        return true;
    }
    false
}

/// How `enter` and `leave` put the counters of what runs the frames (a thread, a goroutine)
/// into `stack.virtual_now`. A trait whose method is always inlined, not a closure: the
/// closure became a BPF subprogram of its own, and verifying `func_entry_multi` with it took
/// more than the verifier's 1M instructions at level 2 (13 counters).
pub(crate) trait ReadCounters {
    fn read(self, stack: &mut ShadowStack) -> bool;
}

/// The current thread's virtual counters (`virtual_counters_cached`).
pub(crate) struct ThreadCounters;

impl ReadCounters for ThreadCounters {
    #[inline(always)]
    fn read(self, stack: &mut ShadowStack) -> bool {
        virtual_counters_cached(&mut stack.now, &mut stack.virtual_now, &mut stack.base)
    }
}

/// Only tasks whose counts are attributed to them can have meaningful virtual counters. Their
/// tid and tgid, for probes that need them.
#[inline(always)]
pub(crate) fn probed_task() -> Option<(u32, u32)> {
    probed_task_ids(true).map(|ids| ids.unwrap_or_else(current_ids))
}

/// `probed_task` for probes that need no ids (those of `virtual_counters_cached`): without
/// `-p`, `-- CMD` or a cgroup filter every task is probed, and the ids are not asked for. A
/// helper's call and return are a visible share of a probe's time on this VM's AMD host
/// (`docs/cost.md`).
#[inline(always)]
pub(crate) fn task_is_probed() -> bool {
    probed_task_ids(false).is_some()
}

/// `None`: not probed. `Some(None)`: probed, ids not read (only if not `always`).
#[inline(always)]
fn probed_task_ids(always: bool) -> Option<Option<(u32, u32)>> {
    if !always && global(&SKIP_UNTRACED) == 0 && global(&FILTER_TGIDS) == 0 {
        return Some(None);
    }
    let (tid, tgid) = current_ids();
    if global(&SKIP_UNTRACED) != 0 {
        // Readings are skipped at untraced switches: `last` is this task's own baseline only
        // if the CPU's last reading was at or after its switch-in, which is what a traced
        // owner means (`topdown_common::reading_owner`).
        let state = CPU_STATE.get_ptr_mut(0)?;
        let switch = switch_state();
        // SAFETY: this CPU's entry (the probe runs with migration disabled); volatile because
        // a switch (or a flush's IPI) may change it under us.
        let owner = unsafe { core::ptr::read_volatile(&(*switch).owner) };
        let owned = reading_owner::pack(reading_owner::TRACED, tid);
        if owner == owned {
            return Some(Some((tid, tgid)));
        }
        if !current_is_traced(tid, tgid) {
            return None;
        }
        if reading_owner::claimable_by(owner, tid) {
            // The last reading saw an untraced task (or idle) arrive, or saw nobody arrive,
            // and this traced one runs instead: a switch sched_switch did not report. What ran
            // since that reading is the stretches before this task and its own: claim it
            // (`delta_belongs_to`).
            // SAFETY: an aligned u64 of this CPU's entry. Atomic, and checked again:
            // on preemptible kernels a switch may run between the load above and this.
            let before = unsafe { atomic_swap(&raw mut (*switch).owner, owned) };
            if before == owner || before == owned || reading_owner::claimable_by(before, tid) {
                if reading_owner::kind(before) == reading_owner::NONE {
                    // SAFETY: a per-CPU map value's aligned u64; a switch on this CPU adds to it
                    // non-atomically, but cannot run inside this one instruction.
                    unsafe { atomic_add(&raw mut (*state).unseen_arrivals, 1) };
                }
                return Some(Some((tid, tgid)));
            }
            // SAFETY: as above. Put back what the switch left.
            unsafe { core::ptr::write_volatile(&raw mut (*switch).owner, before) };
        } else if recover_reading(state, tid) {
            // Another traced task left unseen: the delta spanning both went to `untracked`.
            return Some(Some((tid, tgid)));
        }
        if let Some(stats) = probe_stats() {
            stats.read_failures += 1;
        }
        return None;
    }
    if global(&FILTER_TGIDS) != 0 && !is_tracked(tgid) {
        return None;
    }
    Some(Some((tid, tgid)))
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
    let function = attach_cookie(ctx.as_ptr()) as u32;
    on_return(ctx.regs, RETURN_SP_ADJUST, function, exit_point::RETURN)
}

#[uretprobe(multi)]
pub fn func_return_multi(ctx: RetProbeContext) -> u32 {
    let function = attach_cookie(ctx.as_ptr()) as u32;
    on_return(ctx.regs, RETURN_SP_ADJUST, function, exit_point::RETURN)
}

/// A uprobe on a function's exit instruction (`ret`, tail-call `jmp`): the stack pointer is
/// still the one the function had at entry, and no return address was rewritten, so C++
/// exceptions unwind normally and no kernel nesting limit applies.
#[uprobe]
pub fn func_exit(ctx: ProbeContext) -> u32 {
    on_exit(&ctx)
}

#[uprobe(multi)]
pub fn func_exit_multi(ctx: ProbeContext) -> u32 {
    on_exit(&ctx)
}

#[inline(always)]
pub(crate) fn attach_cookie(ctx: *mut core::ffi::c_void) -> u64 {
    // SAFETY: reading the attach cookie of this probe.
    unsafe { bpf_get_attach_cookie(ctx) }
}

#[inline(always)]
fn on_exit(ctx: &ProbeContext) -> u32 {
    let Some((function, kind)) = exit_of(ctx) else {
        return 0;
    };
    on_return(ctx.regs, 0, function, kind)
}

/// The function and `exit_point` kind of an exit site's probe, from its attach cookie; `None`
/// for an indirect jump that stays inside its function this time.
#[inline(always)]
pub(crate) fn exit_of(ctx: &ProbeContext) -> Option<(u32, u64)> {
    let cookie = attach_cookie(ctx.as_ptr());
    let mut kind = exit_point::kind(cookie);
    if kind == exit_point::INDIRECT {
        kind = indirect_jump(ctx.regs, exit_point::index(cookie))?;
    }
    Some((exit_point::function(cookie), kind))
}

/// What an indirect jump does this time: `None` when it stays inside its function (a jump
/// table), else `TAIL_CALL` when the target is a function whose returns are probed, `CUT`
/// otherwise.
#[inline(always)]
pub(crate) fn indirect_jump(regs: *mut pt_regs, index: u32) -> Option<u64> {
    // SAFETY: a map value nobody changes while probes are attached.
    let jump = unsafe { INDIRECT_JUMPS.get(&index) }?;
    let ip = register(regs, pt_regs_word::IP)?;
    let operand = effective_address(
        regs,
        jump.displacement as u64,
        jump.base,
        jump.index,
        jump.scale,
    )?;
    let target = if jump.memory != 0 {
        // SAFETY: a user address read through the helper, which fails cleanly.
        match unsafe { bpf_probe_read_user(operand as *const u64) } {
            Ok(target) => target,
            Err(_) => {
                if let Some(stats) = probe_stats() {
                    stats.read_failures += 1;
                }
                return None;
            }
        }
    } else {
        operand
    };
    // The same load bias applies to the jump and to any target in the same file.
    let in_file = jump.address.wrapping_add(target.wrapping_sub(ip));
    let mut range = 0;
    while range < MAX_FUNCTION_RANGES {
        let [start, end] = jump.ranges[range];
        // Its own first instruction: a tail call to itself, which enters it again.
        let reentry = range == 0 && in_file == start;
        if in_file >= start && in_file < end && !reentry {
            return None;
        }
        range += 1;
    }
    let key = FileAddress {
        file: jump.file,
        _pad: 0,
        address: in_file,
    };
    // SAFETY: reading a map value's presence.
    let probed = in_file < jump.file_end && unsafe { RETURN_TARGETS.get(&key) }.is_some();
    Some(if probed {
        exit_point::TAIL_CALL
    } else {
        exit_point::CUT
    })
}

/// An x86 memory operand's address, `displacement + base + index * scale` (`pt_regs_word::NONE`:
/// no base or no index): an indirect jump's operand, a USDT argument's location.
#[inline(always)]
pub(crate) fn effective_address(
    regs: *mut pt_regs,
    displacement: u64,
    base: u8,
    index: u8,
    scale: u8,
) -> Option<u64> {
    let mut address = displacement;
    if base != pt_regs_word::NONE {
        address = address.wrapping_add(register(regs, base)?);
    }
    if index != pt_regs_word::NONE {
        address = address.wrapping_add(register(regs, index)?.wrapping_mul(u64::from(scale)));
    }
    Some(address)
}

/// A register of the probe's context by its `pt_regs_word` index. The registers are copied
/// to the stack first (volatile, so the compiler cannot fold the copy back into one context
/// read at a variable offset, which the verifier refuses).
#[inline(always)]
pub(crate) fn register(regs: *mut pt_regs, word: u8) -> Option<u64> {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        const WORDS: usize = pt_regs_word::COUNT as usize;
        const _: () = assert!(core::mem::size_of::<pt_regs>() == WORDS * 8);
        // SAFETY: the probe context's registers are readable; pt_regs is WORDS u64s
        // (arch/x86/include/asm/ptrace.h).
        let copy: [u64; WORDS] = unsafe { core::ptr::read_volatile(regs.cast::<[u64; WORDS]>()) };
        copy.get(usize::from(word)).copied()
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        let _ = (regs, word);
        None
    }
}

#[inline(always)]
fn on_entry(ctx: &ProbeContext) -> u32 {
    if !task_is_probed() {
        return 0;
    }
    let cookie = attach_cookie(ctx.as_ptr());
    let sp = stack_pointer(ctx.regs);
    let Some(stack) = STACKS.current(true) else {
        // The kernel could not allocate it.
        if let Some(stats) = probe_stats() {
            stats.map_full += 1;
        }
        return 0;
    };
    // SAFETY: this thread's stack; only its own probes touch it.
    let stack = unsafe { &mut *stack };
    enter(stack, cookie, sp, ThreadCounters);
    0
}

/// Pushes the frame of a call entering with the entry cookie `cookie` at stack pointer `sp`
/// (or what stands for it: Go frames use their depth below the stack top), with the counters
/// `counters` puts into `stack.virtual_now`.
#[inline(always)]
pub(crate) fn enter(stack: &mut ShadowStack, cookie: u64, sp: u64, counters: impl ReadCounters) {
    let function = cookie as u32;
    // A live caller's frame has a higher stack pointer than any callee's entry, or the same
    // one when it tail-called this function. Any other frame at or below ours was left without
    // a return (longjmp, exception).
    let mut guard = 0;
    while guard < MAX_DEPTH && stack.depth > 0 {
        guard += 1;
        let top = (stack.depth - 1) as usize;
        if top >= MAX_DEPTH {
            break;
        }
        let below = &stack.frames[frame_index(top)];
        if below.sp > sp || (below.sp == sp && below.tail_calling & frame_flags::TAIL_CALLING != 0)
        {
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
        return;
    }
    if !counters.read(stack) {
        if let Some(stats) = probe_stats() {
            stats.read_failures += 1;
        }
        return;
    }
    let frame = &mut stack.frames[frame_index(depth)];
    frame.function = function;
    frame.tail_calling = if cookie & entry_cookie::URETPROBE != 0 {
        frame_flags::URETPROBE
    } else {
        0
    };
    frame.sp = sp;
    // Only the slots in use: everything that reads a frame stops at `used` too, and copying
    // all `MAX_COUNTERS` is 64 memory operations at every call with one counter.
    let used = global(&NUM_COUNTERS) as usize;
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        frame.entry[slot] = stack.virtual_now[slot];
        frame.callees[slot] = 0;
        slot += 1;
    }
    frame.callee_calls = 0;
    stack.depth += 1;
}

/// Tail callers closed with their callee at most, per return.
const MAX_TAIL_CHAIN: u32 = 8;

/// A return of `function` (or, for `ROOT_FUNCTION`, of an unprobed function that probed ones
/// tail-called) of kind `exit_point::*`: closes the frame whose entry stack pointer matches,
/// then the frames that tail-called it, innermost first, so each callee's inclusive figure is
/// added to its tail caller's callees.
#[inline(always)]
fn on_return(regs: *mut pt_regs, sp_adjust: u64, function: u32, kind: u64) -> u32 {
    if !task_is_probed() {
        return 0;
    }
    let Some(stack) = STACKS.current(false) else {
        return 0;
    };
    // SAFETY: this thread's stack; only its own probes touch it.
    let stack = unsafe { &mut *stack };
    let entry_sp = stack_pointer(regs).wrapping_sub(sp_adjust);
    leave(stack, None, entry_sp, function, kind, ThreadCounters);
    0
}

/// The return part of `on_return` on a stack already found: `entry_sp` is the stack pointer
/// the returning frame had at entry (for Go, its depth below the stack top), `counters` puts
/// into `stack.virtual_now`; `tgid` as in `close_top`.
#[inline(always)]
pub(crate) fn leave(
    stack: &mut ShadowStack,
    tgid: Option<u32>,
    entry_sp: u64,
    function: u32,
    kind: u64,
    counters: impl ReadCounters,
) {
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
    let (matches, top_function, top_tail_calling, top_uretprobe) =
        if depth > 0 && depth <= MAX_DEPTH {
            let top = &stack.frames[frame_index(depth - 1)];
            (
                top.sp == entry_sp,
                top.function,
                top.tail_calling & frame_flags::TAIL_CALLING != 0,
                top.tail_calling & frame_flags::URETPROBE != 0,
            )
        } else {
            (false, ROOT_FUNCTION, false, false)
        };
    let own = function != ROOT_FUNCTION;
    // A function whose own uretprobe closes it only marks its tail calls, wherever they go:
    // the uretprobe fires when the callee returns.
    let marks_only = own && top_uretprobe && top_function == function;
    if kind == exit_point::TAIL_CALL || (kind == exit_point::CUT && marks_only) {
        // A frame already tail-calling jumped into the middle of this function: it stays so.
        if matches && (top_function == function || top_tail_calling) {
            stack.frames[frame_index(depth - 1)].tail_calling |= frame_flags::TAIL_CALLING;
        } else if own && let Some(stats) = probe_stats() {
            stats.unmatched_returns += 1;
        }
        return;
    }
    // A return-only point closes only frames that tail-called into its function.
    if !matches || (!own && !top_tail_calling) {
        if own && let Some(stats) = probe_stats() {
            stats.unmatched_returns += 1;
        }
        return;
    }
    if kind == exit_point::CUT
        && let Some(stats) = probe_stats()
    {
        stats.tail_calls_cut += 1;
    }
    if !counters.read(stack) {
        // Drop the frame: its numbers cannot be known.
        stack.depth -= 1;
        if let Some(stats) = probe_stats() {
            stats.read_failures += 1;
        }
        return;
    }
    let mut closed = 0;
    while closed < MAX_TAIL_CHAIN {
        closed += 1;
        if !close_top(stack, tgid, false) {
            break;
        }
        let depth = stack.depth as usize;
        if depth == 0 || depth > MAX_DEPTH {
            break;
        }
        let next = &stack.frames[frame_index(depth - 1)];
        // A tail caller with a uretprobe of its own is closed by it, right after this.
        if next.sp != entry_sp
            || next.tail_calling & frame_flags::TAIL_CALLING == 0
            || next.tail_calling & frame_flags::URETPROBE != 0
        {
            break;
        }
    }
}

/// Pops the top frame with the counters in `stack.virtual_now` and adds its call to the
/// totals and to its caller's callees. `tgid`: the current process's, or `None` to ask for
/// it where the totals are split by process.
#[inline(always)]
pub(crate) fn close_top(stack: &mut ShadowStack, tgid: Option<u32>, unwound: bool) -> bool {
    let depth = stack.depth as usize;
    if depth == 0 || depth > MAX_DEPTH {
        return false;
    }
    let used = global(&NUM_COUNTERS) as usize;
    let top = depth - 1;
    let function = stack.frames[frame_index(top)].function;
    let callee_calls = stack.frames[frame_index(top)].callee_calls;
    // `now` becomes the inclusive figure (scratch reuse: the BPF stack is 512 bytes);
    // `virtual_now` stays the reading, for tail callers closed next.
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        let entry = stack.frames[frame_index(top)].entry[slot];
        stack.now[slot] = stack.virtual_now[slot].wrapping_sub(entry);
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
            tgid.unwrap_or_else(|| current_ids().1)
        } else {
            0
        },
        _pad: 0,
    };
    let Some(stats) = entry_or_zeroed(&CALLS, &key, || ZERO_CALL.get_ptr(0)) else {
        if let Some(stats) = probe_stats() {
            stats.map_full += 1;
        }
        return true;
    };
    // Two CPUs may update one function's totals at once: add atomically (BPF atomic add).
    // SAFETY: naturally aligned u64 fields of a live map value.
    unsafe { atomic_add(&raw mut (*stats).calls, 1) };
    if unwound {
        // SAFETY: as above.
        unsafe { atomic_add(&raw mut (*stats).unwound, 1) };
    }
    // SAFETY: as above.
    unsafe { atomic_add(&raw mut (*stats).callee_calls, callee_calls) };
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        let inclusive = stack.now[slot];
        let exclusive = inclusive.wrapping_sub(stack.frames[frame_index(top)].callees[slot]);
        // SAFETY: as above.
        unsafe {
            atomic_add(&raw mut (*stats).inclusive[slot], inclusive);
            atomic_add(&raw mut (*stats).exclusive[slot], exclusive);
        }
        slot += 1;
    }
    if !histogram::record(
        histogram_kind::FUNCTION,
        function,
        key.tgid,
        &stack.now,
        used,
        callee_calls,
    ) && let Some(stats) = probe_stats()
    {
        stats.histogram_full += 1;
    }
    true
}

/// Ends, as unwound calls, every open frame of the thread whose entry stack pointer is at or
/// below `limit_sp`, with the thread's counters now as their end.
#[inline(always)]
fn close_unwound(limit_sp: u64) {
    let Some((tid, tgid)) = probed_task() else {
        return;
    };
    let Some(stack) = STACKS.current(false) else {
        return;
    };
    // SAFETY: this thread's stack; only its own probes (and its own exit) touch it.
    let stack = unsafe { &mut *stack };
    let depth = stack.depth as usize;
    if depth == 0 || depth > MAX_DEPTH || stack.frames[frame_index(depth - 1)].sp > limit_sp {
        return;
    }
    if !virtual_counters(&mut stack.now, &mut stack.virtual_now, tid) {
        if let Some(stats) = probe_stats() {
            stats.read_failures += 1;
        }
        return;
    }
    let mut unwinding = Unwinding { tgid, limit_sp };
    repeat(MAX_DEPTH as u32, unwind_step, &mut unwinding);
}

/// What `unwind_step` closes: the thread's frames whose entry stack pointer is at or below
/// `limit_sp`.
#[repr(C)]
struct Unwinding {
    tgid: u32,
    limit_sp: u64,
}

/// One step of `close_unwound`, innermost frame first: 0 to go on, 1 to stop. Through
/// `bpf_loop` (Linux 5.17), as `goroutines::close_frames`: the verifier walks one close once,
/// where an unrolled loop of `MAX_DEPTH` closes took `func_catch` past its 1M-instruction
/// budget with 32 counter slots.
extern "C" fn unwind_step(_index: u64, context: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `close_unwound` passes an `Unwinding` on its stack.
    let unwinding = unsafe { &*context.cast::<Unwinding>() };
    let Some(stack) = STACKS.current(false) else {
        return 1;
    };
    // SAFETY: this thread's stack; only its own probes (and its own exit) touch it.
    let stack = unsafe { &mut *stack };
    let depth = stack.depth as usize;
    if depth == 0
        || depth > MAX_DEPTH
        || stack.frames[frame_index(depth - 1)].sp > unwinding.limit_sp
    {
        return 1;
    }
    if close_top(stack, Some(unwinding.tgid), true) {
        0
    } else {
        1
    }
}

/// A catch point: the first function a landing pad calls once unwinding has stopped in its
/// frame (`__cxa_begin_catch` for C++, std's `catch_unwind` cleanup for Rust). It is called
/// from the catching frame with the stack pointer that frame had at the call that unwound, so
/// every probed frame the exception left has an entry stack pointer at or below ours.
#[uprobe]
pub fn func_catch(ctx: ProbeContext) -> u32 {
    close_unwound(stack_pointer(ctx.regs));
    0
}

/// `func_catch` in per-process uprobe.multi links (`-- CMD`: only the command's processes trap
/// where exceptions are caught).
#[uprobe(multi)]
pub fn func_catch_multi(ctx: ProbeContext) -> u32 {
    close_unwound(stack_pointer(ctx.regs));
    0
}

/// `sched_process_exit`, in the exiting thread: a thread ending on its own (the `exit`
/// syscall) has open frames only if `pthread_exit` or a cancellation unwound them, both of
/// which unwind the thread's stack to its start (glibc nptl/unwind.c) first; they are closed
/// as unwound calls. A thread ended by its process's group exit (`exit()`, `exit_group`, a
/// fatal signal) unwound nothing: its frames stay open, to be counted as missed returns when
/// its entry is retired. This tracepoint fires only as tasks end, unlike the `exit` syscall's,
/// whose enabling puts every task's system calls on the kernel's traced slow path.
#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn thread_exit(_ctx: TracePointContext) -> i32 {
    if !in_group_exit() {
        close_unwound(u64::MAX);
    }
    0
}

/// `SIGNAL_GROUP_EXIT` of `signal_struct.flags` (include/linux/sched/signal.h).
const SIGNAL_GROUP_EXIT: u32 = 0x4;

/// Whether the current task's process is exiting as a whole: `current->signal->flags` has
/// `SIGNAL_GROUP_EXIT` (kernel/exit.c `do_group_exit`, kernel/signal.c `complete_signal`). Where
/// that cannot be read, true: frames are then left as missed returns, never closed wrongly.
#[inline(always)]
fn in_group_exit() -> bool {
    let field = |index: u32| {
        THREAD_EXIT_FIELDS
            .get(index)
            .copied()
            .filter(|offset| *offset != topdown_common::FIELD_ABSENT)
    };
    let (Some(signal_at), Some(flags_at)) = (
        field(thread_exit_field::TASK_SIGNAL),
        field(thread_exit_field::SIGNAL_FLAGS),
    ) else {
        return true;
    };
    // SAFETY: a helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    // SAFETY: the helper checks the addresses; a bad one is an error, not a fault.
    let Ok(signal) =
        (unsafe { bpf_probe_read_kernel((task + u64::from(signal_at)) as *const u64) })
    else {
        return true;
    };
    // SAFETY: as above.
    match unsafe { bpf_probe_read_kernel((signal + u64::from(flags_at)) as *const u32) } {
        Ok(flags) => flags & SIGNAL_GROUP_EXIT != 0,
        Err(_) => true,
    }
}
