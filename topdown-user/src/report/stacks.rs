//! A report as stacks with exclusive values: what `--format pprof` and `--format folded` write.
//!
//! With probed functions, one stack per path of the call tree (from a call with no probed
//! caller down through caller -> callee edges), holding the exclusive counts of the function it
//! ends in: summed over the stacks ending in a function they are exactly that function's
//! exclusive figures (pprof's *flat*), and summed over the stacks through it they are its
//! inclusive figure (pprof's *cum*) wherever the call tree is a tree.
//!
//! The call tree has one level of caller context per edge. Where a function has several
//! callers, each path into it gets the share of the function's incoming weight its last edge
//! carries (as the SVG icicle draws it), and the function's exclusive counts are apportioned
//! over its paths in those proportions, in whole units by largest remainder, so no unit is lost
//! or invented.
//!
//! Without probed functions, one stack per task (process, then thread), per process, or per
//! cgroup (its path's components), as `--by` orders them.

use std::collections::BTreeMap;

use super::{By, CallEdge, Entity, FunctionEntry, Report};
use crate::error::{Failure, fail};

/// Deeper paths are not followed (the probes' own nesting limit is 64).
const MAX_DEPTH: usize = 64;
/// Paths walked at most: a densely shared graph has exponentially many. The function totals
/// stay exact past it (they are apportioned over the paths found), only context is lost.
const MAX_PATHS: usize = 200_000;

/// Every stack of a report, with the names of its value columns.
#[derive(Clone, Debug, PartialEq)]
pub struct Stacks {
    /// The counter `weight` holds (`slots`, `cpu-clock`, `cycles`).
    pub weight_counter: String,
    /// TopDown categories whose values are in each stack's `categories`, in this order.
    pub categories: Vec<String>,
    pub stacks: Vec<Stack>,
    /// More paths than [`MAX_PATHS`]: deeper context was left out (totals are still exact).
    pub truncated: bool,
}

/// One stack and its exclusive values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stack {
    /// Root first.
    pub frames: Vec<StackFrame>,
    pub labels: Labels,
    /// Probed calls of the last frame along this path (0 for tasks, processes and cgroups).
    pub calls: u64,
    /// The weight counter, exclusive.
    pub weight: u64,
    /// Each category's share of `weight`, in the weight counter's unit, in [`Stacks`]' order.
    pub categories: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct StackFrame {
    pub name: String,
    /// The binary a probed function is in.
    pub file: Option<String>,
}

/// What a stack belongs to, where the report splits by it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels {
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub comm: Option<String>,
    pub cgroup: Option<String>,
}

/// The report's stacks: probed call paths when it has probed functions, else the first of
/// `by`'s task, process and cgroup breakdowns that has entries.
pub fn stacks(report: &Report, by: &[By]) -> anyhow::Result<Stacks> {
    let categories = category_names(report);
    let mut result = Stacks {
        weight_counter: report.weight_counter.clone(),
        categories,
        stacks: Vec::new(),
        truncated: false,
    };
    if !report.functions.is_empty() {
        function_stacks(report, &mut result);
        return Ok(result);
    }
    for breakdown in by {
        match breakdown {
            By::Task if !report.tasks.is_empty() => {
                task_stacks(report, &mut result);
                return Ok(result);
            }
            By::Process if !report.processes.is_empty() => {
                process_stacks(report, &mut result);
                return Ok(result);
            }
            By::Cgroup if !report.cgroups.is_empty() => {
                cgroup_stacks(report, &mut result);
                return Ok(result);
            }
            _ => {}
        }
    }
    Err(fail(
        Failure::Usage,
        "this report has no probed functions and none of the --by breakdowns (task, process, cgroup) has entries: nothing to write as stacks",
    ))
}

