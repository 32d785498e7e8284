//! CPU and PMU detection for `--pmu auto`.
//!
//! Reads from a root directory (`/` in production, a fixture tree in tests), so every kind of
//! machine can be tested here. Today it tells Intel perf metrics (the `slots` event of the core
//! PMU, exactly perf's `topdown_sys_has_perf_metrics` test, topdown-formulas.md §6.1) from
//! machines without a TopDown PMU, and says plainly when that is a VM without a virtual PMU.

use std::{fs, path::Path};

use anyhow::{Context as _, Result};

/// What `--pmu auto` picked, and the line announcing a fallback.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub model: String,
    pub announcement: Option<String>,
}

/// What the machine has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Detection {
    pub vendor: String,
    pub model_name: String,
    /// The `hypervisor` CPU flag: running in a VM.
    pub hypervisor: bool,
    /// A core PMU (`cpu`, or the hybrid `cpu_core`/`cpu_atom`, or an Arm PMUv3) exists.
    pub core_pmu: bool,
    /// Intel perf metrics: the core PMU has the `slots` event.
    pub perf_metrics: bool,
    /// Hybrid Intel (`cpu_core` + `cpu_atom`).
    pub hybrid: bool,
}

/// Reads `<root>/proc/cpuinfo` and `<root>/sys/bus/event_source/devices`.
pub fn detect(root: &Path) -> Result<Detection> {
    let cpuinfo_path = root.join("proc/cpuinfo");
    let cpuinfo = fs::read_to_string(&cpuinfo_path)
        .with_context(|| format!("reading {}", cpuinfo_path.display()))?;
    let field = |name: &str| {
        cpuinfo.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_owned())
        })
    };
    let devices = root.join("sys/bus/event_source/devices");
    let pmus: Vec<String> = fs::read_dir(&devices)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let has = |name: &str| pmus.iter().any(|pmu| pmu == name);
    let hybrid = has("cpu_core") && has("cpu_atom");
    let core_pmu = has("cpu")
        || hybrid
        || pmus
            .iter()
            .any(|pmu| pmu.starts_with("armv8_") || pmu.starts_with("armv9_"));
    let perf_metrics =
        devices.join("cpu/events/slots").exists() || devices.join("cpu_core/events/slots").exists();
    Ok(Detection {
        vendor: field("vendor_id")
            .or_else(|| field("CPU implementer").map(|id| format!("implementer {id}")))
            .unwrap_or_default(),
        model_name: field("model name").unwrap_or_default(),
        hypervisor: field("flags")
            .is_some_and(|flags| flags.split_whitespace().any(|f| f == "hypervisor")),
        core_pmu,
        perf_metrics,
        hybrid,
    })
}

/// The `--pmu auto` decision for what [`detect`] found.
pub fn choose(detection: &Detection) -> Choice {
    if detection.perf_metrics && !detection.hybrid {
        return Choice {
            model: "intel-icl".to_owned(),
            announcement: None,
        };
    }
    let why = if !detection.core_pmu && detection.hypervisor {
        "VM without a virtual PMU (hypervisor flag set, no core PMU in /sys/bus/event_source/devices)".to_owned()
    } else if !detection.core_pmu {
        "no core PMU in /sys/bus/event_source/devices".to_owned()
    } else {
        format!(
            "no TopDown model for this CPU yet ({} {})",
            detection.vendor, detection.model_name
        )
    };
    Choice {
        model: "software".to_owned(),
        announcement: Some(format!(
            "{why}: using the software model (on-CPU time only, no TopDown breakdown)"
        )),
    }
}

/// Detect and choose, from `root`.
pub fn auto_model(root: &Path) -> Result<Choice> {
    Ok(choose(&detect(root)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/proc` + `/sys` with the given cpuinfo and PMU directories (each with events).
    fn machine(cpuinfo: &str, pmus: &[(&str, &[&str])]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("proc")).unwrap();
        fs::write(root.path().join("proc/cpuinfo"), cpuinfo).unwrap();
        for (pmu, events) in pmus {
            let dir = root
                .path()
                .join("sys/bus/event_source/devices")
                .join(pmu)
                .join("events");
            fs::create_dir_all(&dir).unwrap();
            for event in *events {
                fs::write(dir.join(event), "event=0x00,umask=0x4\n").unwrap();
            }
        }
        root
    }

    const VM: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu vme hypervisor avx2\n";
    const ICX: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 106\nmodel name\t: Intel(R) Xeon(R) Platinum 8380\nflags\t\t: fpu vme avx512f\n";

    #[test]
    fn a_vm_without_a_pmu_says_so() {
        let root = machine(
            VM,
            &[("software", &[]), ("tracepoint", &[]), ("uprobe", &[])],
        );
        let choice = auto_model(root.path()).unwrap();
        assert_eq!(choice.model, "software");
        assert_eq!(
            choice.announcement.as_deref(),
            Some(
                "VM without a virtual PMU (hypervisor flag set, no core PMU in /sys/bus/event_source/devices): using the software model (on-CPU time only, no TopDown breakdown)"
            )
        );
    }

    #[test]
    fn perf_metrics_choose_intel_icl() {
        let root = machine(
            ICX,
            &[("cpu", &["slots", "topdown-retiring"]), ("software", &[])],
        );
        assert_eq!(
            auto_model(root.path()).unwrap(),
            Choice {
                model: "intel-icl".into(),
                announcement: None
            }
        );
    }

    #[test]
    fn a_pmu_without_a_model_is_announced() {
        let root = machine(ICX, &[("cpu", &["cycles"])]);
        let choice = auto_model(root.path()).unwrap();
        assert_eq!(choice.model, "software");
        assert!(choice.announcement.unwrap().starts_with(
            "no TopDown model for this CPU yet (GenuineIntel Intel(R) Xeon(R) Platinum 8380)"
        ));
        let missing = tempfile::tempdir().unwrap();
        assert!(
            auto_model(missing.path())
                .unwrap_err()
                .to_string()
                .contains("proc/cpuinfo")
        );
    }
}
