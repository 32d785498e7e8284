//! `-e/--event SPEC`: extra events counted beside TopDown and attributed like it.
//!
//! Two syntaxes, told apart by shape:
//!
//! - **perf** (`perf stat -e`): `PMU/term=value,flag,alias/MODS` (terms placed by the PMU's
//!   `format/` files, aliases expanded from its `events/`), `rNNNN` (a raw core-PMU config in
//!   hex), a generic or sysfs event name (`cycles`, `cpu-clock`, `topdown-retiring`), or a
//!   tracepoint `group:name`. Modifiers follow a `:` (`cycles:u`) or the closing `/`:
//!   `u` user, `k` kernel, `h` hypervisor (naming any of these excludes the others), `H` host
//!   only, `G` guest only, `I` exclude idle.
//! - **libpfm** (`[PMU::]EVENT[:UMASK]...[:MOD[=VAL]]...`): encoded by libpfm4, loaded at run
//!   time ([`pfm`], [`libpfm`]), for the `PMU::` named (any PMU libpfm knows, present here or
//!   not), else the model's PMU, else the one libpfm detects. Without libpfm.so.4 these names
//!   fail with one line naming the `libpfm4` package; perf syntax needs no library.
//!
//! A spec containing `/`, starting with `r` plus hex digits, or whose first `:`-field is not
//! upper case is perf syntax; `PMU::...` or an upper-case first field is libpfm. So
//! `sched:sched_switch` is a tracepoint and `INT_MISC:RECOVERY_CYCLES` a libpfm event.
//!
//! Arm (topdown-formulas.md §5 PMUs, ../shared/seeds/arm64-perf-attributes.txt): `:u` excludes
//! EL1/EL2 and counts EL0. `:k` counts the kernel: EL1 on a non-VHE host, EL1 *and* EL2 on a VHE
//! host (the host kernel runs at EL2 there, and `exclude_hv` is ignored because the host kernel
//! is the hypervisor); in a guest, EL1 only (EL2 is never counted in a guest). `:h` on a
//! non-VHE host counts EL2 (the hypervisor's guest/host transitions). `:H`/`:G` set
//! `exclude_guest`/`exclude_host`; KVM then switches counting at guest entry and exit, with a
//! short blind window on non-VHE hosts.

pub mod attr;
pub mod catalog;
pub mod libpfm;
pub mod model_table;
pub mod pfm;

use anyhow::{Result, bail};

pub use catalog::PmuCatalog;
use catalog::{CatalogPmu, ConfigWord};

pub use attr::{
    EventAttr, EventKind, Exclude, PERF_TYPE_HARDWARE, PERF_TYPE_RAW, PERF_TYPE_SOFTWARE,
};

/// Parses one `-e` spec against the machine's PMUs.
pub fn parse_event(spec: &str, catalog: &PmuCatalog) -> Result<EventAttr> {
    let spec_trimmed = spec.trim();
    if spec_trimmed.is_empty() {
        bail!("empty event spec: give e.g. -e cycles, -e cpu/event=0x3c/ or -e INST_RETIRED:ANY");
    }
    if spec_trimmed.len() > 512 {
        bail!("event spec longer than 512 characters");
    }
    let result = if is_libpfm(spec_trimmed) {
        libpfm::parse(spec_trimmed, catalog)
    } else {
        parse_perf(spec_trimmed, catalog).or_else(|err| {
            // perf's own name for an event of a model whose PMU is not on this machine
            // (`ex_ret_ops` with --pmu amd-zen5 on Intel): the model's table has it.
            if spec_trimmed.contains('/') {
                return Err(err);
            }
            model_table::lookup(spec_trimmed, catalog)
                .map(|found| found.attr)
                .ok_or(err)
        })
    };
    result.map_err(|err| anyhow::anyhow!("event '{spec_trimmed}': {err:#}"))
}

/// A spec's encoding as `topdown list -e` prints it (libpfm's `check_events`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Description {
    pub attr: EventAttr,
    /// libpfm's PMU name (`knl`) for libpfm syntax, the sysfs PMU for perf syntax.
    pub pmu: Option<String>,
    /// libpfm's canonical name with every modifier (`fstr`); `None` for perf syntax.
    pub fstr: Option<String>,
}

