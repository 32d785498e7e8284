//! Per-slot counts, the numbers every step of the pipeline carries before they are named:
//! [`SlotCounts`] (what the counter plan put in each BPF slot, adding and subtracting like
//! numbers) and [`SlotNamer`] (the names a report gives them). Below the aggregation, the
//! report and the span and distribution entries, which all use them.

use std::{
    collections::BTreeMap,
    iter::Sum,
    ops::{Add, AddAssign, Sub},
};

use topdown_common::MAX_COUNTERS;

use crate::model::Counts;

/// Counts per BPF counter slot (what the counter plan put in each slot, `crate::schedule`).
/// Counters only grow, so a difference of two readings saturates at zero instead of wrapping
/// (a task id reused between two snapshots must not produce 2^64-sized deltas).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotCounts(pub [u64; MAX_COUNTERS]);

impl SlotCounts {
    pub const ZERO: Self = Self([0; MAX_COUNTERS]);

    #[inline]
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&count| count == 0)
    }

    /// The count in `slot` (0 past the slots in use).
    pub fn get(&self, slot: usize) -> u64 {
        self.0.get(slot).copied().unwrap_or(0)
    }

    /// Named by the counter plan's slot names, for the report.
    pub fn named(&self, names: &[String]) -> Counts {
        names
            .iter()
            .zip(self.0.iter())
            .map(|(name, value)| (name.clone(), *value))
            .collect()
    }
}

/// [`SlotCounts::named`] for many entities: the names sorted once, so each entity's map is a
/// copy of a template with its values filled in, not a sort of its names.
pub struct SlotNamer {
    template: Counts,
    /// The slot of each of `template`'s keys, in key order (the last slot of a repeated name,
    /// as `named` keeps it).
    slots: Vec<usize>,
}

impl SlotNamer {
    pub fn new(names: &[String]) -> Self {
        let mut slots: BTreeMap<&String, usize> = BTreeMap::new();
        for (slot, name) in names.iter().enumerate().take(MAX_COUNTERS) {
            slots.insert(name, slot);
        }
        Self {
            template: slots.keys().map(|name| ((*name).clone(), 0)).collect(),
            slots: slots.into_values().collect(),
        }
    }

    /// `counts.named(names)` for the names this namer was built with.
    pub fn named(&self, counts: &SlotCounts) -> Counts {
        let mut named = self.template.clone();
        for (value, slot) in named.values_mut().zip(&self.slots) {
            *value = counts.0[*slot];
        }
        named
    }
}

impl Default for SlotCounts {
    fn default() -> Self {
        Self::ZERO
    }
}

impl From<[u64; MAX_COUNTERS]> for SlotCounts {
    fn from(slots: [u64; MAX_COUNTERS]) -> Self {
        Self(slots)
    }
}

/// `impl $op for SlotCounts`: `$combine` slot by slot.
macro_rules! slotwise_op {
    ($op:ident, $method:ident, $combine:path) => {
        impl $op for SlotCounts {
            type Output = Self;
            #[inline]
            fn $method(self, other: Self) -> Self {
                Self(std::array::from_fn(|slot| {
                    $combine(self.0[slot], other.0[slot])
                }))
            }
        }
    };
}

slotwise_op!(Add, add, u64::wrapping_add);
// Counters only grow: a later reading minus an earlier one saturates (type documentation).
slotwise_op!(Sub, sub, u64::saturating_sub);

impl AddAssign for SlotCounts {
    #[inline]
    fn add_assign(&mut self, other: Self) {
        // In place: a 256-byte value rebuilt per addition costs more than the additions.
        for (sum, count) in self.0.iter_mut().zip(other.0) {
            *sum = sum.wrapping_add(count);
        }
    }
}

impl Sum for SlotCounts {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::ZERO, Add::add)
    }
}
