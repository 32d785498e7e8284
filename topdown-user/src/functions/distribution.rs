//! Per-call distributions: which calls are slow, and why. The BPF side adds each probed call's
//! inclusive counts to the bucket its weight picks (`topdown_common::histogram`: bpftrace's
//! `hist(n, 2)` layout); here the buckets of one owner (a probed function, per process if
//! split) become a [`Distribution`]: every bucket with its calls, counters and metrics (its own
//! TopDown split), and the percentiles of the per-call weight.
//!
//! Nothing here knows what the calls are of: a function's buckets and any other owner's
//! (`HistogramKey::kind`) make the same type.
//!
//! # Percentiles
//!
//! Estimated within their bucket by linear interpolation, as Prometheus' `histogram_quantile`
//! does: the q-th percentile of N calls has rank `r = q N`; in the bucket `[low, high)` with `c`
//! calls after `before` calls in lower buckets (`before < r <= before + c`) it is
//! `low + (high - low) (r - before) / c`. It is exact when the calls of that bucket are spread
//! evenly over it; in any case it lies within the bucket that holds the percentile's call.
//!
//! # Raw bounds, compensated counters
//!
//! The BPF side picks a call's bucket from its count as measured, the probes' own cost
//! included: the probe cost is measured at start, after the programs are loaded, and it is a
//! figure of the machine's speed then, not a constant to bake into the kernel side. So bucket
//! bounds and percentiles are of *raw* per-call counts. The counters of each bucket are then
//! compensated like the function totals (`crate::functions::calibration`):
//! `calls x P + callee_calls x T` is taken out of the bucket's sums, so the buckets add up to the
//! function's inclusive figures and each bucket's TopDown split is free of the probes' cost. For
//! one call the compensation is a constant: `P` for a call without probed callees (a leaf),
//! `P + n T` for one with `n`. A leaf's bucket `[low, high)` therefore holds calls whose
//! compensated count lies in `[low - P, high - P)`, and its compensated percentiles are the raw
//! ones minus `P`; [`Distribution::probe_cost`] gives `P` and `T` in the weight counter. On
//! synthetic counters `P = T = 0` exactly: raw and compensated are the same.

use serde::{Deserialize, Serialize};
use topdown_common::histogram;

use crate::{report::entity::Entity, session::slot_counts::SlotCounts};

/// The calls of one owner, by bucket of their weight.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Distribution {
    /// The counter whose per-call count picks a call's bucket (`slots`, `cpu-clock`).
    pub weight: String,
    /// Buckets with calls, by increasing `low`.
    pub buckets: Vec<Bucket>,
    /// Of the per-call weight; absent without calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentiles: Option<Percentiles>,
    /// The probes' own cost in the weight counter that `low`, `high` and the percentiles
    /// include and the buckets' counters do not (module documentation); absent when nothing
    /// was compensated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_cost: Option<ProbeCost>,
}

/// One bucket: calls whose weight lies in `[low, high)`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Bucket {
    pub low: u64,
    pub high: u64,
    pub calls: u64,
    /// Sums of the calls' inclusive counters, and their metrics.
    #[serde(flatten)]
    pub entity: Entity,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// `P` and `T` of `crate::functions::calibration`, in the weight counter.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProbeCost {
    /// Counted in every call.
    pub per_call: f64,
    /// Counted in a call once per probed callee that returned inside it.
    pub per_callee: f64,
}

/// One bucket as counted: its index (`histogram::bucket`), calls and summed counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketCounts {
    pub bucket: u32,
    pub calls: u64,
    pub counts: SlotCounts,
}

