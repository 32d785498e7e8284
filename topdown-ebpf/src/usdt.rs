//! USDT sites: one program for every probed site (`-U` hits, span starts and ends, aborts and
//! notes). The attach cookie indexes the site's descriptor in `USDT_SITES`, which user space
//! filled from the SDT notes: what to do, and how to decode the arguments it needs. Decoding
//! is a small interpreter over `UsdtArg` (a constant, a register, or memory at base + index *
//! scale + displacement); everything about the probe's meaning stays in user space.

use aya_ebpf::{
    EbpfContext as _,
    bindings::pt_regs,
    helpers::bpf_probe_read_user,
    macros::{map, uprobe},
    maps::{Array, PerCpuArray},
    programs::ProbeContext,
};
use topdown_common::usdt::{UsdtArg, UsdtSite, action, arg_kind};

use crate::{
    counters::current_ids,
    counters::current_is_traced,
    functions::{attach_cookie, effective_address, register},
    maps::atomic_add,
    spans,
};

/// Site descriptors by attach cookie. Sized by user space to the sites it attaches.
#[map]
pub(crate) static USDT_SITES: Array<UsdtSite> = Array::with_max_entries(1, 0);

/// `-U` hits by probe id. Sized by user space to the probes it counts.
#[map]
pub(crate) static USDT_HITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Per-site attach (one perf link per site, the uprobe PMU's `ref_ctr_offset` config bits
/// enabling its semaphore): kernels without uprobe.multi.
#[uprobe]
pub fn usdt_site(ctx: ProbeContext) -> u32 {
    on_site(&ctx);
    0
}

/// One uprobe.multi link per binary, its semaphores in `ref_ctr_offsets` (Linux >= 6.6).
#[uprobe(multi)]
pub fn usdt_site_multi(ctx: ProbeContext) -> u32 {
    on_site(&ctx);
    0
}

#[inline(always)]
fn on_site(ctx: &ProbeContext) {
    let cookie = attach_cookie(ctx.as_ptr()) as u32;
    let Some(site) = USDT_SITES.get(cookie) else {
        return;
    };
    match site.action {
        action::HIT => {
            let (tid, tgid) = current_ids();
            if !current_is_traced(tid, tgid) {
                return;
            }
            if let Some(hits) = USDT_HITS.get_ptr_mut(site.id) {
                // Atomic: uprobe programs can be preempted by another on the same CPU.
                // SAFETY: an aligned u64 of a live per-CPU map value.
                unsafe { atomic_add(hits, 1) };
            }
        }
        action::START => spans::start(ctx.regs, site),
        action::END => spans::end(ctx.regs, site),
        action::ABORT => spans::abort(site),
        action::NOTE_SET | action::NOTE_CLEAR => spans::note(ctx.regs, site),
        _ => {}
    }
}

/// The value of `arg` at this probe, `size` bytes extended to 64 bits; `None` if its memory
/// cannot be read (or the spec is absent).
#[inline(always)]
pub(crate) fn decode(regs: *mut pt_regs, arg: &UsdtArg) -> Option<u64> {
    let raw = match arg.kind {
        arg_kind::CONSTANT => return Some(arg.value as u64),
        arg_kind::REGISTER => register(regs, arg.base)? >> (arg.shift & 63),
        arg_kind::MEMORY => {
            let address =
                effective_address(regs, arg.value as u64, arg.base, arg.index, arg.scale)?;
            read_user(address, arg.size)?
        }
        _ => return None,
    };
    Some(extend(raw, arg.size, arg.signed != 0))
}

/// `size` bytes of user memory at `address` (exactly those: a wider read could cross into an
/// unmapped page).
#[inline(always)]
fn read_user(address: u64, size: u8) -> Option<u64> {
    // SAFETY: user addresses read through the helper, which fails cleanly.
    unsafe {
        match size {
            1 => bpf_probe_read_user(address as *const u8)
                .ok()
                .map(u64::from),
            2 => bpf_probe_read_user(address as *const u16)
                .ok()
                .map(u64::from),
            4 => bpf_probe_read_user(address as *const u32)
                .ok()
                .map(u64::from),
            _ => bpf_probe_read_user(address as *const u64).ok(),
        }
    }
}

/// The low `size` bytes of `value`, zero- or sign-extended.
#[inline(always)]
fn extend(value: u64, size: u8, signed: bool) -> u64 {
    let bits = match size {
        1 => 8,
        2 => 16,
        4 => 32,
        _ => return value,
    };
    let unused = 64 - bits;
    if signed {
        (((value << unused) as i64) >> unused) as u64
    } else {
        (value << unused) >> unused
    }
}
