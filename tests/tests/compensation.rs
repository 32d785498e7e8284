//! The function probes' own cost, calibrated at start and subtracted (`-u`, issue 10 part 4),
//! end to end as root: exactly nothing on synthetic counters (the probes make no syscalls),
//! and on the software model (`cpu-clock` ns) an empty function close to zero and known work
//! close to the same work run unprobed in the same run.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use serde_json::Value;
use topdown_tests::*;

struct Binaries {
    funcs: PathBuf,
    compensation: PathBuf,
}

/// Builds the workloads once per test binary.
fn binaries() -> &'static Binaries {
    static BUILT: OnceLock<Binaries> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("compensation-workloads");
        let build = |name: &str| build_c(&dir, &format!("{name}.c"), name, &PROBED_C_FLAGS);
        Binaries {
            funcs: build("funcs"),
            compensation: build("compensation"),
        }
    })
}

/// Runs `topdown stat --format json <args>` and returns the report and topdown's stderr.
fn stat(args: &[&str]) -> (Value, String) {
    let (report, output) = stat_report(args).unwrap();
    (report, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// [`stat`] with `options`, probing `binary`'s `symbol`, around `binary ARGS`.
fn stat_probing(options: &[&str], binary: &Path, symbol: &str, args: &[&str]) -> (Value, String) {
    let binary = path_str(binary);
    let probe = format!("{binary}:{symbol}");
    stat(&[options, &["-u", &probe, "--", binary], args].concat())
}

fn raw_function<'a>(report: &'a Value, symbol: &str) -> &'a Value {
    report["probe_compensation"]["raw_functions"]
        .as_array()
        .and_then(|functions| functions.iter().find(|f| f["symbol"] == symbol))
        .unwrap_or_else(|| panic!("no raw figures of {symbol} in {report}"))
}

fn cpu_clock(figures: &Value) -> f64 {
    figures["counters"]["cpu-clock"]
        .as_u64()
        .or_else(|| figures["cpu-clock"].as_u64())
        .unwrap_or_else(|| panic!("no cpu-clock in {figures}")) as f64
}

/// A run whose calibration failed reports raw figures and says why on stderr; on a loaded
/// machine that happened twice in ~60 runs beside a CPU hog (counter readings failing), so it
/// fails the attempt, with topdown's reason, not the test.
fn calibrated(report: &Value, stderr: &str) -> Result<(), String> {
    if report.get("probe_compensation").is_some() {
        Ok(())
    } else {
        Err(format!("not calibrated: {}", stderr.trim()))
    }
}

/// The one calibration of `mechanism` in the report.
fn cost<'a>(report: &'a Value, mechanism: &str) -> &'a Value {
    let costs: Vec<&Value> = report["probe_compensation"]["costs"]
        .as_array()
        .unwrap_or_else(|| panic!("no probe_compensation costs in {report}"))
        .iter()
        .filter(|cost| cost["mechanism"] == mechanism)
        .collect();
    assert_eq!(costs.len(), 1, "{mechanism} calibrations: {costs:?}");
    costs[0]
}

