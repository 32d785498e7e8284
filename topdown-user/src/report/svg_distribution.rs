//! The SVG's per-call histograms: one panel per probed function, or per span kind and key, with
//! a distribution (`crate::functions::distribution`), heaviest first, a bar per bucket from the fastest to the
//! slowest bucket with calls (empty ones between them drawn as gaps), each bar's height the
//! bucket's calls on a log scale and its colours the bucket's level-1 TopDown split, with the p50
//! and p99 marked.

use std::fmt::Write as _;

use topdown_common::histogram;

use super::{
    Report,
    svg_parts::{CATEGORIES, Category, MARGIN, NEUTRAL, WIDTH, escape, span_name},
};
use crate::functions::distribution::{Bucket, Distribution};

const COLUMNS: usize = 4;
const PANEL_HEIGHT: f64 = 130.0;
/// Room for the title above the bars and the bounds below them.
const PANEL_TITLE: f64 = 18.0;
const PANEL_AXIS: f64 = 16.0;
const PANEL_GAP: f64 = 12.0;
/// Panels drawn at most; the rest are named in a line (JSON has them all).
const MAX_PANELS: usize = 24;
const CHAR_WIDTH: f64 = 6.7;

/// What the histograms are of: the functions' calls or the spans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Of {
    Functions,
    Spans,
}

/// The distributions to draw, named, heaviest first (the report's order).
fn panels(report: &Report, of: Of, show_pid: bool) -> Vec<(String, &Distribution)> {
    fn drawn(distribution: &Option<Distribution>) -> Option<&Distribution> {
        distribution
            .as_ref()
            .filter(|distribution| distribution.calls() > 0)
    }
    match of {
        Of::Functions => report
            .functions
            .iter()
            .filter_map(|function| {
                let name = match function.pid {
                    Some(pid) if show_pid => format!("{} [{pid}]", function.symbol),
                    _ => function.symbol.clone(),
                };
                Some((name, drawn(&function.distribution)?))
            })
            .collect(),
        Of::Spans => report
            .spans
            .iter()
            .filter_map(|span| Some((span_name(span), drawn(&span.distribution)?)))
            .collect(),
    }
}

/// The height the histograms of `of` take (0 without any).
pub fn height(report: &Report, of: Of) -> f64 {
    let count = panels(report, of, false).len().min(MAX_PANELS);
    if count == 0 {
        return 0.0;
    }
    let rows = count.div_ceil(COLUMNS) as f64;
    // Heading, then the panels, then the line naming those left out.
    24.0 + rows * (PANEL_HEIGHT + PANEL_GAP) + 16.0
}

/// Draws the histograms of `of` from `y` down; `show_pid`: label functions with their process.
pub fn draw(report: &Report, of: Of, y: f64, show_pid: bool, svg: &mut String) {
    let panels = panels(report, of, show_pid);
    if panels.is_empty() {
        return;
    }
    let weight = &report.weight_counter;
    let (heading, rest) = match of {
        Of::Functions => (
            format!(
                "Per-call distribution: calls per bucket of inclusive {weight} per call (log scale), coloured by each bucket's TopDown split; | p50, ¦ p99"
            ),
            "functions",
        ),
        Of::Spans => (
            format!(
                "Per-span distribution: spans per bucket of {weight} from start to end (log scale), coloured by each bucket's TopDown split; | p50, ¦ p99"
            ),
            "spans",
        ),
    };
    let _ = writeln!(
        svg,
        r#"<text class="heading" x="{MARGIN}" y="{}">{}</text>"#,
        y + 14.0,
        escape(&heading)
    );
    let panel_width = (WIDTH - 2.0 * MARGIN - PANEL_GAP * (COLUMNS - 1) as f64) / COLUMNS as f64;
    for (index, (name, distribution)) in panels.iter().take(MAX_PANELS).enumerate() {
        let x = MARGIN + (index % COLUMNS) as f64 * (panel_width + PANEL_GAP);
        let top = y + 24.0 + (index / COLUMNS) as f64 * (PANEL_HEIGHT + PANEL_GAP);
        panel(distribution, name, weight, x, top, panel_width, svg);
    }
    if panels.len() > MAX_PANELS {
        let rows = MAX_PANELS.div_ceil(COLUMNS) as f64;
        let _ = writeln!(
            svg,
            r#"<text x="{MARGIN}" y="{}">{} more {rest} with distributions (in the JSON report)</text>"#,
            y + 24.0 + rows * (PANEL_HEIGHT + PANEL_GAP) + 10.0,
            panels.len() - MAX_PANELS
        );
    }
}

