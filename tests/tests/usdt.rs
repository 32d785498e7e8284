//! USDT probes (`-U`) and spans (`--span`) end to end, as root, with synthetic counters: a C
//! program built here with sys/sdt.h (systemtap-sdt-dev), as a PIE and as a non-PIE
//! executable, whose spans make known numbers of getppid calls (`slots`), whose probe sites
//! carry every argument form with known values, and whose semaphore-guarded probe fires only
//! while a tracer enables it; and Debian's python3.11 (a non-PIE binary with semaphores),
//! against the collections Python itself counts.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

use serde_json::Value;
use topdown_tests::*;

struct Programs {
    pie: PathBuf,
    no_pie: PathBuf,
}

/// sys/sdt.h comes with systemtap-sdt-dev (`cargo xtask setup` installs it).
fn sdt_header() -> bool {
    [
        "/usr/include/sys/sdt.h",
        "/usr/include/x86_64-linux-gnu/sys/sdt.h",
    ]
    .iter()
    .any(|path| Path::new(path).exists())
}

fn programs() -> &'static Programs {
    static BUILT: OnceLock<Programs> = OnceLock::new();
    BUILT.get_or_init(|| {
        assert!(
            sdt_header(),
            "sys/sdt.h is missing: install systemtap-sdt-dev (cargo xtask setup does)"
        );
        let sources = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("workloads");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("usdt-workloads");
        std::fs::create_dir_all(&dir).unwrap();
        let build = |name: &str, flags: &[&str]| {
            let output = dir.join(name);
            compile(
                Command::new("cc")
                    .args(["-O2", "-g", "-pthread"])
                    .args(flags)
                    .arg("-o")
                    .arg(&output)
                    .arg(sources.join("usdt.c"))
                    .arg(sources.join("usdt_guarded.c")),
            );
            output
        };
        Programs {
            pie: build("usdt-pie", &["-fPIE", "-pie"]),
            no_pie: build("usdt-no-pie", &["-fno-pie", "-no-pie"]),
        }
    })
}

fn both() -> [(&'static str, &'static Path); 2] {
    let programs = programs();
    [("pie", &programs.pie), ("no-pie", &programs.no_pie)]
}

fn slots(entity: &Value) -> u64 {
    counter(entity, "slots")
}

