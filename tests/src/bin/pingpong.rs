//! Context-switch ping-pong for `cargo xtask bench`: two threads pinned to one CPU pass a byte
//! back and forth through two pipes, so every hop is a context switch.
//!
//! `pingpong [--round-trips N] [--cpu C]` prints `ns_per_switch=<f64>`.
//! `--processes --cgroup-a DIR --cgroup-b DIR`: the two sides are processes, each moving itself
//! into its cgroup v2 directory first, so every hop is also a cgroup switch.
//! `--waker MS`: instead, wake up every MS milliseconds forever (background cgroup activity).

use std::time::Instant;

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, passed with its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!(
                "pingpong: cannot pin to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
            std::process::exit(2);
        }
    }
}

fn pipe() -> [libc::c_int; 2] {
    let mut fds = [0; 2];
    // SAFETY: pipe fills two fds.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        eprintln!("pingpong: pipe: {}", std::io::Error::last_os_error());
        std::process::exit(2);
    }
    fds
}

fn hop(read_fd: libc::c_int, write_fd: libc::c_int, first: bool) {
    let mut byte = 0u8;
    // SAFETY: one-byte reads and writes on pipes we own.
    unsafe {
        if first {
            libc::write(write_fd, (&raw const byte).cast(), 1);
            libc::read(read_fd, (&raw mut byte).cast(), 1);
        } else {
            libc::read(read_fd, (&raw mut byte).cast(), 1);
            libc::write(write_fd, (&raw const byte).cast(), 1);
        }
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: pingpong [--round-trips N] [--cpu C] [--processes --cgroup-a DIR --cgroup-b DIR] | --waker MS"
    );
    std::process::exit(2);
}

/// Moves this process into a cgroup v2 directory.
fn join_cgroup(dir: &str) {
    let pid = std::process::id().to_string();
    if let Err(err) = std::fs::write(format!("{dir}/cgroup.procs"), pid) {
        eprintln!("pingpong: cannot join cgroup {dir}: {err}");
        std::process::exit(2);
    }
}

fn main() {
    let mut round_trips: u64 = 100_000;
    let mut cpu = 0usize;
    let mut processes = false;
    let mut cgroups: (Option<String>, Option<String>) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--processes" => processes = true,
            "--cgroup-a" => cgroups.0 = Some(args.next().unwrap_or_else(|| usage())),
            "--cgroup-b" => cgroups.1 = Some(args.next().unwrap_or_else(|| usage())),
            "--waker" => {
                let ms = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage());
                loop {
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                }
            }
            "--round-trips" => {
                round_trips = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&v| v > 0)
                    .unwrap_or_else(|| usage())
            }
            "--cpu" => {
                cpu = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage())
            }
            _ => usage(),
        }
    }
    let ping = pipe();
    let pong = pipe();
    let peer = move || {
        pin(cpu);
        for _ in 0..round_trips {
            hop(ping[0], pong[1], false);
        }
    };
    let mut child = None;
    let mut thread = None;
    if processes {
        // SAFETY: the child runs only the loop above before exiting.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            if let Some(dir) = &cgroups.1 {
                join_cgroup(dir);
            }
            peer();
            std::process::exit(0);
        }
        child = Some(pid);
        if let Some(dir) = &cgroups.0 {
            join_cgroup(dir);
        }
    } else {
        thread = Some(std::thread::spawn(peer));
    }
    pin(cpu);
    let start = Instant::now();
    for _ in 0..round_trips {
        hop(pong[0], ping[1], true);
    }
    let elapsed = start.elapsed();
    if let Some(thread) = thread {
        let _ = thread.join();
    }
    if let Some(pid) = child {
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
    println!(
        "ns_per_switch={:.1}",
        elapsed.as_nanos() as f64 / (2 * round_trips) as f64
    );
}
