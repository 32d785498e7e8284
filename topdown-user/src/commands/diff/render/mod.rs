//! `topdown diff`'s outputs: a table, JSON (the [`Comparison`] as it is), and an SVG
//! differential icicle.

use std::fmt::Write as _;

use anyhow::{Context as _, Result};

use super::compare::{Change, Comparison, Verdict};
use crate::report::table::{SYNTHETIC_BANNER, level_text};

pub mod svg;

/// The output formats of `topdown diff`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiffFormat {
    Table,
    Json,
    Svg,
}

pub fn write_json(comparison: &Comparison, out: &mut dyn std::io::Write) -> Result<()> {
    serde_json::to_writer(&mut *out, comparison).context("writing JSON")?;
    out.write_all(b"\n").context("writing JSON")
}

fn number(value: f64) -> String {
    if !value.is_finite() {
        return "-".to_owned();
    }
    let magnitude = value.abs();
    if magnitude >= 1000.0 || value.fract() == 0.0 {
        format!("{value:.0}")
    } else if magnitude >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.3}")
    }
}

fn percent(value: Option<f64>) -> String {
    match value {
        Some(value) => format!("{value:+.1}%"),
        None => "-".to_owned(),
    }
}

/// `old -> new`, or one side with the other shown absent.
fn pair(base: Option<f64>, new: Option<f64>) -> String {
    let show = |value: Option<f64>| value.map_or("-".to_owned(), number);
    format!("{} -> {}", show(base), show(new))
}

/// One line naming a regression and by how much, for the table and for stderr.
pub fn regression_line(comparison: &Comparison, change: &Change) -> String {
    let unit = comparison.cost_unit(change.kind);
    let base = change.base.as_ref().map(|side| side.cost);
    let new = change.new.as_ref().map(|side| side.cost);
    let mut line = format!(
        "{} {}: {unit} {} ({})",
        change.kind.name(),
        change.name,
        pair(base, new),
        match change.change_pct {
            Some(pct) => format!("{pct:+.1}%"),
            None => "grew from 0".to_owned(),
        }
    );
    if let Some(test) = &change.test {
        let _ = write!(line, ", p = {:.2e}", test.p_value);
    }
    if let Some((name, shift)) = change
        .shifts
        .iter()
        .max_by(|a, b| a.1.shift_pp.abs().total_cmp(&b.1.shift_pp.abs()))
        .filter(|(_, shift)| shift.shift_pp.abs() >= 0.05)
    {
        let _ = write!(
            line,
            "; largest category shift {name} {:+.1} pp",
            shift.shift_pp
        );
    }
    line
}

