//! Per-function TopDown (`-u TARGET:FUNC`) end to end, as root, with synthetic counters:
//! workloads in C, C++ and Rust, built here, whose functions make known numbers of getppid
//! (`slots`) and getpgid (`topdown-retiring`) calls, so inclusive and exclusive counts are known
//! to the unit.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

use serde_json::Value;
use topdown_tests::*;

struct Binaries {
    c: PathBuf,
    stripped: PathBuf,
    cpp: PathBuf,
    rust: PathBuf,
    cancel: PathBuf,
    /// A C program whose C++ library (found through `$ORIGIN/lib`) throws and catches.
    plugin_main: PathBuf,
    fake_go: PathBuf,
}

/// Builds the workloads once per test binary.
fn binaries() -> &'static Binaries {
    static BUILT: OnceLock<Binaries> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("function-workloads");
        let c = build_c(&dir, "funcs.c", "funcs", &PROBED_C_FLAGS);
        // A stripped copy whose symbols live in a separate debug file found via .gnu_debuglink.
        let stripped_dir = dir.join("stripped");
        std::fs::create_dir_all(&stripped_dir).unwrap();
        let stripped = stripped_dir.join("funcs-stripped");
        let debug = stripped_dir.join("funcs-stripped.debug");
        compile(
            Command::new("objcopy")
                .arg("--only-keep-debug")
                .arg(&c)
                .arg(&debug),
        );
        compile(
            Command::new("strip")
                .arg("--strip-all")
                .arg("-o")
                .arg(&stripped)
                .arg(&c),
        );
        compile(
            Command::new("objcopy")
                .current_dir(&stripped_dir)
                .arg("--add-gnu-debuglink=funcs-stripped.debug")
                .arg(&stripped),
        );
        let cpp = dir.join("funcs-cpp");
        compile(
            Command::new("c++")
                .args(["-O0", "-g", "-o"])
                .arg(&cpp)
                .arg(workload_source("funcs.cpp")),
        );
        let rust = dir.join("funcs_rs");
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
        compile(
            Command::new(rustc)
                .args(["--edition", "2024", "-C", "opt-level=1", "-o"])
                .arg(&rust)
                .arg(workload_source("funcs_rs.rs")),
        );
        let cancel = build_c(&dir, "cancel.c", "cancel", &["-O0", "-g", "-pthread"]);
        let plugin_dir = dir.join("plugin");
        std::fs::create_dir_all(plugin_dir.join("lib")).unwrap();
        compile(
            Command::new("c++")
                .args(["-O0", "-g", "-shared", "-fPIC", "-o"])
                .arg(plugin_dir.join("lib/libtdplugin.so"))
                .arg(workload_source("plugin.cpp")),
        );
        let plugin_main = plugin_dir.join("plugin_main");
        compile(
            Command::new("cc")
                .args(["-O0", "-g", "-o"])
                .arg(&plugin_main)
                .arg(workload_source("plugin_main.c"))
                .arg(format!("-L{}", plugin_dir.join("lib").display()))
                .args(["-ltdplugin", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib"]),
        );
        // Any ELF with a .go.buildinfo section is a Go binary to topdown; without a function
        // table (.gopclntab) its functions cannot be found.
        let fake_go = dir.join("fake-go");
        let note = dir.join("buildinfo");
        std::fs::write(&note, b"\xff Go buildinf:").unwrap();
        compile(
            Command::new("objcopy")
                .arg(format!("--add-section=.go.buildinfo={}", note.display()))
                .arg(&c)
                .arg(&fake_go),
        );
        Binaries {
            c,
            stripped,
            cpp,
            rust,
            cancel,
            plugin_main,
            fake_go,
        }
    })
}

fn stat(args: &[&str]) -> Value {
    stat_json(args).unwrap().0
}

/// `stat` of `binary ARGS` with `options` and `-u binary:FUNC` for each of `functions`: how
/// most tests here probe a workload of their own.
fn probed(options: &[&str], binary: &str, functions: &[&str], args: &[&str]) -> Value {
    let mut all: Vec<String> = options.iter().map(|&option| option.to_owned()).collect();
    all.extend(probes(Path::new(binary), functions));
    all.extend(["--".to_owned(), binary.to_owned()]);
    all.extend(args.iter().map(|&arg| arg.to_owned()));
    stat_json(&all).unwrap().0
}

fn edge<'a>(report: &'a Value, caller: Option<&str>, callee: &str) -> &'a Value {
    find_edge(report, caller, callee)
        .unwrap_or_else(|| panic!("{caller:?} -> {callee} not in {}", report["call_tree"]))
}

