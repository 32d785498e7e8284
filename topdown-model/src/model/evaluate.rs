//! Metrics from counts, with the counter budget's rotation undone.
//!
//! Counters of a group that rotated (`crate::schedule`) only counted while their group was on
//! the PMU; the group's enabled and running times are attributed next to them, so each entity's
//! counts can be scaled by its own enabled/running ratio before the model's formulas run. The
//! metrics fed by scaled counts are estimates and are reported as such.

use super::{Counts, L1_METRICS, L2_METRICS, Metrics, Model, Name};
use crate::groups::{enabled_slot_name, group_level, running_slot_name};

/// A model's metrics for one entity.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evaluation {
    pub metrics: Metrics,
    /// Names of the metrics computed from scaled (rotated) counts.
    pub estimated: Vec<String>,
}

/// Where one of the model's counters is among the slots, resolved once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Input {
    /// The counter's slot; `None` when the slots do not have it (a recording made at a lower
    /// level leaves out the level-2 counters).
    slot: Option<usize>,
    /// 1 or 2: the TopDown level its scheduling group serves.
    level: usize,
    /// Its group's enabled and running time slots, when the group rotated.
    enabled: Option<usize>,
    running: Option<usize>,
}

/// Counter values kept on the stack for models with up to this many counters (every built-in
/// model and hybrid pairing has at most 32); larger ones (many `-e` events) take one
/// allocation per entity.
const INLINE_VALUES: usize = 32;

/// A model resolved against a set of slot names (the counter plan's `slot_names`, a recording's
/// `counter_names`): which slot holds each of [`Model::counters`] and each rotating group's
/// enabled/running times. Built once per report; evaluating an entity then reads its slot
/// values by index, with no name lookup.
pub struct Evaluator<'a> {
    model: &'a dyn Model,
    inputs: Vec<Input>,
    slot_names: Vec<String>,
    level_one: Vec<&'static str>,
    /// The model's [`Model::metric_names`] at levels 0, 1 and 2, resolved once.
    metric_names: [MetricNames; 3],
}

/// A model's metric names at one level and which of them are level-2 names.
struct MetricNames {
    names: Vec<String>,
    /// Every entity's [`Metrics`] is a clone of this one (all `None`), so all of them share
    /// its names: one allocation per evaluator, not per entity.
    template: Metrics,
    /// Positions in `names` in name order, the last of a name given twice (what collecting
    /// into a map keeps): where each of `template`'s values comes from.
    sorted: Vec<usize>,
    level_two: Vec<bool>,
    level_one: Vec<bool>,
}

/// Which levels' inputs were scaled from rotated counters for one entity (see
/// [`Evaluator::evaluate_into`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scaled {
    level_one: bool,
    level_two: bool,
}

impl<'a> Evaluator<'a> {
    /// Resolves `model`'s counters against `slot_names`. Two counters of the same name (a `-e`
    /// event spelled like a model counter) take one slot of that name each while there are
    /// enough, and otherwise share the first.
    pub fn new<S: AsRef<str>>(model: &'a dyn Model, slot_names: &[S]) -> Self {
        let slot_names: Vec<String> = slot_names
            .iter()
            .map(|name| name.as_ref().to_owned())
            .collect();
        let mut taken = vec![false; slot_names.len()];
        let position = |name: &str| slot_names.iter().position(|slot| slot == name);
        let inputs = model
            .counters()
            .iter()
            .map(|spec| {
                let slot = slot_names
                    .iter()
                    .enumerate()
                    .position(|(slot, name)| !taken[slot] && *name == spec.name)
                    .or_else(|| position(&spec.name));
                if let Some(slot) = slot {
                    taken[slot] = true;
                }
                Input {
                    slot,
                    level: usize::from(group_level(spec.group)),
                    enabled: position(&enabled_slot_name(spec.group)),
                    running: position(&running_slot_name(spec.group)),
                }
            })
            .collect();
        let level_one: Vec<&'static str> = L1_METRICS
            .iter()
            .copied()
            .chain(model.extra_l1_metrics().iter().copied())
            .collect();
        let metric_names = [0, 1, 2].map(|level| {
            let names = model.metric_names(level);
            let mut sorted: Vec<usize> = (0..names.len()).collect();
            // Stable, then the last of each run of equal names.
            sorted.sort_by(|a, b| names[*a].cmp(&names[*b]));
            let sorted = sorted
                .iter()
                .enumerate()
                .filter(|(at, index)| {
                    sorted
                        .get(at + 1)
                        .is_none_or(|next| names[*next] != names[**index])
                })
                .map(|(_, index)| *index)
                .collect();
            MetricNames {
                template: names.iter().map(|name| (name, None)).collect(),
                sorted,
                level_two: names
                    .iter()
                    .map(|name| L2_METRICS.contains(&name.as_str()))
                    .collect(),
                level_one: names
                    .iter()
                    .map(|name| level_one.contains(&name.as_str()))
                    .collect(),
                names,
            }
        });
        Self {
            model,
            inputs,
            slot_names,
            level_one,
            metric_names,
        }
    }

