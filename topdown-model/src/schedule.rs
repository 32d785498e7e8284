//! The counter budget: which of a model's counters share a perf group, which groups have to
//! rotate, and which BPF slot each value lands in.
//!
//! A model declares scheduling groups (`CounterSpec::group`): groups 0-7 hold what level 1 needs,
//! groups 8-15 the level-2 extras. On each PMU the plan is, in order of preference:
//!
//! 1. everything in one pinned group: exact, nothing multiplexed;
//! 2. the level-1 group(s) pinned and each level-2 group flexible: level 1 stays exact, level-2
//!    groups take turns on the counters left over;
//! 3. every group flexible: everything takes turns.
//!
//! A flexible group's counts cover only the time it was scheduled, so its leader's enabled and
//! running times get BPF slots of their own (`groupN.enabled_ns`, `groupN.running_ns`); they are
//! attributed to tasks like any counter, and [`crate::model::Evaluator`] scales that task's
//! counts by enabled/running and marks the metrics they feed as estimated. TopDown is never
//! multiplexed silently: the plan says what rotates in [`Plan::notes`].

use anyhow::{Result, bail};
use topdown_common::{MAX_COUNTERS, slot_source};

use crate::model::{CounterSpec, CounterUse, Model};
// Re-exported so `schedule::LEVEL_TWO_GROUP` and friends keep working for the counter layer.
pub use crate::groups::{
    GROUP_BLOCK, LEVEL_TWO_GROUP, enabled_slot_name, group_level, running_slot_name,
};

/// The PMU a hybrid model's counter belongs to, from perf's `pmu/event` naming; `None` for the
/// CPU's one core PMU.
pub fn counter_pmu(name: &str) -> Option<&str> {
    const HYBRID_PMUS: [&str; 3] = ["cpu_core", "cpu_atom", "cpu_lowpower"];
    let (prefix, _) = name.split_once('/')?;
    HYBRID_PMUS.contains(&prefix).then_some(prefix)
}

/// One BPF counter slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The counter's name, or `groupN.enabled_ns`/`groupN.running_ns`.
    pub name: String,
    /// `topdown_common::slot_source` encoding: which fd and which of its values.
    pub source: u32,
}

/// One perf group to open on every CPU of its PMU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerfGroup {
    /// `None`: the core PMU on every CPU; `Some("cpu_atom")`: only that PMU's CPUs.
    pub pmu: Option<String>,
    pub pinned: bool,
    /// Indices into [`Plan::counters`], leader first. A counter's fd goes to the BPF fd slot
    /// equal to its index.
    pub members: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The counters opened, in fd-slot order.
    pub counters: Vec<CounterSpec>,
    /// BPF slots: one per counter (same index), then the timing slots of flexible groups.
    pub slots: Vec<Slot>,
    pub groups: Vec<PerfGroup>,
    /// One line per PMU whose groups rotate, for the user.
    pub notes: Vec<String>,
}

impl Plan {
    /// Slot names in slot order: what the aggregation names each slot's sums.
    pub fn slot_names(&self) -> Vec<String> {
        self.slots.iter().map(|slot| slot.name.clone()).collect()
    }

    /// The `SLOT_SOURCES` global for the BPF side.
    pub fn slot_sources(&self) -> [u32; MAX_COUNTERS] {
        let mut sources = slot_source::identity();
        for (slot, planned) in self.slots.iter().enumerate() {
            sources[slot] = planned.source;
        }
        sources
    }
}

/// General-purpose counters available on a PMU (`None`: unknown or unlimited, as for software
/// and tracepoint events). The NMI watchdog's counter is already subtracted.
pub type Budget<'a> = &'a dyn Fn(Option<&str>) -> Option<u32>;