#[test]
fn leaf_and_mid_are_exact_inclusive_and_exclusive() {
    let Some(_serial) = bpf_serial() else { return };
    let c = path_str(&binaries().c);
    // mid: 7 x leaf(10) + 5 getpgid; then leaf(10) once more from main. The extra -e event
    // counts the same syscall as `slots` and must be attributed to functions identically.
    let report = stat(&[
        "-u",
        &format!("{c}:leaf"),
        "-u",
        &format!("{c}:mid"),
        "-e",
        "syscalls:sys_enter_getppid",
        "--",
        c,
        "leafmid",
        "7",
        "10",
        "5",
    ]);
    assert_eq!(figures(function(&report, "leaf")), (8, 80, 0, 80, 0));
    assert_eq!(figures(function(&report, "mid")), (1, 70, 5, 0, 5));
    for name in ["leaf", "mid"] {
        for part in ["inclusive", "exclusive"] {
            let entity = &function(&report, name)[part];
            assert_eq!(
                counter(entity, "syscalls:sys_enter_getppid"),
                counter(entity, "slots"),
                "{name} {part}"
            );
        }
    }
    assert_eq!(edge(&report, Some("mid"), "leaf")["calls"], 7);
    assert_eq!(
        counter(&edge(&report, Some("mid"), "leaf")["inclusive"], "slots"),
        70
    );
    assert_eq!(edge(&report, None, "leaf")["calls"], 1);
    assert_eq!(edge(&report, None, "mid")["calls"], 1);
    let d = &report["diagnostics"];
    assert_eq!(
        (d["overflows"].as_u64(), d["missed_returns"].as_u64()),
        (Some(0), Some(0))
    );
    // Exclusive metrics come from the formulas: mid's own work is 5 getpgid = retiring only.
    assert_eq!(
        function(&report, "mid")["exclusive"]["metrics"]["retiring"].as_f64(),
        Some(1.0)
    );
}

#[test]
fn recursion_is_exact_to_depth_ten_and_overflows_past_sixty_four() {
    let Some(_serial) = bpf_serial() else { return };
    let c = path_str(&binaries().c);
    let report = probed(&[], c, &["recurse", "leaf"], &["recurse", "10"]);
    // Level j (1 = outermost) includes 11 - j calls: 10 + 9 + ... + 1 = 55; each makes one itself.
    assert_eq!(figures(function(&report, "recurse")), (10, 55, 0, 10, 0));
    assert_eq!(figures(function(&report, "leaf")), (1, 7, 0, 7, 0));
    assert_eq!(report["diagnostics"]["overflows"].as_u64(), Some(0));

    let report = probed(&[], c, &["recurse", "leaf"], &["recurse", "100"]);
    // The kernel gives at most 64 nested uretprobes: frames 1..=64 are recorded, 36 entries
    // overflow. Recorded level j includes 101 - j calls: sum over j = 1..64 is 4384; the 64th
    // frame's exclusive holds the 36 unprobed levels, so exclusive still adds up to all 100.
    assert_eq!(figures(function(&report, "recurse")), (64, 4384, 0, 100, 0));
    assert_eq!(report["diagnostics"]["overflows"].as_u64(), Some(36));
    assert_eq!(report["overflows"].as_u64(), Some(36));
    // Counting after the overflow is exact again.
    assert_eq!(figures(function(&report, "leaf")), (1, 7, 0, 7, 0));

    // Under uretprobes the kernel omits the returns past 64 nested instances per thread
    // (`uprobe: omit uretprobe due to nestedness limit`): exactly the calls topdown does not
    // record, so they are counted as overflows and nothing is misattributed or missed.
    let report = probed(
        &["--returns", "uretprobe"],
        c,
        &["recurse", "leaf"],
        &["recurse", "100"],
    );
    assert_eq!(figures(function(&report, "recurse")), (64, 4384, 0, 100, 0));
    assert_eq!(report["diagnostics"]["overflows"].as_u64(), Some(36));
    assert_eq!(report["diagnostics"]["missed_returns"].as_u64(), Some(0));
    assert_eq!(report["diagnostics"]["unmatched_returns"].as_u64(), Some(0));
    assert_eq!(figures(function(&report, "leaf")), (1, 7, 0, 7, 0));
}

#[test]
fn another_threads_calls_never_leak_into_a_blocked_function() {
    let Some(_serial) = bpf_serial() else { return };
    let c = path_str(&binaries().c);
    for mode in ["stay", "migrate"] {
        // Thread A: blocker(30) on CPU 0, blocked while thread B makes 1000 calls on CPU 0.
        let report = probed(&[], c, &["blocker"], &["block", "30", "1000", mode]);
        assert_eq!(
            figures(function(&report, "blocker")),
            (1, 60, 0, 60, 0),
            "{mode}"
        );
        let process_slots: u64 = tasks_total(&report, "slots");
        assert_eq!(
            process_slots, 1060,
            "{mode}: both threads' calls are counted, each in its own place"
        );
    }
}

/// longjmp skips returns without walking the stack: safe with uretprobes (the kernel drops the
/// skipped return instances by stack pointer), so a plain C program gets them under `auto`, and
/// the skipped frame is a missed return either way. An exception thrown through a probed
/// function ends its call at the catch.
/// More threads inside probed calls at once than `--max-stacks` allows goroutines: a thread's
/// shadow stack is kept in the thread (task storage), so no thread's calls are dropped, as they
/// were when the stacks were a map of that size.
#[test]
fn more_threads_inside_probed_calls_than_max_stacks_lose_nothing() {
    let Some(_serial) = bpf_serial() else { return };
    let c = path_str(&binaries().c);
    // 64 threads, each 25 getppid, all inside crowded() at its barrier, then 25 more.
    let report = probed(
        &["--max-stacks", "16"],
        c,
        &["crowded"],
        &["crowd", "64", "25"],
    );
    assert_eq!(
        figures(function(&report, "crowded")),
        (64, 64 * 50, 0, 64 * 50, 0)
    );
    let d = &report["diagnostics"];
    for name in ["probe_map_full", "missed_returns", "probe_read_failures"] {
        assert_eq!(d[name], 0, "{name}: {d}");
    }
}

