//! The comparison itself, typed: per entity, each side's calls, cost and TopDown mix, the
//! change, and a verdict against the threshold (and, with several runs per side, Welch's test).
//!
//! The cost compared is the weight counter (`slots`, or `cpu-clock`/`cycles` where the model
//! has no slots) per call for kinds that count calls (functions and call-tree edges inclusive,
//! spans), and the weight counter's total for processes and cgroups. An entity regresses when
//! its cost grew by more than the threshold and, with several runs on each side, the growth is
//! significant (Welch's t-test, p < 0.05): a change within the threshold is inside the noise
//! band, one with p >= 0.05 "not significant".

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{
    input::{Key, Kind, Observed, Run},
    stats,
};
use crate::model::{Counts, Model};

/// One side's figures for one entity.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Side {
    /// Runs of this side in which the entity was present (counted something or was called).
    pub runs: usize,
    /// Calls over those runs, per run (kinds with calls).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls_per_run: Option<f64>,
    /// The mean over runs of the cost: weight per call, or total weight.
    pub cost: f64,
    /// Each run's cost.
    pub cost_per_run: Vec<f64>,
    /// Functions: exclusive weight per call (own work), mean over runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exclusive_cost: Option<f64>,
    /// The TopDown mix of the side's counts summed over its runs, in percent; `None` where
    /// unknown.
    pub categories: BTreeMap<String, Option<f64>>,
}

/// Welch's test of the change, with several runs on both sides.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Test {
    pub method: &'static str,
    pub p_value: f64,
    pub t: f64,
    pub degrees_of_freedom: f64,
    /// The 95% confidence interval of the change of the mean cost, in percent of the base.
    pub change_low_pct: Option<f64>,
    pub change_high_pct: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Cost grew beyond the threshold (and significantly, with several runs).
    Regressed,
    /// Cost fell beyond the threshold (and significantly).
    Improved,
    /// Several runs per side, and the change is within their scatter (p >= 0.05).
    NotSignificant,
    /// The change is within the threshold (the noise band).
    WithinThreshold,
    /// Only in NEW.
    Added,
    /// Only in BASE.
    Removed,
}

impl Verdict {
    pub fn text(self) -> &'static str {
        match self {
            Verdict::Regressed => "REGRESSED",
            Verdict::Improved => "improved",
            Verdict::NotSignificant => "not significant",
            Verdict::WithinThreshold => "within threshold",
            Verdict::Added => "added",
            Verdict::Removed => "removed",
        }
    }
}

/// The shift of one TopDown category.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Shift {
    pub base_pct: f64,
    pub new_pct: f64,
    /// new - base, in percentage points.
    pub shift_pp: f64,
}

/// One entity compared.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    pub kind: Kind,
    pub name: String,
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<Side>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new: Option<Side>,
    /// (new - base) / base of the mean cost, in percent; `None` when either side is absent or
    /// the base cost is 0.
    pub change_pct: Option<f64>,
    /// Functions: the change of the exclusive cost per call, in percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exclusive_change_pct: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test: Option<Test>,
    /// Per category, in the model's order.
    pub shifts: BTreeMap<String, Shift>,
}

/// Everything `topdown diff` found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    pub model: String,
    pub weight_counter: String,
    pub level: u8,
    pub synthetic: bool,
    pub threshold_pct: f64,
    /// How several runs per side are judged, or `None` with one run per side.
    pub method: Option<String>,
    pub base_files: Vec<String>,
    pub new_files: Vec<String>,
    /// The categories of `shifts`, in the model's order.
    pub categories: Vec<String>,
    /// Regressions first (largest first), then improvements, then the rest.
    pub changes: Vec<Change>,
}

impl Comparison {
    pub fn regressions(&self) -> impl Iterator<Item = &Change> {
        self.changes
            .iter()
            .filter(|change| change.verdict == Verdict::Regressed)
    }

    pub fn cost_unit(&self, kind: Kind) -> String {
        if kind.has_calls() {
            format!("{}/call", self.weight_counter)
        } else {
            self.weight_counter.clone()
        }
    }
}

/// The entity's presence in a run: called (kinds with calls) or counted something.
fn present(kind: Kind, observed: &Observed) -> bool {
    if kind.has_calls() {
        observed.calls > 0
    } else {
        observed.counters.values().any(|value| *value > 0)
    }
}

