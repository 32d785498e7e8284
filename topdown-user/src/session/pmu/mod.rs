//! CPU and PMU detection: which CPU this is, which perf PMUs the kernel exposes, and so which
//! TopDown model `--pmu auto` uses and how many counters it has.
//!
//! Everything is read below a root directory (`/` in production, a fixture tree under
//! `tests/fixtures/pmu/` in tests), so every supported kind of machine is tested on any
//! machine. The rules are topdown-formulas.md §6 (detection); the model tables there map
//! Intel family-6 model numbers, AMD families and Arm MIDR part numbers to models.

use std::{collections::BTreeMap, fmt, fs, path::Path};

use anyhow::{Context as _, Result};

use crate::session::counters::parse_cpu_list;

/// What `--pmu auto` picked, and the line announcing a fallback.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub model: String,
    pub announcement: Option<String>,
}

/// Arm's MIDR_EL1 fields (topdown-formulas.md §6.3: [31:24] implementer, [23:20] variant,
/// [19:16] architecture, [15:4] part, [3:0] revision).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Midr {
    pub implementer: u8,
    pub variant: u8,
    pub part: u16,
    pub revision: u8,
}

impl Midr {
    pub fn from_raw(raw: u64) -> Self {
        Self {
            implementer: ((raw >> 24) & 0xff) as u8,
            variant: ((raw >> 20) & 0xf) as u8,
            part: ((raw >> 4) & 0xfff) as u16,
            revision: (raw & 0xf) as u8,
        }
    }

    pub fn raw(&self) -> u32 {
        u32::from(self.implementer) << 24
            | u32::from(self.variant) << 20
            | 0xf << 16
            | u32::from(self.part) << 4
            | u32::from(self.revision)
    }
}

/// One PMU of `/sys/bus/event_source/devices`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pmu {
    pub name: String,
    /// `perf_event_attr.type` for this PMU.
    pub perf_type: Option<u32>,
    /// The CPUs it covers (`cpus`, or `cpumask`), as the kernel printed them.
    pub cpus: Option<String>,
    /// Event aliases in `events/` (`.scale`/`.unit` files left out).
    pub events: Vec<String>,
    /// `caps/slots` (Arm PMMIR_EL1 slots per cycle; 0 before PMUv3p4).
    pub caps_slots: Option<u32>,
    /// `caps/pmu_name` (Intel: `skylake`, `icelake`, `sapphire_rapids`, `alderlake_hybrid`).
    pub pmu_name: Option<String>,
}

impl Pmu {
    /// A CPU core PMU: `cpu` (x86), `cpu_core`/`cpu_atom`/`cpu_lowpower` (Intel hybrid) or an
    /// Arm PMUv3 (`armv8_pmuv3_*`, `armv8_neoverse_*`, `armv9_neoverse_*`, ...).
    pub fn is_core(&self) -> bool {
        matches!(
            self.name.as_str(),
            "cpu" | "cpu_core" | "cpu_atom" | "cpu_lowpower"
        ) || self.name.starts_with("armv8_")
            || self.name.starts_with("armv9_")
    }

    pub fn has_event(&self, event: &str) -> bool {
        self.events.iter().any(|name| name == event)
    }
}

/// What the machine has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Detection {
    /// x86 `vendor_id` (`GenuineIntel`, `AuthenticAMD`), or `Arm implementer 0x41`.
    pub vendor: String,
    pub model_name: String,
    /// x86 family, model and stepping (cpuinfo prints them in decimal).
    pub family: Option<u32>,
    pub model: Option<u32>,
    pub stepping: Option<u32>,
    /// Arm MIDR per CPU: `regs/identification/midr_el1` where present, else cpuinfo's fields.
    pub midrs: BTreeMap<u32, Midr>,
    /// The `hypervisor` CPU flag: running in a VM.
    pub hypervisor: bool,
    /// `/sys/devices/system/cpu/smt/active`.
    pub smt_active: Option<bool>,
    /// `/proc/sys/kernel/nmi_watchdog`.
    pub nmi_watchdog: Option<bool>,
    /// Every PMU, sorted by name.
    pub pmus: Vec<Pmu>,
    /// A core PMU exists.
    pub core_pmu: bool,
    /// Intel perf metrics: the core PMU has the `slots` event (perf's own test,
    /// `topdown_sys_has_perf_metrics`, §6.1).
    pub perf_metrics: bool,
    /// Intel hybrid (`cpu_core` + `cpu_atom`).
    pub hybrid: bool,
}

