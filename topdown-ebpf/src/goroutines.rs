//! Go function probes: the frames of `functions`, kept per goroutine instead of per thread.
//!
//! - A goroutine is its `g` pointer: R14 in every Go function (the register calling convention
//!   of Go 1.17+ on amd64), and the `g` of the `gobuf` that `runtime.gogo` resumes.
//! - Its frames' stack pointers are `SP - g.stack.hi`: the runtime copies a growing stack to a
//!   new place, which moves `SP` and `stack.hi` together, so a frame keeps its value and the
//!   order of frames is that of their stack pointers.
//! - Its counters advance only while it runs on a thread: `GoStack::clock` holds them while it
//!   is off every thread, and their offset from the thread's virtual counters while it runs.
//!   It leaves a thread at `runtime.mcall` (parking, yielding, preemption, exiting, a panic's
//!   recovery) and `runtime.morestack` (the prologue's stack check, which may grow the stack
//!   or reschedule), and joins one at `runtime.gogo`: one reading each, as `sched_switch`
//!   reads at a thread's switch, only for goroutines with open frames.
//! - `runtime.morestack` runs the function again from its first instruction, on the grown
//!   stack: the second entry at the same depth is the same call (`frame_flags::RESTARTING`).
//! - A panic recovered above probed frames resumes the goroutine (`gogo`) at a stack pointer
//!   above them, and `runtime.Goexit` ends the goroutine (`goexit1`) with frames open: both
//!   close those frames as unwound calls, with the goroutine's counters at that moment.

use aya_ebpf::{
    EbpfContext as _, bindings::pt_regs, helpers::bpf_probe_read_user, macros::uprobe,
    programs::ProbeContext,
};
use topdown_common::{
    GoStack, GoroutineKey, MAX_COUNTERS, MAX_DEPTH, ShadowStack, frame_flags, go_hook, go_layout,
};

use crate::{
    counters::current_ids,
    functions::{
        ReadCounters, attach_cookie, close_top, enter, exit_of, frame_index, leave, probe_stats,
        probed_task, virtual_counters,
    },
    maps::{GO_STACKS, NUM_COUNTERS, ZERO_GO_STACK, entry_or_zeroed, global},
};
use topdown_ebpf::repeat;

/// The registers the Go probes read.
struct GoRegisters {
    /// R14: the running goroutine's `g` in Go functions.
    g: u64,
    sp: u64,
}

#[inline(always)]
fn registers(regs: *mut pt_regs) -> Option<GoRegisters> {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        // SAFETY: the probe context's registers are readable.
        let (g, sp) = unsafe { ((*regs).r14, (*regs).rsp) };
        Some(GoRegisters { g, sp })
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        let _ = regs;
        None
    }
}

#[inline(always)]
fn read_user(address: u64) -> Option<u64> {
    // SAFETY: a user address read through the helper, which fails cleanly.
    match unsafe { bpf_probe_read_user(address as *const u64) } {
        Ok(value) => Some(value),
        Err(_) => {
            if let Some(stats) = probe_stats() {
                stats.read_failures += 1;
            }
            None
        }
    }
}

/// `sp` as a Go frame's position: its distance below the goroutine's stack top, negated.
#[inline(always)]
fn frame_position(g: u64, sp: u64) -> Option<u64> {
    let hi = read_user(g.wrapping_add(go_layout::G_STACK_HI))?;
    Some(sp.wrapping_sub(hi))
}

/// Goroutine `g` of the current process.
#[inline(always)]
fn key(g: u64) -> GoroutineKey {
    let (_, tgid) = current_ids();
    GoroutineKey { g, tgid, _pad: 0 }
}

#[inline(always)]
fn existing(g: u64) -> Option<&'static mut GoStack> {
    let stack = GO_STACKS.get_ptr_mut(&key(g))?;
    // SAFETY: a live map value; only probes running on this goroutine's thread touch it
    // (a goroutine runs on one thread at a time).
    Some(unsafe { &mut *stack })
}

