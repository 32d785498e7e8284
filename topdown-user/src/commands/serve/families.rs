//! The exporter's families as the text encoder takes them: each family's name, help, type and
//! label names (`Spec`), and one collection's samples gathered by family (`Families`), in the
//! order `Registry::gather` gives. Below the exporter and its histogram families.

use std::collections::BTreeMap;

use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};

/// One exported family as `Desc` and the text encoder take it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spec {
    pub(super) name: &'static str,
    pub(super) help: &'static str,
    pub(super) kind: MetricType,
    /// Label names, in the order `Families::push` takes their values.
    pub(super) labels: &'static [&'static str],
}

pub(super) const fn spec(
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    labels: &'static [&'static str],
) -> Spec {
    Spec {
        name,
        help,
        kind,
        labels,
    }
}

/// The families of one collection, keyed (and so ordered) by name as `Registry::gather` orders
/// them.
#[derive(Default)]
pub(super) struct Families(BTreeMap<&'static str, MetricFamily>);

impl Families {
    /// Adds one histogram sample: `buckets` are `(le, cumulative calls)` by increasing `le`.
    pub(super) fn push_histogram(
        &mut self,
        spec: Spec,
        values: &[&str],
        buckets: &[(f64, u64)],
        count: u64,
        sum: f64,
    ) {
        let mut metric = proto::Metric::from_label(label_pairs(spec, values));
        metric.set_histogram(histogram_metric(buckets, count, sum));
        self.family(spec).mut_metric().push(metric);
    }

    fn family(&mut self, spec: Spec) -> &mut MetricFamily {
        self.0.entry(spec.name).or_insert_with(|| {
            let mut family = MetricFamily::default();
            family.set_name(spec.name.to_owned());
            family.set_help(spec.help.to_owned());
            family.set_field_type(spec.kind);
            family
        })
    }

    /// Adds one sample; `values` are the values of `spec.labels`, in that order.
    pub(super) fn push(&mut self, spec: Spec, values: &[&str], value: f64) {
        let mut metric = proto::Metric::from_label(label_pairs(spec, values));
        if spec.kind == MetricType::GAUGE {
            let mut gauge = proto::Gauge::default();
            gauge.set_value(value);
            metric.set_gauge(gauge);
        } else {
            let mut counter = proto::Counter::default();
            counter.set_value(value);
            metric.set_counter(counter);
        }
        self.family(spec).mut_metric().push(metric);
    }

    /// The families by name, each one's samples by label values: `Registry::gather`'s order
    /// (prometheus 0.14, src/registry.rs), so the exposition is stable across scrapes.
    pub(super) fn finish(self) -> Vec<MetricFamily> {
        self.0
            .into_values()
            .map(|mut family| {
                // Compared in place: a copy of the label values per comparison made this
                // sort the exporter's largest cost.
                family.mut_metric().sort_by(|a, b| {
                    fn values(metric: &proto::Metric) -> impl Iterator<Item = &str> {
                        metric.get_label().iter().map(|pair| pair.value())
                    }
                    a.get_label()
                        .len()
                        .cmp(&b.get_label().len())
                        .then_with(|| values(a).cmp(values(b)))
                });
                family
            })
            .collect()
    }
}

/// `values` as `spec`'s label pairs, sorted by name as the crate's own metrics write them.
fn label_pairs(spec: Spec, values: &[&str]) -> Vec<LabelPair> {
    debug_assert_eq!(values.len(), spec.labels.len(), "{}", spec.name);
    let mut labels: Vec<LabelPair> = spec
        .labels
        .iter()
        .zip(values)
        .map(|(name, value)| {
            let mut pair = LabelPair::default();
            pair.set_name((*name).to_owned());
            pair.set_value((*value).to_owned());
            pair
        })
        .collect();
    labels.sort();
    labels
}

/// A histogram sample as the text encoder writes it (`_bucket`, `_sum`, `_count`; `+Inf` is
/// added by the encoder from the count).
pub(super) fn histogram_metric(buckets: &[(f64, u64)], count: u64, sum: f64) -> proto::Histogram {
    let mut histogram = proto::Histogram::default();
    histogram.set_sample_count(count);
    histogram.set_sample_sum(sum);
    histogram.set_bucket(
        buckets
            .iter()
            .map(|(upper_bound, cumulative)| {
                let mut bucket = proto::Bucket::default();
                bucket.set_upper_bound(*upper_bound);
                bucket.set_cumulative_count(*cumulative);
                bucket
            })
            .collect(),
    );
    histogram
}
