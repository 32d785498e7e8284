//! Reading a whole BPF hash map with `BPF_MAP_LOOKUP_BATCH` (Linux 5.6): one system call per
//! few thousand entries, where aya's map iterator makes two per entry (`BPF_MAP_GET_NEXT_KEY`,
//! then `BPF_MAP_LOOKUP_ELEM`). At 100000 tasks that is the difference between about 350 ms
//! and about 55 ms per refresh on this project's VM (BENCHMARKS.md, refresh cost).
//!
//! aya 0.16 has no batch operations, so topdown makes this call itself (`super::syscall`); the
//! attribute layout is the kernel's `union bpf_attr`, `batch` member
//! (include/uapi/linux/bpf.h, "struct { /* struct used by BPF_MAP_*_BATCH commands */").

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd, OwnedFd},
};

use aya::Pod;

use super::syscall::{bpf, bpf_fd};

/// `BPF_MAP_LOOKUP_BATCH` in `enum bpf_cmd` (include/uapi/linux/bpf.h).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Entries asked for per call: enough to make the per-call cost small, small enough that the
/// kernel's temporary copy (it stages a call's entries before copying them out) stays modest.
const ENTRIES_PER_CALL: u32 = 4096;

/// The `batch` member of `union bpf_attr` (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    /// Where the previous call stopped (`NULL`: from the start).
    in_batch: u64,
    /// Where this call stopped, written by the kernel.
    out_batch: u64,
    keys: u64,
    values: u64,
    /// In: room for this many entries; out: entries written.
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Why a batch read could not be used.
#[derive(Debug)]
pub enum BatchError {
    /// The kernel (before 5.6) or this map type has no batch lookup: iterate instead.
    Unsupported,
    Failed(io::Error),
}

/// Every entry of the hash map `map` (keys `K`, values `V`), appended to `keys` and `values`
/// in the map's own order. Entries added or removed while it reads may or may not be seen,
/// as with iteration; each entry is read whole (the kernel copies a bucket under its lock).
pub fn lookup_all<K: Pod, V: Pod>(
    map: BorrowedFd<'_>,
    keys: &mut Vec<K>,
    values: &mut Vec<V>,
) -> Result<(), BatchError> {
    // The kernel's cursor for hash maps is a bucket index (u32); room for a key-sized one
    // keeps this right for maps whose cursor is their key.
    let mut cursor = [0u64; 4];
    let cursor_len = std::mem::size_of_val(&cursor);
    if std::mem::size_of::<K>() > cursor_len {
        return Err(BatchError::Unsupported);
    }
    let mut next_cursor = [0u64; 4];
    let mut first = true;
    let mut per_call = ENTRIES_PER_CALL;
    loop {
        keys.reserve(per_call as usize);
        values.reserve(per_call as usize);
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { cursor.as_ptr() as u64 },
            out_batch: next_cursor.as_mut_ptr() as u64,
            keys: keys.spare_capacity_mut().as_mut_ptr() as u64,
            values: values.spare_capacity_mut().as_mut_ptr() as u64,
            count: per_call,
            map_fd: map.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is a valid `bpf_attr` prefix of the size given (the kernel zero-extends
        // a shorter attribute); `keys` and `values` have room for `count` entries each, and the
        // cursors for any cursor the kernel writes.
        let status = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>() as libc::c_uint,
            )
        };
        let error = (status != 0).then(io::Error::last_os_error);
        let read = attr.count.min(per_call) as usize;
        // SAFETY: the kernel wrote `read` whole entries into the spare capacity, and `K` and
        // `V` are `Pod`: any bytes are valid values.
        unsafe {
            keys.set_len(keys.len() + read);
            values.set_len(values.len() + read);
        }
        match error.as_ref().and_then(io::Error::raw_os_error) {
            None => {}
            // The end of the map (the last call may still have returned entries).
            Some(libc::ENOENT) => return Ok(()),
            // One bucket holds more entries than fit: ask again from the same place with room.
            Some(libc::ENOSPC) if read == 0 && per_call < u32::MAX / 2 => {
                per_call *= 2;
                continue;
            }
            // Unknown command (before 5.6) or not supported for this map type (ENOTSUPP).
            Some(libc::EINVAL | libc::EOPNOTSUPP | 524) if first && read == 0 => {
                return Err(BatchError::Unsupported);
            }
            Some(_) => {
                return Err(BatchError::Failed(
                    error.unwrap_or_else(io::Error::last_os_error),
                ));
            }
        }
        cursor = next_cursor;
        first = false;
    }
}

