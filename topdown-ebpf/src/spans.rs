//! Spans: TopDown between a start site and the matching end on the same thread, with the
//! function probes' virtual counters (the thread's accumulated counts plus what its CPU counted
//! since it was switched in), so preemption and migration never add another task's counts.
//!
//! Each thread keeps a stack of open spans. A span whose end never comes (an error that
//! longjmps past it) is closed, as abandoned, at the next start found higher up the stack or at
//! the same stack pointer with the same kind, at the end of an enclosing span, or at an abort
//! site. Totals are kept per kind, key and bucket of the span's weight (its distribution, in
//! the lookup the totals need anyway); string keys are hashed here and their text kept
//! once per hash. Everything else (names, normalising texts, folding workers) is user space's.

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST, pt_regs},
    helpers::generated::bpf_probe_read_user_str,
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use topdown_common::{
    MAX_COUNTERS,
    usdt::{
        ANY_KIND, HASH_OFFSET, HASH_PRIME, MAX_SPAN_DEPTH, MAX_SPAN_KINDS, SpanKey, SpanKind,
        SpanStack, SpanStats, SpanText, SpanTotals, TEXT_BYTES, UsdtSite, action, arg_kind,
        key_mode, key_type, kind_flags, span_flags,
    },
};

use crate::{
    counters::{current_ids, current_is_traced},
    functions::{stack_pointer, task_is_probed, virtual_counters_cached},
    histogram::weight_bucket,
    maps::{NUM_COUNTERS, atomic_add, global},
    usdt::decode,
};
use topdown_ebpf::{TaskStorage, repeat};

/// Open spans and the note of each thread that hit a span or note site, in the thread's own
/// storage: made (zeroed) at its first start or note and freed with it, so no count of threads
/// bounds them and none is left behind by a thread that exits unseen (a tid-keyed hash map's
/// did both, for no less time per span: `docs/cost.md`).
#[unsafe(link_section = ".maps")]
#[unsafe(export_name = "SPAN_STACKS")]
pub(crate) static SPAN_STACKS: TaskStorage<SpanStack> = TaskStorage::new();

/// Totals per span kind, key and bucket. Sized by user space (`--max-spans`).
#[map]
pub(crate) static SPAN_TOTALS: HashMap<SpanKey, SpanTotals> =
    HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

#[map]
static ZERO_SPAN_TOTALS: PerCpuArray<SpanTotals> = PerCpuArray::with_max_entries(1, 0);

/// String keys (and a sample string of note keys) by hash, written once per hash.
#[map]
pub(crate) static SPAN_TEXTS: HashMap<u64, SpanText> =
    HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// Each span kind's flags (`kind_flags`), by kind id.
#[map]
pub(crate) static SPAN_KINDS: Array<SpanKind> = Array::with_max_entries(MAX_SPAN_KINDS as u32, 0);

#[map]
pub(crate) static SPAN_STATS: PerCpuArray<SpanStats> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn stats() -> Option<&'static mut SpanStats> {
    // SAFETY: a per-CPU value; a probe preempted by another on this CPU at worst loses an
    // increment of these diagnostic counts.
    SPAN_STATS
        .get_ptr_mut(0)
        .map(|stats| unsafe { &mut *stats })
}

/// A frame index the verifier can see is in bounds (as `functions::frame_index`).
#[inline(always)]
fn frame_index(index: usize) -> usize {
    const _: () = assert!(MAX_SPAN_DEPTH.is_power_of_two());
    // SAFETY: reading a local.
    let opaque = unsafe { core::ptr::read_volatile(&index) };
    opaque & (MAX_SPAN_DEPTH - 1)
}

#[inline(always)]
fn kind_flags_of(kind: u32) -> u32 {
    SPAN_KINDS.get(kind).map_or(0, |kind| kind.flags)
}

/// The current thread's span stack, created if `create`.
#[inline(always)]
fn stack_of(create: bool) -> Option<&'static mut SpanStack> {
    let stack = SPAN_STACKS.current(create);
    if create
        && stack.is_none()
        && let Some(stats) = stats()
    {
        // The kernel could not allocate it.
        stats.map_full += 1;
    }
    // SAFETY: this thread's stack; only its own probes (and its last switch) touch it.
    stack.map(|stack| unsafe { &mut *stack })
}

