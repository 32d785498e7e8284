//! `--postgres`: TopDown per query of a real PostgreSQL 15 server (Debian's package, built
//! with --enable-dtrace), against `pg_stat_statements` as the oracle.
//!
//! Each test starts its own server in a temporary directory as the `postgres` user (initdb,
//! a unix socket only, `pg_ctl -w start`, `pg_stat_statements` preloaded) and always stops
//! it: the guard's drop runs `pg_ctl stop -m immediate`, then kills the postmaster if it is
//! still there, also when an assertion fails. psql (simple protocol) and pgbench (`-M
//! extended`, `-M prepared`, custom scripts) run known numbers of distinct queries.

use std::{
    ffi::CString,
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::MutexGuard,
    time::Duration,
};

use serde_json::Value;
use topdown_tests::*;

const BIN: &str = "/usr/lib/postgresql/15/bin";

/// The server binaries, or why this machine cannot run the tests.
fn postgres_bin() -> Option<PathBuf> {
    let bin = PathBuf::from(BIN);
    for tool in ["postgres", "initdb", "pg_ctl", "psql", "pgbench"] {
        if !bin.join(tool).exists() {
            let why = format!(
                "{} is missing: install postgresql-15 and postgresql-client-15 (cargo xtask setup does)",
                bin.join(tool).display()
            );
            assert!(std::env::var_os("CI").is_none(), "{why}");
            skipped(&why);
            return None;
        }
    }
    Some(bin)
}

/// How each test starts: privileged, with the server binaries, holding the [`serial`] lock,
/// and a server of its own with `settings` (bound after the lock, so stopped before it is let
/// go); `None` where the test does not run here.
fn serial_server(settings: &[&str]) -> Option<(MutexGuard<'static, ()>, Server)> {
    if !privileged() {
        return None;
    }
    let bin = postgres_bin()?;
    let serial = serial();
    Some((serial, Server::start(&bin, settings)))
}

/// The `postgres` user's uid and gid.
fn postgres_user() -> (u32, u32) {
    let name = CString::new("postgres").unwrap();
    // SAFETY: a valid C string; the result is read at once, on this thread.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !entry.is_null(),
        "no postgres user: install postgresql-15 (cargo xtask setup does)"
    );
    // SAFETY: non-null, as checked.
    unsafe { ((*entry).pw_uid, (*entry).pw_gid) }
}

/// A server of the test's own, stopped when dropped.
struct Server {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    user: (u32, u32),
}

