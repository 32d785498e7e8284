//! `topdown serve` end to end: a workload with known syscall counts under synthetic counters,
//! the exporter's /metrics linted by promtool, scraped by a real Prometheus server (Debian's
//! package, installed by `cargo xtask setup`), and the stored series queried back.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use topdown_tests::*;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_td-workload");

/// A free loopback port.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

/// `GET path` on loopback; the status code and body.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The value of the first sample line starting with `prefix`.
fn sample(metrics: &str, prefix: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

fn wait_for<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(value) = probe() {
            return Some(value);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// Kills the child when the test ends, however it ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn prometheus_scrapes_exact_counts_from_the_exporter() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let port = free_port();
    let exporter = topdown()
        .args([
            "serve",
            "--pmu",
            "synthetic:intel-icl",
            "--refresh-ms",
            "200",
        ])
        .args([
            "--by",
            "cgroup,process",
            "--listen",
            &format!("127.0.0.1:{port}"),
            // An extra event, exported per entity beside the slots.
            "-e",
            "syscalls:sys_enter_getcwd",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting topdown serve");
    let mut exporter = Reaped(exporter);
    wait_for(Duration::from_secs(20), || {
        http_get(port, "/healthz").filter(|(status, _)| *status == 200)
    })
    .expect("the exporter becomes healthy");

    // 1234 getppid (slots) and 400 getpgid (topdown-retiring) in one process named
    // td-workload: retiring = 400/SUM with SUM = 400 -> 1.0, so 1234 slots of retiring. And
    // 77 getcwd, the -e event.
    run_ok(Command::new(WORKLOAD).arg("getppid=1234,getpgid=400,getcwd=77")).unwrap();
    let total =
        r#"topdown_process_slots_total{category="total",comm="td-workload",model="intel-icl"}"#;
    let retiring =
        r#"topdown_process_slots_total{category="retiring",comm="td-workload",model="intel-icl"}"#;
    let metrics = wait_for(Duration::from_secs(10), || {
        let (_, body) = http_get(port, "/metrics")?;
        (sample(&body, total) == Some(1234.0)).then_some(body)
    })
    .expect("the workload's 1234 slots in /metrics");
    assert_eq!(sample(&metrics, retiring), Some(1234.0), "{metrics}");
    assert_eq!(
        sample(
            &metrics,
            r#"topdown_process_events_total{comm="td-workload",event="syscalls:sys_enter_getcwd"}"#
        ),
        Some(77.0),
        "{metrics}"
    );
    assert!(
        metrics.contains("topdown_cgroup_events_total{"),
        "{metrics}"
    );
    assert!(metrics.contains("topdown_cgroup_slots_total{"), "{metrics}");
    assert!(metrics.contains(r#"topdown_build_info{model="intel-icl",synthetic="true""#));
    // Read-only: anything but GET/HEAD is refused, and only two paths exist.
    assert_eq!(http_get(port, "/").map(|(status, _)| status), Some(404));

    // promtool lints the exposition.
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (cargo xtask setup installs Debian's prometheus package)");
    promtool
        .stdin
        .take()
        .expect("stdin")
        .write_all(metrics.as_bytes())
        .unwrap();
    let linted = promtool.wait_with_output().unwrap();
    assert!(
        linted.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&linted.stdout),
        String::from_utf8_lossy(&linted.stderr)
    );

    // A real Prometheus scrapes it every second; the stored series comes back through its API.
    let prometheus_port = free_port();
    let storage = std::env::temp_dir().join(format!("topdown-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&storage);
    std::fs::create_dir_all(&storage).unwrap();
    let config = storage.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: topdown\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .unwrap();
    let prometheus = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            storage.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus (Debian's package)");
    let _prometheus = Reaped(prometheus);
    let query = "/api/v1/query?query=topdown_process_slots_total%7Bcomm%3D%22td-workload%22%2Ccategory%3D%22total%22%7D";
    let stored = wait_for(Duration::from_secs(60), || {
        let (status, body) = http_get(prometheus_port, query)?;
        let json: Value = serde_json::from_str(&body).ok()?;
        let value = json["data"]["result"][0]["value"][1].as_str()?.to_owned();
        (status == 200).then_some(value)
    })
    .expect("Prometheus stored the series");
    assert_eq!(stored, "1234");
    let job = wait_for(Duration::from_secs(10), || {
        let (_, body) = http_get(
            prometheus_port,
            "/api/v1/query?query=up%7Bjob%3D%22topdown%22%7D",
        )?;
        let json: Value = serde_json::from_str(&body).ok()?;
        json["data"]["result"][0]["value"][1]
            .as_str()
            .map(str::to_owned)
    });
    assert_eq!(job.as_deref(), Some("1"));

    // SIGTERM detaches everything and exits 0.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(exporter.0.id() as i32, libc::SIGTERM) };
    let status = exporter.0.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let mut stderr = String::new();
    if let Some(mut pipe) = exporter.0.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    assert!(
        stderr.contains("every probe and BPF program is detached"),
        "{stderr}"
    );
    // The kernel frees programs shortly after their last fd closes (deferred work).
    let ours = |names: &[String]| {
        names
            .iter()
            .any(|name| name == "sched_switch" || name == "flush")
    };
    let gone = wait_for(Duration::from_secs(10), || {
        let programs = loaded_bpf_program_names().ok()?;
        (!ours(&programs)).then_some(())
    });
    assert!(
        gone.is_some(),
        "programs left loaded: {:?}",
        loaded_bpf_program_names()
    );
    let _ = std::fs::remove_dir_all(&storage);
}

/// `GET /metrics` on the first connection the exporter's socket accepts: it binds before
/// loading BPF, so the request waits in the listen backlog and is answered as soon as the
/// HTTP server runs, racing the first refresh.
fn first_metrics(port: u16) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut stream = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => break stream,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Err(err) => panic!("the exporter never listened on {port}: {err}"),
        }
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

#[test]
fn the_first_scrape_describes_the_exporter_and_the_first_refresh_is_at_start() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let port = free_port();
    let mut command = topdown();
    command
        .args(["serve", "--pmu", "synthetic:intel-icl"])
        // No refresh but the first one for a minute: whatever counts below comes from it.
        .args(["--refresh-ms", "60000", "--by", "process"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let _exporter = Reaped(command.spawn().expect("starting topdown serve"));
    let info = format!(
        r#"topdown_build_info{{model="intel-icl",synthetic="true",version="{}"}} 1"#,
        env!("CARGO_PKG_VERSION")
    );
    let (status, first) = first_metrics(port);
    assert_eq!(status, 200, "{first}");
    assert!(first.lines().any(|line| line == info), "{first}");
    // Before the first refresh: the starting series, down (as /healthz's 503); after it: up.
    let state = (
        sample(&first, "topdown_up "),
        sample(&first, "topdown_refreshes_total "),
    );
    assert!(
        state == (Some(0.0), Some(0.0)) || state == (Some(1.0), Some(1.0)),
        "{state:?} in:\n{first}"
    );
    eprintln!(
        "first scrape: {}",
        if state.1 == Some(0.0) {
            "before the first refresh"
        } else {
            "after the first refresh"
        }
    );
    // The first refresh runs at start, not one --refresh-ms later.
    let started = Instant::now();
    wait_for(Duration::from_secs(20), || {
        http_get(port, "/healthz").filter(|(status, _)| *status == 200)
    })
    .expect("healthy after the first refresh, long before 60 s");
    let (status, metrics) = http_get(port, "/metrics").expect("/metrics");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(status, 200);
    assert!(metrics.lines().any(|line| line == info), "{metrics}");
    assert_eq!(sample(&metrics, "topdown_up "), Some(1.0), "{metrics}");
    assert_eq!(
        sample(&metrics, "topdown_refreshes_total "),
        Some(1.0),
        "{metrics}"
    );
}

#[test]
fn serve_refuses_bad_setups_with_one_line() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    // A port already in use: usage error before any BPF is loaded.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let output = topdown()
        .args([
            "serve",
            "--pmu",
            "synthetic:intel-icl",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot listen on 127.0.0.1:"), "{stderr}");
    let output = topdown()
        .args(["serve", "--listen", "not-an-address"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

/// The C workload of the function tests, built once into a directory of its own.
fn funcs_binary(dir_name: &str) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(dir_name);
    std::fs::create_dir_all(&dir).unwrap();
    let binary = dir.join("funcs");
    let source = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("workloads/funcs.c");
    let output = Command::new("cc")
        .args(["-O0", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("cc");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    binary
}

fn start_serve(port: u16, extra: &[&str]) -> Reaped {
    let mut command = topdown();
    command
        .args([
            "serve",
            "--pmu",
            "synthetic:intel-icl",
            "--refresh-ms",
            "200",
        ])
        .args(["--by", "process", "--listen", &format!("127.0.0.1:{port}")])
        .args(extra);
    start_healthy(port, command)
}

/// Starts a `topdown serve` command and waits until it answers /healthz on `port`.
fn start_healthy(port: u16, mut command: Command) -> Reaped {
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting topdown serve");
    let exporter = Reaped(child);
    wait_for(Duration::from_secs(20), || {
        http_get(port, "/healthz").filter(|(status, _)| *status == 200)
    })
    .expect("the exporter becomes healthy");
    exporter
}

fn stop_and_read_stderr(mut exporter: Reaped) -> String {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(exporter.0.id() as i32, libc::SIGTERM) };
    let _ = exporter.0.wait();
    let mut stderr = String::new();
    if let Some(mut pipe) = exporter.0.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    stderr
}

#[test]
fn a_target_replaced_on_disk_is_re_attached() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let built = funcs_binary("serve-replace");
    let target = built.with_file_name("deployed-funcs");
    std::fs::copy(&built, &target).unwrap();
    let port = free_port();
    let exporter = start_serve(port, &["-u", &format!("{}:leaf", target.display())]);
    let calls = format!(
        r#"topdown_function_calls_total{{function="leaf",target="{}"}}"#,
        target.display()
    );
    // leafmid 2 3 1: leaf runs 2 times from mid and once from main.
    run_ok(Command::new(&target).args(["leafmid", "2", "3", "1"])).unwrap();
    wait_for(Duration::from_secs(10), || {
        let (_, body) = http_get(port, "/metrics")?;
        (sample(&body, &calls) == Some(3.0)).then_some(())
    })
    .expect("3 calls of leaf before the deploy");
    // A deploy: a new file renamed over the old one (a new inode; the old probes no longer
    // see the program run from the path).
    let staged = target.with_file_name("deployed-funcs.new");
    std::fs::copy(&built, &staged).unwrap();
    std::fs::rename(&staged, &target).unwrap();
    wait_for(Duration::from_secs(10), || {
        let (_, body) = http_get(port, "/metrics")?;
        (sample(&body, "topdown_probe_reattachments_total") == Some(1.0)).then_some(())
    })
    .expect("the probes are re-attached to the new file");
    // The restarted service reaches the new build through an exec, as a supervisor's wrapper
    // script would: probes follow the file, whichever process maps it.
    run_ok(
        Command::new("sh")
            .arg("-c")
            .arg(format!("exec {} leafmid 2 3 1", target.display())),
    )
    .unwrap();
    wait_for(Duration::from_secs(10), || {
        let (_, body) = http_get(port, "/metrics")?;
        (sample(&body, &calls) == Some(6.0)).then_some(())
    })
    .expect("the new build's 3 calls are counted too");
    let stderr = stop_and_read_stderr(exporter);
    assert!(
        stderr.contains("re-attaching function probes: replaced on disk"),
        "{stderr}"
    );
}

#[test]
fn the_overhead_guard_detaches_the_busiest_function() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let binary = funcs_binary("serve-overhead");
    let port = free_port();
    // A budget no probe can meet: the guard must detach leaf (the most called), then mid.
    let exporter = start_serve(
        port,
        &[
            "--max-overhead",
            "0.000001",
            "-u",
            &format!("{}:leaf", binary.display()),
            "-u",
            &format!("{}:mid", binary.display()),
        ],
    );
    let detached = format!(
        r#"topdown_probes_detached_total{{function="leaf",target="{}"}}"#,
        binary.display()
    );
    let found = wait_for(Duration::from_secs(30), || {
        run_ok(Command::new(&binary).args(["leafmid", "50", "20", "1"])).ok()?;
        let (_, body) = http_get(port, "/metrics")?;
        (sample(&body, &detached) == Some(1.0)).then_some(body)
    })
    .expect("leaf detached by the guard");
    assert!(
        sample(&found, "topdown_overhead_percent").is_some(),
        "{found}"
    );
    let stderr = stop_and_read_stderr(exporter);
    assert!(
        stderr.contains("> --max-overhead 0.000001%: detaching leaf"),
        "{stderr}"
    );
}

#[test]
fn kill_9_leaves_no_probe_or_program_behind() {
    /// The programs a process holds (through program or link fds): `(id, name)`, from
    /// /proc/PID/fdinfo's `prog_id` and the kernel's name for each id.
    fn held_programs(pid: u32) -> Vec<(u32, String)> {
        let mut held = Vec::new();
        for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).unwrap() {
            let info = std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
            let id = info
                .lines()
                .find_map(|line| line.strip_prefix("prog_id:"))
                .map(|id| id.trim().parse::<u32>().unwrap());
            if let Some(id) = id
                && !held.iter().any(|(known, _)| *known == id)
            {
                held.push((id, program_name(id).expect("a held program is loaded")));
            }
        }
        held.sort();
        held
    }
    /// The kernel's name of program `id`, or `None` once no such program is loaded.
    fn program_name(id: u32) -> Option<String> {
        // BPF_PROG_GET_FD_BY_ID (13): prog_id first in union bpf_attr.
        let mut get_fd = [0u32; 4];
        get_fd[0] = id;
        // SAFETY: a valid attr buffer of the size passed.
        let fd = unsafe { libc::syscall(libc::SYS_bpf, 13, get_fd.as_mut_ptr(), 16) };
        if fd < 0 {
            return None;
        }
        // BPF_OBJ_GET_INFO_BY_FD (15); struct bpf_prog_info's name is at offset 64, 16 bytes.
        let mut info = [0u8; 256];
        let attr = [
            (fd as u64) | ((info.len() as u64) << 32),
            info.as_mut_ptr() as u64,
        ];
        // SAFETY: info is writable for info.len() bytes.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, 15, attr.as_ptr(), 16) };
        // SAFETY: closing the fd we got.
        unsafe { libc::close(fd as i32) };
        (rc == 0).then(|| {
            let name = &info[64..80];
            let len = name.iter().position(|&b| b == 0).unwrap_or(16);
            String::from_utf8_lossy(&name[..len]).into_owned()
        })
    }

    let _serial = serial();
    if !privileged() {
        return;
    }
    let binary = funcs_binary("serve-kill");
    let port = free_port();
    let mut exporter = start_serve(port, &["-u", &format!("{}:leaf", binary.display())]);
    let uprobe_events =
        || std::fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap_or_default();
    let events_before = uprobe_events();
    // The kernel keeps 15 bytes of a program's name (BPF_OBJ_NAME_LEN 16 with the NUL).
    let kernel_name = |name: &str| name[..name.len().min(15)].to_owned();
    let ours: Vec<String> = topdown_common::names::PROGRAMS
        .iter()
        .map(|name| kernel_name(name))
        .collect();
    let held = held_programs(exporter.0.id());
    let held_names: Vec<&str> = held.iter().map(|(_, name)| name.as_str()).collect();
    for name in &held_names {
        assert!(
            ours.contains(&name.to_string()),
            "{name} is not topdown's: {held:?}"
        );
    }
    // This configuration loads the switch, the flush and both function-probe sides (as
    // uprobe.multi links where the kernel has them).
    let multi = held_names.contains(&kernel_name("func_entry_multi").as_str());
    // `--returns auto` gives this plain C program uretprobes.
    let (entry, ret) = if multi {
        ("func_entry_multi", "func_return_multi")
    } else {
        ("func_entry", "func_return")
    };
    for name in ["sched_switch", "flush", entry, ret] {
        assert!(
            held_names.contains(&kernel_name(name).as_str()),
            "{name} not loaded: {held:?}"
        );
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(exporter.0.id() as i32, libc::SIGKILL) };
    let _ = exporter.0.wait();
    let left = || -> Vec<(u32, String)> {
        held.iter()
            .filter_map(|(id, _)| program_name(*id).map(|name| (*id, name)))
            .collect()
    };
    let gone = wait_for(Duration::from_secs(10), || left().is_empty().then_some(()));
    assert!(gone.is_some(), "left loaded: {:?}", left());
    // Probes are perf-event links owned by file descriptors, never tracefs uprobe_events entries
    // that could outlive the process.
    assert_eq!(uprobe_events(), events_before);
    assert!(!uprobe_events().contains("topdown"));
}

/// Brings the CPU back online however the test ends.
struct Online(&'static str);

impl Drop for Online {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0, "1");
    }
}

#[test]
fn a_cpu_going_offline_and_back_keeps_counting() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    const CPU1: &str = "/sys/devices/system/cpu/cpu1/online";
    if std::fs::read_to_string(CPU1)
        .map(|text| text.trim() != "1")
        .unwrap_or(true)
    {
        skipped("no hot-pluggable, online CPU 1 here");
        return;
    }
    let out = std::env::temp_dir().join(format!("topdown-hotplug-{}.json", std::process::id()));
    let mut tracer = topdown()
        .args([
            "stat",
            "-a",
            "--pmu",
            "synthetic:intel-icl",
            "-d",
            "8",
            "--format",
            "json",
            "-o",
        ])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until_counting(&mut tracer, Duration::from_secs(30)).unwrap();
    let online = Online(CPU1);
    std::fs::write(CPU1, "0").unwrap();
    let pinned = |cpu: &str, spec: &str| {
        let output = run_ok(Command::new("taskset").args(["-c", cpu, WORKLOAD, spec])).unwrap();
        workload_threads(&String::from_utf8_lossy(&output.stdout))[0].2
    };
    let on_zero = pinned("0", "getppid=100");
    std::fs::write(CPU1, "1").unwrap();
    drop(online);
    // topdown polls the online CPUs every second and re-opens a returning CPU's counters.
    std::thread::sleep(Duration::from_millis(2500));
    let on_one = pinned("1", "getppid=77");
    let status = tracer.wait().unwrap();
    assert!(status.success());
    let report = parse_json(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(
        counter(task(&report, on_zero).expect("task on CPU 0"), "slots"),
        100
    );
    assert_eq!(
        counter(task(&report, on_one).expect("task on CPU 1"), "slots"),
        77
    );
    let _ = std::fs::remove_file(out);
}

#[test]
fn sighup_re_resolves_and_re_attaches_the_function_probes() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let binary = funcs_binary("serve-sighup");
    let port = free_port();
    let exporter = start_serve(port, &["-u", &format!("{}:leaf", binary.display())]);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(exporter.0.id() as i32, libc::SIGHUP) };
    wait_for(Duration::from_secs(10), || {
        let (_, body) = http_get(port, "/metrics")?;
        (sample(&body, "topdown_probe_reattachments_total") == Some(1.0)).then_some(())
    })
    .expect("SIGHUP re-attaches");
    // Still counting, through the new links.
    run_ok(Command::new(&binary).args(["leafmid", "1", "4", "0"])).unwrap();
    let calls = format!(
        r#"topdown_function_calls_total{{function="leaf",target="{}"}}"#,
        binary.display()
    );
    wait_for(Duration::from_secs(10), || {
        let (_, body) = http_get(port, "/metrics")?;
        (sample(&body, &calls) == Some(2.0)).then_some(())
    })
    .expect("leaf counted after SIGHUP");
    let stderr = stop_and_read_stderr(exporter);
    assert!(
        stderr.contains("re-attaching function probes: SIGHUP"),
        "{stderr}"
    );
}

#[test]
fn sighup_reloads_the_config_file_live_and_keeps_running_on_a_bad_one() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let binary = funcs_binary("serve-config");
    let port = free_port();
    let config = binary.with_file_name("topdown.conf");
    let common = format!(
        "# topdown serve's options\n--pmu synthetic:intel-icl\n--refresh-ms 200\n--by process\n--listen 127.0.0.1:{port}\n"
    );
    std::fs::write(&config, format!("{common}-u {}:leaf\n", binary.display())).unwrap();
    // It listens where the file says.
    let mut command = topdown();
    command.args(["serve", "--config"]).arg(&config);
    let exporter = start_healthy(port, command);
    let series = |metric: &str, function: &str| {
        format!(
            r#"{metric}{{category="total",function="{function}",model="intel-icl",target="{}"}}"#,
            binary.display()
        )
    };
    let calls = |function: &str| {
        format!(
            r#"topdown_function_calls_total{{function="{function}",target="{}"}}"#,
            binary.display()
        )
    };
    let metrics_when = |what: &str, check: &dyn Fn(&str) -> bool| {
        wait_for(Duration::from_secs(10), || {
            let (_, body) = http_get(port, "/metrics")?;
            check(&body).then_some(body)
        })
        .unwrap_or_else(|| panic!("{what}"))
    };
    // mid(2 x leaf(5), 3 getpgid), then leaf(5): leaf 3 calls, 15 getppid (slots).
    run_ok(Command::new(&binary).args(["leafmid", "2", "5", "3"])).unwrap();
    metrics_when("leaf counted from the file's -u", &|body| {
        sample(body, &calls("leaf")) == Some(3.0)
            && sample(
                body,
                &series("topdown_function_inclusive_slots_total", "leaf"),
            ) == Some(15.0)
    });

    // Probe mid instead, and move the listener (which needs a restart, so it stays).
    let moved = free_port();
    std::fs::write(
        &config,
        format!(
            "{}-u {}:mid\n--max-series 50\n",
            common.replace(&port.to_string(), &moved.to_string()),
            binary.display()
        ),
    )
    .unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(exporter.0.id() as i32, libc::SIGHUP) };
    metrics_when("the reload is applied", &|body| {
        sample(body, r#"topdown_config_reloads_total{result="applied"}"#) == Some(1.0)
    });
    run_ok(Command::new(&binary).args(["leafmid", "2", "5", "3"])).unwrap();
    let body = metrics_when("mid counted after the reload", &|body| {
        sample(body, &calls("mid")) == Some(1.0)
    });
    // mid's inclusive slots: its two leaf(5) calls; leaf is no longer probed.
    assert_eq!(
        sample(
            &body,
            &series("topdown_function_inclusive_slots_total", "mid")
        ),
        Some(10.0),
        "{body}"
    );
    assert_eq!(sample(&body, &calls("leaf")), Some(3.0), "{body}");

    // A typo: nothing changes, mid stays probed.
    std::fs::write(
        &config,
        format!("{common}-u {}:no_such_function\n", binary.display()),
    )
    .unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(exporter.0.id() as i32, libc::SIGHUP) };
    metrics_when("the bad reload is refused", &|body| {
        sample(body, r#"topdown_config_reloads_total{result="failed"}"#) == Some(1.0)
    });
    run_ok(Command::new(&binary).args(["leafmid", "2", "5", "3"])).unwrap();
    metrics_when("mid still counted after a refused reload", &|body| {
        sample(body, &calls("mid")) == Some(2.0)
    });

    let stderr = stop_and_read_stderr(exporter);
    let path = config.display();
    for expected in [
        format!(
            "topdown: SIGHUP: reloaded {path}: -u {}:mid, --max-series 50",
            binary.display()
        ),
        format!("topdown: SIGHUP: {path} changes options other than"),
        format!("topdown: SIGHUP: {path} not applied, the running configuration stays"),
        "no_such_function".to_owned(),
    ] {
        assert!(
            stderr.contains(&expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
}

/// `text` for a URL's query string: everything but unreserved characters percent-encoded
/// (RFC 3986, section 2.3).
fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// Every target `expr` of the dashboard's panels (repeated rows included), in panel order.
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|panel| panel["targets"].as_array().cloned().unwrap_or_default())
        .map(|target| target["expr"].as_str().expect("expr").to_owned())
        .collect()
}

/// The dashboard's template variables replaced as Grafana would with one choice made:
/// concrete values where the test knows them, `.*` (Grafana's "All" here) for containers,
/// which a host without containers does not label.
fn substitute(expr: &str, instance: &str) -> String {
    expr.replace("$__rate_interval", "20s")
        .replace("$job", "topdown")
        .replace("$instance", instance)
        .replace("$container", ".*")
        .replace("$function", "mid|leaf")
        .replace("$topn", "10")
}

#[test]
fn every_query_of_the_grafana_dashboard_returns_data() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/grafana-dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // A Grafana model: a schema version, a Prometheus data source variable the panels use,
    // and every panel placed on the grid.
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36);
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let names: Vec<&str> = variables
        .iter()
        .map(|variable| variable["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "datasource",
            "job",
            "instance",
            "container",
            "function",
            "topn"
        ]
    );
    assert_eq!(variables[0]["query"], "prometheus");
    for panel in dashboard["panels"].as_array().unwrap() {
        for key in ["h", "w", "x", "y"] {
            assert!(panel["gridPos"][key].is_u64(), "{panel}");
        }
        if panel["type"] != "row" {
            assert_eq!(panel["datasource"]["uid"], "${datasource}", "{panel}");
        }
    }
    let exprs = dashboard_exprs(&dashboard);
    assert_eq!(exprs.len(), 16);

    let binary = funcs_binary("serve-dashboard");
    let port = free_port();
    let _exporter = start_serve(
        port,
        &[
            "--by",
            "cgroup,process",
            // Measured (and exported) only with a budget; this one is never exceeded.
            "--max-overhead",
            "100",
            "-u",
            &format!("{}:mid", binary.display()),
            "-u",
            &format!("{}:leaf", binary.display()),
        ],
    );

    let prometheus_port = free_port();
    let storage = std::env::temp_dir().join(format!("topdown-dashboard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&storage);
    std::fs::create_dir_all(&storage).unwrap();
    let config = storage.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: topdown\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .unwrap();
    let prometheus = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            storage.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus (Debian's package)");
    let _prometheus = Reaped(prometheus);

    // Work that never stops while the queries run, so every rate() has increases to divide:
    // mid calls leaf 20 x 50 getppid (slots) and makes 10 getpgid; td-workload adds a process.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let working = {
        let stop = stop.clone();
        let binary = binary.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                run_ok(Command::new(&binary).args(["leafmid", "20", "50", "10"])).unwrap();
                run_ok(Command::new(WORKLOAD).arg("getppid=2000,getpgid=500")).unwrap();
            }
        })
    };

    let instance = format!("127.0.0.1:{port}");
    let mut answers = Vec::new();
    for expr in &exprs {
        let query = substitute(expr, &instance);
        assert!(!query.contains('$'), "a variable left in {query}");
        let result = wait_for(Duration::from_secs(60), || {
            let (status, body) = http_get(
                prometheus_port,
                &format!("/api/v1/query?query={}", url_encode(&query)),
            )?;
            let json: Value = serde_json::from_str(&body).ok()?;
            let result = json["data"]["result"].as_array()?.clone();
            // Every sample a number (no 0/0 from a rate without increases).
            let finite = result.iter().all(|sample| {
                sample["value"][1]
                    .as_str()
                    .and_then(|value| value.parse::<f64>().ok())
                    .is_some_and(f64::is_finite)
            });
            (status == 200 && !result.is_empty() && finite).then_some(result)
        });
        answers.push((query, result));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    working.join().unwrap();
    let empty: Vec<&String> = answers
        .iter()
        .filter(|(_, result)| result.is_none())
        .map(|(query, _)| query)
        .collect();
    assert!(empty.is_empty(), "queries without data: {empty:#?}");
    // The fractions of mid's four level-1 categories add up to 1 (leaf makes only getppid,
    // the synthetic slots, so its categories have no value to divide).
    let per_function = answers[5].1.as_ref().unwrap();
    let mid: Vec<f64> = per_function
        .iter()
        .filter(|sample| sample["metric"]["function"] == "mid")
        .map(|sample| sample["value"][1].as_str().unwrap().parse::<f64>().unwrap())
        .collect();
    assert_eq!(mid.len(), 4, "{per_function:#?}");
    assert!(
        (mid.iter().sum::<f64>() - 1.0).abs() < 1e-9,
        "{per_function:#?}"
    );
    let _ = std::fs::remove_dir_all(&storage);
}
