//! Per-cgroup TopDown with real cgroup v2 groups, as root, with synthetic counters: workloads
//! with known syscall counts are moved into cgroups (named like Docker's and Kubernetes'), and
//! each cgroup must show exactly its workload's counts.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use serde_json::Value;
use topdown_tests::*;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_td-workload");
const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const POD: &str = "5f1c2a3b_1111_2222_3333_444455556666";

/// The cgroup v2 mount, from mountinfo (these machines mount it beside v1 controllers).
fn v2_mount() -> PathBuf {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mountinfo
        .lines()
        .find_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let mount_point = before.split_whitespace().nth(4)?;
            (after.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .expect("a cgroup v2 mount")
}

/// A test's cgroup tree under the v2 root, removed (deepest first) when dropped.
struct Tree {
    root: PathBuf,
    relative: String,
}

impl Tree {
    fn new(name: &str) -> Self {
        let relative = format!("/topdown-test-{name}-{}", std::process::id());
        let root = v2_mount().join(relative.trim_start_matches('/'));
        std::fs::create_dir_all(&root).unwrap();
        Self { root, relative }
    }

    fn create(&self, path: &str) -> String {
        std::fs::create_dir_all(self.root.join(path)).unwrap();
        format!("{}/{path}", self.relative)
    }

    fn dir(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let mut dirs = Vec::new();
        collect_dirs(&self.root, &mut dirs);
        dirs.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
        for dir in dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
}

/// Starts a held workload, moves it into `cgroup_dir`; `go` releases it.
fn held_workload(cgroup_dir: &Path, spec: &str) -> Child {
    let child = Command::new(WORKLOAD)
        .args(["--wait-stdin", spec])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::fs::write(cgroup_dir.join("cgroup.procs"), child.id().to_string()).unwrap();
    child
}

fn go(mut child: Child) {
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(child.wait().unwrap().success());
}

fn cgroup<'a>(report: &'a Value, path: &str) -> Option<&'a Value> {
    report["cgroups"]
        .as_array()?
        .iter()
        .find(|entry| entry["path"].as_str() == Some(path))
}

/// Runs topdown in the background with `args`, runs `during`, stops it, returns the report.
fn traced(name: &str, args: &[&str], during: impl FnOnce()) -> Value {
    traced_with("synthetic:intel-icl", name, args, during).0
}

/// `traced` with another `--pmu`; also returns what topdown printed on stderr before counting.
///
/// topdown counts until `during` is over, then gets SIGINT (a clean stop with the final
/// report). A fixed `-d 3` ended the count before the work on a loaded machine: the
/// switch-filter test's two workloads and ping-pong took longer than 3 s beside other
/// engineers' builds, and the twin's calls were missing from `untracked` (issue 22). `-d`
/// stays only as a bound should the test hang.
fn traced_with(pmu: &str, name: &str, args: &[&str], during: impl FnOnce()) -> (Value, String) {
    let out = temp_path(&format!("cgroup-{name}.json"));
    let mut tracer = topdown()
        .args([
            "stat", "-a", "-d", "300", "--pmu", pmu, "--format", "json", "-o",
        ])
        .arg(&out)
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = wait_until_counting(&mut tracer, START_TIMEOUT).unwrap();
    during();
    // SAFETY: signals the tracer this test started, still unreaped.
    unsafe { libc::kill(tracer.id() as libc::pid_t, libc::SIGINT) };
    let status = tracer.wait().unwrap();
    assert!(status.success(), "{status}");
    let report = read_report(&out);
    let _ = std::fs::remove_file(out);
    (report, stderr)
}

#[test]
fn each_cgroup_gets_exactly_its_workload_at_cgroup_switches() {
    let Some(_serial) = bpf_serial() else { return };
    // --by cgroup alone defaults to the cgroup-switches trigger.
    each_cgroup_gets_exactly_its_workload("cgroup-switch", &["--by", "cgroup"]);
}

#[test]
fn each_cgroup_gets_exactly_its_workload_at_context_switches() {
    let Some(_serial) = bpf_serial() else { return };
    each_cgroup_gets_exactly_its_workload(
        "sched-switch",
        &["--by", "cgroup", "--trigger", "sched-switch"],
    );
}

