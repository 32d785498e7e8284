//! libpfm-style specs, `[PMU::]EVENT[:UMASK][:MOD[=VAL]]...`, with the Intel core modifiers
//! of libpfm's manual (../shared/seeds/libpfm-intel-knl.txt, MODIFIERS):
//!
//! - `u`, `k`: count at user level (privilege 1-3) / kernel level (0); both or neither: both;
//! - `i`: invert the counter-mask comparison;
//! - `e`: edge detect; libpfm requires a counter mask >= 1 with it (the manual's text calls that
//!   modifier `m` but lists it as `c`: topdown takes `c=N`);
//! - `c=N`: counter mask, 0..=255;
//! - `t`: AnyThread, only on the fixed-counter events (unhalted core cycles, instructions
//!   retired); the manual allows rejecting it for unhalted reference cycles, and topdown does.
//!
//! The event table holds Intel's architectural events (the same on every Intel core, SDM
//! vol. 3 "Architectural Performance Monitoring") under libpfm's names, and the events of
//! topdown-formulas.md §2.1/§1.5 with their Skylake-generation encodings; other generations'
//! encodings differ, so for them use perf syntax (`cpu/event=..,umask=../`) or sysfs names.

use anyhow::{Result, bail};

use super::{EventAttr, EventKind, Exclude, PERF_TYPE_RAW, PmuCatalog};

/// An event: code, its umasks (name, value), and whether `t` (AnyThread) is allowed.
struct TableEvent {
    name: &'static str,
    code: u64,
    umasks: &'static [(&'static str, u64)],
    any_thread: bool,
}

const TABLE: &[TableEvent] = &[
    // Architectural events (libpfm names).
    TableEvent {
        name: "UNHALTED_CORE_CYCLES",
        code: 0x3c,
        umasks: &[],
        any_thread: true,
    },
    TableEvent {
        name: "INSTRUCTION_RETIRED",
        code: 0xc0,
        umasks: &[],
        any_thread: true,
    },
    TableEvent {
        name: "UNHALTED_REFERENCE_CYCLES",
        code: 0x3c,
        umasks: &[("", 0x01)],
        any_thread: false,
    },
    TableEvent {
        name: "LLC_REFERENCES",
        code: 0x2e,
        umasks: &[("", 0x4f)],
        any_thread: false,
    },
    TableEvent {
        name: "LLC_MISSES",
        code: 0x2e,
        umasks: &[("", 0x41)],
        any_thread: false,
    },
    TableEvent {
        name: "BRANCH_INSTRUCTIONS_RETIRED",
        code: 0xc4,
        umasks: &[],
        any_thread: false,
    },
    TableEvent {
        name: "MISPREDICTED_BRANCH_RETIRED",
        code: 0xc5,
        umasks: &[],
        any_thread: false,
    },
    // topdown-formulas.md §2.1 and §1.5 (Skylake encodings).
    TableEvent {
        name: "CPU_CLK_UNHALTED",
        code: 0x3c,
        umasks: &[
            ("THREAD", 0x00),
            ("REF_XCLK", 0x01),
            ("ONE_THREAD_ACTIVE", 0x02),
        ],
        any_thread: true,
    },
    TableEvent {
        name: "INST_RETIRED",
        code: 0xc0,
        umasks: &[("ANY", 0x00)],
        any_thread: true,
    },
    TableEvent {
        name: "UOPS_ISSUED",
        code: 0x0e,
        umasks: &[("ANY", 0x01)],
        any_thread: false,
    },
    TableEvent {
        name: "UOPS_RETIRED",
        code: 0xc2,
        umasks: &[("RETIRE_SLOTS", 0x02), ("MACRO_FUSED", 0x04)],
        any_thread: false,
    },
    TableEvent {
        name: "IDQ_UOPS_NOT_DELIVERED",
        code: 0x9c,
        umasks: &[("CORE", 0x01)],
        any_thread: false,
    },
    TableEvent {
        name: "INT_MISC",
        code: 0x0d,
        umasks: &[("RECOVERY_CYCLES", 0x01)],
        any_thread: false,
    },
    TableEvent {
        name: "IDQ",
        code: 0x79,
        umasks: &[("MS_UOPS", 0x30)],
        any_thread: false,
    },
    TableEvent {
        name: "BR_MISP_RETIRED",
        code: 0xc5,
        umasks: &[("ALL_BRANCHES", 0x00)],
        any_thread: false,
    },
    TableEvent {
        name: "MACHINE_CLEARS",
        code: 0xc3,
        umasks: &[("COUNT", 0x01)],
        any_thread: false,
    },
    TableEvent {
        name: "CYCLE_ACTIVITY",
        code: 0xa3,
        umasks: &[("STALLS_TOTAL", 0x04), ("STALLS_MEM_ANY", 0x14)],
        any_thread: false,
    },
    TableEvent {
        name: "EXE_ACTIVITY",
        code: 0xa6,
        umasks: &[
            ("1_PORTS_UTIL", 0x02),
            ("2_PORTS_UTIL", 0x04),
            ("BOUND_ON_STORES", 0x40),
        ],
        any_thread: false,
    },
];

/// Event names of the table, for `topdown list` and errors.
pub fn event_names() -> Vec<&'static str> {
    TABLE.iter().map(|event| event.name).collect()
}

