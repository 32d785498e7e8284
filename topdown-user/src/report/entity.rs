//! One entity's figures (a thread, a process, a cgroup, a function, an edge, a span): its
//! named counters and the metrics derived from them. Below the report and every entry type
//! that holds one.

use serde::{Deserialize, Serialize};

use crate::model::{Counts, Metrics, NamedMap};

/// Counters and the metrics derived from them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Entity {
    pub counters: Counts,
    pub metrics: Metrics,
    /// Metrics computed from counts scaled for counter rotation (`crate::schedule`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub estimated: Vec<String>,
    /// The report's derived figures for this entity (name -> value in the figure's unit);
    /// absent where the denominator counted nothing.
    #[serde(default, skip_serializing_if = "NamedMap::is_empty")]
    pub derived: NamedMap<f64>,
}

impl Entity {
    /// What `counter` counted (0 where it is not among the entity's counters).
    pub fn count(&self, counter: &str) -> u64 {
        self.counters.get(counter).copied().unwrap_or(0)
    }
}