fn each_cgroup_gets_exactly_its_workload(name: &str, args: &[&str]) {
    let tree = Tree::new(name);
    let a = tree.create("a");
    let ax = tree.create("a/x");
    let b = tree.create("b");
    let docker = tree.create(&format!("system.slice/docker-{ID}.scope"));
    let kube = tree.create(&format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD}.slice/cri-containerd-{ID}.scope"
    ));
    let report = traced(name, args, || {
        let workloads = [
            held_workload(&tree.dir("a"), "getppid=100"),
            held_workload(&tree.dir("a/x"), "getppid=200"),
            held_workload(&tree.dir("b"), "getppid=300,getpgid=30"),
            held_workload(&tree.dir(&docker[tree.relative.len() + 1..]), "getppid=400"),
            held_workload(&tree.dir(&kube[tree.relative.len() + 1..]), "getppid=500"),
        ];
        for workload in workloads {
            go(workload);
        }
        // A cgroup removed during the run keeps its name and counts.
        std::fs::remove_dir(tree.dir("b")).unwrap();
    });
    let slots = |path: &str| {
        counter(
            cgroup(&report, path).unwrap_or_else(|| panic!("{path} in {report}")),
            "slots",
        )
    };
    assert_eq!(slots(&a), 100);
    assert_eq!(slots(&ax), 200);
    assert_eq!(slots(&b), 300);
    assert_eq!(
        counter(cgroup(&report, &b).unwrap(), "topdown-retiring"),
        30
    );
    assert_eq!(slots(&docker), 400);
    assert_eq!(slots(&kube), 500);

    let docker_info = &cgroup(&report, &docker).unwrap()["container"];
    assert_eq!(docker_info["runtime"], "docker");
    assert_eq!(docker_info["id"], "0123456789ab");
    let kube_info = &cgroup(&report, &kube).unwrap()["container"];
    let tasks = report["tasks"].as_array().unwrap();
    assert_eq!(
        tasks.is_empty(),
        name == "cgroup-switch",
        "per-task entries only at context switches"
    );
    assert_eq!(kube_info["runtime"], "containerd");
    assert_eq!(kube_info["pod_uid"], POD.replace('_', "-"));
    assert_eq!(kube_info["qos"], "burstable");
    assert_eq!(cgroup(&report, &a).unwrap()["container"], Value::Null);

    // Conservation across cgroups: every non-idle count is in exactly one cgroup.
    for name in report["counter_names"].as_array().unwrap() {
        let name = name.as_str().unwrap();
        let in_cgroups: u64 = report["cgroups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| counter(c, name))
            .sum();
        assert_eq!(
            in_cgroups + counter(&report["idle"], name) + counter(&report["untracked"], name),
            counter(&report["totals"], name),
            "{name}"
        );
    }
}

#[test]
fn filter_includes_descendants_only_and_depth_rolls_up() {
    let Some(_serial) = bpf_serial() else { return };
    let tree = Tree::new("filter");
    let a = tree.create("a");
    let ax = tree.create("a/x/deep");
    tree.create("b");
    let report = traced("filter", &["-G", &a, "--cgroup-depth", "2"], || {
        let workloads = [
            held_workload(&tree.dir("a"), "getppid=100"),
            held_workload(&tree.dir("a/x/deep"), "getppid=200"),
            held_workload(&tree.dir("b"), "getppid=300"),
        ];
        for workload in workloads {
            go(workload);
        }
    });
    // Depth 2 = /topdown-test-…/a: it holds its descendants' counts; nothing deeper is listed.
    assert_eq!(counter(cgroup(&report, &a).unwrap(), "slots"), 300);
    assert_eq!(
        counter(cgroup(&report, &tree.relative).unwrap(), "slots"),
        300
    );
    assert_eq!(counter(cgroup(&report, "/").unwrap(), "slots"), 300);
    assert!(cgroup(&report, &ax).is_none(), "deeper than --cgroup-depth");
    assert!(
        cgroup(&report, &format!("{}/b", tree.relative)).is_none(),
        "outside -G"
    );
    // b's 300 calls (and everything else outside -G) are untracked.
    assert!(counter(&report["untracked"], "slots") >= 300);
    assert_eq!(
        counter(&report["totals"], "slots") - counter(&report["untracked"], "slots"),
        300
    );
}

#[test]
fn a_missing_cgroup_is_a_clear_error() {
    let Some(_serial) = bpf_serial() else { return };
    let stderr =
        usage_error(topdown().args(["stat", "-a", "-d", "1", "-G", "/no/such/cgroup-xyz"]));
    assert!(
        stderr.contains("-G /no/such/cgroup-xyz: no such cgroup"),
        "{stderr}"
    );
}

fn slots_of(report: &Value, path: &str) -> u64 {
    cgroup(report, path).map_or(0, |entry| counter(entry, "slots"))
}

const TRIGGERS: [(&str, &[&str]); 2] = [
    ("cgroup-switch", &["--by", "cgroup"]),
    (
        "sched-switch",
        &["--by", "cgroup", "--trigger", "sched-switch"],
    ),
];

