//! Context-switch ping-pong for `cargo xtask bench`: two threads pinned to one CPU hand control
//! back and forth, so every hop is a context switch.
//!
//! `pingpong [--round-trips N] [--cpu C] [--via pipe|futex|yield] [--fifo]` prints one line,
//! `ns_per_switch=<wall> cpu_ns_per_switch=<cpu> switches=<count>` (the last two only where
//! the kernel has `/proc/thread-self/schedstat`):
//! - `ns_per_switch`: wall-clock time over `2 N` hops; it includes whatever else ran on the CPU
//!   and, in a VM, the time the hypervisor took the vCPU away (steal).
//! - `switches`: how many times one of the two threads was switched in (the third field of
//!   `/proc/thread-self/schedstat`, `sched_info.pcount`, counted in `sched_info_arrive` only
//!   when the scheduler really changes task), over both threads' loops.
//! - `cpu_ns_per_switch`: both threads' own run time (`CLOCK_THREAD_CPUTIME_ID`, the
//!   scheduler's `sum_exec_runtime`) over those switches. `__schedule` updates the run-queue
//!   clock before it picks the next task and starts the next task's run time from that clock,
//!   then fires `sched_switch` and switches: what a `sched_switch` program costs is charged to
//!   the task switched in. The run-queue task clock leaves out steal time
//!   (`CONFIG_PARAVIRT_TIME_ACCOUNTING`) and the time other tasks ran.
//!
//! `--via`: how a hop hands over. `pipe` (default): each side writes a byte to the other's pipe
//! and reads its own; `futex`: a shared word and `FUTEX_WAKE`/`FUTEX_WAIT`; `yield`: each side
//! calls `sched_yield` N times and the scheduler alternates them (no wake-up path at all, so
//! the cheapest switch; its switch count is whatever the scheduler did, hence `switches`).
//!
//! `--fifo`: both threads run SCHED_FIFO (priority 1), so ordinary tasks do not run on the CPU
//! between hops (only in the kernel's real-time throttling share, 5% by default) and do not
//! evict the ping-pong's caches there; `yield` then alternates the two strictly.
//!
//! `--processes [--cgroup-a DIR --cgroup-b DIR]` (pipes only): the two sides are processes,
//! each moving itself into its cgroup v2 directory first if given, so with two directories
//! every hop is also a cgroup switch; the figures are the same.
//! `--waker MS`: instead, wake up every MS milliseconds forever (background cgroup activity).

use std::{
    sync::{
        Arc, Barrier,
        atomic::{AtomicU32, Ordering},
    },
    time::Instant,
};

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

/// SCHED_FIFO at the lowest real-time priority: the two sides then alternate strictly
/// (`sched_yield` puts the caller behind the other), and ordinary tasks do not run on the CPU
/// between their hops except for the kernel's real-time throttling share (5% by default).
fn realtime() {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: a valid sched_param for this thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        eprintln!(
            "pingpong: cannot switch to SCHED_FIFO: {}",
            std::io::Error::last_os_error()
        );
        std::process::exit(2);
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

/// Waits until `turn` holds `mine`, then passes the turn to the other side and wakes it.
fn futex_hop(turn: &AtomicU32, mine: u32) {
    while turn.load(Ordering::Acquire) != mine {
        // SAFETY: FUTEX_WAIT on a live aligned u32; it returns at once if the value changed.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                turn.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                mine ^ 1,
                std::ptr::null::<libc::timespec>(),
            );
        }
    }
    turn.store(mine ^ 1, Ordering::Release);
    // SAFETY: FUTEX_WAKE on a live aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            turn.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: pingpong [--round-trips N] [--cpu C] [--via pipe|futex|yield] [--fifo] \
         [--processes --cgroup-a DIR --cgroup-b DIR] | --waker MS"
    );
    std::process::exit(2);
}

/// Where one side runs: in `cgroup` (when given), on `cpu`, and as a real-time task when `fifo`.
fn place(cgroup: Option<&str>, cpu: usize, fifo: bool) {
    if let Some(dir) = cgroup {
        join_cgroup(dir);
    }
    pin(cpu);
    if fifo {
        realtime();
    }
}

/// Moves this process into a cgroup v2 directory.
fn join_cgroup(dir: &str) {
    let pid = std::process::id().to_string();
    if let Err(err) = std::fs::write(format!("{dir}/cgroup.procs"), pid) {
        eprintln!("pingpong: cannot join cgroup {dir}: {err}");
        std::process::exit(2);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Via {
    Pipe,
    Futex,
    Yield,
}

/// This thread's run time (ns) and how often it has been switched in (None without
/// `/proc/thread-self/schedstat`, which needs `CONFIG_SCHED_INFO`).
#[derive(Clone, Copy, Default)]
struct ThreadClock {
    run_ns: u64,
    switched_in: Option<u64>,
}

impl ThreadClock {
    fn now() -> Self {
        let mut time = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime fills the timespec.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) } != 0 {
            eprintln!(
                "pingpong: CLOCK_THREAD_CPUTIME_ID: {}",
                std::io::Error::last_os_error()
            );
            std::process::exit(2);
        }
        // Documentation/scheduler/sched-stats.rst: "time spent on the cpu", "time spent
        // waiting on a runqueue", "# of timeslices run on this cpu".
        let switched_in = std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|text| text.split_whitespace().nth(2)?.parse().ok());
        Self {
            run_ns: time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64,
            switched_in,
        }
    }

    fn since(self, start: Self) -> Self {
        Self {
            run_ns: self.run_ns - start.run_ns,
            switched_in: self
                .switched_in
                .zip(start.switched_in)
                .map(|(now, then)| now - then),
        }
    }
}