#[inline(always)]
fn existing_or_new(g: u64) -> Option<&'static mut GoStack> {
    let Some(stack) = entry_or_zeroed(&GO_STACKS, &key(g), || ZERO_GO_STACK.get_ptr(0)) else {
        if let Some(stats) = probe_stats() {
            stats.map_full += 1;
        }
        return None;
    };
    // SAFETY: as in `existing`.
    Some(unsafe { &mut *stack })
}

/// The goroutine's virtual counters into `stack.virtual_now`, joining it to thread `tid`
/// first if it is not running there with a known offset.
#[inline(always)]
fn goroutine_counters(
    stack: &mut ShadowStack,
    thread: &mut u32,
    clock: &mut [u64; MAX_COUNTERS],
    joined: &mut [u64; MAX_COUNTERS],
    tid: u32,
) -> bool {
    if !virtual_counters(&mut stack.now, &mut stack.virtual_now, tid) {
        return false;
    }
    let used = global(&NUM_COUNTERS) as usize;
    if *thread != tid {
        // Running elsewhere as far as its probes know: it left that thread by a way not
        // hooked, and what it ran there since it joined is lost.
        let lost = *thread != 0;
        if lost && let Some(stats) = probe_stats() {
            stats.goroutine_switches_lost += 1;
        }
        let mut slot = 0;
        while slot < MAX_COUNTERS && slot < used {
            if lost {
                clock[slot] = joined[slot];
            }
            joined[slot] = clock[slot];
            clock[slot] = clock[slot].wrapping_sub(stack.virtual_now[slot]);
            slot += 1;
        }
        *thread = tid;
    }
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        stack.virtual_now[slot] = stack.virtual_now[slot].wrapping_add(clock[slot]);
        slot += 1;
    }
    true
}

#[uprobe]
pub fn go_entry(ctx: ProbeContext) -> u32 {
    on_go_entry(&ctx)
}

#[uprobe(multi)]
pub fn go_entry_multi(ctx: ProbeContext) -> u32 {
    on_go_entry(&ctx)
}

#[uprobe]
pub fn go_exit(ctx: ProbeContext) -> u32 {
    on_go_exit(&ctx)
}

#[uprobe(multi)]
pub fn go_exit_multi(ctx: ProbeContext) -> u32 {
    on_go_exit(&ctx)
}

/// The runtime's goroutine switches and exits (`go_hook` kind in the cookie).
#[uprobe]
pub fn go_runtime(ctx: ProbeContext) -> u32 {
    on_go_runtime(&ctx)
}

/// `go_runtime` in the traced processes only (`-- CMD`: a link per followed process).
#[uprobe(multi)]
pub fn go_runtime_multi(ctx: ProbeContext) -> u32 {
    on_go_runtime(&ctx)
}

#[inline(always)]
fn on_go_runtime(ctx: &ProbeContext) -> u32 {
    let Some(registers) = registers(ctx.regs) else {
        return 0;
    };
    let hook = attach_cookie(ctx.as_ptr());
    let to_close = match hook {
        go_hook::GOGO => joins(registers.sp),
        go_hook::MCALL => {
            leaves(registers.g, None);
            None
        }
        go_hook::MORESTACK => {
            leaves(registers.g, Some(registers.sp.wrapping_add(8)));
            None
        }
        go_hook::GOEXIT => ends(registers.g),
        _ => None,
    };
    if let Some((g, tgid, limit_sp)) = to_close {
        close_frames(key(g), tgid, limit_sp);
    }
    if hook == go_hook::GOEXIT {
        // The `g` may serve a later goroutine, so its stack goes.
        let _ = GO_STACKS.remove(&key(registers.g));
    }
    0
}

/// Frames a hook leaves to close as unwound, with the counters in its stack's `virtual_now`:
/// the goroutine's `g`, its process, and the frame position at or below which they end.
type ToClose = Option<(u64, u32, u64)>;

