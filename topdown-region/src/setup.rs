//! The process-wide choice of counters: the model (through `topdown-model`, the one copy of
//! every model and formula), the counter plan for the level asked, and each counter's perf
//! type and config. Per-thread opening is `crate::counters`.

use std::path::Path;

use topdown_model::{
    model::{CounterSource, Model, PERF_TYPE_RAW, model_by_name},
    schedule::{self, Plan, counter_pmu},
};

use crate::decode;

/// How the library is set up; [`Config::from_env`] reads it from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// A `topdown --pmu` model name (`intel-icl`, `software`, `synthetic:intel-icl`, ...).
    pub model: String,
    /// TopDown level (1 or 2); clamped to what the model computes.
    pub level: u8,
    /// Count kernel-mode execution too. Off by default, as in the seed's example
    /// (`.exclude_kernel = 1`): unprivileged users get user-mode counters only under the
    /// default `perf_event_paranoid`. Software and tracepoint counters always include the
    /// kernel (a syscall tracepoint fires there).
    pub include_kernel: bool,
    /// Open the model's raw events on this PMU type instead of `PERF_TYPE_RAW`: on a
    /// heterogeneous arm64 system user access needs the PMU opened by its `type`
    /// (arm64-perf-attributes.txt "About heterogeneous systems"; with the thread pinned to
    /// that PMU's cores).
    pub pmu_type: Option<u32>,
    /// Never read counters in user space (measuring the read() path, or ruling it out).
    pub force_read: bool,
    /// General-purpose counters free on the PMU (`None`: unknown). With a number, the counter
    /// plan (`topdown_model::schedule::plan`) lets groups that do not fit together rotate and
    /// records their enabled/running times, so reports scale them and mark what they feed as
    /// estimated; without one, everything is one pinned group, which counts nothing (and the
    /// readings say so) if the PMU cannot hold it.
    pub general_counters: Option<u32>,
}

/// Environment variables of [`Config::from_env`].
pub const ENV_MODEL: &str = "TOPDOWN_REGION_MODEL";
pub const ENV_LEVEL: &str = "TOPDOWN_REGION_LEVEL";
pub const ENV_PMU_TYPE: &str = "TOPDOWN_REGION_PMU_TYPE";
pub const ENV_FORCE_READ: &str = "TOPDOWN_REGION_FORCE_READ";
pub const ENV_INCLUDE_KERNEL: &str = "TOPDOWN_REGION_INCLUDE_KERNEL";
pub const ENV_COUNTERS: &str = "TOPDOWN_REGION_COUNTERS";

impl Default for Config {
    fn default() -> Self {
        Self {
            model: "software".to_owned(),
            level: 1,
            include_kernel: false,
            pmu_type: None,
            force_read: false,
            general_counters: None,
        }
    }
}

impl Config {
    /// The default config with `TOPDOWN_REGION_MODEL`, `_LEVEL`, `_PMU_TYPE`, `_FORCE_READ`,
    /// `_INCLUDE_KERNEL` and `_COUNTERS` applied; a value that does not parse is an error
    /// naming it.
    pub fn from_env() -> Result<Self, String> {
        let mut config = Self::default();
        let var = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        if let Some(model) = var(ENV_MODEL) {
            config.model = model;
        }
        if let Some(level) = var(ENV_LEVEL) {
            config.level = match level.as_str() {
                "1" => 1,
                "2" => 2,
                _ => return Err(format!("{ENV_LEVEL}={level}: expected 1 or 2")),
            };
        }
        if let Some(pmu_type) = var(ENV_PMU_TYPE) {
            config.pmu_type = Some(pmu_type.parse().map_err(|_| {
                format!("{ENV_PMU_TYPE}={pmu_type}: expected a PMU type number (/sys/bus/event_source/devices/<pmu>/type)")
            })?);
        }
        if let Some(counters) = var(ENV_COUNTERS) {
            config.general_counters = Some(counters.parse().map_err(|_| {
                format!("{ENV_COUNTERS}={counters}: expected the number of free general-purpose counters")
            })?);
        }
        let flag = |name: &str| -> Result<bool, String> {
            match var(name).as_deref() {
                None | Some("0") => Ok(false),
                Some("1") => Ok(true),
                Some(other) => Err(format!("{name}={other}: expected 0 or 1")),
            }
        };
        config.force_read = flag(ENV_FORCE_READ)?;
        config.include_kernel = flag(ENV_INCLUDE_KERNEL)?;
        Ok(config)
    }
}

