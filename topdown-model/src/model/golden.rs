//! The golden vectors of `tests/golden/*.json` (raw counts and hand-worked metrics per model)
//! checked against the formulas directly. The integration tests replay the same files through
//! `topdown report -i` and, as syscalls, through the whole live pipeline.

use std::path::PathBuf;

use serde_json::Value;

use super::{Counts, evaluate, model_by_name};

fn golden_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_golden_vector_matches_the_formulas() {
    let files = golden_files();
    assert!(!files.is_empty());
    for file in files {
        let text = std::fs::read_to_string(&file).expect("golden file");
        let json: Value = serde_json::from_str(&text).expect("golden JSON");
        let name = json["model"].as_str().expect("model");
        let model = model_by_name(name, &[]).unwrap_or_else(|err| panic!("{name}: {err:#}"));
        assert_eq!(model.recorded_name(), name, "{}", file.display());
        for vector in json["vectors"].as_array().expect("vectors") {
            let label = format!("{name} {}", vector["name"]);
            let level = vector["level"].as_u64().expect("level") as u8;
            let counts: Counts = vector["counts"]
                .as_object()
                .expect("counts")
                .iter()
                .map(|(counter, value)| (counter.clone(), value.as_u64().expect("count")))
                .collect();
            let result = evaluate(model.as_ref(), &counts, level);
            let estimated: Vec<String> = vector["estimated"]
                .as_array()
                .map(|names| {
                    names
                        .iter()
                        .map(|name| name.as_str().expect("metric name").to_owned())
                        .collect()
                })
                .unwrap_or_default();
            assert_eq!(result.estimated, estimated, "{label}: estimated metrics");
            for (metric, expected) in vector["expected"].as_object().expect("expected") {
                let actual = result.metrics.get(metric).copied().flatten();
                match (expected.as_f64(), actual) {
                    (None, None) => {}
                    (Some(expected), Some(actual)) => assert!(
                        (expected - actual).abs() < 1e-9,
                        "{label}: {metric} = {actual}, expected {expected}"
                    ),
                    (expected, actual) => {
                        panic!("{label}: {metric} = {actual:?}, expected {expected:?}")
                    }
                }
            }
        }
    }
}
