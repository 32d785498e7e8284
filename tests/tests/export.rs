//! `--format pprof` and `--format folded` end to end, as root, with synthetic counters, read by
//! their real consumers: `go tool pprof` (Debian's golang-go, installed by `cargo xtask setup`)
//! and inferno's flame graph (the Rust port of flamegraph.pl), against the JSON of the same
//! recording and the workload's exact counts (tests/workloads/regress.c: per request,
//! handle_request makes 10 getppid, parse_request PARSE_SLOTS getppid and as many getresuid,
//! lookup_key 50 getppid and 50 getpgid; getppid counts `slots`).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use serde_json::Value;
use topdown_tests::*;

const FUNCTIONS: [&str; 3] = ["handle_request", "parse_request", "lookup_key"];

fn temp(name: &str) -> PathBuf {
    scratch_dir("export").join(name)
}

fn workload() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        build_c_workload(env!("CARGO_TARGET_TMPDIR"), "regress.c", "regress-export")
    })
}

/// `topdown stat --pmu synthetic:intel-icl -l 2 ARGS -- regress 20 100`.
fn stat(args: &[&str], probed: bool) {
    let _serial = serial();
    let mut command = topdown();
    command
        .args(["stat", "--pmu", "synthetic:intel-icl", "-l", "2"])
        .args(args);
    if probed {
        command.args(probes(workload(), &FUNCTIONS));
    }
    command.arg("--").arg(workload()).args(["20", "100"]);
    run_ok(&mut command).unwrap();
}

/// A `-u` recording as JSON, made once.
fn recording() -> &'static Path {
    static RECORDED: OnceLock<PathBuf> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let out = temp("probed.json");
        stat(&["--format", "json", "-o", out.to_str().unwrap()], true);
        out
    })
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `topdown report -i FILE ARGS` into a file.
fn report(input: &Path, args: &[&str], out: &Path) {
    run_ok(
        topdown()
            .args(["report", "-i"])
            .arg(input)
            .args(args)
            .arg("-o")
            .arg(out),
    )
    .unwrap();
}

/// The go toolchain's pprof; its absence fails the test (setup installs it).
fn go() -> PathBuf {
    ["/usr/bin/go", "/usr/lib/go/bin/go"]
        .iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
        .expect("go tool pprof is needed: `cargo xtask setup` installs Debian's golang-go")
}

