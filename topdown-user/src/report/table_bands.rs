//! The table's distribution lines: for each function or span with a distribution, its fast
//! and its slow calls (`crate::functions::distribution`), under the functions and the spans.

use super::layout::layout;
use crate::functions::distribution::{Distribution, dominant_categories};

/// A line for the fast calls (the bucket of the median call) and one for the slow calls (the
/// bucket of the 99th percentile) of each entry (named by the `names` columns) with a
/// distribution, under `title` (`{unit}` stands for the weight's unit): the per-call weight
/// there, the bucket's calls and why they take that long. Empty without calls.
pub(super) fn bands_text<'a>(
    title: &str,
    names: &[&str],
    entries: impl Iterator<Item = (Vec<String>, &'a Distribution)>,
    weight: &str,
    show: &dyn Fn(u64) -> String,
) -> String {
    let per_call = |value: f64| {
        if weight == "cpu-clock" {
            format!("{:.3}", value / 1e3)
        } else {
            format!("{value:.0}")
        }
    };
    let unit = if weight == "cpu-clock" {
        "cpu us"
    } else {
        weight
    };
    let mut header: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
    header.extend([
        "BAND".to_owned(),
        format!("{unit}/call"),
        "BUCKET".to_owned(),
        "IN BUCKET".to_owned(),
        format!(
            "bucket {}",
            if weight == "cpu-clock" {
                "cpu ms"
            } else {
                weight
            }
        ),
        "WHY".to_owned(),
    ]);
    let mut rows = Vec::new();
    for (name, distribution) in entries {
        for (label, quantile) in [("p50", 0.50), ("p99", 0.99)] {
            let Some((value, bucket)) = distribution.band(quantile) else {
                continue;
            };
            let mut row = name.clone();
            row.extend([
                label.to_owned(),
                per_call(value),
                format!(
                    "[{}, {})",
                    per_call(bucket.low as f64),
                    per_call(bucket.high as f64)
                ),
                bucket.calls.to_string(),
                show(bucket.entity.count(weight)),
                dominant_categories(&bucket.entity).unwrap_or_else(|| "-".to_owned()),
            ]);
            rows.push(row);
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    let mut text = format!("\n{}\n", title.replace("{unit}", unit));
    text += &layout(&header, &rows, 5);
    text
}
