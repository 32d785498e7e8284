//! Which of a refresh's threads and processes `top` can show: the screen holds a few dozen
//! rows, and naming and evaluating every one of 100000 threads each refresh costs far more than
//! the refresh itself. The rows are picked on the aggregate's typed counts, in exactly the
//! order `view::rows` sorts the report's rows, so the report of what is kept shows the same
//! first rows as the report of everything.

use std::cmp::Ordering;

use crate::session::aggregate::{Aggregate, Naming, SlotCounts};

use super::view::{Sort, Ui, View};

/// One thread or process as `view::rows` will see it, with what decides its place.
struct Candidate<'a> {
    /// Its index in the aggregate's list.
    index: usize,
    /// `Row::weight`: the weight counter as the report names it.
    weight: u64,
    /// The weight the report sorts by (the same slot unless two slots share the name).
    report_weight: u64,
    /// tid or pid: the report's tie-break.
    id: u32,
    name: &'a str,
    /// The sorted category's fraction (-1 where the model has none, as `view::rows` does).
    fraction: f64,
}

/// What the selection reads besides the aggregate and the keys.
pub struct Shown<'n, 'a> {
    pub naming: &'n Naming<'a>,
    /// The categories `view::categories` shows at the current level.
    pub categories: &'n [String],
    /// Rows the screen can hold (more is harmless).
    pub capacity: usize,
}

/// `aggregate` with its threads and processes cut to the rows the current view can show under
/// `ui`'s sort and filter; the list not on screen keeps one entry, so the report still tells
/// "none counted" from "some counted" when a key switches to it. Cgroups are kept whole (a
/// roll-up by depth needs all of them), and so are the call edges in the functions view (the
/// function totals, and the probes' cost taken out of them, need every edge).
pub fn visible<'g>(aggregate: &'g Aggregate, ui: &Ui, shown: &Shown<'_, '_>) -> Aggregate {
    let naming = shown.naming;
    let weight_name = naming.model.weight_counter();
    // `SlotCounts::named` keeps the last of two slots of one name; the report sorts by the
    // first (`Naming::weight_slot`).
    let row_slot = naming
        .slot_names
        .iter()
        .rposition(|name| name == weight_name);
    let report_slot = naming.weight_slot();
    let category = match ui.sort {
        Sort::Category(index) => shown.categories.get(index),
        _ => None,
    };
    let filter = ui.editing.as_ref().unwrap_or(&ui.filter).to_lowercase();
    let candidate = |index: usize, id: u32, name: &'g str, counts: &SlotCounts| {
        let weight = row_slot.map_or(0, |slot| counts.get(slot));
        // `view::rows` drops rows that counted nothing and rows the filter does not match.
        if weight == 0 || (!filter.is_empty() && !name.to_lowercase().contains(&filter)) {
            return None;
        }
        let fraction = category.map_or(0.0, |category| {
            naming
                .evaluator
                .evaluate(&counts.0, naming.level)
                .metrics
                .get(category)
                .copied()
                .flatten()
                .unwrap_or(-1.0)
        });
        Some(Candidate {
            index,
            weight,
            report_weight: counts.get(report_slot),
            id,
            name,
            fraction,
        })
    };
    let mut kept = Aggregate {
        totals: aggregate.totals,
        idle: aggregate.idle,
        untracked: aggregate.untracked,
        dropped: aggregate.dropped,
        tasks: Vec::new(),
        processes: Vec::new(),
        cgroups: aggregate.cgroups.clone(),
        // Only the functions view shows the function totals; the others keep one edge, so the
        // report still tells "no calls" from "some calls".
        calls: match ui.view {
            View::Functions => aggregate.calls.clone(),
            _ => aggregate.calls.iter().take(1).copied().collect(),
        },
        // The functions view shows the selected function's distribution.
        histograms: match ui.view {
            View::Functions => aggregate.histograms.clone(),
            _ => Vec::new(),
        },
        cpus: aggregate.cpus.clone(),
        diagnostics: aggregate.diagnostics.clone(),
        spans: aggregate.spans.clone(),
    };
    match ui.view {
        View::Threads => {
            let candidates = aggregate
                .tasks
                .iter()
                .enumerate()
                .filter_map(|(index, task)| candidate(index, task.tid, &task.comm, &task.counts))
                .collect();
            let picked = best(candidates, ui.sort, shown.capacity);
            kept.tasks = pick(&aggregate.tasks, &picked);
            kept.processes = aggregate.processes.iter().take(1).cloned().collect();
        }
        View::Processes => {
            let candidates = aggregate
                .processes
                .iter()
                .enumerate()
                .filter_map(|(index, process)| {
                    candidate(index, process.pid, &process.comm, &process.counts)
                })
                .collect();
            let picked = best(candidates, ui.sort, shown.capacity);
            kept.processes = pick(&aggregate.processes, &picked);
            kept.tasks = aggregate.tasks.iter().take(1).cloned().collect();
        }
        View::Cgroups | View::Functions | View::Spans => {
            kept.tasks = aggregate.tasks.iter().take(1).cloned().collect();
            kept.processes = aggregate.processes.iter().take(1).cloned().collect();
        }
    }
    // Nothing passed the filter: one entry keeps the list non-empty (the filter hides it).
    if kept.tasks.is_empty() {
        kept.tasks = aggregate.tasks.iter().take(1).cloned().collect();
    }
    if kept.processes.is_empty() {
        kept.processes = aggregate.processes.iter().take(1).cloned().collect();
    }
    kept
}

/// The entries at `indices`, in the aggregate's order (the report sorts them itself; the
/// order of equal entries must stay the aggregate's).
fn pick<T: Clone>(entries: &[T], indices: &[usize]) -> Vec<T> {
    let mut indices = indices.to_vec();
    indices.sort_unstable();
    indices
        .iter()
        .map(|&index| entries[index].clone())
        .collect()
}

