//! `topdown check`: can topdown trace with TopDown here, and if not, why not and what to do.
//!
//! One line per requirement, each with its evidence and, when it fails, the remedy. The exit
//! status answers the question: 0 when tracing with the chosen model can work on this machine,
//! 1 when it cannot. Every probe is read-only or self-contained (programs are loaded but never
//! attached; counters are opened on one CPU and closed again).

use std::{fmt, fs, path::Path};

use anyhow::Result;

use crate::{
    model::Model,
    session::{
        capabilities::{capabilities_suffice, effective_capabilities},
        counters::{CounterGroups, Privilege, resolve},
        tracefs::Tracefs,
    },
};

/// How one requirement stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Works, with a caveat worth knowing.
    Warn,
    /// Tracing with the chosen model cannot work until this is fixed.
    Fail,
    /// Not applicable to the chosen model.
    Skip,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Ok => "ok  ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        })
    }
}

/// One line of the diagnosis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub status: Status,
    pub requirement: &'static str,
    /// What was found, and for failures what to do.
    pub detail: String,
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}  {:<20} {}",
            self.status, self.requirement, self.detail
        )
    }
}

fn item(status: Status, requirement: &'static str, detail: impl Into<String>) -> Item {
    Item {
        status,
        requirement,
        detail: detail.into(),
    }
}

fn privileges(effective: u64) -> Item {
    if capabilities_suffice(effective) {
        item(
            Status::Ok,
            "privileges",
            "CAP_SYS_ADMIN or CAP_BPF+CAP_PERFMON present",
        )
    } else {
        item(
            Status::Fail,
            "privileges",
            "neither root nor CAP_BPF+CAP_PERFMON: run with sudo, or grant both capabilities \
             (setcap cap_bpf,cap_perfmon+ep)",
        )
    }
}

/// `kernel.perf_event_paranoid`: system-wide counters need -1, or CAP_PERFMON (root) at any value.
fn paranoid(value: Option<i32>, privileged: bool) -> Item {
    match (value, privileged) {
        (None, _) => item(
            Status::Warn,
            "perf_event_paranoid",
            "/proc/sys/kernel/perf_event_paranoid unreadable: perf events may be disabled",
        ),
        (Some(value), true) => item(
            Status::Ok,
            "perf_event_paranoid",
            format!("{value} (does not restrict CAP_PERFMON/root)"),
        ),
        (Some(-1), false) => item(
            Status::Ok,
            "perf_event_paranoid",
            "-1: system-wide counters allowed",
        ),
        (Some(value), false) => item(
            Status::Fail,
            "perf_event_paranoid",
            format!(
                "{value}: per-CPU counters of every task need CAP_PERFMON or \
                 sysctl kernel.perf_event_paranoid=-1"
            ),
        ),
    }
}

fn btf(root: &Path) -> Item {
    let path = root.join("sys/kernel/btf/vmlinux");
    let missing = format!(
        "{} missing: the kernel needs CONFIG_DEBUG_INFO_BTF=y for topdown's \
         tp_btf/sched_switch program",
        path.display()
    );
    present(
        &path,
        "BTF",
        "tp_btf programs can attach",
        (Status::Fail, missing),
    )
}

/// `requirement` met where `path` exists ("PATH present (what it allows)"), else `missing`.
fn present(
    path: &Path,
    requirement: &'static str,
    allows: &str,
    (status, missing): (Status, String),
) -> Item {
    if path.exists() {
        item(
            Status::Ok,
            requirement,
            format!("{} present ({allows})", path.display()),
        )
    } else {
        item(status, requirement, missing)
    }
}

/// Whether `-p`, `-- CMD` and `-G` can skip the switches of untraced tasks.
fn switch_filter(offsets: Result<[u32; topdown_common::kernel_offset::COUNT]>) -> Item {
    match offsets {
        Ok(_) => item(
            Status::Ok,
            "switch filter",
            "task and cgroup fields found in BTF: with -p, -- CMD or -G, counters are read only \
             at switches of traced tasks",
        ),
        Err(err) => item(
            Status::Warn,
            "switch filter",
            format!(
                "{err:#}: with -p, -- CMD or -G, counters are read at every context switch, \
                 traced or not (costlier)"
            ),
        ),
    }
}