fn cost(kind: Kind, counts: &Counts, calls: u64, weight_counter: &str) -> f64 {
    let weight = counts.get(weight_counter).copied().unwrap_or(0) as f64;
    if kind.has_calls() {
        weight / calls as f64
    } else {
        weight
    }
}

struct Evaluate<'a> {
    model: &'a dyn Model,
    counter_names: &'a [String],
    level: u8,
}

impl Evaluate<'_> {
    fn categories(&self, counts: &Counts, names: &[String]) -> BTreeMap<String, Option<f64>> {
        if self.level == 0 {
            return BTreeMap::new();
        }
        let evaluator = crate::model::Evaluator::new(self.model, self.counter_names);
        let metrics = evaluator.evaluate_named(counts, self.level).metrics;
        names
            .iter()
            .map(|name| {
                let value = metrics.get(name).copied().flatten().map(|v| 100.0 * v);
                (name.clone(), value)
            })
            .collect()
    }
}

fn side(
    key: &Key,
    runs: &[&Run],
    weight_counter: &str,
    evaluate: &Evaluate<'_>,
    names: &[String],
) -> Option<Side> {
    let present_in: Vec<&Observed> = runs
        .iter()
        .filter_map(|run| run.entities.get(key))
        .filter(|observed| present(key.kind, observed))
        .collect();
    if present_in.is_empty() {
        return None;
    }
    let cost_per_run: Vec<f64> = present_in
        .iter()
        .map(|observed| cost(key.kind, &observed.counters, observed.calls, weight_counter))
        .collect();
    let exclusive: Vec<f64> = present_in
        .iter()
        .filter_map(|observed| {
            observed
                .exclusive
                .as_ref()
                .map(|counts| cost(key.kind, counts, observed.calls, weight_counter))
        })
        .collect();
    let mut pooled = Counts::new();
    let mut calls = 0u64;
    for observed in &present_in {
        calls += observed.calls;
        for (name, value) in &observed.counters {
            *pooled.entry(name.clone()).or_default() += value;
        }
    }
    Some(Side {
        runs: present_in.len(),
        calls_per_run: key
            .kind
            .has_calls()
            .then(|| calls as f64 / present_in.len() as f64),
        cost: stats::mean(&cost_per_run).unwrap_or(0.0),
        cost_per_run,
        exclusive_cost: stats::mean(&exclusive),
        categories: evaluate.categories(&pooled, names),
    })
}

fn relative(base: f64, new: f64) -> Option<f64> {
    (base > 0.0 && base.is_finite() && new.is_finite()).then(|| 100.0 * (new - base) / base)
}

/// The categories compared: the model's metrics at the level both sides have, in TopDown
/// order (per-core-type metrics of hybrid models left out).
fn category_names(model: &dyn Model, level: u8) -> Vec<String> {
    if level == 0 {
        return Vec::new();
    }
    let known = model.metric_names(level);
    crate::model::L1_METRICS
        .iter()
        .chain(crate::model::L2_METRICS.iter())
        .chain(["smt_contention"].iter())
        .filter(|name| known.iter().any(|known| known == **name))
        .map(|name| (*name).to_owned())
        .collect()
}

