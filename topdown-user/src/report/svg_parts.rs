//! What every SVG picture of a report draws with: the page's geometry, the TopDown level-1
//! categories and their colours, the legend, one stacked bar per entity, and text escaping.
//! Below the pictures themselves (`svg`, `svg_spans`, `svg_distribution`).

use std::fmt::Write as _;

use super::{Entity, Report};
use crate::spans::report::{SpanEntry, SpanKeyType};

/// Drawing width in pixels; frames share it minus the margins.
pub const WIDTH: f64 = 1200.0;
pub const MARGIN: f64 = 10.0;
pub const BAR_HEIGHT: f64 = 16.0;
pub const BAR_LABEL_WIDTH: f64 = 260.0;
pub const BAR_FIGURES_WIDTH: f64 = 240.0;

/// Monospace glyph width at font-size 11, for fitting labels into frames.
pub const CHAR_WIDTH: f64 = 6.7;

/// A TopDown level-1 category and its colour. Hues as toplev and VTune draw them: retiring
/// green, bad speculation red, frontend bound purple, backend bound orange.
pub struct Category {
    pub metric: &'static str,
    pub label: &'static str,
    pub colour: &'static str,
}

pub const CATEGORIES: [Category; 4] = [
    Category {
        metric: "retiring",
        label: "Retiring",
        colour: "#43a047",
    },
    Category {
        metric: "bad_speculation",
        label: "Bad Speculation",
        colour: "#e53935",
    },
    Category {
        metric: "frontend_bound",
        label: "Frontend Bound",
        colour: "#7e57c2",
    },
    Category {
        metric: "backend_bound",
        label: "Backend Bound",
        colour: "#fb8c00",
    },
];

/// Frames without TopDown metrics (software model, or nothing counted).
pub const NEUTRAL: &str = "#9e9e9e";

/// The entity's level-1 categories that have a finite value, with it, in `CATEGORIES` order.
fn category_values(entity: &Entity) -> impl Iterator<Item = (&'static Category, f64)> + '_ {
    CATEGORIES.iter().filter_map(|category| {
        entity
            .metrics
            .get(category.metric)
            .copied()
            .flatten()
            .filter(|value| value.is_finite())
            .map(|value| (category, value))
    })
}

/// The level-1 category with the largest value in `metrics`, if any has a value.
pub fn dominant(entity: &Entity) -> Option<&'static Category> {
    category_values(entity)
        .fold(
            None,
            |best: Option<(&Category, f64)>, (category, value)| match best {
                Some((_, top)) if top >= value => best,
                _ => Some((category, value)),
            },
        )
        .map(|(category, _)| category)
}

pub fn colour(entity: &Entity) -> &'static str {
    dominant(entity).map_or(NEUTRAL, |category| category.colour)
}

/// Text safe inside XML elements and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 allows no other control characters, even escaped.
            c if c.is_control() && !matches!(c, '\n' | '\t') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// Whether the report carries TopDown level-1 metrics (not the software model).
pub fn has_topdown(report: &Report) -> bool {
    report.level > 0
}

/// `text` cut to fit `width` pixels, or nothing when not even a few characters fit.
pub fn fit(text: &str, width: f64) -> Option<String> {
    let room = ((width - 6.0) / CHAR_WIDTH).floor();
    if room < 3.0 {
        return None;
    }
    let room = room as usize;
    let count = text.chars().count();
    Some(if count <= room {
        text.to_owned()
    } else {
        let mut cut: String = text.chars().take(room.saturating_sub(2)).collect();
        cut.push_str("..");
        cut
    })
}

/// A flame-graph frame's label at `x`, baseline `baseline`, cut to the frame's `width` ([`fit`]);
/// nothing where not even a few characters fit.
pub fn frame_label(svg: &mut String, label: &str, x: f64, baseline: f64, width: f64) {
    if let Some(text) = fit(label, width) {
        let _ = write!(
            svg,
            r#"<text x="{:.3}" y="{baseline}" pointer-events="none">{}</text>"#,
            x + 3.0,
            escape(&text)
        );
    }
}

/// A picture `height` pixels tall, begun: the XML declaration, the `svg` element (the font
/// every picture's text and `CHAR_WIDTH` assume) and its white background.
pub fn svg_start(height: f64) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="11">
<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="white"/>"#
    );
    svg
}

/// What a picture's context line adds for a run of the software model.
pub const SYNTHETIC_NOTE: &str =
    " (synthetic counters: syscall counts stand in for hardware events)";

