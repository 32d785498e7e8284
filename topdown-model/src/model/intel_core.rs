//! Intel before Ice Lake, with generic counters (topdown-formulas.md §2): `intel-snb` (Sandy
//! Bridge and Sandy Bridge-EP), `intel-ivb` (Ivy Bridge, Haswell, Broadwell and their server
//! parts) and `intel-skl` (Skylake, Kaby/Coffee/Comet Lake, Skylake-SP, Cascade Lake, Cooper
//! Lake), 4 slots per cycle. Sandy Bridge and Ivy Bridge..Broadwell share level 1 and most of
//! level 2; they differ in Memory_Bound, whose stall events are per generation: topdown has
//! perf's Sandy Bridge form (snb-metrics.json) and none yet for Ivy Bridge..Broadwell.
//!
//! Each comes in two forms. Without SMT, every input is per thread. With SMT (`-smt`), the slots
//! of a core are shared by its two threads: a per-task breakdown cannot use the core-wide
//! (AnyThread) clock, so these models use TMA's per-thread estimate of the core's clocks,
//! CORE_CLKS = THREAD/2 * (1 + ONE_THREAD_ACTIVE/REF_XCLK) (§2.2, the "EBS" form perf uses when
//! not counting core-wide), with per-thread issued/retired/fetch-bubble counts; only the recovery
//! cycles stay per core (INT_MISC.RECOVERY_CYCLES_ANY/2, AnyThread). Attributing that per-core
//! count to the task on the thread is an approximation, and the description says so.
//!
//! Counters: 4 general-purpose per thread with SMT on, 8 with it off, plus fixed ones.
//! CPU_CLK_UNHALTED.THREAD is declared general because the NMI watchdog usually holds fixed
//! counter 1, where the kernel would otherwise put it.

use super::{CounterSpec, LevelOne, LevelTwo, Model, Positions, difference, ratio};
use crate::groups::LEVEL_TWO_GROUP;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Generation {
    /// Sandy Bridge proper (family 6 models 0x2a, 0x2d).
    SandyBridge,
    /// Ivy Bridge, Haswell, Broadwell: Sandy Bridge's level 1 and level 2 but Memory_Bound.
    IvyBridge,
    Skylake,
}

pub struct IntelCore {
    generation: Generation,
    smt: bool,
    at: Positions<{ input::COUNT }>,
}

/// Pipeline width of these cores (TMA `#Pipeline_Width`, §6.1 table: 4).
const WIDTH: f64 = 4.0;