/// Compares the runs of BASE with those of NEW (already checked comparable).
pub fn compare(
    model: &dyn Model,
    base: &[&Run],
    new: &[&Run],
    threshold_pct: f64,
    kinds: &[Kind],
) -> Comparison {
    let first = base[0];
    let level = base
        .iter()
        .chain(new)
        .map(|run| run.level)
        .min()
        .unwrap_or(0);
    let names = category_names(model, level);
    let evaluate = Evaluate {
        model,
        counter_names: &first.counter_names,
        level,
    };
    let several = base.len() > 1 || new.len() > 1;
    let keys: BTreeSet<&Key> = base
        .iter()
        .chain(new)
        .flat_map(|run| run.entities.keys())
        .filter(|key| kinds.contains(&key.kind))
        .collect();
    let weight_counter = first.weight_counter.as_str();
    let mut changes: Vec<Change> = keys
        .into_iter()
        .filter_map(|key| {
            let base_side = side(key, base, weight_counter, &evaluate, &names);
            let new_side = side(key, new, weight_counter, &evaluate, &names);
            let (verdict, change_pct, exclusive_change_pct, test) = match (&base_side, &new_side) {
                (None, None) => return None,
                (None, Some(_)) => (Verdict::Added, None, None, None),
                (Some(_), None) => (Verdict::Removed, None, None, None),
                (Some(b), Some(n)) => {
                    let change = relative(b.cost, n.cost);
                    let exclusive = match (b.exclusive_cost, n.exclusive_cost) {
                        (Some(b), Some(n)) => relative(b, n),
                        _ => None,
                    };
                    let test = if several {
                        stats::welch(&b.cost_per_run, &n.cost_per_run).map(|welch| Test {
                            method: "welch",
                            p_value: welch.p_value,
                            t: welch.t,
                            degrees_of_freedom: welch.degrees_of_freedom,
                            change_low_pct: relative(b.cost, b.cost + welch.low),
                            change_high_pct: relative(b.cost, b.cost + welch.high),
                        })
                    } else {
                        None
                    };
                    // Growth from nothing (a base cost of 0) counts as growth beyond any
                    // threshold.
                    let grew_from_zero = b.cost <= 0.0 && n.cost > 0.0;
                    let beyond = |direction: f64| match change {
                        Some(pct) => direction * pct > threshold_pct,
                        None => direction > 0.0 && grew_from_zero,
                    };
                    let significant = match (&test, several) {
                        (Some(test), _) => test.p_value < stats::ALPHA,
                        // Several runs but one side has a single run where the entity was
                        // present: no test can be made.
                        (None, true) => false,
                        (None, false) => true,
                    };
                    let verdict = if !beyond(1.0) && !beyond(-1.0) {
                        Verdict::WithinThreshold
                    } else if !significant {
                        Verdict::NotSignificant
                    } else if beyond(1.0) {
                        Verdict::Regressed
                    } else {
                        Verdict::Improved
                    };
                    (verdict, change, exclusive, test)
                }
            };
            let shifts = match (&base_side, &new_side) {
                (Some(b), Some(n)) => names
                    .iter()
                    .filter_map(|name| {
                        let base_pct = b.categories.get(name).copied().flatten()?;
                        let new_pct = n.categories.get(name).copied().flatten()?;
                        Some((
                            name.clone(),
                            Shift {
                                base_pct,
                                new_pct,
                                shift_pp: new_pct - base_pct,
                            },
                        ))
                    })
                    .collect(),
                _ => BTreeMap::new(),
            };
            Some(Change {
                kind: key.kind,
                name: key.name.clone(),
                verdict,
                base: base_side,
                new: new_side,
                change_pct,
                exclusive_change_pct,
                test,
                shifts,
            })
        })
        .collect();
    changes.sort_by(|a, b| {
        a.verdict
            .cmp(&b.verdict)
            .then_with(|| {
                let magnitude = |c: &Change| c.change_pct.map_or(f64::INFINITY, f64::abs);
                magnitude(b).total_cmp(&magnitude(a))
            })
            .then_with(|| a.kind.cmp(&b.kind))
            .then_with(|| a.name.cmp(&b.name))
    });
    Comparison {
        model: first.model.clone(),
        weight_counter: first.weight_counter.clone(),
        level,
        synthetic: base.iter().chain(new).any(|run| run.synthetic),
        threshold_pct,
        method: several.then(|| {
            format!(
                "Welch's t-test per entity on the runs' costs (two-sided, p < {}), 95% interval of the change; changes within +/-{threshold_pct}% are the noise band",
                stats::ALPHA
            )
        }),
        base_files: base.iter().map(|run| run.path.display().to_string()).collect(),
        new_files: new.iter().map(|run| run.path.display().to_string()).collect(),
        categories: names,
        changes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::report_of;

    /// A run of intel-icl with one function per `(name, calls, slots)`.
    fn run(functions: &[(&str, u64, u64)]) -> Run {
        let report = report_of("intel-icl", 1);
        let entities = functions
            .iter()
            .map(|(name, calls, slots)| {
                // Every counter present (a missing one makes the metrics it feeds unknown).
                let mut counters: Counts = report
                    .counter_names
                    .iter()
                    .map(|name| (name.clone(), 0))
                    .collect();
                counters.insert("slots".to_owned(), *slots);
                counters.insert("topdown-retiring".to_owned(), *slots / 2);
                counters.insert("topdown-be-bound".to_owned(), *slots / 2);
                (
                    Key {
                        kind: Kind::Function,
                        name: (*name).to_owned(),
                    },
                    Observed {
                        calls: *calls,
                        counters: counters.clone(),
                        exclusive: Some(counters),
                    },
                )
            })
            .collect();
        Run {
            path: "run.json".into(),
            model: report.model.clone(),
            weight_counter: "slots".into(),
            level: 1,
            counter_names: report.counter_names.clone(),
            synthetic: false,
            entities,
            report,
        }
    }

    fn verdicts(comparison: &Comparison) -> Vec<(&str, Verdict, Option<f64>)> {
        comparison
            .changes
            .iter()
            .map(|change| (change.name.as_str(), change.verdict, change.change_pct))
            .collect()
    }

    #[test]
    fn one_run_per_side_is_judged_by_the_threshold() {
        let model = crate::model::base_model("intel-icl").unwrap();
        let base = run(&[
            ("a", 10, 1000),
            ("b", 10, 1000),
            ("c", 10, 1000),
            ("gone", 1, 5),
        ]);
        let new = run(&[
            ("a", 10, 1060),
            ("b", 5, 500),
            ("c", 10, 900),
            ("fresh", 1, 5),
        ]);
        let comparison = compare(model.as_ref(), &[&base], &[&new], 5.0, &Kind::ALL);
        assert_eq!(
            verdicts(&comparison),
            vec![
                ("a", Verdict::Regressed, Some(6.0)),
                ("c", Verdict::Improved, Some(-10.0)),
                ("b", Verdict::WithinThreshold, Some(0.0)),
                ("fresh", Verdict::Added, None),
                ("gone", Verdict::Removed, None),
            ]
        );
        assert!(comparison.method.is_none());
        // The same mix on both sides: every shift is 0 pp.
        let a = &comparison.changes[0];
        assert_eq!(a.shifts["retiring"].shift_pp, 0.0);
        assert_eq!(a.shifts["retiring"].base_pct, 50.0);
        // With a threshold of 6.5%, +6% is within it: nothing regressed, c still improved.
        let comparison = compare(model.as_ref(), &[&base], &[&new], 6.5, &[Kind::Function]);
        assert_eq!(comparison.changes[0].verdict, Verdict::Improved);
        assert!(comparison.regressions().next().is_none());
    }

    fn refs(runs: &[Run]) -> Vec<&Run> {
        runs.iter().collect()
    }

    #[test]
    fn several_runs_need_significance() {
        let model = crate::model::base_model("intel-icl").unwrap();
        let base = [run(&[("f", 10, 1000)]), run(&[("f", 10, 1400)])];
        let noisy = [run(&[("f", 10, 1100)]), run(&[("f", 10, 1500)])];
        let steady = [run(&[("f", 10, 1500)]), run(&[("f", 10, 1510)])];
        let comparison = compare(model.as_ref(), &refs(&base), &refs(&noisy), 5.0, &Kind::ALL);
        let change = &comparison.changes[0];
        assert_eq!(change.verdict, Verdict::NotSignificant);
        let test = change.test.as_ref().unwrap();
        // scipy: stats.ttest_ind([110, 150], [100, 140], equal_var=False).pvalue
        assert!((test.p_value - 0.757464374963667).abs() < 1e-9, "{test:?}");
        let comparison = compare(
            model.as_ref(),
            &refs(&base),
            &refs(&steady),
            5.0,
            &Kind::ALL,
        );
        assert_eq!(comparison.changes[0].verdict, Verdict::NotSignificant);
        // {100, 140} against {150, 151} per call: +25% but not significant (two runs of
        // that much scatter leave little certainty); against a steady base it is.
        let steady_base = [run(&[("f", 10, 1000)]), run(&[("f", 10, 1010)])];
        let comparison = compare(
            model.as_ref(),
            &refs(&steady_base),
            &refs(&steady),
            5.0,
            &Kind::ALL,
        );
        let change = &comparison.changes[0];
        assert_eq!(change.verdict, Verdict::Regressed, "{change:?}");
        let test = change.test.as_ref().unwrap();
        assert!(test.p_value < 0.001, "{test:?}");
        assert!(test.change_low_pct.unwrap() > 40.0 && test.change_high_pct.unwrap() < 60.0);
    }

    #[test]
    fn growth_from_zero_cost_regresses() {
        let model = crate::model::base_model("intel-icl").unwrap();
        let base = run(&[("f", 10, 0)]);
        let new = run(&[("f", 10, 100)]);
        let comparison = compare(model.as_ref(), &[&base], &[&new], 5.0, &Kind::ALL);
        assert_eq!(comparison.changes[0].verdict, Verdict::Regressed);
        assert_eq!(comparison.changes[0].change_pct, None);
    }
}