fn main() {
    let mut round_trips: u64 = 100_000;
    let mut cpu = 0usize;
    let mut via = Via::Pipe;
    let mut fifo = false;
    let mut processes = false;
    let mut cgroups: (Option<String>, Option<String>) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--processes" => processes = true,
            "--fifo" => fifo = true,
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
            "--via" => {
                via = match args.next().as_deref() {
                    Some("pipe") => Via::Pipe,
                    Some("futex") => Via::Futex,
                    Some("yield") => Via::Yield,
                    _ => usage(),
                }
            }
            _ => usage(),
        }
    }
    if processes {
        if via != Via::Pipe {
            usage();
        }
        processes_pingpong(round_trips, cpu, fifo, &cgroups);
        return;
    }
    let ping = pipe();
    let pong = pipe();
    let turn = Arc::new(AtomicU32::new(0));
    // Both sides pinned before either starts, so neither loop runs alone at first.
    let ready = Arc::new(Barrier::new(2));
    let side = move |first: bool, turn: Arc<AtomicU32>, ready: Arc<Barrier>| {
        place(None, cpu, fifo);
        ready.wait();
        let start = ThreadClock::now();
        for _ in 0..round_trips {
            match via {
                Via::Pipe if first => hop(pong[0], ping[1], true),
                Via::Pipe => hop(ping[0], pong[1], false),
                Via::Futex => futex_hop(&turn, u32::from(!first)),
                // SAFETY: sched_yield has no arguments.
                Via::Yield => unsafe {
                    libc::sched_yield();
                },
            }
        }
        ThreadClock::now().since(start)
    };
    let peer = {
        let (turn, ready) = (turn.clone(), ready.clone());
        std::thread::spawn(move || side(false, turn, ready))
    };
    let wall = Instant::now();
    let mine = side(true, turn, ready);
    let elapsed = wall.elapsed();
    let Ok(theirs) = peer.join() else {
        eprintln!("pingpong: the other side panicked");
        std::process::exit(2);
    };
    let wall_ns = elapsed.as_nanos() as f64 / (2 * round_trips) as f64;
    match mine.switched_in.zip(theirs.switched_in) {
        Some((a, b)) => println!(
            "ns_per_switch={wall_ns:.1} cpu_ns_per_switch={:.1} switches={}",
            (mine.run_ns + theirs.run_ns) as f64 / (a + b).max(1) as f64,
            a + b
        ),
        None => {
            eprintln!(
                "pingpong: no /proc/thread-self/schedstat (needs CONFIG_SCHED_INFO): CPU time \
                 per switch not measured"
            );
            println!("ns_per_switch={wall_ns:.1}");
        }
    }
}

/// The two sides as processes, optionally each in its own cgroup. The child hands its own run
/// time and switch count to the parent through a pipe when its loop is done, so the figures are
/// those of the thread mode (both sides are single-threaded: thread and process are one).
fn processes_pingpong(
    round_trips: u64,
    cpu: usize,
    fifo: bool,
    cgroups: &(Option<String>, Option<String>),
) {
    let ping = pipe();
    let pong = pipe();
    let result = pipe();
    // SAFETY: the child runs only its loop before exiting.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        place(cgroups.1.as_deref(), cpu, fifo);
        let start = ThreadClock::now();
        for _ in 0..round_trips {
            hop(ping[0], pong[1], false);
        }
        let spent = ThreadClock::now().since(start);
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&spent.run_ns.to_ne_bytes());
        bytes[8..].copy_from_slice(&spent.switched_in.unwrap_or(u64::MAX).to_ne_bytes());
        // SAFETY: writing 16 bytes of a local array to a pipe we own.
        unsafe { libc::write(result[1], bytes.as_ptr().cast(), bytes.len()) };
        std::process::exit(0);
    }
    place(cgroups.0.as_deref(), cpu, fifo);
    let start = Instant::now();
    let clock = ThreadClock::now();
    for _ in 0..round_trips {
        hop(pong[0], ping[1], true);
    }
    let mine = ThreadClock::now().since(clock);
    let elapsed = start.elapsed();
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let mut bytes = [0u8; 16];
    // SAFETY: reading at most 16 bytes into a local array from a pipe we own.
    let read = unsafe { libc::read(result[0], bytes.as_mut_ptr().cast(), bytes.len()) };
    let wall_ns = elapsed.as_nanos() as f64 / (2 * round_trips) as f64;
    let theirs = (read == 16).then(|| {
        let word = |range: std::ops::Range<usize>| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[range]);
            u64::from_ne_bytes(word)
        };
        (
            word(0..8),
            Some(word(8..16)).filter(|count| *count != u64::MAX),
        )
    });
    match (mine.switched_in, theirs) {
        (Some(a), Some((run_ns, Some(b)))) => println!(
            "ns_per_switch={wall_ns:.1} cpu_ns_per_switch={:.1} switches={}",
            (mine.run_ns + run_ns) as f64 / (a + b).max(1) as f64,
            a + b
        ),
        _ => {
            eprintln!(
                "pingpong: no /proc/thread-self/schedstat (needs CONFIG_SCHED_INFO) or no \
                 figures from the other side: CPU time per switch not measured"
            );
            println!("ns_per_switch={wall_ns:.1}");
        }
    }
}
