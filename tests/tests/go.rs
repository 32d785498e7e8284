//! Go programs under `-u` (issue 24), end to end, as root, with synthetic counters: programs
//! built here with the Go toolchain `cargo xtask setup` installs (Debian's `golang-go`),
//! offline, whose functions make known numbers of getppid (`slots`) and getpgid
//! (`topdown-retiring`) calls from 1000 goroutines on two Ps, across goroutine switches,
//! stack growth and copying, recovered panics and `runtime.Goexit`. Calls and counts are
//! exact, the program's output is the same traced or not, and so with the binary stripped.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{MutexGuard, OnceLock},
};

use serde_json::Value;
use topdown_tests::*;

struct GoPrograms {
    goroutines: PathBuf,
    goroutines_stripped: PathBuf,
    goroutines_pie: PathBuf,
    funcs: PathBuf,
    funcs_stripped: PathBuf,
    cgo: PathBuf,
    bench: PathBuf,
}

/// Builds the Go workloads once per test binary; `None` (said once per test) where there is
/// no Go toolchain outside CI. In CI a missing toolchain fails.
fn programs() -> Option<&'static GoPrograms> {
    static BUILT: OnceLock<Option<GoPrograms>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Err(err) = Command::new("go").arg("version").output() {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "go: {err} (cargo xtask setup installs golang-go)"
                );
                return None;
            }
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("go-workloads");
            std::fs::create_dir_all(&dir).unwrap();
            // Go's build cache, shared with topdown-user's tests and the benchmark.
            let cache = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/go-cache");
            let build = |source: &str, out: &str, flags: &[&str]| {
                let path = dir.join(out);
                compile(
                    Command::new("go")
                        .arg("build")
                        .args(flags)
                        .arg("-o")
                        .arg(&path)
                        .arg(source)
                        .current_dir(workload_source(""))
                        .env("GOCACHE", cache.join("build"))
                        .env("GOPATH", cache.join("gopath"))
                        .env("GOFLAGS", "")
                        .env("GOPROXY", "off")
                        .env("GO111MODULE", "off"),
                );
                path
            };
            let stripped = ["-ldflags=-s -w"];
            Some(GoPrograms {
                goroutines: build("goroutines.go", "goroutines", &[]),
                goroutines_stripped: build("goroutines.go", "goroutines-stripped", &stripped),
                goroutines_pie: build("goroutines.go", "goroutines-pie", &["-buildmode=pie"]),
                funcs: build("gofuncs.go", "gofuncs", &[]),
                funcs_stripped: build("gofuncs.go", "gofuncs-stripped", &stripped),
                cgo: build("gocgo.go", "gocgo", &[]),
                bench: build("gobench.go", "gobench", &[]),
            })
        })
        .as_ref()
}

/// How each test here starts: the [`bpf_serial`] lock and the programs, or `None` after saying
/// why the test is skipped (or when not root).
fn ready() -> Option<(MutexGuard<'static, ()>, &'static GoPrograms)> {
    let serial = bpf_serial()?;
    let programs = programs();
    if programs.is_none() {
        skipped("no Go toolchain (cargo xtask setup installs golang-go)");
    }
    Some((serial, programs?))
}

/// `topdown stat --pmu synthetic:intel-icl --format json -o FILE <args>`: its output (the
/// traced program's own, since the report goes to the file) and the report.
fn stat(args: &[&str]) -> (Output, Value) {
    let (report, output) = stat_json(args).unwrap();
    (output, report)
}

fn edge_calls(report: &Value, caller: Option<&str>, callee: &str) -> u64 {
    find_edge(report, caller, callee)
        .and_then(|edge| edge["calls"].as_u64())
        .unwrap_or(0)
}

/// `(calls, unwound, inclusive slots, inclusive retiring, exclusive slots, exclusive retiring)`.
type Figures = (u64, u64, u64, u64, u64, u64);

fn figures(function: &Value) -> Figures {
    (
        function["calls"].as_u64().unwrap_or(0),
        function["unwound"].as_u64().unwrap_or(0),
        counter(&function["inclusive"], "slots"),
        counter(&function["inclusive"], "topdown-retiring"),
        counter(&function["exclusive"], "slots"),
        counter(&function["exclusive"], "topdown-retiring"),
    )
}

const GOROUTINES: u64 = 1000;
const PROBED: [&str; 7] = [
    "work", "outer", "thrower", "guarded", "waiter", "quitter", "rec",
];

