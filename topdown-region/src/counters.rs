//! One thread's counters: the plan's groups opened for the calling thread (pid 0, cpu -1),
//! each counter's first page mapped, and read on the path those pages allow.
//!
//! Paths (perf_event.h's self-monitoring read; perf-topdown.txt; arm64-perf-attributes.txt):
//! - user space (rdpmc on x86_64, mrs on arm64): every counter's page has `cap_user_rdpmc`
//!   and an `index`; counters are read under the page's sequence lock, and Intel's SLOTS +
//!   PERF_METRICS group is decoded from the two raw registers;
//! - `read()`: any page says no (software and tracepoint events, VMs, rdpmc disabled), an
//!   mmap failed, or the config asks for it; one `read()` per group (PERF_FORMAT_GROUP).
//!
//! A thread never switches a metrics group between the two: a `read()` of it resets SLOTS and
//! PERF_METRICS in the kernel (perf-topdown.txt: "_rdpmc calls should not be mixed with
//! reading the metrics and slots counters through system calls").

use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd};

use perf_event_open_sys::bindings;
use topdown_model::groups::{enabled_slot_name, running_slot_name};

use crate::{
    decode, hw,
    mmap_page::{self, MappedPage, NoUserRead, PageWords},
    setup::{Resolved, Setup},
};

/// How a thread's counters are read.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadPath {
    /// No counters (they could not be opened): regions still count calls.
    Disabled = 0,
    /// `read()` system calls.
    Read = 1,
    /// x86_64 `rdpmc`.
    Rdpmc = 2,
    /// arm64 `mrs` of the PMUv3 counter registers.
    Mrs = 3,
}

impl ReadPath {
    pub fn name(self) -> &'static str {
        match self {
            ReadPath::Disabled => "disabled",
            ReadPath::Read => "read()",
            ReadPath::Rdpmc => "rdpmc",
            ReadPath::Mrs => "mrs",
        }
    }
}

/// The user-space path of this build.
const USER_PATH: ReadPath = if cfg!(target_arch = "aarch64") {
    ReadPath::Mrs
} else {
    ReadPath::Rdpmc
};

struct Member {
    /// Its value's index in a reading (the plan's slot).
    slot: usize,
    name: String,
    fd: OwnedFd,
    /// The counter's mmap page (a live mapping; recorded pages in the tests).
    page: Option<Box<dyn PageWords + Send>>,
    metric_field: Option<usize>,
    is_slots: bool,
}

struct OpenGroup {
    /// Leader first.
    members: Vec<Member>,
    /// Slots of the leader's enabled and running times, for a group that rotates.
    timing: Option<(usize, usize)>,
    /// Intel SLOTS + PERF_METRICS: decoded from the raw registers on the user path.
    metrics: bool,
    /// read() buffer: nr, time_enabled, time_running, one value per member.
    buffer: Vec<u64>,
}

/// One reading's quality.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadingInfo {
    /// Some group was not on the PMU all the time it was enabled (time_enabled !=
    /// time_running): its counts cover less than the region.
    pub multiplexed: bool,
}

pub struct ThreadCounters {
    groups: Vec<OpenGroup>,
    path: ReadPath,
    reason: String,
    /// Values a metrics group had when it was last reset, added to its later readings so that
    /// each value only grows (perf-topdown.txt "Resetting metrics counters").
    base: Vec<u64>,
    period_start_ns: u64,
}

