//! Metrics from counts, with the counter budget's rotation undone.
//!
//! Counters of a group that rotated (`crate::schedule`) only counted while their group was on
//! the PMU; the group's enabled and running times are attributed next to them, so each entity's
//! counts can be scaled by its own enabled/running ratio before the model's formulas run. The
//! metrics fed by scaled counts are estimates and are reported as such.

use super::{Counts, L1_METRICS, L2_METRICS, Metrics, Model};
use crate::groups::{enabled_slot_name, group_level, running_slot_name};

/// A model's metrics for one entity.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evaluation {
    pub metrics: Metrics,
    /// Names of the metrics computed from scaled (rotated) counts.
    pub estimated: Vec<String>,
}

/// Evaluates `model` at `level` on `counts`.
///
/// Level 1 is computed from the level-1 group(s) alone and level 2 needs every group, so:
/// a counter missing from `counts` (a recording made at a lower level) or a group that never
/// ran for this entity leaves the metrics of its level unknown (`None`) instead of computing
/// them from a zero.
pub fn evaluate(model: &dyn Model, counts: &Counts, level: u8) -> Evaluation {
    let mut scaled = counts.clone();
    let mut unknown = [false; 3];
    let mut rotated = [false; 3];
    for spec in model.counters() {
        let spec_level = usize::from(group_level(spec.group));
        let Some(&raw) = counts.get(&spec.name) else {
            unknown[spec_level] = true;
            continue;
        };
        let enabled = counts.get(&enabled_slot_name(spec.group));
        let running = counts.get(&running_slot_name(spec.group));
        if let (Some(&enabled), Some(&running)) = (enabled, running) {
            rotated[spec_level] = true;
            if running == 0 {
                unknown[spec_level] = raw != 0 || enabled != 0;
                continue;
            }
            // The count over the time the group was enabled, extrapolated from the time it
            // was counting (perf's own scaling, `perf stat`'s "(xx.xx%)" column).
            let estimate = raw as f64 * enabled as f64 / running as f64;
            scaled.insert(spec.name.clone(), estimate.round() as u64);
        }
    }
    let mut metrics = model.metrics(&scaled, level);
    let level_one: Vec<&str> = L1_METRICS
        .iter()
        .copied()
        .chain(model.extra_l1_metrics().iter().copied())
        .collect();
    if unknown[1] {
        metrics.values_mut().for_each(|value| *value = None);
    } else if unknown[2] {
        for name in L2_METRICS {
            if let Some(value) = metrics.get_mut(name) {
                *value = None;
            }
        }
    }
    let mut estimated = Vec::new();
    for (name, value) in &metrics {
        let is_level_one = level_one.contains(&name.as_str());
        let scaled_input = if is_level_one {
            rotated[1]
        } else {
            rotated[1] || rotated[2]
        };
        if scaled_input && value.is_some() {
            estimated.push(name.clone());
        }
    }
    Evaluation { metrics, estimated }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CounterSpec, ratio};

    /// retiring = a / cycles (group 0); light_operations = retiring * b / c (group 8).
    struct Pair;

    impl Model for Pair {
        fn name(&self) -> String {
            "pair".to_owned()
        }
        fn base_name(&self) -> &'static str {
            "pair"
        }
        fn description(&self) -> &'static str {
            "pair"
        }
        fn counters(&self) -> Vec<CounterSpec> {
            vec![
                CounterSpec::raw("cycles", 1),
                CounterSpec::raw("a", 2),
                CounterSpec::raw("b", 3).in_group(8),
                CounterSpec::raw("c", 4).in_group(8),
            ]
        }
        fn max_level(&self) -> u8 {
            2
        }
        fn metrics(&self, counts: &Counts, level: u8) -> Metrics {
            let get = |name: &str| counts.get(name).copied().unwrap_or(0) as f64;
            let retiring = ratio(get("a"), get("cycles"));
            let mut metrics: Metrics = L1_METRICS
                .iter()
                .map(|name| ((*name).to_owned(), None))
                .collect();
            metrics.insert("retiring".to_owned(), retiring);
            if level >= 2 {
                metrics.extend(L2_METRICS.iter().map(|name| ((*name).to_owned(), None)));
                let light = retiring.zip(ratio(get("b"), get("c"))).map(|(r, f)| r * f);
                metrics.insert("light_operations".to_owned(), light);
                // cycles-scaled: needs the *scaled* b.
                metrics.insert(
                    "heavy_operations".to_owned(),
                    ratio(get("b"), get("cycles")),
                );
            }
            metrics
        }
        fn weight_counter(&self) -> &'static str {
            "cycles"
        }
    }

    fn counts(pairs: &[(&str, u64)]) -> Counts {
        pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), *value))
            .collect()
    }

    #[test]
    fn without_rotation_nothing_is_scaled_or_estimated() {
        let result = evaluate(
            &Pair,
            &counts(&[("cycles", 1000), ("a", 250), ("b", 10), ("c", 40)]),
            2,
        );
        assert_eq!(result.metrics["retiring"], Some(0.25));
        assert_eq!(result.metrics["light_operations"], Some(0.0625));
        assert_eq!(result.metrics["heavy_operations"], Some(0.01));
        assert!(result.estimated.is_empty());
    }

    #[test]
    fn a_rotated_group_is_scaled_by_its_own_enabled_over_running() {
        // Group 1 ran a quarter of the time: b = 10 * 4 = 40 scaled; the b/c ratio is unchanged.
        let result = evaluate(
            &Pair,
            &counts(&[
                ("cycles", 1000),
                ("a", 250),
                ("b", 10),
                ("c", 40),
                ("group8.enabled_ns", 800),
                ("group8.running_ns", 200),
            ]),
            2,
        );
        assert_eq!(result.metrics["retiring"], Some(0.25));
        assert_eq!(result.metrics["light_operations"], Some(0.0625));
        assert_eq!(result.metrics["heavy_operations"], Some(0.04));
        assert_eq!(result.estimated, ["heavy_operations", "light_operations"]);
    }

    #[test]
    fn a_group_that_never_ran_leaves_its_level_unknown() {
        let result = evaluate(
            &Pair,
            &counts(&[
                ("cycles", 1000),
                ("a", 250),
                ("b", 0),
                ("c", 0),
                ("group8.enabled_ns", 800),
                ("group8.running_ns", 0),
            ]),
            2,
        );
        assert_eq!(result.metrics["retiring"], Some(0.25));
        assert_eq!(result.metrics["light_operations"], None);
        assert_eq!(result.estimated, Vec::<String>::new());
    }

    #[test]
    fn a_level_one_recording_has_no_level_two() {
        let result = evaluate(&Pair, &counts(&[("cycles", 1000), ("a", 250)]), 2);
        assert_eq!(result.metrics["retiring"], Some(0.25));
        assert_eq!(result.metrics["heavy_operations"], None);
        let no_cycles = evaluate(&Pair, &counts(&[("a", 250)]), 1);
        assert_eq!(no_cycles.metrics["retiring"], None);
    }

    #[test]
    fn a_rotated_level_one_group_makes_everything_estimated() {
        let result = evaluate(
            &Pair,
            &counts(&[
                ("cycles", 500),
                ("a", 250),
                ("group0.enabled_ns", 100),
                ("group0.running_ns", 50),
            ]),
            1,
        );
        // Both scaled by 2: the ratio stays 0.5.
        assert_eq!(result.metrics["retiring"], Some(0.5));
        assert_eq!(result.estimated, ["retiring"]);
    }
}
