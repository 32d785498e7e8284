//! `intel-icl`: Ice Lake / Tiger Lake / Rocket Lake / Ice Lake-SP with PERF_METRICS.
//!
//! Counters: the `slots` leader (fixed counter 3) and the four level-1 metric pseudo-events,
//! which the kernel reports as slot-scaled counts (topdown-formulas.md §1.2), plus the two
//! generic events perf's current L1 formulas use. These parts have no L2 metric bytes, so level 2
//! comes from generic counters as perf's icl-metrics.json computes it (torvalds/linux
//! tools/perf/pmu-events/arch/x86/icelake/icl-metrics.json at 6b93f350e55f): fetch latency and
//! bandwidth, branch mispredicts and machine clears, memory and core bound, heavy and light
//! operations, in three rotating level-2 groups: 20 counters and 6 timing slots, 26 of the 32
//! BPF counter slots (topdown_common::MAX_COUNTERS).

use super::{
    CounterSpec, LevelOne, LevelTwo, Model, bad_speculation_left_over, floored_difference, ratio,
    value,
};
use crate::groups::LEVEL_TWO_GROUP;

/// (name, raw config) in group order; level-1 encodings from topdown-formulas.md §1.1 and §1.5,
/// level-2 ones from perf's icelake/{pipeline,frontend}.json (checked in `encodings::tests`).
const COUNTERS: [(&str, u64); 20] = [
    ("slots", 0x0400),
    ("topdown-retiring", 0x8000),
    ("topdown-bad-spec", 0x8100),
    ("topdown-fe-bound", 0x8200),
    ("topdown-be-bound", 0x8300),
    ("INT_MISC.UOP_DROPPING", 0x100d),
    ("INT_MISC.CLEARS_COUNT", 0x0104_010d),
    // Group 8: the frontend and bad-speculation splits; the two ratio terms share the group.
    (
        "IDQ_UOPS_NOT_DELIVERED.CYCLES_0_UOPS_DELIV.CORE",
        0x0500_019c,
    ),
    ("BR_MISP_RETIRED.ALL_BRANCHES", 0x00c5),
    ("MACHINE_CLEARS.COUNT", 0x0104_01c3),
    // Group 9: the memory-bound fraction, all of whose terms share the group.
    ("CYCLE_ACTIVITY.STALLS_MEM_ANY", 0x1400_14a3),
    ("EXE_ACTIVITY.BOUND_ON_STORES", 0x0200_40a6),
    ("CYCLE_ACTIVITY.STALLS_TOTAL", 0x0400_04a3),
    ("EXE_ACTIVITY.1_PORTS_UTIL", 0x02a6),
    ("EXE_ACTIVITY.2_PORTS_UTIL", 0x04a6),
    // Group 10: tma_heavy_operations' terms (icelake/pipeline.json and frontend.json; libpfm4's
    // `icl` table encodes the same).
    ("UOPS_ISSUED.ANY", 0x010e),
    ("IDQ.MS_UOPS", 0x3079),
    ("UOPS_DECODED.DEC0", 0x0156),
    ("UOPS_DECODED.DEC0:c1", 0x0100_0156),
    ("IDQ.MITE_UOPS", 0x0479),
];

// Positions in `COUNTERS`: what the formulas read.
const SLOTS: usize = 0;
const RETIRING: usize = 1;
const BAD_SPEC: usize = 2;
const FE_BOUND: usize = 3;
const BE_BOUND: usize = 4;
const UOP_DROPPING: usize = 5;
const CLEARS_COUNT: usize = 6;
const CYCLES_0_UOPS: usize = 7;
const BR_MISP: usize = 8;
const MACHINE_CLEARS: usize = 9;
const STALLS_MEM_ANY: usize = 10;
const BOUND_ON_STORES: usize = 11;
const STALLS_TOTAL: usize = 12;
const ONE_PORT_UTIL: usize = 13;
const TWO_PORTS_UTIL: usize = 14;
const UOPS_ISSUED: usize = 15;
const MS_UOPS: usize = 16;
const DECODED_DEC0: usize = 17;
const DECODED_DEC0_CYCLES: usize = 18;
const MITE_UOPS: usize = 19;

pub struct IntelIcl;

/// Every model of this file, for `--pmu`, `topdown list` and `report -i`.
pub fn models() -> Vec<Box<dyn Model>> {
    vec![Box::new(IntelIcl)]
}