impl ThreadCounters {
    /// Opens `setup`'s counters for the calling thread. An error is the reason the thread's
    /// regions run without counters.
    pub fn open(setup: &Setup) -> Result<Self, String> {
        let slot_names = setup.slot_names();
        let mut notes = Vec::new();
        let mut groups = Vec::new();
        for planned in &setup.plan.groups {
            let mut members: Vec<Member> = Vec::new();
            for &index in &planned.members {
                let Some(counter) = setup.counters.get(index) else {
                    return Err(format!("the counter plan names counter {index}"));
                };
                let leader = members.first().map(|member| member.fd.as_raw_fd());
                let (fd, note) = open_counter(
                    counter,
                    leader,
                    leader.is_none() && planned.pinned,
                    setup.config.include_kernel,
                )?;
                notes.extend(note);
                members.push(Member {
                    slot: index,
                    name: counter.name.clone(),
                    fd,
                    page: None,
                    metric_field: counter.metric_field,
                    is_slots: counter.slots,
                });
            }
            let timing = if planned.pinned {
                None
            } else {
                let group = planned
                    .members
                    .first()
                    .and_then(|&index| setup.plan.counters.get(index))
                    .map(|spec| spec.group)
                    .unwrap_or(0);
                let position = |name: String| slot_names.iter().position(|slot| *slot == name);
                position(enabled_slot_name(group)).zip(position(running_slot_name(group)))
            };
            let metrics = members.first().is_some_and(|leader| leader.is_slots)
                && members.iter().any(|member| member.metric_field.is_some());
            let buffer = vec![0; 3 + members.len()];
            groups.push(OpenGroup {
                members,
                timing,
                metrics,
                buffer,
            });
        }
        let (path, mut reason) = choose_path(&mut groups, setup.config.force_read);
        if path == ReadPath::Read {
            // Pages only serve the user path.
            groups
                .iter_mut()
                .flat_map(|group| &mut group.members)
                .for_each(|member| member.page = None);
        }
        if !notes.is_empty() {
            reason = format!("{reason}; {}", notes.join("; "));
        }
        Ok(Self {
            groups,
            path,
            reason,
            base: vec![0; slot_names.len()],
            period_start_ns: monotonic_ns(),
        })
    }

    pub fn path(&self) -> ReadPath {
        self.path
    }

    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Fills `values` (one per slot) with the counts since the counters were opened.
    pub fn read(&mut self, values: &mut [u64]) -> Result<ReadingInfo, String> {
        let mut info = ReadingInfo::default();
        let user = self.path != ReadPath::Read;
        for group in &mut self.groups {
            let multiplexed = match (user, group.metrics) {
                (true, true) => {
                    read_metrics_group(group, values, &self.base, &mut read_counter_instruction)?
                }
                (true, false) => {
                    match read_user_group(group, values, &mut read_counter_instruction) {
                        Ok(multiplexed) => multiplexed,
                        // A generic counter's read() does not reset it: the same count as the
                        // page would give, from the kernel (the event was scheduled out).
                        Err(_) => read_group(group, values)?,
                    }
                }
                (false, _) => read_group(group, values)?,
            };
            info.multiplexed |= multiplexed;
        }
        Ok(info)
    }

    /// On the user path with a metrics group, starts a new PERF_METRICS measurement period
    /// when the current one is older than [`decode::RESET_PERIOD_NS`]. Called only where no
    /// region is open on the thread, so no region spans two periods; `scratch` holds a
    /// reading's worth of values.
    pub fn reset_if_due(&mut self, scratch: &mut [u64]) -> Result<bool, String> {
        if self.path == ReadPath::Read || !self.groups.iter().any(|group| group.metrics) {
            return Ok(false);
        }
        let now = monotonic_ns();
        if now.saturating_sub(self.period_start_ns) < decode::RESET_PERIOD_NS {
            return Ok(false);
        }
        self.read(scratch)?;
        for group in self.groups.iter().filter(|group| group.metrics) {
            for member in &group.members {
                if let (Some(base), Some(value)) =
                    (self.base.get_mut(member.slot), scratch.get(member.slot))
                {
                    *base = *value;
                }
            }
            let Some(leader) = group.members.first() else {
                continue;
            };
            // SAFETY: an open perf fd; PERF_IOC_FLAG_GROUP resets every member with it.
            let result = unsafe {
                perf_event_open_sys::ioctls::RESET(
                    leader.fd.as_raw_fd(),
                    bindings::PERF_IOC_FLAG_GROUP,
                )
            };
            if result < 0 {
                return Err(format!(
                    "PERF_EVENT_IOC_RESET of {}: {}",
                    leader.name,
                    std::io::Error::last_os_error()
                ));
            }
        }
        self.period_start_ns = now;
        Ok(true)
    }
}

