//! CSV output (RFC 4180): one row per entity, counters then metrics; empty cells for metrics the
//! model cannot compute.

use anyhow::{Context as _, Result};

use super::{By, Entity, Report};

pub fn write_csv(report: &Report, by: &[By], out: &mut dyn std::io::Write) -> Result<()> {
    let metric_names: Vec<&String> = report.totals.metrics.keys().collect();
    let mut header = vec![
        "interval".to_owned(),
        "kind".into(),
        "tid".into(),
        "pid".into(),
        "comm".into(),
    ];
    header.extend(report.counter_names.iter().cloned());
    header.extend(metric_names.iter().map(|name| (*name).clone()));
    write_row(out, &header)?;

    let interval = report
        .interval
        .as_ref()
        .map(|i| i.index.to_string())
        .unwrap_or_default();
    let row = |kind: &str, tid: String, pid: String, comm: &str, entity: &Entity| -> Vec<String> {
        let mut row = vec![
            interval.clone(),
            kind.to_owned(),
            tid,
            pid,
            comm.to_owned(),
            String::new(),
        ];
        row.extend(
            report
                .counter_names
                .iter()
                .map(|name| entity.counters.get(name).copied().unwrap_or(0).to_string()),
        );
        row.extend(metric_names.iter().map(|name| {
            entity
                .metrics
                .get(*name)
                .copied()
                .flatten()
                .map(|value| value.to_string())
                .unwrap_or_default()
        }));
        row
    };
    write_row(
        out,
        &row("total", String::new(), String::new(), "", &report.totals),
    )?;
    write_row(
        out,
        &row("idle", String::new(), String::new(), "", &report.idle),
    )?;
    write_row(
        out,
        &row(
            "untracked",
            String::new(),
            String::new(),
            "",
            &report.untracked,
        ),
    )?;
    write_row(
        out,
        &row("dropped", String::new(), String::new(), "", &report.dropped),
    )?;
    if by.contains(&By::Task) {
        for task in &report.tasks {
            write_row(
                out,
                &row(
                    "task",
                    task.tid.to_string(),
                    task.tgid.to_string(),
                    &task.comm,
                    &task.entity,
                ),
            )?;
        }
    }
    if by.contains(&By::Process) {
        for process in &report.processes {
            write_row(
                out,
                &row(
                    "process",
                    String::new(),
                    process.pid.to_string(),
                    &process.comm,
                    &process.entity,
                ),
            )?;
        }
    }
    if by.contains(&By::Function) {
        for function in &report.functions {
            let pid = function.pid.map(|pid| pid.to_string()).unwrap_or_default();
            for (kind, entity) in [
                ("function", &function.inclusive),
                ("function-exclusive", &function.exclusive),
            ] {
                write_row(
                    out,
                    &row(kind, String::new(), pid.clone(), &function.symbol, entity),
                )?;
            }
        }
    }
    if by.contains(&By::Cgroup) {
        for cgroup in &report.cgroups {
            let mut cells = row("cgroup", String::new(), String::new(), "", &cgroup.entity);
            cells[5] = cgroup.path.clone().unwrap_or_default();
            cells[4] = cgroup
                .container
                .as_ref()
                .map(|info| info.label())
                .unwrap_or_default();
            write_row(out, &cells)?;
        }
    }
    Ok(())
}

fn write_row(out: &mut dyn std::io::Write, cells: &[String]) -> Result<()> {
    let line: Vec<String> = cells.iter().map(|cell| quote(cell)).collect();
    writeln!(out, "{}", line.join(",")).context("writing CSV")
}

/// Quotes a cell that holds a comma, quote or line break, doubling inner quotes.
fn quote(cell: &str) -> String {
    if cell.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", cell.replace('"', "\"\""))
    } else {
        cell.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_quoted_per_rfc_4180() {
        assert_eq!(quote("plain"), "plain");
        assert_eq!(quote("a,b"), "\"a,b\"");
        assert_eq!(quote("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
