//! The table's span section (`--span`, `--postgres`: TopDown per kind and key, heaviest
//! first) and `-U` hits.

use super::{
    Report,
    layout::{Columns, count_notes, layout, metric_cells, share_cell, title, weight_cell},
};
use crate::spans::report::{SpanEntry, SpanKeyType};

/// Characters of a key (a query text) shown in a cell; JSON has it whole.
const KEY_WIDTH: usize = 72;

/// A span's key as a cell: `-` for kinds without one, a query id with its text.
fn shown_key(span: &SpanEntry) -> String {
    let key = match (&span.key_type, &span.text) {
        (SpanKeyType::None, _) => "-".to_owned(),
        (SpanKeyType::QueryId, Some(text)) => format!("{} {text}", span.key),
        _ => span.key.clone(),
    };
    shorten(&key)
}

pub(super) fn spans_text(report: &Report, columns: &Columns<'_>) -> String {
    let weight = columns.weight;
    let show = |value: u64| weight_cell(weight, value);
    let mut text = String::new();
    if !report.spans.is_empty() {
        let mut header = vec![
            "SPAN".to_owned(),
            "KEY".to_owned(),
            "CALLS".to_owned(),
            "ABANDONED".to_owned(),
            columns.weight_title.to_owned(),
            "share".to_owned(),
            format!("{}/call", columns.weight_title),
        ];
        header.extend(columns.metrics.iter().map(|name| title(name).to_owned()));
        let rows: Vec<Vec<String>> = report
            .spans
            .iter()
            .map(|span| {
                let amount = span.entity.count(weight);
                let mut row = vec![
                    span.kind.clone(),
                    shown_key(span),
                    if span.folded > 0 {
                        format!("{} (+{} workers)", span.calls, span.folded)
                    } else {
                        span.calls.to_string()
                    },
                    span.abandoned.to_string(),
                    show(amount),
                    share_cell(amount, columns.total_weight),
                    amount
                        .checked_div(span.calls)
                        .map_or_else(|| "-".to_owned(), show),
                ];
                row.extend(metric_cells(&span.entity, columns.metrics));
                row
            })
            .collect();
        text += "\nSpans (counts from start to end, nested spans included; abandoned spans not in them)\n";
        text += &layout(&header, &rows, 4);
        text += &super::table_bands::bands_text(
            "Per-span distribution ({unit} per span from start to end; p50: the median span's \
             bucket, p99: the 99th percentile's)",
            &["SPAN", "KEY"],
            report.spans.iter().filter_map(|span| {
                Some((
                    vec![span.kind.clone(), shown_key(span)],
                    span.distribution.as_ref()?,
                ))
            }),
            weight,
            &show,
        );
    }
    if !report.usdt.is_empty() {
        let header = ["PROBE".to_owned(), "TARGET".to_owned(), "HITS".to_owned()];
        let rows: Vec<Vec<String>> = report
            .usdt
            .iter()
            .map(|probe| {
                vec![
                    probe.probe.clone(),
                    probe.target.clone(),
                    probe.hits.to_string(),
                ]
            })
            .collect();
        text += "\nUSDT probes\n";
        text += &layout(&header, &rows, 4);
    }
    if let Some(d) = &report.span_diagnostics {
        if d.overflows + d.read_failures + d.map_full + d.open_at_exit > 0 {
            text += &format!(
                "note: spans: {} starts beyond 8 open spans (not recorded), {} inconsistent reads, \
                 {} map-full drops (raise --max-spans), {} open when their \
                 thread exited (in no total)\n",
                d.overflows, d.read_failures, d.map_full, d.open_at_exit
            );
        }
        count_notes(
            &mut text,
            &[
                (
                    d.unmatched_ends,
                    "note: {n} span ends found no open span of their kind (started before \
                     counting)\n",
                ),
                (
                    d.arg_read_failures,
                    "note: {n} span keys could not be read from the probe's arguments (keyed 0 or \
                     empty)\n",
                ),
            ],
        );
    }
    text
}

/// A key cut to `KEY_WIDTH` characters, on one line.
fn shorten(key: &str) -> String {
    let flat: String = key
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= KEY_WIDTH {
        flat
    } else {
        let cut: String = flat.chars().take(KEY_WIDTH - 3).collect();
        format!("{cut}...")
    }
}
