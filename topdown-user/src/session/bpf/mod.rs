//! The BPF session: loads topdown's eBPF object, hands it the counter fds, attaches its programs,
//! and reads back what it attributed.
//!
//! Dropping a [`Session`] detaches every program and closes every map and counter: nothing stays
//! attached after topdown exits (the kernel also frees all of it when the process dies, even on
//! `kill -9`, since nothing is pinned).

pub mod batch;
mod kernel_types;
mod live_tasks;
pub mod process_links;
mod records;
pub(crate) mod syscall;
mod usdt;

use kernel_types::KernelTypes;
pub use kernel_types::switch_offsets;
pub use live_tasks::LiveTasks;
pub use process_links::ProcessLinks;
pub use usdt::{SpanSnapshot, UsdtLinking, UsdtLinks};

use std::{
    collections::HashMap,
    os::fd::{AsFd as _, AsRawFd as _},
    time::Duration,
};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerfEventArray, RingBuf},
    programs::{
        BtfTracePoint, PerfEvent, RawTracePoint, RawTracePointRunOptions, TestRun as _, TracePoint,
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use topdown_common::{
    CallKey, CallStats, CgroupCounters, CpuState, FileAddress, GoroutineKey, HistogramBucket,
    HistogramKey, IndirectJump, MAX_COUNTERS, ProbeStats, TaskCounters, flush_mode, flush_result,
    kernel_offset, names, skip_untraced, thread_exit_field,
};

use crate::{
    error::{Failure, fail},
    functions::exit_plan::{FunctionProbes, Plan},
    session::{counters::CounterGroups, tracefs::Tracefs},
};

/// The eBPF object, built by build.rs with the pinned nightly and bpf-linker.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/topdown"));

/// At most this many threads close a finished session's links and programs at once.
const CLOSING_THREADS: usize = 32;

/// One thing `Session::close_in_background` closes.
enum Closing<'a> {
    /// A per-process link (`ProcessLinks`).
    Link(std::os::fd::OwnedFd),
    /// A program, detached from everything it is attached to and unloaded.
    Program(&'a mut aya::programs::Program),
}

impl Closing<'_> {
    fn close(self) {
        use aya::programs::Program;
        match self {
            Closing::Link(link) => drop(link),
            // The kinds topdown loads; any other is unloaded with the object.
            Closing::Program(program) => {
                let _ = match program {
                    Program::BtfTracePoint(program) => program.unload(),
                    Program::TracePoint(program) => program.unload(),
                    Program::RawTracePoint(program) => program.unload(),
                    Program::UProbe(program) => program.unload(),
                    Program::KProbe(program) => program.unload(),
                    Program::PerfEvent(program) => program.unload(),
                    _ => Ok(()),
                };
            }
        }
    }
}

/// What to attribute and how big the maps are.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Only tasks of these processes get entries (`-p`, `-- CMD`); `None`: every task (`-a`).
    pub tracked_tgids: Option<Vec<u32>>,
    /// Track children forked by tracked processes (`-- CMD`).
    pub follow_forks: bool,
    /// Capacity of the per-task map.
    pub max_tasks: u32,
    /// Capacity of the tracked-process map.
    pub max_tracked: u32,
    /// Show BPF-side diagnostics (aya-log) on stderr.
    pub verbose: bool,
    /// Keep function totals per process (`--by function,task`).
    pub split_functions_by_process: bool,
    /// Capacity of the per-thread shadow-stack map.
    pub max_stacks: u32,
    /// Capacity of the per-function (per call edge) map.
    pub max_calls: u32,
    /// Capacity of the per-call histogram map (buckets in use, over all functions).
    pub max_buckets: u32,
    /// The counter slot whose per-call count picks a call's histogram bucket.
    pub weight_slot: u32,
    /// Also attribute per cgroup v2 (`--by cgroup`).
    pub by_cgroup: bool,
    /// `-G`: only tasks in these cgroups (and their descendants) count.
    pub cgroup_filter: Option<Vec<u64>>,
    /// Capacity of the per-cgroup map.
    pub max_cgroups: u32,
    /// BPF counter slots in use and where each reads from (`crate::schedule::Plan`).
    pub num_slots: u32,
    pub slot_sources: [u32; MAX_COUNTERS],
    /// What runs the attribution: every context switch, or only cgroup switches (cgroup-only
    /// breakdowns, no per-task entries).
    pub trigger: Trigger,
    /// With a filter, read the counters only at switches where a traced task leaves or arrives
    /// and where a CPU goes idle (`skip_untraced_switches`); false with `--read-every-switch`.
    pub skip_untraced_switches: bool,
    /// Sizes of the USDT and span maps (`-U`, `--span`, `--postgres`).
    pub usdt: UsdtSizes,
}

/// How many USDT sites and `-U` probes there are, and the span totals' capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsdtSizes {
    pub sites: u32,
    pub hit_probes: u32,
    pub max_spans: u32,
}

impl Default for UsdtSizes {
    /// Nothing probed: the smallest maps.
    fn default() -> Self {
        Self {
            sites: 1,
            hit_probes: 1,
            max_spans: 16,
        }
    }
}

/// When counters are read and attributed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// `tp_btf/sched_switch`: every context switch; needed for per-task and per-function counts.
    SchedSwitch,
    /// The `cgroup-switches` software event: only when the CPU moves to another cgroup.
    CgroupSwitch,
}

/// How the function probes were attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// One uprobe.multi link per binary and program.
    Multi,
    /// One perf-event link per function and program.
    PerPoint,
}

/// An earlier snapshot's entries by key (none without one): what a delta subtracts.
pub(crate) fn earlier_by_key<'e, K: Copy + 'e, V: 'e, T, M: Default + FromIterator<(K, T)>>(
    entries: Option<&'e [(K, V)]>,
    value: impl Fn(&'e V) -> T,
) -> M {
    entries
        .map(|entries| {
            entries
                .iter()
                .map(|(key, entry)| (*key, value(entry)))
                .collect()
        })
        .unwrap_or_default()
}

/// Everything the BPF side has attributed so far (cumulative since the baseline).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Per-CPU state, by CPU number.
    pub cpus: Vec<(u32, CpuState)>,
    /// Tasks still in the map (alive at their last switch).
    pub live: LiveTasks,
    /// Tasks that died, in the order their exit records arrived: `(tid, totals)`.
    pub exited: Vec<(u32, TaskCounters)>,
    /// Function totals per caller -> callee edge.
    pub calls: Vec<(CallKey, CallStats)>,
    /// Per-call histogram buckets in use.
    pub histograms: Vec<(HistogramKey, HistogramBucket)>,
    /// Function-probe anomalies, summed over CPUs.
    pub probes: ProbeStats,
    /// Per-cgroup totals by cgroup id.
    pub cgroups: Vec<(u64, CgroupCounters)>,
    /// USDT hits and span totals (`-U`, `--span`, `--postgres`).
    pub spans: SpanSnapshot,
}