impl Detection {
    pub fn pmu(&self, name: &str) -> Option<&Pmu> {
        self.pmus.iter().find(|pmu| pmu.name == name)
    }

    fn is_vendor(&self, vendor: &str) -> bool {
        self.vendor == vendor
    }

    /// The Arm core PMU (`armv8_pmuv3_0`, `armv9_neoverse_n2`, ...).
    fn arm_pmu(&self) -> Option<&Pmu> {
        self.pmus
            .iter()
            .find(|pmu| pmu.name.starts_with("armv8_") || pmu.name.starts_with("armv9_"))
    }
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path)
        .ok()
        .map(|text| text.trim().to_owned())
}

/// `0x00000005` or `5`.
fn parse_number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

fn read_pmu(dir: &Path, name: String) -> Pmu {
    let mut events: Vec<String> = fs::read_dir(dir.join("events"))
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| !name.ends_with(".scale") && !name.ends_with(".unit"))
                .collect()
        })
        .unwrap_or_default();
    events.sort();
    Pmu {
        perf_type: read_trimmed(&dir.join("type")).and_then(|text| text.parse().ok()),
        cpus: read_trimmed(&dir.join("cpus")).or_else(|| read_trimmed(&dir.join("cpumask"))),
        events,
        caps_slots: read_trimmed(&dir.join("caps/slots"))
            .and_then(|text| parse_number(&text))
            .map(|slots| slots as u32),
        pmu_name: read_trimmed(&dir.join("caps/pmu_name")),
        name,
    }
}

/// Reads `<root>/proc/cpuinfo`, `<root>/sys/bus/event_source/devices` and the CPU topology.
pub fn detect(root: &Path) -> Result<Detection> {
    let cpuinfo_path = root.join("proc/cpuinfo");
    let cpuinfo = fs::read_to_string(&cpuinfo_path).with_context(|| {
        format!(
            "reading {}: topdown identifies the CPU from it (is /proc mounted?)",
            cpuinfo_path.display()
        )
    })?;
    let field = |name: &str| {
        cpuinfo.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_owned())
        })
    };
    let number = |name: &str| field(name).and_then(|value| parse_number(&value));

    // Arm: per CPU from the register file, else cpuinfo's per-processor fields.
    let mut midrs = BTreeMap::new();
    let mut processor: Option<u32> = None;
    let mut fields: BTreeMap<&str, u64> = BTreeMap::new();
    let mut flush = |processor: Option<u32>, fields: &BTreeMap<&str, u64>| {
        if let (Some(cpu), Some(implementer), Some(part)) = (
            processor,
            fields.get("CPU implementer"),
            fields.get("CPU part"),
        ) {
            midrs.insert(
                cpu,
                Midr {
                    implementer: *implementer as u8,
                    variant: fields.get("CPU variant").copied().unwrap_or(0) as u8,
                    part: *part as u16,
                    revision: fields.get("CPU revision").copied().unwrap_or(0) as u8,
                },
            );
        }
    };
    for line in cpuinfo.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        if key == "processor" {
            flush(processor, &fields);
            fields.clear();
            processor = value.parse().ok();
        } else if let ("CPU implementer" | "CPU variant" | "CPU part" | "CPU revision", Some(n)) =
            (key, parse_number(value))
        {
            let key = match key {
                "CPU implementer" => "CPU implementer",
                "CPU variant" => "CPU variant",
                "CPU part" => "CPU part",
                _ => "CPU revision",
            };
            fields.insert(key, n);
        }
    }
    flush(processor, &fields);
    let cpu_dir = root.join("sys/devices/system/cpu");
    if let Ok(entries) = fs::read_dir(&cpu_dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(cpu) = name.strip_prefix("cpu").and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(raw) = read_trimmed(&entry.path().join("regs/identification/midr_el1"))
                .and_then(|text| parse_number(&text))
            {
                midrs.insert(cpu, Midr::from_raw(raw));
            }
        }
    }

    let devices = root.join("sys/bus/event_source/devices");
    let mut pmus: Vec<Pmu> = fs::read_dir(&devices)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    read_pmu(&devices.join(&name), name)
                })
                .collect()
        })
        .unwrap_or_default();
    pmus.sort_by(|a, b| a.name.cmp(&b.name));
    let has = |name: &str| pmus.iter().any(|pmu| pmu.name == name);
    let hybrid = has("cpu_core") && has("cpu_atom");
    let core_pmu = pmus.iter().any(Pmu::is_core);
    let perf_metrics = pmus
        .iter()
        .any(|pmu| (pmu.name == "cpu" || pmu.name == "cpu_core") && pmu.has_event("slots"));

    let vendor = field("vendor_id").unwrap_or_else(|| {
        midrs.values().next().map_or_else(String::new, |midr| {
            format!("Arm implementer {:#04x}", midr.implementer)
        })
    });
    Ok(Detection {
        vendor,
        model_name: field("model name").unwrap_or_default(),
        family: number("cpu family").map(|n| n as u32),
        model: field("model")
            .and_then(|value| value.parse().ok())
            .filter(|_| field("vendor_id").is_some()),
        stepping: number("stepping").map(|n| n as u32),
        midrs,
        hypervisor: field("flags")
            .is_some_and(|flags| flags.split_whitespace().any(|f| f == "hypervisor")),
        smt_active: read_trimmed(&cpu_dir.join("smt/active")).map(|text| text == "1"),
        nmi_watchdog: read_trimmed(&root.join("proc/sys/kernel/nmi_watchdog"))
            .map(|text| text != "0"),
        pmus,
        core_pmu,
        perf_metrics,
        hybrid,
    })
}

