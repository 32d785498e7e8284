//! `topdown diff --format svg`: a differential icicle of the probed call tree. Frames are laid
//! out as `--format svg` draws NEW's call tree (width = inclusive weight, summed over NEW's
//! runs); each frame is filled red where its edge's cost per call grew beyond the threshold
//! and blue where it shrank, deeper the larger the change (full at +/-100%), pale grey within
//! the threshold; a strip along its bottom shows NEW's level-1 TopDown mix in the category
//! colours, and its tooltip every category's shift in percentage points. Edges only in BASE
//! are listed under the picture.

use std::fmt::Write as _;

use anyhow::Result;

use crate::{
    commands::diff::{
        compare::{Change, Comparison, Verdict},
        input::{Key, Kind, Run, edge_name},
    },
    error::{Failure, fail},
    report::{
        Weight,
        svg::{
            CATEGORIES, MARGIN, SYNTHETIC_NOTE, WIDTH, escape, frame_label, layout, svg_start,
            title_lines,
        },
    },
};

const FRAME_HEIGHT: f64 = 18.0;
const STRIP_HEIGHT: f64 = 4.0;
/// Pale grey for frames within the threshold.
const UNCHANGED: &str = "#eeeeee";

/// The fill for a change of `pct` percent: white towards full red (growth) or blue.
pub fn fill(change: Option<&Change>) -> String {
    let Some(change) = change else {
        return UNCHANGED.to_owned();
    };
    let strength = |pct: f64| (pct.abs() / 100.0).clamp(0.15, 1.0);
    let channel = |strength: f64| (235.0 * (1.0 - strength)).round() as u8 + 20;
    match (change.verdict, change.change_pct) {
        (Verdict::Regressed | Verdict::Improved | Verdict::NotSignificant, Some(pct))
            if pct != 0.0 =>
        {
            if change.verdict == Verdict::NotSignificant {
                return UNCHANGED.to_owned();
            }
            let v = channel(strength(pct));
            if pct > 0.0 {
                format!("#ff{v:02x}{v:02x}")
            } else {
                format!("#{v:02x}{v:02x}ff")
            }
        }
        (Verdict::Regressed, None) | (Verdict::Added, _) => "#ff1414".to_owned(),
        _ => UNCHANGED.to_owned(),
    }
}

fn tooltip(comparison: &Comparison, name: &str, change: Option<&Change>) -> String {
    let mut text = name.to_owned();
    let Some(change) = change else {
        return text;
    };
    let _ = write!(text, "\n{}", change.verdict.text());
    let show = |value: Option<f64>| value.map_or("-".to_owned(), |v| format!("{v:.1}"));
    let _ = write!(
        text,
        "\ncalls per run: {} -> {}",
        show(change.base.as_ref().and_then(|side| side.calls_per_run)),
        show(change.new.as_ref().and_then(|side| side.calls_per_run)),
    );
    let _ = write!(
        text,
        "\n{}: {} -> {}",
        comparison.cost_unit(change.kind),
        show(change.base.as_ref().map(|side| side.cost)),
        show(change.new.as_ref().map(|side| side.cost)),
    );
    if let Some(pct) = change.change_pct {
        let _ = write!(text, " ({pct:+.1}%)");
    }
    if let Some(test) = &change.test {
        let _ = write!(text, "\np = {:.3}", test.p_value);
    }
    for name in &comparison.categories {
        if let Some(shift) = change.shifts.get(name) {
            let _ = write!(
                text,
                "\n{name}: {:.1}% -> {:.1}% ({:+.1} pp)",
                shift.base_pct, shift.new_pct, shift.shift_pp
            );
        }
    }
    text
}

/// NEW's call tree summed over its runs, on the first run's report.
fn merged_report(new: &[&Run]) -> crate::report::Report {
    let mut report = new[0].report.clone();
    for run in &new[1..] {
        for edge in &run.report.call_tree {
            match report
                .call_tree
                .iter_mut()
                .find(|mine| mine.caller == edge.caller && mine.callee == edge.callee)
            {
                Some(mine) => {
                    mine.calls += edge.calls;
                    for (name, value) in &edge.inclusive.counters {
                        *mine.inclusive.counters.entry(name.clone()).or_default() += value;
                    }
                }
                None => report.call_tree.push(edge.clone()),
            }
        }
    }
    report
}

