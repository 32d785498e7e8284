//! `topdown stat` end to end, as root, with synthetic counters whose true values are known:
//! the default synthetic mapping puts `slots` on getppid and `topdown-retiring` on getpgid, etc.

use std::{io::Write as _, os::unix::process::CommandExt as _, process::Stdio, time::Duration};

use serde_json::Value;
use topdown_tests::*;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_td-workload");

/// Counter names of intel-icl in slot order, and the syscalls the default mapping gives them.
const ICL_COUNTERS: [(&str, &str); 7] = [
    ("slots", "getppid"),
    ("topdown-retiring", "getpgid"),
    ("topdown-bad-spec", "getsid"),
    ("topdown-fe-bound", "getpriority"),
    ("topdown-be-bound", "getresuid"),
    ("INT_MISC.UOP_DROPPING", "getresgid"),
    ("INT_MISC.CLEARS_COUNT", "times"),
];

/// td-workload with `specs`, waiting for a line on its stdin before it starts (each `pause`
/// waits for another); its stdout piped for the thread ids it prints.
fn held_workload(specs: &[&str]) -> std::process::Child {
    std::process::Command::new(WORKLOAD)
        .arg("--wait-stdin")
        .args(specs)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

fn report_path(name: &str) -> std::path::PathBuf {
    temp_path(&format!("test-{name}.json"))
}

/// Every counter: totals == Σ tasks + idle + untracked + dropped, and == Σ per-CPU totals.
fn assert_conserved(report: &Value) {
    for name in report["counter_names"].as_array().expect("counter_names") {
        let name = name.as_str().expect("counter name");
        let tasks: u64 = tasks_total(report, name);
        let parts = tasks
            + counter(&report["idle"], name)
            + counter(&report["untracked"], name)
            + counter(&report["dropped"], name);
        assert_eq!(
            counter(&report["totals"], name),
            parts,
            "conservation of {name}"
        );
        let cpus: u64 = report["cpus"]
            .as_array()
            .expect("cpus")
            .iter()
            .map(|cpu| counter(cpu, name))
            .sum();
        assert_eq!(
            counter(&report["totals"], name),
            cpus,
            "per-CPU sum of {name}"
        );
    }
}

#[test]
fn two_threads_get_exactly_their_own_syscalls() {
    let Some(_serial) = bpf_serial() else { return };
    let (report, output) = stat_json(["--", WORKLOAD, "getppid=1234", "getpgid=777"]).unwrap();
    let threads = workload_threads(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(threads.len(), 2, "workload output: {:?}", output);
    assert_eq!(report["synthetic"], Value::Bool(true));
    assert_eq!(report["model"], "intel-icl");

    let a = task(&report, threads[0].2).expect("thread A in report");
    let b = task(&report, threads[1].2).expect("thread B in report");
    assert_eq!(slots_and_retiring(a), (1234, 0));
    assert_eq!(slots_and_retiring(b), (0, 777));
    let process = process(&report, threads[0].1).expect("workload process");
    assert_eq!(slots_and_retiring(process), (1234, 777));
    // Only the workload is tracked: every task in the report belongs to it.
    for task in report["tasks"].as_array().unwrap() {
        assert_eq!(task["tgid"].as_u64(), Some(threads[0].1));
    }
    assert_conserved(&report);
}

#[test]
fn metrics_follow_the_model_formulas_exactly() {
    let Some(_serial) = bpf_serial() else { return };
    // slots=1000 ret=400 bad=100 fe=200 be=300 uop_dropping=50 clears=10:
    // SUM=1000; FE = 200/1000 - 50/1000 = 0.15; BE = 300/1000 + 5*10/1000 = 0.35;
    // RET = 0.4; BadSpec = 1 - (0.15 + 0.35 + 0.4) = 0.1.
    let counts = [1000, 400, 100, 200, 300, 50, 10];
    let spec: Vec<String> = ICL_COUNTERS
        .iter()
        .zip(counts)
        .map(|((_, syscall), count)| format!("{syscall}={count}"))
        .collect();
    let out = report_path("formulas");
    let output = run_ok(synthetic_stat_to(&out).args(["--", WORKLOAD, &spec.join(",")])).unwrap();
    let threads = workload_threads(&String::from_utf8_lossy(&output.stdout));
    let report = read_report(&out);
    let worker = task(&report, threads[0].2).expect("worker thread");
    for ((name, _), count) in ICL_COUNTERS.iter().zip(counts) {
        // Seen once in 14 runs beside a build loop (issue 22: 1 of the 10 `times` calls, the
        // thread's last ones); not reproduced since, so a failure carries the whole report.
        assert_eq!(counter(worker, name), count, "{name}: {report}");
    }
    let metric = |name: &str| worker["metrics"][name].as_f64().unwrap_or(f64::NAN);
    for (name, expected) in [
        ("frontend_bound", 0.15),
        ("backend_bound", 0.35),
        ("retiring", 0.4),
        ("bad_speculation", 0.1),
    ] {
        assert!(
            (metric(name) - expected).abs() < 1e-12,
            "{name} = {}",
            metric(name)
        );
    }

    // report -i recomputes the same numbers from the raw counters, and says it is synthetic.
    let again = replay_json(&out, &[]);
    assert_eq!(
        task(&again, threads[0].2).unwrap()["metrics"],
        worker["metrics"]
    );
    assert!(replay(&out, &[]).contains("SYNTHETIC"));
    let _ = std::fs::remove_file(out);
}

#[test]
fn system_wide_counts_conserve_and_a_workload_gets_exactly_its_calls() {
    let Some(_serial) = bpf_serial() else { return };
    let out = report_path("system-wide");
    let mut tracer = spawn_counting(
        synthetic_stat_to(&out).args(["-a", "-d", "3"]),
        Duration::from_secs(30),
    );
    let workload = std::process::Command::new(WORKLOAD)
        .args(["getppid=5000,getpgid=321"])
        .output()
        .unwrap();
    let threads = workload_threads(&String::from_utf8_lossy(&workload.stdout));
    assert!(tracer.child().wait().unwrap().success());
    let report = read_report(&out);
    let worker = task(&report, threads[0].2).expect("workload thread");
    assert_eq!(slots_and_retiring(worker), (5000, 321));
    assert_eq!(
        counter(&report["untracked"], "slots"),
        0,
        "-a tracks everyone"
    );
    assert!(counter(&report["totals"], "slots") >= 5000);
    assert_conserved(&report);
    let _ = std::fs::remove_file(out);
}

/// A `-p` target that exits while topdown is still loading its programs: the run ends with
/// a report instead of waiting for an exit it already missed (it waited forever before).
#[test]
fn a_target_gone_before_counting_starts_ends_the_run() {
    let Some(_serial) = bpf_serial() else { return };
    let out = report_path("gone-at-start");
    let mut target = KilledOnDrop::new(
        std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap(),
    );
    let mut tracer = KilledOnDrop::new(
        synthetic_stat_to(&out)
            .args(["-p", &target.child().id().to_string()])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The target ends once topdown is loading its BPF objects: after it found the pid (a pid
    // gone before that is refused, exit 6: what a fixed `sleep 0.3` met whenever topdown took
    // longer to get there beside other builds, issue 22) and before its programs count.
    let tracer_pid = tracer.child().id();
    wait_for(START_TIMEOUT, || {
        holds_bpf_objects(tracer_pid).then_some(())
    })
    .expect("topdown loads its BPF objects");
    target.child().kill().unwrap();
    target.child().wait().unwrap();
    let ended = wait_for(Duration::from_secs(30), || {
        tracer.child().try_wait().ok().flatten()
    });
    let status = ended.expect("topdown still running 30 s after its only target exited");
    assert!(status.success(), "{status}");
    let report = read_report(&out);
    assert_conserved(&report);
    let _ = std::fs::remove_file(out);
}

/// Whether process `pid` holds a BPF map or program (an fd linking to `anon_inode:bpf-...`).
fn holds_bpf_objects(pid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    entries.flatten().any(|entry| {
        std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("anon_inode:bpf-"))
    })
}

#[test]
fn a_busy_thread_that_never_switches_out_is_complete_at_the_end() {
    let Some(_serial) = bpf_serial() else { return };
    let out = report_path("busy");
    let ready = report_path("busy-ready");
    let _ = std::fs::remove_file(&ready);
    let mut workload = std::process::Command::new(WORKLOAD)
        .args(["--wait-stdin", "--spin-ms", "6000", "--ready-file"])
        .arg(&ready)
        .arg("getppid=3000")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = workload.id().to_string();
    let mut tracer = spawn_counting(
        synthetic_stat_to(&out).args(["-p", &pid, "-d", "3"]),
        Duration::from_secs(30),
    );
    workload.stdin.take().unwrap().write_all(b"go\n").unwrap();
    // topdown stops at 3 s while the thread still spins: its calls are only in the CPU's
    // running delta until the final flush.
    assert!(tracer.child().wait().unwrap().success());
    assert!(
        ready.exists(),
        "the workload made its calls before topdown stopped"
    );
    let _ = workload.kill();
    let stdout = workload.wait_with_output().unwrap().stdout;
    let threads = workload_threads(&String::from_utf8_lossy(&stdout));
    let report = read_report(&out);
    let busy = task(&report, threads[0].2).expect("busy thread");
    assert_eq!(counter(busy, "slots"), 3000);
    assert_eq!(busy["exited"], Value::Bool(false));
    assert_conserved(&report);
    let _ = std::fs::remove_file(out);
    let _ = std::fs::remove_file(ready);
}

#[test]
fn a_command_is_followed_into_its_children() {
    let Some(_serial) = bpf_serial() else { return };
    let (report, output) =
        stat_json(["--", WORKLOAD, "--children", "3", "getppid=100,getpgid=10"]).unwrap();
    let threads = workload_threads(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(threads.len(), 4, "parent + 3 children");
    for (_, pid, tid) in &threads {
        let worker = task(&report, *tid).unwrap_or_else(|| panic!("thread {tid} of process {pid}"));
        assert_eq!(slots_and_retiring(worker), (100, 10));
        assert_eq!(counter(process(&report, *pid).unwrap(), "slots"), 100);
    }
    let tracked: u64 = tasks_total(&report, "slots");
    assert_eq!(tracked, 400);
    assert_conserved(&report);
}

#[test]
fn attaching_to_a_running_process_counts_exactly_what_it_does() {
    let Some(_serial) = bpf_serial() else { return };
    let out = report_path("attach");
    let mut workload = held_workload(&["getppid=2222", "getpgid=1111"]);
    let pid = workload.id().to_string();
    let mut tracer = spawn_counting(
        synthetic_stat_to(&out).args(["-p", &pid]),
        Duration::from_secs(30),
    );
    workload.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let stdout = workload.wait_with_output().unwrap().stdout;
    // No -d: topdown ends by itself once the traced process is gone.
    assert!(tracer.child().wait().unwrap().success());
    let threads = workload_threads(&String::from_utf8_lossy(&stdout));
    let report = read_report(&out);
    let process = process(&report, threads[0].1).expect("process");
    assert_eq!(slots_and_retiring(process), (2222, 1111));
    let a = task(&report, threads[0].2).unwrap();
    assert_eq!(a["exited"], Value::Bool(true));
    assert_eq!(counter(a, "slots"), 2222);
    assert_conserved(&report);
    let _ = std::fs::remove_file(out);
}

#[test]
fn ctrl_c_prints_the_final_report_and_leaves_no_bpf_behind() {
    let Some(_serial) = bpf_serial() else { return };
    let mut tracer = spawn_counting(
        topdown()
            .args(["stat", "-a", "--pmu", "software", "--format", "json"])
            .stdout(Stdio::piped()),
        Duration::from_secs(30),
    );
    // Checked by id, so other tracers running at the same time do not count.
    let held = held_programs(tracer.child().id());
    for name in ["sched_switch", "flush"] {
        assert!(
            held.iter().any(|(_, held_name)| held_name == name),
            "{name} not loaded: {held:?}"
        );
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(tracer.child().id() as i32, libc::SIGINT) };
    let output = tracer.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = parse_json(&output.stdout).unwrap();
    assert_eq!(report["model"], "software");
    assert!(counter(&report["totals"], "cpu-clock") > 0);
    assert_conserved(&report);
    assert_programs_freed(&held, Duration::from_secs(5));
}

#[test]
fn interval_mode_writes_one_json_object_per_interval_that_add_up() {
    let Some(_serial) = bpf_serial() else { return };
    let out = report_path("interval");
    run_ok(synthetic_stat_to(&out).args(["-I", "100"]).args([
        "--",
        WORKLOAD,
        "--spin-ms",
        "500",
        "getppid=4321",
    ]))
    .unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    let reports: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(reports.len() >= 3, "{} intervals", reports.len());
    for (index, report) in reports.iter().enumerate() {
        assert_eq!(report["interval"]["index"].as_u64(), Some(index as u64 + 1));
        assert_conserved(report);
    }
    let slots: u64 = reports
        .iter()
        .flat_map(|report| report["tasks"].as_array().unwrap().iter())
        .map(|task| counter(task, "slots"))
        .sum();
    assert_eq!(slots, 4321, "intervals add up to the exact total");
    let _ = std::fs::remove_file(out);
}

/// A task that ends while a report reads the maps is counted once. Its exit record is sent
/// before its entry leaves the task map; a report that read the records first, then the map,
/// found it in neither and counted it whole again at the next report (about 8 in 100 such
/// tasks here, one in 20 runs of the test above). 3000 sleeping threads make the map's read
/// long; 100 processes, one after another, each count 100 getppid calls, spin across a 10 ms
/// interval and end.
#[test]
fn interval_mode_counts_a_task_that_ends_during_a_report_once() {
    let Some(_serial) = bpf_serial() else { return };
    let out = report_path("interval-exits");
    let sleepers = vec!["sleep=1500"; 3000].join(" ");
    let script = format!(
        "{WORKLOAD} {sleepers} >/dev/null & \
         for i in $(seq 100); do {WORKLOAD} --main-thread getppid=100,spin=15 >/dev/null; done; \
         wait"
    );
    run_ok(synthetic_stat_to(&out).args(["-I", "10", "--", "sh", "-c", &script])).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    let mut by_tid: std::collections::BTreeMap<u64, u64> = Default::default();
    let mut intervals = 0;
    for line in text.lines() {
        let report: Value = serde_json::from_str(line).unwrap();
        intervals += 1;
        for task in report["tasks"].as_array().unwrap() {
            if task["comm"] == "td-workload" {
                *by_tid.entry(task["tid"].as_u64().unwrap()).or_default() += counter(task, "slots");
            }
        }
    }
    assert!(intervals >= 100, "{intervals} intervals");
    let counted: Vec<(u64, u64)> = by_tid
        .into_iter()
        .filter(|(_, slots)| *slots != 0)
        .collect();
    assert_eq!(counted.len(), 100, "processes that counted: {counted:?}");
    let wrong: Vec<&(u64, u64)> = counted.iter().filter(|(_, slots)| *slots != 100).collect();
    assert!(wrong.is_empty(), "counted other than once: {wrong:?}");
    let _ = std::fs::remove_file(out);
}

#[test]
fn bad_input_gets_one_clear_line_and_its_own_exit_status() {
    let Some(_serial) = bpf_serial() else { return };
    let cases: [(&[&str], i32, &str); 6] = [
        (
            &["stat", "--pmu", "nonsense", "-d", "1"],
            2,
            "unknown model 'nonsense'",
        ),
        (
            &["stat", "-p", "999999999", "-d", "1"],
            6,
            "no such process: 999999999",
        ),
        (
            &["stat", "--", "/nonexistent/command"],
            127,
            "command not found: /nonexistent/command",
        ),
        (&["stat", "-d", "0"], 2, "positive number of seconds"),
        (
            &[
                "stat",
                "--pmu",
                "synthetic:intel-icl",
                "--synthetic",
                "nope=syscalls:sys_enter_getppid",
                "-d",
                "1",
            ],
            2,
            "nope",
        ),
        (
            &[
                "stat",
                "--pmu",
                "synthetic:intel-icl",
                "--synthetic",
                "slots=syscalls:sys_enter_nope",
                "-d",
                "1",
            ],
            5,
            "sys_enter_nope",
        ),
    ];
    for (args, status, needle) in cases {
        let output = exits_with(topdown().args(args), status);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }

    // A hardware model on a VM without a virtual PMU (what these machines are) says exactly that.
    let no_core_pmu = !std::path::Path::new("/sys/bus/event_source/devices/cpu").exists();
    let in_vm =
        std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|text| text.contains(" hypervisor"));
    if no_core_pmu && in_vm {
        let output = exits_with(
            topdown().args(["stat", "-a", "-d", "1", "--pmu", "intel-icl"]),
            5,
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("this is a VM without a virtual PMU"),
            "{stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    }

    // Without privileges, -a (BPF only; a command would be counted without BPF): a clear line
    // and exit 2, before anything is loaded.
    let stderr = usage_error(
        topdown()
            .args(["stat", "-a", "-d", "1", "--pmu", "software"])
            .uid(65534)
            .gid(65534),
    );
    assert!(stderr.contains("needs root"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
}

/// A bad or impossible `-e` names the event and the model, not only the model: on a VM without
/// a PMU, `--pmu software -e cycles` used to say "model software needs a hardware PMU".
#[test]
fn an_impossible_extra_event_is_named_with_the_model() {
    let Some(_serial) = bpf_serial() else { return };
    let run = |event: &str| {
        let mut command = topdown();
        command.args(["stat", "-a", "-d", "0.1", "--pmu", "software", "-e", event]);
        command
    };
    let stderr = usage_error(&mut run("no_such_event"));
    assert!(
        stderr.contains("-e no_such_event (with model software)"),
        "{stderr}"
    );
    let stderr = usage_error(&mut run("cpu-clock"));
    assert!(
        stderr.contains("-e cpu-clock: model software already counts this event"),
        "{stderr}"
    );
    // A hardware event: only impossible where there is no core PMU (these VMs).
    let has_core_pmu = ["cpu", "cpu_core", "armv8_pmuv3_0"].iter().any(|pmu| {
        std::path::Path::new("/sys/bus/event_source/devices")
            .join(pmu)
            .exists()
    });
    if has_core_pmu {
        skipped("a core PMU is present: -e cycles can be counted here");
        return;
    }
    let hardware = run("cycles").output().unwrap();
    assert_eq!(hardware.status.code(), Some(5));
    let stderr = String::from_utf8_lossy(&hardware.stderr);
    assert!(
        stderr.contains(
            "-e cycles (a hardware event, counted beside model software) needs a hardware PMU"
        ),
        "{stderr}"
    );
}

/// `-o FILE` replaces FILE only with a complete report: a run that fails before counting (a
/// typo) leaves the last result, and no temporary file, behind.
#[test]
fn a_failed_run_keeps_the_last_result_in_its_output_file() {
    let Some(_serial) = bpf_serial() else { return };
    let dir = temp_path("stat-o");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("last.json");
    std::fs::write(&file, "the last result\n").unwrap();
    let failed = topdown()
        .args([
            "stat",
            "-a",
            "-d",
            "0.2",
            "--pmu",
            "synthetic:no-such-model",
            "-o",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(2));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "the last result\n");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("last.json")]);
    // A run that completes replaces it.
    run_ok(
        topdown()
            .args([
                "stat", "-a", "-d", "0.2", "--pmu", "software", "--format", "json", "-o",
            ])
            .arg(&file),
    )
    .unwrap();
    let report = read_report(&file);
    assert_eq!(report["model"], "software");
    let _ = std::fs::remove_dir_all(dir);
}

/// `-- CMD` where CMD is single-threaded and short: its only switch-out comes after its exit,
/// when the exit hook had already stopped tracking it, so every count went to `untracked`.
#[test]
fn a_short_single_threaded_command_is_its_own_process() {
    let Some(_serial) = bpf_serial() else { return };
    let (report, _) =
        stat_json(["--", WORKLOAD, "--main-thread", "getppid=321,getpgid=123"]).unwrap();
    let pid = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|process| process["comm"] == "td-workload")
        .map(|process| process["pid"].as_u64().unwrap())
        .unwrap_or_else(|| panic!("no td-workload process: {report}"));
    let process = process(&report, pid).unwrap();
    assert_eq!(slots_and_retiring(process), (321, 123));
    assert_eq!(counter(&report["untracked"], "slots"), 0, "{report}");
    assert_conserved(&report);
}

/// A task's name is taken at its first reading and kept by the `task:task_rename` hook from
/// then on (the switch program no longer copies it at every reading): a thread that renames
/// itself after its entry was made, and a command whose process execs another program after
/// it switched out, are reported by their new names, with exactly their calls.
#[test]
fn tasks_renamed_after_their_first_reading_keep_their_new_names() {
    let Some(_serial) = bpf_serial() else { return };
    let (report, _) = stat_json([
        "--",
        WORKLOAD,
        "--main-thread",
        // The sleeps switch the thread out: the first one makes its entry, named td-workload.
        "getppid=3,sleep=50,rename=7,getppid=5,sleep=20",
    ])
    .unwrap();
    let tasks = report["tasks"].as_array().unwrap();
    assert_eq!(counter(only_task_named(&report, "renamed-7"), "slots"), 8);
    assert!(
        tasks.iter().all(|task| task["comm"] != "td-workload"),
        "{tasks:?}"
    );
    assert_conserved(&report);

    // The shell sleeps (its entry is made, named sh), then execs the workload in place. The
    // shell makes calls of its own first (dash reads `$PPID` with getppid): measured alone.
    let shell_run = |script: &str| stat_json(["--", "sh", "-c", script]).unwrap().0;
    let alone = shell_run("sleep 0.1");
    let own_calls = counter(only_task_named(&alone, "sh"), "slots");
    let report = shell_run(&format!(
        "sleep 0.1; exec {WORKLOAD} --main-thread getppid=4"
    ));
    let tasks = report["tasks"].as_array().unwrap();
    assert_eq!(
        counter(only_task_named(&report, "td-workload"), "slots"),
        own_calls + 4
    );
    assert!(tasks.iter().all(|task| task["comm"] != "sh"), "{tasks:?}");
}

/// The one task of `report` named `comm`; fails the test, showing the tasks, unless there is
/// exactly one.
fn only_task_named<'a>(report: &'a Value, comm: &str) -> &'a Value {
    let tasks = report["tasks"].as_array().unwrap();
    let named: Vec<&Value> = tasks.iter().filter(|task| task["comm"] == comm).collect();
    assert_eq!(named.len(), 1, "one {comm}: {tasks:?}");
    named[0]
}

const PINGPONG: &str = env!("CARGO_BIN_EXE_pingpong");

/// With `-p`, switches between untraced tasks take no reading. The traced process sleeps on
/// stdin the whole run, so the only readings are the baseline and the final flush on each CPU
/// (2 per CPU) and one each time a CPU goes idle (at most about as many as cpuidle counts
/// entries), while an untraced ping-pong makes 40000 context switches on CPU 0.
#[test]
fn switches_between_untraced_tasks_take_no_reading() {
    let Some(_serial) = bpf_serial() else { return };
    let mut sleeper = std::process::Command::new(WORKLOAD)
        .args(["--wait-stdin", "getppid=1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let out = report_path("untraced-switches");
    let activity = UntracedActivity::start();
    let mut tracer = spawn_counting(
        synthetic_stat_to(&out).args(["-p", &sleeper.id().to_string(), "-d", "3"]),
        Duration::from_secs(30),
    );
    let pingpong = untraced_pingpong(PINGPONG, 20_000)
        .wait_with_output()
        .unwrap();
    assert!(pingpong.status.success());
    assert!(tracer.child().wait().unwrap().success());
    let untraced = activity.since();
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let report = read_report(&out);
    assert_few_readings(&report, untraced);
    assert_eq!(report["tasks"].as_array().unwrap().len(), 0, "it never ran");
    assert_conserved(&report);
    let _ = std::fs::remove_file(out);
}

/// The traced process and an untraced twin make the same syscalls on CPU 0 at the same time,
/// beside an untraced ping-pong there: they preempt each other, so most readings come from
/// switches between a traced and an untraced task. The traced one still gets exactly its calls
/// and nothing is lost, with `-p` and with `-- CMD`.
#[test]
fn traced_counts_stay_exact_beside_untraced_tasks_on_their_cpu() {
    let Some(_serial) = bpf_serial() else { return };
    // Paused at the end until the twin is done, so all of the twin's calls fall in the run.
    let spec = "cpu=0,getppid=30000,getpgid=3000,pause=0";
    let held = |spec: &str| held_workload(&[spec]);
    for scope in ["-p", "--"] {
        let out = report_path("beside-untraced");
        let mut twin = held("cpu=0,getppid=50000,getpgid=5000");
        let mut traced = (scope == "-p").then(|| held(spec));
        let mut tracer = synthetic_stat_to(&out);
        match &traced {
            Some(child) => tracer.args(["-p", &child.id().to_string()]),
            // The command inherits topdown's stdin and waits on it like the others.
            None => tracer.args(["--", WORKLOAD, "--wait-stdin", spec]),
        };
        let mut tracer = tracer
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_until_counting(&mut tracer, Duration::from_secs(30)).unwrap();
        let pingpong = untraced_pingpong(PINGPONG, 20_000);
        let release = match &mut traced {
            Some(child) => child.stdin.take(),
            None => tracer.stdin.take(),
        };
        let mut release = release.unwrap();
        release.write_all(b"go\n").unwrap();
        twin.stdin.take().unwrap().write_all(b"go\n").unwrap();
        assert!(twin.wait().unwrap().success());
        assert!(pingpong.wait_with_output().unwrap().status.success());
        release.write_all(b"go\n").unwrap();
        drop(release);
        let mut stdout = Vec::new();
        match traced {
            Some(child) => stdout = child.wait_with_output().unwrap().stdout,
            None => {
                std::io::Read::read_to_end(&mut tracer.stdout.take().unwrap(), &mut stdout)
                    .unwrap();
            }
        }
        assert!(tracer.wait().unwrap().success(), "{scope}");
        let threads = workload_threads(&String::from_utf8_lossy(&stdout));
        let report = read_report(&out);
        let process = process(&report, threads[0].1).expect("traced process");
        assert_eq!(slots_and_retiring(process), (30_000, 3_000), "{scope}");
        assert!(counter(&report["untracked"], "slots") >= 50_000, "{scope}");
        assert_conserved(&report);
        let _ = std::fs::remove_file(out);
    }
}

/// A traced command on CPU 0 beside an untraced spinner on every CPU, for a few seconds. On
/// the test VM no switch away from PID 1's threads fires `sched_switch` (docs/accuracy.md,
/// Unseen switches), and they wake several times a second on the busy CPUs: one that preempts
/// the spinner (a switch between untraced tasks, not read) and then hands the CPU to the command
/// unseen leaves the command running with the delta since the last reading spanning several
/// tasks. Processes whose switch-outs go unseen are found at the first one and read at every
/// switch into them from then on; before that, the traced task found running is credited the
/// whole delta (`unseen_arrivals`), which holds the spinner's stretch too but no getppid or
/// getpgid call of anyone else. So the command keeps every call both when it starts at once
/// (the first unseen switch-out of PID 1's threads in the run may hand the CPU to it) and after
/// a second of warm-up (they are known by then). Before either, 8 runs of this test out of 8
/// failed here, losing 33 to 24751 of the 2000000 getppid calls (once 1154 getpgid calls too)
/// to `untracked`; with the warm-up alone, the models test still lost up to 898 of 1600 calls
/// in 1 CI run of about 10. Where no task leaves unseen, it checks exactness beside busy
/// untraced tasks.
#[test]
fn a_traced_command_following_a_task_that_leaves_unseen_keeps_every_call() {
    let Some(_serial) = bpf_serial() else { return };
    // The command shares CPU 0 with a spinner, time slice by time slice.
    let _spinners = spinners_on_every_cpu(WORKLOAD);
    // The first unseen switch-out in a run hands the CPU to the command in 1 to 3 runs of
    // 10 that start at once: such runs go on until one has (`unseen_arrivals`), at most 12.
    const COLD_RUNS: usize = 12;
    let mut arrivals_seen = 0;
    for run in 0..=COLD_RUNS {
        let warm_up = run == 0;
        if run > 2 && arrivals_seen > 0 {
            break;
        }
        let out = report_path("unseen-leaver");
        let mut tracer = spawn_counting(
            synthetic_stat_to(&out)
                .args([
                    "--",
                    WORKLOAD,
                    "--wait-stdin",
                    "cpu=0,getppid=2000000,getpgid=200000",
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped()),
            Duration::from_secs(30),
        );
        if warm_up {
            std::thread::sleep(Duration::from_secs(1));
        }
        let child = tracer.child();
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let mut stdout = Vec::new();
        std::io::Read::read_to_end(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
        assert!(child.wait().unwrap().success(), "run {run}");
        let threads = workload_threads(&String::from_utf8_lossy(&stdout));
        let report = read_report(&out);
        let process = process(&report, threads[0].1).expect("traced process");
        assert_eq!(
            slots_and_retiring(process),
            (2_000_000, 200_000),
            "run {run} (warm-up {warm_up}), {} unseen switches, {} unseen arrivals",
            report["diagnostics"]["unseen_switches"],
            report["diagnostics"]["unseen_arrivals"]
        );
        assert_conserved(&report);
        if !warm_up {
            arrivals_seen += report["diagnostics"]["unseen_arrivals"].as_u64().unwrap();
        }
        let _ = std::fs::remove_file(out);
    }
    if arrivals_seen == 0 {
        skipped(&format!(
            "its unseen-arrival part: no unseen arrival in {COLD_RUNS} runs started at once \
             (this kernel may report every switch)"
        ));
    }
}
