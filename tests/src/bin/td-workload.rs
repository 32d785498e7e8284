//! A workload whose syscall counts are known exactly, for synthetic-counter tests.
//!
//! `td-workload [OPTIONS] THREADSPEC...`: each THREADSPEC (`getppid=1000,getpgid=400`) runs in
//! its own thread and makes exactly those raw syscalls, in order; `cpu=N` in a spec moves the
//! thread to CPU N before the syscalls after it (`cpu=0,getppid=10,cpu=1,getppid=5` migrates
//! mid-way). Each thread prints
//! `thread <index> pid=<pid> tid=<tid>` when done.
//!
//! Options:
//! - `--wait-stdin`: read one line from stdin before starting (lets a test attach with `-p`).
//! - `--children K`: fork K child processes that each run the thread specs too.
//! - `--spin-ms MS`: after its syscalls, each thread spins in user space for MS milliseconds.
//! - `--ready-file PATH`: after all threads have made their syscalls (spin still running),
//!   create PATH.
//! - `--cgroup DIR` (repeatable): a cgroup v2 directory the spec item `move=K` names by index.
//! - `--main-thread`: run the specs one after another in the main thread instead, so the
//!   process stays single-threaded (a short command that exits without ever switching out).
//! - `--cpu-time`: as its last act, each thread (the main thread of each process too) prints
//!   `cputime tid=<tid> ns=<ns>`, its own on-CPU time (`CLOCK_THREAD_CPUTIME_ID`): an oracle
//!   independent of perf for on-CPU time counters.
//!
//! Spec items besides syscalls and `cpu=N`: `move=K` writes this process's pid to the K-th
//! `--cgroup`'s `cgroup.procs` (the thread moves its own process, as container runtimes do);
//! `pause=0` prints `paused <tid>` and waits for a line on stdin; `spin=MS` spins in user space
//! for MS milliseconds; `sleep=MS` sleeps MS milliseconds (the thread switches out);
//! `rename=N` names the thread `renamed-N` (`prctl(PR_SET_NAME)`).

use std::{
    io::{BufRead as _, Write as _},
    time::{Duration, Instant},
};

use topdown_model::model::synthetic::DEFAULT_SYSCALLS;

/// The syscalls a spec may name: those the synthetic models count, and `gettid`, which none
/// counts (this program calls it itself to learn its thread ids).
fn known(name: &str) -> bool {
    DEFAULT_SYSCALLS.contains(&name) || name == "gettid"
}