/// Plans `model`'s counters for `level`: level-2-only groups are left out below level 2.
pub fn plan(model: &dyn Model, level: u8, budget: Budget<'_>) -> Result<Plan> {
    let counters: Vec<CounterSpec> = model
        .counters()
        .into_iter()
        .filter(|spec| level >= 2 || group_level(spec.group) == 1)
        .collect();
    if counters.is_empty() {
        bail!("model {} has no counters to open", model.name());
    }

    // Partition by PMU, keeping first-seen order.
    let mut pmus: Vec<Option<String>> = Vec::new();
    for spec in &counters {
        let pmu = counter_pmu(&spec.name).map(str::to_owned);
        if !pmus.contains(&pmu) {
            pmus.push(pmu);
        }
    }

    let mut groups = Vec::new();
    let mut timing_slots: Vec<(u8, usize)> = Vec::new();
    let mut notes = Vec::new();
    for pmu in pmus {
        let indices: Vec<usize> = (0..counters.len())
            .filter(|&index| counter_pmu(&counters[index].name).map(str::to_owned) == pmu)
            .collect();
        let mut model_groups: Vec<u8> = indices.iter().map(|&i| counters[i].group).collect();
        model_groups.sort_unstable();
        model_groups.dedup();
        let members = |group: u8| -> Vec<usize> {
            indices
                .iter()
                .copied()
                .filter(|&index| counters[index].group == group)
                .collect()
        };
        let general = |members: &[usize]| -> u32 {
            members
                .iter()
                .filter(|&&index| counters[index].uses == CounterUse::General)
                .count() as u32
        };
        let total_general = general(&indices);
        let available = budget(pmu.as_deref());
        let fits_all = available.is_none_or(|available| total_general <= available);
        if fits_all {
            groups.push(PerfGroup {
                pmu: pmu.clone(),
                pinned: true,
                members: indices.clone(),
            });
            continue;
        }
        let available = available.unwrap_or(u32::MAX);
        let level_one: Vec<u8> = model_groups
            .iter()
            .copied()
            .filter(|&group| group_level(group) == 1)
            .collect();
        let level_one_general: u32 = level_one.iter().map(|&g| general(&members(g))).sum();
        let largest_other = model_groups
            .iter()
            .filter(|&&group| group_level(group) == 2)
            .map(|&group| general(&members(group)))
            .max()
            .unwrap_or(0);
        let pin_level_one = level_one_general + largest_other <= available;
        for &group in &model_groups {
            let group_members = members(group);
            let needed = general(&group_members);
            if needed > available {
                let remedy = if group_level(group) == 2 {
                    "use -l 1, or free counters"
                } else {
                    "free counters"
                };
                bail!(
                    "model {} needs {needed} general-purpose counters at once for {} but the \
                     {} PMU has {available} free: {remedy} (the NMI watchdog holds one: \
                     sysctl kernel.nmi_watchdog=0)",
                    model.name(),
                    describe_group(group),
                    pmu.as_deref().unwrap_or("core"),
                );
            }
            let pinned = pin_level_one && group_level(group) == 1;
            if !pinned {
                timing_slots.push((group, group_members[0]));
            }
            groups.push(PerfGroup {
                pmu: pmu.clone(),
                pinned,
                members: group_members,
            });
        }
        let what = if pin_level_one {
            "level-2 counters take turns; level-2 metrics are estimated"
        } else {
            "all counters take turns; every metric is estimated"
        };
        notes.push(format!(
            "topdown: {} needs {total_general} general-purpose counters on the {} PMU, which \
             has {available} free: {what} (scaled by each group's enabled/running time)",
            model.name(),
            pmu.as_deref().unwrap_or("core"),
        ));
    }

    let mut slots: Vec<Slot> = counters
        .iter()
        .enumerate()
        .map(|(index, spec)| Slot {
            name: spec.name.clone(),
            source: slot_source::encode(index as u32, slot_source::FIELD_COUNT),
        })
        .collect();
    for (group, leader) in timing_slots {
        slots.push(Slot {
            name: enabled_slot_name(group),
            source: slot_source::encode(leader as u32, slot_source::FIELD_ENABLED),
        });
        slots.push(Slot {
            name: running_slot_name(group),
            source: slot_source::encode(leader as u32, slot_source::FIELD_RUNNING),
        });
    }
    if slots.len() > MAX_COUNTERS {
        bail!(
            "model {} needs {} counter slots at level {level} but the BPF side has {}: use -l 1",
            model.name(),
            slots.len(),
            MAX_COUNTERS
        );
    }
    Ok(Plan {
        counters,
        slots,
        groups,
        notes,
    })
}