fn nmi_watchdog(value: Option<i32>) -> Item {
    match value {
        Some(1) => item(
            Status::Warn,
            "NMI watchdog",
            "on: it holds one hardware counter (sysctl kernel.nmi_watchdog=0 frees it)",
        ),
        Some(_) => item(Status::Ok, "NMI watchdog", "off: every counter is free"),
        None => item(
            Status::Ok,
            "NMI watchdog",
            "not configured (no /proc/sys/kernel/nmi_watchdog)",
        ),
    }
}

fn read_i32(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Runs every check for `model` (the one `--pmu` chose) and prints the diagnosis; returns the
/// exit status.
pub fn run(
    model: &dyn Model,
    announcement: Option<&str>,
    out: &mut dyn std::io::Write,
) -> Result<u8> {
    let root = Path::new("/");
    let mut items = Vec::new();

    let effective = effective_capabilities()?;
    let privileged = capabilities_suffice(effective);
    items.push(privileges(effective));
    items.push(paranoid(
        read_i32(&root.join("proc/sys/kernel/perf_event_paranoid")),
        privileged,
    ));
    items.push(btf(root));
    items.push(switch_filter(crate::session::bpf::switch_offsets()));

    let tracefs = if privileged {
        Tracefs::locate_or_mount()
    } else {
        Err(anyhow::anyhow!("not attempted without privileges"))
    };
    match &tracefs {
        Ok(tracefs) => items.push(item(
            Status::Ok,
            "tracefs",
            format!("{}", tracefs.root().display()),
        )),
        Err(err) => items.push(item(
            Status::Fail,
            "tracefs",
            format!("{err:#}: mount it (mount -t tracefs nodev /sys/kernel/tracing)"),
        )),
    }

    if privileged {
        match crate::session::bpf::verify_programs() {
            Ok(programs) => items.push(item(
                Status::Ok,
                "BPF programs",
                format!(
                    "{} programs pass the verifier: {}",
                    programs.len(),
                    programs.join(" ")
                ),
            )),
            Err(err) => items.push(item(Status::Fail, "BPF programs", format!("{err:#}"))),
        }
    } else {
        items.push(item(
            Status::Skip,
            "BPF programs",
            "needs privileges to load",
        ));
    }

    items.push(present(
        &root.join("sys/bus/event_source/devices/uprobe"),
        "uprobes",
        "-u function probes",
        (
            Status::Warn,
            "no uprobe PMU (CONFIG_UPROBE_EVENTS): -u function probes cannot attach".to_owned(),
        ),
    ));
    items.push(if !privileged {
        item(Status::Skip, "uprobe.multi", "needs privileges to probe")
    } else if crate::session::bpf::uprobe_multi_supported() {
        item(
            Status::Ok,
            "uprobe.multi",
            "supported: one link attaches many functions",
        )
    } else {
        item(
            Status::Warn,
            "uprobe.multi",
            "not supported (Linux < 6.6): each function gets its own uprobe, slower to attach",
        )
    });

    items.extend(pmu_items(root, model, announcement));
    items.push(nmi_watchdog(read_i32(
        &root.join("proc/sys/kernel/nmi_watchdog"),
    )));
    items.push(counters_free(model, tracefs.as_ref().ok(), privileged));

    for line in &items {
        writeln!(out, "{line}")?;
    }
    let failures: Vec<&str> = items
        .iter()
        .filter(|line| line.status == Status::Fail)
        .map(|line| line.requirement)
        .collect();
    if failures.is_empty() {
        writeln!(
            out,
            "verdict: tracing with model {} can work here",
            model.name()
        )?;
        Ok(0)
    } else {
        writeln!(
            out,
            "verdict: TopDown tracing cannot work here with model {} (failed: {}){}",
            model.name(),
            failures.join(", "),
            if model.is_synthetic() {
                ""
            } else {
                "; --pmu software (on-CPU time) and --pmu synthetic:<model> (testing) need no PMU"
            }
        )?;
        Ok(1)
    }
}

fn pmu_items(root: &Path, model: &dyn Model, announcement: Option<&str>) -> Vec<Item> {
    let mut items = Vec::new();
    match crate::session::pmu::detect(root) {
        Ok(detection) => {
            let vm_without_pmu = detection.hypervisor && !detection.core_pmu;
            let needs_pmu = !model.is_synthetic() && model.max_level() > 0;
            let status = match (detection.core_pmu, needs_pmu) {
                (true, _) => Status::Ok,
                (false, true) => Status::Fail,
                (false, false) => Status::Warn,
            };
            let detail = if vm_without_pmu {
                "VM without a virtual PMU (hypervisor flag set, no core PMU in \
                 /sys/bus/event_source/devices): enable the vPMU in the hypervisor (e.g. KVM \
                 -cpu host,pmu=on; cloud: an instance type that exposes the PMU)"
                    .to_owned()
            } else if detection.core_pmu {
                format!(
                    "core PMU present ({} {})",
                    detection.vendor, detection.model_name
                )
            } else {
                "no core PMU in /sys/bus/event_source/devices".to_owned()
            };
            items.push(item(status, "PMU", detail));
        }
        Err(err) => items.push(item(Status::Warn, "PMU", format!("{err:#}"))),
    }
    // `--pmu auto` falling back to the software model means no TopDown here: the question this
    // command answers. An explicit `--pmu software` asks about on-CPU time only.
    let fell_back = model.max_level() == 0 && announcement.is_some();
    items.push(item(
        if fell_back { Status::Fail } else { Status::Ok },
        "model",
        match announcement {
            Some(line) => format!("{}: {line}", model.name()),
            None => format!("{}: {}", model.name(), model.description()),
        },
    ));
    items
}

/// Opens the model's level-1 group on the first online CPU, counts a moment and reads it: a
/// group that never ran means something else holds the counters.
fn counters_free(model: &dyn Model, tracefs: Option<&Tracefs>, privileged: bool) -> Item {
    if !privileged {
        return item(
            Status::Skip,
            "counters free",
            "needs privileges to open counters",
        );
    }
    let attempt = || -> Result<String> {
        let plan = crate::schedule::plan(model, 1, &|_| None)?;
        let counters = resolve(&plan.counters, tracefs)?;
        let cpus = crate::session::counters::online_cpus()?;
        let first = cpus.first().copied().unwrap_or(0);
        let groups = CounterGroups::open(
            &plan,
            &counters,
            &[first],
            &crate::session::counters::pmu_cpus,
            Privilege::All,
        )?;
        let opened = groups.fds().count();
        Ok(format!(
            "{opened} of {} level-1 counters open on CPU {first}",
            plan.counters.len()
        ))
    };
    match attempt() {
        Ok(detail) => item(Status::Ok, "counters free", detail),
        Err(err) => item(Status::Fail, "counters free", format!("{err:#}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities() {
        assert_eq!(privileges(0).status, Status::Fail);
        assert!(privileges(0).detail.contains("sudo"));
    }

    #[test]
    fn paranoid_levels() {
        assert_eq!(paranoid(Some(2), true).status, Status::Ok);
        assert_eq!(paranoid(Some(-1), false).status, Status::Ok);
        let strict = paranoid(Some(2), false);
        assert_eq!(strict.status, Status::Fail);
        assert!(strict.detail.contains("perf_event_paranoid=-1"));
        assert_eq!(paranoid(None, true).status, Status::Warn);
    }

    #[test]
    fn watchdog_and_btf_lines() {
        assert_eq!(nmi_watchdog(Some(1)).status, Status::Warn);
        assert_eq!(nmi_watchdog(Some(0)).status, Status::Ok);
        let missing = btf(Path::new("/nonexistent-root"));
        assert_eq!(missing.status, Status::Fail);
        assert!(missing.detail.contains("CONFIG_DEBUG_INFO_BTF"));
        assert_eq!(
            item(Status::Fail, "BTF", "x").to_string(),
            format!("FAIL  {:<20} x", "BTF")
        );
    }
}