/// Makes one raw syscall `name`. Only side-effect-free syscalls with valid buffers.
fn call(name: &str) -> Result<(), String> {
    // SAFETY: each syscall gets valid, writable buffers of the right size or none at all.
    unsafe {
        let mut buffer = [0u8; 512];
        let buf = buffer.as_mut_ptr();
        let ret = match name {
            "getppid" => libc::syscall(libc::SYS_getppid),
            "getpgid" => libc::syscall(libc::SYS_getpgid, 0),
            "getsid" => libc::syscall(libc::SYS_getsid, 0),
            "getpriority" => libc::syscall(libc::SYS_getpriority, libc::PRIO_PROCESS, 0),
            "getresuid" => libc::syscall(libc::SYS_getresuid, buf, buf.add(8), buf.add(16)),
            "getresgid" => libc::syscall(libc::SYS_getresgid, buf, buf.add(8), buf.add(16)),
            "times" => libc::syscall(libc::SYS_times, buf),
            "sysinfo" => libc::syscall(libc::SYS_sysinfo, buf),
            "getrusage" => libc::syscall(libc::SYS_getrusage, libc::RUSAGE_SELF, buf),
            "getitimer" => libc::syscall(libc::SYS_getitimer, libc::ITIMER_REAL, buf),
            "sched_getscheduler" => libc::syscall(libc::SYS_sched_getscheduler, 0),
            "sched_getparam" => libc::syscall(libc::SYS_sched_getparam, 0, buf),
            "getpgrp" => libc::syscall(libc::SYS_getpgrp),
            "getcwd" => libc::syscall(libc::SYS_getcwd, buf, buffer.len()),
            "newuname" => libc::syscall(libc::SYS_uname, buf),
            "capget" => {
                // Version 3 header, this process, two data structs of 12 bytes.
                let header = buf.cast::<u32>();
                header.write(0x2008_0522);
                header.add(1).write(0);
                libc::syscall(libc::SYS_capget, header, buf.add(64))
            }
            "ioprio_get" => libc::syscall(libc::SYS_ioprio_get, 1, 0),
            "getgroups" => libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<u32>()),
            "sched_get_priority_max" => {
                libc::syscall(libc::SYS_sched_get_priority_max, libc::SCHED_OTHER)
            }
            "sched_get_priority_min" => {
                libc::syscall(libc::SYS_sched_get_priority_min, libc::SCHED_OTHER)
            }
            "sched_rr_get_interval" => libc::syscall(libc::SYS_sched_rr_get_interval, 0, buf),
            "get_robust_list" => libc::syscall(libc::SYS_get_robust_list, 0, buf, buf.add(8)),
            "sched_getattr" => libc::syscall(libc::SYS_sched_getattr, 0, buf, 56, 0),
            "get_mempolicy" => libc::syscall(
                libc::SYS_get_mempolicy,
                std::ptr::null_mut::<i32>(),
                std::ptr::null_mut::<u64>(),
                0,
                std::ptr::null_mut::<u8>(),
                0,
            ),
            // sysfs(3): the number of filesystem types.
            "sysfs" => libc::syscall(libc::SYS_sysfs, 3),
            "getcpu" => libc::syscall(libc::SYS_getcpu, buf, buf.add(8), 0),
            "rt_sigpending" => libc::syscall(libc::SYS_rt_sigpending, buf, 8),
            "clock_getres" => libc::syscall(libc::SYS_clock_getres, libc::CLOCK_MONOTONIC, buf),
            // The page holding `buffer` is mapped: mincore reports it.
            "mincore" => libc::syscall(
                libc::SYS_mincore,
                (buf as usize) & !4095,
                4096usize,
                buf.add(256),
            ),
            // MEMBARRIER_CMD_QUERY (0): the supported commands.
            "membarrier" => libc::syscall(libc::SYS_membarrier, 0, 0),
            // 0xffffffff queries the persona without changing it.
            "personality" => libc::syscall(libc::SYS_personality, 0xffff_ffffu64),
            "sched_getaffinity" => libc::syscall(libc::SYS_sched_getaffinity, 0, 128, buf),
            "gettid" => libc::syscall(libc::SYS_gettid),
            other => return Err(format!("unknown syscall '{other}'")),
        };
        if ret < 0 && name != "getpriority" {
            return Err(format!(
                "{name} failed: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// Moves the calling thread to `cpu` (and waits until it runs there: the affinity change takes
/// effect at once for the caller).
fn pin_to(cpu: u64) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes within it for cpu < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= libc::CPU_SETSIZE as u64 {
            return Err(format!("cpu {cpu} out of range"));
        }
        libc::CPU_SET(cpu as usize, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!(
                "cannot move to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            ));
        }
        if libc::sched_getcpu() != cpu as i32 {
            return Err(format!("still not on CPU {cpu} after sched_setaffinity"));
        }
    }
    Ok(())
}

fn parse_spec(spec: &str) -> Result<Vec<(String, u64)>, String> {
    spec.split(',')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let (name, count) = part
                .split_once('=')
                .ok_or_else(|| format!("'{part}' is not NAME=COUNT"))?;
            let count = count
                .parse()
                .map_err(|_| format!("bad count in '{part}'"))?;
            // Validated by name, not by calling it: every call counts.
            if !["cpu", "move", "pause", "spin", "sleep", "rename"].contains(&name) && !known(name)
            {
                return Err(format!("unknown syscall '{name}'"));
            }
            Ok((name.to_owned(), count))
        })
        .collect()
}

/// Prints the calling thread's on-CPU time if `--cpu-time` was given.
fn report_cpu_time() {
    if !CPU_TIME.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write; gettid has no preconditions.
    let (rc, tid) = unsafe {
        (
            libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now),
            libc::syscall(libc::SYS_gettid),
        )
    };
    if rc == 0 {
        let ns = now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64;
        println!("cputime tid={tid} ns={ns}");
        let _ = std::io::stdout().flush();
    }
}