/// Reads the current thread's virtual counters into `stack.virtual_now`.
#[inline(always)]
fn read(stack: &mut SpanStack) -> bool {
    if virtual_counters_cached(&mut stack.now, &mut stack.virtual_now, &mut stack.base) {
        return true;
    }
    if let Some(stats) = stats() {
        stats.read_failures += 1;
    }
    false
}

/// A start site: closes the spans whose end was skipped, then opens one of kind `site.id`.
#[inline(always)]
pub(crate) fn start(regs: *mut pt_regs, site: &UsdtSite) {
    if !task_is_probed() {
        return;
    }
    let kind = site.id;
    let sp = stack_pointer(regs);
    let Some(stack) = stack_of(true) else {
        return;
    };
    // A live enclosing span started higher up the stack (a larger stack pointer), or at the
    // same place when it is of another kind (two probes in one function). Any other open span
    // was left without its end.
    let mut skipped = 0u32;
    let mut guard = 0;
    while guard < MAX_SPAN_DEPTH && (skipped as usize) < stack.depth as usize {
        guard += 1;
        let frame = &stack.frames[frame_index(stack.depth as usize - 1 - skipped as usize)];
        if frame.sp > sp || (frame.sp == sp && frame.kind != kind) {
            break;
        }
        skipped += 1;
    }
    let depth = (stack.depth - skipped) as usize;
    if depth > 0
        && skipped == 0
        && kind_flags_of(kind) & kind_flags::ABSORB_NESTED != 0
        && stack.frames[frame_index(depth - 1)].kind == kind
    {
        stack.frames[frame_index(depth - 1)].absorbed += 1;
        return;
    }
    if !read(stack) {
        return;
    }
    let stack = if skipped == 0 {
        stack
    } else {
        close_frames(skipped, 0);
        // Looked up again: the loop closed frames through a reference of its own.
        let Some(stack) = stack_of(false) else {
            return;
        };
        stack
    };
    let depth = stack.depth as usize;
    if depth >= MAX_SPAN_DEPTH {
        if let Some(stats) = stats() {
            stats.overflows += 1;
        }
        return;
    }
    let frame = &mut stack.frames[frame_index(depth)];
    frame.kind = kind;
    frame.absorbed = 0;
    frame.sp = sp;
    frame.key_mode = site.key;
    frame.signed = u32::from(site.args[0].signed);
    frame.key = 0;
    frame.text.len = 0;
    match site.key {
        key_mode::INTEGER => match decode(regs, &site.args[0]) {
            Some(key) => frame.key = key,
            None => arg_failed(),
        },
        key_mode::STRING | key_mode::NOTE_OR_STRING => {
            if site.args[0].kind != arg_kind::NONE {
                match decode(regs, &site.args[0]) {
                    Some(pointer) if pointer != 0 => read_text(&mut frame.text, pointer),
                    _ => arg_failed(),
                }
            }
            // Hashed here, once per span, not where frames close in a loop.
            frame.key = hash(&frame.text);
        }
        _ => {}
    }
    // The slots in use only: copying all `MAX_COUNTERS` was a fifth of a start's instructions
    // with one counter.
    let used = global(&NUM_COUNTERS) as usize;
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        frame.entry[slot] = stack.virtual_now[slot];
        slot += 1;
    }
    stack.depth += 1;
}

#[inline(always)]
fn arg_failed() {
    if let Some(stats) = stats() {
        stats.arg_read_failures += 1;
    }
}

/// The NUL-terminated string at `pointer`, up to `TEXT_BYTES` (without the NUL).
#[inline(always)]
fn read_text(text: &mut SpanText, pointer: u64) {
    // SAFETY: the helper reads user memory and fails cleanly; the buffer is `TEXT_BYTES` long.
    let read = unsafe {
        bpf_probe_read_user_str(
            text.bytes.as_mut_ptr().cast(),
            TEXT_BYTES as u32,
            pointer as *const core::ffi::c_void,
        )
    };
    if read > 0 {
        text.len = (read - 1) as u32;
    } else {
        arg_failed();
    }
}

/// An end site: closes the innermost open span of kind `site.id`, and as abandoned any span
/// opened inside it that is still open.
#[inline(always)]
pub(crate) fn end(_regs: *mut pt_regs, site: &UsdtSite) {
    if !task_is_probed() {
        return;
    }
    let Some(stack) = stack_of(false) else {
        unmatched();
        return;
    };
    let Some(above) = innermost(stack, site.id) else {
        unmatched();
        return;
    };
    let found = frame_index(stack.depth as usize - 1 - above as usize);
    if stack.frames[found].absorbed > 0 {
        stack.frames[found].absorbed -= 1;
        return;
    }
    if !read(stack) {
        // Its figures cannot be known: drop it with what opened inside it.
        stack.depth -= above + 1;
        return;
    }
    if above == 0 {
        // The common end: one frame, closed here rather than through the loop's helper.
        close_top(stack, 0);
    } else {
        close_frames(above, 1);
    }
}