/// A loaded and attached BPF session.
pub struct Session {
    /// `None` once closed (`close_in_background`).
    ebpf: Option<Ebpf>,
    exits: RingBuf<MapData>,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    /// Kept open for as long as the BPF side reads them.
    groups: CounterGroups,
    exited: Vec<(u32, TaskCounters)>,
    /// How many of `exited` the last snapshot had.
    exits_in_last_snapshot: usize,
    /// The function probes' links, so they can be detached and re-attached (`serve`).
    function_links: Vec<(&'static str, aya::programs::uprobe::UProbeLinkId)>,
    /// `-- CMD`: function probes are attached per traced process here instead of machine-wide
    /// (the tracer of `crate::session::follow` adds each child's).
    followed: Option<ProcessLinks>,
    /// Time spent loading (verifying) function-probe programs since last taken: the part of
    /// an attach that does not grow with the number of functions.
    program_load_time: std::time::Duration,
    /// The CPUs online at the last check: one that comes back gets its counters re-opened.
    online: Vec<u32>,
    /// Each CPU's read errors at the last check: new ones on an online CPU mean its events
    /// were removed (an offline/online cycle quicker than the poll).
    read_errors: HashMap<u32, u64>,
    /// Span key texts read so far, by hash (`usdt::span_snapshot`).
    span_texts: std::sync::Arc<HashMap<u64, String>>,
    /// `THREAD_EXIT_FIELDS`' offsets when start-up parsed the kernel's BTF anyway.
    thread_exit_offsets: Option<[u32; thread_exit_field::COUNT as usize]>,
}

impl Session {
    /// Loads the programs, stores the counter fds, attaches, and takes each CPU's baseline.
    pub fn start(config: &SessionConfig, groups: CounterGroups, tracefs: &Tracefs) -> Result<Self> {
        // Read once: the switch program's field offsets and aya's program loading both parse
        // it (two reads of the ~6 MB file were ~10% of a run's start-up CPU time here).
        let kernel_btf = read_kernel_btf()?;
        let num_counters = config.num_slots;
        let slot_sources = config.slot_sources;
        let possible_cpus = aya::util::nr_cpus()
            .map_err(|(path, err)| anyhow!("reading {path}: {err}"))?
            .get();
        let filter = u32::from(config.tracked_tgids.is_some());
        let follow = u32::from(config.follow_forks);
        let fork_child = field_offset(tracefs, "sched", "sched_process_fork", "child_pid")?;
        let exit_group_dead = field_offset(tracefs, "sched", "sched_process_exit", "group_dead")?;
        let attach_dst_root =
            optional_field_offset(tracefs, "cgroup", "cgroup_attach_task", "dst_root");
        let attach_dst_id =
            optional_field_offset(tracefs, "cgroup", "cgroup_attach_task", "dst_id");
        let attach_pid = optional_field_offset(tracefs, "cgroup", "cgroup_attach_task", "pid");
        let idle_state = optional_field_offset(tracefs, "power", "cpu_idle", "state");
        let rename_pid = optional_field_offset(tracefs, "task", "task_rename", "pid");
        let rename_comm = optional_field_offset(tracefs, "task", "task_rename", "newcomm");
        let renames_seen = rename_pid != topdown_common::FIELD_ABSENT
            && rename_comm != topdown_common::FIELD_ABSENT;
        let counter_slots = possible_cpus * MAX_COUNTERS as u32;
        let log_level: u8 = if config.verbose { 0xff } else { 0 };
        let split = u32::from(config.split_functions_by_process);
        let by_cgroup = u32::from(config.by_cgroup);
        let by_task = u32::from(config.trigger == Trigger::SchedSwitch);
        // Without `task:task_rename` the names are copied at every reading, as before it kept
        // them.
        let comm_at_every_reading = u32::from(by_task != 0 && !renames_seen);
        let filter_cgroups = u32::from(config.cgroup_filter.is_some());
        // Parsed once (most of the ~25 ms the kernel's BTF costs here), where the switch
        // program reads task fields; the thread-exit program's offsets come from the same
        // parse, so attaching it later reads nothing again.
        let kernel_types = reads_task_fields_at_switches(config)
            .then(|| KernelTypes::parse(&kernel_btf).context("parsing /sys/kernel/btf/vmlinux"));
        let (skip_untraced, kernel_offsets) = skip_untraced_switches(config, kernel_types.as_ref());
        let thread_exit_offsets = match &kernel_types {
            Some(Ok(types)) => thread_exit_offsets(types).ok(),
            _ => None,
        };
        drop(kernel_types);

        // Set at load: from then on only the BPF side changes it, a word at a time, atomically.
        // Idle (pid 0) is marked as a process that leaves unseen: a switch to it is always
        // read (`reading_owner`), and sched_switch's skip path then tests one word, not the
        // tid too.
        let mut pid_flags = vec![0u64; topdown_common::pid_flags::WORDS];
        topdown_common::pid_flags::set(&mut pid_flags, 0, topdown_common::pid_flags::UNSEEN_LEAVER);
        for tgid in config.tracked_tgids.iter().flatten() {
            topdown_common::pid_flags::set(
                &mut pid_flags,
                *tgid,
                topdown_common::pid_flags::TRACKED,
            );
        }

        let mut loader = EbpfLoader::new();
        loader
            // `STACKS` and `SPAN_STACKS` are task storage, which aya 0.16 loads but has no type
            // for (only the programs use them).
            .allow_unsupported_maps()
            .override_global(names::GLOBAL_NUM_COUNTERS, &num_counters, true)
            .override_global(names::GLOBAL_PID_FLAGS, pid_flags.as_slice(), true)
            .override_global(names::GLOBAL_SLOT_SOURCES, &slot_sources, true)
            .override_global(names::GLOBAL_FILTER_TGIDS, &filter, true)
            .override_global(names::GLOBAL_FOLLOW_FORKS, &follow, true)
            .override_global(names::GLOBAL_FORK_CHILD_PID_OFFSET, &fork_child, true)
            .override_global(names::GLOBAL_EXIT_GROUP_DEAD_OFFSET, &exit_group_dead, true)
            .override_global(names::GLOBAL_ATTACH_DST_ROOT_OFFSET, &attach_dst_root, true)
            .override_global(names::GLOBAL_ATTACH_DST_ID_OFFSET, &attach_dst_id, true)
            .override_global(names::GLOBAL_ATTACH_PID_OFFSET, &attach_pid, true)
            .override_global(names::GLOBAL_IDLE_STATE_OFFSET, &idle_state, true)
            .override_global(names::GLOBAL_SPLIT_FUNCTIONS_BY_PROCESS, &split, true)
            .override_global(names::GLOBAL_BY_CGROUP, &by_cgroup, true)
            .override_global(names::GLOBAL_BY_TASK, &by_task, true)
            .override_global(names::GLOBAL_FILTER_CGROUPS, &filter_cgroups, true)
            .override_global(names::GLOBAL_SKIP_UNTRACED, &skip_untraced, true)
            .override_global(names::GLOBAL_KERNEL_OFFSETS, &kernel_offsets, true)
            .override_global(names::GLOBAL_WEIGHT_SLOT, &config.weight_slot, true)
            .map_max_entries(names::HISTOGRAMS, config.max_buckets)
            .override_global(
                names::GLOBAL_COMM_AT_EVERY_READING,
                &comm_at_every_reading,
                true,
            )
            .override_global(names::GLOBAL_RENAME_PID_OFFSET, &rename_pid, true)
            .override_global(names::GLOBAL_RENAME_COMM_OFFSET, &rename_comm, true)
            .map_max_entries(names::CGROUPS, config.max_cgroups)
            .override_global(aya_log::LEVEL, &log_level, false)
            .map_max_entries(names::GO_STACKS, config.max_stacks)
            .map_max_entries(names::CALLS, config.max_calls)
            .map_max_entries(names::COUNTERS, counter_slots)
            .map_max_entries(names::GENERATIONS, possible_cpus)
            .map_max_entries(names::TASKS, config.max_tasks)
            .map_max_entries(names::PROCESS_CGROUPS, config.max_tasks)
            .map_max_entries(names::TRACKED, config.max_tracked)
            .map_max_entries(names::USDT_SITES, config.usdt.sites.max(1))
            .map_max_entries(names::USDT_HITS, config.usdt.hit_probes.max(1))
            .map_max_entries(names::SPAN_TOTALS, config.usdt.max_spans)
            .map_max_entries(names::SPAN_TEXTS, config.usdt.max_spans);
        let mut ebpf = loader.load(EBPF_OBJECT).map_err(|err| {
            fail(
                Failure::BpfUnavailable,
                format!("loading topdown's BPF object failed: {err:#}"),
            )
        })?;

        let logger = if config.verbose {
            Some(aya_log::EbpfLogger::init(&mut ebpf).context("setting up BPF-side logging")?)
        } else {
            None
        };

        {
            let mut counters: PerfEventArray<&mut MapData> = map_mut(&mut ebpf, names::COUNTERS)?;
            for (cpu, slot, fd) in groups.fds() {
                let index = cpu * MAX_COUNTERS as u32 + slot as u32;
                counters.set(index, &fd).with_context(|| {
                    format!("storing counter {slot} of CPU {cpu} in the BPF map")
                })?;
            }
        }
        if let Some(tgids) = &config.tracked_tgids {
            fill_set(&mut ebpf, names::TRACKED, tgids, |tgid| {
                format!("tracking pid {tgid}")
            })?;
        }
        if let Some(ids) = &config.cgroup_filter {
            fill_set(&mut ebpf, names::CGROUP_FILTER, ids, |id| {
                format!("adding cgroup {id} to the filter")
            })?;
        }
        let exits: RingBuf<MapData> = ebpf
            .take_map(names::EXITS)
            .ok_or_else(|| anyhow!("BPF object has no {} map", names::EXITS))?
            .try_into()
            .context("opening the exit ring buffer")?;

        load_programs(
            &mut ebpf,
            follow != 0 || filter != 0 || config.by_cgroup,
            &kernel_btf,
        )?;
        if config.by_cgroup {
            // The fork hook is attached first, so no process is missed between the two.
            match attach_cgroup_attach(&mut ebpf) {
                Ok(()) => record_process_cgroups(&mut ebpf)?,
                Err(err) => log::warn!(
                    "{err:#}: a process that moves itself to another cgroup has its counts since \
                     its CPU's last reading credited to the cgroup it moves to"
                ),
            }
        }
        if by_task != 0 {
            if renames_seen {
                // Before the switches are read: an entry made from here on keeps its name.
                if let Err(err) = attach_task_rename(&mut ebpf) {
                    log::warn!(
                        "{err:#}: a task renamed during the run (exec, prctl) keeps the name \
                         it had at its first reading"
                    );
                }
            } else {
                log::info!(
                    "no task:task_rename tracepoint: task names are copied at every reading \
                     (costlier)"
                );
            }
        }
        if config.trigger == Trigger::CgroupSwitch {
            if let Err(err) = attach_cpu_idle(&mut ebpf) {
                log::warn!(
                    "{err:#}: with the cgroup-switch trigger, idle time goes to the cgroup of \
                     the next task that leaves the CPU; --trigger sched-switch avoids it"
                );
            }
            attach_cgroup_switch(&mut ebpf, &groups)?;
        } else {
            attach_sched_switch(&mut ebpf)?;
        }
        let mut session = Self {
            ebpf: Some(ebpf),
            exits,
            logger,
            groups,
            exited: Vec::new(),
            exits_in_last_snapshot: 0,
            function_links: Vec::new(),
            followed: None,
            program_load_time: std::time::Duration::ZERO,
            online: crate::session::counters::online_cpus()?,
            read_errors: HashMap::new(),
            span_texts: Default::default(),
            thread_exit_offsets,
        };
        // Baseline: from here on every count belongs to someone.
        session.flush(false)?;
        Ok(session)
    }