/// Maps every counter's page and takes the user path only if each page allows it.
fn choose_path(groups: &mut [OpenGroup], force_read: bool) -> (ReadPath, String) {
    if !hw::SUPPORTED {
        return (
            ReadPath::Read,
            format!("no user-space counter read on {}", std::env::consts::ARCH),
        );
    }
    if force_read {
        return (
            ReadPath::Read,
            format!(
                "user-space reads turned off ({}=1 or Config::force_read)",
                crate::setup::ENV_FORCE_READ
            ),
        );
    }
    for member in groups.iter_mut().flat_map(|group| &mut group.members) {
        let page = match MappedPage::map(member.fd.as_fd()) {
            Ok(page) => page,
            Err(err) => {
                return (
                    ReadPath::Read,
                    format!("mmap of counter {}'s page failed: {err}", member.name),
                );
            }
        };
        // Only the fields are checked here: the counter instruction runs only on a page that
        // allows it.
        if let Err(why) = mmap_page::read_under_lock(&page, &mut |_| 0) {
            return (ReadPath::Read, format!("counter {}: {why}", member.name));
        }
        member.page = Some(Box::new(page));
    }
    (
        USER_PATH,
        format!(
            "every counter's mmap page allows {} (cap_user_rdpmc set, index non-zero)",
            hw::INSTRUCTION
        ),
    )
}

fn read_counter_instruction(selector: u32) -> u64 {
    // SAFETY: only reached from `read_under_lock` with a selector of a page that has
    // cap_user_rdpmc set, read under its lock.
    unsafe { hw::read_counter(selector) }
}

/// The counter reader: the instruction in production, recorded registers in the tests.
type CounterReader<'a> = &'a mut dyn FnMut(u32) -> u64;

fn user_read(
    member: &Member,
    reader: CounterReader<'_>,
) -> Result<mmap_page::UserRead, NoUserRead> {
    match &member.page {
        Some(page) => mmap_page::read_under_lock(page.as_ref(), reader),
        None => Err(NoUserRead::NoCounter),
    }
}

/// A generic group on the user path: each counter's count from its page.
fn read_user_group(
    group: &mut OpenGroup,
    values: &mut [u64],
    reader: CounterReader<'_>,
) -> Result<bool, NoUserRead> {
    let mut times = (0, 0);
    for (position, member) in group.members.iter().enumerate() {
        let read = user_read(member, reader)?;
        if position == 0 {
            times = (read.time_enabled, read.time_running);
        }
        store(values, member.slot, read.count);
    }
    if let Some((enabled, running)) = group.timing {
        store(values, enabled, times.0);
        store(values, running, times.1);
    }
    Ok(incomplete(times.0, times.1))
}

/// Intel SLOTS + PERF_METRICS on the user path: each metric event's value is its byte of the
/// register scaled by SLOTS, as the kernel's read() would report it (`decode::scaled_slots`),
/// plus what the group had counted before its last reset.
fn read_metrics_group(
    group: &mut OpenGroup,
    values: &mut [u64],
    base: &[u64],
    reader: CounterReader<'_>,
) -> Result<bool, String> {
    let fail = |member: &Member, why: NoUserRead| {
        format!(
            "{} of counter {} failed: {why} (a read() would reset PERF_METRICS, so this \
             reading is dropped)",
            hw::INSTRUCTION,
            member.name
        )
    };
    let Some(leader) = group.members.first() else {
        return Ok(false);
    };
    let slots = user_read(leader, reader).map_err(|why| fail(leader, why))?;
    let metrics = match group.members.iter().find(|m| m.metric_field.is_some()) {
        Some(member) => {
            user_read(member, reader)
                .map_err(|why| fail(member, why))?
                .raw
        }
        None => 0,
    };
    for member in &group.members {
        let current = if member.is_slots {
            slots.raw
        } else if let Some(field) = member.metric_field {
            decode::scaled_slots(metrics, field, slots.raw)
        } else {
            user_read(member, reader)
                .map_err(|why| fail(member, why))?
                .count
        };
        let before = base.get(member.slot).copied().unwrap_or(0);
        store(values, member.slot, before.saturating_add(current));
    }
    if let Some((enabled, running)) = group.timing {
        store(values, enabled, slots.time_enabled);
        store(values, running, slots.time_running);
    }
    Ok(incomplete(slots.time_enabled, slots.time_running))
}