/// Parses a spec as [`parse_event`] does and keeps what libpfm said about it.
pub fn describe(spec: &str, catalog: &PmuCatalog) -> Result<Description> {
    let spec_trimmed = spec.trim();
    if is_libpfm(spec_trimmed) && spec_trimmed.len() <= 512 {
        let (attr, encoding) = libpfm::parse_encoded(spec_trimmed, catalog)
            .map_err(|err| anyhow::anyhow!("event '{spec_trimmed}': {err:#}"))?;
        return Ok(Description {
            attr,
            pmu: Some(encoding.pmu),
            fstr: Some(encoding.fstr),
        });
    }
    let attr = parse_event(spec, catalog)?;
    if let Some(found) =
        model_table::lookup(spec_trimmed, catalog).filter(|found| found.attr == attr)
        && parse_perf(spec_trimmed, catalog).is_err()
    {
        return Ok(Description {
            pmu: Some(format!("{} (topdown's table)", found.model)),
            fstr: Some(found.counter),
            attr,
        });
    }
    Ok(Description {
        pmu: attr.pmu.clone(),
        attr,
        fstr: None,
    })
}

/// The syntax rule of the module documentation.
fn is_libpfm(spec: &str) -> bool {
    if spec.contains('/') {
        return false;
    }
    if spec.contains("::") {
        return true;
    }
    let first = spec.split(':').next().unwrap_or("");
    first.chars().any(|c| c.is_ascii_uppercase())
        && first
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_' || c == '.')
}

/// perf's event modifiers.
pub fn parse_modifiers(text: &str) -> Result<Exclude> {
    let mut counted = (false, false, false);
    let mut exclude = Exclude::default();
    for modifier in text.chars() {
        match modifier {
            'u' => counted.0 = true,
            'k' => counted.1 = true,
            'h' => counted.2 = true,
            'H' => exclude.guest = true,
            'G' => exclude.host = true,
            'I' => exclude.idle = true,
            'p' | 'P' | 'S' | 'D' | 'W' | 'e' => bail!(
                "modifier '{modifier}' is for sampling or pinning in perf record; topdown counts \
                 every event exactly and needs none"
            ),
            other => bail!("unknown modifier '{other}': use u, k, h, H, G or I"),
        }
    }
    if exclude.host && exclude.guest {
        bail!("modifiers H (host only) and G (guest only) exclude each other");
    }
    if counted.0 || counted.1 || counted.2 {
        exclude.user = !counted.0;
        exclude.kernel = !counted.1;
        exclude.hv = !counted.2;
    }
    Ok(exclude)
}

/// perf's generic hardware and software event names.
fn generic_event(name: &str) -> Option<(u32, u64)> {
    let hardware = match name {
        "cycles" | "cpu-cycles" => Some(0),
        "instructions" => Some(1),
        "cache-references" => Some(2),
        "cache-misses" => Some(3),
        "branches" | "branch-instructions" => Some(4),
        "branch-misses" => Some(5),
        "bus-cycles" => Some(6),
        "stalled-cycles-frontend" | "idle-cycles-frontend" => Some(7),
        "stalled-cycles-backend" | "idle-cycles-backend" => Some(8),
        "ref-cycles" => Some(9),
        _ => None,
    };
    if let Some(config) = hardware {
        return Some((PERF_TYPE_HARDWARE, config));
    }
    let software = match name {
        "cpu-clock" => 0,
        "task-clock" => 1,
        "page-faults" | "faults" => 2,
        "context-switches" | "cs" => 3,
        "cpu-migrations" | "migrations" => 4,
        "minor-faults" => 5,
        "major-faults" => 6,
        "alignment-faults" => 7,
        "emulation-faults" => 8,
        _ => return None,
    };
    Some((PERF_TYPE_SOFTWARE, software))
}

fn parse_number(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) if !hex.is_empty() => u64::from_str_radix(hex, 16).ok(),
        Some(_) => None,
        None => text.parse().ok(),
    }
}

