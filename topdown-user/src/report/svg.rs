//! `--format svg`: the probed call tree as an icicle graph (callers above their callees), each
//! frame coloured by its dominant TopDown level-1 category, and below it one 100% stacked bar
//! per function of its exclusive (own) TopDown breakdown.
//!
//! The report's call tree has one level of context per edge (caller -> callee), not whole
//! stacks. A frame is drawn for each path from a call with no probed caller down through the
//! edges; where a function has several callers, the callees under each of its frames get that
//! frame's share of the function's incoming weight, so they always fit inside it (for a true
//! tree, where every function has one caller, every width is exactly its edge's weight).

use std::{cell::Cell, collections::BTreeMap, fmt::Write as _};

pub use super::svg_parts::{
    BAR_FIGURES_WIDTH, BAR_HEIGHT, BAR_LABEL_WIDTH, CATEGORIES, CHAR_WIDTH, Category, MARGIN,
    NEUTRAL, SYNTHETIC_NOTE, WIDTH, bar_row, colour, dominant, escape, fit, frame_label,
    has_topdown, legend, svg_start, title_lines,
};
use super::{
    CallEdge, Entity, FunctionEntry, Report, Weight,
    svg_distribution::{self as distribution, Of},
};
use crate::error::{Failure, fail};

const FRAME_HEIGHT: f64 = 18.0;
/// Deeper paths are not drawn: a bound on work for pathological graphs (the probes' own
/// nesting limit is 64).
const MAX_DEPTH: usize = 64;
/// Paths walked at most: a densely shared graph (`-u 'lib:*'`) has exponentially many paths;
/// past this the tree stops expanding and says it was cut.
const MAX_VISITS: usize = 200_000;
/// Frames narrower than this many pixels are not drawn (nor their callees, narrower still).
const MIN_PIXELS: f64 = 0.1;

/// One drawn frame of the icicle graph, in weight units (not pixels).
#[derive(Clone, Debug, PartialEq)]
pub struct Frame<'a> {
    pub edge: &'a CallEdge,
    pub depth: usize,
    /// Offset from the left edge of the tree.
    pub x: f64,
    pub width: f64,
    /// Fraction of the edge this frame stands for (1 unless its caller has several callers).
    pub share: f64,
}

/// The probed call tree, laid out.
pub struct Tree<'a> {
    pub frames: Vec<Frame<'a>>,
    /// Sum of the root frames' widths.
    pub total: f64,
    /// More paths than [`MAX_VISITS`]: deeper frames were left out.
    pub truncated: bool,
}