/// The tree `PREFIX-TRIGGER` with cgroups `a` and `b`, made afresh for one trigger of
/// [`TRIGGERS`] (where each test of a move starts): its name, the tree, and the two cgroups'
/// paths as reports name them.
fn move_tree(prefix: &str, trigger: &str) -> (String, Tree, [String; 2]) {
    let name = format!("{prefix}-{trigger}");
    let tree = Tree::new(&name);
    let cgroups = [tree.create("a"), tree.create("b")];
    (name, tree, cgroups)
}

/// Runs a workload that starts in the tree's `a` and moves itself to `b` where `spec` says
/// `move=0`.
fn run_moving_itself(tree: &Tree, spec: &str) {
    let child = Command::new(WORKLOAD)
        .arg("--wait-stdin")
        .arg("--cgroup")
        .arg(tree.dir("b"))
        .arg(spec)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::fs::write(tree.dir("a").join("cgroup.procs"), child.id().to_string()).unwrap();
    go(child);
}

/// A process that moves itself while running (`echo $$ > cgroup.procs`, from a thread other
/// than its main one) has the calls before the move in the cgroup it left, those after in the
/// new one.
#[test]
fn a_process_moving_itself_splits_exactly_at_the_move() {
    let Some(_serial) = bpf_serial() else { return };
    for (trigger, args) in TRIGGERS {
        let (name, tree, [a, b]) = move_tree("self-move", trigger);
        let (report, stderr) = traced_with("synthetic:intel-icl", &name, args, || {
            run_moving_itself(&tree, "getppid=1000,move=0,getppid=2000")
        });
        let (in_a, in_b) = (slots_of(&report, &a), slots_of(&report, &b));
        assert_eq!((in_a, in_b), (1000, 2000), "{trigger}: {stderr}");
        assert_eq!(report["diagnostics"]["unsplit_migrations"], 0, "{trigger}");
    }
}

/// Moved by someone else while asleep: its counts were credited at its switch-out, so the split
/// is exact with or without the migration hook.
#[test]
fn a_process_moved_while_asleep_splits_exactly() {
    let Some(_serial) = bpf_serial() else { return };
    for (trigger, args) in TRIGGERS {
        let (name, tree, [a, b]) = move_tree("asleep-move", trigger);
        let report = traced(&name, args, || {
            let mut child = Command::new(WORKLOAD)
                .args(["--wait-stdin", "getppid=1000,pause=0,getppid=2000"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            std::fs::write(tree.dir("a").join("cgroup.procs"), child.id().to_string()).unwrap();
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(b"go\n").unwrap();
            let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
            assert!(line.starts_with("paused"), "{line}");
            std::fs::write(tree.dir("b").join("cgroup.procs"), child.id().to_string()).unwrap();
            stdin.write_all(b"go\n").unwrap();
            assert!(child.wait().unwrap().success());
        });
        assert_eq!(
            (slots_of(&report, &a), slots_of(&report, &b)),
            (1000, 2000),
            "{trigger}"
        );
    }
}

/// On-CPU time (the `software` model's cpu-clock) of a CPU-bound process that moves itself: the
/// cgroup it moves to shows what the kernel's own accounting (`cpu.stat` usage_usec) says it
/// ran there, within 2%. The exact split is the synthetic tests' job; this is the cross-check
/// against an independent clock. The two clocks are not the same one (perf's cpu-clock is a
/// per-CPU timer, cpu.stat the scheduler's sum_exec_runtime): on an idle VM they agree to well
/// under 1%, and with the host's CPUs contended (load average ~10) they were seen 1.2% apart.
/// On a VM with paravirtual steal-time accounting (CONFIG_PARAVIRT_TIME_ACCOUNTING) the
/// scheduler's clock also leaves out the time the hypervisor ran something else, which
/// cpu-clock counts: a clean CI run saw 702 ms against 670 ms. So cpu-clock may exceed
/// cpu.stat by the steal time all CPUs reported in /proc/stat during the run (plus a tick per
/// CPU, its resolution), never fall short of it by more than 2%.
#[test]
fn on_cpu_time_after_a_self_move_matches_cpu_stat() {
    let Some(_serial) = bpf_serial() else { return };
    for (trigger, args) in TRIGGERS {
        let (name, tree, [a, b]) = move_tree("cpu-move", trigger);
        let steal_before = steal_ns();
        let (report, stderr) = traced_with("software", &name, args, || {
            run_moving_itself(&tree, "spin=700,move=0,spin=700")
        });
        let steal = steal_ns().saturating_sub(steal_before)
            + tick_ns() * std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        assert!(!stderr.contains("error"), "{trigger}: {stderr}");
        // Both the cgroup left and the one moved to: before the fix the first kept nothing of
        // the CPU's time since its last reading and the second got it (and, with the
        // cgroup-switch trigger, the idle time before the process woke up too).
        for (dir, path) in [("a", &a), ("b", &b)] {
            let stat = std::fs::read_to_string(tree.dir(dir).join("cpu.stat")).unwrap();
            let usage_ns = stat
                .lines()
                .find_map(|line| line.strip_prefix("usage_usec "))
                .unwrap()
                .parse::<u64>()
                .unwrap()
                * 1000;
            let counted = counter(cgroup(&report, path).unwrap(), "cpu-clock");
            let margin = usage_ns / 50;
            assert!(
                counted + margin >= usage_ns && counted <= usage_ns + margin + steal,
                "{trigger} {dir}: cpu-clock {counted} ns vs cpu.stat {usage_ns} ns \
                 (allowed: 2% below, 2% + {steal} ns of steal time above); diagnostics {}, \
                 cgroups {}, tasks of the workload {}",
                report["diagnostics"],
                report["cgroups"],
                serde_json::Value::Array(
                    report["tasks"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|task| task["comm"] == "td-workload")
                        .cloned()
                        .collect()
                )
            );
        }
    }
}

/// Steal time of all CPUs so far, from the `cpu` line of /proc/stat (8th value, in ticks).
fn steal_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let ticks: u64 = stat
        .lines()
        .find_map(|line| line.strip_prefix("cpu "))
        .and_then(|values| values.split_whitespace().nth(7))
        .unwrap()
        .parse()
        .unwrap();
    ticks * tick_ns()
}

/// One /proc/stat tick (USER_HZ), in nanoseconds.
fn tick_ns() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    1_000_000_000 / hz.max(1) as u64
}