/// One counter to open on each thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub name: String,
    pub perf_type: u32,
    pub config: u64,
    /// A hardware event (user access possible, kernel excluded unless asked).
    pub hardware: bool,
    /// For Intel's PERF_METRICS pseudo-events, their byte of the register.
    pub metric_field: Option<usize>,
    /// Intel's SLOTS (fixed counter 3), the leader of a metrics group.
    pub slots: bool,
}

/// Everything decided once per process.
pub struct Setup {
    pub config: Config,
    pub model: Box<dyn Model>,
    pub level: u8,
    pub plan: Plan,
    /// In plan counter order.
    pub counters: Vec<Resolved>,
}

const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_TYPE_HW_CACHE: u32 = 3;

impl Setup {
    pub fn new(config: Config) -> Result<Self, String> {
        let model = model_by_name(&config.model, &[]).map_err(|err| format!("{err:#}"))?;
        let level = config.level.clamp(1, model.max_level().max(1));
        let plan = schedule::plan(model.as_ref(), level, &|_| config.general_counters)
            .map_err(|err| format!("{err:#}"))?;
        let counters = plan
            .counters
            .iter()
            .map(|spec| resolve(spec, &config))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            config,
            model,
            level,
            plan,
            counters,
        })
    }

    /// The names of the values each reading fills: the plan's slots (counters, then the
    /// enabled/running times of rotating groups).
    pub fn slot_names(&self) -> Vec<String> {
        self.plan.slot_names()
    }
}

fn resolve(spec: &topdown_model::model::CounterSpec, config: &Config) -> Result<Resolved, String> {
    let (perf_type, config_word) = match &spec.source {
        CounterSource::Perf { perf_type, config } => (*perf_type, *config),
        CounterSource::Tracepoint { group, name } => {
            (PERF_TYPE_TRACEPOINT, tracepoint_id(group, name)?)
        }
        CounterSource::Event(event) => {
            return Err(format!(
                "counter {}: `-e` events are not supported by topdown-region",
                event.name
            ));
        }
    };
    let hardware = matches!(
        perf_type,
        PERF_TYPE_HARDWARE | PERF_TYPE_HW_CACHE | PERF_TYPE_RAW
    ) || perf_type >= 6;
    let perf_type = match (counter_pmu(&spec.name), config.pmu_type) {
        // A hybrid model's counter lives on its core type's PMU (cpu_core, cpu_atom).
        (Some(pmu), _) => pmu_type(pmu)?,
        (None, Some(pmu_type)) if perf_type == PERF_TYPE_RAW => pmu_type,
        _ => perf_type,
    };
    // PERF_METRICS is an Intel register: the same configs mean other events elsewhere.
    let intel_topdown = hardware && cfg!(target_arch = "x86_64");
    Ok(Resolved {
        name: spec.name.clone(),
        perf_type,
        config: config_word,
        hardware,
        metric_field: if intel_topdown {
            decode::metric_field(config_word)
        } else {
            None
        },
        slots: intel_topdown && config_word == decode::SLOTS_CONFIG,
    })
}

/// Where tracefs may be mounted (the library never mounts it: that is the tool's business).
const TRACEFS_ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