/// What tests/workloads/goroutines.go does, worked out from its description (not from its
/// output): each function's figures, and the program's getppid and getpgid totals.
fn expected(goroutines: u64) -> (BTreeMap<&'static str, Figures>, u64, u64) {
    let mut all: BTreeMap<&str, Figures> = PROBED
        .iter()
        .map(|name| (*name, Figures::default()))
        .collect();
    let mut add = |name: &'static str, figures: Figures| {
        let entry = all.entry(name).or_default();
        entry.0 += figures.0;
        entry.1 += figures.1;
        entry.2 += figures.2;
        entry.3 += figures.3;
        entry.4 += figures.4;
        entry.5 += figures.5;
    };
    let (mut ppids, mut pgids) = (0, 0);
    for i in 0..goroutines {
        let k = 1 + i % 5;
        let work = (1, 0, k, 0, k, 0);
        match i % 6 {
            0 => add("work", work),
            1 => {
                add("work", work);
                add("outer", (1, 0, k, 1, 0, 1));
                pgids += 1;
            }
            2 => {
                add("work", work);
                add("thrower", (1, 1, k, 0, 0, 0));
                add("guarded", (1, 0, k, 0, 0, 0));
            }
            3 => {
                let m = 1 + i % 3;
                add("waiter", (1, 0, 0, m, 0, m));
                pgids += m;
                continue; // no getppid
            }
            4 => {
                add("work", work);
                add("quitter", (1, 1, k, 0, 0, 0));
            }
            _ => {
                add("work", work);
                let n = 20 + i % 10;
                for level in 0..=n {
                    add("rec", (1, 0, k, level + 1, 0, 1));
                }
                pgids += n + 1;
            }
        }
        ppids += k;
    }
    (all, ppids, pgids)
}

/// Every probed function of goroutines.go, exact, with the program's output as untraced: for
/// the build `build` picks.
fn goroutine_counts_are_exact(build: fn(&GoPrograms) -> &Path) {
    let Some((_serial, programs)) = ready() else {
        return;
    };
    let program = build(programs);
    let untraced = Command::new(program)
        .arg(GOROUTINES.to_string())
        .env("GOMAXPROCS", "2")
        .output()
        .unwrap();
    assert!(untraced.status.success());
    let (all, ppids, pgids) = expected(GOROUTINES);
    assert_eq!(
        String::from_utf8_lossy(&untraced.stdout),
        format!(
            "goroutines {GOROUTINES} work {} getppid {ppids} getpgid {pgids} recovered {}\n",
            all["work"].0, all["guarded"].0
        ),
        "the workload does what its description says"
    );
    let specs: Vec<String> = PROBED
        .iter()
        .map(|name| format!("{}:main.{name}", path_str(program)))
        .collect();
    let mut args: Vec<&str> = Vec::new();
    for spec in &specs {
        args.extend(["-u", spec]);
    }
    let count = GOROUTINES.to_string();
    args.extend(["--", path_str(program), &count]);
    let (output, report) = stat(&args);
    assert_eq!(
        output.stdout, untraced.stdout,
        "the traced program's output differs"
    );
    for (name, want) in &all {
        let symbol = format!("main.{name}");
        assert_eq!(figures(function(&report, &symbol)), *want, "{symbol}");
        assert_eq!(
            function(&report, &symbol)["return_probe"],
            "exit",
            "{symbol}"
        );
    }
    // Callers, as the goroutines call them.
    let n = |kind: u64| (0..GOROUTINES).filter(|i| i % 6 == kind).count() as u64;
    assert_eq!(edge_calls(&report, None, "main.work"), n(0));
    // Through 200 unprobed frames of deep(), across the stack copies they cause.
    assert_eq!(edge_calls(&report, Some("main.outer"), "main.work"), n(1));
    assert_eq!(edge_calls(&report, Some("main.thrower"), "main.work"), n(2));
    assert_eq!(
        edge_calls(&report, Some("main.guarded"), "main.thrower"),
        n(2)
    );
    assert_eq!(edge_calls(&report, Some("main.quitter"), "main.work"), n(4));
    assert_eq!(edge_calls(&report, Some("main.rec"), "main.work"), n(5));
    assert_eq!(
        edge_calls(&report, Some("main.rec"), "main.rec"),
        (0..GOROUTINES)
            .filter(|i| i % 6 == 5)
            .map(|i| 20 + i % 10)
            .sum::<u64>()
    );
    // Nothing lost or guessed, and the process's own totals are the program's.
    let diagnostics = &report["diagnostics"];
    for name in [
        "overflows",
        "missed_returns",
        "unmatched_returns",
        "probe_read_failures",
        "probe_map_full",
        "goroutine_switches_lost",
    ] {
        assert_eq!(diagnostics[name], 0, "{name}: {diagnostics}");
    }
    let process = report["processes"]
        .as_array()
        .and_then(|processes| processes.first())
        .expect("the program's process");
    assert_eq!(slots_and_retiring(process), (ppids, pgids));
}

#[test]
fn goroutine_function_counts_are_exact() {
    goroutine_counts_are_exact(|programs| &programs.goroutines);
}

