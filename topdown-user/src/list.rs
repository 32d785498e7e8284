//! `topdown list`: what this machine has, which model `--pmu auto` picks, and every counter a
//! model opens with its encoding, the way perf would spell it.

use std::{io::Write, path::Path};

use anyhow::Result;

use crate::{
    model::{CounterSource, CounterUse, Model, all_models},
    schedule::{self, group_level},
};

/// The counter as perf syntax: `cpu/config=0x10ad/`, `cpu_atom/config=0x71/`,
/// `software/config=0x0/`, `syscalls:sys_enter_getppid`.
pub fn encoding(name: &str, source: &CounterSource) -> String {
    match source {
        CounterSource::Perf { perf_type, config } => {
            let pmu = match (schedule::counter_pmu(name), *perf_type) {
                (Some(pmu), _) => pmu.to_owned(),
                (None, crate::model::PERF_TYPE_RAW) => "cpu".to_owned(),
                (None, 1) => "software".to_owned(),
                (None, 0) => "hardware".to_owned(),
                (None, other) => format!("type{other}"),
            };
            format!("{pmu}/config={config:#x}/")
        }
        CounterSource::Tracepoint { group, name } => format!("{group}:{name}"),
        CounterSource::Event(event) => match &event.kind {
            crate::events::EventKind::Perf {
                perf_type,
                config,
                config1,
                config2,
            } => {
                let mut text = format!(
                    "{}/config={config:#x}",
                    event
                        .pmu
                        .clone()
                        .unwrap_or_else(|| format!("type{perf_type}"))
                );
                if *config1 != 0 {
                    text += &format!(",config1={config1:#x}");
                }
                if *config2 != 0 {
                    text += &format!(",config2={config2:#x}");
                }
                text + "/"
            }
            crate::events::EventKind::Tracepoint { group, name } => format!("{group}:{name}"),
        },
    }
}

/// Writes the model's counters, one per line, and how they would be scheduled with
/// `general_counters` free (`None`: unbounded).
pub fn write_model(
    model: &dyn Model,
    general_counters: Option<u32>,
    out: &mut dyn Write,
) -> Result<()> {
    writeln!(
        out,
        "Model:      {} - {}",
        model.name(),
        model.description()
    )?;
    writeln!(
        out,
        "Levels:     {}; weight counter {}",
        match model.max_level() {
            0 => "no TopDown (on-CPU time only)".to_owned(),
            level => format!("TopDown level 1..={level}"),
        },
        model.weight_counter()
    )?;
    writeln!(out, "Counters:")?;
    for spec in model.counters() {
        let uses = match spec.uses {
            CounterUse::General => "general",
            CounterUse::Fixed => "fixed",
            CounterUse::Software => "software",
        };
        writeln!(
            out,
            "  {:<48} {:<34} group {:>2} (L{}) {uses}",
            spec.name,
            encoding(&spec.name, &spec.source),
            spec.group,
            group_level(spec.group),
        )?;
    }
    let level = model.max_level().max(1);
    match schedule::plan(model, level, &|_| general_counters) {
        Ok(plan) => {
            let groups: Vec<String> = plan
                .groups
                .iter()
                .map(|group| {
                    format!(
                        "{}{} x{}",
                        group.pmu.as_deref().unwrap_or("core"),
                        if group.pinned { " pinned" } else { " rotating" },
                        group.members.len()
                    )
                })
                .collect();
            writeln!(
                out,
                "Plan:       level {level} with {} general counters: {}",
                general_counters.map_or("unbounded".to_owned(), |n| n.to_string()),
                groups.join(", ")
            )?;
            for note in plan.notes {
                writeln!(out, "            {note}")?;
            }
        }
        Err(err) => writeln!(out, "Plan:       {err:#}")?,
    }
    Ok(())
}

/// `topdown list [--pmu X] [--all]`.
pub fn run(
    pmu: Option<&str>,
    all: bool,
    general_counters: Option<u32>,
    out: &mut dyn Write,
) -> Result<()> {
    if all {
        writeln!(
            out,
            "Models (--pmu NAME, or synthetic:NAME, or hybrid:P+E):"
        )?;
        for model in all_models() {
            writeln!(out, "  {:<28} {}", model.name(), model.description())?;
        }
        return Ok(());
    }
    let root = Path::new("/");
    let detection = crate::pmu::detect(root);
    match &detection {
        Ok(detection) => write!(out, "{detection}")?,
        Err(err) => writeln!(out, "CPU:        unknown ({err:#})")?,
    }
    let (model, announcement) = crate::counting::select_model_by(pmu.unwrap_or("auto"), None)?;
    if let Some(line) = announcement {
        writeln!(out, "Auto:       {line}")?;
    }
    // Plan with the detected budget unless told otherwise (synthetic models are unbounded).
    let budget = general_counters.or_else(|| {
        if model.is_synthetic() {
            None
        } else {
            crate::pmu::free_general_counters(root, None)
        }
    });
    write_model(model.as_ref(), budget, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::base_model;

    #[test]
    fn encodings_read_like_perf() {
        let raw = CounterSource::Perf {
            perf_type: 4,
            config: 0x10ad,
        };
        assert_eq!(
            encoding("INT_MISC.UOP_DROPPING", &raw),
            "cpu/config=0x10ad/"
        );
        assert_eq!(
            encoding("cpu_atom/TOPDOWN_FE_BOUND.ALL", &raw),
            "cpu_atom/config=0x10ad/"
        );
        let tracepoint = CounterSource::Tracepoint {
            group: "syscalls".to_owned(),
            name: "sys_enter_getppid".to_owned(),
        };
        assert_eq!(encoding("slots", &tracepoint), "syscalls:sys_enter_getppid");
    }

    #[test]
    fn intel_icl_pins_its_level_one_and_rotates_its_level_two_groups() {
        let model = base_model("intel-icl").unwrap();
        let mut out = Vec::new();
        write_model(model.as_ref(), Some(8), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("slots"), "{text}");
        assert!(text.contains("cpu/config=0x400/"), "{text}");
        assert!(text.contains("cpu/config=0x104010d/"), "{text}");
        assert!(
            text.contains(
                "Plan:       level 2 with 8 general counters: core pinned x7, core rotating x3, \
                 core rotating x5"
            ),
            "{text}"
        );
    }
}
