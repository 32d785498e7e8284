//! JSON output: one compact object per report, one per line (`-I` mode writes a line per
//! interval), so a stream can be read line by line.

use anyhow::{Context as _, Result};

use super::Report;

pub fn write_json_line(report: &Report, out: &mut dyn std::io::Write) -> Result<()> {
    serde_json::to_writer(&mut *out, report).context("writing JSON")?;
    out.write_all(b"\n").context("writing JSON")?;
    Ok(())
}
