//! `--format svg` end to end, as root, with synthetic counters: a C workload with nested probed
//! functions (tests/workloads/tree.c) is recorded once as JSON, and the SVG of the same
//! recording (and of `stat --format svg` itself) must draw every call-tree edge at exactly its
//! share of the width, in its dominant category's colour.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use serde_json::Value;
use topdown_tests::*;

/// Pixels the frames share (1200 wide, 10 margin each side), as `report/svg.rs` draws them.
const TREE_WIDTH: f64 = 1180.0;
const MARGIN: f64 = 10.0;

const FUNCTIONS: [&str; 7] = [
    "parse_json",
    "hash_key",
    "lookup",
    "dispatch",
    "handle_request",
    "render_page",
    "load_config",
];

fn workload() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("svg-workloads");
        build_c(
            &dir,
            "tree.c",
            "tree",
            &["-O0", "-g", "-fno-omit-frame-pointer"],
        )
    })
}

fn temp(name: &str) -> PathBuf {
    temp_path(&format!("svg-{name}"))
}

/// `topdown stat --pmu synthetic:intel-icl <args> -- tree 3`, written to `out`.
fn stat(args: &[String], out: &Path) {
    run_ok(
        topdown()
            .args(["stat", "--pmu", "synthetic:intel-icl", "-o"])
            .arg(out)
            .args(args)
            .arg("--")
            .arg(workload())
            .arg("3"),
    )
    .unwrap();
}

/// [`stat`] as `--format FORMAT` with every function of the tree probed.
fn stat_probed(format: &str, out: &Path) {
    let mut args = vec!["--format".to_owned(), format.to_owned()];
    args.extend(probes(workload(), &FUNCTIONS));
    stat(&args, out);
}

/// [`stat_probed`] as JSON to the scratch file `name`: the file and the report.
fn recorded(name: &str) -> (PathBuf, Value) {
    let json = temp(name);
    stat_probed("json", &json);
    let report = read_report(&json);
    (json, report)
}

#[derive(Debug)]
struct Frame {
    symbol: String,
    caller: Option<String>,
    x: f64,
    y: f64,
    width: f64,
    fill: String,
    title: String,
}

fn number(node: roxmltree::Node<'_, '_>, attribute: &str) -> f64 {
    node.attribute(attribute).unwrap().parse().unwrap()
}

/// Every `<g class="frame">` of the SVG, parsed as XML.
fn frames(svg: &str) -> Vec<Frame> {
    let document = roxmltree::Document::parse(svg).unwrap();
    let root = document.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(root.attribute("width"), Some("1200"));
    root.descendants()
        .filter(|node| node.attribute("class") == Some("frame"))
        .map(|group| {
            let rect = group
                .children()
                .find(|node| node.has_tag_name("rect"))
                .unwrap();
            let title = group
                .children()
                .find(|node| node.has_tag_name("title"))
                .unwrap();
            Frame {
                symbol: group.attribute("data-symbol").unwrap().to_owned(),
                caller: Some(group.attribute("data-caller").unwrap())
                    .filter(|caller| !caller.is_empty())
                    .map(str::to_owned),
                x: number(rect, "x"),
                y: number(rect, "y"),
                width: number(rect, "width"),
                fill: rect.attribute("fill").unwrap().to_owned(),
                title: title.text().unwrap_or_default().to_owned(),
            }
        })
        .collect()
}

fn frame<'a>(frames: &'a [Frame], caller: Option<&str>, symbol: &str) -> &'a Frame {
    frames
        .iter()
        .find(|frame| frame.symbol == symbol && frame.caller.as_deref() == caller)
        .unwrap_or_else(|| panic!("{caller:?} -> {symbol} not in {frames:#?}"))
}

fn edge_slots(report: &Value, caller: Option<&str>, callee: &str) -> u64 {
    let edge = report["call_tree"]
        .as_array()
        .unwrap()
        .iter()
        .find(|edge| edge["caller"].as_str() == caller && edge["callee"] == callee)
        .unwrap_or_else(|| panic!("{caller:?} -> {callee} not in {}", report["call_tree"]));
    counter(&edge["inclusive"], "slots")
}