    /// The names of the metrics at `level`, in the order [`Evaluator::evaluate_into`] writes
    /// them (the model's [`Model::metric_names`]).
    pub fn metric_names(&self, level: u8) -> &[String] {
        &self.metric_names[usize::from(level.min(2))].names
    }

    /// The typed evaluation of one entity's slot values: [`Evaluator::evaluate`]'s metrics,
    /// written into `out` by position in [`Evaluator::metric_names`] (`out` is that long),
    /// without allocating for the built-in models. What it returns says which of them are
    /// estimates ([`Evaluator::is_estimated`]).
    pub fn evaluate_into(&self, slots: &[u64], level: u8, out: &mut [Option<f64>]) -> Scaled {
        self.evaluate_with_into(|slot| slots.get(slot).copied(), level, out)
    }

    /// Whether metric `index` of [`Evaluator::metric_names`] at `level`, evaluated to `value`
    /// with `scaled`, is an estimate (computed from scaled counts).
    pub fn is_estimated(
        &self,
        level: u8,
        index: usize,
        scaled: Scaled,
        value: Option<f64>,
    ) -> bool {
        let is_level_one = self.metric_names[usize::from(level.min(2))].level_one[index];
        let scaled_input = if is_level_one {
            scaled.level_one
        } else {
            scaled.level_one || scaled.level_two
        };
        scaled_input && value.is_some()
    }

    /// Evaluates at `level` one entity's slot values, in the order of the slot names this
    /// evaluator was built with (a slot past the end of `slots` counts as missing).
    pub fn evaluate(&self, slots: &[u64], level: u8) -> Evaluation {
        self.evaluate_with(|slot| slots.get(slot).copied(), level)
    }

    /// Evaluates at `level` one entity whose counts are named (a recording's entity): each
    /// slot's value is looked up by its name, and a slot name absent from `counts` counts as
    /// missing.
    pub fn evaluate_named(&self, counts: &Counts, level: u8) -> Evaluation {
        let values: Vec<Option<u64>> = self
            .slot_names
            .iter()
            .map(|name| counts.get(name).copied())
            .collect();
        self.evaluate_with(|slot| values.get(slot).copied().flatten(), level)
    }

    /// Level 1 is computed from the level-1 group(s) alone and level 2 needs every group, so: a
    /// counter missing from the slots (a recording made at a lower level) or a group that never
    /// ran for this entity leaves the metrics of its level unknown (`None`) instead of
    /// computing them from a zero.
    fn evaluate_with(&self, slot: impl Fn(usize) -> Option<u64>, level: u8) -> Evaluation {
        let names = &self.metric_names[usize::from(level.min(2))];
        let mut values = vec![None; names.names.len()];
        let scaled = self.evaluate_with_into(slot, level, &mut values);
        let mut metrics = names.template.clone();
        for (metric, index) in metrics.values_mut().zip(&names.sorted) {
            *metric = values.get(*index).copied().flatten();
        }
        let mut estimated = Vec::new();
        for (name, value) in &metrics {
            let is_level_one = self.level_one.contains(&name.as_str());
            let scaled_input = if is_level_one {
                scaled.level_one
            } else {
                scaled.level_one || scaled.level_two
            };
            if scaled_input && value.is_some() {
                estimated.push(name.to_string());
            }
        }
        Evaluation { metrics, estimated }
    }

