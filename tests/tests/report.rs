//! `topdown report` and the output formats end to end: one recording rendered as CSV and as
//! JSON must agree on every value, and `-o FILE` must not lose FILE when topdown fails.

use serde_json::Value;
use topdown_tests::*;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_td-workload");

fn temp_path(name: &str) -> std::path::PathBuf {
    topdown_tests::temp_path(&format!("report-{name}"))
}

/// `Some(label)` as `ContainerInfo::label` writes it, from the JSON object.
fn container_label(container: &Value) -> String {
    let field = |name: &str| container[name].as_str();
    match (
        field("runtime"),
        field("id"),
        field("pod_uid"),
        field("unit"),
    ) {
        (Some(runtime), Some(id), _, _) => format!("{runtime}:{id}"),
        (_, _, Some(pod), _) => format!("pod:{pod}"),
        (_, _, _, Some(unit)) => unit.to_owned(),
        _ => String::new(),
    }
}

/// Parses CSV with the csv crate (which refuses rows of unequal length).
fn parse_csv(text: &[u8]) -> (Vec<String>, Vec<csv::StringRecord>) {
    let mut reader = csv::Reader::from_reader(text);
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_owned)
        .collect();
    let rows = reader
        .records()
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|err| panic!("{err}: {}", String::from_utf8_lossy(text)));
    (header, rows)
}

/// Checks every counter and metric cell of `row` against the JSON entity.
fn check_values(header: &[String], row: &csv::StringRecord, entity: &Value, report: &Value) {
    let cell = |name: &str| {
        let column = header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name} in {header:?}"));
        &row[column]
    };
    for name in report["counter_names"].as_array().unwrap() {
        let name = name.as_str().unwrap();
        assert_eq!(
            cell(name).parse::<u64>().unwrap(),
            counter(entity, name),
            "{name} of {row:?}"
        );
    }
    let metrics = report["totals"]["metrics"].as_object().unwrap();
    assert!(!metrics.is_empty());
    for name in metrics.keys() {
        match entity["metrics"][name].as_f64() {
            None => assert_eq!(cell(name), "", "{name} of {row:?}"),
            // serde_json reads floats to within an ULP of the shortest text both wrote.
            Some(value) => {
                let read: f64 = cell(name).parse().unwrap();
                assert!((read - value).abs() < 1e-12, "{name}: {read} vs {value}");
            }
        }
    }
}

fn report_of(input: &std::path::Path, format: &str, by: &str) -> Vec<u8> {
    run_ok(
        topdown()
            .args(["report", "-i"])
            .arg(input)
            .args(["--by", by, "--format", format]),
    )
    .unwrap()
    .stdout
}

