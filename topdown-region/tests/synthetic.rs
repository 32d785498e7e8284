//! Exact per-region counts with the synthetic model: `synthetic:intel-icl`'s counters are
//! syscall tracepoints (slots = getppid, topdown-retiring = getpgid, topdown-bad-spec =
//! getsid, ...), counted per thread, so a region's counts are the syscalls it made.
//!
//! Tracepoint counters need root (CI runs as root with CI=true); a non-root run fails unless
//! TOPDOWN_SKIP_PRIVILEGED=1, and then says SKIPPED. Every test works on threads of its own:
//! counters and regions are per thread, so the tests do not see each other.

use topdown_region::{Config, MAX_DEPTH, ReadPath, Snapshot, ThreadRecord};

fn setup() -> bool {
    if !topdown_tests::privileged() {
        return false;
    }
    let config = Config {
        model: "synthetic:intel-icl".into(),
        level: 1,
        ..Config::default()
    };
    if let Err(err) = topdown_region::init(config) {
        panic!("init: {err}");
    }
    true
}

fn getppid(times: u32) {
    for _ in 0..times {
        // SAFETY: no preconditions.
        unsafe { libc::getppid() };
    }
}

fn getpgid(times: u32) {
    for _ in 0..times {
        // SAFETY: no preconditions.
        unsafe { libc::getpgid(0) };
    }
}

fn getsid(times: u32) {
    for _ in 0..times {
        // SAFETY: no preconditions.
        unsafe { libc::getsid(0) };
    }
}

/// Sets up the synthetic model and runs `work` on a fresh thread: the snapshot after it and the
/// thread's id, or `None` where privileged tests are skipped.
fn on_thread(work: impl FnOnce() + Send + 'static) -> Option<(Snapshot, u32)> {
    if !setup() {
        return None;
    }
    let tid = std::thread::spawn(move || {
        work();
        topdown_region::regions::current_tid()
    })
    .join()
    .expect("worker thread");
    Some((topdown_region::snapshot(), tid))
}

fn thread(snapshot: &Snapshot, tid: u32) -> &ThreadRecord {
    snapshot
        .thread(tid)
        .unwrap_or_else(|| panic!("no record of thread {tid}"))
}

/// `counter` in a region's inclusive and exclusive counts.
fn counts(snapshot: &Snapshot, record: &ThreadRecord, region: &str, counter: &str) -> (u64, u64) {
    let totals = record
        .region(region)
        .unwrap_or_else(|| panic!("no region {region}"));
    (
        snapshot.value(&totals.inclusive, counter).unwrap(),
        snapshot.value(&totals.exclusive, counter).unwrap(),
    )
}

/// Each `(region, counter, (inclusive, exclusive))` of `expected`, checked with [`counts`].
fn assert_counts(
    snapshot: &Snapshot,
    record: &ThreadRecord,
    expected: &[(&str, &str, (u64, u64))],
) {
    for &(region, counter, want) in expected {
        assert_eq!(
            counts(snapshot, record, region, counter),
            want,
            "{region} {counter}"
        );
    }
}

#[test]
fn a_region_counts_exactly_its_1234_getppid_calls() {
    let Some((snapshot, tid)) = on_thread(|| {
        getppid(10);
        {
            let _region = topdown_region::region("getppid-1234");
            getppid(1234);
            getpgid(5);
        }
        getppid(10);
    }) else {
        return;
    };
    let record = thread(&snapshot, tid);
    assert_eq!(record.path, ReadPath::Read, "{}", record.reason);
    assert_eq!(record.region("getppid-1234").unwrap().calls, 1);
    assert_counts(
        &snapshot,
        record,
        &[
            ("getppid-1234", "slots", (1234, 1234)),
            ("getppid-1234", "topdown-retiring", (5, 5)),
            ("getppid-1234", "topdown-bad-spec", (0, 0)),
        ],
    );
    assert_eq!(snapshot.value(&record.outermost, "slots"), Some(1234));
    assert_eq!(record.misuse, Default::default());
    assert_eq!(record.read_errors, 0);
    assert_eq!(record.readings, 2);
}

