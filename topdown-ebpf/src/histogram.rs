//! Per-call histograms (`topdown_common::histogram`): one call's counter deltas into the
//! bucket its weight picks. Written for any kind of call (`HistogramKey::kind`): function
//! probes call it as each call closes. Spans keep their buckets in their totals' key
//! (`topdown_common::usdt::SpanKey::bucket`), picked by the same `weight_bucket`.

use aya_ebpf::maps::PerCpuArray;
use aya_ebpf::{bindings::BPF_F_NO_PREALLOC, macros::map, maps::HashMap};
use topdown_common::{HistogramBucket, HistogramKey, MAX_COUNTERS, histogram};

use crate::maps::{atomic_add, entry_or_zeroed, global};

/// The counter slot whose per-call count picks the bucket (the model's weight counter).
#[unsafe(no_mangle)]
pub(crate) static WEIGHT_SLOT: u32 = 0;

/// Buckets in use, keyed by owner and bucket. Not preallocated: a whole-library glob probes
/// thousands of functions and each uses a few dozen of the 252 buckets at most, so memory
/// follows the buckets that calls reached. Sized by user space (`--max-buckets`).
#[map]
pub(crate) static HISTOGRAMS: HashMap<HistogramKey, HistogramBucket> =
    HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// Never written: the zeroed value new buckets are copied from (272 bytes: not on the stack).
#[map]
pub(crate) static ZERO_BUCKET: PerCpuArray<HistogramBucket> = PerCpuArray::with_max_entries(1, 0);

/// The bucket of a call (or span) whose counter deltas are `deltas`: by its weight counter.
#[inline(always)]
pub(crate) fn weight_bucket(deltas: &[u64; MAX_COUNTERS]) -> u32 {
    histogram::bucket(deltas[global(&WEIGHT_SLOT) as usize & (MAX_COUNTERS - 1)])
}

/// Adds one call of `kind`/`owner` (in process `tgid`, 0 when not split) with counter `deltas`
/// (the first `used` slots) and `callee_calls` probed callees to its bucket. False when the
/// bucket was new and the map full: the call is then in no bucket.
#[inline(always)]
pub(crate) fn record(
    kind: u32,
    owner: u32,
    tgid: u32,
    deltas: &[u64; MAX_COUNTERS],
    used: usize,
    callee_calls: u64,
) -> bool {
    let key = HistogramKey {
        kind,
        owner,
        tgid,
        bucket: weight_bucket(deltas),
    };
    let Some(bucket) = entry_or_zeroed(&HISTOGRAMS, &key, || ZERO_BUCKET.get_ptr(0)) else {
        return false;
    };
    // Several CPUs may add to one bucket at once, as to a function's totals.
    // SAFETY: naturally aligned u64 fields of a live map value.
    unsafe {
        atomic_add(&raw mut (*bucket).calls, 1);
        atomic_add(&raw mut (*bucket).callee_calls, callee_calls);
    }
    let mut slot = 0;
    while slot < MAX_COUNTERS && slot < used {
        // SAFETY: as above.
        unsafe { atomic_add(&raw mut (*bucket).counters[slot], deltas[slot]) };
        slot += 1;
    }
    true
}