// Encodings: §2.1 (kernel sysfs aliases and perfmon) and §1.5; config = event | umask << 8 |
// edge << 18 | any << 21 | inv << 23 | cmask << 24.
const THREAD: (&str, u64) = ("CPU_CLK_UNHALTED.THREAD", 0x003c);
const ISSUED: (&str, u64) = ("UOPS_ISSUED.ANY", 0x010e);
const RETIRE_SLOTS: (&str, u64) = ("UOPS_RETIRED.RETIRE_SLOTS", 0x02c2);
const FETCH_BUBBLES: (&str, u64) = ("IDQ_UOPS_NOT_DELIVERED.CORE", 0x019c);
const ONE_THREAD_ACTIVE: (&str, u64) = ("CPU_CLK_UNHALTED.ONE_THREAD_ACTIVE", 0x023c);
const REF_XCLK: (&str, u64) = ("CPU_CLK_UNHALTED.REF_XCLK", 0x013c);
/// §2.1: SNB-BDW `event=0xd,umask=0x3,cmask=1`; the kernel's Skylake alias
/// `event=0xd,umask=0x1,cmask=1` (perfmon has no cmask: open point §7.1). AnyThread adds bit 21.
const RECOVERY_SNB: (&str, u64) = ("INT_MISC.RECOVERY_CYCLES", 0x0100_030d);
const RECOVERY_SNB_ANY: (&str, u64) = ("INT_MISC.RECOVERY_CYCLES_ANY", 0x0120_030d);
const RECOVERY_SKL: (&str, u64) = ("INT_MISC.RECOVERY_CYCLES", 0x0100_010d);
const RECOVERY_SKL_ANY: (&str, u64) = ("INT_MISC.RECOVERY_CYCLES_ANY", 0x0120_010d);
/// IDQ_UOPS_NOT_DELIVERED.CYCLES_0_UOPS_DELIV.CORE: event 0x9c, umask 0x1, cmask 4 (§2.1).
/// §2.1 prints 0x0401019c, whose bit 16 is the MSR's USR flag, not part of the event: perf's
/// raw x86 config masks it out (X86_RAW_EVENT_MASK), and `list` should show the plain encoding.
const CYCLES_0_UOPS: (&str, u64) = (
    "IDQ_UOPS_NOT_DELIVERED.CYCLES_0_UOPS_DELIV.CORE",
    0x0400_019c,
);
const BR_MISP: (&str, u64) = ("BR_MISP_RETIRED.ALL_BRANCHES", 0x00c5);
const MACHINE_CLEARS: (&str, u64) = ("MACHINE_CLEARS.COUNT", 0x0104_01c3);
const MACRO_FUSED: (&str, u64) = ("UOPS_RETIRED.MACRO_FUSED", 0x04c2);
const INST_RETIRED: (&str, u64) = ("INST_RETIRED.ANY", 0x00c0);
const MS_UOPS: (&str, u64) = ("IDQ.MS_UOPS", 0x3079);
// Memory_Bound inputs, as perf's tools/perf/pmu-events/arch/x86/skylake/pipeline.json encodes
// them (checked in `encodings::tests`).
const STALLS_MEM_ANY: (&str, u64) = ("CYCLE_ACTIVITY.STALLS_MEM_ANY", 0x1400_14a3);
const STALLS_TOTAL: (&str, u64) = ("CYCLE_ACTIVITY.STALLS_TOTAL", 0x0400_04a3);
/// Skylake: event 0xa6, umask 0x40, no counter mask. §1.5's `cmask=2` form (0x020040a6) is the
/// Ice Lake-and-later encoding; Skylake's event is a per-cycle condition, which a counter mask
/// of 2 would most likely never see, leaving Memory_Bound understated.
const BOUND_ON_STORES: (&str, u64) = ("EXE_ACTIVITY.BOUND_ON_STORES", 0x40a6);
const ONE_PORT_UTIL: (&str, u64) = ("EXE_ACTIVITY.1_PORTS_UTIL", 0x02a6);
const TWO_PORTS_UTIL: (&str, u64) = ("EXE_ACTIVITY.2_PORTS_UTIL", 0x04a6);
// Sandy Bridge's Memory_Bound inputs, as perf's tools/perf/pmu-events/arch/x86/sandybridge/
// pipeline.json and memory.json encode them (event | umask << 8 | cmask << 24; checked in
// `encodings::tests` and against libpfm4's `snb` table, which calls 0xb1/0x01
// UOPS_EXECUTED:THREAD).
const STALLS_L1D_PENDING: (&str, u64) = ("CYCLE_ACTIVITY.STALLS_L1D_PENDING", 0x0600_06a3);
const STORE_BUFFER_STALLS: (&str, u64) = ("RESOURCE_STALLS.SB", 0x08a2);
const CYCLES_NO_DISPATCH: (&str, u64) = ("CYCLE_ACTIVITY.CYCLES_NO_DISPATCH", 0x0400_04a3);
const DISPATCH_GE_1: (&str, u64) = ("UOPS_DISPATCHED.THREAD:c1", 0x0100_01b1);
const DISPATCH_GE_2: (&str, u64) = ("UOPS_DISPATCHED.THREAD:c2", 0x0200_01b1);
const DISPATCH_GE_3: (&str, u64) = ("UOPS_DISPATCHED.THREAD:c3", 0x0300_01b1);
const RS_EMPTY_CYCLES: (&str, u64) = ("RS_EVENTS.EMPTY_CYCLES", 0x015e);