    /// From now on, function probes go to the processes `links` follows, one link each,
    /// instead of to every process that maps the binary.
    pub fn follow_processes(&mut self, links: ProcessLinks) {
        self.followed = Some(links);
    }

    /// Whether function probes go to followed processes only.
    pub fn follows_processes(&self) -> bool {
        self.followed.is_some()
    }

    /// Hands the exit program its indirect-jump descriptors and the functions whose returns
    /// are probed (`crate::functions::exit_plan`), replacing what a previous attachment left.
    pub fn set_exit_maps(&mut self, plan: &Plan) -> Result<()> {
        let mut jumps: BpfHashMap<&mut MapData, u32, IndirectJump> =
            map_mut(loaded(&mut self.ebpf)?, names::INDIRECT_JUMPS)?;
        let stale: Vec<u32> = jumps.keys().filter_map(Result::ok).collect();
        for key in stale {
            let _ = jumps.remove(&key);
        }
        for (index, jump) in &plan.indirect_jumps {
            jumps
                .insert(index, jump, 0)
                .context("filling the indirect-jump map (too many indirect jumps?)")?;
        }
        let mut targets: BpfHashMap<&mut MapData, FileAddress, u8> =
            map_mut(loaded(&mut self.ebpf)?, names::RETURN_TARGETS)?;
        let stale: Vec<FileAddress> = targets.keys().filter_map(Result::ok).collect();
        for key in stale {
            let _ = targets.remove(&key);
        }
        for target in &plan.return_targets {
            targets
                .insert(target, &1u8, 0)
                .context("filling the return-target map")?;
        }
        Ok(())
    }

    /// Attaches the probes of `functions`, per binary: first the return side (so a call already
    /// in flight at attach time cannot desynchronise a shadow stack), then the entries. The
    /// return side is a plain uprobe on each exit instruction when the function was decoded
    /// (x86-64): it leaves return addresses alone, so C++ exceptions still unwind through
    /// probed frames; otherwise a uretprobe. One uprobe.multi link per binary and program when
    /// the kernel has them. If any link fails, the links of this call are detached again.
    ///
    /// `processes`: limit the probes to these processes (`-p`); empty: every process that
    /// maps the binary (`-a`), or, after [`Session::follow_processes`] (`-- CMD`), the
    /// followed processes only.
    pub fn attach_functions(
        &mut self,
        functions: &[FunctionProbes],
        processes: &[u32],
    ) -> Result<AttachMode> {
        let before = self.function_links.len();
        let result = self.attach_functions_or_leave_some(functions, processes);
        if result.is_err() {
            for (program_name, link) in self.function_links.split_off(before).into_iter().rev() {
                if let Ok(program) = loaded(&mut self.ebpf)
                    .and_then(|ebpf| program_mut::<UProbe>(ebpf, program_name))
                {
                    let _ = program.detach(link);
                }
            }
        }
        result
    }

