//! Reading sysfs and procfs below a root directory (`/` in production, a fixture tree in tests).
//!
//! Missing optional files are normal (older kernels, VMs, other architectures) and read as
//! `None`; any other failure is an error that names the file.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::arm::Midr;
use super::cpulist::CpuList;

/// Where perf PMUs are listed (`perf_event_sysfs_init` in Linux `kernel/events/core.c`).
pub const PMU_DEVICES: &str = "sys/bus/event_source/devices";

/// `<root>/<relative>`; `relative` never starts with `/`.
pub fn under(root: &Path, relative: &str) -> PathBuf {
    root.join(relative)
}

/// A file that must exist.
pub fn read_required(path: &Path, hint: &str) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}: {hint}", path.display()))
}

/// A file that may be absent; other errors (permissions, I/O) are still errors.
pub fn read_optional(path: &Path) -> Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("reading {}", path.display())),
    }
}

/// An optional cpulist file.
pub fn read_cpulist(path: &Path) -> Result<Option<CpuList>> {
    read_optional(path)?
        .map(|text| {
            CpuList::parse(&text).with_context(|| format!("parsing the CPU list in {}", path.display()))
        })
        .transpose()
}

/// An optional file holding a decimal integer, read as "non-zero".
pub fn read_flag(path: &Path) -> Result<Option<bool>> {
    read_optional(path)?
        .map(|text| {
            let text = text.trim();
            text.parse::<i64>().map(|value| value != 0).with_context(|| {
                format!("{}: expected a number (0 or 1), found '{text}'", path.display())
            })
        })
        .transpose()
}

/// One perf event alias from a PMU's `events/` directory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PmuEvent {
    /// The alias string (`event=0x00,umask=0x4`). Read for core PMUs only, whose strings the
    /// models care about; `None` for other PMUs, which can have thousands of aliases.
    pub config: Option<String>,
    /// `<name>.scale` (e.g. `topdown-total-slots.scale` is 4 without HT, 2 with it, §2.1).
    pub scale: Option<String>,
    /// `<name>.unit`.
    pub unit: Option<String>,
}

/// One PMU under `/sys/bus/event_source/devices`.
#[derive(Clone, Debug, PartialEq)]
pub struct Pmu {
    pub name: String,
    /// `type`: the `perf_event_attr.type` for raw events on this PMU.
    pub perf_type: u32,
    /// `cpus`: the CPUs a core PMU covers (hybrid x86, every Arm PMU).
    pub cpus: Option<CpuList>,
    /// `cpumask`: the CPU(s) an uncore or package PMU is read from.
    pub cpumask: Option<CpuList>,
    /// `events/*`, by alias name (without the `.scale`/`.unit` suffix files).
    pub events: BTreeMap<String, PmuEvent>,
    /// `caps/*`, trimmed (`pmu_name`, `branches`, `max_precise`, `slots`, ...).
    pub caps: BTreeMap<String, String>,
    /// `caps/slots` decoded (`0x%08x` since Linux 6.x, `%d` before, K-arm): the Arm PMMIR_EL1
    /// SLOTS field, 0 when the core has no PMUv3p4.
    pub slots: Option<u32>,
}

impl Pmu {
    /// A core (CPU) PMU, by perf's rule (`is_pmu_core` in Linux `tools/perf/util/pmu.c`): the
    /// PMU named `cpu` (non-hybrid x86), or any PMU with a `cpus` file (`cpu_core`, `cpu_atom`,
    /// `cpu_lowpower` on hybrid x86, §3.4; `armv8_pmuv3_*`, `armv8_*`, `armv9_*` on Arm, §5.2).
    /// Uncore PMUs have `cpumask` instead.
    pub fn is_core(&self) -> bool {
        self.name == "cpu" || self.cpus.is_some()
    }

    pub fn has_event(&self, name: &str) -> bool {
        self.events.contains_key(name)
    }

    pub fn cap(&self, name: &str) -> Option<&str> {
        self.caps.get(name).map(String::as_str)
    }

    /// Reads `<devices>/<name>`.
    pub fn read(dir: &Path, name: &str) -> Result<Self> {
        let type_path = dir.join("type");
        let type_text = read_required(
            &type_path,
            "every perf PMU has a type file; is sysfs mounted completely?",
        )?;
        let perf_type = type_text.trim().parse().with_context(|| {
            format!(
                "{}: expected a PMU type number, found '{}'",
                type_path.display(),
                type_text.trim()
            )
        })?;
        let cpus = read_cpulist(&dir.join("cpus"))?;
        let cpumask = read_cpulist(&dir.join("cpumask"))?;
        let core = name == "cpu" || cpus.is_some();
        let events = read_events(&dir.join("events"), core)?;
        let caps = read_caps(&dir.join("caps"))?;
        let slots = match caps.get("slots") {
            Some(text) => Some(parse_slots(text).with_context(|| {
                format!("{}/caps/slots: expected 0x%08x or a decimal number", dir.display())
            })?),
            None => None,
        };
        Ok(Self {
            name: name.to_owned(),
            perf_type,
            cpus,
            cpumask,
            events,
            caps,
            slots,
        })
    }
}

