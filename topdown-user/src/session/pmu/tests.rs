//! Detection on fixture trees: one fake `/proc` + `/sys` per kind of machine, in
//! `tests/fixtures/pmu/<kind>/` (only the files detection reads).

use std::path::PathBuf;

use super::*;

fn fixture(kind: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/pmu")
        .join(kind)
}

fn detect_kind(kind: &str) -> Detection {
    detect(&fixture(kind)).unwrap_or_else(|err| panic!("{kind}: {err:#}"))
}

fn auto(kind: &str) -> Choice {
    auto_model(&fixture(kind)).unwrap_or_else(|err| panic!("{kind}: {err:#}"))
}

/// (fixture, model `--pmu auto` picks, free general-purpose counters of the core PMU).
const MACHINES: [(&str, &str, Option<u32>); 20] = [
    ("intel-hsw", "intel-ivb", Some(8)),
    // Xeon Phi: 2 per thread, and Intel's watchdog sits on a fixed counter.
    ("intel-knl", "intel-knl", Some(2)),
    ("intel-knm", "intel-knl", Some(2)),
    ("intel-skl", "intel-skl", Some(8)),
    ("intel-skl-smt", "intel-skl-smt", Some(4)),
    ("intel-icx", "intel-icl", Some(8)),
    ("intel-spr", "intel-spr", Some(8)),
    ("intel-adl", "hybrid:intel-spr+intel-grt", Some(8)),
    ("intel-mtl", "hybrid:intel-spr+intel-cmt", Some(8)),
    // AMD's watchdog takes one of the 6.
    ("amd-zen4", "amd-zen4", Some(5)),
    ("amd-zen5", "amd-zen5", Some(6)),
    ("arm-n1", "arm-neoverse-n1", Some(6)),
    ("arm-n2-r0p0", "arm-neoverse-n2-r0p0", Some(6)),
    ("arm-n2-r0p3", "arm-neoverse-n2", Some(6)),
    ("arm-v1", "arm-neoverse-v1", Some(6)),
    ("arm-v2-slots6", "arm-neoverse-v2@slots=6", Some(5)),
    ("arm-v3", "arm-neoverse-v3", Some(6)),
    ("arm-n3", "arm-neoverse-n3", Some(6)),
    ("amd-zen3", "software", Some(5)),
    ("intel-icx-vm-no-slots", "software", Some(8)),
];

#[test]
fn every_machine_gets_its_model_and_counter_budget() {
    for (kind, model, counters) in MACHINES {
        let choice = auto(kind);
        assert_eq!(choice.model, model, "{kind}");
        assert_eq!(choice.announcement.is_some(), model == "software", "{kind}");
        assert_eq!(
            free_general_counters(&fixture(kind), None),
            counters,
            "{kind}"
        );
        // Every chosen name is one `--pmu` accepts.
        crate::model::model_by_name(&choice.model, &[])
            .unwrap_or_else(|err| panic!("{kind}: {err:#}"));
    }
}

#[test]
fn fallbacks_say_exactly_why() {
    assert_eq!(
        auto("vm-no-pmu").announcement.as_deref(),
        Some(
            "VM without a virtual PMU (hypervisor flag set, no core PMU in \
             /sys/bus/event_source/devices): using the software model (on-CPU time only, no \
             TopDown breakdown)"
        )
    );
    assert_eq!(
        auto("bare-no-pmu").announcement.as_deref(),
        Some(
            "no core PMU in /sys/bus/event_source/devices: using the software model (on-CPU \
             time only, no TopDown breakdown)"
        )
    );
    let zen3 = auto("amd-zen3").announcement.unwrap();
    assert!(
        zen3.starts_with("AMD Zen 3 (family 0x19 model 0x1) has no pipeline-utilization"),
        "{zen3}"
    );
    let no_slots = auto("intel-icx-vm-no-slots").announcement.unwrap();
    assert!(no_slots.contains("no `slots` event"), "{no_slots}");
    let mixed = auto("arm-big-little").announcement.unwrap();
    assert!(
        mixed.contains("2 different core types (MIDRs 0x410fd490, 0x410fd4f0)"),
        "{mixed}"
    );
}

#[test]
fn hybrid_pmus_name_their_cpus_and_counters() {
    let adl = detect_kind("intel-adl");
    assert!(adl.hybrid && adl.perf_metrics);
    assert_eq!(pmu_cpus(&adl, "cpu_core"), Some((0..16).collect()));
    assert_eq!(pmu_cpus(&adl, "cpu_atom"), Some((16..24).collect()));
    assert_eq!(adl.pmu("cpu_atom").and_then(|pmu| pmu.perf_type), Some(10));
    // Gracemont has 6 general counters, Crestmont 8.
    assert_eq!(general_counters(&adl, Some("cpu_atom")), Some(6));
    assert_eq!(general_counters(&adl, Some("cpu_core")), Some(8));
    let mtl = detect_kind("intel-mtl");
    assert_eq!(general_counters(&mtl, Some("cpu_atom")), Some(8));
}