super::input_ids! {
    /// The formulas' inputs (ids into `IntelCore::at`): SMT adds a level-1 group and each
    /// generation its own level-2 events, so the positions differ per model.
    mod input {
        THREAD,
        ISSUED,
        RETIRE_SLOTS,
        FETCH_BUBBLES,
        /// INT_MISC.RECOVERY_CYCLES, or its AnyThread form with SMT.
        RECOVERY,
        ONE_THREAD_ACTIVE,
        REF_XCLK,
        CYCLES_0_UOPS,
        BR_MISP,
        MACHINE_CLEARS,
        MS_UOPS,
        MACRO_FUSED,
        INST_RETIRED,
        STALLS_MEM_ANY,
        STALLS_TOTAL,
        BOUND_ON_STORES,
        ONE_PORT_UTIL,
        TWO_PORTS_UTIL,
        STALLS_L1D_PENDING,
        STORE_BUFFER_STALLS,
        CYCLES_NO_DISPATCH,
        DISPATCH_GE_1,
        DISPATCH_GE_2,
        DISPATCH_GE_3,
        RS_EMPTY_CYCLES,
    }
}

/// Every model of this file, for `--pmu`, `topdown list` and `report -i`.
pub fn models() -> Vec<Box<dyn Model>> {
    [
        (Generation::SandyBridge, false),
        (Generation::SandyBridge, true),
        (Generation::IvyBridge, false),
        (Generation::IvyBridge, true),
        (Generation::Skylake, false),
        (Generation::Skylake, true),
    ]
    .into_iter()
    .map(|(generation, smt)| Box::new(IntelCore::new(generation, smt)) as Box<dyn Model>)
    .collect()
}

impl IntelCore {
    fn new(generation: Generation, smt: bool) -> Self {
        let mut model = Self {
            generation,
            smt,
            at: Positions::new([]),
        };
        model.at = Positions::new(model.layout().into_iter().map(|(input, _)| input));
        model
    }

