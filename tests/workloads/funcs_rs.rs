//! Rust workload: functions probed by their demangled paths. `leaf` makes exactly N getppid
//! calls; `mid` calls `leaf` k times and makes M getpgid calls.
mod parser {
    #[inline(never)]
    pub fn parse_request(n: u32) {
        for _ in 0..n {
            // SAFETY: a libc call without arguments.
            unsafe { super::getppid() };
        }
    }
}

mod unwind {
    /// Makes `n` getppid calls, then panics: its return never comes.
    #[inline(never)]
    pub fn panicker(n: u32) {
        for _ in 0..n {
            // SAFETY: a libc call without arguments.
            unsafe { super::getppid() };
        }
        if std::hint::black_box(n) < u32::MAX {
            panic!("through a probed function");
        }
    }

    /// Makes `n` getppid calls and calls `panicker(m)`, which unwinds through it.
    #[inline(never)]
    pub fn outer(n: u32, m: u32) {
        for _ in 0..n {
            // SAFETY: a libc call without arguments.
            unsafe { super::getppid() };
        }
        panicker(std::hint::black_box(m));
    }
}

mod work {
    #[inline(never)]
    pub fn leaf(n: u32) {
        for _ in 0..n {
            // SAFETY: a libc call without arguments.
            unsafe { super::getppid() };
        }
    }

    #[inline(never)]
    pub fn mid(k: u32, n: u32, m: u32) {
        for _ in 0..k {
            leaf(std::hint::black_box(n));
        }
        for _ in 0..m {
            // SAFETY: a libc call with a plain integer argument.
            unsafe { super::getpgid(0) };
        }
    }
}

unsafe extern "C" {
    fn getppid() -> i32;
    fn getpgid(pid: i32) -> i32;
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 3 && args[1] == "panic" {
        // `panic K`: K panics through outer() and panicker(), each caught by catch_unwind.
        let times: u32 = args[2].parse().unwrap_or(0);
        std::panic::set_hook(Box::new(|_| {}));
        let mut caught = 0;
        for _ in 0..times {
            let result = std::panic::catch_unwind(|| {
                unwind::outer(std::hint::black_box(2), std::hint::black_box(3))
            });
            caught += u32::from(result.is_err());
        }
        println!("caught={caught}");
        return;
    }
    parser::parse_request(std::hint::black_box(25));
    parser::parse_request(std::hint::black_box(8));
    work::mid(std::hint::black_box(4), std::hint::black_box(6), std::hint::black_box(3));
    println!("pid={}", std::process::id());
}
