//! The tasks a snapshot found in the task map.

use std::collections::HashMap;

use foldhash::fast::RandomState as FastHash;
use topdown_common::TaskCounters;

/// Tasks still in the map (alive at their last switch), one entry per tid, in the order the
/// map gave them, with an index by tid.
///
/// The map's order is its hash order, the same from one snapshot to the next for the tasks
/// both hold, so comparing two snapshots in that order reads the earlier one almost front to
/// back; the index is a small table (8 bytes a task) that stays in cache. Sorting by tid or
/// looking each task up in a map of whole entries cost two to three times more at 100000
/// tasks (BENCHMARKS.md, refresh cost).
#[derive(Clone, Debug, Default)]
pub struct LiveTasks {
    tids: Vec<u32>,
    counters: Vec<TaskCounters>,
    /// tid -> position in `tids` and `counters`.
    position: HashMap<u32, u32, FastHash>,
}

impl LiveTasks {
    /// From the map's entries (`tids[i]` owns `counters[i]`); a tid given twice keeps its
    /// last entry, as inserting into a map would.
    pub fn from_entries(mut tids: Vec<u32>, mut counters: Vec<TaskCounters>) -> Self {
        let len = tids.len().min(counters.len());
        tids.truncate(len);
        counters.truncate(len);
        let mut position: HashMap<u32, u32, FastHash> =
            HashMap::with_capacity_and_hasher(len, FastHash::default());
        let mut repeated = false;
        for (tid, index) in tids.iter().zip(0u32..) {
            repeated |= position.insert(*tid, index).is_some();
        }
        if repeated {
            // Only the entries the index points at stay (a kernel map never repeats a key).
            let keep: Vec<bool> = tids
                .iter()
                .zip(0u32..)
                .map(|(tid, index)| position.get(tid) == Some(&index))
                .collect();
            let mut kept = keep.iter();
            tids.retain(|_| kept.next() == Some(&true));
            let mut kept = keep.iter();
            counters.retain(|_| kept.next() == Some(&true));
            return Self::from_entries(tids, counters);
        }
        Self {
            tids,
            counters,
            position,
        }
    }

    /// Without the entries that `exits` (exit records read after the map was) shows ended:
    /// a task retiring while a snapshot is taken submits its record before its entry leaves the
    /// map, so the map may still hold it when the record is already read. Its record is the
    /// later reading of the same task (same process, no count smaller); counted as both, its
    /// counts would be reported twice (once live, once as its exit).
    pub fn without_retired(self, exits: &[(u32, TaskCounters)]) -> Self {
        let mut retired: Vec<u32> = exits
            .iter()
            .filter_map(|(tid, exit)| {
                let index = *self.position.get(tid)?;
                let live = self.counters.get(index as usize)?;
                let earlier = live.tgid == exit.tgid
                    && live.switches <= exit.switches
                    && live
                        .counters
                        .iter()
                        .zip(&exit.counters)
                        .all(|(live, exit)| live <= exit);
                earlier.then_some(index)
            })
            .collect();
        if retired.is_empty() {
            return self;
        }
        retired.sort_unstable();
        let Self {
            mut tids,
            mut counters,
            ..
        } = self;
        let mut index = 0u32;
        tids.retain(|_| {
            index += 1;
            retired.binary_search(&(index - 1)).is_err()
        });
        let mut index = 0u32;
        counters.retain(|_| {
            index += 1;
            retired.binary_search(&(index - 1)).is_err()
        });
        Self::from_entries(tids, counters)
    }

    pub fn get(&self, tid: u32) -> Option<&TaskCounters> {
        let index = *self.position.get(&tid)?;
        self.counters.get(index as usize)
    }

    /// `get`, looking first at `cursor`, which it leaves after the entry found: walking
    /// another snapshot of the same map in its order, the tasks both hold come in the same
    /// order, so most lookups need no hashing and read this snapshot front to back.
    pub fn get_near(&self, tid: u32, cursor: &mut usize) -> Option<&TaskCounters> {
        let index = if self.tids.get(*cursor) == Some(&tid) {
            *cursor
        } else {
            *self.position.get(&tid)? as usize
        };
        *cursor = index + 1;
        self.counters.get(index)
    }

    /// In the map's order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (u32, &TaskCounters)> {
        self.tids.iter().copied().zip(&self.counters)
    }

    pub fn len(&self) -> usize {
        self.tids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tids.is_empty()
    }
}

impl FromIterator<(u32, TaskCounters)> for LiveTasks {
    /// A tid given twice keeps its last entry, as inserting into a map would.
    fn from_iter<I: IntoIterator<Item = (u32, TaskCounters)>>(entries: I) -> Self {
        let (tids, counters) = entries.into_iter().unzip();
        Self::from_entries(tids, counters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(switches: u64) -> TaskCounters {
        TaskCounters {
            switches,
            ..TaskCounters::ZERO
        }
    }

    #[test]
    fn entries_keep_their_order_and_the_last_of_a_tid_wins() {
        let live: LiveTasks = [
            (30, task(1)),
            (10, task(2)),
            (20, task(3)),
            (10, task(4)),
            (40, task(5)),
        ]
        .into_iter()
        .collect();
        let order: Vec<(u32, u64)> = live.iter().map(|(tid, t)| (tid, t.switches)).collect();
        assert_eq!(order, [(30, 1), (20, 3), (10, 4), (40, 5)]);
        assert_eq!(live.get(10).map(|t| t.switches), Some(4));
        assert_eq!(live.get(40).map(|t| t.switches), Some(5));
        assert!(live.get(25).is_none());
        assert_eq!(live.len(), 4);
        // In order, then out of order, then missing: the same answers as `get`.
        let mut cursor = 0;
        for tid in [30, 20, 10, 40, 20, 30, 25, 40] {
            assert_eq!(
                live.get_near(tid, &mut cursor).map(|t| t.switches),
                live.get(tid).map(|t| t.switches),
                "tid {tid}"
            );
        }
        assert!(LiveTasks::default().is_empty());
    }

    fn reading(tgid: u32, switches: u64, slots: u64) -> TaskCounters {
        let mut task = task(switches);
        task.tgid = tgid;
        task.counters[0] = slots;
        task
    }

    #[test]
    fn a_live_entry_whose_exit_record_is_already_read_is_left_to_the_record() {
        let live: LiveTasks = [
            (10, reading(10, 4, 100)),
            (11, reading(10, 2, 50)),
            (12, reading(10, 2, 50)),
            (13, reading(10, 2, 50)),
            (14, reading(10, 2, 50)),
        ]
        .into_iter()
        .collect();
        let exits = [
            // The same task, read again at its last switch: the record stands for it.
            (11, reading(10, 3, 70)),
            // Exactly the reading the map holds (no switch in between): the same task too.
            (12, reading(10, 2, 50)),
            // Another process's task under a reused tid: the live entry is another task.
            (13, reading(99, 3, 70)),
            // Fewer counts than the live entry: not a later reading of it.
            (14, reading(10, 3, 40)),
            // No live entry at all.
            (15, reading(10, 1, 5)),
        ];
        let kept = live.without_retired(&exits);
        let tids: Vec<u32> = kept.iter().map(|(tid, _)| tid).collect();
        assert_eq!(tids, [10, 13, 14]);
        assert_eq!(kept.get(14).map(|task| task.counters[0]), Some(50));
        assert!(kept.get(11).is_none() && kept.get(12).is_none());
        let unchanged = kept.clone().without_retired(&[]);
        assert_eq!(unchanged.len(), 3);
    }
}
