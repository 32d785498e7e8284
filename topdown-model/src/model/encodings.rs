//! Every raw event encoding of the Intel generic-counter models (`intel_core.rs`) and E-core
//! models (`intel_atom.rs`), checked field by field against Linux perf's pmu-events JSON.
//!
//! Each row gives the fields as perf's JSON spells them (EventCode, UMask, CounterMask,
//! Invert, EdgeDetect, AnyThread; absent = 0) and the file they were read from. Files read
//! (tools/perf/pmu-events/arch/x86/...):
//!
//! - `skylake/pipeline.json`: torvalds/linux 175502747b6c (and the re-sorted Linux 6.x version,
//!   which adds UOPS_RETIRED.MACRO_FUSED), `skylake/frontend.json`: torvalds/linux 00ca782ec9f8;
//! - `sandybridge/pipeline.json`, `sandybridge/frontend.json`: Linux 6.x;
//! - `alderlake/pipeline.json` (Unit cpu_atom = Gracemont): torvalds/linux 0604aa87b098;
//! - `meteorlake/pipeline.json` (cpu_atom = Crestmont): torvalds/linux 0939bd2fcf33;
//! - `lunarlake/pipeline.json` (cpu_atom = Skymont): torvalds/linux 23878069de30;
//! - `icelake/pipeline.json`: torvalds/linux 0604aa87b098, `icelake/frontend.json`:
//!   torvalds/linux ab7f3246b8cd.
//!
//! A counter a model opens without a row here fails the test, so a new event needs its source.
//! (`intel-icl`'s `slots` and `topdown-*` pseudo-events are the kernel's fixed-counter and
//! PERF_METRICS encodings, not perf JSON events: only its general-purpose counters are rows.)

use super::{
    CounterSource, CounterUse, PERF_TYPE_RAW, base_model, intel_atom, intel_core, intel_icl,
};

/// One event as perf's JSON encodes it.
struct Row {
    /// Model families the row applies to: `snb` (intel-snb, intel-ivb and their -smt), `skl` (intel-skl,
    /// intel-skl-smt), `grt`, `cmt`, `skt`.
    families: &'static [&'static str],
    name: &'static str,
    event: u64,
    umask: u64,
    cmask: u64,
    inv: u64,
    edge: u64,
    any: u64,
    source: &'static str,
}

impl Row {
    /// The x86 `cpu` PMU's format/: event 0-7, umask 8-15, edge 18, any 21, inv 23, cmask 24-31.
    fn config(&self) -> u64 {
        self.event
            | self.umask << 8
            | self.edge << 18
            | self.any << 21
            | self.inv << 23
            | self.cmask << 24
    }
}

const fn row(
    families: &'static [&'static str],
    name: &'static str,
    (event, umask, cmask): (u64, u64, u64),
    (inv, edge, any): (u64, u64, u64),
    source: &'static str,
) -> Row {
    Row {
        families,
        name,
        event,
        umask,
        cmask,
        inv,
        edge,
        any,
        source,
    }
}

const SNB: &[&str] = &["snb"];
const ICL: &[&str] = &["icl"];
const SKL: &[&str] = &["skl"];
const BOTH_CORES: &[&str] = &["snb", "skl"];
const NONE: (u64, u64, u64) = (0, 0, 0);

