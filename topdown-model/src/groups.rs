//! The scheduling-group and slot vocabulary shared by the models (which put counters in groups)
//! and the counter budget (`crate::schedule`, which plans the groups onto PMUs).
//!
//! It imports nothing from the rest of the crate so that the dependency runs one way:
//! `groups` <- `model` <- `schedule`.

/// Scheduling groups are numbered per PMU in blocks of this size: a hybrid model puts its
/// E-core model's groups at 16, 17, ... Within a block, groups 0-7 serve level 1 (a model whose
/// level 1 alone exceeds the PMU splits it, e.g. Skylake with SMT) and 8-15 level 2.
pub const GROUP_BLOCK: u8 = 16;

/// The first level-2 group of a block: `CounterSpec::in_group(LEVEL_TWO_GROUP)`.
pub const LEVEL_TWO_GROUP: u8 = 8;

/// The TopDown level a scheduling group serves.
pub fn group_level(group: u8) -> u8 {
    if group % GROUP_BLOCK < LEVEL_TWO_GROUP {
        1
    } else {
        2
    }
}

/// The slot names of a flexible group's leader times.
pub fn enabled_slot_name(group: u8) -> String {
    format!("group{group}.enabled_ns")
}

pub fn running_slot_name(group: u8) -> String {
    format!("group{group}.running_ns")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_levels() {
        assert_eq!(group_level(0), 1);
        assert_eq!(group_level(1), 1);
        assert_eq!(group_level(8), 2);
        assert_eq!(group_level(16), 1);
        assert_eq!(group_level(24), 2);
    }

    #[test]
    fn timing_slot_names() {
        assert_eq!(enabled_slot_name(8), "group8.enabled_ns");
        assert_eq!(running_slot_name(17), "group17.running_ns");
    }
}
