//! libpfm-syntax event specs (`[PMU::]EVENT:UMASK:mods`) never panic: they cross into
//! libpfm4 (dlopen'ed), so this also checks the FFI on hostile strings.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use topdown_model::events::{PmuCatalog, libpfm};

static CATALOG: LazyLock<PmuCatalog> = LazyLock::new(|| {
    PmuCatalog::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/events"))
        .with_model("intel-skl")
});

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = libpfm::parse(text, &CATALOG);
        // Known events with fuzzed umasks and modifiers reach the deeper rules.
        let _ = libpfm::parse(&format!("INT_MISC:{text}"), &CATALOG);
        let _ = libpfm::parse(&format!("CPU_CLK_UNHALTED:THREAD:{text}"), &CATALOG);
        let _ = libpfm::parse(&format!("knl::OFFCORE_RESPONSE_0:{text}"), &CATALOG);
    }
});
