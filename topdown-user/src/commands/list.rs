//! `topdown list`: what this machine has, which model `--pmu auto` picks, and every counter a
//! model opens with its encoding, the way perf would spell it.

use std::{io::Write, path::Path};

use anyhow::Result;

use crate::{
    cli::ListFormat,
    events::EventKind,
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
            EventKind::Perf {
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
            EventKind::Tracepoint { group, name } => format!("{group}:{name}"),
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

/// `topdown list`: `-e` specs' encodings, `--all` models, or this machine and its model.
pub fn run(args: &crate::cli::ListArgs, out: &mut dyn Write) -> Result<()> {
    if !args.events.is_empty() {
        return write_events(&args.events, args.pmu.as_deref(), args.format, out);
    }
    run_model(args.pmu.as_deref(), args.all, args.max_counters, out)
}

/// The model libpfm-style names are encoded for: `--pmu`, else the one `--pmu auto` picks.
fn model_name(pmu: Option<&str>) -> Option<String> {
    match pmu {
        Some(name) => Some(name.to_owned()),
        None => crate::session::counting::select_model_by("auto", None)
            .ok()
            .map(|(model, _)| model.name()),
    }
}

/// `topdown list -e SPEC...`: each spec's encoding without counting, like libpfm's
/// `check_events`. Every spec is checked before anything is printed, so a bad one fails
/// the command with its one-line reason.
pub fn write_events(
    specs: &[String],
    pmu: Option<&str>,
    format: ListFormat,
    out: &mut dyn Write,
) -> Result<()> {
    let mut catalog = crate::events::PmuCatalog::load(Path::new("/"));
    if let Some(model) = model_name(pmu) {
        catalog = catalog.with_model(&model);
    }
    let mut described = Vec::with_capacity(specs.len());
    for spec in specs {
        let description = crate::events::describe(spec, &catalog).map_err(|err| {
            crate::error::fail(crate::error::Failure::Usage, format!("-e {err:#}"))
        })?;
        described.push(description);
    }
    match format {
        ListFormat::Json => {
            let list: Vec<serde_json::Value> = described.iter().map(event_json).collect();
            writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
        }
        ListFormat::Table => {
            for (index, description) in described.iter().enumerate() {
                if index > 0 {
                    writeln!(out)?;
                }
                write_event_table(description, out)?;
            }
        }
    }
    Ok(())
}

/// The encoding's fields as both the table and the JSON list them: `type` and the config
/// words, or the tracepoint (whose type and id come from tracefs when opened). The configs are
/// hex strings, as perf and libpfm print them; u64 configs also exceed what a JSON reader's
/// doubles hold exactly.
fn encoding_fields(kind: &EventKind) -> Vec<(&'static str, serde_json::Value)> {
    match kind {
        EventKind::Perf {
            perf_type,
            config,
            config1,
            config2,
        } => vec![
            ("type", (*perf_type).into()),
            ("config", format!("{config:#x}").into()),
            ("config1", format!("{config1:#x}").into()),
            ("config2", format!("{config2:#x}").into()),
        ],
        EventKind::Tracepoint { group, name } => {
            vec![("tracepoint", format!("{group}:{name}").into())]
        }
    }
}

fn event_json(description: &crate::events::Description) -> serde_json::Value {
    let attr = &description.attr;
    let exclude = attr.exclude.map(|exclude| {
        serde_json::json!({
            "user": exclude.user,
            "kernel": exclude.kernel,
            "hv": exclude.hv,
            "host": exclude.host,
            "guest": exclude.guest,
            "idle": exclude.idle,
        })
    });
    let mut value = serde_json::json!({
        "spec": attr.name,
        "syntax": if description.fstr.is_some() { "libpfm" } else { "perf" },
        "pmu": description.pmu,
        "fstr": description.fstr,
        "exclude": exclude,
    });
    for (field, field_value) in encoding_fields(&attr.kind) {
        value[field] = field_value;
    }
    value
}

fn write_event_table(description: &crate::events::Description, out: &mut dyn Write) -> Result<()> {
    let attr = &description.attr;
    writeln!(out, "Requested event: {}", attr.name)?;
    if let Some(fstr) = &description.fstr {
        writeln!(out, "Actual event:    {fstr}")?;
    }
    writeln!(
        out,
        "PMU:             {}",
        description.pmu.as_deref().unwrap_or("-")
    )?;
    for (field, value) in encoding_fields(&attr.kind) {
        let text = value
            .as_str()
            .map_or_else(|| value.to_string(), str::to_owned);
        writeln!(out, "{:<17}{text}", format!("{field}:"))?;
    }
    match attr.exclude {
        Some(exclude) => writeln!(
            out,
            "exclude:         user={} kernel={} hv={} host={} guest={} idle={}",
            u8::from(exclude.user),
            u8::from(exclude.kernel),
            u8::from(exclude.hv),
            u8::from(exclude.host),
            u8::from(exclude.guest),
            u8::from(exclude.idle),
        )?,
        None => writeln!(
            out,
            "exclude:         none named (the run's --all-user/--all-kernel decide)"
        )?,
    }
    Ok(())
}

/// `topdown list [--pmu X] [--all]`.
pub fn run_model(
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
    let detection = crate::session::pmu::detect(root);
    match &detection {
        Ok(detection) => write!(out, "{detection}")?,
        Err(err) => writeln!(out, "CPU:        unknown ({err:#})")?,
    }
    let (model, announcement) =
        crate::session::counting::select_model_by(pmu.unwrap_or("auto"), None)?;
    if let Some(line) = announcement {
        writeln!(out, "Auto:       {line}")?;
    }
    // Plan with the detected budget unless told otherwise (synthetic models are unbounded).
    let budget = general_counters.or_else(|| {
        if model.is_synthetic() {
            None
        } else {
            crate::session::pmu::free_general_counters(root, None)
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