pub fn parse(spec: &str, catalog: &PmuCatalog) -> Result<EventAttr> {
    let (pmu, rest) = match spec.split_once("::") {
        Some((pmu, rest)) => (Some(pmu), rest),
        None => (None, spec),
    };
    let pmu_name = match pmu {
        None => None,
        Some(name) => {
            // libpfm PMU names (`skl`, `icl`, `knl`) or a sysfs core PMU name (`cpu_core`).
            match catalog.pmus.get(name) {
                Some(found) if found.is_core() => Some(found.name.clone()),
                Some(_) => bail!("PMU '{name}' is not a CPU core PMU"),
                None => None,
            }
        }
    };
    let mut fields = rest.split(':');
    let event_name = fields.next().unwrap_or("");
    let Some(event) = TABLE.iter().find(|event| event.name == event_name) else {
        bail!(
            "unknown libpfm event '{event_name}': the built-in table has {} (use perf syntax for others)",
            event_names().join(", ")
        );
    };
    let mut umask: Option<u64> = None;
    let (mut user, mut kernel, mut invert, mut edge, mut any_thread) =
        (false, false, false, false, false);
    let mut counter_mask: Option<u64> = None;
    for field in fields {
        if field.is_empty() {
            bail!("empty field (two ':' in a row)");
        }
        let (key, value) = match field.split_once('=') {
            Some((key, value)) => (key, Some(value)),
            None => (field, None),
        };
        let flag = |value: Option<&str>| -> Result<bool> {
            match value {
                None | Some("1") | Some("y") => Ok(true),
                Some("0") | Some("n") => Ok(false),
                Some(other) => bail!("modifier '{key}' is boolean; '{other}' is not 0/1"),
            }
        };
        match key {
            "u" => user = flag(value)?,
            "k" => kernel = flag(value)?,
            "i" => invert = flag(value)?,
            "e" => edge = flag(value)?,
            "t" => any_thread = flag(value)?,
            "c" | "m" => {
                let Some(value) = value else {
                    bail!("modifier 'c' needs a value: c=N with N in 0..=255");
                };
                let Some(mask) = super::parse_number(value).filter(|mask| *mask <= 255) else {
                    bail!("counter mask c={value} is out of range: use 0..=255");
                };
                counter_mask = Some(mask);
            }
            name if value.is_none() => {
                let Some((_, value)) = event.umasks.iter().find(|(umask, _)| *umask == name) else {
                    let known: Vec<&str> = event
                        .umasks
                        .iter()
                        .map(|(name, _)| *name)
                        .filter(|name| !name.is_empty())
                        .collect();
                    bail!(
                        "'{name}' is neither a umask of {} ({}) nor a modifier (u, k, i, e, c=N, t)",
                        event.name,
                        if known.is_empty() {
                            "none".to_owned()
                        } else {
                            known.join(", ")
                        }
                    );
                };
                if umask.replace(*value).is_some() {
                    bail!("more than one umask for {}", event.name);
                }
            }
            other => bail!("unknown modifier '{other}': use u, k, i, e, c=N or t"),
        }
    }
    if edge && counter_mask.unwrap_or(0) < 1 {
        bail!("modifier 'e' (edge) needs c=N with N >= 1, e.g. ':e:c=1'");
    }
    if any_thread && !event.any_thread {
        bail!(
            "modifier 't' (any thread) is only for the fixed-counter events \
             UNHALTED_CORE_CYCLES, INSTRUCTION_RETIRED, CPU_CLK_UNHALTED:THREAD and \
             INST_RETIRED:ANY, not {}",
            event.name
        );
    }
    let umask = match umask {
        Some(umask) => umask,
        None => match event.umasks {
            [] => 0,
            [(_, only)] => *only,
            several => bail!(
                "{} needs a umask: one of {}",
                event.name,
                several
                    .iter()
                    .map(|(name, _)| *name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
    };
    // Checked last, so a malformed spec hears about its syntax first. The table is Intel's: on
    // another vendor's core the same raw code is another event, and would be counted without a
    // word. An unknown vendor (no cpuinfo, as in fixtures) is let through.
    if let Some(vendor) = catalog
        .cpu_vendor
        .as_deref()
        .filter(|vendor| *vendor != "GenuineIntel")
    {
        bail!(
            "libpfm-style names here are Intel's events and this CPU is {vendor}: use perf syntax \
             (rNNNN, cpu/event=0x..,umask=0x../) or one of the PMU's named events (`topdown list`)"
        );
    }
    // Intel PERFEVTSEL layout (topdown-formulas.md §1.5): event | umask << 8 | edge << 18 |
    // any << 21 | inv << 23 | cmask << 24.
    let config = event.code
        | umask << 8
        | u64::from(edge) << 18
        | u64::from(any_thread) << 21
        | u64::from(invert) << 23
        | counter_mask.unwrap_or(0) << 24;
    let exclude = (user || kernel).then_some(Exclude {
        user: !user,
        kernel: !kernel,
        hv: true,
        ..Exclude::default()
    });
    let perf_type = pmu_name
        .as_ref()
        .and_then(|name| catalog.pmus.get(name))
        .map_or(PERF_TYPE_RAW, |pmu| pmu.perf_type);
    Ok(EventAttr {
        name: spec.to_owned(),
        pmu: pmu_name,
        kind: EventKind::Perf {
            perf_type,
            config,
            config1: 0,
            config2: 0,
        },
        exclude,
    })
}
