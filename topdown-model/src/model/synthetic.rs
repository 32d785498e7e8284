//! `synthetic:<model>`: the model's formulas over per-CPU syscall tracepoint counts.
//!
//! Machines without a PMU (VMs like these) still need the whole pipeline tested with exact
//! answers. A syscall's `sys_enter` tracepoint counted per CPU is exact and deterministic: a
//! workload that makes 1234 getppid calls adds exactly 1234. So each of the model's counters is
//! replaced by one syscall's count, and reports say so prominently.

use anyhow::{Result, bail};

use super::{CounterSource, CounterSpec, CounterUse, Model};

/// Syscalls standing in for a model's counters, slot 1 first. Chosen because they are cheap,
/// have no side effects, and neither Rust's std runtime nor glibc's start-up calls them, so a
/// test workload controls their counts exactly.
pub const DEFAULT_SYSCALLS: [&str; 32] = [
    "getppid",
    "getpgid",
    "getsid",
    "getpriority",
    "getresuid",
    "getresgid",
    "times",
    "sysinfo",
    "getrusage",
    "getitimer",
    "sched_getscheduler",
    "sched_getparam",
    "getpgrp",
    "getcwd",
    "newuname",
    "capget",
    "ioprio_get",
    "getgroups",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_rr_get_interval",
    "get_robust_list",
    "sched_getattr",
    "get_mempolicy",
    // Eight more for the largest models (hybrid Ice Lake + Skymont: 29 counters); none is made
    // by a Rust or C program's start-up, so a workload's counts stay its own.
    "sysfs",
    "getcpu",
    "rt_sigpending",
    "clock_getres",
    "mincore",
    "membarrier",
    "personality",
    "sched_getaffinity",
];

pub struct Synthetic {
    inner: Box<dyn Model>,
    /// counter name -> (tracefs group, tracepoint), in the inner model's counter order.
    map: Vec<(String, String, String)>,
    /// The inner model's scheduling group and counter use of each counter, in the same order:
    /// the counter budget plans a synthetic model like the hardware it stands in for.
    groups: Vec<(u8, CounterUse)>,
}

