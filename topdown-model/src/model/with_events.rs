//! A model plus the user's `-e` events: counted and attributed with the model's counters,
//! reported as raw counts beside its metrics, never part of its formulas.

use super::{CounterSource, CounterSpec, CounterUse, Counts, Metrics, Model};
use crate::events::{EventAttr, EventKind, PERF_TYPE_SOFTWARE};

/// The scheduling group extra events get: a level-1 group of its own, so they are always
/// counted, and pinned together with the model's when everything fits.
const EXTRA_EVENTS_GROUP: u8 = 7;

pub struct WithEvents {
    inner: Box<dyn Model>,
    events: Vec<EventAttr>,
}

impl WithEvents {
    pub fn new(inner: Box<dyn Model>, events: Vec<EventAttr>) -> Self {
        Self { inner, events }
    }

    /// The extra events' counter names, in order.
    pub fn event_names(&self) -> Vec<String> {
        self.events.iter().map(|event| event.name.clone()).collect()
    }
}

impl Model for WithEvents {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn base_name(&self) -> &'static str {
        self.inner.base_name()
    }

    fn recorded_name(&self) -> String {
        self.inner.recorded_name()
    }

    fn description(&self) -> &'static str {
        self.inner.description()
    }

    fn counters(&self) -> Vec<CounterSpec> {
        let mut specs = self.inner.counters();
        specs.extend(self.events.iter().map(|event| {
            let uses = match &event.kind {
                EventKind::Tracepoint { .. } => CounterUse::Software,
                EventKind::Perf { perf_type, .. } if *perf_type == PERF_TYPE_SOFTWARE => {
                    CounterUse::Software
                }
                EventKind::Perf { .. } => CounterUse::General,
            };
            CounterSpec {
                name: event.name.clone(),
                source: CounterSource::Event(event.clone()),
                group: EXTRA_EVENTS_GROUP,
                uses,
            }
        }));
        specs
    }

    fn max_level(&self) -> u8 {
        self.inner.max_level()
    }

    fn metrics(&self, counts: &Counts, level: u8) -> Metrics {
        self.inner.metrics(counts, level)
    }

    fn weight_counter(&self) -> &'static str {
        self.inner.weight_counter()
    }

    fn extra_l1_metrics(&self) -> &'static [&'static str] {
        self.inner.extra_l1_metrics()
    }

    fn slots(&self, counts: &Counts) -> Option<f64> {
        self.inner.slots(counts)
    }

    fn is_synthetic(&self) -> bool {
        self.inner.is_synthetic()
    }

    fn synthetic_map(&self) -> Vec<(String, String)> {
        self.inner.synthetic_map()
    }
}
