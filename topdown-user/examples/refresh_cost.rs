//! User-space cost of one refresh at scale: what `topdown top` and `topdown serve` do every
//! interval once the BPF maps are read, for `TASKS` live threads and `EDGES` call-tree edges.
//!
//! Run by `cargo xtask bench` (release build): `refresh_cost [TASKS] [EDGES] [ROUNDS] [PATH]`,
//! default 100000 tasks, 10000 edges, 5 rounds, every step; prints one `step_NAME_ms=` line per
//! step with the median of the rounds in milliseconds, then the two paths a refresh takes:
//!
//! - `top_ms=`: what `topdown top` does per refresh: `order` (index the task map's entries by
//!   tid, `LiveTasks::from_entries`) plus `aggregate` plus `top_screen` (pick the rows a
//!   50-line screen shows, name and evaluate them, draw the screen) plus `aggregate_drop` (the
//!   previous refresh's counts freed);
//! - `serve_ms=`: what `topdown serve` does per refresh: `order` plus `aggregate` plus
//!   `exporter_update` (a fresh exporter: every series is new, the worst case) plus
//!   `aggregate_drop`; `scrape` (encoding every series) happens per scrape, not per refresh,
//!   and is printed on its own.
//!
//! Reading the task map itself is the kernel's work and printed on its own: `map_read` (the
//! batched read `Session::snapshot` makes) and `map_read_by_entry` (aya's iterator, two system
//! calls per entry), on a kernel hash map of `TASKS` entries laid out as topdown's task map.
//! Creating it needs `CAP_BPF`; without, `map_read=not measured: REASON` is printed instead.
//!
//! Each figure is printed as wall time (`_ms=`) and as this thread's CPU time (`_cpu_ms=`),
//! which other processes on a busy machine inflate less. Last, `peak_rss_mb=`: the most
//! memory the process held at once (`VmHWM`), in MB. PATH `top`, `serve` or `stat` runs only
//! that command's steps (no kernel map), so `peak_rss_mb` is what that command's process
//! holds: both snapshots (kept from one refresh to the next) and its own step's data. The
//! rendered table and JSON are counted, not kept, as `stat` streams them.
//!
//! `report`, `table` and `json` are `stat`'s full output of everything (every thread, process,
//! function and edge), also printed on their own. The snapshots are synthetic (no BPF): two
//! cumulative snapshots one interval apart, every task and edge having counted in between, the
//! worst case for the delta and the sort. The model is `intel-spr` at level 2 (9 counters).

use std::{
    collections::HashMap,
    os::fd::{AsFd as _, OwnedFd},
    time::Instant,
};

use aya::maps::MapData;

use ratatui::{buffer::Buffer, layout::Rect};

use topdown::{
    commands::{
        serve::exporter::{Exporter, Limits},
        top::{
            Counted,
            view::{self, Header, Ui},
        },
    },
    model::base_model,
    report::{By, Format, Weight, render},
    session::{
        aggregate::{Aggregate, Naming, ReportContext, report_of},
        bpf::{LiveTasks, Snapshot, batch},
    },
};
use topdown_common::{CallKey, CallStats, CpuState, MAX_COUNTERS, ROOT_FUNCTION, TaskCounters};

/// Functions the edges are spread over (each edge: caller -> callee, both probed).
const FUNCTIONS: u32 = 1000;

fn counts(seed: u64, scale: u64) -> [u64; MAX_COUNTERS] {
    let mut counters = [0u64; MAX_COUNTERS];
    for (slot, value) in counters.iter_mut().enumerate().take(9) {
        *value = (seed % 9973 + 1) * (slot as u64 + 3) * scale;
    }
    counters
}

