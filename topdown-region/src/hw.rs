//! The one instruction that reads a hardware counter from user space, per architecture.
//!
//! Only called with a selector the event's mmap page gave under its sequence lock
//! (`crate::mmap_page::read_under_lock`), and only while that page says user access is on
//! (`cap_user_rdpmc`): otherwise the instruction faults (x86: #GP when CR4.PCE is clear;
//! arm64: an undefined-instruction trap when PMUSERENR_EL0 denies EL0 access).

/// The user-space read instruction this build uses, for messages.
#[cfg(target_arch = "x86_64")]
pub const INSTRUCTION: &str = "rdpmc";
#[cfg(target_arch = "aarch64")]
pub const INSTRUCTION: &str = "mrs";
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const INSTRUCTION: &str = "none";

/// True where this build can read counters from user space at all.
pub const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// `rdpmc` with ECX = `selector` (the page's `index - 1`: a general counter's number, or
/// `1 << 30 | n` for fixed counter n, or `1 << 29` for PERF_METRICS; perf-topdown.txt "Using
/// TopDown through RDPMC in applications on Ice Lake").
///
/// # Safety
/// The caller must hold a selector from a page that reports `cap_user_rdpmc`, read under its
/// sequence lock.
#[cfg(target_arch = "x86_64")]
pub unsafe fn read_counter(selector: u32) -> u64 {
    let low: u32;
    let high: u32;
    // SAFETY: the caller guarantees user-space rdpmc is enabled for this counter.
    unsafe {
        std::arch::asm!(
            "rdpmc",
            in("ecx") selector,
            out("eax") low,
            out("edx") high,
            options(nostack, nomem, preserves_flags),
        );
    }
    u64::from(high) << 32 | u64::from(low)
}

/// Reads PMUv3 counter `selector` (the page's `index - 1`): event counters 0-30 are
/// `PMEVCNTR<n>_EL0`, 31 is the cycle counter `PMCCNTR_EL0` (the kernel's
/// `ARMV8_PMU_CYCLE_IDX`). Each register is named in the instruction itself, hence one arm
/// per counter.
///
/// # Safety
/// As for x86: a selector from a page with `cap_user_rdpmc`, under its sequence lock.
#[cfg(target_arch = "aarch64")]
pub unsafe fn read_counter(selector: u32) -> u64 {
    macro_rules! mrs {
        ($register:literal) => {{
            let value: u64;
            // SAFETY: the caller guarantees EL0 access to the PMU counters is enabled.
            unsafe {
                std::arch::asm!(
                    concat!("mrs {value}, ", $register),
                    value = out(reg) value,
                    options(nostack, nomem, preserves_flags),
                );
            }
            value
        }};
    }
    match selector {
        0 => mrs!("pmevcntr0_el0"),
        1 => mrs!("pmevcntr1_el0"),
        2 => mrs!("pmevcntr2_el0"),
        3 => mrs!("pmevcntr3_el0"),
        4 => mrs!("pmevcntr4_el0"),
        5 => mrs!("pmevcntr5_el0"),
        6 => mrs!("pmevcntr6_el0"),
        7 => mrs!("pmevcntr7_el0"),
        8 => mrs!("pmevcntr8_el0"),
        9 => mrs!("pmevcntr9_el0"),
        10 => mrs!("pmevcntr10_el0"),
        11 => mrs!("pmevcntr11_el0"),
        12 => mrs!("pmevcntr12_el0"),
        13 => mrs!("pmevcntr13_el0"),
        14 => mrs!("pmevcntr14_el0"),
        15 => mrs!("pmevcntr15_el0"),
        16 => mrs!("pmevcntr16_el0"),
        17 => mrs!("pmevcntr17_el0"),
        18 => mrs!("pmevcntr18_el0"),
        19 => mrs!("pmevcntr19_el0"),
        20 => mrs!("pmevcntr20_el0"),
        21 => mrs!("pmevcntr21_el0"),
        22 => mrs!("pmevcntr22_el0"),
        23 => mrs!("pmevcntr23_el0"),
        24 => mrs!("pmevcntr24_el0"),
        25 => mrs!("pmevcntr25_el0"),
        26 => mrs!("pmevcntr26_el0"),
        27 => mrs!("pmevcntr27_el0"),
        28 => mrs!("pmevcntr28_el0"),
        29 => mrs!("pmevcntr29_el0"),
        30 => mrs!("pmevcntr30_el0"),
        31 => mrs!("pmccntr_el0"),
        // No such counter: reading nothing is safer than trapping the host program; the
        // caller only passes selectors the kernel gave.
        _ => 0,
    }
}

/// Architectures without a user-space counter read: never called, the pages' path check
/// keeps these builds on read().
///
/// # Safety
/// None needed; it reads nothing.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub unsafe fn read_counter(_selector: u32) -> u64 {
    0
}