#[test]
fn longjmp_and_exceptions_stay_exact_with_either_return_probe() {
    let Some(_serial) = bpf_serial() else { return };
    let b = binaries();
    let c = path_str(&b.c);
    for mode in ["auto", "exit", "uretprobe"] {
        let report = probed(
            &["--returns", mode],
            c,
            &["jumper", "leaf"],
            &["longjmp", "6"],
        );
        assert_eq!(
            figures(function(&report, "jumper")).0,
            0,
            "{mode}: jumper never returns"
        );
        // The diagnostics tell a lost entry (read_failures) from a lost return
        // (missed/unmatched returns) should this ever fail.
        let diagnostics = &report["diagnostics"];
        assert_eq!(
            figures(function(&report, "leaf")),
            (1, 5, 0, 5, 0),
            "{mode}: {diagnostics}"
        );
        assert_eq!(
            diagnostics["missed_returns"].as_u64(),
            Some(1),
            "{mode}: {diagnostics}"
        );
        assert_eq!(
            function(&report, "leaf")["return_probe"],
            if mode == "exit" { "exit" } else { "uretprobe" },
            "{mode}"
        );
    }

    // 200 longjmps past uretprobed jumper(): were the skipped return instances kept, the
    // kernel would stop giving returns after 64 and leaf's would go missing.
    for mode in ["uretprobe", "exit"] {
        let report = probed(
            &["--returns", mode],
            c,
            &["jumper", "leaf"],
            &["longjmps", "200", "3"],
        );
        assert_eq!(figures(function(&report, "jumper")).0, 0, "{mode}");
        assert_eq!(
            figures(function(&report, "leaf")),
            (200, 200, 0, 200, 0),
            "{mode}"
        );
        assert_eq!(
            report["diagnostics"]["missed_returns"].as_u64(),
            Some(200),
            "{mode}"
        );
        assert_eq!(
            report["diagnostics"]["unmatched_returns"].as_u64(),
            Some(0),
            "{mode}"
        );
    }

    let cpp = path_str(&b.cpp);
    let report = probed(&[], cpp, &["app::thrower", "app::after"], &[]);
    let thrower = function(&report, "app::thrower(int)");
    assert_eq!(figures(thrower), (1, 9, 0, 9, 0));
    assert_eq!(thrower["unwound"], 1);
    assert_eq!(thrower["return_probe"], "exit");
    assert_eq!(
        figures(function(&report, "app::after(int)")),
        (1, 4, 0, 4, 0)
    );
    assert_eq!(function(&report, "app::after(int)")["unwound"], 0);
    assert_eq!(report["diagnostics"]["missed_returns"].as_u64(), Some(0));
}

/// Runs `program args` untraced, then under `topdown stat -u` (default `--returns`), and
/// checks the program printed the same and exited the same; returns the report.
fn traced_like_untraced(probes: &[String], program: &str, args: &[&str]) -> Value {
    let untraced = Command::new(program).args(args).output().unwrap();
    assert!(
        untraced.status.success(),
        "{program} {args:?}: {untraced:?}"
    );
    let out = temp_path("functions-unwind.json");
    let traced = synthetic_stat_to(&out)
        .args(probes.iter().flat_map(|probe| ["-u", probe.as_str()]))
        .arg("--")
        .arg(program)
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&traced.stderr);
    assert_eq!(traced.status.code(), untraced.status.code(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&traced.stdout),
        String::from_utf8_lossy(&untraced.stdout),
        "{stderr}"
    );
    let report = read_report(&out);
    let _ = std::fs::remove_file(out);
    assert_eq!(
        report["diagnostics"]["missed_returns"].as_u64(),
        Some(0),
        "every unwound call is closed where unwinding ended"
    );
    report
}

/// `(calls, unwound, inclusive slots, exclusive slots)` and the return mechanism.
fn unwinding_figures(report: &Value, symbol: &str) -> (u64, u64, u64, u64, String) {
    let function = function(report, symbol);
    let (calls, inclusive, _, exclusive, _) = figures(function);
    (
        calls,
        function["unwound"].as_u64().unwrap_or(u64::MAX),
        inclusive,
        exclusive,
        function["return_probe"].as_str().unwrap_or("").to_owned(),
    )
}

/// `calls` calls of `outer` (2 getppid each) into `thrower` (3 getppid each), which throws or
/// panics out of both: each call of each is unwound, ended by the exit probe.
fn assert_unwound_through(report: &Value, outer: &str, thrower: &str, calls: u64) {
    let exit = "exit".to_owned();
    assert_eq!(
        unwinding_figures(report, outer),
        (calls, calls, 5 * calls, 2 * calls, exit.clone())
    );
    assert_eq!(
        unwinding_figures(report, thrower),
        (calls, calls, 3 * calls, 3 * calls, exit)
    );
}

#[test]
fn cpp_exceptions_through_probed_functions_are_unwound_calls() {
    let Some(_serial) = bpf_serial() else { return };
    let cpp = path_str(&binaries().cpp);
    // 1000 x middle(2 getppid) -> thrower(3 getppid) -> throw, caught in main.
    let report = traced_like_untraced(
        &[format!("{cpp}:app::middle"), format!("{cpp}:app::thrower")],
        cpp,
        &["throw", "1000"],
    );
    assert_unwound_through(&report, "app::middle(int, int)", "app::thrower(int)", 1000);
    assert!(
        function(&report, "app::thrower(int)")["return_probe_reason"]
            .as_str()
            .is_some_and(|why| why.contains("C++ exceptions")),
        "{}",
        report["functions"]
    );
}