const TABLE: &[Row] = &[
    // The model names TMA's CLKS (CPU_CLK_UNHALTED.THREAD, fixed counter 1 in the JSON) but
    // opens the architectural CPU_CLK_UNHALTED.THREAD_P encoding, which the kernel may still
    // place on fixed counter 1 (arch/x86/events/intel/core.c FIXED_EVENT_CONSTRAINT(0x003c, 1)).
    row(
        BOTH_CORES,
        "CPU_CLK_UNHALTED.THREAD",
        (0x3c, 0x00, 0),
        NONE,
        "{sandybridge,skylake}/pipeline.json CPU_CLK_UNHALTED.THREAD_P",
    ),
    row(
        BOTH_CORES,
        "UOPS_ISSUED.ANY",
        (0x0e, 0x01, 0),
        NONE,
        "{sandybridge,skylake}/pipeline.json",
    ),
    row(
        BOTH_CORES,
        "UOPS_RETIRED.RETIRE_SLOTS",
        (0xc2, 0x02, 0),
        NONE,
        "{sandybridge,skylake}/pipeline.json",
    ),
    row(
        BOTH_CORES,
        "IDQ_UOPS_NOT_DELIVERED.CORE",
        (0x9c, 0x01, 0),
        NONE,
        "{sandybridge,skylake}/frontend.json",
    ),
    row(
        BOTH_CORES,
        "CPU_CLK_UNHALTED.ONE_THREAD_ACTIVE",
        (0x3c, 0x02, 0),
        NONE,
        "{sandybridge,skylake}/pipeline.json",
    ),
    row(
        BOTH_CORES,
        "CPU_CLK_UNHALTED.REF_XCLK",
        (0x3c, 0x01, 0),
        NONE,
        "{sandybridge,skylake}/pipeline.json",
    ),
    row(
        SNB,
        "INT_MISC.RECOVERY_CYCLES",
        (0x0d, 0x03, 1),
        NONE,
        "sandybridge/pipeline.json",
    ),
    row(
        SNB,
        "INT_MISC.RECOVERY_CYCLES_ANY",
        (0x0d, 0x03, 1),
        (0, 0, 1),
        "sandybridge/pipeline.json",
    ),
    // Skylake's JSON has no counter mask here; topdown keeps the kernel's own Skylake alias
    // `topdown-recovery-bubbles` = event=0xd,umask=0x1,cmask=1 (arch/x86/events/intel/core.c,
    // topdown-formulas.md §2.1), which counts the same per-cycle condition.
    row(
        SKL,
        "INT_MISC.RECOVERY_CYCLES",
        (0x0d, 0x01, 1),
        NONE,
        "kernel alias topdown-recovery-bubbles (skylake/pipeline.json: 0x0d/0x01)",
    ),
    row(
        SKL,
        "INT_MISC.RECOVERY_CYCLES_ANY",
        (0x0d, 0x01, 1),
        (0, 0, 1),
        "kernel alias topdown-recovery-bubbles, any=1 (skylake/pipeline.json: AnyThread 1)",
    ),
    row(
        BOTH_CORES,
        "IDQ_UOPS_NOT_DELIVERED.CYCLES_0_UOPS_DELIV.CORE",
        (0x9c, 0x01, 4),
        NONE,
        "{sandybridge,skylake}/frontend.json",
    ),
    row(
        BOTH_CORES,
        "BR_MISP_RETIRED.ALL_BRANCHES",
        (0xc5, 0x00, 0),
        NONE,
        "{sandybridge,skylake}/pipeline.json",
    ),
    row(
        BOTH_CORES,
        "MACHINE_CLEARS.COUNT",
        (0xc3, 0x01, 1),
        (0, 1, 0),
        "{sandybridge,skylake}/pipeline.json",
    ),
    row(
        SNB,
        "IDQ.MS_UOPS",
        (0x79, 0x30, 0),
        NONE,
        "sandybridge/frontend.json",
    ),
    row(
        SKL,
        "UOPS_RETIRED.MACRO_FUSED",
        (0xc2, 0x04, 0),
        NONE,
        "skylake/pipeline.json (Linux 6.x)",
    ),
    // INST_RETIRED.ANY_P's encoding: the kernel puts 0x00c0 on fixed counter 0
    // (FIXED_EVENT_CONSTRAINT(0x00c0, 0)), which is what the model declares.
    row(
        BOTH_CORES,
        "INST_RETIRED.ANY",
        (0xc0, 0x00, 0),
        NONE,
        "{sandybridge,skylake}/pipeline.json INST_RETIRED.ANY_P",
    ),
    // Sandy Bridge's Memory_Bound terms (snb-metrics.json tma_memory_bound); libpfm4's `snb`
    // table encodes the same (it names 0xb1/0x01 UOPS_EXECUTED:THREAD).
    row(
        SNB,
        "CYCLE_ACTIVITY.STALLS_L1D_PENDING",
        (0xa3, 0x06, 6),
        NONE,
        "sandybridge/pipeline.json",
    ),
    row(
        SNB,
        "RESOURCE_STALLS.SB",
        (0xa2, 0x08, 0),
        NONE,
        "sandybridge/pipeline.json",
    ),
    row(
        SNB,
        "CYCLE_ACTIVITY.CYCLES_NO_DISPATCH",
        (0xa3, 0x04, 4),
        NONE,
        "sandybridge/pipeline.json",
    ),
    row(
        SNB,
        "UOPS_DISPATCHED.THREAD:c1",
        (0xb1, 0x01, 1),
        NONE,
        "sandybridge/pipeline.json UOPS_DISPATCHED.THREAD, cmask from snb-metrics.json",
    ),
    row(
        SNB,
        "UOPS_DISPATCHED.THREAD:c2",
        (0xb1, 0x01, 2),
        NONE,
        "sandybridge/pipeline.json UOPS_DISPATCHED.THREAD, cmask from snb-metrics.json",
    ),
    row(
        SNB,
        "UOPS_DISPATCHED.THREAD:c3",
        (0xb1, 0x01, 3),
        NONE,
        "sandybridge/pipeline.json UOPS_DISPATCHED.THREAD, cmask from snb-metrics.json",
    ),
    row(
        SNB,
        "RS_EVENTS.EMPTY_CYCLES",
        (0x5e, 0x01, 0),
        NONE,
        "sandybridge/pipeline.json",
    ),
    row(
        SKL,
        "CYCLE_ACTIVITY.STALLS_MEM_ANY",
        (0xa3, 0x14, 20),
        NONE,
        "skylake/pipeline.json",
    ),
    row(
        SKL,
        "CYCLE_ACTIVITY.STALLS_TOTAL",
        (0xa3, 0x04, 4),
        NONE,
        "skylake/pipeline.json",
    ),
    row(
        SKL,
        "EXE_ACTIVITY.BOUND_ON_STORES",
        (0xa6, 0x40, 0),
        NONE,
        "skylake/pipeline.json (no CounterMask)",
    ),
    row(
        SKL,
        "EXE_ACTIVITY.1_PORTS_UTIL",
        (0xa6, 0x02, 0),
        NONE,
        "skylake/pipeline.json",
    ),
    row(
        SKL,
        "EXE_ACTIVITY.2_PORTS_UTIL",
        (0xa6, 0x04, 0),
        NONE,
        "skylake/pipeline.json",
    ),
    // E-cores. CPU_CLK_UNHALTED.CORE is the architectural unhalted-cycles event (0x3c/0x00,
    // CPU_CLK_UNHALTED.CORE_P in the JSON), the same on every Intel core.
    row(
        &["grt", "cmt", "skt"],
        "CPU_CLK_UNHALTED.CORE",
        (0x3c, 0x00, 0),
        NONE,
        "architectural (SDM vol. 3, CPU_CLK_UNHALTED.CORE_P)",
    ),
    row(
        &["grt", "cmt"],
        "TOPDOWN_FE_BOUND.ALL",
        (0x71, 0x00, 0),
        NONE,
        "{alderlake,meteorlake}/pipeline.json",
    ),
    row(
        &["grt", "cmt"],
        "TOPDOWN_BE_BOUND.ALL",
        (0x74, 0x00, 0),
        NONE,
        "{alderlake,meteorlake}/pipeline.json",
    ),
    row(
        &["grt"],
        "TOPDOWN_RETIRING.ALL",
        (0xc2, 0x00, 0),
        NONE,
        "alderlake/pipeline.json",
    ),
    row(
        &["cmt"],
        "TOPDOWN_RETIRING.ALL",
        (0x72, 0x00, 0),
        NONE,
        "meteorlake/pipeline.json",
    ),
    row(
        &["cmt"],
        "TOPDOWN_BAD_SPECULATION.ALL",
        (0x73, 0x00, 0),
        NONE,
        "meteorlake/pipeline.json",
    ),
    row(
        &["grt", "cmt", "skt"],
        "TOPDOWN_FE_BOUND.FRONTEND_LATENCY",
        (0x71, 0x72, 0),
        NONE,
        "{alderlake,meteorlake,lunarlake}/pipeline.json",
    ),
    row(
        &["grt", "cmt", "skt"],
        "TOPDOWN_FE_BOUND.FRONTEND_BANDWIDTH",
        (0x71, 0x8d, 0),
        NONE,
        "{alderlake,meteorlake,lunarlake}/pipeline.json",
    ),
    row(
        &["grt", "cmt", "skt"],
        "TOPDOWN_BAD_SPECULATION.MISPREDICT",
        (0x73, 0x04, 0),
        NONE,
        "{alderlake,meteorlake,lunarlake}/pipeline.json",
    ),
    row(
        &["grt", "cmt", "skt"],
        "TOPDOWN_BAD_SPECULATION.MACHINE_CLEARS",
        (0x73, 0x03, 0),
        NONE,
        "{alderlake,meteorlake,lunarlake}/pipeline.json",
    ),
    row(
        &["grt", "cmt", "skt"],
        "TOPDOWN_BE_BOUND.ALLOC_RESTRICTIONS",
        (0x74, 0x01, 0),
        NONE,
        "{alderlake,meteorlake,lunarlake}/pipeline.json",
    ),
    // Skymont: the TOPDOWN_*.ALL names are fixed-counter events there; the model opens the
    // general-counter `_P` forms.
    row(
        &["skt"],
        "TOPDOWN_FE_BOUND.ALL",
        (0x9c, 0x01, 0),
        NONE,
        "lunarlake/pipeline.json TOPDOWN_FE_BOUND.ALL_P",
    ),
    row(
        &["skt"],
        "TOPDOWN_BE_BOUND.ALL",
        (0xa4, 0x02, 0),
        NONE,
        "lunarlake/pipeline.json TOPDOWN_BE_BOUND.ALL_P",
    ),
    row(
        &["skt"],
        "TOPDOWN_RETIRING.ALL",
        (0xc2, 0x02, 0),
        NONE,
        "lunarlake/pipeline.json TOPDOWN_RETIRING.ALL_P",
    ),
    row(
        &["skt"],
        "TOPDOWN_BAD_SPECULATION.ALL",
        (0x73, 0x00, 0),
        NONE,
        "lunarlake/pipeline.json TOPDOWN_BAD_SPECULATION.ALL_P",
    ),
    // Ice Lake (icelake/pipeline.json and icelake/frontend.json).
    row(
        ICL,
        "INT_MISC.UOP_DROPPING",
        (0x0d, 0x10, 0),
        NONE,
        "icelake/pipeline.json",
    ),
    row(
        ICL,
        "INT_MISC.CLEARS_COUNT",
        (0x0d, 0x01, 1),
        (0, 1, 0),
        "icelake/pipeline.json",
    ),
    row(
        ICL,
        "IDQ_UOPS_NOT_DELIVERED.CYCLES_0_UOPS_DELIV.CORE",
        (0x9c, 0x01, 5),
        NONE,
        "icelake/frontend.json",
    ),
    row(
        ICL,
        "BR_MISP_RETIRED.ALL_BRANCHES",
        (0xc5, 0x00, 0),
        NONE,
        "icelake/pipeline.json",
    ),
    row(
        ICL,
        "MACHINE_CLEARS.COUNT",
        (0xc3, 0x01, 1),
        (0, 1, 0),
        "icelake/pipeline.json",
    ),
    row(
        ICL,
        "CYCLE_ACTIVITY.STALLS_MEM_ANY",
        (0xa3, 0x14, 20),
        NONE,
        "icelake/pipeline.json",
    ),
    row(
        ICL,
        "EXE_ACTIVITY.BOUND_ON_STORES",
        (0xa6, 0x40, 2),
        NONE,
        "icelake/pipeline.json",
    ),
    row(
        ICL,
        "CYCLE_ACTIVITY.STALLS_TOTAL",
        (0xa3, 0x04, 4),
        NONE,
        "icelake/pipeline.json",
    ),
    row(
        ICL,
        "EXE_ACTIVITY.1_PORTS_UTIL",
        (0xa6, 0x02, 0),
        NONE,
        "icelake/pipeline.json",
    ),
    row(
        ICL,
        "EXE_ACTIVITY.2_PORTS_UTIL",
        (0xa6, 0x04, 0),
        NONE,
        "icelake/pipeline.json",
    ),
    // tma_heavy_operations' terms; libpfm4's `icl` table encodes the same.
    row(
        ICL,
        "UOPS_ISSUED.ANY",
        (0x0e, 0x01, 0),
        NONE,
        "icelake/pipeline.json",
    ),
    row(
        ICL,
        "IDQ.MS_UOPS",
        (0x79, 0x30, 0),
        NONE,
        "icelake/frontend.json",
    ),
    row(
        ICL,
        "UOPS_DECODED.DEC0",
        (0x56, 0x01, 0),
        NONE,
        "icelake/pipeline.json",
    ),
    row(
        ICL,
        "UOPS_DECODED.DEC0:c1",
        (0x56, 0x01, 1),
        NONE,
        "icelake/pipeline.json UOPS_DECODED.DEC0, cmask from icl-metrics.json",
    ),
    row(
        ICL,
        "IDQ.MITE_UOPS",
        (0x79, 0x04, 0),
        NONE,
        "icelake/frontend.json",
    ),
];