impl Synthetic {
    /// Maps the inner model's counters to [`DEFAULT_SYSCALLS`], then applies the
    /// `COUNTER=GROUP:TRACEPOINT` overrides.
    pub fn new(inner: Box<dyn Model>, overrides: &[(String, String)]) -> Result<Self> {
        let counters = inner.counters();
        if counters.len() > DEFAULT_SYSCALLS.len() {
            bail!(
                "model {} has {} counters but only {} default synthetic syscalls exist",
                inner.name(),
                counters.len(),
                DEFAULT_SYSCALLS.len()
            );
        }
        let mut map: Vec<(String, String, String)> = counters
            .iter()
            .zip(DEFAULT_SYSCALLS)
            .map(|(spec, syscall)| {
                (
                    spec.name.clone(),
                    "syscalls".to_owned(),
                    format!("sys_enter_{syscall}"),
                )
            })
            .collect();
        let mut seen: Vec<&str> = Vec::new();
        for (counter, tracepoint) in overrides {
            if seen.contains(&counter.as_str()) {
                bail!("--synthetic names counter {counter} twice");
            }
            seen.push(counter);
            let Some(slot) = map.iter_mut().find(|(name, _, _)| name == counter) else {
                bail!(
                    "--synthetic: model {} has no counter '{counter}'; its counters are: {}",
                    inner.name(),
                    counters
                        .iter()
                        .map(|spec| spec.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            };
            let (group, name) = parse_tracepoint(tracepoint)?;
            slot.1 = group;
            slot.2 = name;
        }
        let groups = counters
            .iter()
            .map(|spec| (spec.group, spec.uses))
            .collect();
        Ok(Self { inner, map, groups })
    }
}

/// `group:name`, each part non-empty and made of `[A-Za-z0-9_]`.
fn parse_tracepoint(text: &str) -> Result<(String, String)> {
    let valid = |part: &str| {
        !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    match text.split_once(':') {
        Some((group, name)) if valid(group) && valid(name) => {
            Ok((group.to_owned(), name.to_owned()))
        }
        _ => bail!(
            "--synthetic: '{text}' is not a tracepoint: expected GROUP:NAME such as syscalls:sys_enter_getppid"
        ),
    }
}

/// Parses `--synthetic COUNTER=GROUP:TRACEPOINT,...` into `(counter, "group:tracepoint")` pairs.
pub fn parse_synthetic_overrides(text: &str) -> Result<Vec<(String, String)>> {
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once('=') {
            Some((counter, tracepoint)) if !counter.trim().is_empty() => {
                parse_tracepoint(tracepoint.trim())?;
                Ok((counter.trim().to_owned(), tracepoint.trim().to_owned()))
            }
            _ => bail!(
                "--synthetic: '{item}' is not COUNTER=GROUP:TRACEPOINT (e.g. slots=syscalls:sys_enter_getppid)"
            ),
        })
        .collect()
}

impl Model for Synthetic {
    super::formulas_of_inner!();

    fn name(&self) -> String {
        format!("synthetic:{}", self.inner.name())
    }

    fn description(&self) -> &'static str {
        "syscall tracepoint counts standing in for the model's hardware counters (testing)"
    }

    fn counters(&self) -> Vec<CounterSpec> {
        self.map
            .iter()
            .zip(&self.groups)
            .map(
                |((name, group, tracepoint), (scheduling_group, uses))| CounterSpec {
                    name: name.clone(),
                    source: CounterSource::Tracepoint {
                        group: group.clone(),
                        name: tracepoint.clone(),
                    },
                    group: *scheduling_group,
                    uses: *uses,
                },
            )
            .collect()
    }

    fn is_synthetic(&self) -> bool {
        true
    }

    fn synthetic_map(&self) -> Vec<(String, String)> {
        self.map
            .iter()
            .map(|(name, group, tracepoint)| (name.clone(), format!("{group}:{tracepoint}")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::model_by_name;

    #[test]
    fn default_mapping_follows_the_documented_list() {
        let model = model_by_name("synthetic:intel-icl", &[]).unwrap();
        assert_eq!(model.name(), "synthetic:intel-icl");
        assert_eq!(model.base_name(), "intel-icl");
        let map = model.synthetic_map();
        assert_eq!(
            map[0],
            ("slots".to_owned(), "syscalls:sys_enter_getppid".to_owned())
        );
        assert_eq!(
            map[6],
            (
                "INT_MISC.CLEARS_COUNT".to_owned(),
                "syscalls:sys_enter_times".to_owned()
            )
        );
        let software = model_by_name("synthetic:software", &[]).unwrap();
        assert_eq!(
            software.counters()[0].source,
            CounterSource::Tracepoint {
                group: "syscalls".into(),
                name: "sys_enter_getppid".into()
            }
        );
    }

    #[test]
    fn overrides_replace_one_counter() {
        let overrides =
            parse_synthetic_overrides("topdown-retiring=raw_syscalls:sys_exit").unwrap();
        let model = model_by_name("synthetic:intel-icl", &overrides).unwrap();
        assert_eq!(model.synthetic_map()[1].1, "raw_syscalls:sys_exit");
        assert_eq!(model.synthetic_map()[0].1, "syscalls:sys_enter_getppid");
    }

    #[test]
    fn bad_overrides_are_clear_errors() {
        let err = |text: &str| {
            let overrides = parse_synthetic_overrides(text);
            match overrides {
                Err(err) => err.to_string(),
                Ok(overrides) => model_by_name("synthetic:intel-icl", &overrides)
                    .err()
                    .map(|err| err.to_string())
                    .unwrap_or_default(),
            }
        };
        assert!(err("slots").contains("not COUNTER=GROUP:TRACEPOINT"));
        assert!(err("slots=getppid").contains("not a tracepoint"));
        assert!(err("nope=syscalls:sys_enter_getppid").contains("no counter 'nope'"));
        assert!(err("nope=syscalls:sys_enter_getppid").contains("slots, topdown-retiring"));
        assert!(err("slots=a:b,slots=c:d").contains("twice"));
        assert!(model_by_name("intel-icl", &[("slots".into(), "a:b".into())]).is_err());
    }
}