    /// The counters, each with the input it feeds, in counter order.
    fn layout(&self) -> Vec<(usize, CounterSpec)> {
        let spec =
            |input: usize, (name, config): (&str, u64)| (input, CounterSpec::raw(name, config));
        let level_two = LEVEL_TWO_GROUP;
        let in_group =
            |(input, spec): (usize, CounterSpec), group: u8| (input, spec.in_group(group));
        let mut specs = vec![
            spec(input::THREAD, THREAD),
            spec(input::ISSUED, ISSUED),
            spec(input::RETIRE_SLOTS, RETIRE_SLOTS),
            spec(input::FETCH_BUBBLES, FETCH_BUBBLES),
        ];
        if self.smt {
            // Seven level-1 events on four counters per thread: the clock ratio and the
            // per-core recovery cycles form a second level-1 group.
            specs.extend([
                in_group(spec(input::RECOVERY, self.recovery()), 1),
                in_group(spec(input::ONE_THREAD_ACTIVE, ONE_THREAD_ACTIVE), 1),
                in_group(spec(input::REF_XCLK, REF_XCLK), 1),
            ]);
        } else {
            specs.push(spec(input::RECOVERY, self.recovery()));
        }
        specs.extend([
            in_group(spec(input::CYCLES_0_UOPS, CYCLES_0_UOPS), level_two),
            in_group(spec(input::BR_MISP, BR_MISP), level_two),
            in_group(spec(input::MACHINE_CLEARS, MACHINE_CLEARS), level_two),
        ]);
        match self.generation {
            Generation::IvyBridge => specs.push(in_group(spec(input::MS_UOPS, MS_UOPS), level_two)),
            Generation::SandyBridge => {
                // perf marks Memory_Bound NO_GROUP_EVENTS: its terms need not share a group, so
                // they take two more rotating groups of at most four (SMT leaves 4 counters).
                let (inst_input, inst_spec) = spec(input::INST_RETIRED, INST_RETIRED);
                specs.extend([
                    in_group(spec(input::MS_UOPS, MS_UOPS), level_two),
                    in_group(
                        spec(input::STALLS_L1D_PENDING, STALLS_L1D_PENDING),
                        level_two + 1,
                    ),
                    in_group(
                        spec(input::STORE_BUFFER_STALLS, STORE_BUFFER_STALLS),
                        level_two + 1,
                    ),
                    in_group(
                        spec(input::CYCLES_NO_DISPATCH, CYCLES_NO_DISPATCH),
                        level_two + 1,
                    ),
                    in_group(spec(input::RS_EMPTY_CYCLES, RS_EMPTY_CYCLES), level_two + 1),
                    in_group(spec(input::DISPATCH_GE_1, DISPATCH_GE_1), level_two + 2),
                    in_group(spec(input::DISPATCH_GE_2, DISPATCH_GE_2), level_two + 2),
                    in_group(spec(input::DISPATCH_GE_3, DISPATCH_GE_3), level_two + 2),
                    // Fixed counter 0 counts INST_RETIRED.ANY (the IPC > 1.8 test).
                    (inst_input, inst_spec.in_group(level_two + 2).fixed()),
                ]);
            }
            Generation::Skylake => {
                let (inst_input, inst_spec) = spec(input::INST_RETIRED, INST_RETIRED);
                specs.extend([
                    in_group(spec(input::MACRO_FUSED, MACRO_FUSED), level_two),
                    // Fixed counter 0 counts INST_RETIRED.ANY.
                    (inst_input, inst_spec.in_group(level_two).fixed()),
                    in_group(spec(input::STALLS_MEM_ANY, STALLS_MEM_ANY), level_two + 1),
                    in_group(spec(input::STALLS_TOTAL, STALLS_TOTAL), level_two + 1),
                    in_group(spec(input::BOUND_ON_STORES, BOUND_ON_STORES), level_two + 1),
                    in_group(spec(input::ONE_PORT_UTIL, ONE_PORT_UTIL), level_two + 1),
                    in_group(spec(input::TWO_PORTS_UTIL, TWO_PORTS_UTIL), level_two + 1),
                ]);
            }
        }
        specs
    }

    /// §2.2 CORE_CLKS: per-thread counting uses the EBS form with SMT on
    /// (THREAD/2 * (1 + ONE_THREAD_ACTIVE/REF_XCLK)), CLKS without.
    fn core_clks(&self, values: &[u64]) -> Option<f64> {
        let get = |input: usize| self.at.read(values, input);
        let clks = get(input::THREAD);
        if self.smt {
            ratio(get(input::ONE_THREAD_ACTIVE), get(input::REF_XCLK))
                .map(|one_thread_share| clks / 2.0 * (1.0 + one_thread_share))
        } else {
            Some(clks)
        }
    }