#[test]
fn nested_regions_are_exact_inclusive_and_exclusive() {
    let Some((snapshot, tid)) = on_thread(|| {
        topdown_region::begin("outer");
        getppid(100);
        getpgid(7);
        for _ in 0..2 {
            topdown_region::begin("inner");
            getppid(1000);
            getsid(3);
            {
                let _innermost = topdown_region::region("innermost");
                getsid(20);
            }
            topdown_region::end("inner");
        }
        getppid(11);
        topdown_region::end("outer");
    }) else {
        return;
    };
    let record = thread(&snapshot, tid);
    let calls = |name: &str| record.region(name).unwrap().calls;
    assert_eq!(
        (calls("outer"), calls("inner"), calls("innermost")),
        (1, 2, 2)
    );
    assert_counts(
        &snapshot,
        record,
        &[
            ("outer", "slots", (2111, 111)),
            ("inner", "slots", (2000, 2000)),
            ("innermost", "slots", (0, 0)),
            ("outer", "topdown-retiring", (7, 7)),
            ("outer", "topdown-bad-spec", (46, 0)),
            ("inner", "topdown-bad-spec", (46, 6)),
            ("innermost", "topdown-bad-spec", (40, 40)),
        ],
    );
    // The region tree: caller -> callee, calls and inclusive slots / getsid.
    type Edge<'a> = (Option<&'a str>, &'a str, u64, Option<u64>, Option<u64>);
    let edges: Vec<Edge> = record
        .edges
        .iter()
        .map(|edge| {
            (
                edge.caller.as_deref(),
                edge.callee.as_str(),
                edge.calls,
                snapshot.value(&edge.inclusive, "slots"),
                snapshot.value(&edge.inclusive, "topdown-bad-spec"),
            )
        })
        .collect();
    assert_eq!(
        edges,
        [
            (Some("inner"), "innermost", 2, Some(0), Some(40)),
            (Some("outer"), "inner", 2, Some(2000), Some(46)),
            (None, "outer", 1, Some(2111), Some(46)),
        ]
    );
    // Only the outermost region adds to the thread's total.
    assert_eq!(snapshot.value(&record.outermost, "slots"), Some(2111));
    assert_eq!(record.misuse, Default::default());
}

#[test]
fn each_thread_has_its_own_exact_counts() {
    if !setup() {
        return;
    }
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let spawn = |calls: u32| {
        let barrier = std::sync::Arc::clone(&barrier);
        std::thread::spawn(move || {
            // Both threads count at the same time.
            barrier.wait();
            let _region = topdown_region::region("work");
            getppid(calls);
            drop(_region);
            topdown_region::regions::current_tid()
        })
    };
    let (first, second) = (spawn(500), spawn(1500));
    let first = first.join().expect("first thread");
    let second = second.join().expect("second thread");
    let snapshot = topdown_region::snapshot();
    for (tid, calls) in [(first, 500), (second, 1500)] {
        let record = thread(&snapshot, tid);
        assert!(record.exited);
        assert_eq!(counts(&snapshot, record, "work", "slots"), (calls, calls));
        assert_eq!(record.region("work").unwrap().calls, 1);
    }
}

