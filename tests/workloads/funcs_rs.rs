//! Rust workload: functions probed by their demangled paths.
mod parser {
    #[inline(never)]
    pub fn parse_request(n: u32) {
        for _ in 0..n {
            // SAFETY: a raw syscall without arguments.
            unsafe { super::libc_getppid() };
        }
    }
}

unsafe extern "C" {
    #[link_name = "getppid"]
    fn libc_getppid() -> i32;
}

fn main() {
    parser::parse_request(std::hint::black_box(25));
    parser::parse_request(std::hint::black_box(8));
    println!("pid={}", std::process::id());
}