    fn attach_functions_or_leave_some(
        &mut self,
        functions: &[FunctionProbes],
        processes: &[u32],
    ) -> Result<AttachMode> {
        let multi = aya::sys::is_uprobe_multi_supported(aya::sys::UProbeMultiFeature::LinkCreation)
            .unwrap_or(false);
        let pick =
            |single: &'static str, multiple: &'static str| if multi { multiple } else { single };
        let native_entry = pick(names::PROG_FUNC_ENTRY, names::PROG_FUNC_ENTRY_MULTI);
        let native_exit = pick(names::PROG_FUNC_EXIT, names::PROG_FUNC_EXIT_MULTI);
        let ret = pick(names::PROG_FUNC_RETURN, names::PROG_FUNC_RETURN_MULTI);
        let go_entry = pick(names::PROG_GO_ENTRY, names::PROG_GO_ENTRY_MULTI);
        let go_exit = pick(names::PROG_GO_EXIT, names::PROG_GO_EXIT_MULTI);

        type Points = Vec<UProbeAttachPoint<'static>>;
        let mut plan: std::collections::BTreeMap<(&'static str, &std::path::Path), Points> =
            std::collections::BTreeMap::new();
        for function in functions {
            // Go functions keep their frames per goroutine (eBPF `goroutines`).
            let (entry, exit) = if function.go {
                (go_entry, go_exit)
            } else {
                (native_entry, native_exit)
            };
            let points = function
                .exits
                .iter()
                .map(|point| (exit, point))
                .chain(function.uretprobe.iter().map(|point| (ret, point)))
                .chain(function.entry.iter().map(|point| (entry, point)));
            for (program, point) in points {
                plan.entry((program, point.target.as_path()))
                    .or_default()
                    .push(UProbeAttachPoint {
                        location: UProbeAttachLocation::AbsoluteOffset(point.offset),
                        cookie: Some(point.cookie),
                    });
            }
        }
        let needed: Vec<&'static str> = [native_exit, go_exit, ret, native_entry, go_entry]
            .into_iter()
            .filter(|program| plan.keys().any(|(name, _)| name == program))
            .collect();
        self.program_load_time += load_uprobes_together(loaded(&mut self.ebpf)?, &needed)?;
        if let Some(followed) = self.followed.clone() {
            if !multi {
                return Err(fail(
                    Failure::BpfUnavailable,
                    "probing only the traced processes needs uprobe.multi links (Linux 6.6 or later)",
                ));
            }
            let mut templates = Vec::new();
            for program_name in needed {
                let fd = shared_fd(
                    loaded_uprobe(&mut self.ebpf, &mut self.program_load_time, program_name)?,
                    program_name,
                )?;
                for ((name, target), target_points) in &plan {
                    if *name != program_name {
                        continue;
                    }
                    let points: Vec<(u64, u64)> = target_points
                        .iter()
                        .filter_map(|point| match point.location {
                            UProbeAttachLocation::AbsoluteOffset(offset) => {
                                Some((offset, point.cookie.unwrap_or_default()))
                            }
                            _ => None,
                        })
                        .collect();
                    templates.push(process_links::LinkTemplate::new(
                        fd.clone(),
                        target,
                        &points,
                        program_name == ret,
                    )?);
                }
            }
            followed.add(templates)?;
            return Ok(AttachMode::Multi);
        }
        let scopes = scopes_of(processes);
        for program_name in [native_exit, go_exit, ret, native_entry, go_entry] {
            let targets: Vec<_> = plan
                .iter()
                .filter(|((name, _), _)| *name == program_name)
                .collect();
            if targets.is_empty() {
                continue;
            }
            let program = loaded_uprobe(&mut self.ebpf, &mut self.program_load_time, program_name)?;
            for ((_, target), target_points) in targets {
                for scope in &scopes {
                    let link = program
                        .attach(target_points.iter().copied(), target, *scope)
                        .with_context(|| {
                            format!(
                                "attaching {} {program_name} probes to {}",
                                target_points.len(),
                                target.display()
                            )
                        })?;
                    self.function_links.push((program_name, link));
                }
            }
        }
        Ok(if multi {
            AttachMode::Multi
        } else {
            AttachMode::PerPoint
        })
    }

    /// The time spent loading function-probe programs since the last call (the kernel's
    /// verifier: tens of milliseconds for topdown's, whatever the number of functions).
    pub fn take_program_load_time(&mut self) -> std::time::Duration {
        std::mem::take(&mut self.program_load_time)
    }

    /// Probes the points where unwinding ends (`crate::functions::unwinding::catch_points`): each
    /// closes the frames the unwinding left as unwound calls. Detached with the function probes.
    /// Returns the points that could not be attached (a mapping process that exited since its
    /// objects were read): calls unwound there are counted as missed returns instead.
    pub fn attach_catch_points(
        &mut self,
        points: &[(std::path::PathBuf, u64)],
        processes: &[u32],
    ) -> Result<Vec<String>> {
        let mut failed = Vec::new();
        if points.is_empty() {
            return Ok(failed);
        }
        if let Some(followed) = self.followed.clone() {
            // `-- CMD`: in the command's processes only, like the functions: another C++
            // program catching exceptions never traps (issue 21).
            let name = names::PROG_FUNC_CATCH_MULTI;
            let program = loaded_uprobe(&mut self.ebpf, &mut self.program_load_time, name)?;
            let fd = shared_fd(program, name)?;
            let mut by_target: std::collections::BTreeMap<&std::path::Path, Vec<(u64, u64)>> =
                std::collections::BTreeMap::new();
            for (target, offset) in points {
                by_target
                    .entry(target.as_path())
                    .or_default()
                    .push((*offset, 0));
            }
            let mut templates = Vec::new();
            for (target, target_points) in by_target {
                templates.push(process_links::LinkTemplate::new(
                    fd.clone(),
                    target,
                    &target_points,
                    false,
                )?);
            }
            followed.add(templates)?;
            return Ok(failed);
        }
        let name = names::PROG_FUNC_CATCH;
        let program = loaded_uprobe(&mut self.ebpf, &mut self.program_load_time, name)?;
        let scopes = scopes_of(processes);
        for (target, offset) in points {
            for attached in attach_at(program, target, (*offset, None), &scopes) {
                match attached {
                    Ok(link) => self.function_links.push((name, link)),
                    Err(err) => failed.push(format!("{} at {offset:#x}: {err}", target.display())),
                }
            }
        }
        Ok(failed)
    }

    /// Hooks the Go runtime of `target` at `hooks` (`(file offset, go_hook kind)`, see
    /// `crate::functions::symbols::go`): goroutine switches, morestack and goroutine exits, which
    /// the Go function probes need. Attached before the functions' probes, detached with them.
    pub fn attach_go_runtime(
        &mut self,
        target: &std::path::Path,
        hooks: &[(u64, u64)],
        processes: &[u32],
    ) -> Result<()> {
        if let Some(followed) = self.followed.clone() {
            // `-- CMD`: the hooks go into the command's processes only, like its functions: an
            // untraced Go program's goroutine switches never trap.
            let name = names::PROG_GO_RUNTIME_MULTI;
            let program = loaded_uprobe(&mut self.ebpf, &mut self.program_load_time, name)?;
            let fd = shared_fd(program, name)?;
            let template = process_links::LinkTemplate::new(fd, target, hooks, false)?;
            return followed.add(vec![template]);
        }
        let name = names::PROG_GO_RUNTIME;
        let program = loaded_uprobe(&mut self.ebpf, &mut self.program_load_time, name)?;
        let scopes = scopes_of(processes);
        for (offset, kind) in hooks {
            for attached in attach_at(program, target, (*offset, Some(*kind)), &scopes) {
                let link = attached.with_context(|| {
                    format!(
                        "attaching the Go runtime hook at {offset:#x} of {}",
                        target.display()
                    )
                })?;
                self.function_links.push((name, link));
            }
        }
        Ok(())
    }

    /// `sched:sched_process_exit`: a thread leaving by `pthread_exit` or cancellation has its
    /// open frames closed as unwound calls (not one its process's group exit ends: the program
    /// tells them apart through `current->signal->flags`, at offsets from the kernel's BTF).
    /// Once per session.
    pub fn attach_thread_exit(&mut self) -> Result<()> {
        let name = names::PROG_THREAD_EXIT;
        let ebpf = loaded(&mut self.ebpf)?;
        if program_mut::<TracePoint>(ebpf, name)?.fd().is_ok() {
            return Ok(());
        }
        let offsets = match self.thread_exit_offsets {
            Some(offsets) => offsets,
            None => thread_exit_offsets(&KernelTypes::from_sys_fs()?)?,
        };
        let mut fields: Array<&mut MapData, u32> = map_mut(ebpf, names::THREAD_EXIT_FIELDS)?;
        for (index, offset) in (0u32..).zip(offsets) {
            fields
                .set(index, &offset, 0)
                .context("storing the thread-exit program's field offsets")?;
        }
        attach_tracepoint(ebpf, name, "sched", "sched_process_exit")
    }

    /// Detaches every function probe (to re-attach a changed set, or after a target binary was
    /// replaced on disk). Threads inside a probed function at this moment will have their frame
    /// unwound as a missed return.
    pub fn detach_functions(&mut self) -> Result<()> {
        // Reverse attach order: entries stop before returns, so a call that enters now is
        // never left with a frame whose return probe is already gone. Every link is tried even
        // after a failure: one given up here would stay attached, unknown to later detaches
        // (serve's duty cycle detaches thousands of times).
        if let Some(followed) = &self.followed {
            followed.clear();
        }
        let mut first_error = None;
        for (program_name, link) in std::mem::take(&mut self.function_links).into_iter().rev() {
            let detached = loaded(&mut self.ebpf)
                .and_then(|ebpf| program_mut::<UProbe>(ebpf, program_name))
                .and_then(|program| {
                    program
                        .detach(link)
                        .with_context(|| format!("detaching {program_name} probes"))
                });
            if let Err(err) = detached {
                first_error.get_or_insert(err);
            }
        }
        // Goroutines switched and returned unseen while detached: their clocks and frames
        // would mislead the next attachment.
        if let Err(err) = self.clear_goroutine_stacks() {
            first_error.get_or_insert(err);
        }
        first_error.map_or(Ok(()), Err)
    }

    fn clear_goroutine_stacks(&mut self) -> Result<()> {
        self.forget_goroutines(|_| true)
    }

    /// Deletes the shadow stacks of goroutines for which `gone` says so. One deleted meanwhile
    /// by its goroutine's exit is gone either way.
    fn forget_goroutines(&mut self, mut gone: impl FnMut(u32) -> bool) -> Result<()> {
        let mut stacks: BpfHashMap<&mut MapData, GoroutineKey, topdown_common::GoStack> =
            map_mut(loaded(&mut self.ebpf)?, names::GO_STACKS)?;
        let goroutines: Vec<GoroutineKey> = stacks.keys().filter_map(Result::ok).collect();
        for goroutine in goroutines {
            if gone(goroutine.tgid) {
                let _ = stacks.remove(&goroutine);
            }
        }
        Ok(())
    }

    /// Detaches every program and frees the maps on threads of their own, for when counting
    /// is over (the last snapshot taken): the kernel's unregistration of tracepoint and uprobe
    /// links waits for RCU grace periods, 250-440 ms for a run probing a whole libc here when
    /// closed one after another, on ~3 ms of CPU, which the report need not wait for. Reading the session afterwards is an
    /// error; the counter fds stay open until it is dropped.
    pub fn close_in_background(&mut self) -> std::thread::JoinHandle<()> {
        let ebpf = self.ebpf.take();
        let followed = self
            .followed
            .as_ref()
            .map(ProcessLinks::take)
            .unwrap_or_default();
        // Ids into the programs going away with `ebpf`.
        self.function_links.clear();
        std::thread::spawn(move || {
            let mut ebpf = ebpf;
            let mut closing: Vec<Closing<'_>> = followed.into_iter().map(Closing::Link).collect();
            if let Some(ebpf) = ebpf.as_mut() {
                closing.extend(
                    ebpf.programs_mut()
                        .map(|(_, program)| Closing::Program(program)),
                );
            }
            // Each close waits for the kernel's grace periods on next to no CPU: closed all
            // at once, the waits overlap (RCU serves concurrent waiters with one grace
            // period) instead of adding up, which one after another outlasted the probes'
            // calibration and the report and held up the process's exit (~0.5 s with a
            // whole libc and libstdc++ probed). Counting is over: the order no longer matters.
            let threads = closing.len().clamp(1, CLOSING_THREADS);
            let mut shares: Vec<Vec<Closing<'_>>> = (0..threads).map(|_| Vec::new()).collect();
            for (index, item) in closing.into_iter().enumerate() {
                shares[index % threads].push(item);
            }
            std::thread::scope(|scope| {
                for share in shares {
                    scope.spawn(move || share.into_iter().for_each(Closing::close));
                }
            });
            // The maps: freed by the kernel after a grace period, without waiting for it.
            drop(ebpf);
        })
    }

    /// Total time the kernel has spent running this session's programs (needs BPF run-time
    /// statistics enabled, `aya::sys::enable_stats`), and how many runs.
    pub fn program_run_time(&self) -> Result<(Duration, u64)> {
        let mut total = Duration::ZERO;
        let mut runs = 0;
        for (name, program) in loaded_ref(&self.ebpf)?.programs() {
            // Programs never loaded (unused triggers) have no info.
            if let Ok(info) = program.info() {
                total += info.run_time();
                runs += info.run_count();
            } else {
                log::debug!("no run-time info for program {name}");
            }
        }
        Ok((total, runs))
    }

    /// Attributes every CPU's running task its counts up to now. `last`: also freeze every CPU,
    /// so the state read afterwards is final and exactly consistent.
    pub fn flush(&mut self, last: bool) -> Result<()> {
        self.check_cpus()?;
        let program: &RawTracePoint = loaded_ref(&self.ebpf)?
            .program(names::PROG_FLUSH)
            .ok_or_else(|| anyhow!("BPF object has no {} program", names::PROG_FLUSH))?
            .try_into()?;
        let mode = if last {
            flush_mode::FINAL
        } else {
            flush_mode::ATTRIBUTE
        };
        // An offline CPU cannot run the flush; it has nothing running to attribute either.
        for cpu in self.groups.cpus().filter(|cpu| self.online.contains(cpu)) {
            let mut options = RawTracePointRunOptions::new();
            options.args[0] = mode;
            options.cpu = Some(cpu);
            let result = program
                .test_run(options)
                .with_context(|| format!("flushing counters on CPU {cpu}"))?;
            if result.return_value == flush_result::UNREADABLE {
                log::warn!("CPU {cpu}: counters could not be read at flush (group not running)");
            }
        }
        Ok(())
    }

    /// CPU hotplug: the kernel removes a CPU's perf events when it goes offline, so a CPU that
    /// is back gets its counters re-opened. Callers poll this (every second, and at each
    /// flush); counts on a returning CPU before the next poll are not counted.
    pub fn check_cpus(&mut self) -> Result<()> {
        let online = crate::session::counters::online_cpus()?;
        let cpu_state: PerCpuArray<&MapData, CpuState> =
            map(loaded_ref(&self.ebpf)?, names::CPU_STATE)?;
        let states = cpu_state.get(&0, 0).context("reading per-CPU state")?;
        let mut failing = Vec::new();
        for &cpu in &online {
            let errors = states
                .get(cpu as usize)
                .map_or(0, |state| state.read_errors);
            let before = self.read_errors.insert(cpu, errors).unwrap_or(errors);
            if errors > before {
                failing.push(cpu);
            }
        }
        for &cpu in &online {
            let why = if !self.online.contains(&cpu) {
                "back online"
            } else if failing.contains(&cpu) {
                "its counters stopped reading"
            } else {
                continue;
            };
            self.reopen_cpu(cpu)
                .with_context(|| format!("re-opening the counters of CPU {cpu} ({why})"))?;
            log::info!("CPU {cpu}: {why}; its counters were re-opened");
        }
        self.online = online;
        Ok(())
    }

    /// Replaces `cpu`'s counter fds with freshly opened ones, under the `GENERATIONS` seqlock
    /// the BPF side reads: odd while swapping, even (and new) after, so no reading mixes old and
    /// new counters and the first reading after is a baseline.
    pub fn reopen_cpu(&mut self, cpu: u32) -> Result<()> {
        let mut generations: aya::maps::Array<&mut MapData, u32> =
            map_mut(loaded(&mut self.ebpf)?, names::GENERATIONS)?;
        let current = generations.get(&cpu, 0).unwrap_or(0) & !1;
        generations
            .set(cpu, &(current + 1), 0)
            .context("marking the CPU's counters as being replaced")?;
        let reopened = self.groups.reopen(cpu);
        if reopened.is_ok() {
            let mut counters: PerfEventArray<&mut MapData> =
                map_mut(loaded(&mut self.ebpf)?, names::COUNTERS)?;
            for (slot, fd) in self.groups.cpu_fds(cpu) {
                let index = cpu * MAX_COUNTERS as u32 + slot as u32;
                counters.set(index, &fd).with_context(|| {
                    format!("storing counter {slot} of CPU {cpu} in the BPF map")
                })?;
            }
        }
        let mut generations: aya::maps::Array<&mut MapData, u32> =
            map_mut(loaded(&mut self.ebpf)?, names::GENERATIONS)?;
        generations
            .set(cpu, &(current + 2), 0)
            .context("publishing the CPU's new counters")?;
        reopened
    }

    /// The fd to poll for exit records.
    pub fn exits_fd(&self) -> std::os::fd::RawFd {
        self.exits.as_raw_fd()
    }

    /// The fd to poll for BPF-side log records (with `-v`).
    pub fn log_fd(&self) -> Option<std::os::fd::RawFd> {
        self.logger.as_ref().map(|logger| logger.as_raw_fd())
    }

    /// Prints pending BPF-side log records.
    pub fn flush_logs(&mut self) {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
    }

    /// Collects exit records from the ring buffer.
    pub fn drain_exits(&mut self) {
        while let Some(item) = self.exits.next() {
            match records::decode_exit(&item) {
                Some(exit) => self.exited.push(exit),
                None => log::warn!("short exit record ({} bytes) ignored", item.len()),
            }
        }
    }

    /// Reads everything attributed so far. Entries of dead tasks whose exit record was lost are
    /// moved to `exited` and deleted from the map.
    /// Deletes removed cgroups' entries from the cgroup map once their last counts were read:
    /// a removed cgroup can have no task, and a daemon must not fill the map with the dead.
    pub fn forget_cgroups(&mut self, ids: &[u64]) -> Result<()> {
        let mut cgroups: BpfHashMap<&mut MapData, u64, CgroupCounters> =
            map_mut(loaded(&mut self.ebpf)?, names::CGROUPS)?;
        for id in ids {
            match cgroups.remove(id) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(err) => return Err(err).context("removing a cgroup's entry"),
            }
        }
        Ok(())
    }

