//! What a calibration records in the report (JSON `probe_compensation`): the mechanisms, the
//! costs measured, when it ran, and the functions' figures before the subtraction. Types only,
//! below the report that holds them; the measuring and the subtraction are `super`'s.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::Counts;

/// How a probed function's return is caught (`--returns`, per target).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReturnMechanism {
    /// The kernel's uretprobe (return address rewritten).
    Uretprobe,
    /// A uprobe on each exit instruction.
    Exit,
}

impl ReturnMechanism {
    /// The mechanism a function is attached with: `uretprobe` for its target, or its decoded
    /// `exits` (`None`: not decoded, so a uretprobe after all); `None` for a function that never
    /// returns (no return probe, no calls recorded).
    pub fn of<T>(uretprobe: bool, exits: Option<&[T]>) -> Option<Self> {
        match exits {
            _ if uretprobe => Some(Self::Uretprobe),
            None => Some(Self::Uretprobe),
            Some([]) => None,
            Some(_) => Some(Self::Exit),
        }
    }
}

/// One calibration run's result: a mechanism on one core type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeCost {
    pub mechanism: ReturnMechanism,
    /// The hybrid PMU of the CPU measured (`cpu_core`, `cpu_atom`); `null` on a machine with
    /// one core type.
    pub core_type: Option<String>,
    /// The CPU measured on; `null`: not pinned (one core type).
    pub cpu: Option<u32>,
    /// Probed calls measured; each figure is a trimmed mean over pieces of them
    /// (`trimmed_mean`).
    pub samples: u64,
    /// Counter -> counts a probed call adds to its own inclusive and exclusive figures (P).
    pub per_call: BTreeMap<String, f64>,
    /// Counter -> counts a probed callee adds to its caller's inclusive figure (T).
    pub per_callee: BTreeMap<String, f64>,
}

/// When a run's calibration ran (JSON `probe_compensation.calibrated`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationRun {
    pub at: CalibratedAt,
    /// How long the calibration took.
    pub duration_ms: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CalibratedAt {
    /// Before counting started (`serve`, `top`, `stat -I`: reports during the run need it).
    Start,
    /// After counting, before the report (`stat`): the traced command did not wait for it.
    End,
}

/// What the report says about the subtraction (JSON `probe_compensation`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompensationReport {
    /// When this run's calibration ran and how long it took (absent in reports written
    /// before topdown said).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibrated: Option<CalibrationRun>,
    /// Each mechanism on each core type, as calibrated.
    pub costs: Vec<ProbeCost>,
    /// Function/edge counter figures the subtraction would have taken below zero, set to 0.
    pub clamped: u64,
    /// Each function's figures before the subtraction (the report's `functions` are after).
    #[serde(default)]
    pub raw_functions: Vec<RawFunction>,
}

/// A probed function's totals as the probes recorded them, their own cost included.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RawFunction {
    pub target: String,
    pub symbol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    pub calls: u64,
    pub inclusive: Counts,
    pub exclusive: Counts,
}
