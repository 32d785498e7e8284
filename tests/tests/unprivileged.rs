//! `topdown stat -- CMD` without BPF: inherited per-task counters, per process and thread.
//!
//! - a real non-root user (uid 65534, or the user running the tests when that is not root)
//!   counts a command with the software model, checked against each thread's own
//!   `CLOCK_THREAD_CPUTIME_ID`;
//! - as root, `--no-bpf` forces the same path with synthetic counters, whose per-thread and
//!   per-process values are known exactly;
//! - without privileges, the options that need BPF are refused with one line and exit 2.

use std::{
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::PathBuf,
    process::{Command, Output, Stdio},
};

use serde_json::Value;
use topdown_tests::*;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_td-workload");
/// `nobody` on Debian: no capabilities once root's are dropped by setuid.
const NOBODY: u32 = 65534;

fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A directory the unprivileged user can read and enter, holding copies of topdown and the
/// workload (the build tree may be closed to that user), and a writable `out` directory.
struct Sandbox {
    dir: PathBuf,
}

impl Sandbox {
    fn new(name: &str) -> Self {
        let dir = temp_path(&format!("unprivileged-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("out")).expect("creating the sandbox");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .expect("sandbox permissions");
        for (from, to) in [
            (topdown_bin(), "topdown"),
            (PathBuf::from(WORKLOAD), "td-workload"),
        ] {
            std::fs::copy(&from, dir.join(to))
                .unwrap_or_else(|err| panic!("copying {}: {err}", from.display()));
            std::fs::set_permissions(dir.join(to), std::fs::Permissions::from_mode(0o755))
                .expect("binary permissions");
        }
        if is_root() {
            let out = std::ffi::CString::new(dir.join("out").as_os_str().as_encoded_bytes())
                .expect("path without NUL");
            // SAFETY: a valid C string path.
            let rc = unsafe { libc::chown(out.as_ptr(), NOBODY, NOBODY) };
            assert_eq!(rc, 0, "chown of the output directory");
        }
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// topdown from the sandbox, as `nobody` when the tests run as root.
    fn topdown_unprivileged(&self) -> Command {
        let mut command = Command::new(self.path("topdown"));
        command.current_dir(&self.dir).stdin(Stdio::null());
        if is_root() {
            // std drops the supplementary groups (setgroups) before setuid from root.
            command.uid(NOBODY).gid(NOBODY);
        }
        command
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `(tid, ns)` of the workload's `cputime` lines.
fn cpu_times(stdout: &str) -> Vec<(u64, u64)> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            if words.next()? != "cputime" {
                return None;
            }
            let tid = words.next()?.strip_prefix("tid=")?.parse().ok()?;
            let ns = words.next()?.strip_prefix("ns=")?.parse().ok()?;
            Some((tid, ns))
        })
        .collect()
}

/// Every counter: totals == Σ tasks == Σ per-CPU entries, exactly (nothing else is counted
/// without BPF: idle, untracked and dropped are zero).
fn assert_tasks_add_up(report: &Value) {
    for name in report["counter_names"].as_array().expect("counter_names") {
        let name = name.as_str().expect("counter name");
        let sum = |list: &str| -> u64 {
            report[list]
                .as_array()
                .unwrap_or_else(|| panic!("{list} missing"))
                .iter()
                .map(|entry| counter(entry, name))
                .sum()
        };
        let total = counter(&report["totals"], name);
        assert_eq!(total, sum("tasks"), "tasks add up to the total of {name}");
        assert_eq!(total, sum("processes"), "processes add up for {name}");
        assert_eq!(total, sum("cpus"), "CPUs add up for {name}");
        for other in ["idle", "untracked", "dropped"] {
            assert_eq!(counter(&report[other], name), 0, "{other} {name}");
        }
    }
}

/// Steal time of all CPUs so far (`/proc/stat`'s `cpu` line, 8th value) and one clock tick, in
/// ns: its unit is USER_HZ ticks, so a difference of two readings can be short by one tick.
fn steal_ns() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let ticks: u64 = stat
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(8))
        .and_then(|value| value.parse().ok())
        .expect("steal in /proc/stat's cpu line");
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    (ticks * 1_000_000_000 / hz, 1_000_000_000 / hz)
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_non_root_user_counts_a_command_per_thread_with_software_counters() {
    let _serial = serial();
    let sandbox = Sandbox::new("software");
    let out = sandbox.path("out/report.json");
    // Two processes (the command and one child), each with a main thread and two spinning
    // threads of different lengths.
    let steal_before = steal_ns();
    let output = sandbox
        .topdown_unprivileged()
        .args(["stat", "--pmu", "software", "--format", "json", "-o"])
        .arg(&out)
        .arg("--")
        .arg(sandbox.path("td-workload"))
        .args(["--cpu-time", "--children", "1", "spin=150", "spin=40"])
        .output()
        .expect("running topdown");
    let stolen = {
        let ((before, tick), (after, _)) = (steal_before, steal_ns());
        after.saturating_sub(before) + tick
    };
    let stderr = stderr_of(&output);
    assert!(output.status.success(), "topdown failed: {stderr}");
    let notes: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("without BPF"))
        .collect();
    assert_eq!(notes.len(), 1, "one line says what is missing: {stderr}");
    assert!(
        notes[0].contains("-u") && notes[0].contains("cgroup") && notes[0].contains("-p"),
        "{stderr}"
    );
    let report = read_report(&out);
    assert_eq!(report["model"], "software");
    assert_tasks_add_up(&report);