/// What `close_step` needs: the goroutine's stack is looked up again in each step.
#[repr(C)]
struct Closing {
    key: GoroutineKey,
    tgid: u32,
    _pad: u32,
    limit_sp: u64,
}

/// Closes, as unwound calls, the goroutine's frames whose position is at or below `limit_sp`,
/// innermost first. Through `bpf_loop` (Linux 5.17), as spans close theirs: the verifier walks
/// one close once, where an unrolled loop of `MAX_DEPTH` closes, each adding to a per-call
/// histogram, took `go_runtime` past its 1M-instruction budget.
#[inline(always)]
fn close_frames(key: GoroutineKey, tgid: u32, limit_sp: u64) {
    let mut closing = Closing {
        key,
        tgid,
        _pad: 0,
        limit_sp,
    };
    repeat(MAX_DEPTH as u32, close_step, &mut closing);
}

/// One step of `close_frames`: 0 to go on, 1 to stop.
extern "C" fn close_step(_index: u64, context: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `close_frames` passes a `Closing` on its stack.
    let closing = unsafe { &*context.cast::<Closing>() };
    let Some(go) = GO_STACKS.get_ptr_mut(&closing.key) else {
        return 1;
    };
    // SAFETY: a live map value; only probes on this goroutine's thread touch it.
    let stack = unsafe { &mut (*go).stack };
    let depth = stack.depth as usize;
    if depth == 0 || depth > MAX_DEPTH || stack.frames[frame_index(depth - 1)].sp > closing.limit_sp
    {
        return 1;
    }
    if close_top(stack, Some(closing.tgid), true) {
        0
    } else {
        1
    }
}

/// A goroutine's virtual counters (`goroutine_counters`) for `enter` and `leave`.
struct GoroutineCounters<'a> {
    thread: &'a mut u32,
    clock: &'a mut [u64; MAX_COUNTERS],
    joined: &'a mut [u64; MAX_COUNTERS],
    tid: u32,
}

/// The goroutine's shadow stack, and how its counters are read on thread `tid`.
#[inline(always)]
fn counters_on(go: &mut GoStack, tid: u32) -> (&mut ShadowStack, GoroutineCounters<'_>) {
    let GoStack {
        stack,
        thread,
        clock,
        joined,
        ..
    } = go;
    let counters = GoroutineCounters {
        thread,
        clock,
        joined,
        tid,
    };
    (stack, counters)
}

impl ReadCounters for GoroutineCounters<'_> {
    #[inline(always)]
    fn read(self, stack: &mut ShadowStack) -> bool {
        goroutine_counters(stack, self.thread, self.clock, self.joined, self.tid)
    }
}

#[inline(always)]
fn on_go_entry(ctx: &ProbeContext) -> u32 {
    let Some((tid, _)) = probed_task() else {
        return 0;
    };
    let Some(registers) = registers(ctx.regs) else {
        return 0;
    };
    let Some(position) = frame_position(registers.g, registers.sp) else {
        return 0;
    };
    let cookie = attach_cookie(ctx.as_ptr());
    let Some(go) = existing_or_new(registers.g) else {
        return 0;
    };
    let depth = go.stack.depth as usize;
    if depth == 0 {
        // An outermost call: the goroutine's counters start again from zero here.
        go.thread = 0;
        let used = global(&NUM_COUNTERS) as usize;
        let mut slot = 0;
        while slot < MAX_COUNTERS && slot < used {
            go.clock[slot] = 0;
            slot += 1;
        }
    } else if depth <= MAX_DEPTH {
        let top = &mut go.stack.frames[frame_index(depth - 1)];
        if top.tail_calling & frame_flags::RESTARTING != 0
            && top.sp == position
            && top.function == cookie as u32
        {
            // The prologue's morestack ran it again from its start: the same call.
            top.tail_calling &= !frame_flags::RESTARTING;
            return 0;
        }
    }
    let (stack, counters) = counters_on(go, tid);
    enter(stack, cookie, position, counters);
    0
}

