//! CSV output (RFC 4180, written by the `csv` crate, which refuses a row whose length differs
//! from the header's): one row per entity, every section under the same named columns.
//!
//! Columns: `interval,kind,tid,pid,comm,function,target,cgroup,container,calls,span,key,abandoned`,
//! then the
//! counters in the model's order, then the metrics, then the derived figures (`offcore_latency`).
//! A cell that does not apply to a row's kind is empty, as is a metric the model cannot compute.
//! With `-- CMD`, kind `command` is the command's own counts over its run and `before_command`
//! what was counted before it started (start-up, probe calibration), in no other row.

use anyhow::{Context as _, Result};

use super::{By, Entity, Report};
use crate::model::Name;

/// The identifying columns, before the counters and metrics.
pub const KEY_COLUMNS: [&str; 13] = [
    "interval",
    "kind",
    "tid",
    "pid",
    "comm",
    "function",
    "target",
    "cgroup",
    "container",
    "calls",
    "span",
    "key",
    "abandoned",
];

/// What identifies one row; `None` leaves the cell empty.
#[derive(Default)]
struct Key<'a> {
    tid: Option<u32>,
    pid: Option<u32>,
    comm: Option<&'a str>,
    function: Option<&'a str>,
    target: Option<&'a str>,
    cgroup: Option<&'a str>,
    container: Option<String>,
    calls: Option<u64>,
    span: Option<&'a str>,
    key: Option<&'a str>,
    abandoned: Option<u64>,
}