    /// Sandy Bridge's Memory_Bound, as perf's
    /// tools/perf/pmu-events/arch/x86/sandybridge/snb-metrics.json (torvalds/linux at
    /// 01bc4ac9da94) computes tma_memory_bound:
    ///   (min(CPU_CLK_UNHALTED.THREAD, CYCLE_ACTIVITY.STALLS_L1D_PENDING) + RESOURCE_STALLS.SB)
    ///   / (min(CPU_CLK_UNHALTED.THREAD, CYCLE_ACTIVITY.CYCLES_NO_DISPATCH)
    ///      + UOPS_DISPATCHED.THREAD:c1
    ///      - (UOPS_DISPATCHED.THREAD:c3 if tma_info_ipc > 1.8 else UOPS_DISPATCHED.THREAD:c2)
    ///      - (RS_EVENTS.EMPTY_CYCLES if tma_fetch_latency > 0.1 else 0)
    ///      + RESOURCE_STALLS.SB) * tma_backend_bound
    /// with tma_info_ipc = INST_RETIRED.ANY / CPU_CLK_UNHALTED.THREAD.
    fn snb_memory_bound(
        &self,
        values: &[u64],
        backend: Option<f64>,
        fetch_latency: Option<f64>,
    ) -> Option<f64> {
        let get = |input: usize| self.at.read(values, input);
        let clks = get(input::THREAD);
        let store_buffer = get(input::STORE_BUFFER_STALLS);
        let ipc = ratio(get(input::INST_RETIRED), clks)?;
        let dispatch_high = if ipc > 1.8 {
            get(input::DISPATCH_GE_3)
        } else {
            get(input::DISPATCH_GE_2)
        };
        let frontend_stall = if fetch_latency? > 0.1 {
            get(input::RS_EMPTY_CYCLES)
        } else {
            0.0
        };
        let share = ratio(
            clks.min(get(input::STALLS_L1D_PENDING)) + store_buffer,
            clks.min(get(input::CYCLES_NO_DISPATCH)) + get(input::DISPATCH_GE_1)
                - dispatch_high
                - frontend_stall
                + store_buffer,
        )?;
        backend.map(|be| share * be)
    }

    fn recovery(&self) -> (&'static str, u64) {
        match (self.generation, self.smt) {
            (Generation::SandyBridge | Generation::IvyBridge, false) => RECOVERY_SNB,
            (Generation::SandyBridge | Generation::IvyBridge, true) => RECOVERY_SNB_ANY,
            (Generation::Skylake, false) => RECOVERY_SKL,
            (Generation::Skylake, true) => RECOVERY_SKL_ANY,
        }
    }
}

/// `(name, description)` of a generation's model: `$name` on `$chips` without SMT (with
/// `$without_smt_note` after its levels), or `$name-smt` with SMT, whose description gives the
/// same caveat on every generation.
macro_rules! smt_variant {
    ($smt:expr, $name:literal, $chips:literal, $without_smt_note:literal) => {
        if $smt {
            (
                concat!($name, "-smt"),
                concat!(
                    $chips,
                    " with SMT: per-thread slots estimate; recovery cycles are per core (approximate per task)"
                ),
            )
        } else {
            (
                $name,
                concat!(
                    $chips,
                    " (generic counters, SMT off): TopDown L1 + L2",
                    $without_smt_note
                ),
            )
        }
    };
}

impl IntelCore {
    /// The model's `--pmu` name and its `topdown list` line.
    fn name_and_description(&self) -> (&'static str, &'static str) {
        let smt = self.smt;
        match self.generation {
            Generation::SandyBridge => smt_variant!(smt, "intel-snb", "Intel Sandy Bridge", ""),
            Generation::IvyBridge => smt_variant!(
                smt,
                "intel-ivb",
                "Intel Ivy Bridge..Broadwell",
                " (no memory/core split)"
            ),
            Generation::Skylake => {
                smt_variant!(smt, "intel-skl", "Intel Skylake..Cascade Lake", "")
            }
        }
    }
}

impl Model for IntelCore {
    super::name_and_description!(self => self.name_and_description());

    fn counters(&self) -> Vec<CounterSpec> {
        self.layout().into_iter().map(|(_, spec)| spec).collect()
    }

    fn max_level(&self) -> u8 {
        2
    }

