//! The human-readable table: a TopDown breakdown per task and per process, sorted by the
//! model's weight counter (slots, or on-CPU time), with totals and the diagnostics that say how
//! far to trust the numbers.

use anyhow::{Context as _, Result};

use std::{
    collections::{HashMap, HashSet},
    io::Write,
};

use super::{
    By, CallEdge, Entity, Report,
    layout::{
        Cells, Columns, count_notes, layout, layout_twice, metric_cells, share_cell, title,
        weight_cell,
    },
};
use crate::model::{L1_METRICS, L2_METRICS, Name};

pub fn write_table(report: &Report, by: &[By], out: &mut dyn std::io::Write) -> Result<()> {
    // Line by line into `out`: the table of every thread is not held whole.
    let mut buffered = std::io::BufWriter::with_capacity(1 << 16, out);
    write_table_text(report, by, &mut buffered)
        .and_then(|()| buffered.flush())
        .context("writing the report")
}

/// The table as one string (for tests).
#[cfg(test)]
fn table_text(report: &Report, by: &[By]) -> String {
    let mut bytes = Vec::new();
    let written = write_table_text(report, by, &mut bytes);
    assert!(written.is_ok(), "{written:?}");
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The first lines' warning that a synthetic run measured no hardware (the report's, `diff`'s).
pub(crate) const SYNTHETIC_BANNER: &str = "!! SYNTHETIC COUNTERS: syscall tracepoints stand in for hardware events; not a hardware measurement\n";

/// What the figures of a run at `level` are, for a heading: level 0 is the software model's
/// on-CPU time alone.
pub(crate) fn level_text(level: u8) -> String {
    if level > 0 {
        format!("TopDown level {level}")
    } else {
        "on-CPU time (no TopDown)".to_owned()
    }
}

/// Starts a row of a table with three key columns, whose key is `label` in key column `column`
/// (the others empty).
fn label_row(rows: &mut dyn Cells, column: usize, label: &str) {
    rows.row();
    for key_column in 0..3 {
        rows.cell(if key_column == column { label } else { "" });
    }
}

/// Writes `text` out and empties it: before a table laid out straight into `out`.
fn spill(text: &mut String, out: &mut dyn Write) -> std::io::Result<()> {
    out.write_all(text.as_bytes())?;
    text.clear();
    Ok(())
}

fn write_table_text(report: &Report, by: &[By], out: &mut dyn Write) -> std::io::Result<()> {
    let mut text = String::new();
    let interval = report
        .interval
        .as_ref()
        .map(|i| format!(" interval {} (ends at {:.3} s)", i.index, i.end_s))
        .unwrap_or_default();
    text += &format!(
        "topdown: model {}, {}, {}, {:.3} s{interval}\n",
        report.model,
        level_text(report.level),
        report.scope,
        report.duration_s,
    );
    if report.synthetic {
        text += SYNTHETIC_BANNER;
        let map: Vec<String> = report
            .counter_names
            .iter()
            .filter_map(|name| {
                report
                    .synthetic_map
                    .get(name)
                    .map(|tracepoint| format!("{name}={tracepoint}"))
            })
            .collect();
        text += &format!("   {}\n", map.join(" "));
    }
    // A model's extra level-1 buckets (AMD's smt_contention) follow the standard four; dotted
    // names (a hybrid model's per-core-type split) stay in JSON.
    let extra_level_one: Vec<&str> = report
        .totals
        .metrics
        .keys()
        .map(Name::as_str)
        .filter(|name| {
            !name.contains('.') && !L1_METRICS.contains(name) && !L2_METRICS.contains(name)
        })
        .collect();
    let metrics: Vec<&str> = match report.level {
        0 => Vec::new(),
        1 => L1_METRICS.iter().copied().chain(extra_level_one).collect(),
        _ => L1_METRICS
            .iter()
            .copied()
            .chain(extra_level_one)
            .chain(L2_METRICS.iter().copied())
            .collect(),
    };
    let mut any_estimated = false;
    let weight = report.weight_counter.as_str();
    // With `-- CMD` shares are of the command's run; what was counted around it is listed
    // apart, labelled, without a share.
    let share_base = report.command.as_ref().unwrap_or(&report.totals);
    let total_weight = share_base.count(weight);
    let weight_title = if weight == "cpu-clock" {
        "cpu ms".to_owned()
    } else {
        weight.to_owned()
    };

    // Each entity's figures, as cells of its row.
    let cells_of = |rows: &mut dyn Cells, entity: &Entity, shared: bool| {
        let value = entity.count(weight);
        if weight == "cpu-clock" {
            rows.cell_fmt(format_args!("{:.3}", value as f64 / 1e6));
        } else {
            rows.cell_fmt(format_args!("{value}"));
        }
        if total_weight == 0 || !shared {
            rows.cell("-");
        } else {
            rows.cell_fmt(format_args!(
                "{:.1}%",
                100.0 * value as f64 / total_weight as f64
            ));
        }
        for name in &metrics {
            match entity.metrics.get(name).copied().flatten() {
                Some(fraction) if entity.estimated.iter().any(|e| e == name) => {
                    rows.cell_fmt(format_args!("~{:.1}%", 100.0 * fraction));
                }
                Some(fraction) => rows.cell_fmt(format_args!("{:.1}%", 100.0 * fraction)),
                None => rows.cell("-"),
            }
        }
        for event in &report.extra_events {
            let count = entity.count(event);
            rows.cell_fmt(format_args!("{count}"));
        }
        for figure in &report.derived {
            match entity.derived.get(&figure.name) {
                Some(value) => rows.cell_fmt(format_args!("{value:.1}")),
                None => rows.cell("-"),
            }
        }
    };
    any_estimated |= report
        .totals
        .estimated
        .iter()
        .any(|name| metrics.contains(&name.as_str()));
    let mut header_tail = vec![weight_title.clone(), "share".to_owned()];
    header_tail.extend(metrics.iter().map(|name| title(name).to_owned()));
    header_tail.extend(report.extra_events.iter().cloned());
    header_tail.extend(
        report
            .derived
            .iter()
            .map(|figure| format!("{} ({})", figure.name, figure.unit)),
    );

    let counted = |entity: &Entity| entity.counters.values().any(|&v| v != 0);
    // (label, entity, whether it is part of what the shares are of).
    let mut summary: Vec<(String, &Entity, bool)> = Vec::new();
    match &report.command {
        None => {
            summary.push(("total".to_owned(), &report.totals, true));
            summary.push(("idle".to_owned(), &report.idle, true));
            if counted(&report.untracked) {
                summary.push((
                    "untracked (outside scope)".to_owned(),
                    &report.untracked,
                    true,
                ));
            }
            if counted(&report.dropped) {
                summary.push(("dropped (task map full)".to_owned(), &report.dropped, true));
            }
        }
        Some(command) => {
            if counted(&report.dropped) {
                summary.push(("dropped (task map full)".to_owned(), &report.dropped, true));
            }
            summary.push(("command total".to_owned(), command, true));
            if counted(&report.untracked) {
                summary.push((
                    "other tasks during its run".to_owned(),
                    &report.untracked,
                    false,
                ));
            }
            if counted(&report.idle) {
                summary.push(("idle during its run".to_owned(), &report.idle, false));
            }
            if report.totals.counters != command.counters {
                summary.push(("all CPUs during its run".to_owned(), &report.totals, false));
            }
            if let Some(before) = &report.before_command {
                let label = if report.probe_compensation.is_some() {
                    "before it (start-up, probe calibration)"
                } else {
                    "before it (start-up)"
                };
                summary.push((label.to_owned(), before, false));
            }
        }
    }

    // The summary's rows under a table with three key columns, labelled in key column
    // `column`.
    let summary_rows = |rows: &mut dyn Cells, column: usize| {
        for (label, entity, shared) in &summary {
            label_row(rows, column, label);
            cells_of(rows, entity, *shared);
        }
    };
    // A table whose three key columns are `keys`, `text_columns` of them text, after `title`.
    let mut table = |title: &str, keys: [&str; 3], text_columns, rows: &dyn Fn(&mut dyn Cells)| {
        let header: Vec<String> = keys
            .iter()
            .map(|key| (*key).to_owned())
            .chain(header_tail.iter().cloned())
            .collect();
        text += title;
        spill(&mut text, out)?;
        layout_twice(out, &header, text_columns, rows)
    };

    if by.contains(&By::Task) {
        let rows = |rows: &mut dyn Cells| {
            for task in &report.tasks {
                rows.row();
                rows.cell_fmt(format_args!("{}", task.tid));
                rows.cell_fmt(format_args!("{}", task.tgid));
                rows.cell_fmt(format_args!(
                    "{}{}",
                    task.comm,
                    if task.exited { " (exited)" } else { "" }
                ));
                cells_of(rows, &task.entity, true);
            }
            summary_rows(rows, 2);
        };
        table("\nTasks\n", ["TID", "PID", "COMM"], 2, &rows)?;
    }
    if by.contains(&By::Process) {
        let rows = |rows: &mut dyn Cells| {
            for process in &report.processes {
                rows.row();
                rows.cell_fmt(format_args!("{}", process.pid));
                rows.cell(&process.comm);
                rows.cell_fmt(format_args!("{}", process.threads));
                cells_of(rows, &process.entity, true);
            }
            summary_rows(rows, 1);
        };
        table("\nProcesses\n", ["PID", "COMM", "THREADS"], 1, &rows)?;
    }

    if by.contains(&By::Cgroup) {
        let rows = |rows: &mut dyn Cells| {
            for cgroup in &report.cgroups {
                rows.row();
                rows.cell_fmt(format_args!("{}", cgroup.id));
                rows.cell(match &cgroup.path {
                    Some(path) => path,
                    None if cgroup.id == 0 => "(cgroup map full)",
                    None => "(unknown)",
                });
                match &cgroup.container {
                    Some(info) => rows.cell(&info.label()),
                    None => rows.cell(""),
                }
                cells_of(rows, &cgroup.entity, true);
            }
            label_row(rows, 1, "idle");
            cells_of(rows, &report.idle, report.command.is_none());
        };
        let title = match report.cgroup_depth {
            Some(depth) => {
                format!("\nCgroups (rolled up to depth {depth}: each includes its descendants)\n")
            }
            None => "\nCgroups\n".to_owned(),
        };
        table(&title, ["CGROUP ID", "PATH", "CONTAINER"], 3, &rows)?;
    }

    let columns = Columns {
        metrics: &metrics,
        weight,
        weight_title: &weight_title,
        total_weight,
    };
    if by.contains(&By::Function) && !report.functions.is_empty() {
        text += &functions_text(report, &columns);
    }
    if by.contains(&By::Span) || !report.usdt.is_empty() {
        text += &super::table_spans::spans_text(report, &columns);
    }

    if any_estimated {
        text += "note: ~ marks estimates: those counters took turns on the PMU and were scaled by the time each group counted (enabled/running)\n";
    }
    let d = &report.diagnostics;
    if d.overflows
        + d.missed_returns
        + d.unmatched_returns
        + d.probe_read_failures
        + d.probe_map_full
        > 0
    {
        text += &format!(
            "note: function probes: {} entries beyond 64 nested calls (not recorded), {} calls whose end was not seen (longjmp, exit() inside; not in the totals), {} unmatched returns, {} inconsistent reads, {} map-full drops\n",
            d.overflows,
            d.missed_returns,
            d.unmatched_returns,
            d.probe_read_failures,
            d.probe_map_full
        );
    }
    count_notes(
        &mut text,
        &[
            (
                d.tail_calls_cut,
                "note: {n} probed calls ended in a tail call to a function whose end cannot be known (its returns are not probed): their inclusive figures stop at the jump\n",
            ),
            (
                d.histogram_full,
                "note: {n} probed calls are in the function totals but in no per-call distribution (the histogram map was full): raise --max-buckets\n",
            ),
            (
                d.goroutine_switches_lost,
                "note: {n} times a goroutine with probed calls open was found on another thread without its leaving the last one seen: what it ran there is not in those calls\n",
            ),
            (
                d.cgroup_map_full,
                "note: the cgroup map was full {n} times: raise --max-cgroups\n",
            ),
            (
                d.unsplit_migrations,
                "note: {n} processes moved themselves to another cgroup from one topdown had not seen: \
                 their counts since the last reading on their CPU went to the cgroup they moved to\n",
            ),
            (
                d.unseen_arrivals,
                "note: {n} readings credited a traced task that arrived through a switch the kernel did not report, after switches no reading covered: \
                 what ran on its CPU since the last reading, untraced tasks included, is in its counts (docs/accuracy.md)\n",
            ),
        ],
    );
    if d.not_running_readings > 0 {
        text += &format!(
            "\nnote: {} of {} readings found the counter group not running the whole time (multiplexed): those deltas cover less time\n",
            d.not_running_readings, d.readings
        );
    }
    count_notes(
        &mut text,
        &[
            (
                d.read_errors,
                "note: {n} counter readings failed; their counts went to the next successful reading\n",
            ),
            (
                d.task_map_full,
                "note: the task map was full {n} times (counts under 'dropped'): raise --max-tasks\n",
            ),
            (
                d.exit_records_lost,
                "note: {n} exit records did not fit the ring buffer; they were collected from the task map\n",
            ),
            (
                d.unsplit_tasks,
                "note: {n} task(s) of the command could not be split from its main thread (still running at the end, or exit readings lost): their counts are in the main thread's row\n",
            ),
        ],
    );
    out.write_all(text.as_bytes())
}

/// The per-function table (metrics of the exclusive counts: what the function itself did) and
/// the call tree of probed functions.
fn functions_text(report: &Report, columns: &Columns<'_>) -> String {
    let weight = columns.weight;
    let amount = |entity: &Entity| entity.count(weight);
    let show = |value: u64| weight_cell(weight, value);
    let split = report
        .functions
        .iter()
        .any(|function| function.pid.is_some());
    let mut header = vec!["FUNCTION".to_owned(), "TARGET".to_owned()];
    if split {
        header.push("PID".to_owned());
    }
    header.extend([
        "CALLS".to_owned(),
        format!("incl {}", columns.weight_title),
        format!("excl {}", columns.weight_title),
        "incl share".to_owned(),
    ]);
    header.extend(
        columns
            .metrics
            .iter()
            .map(|name| format!("excl {}", title(name))),
    );
    // Probed functions never called are in the JSON (`calls: 0`); here they are one count, so
    // a glob over a large library does not fill the screen with zero rows.
    let uncalled = report
        .functions
        .iter()
        .filter(|function| function.calls == 0)
        .count();
    let rows: Vec<Vec<String>> = report
        .functions
        .iter()
        .filter(|function| function.calls > 0)
        .map(|function| {
            let target = std::path::Path::new(&function.target)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            let mut row = vec![function.symbol.clone(), target];
            if split {
                row.push(function.pid.map(|pid| pid.to_string()).unwrap_or_default());
            }
            let inclusive = amount(&function.inclusive);
            row.extend([
                if function.unwound > 0 {
                    format!("{} ({} unwound)", function.calls, function.unwound)
                } else {
                    function.calls.to_string()
                },
                show(inclusive),
                show(amount(&function.exclusive)),
                share_cell(inclusive, columns.total_weight),
            ]);
            row.extend(metric_cells(&function.exclusive, columns.metrics));
            row
        })
        .collect();
    let mut text = String::from("\nFunctions\n");
    text += &layout(&header, &rows, 4);
    if uncalled > 0 {
        text += &format!(
            "({uncalled} probed function{} not called)\n",
            if uncalled == 1 { "" } else { "s" }
        );
    }

    text += &distributions_text(report, weight, &show);

    text += "\nCall tree (probed functions; calls, inclusive ";
    text += columns.weight_title;
    text += ")\n";
    // Edges by (caller, process): the tree is walked once per edge, not once per path. The
    // recorded edges are a call graph (each knows its immediate caller only), so expanding a
    // callee under every caller that reaches it would repeat its subtree per path, which grows
    // exponentially with a dense graph (a glob over a library): a callee is expanded where it
    // is first met and later shown with "(see above)".
    let mut children: HashMap<(Option<&str>, Option<u32>), Vec<&CallEdge>> = HashMap::new();
    for edge in &report.call_tree {
        children
            .entry((edge.caller.as_deref(), edge.pid))
            .or_default()
            .push(edge);
    }
    struct Walk<'a> {
        children: HashMap<(Option<&'a str>, Option<u32>), Vec<&'a CallEdge>>,
        expanded: HashSet<(&'a str, Option<u32>)>,
        show: &'a dyn Fn(&Entity) -> String,
        text: String,
    }
    fn walk<'a>(
        walk_state: &mut Walk<'a>,
        caller: Option<&'a str>,
        pid: Option<u32>,
        depth: usize,
    ) {
        let edges = walk_state
            .children
            .get(&(caller, pid))
            .cloned()
            .unwrap_or_default();
        for edge in edges {
            let process = edge
                .pid
                .map(|pid| format!(" [pid {pid}]"))
                .unwrap_or_default();
            let first = walk_state.expanded.insert((edge.callee.as_str(), edge.pid));
            let has_children = walk_state
                .children
                .contains_key(&(Some(edge.callee.as_str()), edge.pid));
            let line = format!(
                "{}{}{process}  calls {}  {}{}\n",
                "  ".repeat(depth + 1),
                edge.callee,
                edge.calls,
                (walk_state.show)(&edge.inclusive),
                if !first && has_children {
                    "  (callees above)"
                } else {
                    ""
                }
            );
            walk_state.text += &line;
            if first && depth < 32 {
                walk(walk_state, Some(edge.callee.as_str()), edge.pid, depth + 1);
            }
        }
    }
    let show_entity = |entity: &Entity| show(amount(entity));
    let mut walk_state = Walk {
        children,
        expanded: HashSet::new(),
        show: &show_entity,
        text,
    };
    // Roots: edges with no probed caller, in every process.
    let mut roots: Vec<Option<u32>> = report
        .call_tree
        .iter()
        .filter(|edge| edge.caller.is_none())
        .map(|edge| edge.pid)
        .collect();
    roots.dedup();
    let mut seen_roots = HashSet::new();
    for pid in roots {
        if seen_roots.insert(pid) {
            walk(&mut walk_state, None, pid, 0);
        }
    }
    walk_state.text
}

/// Per function with a distribution, a line for its fast calls (the bucket of the median
/// call) and one for its slow calls (the bucket of the 99th percentile): the per-call weight
/// there, the bucket's calls and why they take that long.
fn distributions_text(report: &Report, weight: &str, show: &dyn Fn(u64) -> String) -> String {
    let split = report
        .functions
        .iter()
        .any(|function| function.pid.is_some());
    let mut names = vec!["FUNCTION"];
    if split {
        names.push("PID");
    }
    let entries = report.functions.iter().filter_map(|function| {
        let mut name = vec![function.symbol.clone()];
        if split {
            name.push(function.pid.map(|pid| pid.to_string()).unwrap_or_default());
        }
        Some((name, function.distribution.as_ref()?))
    });
    super::table_bands::bands_text(
        "Per-call distribution (inclusive {unit} per call; p50: the median call's bucket, p99: \
         the 99th percentile's)",
        &names,
        entries,
        weight,
        show,
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::report::{
        Diagnostics, TaskEntry,
        tests::{empty_report, words_of_line},
    };

    fn entity(slots: u64, retiring: Option<f64>) -> Entity {
        Entity {
            estimated: Vec::new(),
            derived: Default::default(),
            counters: [("slots", slots)].into(),
            metrics: L1_METRICS
                .iter()
                .map(|name| {
                    (
                        (*name).to_owned(),
                        if *name == "retiring" { retiring } else { None },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn a_table_laid_out_twice_is_the_table_laid_out_from_held_cells() {
        let header: Vec<String> = ["TID", "PID", "COMM", "slots", "Retiring"]
            .map(str::to_owned)
            .to_vec();
        let rows: Vec<Vec<&str>> = vec![
            vec!["1", "1", "init", "123456", "50.0%"],
            vec!["22", "1", "wörker é", "7", "-"],
            // Past the header's columns: left out.
            vec!["333", "22", "x", "8", "~1.5%", "extra"],
            vec!["", "", "total", "123471", ""],
        ];
        for text_columns in 1..=4 {
            let held: Vec<Vec<String>> = rows
                .iter()
                .map(|row| row.iter().map(|cell| (*cell).to_owned()).collect())
                .collect();
            let expected = layout(&header, &held, text_columns);
            let mut streamed = Vec::new();
            let fill = |cells: &mut dyn Cells| {
                for row in &rows {
                    cells.row();
                    for (at, cell) in row.iter().enumerate() {
                        if at % 2 == 0 {
                            cells.cell(cell);
                        } else {
                            cells.cell_fmt(format_args!("{cell}"));
                        }
                    }
                }
            };
            let written = layout_twice(&mut streamed, &header, text_columns, &fill);
            assert!(written.is_ok(), "{written:?}");
            assert_eq!(String::from_utf8_lossy(&streamed), expected);
        }
    }

    /// The function and span sections weigh by the report's weight counter (`cpu ms` for
    /// cpu-clock), share it out of the same total as the task rows, and show the metrics.
    #[test]
    fn function_and_span_sections_show_weight_share_and_metric_columns() {
        use crate::spans::report::{SpanEntry, SpanKeyType};
        let span = SpanEntry {
            kind: "request".to_owned(),
            key: "6".to_owned(),
            key_type: SpanKeyType::Integer,
            text: None,
            calls: 4,
            abandoned: 0,
            folded: 0,
            entity: entity(100, Some(0.5)),
            abandoned_counters: None,
            distribution: None,
        };
        let report = Report {
            totals: entity(400, Some(0.5)),
            functions: vec![crate::report::FunctionEntry {
                target: "/usr/bin/server".into(),
                symbol: "parse".into(),
                pid: None,
                calls: 2,
                unwound: 0,
                return_probe: None,
                return_probe_reason: None,
                entry_single_step: false,
                inclusive: entity(200, Some(0.25)),
                exclusive: entity(100, Some(0.25)),
                distribution: None,
            }],
            spans: vec![span],
            ..empty_report()
        };
        let text = table_text(&report, &[By::Function, By::Span]);
        let words = |start: &str| words_of_line(&text, |line| line.starts_with(start));
        assert_eq!(
            words("FUNCTION"),
            [
                "FUNCTION", "TARGET", "CALLS", "incl", "slots", "excl", "slots", "incl", "share",
                "excl", "Retiring", "excl", "BadSpec", "excl", "Frontend", "excl", "Backend"
            ],
            "{text}"
        );
        assert_eq!(
            words("parse")[..6],
            ["parse", "server", "2", "200", "100", "50.0%"]
        );
        assert_eq!(words("parse")[6], "25.0%", "{text}");
        assert_eq!(
            words("SPAN")[..7],
            [
                "SPAN",
                "KEY",
                "CALLS",
                "ABANDONED",
                "slots",
                "share",
                "slots/call"
            ],
            "{text}"
        );
        assert_eq!(
            words("request")[..8],
            ["request", "6", "4", "0", "100", "25.0%", "25", "50.0%"],
            "{text}"
        );
    }

    #[test]
    fn the_heading_names_the_level_or_on_cpu_time() {
        let heading = |level: u8| {
            let text = table_text(
                &Report {
                    level,
                    ..empty_report()
                },
                &[By::Task],
            );
            text.lines().next().unwrap_or_default().to_owned()
        };
        assert_eq!(
            heading(2),
            "topdown: model intel-icl, TopDown level 2, system-wide, 1.000 s"
        );
        assert_eq!(
            heading(0),
            "topdown: model intel-icl, on-CPU time (no TopDown), system-wide, 1.000 s"
        );
    }

    #[test]
    fn a_diagnostic_is_noted_with_its_count_only_where_it_happened() {
        let report = Report {
            diagnostics: Diagnostics {
                tail_calls_cut: 7,
                not_running_readings: 3,
                readings: 10,
                task_map_full: 2,
                ..Diagnostics::default()
            },
            span_diagnostics: Some(topdown_common::usdt::SpanStats {
                arg_read_failures: 5,
                ..Default::default()
            }),
            ..empty_report()
        };
        let text = table_text(&report, &[By::Task, By::Span]);
        let notes: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with("note: "))
            .collect();
        assert_eq!(
            notes,
            [
                "note: 5 span keys could not be read from the probe's arguments (keyed 0 or empty)",
                "note: 7 probed calls ended in a tail call to a function whose end cannot be known \
                 (its returns are not probed): their inclusive figures stop at the jump",
                "note: 3 of 10 readings found the counter group not running the whole time \
                 (multiplexed): those deltas cover less time",
                "note: the task map was full 2 times (counts under 'dropped'): raise --max-tasks",
            ],
            "{text}"
        );
    }

    #[test]
    fn synthetic_banner_rows_sorted_and_percentages() {
        let report = Report {
            synthetic: true,
            synthetic_map: BTreeMap::from([(
                "slots".to_owned(),
                "syscalls:sys_enter_getppid".to_owned(),
            )]),
            totals: entity(400, Some(0.5)),
            idle: entity(0, None),
            untracked: entity(0, None),
            dropped: entity(0, None),
            tasks: vec![
                TaskEntry {
                    tid: 2,
                    tgid: 2,
                    comm: "big".into(),
                    exited: false,
                    entity: entity(300, Some(0.25)),
                },
                TaskEntry {
                    tid: 1,
                    tgid: 1,
                    comm: "small".into(),
                    exited: true,
                    entity: entity(100, None),
                },
            ],
            diagnostics: Diagnostics {
                not_running_readings: 3,
                readings: 10,
                ..Diagnostics::default()
            },
            ..empty_report()
        };
        let text = table_text(&report, &[By::Task]);
        assert!(!text.contains("command total"), "{text}");
        assert!(text.contains("!! SYNTHETIC COUNTERS"), "{text}");
        assert!(text.contains("slots=syscalls:sys_enter_getppid"));
        let big = text.find("big").unwrap();
        let small = text.find("small (exited)").unwrap();
        assert!(big < small, "sorted as given (by weight): {text}");
        assert!(
            text.lines().any(|line| line.contains("big")
                && line.contains("75.0%")
                && line.contains("25.0%")),
            "{text}"
        );
        assert!(text.contains("3 of 10 readings"));

        // `-- CMD`: shares of the command's 400; the rest of the CPUs' 1000 during its run and
        // the 900 before it are listed apart, without a share.
        let command = Report {
            totals: entity(1000, Some(0.5)),
            idle: entity(250, None),
            untracked: entity(350, None),
            command: Some(entity(400, Some(0.5))),
            before_command: Some(entity(900, None)),
            scope: "command: work".into(),
            ..report
        };
        let text = table_text(&command, &[By::Task]);
        // A row's shares: its words that end in % or are "-".
        let row = |label: &str| {
            let mut words = words_of_line(&text, |line| line.contains(label));
            words.retain(|word| word.ends_with('%') || *word == "-");
            words
        };
        assert_eq!(row("big")[0], "75.0%", "{text}");
        assert_eq!(row("command total")[0], "100.0%", "{text}");
        for label in [
            "other tasks during its run",
            "idle during its run",
            "all CPUs during its run",
            "before it (start-up)",
        ] {
            assert_eq!(row(label)[0], "-", "{label}: {text}");
        }
        assert!(text.contains(" 900 "), "{text}");
        assert!(
            !text
                .lines()
                .any(|line| line.trim_start().starts_with("total ")),
            "{text}"
        );
    }
}