impl Server {
    /// initdb and start a server with `settings` added to postgresql.conf.
    fn start(bin: &Path, settings: &[&str]) -> Self {
        let user = postgres_user();
        let dir = std::env::temp_dir().join(format!(
            "topdown-pg-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&dir, Some(user.0), Some(user.1)).unwrap();
        // The socket is .s.PGSQL.<port> in `dir`: any number no other server in `dir` uses.
        let port = 40000 + (std::process::id() % 20000) as u16;
        let server = Self {
            bin: bin.to_owned(),
            dir,
            port,
            user,
        };
        let data = server.dir.join("data");
        server.as_postgres(Command::new(bin.join("initdb")).arg("-D").arg(&data).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
        ]));
        let mut conf = format!(
            "listen_addresses = ''\nunix_socket_directories = '{}'\nport = {port}\n\
             shared_preload_libraries = 'pg_stat_statements'\nfsync = off\n",
            server.dir.display()
        );
        for setting in settings {
            conf.push_str(setting);
            conf.push('\n');
        }
        let path = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&conf);
        std::fs::write(&path, text).unwrap();
        server.as_postgres(
            Command::new(bin.join("pg_ctl"))
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(server.dir.join("server.log"))
                .args(["-w", "-t", "60", "start"]),
        );
        server
    }

    fn as_postgres(&self, command: &mut Command) -> Output {
        let output = command
            .uid(self.user.0)
            .gid(self.user.1)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|err| panic!("{command:?}: {err}"));
        assert!(
            output.status.success(),
            "{command:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    fn connection(&self, command: &mut Command) {
        command.arg("-h").arg(&self.dir).args([
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
            "-d",
            "postgres",
        ]);
    }

    /// Runs psql with each of `commands` as a `-c` (one session, the simple protocol); an
    /// erroring command is reported and the next runs.
    fn psql(&self, commands: &[&str]) -> String {
        let mut command = Command::new(self.bin.join("psql"));
        command.args(["-X", "-q", "-A", "-t"]);
        self.connection(&mut command);
        for text in commands {
            command.args(["-c", text]);
        }
        let output = command.stdin(Stdio::null()).output().unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// pgbench with a custom script, `transactions` per client.
    fn pgbench(&self, mode: &str, script: &str, clients: u32, transactions: u32) {
        let file = self.dir.join(format!("script-{mode}.sql"));
        std::fs::write(&file, script).unwrap();
        let mut command = Command::new(self.bin.join("pgbench"));
        command.args(["-n", "-M", mode, "-f"]).arg(&file).args([
            "-c",
            &clients.to_string(),
            "-t",
            &transactions.to_string(),
        ]);
        self.connection(&mut command);
        let output = command.stdin(Stdio::null()).output().unwrap();
        assert!(
            output.status.success(),
            "pgbench: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// `(queryid, calls, query)` of every statement pg_stat_statements tracked.
    fn statements(&self) -> Vec<(i64, u64, String)> {
        self.psql(&["select queryid, calls, query from pg_stat_statements"])
            .lines()
            .filter_map(|line| {
                let mut fields = line.splitn(3, '|');
                Some((
                    fields.next()?.parse().ok()?,
                    fields.next()?.parse().ok()?,
                    fields.next()?.to_owned(),
                ))
            })
            .collect()
    }

    fn postmaster_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let stopped = Command::new(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .uid(self.user.0)
            .gid(self.user.1)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !stopped && let Some(pid) = self.postmaster_pid() {
            // SAFETY: the server this test started; its children follow the postmaster.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// topdown counting the whole machine with `--postgres`, stopped by SIGINT.
struct Counting {
    tracer: KilledOnDrop,
    out: PathBuf,
}

impl Counting {
    fn start(bin: &Path) -> Self {
        let out = temp_path("pg.json");
        let tracer = spawn_counting(
            topdown()
                .args(["stat", "-a", "--pmu", "synthetic:intel-icl"])
                .args(["--synthetic", "slots=raw_syscalls:sys_enter"])
                .arg("--postgres")
                .arg(bin.join("postgres"))
                .args(["--by", "query", "--format", "json", "-o"])
                .arg(&out)
                .stdout(Stdio::null()),
            Duration::from_secs(120),
        );
        Self { tracer, out }
    }

    fn stop(mut self) -> Value {
        // SAFETY: signalling the child this test started.
        unsafe { libc::kill(self.tracer.child().id() as i32, libc::SIGINT) };
        let output = self.tracer.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "topdown: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report = read_report(&self.out);
        let _ = std::fs::remove_file(&self.out);
        report
    }
}

fn query_spans(report: &Value) -> Vec<&Value> {
    report["spans"]
        .as_array()
        .map(|spans| {
            spans
                .iter()
                .filter(|span| span["kind"] == "query")
                .collect()
        })
        .unwrap_or_default()
}

/// Every statement pg_stat_statements counted while topdown ran has a query span with the
/// same calls, and no span has calls pg_stat_statements did not count: the simple protocol
/// (psql), pgbench's extended and prepared protocols, and an erroring query, which is
/// abandoned and takes nothing from the query after it.
#[test]
fn calls_per_query_equal_pg_stat_statements() {
    let Some((_serial, server)) = serial_server(&["compute_query_id = on"]) else {
        return;
    };
    server.psql(&[
        "create extension pg_stat_statements",
        "create table items (id int primary key, name text)",
        "insert into items select g, 'item ' || g from generate_series(1, 1000) g",
    ]);
    server.psql(&["select pg_stat_statements_reset()"]);
    let counting = Counting::start(&server.bin);
    server.psql(&[
        "select count(*) from items",
        "select count(*) from items",
        "select name from items where id = 7",
        "select 1/0",
        "select name from items where id = 8",
        "update items set name = 'x' where id = 3",
        "select count(*) from items",
        "begin",
        "select max(id) from items",
        "commit",
    ]);
    server.pgbench(
        "extended",
        "\\set n random(1, 1000)\nselect name from items where id = :n;\nselect :n + 1;\n",
        2,
        25,
    );
    server.pgbench(
        "prepared",
        "\\set n random(1, 1000)\nselect length(name) from items where id = :n;\nselect abs(:n - 500);\n",
        3,
        20,
    );
    let report = counting.stop();
    let statements: Vec<(i64, u64, String)> = server
        .statements()
        .into_iter()
        .filter(|(_, _, query)| !query.contains("pg_stat_statements"))
        .collect();
    assert!(statements.len() >= 9, "{statements:?}");
    let spans = query_spans(&report);
    for (id, calls, query) in &statements {
        let key = id.to_string();
        let span = spans
            .iter()
            .find(|span| span["key"] == key.as_str())
            .unwrap_or_else(|| panic!("no span for {id} {query:?}: {}", report["spans"]));
        assert_eq!(span["key_type"], "query_id");
        assert_eq!(span["calls"], *calls, "{query}: {span}");
        assert_eq!(span["abandoned"], 0, "{query}");
        // Its distribution holds every execution once, and its buckets add up to its counts.
        let buckets = span["distribution"]["buckets"]
            .as_array()
            .unwrap_or_else(|| panic!("{query}: no distribution in {span}"));
        let in_buckets: u64 = buckets.iter().map(|b| b["calls"].as_u64().unwrap()).sum();
        assert_eq!(in_buckets, *calls, "{query}: {span}");
        for name in report["counter_names"].as_array().unwrap() {
            let name = name.as_str().unwrap();
            let summed: u64 = buckets.iter().map(|bucket| counter(bucket, name)).sum();
            assert_eq!(summed, counter(span, name), "{query} {name}: {span}");
        }
        for bucket in buckets {
            let (low, high) = (
                bucket["low"].as_u64().unwrap(),
                bucket["high"].as_u64().unwrap(),
            );
            let slots = counter(bucket, "slots");
            let calls = bucket["calls"].as_u64().unwrap();
            assert!(
                low * calls <= slots && slots < high * calls,
                "{query}: a bucket's slots lie within its bounds per execution: {bucket}"
            );
        }
    }
    // The workload itself, as pg_stat_statements saw it (texts with the same id summed: a
    // constant and a parameter give different ids).
    for (text, calls) in [
        ("select count(*) from items", 3),
        ("select name from items where id = $1", 2 + 2 * 25),
        ("select $1 + $2", 2 * 25),
        ("select length(name) from items where id = $1", 3 * 20),
        ("select abs($1 - $2)", 3 * 20),
        ("update items set name = $1 where id = $2", 1),
        ("select max(id) from items", 1),
    ] {
        let found: u64 = statements
            .iter()
            .filter(|(_, _, query)| query == text)
            .map(|(_, calls, _)| *calls)
            .sum();
        assert_eq!(found, calls, "{text}: {statements:?}");
    }
    // The erroring query: an abandoned span of its own, not a call of the next query.
    let erroring: Vec<&&Value> = spans
        .iter()
        .filter(|span| span["abandoned"].as_u64() > Some(0))
        .collect();
    assert_eq!(erroring.len(), 1, "{}", report["spans"]);
    assert_eq!(erroring[0]["abandoned"], 1);
    assert_eq!(erroring[0]["calls"], 0);
    assert_eq!(erroring[0]["text"], "select $1/$2");
    let with_calls = spans
        .iter()
        .filter(|span| span["calls"].as_u64() > Some(0))
        .count();
    assert_eq!(with_calls, statements.len(), "{}", report["spans"]);
    assert_eq!(report["span_diagnostics"]["read_failures"], 0);
    assert_eq!(report["span_diagnostics"]["map_full"], 0);
}

/// Without query ids (`compute_query_id = off`) a query is keyed by its text, normalised:
/// `select 1` and `select 22` are one query; pgbench's `select $1 + 1` another.
#[test]
fn without_query_ids_queries_are_keyed_by_normalised_text() {
    let Some((_serial, server)) = serial_server(&["compute_query_id = off"]) else {
        return;
    };
    let counting = Counting::start(&server.bin);
    server.psql(&[
        "select 1",
        "select 22",
        "SELECT  'a' || 'b'",
        "select 333",
        "SELECT 'c' || 'd'",
    ]);
    server.pgbench("extended", "\\set n random(1, 9)\nselect :n + 1;\n", 2, 10);
    server.pgbench("prepared", "\\set n random(1, 9)\nselect :n * 2;\n", 1, 7);
    let report = counting.stop();
    let spans = query_spans(&report);
    let calls = |text: &str| {
        spans
            .iter()
            .find(|span| span["key"] == text)
            .unwrap_or_else(|| panic!("no span {text:?}: {}", report["spans"]))
            .to_owned()
    };
    for (text, expected) in [
        ("select $1", 3),
        ("SELECT $1 || $2", 2),
        ("select $1 + $2", 20),
        ("select $1 * $2", 7),
    ] {
        let span = calls(text);
        assert_eq!(span["calls"], expected, "{text}: {span}");
        assert_eq!(span["key_type"], "text", "{text}");
    }
}

/// A parallel query's workers run in processes of their own: their spans are folded into
/// the query's figures, one per worker the plan launched (EXPLAIN ANALYZE says how many).
#[test]
fn parallel_workers_fold_into_their_query() {
    let Some((_serial, server)) = serial_server(&[
        "compute_query_id = on",
        "max_parallel_workers_per_gather = 2",
        "parallel_setup_cost = 0",
        "parallel_tuple_cost = 0",
        "min_parallel_table_scan_size = 0",
    ]) else {
        return;
    };
    server.psql(&[
        "create extension pg_stat_statements",
        "create table big as select g from generate_series(1, 100000) g",
        "analyze big",
    ]);
    let counting = Counting::start(&server.bin);
    let explain = "explain (analyze, format json) select count(*) from big";
    let output = server.psql(&[explain, explain, explain]);
    let report = counting.stop();
    let launched: u64 = output
        .lines()
        .filter_map(|line| {
            line.trim()
                .strip_prefix("\"Workers Launched\": ")?
                .trim_end_matches(',')
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(launched > 0, "no parallel workers launched: {output}");
    let id = server
        .statements()
        .into_iter()
        .find(|(_, _, query)| query.starts_with("explain (analyze, format json)"))
        .map(|(id, _, _)| id.to_string())
        .unwrap();
    let span = query_spans(&report)
        .into_iter()
        .find(|span| span["key"] == id.as_str())
        .unwrap_or_else(|| panic!("no span for {id}: {}", report["spans"]));
    assert_eq!(span["calls"], 3, "{span}");
    assert_eq!(span["folded"], launched, "{span}");
    assert_eq!(
        report["spans"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|span| span["kind"] != "query")
            .count(),
        0,
        "worker spans are not reported apart: {}",
        report["spans"]
    );
}
