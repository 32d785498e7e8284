//! The exporter's per-call histograms: for each probed function (and each span kind and key)
//! with a series of its own, a Prometheus histogram of its calls' inclusive weight per call (of
//! its spans' weight from start to end) (`crate::functions::distribution`: bpftrace's
//! `hist(n, 2)` buckets), accumulated over the refreshes, and the TopDown split of the calls in
//! the bucket that holds its 99th percentile.
//!
//! - `topdown_function_call_slots_bucket{function, target, le}`: calls whose weight is at most
//!   `le`, cumulative. A bucket `[low, high)` of integer counts is every value up to `high - 1`,
//!   which is its `le`; each function exports the `le` of every bucket its calls reached so
//!   far, and `+Inf`. `_count` is its calls, `_sum` the weight counter's total over them, as in
//!   `topdown_function_inclusive_slots_total{category="total"}`.
//! - `topdown_function_p99_band_slots{function, target, category, model}`: per category, the
//!   weight of the calls in the bucket holding the 99th percentile of all its calls so far
//!   (`category="total"`: all of it); `topdown_function_p99_band_le`: that bucket's `le`.
//! - `topdown_span_call_slots`, `topdown_span_p99_band_slots` and `topdown_span_p99_band_le`
//!   likewise per span kind and key (`span`, `key`, `text`), of the spans that ended.
//!
//! The buckets are picked by the raw per-call count (probe cost included) and the sums are
//! compensated as the function series are (`crate::functions::distribution`, "Raw bounds,
//! compensated counters"). Under `--duty-cycle` the histograms hold the calls counted while the
//! probes were attached, not scaled: a histogram's shape is what a sample shows.

use std::collections::BTreeMap;

use prometheus::proto::MetricType;
use topdown_common::histogram;

use super::families::{Families, Spec, spec};
use crate::{
    functions::distribution::BucketCounts,
    session::aggregate::{Aggregate, Naming, SlotCounts},
};

pub(super) const CALL_SLOTS: Spec = spec(
    "topdown_function_call_slots",
    "Calls of probed functions by their inclusive slots per call (cpu-clock ns with the software model), in bpftrace hist(n, 2) buckets",
    MetricType::HISTOGRAM,
    &["function", "target"],
);
pub(super) const P99_BAND_SLOTS: Spec = spec(
    "topdown_function_p99_band_slots",
    "Slots per TopDown category of the calls in the bucket holding the function's 99th percentile of slots per call, since start",
    MetricType::GAUGE,
    &["function", "target", "category", "model"],
);
pub(super) const P99_BAND_LE: Spec = spec(
    "topdown_function_p99_band_le",
    "Upper bound (le) of the bucket holding the function's 99th percentile of slots per call, since start",
    MetricType::GAUGE,
    &["function", "target"],
);
pub(super) const SPAN_SLOTS: Spec = spec(
    "topdown_span_call_slots",
    "Spans (queries) that ended by their slots from start to end (cpu-clock ns with the software model), per kind and key, in bpftrace hist(n, 2) buckets",
    MetricType::HISTOGRAM,
    &["span", "key", "text"],
);
pub(super) const SPAN_P99_BAND_SLOTS: Spec = spec(
    "topdown_span_p99_band_slots",
    "Slots per TopDown category of the spans in the bucket holding the kind and key's 99th percentile of slots per span, since start",
    MetricType::GAUGE,
    &["span", "key", "text", "category", "model"],
);
pub(super) const SPAN_P99_BAND_LE: Spec = spec(
    "topdown_span_p99_band_le",
    "Upper bound (le) of the bucket holding the kind and key's 99th percentile of slots per span, since start",
    MetricType::GAUGE,
    &["span", "key", "text"],
);

/// What the histograms are of: their three families, whose label values start with the
/// owner's (`function`, `target`; `span`, `key`, `text`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Of {
    histogram: Spec,
    band_slots: Spec,
    band_le: Spec,
}

pub(super) const FUNCTIONS: Of = Of {
    histogram: CALL_SLOTS,
    band_slots: P99_BAND_SLOTS,
    band_le: P99_BAND_LE,
};
pub(super) const SPANS: Of = Of {
    histogram: SPAN_SLOTS,
    band_slots: SPAN_P99_BAND_SLOTS,
    band_le: SPAN_P99_BAND_LE,
};

/// One bucket, accumulated.
#[derive(Clone, Debug, Default)]
struct BucketTally {
    calls: u64,
    /// `total` and each category's weight, as `Valuation::slots` gives them.
    values: Vec<(String, f64)>,
}

/// One owner's histogram, accumulated.
#[derive(Clone, Debug, Default)]
struct OwnerHistogram {
    buckets: BTreeMap<u32, BucketTally>,
}