/// One `read()` of a group with PERF_FORMAT_GROUP | TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING.
fn read_group(group: &mut OpenGroup, values: &mut [u64]) -> Result<bool, String> {
    let Some(leader) = group.members.first() else {
        return Ok(false);
    };
    let bytes = std::mem::size_of_val(group.buffer.as_slice());
    // SAFETY: the buffer is owned, writable and `bytes` long.
    let got = unsafe {
        libc::read(
            leader.fd.as_raw_fd(),
            group.buffer.as_mut_ptr().cast(),
            bytes,
        )
    };
    if got < 0 {
        return Err(format!(
            "read() of counter group {}: {}",
            leader.name,
            std::io::Error::last_os_error()
        ));
    }
    let expected = group.members.len() as u64;
    if got as usize != bytes || group.buffer[0] != expected {
        return Err(format!(
            "read() of counter group {} gave {got} bytes and {} values, expected {bytes} and {expected}",
            leader.name, group.buffer[0]
        ));
    }
    let (enabled, running) = (group.buffer[1], group.buffer[2]);
    for (member, value) in group.members.iter().zip(&group.buffer[3..]) {
        store(values, member.slot, *value);
    }
    if let Some((enabled_slot, running_slot)) = group.timing {
        store(values, enabled_slot, enabled);
        store(values, running_slot, running);
    }
    Ok(incomplete(enabled, running))
}

/// A group that was not on the PMU all the time it was enabled (rotated with other users of
/// the counters, or never scheduled): its counts cover less than the regions.
fn incomplete(enabled: u64, running: u64) -> bool {
    matches!(
        decode::coverage(enabled, running),
        decode::Coverage::Partial(_) | decode::Coverage::NeverRan
    )
}

fn store(values: &mut [u64], slot: usize, value: u64) {
    if let Some(target) = values.get_mut(slot) {
        *target = value;
    }
}

/// `PERF_TYPE_TRACEPOINT`.
const PERF_TYPE_TRACEPOINT: u32 = 2;

/// `config1` bits of an arm64 PMUv3 event (arm64-perf-attributes.txt "Perf Userspace PMU
/// Hardware Counter Access": config1:1 user access, config1:0 a 64-bit counter), in the order
/// tried: 64-bit user access, 32-bit user access (hardware without 64-bit counters refuses
/// the first), then none (kernel/perf_user_access is 0).
const ARM64_CONFIG1_TRIES: [u64; 3] = [0b11, 0b10, 0b00];