pub fn write_table(comparison: &Comparison, out: &mut dyn std::io::Write) -> Result<()> {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "topdown diff: model {}, {}, threshold {}%",
        comparison.model,
        level_text(comparison.level),
        comparison.threshold_pct
    );
    let _ = writeln!(text, "BASE: {}", comparison.base_files.join(" "));
    let _ = writeln!(text, "NEW:  {}", comparison.new_files.join(" "));
    if comparison.synthetic {
        text += SYNTHETIC_BANNER;
    }
    match &comparison.method {
        Some(method) => {
            let _ = writeln!(text, "method: {method}");
        }
        None => {
            text += "one run per side: no test of significance (give several runs per side: BASE... -- NEW...)\n";
        }
    }
    text += "cost: the weight counter per call (functions and edges inclusive, spans), or in total (processes, cgroups); category shifts in percentage points\n\n";

    let several = comparison.method.is_some();
    let mut header: Vec<String> = ["KIND", "NAME", "CALLS/RUN", "COST", "UNIT", "CHANGE"]
        .iter()
        .map(|title| (*title).to_owned())
        .collect();
    if several {
        header.push("95% CI".into());
        header.push("p".into());
    }
    header.push("OWN".into());
    // Categories no entity has a value for on both sides (a level-2 child the model cannot
    // compute) get no column; JSON keeps every one.
    let categories: Vec<&String> = comparison
        .categories
        .iter()
        .filter(|name| {
            comparison
                .changes
                .iter()
                .any(|change| change.shifts.contains_key(*name))
        })
        .collect();
    header.extend(
        categories
            .iter()
            .map(|name| format!("{} pp", crate::report::layout::title(name))),
    );
    header.push("VERDICT".into());
    let rows: Vec<Vec<String>> = comparison
        .changes
        .iter()
        .map(|change| {
            let calls = pair(
                change.base.as_ref().and_then(|side| side.calls_per_run),
                change.new.as_ref().and_then(|side| side.calls_per_run),
            );
            let mut row = vec![
                change.kind.name().to_owned(),
                change.name.clone(),
                if change.kind.has_calls() {
                    calls
                } else {
                    String::new()
                },
                pair(
                    change.base.as_ref().map(|side| side.cost),
                    change.new.as_ref().map(|side| side.cost),
                ),
                comparison.cost_unit(change.kind),
                percent(change.change_pct),
            ];
            if several {
                match &change.test {
                    Some(test) => {
                        row.push(format!(
                            "{} .. {}",
                            percent(test.change_low_pct),
                            percent(test.change_high_pct)
                        ));
                        row.push(format!("{:.3}", test.p_value));
                    }
                    None => {
                        row.push("-".into());
                        row.push("-".into());
                    }
                }
            }
            row.push(percent(change.exclusive_change_pct));
            for name in &categories {
                row.push(match change.shifts.get(*name) {
                    Some(shift) => format!("{:+.1}", shift.shift_pp),
                    None => "-".into(),
                });
            }
            row.push(change.verdict.text().to_owned());
            row
        })
        .collect();
    if rows.is_empty() {
        text += "nothing to compare: neither side has functions, call-tree edges, spans, processes or cgroups of the chosen kinds\n";
    } else {
        // Kind and name left-aligned, figures right-aligned.
        text += &crate::report::layout::layout(&header, &rows, 4);
    }
    let regressions: Vec<&Change> = comparison.regressions().collect();
    text.push('\n');
    if regressions.is_empty() {
        let _ = writeln!(text, "no regression beyond {}%", comparison.threshold_pct);
    } else {
        let _ = writeln!(
            text,
            "{} regression{} beyond {}%:",
            regressions.len(),
            if regressions.len() == 1 { "" } else { "s" },
            comparison.threshold_pct
        );
        for change in regressions {
            let _ = writeln!(text, "  REGRESSED {}", regression_line(comparison, change));
        }
    }
    out.write_all(text.as_bytes())
        .context("writing the comparison")
}

/// Whether any change is a regression (exit status 1).
pub fn regressed(comparison: &Comparison) -> bool {
    comparison
        .changes
        .iter()
        .any(|change| change.verdict == Verdict::Regressed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heading_names_the_level_and_warns_of_synthetic_counters() {
        let heading = |level: u8, synthetic: bool| {
            let comparison = Comparison {
                model: "intel-icl".into(),
                weight_counter: "slots".into(),
                level,
                synthetic,
                threshold_pct: 5.0,
                method: None,
                base_files: vec!["base.json".into()],
                new_files: vec!["new.json".into()],
                categories: Vec::new(),
                changes: Vec::new(),
            };
            let mut out = Vec::new();
            let written = write_table(&comparison, &mut out);
            assert!(written.is_ok(), "{written:?}");
            String::from_utf8_lossy(&out).into_owned()
        };
        let text = heading(1, true);
        assert!(
            text.starts_with(
                "topdown diff: model intel-icl, TopDown level 1, threshold 5%\n\
                 BASE: base.json\n\
                 NEW:  new.json\n\
                 !! SYNTHETIC COUNTERS: syscall tracepoints stand in for hardware events; not a \
                 hardware measurement\n"
            ),
            "{text}"
        );
        let text = heading(0, false);
        assert!(
            text.starts_with(
                "topdown diff: model intel-icl, on-CPU time (no TopDown), threshold 5%\n"
            ),
            "{text}"
        );
        assert!(!text.contains("SYNTHETIC"), "{text}");
    }
}
