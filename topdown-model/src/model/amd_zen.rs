//! `amd-zen4`, `amd-zen5`: AMD's "pipeline utilization" TopDown (topdown-formulas.md §4).
//!
//! AMD counts dispatch slots: `W` per cycle (6 on Zen 4, 8 on Zen 5), and level 1 has a fifth
//! bucket, `smt_contention`: slots lost because the sibling thread dispatched. The core PMU has
//! 6 general-purpose counters and no fixed ones, so level 1 (6 events) fills it and the level-2
//! extras (6 more events) form a second group that rotates with it (`crate::schedule`). The events
//! of each level-2 ratio share that group, so the ratios are exact even while rotating; only their
//! product with a level-1 bucket is an estimate.

use super::{CounterSpec, LevelOne, LevelTwo, Model, extras_at, ratio, value};
use crate::groups::LEVEL_TWO_GROUP;

/// Raw config of an AMD core event (topdown-formulas.md §4.1, K-amd `PMU_FORMAT_ATTR`):
/// event select bits 0-7 and 32-35, unit mask 8-15, counter mask 24-31.
pub const fn amd_config(event: u64, umask: u64, cmask: u64) -> u64 {
    (event & 0xff) | ((event >> 8) & 0xf) << 32 | (umask & 0xff) << 8 | (cmask & 0xff) << 24
}

/// Which Zen generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zen {
    Zen4,
    Zen5,
}

pub struct AmdZen {
    generation: Zen,
}

impl AmdZen {
    pub fn new(generation: Zen) -> Self {
        Self { generation }
    }

    /// Dispatch width W: "upto 6 instructions can be dispatched in each cycle" on Zen 4, 8 on
    /// Zen 5 (topdown-formulas.md §4.2, `amdzen4/pipeline.json`, `amdzen5/pipeline.json`).
    fn width(&self) -> u64 {
        match self.generation {
            Zen::Zen4 => 6,
            Zen::Zen5 => 8,
        }
    }

    /// The counter standing for "pipeline restarts" R: `resyncs_or_nc_redirects` (0x96) on
    /// Zen 4, `bp_redirects.resync` (0x9F/0x01) on Zen 5 (§4.1).
    fn restarts(&self) -> (&'static str, u64) {
        match self.generation {
            Zen::Zen4 => ("resyncs_or_nc_redirects", amd_config(0x96, 0, 0)),
            Zen::Zen5 => ("bp_redirects.resync", amd_config(0x9f, 0x01, 0)),
        }
    }

    fn frontend_cmask_name(&self) -> &'static str {
        match self.generation {
            Zen::Zen4 => "de_no_dispatch_per_slot.no_ops_from_frontend:cmask=6",
            Zen::Zen5 => "de_no_dispatch_per_slot.no_ops_from_frontend:cmask=8",
        }
    }
}

super::input_ids! {
    /// Positions of the counters in `counters()`, the same on Zen 4 and Zen 5 (the two without
    /// an event name here are named per generation).
    mod at {
        CYCLES = "ls_not_halted_cyc",
        FRONTEND = "de_no_dispatch_per_slot.no_ops_from_frontend",
        DISPATCHED = "de_src_op_disp.all",
        RETIRED = "ex_ret_ops",
        BACKEND = "de_no_dispatch_per_slot.backend_stalls",
        SMT = "de_no_dispatch_per_slot.smt_contention",
        FRONTEND_CMASK,
        MISPREDICTS = "ex_ret_brn_misp",
        RESTARTS,
        LOAD_NOT_COMPLETE = "ex_no_retire.load_not_complete",
        NOT_COMPLETE = "ex_no_retire.not_complete",
        UCODE = "ex_ret_ucode_ops",
    }
}

/// Every model of this file, for `--pmu`, `topdown list` and `report -i`.
pub fn models() -> Vec<Box<dyn Model>> {
    vec![
        Box::new(AmdZen::new(Zen::Zen4)),
        Box::new(AmdZen::new(Zen::Zen5)),
    ]
}

impl Model for AmdZen {
    super::name_and_description!(self => match self.generation {
        Zen::Zen4 => (
            "amd-zen4",
            "AMD Zen 4 (family 0x19) pipeline utilization: L1 (5 buckets incl. SMT contention) + L2",
        ),
        Zen::Zen5 => (
            "amd-zen5",
            "AMD Zen 5 (family 0x1A) pipeline utilization: L1 (5 buckets incl. SMT contention) + L2",
        ),
    });