#[test]
fn goroutine_function_counts_are_exact_stripped() {
    goroutine_counts_are_exact(|programs| &programs.goroutines_stripped);
}

/// Two processes of one Go program at once: their goroutines have the same `g` addresses
/// (every Go process allocates them alike), and each keeps its own stacks and counts.
#[test]
fn two_go_processes_keep_their_goroutines_apart() {
    let Some((_serial, programs)) = ready() else {
        return;
    };
    let program = path_str(&programs.goroutines);
    let goroutines = 300;
    let specs: Vec<String> = PROBED
        .iter()
        .map(|name| format!("{program}:main.{name}"))
        .collect();
    let mut args: Vec<&str> = vec!["--by", "function,task"];
    for spec in &specs {
        args.extend(["-u", spec]);
    }
    let script = format!("{program} {goroutines} & {program} {goroutines}; wait");
    args.extend(["--", "sh", "-c", &script]);
    let (output, report) = stat(&args);
    let (all, _, _) = expected(goroutines);
    let line = format!("goroutines {goroutines} work {} getppid ", all["work"].0);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout)
            .matches(&line)
            .count(),
        2,
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let mut pids: Vec<u64> = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["pid"].as_u64())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 2, "{}", report["functions"]);
    for pid in pids {
        for (name, want) in &all {
            let symbol = format!("main.{name}");
            let function = report["functions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["symbol"] == symbol.as_str() && f["pid"].as_u64() == Some(pid))
                .unwrap_or_else(|| panic!("{symbol} of {pid}"));
            assert_eq!(figures(function), *want, "{symbol} of {pid}");
        }
    }
    assert_eq!(report["diagnostics"]["goroutine_switches_lost"], 0);
    assert_eq!(report["diagnostics"]["missed_returns"], 0);
}

/// A position-independent build keeps its function table in `.data.rel.ro.gopclntab`.
#[test]
fn goroutine_function_counts_are_exact_position_independent() {
    goroutine_counts_are_exact(|programs| &programs.goroutines_pie);
}

/// Go names as written: a generic function's instantiations answer to its source name, a
/// generic type's method too; what cannot be followed is said, with the reason.
#[test]
fn go_names_generics_and_inlined_functions() {
    let Some((_serial, programs)) = ready() else {
        return;
    };
    let rounds = 7;
    let funcs = path_str(&programs.funcs);
    let (output, report) = stat(&[
        "-u",
        &format!("{funcs}:main.Sum"),
        "-u",
        &format!("{funcs}:main.(*Stack).Push"),
        "-u",
        &format!("{funcs}:main.plain"),
        "-u",
        &format!("{funcs}:main.partlyInlined"),
        "--",
        funcs,
        &rounds.to_string(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let slots = |symbol: &str| {
        let function = function(&report, symbol);
        (
            function["calls"].as_u64().unwrap_or(0),
            counter(&function["inclusive"], "slots"),
        )
    };
    assert_eq!(slots("main.Sum[go.shape.int_0]"), (rounds, 3 * rounds));
    assert_eq!(slots("main.Sum[go.shape.float64_0]"), (rounds, 2 * rounds));
    assert_eq!(
        slots("main.(*Stack[go.shape.string_0]).Push"),
        (rounds, rounds)
    );
    // plain: called directly, from partlyInlined's inlined copy in main, and through the
    // function value's call of partlyInlined's own code.
    assert_eq!(slots("main.plain"), (3 * rounds, 3 * rounds));
    assert!(
        stderr.contains(
            "topdown: skipped 1 Go function that cannot be followed: main.partlyInlined (also \
             inlined into callers, whose calls cannot be probed: mark it //go:noinline or build \
             with -gcflags=-l)"
        ),
        "{stderr}"
    );

    // Stripped: the function table names both instantiations `main.Sum[...]`.
    let stripped = path_str(&programs.funcs_stripped);
    let (_, report) = stat(&[
        "-u",
        &format!("{stripped}:main.Sum"),
        "--",
        stripped,
        &rounds.to_string(),
    ]);
    let mut sums: Vec<(String, u64, u64)> = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["symbol"]
                    .as_str()
                    .unwrap()
                    .split('@')
                    .next()
                    .unwrap()
                    .to_owned(),
                f["calls"].as_u64().unwrap(),
                counter(&f["inclusive"], "slots"),
            )
        })
        .collect();
    sums.sort();
    assert_eq!(
        sums,
        [
            ("main.Sum[...]".to_owned(), rounds, 2 * rounds),
            ("main.Sum[...]".to_owned(), rounds, 3 * rounds)
        ]
    );

    // What cannot be probed at all is a usage error naming why.
    let cases = [
        (
            "main.everywhereInlined",
            "main.everywhereInlined is inlined into every caller",
        ),
        (
            "main.partlyInlined",
            "Go functions that cannot be followed: main.partlyInlined",
        ),
        (
            "runtime.memmove",
            "runtime.memmove (Go assembly: it need not keep the goroutine in R14)",
        ),
        ("runtime.goexit1", "(the goroutine ends inside it)"),
    ];
    for (function, needle) in cases {
        let stderr = usage_error(
            topdown()
                .args(["stat", "--pmu", "synthetic:intel-icl", "-u"])
                .arg(format!("{funcs}:{function}"))
                .args(["--", funcs, "1"]),
        );
        assert!(stderr.contains(needle), "{function}: {stderr}");
    }
}

