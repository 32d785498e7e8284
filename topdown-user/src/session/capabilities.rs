//! Which privileges this process holds, from its effective capability set: whether the BPF
//! session can run (`stat`, `top`, `serve` fall back to counting without BPF when it cannot)
//! and whether the kernel lets it count kernel code. `topdown check` reports the same.

use anyhow::Result;

/// Capability numbers (include/uapi/linux/capability.h).
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// The effective capability set of this process (`CapEff` of /proc/self/status).
pub fn effective_capabilities() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|err| anyhow::anyhow!("reading /proc/self/status: {err}"))?;
    Ok(parse_cap_eff(&status).unwrap_or(0))
}

/// The `CapEff:` line of a /proc/PID/status text.
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// Root (CAP_SYS_ADMIN), or CAP_BPF together with CAP_PERFMON: what the BPF session needs.
pub fn capabilities_suffice(effective: u64) -> bool {
    let has = |cap: u32| effective & (1u64 << cap) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

/// The kernel's `perfmon_capable()` (include/linux/capability.h): CAP_PERFMON or CAP_SYS_ADMIN.
pub fn perfmon_capable(effective: u64) -> bool {
    effective & (1u64 << CAP_PERFMON | 1u64 << CAP_SYS_ADMIN) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_sets() {
        let status = "Name:\ttopdown\nCapEff:\t000001ffffffffff\n";
        let effective = parse_cap_eff(status).unwrap();
        assert!(capabilities_suffice(effective));
        assert!(capabilities_suffice(1 << CAP_BPF | 1 << CAP_PERFMON));
        assert!(!capabilities_suffice(1 << CAP_BPF));
        assert!(!capabilities_suffice(0));
        assert!(perfmon_capable(1 << CAP_PERFMON));
        assert!(perfmon_capable(1 << CAP_SYS_ADMIN));
        assert!(!perfmon_capable(1 << CAP_BPF));
        assert_eq!(parse_cap_eff("Name:\tx\n"), None);
    }
}