/// The level-1 and level-2 categories (and AMD's `smt_contention`) the report's metrics hold,
/// in TopDown order. Per-core-type metrics of hybrid models (`cpu_core.retiring`) are fractions
/// of that core type's slots, not of the entity's, so they are left out.
fn category_names(report: &Report) -> Vec<String> {
    if report.level == 0 {
        return Vec::new();
    }
    let known = &report.totals.metrics;
    crate::model::L1_METRICS
        .iter()
        .chain(crate::model::L2_METRICS.iter())
        .chain(["smt_contention"].iter())
        .filter(|name| known.contains_key(name))
        .map(|name| (*name).to_owned())
        .collect()
}

fn weight_of(report: &Report, entity: &Entity) -> u64 {
    entity.count(&report.weight_counter)
}

/// Each category's part of `weight`: the metric (a fraction) times the weight, rounded; an
/// unknown metric gives 0.
fn category_values(categories: &[String], entity: &Entity, weight: u64) -> Vec<u64> {
    categories
        .iter()
        .map(|name| {
            let fraction = entity.metrics.get(name).copied().flatten().unwrap_or(0.0);
            if fraction.is_finite() && fraction > 0.0 {
                (fraction * weight as f64).round() as u64
            } else {
                0
            }
        })
        .collect()
}

/// Splits `total` into whole parts proportional to `weights` (Hamilton's largest-remainder
/// method): the parts add up to `total` exactly. Non-positive weights get nothing; when every
/// weight is zero the parts are equal (the remainder to the first).
pub fn apportion(total: u64, weights: &[f64]) -> Vec<u64> {
    if weights.is_empty() {
        return Vec::new();
    }
    let clean: Vec<f64> = weights
        .iter()
        .map(|weight| {
            if weight.is_finite() && *weight > 0.0 {
                *weight
            } else {
                0.0
            }
        })
        .collect();
    let sum: f64 = clean.iter().sum();
    let clean = if sum > 0.0 {
        clean
    } else {
        vec![1.0; weights.len()]
    };
    let sum: f64 = clean.iter().sum();
    let quotas: Vec<f64> = clean.iter().map(|w| total as f64 * w / sum).collect();
    let mut parts: Vec<u64> = quotas
        .iter()
        .map(|q| (q.floor() as u64).min(total))
        .collect();
    let given: u128 = parts.iter().map(|part| u128::from(*part)).sum();
    // Float quotas of totals above 2^53 can floor past `total`; take any excess back first.
    let mut left = total as i128 - given as i128;
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by(|a, b| {
        let ra = quotas[*a] - quotas[*a].floor();
        let rb = quotas[*b] - quotas[*b].floor();
        rb.total_cmp(&ra).then(a.cmp(b))
    });
    let mut index = 0;
    while left > 0 {
        let at = order[index % order.len()];
        if clean[at] > 0.0 {
            parts[at] += 1;
            left -= 1;
        }
        index += 1;
    }
    while left < 0 {
        let at = order[order.len() - 1 - (index % order.len())];
        if parts[at] > 0 {
            parts[at] -= 1;
            left += 1;
        }
        index += 1;
    }
    parts
}

/// One function of the tree: `(pid, symbol)`, the key call-tree edges use.
type FunctionKey<'a> = (Option<u32>, &'a str);

/// A path found in the call tree, ending at its last edge's callee.
struct PathEnd<'a> {
    symbols: Vec<&'a str>,
    edge: &'a CallEdge,
    share: f64,
}

struct Walk<'a> {
    report: &'a Report,
    out: BTreeMap<FunctionKey<'a>, Vec<&'a CallEdge>>,
    into_weight: BTreeMap<FunctionKey<'a>, f64>,
    into_calls: BTreeMap<FunctionKey<'a>, f64>,
    ends: Vec<PathEnd<'a>>,
    truncated: bool,
}

impl<'a> Walk<'a> {
    fn weight(&self, edge: &CallEdge) -> f64 {
        weight_of(self.report, &edge.inclusive) as f64
    }