/// `-- CMD` puts the catch points (`__cxa_begin_catch`, where unwinding ends) into the
/// command's processes only, like its functions (issue 21: a process that is not traced pays
/// nothing): another process of the same C++ binary, throwing and catching all the while,
/// never traps. The oracle is the kernel's `[uprobes]` page, mapped into a process at its first
/// breakpoint hit.
#[test]
fn an_untraced_cpp_process_never_traps_at_catch_points() {
    let Some(_serial) = bpf_serial() else { return };
    let cpp = path_str(&binaries().cpp);
    let mut beside = Command::new(cpp)
        .args(["throw", "2000000000"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let beside_pid = beside.id();
    let hit = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap_or_else(|err| panic!("/proc/{pid}/maps: {err}"))
            .contains("[uprobes]")
    };
    let report = traced_like_untraced(
        &[format!("{cpp}:app::middle"), format!("{cpp}:app::thrower")],
        cpp,
        &["throw", "1000"],
    );
    let untouched = !hit(beside_pid);
    let still_running = beside.try_wait().unwrap().is_none();
    let _ = beside.kill();
    let _ = beside.wait();
    assert!(still_running, "the untraced process ended before the check");
    assert_eq!(
        unwinding_figures(&report, "app::thrower(int)"),
        (1000, 1000, 3000, 3000, "exit".to_owned()),
        "the traced run's exceptions were closed at its catch points"
    );
    assert!(
        untouched,
        "the untraced C++ process hit a probe while topdown traced another one"
    );
}

/// With catch points (exit-instruction probes), the program that closes the frames a
/// `pthread_exit` unwound sits on `sched:sched_process_exit`, never on a system-call tracepoint:
/// enabling one puts every task's system calls, traced or not, on the kernel's slow path
/// (issue 21). The oracle is the kernel's account of topdown's links (/proc/PID/fdinfo).
#[test]
fn catch_points_put_no_system_call_of_any_task_on_a_tracepoint() {
    let Some(_serial) = bpf_serial() else { return };
    let cpp = path_str(&binaries().cpp);
    let mut traced = spawn_counting(
        topdown()
            .args([
                "stat",
                "--pmu",
                "synthetic:intel-icl",
                "--returns",
                "exit",
                "-u",
                &format!("{cpp}:app::thrower"),
                "--",
                cpp,
                "throw",
                "2000000000",
            ])
            .stdout(Stdio::null()),
        START_TIMEOUT,
    );
    let pid = traced.child().id();
    let tracepoints = held_tracepoints(pid);
    let programs: Vec<String> = held_programs(pid)
        .into_iter()
        .map(|(_, name)| name)
        .collect();
    // SAFETY: a plain kill(2) to our own child; topdown passes SIGINT on to the command.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let output = traced.wait_with_output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(128 + libc::SIGINT),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        programs.iter().any(|name| name == "thread_exit"),
        "the thread-exit program is attached: {programs:?}"
    );
    assert!(
        tracepoints.iter().any(|name| name == "sched_process_exit"),
        "{tracepoints:?}"
    );
    assert!(
        !tracepoints
            .iter()
            .any(|name| name.starts_with("sys_enter") || name.starts_with("sys_exit")),
        "a system-call tracepoint is attached: {tracepoints:?}"
    );
}

#[test]
fn rust_panics_caught_by_catch_unwind_are_unwound_calls() {
    let Some(_serial) = bpf_serial() else { return };
    let rust = path_str(&binaries().rust);
    // 100 x outer(2 getppid) -> panicker(3 getppid) -> panic, caught by catch_unwind.
    let report = traced_like_untraced(
        &[
            format!("{rust}:funcs_rs::unwind::outer"),
            format!("{rust}:funcs_rs::unwind::panicker"),
        ],
        rust,
        &["panic", "100"],
    );
    assert_unwound_through(
        &report,
        "funcs_rs::unwind::outer",
        "funcs_rs::unwind::panicker",
        100,
    );
}

#[test]
fn cancelled_threads_end_their_probed_calls_as_unwound() {
    let Some(_serial) = bpf_serial() else { return };
    let cancel = path_str(&binaries().cancel);
    // 5 threads, each cancelled inside cancelled() after 7 getppid calls.
    let report = traced_like_untraced(
        &[format!("{cancel}:cancelled")],
        cancel,
        &["cancel", "7", "5"],
    );
    assert_eq!(
        unwinding_figures(&report, "cancelled"),
        (5, 5, 35, 35, "exit".to_owned())
    );
}

/// A group exit (`exit()` in one thread) ends every thread of the process without unwinding
/// anything: the calls open in them are missed returns, never unwound calls. The thread-exit
/// program closes only the frames a thread's own `pthread_exit` or cancellation unwound.
#[test]
fn calls_open_at_a_group_exit_are_missed_returns_not_unwound_calls() {
    let Some(_serial) = bpf_serial() else { return };
    let cancel = path_str(&binaries().cancel);
    // 4 threads wait inside stuck() after 3 getppid calls each; then the main thread calls
    // exit() inside quitter().
    let report = probed(
        &["--returns", "exit"],
        cancel,
        &["stuck", "quitter"],
        &["exit", "3", "4"],
    );
    assert_eq!(
        report["diagnostics"]["missed_returns"].as_u64(),
        Some(5),
        "the 4 calls of stuck() and the one of quitter() never end"
    );
    let functions = report["functions"].as_array().cloned().unwrap_or_default();
    for entry in &functions {
        assert_eq!(entry["calls"].as_u64(), Some(0), "{entry}");
        assert_eq!(entry["unwound"].as_u64().unwrap_or(0), 0, "{entry}");
    }
}