/// The model family table for Intel family 6 (topdown-formulas.md §6.1, perfmon mapfile.csv).
fn intel_model(model: u32) -> Option<&'static str> {
    Some(match model {
        0x2a | 0x2d => "snb",
        0x3a | 0x3e | 0x3c | 0x45 | 0x46 | 0x3f | 0x3d | 0x47 | 0x4f | 0x56 => "ivb",
        0x4e | 0x5e | 0x8e | 0x9e | 0xa5 | 0xa6 | 0x55 => "skl",
        0x7d | 0x7e | 0x6a | 0x6c | 0x8c | 0x8d | 0xa7 => "icl",
        0x8f | 0xcf | 0xad | 0xae => "spr",
        0x97 | 0x9a | 0xb7 | 0xba | 0xbf => "hybrid:intel-spr+intel-grt",
        0xaa | 0xac => "hybrid:intel-spr+intel-cmt",
        0xbd | 0xc5 | 0xc6 => "hybrid:intel-lnc+intel-skt",
        0xbe => "grt",
        0xaf | 0xb6 => "cmt",
        // Xeon Phi: Knights Landing and Knights Mill share one core PMU (Linux mapfile.csv
        // `GenuineIntel-6-(57|85),v16,knightslanding,core`; the kernel names it `knl`).
        0x57 | 0x85 => "knl",
        _ => return None,
    })
}

fn fallback(why: String) -> Choice {
    Choice {
        model: "software".to_owned(),
        announcement: Some(format!(
            "{why}: using the software model (on-CPU time only, no TopDown breakdown)"
        )),
    }
}

fn chosen(model: impl Into<String>) -> Choice {
    Choice {
        model: model.into(),
        announcement: None,
    }
}

