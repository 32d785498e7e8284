//! The first page a perf event's fd maps (`struct perf_event_mmap_page`,
//! include/uapi/linux/perf_event.h) and the self-monitoring read under its sequence lock.
//!
//! The kernel bumps `lock` around every update of the page (the event was scheduled in or
//! out, its counter moved, its times changed); a reader takes `lock`, reads the fields and the
//! hardware counter, and starts over when `lock` changed meanwhile (perf_event.h's comment on
//! `lock`; arm64-perf-attributes.txt "Perf Userspace PMU Hardware Counter Access": "Access to
//! the PMU registers is only valid while the sequence lock is unchanged").
//!
//! The page is read through [`PageWords`], so the same logic runs on a live mapping and, in
//! the tests, on recorded byte arrays laid out like the kernel's struct.

use std::sync::atomic::{Ordering, compiler_fence};

// Byte offsets in struct perf_event_mmap_page (include/uapi/linux/perf_event.h); checked
// against perf-event-open-sys's bindgen struct in the tests.
pub const LOCK: usize = 8;
pub const INDEX: usize = 12;
pub const OFFSET: usize = 16;
pub const TIME_ENABLED: usize = 24;
pub const TIME_RUNNING: usize = 32;
pub const CAPABILITIES: usize = 40;
pub const PMC_WIDTH: usize = 48;
/// The struct's fields end before this (the rest of the first page is reserved or ring
/// buffer bookkeeping, which counting events do not use).
pub const PAGE_FIELDS_END: usize = 96;

/// `cap_user_rdpmc` (bit 2 of `capabilities`, after `cap_bit0` and `cap_bit0_is_deprecated`):
/// the counter may be read from user space with the index of the page (rdpmc on x86, mrs on
/// arm64).
pub const CAP_USER_RDPMC: u64 = 1 << 2;

/// Loads of the page's fields. Implementations must load each field once per call, with no
/// caching: the kernel changes them under the reader.
pub trait PageWords {
    fn u32_at(&self, offset: usize) -> u32;
    fn u64_at(&self, offset: usize) -> u64;
    fn u16_at(&self, offset: usize) -> u16;
}

/// A consistent snapshot of one counter, read in user space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserRead {
    /// `offset` plus the hardware counter sign-extended from `pmc_width` bits: the event's
    /// count (perf_event.h's example read loop).
    pub count: u64,
    /// The hardware counter as the instruction returned it (PERF_METRICS is decoded from the
    /// raw register, not from a count).
    pub raw: u64,
    /// The page's `index` minus one: the selector given to rdpmc / the arm64 counter number.
    pub selector: u32,
    /// The page's times, as of the kernel's last update of the page.
    pub time_enabled: u64,
    pub time_running: u64,
}

/// Why a page does not allow a user-space read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoUserRead {
    /// `cap_user_rdpmc` is 0: rdpmc disabled (`/sys/devices/cpu/rdpmc`), arm64 without
    /// `kernel/perf_user_access`, or a PMU (a VM's, a software one) that does not offer it.
    NoCapability,
    /// `index` is 0: the event is not on a hardware counter now (a software or tracepoint
    /// event, or a hardware event scheduled out).
    NoCounter,
    /// `pmc_width` outside 1..=64.
    BadWidth(u16),
    /// The lock kept changing for every try.
    Unstable,
}

impl std::fmt::Display for NoUserRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoUserRead::NoCapability => write!(
                f,
                "cap_user_rdpmc is 0 in the mmap page (user counter reads disabled: \
                 /sys/devices/cpu/rdpmc, kernel/perf_user_access, or a VM's PMU)"
            ),
            NoUserRead::NoCounter => write!(
                f,
                "index is 0 in the mmap page (not on a hardware counter: a software or \
                 tracepoint event)"
            ),
            NoUserRead::BadWidth(width) => write!(f, "pmc_width {width} in the mmap page"),
            NoUserRead::Unstable => write!(f, "the mmap page's lock never held still"),
        }
    }
}

/// Tries before a read gives up on a lock that keeps moving (each change is a kernel update
/// of the page: a context switch or a counter rotation, rare between two loads).
pub const MAX_TRIES: u32 = 16;