    fn evaluate_with_into(
        &self,
        slot: impl Fn(usize) -> Option<u64>,
        level: u8,
        out: &mut [Option<f64>],
    ) -> Scaled {
        let mut inline = [0u64; INLINE_VALUES];
        let mut heap = Vec::new();
        let values: &mut [u64] = if self.inputs.len() <= INLINE_VALUES {
            &mut inline[..self.inputs.len()]
        } else {
            heap.resize(self.inputs.len(), 0);
            &mut heap
        };
        let mut unknown = [false; 3];
        let mut rotated = [false; 3];
        for (value, input) in values.iter_mut().zip(&self.inputs) {
            let Some(raw) = input.slot.and_then(&slot) else {
                unknown[input.level] = true;
                continue;
            };
            *value = raw;
            let enabled = input.enabled.and_then(&slot);
            let running = input.running.and_then(&slot);
            if let (Some(enabled), Some(running)) = (enabled, running) {
                rotated[input.level] = true;
                if running == 0 {
                    // Never on the PMU while this entity ran: its zero is not a count. (All
                    // zeroes: the entity never ran while the group was enabled, a true zero.)
                    // Never clears what an earlier counter of the level found unknown.
                    if raw != 0 || enabled != 0 {
                        unknown[input.level] = true;
                    }
                    continue;
                }
                // The count over the time the group was enabled, extrapolated from the time it
                // was counting (perf's own scaling, `perf stat`'s "(xx.xx%)" column).
                let estimate = raw as f64 * enabled as f64 / running as f64;
                *value = estimate.round() as u64;
            }
        }
        self.model.metrics_into(values, level, out);
        if unknown[1] {
            out.fill(None);
        } else if unknown[2] {
            let level_two = &self.metric_names[usize::from(level.min(2))].level_two;
            for (value, _) in out.iter_mut().zip(level_two).filter(|(_, two)| **two) {
                *value = None;
            }
        }
        Scaled {
            level_one: rotated[1],
            level_two: rotated[2],
        }
    }
}