/// Opens one counter for the calling thread; the note says what was given up on the way.
fn open_counter(
    counter: &Resolved,
    leader: Option<std::os::fd::RawFd>,
    pinned: bool,
    include_kernel: bool,
) -> Result<(OwnedFd, Option<String>), String> {
    // Hardware counters count user mode only unless asked (the seed's example sets
    // exclude_kernel); a syscall tracepoint fires in the kernel, so those count there.
    let exclude = counter.hardware && !include_kernel;
    let config1s: &[u64] = if cfg!(target_arch = "aarch64") && counter.hardware {
        &ARM64_CONFIG1_TRIES
    } else {
        &[0]
    };
    let mut tries: Vec<(u64, bool)> = config1s.iter().map(|&config1| (config1, exclude)).collect();
    // perf_event_paranoid >= 2 refuses kernel-mode counting to unprivileged users; a software
    // counter (cpu-clock) then still counts with the kernel excluded. Not a tracepoint: it
    // would count nothing.
    if !exclude && counter.perf_type != PERF_TYPE_TRACEPOINT {
        tries.push((0, true));
    }
    let mut last_error = None;
    for (attempt, &(config1, exclude)) in tries.iter().enumerate() {
        // SAFETY: perf_event_attr is plain data; all-zero is its documented default.
        let mut attr: bindings::perf_event_attr = unsafe { std::mem::zeroed() };
        attr.size = std::mem::size_of::<bindings::perf_event_attr>() as u32;
        attr.type_ = counter.perf_type;
        attr.config = counter.config;
        attr.__bindgen_anon_3.config1 = config1;
        attr.read_format = u64::from(
            bindings::PERF_FORMAT_GROUP
                | bindings::PERF_FORMAT_TOTAL_TIME_ENABLED
                | bindings::PERF_FORMAT_TOTAL_TIME_RUNNING,
        );
        attr.set_pinned(u64::from(pinned));
        attr.set_exclude_kernel(u64::from(exclude));
        attr.set_exclude_hv(u64::from(exclude));
        // SAFETY: attr is initialised and outlives the call.
        let fd = unsafe {
            perf_event_open_sys::perf_event_open(
                &mut attr,
                0,
                -1,
                leader.unwrap_or(-1),
                libc::c_ulong::from(bindings::PERF_FLAG_FD_CLOEXEC),
            )
        };
        if fd >= 0 {
            let refused = last_error
                .as_ref()
                .map_or(String::new(), ToString::to_string);
            let note = (attempt > 0).then(|| {
                if exclude && !tries[0].1 {
                    format!(
                        "counter {} counts user mode only: kernel-mode counting was refused \
                         ({refused}; /proc/sys/kernel/perf_event_paranoid)",
                        counter.name
                    )
                } else {
                    format!(
                        "counter {} opened with config1={config1:#b} after the kernel refused \
                         {:#b} ({refused})",
                        counter.name, tries[0].0
                    )
                }
            });
            // SAFETY: a fresh fd this function owns.
            return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, note));
        }
        last_error = Some(std::io::Error::last_os_error());
    }
    let err = last_error.unwrap_or_else(|| std::io::Error::other("no attempt"));
    let hint = match err.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            ": not allowed (lower /proc/sys/kernel/perf_event_paranoid, grant CAP_PERFMON, or run as root)"
        }
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) | Some(libc::EINVAL) => {
            ": this machine's PMU does not provide it (pick the model of this CPU, or `software`)"
        }
        _ => "",
    };
    Err(format!(
        "cannot open counter {} (type {}, config {:#x}) for this thread: {err}{hint}",
        counter.name, counter.perf_type, counter.config
    ))
}