fn family(model: &str) -> &'static str {
    match model {
        // Ivy Bridge..Broadwell open Sandy Bridge's level-1 and level-2 encodings.
        "intel-snb" | "intel-snb-smt" | "intel-ivb" | "intel-ivb-smt" => "snb",
        "intel-skl" | "intel-skl-smt" => "skl",
        "intel-grt" => "grt",
        "intel-cmt" => "cmt",
        "intel-skt" => "skt",
        "intel-icl" => "icl",
        other => panic!("no encoding family for {other}"),
    }
}

#[test]
fn every_intel_generic_counter_encoding_matches_perfs_json() {
    let models: Vec<_> = intel_core::models()
        .into_iter()
        .chain(intel_atom::models())
        .chain(intel_icl::models())
        .collect();
    assert_eq!(models.len(), 10);
    let mut checked = 0;
    let mut used = vec![false; TABLE.len()];
    for model in &models {
        let name = model.name();
        let family = family(&name);
        for spec in model.counters() {
            if family == "icl" && spec.uses != CounterUse::General {
                continue;
            }
            let Some((index, row)) = TABLE
                .iter()
                .enumerate()
                .find(|(_, row)| row.families.contains(&family) && row.name == spec.name)
            else {
                panic!("{name}: {} has no row in the encoding table", spec.name);
            };
            used[index] = true;
            assert_eq!(
                spec.source,
                CounterSource::Perf {
                    perf_type: PERF_TYPE_RAW,
                    config: row.config(),
                },
                "{name}: {} (expected from {})",
                spec.name,
                row.source
            );
            checked += 1;
        }
    }
    // intel-snb 17, -smt 19, intel-ivb 9, -smt 11, intel-skl 15, -smt 17, grt 9, cmt 10,
    // skt 10, icl 15 (general counters, and the fixed INST_RETIRED.ANY of snb and skl).
    assert_eq!(checked, 132);
    let unused: Vec<&str> = TABLE
        .iter()
        .zip(&used)
        .filter(|(_, used)| !**used)
        .map(|(row, _)| row.name)
        .collect();
    assert!(unused.is_empty(), "rows no model opens: {unused:?}");
}

#[test]
fn skylake_bound_on_stores_has_no_counter_mask() {
    let skl = base_model("intel-skl").unwrap().counters();
    let stores = skl
        .iter()
        .find(|spec| spec.name == "EXE_ACTIVITY.BOUND_ON_STORES")
        .unwrap();
    assert_eq!(
        stores.source,
        CounterSource::Perf {
            perf_type: PERF_TYPE_RAW,
            config: 0x40a6
        }
    );
}