fn panel(
    distribution: &Distribution,
    name: &str,
    weight: &str,
    x: f64,
    top: f64,
    width: f64,
    svg: &mut String,
) {
    let Some((first, last)) = distribution
        .buckets
        .first()
        .zip(distribution.buckets.last())
        .map(|(first, last)| (histogram::bucket(first.low), histogram::bucket(last.low)))
    else {
        return;
    };
    let slots = (last - first + 1) as f64;
    let bar_width = width / slots;
    let bars_top = top + PANEL_TITLE;
    let bars_height = PANEL_HEIGHT - PANEL_TITLE - PANEL_AXIS;
    let base = bars_top + bars_height;
    let most = distribution.most_calls();
    let scale = |calls: u64| bars_height * (1.0 + calls as f64).ln() / (1.0 + most as f64).ln();
    let title = fit(name, width);
    let _ = write!(
        svg,
        r##"<g class="histogram" data-symbol="{}"><rect x="{x:.3}" y="{top:.3}" width="{width:.3}" height="{PANEL_HEIGHT}" fill="none" stroke="#ddd"/><text x="{:.3}" y="{:.3}">{}</text>"##,
        escape(name),
        x + 2.0,
        top + 13.0,
        escape(&title)
    );
    for bucket in &distribution.buckets {
        let slot = (histogram::bucket(bucket.low) - first) as f64;
        let bar_x = x + slot * bar_width;
        let height = scale(bucket.calls);
        let _ = write!(
            svg,
            r#"<g class="bucket" data-low="{}" data-high="{}" data-calls="{}"><title>{}</title>"#,
            bucket.low,
            bucket.high,
            bucket.calls,
            escape(&tooltip(bucket, weight))
        );
        let mut y = base;
        for (category, share) in shares(bucket) {
            let segment = height * share;
            y -= segment;
            let _ = write!(
                svg,
                r#"<rect class="segment" data-category="{}" x="{bar_x:.3}" y="{y:.3}" width="{:.3}" height="{segment:.3}" fill="{}"/>"#,
                category.map_or("none", |category| category.metric),
                (bar_width - 1.0).max(0.5),
                category.map_or(NEUTRAL, |category| category.colour),
            );
        }
        svg.push_str("</g>");
    }
    // Percentile marks, at their interpolated place within their bucket's bar.
    for (quantile, dash) in [(0.50, ""), (0.99, r#" stroke-dasharray="3,2""#)] {
        let Some((value, bucket)) = distribution.band(quantile) else {
            continue;
        };
        let slot = (histogram::bucket(bucket.low) - first) as f64;
        let within = (value - bucket.low as f64) / (bucket.high - bucket.low) as f64;
        let mark_x = x + (slot + within.clamp(0.0, 1.0)) * bar_width;
        let _ = write!(
            svg,
            r#"<line class="p{:.0}" x1="{mark_x:.3}" y1="{bars_top:.3}" x2="{mark_x:.3}" y2="{base:.3}" stroke="black"{dash}><title>p{:.0}: {value:.1} {}</title></line>"#,
            quantile * 100.0,
            quantile * 100.0,
            escape(weight)
        );
    }
    let low = distribution.buckets.first().map_or(0, |bucket| bucket.low);
    let high = distribution.buckets.last().map_or(0, |bucket| bucket.high);
    let high_text = high.to_string();
    let _ = writeln!(
        svg,
        r#"<text x="{:.3}" y="{:.3}">{low}</text><text x="{:.3}" y="{:.3}" text-anchor="end">{high_text}</text></g>"#,
        x + 2.0,
        base + 12.0,
        x + width - 2.0,
        base + 12.0,
    );
}

/// The level-1 shares of a bucket's bar (normalised: they sum to 1 only up to rounding), or
/// one neutral share without metrics.
fn shares(bucket: &Bucket) -> Vec<(Option<&'static Category>, f64)> {
    let values: Vec<(Option<&'static Category>, f64)> = CATEGORIES
        .iter()
        .filter_map(|category| {
            bucket
                .entity
                .metrics
                .get(category.metric)
                .copied()
                .flatten()
                .filter(|value| value.is_finite() && *value > 0.0)
                .map(|value| (Some(category), value))
        })
        .collect();
    let sum: f64 = values.iter().map(|(_, value)| value).sum();
    if values.is_empty() || sum <= 0.0 {
        return vec![(None, 1.0)];
    }
    values
        .into_iter()
        .map(|(category, value)| (category, value / sum))
        .collect()
}

fn tooltip(bucket: &Bucket, weight: &str) -> String {
    let mut text = format!(
        "[{}, {}) {weight} per call: {} calls, {} {weight}",
        bucket.low,
        bucket.high,
        bucket.calls,
        bucket.entity.count(weight)
    );
    for category in &CATEGORIES {
        if let Some(value) = bucket
            .entity
            .metrics
            .get(category.metric)
            .copied()
            .flatten()
        {
            let _ = write!(text, ", {} {:.1}%", category.label, 100.0 * value);
        }
    }
    text
}

/// `text` cut to fit `width` pixels, with an ellipsis when cut.
fn fit(text: &str, width: f64) -> String {
    let room = (width / CHAR_WIDTH).floor() as usize;
    if text.chars().count() <= room {
        text.to_owned()
    } else {
        let kept: String = text.chars().take(room.saturating_sub(1)).collect();
        format!("{kept}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        functions::distribution::BucketCounts,
        report::{Entity, tests::report_of},
    };

    fn split(retiring: f64, backend: f64) -> Entity {
        Entity {
            metrics: [
                ("retiring", Some(retiring)),
                ("bad_speculation", Some(0.0)),
                ("frontend_bound", Some(0.0)),
                ("backend_bound", Some(backend)),
            ]
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect(),
            ..Entity::default()
        }
    }

    /// 1000 fast retiring calls and 30 slow backend-bound ones: two bars, green then orange,
    /// 25 empty buckets apart, the fast one taller, p50 in the first and p99 in the second.
    #[test]
    fn a_panel_draws_each_bucket_stacked_by_its_split() {
        let mut report = report_of("intel-icl", 1);
        report.functions[0].distribution = Some(Distribution::of(
            "slots",
            [
                BucketCounts {
                    bucket: histogram::bucket(10),
                    calls: 1000,
                    counts: crate::session::aggregate::SlotCounts::ZERO,
                },
                BucketCounts {
                    bucket: histogram::bucket(1000),
                    calls: 30,
                    counts: crate::session::aggregate::SlotCounts::ZERO,
                },
            ],
            &|_| Entity::default(),
        ));
        let distribution = report.functions[0].distribution.as_mut().unwrap();
        distribution.buckets[0].entity = split(1.0, 0.0);
        distribution.buckets[1].entity = split(0.0, 1.0);
        let mut svg = String::new();
        draw(&report, Of::Functions, 0.0, false, &mut svg);
        assert_eq!(svg.matches(r#"<g class="histogram""#).count(), 1, "{svg}");
        let bars: Vec<&str> = svg.split(r#"<g class="bucket""#).skip(1).collect();
        assert_eq!(bars.len(), 2);
        assert!(bars[0].contains(r#"data-low="10" data-high="12" data-calls="1000""#));
        assert!(bars[0].contains(r##"fill="#43a047""##) && !bars[0].contains("#fb8c00"));
        assert!(bars[1].contains(r#"data-low="896" data-high="1024" data-calls="30""#));
        assert!(bars[1].contains(r##"fill="#fb8c00""##) && !bars[1].contains("#43a047"));
        let height = |bar: &str| -> f64 {
            let start = bar.find("height=\"").unwrap() + 8;
            bar[start..].split('"').next().unwrap().parse().unwrap()
        };
        assert!(height(bars[0]) > height(bars[1]));
        // 10 is bucket 9 and 1000 bucket 35: 27 bars wide, p50 in the first, p99 in the last.
        let mark = |class: &str| -> f64 {
            let start =
                svg.find(&format!(r#"<line class="{class}" x1=""#)).unwrap() + 19 + class.len();
            svg[start..].split('"').next().unwrap().parse().unwrap()
        };
        let panel_width = (WIDTH - 2.0 * MARGIN - PANEL_GAP * 3.0) / 4.0;
        let bar_width = panel_width / 27.0;
        assert!(mark("p50") > MARGIN && mark("p50") < MARGIN + bar_width);
        assert!(mark("p99") > MARGIN + 26.0 * bar_width && mark("p99") < MARGIN + panel_width);
        assert!(super::height(&report, Of::Functions) > 0.0);
        assert_eq!(super::height(&report, Of::Spans), 0.0);
    }
}
