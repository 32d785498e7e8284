//! Span totals and USDT hits into the report: typed deltas per kind and key
//! ([`SpanAggregate`]), then entries named by kind and key ([`entries`]), where query texts are
//! normalised, entries of one normalised text merged, and helpers' spans (parallel workers)
//! folded into their query's figures.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use serde::{Deserialize, Serialize};
use topdown_common::usdt::{SpanKey, SpanStats, key_type, span_flags};

use super::{KindInfo, normalize::normalize};
use crate::{
    functions::distribution::{BucketCounts, Distribution},
    model::{Counts, Evaluator, Model},
    report::entity::Entity,
    session::{
        bpf::{SpanSnapshot, earlier_by_key},
        slot_counts::{SlotCounts, SlotNamer},
    },
};

/// One span kind, key and bucket's spans, as counted by the BPF side (abandoned and helpers'
/// spans under keys of their own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanCounts {
    pub key: SpanKey,
    pub spans: u64,
    /// Hash of a text seen with this key (0: none).
    pub text: u64,
    pub counts: SlotCounts,
}

/// Spans and hits counted since the baseline, or between two snapshots.
#[derive(Clone, Debug, Default)]
pub struct SpanAggregate {
    pub spans: Vec<SpanCounts>,
    pub texts: Arc<HashMap<u64, String>>,
    pub hits: Vec<u64>,
    pub stats: SpanStats,
}

impl SpanAggregate {
    /// Everything in `current`, or what happened since `previous`.
    pub fn since(current: &SpanSnapshot, previous: Option<&SpanSnapshot>) -> Self {
        let before: HashMap<SpanKey, (u64, SlotCounts)> = earlier_by_key(
            previous.map(|previous| previous.totals.as_slice()),
            |totals| (totals.spans, SlotCounts(totals.counters)),
        );
        let spans = current
            .totals
            .iter()
            .map(|(key, totals)| {
                let (spans, counts) = before.get(key).copied().unwrap_or_default();
                SpanCounts {
                    key: *key,
                    spans: totals.spans.saturating_sub(spans),
                    text: totals.text,
                    counts: SlotCounts(totals.counters) - counts,
                }
            })
            .filter(|span| previous.is_none() || span.spans != 0)
            .collect();
        let hits = current
            .hits
            .iter()
            .enumerate()
            .map(|(id, hits)| {
                let earlier = previous.and_then(|previous| previous.hits.get(id)).copied();
                hits.saturating_sub(earlier.unwrap_or(0))
            })
            .collect();
        let stats = match previous {
            Some(previous) => {
                span_stats_fieldwise(u64::saturating_sub, &current.stats, &previous.stats)
            }
            None => current.stats,
        };
        Self {
            spans,
            texts: Arc::clone(&current.texts),
            hits,
            stats,
        }
    }
}

/// `combine` of `a` and `b`, field by field.
pub fn span_stats_fieldwise(
    combine: fn(u64, u64) -> u64,
    a: &SpanStats,
    b: &SpanStats,
) -> SpanStats {
    fieldwise!(
        combine,
        SpanStats {
            overflows,
            unmatched_ends,
            read_failures,
            map_full,
            arg_read_failures,
            open_at_exit
        },
        a,
        b
    )
}

/// What a span entry's key is.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum SpanKeyType {
    /// The kind has no key: one entry.
    #[default]
    None,
    /// An integer argument of the start probe.
    Integer,
    /// A string (a query text, normalised for queries).
    Text,
    /// A PostgreSQL query id (signed, as `pg_stat_statements.queryid`).
    QueryId,
    /// A note value of another meaning.
    Note,
}

/// One span kind and key's totals: what `spans[]` holds in JSON.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SpanEntry {
    /// The span kind: a `--span` name, or `query` for `--postgres`.
    pub kind: String,
    /// The key as a string: the integer, the (normalised) text, the query id; empty for
    /// kinds without a key.
    pub key: String,
    pub key_type: SpanKeyType,
    /// A text seen with a key that is not one (the query of a query id), normalised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Spans that ended.
    pub calls: u64,
    /// Spans whose end never came (an error): closed at a later start or an abort probe.
    pub abandoned: u64,
    /// Helpers' spans folded into `counters` (PostgreSQL parallel workers): not calls.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub folded: u64,
    /// Counts from start to end of the spans that ended (and of folded helpers').
    #[serde(flatten)]
    pub entity: Entity,
    /// The abandoned spans' counts, up to where each was closed (not in `counters`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abandoned_counters: Option<Counts>,
    /// The spans that ended, by bucket of their count of the weight counter from start to end
    /// (nested spans included; abandoned spans and folded helpers' are not calls and are in no
    /// bucket). Absent when no span ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<Distribution>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Hits of one `-U` probe.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct UsdtEntry {
    pub target: String,
    /// `provider:name`.
    pub probe: String,
    pub hits: u64,
}

/// What the session's span kinds and `-U` probes are.
#[derive(Clone, Debug, Default)]
pub struct SpanNaming {
    pub kinds: Vec<KindInfo>,
    /// `(target, provider:name)` by hit id.
    pub hit_probes: Vec<(String, String)>,
}

/// One span kind and key as reports show it: abandoned and helpers' spans merged in, texts
/// normalised; counts still typed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MergedSpan {
    /// The kind's id (a helper kind's spans are under the kind they fold into).
    pub kind: u32,
    pub key_type: SpanKeyType,
    pub key: String,
    pub text: Option<String>,
    pub calls: u64,
    pub abandoned: u64,
    pub folded: u64,
    pub counts: SlotCounts,
    pub abandoned_counts: SlotCounts,
    /// The spans that ended, by bucket (several entries of one bucket when texts merged).
    pub buckets: Vec<BucketCounts>,
}

