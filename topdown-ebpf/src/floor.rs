//! The benchmark's floor instrument (`cargo xtask bench`): a `tp_btf/sched_switch` program that
//! does nothing, loaded and attached the way topdown's own is. What it adds per context switch
//! is what any such program costs, so topdown's figures are judged against it.
#![no_std]
#![no_main]

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};

#[btf_tracepoint(function = "sched_switch")]
pub fn empty_switch(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
