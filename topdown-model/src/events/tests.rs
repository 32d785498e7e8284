//! Event specs on a fixture machine (`tests/fixtures/events`: an Intel `cpu` PMU with its
//! format/ and a few events/, and an `armv8_pmuv3_0` with FEAT_PMUv3_TH thresholds).

use std::path::PathBuf;

use super::*;

fn catalog() -> PmuCatalog {
    PmuCatalog::load(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/events"))
}

fn perf(spec: &str) -> (u32, u64, u64, Option<Exclude>) {
    let attr = parse_event(spec, &catalog()).unwrap_or_else(|err| panic!("{spec}: {err:#}"));
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

#[test]
fn libpfm_specs_with_the_knl_modifiers() {
    // 0x0d | 0x01 << 8 | edge << 18 | cmask 1 << 24 = 0x104010d (the kernel's SKL alias).
    assert_eq!(
        perf("INT_MISC:RECOVERY_CYCLES:c=1:e"),
        (4, 0x0104_010d, 0, None)
    );
    assert_eq!(perf("UOPS_ISSUED:ANY:u"), (4, 0x010e, 0, Some(USER_ONLY)));
    // t = AnyThread (bit 21) on a fixed-counter event; i = inv (bit 23).
    assert_eq!(perf("CPU_CLK_UNHALTED:THREAD:t").1, 0x0020_003c);
    assert_eq!(perf("UOPS_ISSUED:ANY:c=1:i").1, 0x0180_010e);
    // u and k together count both.
    assert_eq!(
        perf("INST_RETIRED:ANY:u:k").3.map(|e| (e.user, e.kernel)),
        Some((false, false))
    );
    // An event with one umask needs none named.
    assert_eq!(perf("LLC_MISSES").1, 0x412e);
}

#[test]
fn libpfm_intel_names_are_refused_on_other_vendors() {
    let mut intel = catalog();
    intel.cpu_vendor = Some("GenuineIntel".to_owned());
    assert!(parse_event("INT_MISC:RECOVERY_CYCLES:c=1:e", &intel).is_ok());
    for vendor in ["AuthenticAMD", "Arm (CPU implementer 0x41)"] {
        let mut other = catalog();
        other.cpu_vendor = Some(vendor.to_owned());
        let err = format!(
            "{:#}",
            parse_event("INT_MISC:RECOVERY_CYCLES:c=1:e", &other).unwrap_err()
        );
        assert!(
            err.contains(&format!(
                "Intel's events and this CPU is {vendor}: use perf syntax"
            )),
            "{err}"
        );
        // Syntax is still checked first.
        let err = format!(
            "{:#}",
            parse_event("INT_MISC:RECOVERY_CYCLES:e", &other).unwrap_err()
        );
        assert!(err.contains("needs c=N with N >= 1"), "{err}");
    }
}

#[test]
fn every_error_is_one_line_naming_the_problem() {
    for (spec, expected) in [
        ("INT_MISC:RECOVERY_CYCLES:e", "needs c=N with N >= 1"),
        ("UOPS_ISSUED:ANY:t", "only for the fixed-counter events"),
        (
            "UNHALTED_REFERENCE_CYCLES:t",
            "only for the fixed-counter events",
        ),
        ("UOPS_ISSUED:ANY:c=300", "out of range"),
        (
            "UOPS_RETIRED",
            "needs a umask: one of RETIRE_SLOTS, MACRO_FUSED",
        ),
        ("UOPS_ISSUED:NOPE", "neither a umask of UOPS_ISSUED"),
        ("NOT_AN_EVENT:X", "unknown libpfm event 'NOT_AN_EVENT'"),
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
