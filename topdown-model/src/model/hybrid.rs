//! `hybrid:<P-core model>+<E-core model>`: Intel hybrid parts, one model per core type.
//!
//! Alder Lake and later have two core PMUs, `cpu_core` and `cpu_atom`, each covering its own
//! CPUs with its own events and TopDown tree (topdown-formulas.md §3.4). Each PMU gets its own
//! counter group on its own CPUs; the counters keep perf's `pmu/event` names so the counter
//! layer opens each on the right PMU, and so a task's counts stay split by core type even though
//! BPF simply sums slots. A task that migrated between core types gets one breakdown per core
//! type and a merged one, each core type weighted by the pipeline slots it had (perf evaluates
//! each PMU's metrics on that PMU's CPUs only; merging by slots is what makes the fractions of
//! a slot add up again).

use super::{CounterSpec, L1_METRICS, L2_METRICS, Metrics, Model};
use crate::groups::GROUP_BLOCK;

pub const CORE_PMU: &str = "cpu_core";
pub const ATOM_PMU: &str = "cpu_atom";

pub struct Hybrid {
    core: Box<dyn Model>,
    atom: Box<dyn Model>,
    /// How many counters the P-core model has: its values come first, the E-core model's
    /// after them, as in [`Model::counters`]. The two models' counters may share names
    /// (`hybrid:intel-grt+intel-grt`); positions keep them apart.
    core_counters: usize,
}

impl Hybrid {
    pub fn new(core: Box<dyn Model>, atom: Box<dyn Model>) -> Self {
        let core_counters = core.counters().len();
        Self {
            core,
            atom,
            core_counters,
        }
    }

    /// `values` split into the P-core model's and the E-core model's.
    fn parts<'v>(&self, values: &'v [u64]) -> (&'v [u64], &'v [u64]) {
        values.split_at(self.core_counters.min(values.len()))
    }

    fn prefixed(model: &dyn Model, pmu: &str, group_offset: u8) -> Vec<CounterSpec> {
        model
            .counters()
            .into_iter()
            .map(|mut spec| {
                spec.name = format!("{pmu}/{}", spec.name);
                spec.group += group_offset;
                spec
            })
            .collect()
    }
}

/// Parses `hybrid:<core>+<atom>` into its two model names.
pub fn parse_name(name: &str) -> Option<(&str, &str)> {
    let models = name.strip_prefix("hybrid:")?;
    let (core, atom) = models.split_once('+')?;
    (!core.is_empty() && !atom.is_empty()).then_some((core, atom))
}

impl Model for Hybrid {
    fn name(&self) -> String {
        format!("hybrid:{}+{}", self.core.name(), self.atom.name())
    }

    super::name_and_description!(
        "hybrid",
        "Intel hybrid: the P-core model on cpu_core CPUs, the E-core model on cpu_atom CPUs, \
         merged per task by slots"
    );

    fn counters(&self) -> Vec<CounterSpec> {
        let mut specs = Self::prefixed(self.core.as_ref(), CORE_PMU, 0);
        specs.extend(Self::prefixed(self.atom.as_ref(), ATOM_PMU, GROUP_BLOCK));
        specs
    }

    fn max_level(&self) -> u8 {
        self.core.max_level().max(self.atom.max_level())
    }

    fn metrics(&self, values: &[u64], level: u8) -> Metrics {
        let (core_values, atom_values) = self.parts(values);
        let parts = [
            (
                CORE_PMU,
                self.core.metrics(core_values, level),
                self.core.slots(core_values),
            ),
            (
                ATOM_PMU,
                self.atom.metrics(atom_values, level),
                self.atom.slots(atom_values),
            ),
        ];
        let mut names: Vec<&str> = L1_METRICS.to_vec();
        if level >= 2 {
            names.extend(L2_METRICS);
        }
        let mut metrics = Metrics::new();
        for name in names {
            // Σ slots_i · fraction_i / Σ slots_i over the core types that have this metric.
            let (weighted, weight) = parts
                .iter()
                .filter_map(|(_, metrics, slots)| {
                    let fraction = metrics.get(name).copied().flatten()?;
                    let slots = slots.filter(|slots| *slots > 0.0)?;
                    Some((fraction * slots, slots))
                })
                .fold((0.0, 0.0), |(sum, total), (value, slots)| {
                    (sum + value, total + slots)
                });
            metrics.insert(name.to_owned(), super::ratio(weighted, weight));
        }
        for (pmu, part_metrics, _) in parts {
            for (name, value) in part_metrics {
                metrics.insert(format!("{pmu}.{name}"), value);
            }
        }
        metrics
    }

    super::typed_metrics_from_map!();