    /// The fraction of `edge`'s callee that one path through `edge` at `share` stands for.
    fn child_share(&self, edge: &'a CallEdge, share: f64) -> f64 {
        let key = (edge.pid, edge.callee.as_str());
        let into_weight = self.into_weight.get(&key).copied().unwrap_or(0.0);
        let into_calls = self.into_calls.get(&key).copied().unwrap_or(0.0);
        if into_weight > 0.0 {
            share * self.weight(edge) / into_weight
        } else if into_calls > 0.0 {
            share * edge.calls as f64 / into_calls
        } else {
            0.0
        }
    }

    fn visit(&mut self, edge: &'a CallEdge, share: f64, symbols: &mut Vec<&'a str>) {
        if self.ends.len() >= MAX_PATHS {
            self.truncated = true;
            return;
        }
        symbols.push(&edge.callee);
        self.ends.push(PathEnd {
            symbols: symbols.clone(),
            edge,
            share,
        });
        if symbols.len() < MAX_DEPTH {
            let child_share = self.child_share(edge, share);
            let children = self
                .out
                .get(&(edge.pid, edge.callee.as_str()))
                .cloned()
                .unwrap_or_default();
            for child in children {
                // Recursion and cycles: a function already on the path is not entered again
                // (its counts are in its own exclusive figure, apportioned over its paths).
                if symbols.contains(&child.callee.as_str()) {
                    continue;
                }
                self.visit(child, child_share, symbols);
            }
        } else {
            self.truncated = true;
        }
        symbols.pop();
    }
}

/// Process names by pid, from the processes (else the tasks) of the report.
fn comms(report: &Report) -> BTreeMap<u32, &str> {
    let mut names: BTreeMap<u32, &str> = report
        .tasks
        .iter()
        .filter(|task| task.tid == task.tgid)
        .map(|task| (task.tgid, task.comm.as_str()))
        .collect();
    for process in &report.processes {
        names.insert(process.pid, process.comm.as_str());
    }
    names
}

