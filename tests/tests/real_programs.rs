//! Function probes on real, optimised code, as root with synthetic counters: every exit of a
//! function is an exit (indirect tail calls, cold fragments), a tail callee belongs to its
//! caller's inclusive figure, jump tables are not exits, functions the kernel cannot probe are
//! skipped by name, and single-stepped entries are announced. `-u 'libsqlite3:*'` is checked
//! against bpftrace's entry counts.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use serde_json::Value;
use topdown_tests::*;

/// `tests/workloads/exits.c` built with -O2, once per test binary.
fn exits_binary() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("real-programs");
        build_c(&dir, "exits.c", "exits", &["-O2"])
    })
}

/// The disassembly of one function of `binary`.
fn disassembly(binary: &Path, symbol: &str) -> String {
    let all = compile(
        Command::new("objdump")
            .args(["-d", "--no-show-raw-insn"])
            .arg(binary),
    );
    let header = format!("<{symbol}>:");
    all.split("\n\n")
        .find(|block| block.lines().next().is_some_and(|l| l.ends_with(&header)))
        .unwrap_or_else(|| panic!("{symbol} not in the disassembly of {}", binary.display()))
        .to_owned()
}

/// What the test relies on gcc having made of `symbol`: each of `needles` in its disassembly.
fn assert_disassembly_contains(binary: &Path, symbol: &str, needles: &[&str]) {
    let code = disassembly(binary, symbol);
    assert!(
        needles.iter().all(|needle| code.contains(needle)),
        "{needles:?} not all in\n{code}"
    );
}