impl Model for IntelIcl {
    super::name_and_description!(
        "intel-icl",
        "Intel Ice Lake/Tiger Lake/Rocket Lake/Ice Lake-SP perf metrics: TopDown L1 + L2 (level 2 from generic counters)"
    );

    fn counters(&self) -> Vec<CounterSpec> {
        COUNTERS
            .iter()
            .enumerate()
            .map(|(index, (name, config))| {
                let spec = CounterSpec::raw(name, *config);
                // slots and the four metric events live on fixed counter 3 and PERF_METRICS.
                match index {
                    0..5 => spec.fixed(),
                    CYCLES_0_UOPS..=MACHINE_CLEARS => spec.in_group(LEVEL_TWO_GROUP),
                    STALLS_MEM_ANY..=TWO_PORTS_UTIL => spec.in_group(LEVEL_TWO_GROUP + 1),
                    UOPS_ISSUED.. => spec.in_group(LEVEL_TWO_GROUP + 2),
                    _ => spec,
                }
            })
            .collect()
    }

    fn max_level(&self) -> u8 {
        2
    }

    fn metrics_into(&self, values: &[u64], level: u8, out: &mut [Option<f64>]) {
        let get = |index: usize| value(values, index);
        let slots = get(SLOTS);
        let retiring_slots = get(RETIRING);
        let frontend_slots = get(FE_BOUND);
        let backend_slots = get(BE_BOUND);
        // The four metric counts are each floored by the kernel, so they sum to <= slots;
        // perf divides by their sum (topdown-formulas.md §1.2 conclusion, §1.4 "SUM").
        let sum = retiring_slots + get(BAD_SPEC) + frontend_slots + backend_slots;

        // topdown-formulas.md §1.4, ICL/ICX/TGL/RKL column (P-json-x86 icl-metrics.json):
        // Frontend_Bound = fe/SUM - INT_MISC.UOP_DROPPING/SLOTS
        let frontend = ratio(frontend_slots, sum)
            .zip(ratio(get(UOP_DROPPING), slots))
            .map(|(fe, dropping)| fe - dropping);
        // Backend_Bound = be/SUM + 5 * INT_MISC.CLEARS_COUNT/SLOTS
        let backend = ratio(backend_slots, sum)
            .zip(ratio(get(CLEARS_COUNT), slots))
            .map(|(be, clears)| be + 5.0 * clears);
        // Retiring = ret/SUM
        let retiring = ratio(retiring_slots, sum);
        let level_one = LevelOne {
            retiring,
            // Bad_Speculation = max(1 - (FE + BE + RET), 0): derived; the raw topdown-bad-spec
            // only enters through SUM, as in perf.
            bad_speculation: bad_speculation_left_over(frontend, backend, retiring),
            frontend_bound: frontend,
            backend_bound: backend,
        };
        level_one.write_with_level_two(out, level, |level_one| {
            // icl-metrics.json tma_fetch_latency:
            //   (5 * IDQ_UOPS_NOT_DELIVERED.CYCLES_0_UOPS_DELIV.CORE - INT_MISC.UOP_DROPPING) / SLOTS
            let fetch_latency = ratio(5.0 * get(CYCLES_0_UOPS) - get(UOP_DROPPING), slots);
            // tma_branch_mispredicts: BR_MISP_RETIRED.ALL_BRANCHES / (BR_MISP_RETIRED.ALL_BRANCHES
            //   + MACHINE_CLEARS.COUNT) * tma_bad_speculation
            let branch_mispredicts = ratio(get(BR_MISP), get(BR_MISP) + get(MACHINE_CLEARS))
                .zip(level_one.bad_speculation)
                .map(|(share, bad)| share * bad);
            // tma_memory_bound: (CYCLE_ACTIVITY.STALLS_MEM_ANY + EXE_ACTIVITY.BOUND_ON_STORES) /
            //   (CYCLE_ACTIVITY.STALLS_TOTAL + (EXE_ACTIVITY.1_PORTS_UTIL + tma_retiring *
            //   EXE_ACTIVITY.2_PORTS_UTIL) + EXE_ACTIVITY.BOUND_ON_STORES) * tma_backend_bound
            let stores = get(BOUND_ON_STORES);
            let memory_bound = retiring
                .and_then(|ret| {
                    ratio(
                        get(STALLS_MEM_ANY) + stores,
                        get(STALLS_TOTAL) + get(ONE_PORT_UTIL) + ret * get(TWO_PORTS_UTIL) + stores,
                    )
                })
                .zip(backend)
                .map(|(share, be)| share * be);
            // tma_microcode_sequencer: tma_retiring * tma_info_thread_slots / UOPS_ISSUED.ANY *
            //   IDQ.MS_UOPS / tma_info_thread_slots
            let microcode_sequencer = retiring
                .zip(ratio(get(MS_UOPS), get(UOPS_ISSUED)))
                .map(|(ret, ms_share)| ret * ms_share);
            // tma_heavy_operations: tma_microcode_sequencer + tma_retiring * (UOPS_DECODED.DEC0 -
            //   cpu@UOPS_DECODED.DEC0,cmask=1@) / IDQ.MITE_UOPS
            let heavy_operations = microcode_sequencer
                .zip(retiring)
                .zip(ratio(
                    get(DECODED_DEC0) - get(DECODED_DEC0_CYCLES),
                    get(MITE_UOPS),
                ))
                .map(|((ms, ret), few_uops)| ms + ret * few_uops);
            // tma_fetch_bandwidth, tma_machine_clears, tma_core_bound and tma_light_operations:
            // max(0, parent - sibling).
            LevelTwo::with_siblings(
                level_one,
                floored_difference,
                fetch_latency,
                branch_mispredicts,
                memory_bound,
                heavy_operations,
            )
        });
    }