    let oracle = cpu_times(&String::from_utf8_lossy(&output.stdout));
    let threads = workload_threads(&String::from_utf8_lossy(&output.stdout));
    // 2 processes x (main + 2 threads).
    assert_eq!(oracle.len(), 6, "cputime lines: {oracle:?}");
    assert_eq!(threads.len(), 4, "thread lines: {threads:?}");
    for (tid, truth) in &oracle {
        let task = task(&report, *tid).unwrap_or_else(|| panic!("no entry for tid {tid}"));
        assert_eq!(task["exited"], true, "tid {tid}");
        let counted = counter(task, "cpu-clock");
        // Both are the thread's on-CPU time, taken at the same context switches: cpu-clock
        // sums local_clock() while the task is scheduled in, CLOCK_THREAD_CPUTIME_ID is its
        // sum_exec_runtime. They differ by what the oracle cannot see: the thread's last
        // instructions after its reading (a printed line, the exit path) and, for a main
        // thread, the time before execve that the counters (enabled at exec) leave out.
        // Both are well under a millisecond; 3 ms + 5% leaves room for a loaded machine.
        // And on a VM the hypervisor's steal time while the thread ran: the kernel takes it
        // out of sum_exec_runtime (CONFIG_PARAVIRT_TIME_ACCOUNTING: rq clock_task), while
        // cpu-clock runs on local_clock() and keeps it. A CI run here failed by 4.1 ms of a
        // 19 ms thread; the machine's steal over the run bounds what a thread can hold.
        let tolerance = 3_000_000 + truth / 20;
        let below = truth.saturating_sub(counted);
        let above = counted.saturating_sub(*truth);
        assert!(
            below <= tolerance && above <= tolerance + stolen,
            "tid {tid}: topdown says {counted} ns, the thread itself {truth} ns \
             (steal during the run at most {stolen} ns)"
        );
    }
    // The spinning threads really did work, so the comparison above is not between zeros.
    let spinning: Vec<u64> = threads
        .iter()
        .map(|(_, _, tid)| counter(task(&report, *tid).expect("thread entry"), "cpu-clock"))
        .collect();
    assert!(spinning.iter().all(|&ns| ns > 1_000_000), "{spinning:?}");
    let pids: Vec<u64> = threads.iter().map(|(_, pid, _)| *pid).collect();
    for pid in &pids {
        let entry = process(&report, *pid).unwrap_or_else(|| panic!("no process {pid}"));
        assert_eq!(entry["threads"], 3, "process {pid}");
        let expected: u64 = report["tasks"]
            .as_array()
            .expect("tasks")
            .iter()
            .filter(|task| task["tgid"].as_u64() == Some(*pid))
            .map(|task| counter(task, "cpu-clock"))
            .sum();
        assert_eq!(counter(entry, "cpu-clock"), expected, "process {pid}");
    }

    // The recording reads back.
    let replayed = replay_json(&out, &[]);
    assert_eq!(replayed["processes"], report["processes"]);
    assert_eq!(replayed["tasks"], report["tasks"]);
}