    /// Forgets the exited tasks collected so far, once a long-running caller has reported them
    /// (`serve`): their totals live on in its series, not in this process's memory.
    pub fn forget_exited(&mut self) {
        self.exited.clear();
        self.exited.shrink_to(1024);
        self.exits_in_last_snapshot = 0;
    }

    pub fn snapshot(&mut self) -> Result<Snapshot> {
        // A Go process that ended leaves the stacks of its goroutines that never exited (the
        // kernel side only sees goroutines end): free them, or a long `serve` fills the map.
        let mut alive: HashMap<u32, bool> = HashMap::new();
        self.forget_goroutines(|tgid| {
            !*alive
                .entry(tgid)
                .or_insert_with(|| std::path::Path::new(&format!("/proc/{tgid}")).exists())
        })?;
        let mut tasks: BpfHashMap<&mut MapData, u32, TaskCounters> =
            map_mut(loaded(&mut self.ebpf)?, names::TASKS)?;
        let (mut tids, mut counters) = (Vec::new(), Vec::new());
        read_whole(&tasks, &mut tids, &mut counters).context("reading the task map")?;
        let dead: Vec<(usize, u32)> = counters
            .iter()
            .zip(&tids)
            .enumerate()
            .filter(|(_, (task, _))| task.exited != 0)
            .map(|(index, (_, tid))| (index, *tid))
            .collect();
        // From the last, so that each `swap_remove` moves only entries already looked at.
        for (index, tid) in dead.into_iter().rev() {
            // Only forget it once it is gone from the map, so a failed delete is retried later.
            if tasks.remove(&tid).is_ok() {
                self.exited.push((tid, counters.swap_remove(index)));
                tids.swap_remove(index);
            }
        }
        // Exit records are read after the map, not before: a task retiring in between would
        // otherwise be in neither (its record sent after the read of records, its entry gone
        // before the read of the map), and its next snapshot would count it whole again.
        // Read after, it is in the records, or in both (`without_retired`).
        self.drain_exits();
        let since_last = self
            .exited
            .get(self.exits_in_last_snapshot..)
            .unwrap_or(&[]);
        let live = LiveTasks::from_entries(tids, counters).without_retired(since_last);
        self.exits_in_last_snapshot = self.exited.len();
        let cpu_state: PerCpuArray<&MapData, CpuState> =
            map(loaded_ref(&self.ebpf)?, names::CPU_STATE)?;
        let per_cpu = cpu_state.get(&0, 0).context("reading per-CPU state")?;
        let cpus = self
            .groups
            .cpus()
            .filter_map(|cpu| per_cpu.get(cpu as usize).map(|state| (cpu, *state)))
            .collect();
        let ebpf = loaded_ref(&self.ebpf)?;
        let calls = whole_map(ebpf, names::CALLS, "reading the function map")?;
        let histograms = whole_map(
            ebpf,
            names::HISTOGRAMS,
            "reading the per-call histogram map",
        )?;
        let probes = summed_per_cpu(
            loaded_ref(&self.ebpf)?,
            names::PROBE_STATS,
            "reading function-probe statistics",
            |sum: ProbeStats, cpu: &ProbeStats| {
                fieldwise!(
                    std::ops::Add::add,
                    ProbeStats {
                        overflows,
                        missed_returns,
                        unmatched_returns,
                        map_full,
                        read_failures,
                        tail_calls_cut,
                        histogram_full,
                        goroutine_switches_lost
                    },
                    sum,
                    cpu
                )
            },
        )?;
        let cgroups = whole_map(ebpf, names::CGROUPS, "reading the cgroup map")?;
        Ok(Snapshot {
            cpus,
            live,
            exited: self.exited.clone(),
            calls,
            histograms,
            probes,
            cgroups,
            spans: SpanSnapshot::default(),
        })
    }
}

/// Loads every program of topdown's BPF object into the kernel (the verifier runs) without
/// attaching anything, for `topdown check`. Returns the names of the programs that loaded.
pub fn verify_programs() -> Result<Vec<&'static str>> {
    let possible_cpus = aya::util::nr_cpus()
        .map_err(|(path, err)| anyhow!("reading {path}: {err}"))?
        .get();
    // The programs' loops over counter slots run to `NUM_COUNTERS`, a constant to the
    // verifier: verified with every slot in use, the largest a model can ask for, so a program
    // that only a big model's run would find too complex fails here.
    let num_counters = MAX_COUNTERS as u32;
    let mut ebpf = EbpfLoader::new()
        // As in `Session::start`.
        .allow_unsupported_maps()
        .map_max_entries(names::COUNTERS, possible_cpus * MAX_COUNTERS as u32)
        .override_global(names::GLOBAL_NUM_COUNTERS, &num_counters, true)
        .load(EBPF_OBJECT)
        .map_err(|err| {
            fail(
                Failure::BpfUnavailable,
                format!("loading topdown's BPF object failed: {err:#}"),
            )
        })?;
    let btf = Btf::from_sys_fs().map_err(|err| {
        fail(
            Failure::BpfUnavailable,
            format!("reading kernel BTF failed: {err}"),
        )
    })?;
    program_mut::<BtfTracePoint>(&mut ebpf, names::PROG_SCHED_SWITCH)?
        .load("sched_switch", &btf)
        .map_err(load_error(names::PROG_SCHED_SWITCH))?;
    let tracepoints = [
        names::PROG_FORK,
        names::PROG_EXIT,
        names::PROG_TASK_RENAME,
        names::PROG_CGROUP_ATTACH,
        names::PROG_CPU_IDLE,
        names::PROG_THREAD_EXIT,
    ];
    let uprobes = [
        names::PROG_FUNC_ENTRY,
        names::PROG_FUNC_RETURN,
        names::PROG_FUNC_EXIT,
        names::PROG_FUNC_CATCH,
        names::PROG_USDT_SITE,
        names::PROG_GO_ENTRY,
        names::PROG_GO_EXIT,
        names::PROG_GO_RUNTIME,
    ];
    load_each(&mut ebpf, &[names::PROG_FLUSH], RawTracePoint::load)?;
    load_each(&mut ebpf, &tracepoints, TracePoint::load)?;
    load_each(
        &mut ebpf,
        &[names::PROG_CGROUP_SWITCH],
        aya::programs::PerfEvent::load,
    )?;
    load_each(&mut ebpf, &uprobes, UProbe::load)?;
    // The uprobe.multi variants: the same code, verified with their own attach type, where the
    // kernel has them (listed apart: `check` names the programs above).
    if uprobe_multi_supported() {
        let uprobe_multis = [
            names::PROG_FUNC_ENTRY_MULTI,
            names::PROG_FUNC_RETURN_MULTI,
            names::PROG_FUNC_EXIT_MULTI,
            names::PROG_USDT_SITE_MULTI,
            names::PROG_GO_ENTRY_MULTI,
            names::PROG_GO_EXIT_MULTI,
            names::PROG_GO_RUNTIME_MULTI,
            names::PROG_FUNC_CATCH_MULTI,
        ];
        load_each(&mut ebpf, &uprobe_multis, UProbe::load)?;
    }
    Ok([
        &[names::PROG_SCHED_SWITCH, names::PROG_FLUSH][..],
        &tracepoints,
        &[names::PROG_CGROUP_SWITCH],
        &uprobes,
    ]
    .concat())
}

