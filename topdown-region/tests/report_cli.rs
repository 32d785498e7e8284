//! The region report through the real `topdown report -i` (TOPDOWN_BIN, as for topdown's
//! integration tests): the JSON the library writes is topdown's schema, and the tool renders
//! the regions as functions with target "region". Synthetic counters (root: tracepoints).

use std::process::Command;

fn getppid(times: u32) {
    for _ in 0..times {
        // SAFETY: no preconditions.
        unsafe { libc::getppid() };
    }
}

#[test]
fn topdown_report_renders_the_regions() {
    if !topdown_tests::privileged() {
        return;
    }
    topdown_region::init(topdown_region::Config {
        model: "synthetic:intel-icl".into(),
        ..Default::default()
    })
    .expect("init");
    let tid = std::thread::spawn(|| {
        let _outer = topdown_region::region("parse");
        getppid(1234);
        {
            let _inner = topdown_region::region("lookup");
            getppid(766);
        }
        topdown_region::regions::current_tid()
    })
    .join()
    .expect("worker");
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("region.json");
    topdown_region::report::write_json(&topdown_region::snapshot(), &path).expect("write");

    // `topdown report -i` on the JSON with `options`: its standard output.
    let report_i = |options: [&str; 2]| -> Vec<u8> {
        let output = Command::new(topdown_tests::topdown_bin())
            .args(["report", "-i"])
            .arg(&path)
            .args(options)
            .output()
            .expect("running topdown report");
        assert!(
            output.status.success(),
            "topdown report -i {options:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output.stdout
    };

    // The JSON, read back and re-written by the tool: the counts survive, the metrics are
    // recomputed by topdown from the counters.
    let report: serde_json::Value =
        serde_json::from_slice(&report_i(["--format", "json"])).expect("JSON");
    let function = |symbol: &str| {
        report["functions"]
            .as_array()
            .expect("functions")
            .iter()
            .find(|f| f["symbol"] == symbol && f["pid"] == tid)
            .unwrap_or_else(|| panic!("no function {symbol} of thread {tid}"))
            .clone()
    };
    let parse = function("parse");
    let lookup = function("lookup");
    assert_eq!(parse["target"], "region");
    assert_eq!(parse["calls"], 1);
    assert_eq!(parse["inclusive"]["counters"]["slots"], 2000);
    assert_eq!(parse["exclusive"]["counters"]["slots"], 1234);
    assert_eq!(lookup["inclusive"]["counters"]["slots"], 766);
    assert_eq!(lookup["exclusive"]["counters"]["slots"], 766);
    assert_eq!(report["model"], "intel-icl");
    assert_eq!(report["synthetic"], true);
    let task = report["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .find(|task| task["tid"] == tid)
        .expect("the worker thread");
    assert_eq!(task["counters"]["slots"], 2000);

    // The table: one row per region and thread, with its calls and slots.
    let table = String::from_utf8_lossy(&report_i(["--by", "function"])).into_owned();
    let row = |symbol: &str| -> Vec<String> {
        table
            .lines()
            .map(|line| {
                line.split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .find(|words| {
                words.first().map(String::as_str) == Some(symbol)
                    && words.get(2) == Some(&tid.to_string())
            })
            .unwrap_or_else(|| panic!("no row for {symbol} in:\n{table}"))
    };
    // FUNCTION TARGET PID CALLS incl excl ...
    assert_eq!(
        &row("parse")[..6],
        ["parse", "region", &tid.to_string(), "1", "2000", "1234"]
    );
    assert_eq!(
        &row("lookup")[..6],
        ["lookup", "region", &tid.to_string(), "1", "766", "766"]
    );
    assert!(table.contains("SYNTHETIC COUNTERS"), "{table}");
    // The call tree: lookup inside parse.
    let tree: Vec<&str> = table
        .lines()
        .skip_while(|line| !line.starts_with("Call tree"))
        .skip(1)
        .collect();
    assert_eq!(
        tree,
        [
            format!("  parse [pid {tid}]  calls 1  2000"),
            format!("    lookup [pid {tid}]  calls 1  766"),
        ]
    );
}