fn pprof(args: &[&str], profile: &Path) -> String {
    let output = Command::new(go())
        .args(["tool", "pprof"])
        .args(args)
        .arg(profile)
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "go tool pprof {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// `go tool pprof -raw`: the sample types and each type's total over the samples.
fn raw_totals(profile: &Path) -> BTreeMap<String, i64> {
    let raw = pprof(&["-raw"], profile);
    let mut lines = raw.lines().skip_while(|line| *line != "Samples:").skip(1);
    let types: Vec<String> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .map(|column| column.split('/').next().unwrap().to_owned())
        .collect();
    let mut totals: BTreeMap<String, i64> = types.iter().map(|t| (t.clone(), 0)).collect();
    let mut samples = 0;
    for line in lines.take_while(|line| !line.starts_with("Locations")) {
        // Sample lines are `VALUES...: LOCATION IDS`; label lines are `key:[value]`.
        let Some((values, _)) = line.split_once(": ") else {
            continue;
        };
        if values.contains('[') {
            continue;
        }
        samples += 1;
        for (name, value) in types.iter().zip(values.split_whitespace()) {
            *totals.get_mut(name).unwrap() += value.parse::<i64>().unwrap();
        }
    }
    assert!(samples > 0, "{raw}");
    totals
}

fn slots(entity: &Value) -> i64 {
    entity["counters"]["slots"].as_i64().unwrap()
}

/// Each sample type's total equals the JSON: calls and exclusive slots summed over the
/// functions, each category's fraction of each function's exclusive slots; `-top` gives each
/// function's exclusive slots as flat and its inclusive slots as cum.
#[test]
fn go_pprof_reads_the_profile_and_its_totals_equal_the_json() {
    if !privileged() {
        return;
    }
    let json = read_json(recording());
    let profile = temp("probed.pb.gz");
    report(recording(), &["--format", "pprof"], &profile);
    let totals = raw_totals(&profile);
    let functions = json["functions"].as_array().unwrap();
    let calls: i64 = functions.iter().map(|f| f["calls"].as_i64().unwrap()).sum();
    assert_eq!(totals["calls"], calls);
    assert_eq!(calls, 60, "20 calls of each function");
    let exclusive: i64 = functions.iter().map(|f| slots(&f["exclusive"])).sum();
    assert_eq!(totals["slots"], exclusive);
    assert_eq!(
        exclusive,
        20 * (10 + 100 + 50),
        "the workload's exact slots"
    );
    for (category, total) in &totals {
        if category == "calls" || category == "slots" {
            continue;
        }
        let expected: i64 = functions
            .iter()
            .map(|f| {
                let fraction = f["exclusive"]["metrics"][category].as_f64().unwrap_or(0.0);
                (fraction * slots(&f["exclusive"]) as f64).round() as i64
            })
            .sum();
        assert_eq!(*total, expected, "{category}");
    }
    assert_eq!(
        totals["backend_bound"],
        20 * 100,
        "parse_request's getresuid"
    );
    assert_eq!(totals["retiring"], 20 * 50, "lookup_key's getpgid");

    let top = pprof(&["-top", "-sample_index=slots"], &profile);
    for function in functions {
        let symbol = function["symbol"].as_str().unwrap();
        let row: Vec<&str> = top
            .lines()
            .find(|line| line.split_whitespace().last() == Some(symbol))
            .unwrap_or_else(|| panic!("{symbol} not in {top}"))
            .split_whitespace()
            .collect();
        assert_eq!(
            row[0].parse::<i64>().unwrap(),
            slots(&function["exclusive"]),
            "{symbol} flat: {top}"
        );
        assert_eq!(
            row[3].parse::<i64>().unwrap(),
            slots(&function["inclusive"]),
            "{symbol} cum: {top}"
        );
    }
    // The functions of a `-- CMD` run are the command's: every sample carries its pid and
    // comm as labels (`-tags` lists each label's values with their share of the total).
    let pid = functions[0]["pid"]
        .as_u64()
        .expect("functions of a command carry its pid");
    let tags = pprof(&["-tags"], &profile);
    let tag_lines: Vec<&str> = tags.lines().map(str::trim).collect();
    assert!(tag_lines.contains(&"comm: Total 3200.0"), "{tags}");
    assert!(
        tag_lines.contains(&"3200.0 (  100%): regress-export"),
        "{tags}"
    );
    assert!(
        tag_lines.contains(&format!("3200.0 (  100%): {pid}").as_str()),
        "{tags}"
    );
}

/// `stat --format pprof` writes the profile itself; without `-u` the stacks are the tasks
/// (process, then thread), and their totals are the tasks' slots.
#[test]
fn stat_writes_pprof_and_tasks_become_stacks() {
    if !privileged() {
        return;
    }
    let profile = temp("stat.pb.gz");
    stat(
        &["--format", "pprof", "-o", profile.to_str().unwrap()],
        true,
    );
    let totals = raw_totals(&profile);
    assert_eq!(totals["calls"], 60);
    assert_eq!(totals["slots"], 20 * 160);

    let tasks_json = temp("tasks.json");
    stat(
        &["--format", "json", "-o", tasks_json.to_str().unwrap()],
        false,
    );
    let json = read_json(&tasks_json);
    let tasks_profile = temp("tasks.pb.gz");
    report(
        &tasks_json,
        &["--format", "pprof", "--by", "task"],
        &tasks_profile,
    );
    let totals = raw_totals(&tasks_profile);
    let expected: i64 = json["tasks"].as_array().unwrap().iter().map(slots).sum();
    assert_eq!(totals["slots"], expected);
    assert_eq!(expected, 20 * 160, "the command's one thread");
    assert_eq!(totals["calls"], 0);
}

/// Folded stacks: one line per call path with its exclusive slots (or calls), exact, and
/// inferno draws a flame graph of them whose frames carry the inclusive counts.
#[test]
fn folded_stacks_are_exact_and_inferno_draws_them() {
    if !privileged() {
        return;
    }
    let folded = temp("probed.folded");
    report(recording(), &["--format", "folded"], &folded);
    let text = std::fs::read_to_string(&folded).unwrap();
    let lines: BTreeMap<&str, u64> = text
        .lines()
        .map(|line| {
            let (stack, value) = line.rsplit_once(' ').unwrap();
            (stack, value.parse().unwrap())
        })
        .collect();
    assert_eq!(
        lines,
        BTreeMap::from([
            ("handle_request", 200),
            ("handle_request;lookup_key", 1000),
            ("handle_request;parse_request", 2000),
        ])
    );
    let calls = temp("probed-calls.folded");
    report(
        recording(),
        &["--format", "folded", "--weight", "calls"],
        &calls,
    );
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        "handle_request 20\nhandle_request;lookup_key 20\nhandle_request;parse_request 20\n"
    );

    let mut svg = Vec::new();
    let mut options = inferno::flamegraph::Options::default();
    inferno::flamegraph::from_lines(&mut options, text.lines(), &mut svg).unwrap();
    let svg = String::from_utf8(svg).unwrap();
    for title in [
        "handle_request (3,200 samples, 100.00%)",
        "parse_request (2,000 samples, 62.50%)",
        "lookup_key (1,000 samples, 31.25%)",
    ] {
        assert!(svg.contains(title), "{title} not in inferno's SVG");
    }
}
