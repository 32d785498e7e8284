//! (being written)

use super::Model;

/// Every model of this file, for `--pmu`, `topdown list` and `report -i`.
pub fn models() -> Vec<Box<dyn Model>> {
    Vec::new()
}

/// The model named `name` (as `Model::name` returns it), if this file has it.
pub fn by_name(name: &str) -> Option<Box<dyn Model>> {
    models().into_iter().find(|model| model.name() == name)
}