/// Reads the counter described by `page` with `read_counter(selector)` under the sequence lock.
pub fn read_under_lock<P: PageWords + ?Sized>(
    page: &P,
    read_counter: &mut dyn FnMut(u32) -> u64,
) -> Result<UserRead, NoUserRead> {
    for _ in 0..MAX_TRIES {
        let sequence = page.u32_at(LOCK);
        // The kernel's barrier() pairs: the fields are read after the lock, and the lock is
        // read again after them.
        compiler_fence(Ordering::SeqCst);
        let time_enabled = page.u64_at(TIME_ENABLED);
        let time_running = page.u64_at(TIME_RUNNING);
        let index = page.u32_at(INDEX);
        let offset = page.u64_at(OFFSET);
        let capabilities = page.u64_at(CAPABILITIES);
        let width = page.u16_at(PMC_WIDTH);
        let outcome = if capabilities & CAP_USER_RDPMC == 0 {
            Err(NoUserRead::NoCapability)
        } else if index == 0 {
            Err(NoUserRead::NoCounter)
        } else if width == 0 || width > 64 {
            Err(NoUserRead::BadWidth(width))
        } else {
            let selector = index - 1;
            let raw = read_counter(selector);
            Ok(UserRead {
                count: offset.wrapping_add(sign_extend(raw, width)),
                raw,
                selector,
                time_enabled,
                time_running,
            })
        };
        compiler_fence(Ordering::SeqCst);
        if page.u32_at(LOCK) == sequence {
            return outcome;
        }
    }
    Err(NoUserRead::Unstable)
}

/// `value`'s low `width` bits as a signed number (perf_event.h: "pmc <<= 64 - width; pmc >>=
/// 64 - width; // signed shift right"); arm64's seed: the upper bits past `pmc_width` are
/// UNKNOWN and must be masked.
pub fn sign_extend(value: u64, width: u16) -> u64 {
    let shift = 64 - u32::from(width.clamp(1, 64));
    (((value << shift) as i64) >> shift) as u64
}

/// A live mapping of an event's first page.
pub struct MappedPage {
    base: *const u8,
    len: usize,
}

// SAFETY: the mapping is read-only and only read with volatile loads; the kernel is its only
// writer.
unsafe impl Send for MappedPage {}

impl MappedPage {
    /// Maps the first page of perf event `fd` read-only.
    pub fn map(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: sysconf has no preconditions.
        let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let len = usize::try_from(page_size)
            .ok()
            .filter(|len| *len >= PAGE_FIELDS_END)
            .ok_or_else(|| std::io::Error::other("sysconf(_SC_PAGESIZE) failed"))?;
        // SAFETY: a fresh shared read-only mapping of a perf fd; checked for MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            base: base.cast(),
            len,
        })
    }

    fn load<T: Copy>(&self, offset: usize) -> T {
        debug_assert!(offset + std::mem::size_of::<T>() <= PAGE_FIELDS_END);
        // SAFETY: offset is one of this module's field offsets, inside the mapped page and
        // aligned for T as in the kernel's struct.
        unsafe { std::ptr::read_volatile(self.base.add(offset).cast::<T>()) }
    }
}

impl PageWords for MappedPage {
    fn u32_at(&self, offset: usize) -> u32 {
        self.load(offset)
    }
    fn u64_at(&self, offset: usize) -> u64 {
        self.load(offset)
    }
    fn u16_at(&self, offset: usize) -> u16 {
        self.load(offset)
    }
}

impl Drop for MappedPage {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe {
            libc::munmap(self.base.cast_mut().cast(), self.len);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;

    use super::*;

    /// A recorded page: the struct's fields as bytes, little-endian as on x86_64 and arm64.
    #[derive(Clone)]
    pub(crate) struct RecordedPage(pub [u8; PAGE_FIELDS_END]);