/// Evaluates `model` at `level` on named `counts`: [`Evaluator`] for a single entity, for
/// callers that have no slot list (a check, a test). Reports build one [`Evaluator`] instead.
pub fn evaluate(model: &dyn Model, counts: &Counts, level: u8) -> Evaluation {
    let names: Vec<&str> = counts.keys().map(Name::as_str).collect();
    let values: Vec<u64> = counts.values().copied().collect();
    Evaluator::new(model, &names).evaluate(&values, level)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CounterSpec, ratio, value};

    /// retiring = a / cycles (group 0); light_operations = retiring * b / c (group 8).
    struct Pair;

    impl Model for Pair {
        crate::model::name_and_description!("pair", "pair");
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
        fn metrics(&self, values: &[u64], level: u8) -> Metrics {
            let get = |index: usize| value(values, index);
            let (cycles, a, b, c) = (get(0), get(1), get(2), get(3));
            let retiring = ratio(a, cycles);
            let mut metrics: Metrics = L1_METRICS
                .iter()
                .map(|name| ((*name).to_owned(), None))
                .collect();
            metrics.insert("retiring".to_owned(), retiring);
            if level >= 2 {
                metrics.extend(L2_METRICS.iter().map(|name| ((*name).to_owned(), None)));
                let light = retiring.zip(ratio(b, c)).map(|(r, f)| r * f);
                metrics.insert("light_operations".to_owned(), light);
                // cycles-scaled: needs the *scaled* b.
                metrics.insert("heavy_operations".to_owned(), ratio(b, cycles));
            }
            metrics
        }
        crate::model::typed_metrics_from_map!();
        fn slots(&self, values: &[u64]) -> Option<f64> {
            Some(value(values, 0))
        }
        fn weight_counter(&self) -> &'static str {
            "cycles"
        }
    }

    /// [`evaluate`] of [`Pair`] at level 2 with cycles 1000 and a 250, and `rest`: the level-2
    /// counters and group 8's times, as each test has them. Level 1 is the same whatever
    /// `rest` is: retiring 0.25, checked here.
    fn evaluate_pair(rest: &[(&str, u64)]) -> Evaluation {
        let pairs: Vec<(&str, u64)> = [("cycles", 1000), ("a", 250)]
            .into_iter()
            .chain(rest.iter().copied())
            .collect();
        let result = evaluate(&Pair, &counts(&pairs), 2);
        assert_eq!(result.metrics["retiring"], Some(0.25));
        result
    }

    fn counts(pairs: &[(&str, u64)]) -> Counts {
        pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), *value))
            .collect()
    }

    #[test]
    fn without_rotation_nothing_is_scaled_or_estimated() {
        let result = evaluate_pair(&[("b", 10), ("c", 40)]);
        assert_eq!(result.metrics["light_operations"], Some(0.0625));
        assert_eq!(result.metrics["heavy_operations"], Some(0.01));
        assert!(result.estimated.is_empty());
    }

    #[test]
    fn a_rotated_group_is_scaled_by_its_own_enabled_over_running() {
        // Group 1 ran a quarter of the time: b = 10 * 4 = 40 scaled; the b/c ratio is unchanged.
        let result = evaluate_pair(&[
            ("b", 10),
            ("c", 40),
            ("group8.enabled_ns", 800),
            ("group8.running_ns", 200),
        ]);
        assert_eq!(result.metrics["light_operations"], Some(0.0625));
        assert_eq!(result.metrics["heavy_operations"], Some(0.04));
        assert_eq!(result.estimated, ["heavy_operations", "light_operations"]);
    }

    #[test]
    fn a_group_that_never_ran_leaves_its_level_unknown() {
        let result = evaluate_pair(&[
            ("b", 0),
            ("c", 0),
            ("group8.enabled_ns", 800),
            ("group8.running_ns", 0),
        ]);
        assert_eq!(result.metrics["light_operations"], None);
        assert_eq!(result.estimated, Vec::<String>::new());
    }

    #[test]
    fn a_later_idle_group_does_not_clear_an_unknown_level() {
        // `b` is missing (its level is unknown); `c`'s rotated group never ran for this entity
        // and was never enabled either: that must not make level 2 known again.
        let result = evaluate_pair(&[("c", 0), ("group8.enabled_ns", 0), ("group8.running_ns", 0)]);
        assert_eq!(result.metrics["heavy_operations"], None);
        assert_eq!(result.metrics["light_operations"], None);
    }

    #[test]
    fn entities_share_the_evaluators_names_in_the_models_order() {
        let evaluator = Evaluator::new(&Pair, &["cycles", "a", "b", "c"]);
        let one = evaluator.evaluate(&[1000, 250, 10, 40], 2).metrics;
        let two = evaluator.evaluate(&[1000, 500, 10, 40], 2).metrics;
        assert!(std::ptr::eq(one.keys().as_slice(), two.keys().as_slice()));
        // The same map, in the same order, as the model's own named metrics.
        assert_eq!(one, Pair.metrics(&[1000, 250, 10, 40], 2));
        assert_eq!(one["retiring"], Some(0.25));
    }

    #[test]
    fn a_level_one_recording_has_no_level_two() {
        let result = evaluate_pair(&[]);
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

    #[test]
    fn counters_resolve_by_name_whatever_the_slot_order() {
        // A level-1 plan: b and c (group 8) have no slot, so level 2 is unknown.
        let evaluator = Evaluator::new(&Pair, &["a", "cycles"]);
        let result = evaluator.evaluate(&[250, 1000], 2);
        assert_eq!(result.metrics["retiring"], Some(0.25));
        assert_eq!(result.metrics["light_operations"], None);
        assert_eq!(result.metrics["heavy_operations"], None);
        assert!(result.estimated.is_empty());
        // A slot past the end of the values is missing too: no `a`, no level 1.
        let short = evaluator.evaluate(&[250], 1);
        assert_eq!(short.metrics["retiring"], None);
    }

    #[test]
    fn a_rotated_group_is_scaled_on_the_slot_array() {
        // As the BPF side fills it: the plan's slots, then zeros to MAX_COUNTERS. Group 8 ran
        // a quarter of the time: b = 10 * 4 = 40, heavy = 40/1000.
        let evaluator = Evaluator::new(
            &Pair,
            &[
                "cycles",
                "a",
                "b",
                "c",
                "group8.enabled_ns",
                "group8.running_ns",
            ],
        );
        let mut slots = [0u64; 24];
        slots[..6].copy_from_slice(&[1000, 250, 10, 40, 800, 200]);
        let result = evaluator.evaluate(&slots, 2);
        assert_eq!(result.metrics["retiring"], Some(0.25));
        assert_eq!(result.metrics["light_operations"], Some(0.0625));
        assert_eq!(result.metrics["heavy_operations"], Some(0.04));
        assert_eq!(result.estimated, ["heavy_operations", "light_operations"]);
        // The group never ran: level 2 unknown, level 1 exact.
        slots[..6].copy_from_slice(&[1000, 250, 0, 0, 800, 0]);
        let never = evaluator.evaluate(&slots, 2);
        assert_eq!(never.metrics["retiring"], Some(0.25));
        assert_eq!(never.metrics["heavy_operations"], None);
        assert!(never.estimated.is_empty());
    }

    #[test]
    fn named_counts_missing_a_slot_leave_its_level_unknown() {
        // `report -i`: the recording's counter names, each entity's counts by name.
        let evaluator = Evaluator::new(&Pair, &["cycles", "a", "b", "c"]);
        let all = counts(&[("cycles", 1000), ("a", 250), ("b", 10), ("c", 40)]);
        let result = evaluator.evaluate_named(&all, 2);
        assert_eq!(result.metrics["retiring"], Some(0.25));
        assert_eq!(result.metrics["heavy_operations"], Some(0.01));
        let without_c = counts(&[("cycles", 1000), ("a", 250), ("b", 10)]);
        let result = evaluator.evaluate_named(&without_c, 2);
        assert_eq!(result.metrics["retiring"], Some(0.25));
        assert_eq!(result.metrics["light_operations"], None);
        assert_eq!(result.metrics["heavy_operations"], None);
        let without_a = counts(&[("cycles", 1000), ("b", 10), ("c", 40)]);
        let result = evaluator.evaluate_named(&without_a, 2);
        assert!(result.metrics.values().all(Option::is_none));
    }

    #[test]
    fn an_event_named_like_a_model_counter_keeps_its_own_slot() {
        // `-e a` beside the model's own `a`: the plan has two slots named `a`, the model's
        // first. The model reads 250 (retiring 0.25), not the event's 999.
        let event = crate::events::attr::EventAttr {
            name: "a".to_owned(),
            pmu: None,
            kind: crate::events::EventKind::Perf {
                perf_type: crate::events::attr::PERF_TYPE_SOFTWARE,
                config: 2,
                config1: 0,
                config2: 0,
            },
            exclude: None,
        };
        let model = crate::model::with_events::WithEvents::new(Box::new(Pair), vec![event]);
        let evaluator = Evaluator::new(&model, &["cycles", "a", "b", "c", "a"]);
        let result = evaluator.evaluate(&[1000, 250, 10, 40, 999], 2);
        assert_eq!(result.metrics["retiring"], Some(0.25));
        assert_eq!(result.metrics["heavy_operations"], Some(0.01));
    }
}

