//! `--synthetic COUNTER=GROUP:TRACEPOINT,...` never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use topdown_model::model::synthetic::parse_synthetic_overrides;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_synthetic_overrides(text);
    }
});
