//! `topdown diff` end to end, as root, with synthetic counters: tests/workloads/regress.c is
//! recorded with its parse_request doing 100 and then 200 slots per call (exact: each slot is
//! one getppid), and diff must exit 0 on two runs of the same work, 1 naming parse_request and
//! its +100% when its cost per call doubles, 2 on bad input.

use std::{
    path::{Path, PathBuf},
    process::Output,
    sync::OnceLock,
};

use serde_json::Value;
use topdown_tests::*;

fn temp(name: &str) -> PathBuf {
    scratch_dir("diff").join(name)
}

fn workload() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build_c_workload(env!("CARGO_TARGET_TMPDIR"), "regress.c", "regress"))
}

/// Records `regress 20 PARSE_SLOTS` as JSON at level 2 and returns the file.
fn record(name: &str, parse_slots: u32) -> PathBuf {
    let out = temp(name);
    let mut command = synthetic_stat_to(&out);
    command.args(["-l", "2"]).args(probes(
        workload(),
        &["handle_request", "parse_request", "lookup_key"],
    ));
    command
        .arg("--")
        .arg(workload())
        .args(["20", &parse_slots.to_string()]);
    run_ok(&mut command).unwrap();
    out
}

/// Three runs at 100 slots per parse and two at 200, recorded once for every test here;
/// `None` where the test cannot load BPF (what every test here starts with: the recordings
/// need it, even where the diff itself does not).
fn recordings() -> Option<&'static (Vec<PathBuf>, Vec<PathBuf>)> {
    static RECORDED: OnceLock<(Vec<PathBuf>, Vec<PathBuf>)> = OnceLock::new();
    if !privileged() {
        return None;
    }
    Some(RECORDED.get_or_init(|| {
        let _serial = serial();
        let same = (1..=3)
            .map(|n| record(&format!("same{n}.json"), 100))
            .collect();
        let doubled = (1..=2)
            .map(|n| record(&format!("doubled{n}.json"), 200))
            .collect();
        (same, doubled)
    }))
}

/// Runs `topdown diff EXTRA FILES` and checks that it exits with `code` (the message shows
/// what it printed).
fn diff(files: &[&Path], extra: &[&str], code: i32) -> Output {
    let output = topdown()
        .arg("diff")
        .args(extra)
        .args(files)
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(code),
        "{files:?} {extra:?}: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    output
}

/// [`diff`]'s stdout.
fn diff_stdout(files: &[&Path], extra: &[&str], code: i32) -> String {
    text(&diff(files, extra, code).stdout)
}

/// [`diff`] with `--format json`: the comparison.
fn diff_json(files: &[&Path], extra: &[&str], code: i32) -> Value {
    let extra = [extra, &["--format", "json"]].concat();
    serde_json::from_slice(&diff(files, &extra, code).stdout).unwrap()
}