/// The kind, key type and key string `span` reports under, and the text behind it.
fn key_of(
    naming: &SpanNaming,
    span: &SpanCounts,
    texts: &HashMap<u64, String>,
) -> (u32, SpanKeyType, String, Option<String>) {
    let kind = naming.kinds.get(span.key.kind as usize);
    let shown_kind = kind
        .and_then(|kind| kind.folds_into)
        .unwrap_or(span.key.kind);
    let normalize_text = kind.is_some_and(|kind| kind.normalize_text);
    let text_of = |hash: u64| -> Option<String> {
        let text = texts.get(&hash)?;
        Some(if normalize_text {
            normalize(text)
        } else {
            text.clone()
        })
    };
    let (key_type, key) = match span.key.key_type {
        key_type::UNSIGNED => (SpanKeyType::Integer, span.key.key.to_string()),
        key_type::SIGNED => (SpanKeyType::Integer, (span.key.key as i64).to_string()),
        key_type::TEXT => (
            SpanKeyType::Text,
            text_of(span.key.key).unwrap_or_else(|| format!("#{:016x}", span.key.key)),
        ),
        key_type::NOTE if kind.is_some_and(|kind| kind.note_is_query_id) => {
            (SpanKeyType::QueryId, (span.key.key as i64).to_string())
        }
        key_type::NOTE => (SpanKeyType::Note, span.key.key.to_string()),
        _ => (SpanKeyType::None, String::new()),
    };
    let text = (key_type != SpanKeyType::Text && span.text != 0)
        .then(|| text_of(span.text))
        .flatten();
    (shown_kind, key_type, key, text)
}

/// Every kind and key of `aggregate` (its buckets added up), heaviest first by `weight_slot` (then by kind and key).
pub fn merge(
    naming: &SpanNaming,
    aggregate: &SpanAggregate,
    weight_slot: usize,
) -> Vec<MergedSpan> {
    let mut merged: BTreeMap<(u32, SpanKeyType, String), MergedSpan> = BTreeMap::new();
    for span in &aggregate.spans {
        let (kind, key_type, key, text) = key_of(naming, span, &aggregate.texts);
        let entry = merged
            .entry((kind, key_type, key.clone()))
            .or_insert_with(|| MergedSpan {
                kind,
                key_type,
                key,
                ..MergedSpan::default()
            });
        if entry.text.is_none() {
            entry.text = text;
        }
        if span.key.flags & span_flags::WORKER != 0 {
            entry.folded += span.spans;
            entry.counts += span.counts;
        } else if span.key.flags & span_flags::ABANDONED != 0 {
            entry.abandoned += span.spans;
            entry.abandoned_counts += span.counts;
        } else {
            entry.calls += span.spans;
            entry.counts += span.counts;
            entry.buckets.push(BucketCounts {
                bucket: span.key.bucket,
                calls: span.spans,
                counts: span.counts,
            });
        }
    }
    let mut rows: Vec<MergedSpan> = merged.into_values().collect();
    rows.sort_by(|a, b| {
        b.counts
            .get(weight_slot)
            .cmp(&a.counts.get(weight_slot))
            .then_with(|| (a.kind, a.key_type, &a.key).cmp(&(b.kind, b.key_type, &b.key)))
    });
    rows
}

impl SpanNaming {
    /// What reports call kind `id`.
    pub fn kind_name(&self, id: u32) -> String {
        self.kinds
            .get(id as usize)
            .map_or_else(|| format!("span #{id}"), |kind| kind.name.clone())
    }
}

/// The report's `spans` (heaviest first by the weight slot) and `usdt` entries.
pub fn entries(
    naming: &SpanNaming,
    aggregate: &SpanAggregate,
    model: &dyn Model,
    slot_names: &[String],
    level: u8,
) -> (Vec<SpanEntry>, Vec<UsdtEntry>) {
    let evaluator = Evaluator::new(model, slot_names);
    let namer = SlotNamer::new(slot_names);
    let weight_slot = slot_names
        .iter()
        .position(|name| name == model.weight_counter())
        .unwrap_or(0);
    let entity = |counts: &SlotCounts| {
        let evaluation = evaluator.evaluate(&counts.0, level);
        Entity {
            counters: namer.named(counts),
            metrics: evaluation.metrics,
            estimated: evaluation.estimated,
            ..Entity::default()
        }
    };
    let spans = merge(naming, aggregate, weight_slot)
        .into_iter()
        .map(|merged| {
            let distribution = (merged.calls > 0)
                .then(|| Distribution::of(model.weight_counter(), merged.buckets, &entity));
            SpanEntry {
                kind: naming.kind_name(merged.kind),
                key: merged.key,
                key_type: merged.key_type,
                text: merged.text,
                calls: merged.calls,
                abandoned: merged.abandoned,
                folded: merged.folded,
                entity: entity(&merged.counts),
                abandoned_counters: (merged.abandoned > 0)
                    .then(|| namer.named(&merged.abandoned_counts)),
                distribution,
            }
        })
        .collect();
    let usdt = naming
        .hit_probes
        .iter()
        .enumerate()
        .map(|(id, (target, probe))| UsdtEntry {
            target: target.clone(),
            probe: probe.clone(),
            hits: aggregate.hits.get(id).copied().unwrap_or(0),
        })
        .collect();
    (spans, usdt)
}