    impl RecordedPage {
        pub(crate) fn new(
            index: u32,
            offset: i64,
            enabled: u64,
            running: u64,
            user_rdpmc: bool,
            width: u16,
        ) -> Self {
            let mut bytes = [0u8; PAGE_FIELDS_END];
            bytes[0..4].copy_from_slice(&1u32.to_le_bytes());
            bytes[LOCK..LOCK + 4].copy_from_slice(&2u32.to_le_bytes());
            bytes[INDEX..INDEX + 4].copy_from_slice(&index.to_le_bytes());
            bytes[OFFSET..OFFSET + 8].copy_from_slice(&offset.to_le_bytes());
            bytes[TIME_ENABLED..TIME_ENABLED + 8].copy_from_slice(&enabled.to_le_bytes());
            bytes[TIME_RUNNING..TIME_RUNNING + 8].copy_from_slice(&running.to_le_bytes());
            let caps: u64 = if user_rdpmc { CAP_USER_RDPMC } else { 0 };
            bytes[CAPABILITIES..CAPABILITIES + 8].copy_from_slice(&caps.to_le_bytes());
            bytes[PMC_WIDTH..PMC_WIDTH + 2].copy_from_slice(&width.to_le_bytes());
            Self(bytes)
        }

        pub(crate) fn with_lock(mut self, lock: u32) -> Self {
            self.0[LOCK..LOCK + 4].copy_from_slice(&lock.to_le_bytes());
            self
        }
    }

    impl PageWords for RecordedPage {
        fn u32_at(&self, offset: usize) -> u32 {
            u32::from_le_bytes(self.0[offset..offset + 4].try_into().unwrap())
        }
        fn u64_at(&self, offset: usize) -> u64 {
            u64::from_le_bytes(self.0[offset..offset + 8].try_into().unwrap())
        }
        fn u16_at(&self, offset: usize) -> u16 {
            u16::from_le_bytes(self.0[offset..offset + 2].try_into().unwrap())
        }
    }

    /// A page the kernel updates under the reader: each load of `lock` after the first of a
    /// try moves to the next recorded frame, as a context switch between the two loads would.
    struct ChangingPage {
        frames: Vec<RecordedPage>,
        frame: Cell<usize>,
        lock_loads: Cell<usize>,
    }

    impl PageWords for ChangingPage {
        fn u32_at(&self, offset: usize) -> u32 {
            if offset == LOCK {
                let loads = self.lock_loads.get() + 1;
                self.lock_loads.set(loads);
                // Loads 2, 4, ... close a try: the kernel changed the page in between.
                if loads.is_multiple_of(2) && self.frame.get() + 1 < self.frames.len() {
                    self.frame.set(self.frame.get() + 1);
                }
            }
            self.frames[self.frame.get()].u32_at(offset)
        }
        fn u64_at(&self, offset: usize) -> u64 {
            self.frames[self.frame.get()].u64_at(offset)
        }
        fn u16_at(&self, offset: usize) -> u16 {
            self.frames[self.frame.get()].u16_at(offset)
        }
    }

    #[test]
    fn offsets_match_the_kernel_struct() {
        use perf_event_open_sys::bindings::perf_event_mmap_page as Page;
        assert_eq!(std::mem::offset_of!(Page, lock), LOCK);
        assert_eq!(std::mem::offset_of!(Page, index), INDEX);
        assert_eq!(std::mem::offset_of!(Page, offset), OFFSET);
        assert_eq!(std::mem::offset_of!(Page, time_enabled), TIME_ENABLED);
        assert_eq!(std::mem::offset_of!(Page, time_running), TIME_RUNNING);
        assert_eq!(std::mem::offset_of!(Page, __bindgen_anon_1), CAPABILITIES);
        assert_eq!(std::mem::offset_of!(Page, pmc_width), PMC_WIDTH);
        assert_eq!(std::mem::offset_of!(Page, __reserved), PAGE_FIELDS_END);
        // cap_user_rdpmc's bit, through bindgen's own bitfield accessor.
        let mut caps =
            perf_event_open_sys::bindings::perf_event_mmap_page__bindgen_ty_1 { capabilities: 0 };
        // SAFETY: both union members are plain integers of the same size.
        unsafe {
            caps.__bindgen_anon_1.set_cap_user_rdpmc(1);
            assert_eq!(caps.capabilities, CAP_USER_RDPMC);
        }
    }