/// The task map's entries as a snapshot reads them: in the map's own order, which is its hash
/// order (here a fixed pseudo-random permutation of the tids).
fn task_entries(tasks: u32, scale: u64) -> (Vec<u32>, Vec<TaskCounters>) {
    let mut comm = [0u8; 16];
    comm[..6].copy_from_slice(b"worker");
    let mut tids: Vec<u32> = (1..=tasks).collect();
    // Fisher-Yates with a fixed LCG: the same order for both snapshots, as one map gives.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for index in (1..tids.len()).rev() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        tids.swap(index, (state >> 33) as usize % (index + 1));
    }
    let counters = tids
        .iter()
        .map(|&tid| TaskCounters {
            counters: counts(u64::from(tid), scale),
            switches: u64::from(tid) * scale,
            tgid: 1 + tid / 8,
            comm,
            ..TaskCounters::ZERO
        })
        .collect();
    (tids, counters)
}

fn snapshot(tasks: u32, edges: u32, scale: u64) -> Snapshot {
    let (tids, counters) = task_entries(tasks, scale);
    let live = LiveTasks::from_entries(tids, counters);
    let calls = (0..edges)
        .map(|edge| {
            let function = edge % FUNCTIONS;
            let parent = if edge < FUNCTIONS {
                ROOT_FUNCTION
            } else {
                (edge / FUNCTIONS + function) % FUNCTIONS
            };
            // Not split by process: `top` and `serve` never split functions by process
            // (`stat --by function,task` does).
            let key = CallKey {
                function,
                parent,
                tgid: 0,
                _pad: 0,
            };
            let stats = CallStats {
                calls: u64::from(edge + 1) * scale,
                unwound: 0,
                inclusive: counts(u64::from(edge) * 7, scale * 2),
                exclusive: counts(u64::from(edge) * 7, scale),
                callee_calls: 0,
            };
            (key, stats)
        })
        .collect();
    let mut cpu = CpuState::ZERO;
    cpu.total = counts(1, scale * u64::from(tasks));
    Snapshot {
        cpus: vec![(0, cpu), (1, cpu)],
        live,
        calls,
        ..Snapshot::default()
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The terminal `top` draws on here.
const SCREEN: Rect = Rect {
    x: 0,
    y: 0,
    width: 200,
    height: 50,
};

fn main() -> anyhow::Result<()> {
    let arg = |index: usize, default: u32| -> anyhow::Result<u32> {
        match std::env::args().nth(index) {
            Some(text) => text
                .parse()
                .map_err(|err| anyhow::anyhow!("argument {index} '{text}': {err}")),
            None => Ok(default),
        }
    };
    let (tasks, edges, rounds) = (arg(1, 100_000)?, arg(2, 10_000)?, arg(3, 5)?.max(1));
    let path = match std::env::args().nth(4).as_deref() {
        None | Some("all") => Path::All,
        Some("top") => Path::Top,
        Some("serve") => Path::Serve,
        Some("stat") => Path::Stat,
        Some(other) => anyhow::bail!("argument 4 '{other}': all, top, serve or stat"),
    };
    let model = base_model("intel-spr")?;
    let slot_names: Vec<String> = model.counters().into_iter().map(|spec| spec.name).collect();
    let functions: Vec<(String, String)> = (0..FUNCTIONS)
        .map(|id| {
            (
                "/usr/lib/libapp.so".to_owned(),
                format!("app::function_{id}"),
            )
        })
        .collect();
    let cgroup_paths = HashMap::new();
    let previous = snapshot(tasks, edges, 1);
    let current = snapshot(tasks, edges, 2);
    let by = [By::Task, By::Process, By::Function];
    let context = |call_tree: bool| ReportContext {
        model: model.as_ref(),
        slot_names: slot_names.clone(),
        level: 2,
        scope: "system-wide".into(),
        duration_s: 1.0,
        interval: None,
        cgroup_paths: &cgroup_paths,
        cgroup_depth: None,
        functions: &functions,
        target_returns: &[],
        call_tree,
        distribution_probe_costs: &|_| None,
        command_scope: false,
        before_command: None,
    };
    let naming = Naming::new(
        model.as_ref(),
        &slot_names,
        2,
        &cgroup_paths,
        None,
        &functions,
    );
    let header = Header {
        cpus: 2,
        refresh_ms: 1000,
        overhead_percent: None,
        counted_level: 2,
    };
    let ui = Ui::new(2);

    const STEPS: [&str; 11] = [
        "map_read",
        "map_read_by_entry",
        "order",
        "aggregate",
        "top_screen",
        "exporter_update",
        "scrape",
        "report",
        "table",
        "json",
        "aggregate_drop",
    ];
    // Per step: (wall, this thread's CPU time) of each round.
    let mut steps: Vec<Vec<(f64, f64)>> = vec![Vec::new(); STEPS.len()];
    let mut time = |step: usize, started: Started| {
        steps[step].push(started.elapsed());
    };
    let task_map = match path {
        Path::All => match kernel_task_map(tasks) {
            Ok(map) => Some(map),
            Err(err) => {
                println!("map_read=not measured: {err:#}");
                None
            }
        },
        // What one command's process holds: no kernel map read, which needs memory of its
        // own (the entries it returns become the current snapshot in topdown).
        _ => None,
    };
    // The entries `order` sorts, as the kernel map returns them: only the paths that run
    // `order` hold them (`stat` takes its snapshot from the session already in order).
    let unordered = (path != Path::Stat).then(|| task_entries(tasks, 2));
    let mut rendered = 0usize;
    for _ in 0..rounds {
        if let Some((batch_fd, by_entry)) = &task_map {
            // What `Session::snapshot` does with the task map: batched, then (the kernel's
            // fallback before 5.6) one entry at a time, as aya's iterator reads.
            let started = Started::now();
            let (mut tids, mut counters) = (Vec::<u32>::new(), Vec::<TaskCounters>::new());
            batch::lookup_all(batch_fd.as_fd(), &mut tids, &mut counters)
                .map_err(|err| anyhow::anyhow!("batch read: {err:?}"))?;
            time(0, started);
            rendered += tids.len();
            let started = Started::now();
            let mut read = 0usize;
            for entry in by_entry.iter() {
                read += usize::from(entry.is_ok());
            }
            time(1, started);
            rendered += read;
        }

        if let Some((unordered_tids, unordered_counters)) = &unordered {
            let (tids, counters) = (unordered_tids.clone(), unordered_counters.clone());
            let started = Started::now();
            let ordered = LiveTasks::from_entries(tids, counters);
            time(2, started);
            rendered += ordered.len();
        }

        let started = Started::now();
        let aggregate = Aggregate::since(&current, Some(&previous));
        time(3, started);

        let aggregate = if matches!(path, Path::All | Path::Top) {
            let started = Started::now();
            let counted = Counted {
                aggregate,
                duration_s: 1.0,
            };
            let kept = counted.visible(&naming, &ui, usize::from(SCREEN.height));
            let shown = report_of(&context(false), &kept);
            let mut screen = Buffer::empty(SCREEN);
            view::draw(&mut screen, SCREEN, &shown, &header, &ui);
            time(4, started);
            rendered += screen.content.len();
            counted.aggregate
        } else {
            aggregate
        };

        if matches!(path, Path::All | Path::Serve) {
            let started = Started::now();
            let mut exporter = Exporter::new(
                model.name(),
                false,
                Limits {
                    max_series: 1_000_000,
                    ttl: std::time::Duration::from_secs(300),
                },
            );
            exporter.update(&aggregate, &naming, Instant::now());
            time(5, started);

            let started = Started::now();
            let text = exporter.encode()?;
            time(6, started);
            rendered += text.len();
        }

        if matches!(path, Path::All | Path::Stat) {
            let started = Started::now();
            let report = report_of(&context(true), &aggregate);
            time(7, started);

            for (step, format) in [(8, Format::Table), (9, Format::Json)] {
                let started = Started::now();
                // Counted, not kept: `stat` streams its report to a file or stdout.
                let mut out = CountingSink(0);
                render(&report, format, &by, Weight::Slots, &mut out)?;
                time(step, started);
                rendered += out.0;
            }
        }
        // `top` and `serve` drop each refresh's counts when the next arrive.
        let started = Started::now();
        drop(aggregate);
        time(10, started);
    }
    println!("tasks={tasks} edges={edges} rounds={rounds} bytes_rendered={rendered}");
    let medians = |pick: fn(&(f64, f64)) -> f64| -> Vec<Option<f64>> {
        steps
            .iter()
            .map(|rounds| (!rounds.is_empty()).then(|| median(rounds.iter().map(pick).collect())))
            .collect()
    };
    let (wall, cpu) = (medians(|(wall, _)| *wall), medians(|(_, cpu)| *cpu));
    for ((name, wall), cpu) in STEPS.iter().zip(&wall).zip(&cpu) {
        if let (Some(wall), Some(cpu)) = (wall, cpu) {
            println!("step_{name}_ms={wall:.1}");
            println!("step_{name}_cpu_ms={cpu:.1}");
        }
    }
    // The user-space paths: ordering the read entries, the deltas, the path's own step, drop.
    let refresh = |figures: &[Option<f64>], own: usize| -> f64 {
        [2, 3, own, 10]
            .iter()
            .map(|&step| figures[step].unwrap_or(f64::NAN))
            .sum()
    };
    if path == Path::All {
        println!("top_ms={:.1}", refresh(&wall, 4));
        println!("top_cpu_ms={:.1}", refresh(&cpu, 4));
        println!("serve_ms={:.1}", refresh(&wall, 5));
        println!("serve_cpu_ms={:.1}", refresh(&cpu, 5));
    }
    // The most memory this process held at once (`VmHWM`, proc(5)): both snapshots, the
    // deltas, the exporter's series, and `stat`'s full report of everything rendered.
    match peak_rss_kib() {
        Some(kib) => println!("peak_rss_mb={:.1}", kib as f64 * 1024.0 / 1e6),
        None => println!("peak_rss_mb=not measured: no VmHWM in /proc/self/status"),
    }
    Ok(())
}

/// Which steps run: all of them (the timings), or one command's path alone, for the memory
/// that command's process holds (`peak_rss_mb`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    All,
    /// `order`, `aggregate`, `top_screen`, `aggregate_drop`.
    Top,
    /// `order`, `aggregate`, `exporter_update`, `scrape`, `aggregate_drop`.
    Serve,
    /// `aggregate`, `report`, `table`, `json`, `aggregate_drop`.
    Stat,
}

/// A writer that keeps nothing, only the byte count.
struct CountingSink(usize);

impl std::io::Write for CountingSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `VmHWM` of /proc/self/status, in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

/// A kernel hash map laid out as topdown's task map, holding `tasks` tasks: the batch reader's
/// descriptor, and the same map opened through aya for the entry-by-entry read. Needs
/// `CAP_BPF`.
fn kernel_task_map(
    tasks: u32,
) -> anyhow::Result<(OwnedFd, aya::maps::HashMap<MapData, u32, TaskCounters>)> {
    let map = batch::scratch_hash_map::<u32, TaskCounters>(tasks)
        .map_err(|err| anyhow::anyhow!("creating a BPF hash map needs CAP_BPF: {err}"))?;
    let (tids, counters) = task_entries(tasks, 2);
    for (tid, task) in tids.iter().zip(&counters) {
        batch::insert(map.as_fd(), tid, task)?;
    }
    let by_entry = MapData::from_fd(map.try_clone()?)?;
    let by_entry = aya::maps::HashMap::try_from(aya::maps::Map::HashMap(by_entry))?;
    Ok((map, by_entry))
}

/// When a step started: wall clock and this thread's CPU time, which other processes on a
/// busy machine do not inflate (they still share its caches).
#[derive(Clone, Copy)]
struct Started {
    wall: Instant,
    cpu_ms: f64,
}

impl Started {
    fn now() -> Self {
        Self {
            wall: Instant::now(),
            cpu_ms: thread_cpu_ms(),
        }
    }

    /// (wall, CPU) milliseconds since.
    fn elapsed(self) -> (f64, f64) {
        (
            self.wall.elapsed().as_secs_f64() * 1e3,
            thread_cpu_ms() - self.cpu_ms,
        )
    }
}

/// This thread's CPU time in milliseconds (`clock_gettime(2)`, `CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_ms() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if status != 0 {
        return f64::NAN;
    }
    now.tv_sec as f64 * 1e3 + now.tv_nsec as f64 / 1e6
}
