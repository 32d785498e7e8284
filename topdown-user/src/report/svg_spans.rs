//! The SVG picture of spans (`--span`, `--postgres`): one bar per span kind and key, its
//! level-1 TopDown from start to end, heaviest first, with its calls and weight per call.

use std::fmt::Write as _;

use super::{
    Report,
    svg_distribution::{self as distribution, Of},
    svg_parts::{
        BAR_HEIGHT, MARGIN, SYNTHETIC_NOTE, bar_row, escape, legend, span_name, svg_start,
        title_lines,
    },
};

/// Rows of span bars at most: a workload of thousands of distinct queries is a table's job.
pub const MAX_BARS: usize = 200;

/// Height of `span_bars` for `report`.
pub fn bars_height(report: &Report) -> f64 {
    24.0 + report.spans.len().min(MAX_BARS) as f64 * (BAR_HEIGHT + 4.0)
}

/// The span bars from `y`; returns where they end.
pub fn span_bars(report: &Report, y: f64, svg: &mut String) -> f64 {
    let weight = |entity: &super::Entity| entity.count(&report.weight_counter);
    let _ = writeln!(
        svg,
        r#"<text class="heading" x="{MARGIN}" y="{}">{}</text>"#,
        y + 14.0,
        escape(&format!(
            "TopDown per span (start to end, nested spans included){}",
            if report.spans.len() > MAX_BARS {
                format!("; the heaviest {MAX_BARS} of {}", report.spans.len())
            } else {
                String::new()
            }
        ))
    );
    let heaviest = report
        .spans
        .iter()
        .map(|span| weight(&span.entity))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let mut row_y = y + 24.0;
    for span in report.spans.iter().take(MAX_BARS) {
        let name = span_name(span);
        let amount = weight(&span.entity);
        let per_call = amount.checked_div(span.calls).unwrap_or(0);
        let figures = format!(
            "{} calls, {per_call} {}/call{}",
            span.calls,
            report.weight_counter,
            if span.abandoned > 0 {
                format!(", {} abandoned", span.abandoned)
            } else {
                String::new()
            }
        );
        bar_row(
            svg,
            &name,
            &span.entity,
            amount as f64 / heaviest,
            &figures,
            row_y,
        );
        row_y += BAR_HEIGHT + 4.0;
    }
    row_y
}

/// A picture of the spans alone (a report without probed functions).
pub fn write_spans_svg(report: &Report, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let histograms_y = 64.0 + bars_height(report) + 8.0;
    let height = histograms_y + distribution::height(report, Of::Spans) + MARGIN;
    let mut svg = svg_start(height);
    let mut context = format!(
        "model {}, level {}, {}",
        report.model, report.level, report.scope
    );
    if report.synthetic {
        context.push_str(SYNTHETIC_NOTE);
    }
    title_lines(
        &mut svg,
        14,
        "Spans: bar = TopDown from start to end",
        &context,
    );
    legend(report, 44.0, &mut svg);
    span_bars(report, 64.0, &mut svg);
    distribution::draw(report, Of::Spans, histograms_y, false, &mut svg);
    svg.push_str("</svg>\n");
    out.write_all(svg.as_bytes())?;
    Ok(())
}