#[cfg(test)]
mod typed_tests {
    use crate::model::{Metrics, Model, all_models, base_model, model_by_name};

    /// The typed evaluation, named by `metric_names`, is exactly the map of `metrics` for every
    /// model, hybrid pairing and synthetic wrapper, at both levels, whatever the values (the
    /// default `metric_names` takes the keys from empty values, so this also checks that a
    /// model's names do not depend on its values).
    #[test]
    fn typed_evaluation_names_match_the_metrics_map_for_every_model() {
        let mut models: Vec<Box<dyn Model>> = all_models();
        models.push(base_model("hybrid:intel-spr+intel-grt").expect("hybrid pairing"));
        models.push(model_by_name("synthetic:intel-icl", &[]).expect("synthetic model"));
        models.push(model_by_name("synthetic:amd-zen4", &[]).expect("synthetic model"));
        for model in &models {
            let count = model.counters().len();
            // Distinct, nonzero values so that every ratio is defined somewhere.
            let values: Vec<u64> = (0..count as u64).map(|k| 1000 + 37 * k * k).collect();
            for level in [1, 2] {
                for values in [&values[..], &[][..]] {
                    let names = model.metric_names(level);
                    let mut out = vec![Some(f64::NAN); names.len()];
                    model.metrics_into(values, level, &mut out);
                    let typed: Metrics = names.into_iter().zip(out).collect();
                    let map = model.metrics(values, level);
                    assert_eq!(
                        format!("{typed:?}"),
                        format!("{map:?}"),
                        "{} at level {level}",
                        model.name()
                    );
                }
            }
        }
    }
}
