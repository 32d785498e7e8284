//! The side-band records of the per-task counters' ring buffers, decoded.
//!
//! Layouts from include/uapi/linux/perf_event.h, `enum perf_event_type`, for the attributes
//! [`super::task_counters`] sets: `sample_id_all` with `sample_type = PERF_SAMPLE_TIME` (so every
//! record ends with its `u64` time) and `read_format = TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING |
//! ID` without `PERF_FORMAT_GROUP` (so a `PERF_RECORD_READ` carries one counter).

use perf_event_open_sys::bindings;

/// One counter's value as the kernel reports it with this read format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterValue {
    pub value: u64,
    pub enabled_ns: u64,
    pub running_ns: u64,
}

impl std::ops::AddAssign for CounterValue {
    fn add_assign(&mut self, other: Self) {
        self.value = self.value.wrapping_add(other.value);
        self.enabled_ns = self.enabled_ns.wrapping_add(other.enabled_ns);
        self.running_ns = self.running_ns.wrapping_add(other.running_ns);
    }
}

/// What the ring buffers tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// `PERF_RECORD_READ`: an inherited counter's final value for task `tid` of process `pid`,
    /// written as the task exits (`inherit_stat`). `id` is the counter's parent event id.
    Read {
        pid: u32,
        tid: u32,
        id: u64,
        counter: CounterValue,
    },
    /// `PERF_RECORD_FORK`: task `tid` (process `pid`) was created by `ptid`.
    Fork { pid: u32, tid: u32, ptid: u32 },
    /// `PERF_RECORD_EXIT`: task `tid` (process `pid`) exited; its exit readings follow.
    Exit { pid: u32, tid: u32 },
    /// `PERF_RECORD_COMM`: task `tid` took the name `comm` (exec, `PR_SET_NAME`) at `time`.
    Comm {
        pid: u32,
        tid: u32,
        comm: String,
        time: u64,
    },
    /// `PERF_RECORD_LOST`: `lost` records did not fit in the buffer.
    Lost { lost: u64 },
    /// Any other type (throttling, ...): nothing to learn from it here.
    Other,
}

fn u32_at(bytes: &[u8], offset: usize) -> Option<u32> {
    let raw = bytes.get(offset..offset.checked_add(4)?)?;
    Some(u32::from_ne_bytes(raw.try_into().ok()?))
}

fn u64_at(bytes: &[u8], offset: usize) -> Option<u64> {
    let raw = bytes.get(offset..offset.checked_add(8)?)?;
    Some(u64::from_ne_bytes(raw.try_into().ok()?))
}

/// Size of `struct perf_event_header`: `u32 type, u16 misc, u16 size`.
pub const HEADER_SIZE: usize = 8;

/// The total size of the record starting at `bytes` (from its header), if the header is there.
pub fn record_size(bytes: &[u8]) -> Option<usize> {
    let raw = bytes.get(6..8)?;
    Some(usize::from(u16::from_ne_bytes(raw.try_into().ok()?)))
}

