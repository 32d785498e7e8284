//! Event specs on a fixture machine (`tests/fixtures/events`: an Intel `cpu` PMU with its
//! format/ and a few events/, and an `armv8_pmuv3_0` with FEAT_PMUv3_TH thresholds).

use std::path::PathBuf;

use super::*;

fn catalog() -> PmuCatalog {
    PmuCatalog::load(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/events"))
}

fn perf(spec: &str) -> (u32, u64, u64, Option<Exclude>) {
    libpfm(spec, &catalog())
}

fn error(spec: &str) -> String {
    let err = parse_event(spec, &catalog()).expect_err(spec);
    let text = format!("{err:#}");
    assert_eq!(text.lines().count(), 1, "{text}");
    text
}

const USER_ONLY: Exclude = Exclude {
    user: false,
    kernel: true,
    hv: true,
    host: false,
    guest: false,
    idle: false,
};

#[test]
fn perf_pmu_terms_are_placed_by_the_format_files() {
    // event 0x3c | edge << 18 | inv << 23 | cmask 1 << 24 = 0x184003c.
    assert_eq!(
        perf("cpu/event=0x3c,umask=0x0,cmask=1,inv,edge/u"),
        (4, 0x0184_003c, 0, Some(USER_ONLY))
    );
    // An alias expands to its terms; config1 terms land in config1.
    assert_eq!(perf("cpu/topdown-retiring/"), (4, 0x8000, 0, None));
    assert_eq!(
        perf("cpu/event=0xc6,umask=0x1,frontend=0x11/"),
        (4, 0x01c6, 0x11, None)
    );
    assert_eq!(perf("cpu/config=0x1234,config1=7/"), (4, 0x1234, 7, None));
}

#[test]
fn raw_named_generic_and_tracepoint_events() {
    assert_eq!(perf("r01c2"), (4, 0x01c2, 0, None));
    assert_eq!(
        perf("r01c2:k").3.map(|e| (e.user, e.kernel)),
        Some((true, false))
    );
    assert_eq!(perf("topdown-retiring"), (4, 0x8000, 0, None));
    assert_eq!(perf("cycles"), (PERF_TYPE_HARDWARE, 0, 0, None));
    assert_eq!(perf("cpu-clock"), (PERF_TYPE_SOFTWARE, 0, 0, None));
    let attr = parse_event("sched:sched_switch", &catalog()).unwrap();
    assert_eq!(
        attr.kind,
        EventKind::Tracepoint {
            group: "sched".into(),
            name: "sched_switch".into()
        }
    );
}

#[test]
fn arm_events_and_thresholds() {
    assert_eq!(perf("armv8_pmuv3_0/stall_slot/"), (8, 0x3f, 0, None));
    // threshold 2 at config1 bits 5-16, compare 2 at bits 1-2: (2 << 5) | (2 << 1) = 0x44.
    assert_eq!(
        perf("armv8_pmuv3_0/stall_slot,threshold=2,threshold_compare=2/"),
        (8, 0x3f, 0x44, None)
    );
    let too_high = error("armv8_pmuv3_0/stall_slot,threshold=300/");
    assert!(
        too_high.contains("exceeds the 255 this PMU supports"),
        "{too_high}"
    );
    // :k on Arm: kernel only (EL1, and EL2 too on a VHE host: module docs).
    let kernel = perf("armv8_pmuv3_0/cpu_cycles/k").3.unwrap();
    assert_eq!((kernel.user, kernel.kernel, kernel.hv), (true, false, true));
    let host = perf("armv8_pmuv3_0/cpu_cycles/H").3.unwrap();
    assert!(host.guest && !host.host && !host.user);
    let guest = perf("armv8_pmuv3_0/cpu_cycles/G").3.unwrap();
    assert!(guest.host && !guest.guest);
}

/// The catalog for a model in use (libpfm-style names without `PMU::` go to its PMU).
fn for_model(model: &str) -> PmuCatalog {
    catalog().with_model(model)
}

/// `spec`'s perf type, config words and exclusions on `catalog` (the fixture machine's, or one
/// with a model's libpfm4 table).
fn libpfm(spec: &str, catalog: &PmuCatalog) -> (u32, u64, u64, Option<Exclude>) {
    let attr = parse_event(spec, catalog).unwrap_or_else(|err| panic!("{spec}: {err:#}"));
    match attr.kind {
        EventKind::Perf {
            perf_type,
            config,
            config1,
            ..
        } => (perf_type, config, config1, attr.exclude),
        EventKind::Tracepoint { .. } => panic!("{spec}: tracepoint"),
    }
}

/// Every example of ../shared/seeds/libpfm-intel-knl.txt, encoded by libpfm4. Expected words
/// from Intel's Knights Landing event list (perfmon KNL/events/knightslanding_core.json, also
/// the kernel's tools/perf/pmu-events/arch/x86/knightslanding/cache.json): OFFCORE_RESPONSE
/// is event 0xB7; MSRValue of DEMAND_DATA_RD.ANY_RESPONSE 0x0000010001 (request bit 0,
/// ANY_RESPONSE bit 16), ANY_REQUEST.DDR_NEAR 0x0080808000 (ANY_REQUEST bit 15, DDR_NEAR bits
/// 23 and 31), ANY_RFO.DDR_NEAR 0x0080800022 (ANY_RFO bits 1 and 5), ANY_REQUEST.OUTSTANDING
/// 0x4000008000 (OUTSTANDING bit 38). umask 0x01 selects MSR_OFFCORE_RSP_0 and 0x02
/// MSR_OFFCORE_RSP_1 (Linux arch/x86/events/intel/core.c, intel_knl_extra_regs: 0x01b7 and
/// 0x02b7), so config is 0x1b7 / 0x2b7 and the MSR value goes to config1.
#[test]
fn knl_seed_examples_encode_as_intel_documents_them() {
    let any = catalog();
    for (spec, config, config1) in [
        // Normal mode.
        (
            "knl::OFFCORE_RESPONSE_0:DMND_DATA_RD:ANY_RESPONSE",
            0x1b7,
            0x1_0001,
        ),
        // No supplier or snoop: libpfm defaults to ANY_RESPONSE (bit 16) with ANY_REQUEST.
        ("knl::OFFCORE_RESPONSE_0:ANY_REQUEST", 0x1b7, 0x1_8000),
        (
            "knl::OFFCORE_RESPONSE_0:ANY_RFO:DDR_NEAR",
            0x1b7,
            0x8080_0022,
        ),
        (
            "knl::OFFCORE_RESPONSE_0:ANY_REQUEST:DDR_NEAR",
            0x1b7,
            0x8080_8000,
        ),
        // Average-latency mode: the pair of each example.
        (
            "knl::OFFCORE_RESPONSE_0:DMND_DATA_RD:OUTSTANDING",
            0x1b7,
            0x40_0000_0001,
        ),
        (
            "knl::OFFCORE_RESPONSE_1:DMND_DATA_RD:ANY_RESPONSE",
            0x2b7,
            0x1_0001,
        ),
        (
            "knl::OFFCORE_RESPONSE_0:ANY_REQUEST:OUTSTANDING",
            0x1b7,
            0x40_0000_8000,
        ),
        (
            "knl::OFFCORE_RESPONSE_1:ANY_REQUEST:ANY_RESPONSE",
            0x2b7,
            0x1_8000,
        ),
    ] {
        assert_eq!(libpfm(spec, &any), (4, config, config1, None), "{spec}");
    }
    // The modifiers (seed, MODIFIERS) in PERFEVTSEL (SDM vol. 3B, "Architectural Performance
    // Monitoring Version 1": edge bit 18, AnyThread bit 21, inv bit 23, cmask bits 24-31).
    // UOPS_RETIRED.ALL on KNL: event 0xC2, umask 0x10 (knightslanding_core.json).
    let knl = for_model("intel-knl");
    assert_eq!(libpfm("UOPS_RETIRED:ALL", &knl).1, 0x10c2);
    assert_eq!(libpfm("UOPS_RETIRED:ALL:e:c=1:i", &knl).1, 0x0184_10c2);
    assert_eq!(libpfm("UOPS_RETIRED:ALL:c=255", &knl).1, 0xff00_10c2);
    // t on a fixed-counter event: UNHALTED_CORE_CYCLES is architectural event 0x3C.
    assert_eq!(libpfm("UNHALTED_CORE_CYCLES:t", &knl).1, 0x0020_003c);
    assert_eq!(libpfm("UOPS_RETIRED:ALL:u", &knl).3, Some(USER_ONLY_NO_HV));
    let kernel = libpfm("UOPS_RETIRED:ALL:k", &knl).3.unwrap();
    assert_eq!((kernel.user, kernel.kernel), (true, false));
    // u and k together count both.
    let both = libpfm("UOPS_RETIRED:ALL:u:k", &knl).3.unwrap();
    assert_eq!((both.user, both.kernel), (false, false));
    // Knights Mill shares the core: the same event on knm.
    assert_eq!(libpfm("knm::UOPS_RETIRED:ALL", &any).1, 0x10c2);
}

/// libpfm sets exclude_hv only where the PMU cannot filter the hypervisor level; Intel's
/// core PMUs can't, so `:u` leaves hv counted (libpfm's pfmlib_perf_event.c, supported_plm).
const USER_ONLY_NO_HV: Exclude = Exclude {
    user: false,
    kernel: true,
    hv: false,
    host: false,
    guest: false,
    idle: false,
};

/// Every illegal combination of the seed, each refused in one line naming the spec and
/// libpfm's reason.
#[test]
fn knl_seed_illegal_combinations_are_refused() {
    for (spec, reason) in [
        // ANY_RESPONSE overrides supplier and snoop: not both.
        (
            "knl::OFFCORE_RESPONSE_0:ANY_RFO:DDR_NEAR:ANY_RESPONSE",
            "invalid combination of model specific features",
        ),
        // OUTSTANDING goes with request types and nothing else.
        (
            "knl::OFFCORE_RESPONSE_0:DMND_DATA_RD:OUTSTANDING:DDR_NEAR",
            "invalid combination of model specific features",
        ),
        (
            "knl::OFFCORE_RESPONSE_0:DMND_DATA_RD:OUTSTANDING:ANY_RESPONSE",
            "invalid combination of model specific features",
        ),
        // t only on the fixed-counter events.
        ("knl::UOPS_RETIRED:ALL:t", "invalid event attribute"),
        // e needs c >= 1.
        ("knl::UOPS_RETIRED:ALL:e", "invalid event attribute"),
        // c is 0..=255.
        ("knl::UOPS_RETIRED:ALL:c=256", "invalid"),
        // Sampling modifiers have no place in counting (PFM_OS_PERF_EVENT refuses them).
        ("knl::UOPS_RETIRED:ALL:period=10", "invalid event attribute"),
        ("knl::NOT_AN_EVENT", "event not found"),
    ] {
        let text = error(spec);
        assert!(
            text.contains(&format!("event '{spec}': libpfm4")) && text.contains(reason),
            "{spec}: {text}"
        );
    }
}

/// Events per PMU family, expected words from the vendors' documents, not from libpfm. Intel:
/// PERFEVTSEL = event | umask << 8 | cmask << 24 (SDM vol. 3B); codes from Intel's perfmon
/// event lists (github.com/intel/perfmon: SKL/events/skylake_core.json, ICL/events/
/// icelake_core.json, SPR/events/sapphirerapids_core.json). AMD: PerfEvtSel EventSelect[7:0]
/// at bits 7:0, UnitMask at 15:8, EventSelect[11:8] at bits 35:32 (AMD PPR for Family 19h
/// Model 11h, #55901, MSRC001_020[0...A]); codes from the same PPR's core PMC events.
#[test]
fn vendor_documented_encodings_per_family() {
    let any = catalog();
    for (spec, config) in [
        // Skylake: INST_RETIRED.ANY_P 0xC0/0x00, UOPS_ISSUED.ANY 0x0E/0x01,
        // INT_MISC.RECOVERY_CYCLES 0x0D/0x01, IDQ_UOPS_NOT_DELIVERED.CORE 0x9C/0x01,
        // CYCLE_ACTIVITY.STALLS_MEM_ANY 0xA3/0x14 with CounterMask 20.
        ("skl::INST_RETIRED:ANY_P", 0xc0),
        ("skl::UOPS_ISSUED:ANY", 0x10e),
        ("skl::INT_MISC:RECOVERY_CYCLES", 0x10d),
        ("skl::IDQ_UOPS_NOT_DELIVERED:CORE", 0x19c),
        ("skl::CYCLE_ACTIVITY:STALLS_MEM_ANY", 0x1400_14a3),
        // Ice Lake: UOPS_ISSUED.ANY 0x0E/0x01, INT_MISC.RECOVERY_CYCLES 0x0D/0x01,
        // BR_MISP_RETIRED.ALL_BRANCHES 0xC5/0x00, TOPDOWN.SLOTS_P 0xA4/0x01.
        ("icl::UOPS_ISSUED:ANY", 0x10e),
        ("icl::INT_MISC:RECOVERY_CYCLES", 0x10d),
        ("icl::BR_MISP_RETIRED:ALL_BRANCHES", 0xc5),
        ("icl::TOPDOWN:SLOTS_P", 0x1a4),
        // Sapphire Rapids: INST_RETIRED.ANY_P 0xC0/0x00, TOPDOWN.SLOTS_P 0xA4/0x01, and
        // UOPS_ISSUED.ANY moved to 0xAE/0x01.
        ("spr::INST_RETIRED:ANY_P", 0xc0),
        ("spr::TOPDOWN:SLOTS_P", 0x1a4),
        ("spr::UOPS_ISSUED:ANY", 0x1ae),
        // Zen 4: PMCx0C0 Retired Instructions, PMCx076 Cycles not in Halt, PMCx0C3 Retired
        // Branch Instructions Mispredicted, PMCx029 LS Dispatch UnitMask bit 0 LdDispatch,
        // PMCx1A0 Dispatch Slots stalled UnitMask 0x01 (no ops from the frontend): event
        // bits 11:8 = 1 go to config bit 32.
        ("amd64_fam19h_zen4::RETIRED_INSTRUCTIONS", 0xc0),
        ("amd64_fam19h_zen4::CYCLES_NOT_IN_HALT", 0x76),
        (
            "amd64_fam19h_zen4::RETIRED_BRANCH_INSTRUCTIONS_MISPREDICTED",
            0xc3,
        ),
        ("amd64_fam19h_zen4::LS_DISPATCH:LD_DISPATCH", 0x129),
        (
            "amd64_fam19h_zen4::DISPATCH_STALLS_1:FE_NO_OPS",
            0x1_0000_01a0,
        ),
    ] {
        assert_eq!(libpfm(spec, &any), (4, config, 0, None), "{spec}");
    }
    // Skylake's offcore response: DEMAND_DATA_RD.ANY_RESPONSE is 0xB7/0x01 with MSRValue
    // 0x0000010001 (skylake_core.json).
    assert_eq!(
        libpfm("skl::OFFCORE_RESPONSE_0:DMND_DATA_RD:ANY_RESPONSE", &any),
        (4, 0x1b7, 0x1_0001, None)
    );
    // Without a prefix, the model in use picks the PMU: the same name, two generations.
    assert_eq!(libpfm("UOPS_ISSUED:ANY", &for_model("intel-skl")).1, 0x10e);
    assert_eq!(libpfm("UOPS_ISSUED:ANY", &for_model("intel-spr")).1, 0x1ae);
    assert_eq!(
        libpfm("RETIRED_INSTRUCTIONS", &for_model("amd-zen4")).1,
        0xc0
    );
    // An SMT variant shares its PMU.
    assert_eq!(
        libpfm("UOPS_ISSUED:ANY", &for_model("intel-skl-smt")).1,
        0x10e
    );
}

/// Neoverse N2 (Arm Neoverse N2 TRM, "PMU events": INST_RETIRED 0x08, CPU_CYCLES 0x11,
/// STALL_SLOT 0x3F; the event number is the whole config). libpfm builds its Arm PMUs only
/// into Arm builds of the library, so this runs on Arm hosts only.
#[cfg(target_arch = "aarch64")]
#[test]
fn neoverse_n2_events_as_the_trm_documents_them() {
    let n2 = for_model("arm-neoverse-n2");
    for (spec, config) in [
        ("INST_RETIRED", 0x08),
        ("CPU_CYCLES", 0x11),
        ("STALL_SLOT", 0x3f),
    ] {
        assert_eq!(libpfm(spec, &n2).1, config, "{spec}");
    }
}

#[test]
fn libpfm_maps_topdown_models_to_its_pmus() {
    for (model, pmu) in [
        ("intel-skl", Some("skl")),
        ("intel-skl-smt", Some("skl")),
        ("intel-icl", Some("icl")),
        ("intel-spr", Some("spr")),
        ("amd-zen4", Some("amd64_fam19h_zen4")),
        ("arm-neoverse-n2", Some("arm_n2")),
        ("software", None),
    ] {
        assert_eq!(pfm::pmu_for_model(model), pmu, "{model}");
    }
    // libpfm's own names for the x86 ones: each encodes its architectural instructions event.
    for pmu in ["skl", "icl", "spr", "knl", "knm", "snb"] {
        assert!(
            pfm::encode("INST_RETIRED:ANY_P", Some(pmu)).is_ok()
                || pfm::encode("UOPS_RETIRED:ALL", Some(pmu)).is_ok(),
            "{pmu}"
        );
    }
}

#[test]
fn every_error_is_one_line_naming_the_problem() {
    for (spec, expected) in [
        ("skl::UOPS_ISSUED:NOPE", "libpfm4: invalid event attribute"),
        ("skl::NOT_AN_EVENT:X", "libpfm4: event not found"),
        ("cpu/nonsense=1/", "unknown term 'nonsense' on PMU cpu"),
        ("cpu/event=0x1000/", "does not fit the 8 bits of event"),
        ("cpu/event=zz/", "'zz' is not a number"),
        ("nopmu/event=1/", "no PMU 'nopmu'"),
        ("cpu/event=1", "needs a closing '/'"),
        ("cycles:x", "unknown modifier 'x'"),
        ("cycles:p", "for sampling"),
        ("cycles:HG", "exclude each other"),
        ("not-an-event", "unknown event 'not-an-event'"),
        ("", "empty event spec"),
    ] {
        let text = error(spec);
        assert!(text.contains(expected), "{spec}: {text}");
    }
}

#[test]
fn the_syntax_rule_tells_the_two_apart() {
    assert!(is_libpfm("INT_MISC:RECOVERY_CYCLES"));
    assert!(is_libpfm("skl::INST_RETIRED:ANY"));
    assert!(is_libpfm("LLC_MISSES"));
    assert!(!is_libpfm("sched:sched_switch"));
    assert!(!is_libpfm("cpu/event=0x3c/"));
    assert!(!is_libpfm("r01c2"));
    assert!(!is_libpfm("cycles:u"));
    assert!(!is_libpfm("topdown-retiring"));
}

/// Specs the fuzzer found (`CS` once aborted in free(), in a sanitizer build where libpfm's
/// canonical name was freed with another allocator's `free`): refused in one line or encoded.
#[test]
fn short_and_odd_libpfm_specs_are_refused_or_encoded() {
    for spec in [
        "CS",
        "cpu/CS/",
        "armv8_pmuv3_0/CS",
        "C",
        "CS:",
        "::CS",
        "skl::CS",
    ] {
        // Refused (one line) or encoded: what matters is that the process survives them all.
        if let Err(err) = parse_event(spec, &catalog()) {
            assert_eq!(format!("{err:#}").lines().count(), 1, "{spec}");
        }
    }
}