/// Loads each of `names` as a `P` with `load` (the verifier runs), without attaching it.
fn load_each<P>(
    ebpf: &mut Ebpf,
    names: &[&'static str],
    load: impl Fn(&mut P) -> Result<(), aya::programs::ProgramError>,
) -> Result<()>
where
    for<'a> &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    for &name in names {
        load(program_mut(ebpf, name)?).map_err(load_error(name))?;
    }
    Ok(())
}

/// Whether the kernel can attach many uprobes with one uprobe.multi link (Linux 6.6+).
pub fn uprobe_multi_supported() -> bool {
    aya::sys::is_uprobe_multi_supported(aya::sys::UProbeMultiFeature::LinkCreation).unwrap_or(false)
}

fn load_programs(ebpf: &mut Ebpf, need_process_hooks: bool, kernel_btf: &[u8]) -> Result<()> {
    let btf = Btf::parse(kernel_btf, aya::Endianness::default()).map_err(|err| {
        fail(
            Failure::BpfUnavailable,
            format!("reading kernel BTF failed: {err}"),
        )
    })?;
    {
        let program: &mut RawTracePoint = program_mut(ebpf, names::PROG_FLUSH)?;
        program.load().map_err(load_error(names::PROG_FLUSH))?;
    }
    if need_process_hooks {
        for (name, tracepoint) in [
            (names::PROG_FORK, "sched_process_fork"),
            (names::PROG_EXIT, "sched_process_exit"),
        ] {
            attach_tracepoint(ebpf, name, "sched", tracepoint)?;
        }
    }
    let program: &mut BtfTracePoint = program_mut(ebpf, names::PROG_SCHED_SWITCH)?;
    program
        .load("sched_switch", &btf)
        .map_err(load_error(names::PROG_SCHED_SWITCH))?;
    Ok(())
}

fn attach_sched_switch(ebpf: &mut Ebpf) -> Result<()> {
    let program: &mut BtfTracePoint = program_mut(ebpf, names::PROG_SCHED_SWITCH)?;
    program
        .attach()
        .context("attaching to tp_btf/sched_switch")?;
    Ok(())
}

/// `cgroup:cgroup_attach_task`: a process moving itself to another cgroup has its counts up to
/// the move credited to the cgroup it leaves (eBPF `process` module).
fn attach_cgroup_attach(ebpf: &mut Ebpf) -> Result<()> {
    attach_tracepoint(
        ebpf,
        names::PROG_CGROUP_ATTACH,
        "cgroup",
        "cgroup_attach_task",
    )
}

/// Fills `PROCESS_CGROUPS` with every process's cgroup v2 id as the run starts: a process that
/// moves itself before its first reading still has the cgroup it leaves known. Processes that
/// exit or move while this runs are corrected by the fork and attach hooks, already attached.
fn record_process_cgroups(ebpf: &mut Ebpf) -> Result<()> {
    let Some(mount) = crate::cgroup::CgroupTree::open()
        .ok()
        .map(|tree| tree.mount().to_path_buf())
    else {
        return Ok(());
    };
    // aya's HashMap also opens LRU hash maps.
    let mut map: BpfHashMap<&mut MapData, u32, u64> = map_mut(ebpf, names::PROCESS_CGROUPS)?;
    // linux/bpf.h
    const BPF_NOEXIST: u64 = 1;
    for (pid, cgroup) in crate::cgroup::process_cgroup_ids(std::path::Path::new("/proc"), &mount) {
        // BPF_NOEXIST: an entry the hooks wrote meanwhile is newer than what /proc said.
        let _ = map.insert(&pid, &cgroup, BPF_NOEXIST);
    }
    Ok(())
}

/// `power:cpu_idle` for the cgroup-switch trigger (eBPF `counters::cpu_idle`: the switches into
/// and out of idle that `cgroup-switches` does not report).
fn attach_cpu_idle(ebpf: &mut Ebpf) -> Result<()> {
    attach_tracepoint(ebpf, names::PROG_CPU_IDLE, "power", "cpu_idle")
}