/// The `--pmu auto` decision for what [`detect`] found.
pub fn choose(detection: &Detection) -> Choice {
    if !detection.core_pmu {
        return fallback(if detection.hypervisor {
            "VM without a virtual PMU (hypervisor flag set, no core PMU in \
             /sys/bus/event_source/devices)"
                .to_owned()
        } else {
            "no core PMU in /sys/bus/event_source/devices".to_owned()
        });
    }
    let smt = detection.smt_active == Some(true);
    if detection.is_vendor("GenuineIntel") {
        let Some(kind) = detection
            .model
            .filter(|_| detection.family == Some(6))
            .and_then(intel_model)
        else {
            return fallback(format!(
                "no TopDown model for Intel family {} model {:#x} yet",
                detection.family.unwrap_or(0),
                detection.model.unwrap_or(0)
            ));
        };
        let needs_slots = matches!(kind, "icl" | "spr") || kind.starts_with("hybrid:");
        if needs_slots && !detection.perf_metrics {
            return fallback(format!(
                "this CPU ({}) has perf metrics, but the core PMU offers no `slots` event (a \
                 hypervisor that hides fixed counter 3?)",
                detection.model_name
            ));
        }
        if kind.starts_with("hybrid:") && !detection.hybrid {
            return fallback(format!(
                "a hybrid CPU ({}) without the cpu_core and cpu_atom PMUs",
                detection.model_name
            ));
        }
        return chosen(match kind {
            "snb" | "ivb" | "skl" if smt => format!("intel-{kind}-smt"),
            hybrid if hybrid.starts_with("hybrid:") => hybrid.to_owned(),
            other => format!("intel-{other}"),
        });
    }
    if detection.is_vendor("AuthenticAMD") {
        // Linux mapfile.csv: AuthenticAMD-25-([245][[:xdigit:]]|[[:xdigit:]]) is Zen 3, every
        // other family 0x19 model Zen 4; family 0x1A is Zen 5 (§4 "Model mapping").
        let model = detection.model.unwrap_or(0);
        return match detection.family {
            Some(0x19) if model <= 0x0f || (0x20..=0x5f).contains(&model) => fallback(format!(
                "AMD Zen 3 (family 0x19 model {model:#x}) has no pipeline-utilization TopDown events"
            )),
            Some(0x19) => chosen("amd-zen4"),
            Some(0x1a) => chosen("amd-zen5"),
            family => fallback(format!(
                "no TopDown model for AMD family {:#x} yet",
                family.unwrap_or(0)
            )),
        };
    }
    let mut parts: Vec<Midr> = detection.midrs.values().copied().collect();
    parts.sort();
    parts.dedup();
    if let Some(midr) = parts.first() {
        if parts.len() > 1 {
            return fallback(format!(
                "CPUs of {} different core types (MIDRs {}): one Arm model cannot cover them",
                parts.len(),
                parts
                    .iter()
                    .map(|midr| format!("{:#010x}", midr.raw()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let caps_slots = detection.arm_pmu().and_then(|pmu| pmu.caps_slots);
        if midr.implementer == 0x41
            && let Some(model) = crate::model::arm_neoverse::model_for_midr(
                midr.part,
                midr.variant,
                midr.revision,
                caps_slots,
            )
        {
            return chosen(model.name());
        }
        return fallback(format!(
            "no TopDown model for Arm MIDR {:#010x} (implementer {:#04x} part {:#05x}) yet",
            midr.raw(),
            midr.implementer,
            midr.part
        ));
    }
    fallback(format!(
        "no TopDown model for this CPU yet ({} {})",
        detection.vendor, detection.model_name
    ))
}

/// Detect and choose, from `root`.
pub fn auto_model(root: &Path) -> Result<Choice> {
    Ok(choose(&detect(root)?))
}

/// General-purpose counters per thread of a core PMU, by CPU kind (topdown-formulas.md §2.1,
/// §3, §4, §5.4; Intel SDM CPUID leaf 0xA: 4 per thread with SMT on, 8 with it off before Ice
/// Lake; 8 on Ice Lake and later P-cores; Gracemont 6, Crestmont/Skymont 8; Knights
/// Landing/Mill 2 with SMT on or off (perfmon knightslanding_core.json `"Counter": "0,1"`,
/// libpfm4 `num_cntrs` 2); AMD core PMU 6; Neoverse 6).
pub fn general_counters(detection: &Detection, pmu: Option<&str>) -> Option<u32> {
    match pmu {
        Some("cpu_core") => return Some(8),
        Some("cpu_atom") => {
            return Some(match detection.model {
                Some(0x97 | 0x9a | 0xb7 | 0xba | 0xbf | 0xbe) => 6,
                _ => 8,
            });
        }
        _ => {}
    }
    if detection.is_vendor("GenuineIntel") {
        let kind = detection.model.and_then(intel_model)?;
        return Some(match kind {
            "snb" | "ivb" | "skl" if detection.smt_active == Some(true) => 4,
            "grt" => 6,
            "knl" => 2,
            _ => 8,
        });
    }
    if detection.is_vendor("AuthenticAMD") {
        return Some(6);
    }
    (!detection.midrs.is_empty()).then_some(6)
}

/// Counters the NMI watchdog takes from the general-purpose ones: AMD's has no fixed counter to
/// use; Arm's perf-based hardlockup detector holds the cycle counter, pushing our cycle event
/// onto a general counter; Intel's uses fixed counter 1 (topdown's models declare the cycle
/// event general for that reason), so none.
pub fn held_by_watchdog(detection: &Detection) -> u32 {
    if detection.nmi_watchdog != Some(true) || detection.is_vendor("GenuineIntel") {
        0
    } else {
        1
    }
}

/// Free general-purpose counters of this machine's core PMU (or of a hybrid `pmu`); `None`
/// when unknown, which plans every group as one pinned group.
pub fn free_general_counters(root: &Path, pmu: Option<&str>) -> Option<u32> {
    let detection = detect(root).ok()?;
    let general = general_counters(&detection, pmu)?;
    Some(general.saturating_sub(held_by_watchdog(&detection)))
}

/// The CPUs of a PMU, parsed.
pub fn pmu_cpus(detection: &Detection, pmu: &str) -> Option<Vec<u32>> {
    parse_cpu_list(detection.pmu(pmu)?.cpus.as_deref()?).ok()
}

impl fmt::Display for Detection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CPU:        {}", self.vendor)?;
        if !self.model_name.is_empty() {
            write!(f, " {}", self.model_name)?;
        }
        if let (Some(family), Some(model)) = (self.family, self.model) {
            write!(f, " (family {family:#x} model {model:#x}")?;
            if let Some(stepping) = self.stepping {
                write!(f, " stepping {stepping}")?;
            }
            write!(f, ")")?;
        }
        let mut midrs: Vec<Midr> = self.midrs.values().copied().collect();
        midrs.sort();
        midrs.dedup();
        for midr in midrs {
            write!(
                f,
                " MIDR {:#010x} (part {:#05x} r{}p{})",
                midr.raw(),
                midr.part,
                midr.variant,
                midr.revision
            )?;
        }
        if self.hypervisor {
            write!(f, ", hypervisor flag set")?;
        }
        writeln!(f)?;
        let topology = [
            match self.smt_active {
                Some(true) => "SMT on",
                Some(false) => "SMT off",
                None => "SMT unknown",
            },
            match self.nmi_watchdog {
                Some(true) => "NMI watchdog on",
                Some(false) => "NMI watchdog off",
                None => "no NMI watchdog",
            },
        ];
        writeln!(f, "Topology:   {}", topology.join(", "))?;
        let core: Vec<&Pmu> = self.pmus.iter().filter(|pmu| pmu.is_core()).collect();
        if core.is_empty() {
            writeln!(f, "Core PMU:   none")?;
        }
        for pmu in core {
            write!(f, "Core PMU:   {}", pmu.name)?;
            if let Some(perf_type) = pmu.perf_type {
                write!(f, " type {perf_type}")?;
            }
            if let Some(cpus) = &pmu.cpus {
                write!(f, ", CPUs {cpus}")?;
            }
            if let Some(name) = &pmu.pmu_name {
                write!(f, ", {name}")?;
            }
            if let Some(slots) = pmu.caps_slots {
                write!(f, ", {slots} slots/cycle")?;
            }
            let topdown: Vec<&str> = pmu
                .events
                .iter()
                .map(String::as_str)
                .filter(|name| *name == "slots" || name.starts_with("topdown-"))
                .collect();
            if !topdown.is_empty() {
                write!(f, ", {}", topdown.join(" "))?;
            }
            let counters = general_counters(
                self,
                Some(pmu.name.as_str()).filter(|name| *name == "cpu_core" || *name == "cpu_atom"),
            );
            if let Some(counters) = counters {
                write!(
                    f,
                    ", {counters} general counters ({} free)",
                    counters.saturating_sub(held_by_watchdog(self))
                )?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