fn function_stacks(report: &Report, result: &mut Stacks) {
    // Functions of one process with the same printed name (the same symbol in two binaries)
    // are one node of the tree: edges name their callee by symbol only.
    let mut functions: BTreeMap<FunctionKey<'_>, Vec<&FunctionEntry>> = BTreeMap::new();
    for function in &report.functions {
        functions
            .entry((function.pid, function.symbol.as_str()))
            .or_default()
            .push(function);
    }
    let mut walk = Walk {
        report,
        out: BTreeMap::new(),
        into_weight: BTreeMap::new(),
        into_calls: BTreeMap::new(),
        ends: Vec::new(),
        truncated: false,
    };
    for edge in &report.call_tree {
        if let Some(caller) = &edge.caller {
            walk.out
                .entry((edge.pid, caller.as_str()))
                .or_default()
                .push(edge);
        }
        if edge.caller.as_deref() != Some(edge.callee.as_str()) {
            let key = (edge.pid, edge.callee.as_str());
            *walk.into_weight.entry(key).or_default() += walk.weight(edge);
            *walk.into_calls.entry(key).or_default() += edge.calls as f64;
        }
    }
    let mut symbols = Vec::new();
    for root in report.call_tree.iter().filter(|edge| edge.caller.is_none()) {
        walk.visit(root, 1.0, &mut symbols);
    }
    result.truncated = walk.truncated;

    let mut ends_of: BTreeMap<FunctionKey<'_>, Vec<&PathEnd<'_>>> = BTreeMap::new();
    for end in &walk.ends {
        ends_of
            .entry((end.edge.pid, end.edge.callee.as_str()))
            .or_default()
            .push(end);
    }
    let comms = comms(report);
    let file_of = |pid: Option<u32>, symbol: &str| {
        functions
            .get(&(pid, symbol))
            .and_then(|entries| entries.first())
            .map(|function| function.target.clone())
    };
    for (key, entries) in &functions {
        let calls: u64 = entries.iter().map(|function| function.calls).sum();
        let weight: u64 = entries
            .iter()
            .map(|function| weight_of(report, &function.exclusive))
            .sum();
        let mut categories = vec![0; result.categories.len()];
        for function in entries {
            let own = weight_of(report, &function.exclusive);
            for (total, value) in categories.iter_mut().zip(category_values(
                &result.categories,
                &function.exclusive,
                own,
            )) {
                *total += value;
            }
        }
        let labels = Labels {
            pid: key.0,
            comm: key
                .0
                .and_then(|pid| comms.get(&pid))
                .map(|c| (*c).to_owned()),
            ..Labels::default()
        };
        let paths: Vec<(Vec<StackFrame>, f64, f64)> = match ends_of.get(key) {
            Some(ends) => ends
                .iter()
                .map(|end| {
                    let frames = end
                        .symbols
                        .iter()
                        .map(|symbol| StackFrame {
                            name: (*symbol).to_owned(),
                            file: file_of(key.0, symbol),
                        })
                        .collect();
                    (
                        frames,
                        end.share * walk.weight(end.edge),
                        end.share * end.edge.calls as f64,
                    )
                })
                .collect(),
            // Not in the call tree (never called, or its edges did not fit the map): a stack
            // of its own, so the totals stay whole.
            None => vec![(
                vec![StackFrame {
                    name: key.1.to_owned(),
                    file: file_of(key.0, key.1),
                }],
                1.0,
                1.0,
            )],
        };
        let by_weight: Vec<f64> = paths.iter().map(|(_, weight, _)| *weight).collect();
        let by_calls: Vec<f64> = paths.iter().map(|(_, _, calls)| *calls).collect();
        // Weight and categories follow the paths' weight (their calls where nothing weighs).
        let weight_split = if by_weight.iter().any(|w| *w > 0.0) {
            &by_weight
        } else {
            &by_calls
        };
        let weights = apportion(weight, weight_split);
        let call_parts = apportion(calls, &by_calls);
        let category_parts: Vec<Vec<u64>> = categories
            .iter()
            .map(|total| apportion(*total, weight_split))
            .collect();
        for (index, (frames, _, _)) in paths.into_iter().enumerate() {
            let stack = Stack {
                frames,
                labels: labels.clone(),
                calls: call_parts[index],
                weight: weights[index],
                categories: category_parts.iter().map(|parts| parts[index]).collect(),
            };
            if stack.calls > 0 || stack.weight > 0 {
                result.stacks.push(stack);
            }
        }
    }
}

fn entity_stack(
    report: &Report,
    categories: &[String],
    frames: Vec<StackFrame>,
    labels: Labels,
    entity: &Entity,
) -> Stack {
    let weight = weight_of(report, entity);
    Stack {
        frames,
        labels,
        calls: 0,
        weight,
        categories: category_values(categories, entity, weight),
    }
}

fn named(name: String) -> StackFrame {
    StackFrame { name, file: None }
}

fn task_stacks(report: &Report, result: &mut Stacks) {
    let comms = comms(report);
    for task in &report.tasks {
        let process = comms.get(&task.tgid).copied().unwrap_or(task.comm.as_str());
        let frames = vec![
            named(format!("{process} [{}]", task.tgid)),
            named(format!("{} [{}]", task.comm, task.tid)),
        ];
        let labels = Labels {
            pid: Some(task.tgid),
            tid: Some(task.tid),
            comm: Some(task.comm.clone()),
            cgroup: None,
        };
        let stack = entity_stack(report, &result.categories, frames, labels, &task.entity);
        result.stacks.push(stack);
    }
}

fn process_stacks(report: &Report, result: &mut Stacks) {
    for process in &report.processes {
        let frames = vec![named(format!("{} [{}]", process.comm, process.pid))];
        let labels = Labels {
            pid: Some(process.pid),
            comm: Some(process.comm.clone()),
            ..Labels::default()
        };
        let stack = entity_stack(report, &result.categories, frames, labels, &process.entity);
        result.stacks.push(stack);
    }
}