static CPU_TIME: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn spin_for(duration: Duration) {
    let start = Instant::now();
    let mut x: u64 = 1;
    while start.elapsed() < duration {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    std::hint::black_box(x);
}

/// The spec items that are not syscalls.
fn special(name: &str, value: u64, cgroups: &[String]) -> Result<bool, String> {
    match name {
        "cpu" => pin_to(value)?,
        "move" => {
            let dir = cgroups
                .get(value as usize)
                .ok_or_else(|| format!("move={value}: no such --cgroup"))?;
            let procs = std::path::Path::new(dir).join("cgroup.procs");
            std::fs::write(&procs, std::process::id().to_string())
                .map_err(|err| format!("writing {}: {err}", procs.display()))?;
        }
        "pause" => {
            // SAFETY: no preconditions.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) };
            println!("paused {tid}");
            let _ = std::io::stdout().flush();
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
        }
        "spin" => spin_for(Duration::from_millis(value)),
        "sleep" => std::thread::sleep(Duration::from_millis(value)),
        "rename" => {
            let name = format!("renamed-{value}\0");
            // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
            if unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) } != 0 {
                return Err(format!(
                    "prctl(PR_SET_NAME): {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// Makes one spec's syscalls (and special items) in the calling thread.
fn run_spec(spec: &[(String, u64)], cgroups: &[String]) {
    for (name, count) in spec {
        match special(name, *count, cgroups) {
            Ok(true) => continue,
            Ok(false) => {}
            Err(err) => {
                eprintln!("td-workload: {err}");
                std::process::exit(2);
            }
        }
        for _ in 0..*count {
            if let Err(err) = call(name) {
                eprintln!("td-workload: {err}");
                std::process::exit(2);
            }
        }
    }
}

/// Runs every spec in its own thread; returns when all are done.
fn run_threads(
    specs: &[Vec<(String, u64)>],
    spin: Duration,
    ready_file: Option<&str>,
    cgroups: &[String],
) {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(specs.len() + 1));
    let handles: Vec<_> = specs
        .iter()
        .cloned()
        .enumerate()
        .map(|(index, spec)| {
            let barrier = barrier.clone();
            let cgroups = cgroups.to_vec();
            std::thread::spawn(move || {
                run_spec(&spec, &cgroups);
                // SAFETY: no preconditions.
                let (pid, tid) = unsafe { (libc::getpid(), libc::syscall(libc::SYS_gettid)) };
                println!("thread {index} pid={pid} tid={tid}");
                let _ = std::io::stdout().flush();
                barrier.wait();
                spin_for(spin);
                report_cpu_time();
            })
        })
        .collect();
    barrier.wait();
    if let Some(path) = ready_file {
        let _ = std::fs::write(path, b"ready\n");
    }
    for handle in handles {
        let _ = handle.join();
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut wait_stdin = false;
    let mut children = 0u32;
    let mut spin = Duration::ZERO;
    let mut ready_file = None;
    let mut specs = Vec::new();
    let mut cgroups = Vec::new();
    let mut main_thread = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--wait-stdin" => wait_stdin = true,
            "--main-thread" => main_thread = true,
            "--cpu-time" => CPU_TIME.store(true, std::sync::atomic::Ordering::Relaxed),
            "--children" => children = args.next().and_then(|v| v.parse().ok()).unwrap_or(0),
            "--spin-ms" => {
                spin = Duration::from_millis(args.next().and_then(|v| v.parse().ok()).unwrap_or(0))
            }
            "--ready-file" => ready_file = args.next(),
            "--cgroup" => cgroups.extend(args.next()),
            spec => match parse_spec(spec) {
                Ok(spec) => specs.push(spec),
                Err(err) => {
                    eprintln!("td-workload: {err}");
                    std::process::exit(2);
                }
            },
        }
    }
    if wait_stdin {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
    }
    if main_thread {
        for spec in &specs {
            run_spec(spec, &cgroups);
        }
        // SAFETY: no preconditions.
        let pid = unsafe { libc::getpid() };
        println!("thread 0 pid={pid} tid={pid}");
        report_cpu_time();
        return;
    }
    let mut pids = Vec::new();
    for _ in 0..children {
        // SAFETY: the child only runs Rust code of this single-threaded process before threads
        // are spawned in it.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            run_threads(&specs, spin, None, &cgroups);
            report_cpu_time();
            std::process::exit(0);
        }
        pids.push(pid);
    }
    run_threads(&specs, spin, ready_file.as_deref(), &cgroups);
    for pid in pids {
        let mut status = 0;
        // SAFETY: reaping our own children.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
    report_cpu_time();
}