    fn metrics_into(&self, values: &[u64], level: u8, out: &mut [Option<f64>]) {
        let get = |input: usize| self.at.read(values, input);
        let clks = get(input::THREAD);
        // SLOTS = 4 * CORE_CLKS
        let slots = self
            .core_clks(values)
            .map(|core_clks| WIDTH * core_clks)
            .unwrap_or(0.0);
        // Recovery_Cycles = INT_MISC.RECOVERY_CYCLES_ANY/2 if SMT_on else INT_MISC.RECOVERY_CYCLES
        let recovery = if self.smt {
            get(input::RECOVERY) / 2.0
        } else {
            get(input::RECOVERY)
        };
        let issued = get(input::ISSUED);
        let retire_slots = get(input::RETIRE_SLOTS);

        // §2.2 level 1 (TMA 5.2; perf JSON identical):
        // Frontend_Bound = IDQ_UOPS_NOT_DELIVERED.CORE / SLOTS
        let frontend = ratio(get(input::FETCH_BUBBLES), slots);
        // Bad_Speculation = (UOPS_ISSUED.ANY - UOPS_RETIRED.RETIRE_SLOTS + 4*Recovery_Cycles) / SLOTS
        let bad_speculation = ratio(issued - retire_slots + WIDTH * recovery, slots);
        // Retiring = UOPS_RETIRED.RETIRE_SLOTS / SLOTS
        let retiring = ratio(retire_slots, slots);
        let level_one = LevelOne {
            retiring,
            bad_speculation,
            frontend_bound: frontend,
            backend_bound: match self.generation {
                // SNB-BDX: Backend_Bound = 1 - (FE + BadSpec + Retiring)
                Generation::SandyBridge | Generation::IvyBridge => frontend
                    .zip(bad_speculation)
                    .zip(retiring)
                    .map(|((fe, bad), ret)| 1.0 - (fe + bad + ret)),
                // SKL/SKX/CLX: Backend_Bound = 1 - FE - (UOPS_ISSUED.ANY + 4*Recovery_Cycles)/SLOTS
                Generation::Skylake => frontend
                    .zip(ratio(issued + WIDTH * recovery, slots))
                    .map(|(fe, issued_share)| 1.0 - fe - issued_share),
            },
        };
        level_one.write_with_level_two(out, level, |level_one| {
            let cycles_0_uops = get(input::CYCLES_0_UOPS);
            let fetch_latency = match self.generation {
                // SNB-HSW: Fetch_Latency = 4*min(CLKS, CYCLES_0_UOPS_DELIV.CORE)/SLOTS
                Generation::SandyBridge | Generation::IvyBridge => {
                    ratio(WIDTH * clks.min(cycles_0_uops), slots)
                }
                // SKL/CLX/BDW: Fetch_Latency = 4*IDQ_UOPS_NOT_DELIVERED.CYCLES_0_UOPS_DELIV.CORE/SLOTS
                Generation::Skylake => ratio(WIDTH * cycles_0_uops, slots),
            };
            // Branch_Mispredicts = BR_MISP_RETIRED.ALL_BRANCHES/(BR_MISP_RETIRED.ALL_BRANCHES +
            //                      MACHINE_CLEARS.COUNT) * BadSpec
            let branch_mispredicts = ratio(
                get(input::BR_MISP),
                get(input::BR_MISP) + get(input::MACHINE_CLEARS),
            )
            .zip(bad_speculation)
            .map(|(share, bad)| share * bad);
            let (memory_bound, heavy_operations) = match self.generation {
                Generation::SandyBridge | Generation::IvyBridge => {
                    // Heavy_Operations (SNB-BDW) = Microcode_Sequencer =
                    //   RETIRE_SLOTS/UOPS_ISSUED.ANY * IDQ.MS_UOPS/SLOTS
                    let heavy = ratio(retire_slots, issued)
                        .zip(ratio(get(input::MS_UOPS), slots))
                        .map(|(retired_share, ms)| retired_share * ms);
                    if self.generation == Generation::IvyBridge {
                        // Memory_Bound needs per-generation stall events (ivb/hsw/bdw
                        // metrics.json), not modelled yet: no memory/core split.
                        (None, heavy)
                    } else {
                        (
                            self.snb_memory_bound(values, level_one.backend_bound, fetch_latency),
                            heavy,
                        )
                    }
                }
                Generation::Skylake => {
                    // Memory_Bound (SKL/CLX) = (CYCLE_ACTIVITY.STALLS_MEM_ANY + EXE_ACTIVITY.BOUND_ON_STORES)
                    //   / (CYCLE_ACTIVITY.STALLS_TOTAL + EXE_ACTIVITY.1_PORTS_UTIL
                    //      + Retiring*EXE_ACTIVITY.2_PORTS_UTIL + EXE_ACTIVITY.BOUND_ON_STORES) * BE
                    let stores = get(input::BOUND_ON_STORES);
                    let memory = retiring.and_then(|ret| {
                        ratio(
                            get(input::STALLS_MEM_ANY) + stores,
                            get(input::STALLS_TOTAL)
                                + get(input::ONE_PORT_UTIL)
                                + ret * get(input::TWO_PORTS_UTIL)
                                + stores,
                        )
                    });
                    let memory_bound = memory
                        .zip(level_one.backend_bound)
                        .map(|(share, be)| share * be);
                    // Heavy_Operations (SKL/CLX) = (UOPS_RETIRED.RETIRE_SLOTS + UOPS_RETIRED.MACRO_FUSED
                    //   - INST_RETIRED.ANY)/SLOTS
                    let heavy = ratio(
                        retire_slots + get(input::MACRO_FUSED) - get(input::INST_RETIRED),
                        slots,
                    );
                    (memory_bound, heavy)
                }
            };
            // Fetch_Bandwidth = FE - Fetch_Latency; Machine_Clears = BadSpec -
            // Branch_Mispredicts; Core_Bound = BE - Memory_Bound (snb-metrics.json
            // tma_core_bound: tma_backend_bound - tma_memory_bound); Light_Operations =
            // Retiring - Heavy_Operations.
            LevelTwo::with_siblings(
                level_one,
                difference,
                fetch_latency,
                branch_mispredicts,
                memory_bound,
                heavy_operations,
            )
        });
    }