/// Runs outside the test's cgroups.
const PINGPONG: &str = env!("CARGO_BIN_EXE_pingpong");

/// With `-G`, switches between tasks outside the chosen cgroups take no reading: with the only
/// process inside asleep, the readings are the baseline and final flush of each CPU (2 per
/// CPU) and one each time a CPU goes idle, against the ping-pong's 40000 switches. Then a process inside and an untraced twin
/// outside make syscalls on CPU 0 at once, beside the ping-pong: the chosen cgroup gets exactly
/// its process's calls and nothing is lost.
#[test]
fn with_a_cgroup_filter_only_switches_of_its_tasks_are_read() {
    let Some(_serial) = bpf_serial() else { return };
    let tree = Tree::new("switch-filter");
    let chosen = tree.create("chosen");
    tree.create("other");
    let sleeper = held_workload(&tree.dir("chosen"), "getppid=1");
    let activity = UntracedActivity::start();
    let report = traced(
        "switch-filter-idle",
        &["-G", &chosen, "--by", "task,cgroup"],
        || {
            let pingpong = untraced_pingpong(PINGPONG, 20_000)
                .wait_with_output()
                .unwrap();
            assert!(pingpong.status.success());
        },
    );
    let untraced = activity.since();
    go(sleeper);
    assert_few_readings(&report, untraced);
    assert_eq!(
        counter(&report["totals"], "slots"),
        counter(&report["untracked"], "slots")
    );

    let report = traced(
        "switch-filter-busy",
        &["-G", &chosen, "--by", "task,cgroup"],
        || {
            let inside = held_workload(&tree.dir("chosen"), "cpu=0,getppid=30000,getpgid=3000");
            let twin = held_workload(&tree.dir("other"), "cpu=0,getppid=50000,getpgid=5000");
            let pingpong = untraced_pingpong(PINGPONG, 20_000);
            go(inside);
            go(twin);
            assert!(pingpong.wait_with_output().unwrap().status.success());
        },
    );
    assert_eq!(counter(cgroup(&report, &chosen).unwrap(), "slots"), 30_000);
    assert_eq!(
        counter(cgroup(&report, &chosen).unwrap(), "topdown-retiring"),
        3_000
    );
    assert!(counter(&report["untracked"], "slots") >= 50_000);
    for name in report["counter_names"].as_array().unwrap() {
        let name = name.as_str().unwrap();
        let tasks: u64 = tasks_total(&report, name);
        let parts = tasks
            + counter(&report["idle"], name)
            + counter(&report["untracked"], name)
            + counter(&report["dropped"], name);
        assert_eq!(counter(&report["totals"], name), parts, "{name}");
        assert_eq!(
            counter(cgroup(&report, &chosen).unwrap(), name),
            tasks,
            "{name}: the filter's tasks are the chosen cgroup's"
        );
    }
}
