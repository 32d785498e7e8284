//! `topdown report -i FILE`: a recording (`stat --format json`, one report per line) read
//! back, its metrics recomputed with the model it was recorded with, and rendered again in any
//! format. The formats themselves are [`crate::report`]'s.

use std::path::Path;

use crate::{
    error::{Failure, fail},
    model::base_model,
    report::{By, Format, Weight, load_reports, recompute, render},
};

/// Reloads, recomputes with the recorded model (at `level` if given), re-renders.
pub fn run(
    input: &Path,
    level: Option<u8>,
    format: Format,
    by: &[By],
    weight: Weight,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    for mut report in load_reports(input)? {
        let model = base_model(&report.model)
            .map_err(|err| fail(Failure::Usage, format!("{}: {err:#}", input.display())))?;
        let level = match level {
            None => report.level,
            Some(level) if model.max_level() == 0 => {
                return Err(fail(
                    Failure::Usage,
                    format!(
                        "-l {level}: the recording's model {} has no TopDown levels",
                        report.model
                    ),
                ));
            }
            Some(level) => level,
        };
        recompute(&mut report, model.as_ref(), level);
        render(&report, format, by, weight, out)?;
    }
    Ok(())
}
