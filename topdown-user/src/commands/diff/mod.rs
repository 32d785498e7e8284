//! `topdown diff BASE NEW` (or `BASE... -- NEW...`): compares JSON results per function,
//! call-tree edge, span, process and cgroup, and exits 1 when an entity's cost grew beyond the
//! threshold: a regression gate for CI. Exit 0 otherwise, 2 on bad input (a missing file, a
//! file that is not a topdown result, runs of different models or weight counters).
//!
//! `input` reads the files into typed entities, `compare` compares them (`stats` is Welch's
//! test for several runs per side), `render` writes the table, JSON or differential SVG.

pub mod compare;
pub mod input;
pub mod render;
pub mod stats;

use std::path::PathBuf;

use crate::error::{Failure, fail, failure_of};
use input::Kind;
use render::DiffFormat;

/// What `topdown diff` was asked to do (the CLI's [`crate::cli::DiffArgs`], typed).
#[derive(Clone, Debug)]
pub struct DiffRequest {
    pub base: Vec<PathBuf>,
    pub new: Vec<PathBuf>,
    pub threshold_pct: f64,
    pub format: DiffFormat,
    pub output: Option<PathBuf>,
    pub kinds: Vec<Kind>,
}

/// Runs the comparison and returns the exit status: 1 when something regressed, else 0. Every
/// error is exit status 2 (bad input), so that 1 always means a regression.
pub fn command(request: &DiffRequest) -> anyhow::Result<u8> {
    run(request).map_err(|err| match failure_of(&err) {
        Some(Failure::Usage) => err,
        _ => fail(Failure::Usage, format!("{err:#}")),
    })
}

fn run(request: &DiffRequest) -> anyhow::Result<u8> {
    let load = |paths: &[PathBuf]| -> anyhow::Result<Vec<input::Run>> {
        paths.iter().map(|path| input::load(path)).collect()
    };
    if (request.base.len() == 1) != (request.new.len() == 1) {
        return Err(fail(
            Failure::Usage,
            format!(
                "BASE has {} run(s) and NEW {}: give one run per side, or at least two on each for the test of significance",
                request.base.len(),
                request.new.len()
            ),
        ));
    }
    let base_runs = load(&request.base)?;
    let new_runs = load(&request.new)?;
    let base: Vec<&input::Run> = base_runs.iter().collect();
    let new: Vec<&input::Run> = new_runs.iter().collect();
    let all: Vec<&input::Run> = base.iter().chain(&new).copied().collect();
    input::check_comparable(&all)?;
    let model = crate::model::base_model(&base[0].model).map_err(|err| {
        fail(
            Failure::Usage,
            format!("{}: {err:#}", base[0].path.display()),
        )
    })?;
    let comparison = compare::compare(
        model.as_ref(),
        &base,
        &new,
        request.threshold_pct,
        &request.kinds,
    );
    let mut output = crate::ui::output::Output::open(request.output.as_deref())?;
    match request.format {
        DiffFormat::Table => render::write_table(&comparison, output.as_mut())?,
        DiffFormat::Json => render::write_json(&comparison, output.as_mut())?,
        DiffFormat::Svg => render::svg::write_svg(&comparison, &new, output.as_mut())?,
    }
    output.commit()?;
    let regressed = render::regressed(&comparison);
    // The table names the regressions itself; elsewhere (JSON, SVG, a file) stderr does, so a
    // CI log always says what failed the gate.
    let table_on_stdout = request.format == DiffFormat::Table && request.output.is_none();
    if regressed && !table_on_stdout {
        for change in comparison.regressions() {
            eprintln!(
                "topdown diff: REGRESSED {}",
                render::regression_line(&comparison, change)
            );
        }
    }
    Ok(u8::from(regressed))
}