impl Distribution {
    /// The distribution of `buckets` (any order; several entries of one index add up), each
    /// bucket's counts named and evaluated by `entity`.
    pub fn of(
        weight: &str,
        buckets: impl IntoIterator<Item = BucketCounts>,
        entity: &dyn Fn(&SlotCounts) -> Entity,
    ) -> Self {
        let mut merged: std::collections::BTreeMap<u32, (u64, SlotCounts)> =
            std::collections::BTreeMap::new();
        for bucket in buckets {
            let sum = merged.entry(bucket.bucket).or_default();
            sum.0 += bucket.calls;
            sum.1 += bucket.counts;
        }
        let buckets: Vec<Bucket> = merged
            .into_iter()
            .filter(|(_, (calls, _))| *calls > 0)
            .map(|(index, (calls, counts))| {
                let (low, high) = histogram::bounds(index);
                Bucket {
                    low,
                    high,
                    calls,
                    entity: entity(&counts),
                }
            })
            .collect();
        let mut distribution = Self {
            weight: weight.to_owned(),
            buckets,
            percentiles: None,
            probe_cost: None,
        };
        distribution.percentiles = distribution.estimate_percentiles();
        distribution
    }

    pub fn calls(&self) -> u64 {
        self.buckets.iter().map(|bucket| bucket.calls).sum()
    }

    /// The calls of the fullest bucket, which the histograms scale their bars to (1 without
    /// buckets).
    pub fn most_calls(&self) -> u64 {
        self.buckets
            .iter()
            .map(|bucket| bucket.calls)
            .max()
            .unwrap_or(1)
    }

    /// p50, p90 and p99 of the buckets (module documentation), `None` without calls.
    pub fn estimate_percentiles(&self) -> Option<Percentiles> {
        Some(Percentiles {
            p50: self.percentile(0.50)?,
            p90: self.percentile(0.90)?,
            p99: self.percentile(0.99)?,
        })
    }

    /// The `quantile` (0..=1) of the per-call weight, interpolated within its bucket.
    pub fn percentile(&self, quantile: f64) -> Option<f64> {
        let index = self.bucket_of(quantile)?;
        let before: u64 = self.buckets[..index].iter().map(|b| b.calls).sum();
        let bucket = &self.buckets[index];
        let rank = quantile.clamp(0.0, 1.0) * self.calls() as f64;
        let within = ((rank - before as f64) / bucket.calls as f64).clamp(0.0, 1.0);
        Some(bucket.low as f64 + (bucket.high - bucket.low) as f64 * within)
    }

    /// The index in `buckets` of the bucket holding the `quantile`'s call: the first whose
    /// cumulative calls reach `quantile x calls` (the lowest bucket with calls for 0).
    pub fn bucket_of(&self, quantile: f64) -> Option<usize> {
        let total = self.calls();
        if total == 0 {
            return None;
        }
        let rank = quantile.clamp(0.0, 1.0) * total as f64;
        let mut cumulative = 0;
        for (index, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.calls;
            if bucket.calls > 0 && cumulative as f64 >= rank {
                return Some(index);
            }
        }
        Some(self.buckets.len() - 1)
    }

    /// The band of calls around `quantile`: the percentile's value and the bucket holding it.
    pub fn band(&self, quantile: f64) -> Option<(f64, &Bucket)> {
        Some((
            self.percentile(quantile)?,
            &self.buckets[self.bucket_of(quantile)?],
        ))
    }

    /// Every bucket's entity, for recomputing metrics.
    pub fn entities_mut(&mut self) -> impl Iterator<Item = &mut Entity> {
        self.buckets.iter_mut().map(|bucket| &mut bucket.entity)
    }
}