    fn counters(&self) -> Vec<CounterSpec> {
        let (restarts, restarts_config) = self.restarts();
        vec![
            // Group 0: level 1 (§4.1 encodings).
            CounterSpec::raw(CYCLES, amd_config(0x76, 0, 0)),
            CounterSpec::raw(FRONTEND, amd_config(0x1a0, 0x01, 0)),
            CounterSpec::raw(DISPATCHED, amd_config(0xaa, 0x07, 0)),
            CounterSpec::raw(RETIRED, amd_config(0xc1, 0, 0)),
            CounterSpec::raw(BACKEND, amd_config(0x1a0, 0x1e, 0)),
            CounterSpec::raw(SMT, amd_config(0x1a0, 0x60, 0)),
            // Group 1: level 2. Each ratio's events sit together.
            CounterSpec::raw(
                self.frontend_cmask_name(),
                amd_config(0x1a0, 0x01, self.width()),
            )
            .in_group(LEVEL_TWO_GROUP),
            CounterSpec::raw(MISPREDICTS, amd_config(0xc3, 0, 0)).in_group(LEVEL_TWO_GROUP),
            CounterSpec::raw(restarts, restarts_config).in_group(LEVEL_TWO_GROUP),
            CounterSpec::raw(LOAD_NOT_COMPLETE, amd_config(0xd6, 0xa2, 0))
                .in_group(LEVEL_TWO_GROUP),
            CounterSpec::raw(NOT_COMPLETE, amd_config(0xd6, 0x02, 0)).in_group(LEVEL_TWO_GROUP),
            CounterSpec::raw(UCODE, amd_config(0x1c2, 0, 0)).in_group(LEVEL_TWO_GROUP),
        ]
    }

    fn max_level(&self) -> u8 {
        2
    }

