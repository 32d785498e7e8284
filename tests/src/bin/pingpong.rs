//! Context-switch ping-pong for `cargo xtask bench`: two threads pinned to one CPU pass a byte
//! back and forth through two pipes, so every hop is a context switch.
//!
//! `pingpong [--round-trips N] [--cpu C]` prints `ns_per_switch=<f64>`.

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

fn main() {
    let mut round_trips: u64 = 100_000;
    let mut cpu = 0usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().and_then(|v| v.parse::<u64>().ok());
        match (arg.as_str(), value) {
            ("--round-trips", Some(v)) if v > 0 => round_trips = v,
            ("--cpu", Some(v)) => cpu = v as usize,
            _ => {
                eprintln!("usage: pingpong [--round-trips N] [--cpu C]");
                std::process::exit(2);
            }
        }
    }
    let ping = pipe();
    let pong = pipe();
    let peer = std::thread::spawn(move || {
        pin(cpu);
        for _ in 0..round_trips {
            hop(ping[0], pong[1], false);
        }
    });
    pin(cpu);
    let start = Instant::now();
    for _ in 0..round_trips {
        hop(pong[0], ping[1], true);
    }
    let elapsed = start.elapsed();
    let _ = peer.join();
    println!(
        "ns_per_switch={:.1}",
        elapsed.as_nanos() as f64 / (2 * round_trips) as f64
    );
}
