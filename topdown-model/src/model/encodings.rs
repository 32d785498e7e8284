//! Every raw event encoding of the Intel generic-counter models (`intel_core.rs`) and E-core
//! models (`intel_atom.rs`), checked field by field against Linux perf's pmu-events JSON.
//!
//! Each event gives the fields as perf's JSON spells them (EventCode, UMask, CounterMask,
//! EdgeDetect, AnyThread; absent = 0; no event here sets Invert), listed under the file it was
//! read from, which a failure names. Files read (tools/perf/pmu-events/arch/x86/...):
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
struct Encoding {
    name: &'static str,
    event: u64,
    umask: u64,
    cmask: u64,
    edge: u64,
    any: u64,
    /// What else than its source file's entry of the same name the event was read from.
    note: &'static str,
}

impl Encoding {
    /// The x86 `cpu` PMU's format/: event 0-7, umask 8-15, edge 18, any 21, cmask 24-31.
    fn config(&self) -> u64 {
        self.event | self.umask << 8 | self.edge << 18 | self.any << 21 | self.cmask << 24
    }

    /// The same event with EdgeDetect set.
    const fn edge(self) -> Self {
        Self { edge: 1, ..self }
    }

    /// The same event with AnyThread set.
    const fn any_thread(self) -> Self {
        Self { any: 1, ..self }
    }

    /// The same event, read from `note` in its source file (another entry, another file's
    /// counter mask).
    const fn note(self, note: &'static str) -> Self {
        Self { note, ..self }
    }
}

/// An event with EventCode `event`, UMask `umask` and CounterMask `cmask`.
const fn encoding(name: &'static str, event: u64, umask: u64, cmask: u64) -> Encoding {
    Encoding {
        name,
        event,
        umask,
        cmask,
        edge: 0,
        any: 0,
        note: "",
    }
}

/// Events read from one file (`source`, with what else the reading took), for the same model
/// families: `snb` (intel-snb, intel-ivb and their -smt), `skl` (intel-skl, intel-skl-smt),
/// `grt`, `cmt`, `skt`, `icl`.
struct Source {
    families: &'static [&'static str],
    source: &'static str,
    events: &'static [Encoding],
}

const SNB: &[&str] = &["snb"];
const ICL: &[&str] = &["icl"];
const SKL: &[&str] = &["skl"];
const BOTH_CORES: &[&str] = &["snb", "skl"];
const E_CORES: &[&str] = &["grt", "cmt", "skt"];

/// Sandy Bridge's UOPS_DISPATCHED.THREAD with the counter masks snb-metrics.json gives it.
const DISPATCHED_CMASK: &str = "UOPS_DISPATCHED.THREAD, cmask from snb-metrics.json";

/// Skylake's JSON has no counter mask for INT_MISC.RECOVERY_CYCLES(_ANY) (0x0d/0x01, AnyThread 1);
/// topdown keeps the kernel's own Skylake alias `topdown-recovery-bubbles` =
/// event=0xd,umask=0x1,cmask=1 (arch/x86/events/intel/core.c, topdown-formulas.md §2.1), which
/// counts the same per-cycle condition.
const RECOVERY_BUBBLES: &str = "kernel alias topdown-recovery-bubbles";