pub fn write_svg(
    comparison: &Comparison,
    new: &[&Run],
    out: &mut dyn std::io::Write,
) -> Result<()> {
    let report = merged_report(new);
    if report.call_tree.is_empty() {
        return Err(fail(
            Failure::Usage,
            "--format svg draws the probed call tree, and NEW has no call-tree edges: record with -u TARGET:FUNC",
        ));
    }
    let change_of = |caller: Option<&str>, callee: &str| {
        let key = Key {
            kind: Kind::Edge,
            name: edge_name(caller, callee),
        };
        comparison
            .changes
            .iter()
            .find(|change| change.kind == key.kind && change.name == key.name)
    };
    let tree = layout(&report, Weight::Slots);
    let depth = tree.frames.iter().map(|f| f.depth + 1).max().unwrap_or(0);
    let tree_y = 88.0;
    let removed: Vec<&Change> = comparison
        .changes
        .iter()
        .filter(|change| change.kind == Kind::Edge && change.verdict == Verdict::Removed)
        .collect();
    let height = tree_y + depth as f64 * FRAME_HEIGHT + 24.0 + removed.len() as f64 * 14.0 + MARGIN;
    let mut svg = svg_start(height);
    let heading = format!(
        "Differential call tree: width = NEW's inclusive {}, colour = change of {} per call (red grew, blue shrank, threshold {}%)",
        comparison.weight_counter, comparison.weight_counter, comparison.threshold_pct
    );
    let mut context = format!(
        "model {}, level {}; BASE {} run(s), NEW {} run(s)",
        comparison.model,
        comparison.level,
        comparison.base_files.len(),
        comparison.new_files.len()
    );
    if comparison.synthetic {
        context.push_str(SYNTHETIC_NOTE);
    }
    title_lines(&mut svg, 13, &heading, &context);
    // Legend: the change colours, then the category colours of the strips.
    let mut x = MARGIN;
    for (fill, label) in [
        ("#ff1414", "grew"),
        ("#1414ff", "shrank"),
        (UNCHANGED, "within threshold"),
    ] {
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="44" width="12" height="12" fill="{fill}" stroke="grey"/><text x="{}" y="54">{}</text>"#,
            x + 16.0,
            escape(label)
        );
        x += 24.0 + label.len() as f64 * 7.0;
    }
    if comparison.level > 0 {
        let _ = write!(svg, r#"<text x="{x}" y="54">strip: NEW's mix</text>"#);
        x += 130.0;
        for category in &CATEGORIES {
            let _ = writeln!(
                svg,
                r#"<rect class="legend" x="{x}" y="44" width="12" height="12" fill="{}"/><text x="{}" y="54">{}</text>"#,
                category.colour,
                x + 16.0,
                escape(category.label)
            );
            x += 24.0 + category.label.len() as f64 * 7.0;
        }
    }
    let scale = if tree.total > 0.0 {
        (WIDTH - 2.0 * MARGIN) / tree.total
    } else {
        0.0
    };
    for frame in &tree.frames {
        let edge = frame.edge;
        let change = change_of(edge.caller.as_deref(), &edge.callee);
        let x = MARGIN + frame.x * scale;
        let width = frame.width * scale;
        let y = tree_y + frame.depth as f64 * FRAME_HEIGHT;
        let name = edge_name(edge.caller.as_deref(), &edge.callee);
        let _ = write!(
            svg,
            r#"<g class="frame" data-symbol="{}" data-caller="{}" data-change="{}"><title>{}</title><rect x="{x:.3}" y="{y}" width="{width:.3}" height="{}" fill="{}" stroke="white" stroke-width="0.5"/>"#,
            escape(&edge.callee),
            escape(edge.caller.as_deref().unwrap_or("")),
            change
                .and_then(|change| change.change_pct)
                .map_or(String::new(), |pct| format!("{pct:.3}")),
            escape(&tooltip(comparison, &name, change)),
            FRAME_HEIGHT - 1.0,
            fill(change),
        );
        // NEW's level-1 mix along the bottom of the frame.
        if let Some(side) = change.and_then(|change| change.new.as_ref()) {
            let mut offset = x;
            for category in &CATEGORIES {
                let share = side
                    .categories
                    .get(category.metric)
                    .copied()
                    .flatten()
                    .unwrap_or(0.0)
                    .clamp(0.0, 100.0)
                    / 100.0;
                let part = width * share;
                if part > 0.0 {
                    let _ = write!(
                        svg,
                        r#"<rect class="strip" x="{offset:.3}" y="{}" width="{part:.3}" height="{STRIP_HEIGHT}" fill="{}"/>"#,
                        y + FRAME_HEIGHT - 1.0 - STRIP_HEIGHT,
                        category.colour
                    );
                }
                offset += part;
            }
        }
        let mut label = edge.callee.clone();
        if let Some(pct) = change.and_then(|change| change.change_pct) {
            let _ = write!(label, " {pct:+.0}%");
        }
        frame_label(&mut svg, &label, x, y + 11.0, width);
        svg.push_str("</g>\n");
    }
    let mut y = tree_y + depth as f64 * FRAME_HEIGHT + 20.0;
    for change in removed {
        let _ = writeln!(
            svg,
            r#"<text class="removed" x="{MARGIN}" y="{y}">only in BASE: {}</text>"#,
            escape(&change.name)
        );
        y += 14.0;
    }
    svg.push_str("</svg>\n");
    out.write_all(svg.as_bytes())?;
    Ok(())
}