/// The histograms of one kind of owner (functions or spans), by the owner's label values.
pub struct CallHistograms {
    of: Of,
    owners: BTreeMap<Vec<String>, OwnerHistogram>,
}

impl CallHistograms {
    pub(super) fn new(of: Of) -> Self {
        Self {
            of,
            owners: BTreeMap::new(),
        }
    }

    /// Adds one refresh's histogram buckets of the functions `exported` says have series;
    /// `valuation(counts)`: `total` and each category's weight.
    pub fn update(
        &mut self,
        counts: &Aggregate,
        naming: &Naming<'_>,
        valuation: &dyn Fn(&SlotCounts) -> Vec<(String, f64)>,
        exported: &dyn Fn(&[String]) -> bool,
    ) {
        for ((id, _), buckets) in counts.function_histograms() {
            let (target, symbol) = naming.function(id);
            let labels = vec![symbol, target];
            if exported(&labels) {
                self.add(labels, &buckets, valuation);
            }
        }
    }

    /// Adds `buckets` to the histogram of the owner with label values `labels`.
    pub fn add(
        &mut self,
        labels: Vec<String>,
        buckets: &[BucketCounts],
        valuation: &dyn Fn(&SlotCounts) -> Vec<(String, f64)>,
    ) {
        let owner = self.owners.entry(labels).or_default();
        for bucket in buckets {
            let tally = owner.buckets.entry(bucket.bucket).or_default();
            tally.calls += bucket.calls;
            for (category, value) in valuation(&bucket.counts) {
                match tally.values.iter_mut().find(|(name, _)| *name == category) {
                    Some((_, sum)) => *sum += value,
                    None => tally.values.push((category, value)),
                }
            }
        }
    }

    /// Forgets the histograms of owners whose series expired.
    pub fn retain(&mut self, exported: &dyn Fn(&[String]) -> bool) {
        self.owners.retain(|labels, _| exported(labels));
    }

    pub fn collect(&self, families: &mut Families, model: &str) {
        for (owner, histogram) in &self.owners {
            let labels: Vec<&str> = owner.iter().map(String::as_str).collect();
            let mut cumulative = 0;
            let mut sum = 0.0;
            let mut buckets = Vec::with_capacity(histogram.buckets.len());
            for (index, tally) in &histogram.buckets {
                cumulative += tally.calls;
                sum += total(tally);
                buckets.push((le(*index), cumulative));
            }
            families.push_histogram(self.of.histogram, &labels, &buckets, cumulative, sum);
            let Some((index, band)) = p99_bucket(histogram, cumulative) else {
                continue;
            };
            families.push(self.of.band_le, &labels, le(index));
            for (category, value) in &band.values {
                let mut values = labels.clone();
                values.extend([category.as_str(), model]);
                families.push(self.of.band_slots, &values, value.max(0.0));
            }
        }
    }
}

/// The `le` of bucket `index`: its highest integer value.
fn le(index: u32) -> f64 {
    let (_, high) = histogram::bounds(index);
    (high - 1) as f64
}

fn total(tally: &BucketTally) -> f64 {
    tally
        .values
        .iter()
        .find(|(name, _)| name == "total")
        .map_or(0.0, |(_, value)| *value)
}

/// The bucket whose cumulative calls first reach 99% of `calls`.
fn p99_bucket(histogram: &OwnerHistogram, calls: u64) -> Option<(u32, &BucketTally)> {
    let rank = 0.99 * calls as f64;
    let mut cumulative = 0;
    histogram
        .buckets
        .iter()
        .find(|(_, tally)| {
            cumulative += tally.calls;
            tally.calls > 0 && cumulative as f64 >= rank
        })
        .map(|(index, tally)| (*index, tally))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn le_is_each_buckets_highest_value_and_p99_is_cumulative() {
        assert_eq!(le(histogram::bucket(10)), 11.0);
        assert_eq!(le(histogram::bucket(1000)), 1023.0);
        assert_eq!(le(0), 0.0);
        let mut function = OwnerHistogram::default();
        for (weight, calls) in [(10, 1000), (1000, 30)] {
            function.buckets.insert(
                histogram::bucket(weight),
                BucketTally {
                    calls,
                    values: vec![("total".to_owned(), (calls * weight) as f64)],
                },
            );
        }
        let (index, band) = p99_bucket(&function, 1030).unwrap();
        assert_eq!((le(index), band.calls), (1023.0, 30));
        // With 10 slow calls of 1010 (1%), the p99's call is the 1000th: a fast one.
        function
            .buckets
            .get_mut(&histogram::bucket(1000))
            .unwrap()
            .calls = 10;
        let (index, _) = p99_bucket(&function, 1010).unwrap();
        assert_eq!(le(index), 11.0);
    }
}