/// CLOCK_MONOTONIC in nanoseconds (vDSO: no system call).
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now);
    }
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmap_page::tests::RecordedPage;

    /// rdpmc selectors of perf-topdown.txt: fixed counter 3 (SLOTS) and PERF_METRICS.
    const SLOTS_SELECTOR: u32 = 1 << 30 | 3;
    const METRICS_SELECTOR: u32 = 1 << 29;

    fn member(slot: usize, name: &str, page: RecordedPage, field: Option<usize>) -> Member {
        let file = std::fs::File::open("/dev/null").unwrap();
        Member {
            slot,
            name: name.to_owned(),
            fd: OwnedFd::from(file),
            page: Some(Box::new(page)),
            metric_field: field,
            is_slots: slot == 0,
        }
    }

    /// intel-icl's level-1 group as the kernel shows it in the pages: SLOTS on fixed counter 3,
    /// the four metric events on PERF_METRICS, and a general counter (counter 2, offset 100).
    fn icl_group(metrics_page: RecordedPage, slots_enabled: (u64, u64)) -> OpenGroup {
        let (enabled, running) = slots_enabled;
        let slots = RecordedPage::new(SLOTS_SELECTOR + 1, 0, enabled, running, true, 48);
        let names = [
            "topdown-retiring",
            "topdown-bad-spec",
            "topdown-fe-bound",
            "topdown-be-bound",
        ];
        let mut members = vec![member(0, "slots", slots, None)];
        for (field, name) in names.iter().enumerate() {
            members.push(member(field + 1, name, metrics_page.clone(), Some(field)));
        }
        let general = RecordedPage::new(3, 100, enabled, running, true, 48);
        members.push(member(5, "INT_MISC.UOP_DROPPING", general, None));
        OpenGroup {
            buffer: vec![0; 3 + members.len()],
            members,
            timing: None,
            metrics: true,
        }
    }

    #[test]
    fn metrics_group_decodes_the_raw_registers_into_read_counts() {
        let metrics_page = RecordedPage::new(METRICS_SELECTOR + 1, 0, 50, 50, true, 48);
        let mut group = icl_group(metrics_page, (50, 50));
        let selectors = std::cell::RefCell::new(Vec::new());
        let mut reader = |selector: u32| {
            selectors.borrow_mut().push(selector);
            match selector {
                SLOTS_SELECTOR => 1_000_000,
                // Bytes 51, 26, 102, 76 (sum 0xff): retiring lowest.
                METRICS_SELECTOR => u64::from_le_bytes([51, 26, 102, 76, 0, 0, 0, 0]),
                2 => 50,
                other => panic!("unexpected selector {other:#x}"),
            }
        };
        let mut values = [0u64; 6];
        let base = [0, 0, 0, 0, 0, 0];
        let multiplexed = read_metrics_group(&mut group, &mut values, &base, &mut reader).unwrap();
        assert!(!multiplexed);
        // floor(slots * byte / 255), as a read() of each metric event reports
        // (topdown-formulas.md §1.2); the general counter is offset + counter.
        assert_eq!(values, [1_000_000, 200_000, 101_960, 400_000, 298_039, 150]);
        assert_eq!(*selectors.borrow(), [SLOTS_SELECTOR, METRICS_SELECTOR, 2]);

        // After a reset, the counts before it are added back so values only grow.
        let base = [10, 1, 2, 3, 4, 5];
        read_metrics_group(&mut group, &mut values, &base, &mut reader).unwrap();
        assert_eq!(values, [1_000_010, 200_001, 101_962, 400_003, 298_043, 155]);
    }

    #[test]
    fn metrics_group_reports_multiplexing_and_never_falls_back_to_read() {
        let metrics_page = RecordedPage::new(METRICS_SELECTOR + 1, 0, 80, 40, true, 48);
        let mut group = icl_group(metrics_page, (80, 40));
        let mut reader = |_: u32| 0;
        let mut values = [7u64; 6];
        assert!(read_metrics_group(&mut group, &mut values, &[0; 6], &mut reader).unwrap());
        let before = values;

        // PERF_METRICS scheduled out (index 0): the reading fails, values stay as they were.
        let scheduled_out = RecordedPage::new(0, 0, 80, 40, true, 48);
        let mut group = icl_group(scheduled_out, (80, 40));
        let err = read_metrics_group(&mut group, &mut values, &[0; 6], &mut |selector| {
            assert_eq!(selector, SLOTS_SELECTOR, "only SLOTS may be read");
            5
        })
        .unwrap_err();
        assert!(err.contains("counter topdown-retiring"), "{err}");
        assert!(err.contains("a read() would reset PERF_METRICS"), "{err}");
        assert_eq!(values, before);
    }

    #[test]
    fn generic_group_reads_each_page_and_its_times() {
        // An arm64 PMUv3 group: cycle counter 31 and event counter 0, 64-bit, with the
        // leader's times in the rotating group's timing slots 2 and 3.
        let mut group = OpenGroup {
            members: vec![
                member(
                    0,
                    "cpu_cycles",
                    RecordedPage::new(32, 1_000, 90, 60, true, 64),
                    None,
                ),
                member(
                    1,
                    "inst_retired",
                    RecordedPage::new(1, -20, 90, 60, true, 64),
                    None,
                ),
            ],
            timing: Some((2, 3)),
            metrics: false,
            buffer: vec![0; 5],
        };
        let mut reader = |selector: u32| match selector {
            31 => 5_000,
            0 => 4_020,
            other => panic!("unexpected counter {other}"),
        };
        let mut values = [0u64; 4];
        let multiplexed = read_user_group(&mut group, &mut values, &mut reader).unwrap();
        assert!(multiplexed);
        assert_eq!(values, [6_000, 4_000, 90, 60]);
    }
}
