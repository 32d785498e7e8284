//! The C header and static library: a C program built against them (`cc`), with exact
//! synthetic counts (root: tracepoints), and the C example run on the software model.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

/// The static library cargo built for this test run: in `target/<profile>/deps`, next to the
/// test binary (the copy in `target/<profile>` is only refreshed by `cargo build`).
fn static_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .expect("target/<profile>/deps")
        .join("libtopdown_region.a")
}

/// Compiles `source` against the static library into a fresh temporary directory: the
/// directory (the program lives as long as it) and the program's path; panics with cc's output.
fn build_c(source: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let stem = Path::new(source).file_stem().expect("a source file name");
    let output = dir.path().join(stem);
    let library = static_library();
    assert!(library.exists(), "{} was not built", library.display());
    let mut link: Vec<OsString> = vec![library.into()];
    // rustc --print native-static-libs for this crate.
    link.extend(
        [
            "-ldl",
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-lc",
        ]
        .map(OsString::from),
    );
    compile("cc", &crate_dir().join(source), &link, &output);
    (dir, output)
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles `source` with `compiler` (a C compiler is needed for these tests) against the
/// header, linking with `link`; panics with the compiler's output.
fn compile(compiler: &str, source: &Path, link: &[OsString], output: &Path) {
    run(Command::new(compiler)
        .args(["-O2", "-Wall", "-Werror", "-I"])
        .arg(crate_dir().join("include"))
        .arg(source)
        .args(link)
        .arg("-o")
        .arg(output));
}

/// Runs `command` and checks that it succeeded: its standard output and standard error.
fn run(command: &mut Command) -> (String, String) {
    let output = command
        .output()
        .unwrap_or_else(|err| panic!("running {command:?}: {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "{command:?}: exit {:?}\n{stdout}\n{stderr}",
        output.status.code()
    );
    (stdout, stderr)
}

/// A report the program wrote.
fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("the JSON")).expect("JSON")
}

#[test]
fn c_program_counts_exactly() {
    if !topdown_tests::privileged() {
        return;
    }
    let (dir, program) = build_c("tests/c/exact.c");
    let json = dir.path().join("exact.json");
    let (stdout, _) = run(Command::new(&program)
        .arg(&json)
        .env_remove("TOPDOWN_REGION_MODEL"));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "path 1");
    assert_eq!(lines[1], "misuse 1");
    assert!(
        lines[2].starts_with("write error: writing /nonexistent-directory/out.json: "),
        "{stdout}"
    );
    assert_eq!(
        lines[3],
        "second init: topdown-region is already set up (init must come before the first region)"
    );
    let report = read_json(&json);
    let function = |symbol: &str| {
        report["functions"]
            .as_array()
            .expect("functions")
            .iter()
            .find(|f| f["symbol"] == symbol)
            .unwrap_or_else(|| panic!("no region {symbol}"))
            .clone()
    };
    assert_eq!(function("c-outer")["inclusive"]["counters"]["slots"], 1334);
    assert_eq!(function("c-outer")["exclusive"]["counters"]["slots"], 1234);
    assert_eq!(function("c-inner")["inclusive"]["counters"]["slots"], 100);
    assert_eq!(function("c-inner")["target"], "region");
    assert_eq!(report["diagnostics"]["unmatched_returns"], 1);
}

#[test]
fn c_example_runs_on_the_read_fallback() {
    // The software model (cpu-clock) needs no root.
    let (dir, program) = build_c("examples/regions.c");
    let json = dir.path().join("regions.json");
    let (stdout, _) = run(Command::new(&program)
        .arg(&json)
        .env("TOPDOWN_REGION_MODEL", "software"));
    // This VM has no PMU: cpu-clock is a software event, its page offers no user read.
    assert!(
        stdout.contains("regions-c: counters read by path 1: counter cpu-clock: "),
        "{stdout}"
    );
    let report = read_json(&json);
    let functions = report["functions"].as_array().expect("functions");
    let calls: Vec<(&str, u64)> = functions
        .iter()
        .map(|f| (f["symbol"].as_str().unwrap(), f["calls"].as_u64().unwrap()))
        .collect();
    assert_eq!(calls, [("pointer_chase", 3), ("branchy", 3)]);
    for function in functions {
        let on_cpu = function["inclusive"]["counters"]["cpu-clock"]
            .as_u64()
            .unwrap();
        assert!(on_cpu > 0, "{function}");
    }
}

