//! Figures derived from the user's `-e` events rather than from a model's formulas.
//!
//! Knights Landing's OFFCORE_RESPONSE average-latency mode (../shared/seeds/libpfm-intel-knl.txt,
//! "average latency"): OFFCORE_RESPONSE_0 with the request types of interest and OUTSTANDING
//! alone, OFFCORE_RESPONSE_1 with the same request types and ANY_RESPONSE; "the average latency
//! for the request(s) is obtained by dividing the counts of OFFCORE_RESPONSE_0 by the count of
//! OFFCORE_RESPONSE_1. The ratio is expressed in core cycles." libpfm encodes each event alone
//! and cannot check that the requests match; the pairing here does, from the encodings.

use super::{CounterSource, Model};
use crate::events::attr::EventKind;

/// `PERF_TYPE_RAW`.
const RAW: u32 = 4;
/// OFFCORE_RESPONSE_0 and _1 on Knights Landing: event 0xB7 with umask 0x01 and 0x02 (Intel
/// perfmon knightslanding_core.json; libpfm4's `knl` table encodes the same).
const RESPONSE_0: u64 = 0x01b7;
const RESPONSE_1: u64 = 0x02b7;
/// MSR_OFFCORE_RSP_x bits, as libpfm4's `knl` table places them in config1: request types in
/// bits 0-15, ANY_RESPONSE bit 16, OUTSTANDING bit 38 (`knl::OFFCORE_RESPONSE_0:DMND_DATA_RD:
/// OUTSTANDING` is config1 0x4000000001).
const REQUEST_MASK: u64 = 0xffff;
const ANY_RESPONSE: u64 = 1 << 16;
const OUTSTANDING: u64 = 1 << 38;

/// A ratio of two counters, reported per entity beside the counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DerivedFigure {
    pub name: String,
    pub numerator: String,
    pub denominator: String,
    pub unit: &'static str,
}

impl DerivedFigure {
    /// numerator / denominator of `counts`; `None` when either is missing or nothing was
    /// counted below the line.
    pub fn value(&self, counts: &super::Counts) -> Option<f64> {
        let numerator = *counts.get(&self.numerator)?;
        let denominator = *counts.get(&self.denominator)?;
        (denominator != 0).then(|| numerator as f64 / denominator as f64)
    }
}

/// The derived figures `model`'s `-e` events allow: one offcore average latency per
/// OUTSTANDING / ANY_RESPONSE pair with the same request types, on Knights Landing/Mill only
/// (the bit layout is theirs).
pub fn derived_figures(model: &dyn Model) -> Vec<DerivedFigure> {
    if model.base_name() != "intel-knl" {
        return Vec::new();
    }
    let events: Vec<(String, u64, u64)> = model
        .counters()
        .into_iter()
        .filter_map(|spec| match spec.source {
            CounterSource::Event(attr) => match attr.kind {
                EventKind::Perf {
                    perf_type: RAW,
                    config,
                    config1,
                    ..
                } => Some((spec.name, config & 0xffff, config1)),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let mut figures = Vec::new();
    for (outstanding, _, requests) in events
        .iter()
        .filter(|(_, config, config1)| *config == RESPONSE_0 && config1 & OUTSTANDING != 0)
    {
        let partner = events.iter().find(|(_, config, config1)| {
            *config == RESPONSE_1
                && config1 & ANY_RESPONSE != 0
                && config1 & REQUEST_MASK == requests & REQUEST_MASK
        });
        if let Some((responses, _, _)) = partner {
            let name = if figures.is_empty() {
                "offcore_latency".to_owned()
            } else {
                format!("offcore_latency_{}", figures.len() + 1)
            };
            figures.push(DerivedFigure {
                name,
                numerator: outstanding.clone(),
                denominator: responses.clone(),
                unit: "core cycles",
            });
        }
    }
    figures
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{PmuCatalog, parse_event};
    use crate::model::{base_model, with_events::WithEvents};

    fn with(model: &str, specs: &[&str]) -> WithEvents {
        let catalog = PmuCatalog::load(std::path::Path::new("/nonexistent")).with_model(model);
        let events = specs
            .iter()
            .map(|spec| parse_event(spec, &catalog).expect("libpfm4 encodes the seed's examples"))
            .collect();
        WithEvents::new(base_model(model).expect("model"), events)
    }

    /// The seed's two examples of average-latency settings.
    #[test]
    fn the_seeds_latency_pairs_become_one_figure_each() {
        let model = with(
            "intel-knl",
            &[
                "knl::OFFCORE_RESPONSE_0:DMND_DATA_RD:OUTSTANDING",
                "knl::OFFCORE_RESPONSE_1:DMND_DATA_RD:ANY_RESPONSE",
            ],
        );
        let figures = derived_figures(&model);
        assert_eq!(
            figures,
            vec![DerivedFigure {
                name: "offcore_latency".to_owned(),
                numerator: "knl::OFFCORE_RESPONSE_0:DMND_DATA_RD:OUTSTANDING".to_owned(),
                denominator: "knl::OFFCORE_RESPONSE_1:DMND_DATA_RD:ANY_RESPONSE".to_owned(),
                unit: "core cycles",
            }]
        );
        let counts = [
            (figures[0].numerator.clone(), 3000),
            (figures[0].denominator.clone(), 12),
        ]
        .into_iter()
        .collect();
        assert_eq!(figures[0].value(&counts), Some(250.0));
        let none = [(figures[0].numerator.clone(), 3000)].into_iter().collect();
        assert_eq!(figures[0].value(&none), None);

        let two = with(
            "intel-knl",
            &[
                "knl::OFFCORE_RESPONSE_0:ANY_REQUEST:OUTSTANDING",
                "knl::OFFCORE_RESPONSE_1:ANY_REQUEST:ANY_RESPONSE",
            ],
        );
        assert_eq!(derived_figures(&two).len(), 1);
    }

    #[test]
    fn mismatched_requests_or_another_model_give_no_figure() {
        // Different request types: libpfm encodes both, but they do not pair.
        let mismatched = with(
            "intel-knl",
            &[
                "knl::OFFCORE_RESPONSE_0:DMND_DATA_RD:OUTSTANDING",
                "knl::OFFCORE_RESPONSE_1:ANY_REQUEST:ANY_RESPONSE",
            ],
        );
        assert!(derived_figures(&mismatched).is_empty());
        // Normal mode (no OUTSTANDING): two independent counts.
        let normal = with(
            "intel-knl",
            &[
                "knl::OFFCORE_RESPONSE_0:DMND_DATA_RD:ANY_RESPONSE",
                "knl::OFFCORE_RESPONSE_1:DMND_DATA_RD:ANY_RESPONSE",
            ],
        );
        assert!(derived_figures(&normal).is_empty());
        let skl = with("intel-skl", &["cycles"]);
        assert!(derived_figures(&skl).is_empty());
    }
}