    super::weighed_by_slots_counter!(COUNTERS[SLOTS]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CounterSource;
    use crate::model::{L1_METRICS, L2_METRICS};

    fn close(value: Option<f64>, expected: f64) -> bool {
        value.is_some_and(|value| (value - expected).abs() < 1e-12)
    }

    #[test]
    fn level_one_as_perf_computes_it() {
        // SUM = 400+100+200+300 = 1000. FE = 200/1000 - 50/1000 = 0.15;
        // BE = 300/1000 + 5*10/1000 = 0.35; RET = 0.4; BadSpec = 1 - 0.9 = 0.1.
        let metrics = IntelIcl.metrics(&[1000, 400, 100, 200, 300, 50, 10], 1);
        assert!(close(metrics["frontend_bound"], 0.15));
        assert!(close(metrics["backend_bound"], 0.35));
        assert!(close(metrics["retiring"], 0.4));
        assert!(close(metrics["bad_speculation"], 0.1));
        assert_eq!(metrics.len(), 4);
    }

    #[test]
    fn bad_speculation_is_clamped_at_zero() {
        // SUM = 2000 (slots 1000 is smaller only in this constructed case). FE = 0.25 - 0;
        // BE = 0.5 + 5*200/1000 = 1.5; RET = 0.25: 1 - 2.0 < 0 -> 0.
        let metrics = IntelIcl.metrics(&[1000, 500, 0, 500, 1000, 0, 200], 1);
        assert!(close(metrics["backend_bound"], 1.5));
        assert_eq!(metrics["bad_speculation"], Some(0.0));
    }

    #[test]
    fn no_counts_means_no_metrics_and_level_two_is_null() {
        let metrics = IntelIcl.metrics(&[0; 20], 2);
        assert!(metrics.values().all(Option::is_none));
        for name in L1_METRICS.iter().chain(L2_METRICS.iter()) {
            assert!(metrics.contains_key(name), "{name}");
        }
    }

    #[test]
    fn counters_put_slots_first() {
        let counters = IntelIcl.counters();
        assert_eq!(counters[0].name, "slots");
        assert_eq!(
            counters[0].source,
            CounterSource::Perf {
                perf_type: 4,
                config: 0x0400
            }
        );
        assert_eq!(counters.len(), 20);
        // Level 1 pinned (2 general) beside any level-2 group (3, 5 and 5 general) fits the 8
        // general counters; three rotating groups keep the slots at 20 + 6 <= 32.
        let general = |group: u8| {
            counters
                .iter()
                .filter(|spec| {
                    spec.group == group && spec.uses == crate::model::CounterUse::General
                })
                .count()
        };
        assert_eq!(
            (general(0), general(8), general(9), general(10)),
            (2, 3, 5, 5)
        );
        const _: () = assert!(20 + 2 * 3 <= topdown_common::MAX_COUNTERS);
    }
}