    fn extra_l1_metrics(&self) -> &'static [&'static str] {
        &["smt_contention"]
    }

    fn metrics_into(&self, values: &[u64], level: u8, out: &mut [Option<f64>]) {
        let get = |index: usize| value(values, index);
        let width = self.width() as f64;
        // total_dispatch_slots = W * ls_not_halted_cyc (§4.2).
        let slots = width * get(at::CYCLES);

        // Level 1, each divided by total_dispatch_slots (§4.2, amdzen4/5 pipeline.json,
        // group PipelineL1). perf uses d_ratio (0 for a zero denominator); here no slots
        // means no data (None).
        let level_one = LevelOne {
            retiring: ratio(get(at::RETIRED), slots),
            bad_speculation: ratio(get(at::DISPATCHED) - get(at::RETIRED), slots),
            frontend_bound: ratio(get(at::FRONTEND), slots),
            backend_bound: ratio(get(at::BACKEND), slots),
        };
        // The extra bucket, last at either level.
        out[extras_at(level)] = ratio(get(at::SMT), slots);
        level_one.write_with_level_two(out, level, |level_one| {
            // Level 2 (§4.2, group PipelineL2); AMD's names, Zen 5's in brackets. Each level-1
            // bucket but the frontend splits by a share: (parent * share, parent * (1 - share)).
            let split = |parent: Option<f64>, share: Option<f64>| {
                let both = parent.zip(share);
                (
                    both.map(|(parent, share)| parent * share),
                    both.map(|(parent, share)| parent * (1.0 - share)),
                )
            };
            let restarts = at::RESTARTS;
            let frontend_cmask = get(at::FRONTEND_CMASK);
            // frontend_bound_latency [frontend_bound_by_latency] = W * no_ops_from_frontend{cmask=W} / slots
            let fetch_latency = ratio(width * frontend_cmask, slots);
            // frontend_bound_bandwidth [frontend_bound_by_bandwidth]
            //   = (no_ops_from_frontend - W * no_ops_from_frontend{cmask=W}) / slots
            let fetch_bandwidth = ratio(get(at::FRONTEND) - width * frontend_cmask, slots);
            let misprediction_share =
                ratio(get(at::MISPREDICTS), get(at::MISPREDICTS) + get(restarts));
            // bad_speculation_mispredicts [bad_speculation_from_mispredicts]
            //   = bad_speculation * ex_ret_brn_misp / (ex_ret_brn_misp + R)
            // bad_speculation_pipeline_restarts [bad_speculation_from_pipeline_restarts]
            //   = bad_speculation * R / (ex_ret_brn_misp + R)
            let (branch_mispredicts, machine_clears) =
                split(level_one.bad_speculation, misprediction_share);
            let memory_share = ratio(get(at::LOAD_NOT_COMPLETE), get(at::NOT_COMPLETE));
            // backend_bound_memory [backend_bound_by_memory]
            //   = backend_bound * ex_no_retire.load_not_complete / ex_no_retire.not_complete
            // backend_bound_cpu [backend_bound_by_cpu] = backend_bound * (1 - load_not_complete/not_complete)
            let (memory_bound, core_bound) = split(level_one.backend_bound, memory_share);
            let microcode_share = ratio(get(at::UCODE), get(at::RETIRED));
            // retiring_microcode [retiring_from_microcode] = retiring * ex_ret_ucode_ops/ex_ret_ops
            // retiring_fastpath [retiring_from_fastpath] = retiring * (1 - ex_ret_ucode_ops/ex_ret_ops)
            let (heavy_operations, light_operations) = split(level_one.retiring, microcode_share);

            LevelTwo {
                light_operations,
                heavy_operations,
                branch_mispredicts,
                machine_clears,
                fetch_latency,
                fetch_bandwidth,
                memory_bound,
                core_bound,
            }
        });
    }

    fn weight_counter(&self) -> &'static str {
        // Cycles, not slots: AMD has no slots counter. `slots()` gives W * cycles.
        CYCLES
    }

    fn slots(&self, values: &[u64]) -> Option<f64> {
        Some(value(values, at::CYCLES) * self.width() as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::base_model;

    #[test]
    fn encodings_match_the_reference_table() {
        // topdown-formulas.md §4.1 "Raw config" column.
        assert_eq!(amd_config(0x76, 0, 0), 0x76);
        assert_eq!(amd_config(0xc1, 0, 0), 0xc1);
        assert_eq!(amd_config(0x1c2, 0, 0), 0x1_0000_00c2);
        assert_eq!(amd_config(0xaa, 0x07, 0), 0x7aa);
        assert_eq!(amd_config(0x1a0, 0x01, 0), 0x1_0000_01a0);
        assert_eq!(amd_config(0x1a0, 0x01, 6), 0x1_0600_01a0);
        assert_eq!(amd_config(0x1a0, 0x01, 8), 0x1_0800_01a0);
        assert_eq!(amd_config(0x1a0, 0x1e, 0), 0x1_0000_1ea0);
        assert_eq!(amd_config(0x1a0, 0x60, 0), 0x1_0000_60a0);
        assert_eq!(amd_config(0xd6, 0x02, 0), 0x2d6);
        assert_eq!(amd_config(0xd6, 0xa2, 0), 0xa2d6);
        assert_eq!(amd_config(0xc3, 0, 0), 0xc3);
        assert_eq!(amd_config(0x96, 0, 0), 0x96);
        assert_eq!(amd_config(0x9f, 0x01, 0), 0x19f);
    }

    #[test]
    fn six_level_one_events_and_six_level_two_events() {
        for model in models() {
            let counters = model.counters();
            assert_eq!(counters.iter().filter(|spec| spec.group == 0).count(), 6);
            assert_eq!(
                counters
                    .iter()
                    .filter(|spec| spec.group == LEVEL_TWO_GROUP)
                    .count(),
                6
            );
        }
        assert!(base_model("amd-zen4").is_ok());
        assert!(base_model("amd-zen5").is_ok());
        assert!(base_model("amd-zen3").is_err());
    }

    #[test]
    fn no_cycles_means_no_data() {
        let metrics = AmdZen::new(Zen::Zen4).metrics(&[], 2);
        assert!(metrics.values().all(Option::is_none));
        assert_eq!(metrics.len(), 13);
    }

    #[test]
    fn positions_name_the_counters_on_both_generations() {
        for generation in [Zen::Zen4, Zen::Zen5] {
            let model = AmdZen::new(generation);
            let counters = model.counters();
            let name = |position: usize| counters[position].name.as_str();
            assert_eq!(name(at::CYCLES), CYCLES);
            assert_eq!(name(at::SMT), SMT);
            assert_eq!(name(at::FRONTEND_CMASK), model.frontend_cmask_name());
            assert_eq!(name(at::RESTARTS), model.restarts().0);
            assert_eq!(name(at::UCODE), UCODE);
        }
    }
}