fn is_identifier(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

fn parse_perf(spec: &str, catalog: &PmuCatalog) -> Result<EventAttr> {
    let name = spec.to_owned();
    if let Some((pmu_name, rest)) = spec.split_once('/') {
        let Some((terms, modifiers)) = rest.rsplit_once('/') else {
            bail!("perf syntax PMU/terms/ needs a closing '/'");
        };
        let modifiers = modifiers.strip_prefix(':').unwrap_or(modifiers);
        let Some(pmu) = catalog.pmus.get(pmu_name) else {
            let known: Vec<&str> = catalog.pmus.keys().map(String::as_str).collect();
            bail!(
                "no PMU '{pmu_name}' in /sys/bus/event_source/devices (this machine has: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(" ")
                }
            );
        };
        return Ok(EventAttr::perf(
            name,
            Some(pmu.name.clone()),
            pmu.perf_type,
            apply_terms(pmu, terms)?,
            exclusion(modifiers)?,
        ));
    }
    let (event, modifiers) = match spec.split_once(':') {
        Some((event, rest)) => (event, Some(rest)),
        None => (spec, None),
    };
    // The forms below name the event as written and take the modifiers after ':'.
    let perf_event = |pmu: Option<String>, perf_type: u32, words: (u64, u64, u64)| {
        let exclude = exclusion(modifiers.unwrap_or(""))?;
        Ok(EventAttr::perf(
            name.clone(),
            pmu,
            perf_type,
            words,
            exclude,
        ))
    };
    // rNNNN: a raw config for the core PMU.
    if let Some(hex) = event.strip_prefix('r')
        && !hex.is_empty()
        && hex.chars().all(|c| c.is_ascii_hexdigit())
    {
        let Ok(config) = u64::from_str_radix(hex, 16) else {
            bail!("raw config r{hex} does not fit 64 bits");
        };
        return perf_event(None, PERF_TYPE_RAW, (config, 0, 0));
    }
    if event == "task-clock" {
        bail!(
            "task-clock counts one task's time, but topdown's counters are per CPU (it would read \
             0): use cpu-clock, which topdown attributes per task"
        );
    }
    if let Some((perf_type, config)) = generic_event(event) {
        return perf_event(None, perf_type, (config, 0, 0));
    }
    if let Some(pmu) = catalog
        .core_pmus()
        .into_iter()
        .find(|pmu| pmu.events.contains_key(event))
    {
        return perf_event(
            Some(pmu.name.clone()),
            pmu.perf_type,
            apply_terms(pmu, event)?,
        );
    }
    match modifiers {
        Some(tracepoint) if is_identifier(event) && is_identifier(tracepoint) => Ok(EventAttr {
            name,
            pmu: None,
            kind: EventKind::Tracepoint {
                group: event.to_owned(),
                name: tracepoint.to_owned(),
            },
            exclude: None,
        }),
        _ => bail!(
            "unknown event '{event}': not a generic event (cycles, instructions, cpu-clock, ...), \
             not in the core PMU's events/, not rNNNN, PMU/terms/ or group:tracepoint \
             (`topdown list` shows the PMUs)"
        ),
    }
}

fn exclusion(modifiers: &str) -> Result<Option<Exclude>> {
    if modifiers.is_empty() {
        Ok(None)
    } else {
        parse_modifiers(modifiers).map(Some)
    }
}

/// Applies `term=value,flag,alias` terms on a PMU; aliases expand (once) to their terms.
fn apply_terms(pmu: &CatalogPmu, terms: &str) -> Result<(u64, u64, u64)> {
    let mut words = [0u64; 3];
    apply_terms_into(pmu, terms, &mut words, 0)?;
    Ok((words[0], words[1], words[2]))
}

fn apply_terms_into(pmu: &CatalogPmu, terms: &str, words: &mut [u64; 3], depth: u8) -> Result<()> {
    for term in terms
        .split(',')
        .map(str::trim)
        .filter(|term| !term.is_empty())
    {
        let (key, value) = match term.split_once('=') {
            Some((key, value)) => {
                let Some(value) = parse_number(value) else {
                    bail!("term '{term}': '{value}' is not a number (decimal or 0x hex)");
                };
                (key.trim(), Some(value))
            }
            None => (term, None),
        };
        let raw_word = match key {
            "config" => Some(0),
            "config1" => Some(1),
            "config2" => Some(2),
            _ => None,
        };
        if let (Some(index), Some(value)) = (raw_word, value) {
            words[index] |= value;
            continue;
        }
        if let Some(format) = pmu.formats.get(key) {
            let value = value.unwrap_or(1);
            let Some(bits) = format.place(value) else {
                bail!(
                    "term '{term}': {value:#x} does not fit the {} bits of {key} on {}",
                    format.width(),
                    pmu.name
                );
            };
            check_caps(pmu, key, value)?;
            let index = match format.word {
                ConfigWord::Config => 0,
                ConfigWord::Config1 => 1,
                ConfigWord::Config2 => 2,
            };
            words[index] |= bits;
            continue;
        }
        if value.is_none()
            && depth == 0
            && let Some(alias) = pmu.events.get(key)
        {
            apply_terms_into(pmu, alias, words, depth + 1)?;
            continue;
        }
        let mut known: Vec<&str> = pmu.formats.keys().map(String::as_str).collect();
        known.extend(["config", "config1", "config2"]);
        bail!(
            "unknown term '{key}' on PMU {}: its terms are {} (or an alias from its events/)",
            pmu.name,
            known.join(", ")
        );
    }
    Ok(())
}

/// Limits a PMU states in `caps/` (Arm's FEAT_PMUv3_TH `threshold_max`).
fn check_caps(pmu: &CatalogPmu, term: &str, value: u64) -> Result<()> {
    if term == "threshold"
        && let Some(max) = pmu
            .caps
            .get("threshold_max")
            .and_then(|text| parse_number(text))
        && value > max
    {
        bail!(
            "threshold {value} exceeds the {max} this PMU supports ({}/caps/threshold_max)",
            pmu.name
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
