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

use super::{CounterSpec, Counts, L1_METRICS, L2_METRICS, Metrics, Model};
use crate::groups::GROUP_BLOCK;

pub const CORE_PMU: &str = "cpu_core";
pub const ATOM_PMU: &str = "cpu_atom";

pub struct Hybrid {
    core: Box<dyn Model>,
    atom: Box<dyn Model>,
}

impl Hybrid {
    pub fn new(core: Box<dyn Model>, atom: Box<dyn Model>) -> Self {
        Self { core, atom }
    }

    /// The counts of one PMU, with its prefix taken off.
    fn part(counts: &Counts, pmu: &str) -> Counts {
        let prefix = format!("{pmu}/");
        counts
            .iter()
            .filter_map(|(name, value)| Some((name.strip_prefix(&prefix)?.to_owned(), *value)))
            .collect()
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

    fn base_name(&self) -> &'static str {
        "hybrid"
    }

    fn description(&self) -> &'static str {
        "Intel hybrid: the P-core model on cpu_core CPUs, the E-core model on cpu_atom CPUs, \
         merged per task by slots"
    }

    fn counters(&self) -> Vec<CounterSpec> {
        let mut specs = Self::prefixed(self.core.as_ref(), CORE_PMU, 0);
        specs.extend(Self::prefixed(self.atom.as_ref(), ATOM_PMU, GROUP_BLOCK));
        specs
    }

    fn max_level(&self) -> u8 {
        self.core.max_level().max(self.atom.max_level())
    }

    fn metrics(&self, counts: &Counts, level: u8) -> Metrics {
        let core_counts = Self::part(counts, CORE_PMU);
        let atom_counts = Self::part(counts, ATOM_PMU);
        let parts = [
            (
                CORE_PMU,
                self.core.metrics(&core_counts, level),
                self.core.slots(&core_counts),
            ),
            (
                ATOM_PMU,
                self.atom.metrics(&atom_counts, level),
                self.atom.slots(&atom_counts),
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

    fn weight_counter(&self) -> &'static str {
        // Reports sort by the P-core model's weight counter; the per-core-type split is in JSON.
        match self.core.weight_counter() {
            "slots" => "cpu_core/slots",
            _ => "cpu_core/cpu-clock",
        }
    }

    fn slots(&self, counts: &Counts) -> Option<f64> {
        let core = self.core.slots(&Self::part(counts, CORE_PMU));
        let atom = self.atom.slots(&Self::part(counts, ATOM_PMU));
        match (core, atom) {
            (None, None) => None,
            (core, atom) => Some(core.unwrap_or(0.0) + atom.unwrap_or(0.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ratio;

    /// A width-`width` model: slots = width * cycles; retiring = ret / slots.
    struct Simple {
        name: &'static str,
        width: f64,
    }

    impl Model for Simple {
        fn name(&self) -> String {
            self.name.to_owned()
        }
        fn base_name(&self) -> &'static str {
            self.name
        }
        fn description(&self) -> &'static str {
            "simple"
        }
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
        fn metrics(&self, counts: &Counts, _level: u8) -> Metrics {
            let slots = self.slots(counts).unwrap_or(0.0);
            let ret = counts.get("ret").copied().unwrap_or(0) as f64;
            let mut metrics: Metrics = L1_METRICS
                .iter()
                .map(|name| ((*name).to_owned(), None))
                .collect();
            metrics.insert("retiring".to_owned(), ratio(ret, slots));
            metrics
        }
        fn weight_counter(&self) -> &'static str {
            "cycles"
        }
        fn slots(&self, counts: &Counts) -> Option<f64> {
            counts
                .get("cycles")
                .map(|cycles| *cycles as f64 * self.width)
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
        let counts: Counts = [
            ("cpu_core/cycles", 100),
            ("cpu_core/ret", 300),
            ("cpu_atom/cycles", 80),
            ("cpu_atom/ret", 100),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        let metrics = hybrid().metrics(&counts, 1);
        assert_eq!(metrics["retiring"], Some(0.4));
        assert_eq!(metrics["cpu_core.retiring"], Some(0.5));
        assert_eq!(metrics["cpu_atom.retiring"], Some(0.25));
        assert_eq!(metrics["frontend_bound"], None);
        assert_eq!(hybrid().slots(&counts), Some(1000.0));
    }

    #[test]
    fn a_task_that_only_ran_on_one_core_type_gets_that_type_alone() {
        let counts: Counts = [
            ("cpu_core/cycles", 0),
            ("cpu_core/ret", 0),
            ("cpu_atom/cycles", 80),
            ("cpu_atom/ret", 100),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        let metrics = hybrid().metrics(&counts, 1);
        assert_eq!(metrics["retiring"], Some(0.25));
        assert_eq!(metrics["cpu_core.retiring"], None);
    }
}