    fn weight_counter(&self) -> &'static str {
        // Reports sort by the P-core model's weight counter; the per-core-type split is in JSON.
        match self.core.weight_counter() {
            "slots" => "cpu_core/slots",
            _ => "cpu_core/cpu-clock",
        }
    }

    fn slots(&self, values: &[u64]) -> Option<f64> {
        let (core_values, atom_values) = self.parts(values);
        let core = self.core.slots(core_values);
        let atom = self.atom.slots(atom_values);
        match (core, atom) {
            (None, None) => None,
            (core, atom) => Some(core.unwrap_or(0.0) + atom.unwrap_or(0.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Counts, Evaluator, evaluate, ratio, value};

    /// A width-`width` model: slots = width * cycles; retiring = ret / slots.
    struct Simple {
        name: &'static str,
        width: f64,
    }

    impl Model for Simple {
        crate::model::name_and_description!(self => (self.name, "simple"));
        fn counters(&self) -> Vec<CounterSpec> {
            vec![
                CounterSpec::raw("cycles", 0x3c),
                CounterSpec::raw("ret", 0xc2),
                CounterSpec::raw("extra", 0x1).in_group(8),
            ]
        }
        fn max_level(&self) -> u8 {
            1
        }
        fn metrics(&self, values: &[u64], _level: u8) -> Metrics {
            let slots = self.slots(values).unwrap_or(0.0);
            let ret = value(values, 1);
            let mut metrics: Metrics = L1_METRICS
                .iter()
                .map(|name| ((*name).to_owned(), None))
                .collect();
            metrics.insert("retiring".to_owned(), ratio(ret, slots));
            metrics
        }
        crate::model::typed_metrics_from_map!();
        fn weight_counter(&self) -> &'static str {
            "cycles"
        }
        fn slots(&self, values: &[u64]) -> Option<f64> {
            Some(value(values, 0) * self.width)
        }
    }

    fn hybrid() -> Hybrid {
        Hybrid::new(
            Box::new(Simple {
                name: "p",
                width: 6.0,
            }),
            Box::new(Simple {
                name: "e",
                width: 5.0,
            }),
        )
    }

    #[test]
    fn counters_carry_their_pmu_and_separate_groups() {
        let specs = hybrid().counters();
        let names: Vec<&str> = specs.iter().map(|spec| spec.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "cpu_core/cycles",
                "cpu_core/ret",
                "cpu_core/extra",
                "cpu_atom/cycles",
                "cpu_atom/ret",
                "cpu_atom/extra"
            ]
        );
        let groups: Vec<u8> = specs.iter().map(|spec| spec.group).collect();
        assert_eq!(groups, [0, 0, 8, 16, 16, 24]);
        assert_eq!(hybrid().name(), "hybrid:p+e");
        assert_eq!(parse_name("hybrid:p+e"), Some(("p", "e")));
        assert_eq!(parse_name("hybrid:p"), None);
        assert_eq!(parse_name("hybrid:+e"), None);
    }

    #[test]
    fn a_migrating_task_is_merged_by_slots() {
        // P: 100 cycles * 6 = 600 slots, 300 retired -> 0.5.
        // E: 80 cycles * 5 = 400 slots, 100 retired -> 0.25.
        // Merged: (600 * 0.5 + 400 * 0.25) / 1000 = 0.4.
        // cpu_core/cycles, ret, extra; cpu_atom/cycles, ret, extra.
        let values = [100, 300, 0, 80, 100, 0];
        let metrics = hybrid().metrics(&values, 1);
        assert_eq!(metrics["retiring"], Some(0.4));
        assert_eq!(metrics["cpu_core.retiring"], Some(0.5));
        assert_eq!(metrics["cpu_atom.retiring"], Some(0.25));
        assert_eq!(metrics["frontend_bound"], None);
        assert_eq!(hybrid().slots(&values), Some(1000.0));
    }

    #[test]
    fn a_task_that_only_ran_on_one_core_type_gets_that_type_alone() {
        let metrics = hybrid().metrics(&[0, 0, 0, 80, 100, 0], 1);
        assert_eq!(metrics["retiring"], Some(0.25));
        assert_eq!(metrics["cpu_core.retiring"], None);
    }

    #[test]
    fn counters_of_the_same_name_in_both_core_types_resolve_to_their_own_slots() {
        // Both core types' models call their counters `cycles` and `ret`; the plan's slots
        // carry the PMU, in any order. The E-core level-1 group (16) rotated at half duty:
        // cpu_atom/cycles 80 -> 160 and ret 100 -> 200 (E retiring stays 200/800 = 0.25), the
        // P-core counts stay as counted (600 slots, retiring 0.5). Merged by slots:
        // (600 * 0.5 + 800 * 0.25) / 1400 = 500/1400; scaling the P-core too would give 0.4.
        let model = hybrid();
        let slot_names = [
            "cpu_atom/cycles",
            "cpu_atom/ret",
            "cpu_core/ret",
            "cpu_core/cycles",
            "group16.enabled_ns",
            "group16.running_ns",
        ];
        let slots = [80, 100, 300, 100, 1000, 500];
        let evaluator = Evaluator::new(&model, &slot_names);
        let result = evaluator.evaluate(&slots, 1);
        assert_eq!(result.metrics["cpu_core.retiring"], Some(0.5));
        assert_eq!(result.metrics["cpu_atom.retiring"], Some(0.25));
        assert_eq!(result.metrics["retiring"], Some(500.0 / 1400.0));
        // A level-1 group rotated: every known metric is an estimate.
        assert_eq!(
            result.estimated,
            ["cpu_atom.retiring", "cpu_core.retiring", "retiring"]
        );
        // The name-keyed convenience agrees.
        let counts: Counts = slot_names
            .iter()
            .zip(slots)
            .map(|(name, value)| ((*name).to_owned(), value))
            .collect();
        assert_eq!(evaluate(&model, &counts, 1), result);
    }
}