/// One stack per cgroup, its path's components as frames. With `--cgroup-depth` each entry
/// includes its descendants' counts: their own entries are taken off so each count is in one
/// stack only.
fn cgroup_stacks(report: &Report, result: &mut Stacks) {
    let path_of = |id: u64, path: Option<&String>| match path {
        Some(path) => path.clone(),
        None => format!("(cgroup {id})"),
    };
    let paths: Vec<String> = report
        .cgroups
        .iter()
        .map(|cgroup| path_of(cgroup.id, cgroup.path.as_ref()))
        .collect();
    for (cgroup, path) in report.cgroups.iter().zip(&paths) {
        let mut entity = cgroup.entity.clone();
        if report.cgroup_depth.is_some() {
            for (child, child_path) in report.cgroups.iter().zip(&paths) {
                if parent_of(child_path) == Some(path.as_str()) {
                    for (name, value) in &child.entity.counters {
                        if let Some(own) = entity.counters.get_mut(name) {
                            *own = own.saturating_sub(*value);
                        }
                    }
                }
            }
        }
        let mut frames: Vec<StackFrame> = path
            .split('/')
            .filter(|part| !part.is_empty())
            .map(|part| named(part.to_owned()))
            .collect();
        frames.insert(0, named("/".to_owned()));
        let labels = Labels {
            cgroup: Some(path.clone()),
            ..Labels::default()
        };
        // The metrics stay the entry's own fractions: with a roll-up they describe the whole
        // subtree, the closest the report has to the cgroup's own mix.
        let stack = entity_stack(report, &result.categories, frames, labels, &entity);
        result.stacks.push(stack);
    }
}