    fn weight_counter(&self) -> &'static str {
        THREAD.0
    }

    fn slots(&self, values: &[u64]) -> Option<f64> {
        self.core_clks(values).map(|core_clks| WIDTH * core_clks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::base_model;
    use crate::model::values_of;

    /// `pairs` by event in `model`'s counter order.
    fn counts(model: &dyn Model, pairs: &[((&str, u64), u64)]) -> Vec<u64> {
        let named: Vec<(&str, u64)> = pairs
            .iter()
            .map(|((name, _), value)| (*name, *value))
            .collect();
        values_of(model, &named)
    }

    #[test]
    fn both_backend_forms_agree() {
        // THREAD 1000 -> SLOTS 4000; FE = 0.2, BadSpec = (2200-2000+200)/4000 = 0.1,
        // RET = 0.5; SNB form 1 - 0.8 = 0.2; SKL form 1 - 0.2 - (2200+200)/4000 = 0.2.
        let snb = IntelCore::new(Generation::SandyBridge, false);
        let skl = IntelCore::new(Generation::Skylake, false);
        let snb_counts = counts(
            &snb,
            &[
                (THREAD, 1000),
                (ISSUED, 2200),
                (RETIRE_SLOTS, 2000),
                (FETCH_BUBBLES, 800),
                (RECOVERY_SNB, 50),
            ],
        );
        let skl_counts = counts(
            &skl,
            &[
                (THREAD, 1000),
                (ISSUED, 2200),
                (RETIRE_SLOTS, 2000),
                (FETCH_BUBBLES, 800),
                (RECOVERY_SKL, 50),
            ],
        );
        let a = snb.metrics(&snb_counts, 1)["backend_bound"].unwrap();
        let b = skl.metrics(&skl_counts, 1)["backend_bound"].unwrap();
        assert!(
            (a - 0.2).abs() < 1e-12 && (b - 0.2).abs() < 1e-12,
            "{a} {b}"
        );
    }

    #[test]
    fn smt_uses_the_per_thread_core_clock_estimate() {
        // THREAD 1000, ONE_THREAD_ACTIVE 250, REF_XCLK 500: CORE_CLKS = 500 * 1.5 = 750,
        // SLOTS = 3000; FETCH 600 -> FE = 0.2.
        let model = base_model("intel-skl-smt").unwrap();
        let metrics = model.metrics(
            &counts(
                model.as_ref(),
                &[
                    (THREAD, 1000),
                    (ONE_THREAD_ACTIVE, 250),
                    (REF_XCLK, 500),
                    (FETCH_BUBBLES, 600),
                ],
            ),
            1,
        );
        assert_eq!(metrics["frontend_bound"], Some(0.2));
        // No REF_XCLK: the core clock cannot be estimated.
        let none = model.metrics(
            &counts(model.as_ref(), &[(THREAD, 1000), (FETCH_BUBBLES, 600)]),
            1,
        );
        assert_eq!(none["frontend_bound"], None);
    }

    #[test]
    fn encodings_and_groups() {
        let skl = base_model("intel-skl").unwrap().counters();
        let config = |name: &str| {
            skl.iter()
                .find(|spec| spec.name == name)
                .map(|spec| spec.source.clone())
        };
        assert_eq!(
            config("INT_MISC.RECOVERY_CYCLES"),
            Some(crate::model::CounterSource::Perf {
                perf_type: 4,
                config: 0x0100_010d
            })
        );
        // event 0x9c, umask 0x1, cmask 4; no USR bit 16 (not part of an event's encoding).
        assert_eq!(
            config("IDQ_UOPS_NOT_DELIVERED.CYCLES_0_UOPS_DELIV.CORE"),
            Some(crate::model::CounterSource::Perf {
                perf_type: 4,
                config: 0x0400_019c
            })
        );
        // Level 1: five events in group 0 (8 counters with SMT off).
        assert_eq!(skl.iter().filter(|spec| spec.group == 0).count(), 5);
        let smt = base_model("intel-skl-smt").unwrap().counters();
        assert_eq!(smt.iter().filter(|spec| spec.group == 0).count(), 4);
        assert_eq!(smt.iter().filter(|spec| spec.group == 1).count(), 3);
        assert!(
            smt.iter()
                .any(|spec| spec.name == "INT_MISC.RECOVERY_CYCLES_ANY")
        );
        for name in ["intel-snb", "intel-snb-smt", "intel-skl", "intel-skl-smt"] {
            assert_eq!(base_model(name).unwrap().name(), name);
        }
        assert!(base_model("intel-hsw").is_err());
    }

    #[test]
    fn each_input_is_read_from_its_own_counter() {
        // With SMT the level-2 events move back by the two clock-ratio events.
        let name_at = |model: &IntelCore, input: usize| {
            model
                .at
                .of(input)
                .map(|position| model.counters()[position].name.clone())
        };
        let skl = IntelCore::new(Generation::Skylake, false);
        let skl_smt = IntelCore::new(Generation::Skylake, true);
        let snb = IntelCore::new(Generation::SandyBridge, false);
        assert_eq!(skl.at.of(input::CYCLES_0_UOPS), Some(5));
        assert_eq!(skl_smt.at.of(input::CYCLES_0_UOPS), Some(7));
        assert_eq!(skl.at.of(input::REF_XCLK), None);
        assert_eq!(snb.at.of(input::MACRO_FUSED), None);
        for model in [&skl, &skl_smt, &snb] {
            assert_eq!(
                name_at(model, input::RECOVERY),
                Some(model.recovery().0.to_owned())
            );
            assert_eq!(name_at(model, input::BR_MISP), Some(BR_MISP.0.to_owned()));
        }
        assert_eq!(
            name_at(&skl_smt, input::REF_XCLK),
            Some(REF_XCLK.0.to_owned())
        );
        assert_eq!(
            name_at(&skl, input::TWO_PORTS_UTIL),
            Some(TWO_PORTS_UTIL.0.to_owned())
        );
        assert_eq!(name_at(&snb, input::MS_UOPS), Some(MS_UOPS.0.to_owned()));
    }
}