struct Graph<'a> {
    report: &'a Report,
    weight: Weight,
    /// (pid, caller) -> edges out of it.
    out: BTreeMap<(Option<u32>, &'a str), Vec<&'a CallEdge>>,
    /// (pid, callee) -> its edges' base values summed, recursive self-edges left out.
    into: BTreeMap<(Option<u32>, &'a str), f64>,
    visits: Cell<usize>,
    /// Frames narrower than this (in weight units) are left out.
    min_width: Cell<f64>,
}

impl<'a> Graph<'a> {
    fn new(report: &'a Report, weight: Weight) -> Self {
        let mut graph = Graph {
            report,
            weight,
            out: BTreeMap::new(),
            into: BTreeMap::new(),
            visits: Cell::new(0),
            min_width: Cell::new(0.0),
        };
        for edge in &report.call_tree {
            if let Some(caller) = &edge.caller {
                graph
                    .out
                    .entry((edge.pid, caller.as_str()))
                    .or_default()
                    .push(edge);
            }
            if edge.caller.as_deref() != Some(edge.callee.as_str()) {
                *graph
                    .into
                    .entry((edge.pid, edge.callee.as_str()))
                    .or_default() += graph.base(edge);
            }
        }
        graph
    }

    /// The edge's own value: its inclusive weight counter, or its calls.
    fn base(&self, edge: &CallEdge) -> f64 {
        match self.weight {
            Weight::Slots => edge.inclusive.count(&self.report.weight_counter) as f64,
            Weight::Calls => edge.calls as f64,
        }
    }

    /// The callee's edges down the tree, with the fraction of them a frame standing for
    /// `share` of `edge` gets. Callees already on `stack` (recursion, cycles) are left out.
    fn children(&self, edge: &'a CallEdge, share: f64, stack: &[&str]) -> Vec<(&'a CallEdge, f64)> {
        self.visits.set(self.visits.get() + 1);
        if stack.len() >= MAX_DEPTH || self.visits.get() > MAX_VISITS {
            return Vec::new();
        }
        let into = self
            .into
            .get(&(edge.pid, edge.callee.as_str()))
            .copied()
            .unwrap_or(0.0);
        if into <= 0.0 {
            return Vec::new();
        }
        let child_share = share * self.base(edge) / into;
        self.out
            .get(&(edge.pid, edge.callee.as_str()))
            .into_iter()
            .flatten()
            .filter(|child| !stack.contains(&child.callee.as_str()) && child.callee != edge.callee)
            .map(|child| (*child, child_share))
            .collect()
    }

    /// A frame's width: with slots its share of the edge's inclusive count; with calls its
    /// share of the edge's calls plus its callees' frames, so callees nest inside.
    fn measure(&self, edge: &'a CallEdge, share: f64, stack: &mut Vec<&'a str>) -> f64 {
        let own = share * self.base(edge);
        match self.weight {
            Weight::Slots => own,
            Weight::Calls => {
                stack.push(&edge.callee);
                let children: f64 = self
                    .children(edge, share, stack)
                    .into_iter()
                    .map(|(child, share)| self.measure(child, share, stack))
                    .sum();
                stack.pop();
                own + children
            }
        }
    }

    fn place(
        &self,
        edge: &'a CallEdge,
        share: f64,
        x: f64,
        width: f64,
        stack: &mut Vec<&'a str>,
        frames: &mut Vec<Frame<'a>>,
    ) {
        frames.push(Frame {
            edge,
            depth: stack.len(),
            x,
            width,
            share,
        });
        stack.push(&edge.callee);
        let mut children: Vec<(&CallEdge, f64, f64)> = self
            .children(edge, share, stack)
            .into_iter()
            .map(|(child, share)| (child, share, self.measure(child, share, stack)))
            .filter(|(_, _, width)| *width > 0.0 && *width >= self.min_width.get())
            .collect();
        // Inclusive counts of callees can exceed their caller's by rounding in the kernel's
        // reads; squeeze them in rather than draw past the caller.
        let sum: f64 = children.iter().map(|(_, _, width)| width).sum();
        let squeeze = if sum > width { width / sum } else { 1.0 };
        sort_by_weight(&mut children);
        let mut offset = x;
        for (child, child_share, child_width) in children {
            let child_width = child_width * squeeze;
            self.place(
                child,
                child_share * squeeze,
                offset,
                child_width,
                stack,
                frames,
            );
            offset += child_width;
        }
        stack.pop();
    }
}

/// Heaviest first; equal weights by name, so the picture is the same run to run.
fn sort_by_weight(items: &mut [(&CallEdge, f64, f64)]) {
    items.sort_by(|a, b| {
        b.2.total_cmp(&a.2)
            .then_with(|| a.0.callee.cmp(&b.0.callee))
            .then_with(|| a.0.pid.cmp(&b.0.pid))
    });
}

/// Lays out the call tree: roots are the edges with no probed caller, heaviest leftmost.
pub fn layout(report: &Report, weight: Weight) -> Tree<'_> {
    let graph = Graph::new(report, weight);
    let mut stack = Vec::new();
    let mut roots: Vec<(&CallEdge, f64, f64)> = report
        .call_tree
        .iter()
        .filter(|edge| edge.caller.is_none())
        .map(|edge| (edge, 1.0, graph.measure(edge, 1.0, &mut stack)))
        .filter(|(_, _, width)| *width > 0.0)
        .collect();
    sort_by_weight(&mut roots);
    let total: f64 = roots.iter().map(|(_, _, width)| width).sum();
    graph
        .min_width
        .set(total * MIN_PIXELS / (WIDTH - 2.0 * MARGIN));
    let mut frames = Vec::new();
    let mut x = 0.0;
    for (edge, share, width) in roots {
        graph.place(edge, share, x, width, &mut stack, &mut frames);
        x += width;
    }
    Tree {
        frames,
        total: x,
        truncated: graph.visits.get() > MAX_VISITS,
    }
}