fn spans_of(report: &Value) -> Vec<(String, String, u64, u64)> {
    let mut spans: Vec<(String, String, u64, u64)> = report["spans"]
        .as_array()
        .map(|spans| {
            spans
                .iter()
                .map(|span| {
                    (
                        span["kind"].as_str().unwrap_or_default().to_owned(),
                        span["key"].as_str().unwrap_or_default().to_owned(),
                        span["calls"].as_u64().unwrap_or(0),
                        span["abandoned"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    spans.sort();
    spans
}

/// The `request` span of `target`: test:request_start..test:request_done keyed by arg0, then
/// `more` of the spec (`,abort=...`).
fn request_span(target: &str, more: &str) -> String {
    format!("request={target}:test:request_start..test:request_done,key=arg0{more}")
}

/// The report of `--span` [`request_span`]`(target, more)` around `target ARGS`.
fn request_spans(target: &str, more: &str, args: &[&str]) -> Value {
    let spec = request_span(target, more);
    let mut all = vec!["--span", &spec, "--", target];
    all.extend(args);
    stat_json(all).unwrap().0
}

/// `topdown report -i RECORDING --by BY --format FORMAT`'s output.
fn render(recording: &Path, by: &str, format: &str) -> String {
    replay(recording, &["--by", by, "--format", format])
}

fn no_span_anomalies(report: &Value) {
    for field in [
        "overflows",
        "unmatched_ends",
        "read_failures",
        "map_full",
        "arg_read_failures",
        "open_at_exit",
    ] {
        assert_eq!(
            report["span_diagnostics"][field], 0,
            "{field}: {}",
            report["span_diagnostics"]
        );
    }
}

/// Each request makes key x N getppid calls between its start and its end; the batch around
/// them all 13 N; a request left by longjmp is closed at the next start (N, abandoned), one
/// ended by the abort probe too (2 N); string keys "alpha" (N each) and "beta" (2 N each).
#[test]
fn spans_count_exactly_what_ran_between_start_and_end() {
    let Some(_serial) = bpf_serial() else { return };
    const N: u64 = 1000;
    for (build, program) in both() {
        let target = program.display();
        let (report, _) = stat_json([
            "--span".to_owned(),
            request_span(&target.to_string(), ",abort=test:reset"),
            "--span".to_owned(),
            format!("batch={target}:test:batch_start..test:batch_done"),
            "--span".to_owned(),
            format!("named={target}:test:named_start..test:named_done,key=str:arg0"),
            "-U".to_owned(),
            format!("{target}:test:request_start"),
            "--".to_owned(),
            target.to_string(),
            "spans".to_owned(),
            N.to_string(),
        ])
        .unwrap();
        let figures = |kind: &str, key: &str| {
            let span = span(&report, kind, key)
                .unwrap_or_else(|| panic!("{build}: no {kind} {key:?} in {}", report["spans"]));
            (
                span["calls"].as_u64().unwrap(),
                slots(span),
                span["abandoned"].as_u64().unwrap(),
                span["abandoned_counters"]["slots"].as_u64().unwrap_or(0),
            )
        };
        for key in 1..=4 {
            assert_eq!(
                figures("request", &key.to_string()),
                (1, key * N, 0, 0),
                "{build}: request {key}"
            );
        }
        assert_eq!(figures("request", "9"), (0, 0, 1, N), "{build}: longjmp");
        assert_eq!(figures("request", "5"), (0, 0, 1, 2 * N), "{build}: reset");
        assert_eq!(figures("batch", ""), (1, 13 * N, 0, 0), "{build}: batch");
        assert_eq!(
            figures("named", "alpha"),
            (2, 2 * N, 0, 0),
            "{build}: alpha"
        );
        assert_eq!(figures("named", "beta"), (2, 4 * N, 0, 0), "{build}: beta");
        assert_eq!(report["spans"].as_array().map(Vec::len), Some(9), "{build}");
        assert_eq!(span(&report, "batch", "").unwrap()["key_type"], "none");
        assert_eq!(span(&report, "named", "beta").unwrap()["key_type"], "text");
        assert_eq!(
            span(&report, "request", "4").unwrap()["key_type"],
            "integer"
        );
        // The whole command made 19 N calls: the spans hold exactly theirs.
        let process = report["processes"]
            .as_array()
            .and_then(|processes| processes.first())
            .unwrap();
        assert_eq!(slots(process), 19 * N, "{build}");
        assert_eq!(report["usdt"][0]["probe"], "test:request_start");
        assert_eq!(report["usdt"][0]["hits"], 6, "{build}");
        no_span_anomalies(&report);
    }
}

/// A span whose thread is switched out in its middle while another thread of the process runs
/// a span of its own on the same CPU, and, with `migrate`, ends on another CPU: each span holds
/// exactly its own thread's calls (the thread's virtual counters), never the other's.
#[test]
fn a_span_switched_out_or_migrated_holds_only_its_own_threads_counts() {
    let Some(_serial) = bpf_serial() else { return };
    const N: u64 = 700;
    const M: u64 = 300;
    for migrate in [false, true] {
        let target = programs().pie.display().to_string();
        let (n, m) = (N.to_string(), M.to_string());
        let mut args = vec!["block", &n, &m];
        if migrate {
            args.push("migrate");
        }
        let report = request_spans(&target, "", &args);
        let figures = |key: &str| {
            let span = span(&report, "request", key)
                .unwrap_or_else(|| panic!("no request {key:?} in {}", report["spans"]));
            (span["calls"].as_u64().unwrap(), slots(span))
        };
        assert_eq!(
            figures("7"),
            (1, 2 * N),
            "migrate {migrate}: the blocked span"
        );
        assert_eq!(
            figures("8"),
            (1, M),
            "migrate {migrate}: the other thread's span"
        );
        no_span_anomalies(&report);
    }
}

/// More threads inside spans at once than `--max-stacks` allows goroutines: a thread's span
/// stack is kept in the thread (task storage), so no thread's span is dropped, as they were
/// when the stacks were a map of that size.
#[test]
fn more_threads_inside_spans_than_max_stacks_lose_nothing() {
    let Some(_serial) = bpf_serial() else { return };
    let target = programs().pie.display().to_string();
    let spec = request_span(&target, "");
    // 64 threads, each in request 5: 25 getppid, a barrier all 64 reach inside, 25 more.
    let report = stat_json([
        "--max-stacks",
        "16",
        "--span",
        &spec,
        "--",
        &target,
        "crowd",
        "64",
        "25",
    ])
    .unwrap()
    .0;
    let request = span(&report, "request", "5")
        .unwrap_or_else(|| panic!("no request 5 in {}", report["spans"]));
    assert_eq!(
        (request["calls"].as_u64(), slots(request)),
        (Some(64), 64 * 50)
    );
    no_span_anomalies(&report);
}

/// Issue 25's case for spans, exact on synthetic counters: 1000 requests of 10 slots (all
/// retiring) and 30 of 1000 (all backend bound) give one bucket of exactly 1000 spans and
/// 10000 slots and one of 30 spans and 30000, each with its own TopDown split, the p50 in the
/// first and the p99 in the second; the buckets add up to the span's figures; `report -i`
/// keeps the distribution and the table names the slow band and why.
#[test]
fn span_distributions_are_exact_and_survive_a_replay() {
    let Some(_serial) = bpf_serial() else { return };
    for (build, program) in both() {
        let target = program.display().to_string();
        let report = request_spans(&target, "", &["bands", "1000", "10", "30", "1000"]);
        let request = span(&report, "request", "6")
            .unwrap_or_else(|| panic!("{build}: no request 6 in {}", report["spans"]));
        assert_eq!(request["calls"], 1030, "{build}");
        assert_eq!(slots(request), 40_000, "{build}");
        assert_eq!(
            distribution_buckets(request),
            [(10, 12, 1000, 10_000), (896, 1024, 30, 30_000)],
            "{build}"
        );
        let distribution = &request["distribution"];
        assert_eq!(distribution["weight"], "slots");
        let (fast, slow) = (&distribution["buckets"][0], &distribution["buckets"][1]);
        assert_eq!(counter(fast, "topdown-retiring"), 10_000, "{build}");
        assert_eq!(counter(slow, "topdown-be-bound"), 30_000, "{build}");
        assert_eq!(fast["metrics"]["retiring"].as_f64(), Some(1.0), "{build}");
        assert_eq!(
            slow["metrics"]["backend_bound"].as_f64(),
            Some(1.0),
            "{build}"
        );
        // Ranks 515 and 1019.7 of 1030, interpolated in their buckets.
        let percentile = |name: &str| distribution["percentiles"][name].as_f64().unwrap();
        assert!((percentile("p50") - 11.03).abs() < 1e-9, "{distribution}");
        assert!((percentile("p99") - (896.0 + 128.0 * 19.7 / 30.0)).abs() < 1e-9);
        for name in report["counter_names"].as_array().unwrap() {
            let name = name.as_str().unwrap();
            assert_eq!(
                counter(fast, name) + counter(slow, name),
                counter(request, name),
                "{build} {name}"
            );
        }
        no_span_anomalies(&report);

        let recording = temp_path(&format!("usdt-bands-{build}.json"));
        std::fs::write(&recording, report.to_string()).unwrap();
        let render = |format: &str| render(&recording, "span", format);
        let replayed = parse_json(render("json").as_bytes()).unwrap();
        assert_eq!(
            span(&replayed, "request", "6").unwrap()["distribution"],
            request["distribution"],
            "{build}"
        );
        let table = render("table");
        let line = |band: &str| band_row(&table, "request", band);
        assert_eq!(
            line("p50"),
            [
                "request", "6", "p50", "11", "[10,", "12)", "1000", "10000", "retiring", "100%"
            ]
        );
        assert_eq!(
            line("p99"),
            [
                "request",
                "6",
                "p99",
                "980",
                "[896,",
                "1024)",
                "30",
                "30000",
                "backend_bound",
                "100%"
            ]
        );
        // The picture: a histogram for the span, a bar per bucket with its calls.
        let svg = render("svg");
        assert_eq!(
            svg.matches(r#"<g class="histogram" data-symbol="request 6">"#)
                .count(),
            1,
            "{svg}"
        );
        assert!(
            svg.contains(r#"<g class="bucket" data-low="10" data-high="12" data-calls="1000">"#)
        );
        assert!(
            svg.contains(r#"<g class="bucket" data-low="896" data-high="1024" data-calls="30">"#)
        );
        let _ = std::fs::remove_file(&recording);
    }
}

/// `test:form` has one site per operand form, each with its own spec and a known value; the
/// span keyed by arg0 has one entry per value, `R` calls each.
#[test]
fn every_argument_form_is_decoded_exactly() {
    let Some(_serial) = bpf_serial() else { return };
    const R: u64 = 3;
    let expected: Vec<(&str, &str)> = vec![
        ("8@%rax", "9223372036854710273"),
        ("-4@%ecx", "-2"),
        ("2@%dx", "57072"),
        ("1@%ah", "171"),
        ("-1@%sil", "-1"),
        ("4@%r9d", "7"),
        ("-4@$-5", "-5"),
        ("8@$123456", "123456"),
        ("4@(%rdi)", "11"),
        ("-4@4(%rdi)", "-22"),
        ("-4@(%rdi,%r10,4)", "-44"),
        ("-4@(,%r11,1)", "33"),
        ("8@sdt_global(%rip)", "1234605616436508552"),
        ("4@16+sdt_array(%rip)", "55"),
        ("-4@sdt_array+20(%rip)", "-66"),
        ("-8@(%rsp)", "-77"),
    ];
    for (build, program) in both() {
        let target = program.display();
        let (report, _) = stat_json([
            "--span".to_owned(),
            format!("form={target}:test:form..test:form_end,key=arg0"),
            "-U".to_owned(),
            format!("{target}:test:form*"),
            "--".to_owned(),
            target.to_string(),
            "forms".to_owned(),
            R.to_string(),
        ])
        .unwrap();
        for (form, value) in &expected {
            let span = span(&report, "form", value).unwrap_or_else(|| {
                panic!("{build}: {form} gave no key {value}: {}", report["spans"])
            });
            assert_eq!(span["calls"], R, "{build}: {form}");
        }
        assert_eq!(
            report["spans"].as_array().map(Vec::len),
            Some(expected.len()),
            "{build}: {}",
            report["spans"]
        );
        let hits: Vec<(String, u64)> = name_counts(&report["usdt"], "probe", "hits");
        let sites = expected.len() as u64;
        assert_eq!(
            hits,
            [
                ("test:form".to_owned(), sites * R),
                ("test:form_end".to_owned(), sites * R)
            ],
            "{build}"
        );
        no_span_anomalies(&report);
    }
}

/// The guarded probe runs only when its semaphore is nonzero: topdown enables it, through
/// uprobe.multi's ref_ctr_offsets or through the uprobe PMU's config, so every call fires and
/// is counted; without topdown none fires.
#[test]
fn a_guarded_probe_fires_only_while_topdown_enables_it() {
    let Some(_serial) = bpf_serial() else { return };
    const N: u64 = 25;
    for (build, program) in both() {
        let untraced = Command::new(program)
            .args(["guarded", "25"])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&untraced.stdout),
            "fired 0\n",
            "{build}"
        );
        for links in ["auto", "per-site"] {
            let (report, output) = stat_json([
                "--usdt-links".to_owned(),
                links.to_owned(),
                "-U".to_owned(),
                format!("{}:test:guarded", program.display()),
                "--".to_owned(),
                program.display().to_string(),
                "guarded".to_owned(),
                N.to_string(),
            ])
            .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&output.stdout),
                format!("fired {N}\n"),
                "{build} {links}"
            );
            assert_eq!(report["usdt"][0]["hits"], N, "{build} {links}");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(stderr.contains("1 with semaphores"), "{stderr}");
        }
    }
}

/// `program watch`, killed when the first value is dropped: its pid, and a function that asks it
/// for its guarded probe's semaphore (`semaphore N`).
fn semaphore_watcher(program: &Path) -> (KilledOnDrop, u32, impl FnMut() -> String) {
    let watcher = Command::new(program)
        .arg("watch")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut watcher = KilledOnDrop::new(watcher);
    let pid = watcher.child().id();
    let mut input = watcher.child().stdin.take().unwrap();
    let mut lines = BufReader::new(watcher.child().stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let semaphore = move || -> String {
        writeln!(input, "?").unwrap();
        lines.next().unwrap().unwrap()
    };
    (watcher, pid, semaphore)
}

/// A process that prints its guarded probe's semaphore on demand: 0 before topdown, 1 while
/// topdown counts it (`-p`), 0 again once topdown has detached, whether it stopped on SIGINT
/// or was killed.
#[test]
fn the_semaphore_goes_back_to_zero_when_topdown_detaches() {
    let Some(_serial) = bpf_serial() else { return };
    let program = &programs().no_pie;
    let (_watcher, pid, mut semaphore) = semaphore_watcher(program);
    assert_eq!(semaphore(), "semaphore 0");
    for (links, signal) in [
        ("auto", libc::SIGINT),
        ("auto", libc::SIGKILL),
        ("per-site", libc::SIGINT),
        ("per-site", libc::SIGKILL),
    ] {
        let mut tracer = spawn_counting(
            topdown()
                .args([
                    "stat",
                    "--pmu",
                    "synthetic:intel-icl",
                    "--usdt-links",
                    links,
                ])
                .args(["-p", &pid.to_string(), "-U"])
                .arg(format!("{}:test:guarded", program.display()))
                .stdout(Stdio::null()),
            Duration::from_secs(60),
        );
        assert_eq!(semaphore(), "semaphore 1", "{links}, counting");
        // SAFETY: signalling the child this test started.
        unsafe { libc::kill(tracer.child().id() as i32, signal) };
        let status = tracer.child().wait().unwrap();
        assert!(signal == libc::SIGKILL || status.success(), "{status}");
        assert_eq!(semaphore(), "semaphore 0", "{links}, after signal {signal}");
    }
}

/// `-- CMD` puts its USDT sites into the command's processes only (issue 21's scope rule), with
/// uprobe.multi links and with one perf link per site alike: an untraced process of the same
/// binary keeps its semaphore at 0 and never traps, while the command's guarded probe fires at
/// every call.
#[test]
fn an_untraced_process_keeps_its_semaphore_at_zero() {
    let Some(_serial) = bpf_serial() else { return };
    for links in ["auto", "per-site"] {
        untraced_process_beside(links);
    }
}

fn untraced_process_beside(links: &str) {
    let program = &programs().no_pie;
    let (_watcher, pid, mut semaphore) = semaphore_watcher(program);
    assert_eq!(semaphore(), "semaphore 0", "{links}");
    let out = temp_path(&format!("usdt-beside-{links}.json"));
    // The command fires its guarded probe 25 times, then stays a while so the watcher is
    // asked while topdown's probes are attached.
    let script = format!("{} guarded 25 && sleep 2", program.display());
    let mut tracer = spawn_counting(
        synthetic_stat_to(&out)
            .args(["--usdt-links", links])
            .arg("-U")
            .arg(format!("{}:test:guarded", program.display()))
            .args(["--", "sh", "-c", &script])
            .stdout(Stdio::piped()),
        Duration::from_secs(60),
    );
    assert_eq!(
        semaphore(),
        "semaphore 0",
        "{links}: while topdown traced the command"
    );
    let status = tracer.child().wait().unwrap();
    assert!(status.success(), "{links}: {status}");
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut tracer.child().stdout.take().unwrap(), &mut stdout).unwrap();
    assert_eq!(stdout, "fired 25\n", "{links}");
    let report = read_report(&out);
    let _ = std::fs::remove_file(&out);
    assert_eq!(report["usdt"][0]["hits"], 25, "{links}: {}", report["usdt"]);
    assert_eq!(semaphore(), "semaphore 0", "{links}: after topdown");
    assert!(
        !std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap()
            .contains("[uprobes]"),
        "{links}: the untraced process hit a probe"
    );
}

/// Python's own collection counts (gc.get_stats, read before the interpreter exits without
/// finalising) against spans between python:gc__start and gc__done keyed by the generation,
/// an argument on the stack (`-4@112(%rsp)`), in Debian's non-PIE python3.11, whose probes
/// are guarded by semaphores.
#[test]
fn python_collections_per_generation_match_pythons_own_counts() {
    if !privileged() {
        return;
    }
    let python = Path::new("/usr/bin/python3.11");
    if !python.exists() {
        skipped("no /usr/bin/python3.11 (Debian's python3.11 package)");
        return;
    }
    let _serial = serial();
    let script = "import gc, os, sys\n\
                  gc.disable()\n\
                  for generation, n in ((0, 3), (1, 5), (2, 7)):\n    \
                      for _ in range(n): gc.collect(generation)\n\
                  print(' '.join(str(stats['collections']) for stats in gc.get_stats()))\n\
                  sys.stdout.flush()\n\
                  os._exit(0)\n";
    let (report, output) = stat_json([
        "--span".to_owned(),
        format!(
            "gc={}:python:gc__start..python:gc__done,key=arg0",
            python.display()
        ),
        "--".to_owned(),
        python.display().to_string(),
        "-c".to_owned(),
        script.to_owned(),
    ])
    .unwrap();
    let counted: Vec<u64> = String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(|count| count.parse().unwrap())
        .collect();
    assert_eq!(counted.len(), 3, "{:?}", output.stdout);
    assert!(counted[1] >= 5 && counted[2] >= 7, "{counted:?}");
    for (generation, expected) in counted.iter().enumerate() {
        let calls = span(&report, "gc", &generation.to_string())
            .map_or(0, |span| span["calls"].as_u64().unwrap());
        assert_eq!(
            calls, *expected,
            "generation {generation}: {}",
            report["spans"]
        );
    }
    no_span_anomalies(&report);
}

/// Bad probes, specs and binaries: one line naming what is wrong, exit 2, nothing attached.
#[test]
fn bad_usdt_input_is_one_line_and_exit_2() {
    let Some(_serial) = bpf_serial() else { return };
    let program = programs().pie.display().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["-U".into(), format!("{program}:test:nothing")],
            "no USDT probe test:nothing in",
        ),
        (
            vec![
                "--span".into(),
                format!("x={program}:test:request_start..test:request_done,key=arg3"),
            ],
            "has 1 argument ('-4@",
        ),
        (
            vec!["--span".into(), "x=/bin/true:a:b..a:c".into()],
            "/bin/true has no USDT probes",
        ),
        (
            vec!["-U".into(), "/etc/passwd:a:b".into()],
            "not an ELF file",
        ),
        (
            vec!["-U".into(), "nothing".into()],
            "expected TARGET:PROVIDER:NAME",
        ),
        (
            vec!["--postgres".into(), "/bin/true".into()],
            "PostgreSQL must be built with --enable-dtrace",
        ),
        (
            vec![
                "--span".into(),
                format!("x={program}:test:form*..test:form_end"),
            ],
            "not by glob",
        ),
    ];
    for (args, wanted) in cases {
        let stderr = usage_error(
            topdown()
                .args(["stat", "--pmu", "synthetic:intel-icl"])
                .args(&args)
                .args(["--", "true"]),
        );
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|line| line.contains("error"))
            .collect();
        assert_eq!(errors.len(), 1, "{args:?}: {stderr}");
        assert!(errors[0].contains(wanted), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// `spans[]` is read back by `report -i`, recomputed, and rendered in every format.
#[test]
fn span_reports_round_trip_through_report_input() {
    let Some(_serial) = bpf_serial() else { return };
    let target = programs().pie.display().to_string();
    let recorded = request_spans(&target, ",abort=test:reset", &["spans", "100"]);
    let recording = temp_path("usdt-rec.json");
    std::fs::write(&recording, recorded.to_string()).unwrap();
    let render = |format: &str| render(&recording, "query", format);
    let again = parse_json(render("json").as_bytes()).unwrap();
    assert_eq!(spans_of(&again), spans_of(&recorded));
    for (read, written) in again["spans"]
        .as_array()
        .unwrap()
        .iter()
        .zip(recorded["spans"].as_array().unwrap())
    {
        assert_eq!(read["counters"], written["counters"]);
        assert_eq!(read["abandoned_counters"], written["abandoned_counters"]);
    }
    let table = render("table");
    assert!(
        table.contains("Spans (") && table.contains("request  4"),
        "{table}"
    );
    let csv = render("csv");
    let rows: Vec<&str> = csv
        .lines()
        .filter(|line| line.starts_with(",span,"))
        .collect();
    assert_eq!(rows.len(), 6, "{csv}");
    assert!(
        csv.lines()
            .next()
            .unwrap()
            .contains(",calls,span,key,abandoned,")
    );
    let svg = render("svg");
    assert_eq!(svg.matches(r#"<g class="bar""#).count(), 6, "{svg}");
    let _ = std::fs::remove_file(&recording);
}
