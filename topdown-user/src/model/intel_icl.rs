//! (in progress: being written)
use super::{CounterSpec, Counts, Metrics, Model};
pub struct IntelIcl;
impl Model for IntelIcl {
    fn name(&self) -> String { "intel-icl".into() }
    fn base_name(&self) -> &'static str { "intel-icl" }
    fn description(&self) -> &'static str { "" }
    fn counters(&self) -> Vec<CounterSpec> { Vec::new() }
    fn max_level(&self) -> u8 { 1 }
    fn metrics(&self, _counts: &Counts, _level: u8) -> Metrics { Metrics::new() }
    fn weight_counter(&self) -> &'static str { "slots" }
}
