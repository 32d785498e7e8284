//! Hardware models end to end on synthetic counters, hybrid core types, counter rotation, and
//! the `list`/`check` commands.
//!
//! Golden vectors live in `tests/golden/<model>.json`: raw counts and the metrics worked out by
//! hand from topdown-formulas.md. The same files feed the library's unit tests; here each is
//! replayed (1) through `topdown report -i`, and (2) for real: a workload makes exactly that
//! many syscalls, the synthetic model counts them, and the task's metrics must equal the
//! hand-worked values.

use std::{collections::BTreeMap, path::PathBuf};

use serde_json::Value;
use topdown_tests::*;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_td-workload");

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden")
}

fn temp_path(name: &str) -> PathBuf {
    topdown_tests::temp_path(&format!("models-{name}.json"))
}

/// One hand-worked vector of a golden file.
struct Golden {
    model: String,
    name: String,
    level: u8,
    counts: BTreeMap<String, u64>,
    expected: BTreeMap<String, Option<f64>>,
    estimated: Vec<String>,
    /// False for vectors that only make sense as recordings (see their comment).
    replay: bool,
}

fn goldens() -> Vec<Golden> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("tests/golden")
        .map(|entry| entry.expect("golden entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    let mut vectors = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("golden file");
        let json: Value =
            serde_json::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", file.display()));
        let model = json["model"].as_str().expect("model").to_owned();
        for vector in json["vectors"].as_array().expect("vectors") {
            vectors.push(Golden {
                model: model.clone(),
                name: vector["name"].as_str().expect("name").to_owned(),
                level: vector["level"].as_u64().expect("level") as u8,
                counts: vector["counts"]
                    .as_object()
                    .expect("counts")
                    .iter()
                    .map(|(name, value)| (name.clone(), value.as_u64().expect("count")))
                    .collect(),
                expected: vector["expected"]
                    .as_object()
                    .expect("expected")
                    .iter()
                    .map(|(name, value)| (name.clone(), value.as_f64()))
                    .collect(),
                estimated: vector["estimated"]
                    .as_array()
                    .map(|names| {
                        names
                            .iter()
                            .map(|name| name.as_str().expect("name").to_owned())
                            .collect()
                    })
                    .unwrap_or_default(),
                replay: vector["replay"].as_bool().unwrap_or(true),
            });
        }
    }
    vectors
}

fn assert_metrics(golden: &Golden, metrics: &Value, context: &str) {
    for (name, expected) in &golden.expected {
        let actual = metrics[name].as_f64();
        match (expected, actual) {
            (None, None) => {}
            (Some(expected), Some(actual)) => assert!(
                (expected - actual).abs() < 1e-9,
                "{context}: {} {}: {name} = {actual}, expected {expected}",
                golden.model,
                golden.name
            ),
            _ => panic!(
                "{context}: {} {}: {name} = {actual:?}, expected {expected:?}",
                golden.model, golden.name
            ),
        }
    }
}

/// A minimal recording with one task holding the golden counts, as `stat --format json` writes.
fn recording(golden: &Golden) -> Value {
    let entity = serde_json::json!({ "counters": golden.counts, "metrics": {} });
    let empty = serde_json::json!({ "counters": {}, "metrics": {} });
    serde_json::json!({
        "topdown_version": "0.1.0",
        "model": golden.model,
        "synthetic": false,
        "level": golden.level,
        "counter_names": golden.counts.keys().collect::<Vec<_>>(),
        "weight_counter": golden.counts.keys().next(),
        "duration_s": 1.0,
        "scope": "golden",
        "totals": entity,
        "idle": empty,
        "untracked": empty,
        "dropped": empty,
        "tasks": [ { "tid": 1, "tgid": 1, "comm": "golden", "exited": false,
                     "counters": golden.counts, "metrics": {} } ],
        "processes": [],
        "cgroups": [],
        "cpus": [],
        "diagnostics": {
            "readings": 1,
            "not_running_readings": 0,
            "read_errors": 0,
            "task_map_full": 0,
            "exit_records_lost": 0
        }
    })
}

