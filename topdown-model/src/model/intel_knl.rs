//! Intel Knights Landing (family 6 model 0x57) and Knights Mill (model 0x85): `intel-knl`.
//!
//! Both parts have the same Silvermont-derived core PMU (libpfm4 4.13 encodes the `knl` and
//! `knm` PMUs' events identically), so one model serves both. The formulas are toplev's
//! (pmu-tools `knl_ratios.py`, which subclasses `slm_ratios.py` with CPU_CLK_UNHALTED.THREAD as
//! CLKS): frontend and bad speculation are fractions of *cycles* in which nothing was allocated,
//! retiring is a fraction of 2 allocation slots per cycle (`UOPS_RETIRED.ALL / (2 * CLKS)`), and
//! backend is what is left. Level 2 has only Frontend Latency, as in toplev.
//!
//! Counter budget: 2 general-purpose counters per thread (Intel perfmon
//! `KNL/events/knightslanding_core.json` gives every programmable event `"Counter": "0,1"`;
//! libpfm4's `pfm_get_pmu_info` for `knl`/`knm` says `num_cntrs` 2, `num_fixed_cntrs` 3). The
//! libpfm man page (the seed `libpfm-intel-knl.txt`) says 4, which its own tables contradict.
//! CPU_CLK_UNHALTED.THREAD is declared general like the other Intel models' cycle events: the
//! NMI watchdog holds fixed counter 1. So every scheduling group holds two events.

use super::{CounterSpec, LevelOne, LevelTwo, Model, ratio, value};
use crate::groups::LEVEL_TWO_GROUP;

pub struct IntelKnl;

// Encodings `umask << 8 | event`, from Intel perfmon KNL/events/knightslanding_core.json (also
// Linux tools/perf/pmu-events/arch/x86/knightslanding/*.json); each checked against libpfm4
// 4.13's `knl::` encoding (LIBPFM_ENCODE_INACTIVE=1, pfm_get_event_encoding).
super::input_ids! {
    /// Positions in [`Model::counters`].
    mod at {
        /// 0x3C/0x00 (CPU_CLK_UNHALTED.THREAD_P: the programmable form of fixed counter 1).
        CLOCKS = "CPU_CLK_UNHALTED.THREAD",
        /// 0xCA/0x90 (KNL's umask; Silvermont's is 0x50).
        NOT_DELIVERED = "NO_ALLOC_CYCLES.NOT_DELIVERED",
        /// 0xCA/0x04.
        MISPREDICTS = "NO_ALLOC_CYCLES.MISPREDICTS",
        /// 0xC2/0x10.
        UOPS_RETIRED = "UOPS_RETIRED.ALL",
        /// 0x86/0x04.
        ICACHE_FILL = "FETCH_STALL.ICACHE_FILL_PENDING_CYCLES",
        /// 0x05/0x02 (without edge detect; with it the same code counts I_SIDE_WALKS).
        ITLB_WALK_CYCLES = "PAGE_WALKS.I_SIDE_CYCLES",
        /// 0xE7/0x01 (libpfm names it MS_DECODED:ENTRY).
        MS_ENTRY = "MS_DECODED.MS_ENTRY",
        /// 0xE6/0x01.
        BACLEARS = "BACLEARS.ALL",
    }
}

/// Allocation width: toplev's Retiring divides UOPS_RETIRED.ALL by `2 * CLKS` (slm_ratios.py
/// `Retiring`); the kernel's Silvermont `topdown-total-slots.scale` is 2 as well.
const WIDTH: f64 = 2.0;

/// toplev's cost in cycles of one MS entry and of one BACLEAR (slm_ratios.py `ms_entry_cost`,
/// `ba_clears_cost`).
const MS_ENTRY_CYCLES: f64 = 5.0;
const BACLEAR_CYCLES: f64 = 5.0;

/// Every model of this file, for `--pmu`, `topdown list` and `report -i`.
pub fn models() -> Vec<Box<dyn Model>> {
    vec![Box::new(IntelKnl)]
}

impl Model for IntelKnl {
    super::name_and_description!(
        "intel-knl",
        "Intel Knights Landing / Knights Mill (Xeon Phi): TopDown L1 + Frontend Latency (toplev KNL)"
    );