fn tracepoint_id(group: &str, name: &str) -> Result<u64, String> {
    for root in TRACEFS_ROOTS {
        let path = Path::new(root)
            .join("events")
            .join(group)
            .join(name)
            .join("id");
        if let Ok(text) = std::fs::read_to_string(&path) {
            return text
                .trim()
                .parse()
                .map_err(|_| format!("{} does not hold a number", path.display()));
        }
    }
    Err(format!(
        "tracepoint {group}:{name} not found under {} (tracefs not mounted, not root, or not \
         on this kernel: mount tracefs or run as root)",
        TRACEFS_ROOTS.join(" or ")
    ))
}

fn pmu_type(pmu: &str) -> Result<u32, String> {
    let path = format!("/sys/bus/event_source/devices/{pmu}/type");
    std::fs::read_to_string(&path)
        .map_err(|err| format!("reading {path}: {err}"))?
        .trim()
        .parse()
        .map_err(|_| format!("{path} does not hold a number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intel_icl_level_one_is_slots_led_with_metric_fields() {
        let setup = Setup::new(Config {
            model: "intel-icl".into(),
            ..Config::default()
        })
        .unwrap();
        assert_eq!(setup.level, 1);
        let names: Vec<&str> = setup.counters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "slots",
                "topdown-retiring",
                "topdown-bad-spec",
                "topdown-fe-bound",
                "topdown-be-bound",
                "INT_MISC.UOP_DROPPING",
                "INT_MISC.CLEARS_COUNT"
            ]
        );
        if cfg!(target_arch = "x86_64") {
            assert!(setup.counters[0].slots);
            let fields: Vec<Option<usize>> =
                setup.counters.iter().map(|c| c.metric_field).collect();
            assert_eq!(
                fields,
                [None, Some(0), Some(1), Some(2), Some(3), None, None]
            );
        }
        assert_eq!(setup.plan.groups.len(), 1);
        assert_eq!(setup.plan.groups[0].members, (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn a_counter_budget_makes_level_two_groups_rotate_with_their_times() {
        let setup = Setup::new(Config {
            model: "intel-icl".into(),
            level: 2,
            general_counters: Some(7),
            ..Config::default()
        })
        .unwrap();
        // 2 + 3 + 5 + 5 general counters do not fit 7 at once; level 1 (2) and the largest
        // level-2 group (5) do: level 1 stays pinned, the level-2 groups rotate with their times.
        let pinned: Vec<bool> = setup.plan.groups.iter().map(|group| group.pinned).collect();
        assert_eq!(pinned, [true, false, false, false]);
        let names = setup.slot_names();
        assert_eq!(
            &names[20..],
            [
                "group8.enabled_ns",
                "group8.running_ns",
                "group9.enabled_ns",
                "group9.running_ns",
                "group10.enabled_ns",
                "group10.running_ns"
            ]
        );
    }

    #[test]
    fn software_model_and_bad_names() {
        let setup = Setup::new(Config::default()).unwrap();
        assert_eq!(setup.slot_names(), ["cpu-clock"]);
        assert!(!setup.counters[0].hardware);
        assert_eq!(setup.level, 1);
        let err = Setup::new(Config {
            model: "nope".into(),
            ..Config::default()
        })
        .err()
        .unwrap();
        assert!(err.contains("unknown model 'nope'"), "{err}");
    }

    #[test]
    fn pmu_type_override_applies_to_raw_events_only() {
        let setup = Setup::new(Config {
            model: "arm-neoverse-n1".into(),
            pmu_type: Some(10),
            ..Config::default()
        });
        // The Neoverse models name raw PMUv3 events.
        let setup = setup.unwrap();
        assert!(!setup.counters.is_empty());
        assert!(setup.counters.iter().all(|c| c.perf_type == 10));
        let software = Setup::new(Config {
            pmu_type: Some(10),
            ..Config::default()
        })
        .unwrap();
        assert_eq!(software.counters[0].perf_type, 1);
    }
}