/// A function's name, with its process where the report holds more than one.
fn label(symbol: &str, pid: Option<u32>, show_pid: bool) -> String {
    match pid {
        Some(pid) if show_pid => format!("{symbol} [{pid}]"),
        _ => symbol.to_owned(),
    }
}

/// Whether functions of more than one process are in the report (`--by function,task`).
fn several_processes(report: &Report) -> bool {
    let mut pids = report.functions.iter().map(|function| function.pid);
    let first = pids.next().flatten();
    pids.any(|pid| pid != first)
}

fn metric_lines(entity: &Entity, out: &mut String) {
    for (name, value) in &entity.metrics {
        match value {
            Some(value) => {
                let _ = write!(out, "\n{name}: {value:.3}");
            }
            None => {
                let _ = write!(out, "\n{name}: n/a");
            }
        }
    }
}

fn frame_tooltip(
    report: &Report,
    frame: &Frame<'_>,
    total: f64,
    weight: Weight,
    show_pid: bool,
) -> String {
    let edge = frame.edge;
    let mut text = label(&edge.callee, edge.pid, show_pid);
    let _ = write!(
        text,
        "\ncalled from {}",
        edge.caller.as_deref().unwrap_or("no probed function")
    );
    let _ = write!(text, "\ncalls: {}", edge.calls);
    let counted = edge.inclusive.count(&report.weight_counter);
    let _ = write!(text, "\ninclusive {}: {counted}", report.weight_counter);
    let unit = match weight {
        Weight::Slots => report.weight_counter.as_str(),
        Weight::Calls => "probed calls",
    };
    let percent = if total > 0.0 {
        100.0 * frame.width / total
    } else {
        0.0
    };
    let _ = write!(text, "\nwidth: {percent:.2}% of all {unit}");
    // With `-- CMD`: what this frame's calls are of the command's whole run.
    let command = report
        .command
        .as_ref()
        .and_then(|command| command.counters.get(&report.weight_counter).copied())
        .filter(|&whole| whole > 0);
    if let Some(whole) = command {
        let _ = write!(
            text,
            "\n{:.2}% of the command's {}",
            100.0 * frame.share * counted as f64 / whole as f64,
            report.weight_counter
        );
    }
    if frame.share < 1.0 - 1e-9 {
        let _ = write!(
            text,
            "\n(drawn at {:.1}% of this edge: {} has several callers)",
            100.0 * frame.share,
            edge.caller.as_deref().unwrap_or("")
        );
    }
    metric_lines(&edge.inclusive, &mut text);
    text
}