    fn counters(&self) -> Vec<CounterSpec> {
        // Two counters per thread: pairs. Frontend's ratio is exact within group 0; the rest
        // are estimated whenever the groups rotate, which on KNL they always do.
        let level_two = LEVEL_TWO_GROUP;
        vec![
            CounterSpec::raw(CLOCKS, 0x003c),
            CounterSpec::raw(NOT_DELIVERED, 0x90ca),
            CounterSpec::raw(MISPREDICTS, 0x04ca).in_group(1),
            CounterSpec::raw(UOPS_RETIRED, 0x10c2).in_group(1),
            CounterSpec::raw(ICACHE_FILL, 0x0486).in_group(level_two),
            CounterSpec::raw(ITLB_WALK_CYCLES, 0x0205).in_group(level_two),
            CounterSpec::raw(MS_ENTRY, 0x01e7).in_group(level_two + 1),
            CounterSpec::raw(BACLEARS, 0x01e6).in_group(level_two + 1),
        ]
    }

    fn max_level(&self) -> u8 {
        2
    }

    fn metrics_into(&self, values: &[u64], level: u8, out: &mut [Option<f64>]) {
        let get = |position: usize| value(values, position);
        let clocks = get(at::CLOCKS);
        // slm_ratios.py level 1: FrontendBound = NOT_DELIVERED / CLKS; BadSpeculation =
        // MISPREDICTS / CLKS; Retiring = UOPS_RETIRED.ALL / (2 * CLKS); BackendBound =
        // 1 - (Retiring + BadSpeculation + FrontendBound).
        let frontend = ratio(get(at::NOT_DELIVERED), clocks);
        let bad_speculation = ratio(get(at::MISPREDICTS), clocks);
        let retiring = ratio(get(at::UOPS_RETIRED), WIDTH * clocks);
        let level_one = LevelOne {
            retiring,
            bad_speculation,
            frontend_bound: frontend,
            backend_bound: frontend
                .zip(bad_speculation)
                .zip(retiring)
                .map(|((fe, bs), ret)| 1.0 - (fe + bs + ret)),
        };
        level_one.write_with_level_two(out, level, |_| {
            // knl_ratios.py level 2 (FrontendLatency, from slm_ratios.py): ICacheMisses (KNL: only
            // FETCH_STALL.ICACHE_FILL_PENDING_CYCLES / CLKS, no PDCACHE_WRONG) + ITLBMisses
            // (PAGE_WALKS.I_SIDE_CYCLES / CLKS) + MSSwitches (5 * MS_ENTRY / CLKS) + 5 *
            // BACLEARS.ALL / CLKS. slm_ratios.py sums those per-cycle fractions and divides by
            // CLKS once more, which leaves a 1/cycles quantity; topdown takes the evident intent,
            // the sum itself. toplev has no Frontend Bandwidth or other level-2 node for KNL:
            // they stay null.
            let latency_cycles = get(at::ICACHE_FILL)
                + get(at::ITLB_WALK_CYCLES)
                + MS_ENTRY_CYCLES * get(at::MS_ENTRY)
                + BACLEAR_CYCLES * get(at::BACLEARS);
            LevelTwo {
                fetch_latency: ratio(latency_cycles, clocks),
                ..LevelTwo::default()
            }
        });
    }