#[test]
fn golden_vectors_through_report_i() {
    let vectors = goldens();
    assert!(!vectors.is_empty(), "no golden vectors in tests/golden");
    for golden in &vectors {
        let input = temp_path(&format!("golden-{}-{}", golden.model, golden.name));
        std::fs::write(&input, recording(golden).to_string()).unwrap();
        let output = run_ok(
            topdown()
                .args(["report", "--format", "json", "-l"])
                .arg(golden.level.to_string())
                .arg("-i")
                .arg(&input),
        )
        .unwrap_or_else(|err| panic!("{} {}: {err:#}", golden.model, golden.name));
        let report = parse_json(&output.stdout).unwrap();
        assert_eq!(report["model"], golden.model.as_str());
        assert_metrics(golden, &report["tasks"][0]["metrics"], "report -i");
        let estimated: Vec<String> = report["tasks"][0]["estimated"]
            .as_array()
            .map(|names| {
                names
                    .iter()
                    .filter_map(|name| Some(name.as_str()?.to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(
            estimated, golden.estimated,
            "{} {}",
            golden.model, golden.name
        );
        let _ = std::fs::remove_file(input);
    }
}

/// Counter name -> syscall of a synthetic model's default mapping, from `topdown list`.
fn synthetic_mapping(model: &str) -> BTreeMap<String, String> {
    let output = run_ok(topdown().args(["list", "--pmu", &format!("synthetic:{model}")])).unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?;
            let tracepoint = words.next()?.strip_prefix("syscalls:sys_enter_")?;
            Some((name.to_owned(), tracepoint.to_owned()))
        })
        .collect()
}

/// Golden vectors small enough to replay as syscalls (Yitian's billions are report-only).
const REPLAY_LIMIT: u64 = 400_000;

#[test]
fn every_model_end_to_end_on_synthetic_counters() {
    let Some(_serial) = bpf_serial() else { return };
    let vectors = goldens();
    let mut replayed = BTreeMap::<String, usize>::new();
    for golden in vectors
        .iter()
        .filter(|golden| golden.replay && golden.counts.values().sum::<u64>() <= REPLAY_LIMIT)
    {
        let mapping = synthetic_mapping(&golden.model);
        assert!(
            !mapping.is_empty(),
            "{}: no synthetic mapping listed",
            golden.model
        );
        let spec: Vec<String> = golden
            .counts
            .iter()
            .filter(|(_, count)| **count > 0)
            .map(|(name, count)| {
                let syscall = mapping
                    .get(name)
                    .unwrap_or_else(|| panic!("{}: no synthetic counter {name}", golden.model));
                format!("{syscall}={count}")
            })
            .collect();
        let out = temp_path(&format!("replay-{}", golden.model));
        let replay = || {
            let mut args = vec![
                "--pmu".to_owned(),
                format!("synthetic:{}", golden.model),
                "-l".to_owned(),
                golden.level.to_string(),
            ];
            if golden.model.starts_with("hybrid:") {
                // Both core types' counters on every CPU: the counts are exact wherever the
                // workload runs (migration between core types is tested on its own below).
                let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
                let online = online.trim().to_owned();
                args.extend([
                    "--hybrid-cpus".to_owned(),
                    format!("cpu_core={online},cpu_atom={online}"),
                ]);
            }
            args.extend(["--".to_owned(), WORKLOAD.to_owned(), spec.join(",")]);
            let (report, output) = stat_report_to(&out, &args)
                .unwrap_or_else(|err| panic!("{} {}: {err:#}", golden.model, golden.name));
            let threads = workload_threads(&String::from_utf8_lossy(&output.stdout));
            (threads[0].2, report)
        };
        // Once seen missing from the tasks here (November 2026, when every switch was read):
        // not reproduced since (issue 22), so a miss fails with what the report holds.
        // A switch into the thread that the kernel does not report, at the first unseen
        // switch-out of another process in the run, credits it what ran on its CPU since the
        // last reading (`unseen_arrivals`): no other task makes these syscalls, so it stays
        // exact (before, that stretch went to `untracked`: once 898 of 1600 calls, 1 CI run of
        // about 10).
        let (tid, report) = replay();
        let task = task(&report, tid).unwrap_or_else(|| {
            panic!(
                "{} {}: workload thread {tid} not in the report's tasks {}; untracked {}; \
                 diagnostics {}",
                golden.model,
                golden.name,
                report["tasks"],
                report["untracked"],
                report["diagnostics"]
            )
        });
        for (name, count) in &golden.counts {
            // A failure shows the whole report (issue 22: the losses to `untracked` above).
            assert_eq!(
                counter(task, name),
                *count,
                "{} {name}: tasks {}, untracked {}, dropped {}, diagnostics {}",
                golden.model,
                report["tasks"],
                report["untracked"],
                report["dropped"],
                report["diagnostics"]
            );
        }
        assert_metrics(golden, &task["metrics"], "synthetic replay");
        *replayed.entry(golden.model.clone()).or_default() += 1;
        let _ = std::fs::remove_file(out);
    }
    // Every hardware model has at least one replayed vector.
    let listed = run_ok(topdown().args(["list", "--all"])).unwrap();
    for line in String::from_utf8_lossy(&listed.stdout).lines().skip(1) {
        let Some(model) = line.split_whitespace().next() else {
            continue;
        };
        if model != "software" {
            assert!(
                replayed.contains_key(model),
                "model {model} has no golden vector replayed end to end (have: {replayed:?})"
            );
        }
    }
}

#[test]
fn a_task_migrating_between_core_types_is_split_and_merged_by_slots() {
    let Some(_serial) = bpf_serial() else { return };
    // An intel-icl P-core and an intel-skt (Skymont, 8 slots per cycle) E-core stand in for the
    // core types: CPU 0 is cpu_core, CPU 1 cpu_atom. The thread makes 1000 getppid
    // (cpu_core/slots) and 400 getpgid (cpu_core retiring) on CPU 0, then moves to CPU 1 for 10
    // more getppid (no cpu_core counter there), 100 sched_rr_get_interval (cpu_atom cycles: the
    // 21st synthetic syscall, after intel-icl's 20 counters) and 800 get_mempolicy (cpu_atom
    // retiring); 77 sched_rr_get_interval made on CPU 0 count nowhere (no cpu_atom counter
    // there).
    let (report, output) = stat_report([
        "--pmu",
        "synthetic:hybrid:intel-icl+intel-skt",
        "--hybrid-cpus",
        "cpu_core=0,cpu_atom=1",
        "--",
        WORKLOAD,
        "cpu=0,getppid=1000,getpgid=400,sched_rr_get_interval=77,cpu=1,getppid=10,\
         sched_rr_get_interval=100,get_mempolicy=800",
    ])
    .unwrap();
    let threads = workload_threads(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(report["model"], "hybrid:intel-icl+intel-skt");
    let task = task(&report, threads[0].2).expect("workload thread");
    assert_eq!(counter(task, "cpu_core/slots"), 1000);
    assert_eq!(counter(task, "cpu_core/topdown-retiring"), 400);
    assert_eq!(counter(task, "cpu_atom/CPU_CLK_UNHALTED.CORE"), 100);
    assert_eq!(counter(task, "cpu_atom/TOPDOWN_RETIRING.ALL"), 800);
    // cpu_core: retiring = ret/SUM with SUM = ret alone = 1.0 (the other L1 counts are 0).
    // cpu_atom: retiring = 800 / (8 x 100 cycles) = 1.0. Merged by slots (1000 and 800):
    // (1000 * 1.0 + 800 * 1.0) / 1800 = 1.0; frontend likewise 0.
    let metrics = &task["metrics"];
    assert_eq!(metrics["cpu_core.retiring"].as_f64(), Some(1.0));
    assert_eq!(metrics["cpu_atom.retiring"].as_f64(), Some(1.0));
    assert_eq!(metrics["retiring"].as_f64(), Some(1.0));
    assert_eq!(metrics["frontend_bound"].as_f64(), Some(0.0));
}

#[test]
fn check_says_why_topdown_cannot_work_in_this_vm() {
    let Some(_serial) = bpf_serial() else { return };
    let output = topdown().arg("check").output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    for requirement in [
        "privileges",
        "perf_event_paranoid",
        "BTF",
        "tracefs",
        "BPF programs",
        "uprobes",
        "uprobe.multi",
        "PMU",
        "model",
        "NMI watchdog",
        "counters free",
    ] {
        assert!(
            text.lines().any(|line| line[6..].starts_with(requirement)),
            "no '{requirement}' line in:\n{text}"
        );
    }
    // Every program check loads, by name: all but the uprobe.multi variants (the same code as
    // func_entry/func_return/func_exit/func_catch/usdt_site/go_entry/go_exit/go_runtime, loaded
    // only where the kernel has uprobe.multi).
    assert!(
        text.contains(
            "ok    BPF programs         17 programs pass the verifier: sched_switch flush \
             process_fork process_exit task_rename cgroup_attach cpu_idle thread_exit \
             cgroup_switch func_entry func_return func_exit func_catch usdt_site go_entry \
             go_exit go_runtime"
        ),
        "{text}"
    );
    // These machines have no PMU: auto falls back and check says TopDown cannot work.
    let has_pmu = std::path::Path::new("/sys/bus/event_source/devices/cpu/events").exists();
    if !has_pmu {
        assert_eq!(output.status.code(), Some(1), "{text}");
        assert!(text.contains("FAIL  model"), "{text}");
        assert!(
            text.contains(
                "verdict: TopDown tracing cannot work here with model software (failed: model)"
            ),
            "{text}"
        );
    }
    // A synthetic model needs no PMU: check passes.
    let synthetic = exits_with(topdown().args(["check", "--pmu", "synthetic:intel-icl"]), 0);
    let text = String::from_utf8_lossy(&synthetic.stdout);
    assert!(
        text.contains("ok    counters free        7 of 7 level-1 counters open on CPU 0"),
        "{text}"
    );
}

#[test]
fn list_shows_each_counter_with_its_encoding() {
    let output =
        run_ok(topdown().args(["list", "--pmu", "intel-icl", "--max-counters", "8"])).unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("Model:      intel-icl"), "{text}");
    let slots = text
        .lines()
        .find(|line| line.trim_start().starts_with("slots "))
        .expect("slots line");
    assert!(slots.contains("cpu/config=0x400/"), "{slots}");
    assert!(slots.contains("fixed"), "{slots}");
    assert!(text.contains("core pinned x7"), "{text}");
    let stderr = usage_error(topdown().args(["list", "--pmu", "intel-nope"]));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("unknown model 'intel-nope'"), "{stderr}");
}

#[test]
fn counters_beyond_the_pmu_rotate_and_their_metrics_are_marked_estimated() {
    let Some(_serial) = bpf_serial() else { return };
    let golden = goldens()
        .into_iter()
        .find(|golden| golden.model == "amd-zen4" && golden.name == "level-2")
        .expect("amd-zen4 level-2 golden vector");
    let mapping = synthetic_mapping("amd-zen4");
    let spec: Vec<String> = golden
        .counts
        .iter()
        .map(|(name, count)| format!("{}={count}", mapping[name]))
        .collect();
    // 6 counters: level 1 (6) and level 2 (6) cannot both be on the PMU, so both groups rotate.
    // Tracepoint groups are never actually descheduled, so running == enabled and the scaled
    // counts equal the raw ones: the metrics are exact, but reported as estimated.
    let out = temp_path("rotation");
    let zen4 = |level: &str, workload: &str| {
        stat_report_to(
            &out,
            [
                "--pmu",
                "synthetic:amd-zen4",
                "-l",
                level,
                "--max-counters",
                "6",
                "--",
                WORKLOAD,
                workload,
            ],
        )
        .unwrap()
    };
    let (report, output) = zen4("2", &spec.join(","));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("needs 12 general-purpose counters on the core PMU, which has 6 free: all counters take turns"),
        "{stderr}"
    );
    let threads = workload_threads(&String::from_utf8_lossy(&output.stdout));
    let task = task(&report, threads[0].2).expect("workload thread");
    for (name, count) in &golden.counts {
        assert_eq!(counter(task, name), *count, "{name}");
    }
    for group in ["group0", "group8"] {
        let enabled = counter(task, &format!("{group}.enabled_ns"));
        let running = counter(task, &format!("{group}.running_ns"));
        assert!(enabled > 0, "{group} enabled time attributed to the task");
        assert_eq!(
            enabled, running,
            "{group}: tracepoint groups never rotate out"
        );
    }
    assert_metrics(&golden, &task["metrics"], "rotated replay");
    let estimated: Vec<&str> = task["estimated"]
        .as_array()
        .expect("estimated list")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for name in golden.expected.keys() {
        assert!(
            estimated.contains(&name.as_str()),
            "{name} not marked estimated: {estimated:?}"
        );
    }
    // The table marks them too.
    let table = replay(&out, &[]);
    assert!(table.contains("note: ~ marks estimates"), "{table}");
    assert!(table.contains("~30.0%"), "{table}");

    // Level 1 alone fits: one pinned group, nothing estimated.
    let (report, level_one) = zen4("1", "getppid=10");
    assert!(!String::from_utf8_lossy(&level_one.stderr).contains("take turns"));
    assert!(report["totals"]["estimated"].is_null());

    // Fewer counters than one group needs: one clear line, usage exit status.
    let stderr = usage_error(topdown().args([
        "stat",
        "--pmu",
        "synthetic:amd-zen4",
        "--max-counters",
        "5",
        "--",
        "true",
    ]));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("needs 6 general-purpose counters at once for level 1"),
        "{stderr}"
    );
    let _ = std::fs::remove_file(out);
}

