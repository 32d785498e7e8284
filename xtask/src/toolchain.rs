//! The pinned toolchains, in one place.

/// Host toolchain: aya 0.16 / aya-ebpf 0.3 / aya-log 0.4 need rustc >= 1.98.
pub const HOST_TOOLCHAIN: &str = "1.98.0";
/// The eBPF crate's nightly: its LLVM major (22) must match bpf-linker's. Keep equal to
/// `EBPF_TOOLCHAIN` in topdown-user/build.rs, which aya-build uses to compile the object.
pub const EBPF_TOOLCHAIN: &str = "nightly-2026-06-20";
pub const BPF_LINKER_VERSION: &str = "0.13.0";
/// cargo-fuzz for `cargo xtask fuzz`.
pub const CARGO_FUZZ_VERSION: &str = "0.13.2";
/// Debian packages bpf-linker links against (LLVM 22, as the nightly's LLVM).
pub const LLVM_PACKAGES: [&str; 4] = [
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
];
pub const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
/// Debian packages the tests use: Debian's Prometheus server (scrapes `topdown serve` in a
/// test) and its promtool (lints the exposition). The package's service is not started in
/// containers without an init; the test runs its own server. tmux is the pseudo-terminal that
/// `topdown top`'s test drives. libpfm4 (libpfm.so.4) encodes `-e` libpfm-style names, dlopen'ed
/// at run time; its tests need it.
pub const TEST_PACKAGES: [&str; 3] = ["prometheus", "tmux", "libpfm4"];

/// Debian's Go toolchain (1.19 on bookworm): the Go function-probe tests build their Go
/// programs with it at test time (standard library only, no network), and `go tool pprof`
/// reads `--format pprof` output in the export tests (tests/tests/export.rs).
pub const GO_PACKAGES: [&str; 1] = ["golang-go"];

/// Debian packages of the real-program function-probe tests (tests/tests/real_programs.rs):
/// bpftrace as the entry-count oracle, the sqlite3 CLI and its library as the program probed.
pub const REAL_PROGRAM_PACKAGES: [&str; 3] = ["bpftrace", "sqlite3", "libsqlite3-0"];

/// Debian packages of the probe-safety harness (tests/tests/probe_safety.rs): libc's debug
/// symbols (the functions known only from them are probed too), Python's interpreter and its
/// shared library with headers (a small C program runs Python through libpython3.11.so), g++
/// for the C++ program that throws, and zlib.
pub const SAFETY_PACKAGES: [&str; 6] = [
    "libc6-dbg",
    "python3.11",
    "libpython3.11-dev",
    "g++",
    "zlib1g",
    "libstdc++6",
];

/// Debian packages of the USDT and span tests (tests/tests/usdt.rs, postgres.rs): sys/sdt.h
/// for the C workload's probes, python3.11 (a non-PIE binary with SDT notes) and the
/// PostgreSQL 15 server (with pg_stat_statements), client (psql) and pgbench that the
/// `--postgres` tests run. The package's cluster is not started: each test runs its own.
pub const USDT_PACKAGES: [&str; 5] = [
    "systemtap-sdt-dev",
    "python3.11",
    "postgresql-15",
    "postgresql-client-15",
    "postgresql-contrib",
];

/// Debian packages for topdown's usage reference (installed by `cargo xtask setup`, see
/// usage.rs): man-db to read the man pages, bash-completion to load the bash script, and zsh
/// and fish, whose scripts the usage test (tests/tests/usage.rs) checks with the shells
/// themselves.
pub const USAGE_PACKAGES: [&str; 4] = ["man-db", "bash-completion", "zsh", "fish"];