/// `--returns uretprobe` does not give a Go binary uretprobes: they would corrupt its
/// goroutine stacks. Its functions still get exact exit-instruction probes.
#[test]
fn go_binaries_never_get_uretprobes() {
    let Some((_serial, programs)) = ready() else {
        return;
    };
    let program = path_str(&programs.goroutines);
    let (output, report) = stat(&[
        "--returns",
        "uretprobe",
        "-v",
        "-u",
        &format!("{program}:main.work"),
        "--",
        program,
        "60",
    ]);
    let work = function(&report, "main.work");
    assert_eq!(work["return_probe"], "exit");
    assert!(
        work["return_probe_reason"]
            .as_str()
            .is_some_and(|why| why.contains("a Go binary (go1.")),
        "{work}"
    );
    // 60 goroutines: kinds 0, 1, 2, 4, 5 call work, with k = 1 + i % 5 getppid calls.
    let (calls, ppids) = (0..60u64)
        .filter(|i| i % 6 != 3)
        .fold((0, 0), |(calls, ppids), i| (calls + 1, ppids + 1 + i % 5));
    assert_eq!(
        (work["calls"].as_u64(), counter(&work["inclusive"], "slots")),
        (Some(calls), ppids)
    );
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("goroutines 60 "));
}

/// cgo: C functions in a Go binary are probed as native code, per thread, and their counts
/// are in the calling Go function's (the goroutine stays on its thread during the call).
#[test]
fn cgo_functions_are_native_code_inside_go_calls() {
    let Some((_serial, programs)) = ready() else {
        return;
    };
    let cgo = path_str(&programs.cgo);
    let (output, report) = stat(&[
        "-u",
        &format!("{cgo}:c_work"),
        "-u",
        &format!("{cgo}:main.callC"),
        "--",
        cgo,
        "9",
    ]);
    assert_eq!(String::from_utf8_lossy(&output.stdout), "gocgo 9 5\n");
    let c_work = function(&report, "c_work");
    let call_c = function(&report, "main.callC");
    // 9 calls of callC(5), each one c_work(5): 5 getppid in C.
    assert_eq!(
        (
            c_work["calls"].as_u64(),
            counter(&c_work["inclusive"], "slots")
        ),
        (Some(9), 45)
    );
    assert_eq!(
        (
            call_c["calls"].as_u64(),
            counter(&call_c["inclusive"], "slots")
        ),
        (Some(9), 45)
    );
    assert_eq!(c_work["return_probe"], "exit");
}

/// Whether process `pid` has hit a uprobe: the kernel maps its `[uprobes]` page (the
/// out-of-line execution area) into a process at its first breakpoint hit.
fn hit_a_uprobe(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_else(|err| panic!("/proc/{pid}/maps: {err}"))
        .contains("[uprobes]")
}

/// `-- CMD` on a Go program probes only the command's processes (issue 21's scope rule), the
/// runtime hooks included: another process of the same binary, switching goroutines all the
/// while, never traps. With `-p` of that process, it does (the oracle can see a hit).
#[test]
fn an_untraced_go_process_never_traps() {
    let Some((_serial, programs)) = ready() else {
        return;
    };
    let program = path_str(&programs.bench);
    let spawn_switching = || {
        let child = Command::new(program)
            .args(["switches", "1000000000"])
            .env("GOMAXPROCS", "1")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Killed however the test ends.
        KilledOnDrop::new(child)
    };
    let mut beside = spawn_switching();
    let spec = format!("{program}:main.tiny");
    let (output, report) = stat(&["-u", &spec, "--", program, "calls", "100000"]);
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("calls=100000"),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert_eq!(function(&report, "main.tiny")["calls"], 100000);
    assert!(
        !hit_a_uprobe(beside.child().id()),
        "the untraced Go process hit a probe while topdown traced another one"
    );
    // The same probes given to that process with -p: it traps at once (its goroutine switches
    // reach the runtime hooks).
    let mut traced = spawn_switching();
    let pid = traced.child().id().to_string();
    stat(&["-u", &spec, "-p", &pid, "-d", "1"]);
    assert!(hit_a_uprobe(traced.child().id()), "-p {pid}: no probe hit");
    assert!(!hit_a_uprobe(beside.child().id()));
}
