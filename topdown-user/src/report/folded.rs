//! `--format folded`: collapsed stacks, one `frame;frame;frame WEIGHT` line per stack, the
//! input of flamegraph.pl, inferno-flamegraph and speedscope. The weight is the stack's
//! exclusive weight counter (`--weight slots`) or its probed calls (`--weight calls`); a
//! flame graph then sums each frame's inclusive figure from its stacks.
//!
//! Functions of several processes (`--by function,task`) get their process (`comm [pid]`) as
//! the root frame. `;` inside a name (the separator) becomes `:`, and line breaks a space.

use std::{collections::BTreeMap, io::Write as _};

use anyhow::{Context as _, Result};

use super::{By, Report, Weight};

fn clean(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect()
}

pub fn write_folded(
    report: &Report,
    by: &[By],
    weight: Weight,
    out: &mut dyn std::io::Write,
) -> Result<()> {
    report.check_whole_run("--format folded writes")?;
    let stacks = super::stacks::stacks(report, by)?;
    // Function stacks of more than one process: each under its process, as `--by
    // function,task` splits them (task stacks already start with their process).
    let pids: std::collections::BTreeSet<Option<u32>> = stacks
        .stacks
        .iter()
        .filter(|stack| stack.labels.tid.is_none() && stack.labels.cgroup.is_none())
        .map(|stack| stack.labels.pid)
        .collect();
    let several_processes = !report.functions.is_empty() && pids.len() > 1;
    // Equal stacks (two targets' functions of one name) are one line, as the format expects.
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for stack in &stacks.stacks {
        let value = match weight {
            Weight::Slots => stack.weight,
            Weight::Calls => stack.calls,
        };
        if value == 0 {
            continue;
        }
        let mut frames: Vec<String> = Vec::with_capacity(stack.frames.len() + 1);
        if several_processes && let Some(pid) = stack.labels.pid {
            let comm = stack.labels.comm.as_deref().unwrap_or("?");
            frames.push(clean(&format!("{comm} [{pid}]")));
        }
        frames.extend(stack.frames.iter().map(|frame| clean(&frame.name)));
        *lines.entry(frames.join(";")).or_default() += value;
    }
    let mut buffered = std::io::BufWriter::new(out);
    for (stack, value) in lines {
        writeln!(buffered, "{stack} {value}").context("writing folded stacks")?;
    }
    buffered.flush().context("writing folded stacks")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::report_of;

    #[test]
    fn one_line_per_stack_with_process_roots() {
        let mut report = report_of("intel-icl", 1);
        report.interval = None;
        report.functions[1].symbol = "a;b\nc".into();
        report.call_tree.clear();
        let mut out = Vec::new();
        write_folded(&report, &[], Weight::Calls, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        // malloc has no pid, parse<i32> is process 100's: two processes, each its root frame.
        assert_eq!(text, "a:b c 9\nserver [100];parse<i32> 42\n");
    }
}
