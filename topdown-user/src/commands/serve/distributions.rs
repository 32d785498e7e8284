//! The exporter's per-call histograms: for each probed function with a series of its own, a
//! Prometheus histogram of its calls' inclusive weight per call (`crate::functions::distribution`:
//! bpftrace's `hist(n, 2)` buckets), accumulated over the refreshes, and the TopDown split of
//! the calls in the bucket that holds its 99th percentile.
//!
//! - `topdown_function_call_slots_bucket{function, target, le}`: calls whose weight is at most
//!   `le`, cumulative. A bucket `[low, high)` of integer counts is every value up to `high - 1`,
//!   which is its `le`; each function exports the `le` of every bucket its calls reached so
//!   far, and `+Inf`. `_count` is its calls, `_sum` the weight counter's total over them, as in
//!   `topdown_function_inclusive_slots_total{category="total"}`.
//! - `topdown_function_p99_band_slots{function, target, category, model}`: per category, the
//!   weight of the calls in the bucket holding the 99th percentile of all its calls so far
//!   (`category="total"`: all of it); `topdown_function_p99_band_le`: that bucket's `le`.
//!
//! The buckets are picked by the raw per-call count (probe cost included) and the sums are
//! compensated as the function series are (`crate::functions::distribution`, "Raw bounds,
//! compensated counters"). Under `--duty-cycle` the histograms hold the calls counted while the
//! probes were attached, not scaled: a histogram's shape is what a sample shows.

use std::collections::BTreeMap;

use prometheus::proto::MetricType;
use topdown_common::histogram;

use super::families::{Families, Spec, spec};
use crate::session::aggregate::{Aggregate, Naming};

/// Labels of a function's histogram: `function`, `target`.
pub type FunctionLabels = (String, String);

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

/// One bucket, accumulated.
#[derive(Clone, Debug, Default)]
struct BucketTally {
    calls: u64,
    /// `total` and each category's weight, as `Valuation::slots` gives them.
    values: Vec<(String, f64)>,
}

/// One function's histogram, accumulated.
#[derive(Clone, Debug, Default)]
struct FunctionHistogram {
    buckets: BTreeMap<u32, BucketTally>,
}

#[derive(Default)]
pub struct CallHistograms {
    functions: BTreeMap<FunctionLabels, FunctionHistogram>,
}

impl CallHistograms {
    /// Adds one refresh's histogram buckets of the functions `exported` says have series;
    /// `valuation(counts)`: `total` and each category's weight.
    pub fn update(
        &mut self,
        counts: &Aggregate,
        naming: &Naming<'_>,
        valuation: &dyn Fn(&crate::session::aggregate::SlotCounts) -> Vec<(String, f64)>,
        exported: &dyn Fn(&FunctionLabels) -> bool,
    ) {
        for ((id, _), buckets) in counts.function_histograms() {
            let (target, symbol) = naming.function(id);
            let labels = (symbol, target);
            if !exported(&labels) {
                continue;
            }
            let function = self.functions.entry(labels).or_default();
            for bucket in buckets {
                let tally = function.buckets.entry(bucket.bucket).or_default();
                tally.calls += bucket.calls;
                for (category, value) in valuation(&bucket.counts) {
                    match tally.values.iter_mut().find(|(name, _)| *name == category) {
                        Some((_, sum)) => *sum += value,
                        None => tally.values.push((category, value)),
                    }
                }
            }
        }
    }

    /// Forgets the histograms of functions whose series expired.
    pub fn retain(&mut self, exported: &dyn Fn(&FunctionLabels) -> bool) {
        self.functions.retain(|labels, _| exported(labels));
    }

    pub fn collect(&self, families: &mut Families, model: &str) {
        for ((function, target), histogram) in &self.functions {
            let labels = [function.as_str(), target.as_str()];
            let mut cumulative = 0;
            let mut sum = 0.0;
            let mut buckets = Vec::with_capacity(histogram.buckets.len());
            for (index, tally) in &histogram.buckets {
                cumulative += tally.calls;
                sum += total(tally);
                buckets.push((le(*index), cumulative));
            }
            families.push_histogram(CALL_SLOTS, &labels, &buckets, cumulative, sum);
            let Some((index, band)) = p99_bucket(histogram, cumulative) else {
                continue;
            };
            families.push(P99_BAND_LE, &labels, le(index));
            for (category, value) in &band.values {
                families.push(
                    P99_BAND_SLOTS,
                    &[function, target, category, model],
                    value.max(0.0),
                );
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
fn p99_bucket(histogram: &FunctionHistogram, calls: u64) -> Option<(u32, &BucketTally)> {
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
        let mut function = FunctionHistogram::default();
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
