//! User-space cost of one refresh at scale: what `topdown top` and `topdown serve` do every
//! interval once the BPF maps are read, for `TASKS` live threads and `EDGES` call-tree edges.
//!
//! Run by `cargo xtask bench` (release build): `refresh_cost [TASKS] [EDGES] [ROUNDS]`, default
//! 100000 tasks, 10000 edges, 5 rounds; prints one line per step with the median of the rounds
//! in milliseconds, then `total_ms=`. The snapshots are synthetic (no BPF): two cumulative
//! snapshots one interval apart, every task and edge having counted in between, the worst case
//! for the delta and the sort. The model is `intel-spr` at level 2 (9 counters).

use std::{collections::HashMap, time::Instant};

use topdown::{
    aggregate::{Aggregate, Naming, ReportContext, report_of},
    bpf::Snapshot,
    model::base_model,
    report::{By, Format, Weight, render},
    serve::exporter::{Exporter, Limits},
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

fn snapshot(tasks: u32, edges: u32, scale: u64) -> Snapshot {
    let mut comm = [0u8; 16];
    comm[..6].copy_from_slice(b"worker");
    let live: HashMap<u32, TaskCounters> = (1..=tasks)
        .map(|tid| {
            let task = TaskCounters {
                counters: counts(u64::from(tid), scale),
                switches: u64::from(tid) * scale,
                tgid: 1 + tid / 8,
                comm,
                ..TaskCounters::ZERO
            };
            (tid, task)
        })
        .collect();
    let calls = (0..edges)
        .map(|edge| {
            let function = edge % FUNCTIONS;
            let parent = if edge < FUNCTIONS {
                ROOT_FUNCTION
            } else {
                (edge / FUNCTIONS + function) % FUNCTIONS
            };
            let key = CallKey {
                function,
                parent,
                tgid: edge / FUNCTIONS,
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

    let mut steps: Vec<(&str, Vec<f64>)> = ["aggregate", "report", "table", "json", "exporter"]
        .into_iter()
        .map(|name| (name, Vec::new()))
        .collect();
    let mut rendered = 0usize;
    for _ in 0..rounds {
        let started = Instant::now();
        let aggregate = Aggregate::since(&current, Some(&previous));
        steps[0].1.push(started.elapsed().as_secs_f64() * 1e3);

        let started = Instant::now();
        let ctx = ReportContext {
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
        };
        let report = report_of(&ctx, &aggregate);
        steps[1].1.push(started.elapsed().as_secs_f64() * 1e3);

        for (step, format) in [(2, Format::Table), (3, Format::Json)] {
            let started = Instant::now();
            let mut out = Vec::new();
            render(&report, format, &by, Weight::Slots, &mut out)?;
            steps[step].1.push(started.elapsed().as_secs_f64() * 1e3);
            rendered += out.len();
        }

        let started = Instant::now();
        let mut exporter = Exporter::new(
            model.name(),
            false,
            Limits {
                max_series: 1_000_000,
                ttl: std::time::Duration::from_secs(300),
            },
        );
        let naming = Naming::new(
            model.as_ref(),
            &slot_names,
            2,
            &cgroup_paths,
            None,
            &functions,
        );
        exporter.update(&aggregate, &naming, Instant::now());
        let text = exporter.encode()?;
        steps[4].1.push(started.elapsed().as_secs_f64() * 1e3);
        rendered += text.len();
    }
    println!("tasks={tasks} edges={edges} rounds={rounds} bytes_rendered={rendered}");
    let mut total = 0.0;
    for (name, values) in steps {
        let value = median(values);
        total += value;
        println!("{name}_ms={value:.1}");
    }
    println!("total_ms={total:.1}");
    Ok(())
}