/// Suffix files that describe an alias rather than being one (`perf_pmu__new_alias` and
/// `pmu_aliases_parse` in Linux `tools/perf/util/pmu.c`).
const EVENT_SUFFIXES: [&str; 4] = [".scale", ".unit", ".per-pkg", ".snapshot"];

fn read_events(dir: &Path, read_strings: bool) -> Result<BTreeMap<String, PmuEvent>> {
    let mut events: BTreeMap<String, PmuEvent> = BTreeMap::new();
    for file in list_dir(dir)? {
        let suffix = EVENT_SUFFIXES
            .iter()
            .find(|suffix| file.ends_with(**suffix));
        let base = match suffix {
            Some(suffix) => &file[..file.len() - suffix.len()],
            None => file.as_str(),
        };
        let entry = events.entry(base.to_owned()).or_default();
        match suffix.copied() {
            None if read_strings => {
                entry.config = read_optional(&dir.join(&file))?.map(|s| s.trim().to_owned());
            }
            Some(".scale") => {
                entry.scale = read_optional(&dir.join(&file))?.map(|s| s.trim().to_owned());
            }
            Some(".unit") => {
                entry.unit = read_optional(&dir.join(&file))?.map(|s| s.trim().to_owned());
            }
            _ => {}
        }
    }
    Ok(events)
}

fn read_caps(dir: &Path) -> Result<BTreeMap<String, String>> {
    let mut caps = BTreeMap::new();
    for file in list_dir(dir)? {
        if let Some(text) = read_optional(&dir.join(&file))? {
            caps.insert(file, text.trim().to_owned());
        }
    }
    Ok(caps)
}

/// `caps/slots`: `0x%08x` (current `slots_show` in Linux `drivers/perf/arm_pmuv3.c`) or `%d`
/// (older kernels), topdown-formulas.md §5.2.
pub fn parse_slots(text: &str) -> Result<u32> {
    let text = text.trim();
    match text.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).with_context(|| format!("'{text}' is not hex")),
        None => text
            .parse()
            .with_context(|| format!("'{text}' is not a number")),
    }
}

/// File names in a directory, sorted; a missing directory is empty.
pub fn list_dir(dir: &Path) -> Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err).with_context(|| format!("listing {}", dir.display())),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        match entry.file_name().into_string() {
            Ok(name) => names.push(name),
            Err(name) => bail!(
                "{}: entry {name:?} is not UTF-8; sysfs names never are",
                dir.display()
            ),
        }
    }
    names.sort();
    Ok(names)
}

/// Every PMU under `<root>/sys/bus/event_source/devices`, sorted by name.
pub fn read_pmus(root: &Path) -> Result<Vec<Pmu>> {
    let devices = under(root, PMU_DEVICES);
    if !devices.is_dir() {
        bail!(
            "{} does not exist: sysfs is not mounted (mount -t sysfs sysfs /sys), or this kernel \
             has no perf events (CONFIG_PERF_EVENTS)",
            devices.display()
        );
    }
    list_dir(&devices)?
        .into_iter()
        .map(|name| Pmu::read(&devices.join(&name), &name))
        .collect()
}

/// MIDR_EL1 per CPU from `<root>/sys/devices/system/cpu/cpu<N>/regs/identification/midr_el1`
/// (arm64 only; `cpuid_cpu_online` in Linux `arch/arm64/kernel/cpuinfo.c` creates it for
/// online CPUs).
pub fn read_midrs(root: &Path) -> Result<BTreeMap<u32, Midr>> {
    let cpu_dir = under(root, "sys/devices/system/cpu");
    let mut midrs = BTreeMap::new();
    for name in list_dir(&cpu_dir)? {
        let Some(cpu) = name
            .strip_prefix("cpu")
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let path = cpu_dir.join(&name).join("regs/identification/midr_el1");
        if let Some(text) = read_optional(&path)? {
            let midr = Midr::parse_sysfs(&text).with_context(|| format!("parsing {}", path.display()))?;
            midrs.insert(cpu, midr);
        }
    }
    Ok(midrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_in_both_kernel_formats() -> Result<()> {
        assert_eq!(parse_slots("0x00000005\n")?, 5);
        assert_eq!(parse_slots("0x0000000a")?, 10);
        assert_eq!(parse_slots("8\n")?, 8);
        assert_eq!(parse_slots("0x00000000")?, 0);
        assert!(parse_slots("five").is_err());
        assert!(parse_slots("0x").is_err());
        Ok(())
    }
}
