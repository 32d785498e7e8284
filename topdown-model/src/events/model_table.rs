//! The events topdown's own models open, by name: the fallback when libpfm4 cannot encode a
//! name because the library is missing or lacks the PMU (4.13 has no Granite Rapids or Zen 5
//! table, and an x86 build has no Arm tables). Only the events a model's formulas use are here,
//! with the encodings the model itself opens (each cited in its model file); anything else still
//! needs libpfm4 or perf syntax.

use crate::model::{CounterSource, Model, base_model};

use super::{EventAttr, EventKind, Exclude, PmuCatalog, pfm};

/// libpfm PMU names this libpfm4 (4.13) lacks, and the topdown model whose counters cover their
/// TopDown events. Granite Rapids' Redwood Cove cores count TopDown as Sapphire Rapids' do
/// (one `intel-spr` model, docs/models.md's model table).
const PMUS_LIBPFM_LACKS: &[(&str, &str)] = &[
    ("gnr", "intel-spr"),
    ("amd64_fam1ah_zen5", "amd-zen5"),
    ("arm_n1", "arm-neoverse-n1"),
    ("arm_n2", "arm-neoverse-n2"),
    ("arm_n3", "arm-neoverse-n3"),
    ("arm_v1", "arm-neoverse-v1"),
    ("arm_v2", "arm-neoverse-v2"),
    ("arm_v3", "arm-neoverse-v3"),
];

/// Intel's names (perfmon's sapphirerapids/graniterapids core event lists) for the counters the
/// perf-metrics models name as the kernel does: fixed counter 3 and the PERF_METRICS fields.
const INTEL_NAMES: &[(&str, &str)] = &[
    ("slots", "TOPDOWN.SLOTS"),
    ("topdown-retiring", "PERF_METRICS.RETIRING"),
    ("topdown-bad-spec", "PERF_METRICS.BAD_SPECULATION"),
    ("topdown-fe-bound", "PERF_METRICS.FRONTEND_BOUND"),
    ("topdown-be-bound", "PERF_METRICS.BACKEND_BOUND"),
    ("topdown-heavy-ops", "PERF_METRICS.HEAVY_OPERATIONS"),
    ("topdown-br-mispredict", "PERF_METRICS.BRANCH_MISPREDICTS"),
    ("topdown-fetch-lat", "PERF_METRICS.FETCH_LATENCY"),
    ("topdown-mem-bound", "PERF_METRICS.MEMORY_BOUND"),
];

/// A spec found in a model's counter table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub attr: EventAttr,
    /// The model whose table had it (`intel-spr`).
    pub model: String,
    /// The counter's name there (`TOPDOWN.SLOTS`).
    pub counter: String,
}

/// Event names compare without case, with libpfm's `:` between event and umask read as perf's
/// `.` (`TOPDOWN:SLOTS` is `TOPDOWN.SLOTS`).
fn normalized(name: &str) -> String {
    name.to_ascii_uppercase().replace(':', ".")
}

/// The models a spec's names are looked up in: the `PMU::` prefix's, else the model in use
/// (both halves of a hybrid).
fn models_for(prefix: Option<&str>, catalog: &PmuCatalog) -> Vec<Box<dyn Model>> {
    let names: Vec<String> = match prefix {
        Some(pmu) => PMUS_LIBPFM_LACKS
            .iter()
            .filter(|(lacking, _)| *lacking == pmu)
            .map(|(_, model)| (*model).to_owned())
            .collect(),
        None => match catalog.model.as_deref() {
            Some(model) if !model.starts_with("synthetic:") => {
                match crate::model::hybrid::parse_name(model) {
                    Some((core, atom)) => vec![core.to_owned(), atom.to_owned()],
                    None => vec![model.to_owned()],
                }
            }
            _ => Vec::new(),
        },
    };
    names
        .iter()
        .filter_map(|name| base_model(name).ok())
        .collect()
}

/// Looks `spec` (`[PMU::]EVENT[.:]UMASK[:u|:k]`, or a bare perf-style name) up in the model
/// tables. Privilege modifiers `u` and `k` are the only ones taken: any other modifier needs
/// libpfm.
pub fn lookup(spec: &str, catalog: &PmuCatalog) -> Option<Found> {
    let (prefix, rest) = match spec.split_once("::") {
        Some((pmu, rest)) => (Some(pmu), rest),
        None => (None, spec),
    };
    let mut fields: Vec<&str> = rest.split(':').collect();
    let mut exclude: Option<Exclude> = None;
    while let Some(last) = fields.last().copied() {
        let (user, kernel) = match last {
            "u" => (true, false),
            "k" => (false, true),
            _ => break,
        };
        fields.pop();
        let mut modifiers = exclude.unwrap_or(Exclude {
            user: true,
            kernel: true,
            hv: true,
            ..Exclude::default()
        });
        modifiers.user &= !user;
        modifiers.kernel &= !kernel;
        exclude = Some(modifiers);
    }
    let wanted = normalized(&fields.join(":"));
    if wanted.is_empty() {
        return None;
    }
    for model in models_for(prefix, catalog) {
        for counter in model.counters() {
            let CounterSource::Perf { perf_type, config } = counter.source else {
                continue;
            };
            let intel_name = INTEL_NAMES
                .iter()
                .find(|(kernel, _)| *kernel == counter.name)
                .map(|(_, intel)| normalized(intel));
            if normalized(&counter.name) != wanted && intel_name.as_deref() != Some(&wanted) {
                continue;
            }
            return Some(Found {
                attr: EventAttr::perf(spec.to_owned(), None, perf_type, (config, 0, 0), exclude),
                model: model.name(),
                counter: counter.name.clone(),
            });
        }
    }
    None
}

