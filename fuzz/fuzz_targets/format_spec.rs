//! sysfs `format/` strings (`config:0-7,32-35`) and value placement never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use topdown_model::events::catalog::Format;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (value, text) = data.split_at(8);
    let value = u64::from_le_bytes(value.try_into().unwrap_or([0; 8]));
    if let Ok(text) = std::str::from_utf8(text)
        && let Ok(format) = Format::parse(text)
    {
        let _ = format.width();
        let _ = format.place(value);
    }
});