fn parent_of(path: &str) -> Option<&str> {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return None;
    }
    match trimmed.rfind('/') {
        Some(0) => Some("/"),
        Some(at) => Some(&trimmed[..at]),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::report_of;

    #[test]
    fn apportion_keeps_every_unit() {
        assert_eq!(apportion(10, &[1.0, 1.0, 1.0]), vec![4, 3, 3]);
        assert_eq!(apportion(7, &[0.0, 2.0, 5.0]), vec![0, 2, 5]);
        assert_eq!(apportion(5, &[0.0, 0.0]), vec![3, 2]);
        assert_eq!(apportion(0, &[1.0, 2.0]), vec![0, 0]);
        assert_eq!(apportion(3, &[]), Vec::<u64>::new());
        // 100 over thirds: 33.33 each, the remainder to the lowest index of equal remainders.
        assert_eq!(apportion(100, &[1.0, 1.0, 1.0]), vec![34, 33, 33]);
        let big = apportion(u64::MAX, &[1.0, 3.0]);
        assert_eq!(
            big.iter().map(|v| *v as u128).sum::<u128>(),
            u64::MAX as u128
        );
    }

    #[test]
    fn cgroup_parents() {
        assert_eq!(parent_of("/a/b"), Some("/a"));
        assert_eq!(parent_of("/a"), Some("/"));
        assert_eq!(parent_of("/"), None);
    }

    fn edge(caller: Option<&str>, callee: &str, calls: u64, slots: u64) -> CallEdge {
        CallEdge {
            caller: caller.map(str::to_owned),
            callee: callee.into(),
            pid: None,
            calls,
            inclusive: Entity {
                counters: [("slots".to_owned(), slots)].into(),
                ..Entity::default()
            },
        }
    }

    fn function(
        symbol: &str,
        calls: u64,
        inclusive: u64,
        exclusive: u64,
        retiring: f64,
    ) -> FunctionEntry {
        let entity = |slots: u64| Entity {
            counters: [("slots".to_owned(), slots)].into(),
            metrics: [
                ("retiring".to_owned(), Some(retiring)),
                ("bad_speculation".to_owned(), Some(0.0)),
                ("frontend_bound".to_owned(), Some(0.0)),
                ("backend_bound".to_owned(), Some(1.0 - retiring)),
            ]
            .into(),
            ..Entity::default()
        };
        FunctionEntry {
            target: "/bin/app".into(),
            symbol: symbol.into(),
            pid: None,
            calls,
            unwound: 0,
            return_probe: None,
            return_probe_reason: None,
            entry_single_step: false,
            inclusive: entity(inclusive),
            exclusive: entity(exclusive),
            distribution: None,
        }
    }

    /// main -> a (2 calls, 300 slots) and main -> b (1 call, 100 slots), both -> leaf: leaf's
    /// exclusive 90 splits over its two paths by their edges' shares (a: 60 of 90 incoming, b:
    /// 30), flat sums stay whole, and every stack carries its own retiring part.
    #[test]
    fn shared_callees_split_by_their_paths_share() {
        let mut report = report_of("intel-icl", 1);
        report.weight_counter = "slots".into();
        report.functions = vec![
            function("main", 1, 1000, 600, 0.5),
            function("a", 2, 300, 240, 1.0),
            function("b", 1, 100, 70, 0.0),
            function("leaf", 3, 90, 90, 0.5),
        ];
        report.call_tree = vec![
            edge(None, "main", 1, 1000),
            edge(Some("main"), "a", 2, 300),
            edge(Some("main"), "b", 1, 100),
            edge(Some("a"), "leaf", 2, 60),
            edge(Some("b"), "leaf", 1, 30),
        ];
        let stacks = stacks(&report, &[]).unwrap();
        let lines: Vec<(String, u64, u64, Vec<u64>)> = stacks
            .stacks
            .iter()
            .map(|stack| {
                let path: Vec<&str> = stack.frames.iter().map(|f| f.name.as_str()).collect();
                (
                    path.join(";"),
                    stack.calls,
                    stack.weight,
                    stack.categories.clone(),
                )
            })
            .collect();
        assert_eq!(
            stacks.categories,
            [
                "retiring",
                "bad_speculation",
                "frontend_bound",
                "backend_bound"
            ]
        );
        assert_eq!(
            lines,
            vec![
                ("main;a".to_owned(), 2, 240, vec![240, 0, 0, 0]),
                ("main;b".to_owned(), 1, 70, vec![0, 0, 0, 70]),
                ("main;a;leaf".to_owned(), 2, 60, vec![30, 0, 0, 30]),
                ("main;b;leaf".to_owned(), 1, 30, vec![15, 0, 0, 15]),
                ("main".to_owned(), 1, 600, vec![300, 0, 0, 300]),
            ]
        );
        let total: u64 = stacks.stacks.iter().map(|s| s.weight).sum();
        assert_eq!(total, 600 + 240 + 70 + 90);
    }

    /// A function missing from the call tree still has its own stack; a report without
    /// functions follows `--by`.
    #[test]
    fn functions_outside_the_tree_and_other_breakdowns() {
        let mut report = report_of("intel-icl", 1);
        report.call_tree.clear();
        let found = stacks(&report, &[]).unwrap();
        assert_eq!(found.stacks.len(), 2);
        assert_eq!(found.stacks[0].frames[0].name, "malloc");
        assert_eq!(found.stacks[1].labels.pid, Some(100));
        assert_eq!(found.stacks[1].labels.comm.as_deref(), Some("server"));

        report.functions.clear();
        let tasks = stacks(&report, &[By::Task]).unwrap();
        assert_eq!(tasks.stacks.len(), 2);
        assert_eq!(tasks.stacks[0].frames[0].name, "server [100]");
        assert_eq!(tasks.stacks[0].frames[1].name, "worker, \"one\" [101]");
        assert_eq!(tasks.stacks[0].labels.tid, Some(101));
        let cgroups = stacks(&report, &[By::Cgroup]).unwrap();
        let names: Vec<&str> = cgroups.stacks[0]
            .frames
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(names, ["/", "system.slice", "a, \"b\".service"]);
        report.tasks.clear();
        report.processes.clear();
        report.cgroups.clear();
        let err = stacks(&report, &[By::Task]).unwrap_err();
        assert!(err.to_string().contains("nothing to write"), "{err}");
    }
}