/// `BPF_MAP_CREATE`, `BPF_MAP_UPDATE_ELEM` and `BPF_MAP_TYPE_HASH` (include/uapi/linux/bpf.h).
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_TYPE_HASH: u32 = 1;

/// `union bpf_attr`'s map-creation member, as far as needed here.
#[repr(C)]
#[derive(Default)]
struct CreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// `union bpf_attr`'s element member.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// A BPF hash map of this process's own, outside any BPF object, with room for `max_entries`
/// entries of `K` to `V`: tests and `cargo xtask bench` fill one to read it back. Needs
/// `CAP_BPF`.
pub fn scratch_hash_map<K: Pod, V: Pod>(max_entries: u32) -> io::Result<OwnedFd> {
    let size = |bytes: usize| u32::try_from(bytes).map_err(io::Error::other);
    let mut create = CreateAttr {
        map_type: BPF_MAP_TYPE_HASH,
        key_size: size(std::mem::size_of::<K>())?,
        value_size: size(std::mem::size_of::<V>())?,
        max_entries: max_entries.max(1),
        map_flags: 0,
    };
    bpf_fd(BPF_MAP_CREATE, &mut create)
}

/// Sets `key` to `value` in the hash map `map` (`BPF_MAP_UPDATE_ELEM`, any flags).
pub fn insert<K: Pod, V: Pod>(map: BorrowedFd<'_>, key: &K, value: &V) -> io::Result<()> {
    let mut update = ElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: key as *const K as u64,
        value: value as *const V as u64,
        ..ElemAttr::default()
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut update).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::os::fd::AsFd as _;

    fn value_of(key: u32) -> [u64; 5] {
        let key = u64::from(key);
        [key, key * 3, key * 7 + 1, u64::MAX - key, 42]
    }

    /// Every entry exactly once, whole, across many calls (and a last one that ends the map
    /// with entries), compared with what was inserted. Needs `CAP_BPF` (root in CI).
    #[test]
    fn a_batch_read_returns_every_entry_once_and_whole() {
        for entries in [0u32, 1, 4095, 4096, 4097, 20_000] {
            let map = match scratch_hash_map::<u32, [u64; 5]>(entries) {
                Ok(map) => map,
                Err(err) if std::env::var_os("CI").is_none() => {
                    eprintln!("SKIPPED a_batch_read_returns_every_entry_once_and_whole: {err}");
                    return;
                }
                Err(err) => panic!("creating a BPF hash map (CI runs as root): {err}"),
            };
            for key in 0..entries {
                if let Err(err) = insert(map.as_fd(), &key, &value_of(key)) {
                    panic!("inserting key {key}: {err}");
                }
            }
            let (mut keys, mut values) = (Vec::<u32>::new(), Vec::<[u64; 5]>::new());
            if let Err(err) = lookup_all(map.as_fd(), &mut keys, &mut values) {
                panic!("batch read of {entries} entries: {err:?}");
            }
            assert_eq!(keys.len(), entries as usize, "{entries} entries");
            assert_eq!(values.len(), keys.len());
            let mut seen = vec![false; entries as usize];
            for (key, value) in keys.iter().zip(&values) {
                assert_eq!(*value, value_of(*key), "value of key {key}");
                assert!(
                    !std::mem::replace(&mut seen[*key as usize], true),
                    "key {key} twice"
                );
            }
        }
    }
}