/// Synthetic counters count syscalls; neither the traps nor the BPF programs make any, so the
/// calibration must measure exactly 0 for every counter and both return mechanisms, and the
/// exact figures stay exact with the compensation on (the default).
#[test]
fn synthetic_counts_compensate_by_exactly_zero() {
    let Some(_serial) = bpf_serial() else { return };
    let c = path_str(&binaries().funcs);
    for (flag, mechanism) in [
        ("--returns=exit", "exit"),
        ("--returns=uretprobe", "uretprobe"),
    ] {
        let mut args = vec!["--pmu", "synthetic:intel-icl", flag];
        let leaf = format!("{c}:leaf");
        let mid = format!("{c}:mid");
        args.extend(["-u", &leaf, "-u", &mid, "--", c, "leafmid", "7", "10", "5"]);
        let (report, stderr) = stat(&args);
        let cost = cost(&report, mechanism);
        // 2,048 calls on a synthetic model (its cost can only be 0); a hit whose reading kept
        // racing with context switches may be dropped.
        let samples = cost["samples"].as_u64().unwrap();
        assert!((2_028..=2_048).contains(&samples), "{cost}");
        assert!(
            stderr.contains("subtracted from function figures"),
            "{stderr}"
        );
        // Calibrated after counting, so the command did not wait for it.
        let calibrated = &report["probe_compensation"]["calibrated"];
        assert_eq!(calibrated["at"], "end", "{report}");
        assert!(
            calibrated["duration_ms"].as_f64().unwrap() > 0.0,
            "{calibrated}"
        );
        let counting = stderr.find("topdown: counting").unwrap();
        let probe_cost = stderr.find("topdown: probe cost").unwrap();
        assert!(counting < probe_cost, "{stderr}");
        for table in ["per_call", "per_callee"] {
            let values = cost[table].as_object().unwrap();
            assert_eq!(
                values.len(),
                report["counter_names"].as_array().unwrap().len()
            );
            for (counter, value) in values {
                assert_eq!(value.as_f64(), Some(0.0), "{mechanism} {table} {counter}");
            }
        }
        assert_eq!(report["probe_compensation"]["clamped"], 0);
        // mid: 7 x leaf(10) + 5 getpgid; leaf(10) once more from main.
        let mid = function(&report, "mid");
        assert_eq!(mid["calls"], 1);
        assert_eq!(counter(&mid["inclusive"], "slots"), 70);
        assert_eq!(counter(&mid["inclusive"], "topdown-retiring"), 5);
        assert_eq!(counter(&mid["exclusive"], "slots"), 0);
        let leaf = function(&report, "leaf");
        assert_eq!(leaf["calls"], 8);
        assert_eq!(counter(&leaf["inclusive"], "slots"), 80);
        assert_eq!(counter(&leaf["exclusive"], "slots"), 80);
        // The raw figures are the same numbers.
        assert_eq!(raw_function(&report, "leaf")["inclusive"]["slots"], 80);
        assert_eq!(raw_function(&report, "mid")["inclusive"]["slots"], 70);
        // The calibration's own probes ran in a session of their own: not in the report.
        let symbols: Vec<&str> = report["functions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["symbol"].as_str())
            .collect();
        assert_eq!(symbols.len(), 2, "{symbols:?}");
        assert!(
            !report.to_string().contains("topdown_calibration"),
            "{report}"
        );
    }
}

/// With `-I`, every interval's report is compensated from the first on: the calibration runs
/// before counting starts, and each report says so.
#[test]
fn interval_reports_are_calibrated_before_counting() {
    let Some(_serial) = bpf_serial() else { return };
    let c = path_str(&binaries().funcs);
    let leaf = format!("{c}:leaf");
    let out = temp_path("compensation-interval.json");
    let output = run_ok(
        topdown()
            .args(["stat", "--pmu", "synthetic:intel-icl", "--format", "json"])
            .args(["-I", "60000", "-o"])
            .arg(&out)
            .args(["-u", &leaf, "--", c, "leafmid", "3", "10", "0"]),
    )
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    // One JSON object per interval, one per line.
    let reports: Vec<Value> = text
        .lines()
        .map(|line| parse_json(line.as_bytes()).unwrap())
        .collect();
    assert!(!reports.is_empty(), "{text}");
    for report in &reports {
        assert_eq!(
            report["probe_compensation"]["calibrated"]["at"], "start",
            "{report}"
        );
    }
    assert_eq!(function(&reports[reports.len() - 1], "leaf")["calls"], 4);
    let counting = stderr.find("topdown: counting").unwrap();
    let probe_cost = stderr.find("topdown: probe cost").unwrap();
    assert!(probe_cost < counting, "{stderr}");
}

/// A hybrid model calibrates on one CPU of each core type (here the synthetic split: the
/// first CPU stands in for cpu_core, the second for cpu_atom), exactly 0 on syscall counts.
#[test]
fn hybrid_models_calibrate_each_core_type() {
    let Some(_serial) = bpf_serial() else { return };
    let (report, stderr) = stat_probing(
        &[
            "--pmu",
            "synthetic:hybrid:intel-spr+intel-grt",
            "--hybrid-cpus",
            "cpu_core=0,cpu_atom=1",
        ],
        &binaries().funcs,
        "leaf",
        &["leafmid", "3", "10", "0"],
    );
    // Failed once in 10 runs of cargo xtask repeat beside heavy load (issue 22), without its
    // reason: topdown says why on stderr, and a failure says it too now.
    calibrated(&report, &stderr).unwrap();
    let costs = report["probe_compensation"]["costs"].as_array().unwrap();
    let calibrated: Vec<(&str, u64)> = costs
        .iter()
        .map(|cost| {
            (
                cost["core_type"].as_str().unwrap(),
                cost["cpu"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(calibrated, [("cpu_core", 0), ("cpu_atom", 1)], "{costs:?}");
    // The mechanism `--returns auto` chose for this plain C program is the one calibrated.
    let chosen = function(&report, "leaf")["return_probe"].clone();
    assert_eq!(chosen, "uretprobe");
    for cost in costs {
        assert_eq!(cost["mechanism"], chosen);
        for table in ["per_call", "per_callee"] {
            assert!(
                cost[table]
                    .as_object()
                    .unwrap()
                    .values()
                    .all(|value| value.as_f64() == Some(0.0)),
                "{cost}"
            );
        }
    }
    let leaf = function(&report, "leaf");
    assert_eq!(leaf["calls"], 4);
    assert_eq!(report["probe_compensation"]["clamped"], 0);
}

/// An empty function probed 20,000 times: its raw on-CPU time is all probe, and the
/// compensated figure must be within 10% of that raw figure from zero (issue 10). The
/// subtraction is recomputed from the calibration as the report gives it, so an
/// over-compensation hidden by the clamp at zero still fails. Each return mechanism in turn:
/// the calibration must match the one the function is probed with.
///
/// Judged on the mean of many runs: on a shared VM the cost of a uprobe trap moves from one
/// second to the next, so one run's calibration and its workload's calls see different costs.
/// Measured here: one run's residual spreads 15-20% (standard deviation), pinned to one CPU or
/// not, with 20000 or 200000 calls alike, wider than the bound itself; six runs in a row also
/// drifted together (+21% mean over one 15-second stretch). Each run pairs its own calibration
/// with its own calls, so the mean over runs keeps a systematic error (what the check is for)
/// and averages the drift away; the two mechanisms take turns, so both sample the whole
/// minute rather than one stretch each.
#[test]
fn empty_function_compensates_to_within_ten_percent_of_zero() {
    const RUNS: usize = 24;
    const MECHANISMS: [&str; 2] = ["--returns=exit", "--returns=uretprobe"];
    let Some(_serial) = bpf_serial() else { return };
    let w = path_str(&binaries().compensation);
    let empty = format!("{w}:empty");
    let mut shares: [Vec<f64>; 2] = Default::default();
    let mut failures: [Vec<String>; 2] = Default::default();
    for _ in 0..RUNS {
        for (index, returns) in MECHANISMS.iter().enumerate() {
            match empty_function_attempt(w, &empty, returns) {
                Ok(share) => shares[index].push(share),
                Err(failure) => failures[index].push(failure),
            }
        }
    }
    for ((returns, shares), failures) in MECHANISMS.iter().zip(&shares).zip(&failures) {
        // A calibration can fail beside heavy load (counter read errors): such a run says so
        // and is left out, but most runs must give a figure.
        assert!(
            shares.len() * 3 >= RUNS * 2,
            "{returns}: {} of {RUNS} runs failed: {failures:#?}",
            failures.len()
        );
        let mean = shares.iter().sum::<f64>() / shares.len() as f64;
        eprintln!("empty() {returns}: mean residual {mean:+.1}% of raw over {shares:.1?}");
        assert!(
            mean.abs() <= 10.0,
            "{returns}: the compensated figure is {mean:+.1}% of the raw one on average \
             (runs: {shares:.1?}; failed: {failures:#?})"
        );
    }
}

fn empty_function_attempt(w: &str, empty: &str, returns: &str) -> Result<f64, String> {
    let (report, stderr) = stat(&[
        "--pmu", "software", returns, "-u", empty, "--", w, "empty", "20000",
    ]);
    calibrated(&report, &stderr)?;
    let calls = 20_000.0;
    assert_eq!(function(&report, "empty")["calls"], 20_000);
    let raw = cpu_clock(&raw_function(&report, "empty")["inclusive"]);
    let mechanism = function(&report, "empty")["return_probe"]
        .as_str()
        .unwrap_or_else(|| panic!("no return_probe in {report}"))
        .to_owned();
    let per_call = cost(&report, &mechanism)["per_call"]["cpu-clock"]
        .as_f64()
        .unwrap();
    // topdown subtracts whole counts: the cost of all calls, rounded.
    let compensated_unclamped = raw - (calls * per_call).round();
    let reported = cpu_clock(&function(&report, "empty")["inclusive"]);
    // One count either way: serde_json's default float parsing may miss the cost by an ulp,
    // which moves a product landing on .5 to the other whole count.
    assert!(
        (reported - compensated_unclamped.max(0.0)).abs() <= 1.0,
        "reported {reported}, expected {compensated_unclamped}: {report}"
    );
    assert!(raw > 0.0, "a probed call costs on-CPU time: {report}");
    let share = 100.0 * compensated_unclamped / raw;
    // The spread over runs is what this check is about on a shared machine (`--nocapture`).
    eprintln!(
        "empty() ({mechanism}): raw {raw} ns, compensated {compensated_unclamped} ns \
         ({share:+.1}% of raw), calibrated {per_call} ns per call"
    );
    Ok(share)
}

/// Known work: outer() runs spin(n) and empty(), all three probed; reference() runs the same
/// work through unprobed copies of them (same code, same alignment), 10 units per probed
/// call, interleaved with outer() in one run. outer's compensated inclusive time must match
/// reference's within 5%, where the raw figure (probe cost included) does not.
#[test]
fn known_work_matches_its_unprobed_time_within_five_percent() {
    let Some(_serial) = bpf_serial() else { return };
    let w = path_str(&binaries().compensation);
    // ~0.5 ms of spinning per unit here: three probed calls (~40-50 us on this VM) are well
    // beyond 5% of it, and the traps' extra cost after long user work, which the back-to-back
    // calibration does not see (~+40% per probed callee here, docs/accuracy.md), stays within it.
    let units = 1000.0;
    let specs: Vec<String> = ["outer", "spin", "empty", "reference"]
        .iter()
        .map(|name| format!("{w}:{name}"))
        .collect();
    // Exit-instruction probes: the costlier mechanism, whose cost the raw figure must show.
    let mut args = vec!["--pmu", "software", "--returns=exit"];
    for spec in &specs {
        args.extend(["-u", spec.as_str()]);
    }
    args.extend(["--", w, "work", "1000", "600000"]);
    // Timing on a shared VM: up to three runs, each checked in full; one within the bounds
    // passes (a systematic error fails all three).
    let mut failures = Vec::new();
    for _ in 0..3 {
        match known_work_attempt(&args, units) {
            Ok(()) => return,
            Err(failure) => failures.push(failure),
        }
    }
    panic!("in three runs: {failures:#?}");
}

fn known_work_attempt(args: &[&str], units: f64) -> Result<(), String> {
    let (report, stderr) = stat(args);
    calibrated(&report, &stderr)?;
    assert_eq!(function(&report, "outer")["calls"], 1000);
    assert_eq!(function(&report, "reference")["calls"], 100);
    let reference = cpu_clock(&function(&report, "reference")["inclusive"]) / units;
    let outer = cpu_clock(&function(&report, "outer")["inclusive"]) / units;
    let spin = cpu_clock(&function(&report, "spin")["inclusive"]) / units;
    let raw_outer = cpu_clock(&raw_function(&report, "outer")["inclusive"]) / units;
    let within = |value: f64| (value - reference).abs() <= 0.05 * reference;
    eprintln!(
        "outer(): compensated {:+.1}%, raw {:+.1}% of its unprobed time",
        100.0 * (outer - reference) / reference,
        100.0 * (raw_outer - reference) / reference
    );
    if within(raw_outer) {
        return Err(format!(
            "the probes' cost should show in outer's raw figure: raw {raw_outer:.0} ns vs \
             unprobed {reference:.0} ns per unit"
        ));
    }
    if !within(outer) {
        return Err(format!(
            "outer(): compensated {outer:.0} ns vs unprobed {reference:.0} ns per unit \
             ({:+.1}%), raw {raw_outer:.0} ns; calibration {}",
            100.0 * (outer - reference) / reference,
            report["probe_compensation"]["costs"]
        ));
    }
    if !within(spin) {
        return Err(format!(
            "spin(): compensated {spin:.0} ns vs unprobed {reference:.0} ns per unit ({:+.1}%)",
            100.0 * (spin - reference) / reference
        ));
    }
    Ok(())
}

/// `--no-compensation`: no calibration, no `probe_compensation`, the raw figures reported.
/// The calibration runs before the command (issue 22): none of it is in the command's run.
/// On the software model every CPU's `cpu-clock` counts wall time, idle included, so the run's
/// totals are its length on every CPU; the calibration's seconds are reported apart, as
/// `before_command`, and the table's shares are of the command.
#[test]
fn the_calibration_is_not_in_the_command_s_run() {
    let Some(_serial) = bpf_serial() else { return };
    let w = path_str(&binaries().compensation);
    let recording = temp_path("compensation-run.json");
    let output = run_ok(
        topdown()
            .args(["stat", "--pmu", "software", "-u", &format!("{w}:empty")])
            .args(["--format", "json", "-o"])
            .arg(&recording)
            .args(["--", w, "empty", "500000"]),
    )
    .unwrap();
    let report = read_report(&recording);
    // Start-up alone is counted before the command too, so a calibration failing under load
    // (`calibrated`) does not change what is checked here.
    if let Err(why) = calibrated(&report, &String::from_utf8_lossy(&output.stderr)) {
        eprintln!("{why}");
    }
    let cpus = report["cpus"].as_array().expect("cpus").len() as f64;
    let wall_ns = report["duration_s"].as_f64().expect("duration_s") * 1e9 * cpus;
    let totals = cpu_clock(&report["totals"]);
    // A few ms between the snapshot before the command's release and the run's clock start,
    // and at its end, on a loaded 2-vCPU VM: 10%. With the calibration in, totals were 2-3
    // times the run.
    assert!(
        (totals / wall_ns - 1.0).abs() < 0.10,
        "totals {totals} ns over {wall_ns} ns of the run on all CPUs"
    );
    let before = cpu_clock(&report["before_command"]);
    assert!(before > 0.0, "{}", report["before_command"]);
    let counter = |entity: &Value| entity["counters"]["cpu-clock"].as_u64().unwrap();
    let command = counter(&report["command"]);
    assert_eq!(
        command,
        counter(&report["totals"]) - counter(&report["idle"]) - counter(&report["untracked"])
    );
    let processes = report["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 1);
    assert_eq!(counter(&processes[0]), command);

    // The table (of the recording, as a live run prints it): shares of the command, and what
    // was counted around it labelled, without a share.
    let table = replay(&recording, &["--by", "process"]);
    let _ = std::fs::remove_file(&recording);
    let share = |label: &str| {
        table
            .lines()
            .find(|line| line.contains(label) && !line.starts_with("topdown:"))
            .and_then(|line| line.split_whitespace().last())
            .unwrap_or_else(|| panic!("no {label} row: {table}"))
            .to_owned()
    };
    assert_eq!(share("compensation"), "100.0%", "{table}");
    assert_eq!(share("command total"), "100.0%", "{table}");
    assert_eq!(share("other tasks during its run"), "-", "{table}");
    assert_eq!(share("all CPUs during its run"), "-", "{table}");
    assert_eq!(share("before it (start-up"), "-", "{table}");
}

#[test]
fn no_compensation_reports_raw_figures() {
    let Some(_serial) = bpf_serial() else { return };
    let (report, stderr) = stat_probing(
        &["--pmu", "software", "--no-compensation"],
        &binaries().compensation,
        "empty",
        &["empty", "2000"],
    );
    assert!(report.get("probe_compensation").is_none(), "{report}");
    assert!(!stderr.contains("probe cost"), "{stderr}");
    let empty = function(&report, "empty");
    assert_eq!(empty["calls"], 2000);
    // Every probed call costs on-CPU time, none of it taken out.
    assert!(cpu_clock(&empty["inclusive"]) >= 2000.0, "{empty}");
}
