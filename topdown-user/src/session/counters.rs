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
    error::{Failure, fail, read_or_fail},
    events::EventKind,
    model::{CounterSource, CounterSpec},
    schedule::Plan,
    session::tracefs::Tracefs,
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
    pub config1: u64,
    pub config2: u64,
    /// An `-e` event's own modifiers; `None`: the run's `--all-user`/`--all-kernel`.
    pub exclude: Option<crate::events::Exclude>,
}

/// Turns a model's counter specs into perf types and configs (tracepoints need tracefs ids;
/// a hybrid PMU's raw events need that PMU's dynamic type from sysfs).
pub fn resolve(specs: &[CounterSpec], tracefs: Option<&Tracefs>) -> Result<Vec<ResolvedCounter>> {
    specs
        .iter()
        .map(|spec| {
            // A tracepoint's type and config: its id in tracefs (`what`: how the error names
            // the spec).
            let tracepoint = |what: &str, group: &str, name: &str| -> Result<(u32, u64)> {
                let Some(tracefs) = tracefs else {
                    bail!(
                        "{what} {} is a tracepoint but tracefs is not available",
                        spec.name
                    );
                };
                Ok((
                    bindings::PERF_TYPE_TRACEPOINT,
                    tracefs.tracepoint_id(group, name)?,
                ))
            };
            let mut extra = (0, 0, None);
            let (perf_type, config) = match &spec.source {
                CounterSource::Perf { perf_type, config } => {
                    match crate::schedule::counter_pmu(&spec.name) {
                        Some(pmu) if *perf_type == crate::model::PERF_TYPE_RAW => {
                            (hybrid_pmu_type(pmu)?, *config)
                        }
                        _ => (*perf_type, *config),
                    }
                }
                CounterSource::Event(event) => match &event.kind {
                    EventKind::Perf {
                        perf_type,
                        config,
                        config1,
                        config2,
                    } => {
                        extra = (*config1, *config2, event.exclude);
                        // A raw event on a hybrid PMU goes to that PMU's dynamic type.
                        match event.pmu.as_deref() {
                            Some(pmu @ ("cpu_core" | "cpu_atom"))
                                if *perf_type == crate::model::PERF_TYPE_RAW =>
                            {
                                (hybrid_pmu_type(pmu)?, *config)
                            }
                            _ => (*perf_type, *config),
                        }
                    }
                    EventKind::Tracepoint { group, name } => tracepoint("event", group, name)?,
                },
                CounterSource::Tracepoint { group, name } => tracepoint("counter", group, name)?,
            };
            Ok(ResolvedCounter {
                name: spec.name.clone(),
                perf_type,
                config,
                config1: extra.0,
                config2: extra.1,
                exclude: extra.2,
            })
        })
        .collect()
}

/// The `perf_event_attr.type` of a hybrid core PMU (`cpu_core`, `cpu_atom`): dynamic, in sysfs.
fn hybrid_pmu_type(pmu: &str) -> Result<u32> {
    let (path, text) = read_pmu_file(pmu, "type")?;
    text.trim()
        .parse()
        .with_context(|| format!("parsing {path}: expected a number, got '{}'", text.trim()))
}

/// The CPUs a hybrid PMU covers (`/sys/bus/event_source/devices/<pmu>/cpus`).
pub fn pmu_cpus(pmu: &str) -> Result<Vec<u32>> {
    let (path, text) = read_pmu_file(pmu, "cpus")?;
    parse_cpu_list(&text).with_context(|| format!("parsing {path}"))
}