/// Exclusive TopDown per function, as 100% stacked bars, heaviest function first.
fn bars(report: &Report, y: f64, show_pid: bool, svg: &mut String) -> f64 {
    let mut functions: Vec<&FunctionEntry> = report
        .functions
        .iter()
        .filter(|function| function.calls > 0)
        .collect();
    let own = |function: &FunctionEntry| function.exclusive.count(&report.weight_counter);
    functions.sort_by(|a, b| {
        own(b)
            .cmp(&own(a))
            .then_with(|| a.symbol.cmp(&b.symbol))
            .then_with(|| a.pid.cmp(&b.pid))
    });
    let heading = if has_topdown(report) {
        "Exclusive TopDown per function (own work, probed callees excluded)".to_owned()
    } else {
        format!(
            "Exclusive {} per function (own work, probed callees excluded; no TopDown metrics)",
            report.weight_counter
        )
    };
    let _ = writeln!(
        svg,
        r#"<text class="heading" x="{MARGIN}" y="{}">{}</text>"#,
        y + 14.0,
        escape(&heading)
    );
    let heaviest = functions.first().map_or(0, |function| own(function)).max(1) as f64;
    let mut row_y = y + 24.0;
    for function in functions {
        let name = label(&function.symbol, function.pid, show_pid);
        let figures = format!(
            "{} {} own, {} calls",
            own(function),
            report.weight_counter,
            function.calls
        );
        bar_row(
            svg,
            &name,
            &function.exclusive,
            own(function) as f64 / heaviest,
            &figures,
            row_y,
        );
        row_y += BAR_HEIGHT + 4.0;
    }
    row_y
}