/// A picture's first two lines: `heading` in bold at `font_size`, and under it `context`
/// (what was counted, and how).
pub fn title_lines(svg: &mut String, font_size: u32, heading: &str, context: &str) {
    let _ = writeln!(
        svg,
        r#"<text class="heading" x="{MARGIN}" y="18" font-size="{font_size}" font-weight="bold">{}</text>
<text class="context" x="{MARGIN}" y="34">{}</text>"#,
        escape(heading),
        escape(context)
    );
}

pub fn legend(report: &Report, y: f64, svg: &mut String) {
    if !has_topdown(report) {
        let _ = write!(
            svg,
            r#"<g class="legend"><rect x="{MARGIN}" y="{y}" width="14" height="14" fill="{NEUTRAL}"/><text x="{}" y="{}">model {}: no TopDown metrics, one colour for all</text></g>"#,
            MARGIN + 20.0,
            y + 11.0,
            escape(&report.model)
        );
        svg.push('\n');
        return;
    }
    svg.push_str(r#"<g class="legend">"#);
    let mut x = MARGIN;
    for category in &CATEGORIES {
        let _ = write!(
            svg,
            r#"<rect x="{x}" y="{y}" width="14" height="14" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            category.colour,
            x + 20.0,
            y + 11.0,
            category.label
        );
        x += 40.0 + category.label.len() as f64 * CHAR_WIDTH;
    }
    let _ = write!(
        svg,
        r#"<rect x="{x}" y="{y}" width="14" height="14" fill="{NEUTRAL}"/><text x="{}" y="{}">no metrics</text>"#,
        x + 20.0,
        y + 11.0
    );
    svg.push_str("</g>\n");
}

/// One bar: `name`, the entity's level-1 TopDown as a 100% stacked bar (or, without metrics,
/// a grey bar `relative` of the full length), and `figures` after it.
pub fn bar_row(
    svg: &mut String,
    name: &str,
    entity: &Entity,
    relative: f64,
    figures: &str,
    row_y: f64,
) {
    let bar_x = MARGIN + BAR_LABEL_WIDTH;
    let bar_width = WIDTH - 2.0 * MARGIN - BAR_LABEL_WIDTH - BAR_FIGURES_WIDTH;
    let _ = write!(
        svg,
        r#"<g class="bar" data-symbol="{}"><text x="{MARGIN}" y="{}">{}</text>"#,
        escape(name),
        row_y + 12.0,
        escape(&fit(name, BAR_LABEL_WIDTH).unwrap_or_default())
    );
    let values: Vec<(&Category, f64)> = category_values(entity)
        .filter(|(_, value)| *value > 0.0)
        .collect();
    // Level-1 fractions sum to 1 only up to the kernel's rounding: normalise for the bar.
    let sum: f64 = values.iter().map(|(_, value)| value).sum();
    if values.is_empty() {
        // No breakdown: the bar's length says how much it did.
        let width = bar_width * relative;
        let _ = write!(
            svg,
            r#"<rect class="segment" x="{bar_x:.3}" y="{row_y}" width="{width:.3}" height="{BAR_HEIGHT}" fill="{NEUTRAL}"><title>{}: no TopDown metrics</title></rect>"#,
            escape(name)
        );
    } else {
        let mut x = bar_x;
        for (category, value) in values {
            let width = bar_width * value / sum;
            let _ = write!(
                svg,
                r#"<rect class="segment" data-category="{}" x="{x:.3}" y="{row_y}" width="{width:.3}" height="{BAR_HEIGHT}" fill="{}"><title>{}: {} {:.1}%</title></rect>"#,
                category.metric,
                category.colour,
                escape(name),
                category.label,
                100.0 * value
            );
            let percent = format!("{:.0}%", 100.0 * value);
            if width >= (percent.len() as f64 + 1.0) * CHAR_WIDTH {
                let _ = write!(
                    svg,
                    r#"<text x="{:.3}" y="{}" pointer-events="none">{percent}</text>"#,
                    x + 3.0,
                    row_y + 12.0
                );
            }
            x += width;
        }
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.3}" y="{}">{}</text></g>"#,
        bar_x + bar_width + 8.0,
        row_y + 12.0,
        escape(figures)
    );
}

/// How a picture names a span kind and key: the kind, then the key (a query id's text).
pub fn span_name(span: &SpanEntry) -> String {
    let key = match (&span.key_type, &span.text) {
        (SpanKeyType::None, _) => String::new(),
        (SpanKeyType::QueryId, Some(text)) => format!(" {text}"),
        _ => format!(" {}", span.key),
    };
    format!("{}{key}", span.kind)
}