#[test]
fn misuse_is_counted_and_never_fatal() {
    let Some((snapshot, tid)) = on_thread(|| {
        // An end without a begin.
        topdown_region::end("never-begun");
        // An end naming a region that is not open, inside one that is.
        topdown_region::begin("a");
        topdown_region::end("not-open");
        // A mismatched end: "a" ends while "b" is open inside it; "b" is abandoned.
        topdown_region::begin("b");
        getppid(4);
        topdown_region::end("a");
        // Past the depth limit: the extra begins and their ends are ignored.
        for _ in 0..MAX_DEPTH + 3 {
            topdown_region::begin("deep");
        }
        getppid(9);
        for _ in 0..MAX_DEPTH + 3 {
            topdown_region::end("deep");
        }
        // Left open when the thread exits.
        topdown_region::begin("left-open");
    }) else {
        return;
    };
    let record = thread(&snapshot, tid);
    let misuse = record.misuse;
    assert_eq!(misuse.unmatched_ends, 1);
    assert_eq!(misuse.unknown_ends, 1);
    assert_eq!(misuse.mismatched_ends, 1);
    assert_eq!(misuse.abandoned, 1);
    assert_eq!(misuse.too_deep, 3);
    assert_eq!(misuse.open_at_exit, 1);
    assert!(record.exited);
    // "a" still counted its getppid calls; "b" never ended.
    assert_eq!(counts(&snapshot, record, "a", "slots"), (4, 4));
    assert_eq!(record.region("b").unwrap().calls, 0);
    // The 64 counted "deep" regions nest: the innermost saw the 9 calls, and each one
    // around it too (inclusive), none of them exclusively but the innermost.
    let deep = record.region("deep").unwrap();
    assert_eq!(deep.calls, MAX_DEPTH as u64);
    assert_eq!(
        snapshot.value(&deep.inclusive, "slots"),
        Some(9 * MAX_DEPTH as u64)
    );
    assert_eq!(snapshot.value(&deep.exclusive, "slots"), Some(9));
}

#[test]
fn the_path_is_read_with_the_pages_reason() {
    if !setup() {
        return;
    }
    let (path, reason) = std::thread::spawn(topdown_region::thread_path)
        .join()
        .expect("thread");
    assert_eq!(path, ReadPath::Read);
    // The first counter's page already says no: tracepoints have no hardware counter.
    assert!(reason.starts_with("counter slots: "), "{reason}");
    assert!(
        reason.contains("cap_user_rdpmc is 0") || reason.contains("index is 0"),
        "{reason}"
    );
}

#[test]
fn level_one_metrics_come_from_the_models_formulas() {
    // intel-icl level 1 (topdown-formulas.md §1.4): SUM = ret + bad + fe + be; Frontend =
    // fe/SUM - UOP_DROPPING/slots; Backend = be/SUM + 5 * CLEARS_COUNT/slots; Retiring =
    // ret/SUM; Bad speculation = 1 - the others. Counters: slots=getppid,
    // topdown-retiring=getpgid, topdown-bad-spec=getsid, topdown-fe-bound=getpriority,
    // topdown-be-bound=getresuid.
    let Some((snapshot, tid)) = on_thread(|| {
        let _region = topdown_region::region("mix");
        getppid(1000);
        getpgid(400);
        getsid(100);
        for _ in 0..200 {
            // SAFETY: no preconditions.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        }
        let (mut r, mut e, mut s) = (0, 0, 0);
        for _ in 0..300 {
            // SAFETY: valid out-pointers.
            unsafe { libc::getresuid(&mut r, &mut e, &mut s) };
        }
    }) else {
        return;
    };
    let record = thread(&snapshot, tid);
    let json = topdown_region::report::to_json(&snapshot).unwrap();
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    let function = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["symbol"] == "mix" && f["pid"] == tid)
        .expect("the region in the report");
    assert_eq!(function["target"], "region");
    let metric = |name: &str| function["exclusive"]["metrics"][name].as_f64().unwrap();
    assert!((metric("retiring") - 0.40).abs() < 1e-12);
    assert!((metric("frontend_bound") - 0.20).abs() < 1e-12);
    assert!((metric("backend_bound") - 0.30).abs() < 1e-12);
    assert!((metric("bad_speculation") - 0.10).abs() < 1e-12);
    assert_eq!(report["model"], "intel-icl");
    assert_eq!(report["synthetic"], true);
    assert_eq!(
        counts(&snapshot, record, "mix", "topdown-be-bound"),
        (300, 300)
    );
}