/// The synthetic model's counters are kernel tracepoints, which a non-root user cannot count
/// at `perf_event_paranoid` 2; as root, `--no-bpf` takes the unprivileged path with them.
#[test]
fn forced_no_bpf_counts_exact_syscalls_per_process_and_thread() {
    let Some(_serial) = bpf_serial() else { return };
    let out = temp_path("test-no-bpf.json");
    let output = run_ok(synthetic_stat_to(&out).arg("--no-bpf").args([
        "--",
        WORKLOAD,
        "--children",
        "1",
        "getppid=1234",
        "getpgid=777,getppid=3",
    ]))
    .unwrap();
    let report = read_report(&out);
    let _ = std::fs::remove_file(&out);
    assert_eq!(report["synthetic"], true);
    assert_tasks_add_up(&report);
    let threads = workload_threads(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(threads.len(), 4, "{threads:?}");
    let mut pids: Vec<u64> = threads.iter().map(|(_, pid, _)| *pid).collect();
    pids.dedup();
    assert_eq!(pids.len(), 2, "the command and its child: {threads:?}");
    for (index, pid, tid) in &threads {
        let entry = task(&report, *tid).unwrap_or_else(|| panic!("no entry for tid {tid}"));
        let (slots, retiring) = if *index == 0 { (1234, 0) } else { (3, 777) };
        assert_eq!(counter(entry, "slots"), slots, "thread {index} of {pid}");
        assert_eq!(
            counter(entry, "topdown-retiring"),
            retiring,
            "thread {index} of {pid}"
        );
        assert_eq!(entry["tgid"].as_u64(), Some(*pid));
        assert_eq!(entry["exited"], true);
    }
    for pid in &pids {
        // The main threads make no getppid or getpgid calls of their own.
        let main = task(&report, *pid).unwrap_or_else(|| panic!("no main thread {pid}"));
        assert_eq!(counter(main, "slots"), 0, "main thread of {pid}");
        assert_eq!(counter(main, "topdown-retiring"), 0, "main thread of {pid}");
        let entry = process(&report, *pid).unwrap_or_else(|| panic!("no process {pid}"));
        assert_eq!(counter(entry, "slots"), 1237, "process {pid}");
        assert_eq!(counter(entry, "topdown-retiring"), 777, "process {pid}");
        assert_eq!(entry["threads"], 3, "process {pid}");
    }
    assert_eq!(counter(&report["totals"], "slots"), 2474);
    assert_eq!(counter(&report["totals"], "topdown-retiring"), 1554);
    assert_eq!(report["tasks"].as_array().map(Vec::len), Some(6));
    assert_eq!(report["diagnostics"]["unsplit_tasks"], 0);

    // CSV carries the same per-process figures.
    let csv_out = run_ok(topdown().args([
        "stat",
        "--no-bpf",
        "--pmu",
        "synthetic:intel-icl",
        "--by",
        "process",
        "--format",
        "csv",
        "--",
        WORKLOAD,
        "--main-thread",
        "getppid=321",
    ]))
    .unwrap();
    let text = String::from_utf8_lossy(&csv_out.stdout);
    // The workload's own line comes first on the shared stdout.
    let report_csv = text
        .lines()
        .filter(|line| !line.starts_with("thread "))
        .collect::<Vec<_>>()
        .join("\n");
    let mut reader = csv::Reader::from_reader(report_csv.as_bytes());
    let headers = reader.headers().expect("CSV header").clone();
    let column = |name: &str| headers.iter().position(|header| header == name);
    let (kind, slots) = (
        column("kind").expect("kind column"),
        column("slots").expect("slots column"),
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(|row| row.expect("row")).collect();
    let processes: Vec<&str> = rows
        .iter()
        .filter(|row| &row[kind] == "process")
        .map(|row| &row[slots])
        .collect();
    assert_eq!(processes, ["321"], "{text}");
}

/// Many threads of two processes exit at the same moment on both CPUs, so their exit readings
/// are written concurrently: each thread still gets exactly its own count, and none is left
/// unsplit. With one buffer per CPU for all events (which the kernel writes from one CPU at a
/// time), about half of such runs lost some threads' readings to the main thread (issue 22).
#[test]
fn threads_exiting_at_once_keep_their_own_counts() {
    let Some(_serial) = bpf_serial() else { return };
    const THREADS: u64 = 48;
    let out = temp_path("test-no-bpf-exits.json");
    // Thread i makes i + 1 getppid calls; the workload's barrier releases them all at once.
    let specs: Vec<String> = (1..=THREADS)
        .map(|calls| format!("getppid={calls}"))
        .collect();
    for run in 0..4 {
        let output = run_ok(
            synthetic_stat_to(&out)
                .arg("--no-bpf")
                .args(["--", WORKLOAD, "--children", "1"])
                .args(&specs),
        )
        .unwrap();
        let report = read_report(&out);
        let _ = std::fs::remove_file(&out);
        assert_tasks_add_up(&report);
        assert_eq!(
            report["diagnostics"]["unsplit_tasks"],
            0,
            "run {run}: {}",
            stderr_of(&output)
        );
        let threads = workload_threads(&String::from_utf8_lossy(&output.stdout));
        assert_eq!(threads.len(), 2 * THREADS as usize, "run {run}");
        for (index, pid, tid) in &threads {
            let entry = task(&report, *tid).unwrap_or_else(|| panic!("run {run}: no tid {tid}"));
            assert_eq!(
                counter(entry, "slots"),
                *index as u64 + 1,
                "run {run}: thread {index} of {pid}"
            );
        }
        for pid in threads.iter().map(|(_, pid, _)| *pid) {
            let main = task(&report, pid).unwrap_or_else(|| panic!("run {run}: no main {pid}"));
            assert_eq!(counter(main, "slots"), 0, "run {run}: main thread of {pid}");
        }
        assert_eq!(
            counter(&report["totals"], "slots"),
            THREADS * (THREADS + 1),
            "run {run}"
        );
    }
}

/// Without root, every option that needs BPF is refused in one line, with exit 2, before
/// anything runs.
#[test]
fn without_privilege_bpf_only_options_are_refused_in_one_line() {
    let _serial = serial();
    let sandbox = Sandbox::new("refusals");
    let cases: [(&[&str], &str); 6] = [
        (&["-u", "libc:malloc", "--", "true"], "-u"),
        (&["--by", "cgroup", "--", "true"], "cgroup"),
        (&["-G", "/", "--", "true"], "cgroup"),
        (&["-p", "1"], "-p"),
        (&["-a", "-d", "1"], "-a"),
        (&["-I", "100", "--", "true"], "-I"),
    ];
    let check = |output: &Output, what: &str, mode: &str| {
        let stderr = stderr_of(output);
        assert_eq!(output.status.code(), Some(2), "{mode} {what}: {stderr}");
        assert_eq!(
            stderr.lines().count(),
            1,
            "{mode} {what}: one line: {stderr}"
        );
        assert!(stderr.contains(what), "{mode} {what}: {stderr}");
    };
    for (args, what) in cases {
        let output = sandbox
            .topdown_unprivileged()
            .args(["stat", "--pmu", "software"])
            .args(args)
            .output()
            .expect("running topdown");
        check(&output, what, "unprivileged");
        let stderr = stderr_of(&output);
        assert!(stderr.contains("needs root"), "{stderr}");
        if is_root() {
            // Forced onto the same path, root gets the same refusals.
            let output = topdown()
                .args(["stat", "--no-bpf", "--pmu", "software"])
                .args(args)
                .output()
                .expect("running topdown");
            check(&output, what, "--no-bpf");
        }
    }
    // With no scope at all the default is every task (-a).
    let output = sandbox
        .topdown_unprivileged()
        .args(["stat", "--pmu", "software", "-d", "1"])
        .output()
        .expect("running topdown");
    check(&output, "-a", "unprivileged, no scope");
    // A model whose counters need the kernel is refused for what it is, not run to zeros.
    if std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .is_ok_and(|text| text.trim().parse::<i32>().is_ok_and(|level| level > 1))
    {
        let output = sandbox
            .topdown_unprivileged()
            .args(["stat", "--pmu", "synthetic:intel-icl", "--", "true"])
            .output()
            .expect("running topdown");
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(3), "{stderr}");
        assert!(stderr.contains("perf_event_paranoid"), "{stderr}");
    } else {
        skipped("kernel.perf_event_paranoid allows kernel counting: no user-space-only refusal");
    }
}

/// A task still running when the command exits has no exit record yet: its counts so far are
/// in the command's main thread, the totals stay exact, and stderr says so.
#[test]
fn a_task_left_running_is_counted_in_the_main_thread_and_said() {
    let Some(_serial) = bpf_serial() else { return };
    let out = temp_path("test-no-bpf-left.json");
    // The workload makes its 50 calls at once, then spins past the shell's exit. getsid
    // (`topdown-bad-spec`): the shell itself calls getppid at start-up, never getsid.
    let script = format!("{WORKLOAD} --spin-ms 1500 getsid=50 & sleep 0.5; exit 0");
    let output = run_ok(
        synthetic_stat_to(&out)
            .arg("--no-bpf")
            .args(["--", "sh", "-c", &script]),
    )
    .unwrap();
    let report = read_report(&out);
    let _ = std::fs::remove_file(&out);
    let stderr = stderr_of(&output);
    assert!(stderr.contains("still running at the end"), "{stderr}");
    assert_tasks_add_up(&report);
    assert_eq!(counter(&report["totals"], "topdown-bad-spec"), 50);
    let shell = report["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .find(|task| task["comm"] == "sh")
        .expect("the shell's entry");
    assert_eq!(counter(shell, "topdown-bad-spec"), 50, "{report}");
    // The workload's main thread and its one spinning thread.
    assert_eq!(report["diagnostics"]["unsplit_tasks"], 2, "{stderr}");
}