#[inline(always)]
fn unmatched() {
    if let Some(stats) = stats() {
        stats.unmatched_ends += 1;
    }
}

/// How many frames lie above the innermost open span of `kind` (`ANY_KIND`: the top one).
#[inline(always)]
fn innermost(stack: &SpanStack, kind: u32) -> Option<u32> {
    let depth = stack.depth as usize;
    let mut above = 0;
    while above < MAX_SPAN_DEPTH && above < depth {
        if kind == ANY_KIND || stack.frames[frame_index(depth - 1 - above)].kind == kind {
            return Some(above as u32);
        }
        above += 1;
    }
    None
}

/// How many frames lie above the outermost open span of `kind` (`ANY_KIND`: the bottom one).
#[inline(always)]
fn outermost(stack: &SpanStack, kind: u32) -> Option<u32> {
    let depth = stack.depth as usize;
    let mut below = 0;
    while below < MAX_SPAN_DEPTH && below < depth {
        if kind == ANY_KIND || stack.frames[frame_index(below)].kind == kind {
            return Some((depth - 1 - below) as u32);
        }
        below += 1;
    }
    None
}

/// An abort site (an error's recovery): closes every open span of kind `site.id`, and those
/// opened inside them, as abandoned.
#[inline(always)]
pub(crate) fn abort(site: &UsdtSite) {
    if !task_is_probed() {
        return;
    }
    let Some(stack) = stack_of(false) else {
        return;
    };
    let Some(above) = outermost(stack, site.id) else {
        return;
    };
    if !read(stack) {
        stack.depth -= above + 1;
        return;
    }
    close_frames(above + 1, 0);
}

/// A note site: sets or clears the thread's note (PostgreSQL's query id, mirrored as
/// `pgstat_report_query_id` and `pgstat_report_activity` keep it).
#[inline(always)]
pub(crate) fn note(regs: *mut pt_regs, site: &UsdtSite) {
    let (tid, tgid) = current_ids();
    if !current_is_traced(tid, tgid) {
        return;
    }
    let Some(stack) = stack_of(true) else {
        return;
    };
    let value = decode(regs, &site.args[0]);
    if site.action == action::NOTE_SET {
        let Some(value) = value else {
            arg_failed();
            return;
        };
        let forced = site.args[1].kind != arg_kind::NONE
            && decode(regs, &site.args[1]).is_some_and(|force| force != 0);
        if stack.note == 0 || forced {
            stack.note = value;
        }
    } else if value.is_some() && value == decode(regs, &site.args[1]) {
        stack.note = 0;
    }
}

/// What `close_frames` hands each step of its loop.
#[repr(C)]
struct Closing {
    /// The first `abandoned` frames closed are abandoned, the rest ended.
    abandoned: u32,
}

/// Closes the top `abandoned` frames of the current thread's stack as abandoned, then the top `ended` frame
/// (if 1) as ended, with the counters in its `virtual_now`, adding each to its kind and key's
/// totals. Through `bpf_loop` (Linux 5.17): the verifier walks one close once, where an
/// unrolled loop of up to `MAX_SPAN_DEPTH` closes cost it most of its instruction budget.
#[inline(always)]
fn close_frames(abandoned: u32, ended: u32) {
    let total = (abandoned + ended).min(MAX_SPAN_DEPTH as u32);
    if total == 0 {
        return;
    }
    let mut closing = Closing { abandoned };
    repeat(total, close_step, &mut closing);
}

/// One step of `close_frames`: 0 to go on, 1 to stop.
extern "C" fn close_step(index: u64, context: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `close_frames` passes a `Closing` on its stack.
    let closing = unsafe { &*context.cast::<Closing>() };
    let Some(stack) = SPAN_STACKS.current(false) else {
        return 1;
    };
    // SAFETY: this thread's stack; only its own probes (and its last switch) touch it.
    let stack = unsafe { &mut *stack };
    if stack.depth == 0 {
        return 1;
    }
    let flags = if index < u64::from(closing.abandoned) {
        span_flags::ABANDONED
    } else {
        0
    };
    close_top(stack, flags);
    0
}