#[test]
fn extra_events_are_attributed_per_task_exactly() {
    let Some(_serial) = bpf_serial() else { return };
    let out = temp_path("extra-events");
    let (report, output) = stat_report_to(
        &out,
        [
            "--pmu",
            "synthetic:intel-icl",
            "-e",
            "syscalls:sys_enter_getcwd",
            "-e",
            "syscalls:sys_enter_newuname",
            "--",
            WORKLOAD,
            "getcwd=300,getppid=10",
            "getcwd=100,newuname=50",
        ],
    )
    .unwrap();
    let threads = workload_threads(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(
        report["extra_events"],
        serde_json::json!(["syscalls:sys_enter_getcwd", "syscalls:sys_enter_newuname"])
    );
    let a = task(&report, threads[0].2).expect("thread A");
    let b = task(&report, threads[1].2).expect("thread B");
    assert_eq!(counter(a, "syscalls:sys_enter_getcwd"), 300);
    assert_eq!(counter(a, "syscalls:sys_enter_newuname"), 0);
    assert_eq!(counter(a, "slots"), 10);
    assert_eq!(counter(b, "syscalls:sys_enter_getcwd"), 100);
    assert_eq!(counter(b, "syscalls:sys_enter_newuname"), 50);
    // The table shows them as columns.
    let table = replay(&out, &[]);
    assert!(table.contains("syscalls:sys_enter_getcwd"), "{table}");
    let _ = std::fs::remove_file(out);

    for (spec, message) in [
        // libpfm4's own reason, after the spec it names.
        (
            "INT_MISC:RECOVERY_CYCLES:e",
            "libpfm4 refuses 'icl::INT_MISC:RECOVERY_CYCLES:e': invalid event attribute",
        ),
        ("task-clock", "use cpu-clock"),
        ("nopmu/event=1/", "no PMU 'nopmu'"),
    ] {
        let stderr = usage_error(topdown().args([
            "stat",
            "--pmu",
            "synthetic:intel-icl",
            "-e",
            spec,
            "--",
            "true",
        ]));
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(message), "{spec}: {stderr}");
    }
}