    fn weight_counter(&self) -> &'static str {
        CLOCKS
    }

    fn slots(&self, values: &[u64]) -> Option<f64> {
        Some(WIDTH * value(values, at::CLOCKS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::L2_METRICS;
    use crate::model::{CounterSource, CounterUse, PERF_TYPE_RAW, values_of};
    use crate::schedule::plan;

    #[test]
    fn encodings_follow_intel_perfmon() {
        let configs: Vec<(String, u64)> = IntelKnl
            .counters()
            .into_iter()
            .map(|spec| match spec.source {
                CounterSource::Perf { perf_type, config } => {
                    assert_eq!(perf_type, PERF_TYPE_RAW, "{}", spec.name);
                    (spec.name, config)
                }
                other => panic!("{}: {other:?}", spec.name),
            })
            .collect();
        // Worked from knightslanding_core.json: (UMask << 8) | EventCode.
        let expected = [
            ("CPU_CLK_UNHALTED.THREAD", 0x003c),
            ("NO_ALLOC_CYCLES.NOT_DELIVERED", 0x90ca),
            ("NO_ALLOC_CYCLES.MISPREDICTS", 0x04ca),
            ("UOPS_RETIRED.ALL", 0x10c2),
            ("FETCH_STALL.ICACHE_FILL_PENDING_CYCLES", 0x0486),
            ("PAGE_WALKS.I_SIDE_CYCLES", 0x0205),
            ("MS_DECODED.MS_ENTRY", 0x01e7),
            ("BACLEARS.ALL", 0x01e6),
        ];
        assert_eq!(
            configs,
            expected
                .iter()
                .map(|(name, config)| ((*name).to_owned(), *config))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn every_group_fits_the_two_counters_of_a_knl_thread() {
        for spec in IntelKnl.counters() {
            assert_eq!(spec.uses, CounterUse::General, "{}", spec.name);
        }
        let two = plan(&IntelKnl, 2, &|_| Some(2)).unwrap();
        assert_eq!(two.groups.len(), 4);
        for group in &two.groups {
            assert_eq!(group.members.len(), 2);
            assert!(!group.pinned);
        }
        // 8 counters and an enabled/running pair per rotating group.
        assert_eq!(two.slots.len(), 16);
        assert_eq!(two.notes.len(), 1);
        assert!(
            two.notes[0].contains("needs 8 general-purpose"),
            "{}",
            two.notes[0]
        );
        // Level 1 alone is four events: one pinned group where four counters are free (the
        // seed's figure), two rotating pairs on a real KNL thread.
        let four = plan(&IntelKnl, 1, &|_| Some(4)).unwrap();
        assert_eq!(four.groups.len(), 1);
        assert!(four.groups[0].pinned);
        assert_eq!(four.groups[0].members, vec![0, 1, 2, 3]);
        let level_one = plan(&IntelKnl, 1, &|_| Some(2)).unwrap();
        assert_eq!(level_one.groups.len(), 2);
        assert_eq!(level_one.groups[0].members, vec![0, 1]);
        assert_eq!(level_one.groups[1].members, vec![2, 3]);
        let err = plan(&IntelKnl, 1, &|_| Some(1)).unwrap_err().to_string();
        assert!(err.contains("needs 2 general-purpose counters"), "{err}");
    }

    #[test]
    fn level_one_and_frontend_latency_by_hand() {
        // CLKS 1000: FE 250/1000, BadSpec 50/1000, RET 900/2000, BE 1 - 0.75 = 0.25;
        // FetchLat = (100 + 40 + 5*6 + 5*4)/1000 = 0.19.
        let values = values_of(
            &IntelKnl,
            &[
                (CLOCKS, 1000),
                (NOT_DELIVERED, 250),
                (MISPREDICTS, 50),
                (UOPS_RETIRED, 900),
                (ICACHE_FILL, 100),
                (ITLB_WALK_CYCLES, 40),
                (MS_ENTRY, 6),
                (BACLEARS, 4),
            ],
        );
        let metrics = IntelKnl.metrics(&values, 2);
        assert_eq!(metrics["frontend_bound"], Some(0.25));
        assert_eq!(metrics["bad_speculation"], Some(0.05));
        assert_eq!(metrics["retiring"], Some(0.45));
        assert_eq!(metrics["backend_bound"], Some(0.25));
        assert_eq!(metrics["fetch_latency"], Some(0.19));
        for name in L2_METRICS.iter().filter(|name| **name != "fetch_latency") {
            assert_eq!(metrics[*name], None, "{name}");
        }
        assert_eq!(IntelKnl.metrics(&values, 1).len(), 4);
        assert_eq!(IntelKnl.slots(&values), Some(2000.0));
    }

    #[test]
    fn no_clocks_means_no_data() {
        let metrics = IntelKnl.metrics(&[0, 10, 10, 10, 10, 10, 10, 10], 2);
        assert!(metrics.values().all(Option::is_none), "{metrics:?}");
    }
}