pub fn write_csv(report: &Report, by: &[By], out: &mut dyn std::io::Write) -> Result<()> {
    let mut writer = ::csv::Writer::from_writer(out);
    let metric_names: Vec<&Name> = report.totals.metrics.keys().collect();
    let header = KEY_COLUMNS
        .iter()
        .copied()
        .chain(report.counter_names.iter().map(String::as_str))
        .chain(metric_names.iter().map(|name| name.as_str()))
        .chain(report.derived.iter().map(|figure| figure.name.as_str()));
    writer.write_record(header).context("writing CSV")?;

    let interval = report
        .interval
        .as_ref()
        .map(|i| i.index.to_string())
        .unwrap_or_default();
    let number = |value: Option<u64>| value.map(|v| v.to_string()).unwrap_or_default();
    let mut row = |kind: &str, key: Key<'_>, entity: &Entity| -> Result<()> {
        let mut cells = vec![
            interval.clone(),
            kind.to_owned(),
            number(key.tid.map(u64::from)),
            number(key.pid.map(u64::from)),
            key.comm.unwrap_or_default().to_owned(),
            key.function.unwrap_or_default().to_owned(),
            key.target.unwrap_or_default().to_owned(),
            key.cgroup.unwrap_or_default().to_owned(),
            key.container.unwrap_or_default(),
            number(key.calls),
            key.span.unwrap_or_default().to_owned(),
            key.key.unwrap_or_default().to_owned(),
            number(key.abandoned),
        ];
        cells.extend(
            report
                .counter_names
                .iter()
                .map(|name| entity.count(name).to_string()),
        );
        // f64's Display is the shortest text that parses back to the same value, as JSON's is.
        cells.extend(metric_names.iter().map(|name| {
            entity
                .metrics
                .get(name)
                .copied()
                .flatten()
                .map(|value| value.to_string())
                .unwrap_or_default()
        }));
        cells.extend(report.derived.iter().map(|figure| {
            entity
                .derived
                .get(&figure.name)
                .map(|value| value.to_string())
                .unwrap_or_default()
        }));
        writer.write_record(&cells).context("writing CSV")
    };
    row("total", Key::default(), &report.totals)?;
    row("idle", Key::default(), &report.idle)?;
    row("untracked", Key::default(), &report.untracked)?;
    row("dropped", Key::default(), &report.dropped)?;
    if let Some(command) = &report.command {
        row("command", Key::default(), command)?;
    }
    if let Some(before) = &report.before_command {
        row("before_command", Key::default(), before)?;
    }
    if by.contains(&By::Task) {
        for task in &report.tasks {
            let key = Key {
                tid: Some(task.tid),
                pid: Some(task.tgid),
                comm: Some(&task.comm),
                ..Key::default()
            };
            row("task", key, &task.entity)?;
        }
    }
    if by.contains(&By::Process) {
        for process in &report.processes {
            let key = Key {
                pid: Some(process.pid),
                comm: Some(&process.comm),
                ..Key::default()
            };
            row("process", key, &process.entity)?;
        }
    }
    if by.contains(&By::Function) {
        for function in &report.functions {
            for (kind, entity) in [
                ("function", &function.inclusive),
                ("function-exclusive", &function.exclusive),
            ] {
                let key = Key {
                    pid: function.pid,
                    function: Some(&function.symbol),
                    target: Some(&function.target),
                    calls: Some(function.calls),
                    ..Key::default()
                };
                row(kind, key, entity)?;
            }
        }
    }
    if by.contains(&By::Span) {
        for span in &report.spans {
            let key = Key {
                span: Some(&span.kind),
                key: Some(&span.key),
                calls: Some(span.calls),
                abandoned: Some(span.abandoned),
                ..Key::default()
            };
            row("span", key, &span.entity)?;
        }
    }
    for probe in &report.usdt {
        let key = Key {
            function: Some(&probe.probe),
            target: Some(&probe.target),
            calls: Some(probe.hits),
            ..Key::default()
        };
        row("usdt", key, &Entity::default())?;
    }
    if by.contains(&By::Cgroup) {
        for cgroup in &report.cgroups {
            let key = Key {
                cgroup: cgroup.path.as_deref(),
                container: cgroup.container.as_ref().map(|info| info.label()),
                ..Key::default()
            };
            row("cgroup", key, &cgroup.entity)?;
        }
    }
    writer.flush().context("writing CSV")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::full_report;

    fn parse(text: &str) -> (Vec<String>, Vec<::csv::StringRecord>) {
        let mut reader = ::csv::Reader::from_reader(text.as_bytes());
        let header = reader
            .headers()
            .unwrap()
            .iter()
            .map(str::to_owned)
            .collect();
        let rows = reader.records().map(Result::unwrap).collect();
        (header, rows)
    }

    /// Checks a row's counters and metrics against the entity, by column name.
    fn check_entity(header: &[String], row: &::csv::StringRecord, entity: &Entity) {
        assert_eq!(row.len(), header.len());
        for (name, value) in &entity.counters {
            let column = header.iter().position(|h| h == name).unwrap();
            assert_eq!(row[column].parse::<u64>().unwrap(), *value, "{name}");
        }
        for (name, value) in &entity.metrics {
            let column = header.iter().position(|h| h == name).unwrap();
            match value {
                Some(value) => assert_eq!(row[column].parse::<f64>().unwrap(), *value, "{name}"),
                None => assert_eq!(&row[column], "", "{name}"),
            }
        }
    }

    #[test]
    fn every_row_is_as_long_as_the_header_and_round_trips() {
        let report = full_report(2);
        let mut out = Vec::new();
        write_csv(
            &report,
            &[By::Task, By::Process, By::Function, By::Cgroup],
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        let (header, rows) = parse(&text);
        let column = |name: &str| header.iter().position(|h| h == name).unwrap();
        assert_eq!(
            &header[..KEY_COLUMNS.len()],
            &KEY_COLUMNS.map(str::to_owned)
        );
        assert_eq!(
            header.len(),
            KEY_COLUMNS.len() + report.counter_names.len() + report.totals.metrics.len()
        );
        // 6 fixed rows (with `-- CMD`'s command and before_command), 2 tasks, 1 process,
        // 2 functions x 2, 1 cgroup.
        assert_eq!(rows.len(), 14);
        let kinds: Vec<&str> = rows.iter().map(|row| &row[column("kind")]).collect();
        assert_eq!(
            kinds,
            [
                "total",
                "idle",
                "untracked",
                "dropped",
                "command",
                "before_command",
                "task",
                "task",
                "process",
                "function",
                "function-exclusive",
                "function",
                "function-exclusive",
                "cgroup"
            ]
        );
        let command = report.command.as_ref().unwrap();
        let before_command = report.before_command.as_ref().unwrap();
        for (row, entity) in rows[..6].iter().zip([
            &report.totals,
            &report.idle,
            &report.untracked,
            &report.dropped,
            command,
            before_command,
        ]) {
            check_entity(&header, row, entity);
        }
        for (row, task) in rows[6..8].iter().zip(&report.tasks) {
            assert_eq!(row[column("tid")].parse::<u32>().unwrap(), task.tid);
            assert_eq!(row[column("pid")].parse::<u32>().unwrap(), task.tgid);
            assert_eq!(&row[column("comm")], task.comm);
            assert_eq!(&row[column("function")], "");
            check_entity(&header, row, &task.entity);
        }
        let process = &rows[8];
        assert_eq!(&process[column("tid")], "");
        assert_eq!(
            process[column("pid")].parse::<u32>().unwrap(),
            report.processes[0].pid
        );
        assert_eq!(&process[column("comm")], report.processes[0].comm);
        check_entity(&header, process, &report.processes[0].entity);
        for (pair, function) in rows[9..13].chunks(2).zip(&report.functions) {
            for row in pair {
                assert_eq!(&row[column("function")], function.symbol);
                assert_eq!(&row[column("target")], function.target);
                assert_eq!(row[column("calls")].parse::<u64>().unwrap(), function.calls);
                assert_eq!(
                    &row[column("pid")],
                    function.pid.map(|p| p.to_string()).unwrap_or_default()
                );
                assert_eq!(&row[column("comm")], "");
            }
            check_entity(&header, &pair[0], &function.inclusive);
            check_entity(&header, &pair[1], &function.exclusive);
        }
        let cgroup = &rows[13];
        assert_eq!(&cgroup[column("cgroup")], "/system.slice/a, \"b\".service");
        assert_eq!(&cgroup[column("container")], "docker:0123456789ab");
        assert_eq!(&cgroup[column("comm")], "");
        check_entity(&header, cgroup, &report.cgroups[0].entity);
    }
}