/// The model table a prefixed spec fell back to, for the error when the event is not in it
/// either (`gnr::` -> `intel-spr`).
pub fn fallback_model(spec: &str) -> Option<&'static str> {
    let (pmu, _) = spec.split_once("::")?;
    PMUS_LIBPFM_LACKS
        .iter()
        .find(|(lacking, _)| *lacking == pmu)
        .map(|(_, model)| *model)
}

/// [`lookup`] as the encoding `topdown list -e` prints: the PMU column names the model table,
/// and the canonical name is the model's counter name.
pub fn encoding(found: &Found) -> Option<pfm::Encoding> {
    let EventKind::Perf {
        perf_type,
        config,
        config1,
        config2,
    } = found.attr.kind
    else {
        return None;
    };
    let exclude = found.attr.exclude.unwrap_or_default();
    Some(pfm::Encoding {
        pmu: format!("{} (topdown's table)", found.model),
        perf_type,
        config,
        config1,
        config2,
        exclude_user: exclude.user,
        exclude_kernel: exclude.kernel,
        exclude_hv: exclude.hv,
        fstr: found.counter.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(model: Option<&str>) -> PmuCatalog {
        let catalog = PmuCatalog::load(std::path::Path::new("/nonexistent"));
        match model {
            Some(model) => catalog.with_model(model),
            None => catalog,
        }
    }

    /// Expected words from the vendors' event lists, not from the model under test: Intel
    /// perfmon graniterapids_core.json TOPDOWN.SLOTS (fixed counter 3: event 0x00 umask 0x04),
    /// Arm Neoverse N2 TRM PMU events STALL_SLOT 0x3F, AMD PPR for family 1Ah
    /// (Zen 5) PMCx0C1 Retired Ops (ex_ret_ops).
    #[test]
    fn names_libpfm_4_13_lacks_are_taken_from_the_model_tables() {
        let gnr = lookup("gnr::TOPDOWN:SLOTS", &catalog(None)).expect("gnr");
        assert_eq!(gnr.model, "intel-spr");
        assert_eq!(
            gnr.attr.kind,
            EventKind::Perf {
                perf_type: 4,
                config: 0x0400,
                config1: 0,
                config2: 0
            }
        );
        let retiring = lookup("gnr::PERF_METRICS:RETIRING", &catalog(None)).expect("gnr metric");
        assert!(matches!(
            retiring.attr.kind,
            EventKind::Perf { config: 0x8000, .. }
        ));
        let n2 = lookup("arm_n2::STALL_SLOT", &catalog(None)).expect("arm_n2");
        assert_eq!(n2.model, "arm-neoverse-n2");
        assert!(matches!(n2.attr.kind, EventKind::Perf { config: 0x3f, .. }));
        let zen5 = lookup("ex_ret_ops", &catalog(Some("amd-zen5"))).expect("zen5");
        assert!(matches!(
            zen5.attr.kind,
            EventKind::Perf { config: 0xc1, .. }
        ));
        // The model in use decides unprefixed names; modifiers u and k set the exclude bits.
        let user = lookup("STALL_SLOT:u", &catalog(Some("arm-neoverse-v2"))).expect("v2");
        assert_eq!(user.model, "arm-neoverse-v2");
        let exclude = user.attr.exclude.expect("exclude bits");
        assert!(!exclude.user && exclude.kernel);
    }

    #[test]
    fn only_the_models_own_events_and_only_u_k_modifiers() {
        assert_eq!(
            lookup("gnr::MEM_LOAD_RETIRED:L3_MISS", &catalog(None)),
            None
        );
        assert_eq!(lookup("gnr::TOPDOWN:SLOTS:c=1", &catalog(None)), None);
        // A PMU libpfm has is never answered from a model table.
        assert_eq!(lookup("skl::INST_RETIRED:ANY", &catalog(None)), None);
        assert_eq!(lookup("STALL_SLOT", &catalog(None)), None);
        assert_eq!(lookup("gnr::", &catalog(None)), None);
    }
}