/// (caller, callee, slots per the workload's source, colour of its dominant category).
const EDGES: [(Option<&str>, &str, u64, &str); 8] = [
    // 3 x (30 own + parse_json 100 + lookup 150 + 2 x hash_key 40 + dispatch 60); backend
    // 45 / 111 of the category slots.
    (None, "handle_request", 1260, "#fb8c00"),
    (None, "render_page", 240, "#7e57c2"),
    (None, "load_config", 220, "#43a047"),
    (Some("handle_request"), "lookup", 690, "#fb8c00"),
    (Some("handle_request"), "parse_json", 300, "#43a047"),
    (Some("handle_request"), "dispatch", 180, "#e53935"),
    (Some("lookup"), "hash_key", 240, "#43a047"),
    (Some("load_config"), "parse_json", 200, "#43a047"),
];

/// Checks every frame of a slots-weighted SVG against the recording's edges.
fn check_slot_widths(svg: &str, report: &Value) {
    let frames = frames(svg);
    assert_eq!(frames.len(), EDGES.len(), "{frames:#?}");
    let total: u64 = EDGES
        .iter()
        .filter(|(caller, ..)| caller.is_none())
        .map(|(_, callee, ..)| edge_slots(report, None, callee))
        .sum();
    assert_eq!(total, 1720);
    for (caller, callee, slots, colour) in EDGES {
        assert_eq!(
            edge_slots(report, caller, callee),
            slots,
            "{caller:?} -> {callee}"
        );
        let drawn = frame(&frames, caller, callee);
        let expected = TREE_WIDTH * slots as f64 / total as f64;
        assert!(
            (drawn.width - expected).abs() < 0.001,
            "{caller:?} -> {callee}: {} != {expected}",
            drawn.width
        );
        assert_eq!(drawn.fill, colour, "{caller:?} -> {callee}");
        assert!(
            drawn
                .title
                .contains(&format!("\ninclusive slots: {slots}\n")),
            "{}",
            drawn.title
        );
    }
    // Heaviest root leftmost; callees start under their caller and sit one row lower.
    let handle = frame(&frames, None, "handle_request");
    assert_eq!((handle.x, handle.y), (MARGIN, 72.0));
    let render = frame(&frames, None, "render_page");
    assert!((render.x - (MARGIN + TREE_WIDTH * 1260.0 / 1720.0)).abs() < 0.001);
    let lookup = frame(&frames, Some("handle_request"), "lookup");
    assert_eq!((lookup.x, lookup.y), (MARGIN, 90.0));
    let hash = frame(&frames, Some("lookup"), "hash_key");
    assert_eq!((hash.x, hash.y), (MARGIN, 108.0));
    assert!(hash.title.contains("\ncalls: 6\n"), "{}", hash.title);
    for metric in [
        "retiring",
        "bad_speculation",
        "frontend_bound",
        "backend_bound",
    ] {
        assert!(
            hash.title.contains(&format!("\n{metric}: ")),
            "{}",
            hash.title
        );
    }
}

#[test]
fn report_svg_draws_the_recorded_tree_to_scale() {
    let Some(_serial) = bpf_serial() else { return };
    let (json, report) = recorded("tree.json");

    let svg = temp("tree.svg");
    replay(&json, &["--format", "svg", "-o", path_str(&svg)]);
    check_slot_widths(&std::fs::read_to_string(&svg).unwrap(), &report);

    // --weight calls: a frame is its own calls plus its callees', so handle_request is
    // 3 + parse_json 3 + lookup 3 + hash_key 6 + dispatch 3 = 18 of 23 (load_config 1 + 2,
    // render_page 2).
    let frames = frames(&replay(&json, &["--format", "svg", "--weight", "calls"]));
    for (caller, callee, calls) in [
        (None, "handle_request", 18.0),
        (None, "load_config", 3.0),
        (None, "render_page", 2.0),
        (Some("handle_request"), "lookup", 9.0),
        (Some("lookup"), "hash_key", 6.0),
        (Some("load_config"), "parse_json", 2.0),
    ] {
        let drawn = frame(&frames, caller, callee);
        let expected = TREE_WIDTH * calls / 23.0;
        assert!(
            (drawn.width - expected).abs() < 0.001,
            "{caller:?} -> {callee}: {} != {expected}",
            drawn.width
        );
    }
    let _ = std::fs::remove_file(json);
    let _ = std::fs::remove_file(svg);
}