/// Why calls of `entity` are slow, in a few words: its largest level-1 category and, where
/// the report has level 2, the largest level-2 one, e.g. `backend_bound 62% (memory_bound
/// 48%)`; `None` without TopDown metrics (the software model).
pub fn dominant_categories(entity: &Entity) -> Option<String> {
    use crate::model::{L1_METRICS, L2_METRICS};
    let largest = |names: &[&str]| -> Option<(String, f64)> {
        names
            .iter()
            .filter_map(|name| {
                let value = entity.metrics.get(name).copied().flatten()?;
                value.is_finite().then(|| ((*name).to_owned(), value))
            })
            .fold(
                None,
                |best: Option<(String, f64)>, (name, value)| match best {
                    Some((_, top)) if top >= value => best,
                    _ => Some((name, value)),
                },
            )
    };
    let (level_one, share) = largest(&L1_METRICS)?;
    let mut text = format!("{level_one} {:.0}%", 100.0 * share);
    if let Some((level_two, share)) = largest(&L2_METRICS) {
        text += &format!(" ({level_two} {:.0}%)", 100.0 * share);
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(weight: u64) -> SlotCounts {
        let mut counts = SlotCounts::ZERO;
        counts.0[0] = weight;
        counts
    }

    fn plain(counts: &SlotCounts) -> Entity {
        Entity {
            counters: [("slots".to_owned(), counts.0[0])].into_iter().collect(),
            ..Entity::default()
        }
    }

    fn of_calls(calls: &[(u64, u64)]) -> Distribution {
        Distribution::of(
            "slots",
            calls.iter().map(|&(n, weight)| BucketCounts {
                bucket: histogram::bucket(weight),
                calls: n,
                counts: counts(n * weight),
            }),
            &plain,
        )
    }

    /// The case: 1000 calls of 10 and 30 calls of 1000 slots.
    #[test]
    fn two_bands_give_two_buckets_and_percentiles_inside_them() {
        let distribution = of_calls(&[(1000, 10), (30, 1000)]);
        let buckets: Vec<(u64, u64, u64, u64)> = distribution
            .buckets
            .iter()
            .map(|b| (b.low, b.high, b.calls, b.entity.counters["slots"]))
            .collect();
        assert_eq!(buckets, [(10, 12, 1000, 10_000), (896, 1024, 30, 30_000)]);
        let percentiles = distribution.percentiles.unwrap();
        // Rank 515 of 1030: 515/1000 into [10, 12).
        assert!((percentiles.p50 - 11.03).abs() < 1e-9, "{percentiles:?}");
        // Rank 927: 927/1000 into [10, 12).
        assert!((percentiles.p90 - 11.854).abs() < 1e-9, "{percentiles:?}");
        // Rank 1019.7: 19.7/30 into [896, 1024).
        assert!(
            (percentiles.p99 - (896.0 + 128.0 * 19.7 / 30.0)).abs() < 1e-9,
            "{percentiles:?}"
        );
        assert_eq!(distribution.bucket_of(0.5), Some(0));
        assert_eq!(distribution.bucket_of(0.99), Some(1));
    }

    /// Interpolation reaches each bucket's ends exactly at its cumulative ranks.
    #[test]
    fn percentiles_interpolate_linearly_within_a_bucket() {
        // 100 calls in [16, 20), 100 in [32, 40).
        let distribution = of_calls(&[(100, 17), (100, 33)]);
        assert_eq!(distribution.percentile(0.0), Some(16.0));
        assert_eq!(distribution.percentile(0.25), Some(18.0));
        assert_eq!(distribution.percentile(0.5), Some(20.0));
        assert_eq!(distribution.percentile(0.75), Some(36.0));
        assert_eq!(distribution.percentile(1.0), Some(40.0));
        // A single call: every percentile within its one bucket.
        let one = of_calls(&[(1, 5)]);
        assert_eq!(one.percentile(0.5), Some(5.5));
        assert_eq!(of_calls(&[]).percentiles, None);
    }

    /// Entries of one bucket (several processes, or CPUs) add up; empty buckets are dropped.
    #[test]
    fn entries_of_one_bucket_merge() {
        let distribution = Distribution::of(
            "slots",
            [
                BucketCounts {
                    bucket: 9,
                    calls: 3,
                    counts: counts(30),
                },
                BucketCounts {
                    bucket: 2,
                    calls: 0,
                    counts: counts(0),
                },
                BucketCounts {
                    bucket: 9,
                    calls: 2,
                    counts: counts(21),
                },
            ],
            &plain,
        );
        assert_eq!(distribution.buckets.len(), 1);
        assert_eq!(
            (distribution.buckets[0].calls, distribution.buckets[0].low),
            (5, 10)
        );
        assert_eq!(distribution.buckets[0].entity.counters["slots"], 51);
    }
}
