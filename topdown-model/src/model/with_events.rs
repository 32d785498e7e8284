//! A model plus the user's `-e` events: counted and attributed with the model's counters,
//! reported as raw counts beside its metrics, never part of its formulas.

use super::{CounterSource, CounterSpec, CounterUse, Model};
use crate::events::attr::{EventAttr, EventKind, PERF_TYPE_SOFTWARE};

/// `PERF_TYPE_TRACEPOINT` (include/uapi/linux/perf_event.h).
const PERF_TYPE_TRACEPOINT: u32 = 2;

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

/// The counters of a model (with or without `-e` events) that only a hardware PMU can count,
/// split by whose they are: a VM without a virtual PMU fails on either, and the error has to
/// name the right one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HardwareNeeds {
    /// The model's own counters that need a hardware PMU (`slots`, `CPU_CLK_UNHALTED.THREAD`).
    pub model: Vec<String>,
    /// The user's `-e` specs that need one (`cycles`, `cpu/event=0x3c/`, `r01c2`).
    pub events: Vec<String>,
}

/// Sorts `model`'s counters into [`HardwareNeeds`]. Software and tracepoint counters need none.
pub fn hardware_needs(model: &dyn Model) -> HardwareNeeds {
    let mut needs = HardwareNeeds::default();
    for spec in model.counters() {
        match &spec.source {
            CounterSource::Perf { perf_type, .. } => {
                if *perf_type != PERF_TYPE_SOFTWARE && *perf_type != PERF_TYPE_TRACEPOINT {
                    needs.model.push(spec.name);
                }
            }
            CounterSource::Tracepoint { .. } => {}
            CounterSource::Event(event) => match &event.kind {
                EventKind::Perf { perf_type, .. }
                    if *perf_type != PERF_TYPE_SOFTWARE && *perf_type != PERF_TYPE_TRACEPOINT =>
                {
                    needs.events.push(event.name.clone());
                }
                EventKind::Perf { .. } | EventKind::Tracepoint { .. } => {}
            },
        }
    }
    needs
}

/// The one-line error for a VM without a virtual PMU (hypervisor flag set, no core PMU in
/// /sys/bus/event_source/devices) when `model`'s counters failed to open there: it names the
/// model when the model's own counters need the PMU, and otherwise the `-e` events that do
/// (`--pmu software -e cycles` fails because of `cycles`, not because of `software`).
pub fn missing_pmu_message(model: &dyn Model) -> String {
    const VM: &str = "this is a VM without a virtual PMU (hypervisor flag set, no core PMU in \
                      /sys/bus/event_source/devices)";
    let needs = hardware_needs(model);
    if needs.model.is_empty() && !needs.events.is_empty() {
        let events: Vec<String> = needs
            .events
            .iter()
            .map(|name| format!("-e {name}"))
            .collect();
        let (noun, verb) = if events.len() == 1 {
            ("a hardware event", "needs")
        } else {
            ("hardware events", "need")
        };
        return format!(
            "{} ({noun}, counted beside model {}) {verb} a hardware PMU, but {VM}: leave {} out, \
             or count software events (-e cpu-clock, -e page-faults) or tracepoints \
             (-e sched:sched_switch) instead",
            events.join(", "),
            model.name(),
            if events.len() == 1 { "it" } else { "them" },
        );
    }
    format!(
        "model {} needs a hardware PMU, but {VM}: use --pmu software, or --pmu synthetic:{} to \
         exercise the pipeline",
        model.name(),
        model.recorded_name()
    )
}

impl Model for WithEvents {
    super::formulas_of_inner!();

    fn name(&self) -> String {
        self.inner.name()
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

    fn is_synthetic(&self) -> bool {
        self.inner.is_synthetic()
    }

    fn synthetic_map(&self) -> Vec<(String, String)> {
        self.inner.synthetic_map()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::attr::Exclude;
    use crate::model::{base_model, model_by_name};

    fn event(name: &str, kind: EventKind) -> EventAttr {
        EventAttr {
            name: name.to_owned(),
            pmu: None,
            kind,
            exclude: None::<Exclude>,
        }
    }

    fn perf(perf_type: u32, config: u64) -> EventKind {
        EventKind::Perf {
            perf_type,
            config,
            config1: 0,
            config2: 0,
        }
    }

    /// The model `model` named with `events` counted beside it.
    fn beside(model: &str, events: Vec<EventAttr>) -> WithEvents {
        WithEvents::new(base_model(model).unwrap(), events)
    }

    /// `-e cycles`, the generic hardware event.
    fn cycles() -> EventAttr {
        event("cycles", perf(crate::events::attr::PERF_TYPE_HARDWARE, 0))
    }

    #[test]
    fn a_hardware_event_beside_the_software_model_is_named_as_the_cause() {
        let model = beside(
            "software",
            vec![
                cycles(),
                event("page-faults", perf(PERF_TYPE_SOFTWARE, 2)),
                event(
                    "sched:sched_switch",
                    EventKind::Tracepoint {
                        group: "sched".to_owned(),
                        name: "sched_switch".to_owned(),
                    },
                ),
            ],
        );
        assert_eq!(
            hardware_needs(&model),
            HardwareNeeds {
                model: vec![],
                events: vec!["cycles".to_owned()],
            }
        );
        let message = missing_pmu_message(&model);
        assert_eq!(
            message,
            "-e cycles (a hardware event, counted beside model software) needs a hardware PMU, \
             but this is a VM without a virtual PMU (hypervisor flag set, no core PMU in \
             /sys/bus/event_source/devices): leave it out, or count software events \
             (-e cpu-clock, -e page-faults) or tracepoints (-e sched:sched_switch) instead"
        );
    }

    #[test]
    fn several_hardware_events_are_all_named() {
        let model = beside(
            "software",
            vec![
                cycles(),
                event("r01c2", perf(crate::events::attr::PERF_TYPE_RAW, 0x01c2)),
            ],
        );
        let message = missing_pmu_message(&model);
        assert!(
            message.starts_with(
                "-e cycles, -e r01c2 (hardware events, counted beside model software) need"
            ),
            "{message}"
        );
        assert!(message.contains("leave them out"), "{message}");
    }

    #[test]
    fn a_hardware_model_is_named_even_with_hardware_events() {
        let model = beside("intel-icl", vec![cycles()]);
        let needs = hardware_needs(&model);
        assert_eq!(needs.model.first().map(String::as_str), Some("slots"));
        assert_eq!(needs.events, ["cycles"]);
        assert!(
            missing_pmu_message(&model).starts_with("model intel-icl needs a hardware PMU"),
            "{}",
            missing_pmu_message(&model)
        );
    }

    #[test]
    fn software_and_synthetic_models_need_no_hardware() {
        assert_eq!(
            hardware_needs(base_model("software").unwrap().as_ref()),
            HardwareNeeds::default()
        );
        // Syscall tracepoints stand in for the hardware events.
        let synthetic = model_by_name("synthetic:intel-icl", &[]).unwrap();
        assert!(hardware_needs(synthetic.as_ref()).model.is_empty());
    }
}