#[test]
fn stat_writes_svg_directly() {
    let Some(_serial) = bpf_serial() else { return };
    // The same run recorded as JSON too would be a second run; the synthetic counts are exact,
    // so the JSON of any run of the workload stands for this one.
    let (json, report) = recorded("direct.json");

    let svg = temp("direct.svg");
    stat_probed("svg", &svg);
    let text = std::fs::read_to_string(&svg).unwrap();
    check_slot_widths(&text, &report);
    let document = roxmltree::Document::parse(&text).unwrap();
    // The heading gives the command's run (its exact synthetic total), and the frames their
    // share of it.
    let command = report["command"]["counters"]["slots"].as_u64().unwrap();
    assert!(command > 0);
    let context = document
        .descendants()
        .find(|node| node.attribute("class") == Some("context"))
        .and_then(|node| node.text())
        .unwrap();
    assert!(context.contains("; the command's run: "), "{context}");
    assert!(
        context.contains(&format!(" s, {command} slots")),
        "{context}"
    );
    assert!(
        document
            .descendants()
            .filter(|node| node.has_tag_name("title"))
            .filter_map(|node| node.text())
            .any(|title| title.contains("% of the command's slots")),
        "{text}"
    );
    // Seven exclusive bars, one per probed function.
    let bars: Vec<&str> = document
        .descendants()
        .filter(|node| node.attribute("class") == Some("bar"))
        .map(|node| node.attribute("data-symbol").unwrap())
        .collect();
    assert_eq!(
        bars,
        [
            "parse_json",
            "lookup",
            "hash_key",
            "render_page",
            "dispatch",
            "handle_request",
            "load_config"
        ]
    );
    let _ = std::fs::remove_file(json);
    let _ = std::fs::remove_file(svg);
}

#[test]
fn svg_without_probed_functions_is_a_usage_error() {
    let Some(_serial) = bpf_serial() else { return };
    let expected = "topdown: error: --format svg draws the probed call tree or spans, and this report has neither: record with -u TARGET:FUNC, --span or --postgres\n";
    let json = temp("plain.json");
    stat(&["--format".to_owned(), "json".to_owned()], &json);
    let output = exits_with(
        topdown()
            .args(["report", "--format", "svg", "-i"])
            .arg(&json),
        2,
    );
    assert_eq!(String::from_utf8_lossy(&output.stderr), expected);
    assert!(output.stdout.is_empty());

    let svg = temp("plain.svg");
    let stderr = usage_error(
        topdown()
            .args([
                "stat",
                "--pmu",
                "synthetic:intel-icl",
                "--format",
                "svg",
                "-o",
            ])
            .arg(&svg)
            .arg("--")
            .arg(workload())
            .arg("1"),
    );
    // Refused before anything runs: the command is never started, nothing is counted.
    assert_eq!(
        stderr,
        "topdown: error: --format svg draws the probed call tree or spans: add -u TARGET:FUNC, --span or --postgres\n"
    );
    assert!(!svg.exists());
    let interval = usage_error(
        topdown()
            .args(["stat", "--format", "svg", "-I", "100", "-u"])
            .arg(format!("{}:main", workload().display()))
            .arg("--")
            .arg(workload())
            .arg("1"),
    );
    assert_eq!(
        interval,
        "topdown: error: --format svg draws one whole run: leave out -I\n"
    );
    let _ = std::fs::remove_file(json);
}