#[test]
fn x86_identity_and_topology() {
    let skl = detect_kind("intel-skl-smt");
    assert_eq!(skl.vendor, "GenuineIntel");
    assert_eq!(
        (skl.family, skl.model, skl.stepping),
        (Some(6), Some(0x55), Some(7))
    );
    assert_eq!(skl.smt_active, Some(true));
    assert_eq!(skl.nmi_watchdog, Some(true));
    assert!(!skl.perf_metrics);
    // Intel's watchdog sits on a fixed counter: the 4 per thread stay free.
    assert_eq!(held_by_watchdog(&skl), 0);
    let zen4 = detect_kind("amd-zen4");
    assert_eq!((zen4.family, zen4.model), (Some(0x19), Some(0x11)));
    assert_eq!(held_by_watchdog(&zen4), 1);
}

#[test]
fn xeon_phi_knights_landing_and_mill() {
    let knl = detect_kind("intel-knl");
    let knm = detect_kind("intel-knm");
    assert_eq!((knl.family, knl.model), (Some(6), Some(0x57)));
    assert_eq!((knm.family, knm.model), (Some(6), Some(0x85)));
    for phi in [&knl, &knm] {
        assert!(!phi.perf_metrics && !phi.hybrid);
        assert_eq!(general_counters(phi, None), Some(2));
    }
    assert_eq!(
        knm.to_string(),
        "CPU:        GenuineIntel Intel(R) Xeon Phi(TM) CPU 7295 @ 1.50GHz (family 0x6 model \
         0x85 stepping 0)\n\
         Topology:   SMT on, NMI watchdog on\n\
         Core PMU:   cpu type 4, knl, 2 general counters (2 free)\n"
    );
    // The neighbours of 0x57 and 0x85 are not Xeon Phi.
    for model in [0x56, 0x58, 0x84, 0x86] {
        assert_ne!(intel_model(model), Some("knl"), "{model:#x}");
    }
}

#[test]
fn arm_midr_from_registers_or_cpuinfo() {
    let n2 = detect_kind("arm-n2-r0p0");
    let midr = n2.midrs[&0];
    assert_eq!(
        (midr.implementer, midr.variant, midr.part, midr.revision),
        (0x41, 0, 0xd49, 0)
    );
    assert_eq!(midr.raw(), 0x410f_d490);
    assert_eq!(n2.vendor, "Arm implementer 0x41");
    // V1's fixture has no regs/identification: cpuinfo's fields give the same MIDR.
    let v1 = detect_kind("arm-v1");
    assert_eq!(v1.midrs[&1].raw(), 0x411f_d402);
    assert_eq!(v1.midrs.len(), 2);
    // caps/slots in hex (recent kernels) or decimal (older ones).
    assert_eq!(
        detect_kind("arm-v3")
            .arm_pmu()
            .and_then(|pmu| pmu.caps_slots),
        Some(10)
    );
    assert_eq!(
        detect_kind("arm-n2-r0p3")
            .arm_pmu()
            .map(|pmu| pmu.name.as_str()),
        Some("armv9_neoverse_n2")
    );
}

#[test]
fn summary_for_topdown_list() {
    assert_eq!(
        detect_kind("intel-adl").to_string(),
        "CPU:        GenuineIntel 12th Gen Intel(R) Core(TM) i9-12900K (family 0x6 model 0x97 \
         stepping 2)\n\
         Topology:   SMT on, NMI watchdog on\n\
         Core PMU:   cpu_atom type 10, CPUs 16-23, alderlake_hybrid, topdown-bad-spec \
         topdown-be-bound topdown-fe-bound topdown-retiring, 6 general counters (6 free)\n\
         Core PMU:   cpu_core type 4, CPUs 0-15, alderlake_hybrid, slots topdown-bad-spec \
         topdown-be-bound topdown-br-mispredict topdown-fe-bound topdown-fetch-lat \
         topdown-heavy-ops topdown-mem-bound topdown-retiring, 8 general counters (8 free)\n"
    );
    assert_eq!(
        detect_kind("vm-no-pmu").to_string(),
        "CPU:        GenuineIntel Intel(R) Xeon(R) Processor (family 0x6 model 0x55 stepping \
         7), hypervisor flag set\n\
         Topology:   SMT off, NMI watchdog off\n\
         Core PMU:   none\n"
    );
}

#[test]
fn a_missing_cpuinfo_is_one_clear_error() {
    let err = detect(&fixture("does-not-exist")).unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("proc/cpuinfo"), "{text}");
    assert!(text.contains("is /proc mounted?"), "{text}");
    assert_eq!(text.lines().count(), 1);
}