/// Writes `report` as an SVG picture of its probed call tree.
pub fn write_svg(
    report: &Report,
    weight: Weight,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    report.check_whole_run("--format svg draws")?;
    if report.functions.is_empty() {
        if !report.spans.is_empty() {
            return super::svg_spans::write_spans_svg(report, out);
        }
        return Err(fail(
            Failure::Usage,
            "--format svg draws the probed call tree or spans, and this report has neither: record with -u TARGET:FUNC, --span or --postgres",
        ));
    }
    let tree = layout(report, weight);
    let depth = tree
        .frames
        .iter()
        .map(|frame| frame.depth + 1)
        .max()
        .unwrap_or(0);
    let tree_y = 72.0;
    let show_pid = several_processes(report);
    let tree_height = depth as f64 * FRAME_HEIGHT;
    let bars_y = tree_y + tree_height + 24.0;
    let rows = report.functions.len() as f64;
    let spans_height = if report.spans.is_empty() {
        0.0
    } else {
        super::svg_spans::bars_height(report) + 24.0
    };
    let histograms_y = bars_y + 24.0 + rows * (BAR_HEIGHT + 4.0) + spans_height;
    let span_histograms_y = histograms_y + distribution::height(report, Of::Functions);
    let height = span_histograms_y + distribution::height(report, Of::Spans) + MARGIN;

    let mut svg = svg_start(height);
    let measure = match weight {
        Weight::Slots => format!("inclusive {}", report.weight_counter),
        Weight::Calls => "probed calls (own and callees')".to_owned(),
    };
    let heading = format!("Probed call tree: frame width = {measure}");
    let mut context = format!(
        "model {}, level {}, {}",
        report.model, report.level, report.scope
    );
    if let Some(command) = &report.command {
        // The figures are of the command's run, not of what topdown counted before it.
        let counted = command.count(&report.weight_counter);
        let amount = if report.weight_counter == "cpu-clock" {
            format!("{:.3} cpu ms", counted as f64 / 1e6)
        } else {
            format!("{counted} {}", report.weight_counter)
        };
        let _ = write!(
            context,
            "; the command's run: {:.3} s, {amount}",
            report.duration_s
        );
    }
    if report.synthetic {
        context.push_str(SYNTHETIC_NOTE);
    }
    if tree.truncated {
        let _ = write!(
            context,
            "; more than {MAX_VISITS} call paths: deeper frames left out"
        );
    }
    title_lines(&mut svg, 14, &heading, &context);
    legend(report, 44.0, &mut svg);

    let scale = if tree.total > 0.0 {
        (WIDTH - 2.0 * MARGIN) / tree.total
    } else {
        0.0
    };
    if tree.frames.is_empty() {
        let _ = writeln!(
            svg,
            r#"<text x="{MARGIN}" y="{}">no {} counted in probed calls</text>"#,
            tree_y + 12.0,
            escape(&measure)
        );
    }
    for frame in &tree.frames {
        let x = MARGIN + frame.x * scale;
        let width = frame.width * scale;
        let y = tree_y + frame.depth as f64 * FRAME_HEIGHT;
        let name = label(&frame.edge.callee, frame.edge.pid, show_pid);
        let _ = write!(
            svg,
            r#"<g class="frame" data-symbol="{}" data-caller="{}"><title>{}</title><rect x="{x:.3}" y="{y}" width="{width:.3}" height="{}" fill="{}" stroke="white" stroke-width="0.5"/>"#,
            escape(&name),
            escape(frame.edge.caller.as_deref().unwrap_or("")),
            escape(&frame_tooltip(report, frame, tree.total, weight, show_pid)),
            FRAME_HEIGHT - 1.0,
            colour(&frame.edge.inclusive),
        );
        frame_label(&mut svg, &name, x, y + 12.5, width);
        svg.push_str("</g>\n");
    }
    let bars_end = bars(report, bars_y, show_pid, &mut svg);
    if !report.spans.is_empty() {
        super::svg_spans::span_bars(report, bars_end + 24.0, &mut svg);
    }
    distribution::draw(report, Of::Functions, histograms_y, show_pid, &mut svg);
    distribution::draw(report, Of::Spans, span_histograms_y, show_pid, &mut svg);
    svg.push_str("</svg>\n");
    out.write_all(svg.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::failure_of;
    use crate::report::tests::report_of;

    /// An entity with `slots` and the four level-1 fractions given.
    fn entity(slots: u64, [retiring, bad, frontend, backend]: [f64; 4]) -> Entity {
        Entity {
            counters: [("slots".to_owned(), slots)].into_iter().collect(),
            metrics: [
                ("retiring", retiring),
                ("bad_speculation", bad),
                ("frontend_bound", frontend),
                ("backend_bound", backend),
            ]
            .into_iter()
            .map(|(name, value)| (name.to_owned(), Some(value)))
            .collect(),
            estimated: Vec::new(),
            derived: Default::default(),
        }
    }

    fn edge(caller: Option<&str>, callee: &str, calls: u64, inclusive: Entity) -> CallEdge {
        CallEdge {
            caller: caller.map(str::to_owned),
            callee: callee.to_owned(),
            pid: Some(100),
            calls,
            inclusive,
        }
    }

    fn function(symbol: &str, calls: u64, exclusive: Entity) -> FunctionEntry {
        FunctionEntry {
            target: "/bin/app".into(),
            symbol: symbol.into(),
            pid: Some(100),
            calls,
            unwound: 0,
            return_probe: None,
            return_probe_reason: None,
            entry_single_step: false,
            inclusive: exclusive.clone(),
            exclusive,
            distribution: None,
        }
    }

    const RETIRING: [f64; 4] = [0.6, 0.1, 0.1, 0.2];
    const BAD: [f64; 4] = [0.2, 0.5, 0.1, 0.2];
    const FRONTEND: [f64; 4] = [0.1, 0.1, 0.7, 0.1];
    const BACKEND: [f64; 4] = [0.1, 0.1, 0.1, 0.7];

    /// main-less program: a (600 slots) calls c (300) and d (100), c calls e (150); b<&"T">
    /// (200) has no probed caller either.
    fn tree_report() -> Report {
        let mut report = report_of("intel-icl", 1);
        report.interval = None;
        report.functions = vec![
            function("a", 2, entity(200, BACKEND)),
            function("b<&\"T'>", 4, entity(200, FRONTEND)),
            function("c", 3, entity(150, RETIRING)),
            function("d", 1, entity(100, BAD)),
            function("e", 5, entity(150, RETIRING)),
        ];
        report.call_tree = vec![
            edge(None, "a", 2, entity(600, BACKEND)),
            edge(None, "b<&\"T'>", 4, entity(200, FRONTEND)),
            edge(Some("a"), "c", 3, entity(300, RETIRING)),
            edge(Some("a"), "d", 1, entity(100, BAD)),
            edge(Some("c"), "e", 5, entity(150, RETIRING)),
        ];
        report
    }

    fn svg_of(report: &Report, weight: Weight) -> String {
        let mut out = Vec::new();
        write_svg(report, weight, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// `(callee, caller, depth, x, width)` of every frame, in drawing order.
    fn frames(report: &Report, weight: Weight) -> Vec<(String, Option<String>, usize, f64, f64)> {
        layout(report, weight)
            .frames
            .iter()
            .map(|frame| {
                (
                    frame.edge.callee.clone(),
                    frame.edge.caller.clone(),
                    frame.depth,
                    frame.x,
                    frame.width,
                )
            })
            .collect()
    }

    fn row(
        callee: &str,
        caller: Option<&str>,
        depth: usize,
        x: f64,
        width: f64,
    ) -> (String, Option<String>, usize, f64, f64) {
        (
            callee.to_owned(),
            caller.map(str::to_owned),
            depth,
            x,
            width,
        )
    }

    /// The `<g class="frame">` element drawn for `symbol` called from `caller`.
    fn frame_element<'s>(svg: &'s str, symbol: &str, caller: &str) -> &'s str {
        let start = format!(
            r#"<g class="frame" data-symbol="{}" data-caller="{}">"#,
            escape(symbol),
            escape(caller)
        );
        let begin = svg
            .find(&start)
            .unwrap_or_else(|| panic!("{start} not in {svg}"));
        let end = begin + svg[begin..].find("</g>").unwrap();
        &svg[begin..end]
    }

    #[test]
    fn widths_are_inclusive_slots_heaviest_first() {
        let report = tree_report();
        assert_eq!(
            frames(&report, Weight::Slots),
            vec![
                row("a", None, 0, 0.0, 600.0),
                row("c", Some("a"), 1, 0.0, 300.0),
                row("e", Some("c"), 2, 0.0, 150.0),
                row("d", Some("a"), 1, 300.0, 100.0),
                row("b<&\"T'>", None, 0, 600.0, 200.0),
            ]
        );
        // 800 slots over 1180 pixels: 1.475 pixels a slot, from the left margin of 10.
        let svg = svg_of(&report, Weight::Slots);
        for (symbol, caller, x, y, width) in [
            ("a", "", 10.0, 72.0, 885.0),
            ("c", "a", 10.0, 90.0, 442.5),
            ("e", "c", 10.0, 108.0, 221.25),
            ("d", "a", 452.5, 90.0, 147.5),
            ("b<&\"T'>", "", 895.0, 72.0, 295.0),
        ] {
            let rect = format!(r#"<rect x="{x:.3}" y="{y}" width="{width:.3}" height="17""#);
            let element = frame_element(&svg, symbol, caller);
            assert!(element.contains(&rect), "{rect} not in {element}");
        }
        assert_eq!(svg.matches(r#"<g class="frame""#).count(), 5);
    }

    #[test]
    fn calls_weight_nests_callees_calls_inside() {
        // a: its 2 calls + c's 3 + e's 5 + d's 1 = 11; b: 4.
        assert_eq!(
            frames(&tree_report(), Weight::Calls),
            vec![
                row("a", None, 0, 0.0, 11.0),
                row("c", Some("a"), 1, 0.0, 8.0),
                row("e", Some("c"), 2, 0.0, 5.0),
                row("d", Some("a"), 1, 8.0, 1.0),
                row("b<&\"T'>", None, 0, 11.0, 4.0),
            ]
        );
        let svg = svg_of(&tree_report(), Weight::Calls);
        assert!(svg.contains("frame width = probed calls (own and callees&apos;)"));
        // 15 calls over 1180 pixels.
        let element = frame_element(&svg, "b<&\"T'>", "");
        let rect = format!(
            r#"<rect x="{:.3}" y="72" width="{:.3}""#,
            10.0 + 1180.0 * 11.0 / 15.0,
            1180.0 * 4.0 / 15.0
        );
        assert!(element.contains(&rect), "{rect} not in {element}");
    }

    #[test]
    fn frames_take_their_dominant_category_colour() {
        let svg = svg_of(&tree_report(), Weight::Slots);
        for (symbol, caller, colour) in [
            ("a", "", "#fb8c00"),
            ("b<&\"T'>", "", "#7e57c2"),
            ("c", "a", "#43a047"),
            ("d", "a", "#e53935"),
        ] {
            let element = frame_element(&svg, symbol, caller);
            assert!(
                element.contains(&format!(r#"fill="{colour}""#)),
                "{symbol}: {element}"
            );
        }
        // The legend names all four categories.
        for label in [
            "Retiring",
            "Bad Speculation",
            "Frontend Bound",
            "Backend Bound",
        ] {
            assert!(svg.contains(&format!(">{label}</text>")), "{label}");
        }
    }

    #[test]
    fn names_are_escaped_everywhere() {
        let svg = svg_of(&tree_report(), Weight::Slots);
        assert!(!svg.contains("b<&"), "{svg}");
        let escaped = "b&lt;&amp;&quot;T&apos;&gt;";
        // Frame attribute, tooltip, frame label and bar label.
        assert!(svg.matches(escaped).count() >= 4, "{svg}");
        assert_eq!(escape("a\u{1}b"), "a\u{fffd}b");
    }

    #[test]
    fn tooltips_give_calls_weight_and_every_metric() {
        let mut report = tree_report();
        // With `-- CMD` a frame also says what its calls are of the command's run: 300 of 1200.
        report.command = Some(entity(1200, RETIRING));
        let svg = svg_of(&report, Weight::Slots);
        let element = frame_element(&svg, "c", "a");
        let title =
            &element[element.find("<title>").unwrap() + 7..element.find("</title>").unwrap()];
        assert_eq!(
            title,
            "c\ncalled from a\ncalls: 3\ninclusive slots: 300\nwidth: 37.50% of all slots\n\
             25.00% of the command&apos;s slots\n\
             backend_bound: 0.200\nbad_speculation: 0.100\nfrontend_bound: 0.100\nretiring: 0.600"
        );
    }

    #[test]
    fn shared_callees_split_and_cycles_stop() {
        // y has two callers (x: 80 slots, z: 20), calls itself and w; w calls x back.
        let mut report = tree_report();
        report.call_tree = vec![
            edge(None, "x", 1, entity(100, RETIRING)),
            edge(None, "z", 1, entity(100, RETIRING)),
            edge(Some("x"), "y", 1, entity(80, RETIRING)),
            edge(Some("z"), "y", 1, entity(20, RETIRING)),
            edge(Some("y"), "y", 1, entity(30, RETIRING)),
            edge(Some("y"), "w", 1, entity(50, RETIRING)),
            edge(Some("w"), "x", 1, entity(10, RETIRING)),
        ];
        // x's root frame is 100 of x's 110 incoming slots (w calls it back), so its callees get
        // 100/110 of x's edges; y then has 80 of its 100 under x, 20 under z. Under x the
        // cycle stops at w (x is on the path); under z it goes on to x once.
        let x_share = 1.0 * 100.0 / 110.0;
        let y_under_x = x_share * 80.0 / 100.0;
        assert_eq!(
            frames(&report, Weight::Slots),
            vec![
                row("x", None, 0, 0.0, 100.0),
                row("y", Some("x"), 1, 0.0, x_share * 80.0),
                row("w", Some("y"), 2, 0.0, y_under_x * 50.0),
                row("z", None, 0, 100.0, 100.0),
                row("y", Some("z"), 1, 100.0, 20.0),
                row("w", Some("y"), 2, 100.0, 10.0),
                row("x", Some("w"), 3, 100.0, 2.0),
            ]
        );
        let svg = svg_of(&report, Weight::Slots);
        // The tooltip of y under x says it stands for part of the edge.
        let element = frame_element(&svg, "y", "x");
        assert!(
            element.contains("(drawn at 90.9% of this edge: x has several callers)"),
            "{element}"
        );
    }

    /// 40 functions each calling every later one: 2^38 paths. The walk stops, says so, and
    /// still draws the roots to scale.
    #[test]
    fn densely_shared_graphs_are_cut_not_walked() {
        let mut report = tree_report();
        let name = |index: usize| format!("f{index:02}");
        report.call_tree = vec![edge(None, &name(0), 1, entity(1000, RETIRING))];
        for caller in 0..40 {
            for callee in caller + 1..40 {
                report.call_tree.push(edge(
                    Some(&name(caller)),
                    &name(callee),
                    1,
                    entity(10, RETIRING),
                ));
            }
        }
        let started = std::time::Instant::now();
        let tree = layout(&report, Weight::Calls);
        assert!(tree.truncated);
        let svg = svg_of(&report, Weight::Calls);
        assert!(svg.contains("; more than 200000 call paths: deeper frames left out"));
        let element = frame_element(&svg, "f00", "");
        assert!(element.contains(r#"width="1180.000""#), "{element}");
        // By slots, callees squeezed into their callers soon fall below a tenth of a pixel
        // and are not walked further.
        let tree = layout(&report, Weight::Slots);
        assert!(!tree.truncated);
        assert!(tree.frames.len() < 10_000, "{}", tree.frames.len());
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
    }

    #[test]
    fn software_model_frames_are_one_neutral_colour() {
        let mut report = report_of("software", 0);
        report.interval = None;
        let clock = |ns: u64| Entity {
            counters: [("cpu-clock".to_owned(), ns)].into_iter().collect(),
            ..Entity::default()
        };
        report.functions = vec![FunctionEntry {
            target: "/bin/app".into(),
            symbol: "f".into(),
            pid: None,
            calls: 1,
            unwound: 0,
            return_probe: None,
            return_probe_reason: None,
            entry_single_step: false,
            inclusive: clock(500),
            exclusive: clock(500),
            distribution: None,
        }];
        report.call_tree = vec![CallEdge {
            caller: None,
            callee: "f".into(),
            pid: None,
            calls: 1,
            inclusive: clock(500),
        }];
        let svg = svg_of(&report, Weight::Slots);
        assert!(svg.contains("model software: no TopDown metrics, one colour for all"));
        assert!(svg.contains("frame width = inclusive cpu-clock"));
        assert!(svg.contains(">Exclusive cpu-clock per function (own work, probed callees excluded; no TopDown metrics)<"));
        let element = frame_element(&svg, "f", "");
        assert!(
            element.contains(&format!(r#"fill="{NEUTRAL}""#)),
            "{element}"
        );
        for category in &CATEGORIES {
            assert!(!svg.contains(category.colour), "{}", category.colour);
        }
    }

    #[test]
    fn reports_without_functions_or_with_intervals_are_refused() {
        let mut report = tree_report();
        report.functions.clear();
        report.call_tree.clear();
        let err = write_svg(&report, Weight::Slots, &mut Vec::new()).unwrap_err();
        assert_eq!(failure_of(&err), Some(Failure::Usage));
        assert_eq!(
            err.to_string(),
            "--format svg draws the probed call tree or spans, and this report has neither: record with -u TARGET:FUNC, --span or --postgres"
        );
        let interval = report_of("intel-icl", 1);
        let err = write_svg(&interval, Weight::Slots, &mut Vec::new()).unwrap_err();
        assert_eq!(failure_of(&err), Some(Failure::Usage));
        assert!(
            err.to_string().contains("interval 3 of an -I recording"),
            "{err}"
        );
    }

    #[test]
    fn labels_fit_their_frames() {
        assert_eq!(
            fit("handle_request", 200.0).as_deref(),
            Some("handle_request")
        );
        // 60 pixels: (60 - 6) / 6.7 = 8 characters, the last two of them "..".
        assert_eq!(fit("handle_request", 60.0).as_deref(), Some("handle.."));
        assert_eq!(fit("handle_request", 20.0), None);
    }
}
