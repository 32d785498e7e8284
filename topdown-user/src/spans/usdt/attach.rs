//! Attaching the USDT program to sites with their semaphores enabled, which aya 0.16 cannot
//! do (it creates uprobe.multi links without `ref_ctr_offsets`, and per-point perf links
//! without the uprobe PMU's `ref_ctr_offset`). The two system calls are made here, raw:
//!
//! - `BPF_LINK_CREATE` of a `BPF_TRACE_UPROBE_MULTI` link (Linux 6.6): every site of one file in
//!   one link, each with its cookie and its semaphore's file offset in `ref_ctr_offsets` (0: no
//!   semaphore). The kernel increments each semaphore in every process that maps the file (and
//!   in those that map it later) while the link exists, and decrements it when the link goes;
//! - otherwise `perf_event_open` of the `uprobe` PMU per site, the semaphore's offset in
//!   `config` bits 32-63 (`/sys/bus/event_source/devices/uprobe/format/ref_ctr_offset`), then a
//!   `BPF_LINK_CREATE` of a `BPF_PERF_EVENT` link carrying the cookie.
//!
//! Layouts: `union bpf_attr`'s `link_create` member (include/uapi/linux/bpf.h). Every link is a
//! file descriptor owned here: closing it detaches, so nothing outlives topdown (no pinning).
//! The per-process links of function probes (`crate::session::bpf::process_links`) are made
//! here too.

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

use crate::session::bpf::syscall::bpf_fd;

/// `BPF_LINK_CREATE` in `enum bpf_cmd`.
const BPF_LINK_CREATE: libc::c_long = 28;
/// `enum bpf_attach_type`.
const BPF_PERF_EVENT: u32 = 41;
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
/// `BPF_F_UPROBE_MULTI_RETURN`.
const UPROBE_MULTI_RETURN: u32 = 1;

/// One site to attach: its file offset, its semaphore's (0: none) and its cookie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    pub offset: u64,
    pub ref_ctr_offset: u64,
    pub cookie: u64,
}

/// `link_create` with its `uprobe_multi` member.
#[repr(C)]
#[derive(Default)]
struct UprobeMultiAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
}

/// `link_create` with its `perf_event` member.
#[repr(C)]
#[derive(Default)]
struct PerfEventLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    bpf_cookie: u64,
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

/// One uprobe.multi link for `points` of `path` in process `pid` (0: every process), as
/// return probes if `retprobe`.
pub fn multi(
    program: BorrowedFd<'_>,
    path: &Path,
    points: &[Point],
    pid: u32,
    retprobe: bool,
) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    let offsets: Vec<u64> = points.iter().map(|point| point.offset).collect();
    let ref_ctr_offsets: Vec<u64> = points.iter().map(|point| point.ref_ctr_offset).collect();
    let cookies: Vec<u64> = points.iter().map(|point| point.cookie).collect();
    let any_semaphore = ref_ctr_offsets.iter().any(|offset| *offset != 0);
    let mut attr = UprobeMultiAttr {
        prog_fd: program.as_raw_fd() as u32,
        attach_type: BPF_TRACE_UPROBE_MULTI,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        ref_ctr_offsets: if any_semaphore {
            ref_ctr_offsets.as_ptr() as u64
        } else {
            0
        },
        cookies: cookies.as_ptr() as u64,
        cnt: u32::try_from(points.len()).map_err(io::Error::other)?,
        multi_flags: if retprobe { UPROBE_MULTI_RETURN } else { 0 },
        pid,
        ..UprobeMultiAttr::default()
    };
    bpf_fd(BPF_LINK_CREATE, &mut attr)
}

/// The `uprobe` PMU's type (`/sys/bus/event_source/devices/uprobe/type`).
fn uprobe_pmu_type() -> io::Result<u32> {
    let text = std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")?;
    text.trim().parse().map_err(io::Error::other)
}

/// A perf uprobe event on `point` of `path` (its semaphore in the config's high bits) in
/// process `pid` (0: every process), with a perf link running `program` with its cookie. Both
/// descriptors must be kept: the link detaches when they close.
pub fn perf(
    program: BorrowedFd<'_>,
    path: &Path,
    point: &Point,
    pid: u32,
    retprobe: bool,
) -> io::Result<[OwnedFd; 2]> {
    use perf_event_open_sys::bindings::perf_event_attr;
    let path = c_path(path)?;
    let mut attr = perf_event_attr {
        type_: uprobe_pmu_type()?,
        size: std::mem::size_of::<perf_event_attr>() as u32,
        // Bit 0: retprobe; bits 32-63: ref_ctr_offset (the PMU's format/ directory).
        config: u64::from(retprobe) | (point.ref_ctr_offset << 32),
        ..perf_event_attr::default()
    };
    attr.__bindgen_anon_3.config1 = path.as_ptr() as u64;
    attr.__bindgen_anon_4.config2 = point.offset;
    attr.__bindgen_anon_1.sample_period = 1;
    attr.__bindgen_anon_2.wakeup_events = 1;
    // Every process: on CPU 0 with pid -1, as libbpf does (a uprobe event fires on any CPU).
    let (target, cpu) = if pid == 0 { (-1, 0) } else { (pid as i32, -1) };
    // SAFETY: `attr` is a valid perf_event_attr whose path pointer outlives the call.
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            &mut attr,
            target,
            cpu,
            -1,
            perf_event_open_sys::bindings::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    let event = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut link = PerfEventLinkAttr {
        prog_fd: program.as_raw_fd() as u32,
        target_fd: event.as_raw_fd() as u32,
        attach_type: BPF_PERF_EVENT,
        flags: 0,
        bpf_cookie: point.cookie,
    };
    let link = bpf_fd(BPF_LINK_CREATE, &mut link)?;
    Ok([link, event])
}