/// The indices of the `capacity` first candidates in `view::rows`' order under `sort`, ties
/// broken as the report orders its rows (weight, then id, then the aggregate's order): a
/// total order, so the first `capacity` are exactly the rows the screen shows.
fn best(mut candidates: Vec<Candidate<'_>>, sort: Sort, capacity: usize) -> Vec<usize> {
    let report_order = |a: &Candidate<'_>, b: &Candidate<'_>| {
        b.report_weight
            .cmp(&a.report_weight)
            .then(a.id.cmp(&b.id))
            .then(a.index.cmp(&b.index))
    };
    let order = |a: &Candidate<'_>, b: &Candidate<'_>| -> Ordering {
        match sort {
            Sort::Weight => b.weight.cmp(&a.weight).then(a.name.cmp(b.name)),
            Sort::Category(_) => b
                .fraction
                .total_cmp(&a.fraction)
                .then(b.weight.cmp(&a.weight))
                .then(a.name.cmp(b.name)),
            Sort::Name => a.name.cmp(b.name).then(b.weight.cmp(&a.weight)),
        }
        .then_with(|| report_order(a, b))
    };
    if candidates.len() > capacity && capacity > 0 {
        candidates.select_nth_unstable_by(capacity - 1, order);
        candidates.truncate(capacity);
    } else if capacity == 0 {
        candidates.clear();
    }
    candidates
        .into_iter()
        .map(|candidate| candidate.index)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::{
        commands::top::view::{categories, rows},
        model::base_model,
        report::Report,
        session::aggregate::{ProcessCounts, ReportContext, TaskCounts, processes_of, report_of},
    };

    /// A reproducible pseudo-random sequence (SplitMix64).
    struct Random(u64);

    impl Random {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, bound: u64) -> u64 {
            self.next() % bound
        }
    }

    /// Threads with few distinct weights and names (ties everywhere), some counting nothing,
    /// some sharing a tid (a reused one), with intel-spr level-2 counts.
    fn aggregate(random: &mut Random, tasks: usize, slots: usize) -> Aggregate {
        let names = ["worker", "Worker-2", "db", "sh", "wORKer", "idle"];
        let tasks: Vec<TaskCounts> = (0..tasks)
            .map(|index| {
                let mut counts = SlotCounts::ZERO;
                let scale = random.below(4);
                for slot in counts.0.iter_mut().take(slots) {
                    *slot = scale * (1 + random.below(3)) * 100;
                }
                let tid = 1 + random.below(tasks as u64 / 2 + 1) as u32;
                TaskCounts {
                    tid,
                    tgid: 1 + tid / 4,
                    comm: names[random.below(names.len() as u64) as usize].into(),
                    exited: index % 7 == 0,
                    counts,
                }
            })
            .collect();
        let processes: Vec<ProcessCounts> = processes_of(&tasks);
        Aggregate {
            totals: tasks.iter().map(|task| task.counts).sum(),
            tasks,
            processes,
            ..Aggregate::default()
        }
    }

    fn report(
        aggregate: &Aggregate,
        slot_names: &[String],
        model: &dyn crate::model::Model,
    ) -> Report {
        let ctx = ReportContext::system_wide_for_tests(model, slot_names.to_vec(), 2);
        report_of(&ctx, aggregate)
    }

    /// The rows drawn from the report of the kept threads and processes are the first rows of
    /// the report of everything, for every view, sort and filter.
    #[test]
    fn the_kept_rows_are_the_first_rows_of_the_whole_report() {
        let model = base_model("intel-spr").unwrap();
        let slot_names: Vec<String> = model.counters().into_iter().map(|spec| spec.name).collect();
        let no_paths = HashMap::new();
        let naming = Naming::new(model.as_ref(), &slot_names, 2, &no_paths, None, &[]);
        let mut random = Random(11);
        for round in 0..6 {
            let aggregate = aggregate(&mut random, 40 + 30 * round, slot_names.len());
            let whole = report(&aggregate, &slot_names, model.as_ref());
            for view in [View::Threads, View::Processes, View::Cgroups] {
                for level in [1, 2] {
                    let shown_categories = categories(&whole, level);
                    let sorts = [Sort::Weight, Sort::Name]
                        .into_iter()
                        .chain((0..shown_categories.len()).map(Sort::Category));
                    for sort in sorts {
                        for filter in ["", "work", "zzz"] {
                            let ui = Ui {
                                view,
                                sort,
                                filter: filter.to_owned(),
                                ..Ui::new(level)
                            };
                            for capacity in [1, 5, 17, 1000] {
                                let kept = visible(
                                    &aggregate,
                                    &ui,
                                    &Shown {
                                        naming: &naming,
                                        categories: &shown_categories,
                                        capacity,
                                    },
                                );
                                let part = report(&kept, &slot_names, model.as_ref());
                                let expected: Vec<_> = rows(&whole, &ui, &shown_categories)
                                    .into_iter()
                                    .take(capacity)
                                    .collect();
                                let got: Vec<_> = rows(&part, &ui, &shown_categories)
                                    .into_iter()
                                    .take(capacity)
                                    .collect();
                                assert_eq!(
                                    got, expected,
                                    "{view:?} {sort:?} '{filter}' {capacity}"
                                );
                                // What the keys check stays true of the cut report.
                                assert_eq!(part.tasks.is_empty(), whole.tasks.is_empty());
                                assert_eq!(part.processes.is_empty(), whole.processes.is_empty());
                                assert_eq!(part.totals, whole.totals);
                            }
                        }
                    }
                }
            }
        }
    }
}
