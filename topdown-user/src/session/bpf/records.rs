//! Decoding the raw records the BPF side sends through its ring buffer. They are the
//! `#[repr(C)]` types of topdown-common in native byte order; reading them field by field
//! with `bytes::Buf` needs no alignment and no `unsafe`, and a layout change in the shared
//! crate fails the assertions below instead of silently misreading counters.

use bytes::Buf as _;
use topdown_common::{MAX_COUNTERS, TaskCounters, TaskExit};

// The layout `decode_exit` reads, checked against the compiler's.
const _: () = {
    assert!(std::mem::offset_of!(TaskExit, tid) == 0);
    assert!(std::mem::offset_of!(TaskExit, task) == 8);
    assert!(std::mem::offset_of!(TaskCounters, counters) == 0);
    assert!(std::mem::offset_of!(TaskCounters, switches) == 8 * MAX_COUNTERS);
    assert!(std::mem::offset_of!(TaskCounters, tgid) == 8 * MAX_COUNTERS + 8);
    assert!(std::mem::offset_of!(TaskCounters, exited) == 8 * MAX_COUNTERS + 12);
    assert!(std::mem::offset_of!(TaskCounters, comm) == 8 * MAX_COUNTERS + 16);
    assert!(std::mem::size_of::<TaskExit>() == 8 + 8 * MAX_COUNTERS + 32);
};

/// One exit record: the dead thread's id and its final counters. `None` for a record too
/// short to be one (never expected; the caller logs it).
pub fn decode_exit(mut record: &[u8]) -> Option<(u32, TaskCounters)> {
    if record.len() < std::mem::size_of::<TaskExit>() {
        return None;
    }
    let tid = record.get_u32_ne();
    let _pad = record.get_u32_ne();
    let mut task = TaskCounters::ZERO;
    for counter in &mut task.counters {
        *counter = record.get_u64_ne();
    }
    task.switches = record.get_u64_ne();
    task.tgid = record.get_u32_ne();
    task.exited = record.get_u32_ne();
    record.copy_to_slice(&mut task.comm);
    Some((tid, task))
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut as _, BytesMut};

    use super::*;

    #[test]
    fn an_exit_record_decodes_to_the_values_written() {
        let mut record = BytesMut::new();
        record.put_u32_ne(4242);
        record.put_u32_ne(0);
        for index in 0..MAX_COUNTERS as u64 {
            record.put_u64_ne(1000 + index);
        }
        record.put_u64_ne(7);
        record.put_u32_ne(4240);
        record.put_u32_ne(1);
        record.put_slice(b"worker-3\0\0\0\0\0\0\0\0");
        assert_eq!(record.len(), std::mem::size_of::<TaskExit>());
        let (tid, task) = decode_exit(&record).unwrap();
        assert_eq!(tid, 4242);
        assert_eq!(task.counters[0], 1000);
        assert_eq!(
            task.counters[MAX_COUNTERS - 1],
            1000 + MAX_COUNTERS as u64 - 1
        );
        assert_eq!((task.switches, task.tgid, task.exited), (7, 4240, 1));
        assert_eq!(&task.comm[..8], b"worker-3");
        // A truncated record is refused, not half-read.
        assert!(decode_exit(&record[..record.len() - 1]).is_none());
    }
}