#[test]
fn c_example_counts_without_privileges() {
    // Regions are for programs that are not root: the software model as an ordinary user
    // (uid 65534 through setpriv when the test runs as root).
    let (dir, program) = build_c("examples/regions.c");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // SAFETY: no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut command = if root {
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&program);
        command
    } else {
        Command::new(&program)
    };
    // (setpriv comes from util-linux.)
    let (stdout, stderr) = run(command
        .env("TOPDOWN_REGION_MODEL", "software")
        .current_dir(dir.path()));
    assert!(
        stdout.contains("regions-c: counters read by path 1: "),
        "{stdout}"
    );
    let paranoid: i32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(2);
    if paranoid >= 2 {
        // Kernel-mode counting is refused: cpu-clock is opened again with the kernel excluded.
        assert!(stdout.contains("counts user mode only"), "{stdout}");
    }
    // Both regions were counted (their on-CPU time is in the summary on stderr).
    for region in [
        "pointer_chase calls=3 cpu-clock=",
        "branchy calls=3 cpu-clock=",
    ] {
        assert!(stderr.contains(region), "{stderr}");
    }
}

#[test]
fn a_setup_failure_leaves_regions_counting_calls_with_the_reason() {
    let (_dir, program) = build_c("examples/regions.c");
    let (stdout, stderr) = run(Command::new(&program).env("TOPDOWN_REGION_MODEL", "no-such-model"));
    assert!(
        stderr.starts_with(
            "regions-c: no counters: unknown model 'no-such-model': expected one of software, "
        ),
        "{stderr}"
    );
    assert!(
        stdout.contains("regions-c: counters read by path 0: unknown model 'no-such-model'"),
        "{stdout}"
    );
    for region in ["pointer_chase calls=3 ", "branchy calls=3 "] {
        assert!(stderr.contains(region), "{stderr}");
    }
}

#[test]
fn a_forked_child_counts_with_its_own_counters() {
    if !topdown_tests::privileged() {
        return;
    }
    let (dir, program) = build_c("tests/c/fork.c");
    let (parent_json, child_json) = (
        dir.path().join("parent.json"),
        dir.path().join("child.json"),
    );
    run(Command::new(&program).arg(&parent_json).arg(&child_json));
    let regions = |report: &serde_json::Value| -> Vec<(String, u64, u64)> {
        report["functions"]
            .as_array()
            .expect("functions")
            .iter()
            .map(|f| {
                (
                    f["symbol"].as_str().unwrap().to_owned(),
                    f["calls"].as_u64().unwrap(),
                    f["inclusive"]["counters"]["slots"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    // The child: only its own region, on its own counters (not the parent thread's, which
    // would show the parent's 0 getppid calls during the child's region).
    let child = read_json(&child_json);
    assert_eq!(regions(&child), [("child".to_owned(), 1, 300)]);
    // The parent: 10 + 5 calls of its own; the child's 300 were another process's.
    let parent = read_json(&parent_json);
    assert_eq!(regions(&parent), [("parent".to_owned(), 1, 15)]);
}

#[test]
fn c_and_cpp_programs_link_the_shared_library() {
    let library_dir = static_library()
        .parent()
        .expect("deps directory")
        .to_path_buf();
    let dir = tempfile::tempdir().expect("temporary directory");
    // The C example in C, and the header from C++ (its extern "C" block).
    let cpp = dir.path().join("use.cpp");
    std::fs::write(
        &cpp,
        "#include \"topdown_region.h\"\nint main() { td_region_begin(\"x\"); td_region_end(\"x\"); \
         return td_region_path() == TD_REGION_PATH_READ && td_region_misuse_count() == 0 ? 0 : 1; }\n",
    )
    .expect("writing the C++ source");
    for (compiler, source) in [("cc", crate_dir().join("examples/regions.c")), ("c++", cpp)] {
        let program = dir.path().join(format!("linked-{compiler}"));
        let link = [
            format!("-L{}", library_dir.display()),
            format!("-Wl,-rpath,{}", library_dir.display()),
            "-ltopdown_region".to_owned(),
        ]
        .map(OsString::from);
        compile(compiler, &source, &link, &program);
        run(Command::new(&program).env("TOPDOWN_REGION_MODEL", "software"));
    }
}
