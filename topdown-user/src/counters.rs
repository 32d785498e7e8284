//! Per-CPU counter groups, opened with `perf_event_open`.
//!
//! One group per online CPU: `pid = -1` (every task on that CPU), no inherit (the BPF helper
//! `perf_event_read_local` refuses inherited events), the model's leader first and pinned (a
//! pinned group is never silently multiplexed: if it cannot be scheduled, reads fail and the BPF
//! side counts that). The fds stay open for the whole session; the BPF side reads them through a
//! `PERF_EVENT_ARRAY`.

use std::{
    fs,
    os::fd::{AsFd, BorrowedFd, FromRawFd as _, OwnedFd},
};

use anyhow::{Context as _, Result, bail};
use perf_event_open_sys::bindings;

use crate::{
    error::{Failure, fail},
    model::{CounterSource, CounterSpec},
    tracefs::Tracefs,
};

/// Which privilege levels to count (perf's `--all-user` / `--all-kernel`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Privilege {
    #[default]
    All,
    UserOnly,
    KernelOnly,
}

/// A counter ready for `perf_event_open`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedCounter {
    pub name: String,
    pub perf_type: u32,
    pub config: u64,
}

/// Turns a model's counter specs into perf types and configs (tracepoints need tracefs ids).
pub fn resolve(specs: &[CounterSpec], tracefs: Option<&Tracefs>) -> Result<Vec<ResolvedCounter>> {
    specs
        .iter()
        .map(|spec| {
            let (perf_type, config) = match &spec.source {
                CounterSource::Perf { perf_type, config } => (*perf_type, *config),
                CounterSource::Tracepoint { group, name } => {
                    let Some(tracefs) = tracefs else {
                        bail!(
                            "counter {} is a tracepoint but tracefs is not available",
                            spec.name
                        );
                    };
                    (
                        bindings::PERF_TYPE_TRACEPOINT,
                        tracefs.tracepoint_id(group, name)?,
                    )
                }
            };
            Ok(ResolvedCounter {
                name: spec.name.clone(),
                perf_type,
                config,
            })
        })
        .collect()
}

/// The CPUs in `/sys/devices/system/cpu/online`.
pub fn online_cpus() -> Result<Vec<u32>> {
    let path = "/sys/devices/system/cpu/online";
    let text = fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    parse_cpu_list(&text).with_context(|| format!("parsing {path}"))
}

/// Parses a kernel cpulist (`0-3,8,10-11`).
pub fn parse_cpu_list(text: &str) -> Result<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|part| !part.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((first, last)) => (first, last),
            None => (part, part),
        };
        let first: u32 = first
            .trim()
            .parse()
            .with_context(|| format!("bad CPU number in '{part}'"))?;
        let last: u32 = last
            .trim()
            .parse()
            .with_context(|| format!("bad CPU number in '{part}'"))?;
        if last < first {
            bail!("CPU range '{part}' runs backwards");
        }
        cpus.extend(first..=last);
    }
    Ok(cpus)
}

/// One group per CPU, each with the same counters in the same order.
pub struct CounterGroups {
    counters: Vec<ResolvedCounter>,
    /// `(cpu, fds in counter order)`.
    groups: Vec<(u32, Vec<OwnedFd>)>,
}

impl CounterGroups {
    /// Opens the groups. Fails on the first counter the kernel refuses, naming it and the CPU.
    pub fn open(counters: &[ResolvedCounter], cpus: &[u32], privilege: Privilege) -> Result<Self> {
        if counters.is_empty() {
            bail!("a model must have at least one counter");
        }
        if counters.len() > topdown_common::MAX_COUNTERS {
            bail!(
                "{} counters in one pass, but the BPF side has {} slots per CPU",
                counters.len(),
                topdown_common::MAX_COUNTERS
            );
        }
        let mut groups = Vec::with_capacity(cpus.len());
        for &cpu in cpus {
            let mut fds: Vec<OwnedFd> = Vec::with_capacity(counters.len());
            for (slot, counter) in counters.iter().enumerate() {
                let leader = fds.first().map(|fd| fd.as_fd());
                let fd = open_counter(counter, cpu, leader, slot == 0, privilege)?;
                fds.push(fd);
            }
            groups.push((cpu, fds));
        }
        Ok(Self {
            counters: counters.to_vec(),
            groups,
        })
    }

    pub fn counters(&self) -> &[ResolvedCounter] {
        &self.counters
    }

    pub fn cpus(&self) -> impl Iterator<Item = u32> + '_ {
        self.groups.iter().map(|(cpu, _)| *cpu)
    }

    /// Every `(cpu, slot, fd)`.
    pub fn fds(&self) -> impl Iterator<Item = (u32, usize, BorrowedFd<'_>)> + '_ {
        self.groups.iter().flat_map(|(cpu, fds)| {
            fds.iter()
                .enumerate()
                .map(move |(slot, fd)| (*cpu, slot, fd.as_fd()))
        })
    }
}

fn open_counter(
    counter: &ResolvedCounter,
    cpu: u32,
    leader: Option<BorrowedFd<'_>>,
    is_leader: bool,
    privilege: Privilege,
) -> Result<OwnedFd> {
    // SAFETY: perf_event_attr is plain data; all-zero is its documented default.
    let mut attr: bindings::perf_event_attr = unsafe { std::mem::zeroed() };
    attr.size = std::mem::size_of::<bindings::perf_event_attr>() as u32;
    attr.type_ = counter.perf_type;
    attr.config = counter.config;
    attr.read_format = u64::from(
        bindings::PERF_FORMAT_TOTAL_TIME_ENABLED | bindings::PERF_FORMAT_TOTAL_TIME_RUNNING,
    );
    // Only a group leader may be pinned; members follow it.
    attr.set_pinned(u64::from(is_leader));
    attr.set_exclude_user(u64::from(privilege == Privilege::KernelOnly));
    attr.set_exclude_kernel(u64::from(privilege == Privilege::UserOnly));
    attr.set_exclude_hv(u64::from(privilege == Privilege::UserOnly));
    let group_fd = leader.map_or(-1, |fd| std::os::fd::AsRawFd::as_raw_fd(&fd));
    // SAFETY: attr is initialised and outlives the call.
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            &mut attr,
            -1,
            cpu as libc::c_int,
            group_fd,
            libc::c_ulong::from(bindings::PERF_FLAG_FD_CLOEXEC),
        )
    };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        return Err(open_error(counter, cpu, err));
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_error(counter: &ResolvedCounter, cpu: u32, err: std::io::Error) -> anyhow::Error {
    let what = format!(
        "cannot open counter {} (type {}, config {:#x}) on CPU {cpu}: {err}",
        counter.name, counter.perf_type, counter.config
    );
    match err.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => fail(
            Failure::Permission,
            format!("{what}: run as root or grant CAP_PERFMON"),
        ),
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) | Some(libc::EINVAL) => {
            fail(
                Failure::PmuUnavailable,
                format!(
                    "{what}: this PMU does not provide it (check `--pmu`; use --pmu software or \
                     --pmu synthetic:<model> on machines without the hardware)"
                ),
            )
        }
        _ => anyhow::anyhow!(what),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n").unwrap(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpu_list("0\n").unwrap(), vec![0]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a-b").is_err());
    }
}