/// A copy of the recording `from` with `edit` made, written to `name`.
fn edited_copy(from: &Path, name: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let mut report = read_report(from);
    edit(&mut report);
    let path = temp(name);
    std::fs::write(&path, report.to_string()).unwrap();
    path
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn change<'a>(comparison: &'a Value, kind: &str, name: &str) -> &'a Value {
    comparison["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|change| change["kind"] == kind && change["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {comparison:#}"))
}

#[test]
fn same_work_twice_exits_0() {
    let Some((same, _)) = recordings() else {
        return;
    };
    let stdout = diff_stdout(&[&same[0], &same[1]], &[], 0);
    assert!(stdout.contains("no regression beyond 5%"), "{stdout}");
    assert!(
        stdout.contains("parse_request (regress)") && stdout.contains("100 -> 100"),
        "{stdout}"
    );

    let comparison = diff_json(&[&same[0], &same[1]], &[], 0);
    let changes = comparison["changes"].as_array().unwrap();
    // 3 functions, 3 edges and the process, each exactly unchanged.
    assert_eq!(changes.len(), 7, "{comparison:#}");
    for change in changes {
        assert_eq!(change["verdict"], "within_threshold", "{change:#}");
        assert_eq!(change["change_pct"], 0.0, "{change:#}");
        for shift in change["shifts"].as_object().unwrap().values() {
            assert_eq!(shift["shift_pp"], 0.0, "{change:#}");
        }
    }
}

#[test]
fn doubled_work_per_call_exits_1_naming_the_function() {
    let Some((same, doubled)) = recordings() else {
        return;
    };
    let stdout = diff_stdout(&[&same[0], &doubled[0]], &[], 1);
    assert!(
        stdout.contains(
            "REGRESSED function parse_request (regress): slots/call 100 -> 200 (+100.0%)"
        ),
        "{stdout}"
    );
    // handle_request: 10 own + 100 parse + 50 lookup slots per call, then 10 + 200 + 50;
    // its own work is unchanged.
    assert!(
        stdout.contains(
            "REGRESSED function handle_request (regress): slots/call 160 -> 260 (+62.5%)"
        ),
        "{stdout}"
    );
    assert!(
        !stdout.contains("REGRESSED function lookup_key"),
        "{stdout}"
    );

    let output = diff(&[&same[0], &doubled[0]], &["--format", "json"], 1);
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("topdown diff: REGRESSED function parse_request (regress)"),
        "{stderr}"
    );
    let comparison: Value = serde_json::from_slice(&output.stdout).unwrap();
    let parse = change(&comparison, "function", "parse_request (regress)");
    assert_eq!(parse["verdict"], "regressed");
    assert_eq!(parse["change_pct"], 100.0);
    assert_eq!(parse["exclusive_change_pct"], 100.0);
    assert_eq!(parse["base"]["cost"], 100.0);
    assert_eq!(parse["new"]["cost"], 200.0);
    assert_eq!(parse["base"]["calls_per_run"], 20.0);
    let handle = change(&comparison, "function", "handle_request (regress)");
    assert_eq!(handle["exclusive_change_pct"], 0.0);
    // handle_request's mix: parse_request is all backend bound (getresuid), lookup_key all
    // retiring (getpgid). intel-icl's level 1 is each topdown metric over their sum (perf
    // metrics), so backend goes from 100 of 150 to 200 of 250.
    let backend = &handle["shifts"]["backend_bound"];
    let expected = 100.0 * 200.0 / 250.0 - 100.0 * 100.0 / 150.0;
    assert!(
        (backend["shift_pp"].as_f64().unwrap() - expected).abs() < 1e-9,
        "{backend}"
    );
    let lookup = change(&comparison, "edge", "handle_request -> lookup_key");
    assert_eq!(lookup["verdict"], "within_threshold");
    assert_eq!(lookup["change_pct"], 0.0);

    // A threshold above the change lets it pass; --kinds narrows the gate.
    diff(&[&same[0], &doubled[0]], &["--threshold", "150"], 0);
    let comparison = diff_json(&[&same[0], &doubled[0]], &["--kinds", "function"], 1);
    assert!(
        comparison["changes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|change| change["kind"] == "function")
    );
}

#[test]
fn several_runs_per_side_are_tested() {
    let Some((same, doubled)) = recordings() else {
        return;
    };
    // Exact synthetic counts: no scatter, so the doubling is certain (p = 0).
    let output = topdown()
        .args(["diff", "--format", "json"])
        .args(&same[..2])
        .arg("--")
        .args(doubled)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let comparison: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(comparison["method"].as_str().unwrap().contains("Welch"));
    let parse = change(&comparison, "function", "parse_request (regress)");
    assert_eq!(parse["verdict"], "regressed");
    assert_eq!(parse["test"]["p_value"], 0.0);
    assert_eq!(parse["base"]["runs"], 2);
    assert_eq!(parse["new"]["runs"], 2);

    let output = topdown()
        .arg("diff")
        .args(&same[..2])
        .arg("--")
        .args(&same[2..])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "1 run against 2 is refused");
    let stderr = text(&output.stderr);
    assert!(stderr.contains("at least two on each"), "{stderr}");

    // Scatter: parse_request's slots per call edited to {100, 140} in BASE and {110, 150} in
    // NEW: the mean grew 8.3%, beyond 5%, but the runs overlap (Welch: t = 0.354, p = 0.757).
    let edited = |from: &Path, name: &str, slots_per_call: u64| -> PathBuf {
        edited_copy(from, name, |report| {
            for function in report["functions"].as_array_mut().unwrap() {
                if function["symbol"] == "parse_request" {
                    function["inclusive"]["counters"]["slots"] = (slots_per_call * 20).into();
                }
            }
        })
    };
    let base = [
        edited(&same[0], "scatter-b1.json", 100),
        edited(&same[1], "scatter-b2.json", 140),
    ];
    let new = [
        edited(&same[0], "scatter-n1.json", 110),
        edited(&same[1], "scatter-n2.json", 150),
    ];
    let output = topdown()
        .args(["diff", "--kinds", "function", "--format", "json"])
        .args(&base)
        .arg("--")
        .args(&new)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let comparison: Value = serde_json::from_slice(&output.stdout).unwrap();
    let parse = change(&comparison, "function", "parse_request (regress)");
    assert_eq!(parse["verdict"], "not_significant", "{parse:#}");
    let p = parse["test"]["p_value"].as_f64().unwrap();
    // scipy: stats.ttest_ind([110, 150], [100, 140], equal_var=False).pvalue
    assert!((p - 0.7574643749636668).abs() < 1e-9, "{p}");
    let change_pct = parse["change_pct"].as_f64().unwrap();
    assert!((change_pct - 100.0 * 10.0 / 120.0).abs() < 1e-9);
}