#[inline(always)]
fn close_top(stack: &mut SpanStack, flags: u32) {
    let depth = stack.depth as usize;
    if depth == 0 || depth > MAX_SPAN_DEPTH {
        return;
    }
    let used = global(&NUM_COUNTERS) as usize;
    let top = frame_index(depth - 1);
    stack.depth -= 1;
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        stack.now[slot] = stack.virtual_now[slot].wrapping_sub(stack.frames[top].entry[slot]);
        slot += 1;
    }
    let kind = stack.frames[top].kind;
    let mut flags = flags;
    if kind_flags_of(kind) & kind_flags::WORKER != 0 {
        flags |= span_flags::WORKER;
    }
    let frame = &stack.frames[top];
    let texted = matches!(frame.key_mode, key_mode::STRING | key_mode::NOTE_OR_STRING);
    // A string key's hash, from the start.
    let text_hash = frame.key;
    let (key_type, key) = match frame.key_mode {
        key_mode::INTEGER if frame.signed != 0 => (key_type::SIGNED, frame.key),
        key_mode::INTEGER => (key_type::UNSIGNED, frame.key),
        key_mode::NOTE_OR_STRING if stack.note != 0 => (key_type::NOTE, stack.note),
        key_mode::STRING | key_mode::NOTE_OR_STRING => (key_type::TEXT, frame.key),
        _ => (key_type::NONE, 0),
    };
    let span_key = SpanKey {
        kind,
        flags,
        key_type,
        bucket: weight_bucket(&stack.now),
        key,
    };
    let totals = match SPAN_TOTALS.get_ptr_mut(&span_key) {
        Some(totals) => totals,
        None => {
            let Some(zero) = ZERO_SPAN_TOTALS.get_ptr_mut(0) else {
                return;
            };
            // SAFETY: a per-CPU map value only this program writes, and only here.
            let zero = unsafe { &mut *zero };
            zero.text = 0;
            if texted && frame.text.len > 0 {
                // Written once per hash: later spans with the same text find it there.
                let _ = SPAN_TEXTS.insert(&text_hash, &frame.text, BPF_NOEXIST as u64);
                zero.text = text_hash;
            }
            let _ = SPAN_TOTALS.insert(&span_key, zero, BPF_NOEXIST as u64);
            zero.text = 0;
            match SPAN_TOTALS.get_ptr_mut(&span_key) {
                Some(totals) => totals,
                None => {
                    if let Some(stats) = stats() {
                        stats.map_full += 1;
                    }
                    return;
                }
            }
        }
    };
    // Two CPUs may close spans of one key at once: add atomically.
    // SAFETY: naturally aligned u64 fields of a live map value.
    unsafe { atomic_add(&raw mut (*totals).spans, 1) };
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        // SAFETY: as above.
        unsafe { atomic_add(&raw mut (*totals).counters[slot], stack.now[slot]) };
        slot += 1;
    }
}

/// The hash of a string key (`topdown_common::usdt::HASH_OFFSET`): its 8-byte words, the
/// last one masked to the string's length.
#[inline(always)]
fn hash(text: &SpanText) -> u64 {
    const WORDS: usize = TEXT_BYTES / 8;
    let len = (text.len as usize).min(TEXT_BYTES);
    let mut hash = HASH_OFFSET ^ len as u64;
    let mut word = 0;
    while word < WORDS && word * 8 < len {
        // SAFETY: `word < WORDS`, so 8 bytes from `8 * word` are inside `bytes`, which is
        // 8-byte aligned (`SpanText` is).
        let mut value = unsafe {
            core::ptr::read(
                text.bytes
                    .as_ptr()
                    .add(8 * (word & (WORDS - 1)))
                    .cast::<u64>(),
            )
        };
        let left = len - word * 8;
        if left < 8 {
            value &= (1u64 << (8 * left)) - 1;
        }
        hash = (hash ^ value).wrapping_mul(HASH_PRIME);
        word += 1;
    }
    hash
}

/// The current thread will never run again (its last switch): its open spans will never end.
/// Its stack goes with it.
#[inline(always)]
pub(crate) fn retire_current_thread() {
    if let Some(stack) = SPAN_STACKS.current(false) {
        // SAFETY: only this thread's probes and its last switch touch its stack.
        let open = u64::from(unsafe { (*stack).depth });
        if let Some(stats) = stats() {
            stats.open_at_exit += open;
        }
    }
}