/// `task:task_rename`: keeps the names of tasks that have entries (eBPF `process::task_rename`).
fn attach_task_rename(ebpf: &mut Ebpf) -> Result<()> {
    attach_tracepoint(ebpf, names::PROG_TASK_RENAME, "task", "task_rename")
}

/// `cgroup_switch` on the cgroup-switches events (`attach_to_cgroup_switches`).
fn attach_cgroup_switch(ebpf: &mut Ebpf, groups: &CounterGroups) -> Result<()> {
    let program: &mut PerfEvent = program_mut(ebpf, names::PROG_CGROUP_SWITCH)?;
    program
        .load()
        .map_err(load_error(names::PROG_CGROUP_SWITCH))?;
    attach_to_cgroup_switches(program, groups)
}

/// Attaches the loaded `program` to one `cgroup-switches` software event per counted CPU,
/// period 1: the cgroup-switch trigger's hook, which `topdown-floor` measures attached alike.
pub fn attach_to_cgroup_switches(program: &mut PerfEvent, groups: &CounterGroups) -> Result<()> {
    use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
    for cpu in groups.cpus() {
        program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CgroupSwitches),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Period(1),
                false,
            )
            .with_context(|| format!("attaching to the cgroup-switches event on CPU {cpu}"))?;
    }
    Ok(())
}

/// Uprobe program `name` of a session's object (`Session::ebpf`), loaded if it was not yet,
/// the verifier's time added to `load_time` (`Session::program_load_time`). Apart from the
/// session so that its links can be stored while the program is borrowed.
fn loaded_uprobe<'a>(
    ebpf: &'a mut Option<Ebpf>,
    load_time: &mut Duration,
    name: &'static str,
) -> Result<&'a mut UProbe> {
    let program: &mut UProbe = program_mut(loaded(ebpf)?, name)?;
    if program.fd().is_err() {
        let started = std::time::Instant::now();
        program.load().map_err(load_error(name))?;
        *load_time += started.elapsed();
    }
    Ok(program)
}

/// A loaded program's fd, duplicated so links made later (per followed process) hold it.
fn shared_fd(program: &UProbe, name: &str) -> Result<std::sync::Arc<std::os::fd::OwnedFd>> {
    let fd = program
        .fd()
        .map_err(|err| anyhow!("{name}: {err}"))?
        .as_fd()
        .try_clone_to_owned()
        .context("duplicating a program fd")?;
    Ok(std::sync::Arc::new(fd))
}

/// Where machine-wide or per-process (`-p`) uprobes go: every process, or each of `processes`.
/// `program` attached at `offset` of `target`, with `cookie`, in each of `scopes`: per scope,
/// its link or the kernel's refusal.
fn attach_at<'p>(
    program: &'p mut UProbe,
    target: &'p std::path::Path,
    (offset, cookie): (u64, Option<u64>),
    scopes: &'p [UProbeScope],
) -> impl Iterator<Item = Result<aya::programs::uprobe::UProbeLinkId, aya::programs::ProgramError>> + 'p
{
    let point = UProbeAttachPoint {
        location: UProbeAttachLocation::AbsoluteOffset(offset),
        cookie,
    };
    scopes
        .iter()
        .map(move |scope| program.attach([point], target, *scope))
}

fn scopes_of(processes: &[u32]) -> Vec<UProbeScope> {
    if processes.is_empty() {
        vec![UProbeScope::AllProcesses]
    } else {
        processes
            .iter()
            .filter_map(|pid| std::num::NonZeroU32::new(*pid).map(UProbeScope::OneProcess))
            .collect()
    }
}

/// Loads the named uprobe programs not loaded yet, each on a thread of its own, and returns
/// the time it took. The kernel's verifier runs on the loading thread and privileged loads
/// take no common lock, so the programs a probe set needs (tens of milliseconds each, most of
/// attaching) are verified side by side on the CPUs instead of one after another.
fn load_uprobes_together(ebpf: &mut Ebpf, wanted: &[&'static str]) -> Result<Duration> {
    let started = std::time::Instant::now();
    let mut pending: Vec<(&'static str, &mut UProbe)> = Vec::new();
    for (name, program) in ebpf.programs_mut() {
        let Some(wanted) = wanted.iter().find(|wanted| **wanted == name) else {
            continue;
        };
        let program: &mut UProbe = program.try_into()?;
        if program.fd().is_err() {
            pending.push((wanted, program));
        }
    }
    if pending.len() < 2 {
        for (name, program) in pending {
            program.load().map_err(load_error(name))?;
        }
        return Ok(started.elapsed());
    }
    std::thread::scope(|scope| {
        let loads: Vec<_> = pending
            .into_iter()
            .map(|(name, program)| scope.spawn(move || program.load().map_err(load_error(name))))
            .collect();
        for load in loads {
            load.join()
                .unwrap_or_else(|_| Err(anyhow!("loading a probe program panicked")))?;
        }
        Ok::<(), anyhow::Error>(())
    })?;
    Ok(started.elapsed())
}

/// Loads the tracepoint program `name` and attaches it to `category:tracepoint`.
fn attach_tracepoint(
    ebpf: &mut Ebpf,
    name: &'static str,
    category: &str,
    tracepoint: &str,
) -> Result<()> {
    let program: &mut TracePoint = program_mut(ebpf, name)?;
    program.load().map_err(load_error(name))?;
    program
        .attach(category, tracepoint)
        .with_context(|| format!("attaching to {category}:{tracepoint}"))?;
    Ok(())
}

fn load_error(name: &'static str) -> impl Fn(aya::programs::ProgramError) -> anyhow::Error {
    move |err| {
        fail(
            Failure::BpfUnavailable,
            format!("the kernel refused BPF program {name}: {err:#}"),
        )
    }
}

/// The loaded object of a session not yet closed (`Session::close_in_background`).
fn loaded(ebpf: &mut Option<Ebpf>) -> Result<&mut Ebpf> {
    ebpf.as_mut()
        .ok_or_else(|| anyhow!("the BPF session is closed: its programs are detached"))
}

fn loaded_ref(ebpf: &Option<Ebpf>) -> Result<&Ebpf> {
    ebpf.as_ref()
        .ok_or_else(|| anyhow!("the BPF session is closed: its programs are detached"))
}

fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let program = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("BPF object has no program {name}"))?;
    Ok(program.try_into()?)
}

/// Every entry of a BPF hash map, appended to `keys` and `values` in the map's order: by batch
/// (`batch::lookup_all`) where the kernel has it, else entry by entry.
fn read_whole<T: std::borrow::Borrow<MapData>, K: aya::Pod, V: aya::Pod>(
    map: &BpfHashMap<T, K, V>,
    keys: &mut Vec<K>,
    values: &mut Vec<V>,
) -> Result<()> {
    use aya::maps::IterableMap as _;
    use std::os::fd::AsFd as _;
    match batch::lookup_all(map.map().fd().as_fd(), keys, values) {
        Ok(()) => Ok(()),
        Err(batch::BatchError::Failed(err)) => Err(err.into()),
        // Nothing was appended: read it the old way.
        Err(batch::BatchError::Unsupported) => read_by_entry(map, keys, values),
    }
}

/// `read_whole` on kernels before 5.6: aya's iterator, two system calls per entry.
fn read_by_entry<T: std::borrow::Borrow<MapData>, K: aya::Pod, V: aya::Pod>(
    map: &BpfHashMap<T, K, V>,
    keys: &mut Vec<K>,
    values: &mut Vec<V>,
) -> Result<()> {
    for entry in map.iter() {
        match entry {
            Ok((key, value)) => {
                keys.push(key);
                values.push(value);
            }
            // An entry removed while iterating; the next snapshot sees the rest.
            Err(aya::maps::MapError::KeyNotFound) => continue,
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
}

fn map_mut<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<T>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .map_mut(name)
        .ok_or_else(|| anyhow!("BPF object has no map {name}"))?;
    T::try_from(map).with_context(|| format!("opening map {name}"))
}

/// Puts each of `keys` in the set map `name` (a hash map to 1); `what` says which failed.
fn fill_set<K: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &str,
    keys: &[K],
    what: impl Fn(&K) -> String,
) -> Result<()> {
    let mut set: BpfHashMap<&mut MapData, K, u8> = map_mut(ebpf, name)?;
    for key in keys {
        set.insert(key, &1, 0).with_context(|| what(key))?;
    }
    Ok(())
}