const TABLE: &[Source] = &[
    Source {
        families: BOTH_CORES,
        source: "{sandybridge,skylake}/pipeline.json",
        events: &[
            // The model names TMA's CLKS (CPU_CLK_UNHALTED.THREAD, fixed counter 1 in the JSON)
            // but opens the architectural CPU_CLK_UNHALTED.THREAD_P encoding, which the kernel
            // may still place on fixed counter 1 (arch/x86/events/intel/core.c
            // FIXED_EVENT_CONSTRAINT(0x003c, 1)).
            encoding("CPU_CLK_UNHALTED.THREAD", 0x3c, 0x00, 0).note("CPU_CLK_UNHALTED.THREAD_P"),
            encoding("UOPS_ISSUED.ANY", 0x0e, 0x01, 0),
            encoding("UOPS_RETIRED.RETIRE_SLOTS", 0xc2, 0x02, 0),
            encoding("CPU_CLK_UNHALTED.ONE_THREAD_ACTIVE", 0x3c, 0x02, 0),
            encoding("CPU_CLK_UNHALTED.REF_XCLK", 0x3c, 0x01, 0),
            encoding("BR_MISP_RETIRED.ALL_BRANCHES", 0xc5, 0x00, 0),
            encoding("MACHINE_CLEARS.COUNT", 0xc3, 0x01, 1).edge(),
            // INST_RETIRED.ANY_P's encoding: the kernel puts 0x00c0 on fixed counter 0
            // (FIXED_EVENT_CONSTRAINT(0x00c0, 0)), which is what the model declares.
            encoding("INST_RETIRED.ANY", 0xc0, 0x00, 0).note("INST_RETIRED.ANY_P"),
        ],
    },
    Source {
        families: BOTH_CORES,
        source: "{sandybridge,skylake}/frontend.json",
        events: &[
            encoding("IDQ_UOPS_NOT_DELIVERED.CORE", 0x9c, 0x01, 0),
            encoding(
                "IDQ_UOPS_NOT_DELIVERED.CYCLES_0_UOPS_DELIV.CORE",
                0x9c,
                0x01,
                4,
            ),
        ],
    },
    Source {
        families: SNB,
        source: "sandybridge/pipeline.json",
        events: &[
            encoding("INT_MISC.RECOVERY_CYCLES", 0x0d, 0x03, 1),
            encoding("INT_MISC.RECOVERY_CYCLES_ANY", 0x0d, 0x03, 1).any_thread(),
            // Sandy Bridge's Memory_Bound terms (snb-metrics.json tma_memory_bound); libpfm4's
            // `snb` table encodes the same (it names 0xb1/0x01 UOPS_EXECUTED:THREAD).
            encoding("CYCLE_ACTIVITY.STALLS_L1D_PENDING", 0xa3, 0x06, 6),
            encoding("RESOURCE_STALLS.SB", 0xa2, 0x08, 0),
            encoding("CYCLE_ACTIVITY.CYCLES_NO_DISPATCH", 0xa3, 0x04, 4),
            encoding("RS_EVENTS.EMPTY_CYCLES", 0x5e, 0x01, 0),
            encoding("UOPS_DISPATCHED.THREAD:c1", 0xb1, 0x01, 1).note(DISPATCHED_CMASK),
            encoding("UOPS_DISPATCHED.THREAD:c2", 0xb1, 0x01, 2).note(DISPATCHED_CMASK),
            encoding("UOPS_DISPATCHED.THREAD:c3", 0xb1, 0x01, 3).note(DISPATCHED_CMASK),
        ],
    },
    Source {
        families: SNB,
        source: "sandybridge/frontend.json",
        events: &[encoding("IDQ.MS_UOPS", 0x79, 0x30, 0)],
    },
    Source {
        families: SKL,
        source: "skylake/pipeline.json",
        events: &[
            encoding("INT_MISC.RECOVERY_CYCLES", 0x0d, 0x01, 1).note(RECOVERY_BUBBLES),
            encoding("INT_MISC.RECOVERY_CYCLES_ANY", 0x0d, 0x01, 1)
                .any_thread()
                .note(RECOVERY_BUBBLES),
            encoding("UOPS_RETIRED.MACRO_FUSED", 0xc2, 0x04, 0).note("Linux 6.x"),
            encoding("CYCLE_ACTIVITY.STALLS_MEM_ANY", 0xa3, 0x14, 20),
            encoding("CYCLE_ACTIVITY.STALLS_TOTAL", 0xa3, 0x04, 4),
            encoding("EXE_ACTIVITY.1_PORTS_UTIL", 0xa6, 0x02, 0),
            encoding("EXE_ACTIVITY.2_PORTS_UTIL", 0xa6, 0x04, 0),
            encoding("EXE_ACTIVITY.BOUND_ON_STORES", 0xa6, 0x40, 0).note("no CounterMask"),
        ],
    },
    // E-cores. CPU_CLK_UNHALTED.CORE is the architectural unhalted-cycles event (0x3c/0x00,
    // CPU_CLK_UNHALTED.CORE_P in the JSON), the same on every Intel core.
    Source {
        families: E_CORES,
        source: "architectural (SDM vol. 3, CPU_CLK_UNHALTED.CORE_P)",
        events: &[encoding("CPU_CLK_UNHALTED.CORE", 0x3c, 0x00, 0)],
    },
    Source {
        families: &["grt", "cmt"],
        source: "{alderlake,meteorlake}/pipeline.json",
        events: &[
            encoding("TOPDOWN_FE_BOUND.ALL", 0x71, 0x00, 0),
            encoding("TOPDOWN_BE_BOUND.ALL", 0x74, 0x00, 0),
        ],
    },
    Source {
        families: &["grt"],
        source: "alderlake/pipeline.json",
        events: &[encoding("TOPDOWN_RETIRING.ALL", 0xc2, 0x00, 0)],
    },
    Source {
        families: &["cmt"],
        source: "meteorlake/pipeline.json",
        events: &[
            encoding("TOPDOWN_RETIRING.ALL", 0x72, 0x00, 0),
            encoding("TOPDOWN_BAD_SPECULATION.ALL", 0x73, 0x00, 0),
        ],
    },
    Source {
        families: E_CORES,
        source: "{alderlake,meteorlake,lunarlake}/pipeline.json",
        events: &[
            encoding("TOPDOWN_FE_BOUND.FRONTEND_LATENCY", 0x71, 0x72, 0),
            encoding("TOPDOWN_FE_BOUND.FRONTEND_BANDWIDTH", 0x71, 0x8d, 0),
            encoding("TOPDOWN_BAD_SPECULATION.MISPREDICT", 0x73, 0x04, 0),
            encoding("TOPDOWN_BAD_SPECULATION.MACHINE_CLEARS", 0x73, 0x03, 0),
            encoding("TOPDOWN_BE_BOUND.ALLOC_RESTRICTIONS", 0x74, 0x01, 0),
        ],
    },
    // Skymont: the TOPDOWN_*.ALL names are fixed-counter events there; the model opens the
    // general-counter `_P` forms (TOPDOWN_FE_BOUND.ALL_P and so on).
    Source {
        families: &["skt"],
        source: "lunarlake/pipeline.json, each name's _P form",
        events: &[
            encoding("TOPDOWN_FE_BOUND.ALL", 0x9c, 0x01, 0),
            encoding("TOPDOWN_BE_BOUND.ALL", 0xa4, 0x02, 0),
            encoding("TOPDOWN_RETIRING.ALL", 0xc2, 0x02, 0),
            encoding("TOPDOWN_BAD_SPECULATION.ALL", 0x73, 0x00, 0),
        ],
    },
    // Ice Lake.
    Source {
        families: ICL,
        source: "icelake/pipeline.json",
        events: &[
            encoding("INT_MISC.UOP_DROPPING", 0x0d, 0x10, 0),
            encoding("INT_MISC.CLEARS_COUNT", 0x0d, 0x01, 1).edge(),
            encoding("BR_MISP_RETIRED.ALL_BRANCHES", 0xc5, 0x00, 0),
            encoding("MACHINE_CLEARS.COUNT", 0xc3, 0x01, 1).edge(),
            encoding("CYCLE_ACTIVITY.STALLS_MEM_ANY", 0xa3, 0x14, 20),
            encoding("EXE_ACTIVITY.BOUND_ON_STORES", 0xa6, 0x40, 2),
            encoding("CYCLE_ACTIVITY.STALLS_TOTAL", 0xa3, 0x04, 4),
            encoding("EXE_ACTIVITY.1_PORTS_UTIL", 0xa6, 0x02, 0),
            encoding("EXE_ACTIVITY.2_PORTS_UTIL", 0xa6, 0x04, 0),
            // tma_heavy_operations' terms; libpfm4's `icl` table encodes the same.
            encoding("UOPS_ISSUED.ANY", 0x0e, 0x01, 0),
            encoding("UOPS_DECODED.DEC0", 0x56, 0x01, 0),
            encoding("UOPS_DECODED.DEC0:c1", 0x56, 0x01, 1)
                .note("UOPS_DECODED.DEC0, cmask from icl-metrics.json"),
        ],
    },
    Source {
        families: ICL,
        source: "icelake/frontend.json",
        events: &[
            encoding(
                "IDQ_UOPS_NOT_DELIVERED.CYCLES_0_UOPS_DELIV.CORE",
                0x9c,
                0x01,
                5,
            ),
            encoding("IDQ.MS_UOPS", 0x79, 0x30, 0),
            encoding("IDQ.MITE_UOPS", 0x79, 0x04, 0),
        ],
    },
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
    // Each event beside the source it was read from, for the models' families.
    let rows: Vec<(&Source, &Encoding)> = TABLE
        .iter()
        .flat_map(|source| source.events.iter().map(move |event| (source, event)))
        .collect();
    let mut checked = 0;
    let mut used = vec![false; rows.len()];
    for model in &models {
        let name = model.name();
        let family = family(&name);
        for spec in model.counters() {
            if family == "icl" && spec.uses != CounterUse::General {
                continue;
            }
            let Some((index, (source, event))) =
                rows.iter().enumerate().find(|(_, (source, event))| {
                    source.families.contains(&family) && event.name == spec.name
                })
            else {
                panic!("{name}: {} has no row in the encoding table", spec.name);
            };
            used[index] = true;
            assert_eq!(
                spec.source,
                CounterSource::Perf {
                    perf_type: PERF_TYPE_RAW,
                    config: event.config(),
                },
                "{name}: {} (expected from {} {})",
                spec.name,
                source.source,
                event.note
            );
            checked += 1;
        }
    }
    // intel-snb 17, -smt 19, intel-ivb 9, -smt 11, intel-skl 15, -smt 17, grt 9, cmt 10,
    // skt 10, icl 15 (general counters, and the fixed INST_RETIRED.ANY of snb and skl).
    assert_eq!(checked, 132);
    let unused: Vec<&str> = rows
        .iter()
        .zip(&used)
        .filter(|(_, used)| !**used)
        .map(|((_, event), _)| event.name)
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