fn describe_group(group: u8) -> String {
    match group_level(group) {
        1 => format!("level 1 (group {group})"),
        _ => format!("level 2 (group {group})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Six level-1 events, a fixed counter, and two level-2 groups of four: 14 general in all.
    struct Toy;

    impl Model for Toy {
        crate::model::name_and_description!("toy", "toy");
        fn counters(&self) -> Vec<CounterSpec> {
            let mut specs: Vec<CounterSpec> = (0..6)
                .map(|index| CounterSpec::raw(&format!("l1_{index}"), index))
                .collect();
            specs.push(CounterSpec::raw("fixed", 0x99).fixed());
            specs.extend(
                (0..4).map(|index| {
                    CounterSpec::raw(&format!("a_{index}"), 0x100 + index).in_group(8)
                }),
            );
            specs.extend(
                (0..4).map(|index| {
                    CounterSpec::raw(&format!("b_{index}"), 0x200 + index).in_group(9)
                }),
            );
            specs
        }
        fn max_level(&self) -> u8 {
            2
        }
        fn metrics_into(&self, _values: &[u64], _level: u8, out: &mut [Option<f64>]) {
            out.fill(None);
        }
        fn slots(&self, _values: &[u64]) -> Option<f64> {
            None
        }
        fn weight_counter(&self) -> &'static str {
            "l1_0"
        }
    }

    #[test]
    fn everything_fits_in_one_pinned_group() {
        for budget in [Some(14), None] {
            let plan = plan(&Toy, 2, &|_| budget).unwrap();
            assert_eq!(plan.groups.len(), 1);
            assert!(plan.groups[0].pinned);
            assert_eq!(plan.groups[0].members, (0..15).collect::<Vec<_>>());
            assert_eq!(plan.slots.len(), 15);
            assert!(plan.notes.is_empty());
            assert_eq!(plan.slot_sources()[3], 3);
        }
    }

    #[test]
    fn level_one_alone_drops_level_two_groups() {
        let plan = plan(&Toy, 1, &|_| Some(6)).unwrap();
        assert_eq!(plan.counters.len(), 7);
        assert_eq!(plan.groups.len(), 1);
        assert!(plan.groups[0].pinned);
        assert!(plan.notes.is_empty());
    }

    #[test]
    fn level_one_stays_pinned_when_each_level_two_group_fits_beside_it() {
        // 14 > 10 free, but 6 (level 1) + 4 (largest level-2 group) = 10 fits.
        let plan = plan(&Toy, 2, &|_| Some(10)).unwrap();
        let pinned: Vec<bool> = plan.groups.iter().map(|group| group.pinned).collect();
        assert_eq!(pinned, [true, false, false]);
        assert_eq!(plan.groups[1].members, [7, 8, 9, 10]);
        assert!(
            plan.notes[0].contains("level-2 metrics are estimated"),
            "{:?}",
            plan.notes
        );
        let names = plan.slot_names()[15..].to_vec();
        assert_eq!(
            names,
            [
                "group8.enabled_ns",
                "group8.running_ns",
                "group9.enabled_ns",
                "group9.running_ns"
            ]
        );
        let sources = plan.slot_sources();
        assert_eq!(
            sources[15],
            slot_source::encode(7, slot_source::FIELD_ENABLED)
        );
        assert_eq!(
            sources[18],
            slot_source::encode(11, slot_source::FIELD_RUNNING)
        );
    }

    #[test]
    fn everything_rotates_when_level_one_cannot_stay_pinned() {
        let plan = plan(&Toy, 2, &|_| Some(8)).unwrap();
        assert!(plan.groups.iter().all(|group| !group.pinned));
        assert!(plan.notes[0].contains("every metric is estimated"));
        assert_eq!(plan.slot_names()[15], "group0.enabled_ns");
        assert_eq!(plan.slots.len(), 21);
    }

    #[test]
    fn a_group_larger_than_the_pmu_is_a_clear_error() {
        let err = plan(&Toy, 2, &|_| Some(5)).unwrap_err().to_string();
        assert!(err.contains("needs 6 general-purpose counters"), "{err}");
        assert!(err.contains("nmi_watchdog"), "{err}");
    }

    #[test]
    fn hybrid_counter_names_name_their_pmu() {
        assert_eq!(
            counter_pmu("cpu_atom/TOPDOWN_FE_BOUND.ALL"),
            Some("cpu_atom")
        );
        assert_eq!(counter_pmu("slots"), None);
        assert_eq!(counter_pmu("armv8_pmuv3_0/stall_slot/"), None);
    }
}