/// `auto` reads the libraries a program needs the way ld.so finds them (here through a
/// `$ORIGIN` RUNPATH): a C program whose C++ library throws gets exit probes. An exception
/// caught below a probed frame ends only the frames it unwound, not the probed caller.
#[test]
fn a_throwing_library_found_through_runpath_gives_exit_probes() {
    let Some(_serial) = bpf_serial() else { return };
    let main = path_str(&binaries().plugin_main);
    let library = binaries()
        .plugin_main
        .with_file_name("lib")
        .join("libtdplugin.so");
    let library = path_str(&library);
    // 10 x work(2 getppid) -> plugin_work -> plugin_thrower(4 getppid) -> throw, caught in
    // plugin_work.
    let report = traced_like_untraced(
        &[format!("{main}:work"), format!("{library}:plugin_thrower")],
        main,
        &["10", "2", "4"],
    );
    assert_eq!(
        unwinding_figures(&report, "work"),
        (10, 0, 60, 20, "exit".to_owned())
    );
    assert_eq!(
        unwinding_figures(&report, "plugin_thrower"),
        (10, 10, 40, 40, "exit".to_owned())
    );
    let why = function(&report, "work")["return_probe_reason"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(why.contains("libtdplugin.so"), "{why}");
}

#[test]
fn returns_mode_is_chosen_per_program_and_can_be_forced() {
    let Some(_serial) = bpf_serial() else { return };
    let b = binaries();
    let c = path_str(&b.c);
    for (mode, mechanism) in [
        ("auto", "uretprobe"),
        ("exit", "exit"),
        ("uretprobe", "uretprobe"),
    ] {
        let report = probed(
            &["--returns", mode],
            c,
            &["leaf", "mid"],
            &["leafmid", "3", "4", "2"],
        );
        assert_eq!(
            figures(function(&report, "leaf")),
            (4, 16, 0, 16, 0),
            "{mode}"
        );
        assert_eq!(
            figures(function(&report, "mid")),
            (1, 12, 2, 0, 2),
            "{mode}"
        );
        for name in ["leaf", "mid"] {
            assert_eq!(function(&report, name)["return_probe"], mechanism, "{mode}");
            assert_eq!(function(&report, name)["unwound"], 0, "{mode}");
        }
    }
    // The C++ program gets uretprobes only when asked: it never throws in this mode.
    let cpp = path_str(&b.cpp);
    let report = probed(&["--returns", "uretprobe"], cpp, &["app::after"], &[]);
    assert_eq!(
        function(&report, "app::after(int)")["return_probe"],
        "uretprobe"
    );
    assert_eq!(
        figures(function(&report, "app::after(int)")),
        (1, 4, 0, 4, 0)
    );

    let stderr = usage_error(topdown().args([
        "stat",
        "--returns",
        "bogus",
        "-u",
        &format!("{c}:leaf"),
        "--",
        c,
    ]));
    assert!(
        stderr.contains("bogus") && stderr.contains("auto"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn demangled_names_globs_libraries_and_stripped_binaries_resolve() {
    let Some(_serial) = bpf_serial() else { return };
    let b = binaries();
    // C++ by its name without parameters; the report shows the full demangled name.
    let cpp = path_str(&b.cpp);
    let report = probed(&[], cpp, &["app::Parser::parse"], &[]);
    let parse = &report["functions"][0];
    assert!(
        parse["symbol"]
            .as_str()
            .unwrap()
            .starts_with("app::Parser::parse("),
        "{parse}"
    );
    assert_eq!(figures(parse), (1, 12, 0, 12, 0));

    // Rust by its demangled path without hash, and a glob over the module.
    let rust = path_str(&b.rust);
    for func in ["funcs_rs::parser::parse_request", "funcs_rs::parser::*"] {
        let report = stat(&["-u", &format!("{rust}:{func}"), "--", rust]);
        assert_eq!(
            figures(function(&report, "funcs_rs::parser::parse_request")),
            (2, 33, 0, 33, 0),
            "{func}"
        );
    }

    // A library by its short name.
    let c = path_str(&b.c);
    let report = stat(&["-u", "libc:getppid", "--", c, "libc", "17"]);
    assert_eq!(figures(function(&report, "getppid")), (17, 17, 0, 17, 0));

    // A glob over the C program (mid calls leaf twice, main once, 3 calls each), and the
    // stripped copy through its debug link.
    let report = probed(&[], c, &["le?f*"], &["leafmid", "2", "3", "1"]);
    assert_eq!(figures(function(&report, "leaf")), (3, 9, 0, 9, 0));
    let stripped = path_str(&b.stripped);
    let report = probed(
        &[],
        stripped,
        &["leaf", "mid"],
        &["leafmid", "7", "10", "5"],
    );
    assert_eq!(figures(function(&report, "leaf")), (8, 80, 0, 80, 0));
    assert_eq!(figures(function(&report, "mid")), (1, 70, 5, 0, 5));
}

#[test]
fn functions_split_per_process_with_by_function_task() {
    let Some(_serial) = bpf_serial() else { return };
    // Two runs of the workload under one command: each process gets its own function entry.
    let c = path_str(&binaries().c);
    let script = format!("{c} leafmid 1 4 0; {c} leafmid 1 9 0");
    let report = stat(&[
        "--by",
        "function,task",
        "-u",
        &format!("{c}:leaf"),
        "--",
        "/bin/sh",
        "-c",
        &script,
    ]);
    let mut per_process: Vec<(u64, u64)> = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["calls"].as_u64().unwrap(),
                counter(&f["inclusive"], "slots"),
            )
        })
        .collect();
    per_process.sort();
    assert_eq!(per_process, vec![(2, 8), (2, 18)]);
    assert!(
        report["functions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["pid"].as_u64().is_some())
    );
}

#[test]
fn attaching_to_a_running_process_counts_its_functions() {
    let Some(_serial) = bpf_serial() else { return };
    let c = path_str(&binaries().c);
    let mut workload = Command::new(c)
        .args(["wait", "3", "10", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = workload.id().to_string();
    let out = temp_path("functions-attach.json");
    let mut tracer = synthetic_stat_to(&out)
        .args(["-p", &pid])
        .args(["-u", &format!("{c}:leaf"), "-u", &format!("{c}:mid")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until_counting(&mut tracer, Duration::from_secs(30)).unwrap();
    workload.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(workload.wait().unwrap().success());
    assert!(tracer.wait().unwrap().success());
    let report = read_report(&out);
    assert_eq!(figures(function(&report, "leaf")), (3, 30, 0, 30, 0));
    assert_eq!(figures(function(&report, "mid")), (1, 30, 2, 0, 2));
    // -p: auto reads the process's mappings (the program, libc, ld.so): nothing unwinds.
    assert_eq!(function(&report, "mid")["return_probe"], "uretprobe");
    let _ = std::fs::remove_file(out);
}

#[test]
fn go_binaries_and_bad_specs_are_refused_clearly() {
    let Some(_serial) = bpf_serial() else { return };
    let b = binaries();
    let c = path_str(&b.c);
    let cases: [(Vec<String>, &str); 4] = [
        (
            vec![format!("{}:main", path_str(&b.fake_go))],
            "a Go binary without .gopclntab: its functions cannot be found",
        ),
        (vec![format!("{c}:no_such_function")], "no function of"),
        (vec![format!("{c}:zz*")], "no function of"),
        (vec!["nocolon".to_owned()], "expected TARGET:FUNC"),
    ];
    for (specs, needle) in cases {
        let mut command = topdown();
        command.args(["stat", "--pmu", "synthetic:intel-icl"]);
        for spec in &specs {
            command.args(["-u", spec]);
        }
        let stderr = usage_error(command.args(["--", c, "leafmid", "1", "1", "1"]));
        assert!(stderr.contains(needle), "{specs:?}: {stderr}");
    }
}

/// `report -l 2` over a recording with functions, call-tree edges and cgroups recomputes every
/// one of them: each entity's metrics carry the level-2 names the header shows.
#[test]
fn a_level_two_replay_recomputes_functions_edges_and_cgroups() {
    let Some(_serial) = bpf_serial() else { return };
    let c = path_str(&binaries().c);
    let recording = temp_path("functions-replay.json");
    let by = "task,process,cgroup,function";
    run_ok(
        synthetic_stat_to(&recording)
            .args(["--by", by])
            .args(["-u", &format!("{c}:leaf"), "-u", &format!("{c}:mid")])
            // Through a shell: the workload as the command itself lands in `untracked`, not in
            // tasks and cgroups (a stat bug reported separately), and cgroups are checked here.
            .args(["--", "/bin/sh", "-c", &format!("{c} leafmid 7 10 5; true")]),
    )
    .unwrap();
    let render = |format: &str| replay(&recording, &["-l", "2", "--by", by, "--format", format]);
    let report = parse_json(render("json").as_bytes()).unwrap();
    assert_eq!(report["level"], 2);
    let level_two = |entity: &Value, what: &str| {
        let metrics = entity["metrics"].as_object().unwrap();
        assert_eq!(metrics.len(), 12, "{what}: {metrics:?}");
        assert!(metrics.contains_key("memory_bound"), "{what}");
    };
    level_two(&report["totals"], "totals");
    for part in ["inclusive", "exclusive"] {
        level_two(&function(&report, "mid")[part], "mid");
        level_two(&function(&report, "leaf")[part], "leaf");
    }
    level_two(&edge(&report, Some("mid"), "leaf")["inclusive"], "edge");
    let cgroups = report["cgroups"].as_array().unwrap();
    assert!(!cgroups.is_empty());
    for cgroup in cgroups {
        level_two(cgroup, "cgroup");
    }
    // Recomputed, not copied: mid's own work is 5 getpgid = retiring only.
    assert_eq!(
        function(&report, "mid")["exclusive"]["metrics"]["retiring"].as_f64(),
        Some(1.0)
    );
    let table = render("table");
    assert!(table.contains("mid"), "{table}");
    let csv = render("csv");
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let width = reader.headers().unwrap().len();
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert!(rows.iter().all(|row| row.len() == width));
    assert_eq!(
        rows.iter()
            .filter(|row| &row[1] == "function" || &row[1] == "function-exclusive")
            .count(),
        4
    );
    let _ = std::fs::remove_file(recording);
}

/// `-u` whose probe never completes a call still writes `"functions": []`; a glob matching one
/// function says "1 function"; a directory as target is a usage error (exit 2).
#[test]
fn probes_without_calls_singular_matches_and_directory_targets() {
    let Some(_serial) = bpf_serial() else { return };
    let c = path_str(&binaries().c);
    let out = temp_path("functions-uncalled.json");
    let output = run_ok(
        synthetic_stat_to(&out)
            .args(["-u", &format!("{c}:jumpe*")])
            .args(["--", c, "leafmid", "1", "1", "1"]),
    )
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("-u {c}:jumpe* matched 1 function\n")),
        "{stderr}"
    );
    let report = read_report(&out);
    assert_eq!(figures(function(&report, "jumper")), (0, 0, 0, 0, 0));
    assert_eq!(report["functions"].as_array().map(Vec::len), Some(1));
    let _ = std::fs::remove_file(out);
    // The table counts it instead of printing a zero row.
    let output = run_ok(
        topdown()
            .args(["stat", "--pmu", "synthetic:intel-icl"])
            .args(["-u", &format!("{c}:jumper"), "-u", &format!("{c}:leaf")])
            .args(["--", c, "leafmid", "1", "1", "1"]),
    )
    .unwrap();
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains("(1 probed function not called)"), "{table}");
    assert!(
        !table.lines().any(|line| line.starts_with("jumper")),
        "{table}"
    );

    let dir = std::env::temp_dir();
    let stderr = usage_error(
        topdown()
            .args(["stat", "--pmu", "synthetic:intel-icl"])
            .args(["-u", &format!("{}:main", dir.display())])
            .args(["--", c, "leafmid", "1", "1", "1"]),
    );
    assert!(stderr.contains("is not a regular file"), "{stderr}");
}

/// A command that sleeps before each of its 3000 calls is woken on an idle CPU 3000 times. On
/// the test VM about half of the switches away from idle fire no `sched_switch`
/// (docs/accuracy.md, Unseen switches), so the command often runs without its arrival being
/// seen: with readings skipped at untraced switches (the default with `-- CMD`) it is credited
/// from the reading taken when the CPU went idle, and its probes claim that, so every call and
/// every count is still its own.
/// Before that, up to 7 of its calls (and counts) per run went to `untracked` here (4, 7 and 0
/// in three runs).
#[test]
fn a_task_woken_on_an_idle_cpu_keeps_every_call_and_count() {
    let Some(_serial) = bpf_serial() else { return };
    let c = path_str(&binaries().c);
    for _ in 0..2 {
        // leaf(1) 2000 times a second for 1.5 s: one getppid (one slot) per call.
        let report = probed(&[], c, &["leaf"], &["steady", "2000", "1.5"]);
        assert_eq!(figures(function(&report, "leaf")), (3000, 3000, 0, 3000, 0));
        let task_slots: u64 = tasks_total(&report, "slots");
        assert_eq!(task_slots, 3000, "{}", report["tasks"]);
        assert_eq!(report["diagnostics"]["probe_read_failures"], 0);
    }
}

/// `stat.rs`'s unseen-leaver test with function probes: a traced thread that came in through
/// a switch sched_switch did not report, with no reading at its arrival, is claimed by the
/// first of its probes to run (`reading_owner::claimable_by`), and a probed function keeps
/// every call and count in runs where that happened. Untraced spinners share every CPU with
/// it, so PID 1's threads (whose switch-outs this kernel does not report) wake where one runs
/// and hand the CPU on; runs go on until one had an unseen arrival, at most 6 (without the
/// calibration, so that the command runs as soon as counting starts, as in `stat.rs`).
#[test]
fn a_probed_function_following_a_task_that_leaves_unseen_keeps_every_count() {
    let Some(_serial) = bpf_serial() else { return };
    let c = path_str(&binaries().c);
    let _spinners = spinners_on_every_cpu(env!("CARGO_BIN_EXE_td-workload"));
    const RUNS: usize = 6;
    let mut arrivals_seen = 0;
    for run in 0..RUNS {
        if arrivals_seen > 0 {
            break;
        }
        // 10000 calls of band(100, 0): 100 getppid and 100 getpgid each, on CPU 0.
        let report = stat(&[
            "--no-compensation",
            "-u",
            &format!("{c}:band"),
            "--",
            "taskset",
            "-c",
            "0",
            c,
            "bands",
            "10000",
            "100",
            "0",
            "0",
        ]);
        let diagnostics = &report["diagnostics"];
        assert_eq!(
            figures(function(&report, "band")),
            (10_000, 1_000_000, 1_000_000, 1_000_000, 1_000_000),
            "run {run}: {diagnostics}"
        );
        let task_slots: u64 = tasks_total(&report, "slots");
        assert_eq!(task_slots, 1_000_000, "run {run}: {diagnostics}");
        assert_eq!(diagnostics["probe_read_failures"], 0, "run {run}");
        arrivals_seen += diagnostics["unseen_arrivals"].as_u64().unwrap();
    }
    if arrivals_seen == 0 {
        skipped(&format!(
            "its unseen-arrival part: no unseen arrival in {RUNS} runs \
             (this kernel may report every switch)"
        ));
    }
}

/// The case, exact on synthetic counters: 1000 calls of band(10, retiring) and 30 of
/// band(1000, backend bound) give one bucket of exactly 1000 calls and 10000 slots and one of
/// 30 calls and 30000, each with its own TopDown split, the p50 in the first and the p99 in
/// the second; the buckets add up to the function's inclusive figures, and `record -> report
/// -i` keeps all of it.
#[test]
fn per_call_distributions_are_exact_and_survive_a_replay() {
    let Some(_serial) = bpf_serial() else { return };
    let c = path_str(&binaries().c);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("distribution-replay");
    std::fs::create_dir_all(&dir).unwrap();
    let recorded = dir.join("run.json");
    for returns in ["uretprobe", "exit"] {
        run_ok(
            synthetic_stat_to(&recorded)
                .args(["--returns", returns, "-u", &format!("{c}:band"), "--"])
                .args([c, "bands", "1000", "10", "30", "1000"]),
        )
        .unwrap();
        let report = read_report(&recorded);
        let band = function(&report, "band");
        assert_eq!(band["calls"], 1030, "{returns}");
        assert_eq!(
            distribution_buckets(band),
            [(10, 12, 1000, 10_000), (896, 1024, 30, 30_000)],
            "{returns}"
        );
        let distribution = &band["distribution"];
        assert_eq!(distribution["weight"], "slots");
        let fast = &distribution["buckets"][0];
        let slow = &distribution["buckets"][1];
        assert_eq!(counter(fast, "topdown-retiring"), 10_000);
        assert_eq!(counter(slow, "topdown-be-bound"), 30_000);
        assert_eq!(fast["metrics"]["retiring"].as_f64(), Some(1.0));
        assert_eq!(slow["metrics"]["backend_bound"].as_f64(), Some(1.0));
        let percentile = |name: &str| distribution["percentiles"][name].as_f64().unwrap();
        assert!((10.0..12.0).contains(&percentile("p50")), "{distribution}");
        assert!(
            (896.0..1024.0).contains(&percentile("p99")),
            "{distribution}"
        );
        // Every counter of the buckets adds up to the function's inclusive figure.
        for name in report["counter_names"].as_array().unwrap() {
            let name = name.as_str().unwrap();
            assert_eq!(
                counter(fast, name) + counter(slow, name),
                counter(&band["inclusive"], name),
                "{returns} {name}"
            );
        }
        assert_eq!(report["diagnostics"]["histogram_full"], 0);

        // The replay keeps the distribution as recorded.
        let replayed = replay_json(&recorded, &["--by", "function"]);
        assert_eq!(
            function(&replayed, "band")["distribution"],
            band["distribution"],
            "{returns}"
        );
        // And the table says which calls are slow, and why.
        let table = replay(&recorded, &["--by", "function"]);
        let line = |band: &str| band_row(&table, "band", band);
        let fast_line = line("p50");
        let slow_line = line("p99");
        assert_eq!(
            fast_line[fast_line.len() - 5..],
            ["12)", "1000", "10000", "retiring", "100%"]
        );
        assert_eq!(
            slow_line[slow_line.len() - 5..],
            ["1024)", "30", "30000", "backend_bound", "100%"]
        );
    }
}

/// bpftrace as the oracle of the bucket layout: its `hist(n, 2)` is `hist` over powers of two
/// (bpftrace 0.17, Debian's, has no second argument) split by `lhist` into 4 linear parts of
/// each power of two; the same calls' buckets from bpftrace (of `band`'s argument, which is its
/// slots per call) and from topdown's BPF side must be the same, bucket for bucket.
#[test]
fn histogram_buckets_match_bpftraces() {
    let Some(_serial) = bpf_serial() else { return };
    if !Path::new("/usr/bin/bpftrace").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "bpftrace missing: cargo xtask setup installs it"
        );
        skipped("bpftrace not installed");
        return;
    }
    let c = path_str(&binaries().c);
    // Every value below 20, both ends and the middle of several powers of two, and repeats.
    let mut values: Vec<u64> = (0..20).collect();
    values.extend([
        23, 31, 32, 33, 47, 48, 63, 64, 100, 127, 128, 255, 256, 257, 383, 384, 511, 700, 1000,
        1023, 1024, 1500, 2047, 2048, 3000, 3071, 3072,
    ]);
    values.extend([5, 5, 100, 1000, 1000, 3000]);
    let arguments: Vec<String> = values.iter().map(u64::to_string).collect();

    let mut program = format!("uprobe:{c}:band {{ @small = lhist(arg0, 0, 4, 1); ");
    for e in 2..12 {
        let low = 1u64 << e;
        program += &format!("@e{e} = lhist(arg0, {low}, {}, {}); ", 2 * low, low / 4);
    }
    program += "}";
    let command = format!("{c} bandlist {}", arguments.join(" "));
    let stdout = bpftrace(&program, &command, &[]);
    // `[low, high)   count |@@@|` lines with both bounds numbers (not the out-of-range ones);
    // bpftrace writes multiples of 1024 as `1K`, `3K`, `1M`.
    let number = |text: &str| -> Option<u64> {
        match text.strip_suffix('K') {
            Some(kilo) => kilo.parse::<u64>().ok().map(|n| n << 10),
            None => match text.strip_suffix('M') {
                Some(mega) => mega.parse::<u64>().ok().map(|n| n << 20),
                None => text.parse().ok(),
            },
        }
    };
    let mut oracle: Vec<(u64, u64, u64)> = stdout
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix('[')?;
            let (range, tail) = rest.split_once(')')?;
            let (low, high) = range.split_once(", ")?;
            let count = tail.split_whitespace().next()?.parse::<u64>().ok()?;
            Some((number(low)?, number(high)?, count))
        })
        .filter(|(_, _, count)| *count > 0)
        .collect();
    oracle.sort_unstable();
    assert_eq!(
        oracle.iter().map(|(_, _, count)| count).sum::<u64>(),
        values.len() as u64,
        "every value in one bpftrace bucket: {stdout}"
    );

    let mut args = vec!["-u".to_owned(), format!("{c}:band"), "--".to_owned()];
    args.extend([c.to_owned(), "bandlist".to_owned()]);
    args.extend(arguments);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let report = stat(&args);
    let ours: Vec<(u64, u64, u64)> = distribution_buckets(function(&report, "band"))
        .into_iter()
        .map(|(low, high, calls, slots)| {
            let expected: u64 = values.iter().filter(|v| (low..high).contains(*v)).sum();
            assert_eq!(slots, expected, "[{low}, {high})");
            (low, high, calls)
        })
        .collect();
    assert_eq!(ours, oracle);
}