    #[test]
    fn x86_fixed_counter_page_gives_offset_plus_sign_extended_counter() {
        // Fixed counter 3 (SLOTS): the kernel puts its rdpmc selector plus one in `index`
        // (perf-topdown.txt: RDPMC_FIXED (1 << 30) | FIXED_COUNTER_SLOTS 3); 48-bit counters.
        let page = RecordedPage::new((1 << 30 | 3) + 1, -5000, 900, 900, true, 48);
        let mut selectors = Vec::new();
        let read = read_under_lock(&page, &mut |selector| {
            selectors.push(selector);
            12_345
        })
        .unwrap();
        assert_eq!(selectors, vec![1 << 30 | 3]);
        assert_eq!(read.count, 7_345);
        assert_eq!(read.raw, 12_345);
        assert_eq!((read.time_enabled, read.time_running), (900, 900));
    }

    #[test]
    fn counter_bits_past_pmc_width_are_dropped_and_sign_extended() {
        // A 48-bit counter the kernel started at -1000 (its period trick) reads 2^48 - 1000 + 5.
        let raw = (1u64 << 48) - 1000 + 5;
        let page = RecordedPage::new(1, 10_000, 1, 1, true, 48);
        let read = read_under_lock(&page, &mut |_| raw | (0xdead << 48)).unwrap();
        assert_eq!(read.count, 10_000 - 995);
        // arm64 32-bit counter (config1 bit 0 clear): the upper 32 bits are UNKNOWN.
        let page = RecordedPage::new(3, 0, 1, 1, true, 32);
        let read = read_under_lock(&page, &mut |_| 0xffff_ffff_0000_0007).unwrap();
        assert_eq!(read.count, 7);
        assert_eq!(read.selector, 2);
        // A 64-bit counter is taken whole.
        let page = RecordedPage::new(1, 0, 1, 1, true, 64);
        let read = read_under_lock(&page, &mut |_| u64::MAX - 1).unwrap();
        assert_eq!(read.count, u64::MAX - 1);
    }

    #[test]
    fn pages_without_user_access_say_why() {
        let mut never = |_: u32| -> u64 { panic!("the counter must not be read") };
        let software = RecordedPage::new(0, 77, 5, 5, true, 0);
        assert_eq!(
            read_under_lock(&software, &mut never),
            Err(NoUserRead::NoCounter)
        );
        let vm = RecordedPage::new(4, 0, 5, 5, false, 48);
        assert_eq!(
            read_under_lock(&vm, &mut never),
            Err(NoUserRead::NoCapability)
        );
        let odd = RecordedPage::new(4, 0, 5, 5, true, 0);
        assert_eq!(
            read_under_lock(&odd, &mut never),
            Err(NoUserRead::BadWidth(0))
        );
    }

    #[test]
    fn a_lock_change_during_the_read_retries_with_the_new_page() {
        // Frame 0: counter 0 with offset 100; the kernel then moves the event to counter 2
        // with offset 500 (a context switch); the read must come from frame 1 only.
        let before = RecordedPage::new(1, 100, 10, 10, true, 48).with_lock(4);
        let after = RecordedPage::new(3, 500, 20, 20, true, 48).with_lock(6);
        let page = ChangingPage {
            frames: vec![before, after.clone(), after],
            frame: Cell::new(0),
            lock_loads: Cell::new(0),
        };
        let mut selectors = Vec::new();
        let read = read_under_lock(&page, &mut |selector| {
            selectors.push(selector);
            1_000 + u64::from(selector)
        })
        .unwrap();
        assert_eq!(selectors, vec![0, 2]);
        assert_eq!(read.count, 500 + 1_002);
        assert_eq!((read.time_enabled, read.time_running), (20, 20));
    }

    #[test]
    fn a_lock_that_never_holds_still_gives_up() {
        let frames: Vec<RecordedPage> = (0..=MAX_TRIES * 2)
            .map(|step| RecordedPage::new(1, 0, 1, 1, true, 48).with_lock(step * 2))
            .collect();
        let page = ChangingPage {
            frames,
            frame: Cell::new(0),
            lock_loads: Cell::new(0),
        };
        assert_eq!(
            read_under_lock(&page, &mut |_| 1),
            Err(NoUserRead::Unstable)
        );
    }
}
