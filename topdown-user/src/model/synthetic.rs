//! (in progress: being written)
use anyhow::Result;
use super::{CounterSpec, Counts, Metrics, Model};
pub struct Synthetic { inner: Box<dyn Model> }
impl Synthetic {
    pub fn new(inner: Box<dyn Model>, _overrides: &[(String, String)]) -> Result<Self> { Ok(Self { inner }) }
}
impl Model for Synthetic {
    fn name(&self) -> String { format!("synthetic:{}", self.inner.name()) }
    fn base_name(&self) -> &'static str { self.inner.base_name() }
    fn description(&self) -> &'static str { "" }
    fn counters(&self) -> Vec<CounterSpec> { Vec::new() }
    fn max_level(&self) -> u8 { self.inner.max_level() }
    fn metrics(&self, counts: &Counts, level: u8) -> Metrics { self.inner.metrics(counts, level) }
    fn weight_counter(&self) -> &'static str { self.inner.weight_counter() }
}