/// `/sys/bus/event_source/devices/<pmu>/<file>`: its path and text. A PMU the machine lacks
/// is the user's `--pmu` choice, reported as such.
fn read_pmu_file(pmu: &str, file: &str) -> Result<(String, String)> {
    let path = format!("/sys/bus/event_source/devices/{pmu}/{file}");
    let text = read_or_fail(&path, Failure::PmuUnavailable, |err| {
        format!("cannot read {path}: {err}: this machine has no {pmu} PMU (check --pmu)")
    })?;
    Ok((path, text))
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

/// One planned perf group (`crate::schedule::PerfGroup`) as it is opened on a CPU: the CPUs
/// it covers and its members' counters.
#[derive(Clone, Debug)]
pub struct PlacedGroup {
    /// `None`: the core PMU on every CPU; `Some("cpu_atom")`: only that PMU's CPUs.
    pub pmu: Option<String>,
    /// The CPUs it may be opened on (its hybrid PMU's), or `None`: every CPU.
    pub cpus: Option<Vec<u32>>,
    pub pinned: bool,
    /// `(index in the plan's counters, counter)`, leader first: the index is its fd slot.
    pub members: Vec<(usize, ResolvedCounter)>,
}

impl PlacedGroup {
    pub fn covers(&self, cpu: u32) -> bool {
        self.cpus.as_ref().is_none_or(|cpus| cpus.contains(&cpu))
    }
}

/// `plan`'s groups with their counters (`counters`, the plan's resolved, in fd-slot order) and
/// the CPUs of their PMUs (`cpus_of(pmu)`: a hybrid PMU's CPUs).
pub fn place_groups(
    plan: &Plan,
    counters: &[ResolvedCounter],
    cpus_of: &dyn Fn(&str) -> Result<Vec<u32>>,
) -> Result<Vec<PlacedGroup>> {
    plan.groups
        .iter()
        .map(|group| {
            let cpus = group.pmu.as_deref().map(cpus_of).transpose()?;
            let members = group
                .members
                .iter()
                .map(|&index| match counters.get(index) {
                    Some(counter) => Ok((index, counter.clone())),
                    None => bail!("counter plan names counter {index} of {}", counters.len()),
                })
                .collect::<Result<_>>()?;
            Ok(PlacedGroup {
                pmu: group.pmu.clone(),
                cpus,
                pinned: group.pinned,
                members,
            })
        })
        .collect()
}

/// The planned perf groups on every CPU their PMU covers (`crate::schedule::Plan`).
pub struct CounterGroups {
    counters: Vec<ResolvedCounter>,
    /// `(cpu, [(fd slot, fd)])`: the counters of every group opened on that CPU.
    groups: Vec<(u32, Vec<(usize, OwnedFd)>)>,
    /// What re-opening a CPU's groups needs (CPU hotplug removes a CPU's events).
    placed: Vec<PlacedGroup>,
    privilege: Privilege,
}

impl CounterGroups {
    /// Opens the plan's groups. `counters` are the plan's counters resolved, in fd-slot order;
    /// `cpus_of(pmu)` lists the CPUs of a hybrid PMU (`None`: the core PMU, every CPU in
    /// `cpus`). Fails on the first counter the kernel refuses, naming it and the CPU.
    pub fn open(
        plan: &Plan,
        counters: &[ResolvedCounter],
        cpus: &[u32],
        cpus_of: &dyn Fn(&str) -> Result<Vec<u32>>,
        privilege: Privilege,
    ) -> Result<Self> {
        if counters.is_empty() {
            bail!("a model must have at least one counter");
        }
        if plan.slots.len() > topdown_common::MAX_COUNTERS {
            bail!(
                "{} counter slots in one pass, but the BPF side has {} per CPU",
                plan.slots.len(),
                topdown_common::MAX_COUNTERS
            );
        }
        let mut groups = Self {
            counters: counters.to_vec(),
            groups: Vec::with_capacity(cpus.len()),
            placed: place_groups(plan, counters, cpus_of)?,
            privilege,
        };
        for &cpu in cpus {
            let fds = groups.open_cpu(cpu)?;
            groups.groups.push((cpu, fds));
        }
        Ok(groups)
    }

    /// Opens every planned group that covers `cpu` on it.
    fn open_cpu(&self, cpu: u32) -> Result<Vec<(usize, OwnedFd)>> {
        let mut fds = Vec::new();
        for group in self.placed.iter().filter(|group| group.covers(cpu)) {
            let mut leader: Option<OwnedFd> = None;
            let mut members = Vec::with_capacity(group.members.len());
            for &(index, ref counter) in &group.members {
                let fd = open_counter(
                    counter,
                    cpu,
                    leader.as_ref().map(|fd| fd.as_fd()),
                    leader.is_none() && group.pinned,
                    self.privilege,
                )?;
                match leader {
                    None => leader = Some(fd),
                    Some(_) => members.push((index, fd)),
                }
            }
            if let (Some(leader), Some(&(first, _))) = (leader, group.members.first()) {
                fds.push((first, leader));
            }
            fds.extend(members);
        }
        Ok(fds)
    }

    /// Re-opens `cpu`'s groups (it went offline and came back: the kernel removed its events),
    /// or opens them for a CPU that came online after the start. The old fds close.
    pub fn reopen(&mut self, cpu: u32) -> Result<()> {
        let fds = self.open_cpu(cpu)?;
        match self.groups.iter_mut().find(|(known, _)| *known == cpu) {
            Some(entry) => entry.1 = fds,
            None => self.groups.push((cpu, fds)),
        }
        Ok(())
    }

    /// The same counters through duplicated fds: a second BPF session (the probe-cost
    /// calibration, `crate::functions::calibration`) reads the events the first one reads, instead
    /// of opening a second set that a real PMU might not have the counters for.
    pub fn try_clone(&self) -> Result<Self> {
        let groups = self
            .groups
            .iter()
            .map(|(cpu, fds)| {
                let fds = fds
                    .iter()
                    .map(|(slot, fd)| Ok((*slot, fd.try_clone()?)))
                    .collect::<std::io::Result<Vec<_>>>()?;
                Ok((*cpu, fds))
            })
            .collect::<std::io::Result<Vec<_>>>()
            .context("duplicating counter fds")?;
        Ok(Self {
            counters: self.counters.clone(),
            groups,
            placed: self.placed.clone(),
            privilege: self.privilege,
        })
    }

    /// Each hybrid PMU the plan opens and the CPUs it was opened on; empty when every group
    /// is on the core PMU of every CPU.
    pub fn hybrid_cpus(&self) -> Vec<(String, Vec<u32>)> {
        let mut found: Vec<(String, Vec<u32>)> = Vec::new();
        for group in &self.placed {
            if let (Some(pmu), Some(cpus)) = (&group.pmu, &group.cpus)
                && !found.iter().any(|(known, _)| known == pmu)
            {
                let opened = cpus
                    .iter()
                    .copied()
                    .filter(|cpu| self.groups.iter().any(|(open, _)| open == cpu))
                    .collect();
                found.push((pmu.clone(), opened));
            }
        }
        found
    }

    pub fn counters(&self) -> &[ResolvedCounter] {
        &self.counters
    }

    pub fn cpus(&self) -> impl Iterator<Item = u32> + '_ {
        self.groups.iter().map(|(cpu, _)| *cpu)
    }

    /// `cpu`'s `(fd slot, fd)`s.
    pub fn cpu_fds(&self, cpu: u32) -> impl Iterator<Item = (usize, BorrowedFd<'_>)> + '_ {
        self.groups
            .iter()
            .filter(move |(known, _)| *known == cpu)
            .flat_map(|(_, fds)| fds.iter().map(|(slot, fd)| (*slot, fd.as_fd())))
    }

    /// Every `(cpu, fd slot, fd)`.
    pub fn fds(&self) -> impl Iterator<Item = (u32, usize, BorrowedFd<'_>)> + '_ {
        self.groups
            .iter()
            .flat_map(|(cpu, fds)| fds.iter().map(move |(slot, fd)| (*cpu, *slot, fd.as_fd())))
    }
}

/// The `perf_event_attr` that names `counter` (type and config words), all else zero: the
/// per-CPU groups here and the per-task counters without BPF (`unprivileged`) add their own
/// read format and flags.
pub fn counter_attr(counter: &ResolvedCounter) -> bindings::perf_event_attr {
    // SAFETY: perf_event_attr is plain data; all-zero is its documented default.
    let mut attr: bindings::perf_event_attr = unsafe { std::mem::zeroed() };
    attr.size = std::mem::size_of::<bindings::perf_event_attr>() as u32;
    attr.type_ = counter.perf_type;
    attr.config = counter.config;
    attr.__bindgen_anon_3.config1 = counter.config1;
    attr.__bindgen_anon_4.config2 = counter.config2;
    attr
}

fn open_counter(
    counter: &ResolvedCounter,
    cpu: u32,
    leader: Option<BorrowedFd<'_>>,
    pinned: bool,
    privilege: Privilege,
) -> Result<OwnedFd> {
    let mut attr = counter_attr(counter);
    attr.read_format = u64::from(
        bindings::PERF_FORMAT_TOTAL_TIME_ENABLED | bindings::PERF_FORMAT_TOTAL_TIME_RUNNING,
    );
    // Only a group leader may be pinned; members follow it.
    attr.set_pinned(u64::from(pinned));
    match counter.exclude {
        Some(exclude) => {
            attr.set_exclude_user(u64::from(exclude.user));
            attr.set_exclude_kernel(u64::from(exclude.kernel));
            attr.set_exclude_hv(u64::from(exclude.hv));
            attr.set_exclude_host(u64::from(exclude.host));
            attr.set_exclude_guest(u64::from(exclude.guest));
            attr.set_exclude_idle(u64::from(exclude.idle));
        }
        None => {
            attr.set_exclude_user(u64::from(privilege == Privilege::KernelOnly));
            attr.set_exclude_kernel(u64::from(privilege == Privilege::UserOnly));
            attr.set_exclude_hv(u64::from(privilege == Privilege::UserOnly));
        }
    }
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
