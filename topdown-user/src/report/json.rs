//! JSON output: one compact object per report, one per line (`-I` mode writes a line per
//! interval), so a stream can be read line by line.

use std::io::Write as _;

use anyhow::{Context as _, Result};

use super::Report;

pub fn write_json_line(report: &Report, out: &mut dyn std::io::Write) -> Result<()> {
    // serde_json writes token by token: buffered, those are copies, not a dynamic call each
    // into `out` (a third of a large report's JSON time).
    let mut buffered = std::io::BufWriter::with_capacity(1 << 16, &mut *out);
    serde_json::to_writer(&mut buffered, report).context("writing JSON")?;
    buffered.write_all(b"\n").context("writing JSON")?;
    buffered.flush().context("writing JSON")?;
    Ok(())
}
