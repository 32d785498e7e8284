//! `topdown report -i FILE`: a recording (`stat --format json`, one report per line) read
//! back, its metrics recomputed with the model it was recorded with, and rendered again in any
//! format. The formats themselves are [`crate::report`]'s.

use crate::{
    cli::ReportArgs,
    error::{Failure, fail},
    model::base_model,
    report::{load_reports, recompute, render},
};

/// Reloads `-i FILE`, recomputes with the recorded model (at `-l` if given), re-renders as
/// the report options say.
pub fn run(args: &ReportArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let input = &args.input;
    let shape = &args.report;
    for mut report in load_reports(input)? {
        let model = base_model(&report.model)
            .map_err(|err| fail(Failure::Usage, format!("{}: {err:#}", input.display())))?;
        let level = match args.level {
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
        render(&report, shape.format, &shape.by, shape.weight, out)?;
    }
    Ok(())
}