#[inline(always)]
fn on_go_exit(ctx: &ProbeContext) -> u32 {
    let Some((function, kind)) = exit_of(ctx) else {
        return 0;
    };
    let Some((tid, tgid)) = probed_task() else {
        return 0;
    };
    let Some(registers) = registers(ctx.regs) else {
        return 0;
    };
    let Some(go) = existing(registers.g) else {
        return 0;
    };
    if go.stack.depth == 0 {
        return 0;
    }
    let Some(position) = frame_position(registers.g, registers.sp) else {
        return 0;
    };
    let (stack, counters) = counters_on(go, tid);
    leave(stack, Some(tgid), position, function, kind, counters);
    0
}

/// `runtime.gogo(buf)`: the goroutine of `buf` joins this thread at `buf.sp`. Frames below
/// that stack pointer were left without returning (a recovered panic resumes the frame that
/// deferred the recovering call): they end here, unwound.
#[inline(always)]
fn joins(sp: u64) -> ToClose {
    let buf = read_user(sp.wrapping_add(8))?;
    let g = read_user(buf.wrapping_add(go_layout::GOBUF_G))?;
    let go = existing(g)?;
    if go.stack.depth == 0 {
        return None;
    }
    let (tid, tgid) = probed_task()?;
    let (stack, counters) = counters_on(go, tid);
    if !counters.read(stack) {
        // Not joined: its next probe joins it, and what it runs until then is not in its
        // calls.
        if let Some(stats) = probe_stats() {
            stats.read_failures += 1;
        }
        return None;
    }
    let resumed = read_user(buf.wrapping_add(go_layout::GOBUF_SP))?;
    let position = frame_position(g, resumed)?;
    // Frames strictly below the resumed stack pointer; the function that morestack runs again
    // resumes exactly at its own frame, which stays open.
    Some((g, tgid, position.wrapping_sub(1)))
}

/// `runtime.mcall` and `runtime.morestack`: goroutine `g` leaves this thread; its counters
/// stop. At morestack, `entry_sp` is the stack pointer the calling function had at its first
/// instruction: if that function's frame is open, its next entry is the same call.
#[inline(always)]
fn leaves(g: u64, entry_sp: Option<u64>) {
    let Some(go) = existing(g) else {
        return;
    };
    let depth = go.stack.depth as usize;
    if depth == 0 || depth > MAX_DEPTH {
        return;
    }
    if let Some(entry_sp) = entry_sp {
        let Some(position) = frame_position(g, entry_sp) else {
            return;
        };
        let top = &mut go.stack.frames[frame_index(depth - 1)];
        if top.sp == position {
            top.tail_calling |= frame_flags::RESTARTING;
        }
    }
    let Some((tid, _)) = probed_task() else {
        return;
    };
    if go.thread != tid {
        return;
    }
    let used = global(&NUM_COUNTERS) as usize;
    // Its counters since it joined cannot be known if the reading fails: it leaves with those
    // it joined with.
    let read = virtual_counters(&mut go.stack.now, &mut go.stack.virtual_now, tid);
    if !read && let Some(stats) = probe_stats() {
        stats.read_failures += 1;
    }
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        go.clock[slot] = if read {
            go.clock[slot].wrapping_add(go.stack.virtual_now[slot])
        } else {
            go.joined[slot]
        };
        slot += 1;
    }
    go.thread = 0;
}

/// `runtime.goexit1`: goroutine `g` ends. Frames still open were left by `runtime.Goexit`
/// (after its deferred calls): they end here, unwound (the caller then removes its stack).
#[inline(always)]
fn ends(g: u64) -> ToClose {
    let go = existing(g)?;
    if go.stack.depth == 0 {
        return None;
    }
    let (tid, tgid) = probed_task()?;
    let (stack, counters) = counters_on(go, tid);
    if counters.read(stack) {
        Some((g, tgid, u64::MAX))
    } else {
        if let Some(stats) = probe_stats() {
            stats.read_failures += 1;
        }
        None
    }
}