/// Every entry of the hash map `name`, as `(key, value)` pairs ([`read_whole`]'s order).
fn whole_map<K: aya::Pod, V: aya::Pod>(
    ebpf: &Ebpf,
    name: &str,
    what: &'static str,
) -> Result<Vec<(K, V)>> {
    let whole: BpfHashMap<&MapData, K, V> = map(ebpf, name)?;
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    read_whole(&whole, &mut keys, &mut values).context(what)?;
    Ok(keys.into_iter().zip(values).collect())
}

/// A one-entry per-CPU statistics map: its CPUs' copies summed with `add`.
fn summed_per_cpu<T: aya::Pod + Default>(
    ebpf: &Ebpf,
    name: &str,
    what: &'static str,
    add: impl Fn(T, &T) -> T,
) -> Result<T> {
    let per_cpu: PerCpuArray<&MapData, T> = map(ebpf, name)?;
    Ok(per_cpu
        .get(&0, 0)
        .context(what)?
        .iter()
        .fold(T::default(), add))
}

fn map<'a, T>(ebpf: &'a Ebpf, name: &str) -> Result<T>
where
    T: TryFrom<&'a aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .map(name)
        .ok_or_else(|| anyhow!("BPF object has no map {name}"))?;
    T::try_from(map).with_context(|| format!("opening map {name}"))
}

fn field_offset(tracefs: &Tracefs, group: &str, event: &str, field: &str) -> Result<u32> {
    Ok(tracefs
        .field_offset(group, event, field)?
        .unwrap_or(topdown_common::FIELD_ABSENT))
}

/// Like `field_offset`, for events a kernel may lack (their programs then do nothing).
fn optional_field_offset(tracefs: &Tracefs, group: &str, event: &str, field: &str) -> u32 {
    tracefs
        .field_offset(group, event, field)
        .ok()
        .flatten()
        .unwrap_or(topdown_common::FIELD_ABSENT)
}

/// Whether sched_switch may skip switches between untraced tasks (not refused with
/// `--read-every-switch`, a filter is on and the arriving task's fields were found in the
/// kernel's BTF), and the offsets it reads them at. Without them it reads at every switch, as
/// with `-a`, and says why (shown with `-v`).
///
/// Skipping depends on knowing whose counts the delta since a CPU's last reading holds, which
/// sched_switch alone does not tell: the kernel does not fire it at every context switch. On
/// this project's VM (a PVM guest kernel, 6.18.44-fc) `/proc/stat` `ctxt` grew 3-15% more than
/// an ftrace instance's `sched_switch` events over the same seconds (no ring-buffer loss); the
/// unreported switches were all away from the idle task (about half of its switch-outs) or
/// from PID 1's threads (every one of theirs), and topdown's program missed exactly the
/// switches ftrace missed. A traced task arriving at one ran without its switch-in being read:
/// that was the loss (up to 40% of a run's calls) that kept skipping opt-in. The BPF side now
/// reads when a CPU goes idle and when an untraced task follows a traced one, and credits a
/// traced task found running after such a reading with the delta since it (as reading at every
/// switch does); its function probes claim or, after a switch nobody read, take a reading
/// themselves (`topdown_common::reading_owner`). A process found leaving unseen (a switch's
/// `prev` is not the task the CPU last saw arrive) is marked, and every switch into it is read
/// from then on (`unseen_leavers`; `unseen_switches` in the diagnostics counts such switches).
/// A traced task arriving unseen at a process's first unseen switch-out of the run, before that
/// process is known, gets the whole delta since the CPU's last reading, other tasks' stretches
/// included, at its first probe, flush or switch-out (`unseen_arrivals` counts those).
fn skip_untraced_switches(
    config: &SessionConfig,
    kernel_types: Option<&Result<KernelTypes>>,
) -> (u32, [u32; kernel_offset::COUNT]) {
    let absent = [topdown_common::FIELD_ABSENT; kernel_offset::COUNT];
    if !reads_task_fields_at_switches(config) {
        return (0, absent);
    }
    let offsets = match kernel_types {
        Some(Ok(types)) => types.switch_offsets(),
        Some(Err(err)) => Err(anyhow!("{err:#}")),
        None => Err(anyhow!("the kernel's BTF was not parsed")),
    };
    match offsets {
        Ok(offsets) => {
            log::info!("counters are read only at context switches of traced tasks");
            let mode = skip_untraced::mode(
                true,
                config.tracked_tgids.is_some(),
                config.cgroup_filter.is_some(),
            );
            (mode, offsets)
        }
        Err(err) => {
            log::info!(
                "{err:#}: counters are read at every context switch, traced or not (costlier)"
            );
            (0, absent)
        }
    }
}

/// Whether the switch program skips untraced tasks, reading their ids (and cgroups) from
/// `struct task_struct` at offsets from the kernel's BTF (`skip_untraced_switches`).
fn reads_task_fields_at_switches(config: &SessionConfig) -> bool {
    let filtered = config.tracked_tgids.is_some() || config.cgroup_filter.is_some();
    config.skip_untraced_switches && filtered && config.trigger == Trigger::SchedSwitch
}

/// `THREAD_EXIT_FIELDS`' offsets (`topdown_common::thread_exit_field`), from the kernel's BTF.
fn thread_exit_offsets(types: &KernelTypes) -> Result<[u32; thread_exit_field::COUNT as usize]> {
    let mut offsets = [0; thread_exit_field::COUNT as usize];
    for (index, structure, field) in [
        (thread_exit_field::TASK_SIGNAL, "task_struct", "signal"),
        (thread_exit_field::SIGNAL_FLAGS, "signal_struct", "flags"),
    ] {
        offsets[index as usize] = types
            .offset_of(structure, field)
            .with_context(|| format!("no {structure}.{field} in the kernel's BTF"))?;
    }
    Ok(offsets)
}

/// The kernel's BTF, which tp_btf programs need.
fn read_kernel_btf() -> Result<Vec<u8>> {
    let path = "/sys/kernel/btf/vmlinux";
    if !std::path::Path::new(path).exists() {
        return Err(fail(
            Failure::BpfUnavailable,
            format!(
                "{path} is missing: this kernel has no BTF (CONFIG_DEBUG_INFO_BTF), which topdown's \
                 sched_switch program needs"
            ),
        ));
    }
    std::fs::read(path).map_err(|err| {
        fail(
            Failure::BpfUnavailable,
            format!("reading {path} failed: {err}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batched read and the entry-by-entry one (the fallback before Linux 5.6) give the
    /// same entries, appended after what the vectors held. Needs `CAP_BPF` (root in CI).
    #[test]
    fn both_ways_of_reading_a_map_give_the_same_entries() {
        let map = match batch::scratch_hash_map::<u32, TaskCounters>(5000) {
            Ok(map) => map,
            Err(err) if std::env::var_os("CI").is_none() => {
                eprintln!("SKIPPED both_ways_of_reading_a_map_give_the_same_entries: {err}");
                return;
            }
            Err(err) => panic!("creating a BPF hash map (CI runs as root): {err}"),
        };
        for tid in 1..=5000u32 {
            let task = TaskCounters {
                switches: u64::from(tid) * 3,
                tgid: tid / 4,
                ..TaskCounters::ZERO
            };
            if let Err(err) = batch::insert(map.as_fd(), &tid, &task) {
                panic!("inserting tid {tid}: {err}");
            }
        }
        let opened = map
            .try_clone()
            .map_err(anyhow::Error::from)
            .and_then(|fd| Ok(MapData::from_fd(fd)?))
            .and_then(|data| Ok(BpfHashMap::try_from(aya::maps::Map::HashMap(data))?));
        let tasks: BpfHashMap<MapData, u32, TaskCounters> = match opened {
            Ok(tasks) => tasks,
            Err(err) => panic!("opening the map through aya: {err:#}"),
        };
        let read = |whole: bool| -> Vec<(u32, u64, u32)> {
            let (mut tids, mut counters) = (vec![0], vec![TaskCounters::ZERO]);
            let result = if whole {
                read_whole(&tasks, &mut tids, &mut counters)
            } else {
                read_by_entry(&tasks, &mut tids, &mut counters)
            };
            if let Err(err) = result {
                panic!("reading (batched: {whole}): {err:#}");
            }
            let mut entries: Vec<(u32, u64, u32)> = tids
                .iter()
                .zip(&counters)
                .map(|(tid, task)| (*tid, task.switches, task.tgid))
                .collect();
            entries.sort_unstable();
            entries
        };
        let batched = read(true);
        assert_eq!(batched.len(), 5001);
        assert_eq!(batched[0], (0, 0, 0), "what the vectors held is kept");
        assert!(
            batched[1..]
                .iter()
                .zip(1u32..)
                .all(|(entry, tid)| *entry == (tid, u64::from(tid) * 3, tid / 4))
        );
        assert_eq!(read(false), batched);
    }
}