/// `topdown stat --pmu synthetic:intel-icl --format json <args>`: the report and stderr.
fn stat(args: &[&str]) -> (Value, String) {
    let (report, output) = stat_json(args).unwrap();
    (report, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// `exits MODE CALLS` with only `symbol` probed: the report.
fn probed_alone(symbol: &str, mode: &str, calls: u64) -> Value {
    let exe = path_str(exits_binary());
    let probe = format!("{exe}:{symbol}");
    stat(&["-u", &probe, "--", exe, mode, &calls.to_string()]).0
}

/// No call of the report lost its return, and no tail call was cut short.
fn assert_every_return_and_tail_call_seen(report: &Value) {
    for name in ["missed_returns", "unmatched_returns", "tail_calls_cut"] {
        assert_eq!(diagnostic(report, name), 0, "{name}");
    }
}

fn diagnostic(report: &Value, name: &str) -> u64 {
    report["diagnostics"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no diagnostics.{name} in {}", report["diagnostics"]))
}

#[test]
fn cold_fragments_belong_to_their_function() {
    let Some(_serial) = bpf_serial() else { return };
    let binary = exits_binary();
    let symbols = compile(Command::new("nm").arg(binary));
    assert!(
        symbols.lines().any(|line| line.ends_with(" h.cold")),
        "gcc -O2 made no h.cold fragment: the test would prove nothing\n{symbols}"
    );
    // The fragment leaves h by a tail call to finish: an exit of h in its cold part.
    assert_disassembly_contains(binary, "h.cold", &["<finish>"]);
    let exe = binary.to_str().unwrap();
    // 100,000 calls, 1,000 through the cold part: 1 getppid each, 2 more (h.cold's and
    // finish's) on the cold path.
    let report = probed_alone("h", "cold", 100_000);
    assert_eq!(
        figures(function(&report, "h")),
        (100_000, 101_000, 0, 101_000, 0)
    );
    assert_eq!(diagnostic(&report, "missed_returns"), 0);
    assert_eq!(diagnostic(&report, "unmatched_returns"), 0);
    assert!(
        !report["functions"].to_string().contains("cold"),
        "{}",
        report["functions"]
    );
    // The fragment is no function of its own: globs do not reach it.
    let stderr = usage_error(
        topdown()
            .args(["stat", "--pmu", "synthetic:intel-icl", "-u"])
            .arg(format!("{exe}:*cold*"))
            .args(["--", exe, "cold", "1"]),
    );
    assert!(stderr.contains("no function of"));
}

#[test]
fn tail_calls_include_their_callees_and_jump_tables_are_not_exits() {
    let Some(_serial) = bpf_serial() else { return };
    let binary = exits_binary();
    // What the test is about must be in the machine code: a direct tail call, and two
    // register jumps in dispatch (its jump table and its tail call through `pointer`).
    assert_disassembly_contains(binary, "tail_direct", &["jmp", "<callee>"]);
    let dispatch = disassembly(binary, "dispatch");
    assert!(
        dispatch.matches("jmp    *%").count() >= 2,
        "no jump table and indirect tail call in\n{dispatch}"
    );
    let exe = binary.to_str().unwrap();
    let (report, _) = stat(&[
        "-u",
        &format!("{exe}:tail_direct"),
        "-u",
        &format!("{exe}:dispatch"),
        "-u",
        &format!("{exe}:handler"),
        "--",
        exe,
        "tails",
        "1000",
    ]);
    // tail_direct: its getpgid, then `jmp callee` (not probed: return-only probes) and its 3
    // getppid.
    assert_eq!(
        figures(function(&report, "tail_direct")),
        (1000, 3000, 1000, 3000, 1000)
    );
    // handler, reached by dispatch's indirect tail call: 2 getppid.
    assert_eq!(
        figures(function(&report, "handler")),
        (1000, 2000, 0, 2000, 0)
    );
    // dispatch: its switch cases (1+2+...+6 getpgid per 8 calls, 125 rounds) plus handler.
    assert_eq!(
        figures(function(&report, "dispatch")),
        (1000, 2000, 2625, 0, 2625)
    );
    let edge = find_edge(&report, Some("dispatch"), "handler")
        .unwrap_or_else(|| panic!("no dispatch -> handler in {}", report["call_tree"]));
    assert_eq!(edge["calls"], 1000);
    assert_every_return_and_tail_call_seen(&report);
}

#[test]
fn a_tail_call_through_the_plt_includes_the_library_callee() {
    let Some(_serial) = bpf_serial() else { return };
    let binary = exits_binary();
    assert_disassembly_contains(binary, "tail_libc", &["<getppid@plt>"]);
    // Its getpgid, then `jmp getppid@plt`: libc's getppid (return-only probes on its ret)
    // makes the getppid syscall inside tail_libc's call.
    let report = probed_alone("tail_libc", "plt", 500);
    assert_eq!(
        figures(function(&report, "tail_libc")),
        (500, 500, 500, 500, 500)
    );
    assert_every_return_and_tail_call_seen(&report);
}

#[test]
fn unprobeable_functions_are_skipped_by_name_and_only_nothing_fails() {
    let Some(_serial) = bpf_serial() else { return };
    // glibc's pthread_spin_lock starts with `lock` (the kernel refuses: ENOTSUPP, 524).
    let (report, stderr) = stat(&[
        "-u",
        "libc:pthread_spin_lock",
        "-u",
        "libc:getppid",
        "--",
        exits_binary().to_str().unwrap(),
        "cold",
        "17",
    ]);
    let skipped: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("skipped"))
        .collect();
    assert_eq!(
        skipped,
        [
            "topdown: skipped 1 function that cannot be probed safely: pthread_spin_lock (lock prefix)"
        ],
        "{stderr}"
    );
    // h(0) takes the cold path (2 getppid), h(1..16) the hot one (1 each).
    assert_eq!(function(&report, "getppid")["calls"], 18);

    let stderr = usage_error(topdown().args([
        "stat",
        "--pmu",
        "synthetic:intel-icl",
        "-u",
        "libc:pthread_spin_lock",
        "--",
        "true",
    ]));
    assert!(
        stderr.contains("no function can be probed") && stderr.contains("pthread_spin_lock"),
        "{stderr}"
    );
}

#[test]
fn single_stepped_entries_are_announced_and_marked_in_json() {
    let Some(_serial) = bpf_serial() else { return };
    let exe = exits_binary().to_str().unwrap();
    let (report, stderr) = stat(&[
        "-v",
        "-u",
        &format!("{exe}:starts_with_push"),
        "-u",
        &format!("{exe}:starts_with_mov"),
        "--",
        exe,
        "entries",
        "10",
    ]);
    assert!(
        stderr.contains(
            "topdown: 1 of 2 probed functions start with an instruction the kernel single-steps"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("single-stepped entry: starts_with_mov"),
        "{stderr}"
    );
    assert!(!stderr.contains("single-stepped entry: starts_with_push"));
    let push = function(&report, "starts_with_push");
    let mov = function(&report, "starts_with_mov");
    assert_eq!(
        (push["calls"].as_u64(), mov["calls"].as_u64()),
        (Some(10), Some(10))
    );
    assert_eq!(push["entry_single_step"], false);
    assert_eq!(mov["entry_single_step"], true);
}

/// Entry counts per function from bpftrace's `uprobe:LIB:*` while `command` runs.
/// Entry counts of every function of `library` in `command`'s process alone (`cpid`): other
/// sessions run the same program on this machine at the same time, and a filter by name
/// counted their calls too (3-4x the truth).
fn bpftrace_entries(library: &Path, command: &str) -> BTreeMap<String, u64> {
    let program = format!(
        "uprobe:{}:* /pid == cpid/ {{ @[probe] = count(); }}",
        library.display()
    );
    // bpftrace makes one program and one link per function (1,370 for libsqlite3).
    let limits = [
        ("BPFTRACE_MAX_PROBES", "10000"),
        ("BPFTRACE_MAX_BPF_PROGS", "10000"),
    ];
    let stdout = bpftrace(&program, command, &limits);
    let prefix = format!("@[uprobe:{}:", library.display());
    stdout
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (name, count) = rest.split_once("]: ")?;
            Some((name.to_owned(), count.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn libsqlite3_glob_matches_bpftrace_entry_counts_with_no_missed_returns() {
    let Some(_serial) = bpf_serial() else { return };
    let library = Path::new("/usr/lib/x86_64-linux-gnu/libsqlite3.so.0");
    let missing: Vec<&str> = [
        ("bpftrace", Path::new("/usr/bin/bpftrace")),
        ("sqlite3", Path::new("/usr/bin/sqlite3")),
        ("libsqlite3-0", library),
    ]
    .into_iter()
    .filter(|(_, path)| !path.exists())
    .map(|(name, _)| name)
    .collect();
    if !missing.is_empty() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{} missing: cargo xtask setup installs them",
            missing.join(", ")
        );
        skipped(&format!("{} not installed", missing.join(", ")));
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("real-programs");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("script.sql");
    std::fs::write(
        &script,
        "CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c REAL);\n\
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i<2000)\n\
           INSERT INTO t SELECT i, 'v'||i, i*0.5 FROM n;\n\
         CREATE INDEX tb ON t(b);\n\
         SELECT count(*), sum(c) FROM t WHERE b LIKE 'v1%';\n\
         UPDATE t SET c = c*2 WHERE a % 3 = 0;\n\
         DELETE FROM t WHERE a % 7 = 0;\n\
         SELECT max(a), min(b) FROM t;\n",
    )
    .unwrap();
    let script = script.to_str().unwrap();
    // The same deterministic script under each tool.
    let oracle = bpftrace_entries(
        library,
        &format!("/usr/bin/sqlite3 :memory: -init {script} .quit"),
    );
    assert!(
        oracle
            .get("sqlite3_mutex_enter")
            .is_some_and(|calls| *calls > 1000),
        "{oracle:?}"
    );
    let (report, stderr) = stat(&[
        "-u",
        "libsqlite3:*",
        "--",
        "/usr/bin/sqlite3",
        ":memory:",
        "-init",
        script,
        ".quit",
    ]);
    let mut counted: BTreeMap<String, u64> = name_counts(&report["functions"], "symbol", "calls");
    counted.retain(|_, calls| *calls > 0);
    let differing: Vec<(&String, Option<&u64>, Option<&u64>)> = oracle
        .keys()
        .chain(counted.keys())
        .map(|name| (name, oracle.get(name), counted.get(name)))
        .filter(|(_, expected, got)| expected != got)
        .collect();
    assert!(
        differing.is_empty(),
        "(function, bpftrace, topdown): {differing:?}\n{stderr}"
    );
    assert_eq!(diagnostic(&report, "missed_returns"), 0);
    assert_eq!(diagnostic(&report, "unmatched_returns"), 0);
}
