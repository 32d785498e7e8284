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
    parser::parse_request(std::hint::black_box(25));
    parser::parse_request(std::hint::black_box(8));
    work::mid(std::hint::black_box(4), std::hint::black_box(6), std::hint::black_box(3));
    println!("pid={}", std::process::id());
}
