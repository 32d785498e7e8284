//! perf-syntax event specs (`PMU/terms/mods`, `rNNNN`, names, tracepoints) never panic.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use topdown_model::events::{PmuCatalog, parse_event};

/// The fixture machine of the unit tests: an Intel `cpu` PMU and an `armv8_pmuv3_0`.
static CATALOG: LazyLock<PmuCatalog> = LazyLock::new(|| {
    PmuCatalog::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/events"))
});

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        // Steer toward the perf parser: a PMU prefix, a raw config, or as given.
        let _ = parse_event(text, &CATALOG);
        let _ = parse_event(&format!("cpu/{text}/"), &CATALOG);
        let _ = parse_event(&format!("armv8_pmuv3_0/{text}"), &CATALOG);
    }
});
