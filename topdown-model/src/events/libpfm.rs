//! libpfm-style specs, `[PMU::]EVENT[:UMASK...][:MOD[=VAL]]...`, encoded by libpfm4 itself
//! ([`super::pfm`]): every event, umask and modifier rule of every PMU libpfm knows (its
//! manuals, e.g. ../shared/seeds/libpfm-intel-knl.txt: `u k i e c=N t`, `e` needs `c>=1`,
//! `t` only on the fixed-counter events, OFFCORE_RESPONSE request/supplier/snoop umasks into
//! config1). The PMU is the spec's `PMU::` prefix, else the one of the model in use
//! ([`PmuCatalog::model`]), else the core PMU libpfm detects on this CPU, so a name is never
//! encoded with another vendor's codes.

use anyhow::Result;

use super::{EventAttr, Exclude, PmuCatalog, pfm};

/// The libpfm PMU an unprefixed spec is encoded for: the model's, when libpfm has one.
fn default_pmu(catalog: &PmuCatalog) -> Option<&'static str> {
    catalog.model.as_deref().and_then(pfm::pmu_for_model)
}

/// Whether the spec names a privilege modifier: then its exclude bits are the spec's own,
/// otherwise the run's `--all-user`/`--all-kernel` decide (libpfm would say "both").
fn names_privilege(spec: &str) -> bool {
    let rest = spec.split_once("::").map_or(spec, |(_, rest)| rest);
    rest.split(':').skip(1).any(|field| {
        let key = field.split_once('=').map_or(field, |(key, _)| key);
        matches!(key, "u" | "k" | "h")
    })
}

/// Encodes through libpfm4; see [`pfm::encode`].
pub fn encode(spec: &str, catalog: &PmuCatalog) -> Result<pfm::Encoding> {
    pfm::encode(spec, default_pmu(catalog))
}

pub fn parse(spec: &str, catalog: &PmuCatalog) -> Result<EventAttr> {
    parse_encoded(spec, catalog).map(|(attr, _)| attr)
}

/// [`parse`], also returning libpfm's encoding (its PMU name and canonical `fstr`).
pub fn parse_encoded(spec: &str, catalog: &PmuCatalog) -> Result<(EventAttr, pfm::Encoding)> {
    let encoding = match encode(spec, catalog) {
        Ok(encoding) => encoding,
        // libpfm4 is missing or lacks the PMU: the events topdown's own models open are still
        // known by name (super::model_table).
        Err(err) => match super::model_table::lookup(spec, catalog) {
            Some(found) => match super::model_table::encoding(&found) {
                Some(encoding) => return Ok((found.attr, encoding)),
                None => return Err(err),
            },
            None => {
                return Err(match super::model_table::fallback_model(spec) {
                    Some(model) => err.context(format!(
                        "not among the events topdown's {model} model opens either (its table \
                         has only those; `topdown list --pmu {model}` shows them)"
                    )),
                    None => err,
                });
            }
        },
    };
    let exclude = names_privilege(spec).then_some(Exclude {
        user: encoding.exclude_user,
        kernel: encoding.exclude_kernel,
        hv: encoding.exclude_hv,
        ..Exclude::default()
    });
    // A hybrid core PMU keeps its sysfs name, so the raw config goes to its dynamic type.
    let pmu = ["cpu_core", "cpu_atom"]
        .into_iter()
        .find(|name| catalog.pmus.get(*name).map(|pmu| pmu.perf_type) == Some(encoding.perf_type))
        .map(str::to_owned);
    let attr = EventAttr::perf(
        spec.to_owned(),
        pmu,
        encoding.perf_type,
        (encoding.config, encoding.config1, encoding.config2),
        exclude,
    );
    Ok((attr, encoding))
}