/// Decodes one whole record (header included). `None`: too short for its type, which only a
/// kernel with another layout would write; the caller counts it.
pub fn decode(record: &[u8]) -> Option<Record> {
    let kind = u32_at(record, 0)?;
    let body = record.get(HEADER_SIZE..)?;
    match kind {
        bindings::PERF_RECORD_READ => Some(Record::Read {
            pid: u32_at(body, 0)?,
            tid: u32_at(body, 4)?,
            counter: CounterValue {
                value: u64_at(body, 8)?,
                enabled_ns: u64_at(body, 16)?,
                running_ns: u64_at(body, 24)?,
            },
            id: u64_at(body, 32)?,
        }),
        // { u32 pid, ppid; u32 tid, ptid; u64 time; }
        bindings::PERF_RECORD_FORK => Some(Record::Fork {
            pid: u32_at(body, 0)?,
            tid: u32_at(body, 8)?,
            ptid: u32_at(body, 12)?,
        }),
        // The same layout as the fork record.
        bindings::PERF_RECORD_EXIT => Some(Record::Exit {
            pid: u32_at(body, 0)?,
            tid: u32_at(body, 8)?,
        }),
        // { u32 pid, tid; char comm[] (NUL-padded to 8 bytes); struct sample_id; } and our
        // sample_id is the time alone, the record's last 8 bytes.
        bindings::PERF_RECORD_COMM => {
            let time_at = body.len().checked_sub(8)?;
            let name = body.get(8..time_at)?;
            let end = name
                .iter()
                .position(|&byte| byte == 0)
                .unwrap_or(name.len());
            Some(Record::Comm {
                pid: u32_at(body, 0)?,
                tid: u32_at(body, 4)?,
                comm: String::from_utf8_lossy(&name[..end]).into_owned(),
                time: u64_at(body, time_at)?,
            })
        }
        // { u64 id; u64 lost; struct sample_id; }
        bindings::PERF_RECORD_LOST => Some(Record::Lost {
            lost: u64_at(body, 8)?,
        }),
        _ => Some(Record::Other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u32, size: usize) -> Vec<u8> {
        let mut bytes = kind.to_ne_bytes().to_vec();
        bytes.extend(0u16.to_ne_bytes());
        bytes.extend((size as u16).to_ne_bytes());
        bytes
    }

    #[test]
    fn a_read_record_carries_the_task_and_its_counter() {
        let mut record = header(bindings::PERF_RECORD_READ, 56);
        for word in [101u32, 102] {
            record.extend(word.to_ne_bytes());
        }
        for word in [1234u64, 50, 40, 7, 999] {
            record.extend(word.to_ne_bytes());
        }
        assert_eq!(record_size(&record), Some(56));
        assert_eq!(
            decode(&record),
            Some(Record::Read {
                pid: 101,
                tid: 102,
                id: 7,
                counter: CounterValue {
                    value: 1234,
                    enabled_ns: 50,
                    running_ns: 40
                },
            })
        );
        // Cut short: refused, not misread.
        assert_eq!(decode(&record[..30]), None);
    }

    #[test]
    fn comm_fork_exit_and_lost_records() {
        let mut comm = header(bindings::PERF_RECORD_COMM, 32);
        comm.extend(5u32.to_ne_bytes());
        comm.extend(6u32.to_ne_bytes());
        comm.extend(b"true\0\0\0\0");
        comm.extend(77u64.to_ne_bytes());
        assert_eq!(
            decode(&comm),
            Some(Record::Comm {
                pid: 5,
                tid: 6,
                comm: "true".to_owned(),
                time: 77
            })
        );
        let mut fork = header(bindings::PERF_RECORD_FORK, 40);
        for word in [5u32, 4, 9, 6] {
            fork.extend(word.to_ne_bytes());
        }
        fork.extend(1u64.to_ne_bytes());
        fork.extend(2u64.to_ne_bytes());
        assert_eq!(
            decode(&fork),
            Some(Record::Fork {
                pid: 5,
                tid: 9,
                ptid: 6
            })
        );
        let mut lost = header(bindings::PERF_RECORD_LOST, 32);
        for word in [3u64, 12, 0] {
            lost.extend(word.to_ne_bytes());
        }
        assert_eq!(decode(&lost), Some(Record::Lost { lost: 12 }));
        let mut exit = header(bindings::PERF_RECORD_EXIT, 40);
        for word in [5u32, 4, 9, 6] {
            exit.extend(word.to_ne_bytes());
        }
        exit.extend(1u64.to_ne_bytes());
        exit.extend(2u64.to_ne_bytes());
        assert_eq!(decode(&exit), Some(Record::Exit { pid: 5, tid: 9 }));
        // Cut short: refused, not misread.
        assert_eq!(decode(&header(bindings::PERF_RECORD_EXIT, 8)), None);
        assert_eq!(
            decode(&header(bindings::PERF_RECORD_THROTTLE, 8)),
            Some(Record::Other)
        );
    }
}