#[test]
fn csv_and_json_of_one_recording_agree_on_every_value() {
    let Some(_serial) = bpf_serial() else { return };
    let by = "task,process,cgroup";
    let recording = temp_path("recording.json");
    let output = run_ok(
        topdown()
            .args(["stat", "--pmu", "synthetic:intel-icl", "--by", by])
            .args(["--format", "json", "-o"])
            .arg(&recording)
            .args([
                "--",
                WORKLOAD,
                "getppid=1234,getpgid=700,getsid=50,getpriority=100,getresuid=200,getresgid=3,times=2",
                "getppid=500",
            ]),
    )
    .unwrap();
    let threads = workload_threads(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(threads.len(), 2);

    let csv_text = report_of(&recording, "csv", by);
    let report = parse_json(&report_of(&recording, "json", by)).unwrap();
    let (header, rows) = parse_csv(&csv_text);
    let column = |name: &str| header.iter().position(|h| h == name).unwrap();
    assert_eq!(
        &header[..13],
        [
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
            "abandoned"
        ]
    );
    let counter_names = report["counter_names"].as_array().unwrap();
    let metric_count = report["totals"]["metrics"].as_object().unwrap().len();
    assert_eq!(header.len(), 13 + counter_names.len() + metric_count);

    let array = |key: &str| report[key].as_array().unwrap().clone();
    let (tasks, processes, cgroups) = (array("tasks"), array("processes"), array("cgroups"));
    assert!(!cgroups.is_empty());
    // total, idle, untracked, dropped, and for a command its run and what came before it.
    assert_eq!(
        rows.len(),
        6 + tasks.len() + processes.len() + cgroups.len()
    );
    let mut seen = (0, 0, 0);
    for row in &rows {
        let cell = |name: &str| row[column(name)].to_owned();
        assert_eq!(cell("interval"), "");
        assert_eq!(
            (cell("function"), cell("target"), cell("calls")),
            Default::default()
        );
        let entity = match cell("kind").as_str() {
            kind @ ("total" | "idle" | "untracked" | "dropped" | "command" | "before_command") => {
                let key = if kind == "total" { "totals" } else { kind };
                assert!(report[key].is_object(), "{kind}: {report}");
                assert_eq!((cell("tid"), cell("pid"), cell("comm")), Default::default());
                report[key].clone()
            }
            "task" => {
                seen.0 += 1;
                let tid: u64 = cell("tid").parse().unwrap();
                let task = task(&report, tid).unwrap().clone();
                assert_eq!(cell("pid").parse::<u64>().ok(), task["tgid"].as_u64());
                assert_eq!(Some(cell("comm").as_str()), task["comm"].as_str());
                assert_eq!((cell("cgroup"), cell("container")), Default::default());
                task
            }
            "process" => {
                seen.1 += 1;
                assert_eq!(cell("tid"), "");
                let pid: u64 = cell("pid").parse().unwrap();
                let process = process(&report, pid).unwrap().clone();
                assert_eq!(Some(cell("comm").as_str()), process["comm"].as_str());
                process
            }
            "cgroup" => {
                let cgroup = cgroups[seen.2].clone();
                seen.2 += 1;
                assert_eq!((cell("tid"), cell("pid"), cell("comm")), Default::default());
                assert_eq!(cell("cgroup"), cgroup["path"].as_str().unwrap_or(""));
                assert_eq!(cell("container"), container_label(&cgroup["container"]));
                cgroup
            }
            other => panic!("unexpected row kind {other}"),
        };
        check_values(&header, row, &entity, &report);
    }
    assert_eq!(seen, (tasks.len(), processes.len(), cgroups.len()));

    // The known truth, read by column name: thread A made 1234 getppid (slots) and 700
    // getpgid (topdown-retiring), thread B 500 getppid.
    let task_row = |tid: u64| {
        rows.iter()
            .find(|row| &row[column("kind")] == "task" && row[column("tid")] == tid.to_string())
            .unwrap()
    };
    let a = task_row(threads[0].2);
    let b = task_row(threads[1].2);
    assert_eq!(
        (
            &a[column("slots")],
            &a[column("topdown-retiring")],
            &a[column("topdown-bad-spec")],
            &a[column("INT_MISC.CLEARS_COUNT")]
        ),
        ("1234", "700", "50", "2")
    );
    assert_eq!(
        (&b[column("slots")], &b[column("topdown-retiring")]),
        ("500", "0")
    );

    // `stat --format csv` writes the same columns straight away.
    let direct = run_ok(
        topdown()
            .args(["stat", "--pmu", "synthetic:intel-icl", "--by", "task"])
            .args(["--format", "csv", "--", WORKLOAD, "getppid=321,getpgid=9"]),
    )
    .unwrap();
    let stdout = String::from_utf8_lossy(&direct.stdout);
    let csv_start = stdout.find("interval,kind,").unwrap();
    let (direct_header, direct_rows) = parse_csv(stdout[csv_start..].as_bytes());
    assert_eq!(direct_header, header);
    let slots = column("slots");
    let retiring = column("topdown-retiring");
    assert!(
        direct_rows.iter().any(|row| &row[column("kind")] == "task"
            && &row[slots] == "321"
            && &row[retiring] == "9"),
        "{stdout}"
    );

    // -o FILE writes what stdout gets.
    let out = temp_path("out.csv");
    run_ok(
        topdown()
            .args(["report", "-i"])
            .arg(&recording)
            .args(["--by", by, "--format", "csv", "-o"])
            .arg(&out),
    )
    .unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), csv_text);
    let _ = std::fs::remove_file(out);
    let _ = std::fs::remove_file(recording);
}

/// A typo must not cost the last result: `-o FILE` is replaced only by a complete report.
#[test]
fn a_failed_report_keeps_the_previous_output_file() {
    let dir = scratch_dir("report-keep");
    let out = dir.join("result.csv");
    std::fs::write(&out, "the last good result\n").unwrap();
    let bad_input = dir.join("no-such-recording.json");
    let stderr = usage_error(
        topdown()
            .args(["report", "-i"])
            .arg(&bad_input)
            .args(["--format", "csv", "-o"])
            .arg(&out),
    );
    assert!(stderr.contains("cannot read"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "the last good result\n"
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(left, ["result.csv"], "no temporary file left behind");
    let _ = std::fs::remove_dir_all(dir);
}