#[test]
fn spans_are_compared_when_present() {
    let Some((same, _)) = recordings() else {
        return;
    };
    // A spans[] entry as issue 23's --span/--postgres write it, added by hand.
    let with_span = |name: &str, slots: u64| -> PathBuf {
        edited_copy(&same[0], name, |report| {
            report["spans"] = serde_json::json!([{
                "kind": "postgres",
                "key": "SELECT 1",
                "calls": 10,
                "abandoned": 0,
                "counters": {"slots": slots},
                "metrics": {},
                "some_future_field": [1, 2]
            }]);
        })
    };
    let base = with_span("span-base.json", 1000);
    let new = with_span("span-new.json", 1500);
    let stdout = diff_stdout(&[&base, &new], &["--kinds", "span"], 1);
    assert!(
        stdout.contains("REGRESSED span postgres: SELECT 1: slots/call 100 -> 150 (+50.0%)"),
        "{stdout}"
    );
    // A file without spans compares them as absent: removed, not a regression.
    let comparison = diff_json(&[&base, &same[1]], &["--kinds", "span"], 0);
    assert_eq!(
        change(&comparison, "span", "postgres: SELECT 1")["verdict"],
        "removed"
    );
}

#[test]
fn differential_svg_colours_the_grown_edge_red() {
    let Some((same, doubled)) = recordings() else {
        return;
    };
    let svg = diff_stdout(&[&same[0], &doubled[0]], &["--format", "svg"], 1);
    let document = roxmltree::Document::parse(&svg).unwrap();
    let frame = |symbol: &str| {
        let group = document
            .descendants()
            .find(|node| {
                node.attribute("class") == Some("frame")
                    && node.attribute("data-symbol") == Some(symbol)
            })
            .unwrap_or_else(|| panic!("no frame {symbol}"));
        let rect = group.children().find(|n| n.has_tag_name("rect")).unwrap();
        (
            group.attribute("data-change").unwrap().to_owned(),
            rect.attribute("fill").unwrap().to_owned(),
            rect.attribute("width").unwrap().parse::<f64>().unwrap(),
        )
    };
    let (change, fill, parse_width) = frame("parse_request");
    assert_eq!(change, "100.000");
    assert_eq!(fill, "#ff1414", "+100% is full red");
    let (change, fill, lookup_width) = frame("lookup_key");
    assert_eq!(change, "0.000");
    assert_eq!(fill, "#eeeeee");
    let (_, fill, handle_width) = frame("handle_request");
    assert!(fill.starts_with("#ff"), "{fill}");
    // Widths are NEW's inclusive slots: 4000 and 1000 of handle_request's 5200.
    assert!((parse_width / handle_width - 4000.0 / 5200.0).abs() < 1e-3);
    assert!((lookup_width / handle_width - 1000.0 / 5200.0).abs() < 1e-3);
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let Some((same, _)) = recordings() else {
        return;
    };
    let missing = temp("missing.json");
    let not_topdown = temp("not-topdown.json");
    std::fs::write(&not_topdown, "{\"hello\": 1}\n").unwrap();
    let other_model_path = edited_copy(&same[0], "other-model.json", |report| {
        report["model"] = "intel-spr".into();
    });
    let other_weight_path = edited_copy(&same[0], "other-weight.json", |report| {
        report["weight_counter"] = "cycles".into();
    });
    let other_counters_path = edited_copy(&same[0], "other-counters.json", |report| {
        report["synthetic"] = false.into();
    });

    for (files, expected) in [
        (vec![&same[0], &missing], "cannot read"),
        (vec![&not_topdown, &same[0]], "not a topdown JSON result"),
        (
            vec![&same[0], &other_model_path],
            "recorded with model intel-icl",
        ),
        (vec![&same[0], &other_weight_path], "weighs by slots"),
        (
            vec![&same[0], &other_counters_path],
            "counted with synthetic counters",
        ),
        (vec![&same[0]], "topdown diff takes BASE NEW"),
    ] {
        let output = topdown().arg("diff").args(&files).output().unwrap();
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{files:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(expected), "{expected}: {stderr}");
    }
    diff(&[&same[0], &same[1]], &["--threshold", "-3"], 2);
}
