//! Command-line interface, perf-like.

pub mod usage;

use std::{ffi::OsString, path::PathBuf};

use clap::{
    ArgAction, Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand,
    builder::{PossibleValuesParser, TypedValueParser},
};

use crate::{
    commands::{
        diff::{input::Kind, render::DiffFormat},
        serve::duty_cycle::DutyCycle,
    },
    report::{By, Format, Weight},
    session::{bpf::Trigger, target::Scope},
};

/// The command-line names of a domain enum. The enums themselves stay free of clap: the names
/// are the CLI's business.
pub trait Named: Sized + Copy + Send + Sync + 'static {
    const NAMES: &'static [(&'static str, Self)];

    fn from_name(name: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .find(|(known, _)| *known == name)
            .map(|(_, value)| *value)
    }
}

impl Named for By {
    const NAMES: &'static [(&'static str, Self)] = &[
        ("task", By::Task),
        ("process", By::Process),
        ("cgroup", By::Cgroup),
        ("function", By::Function),
        ("span", By::Span),
        ("query", By::Span),
    ];
}

impl Named for Format {
    const NAMES: &'static [(&'static str, Self)] = &[
        ("table", Format::Table),
        ("json", Format::Json),
        ("csv", Format::Csv),
        ("svg", Format::Svg),
        ("pprof", Format::Pprof),
        ("folded", Format::Folded),
    ];
}

impl Named for Weight {
    const NAMES: &'static [(&'static str, Self)] =
        &[("slots", Weight::Slots), ("calls", Weight::Calls)];
}

impl Named for crate::session::bpf::UsdtLinking {
    const NAMES: &'static [(&'static str, Self)] = &[
        ("auto", crate::session::bpf::UsdtLinking::Auto),
        ("per-site", crate::session::bpf::UsdtLinking::PerSite),
    ];
}

impl Named for Trigger {
    const NAMES: &'static [(&'static str, Self)] = &[
        ("sched-switch", Trigger::SchedSwitch),
        ("cgroup-switch", Trigger::CgroupSwitch),
    ];
}

/// A parser that accepts exactly `T`'s names (clap lists them in `--help` and in errors).
pub fn named<T: Named>() -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(T::NAMES.iter().map(|(name, _)| *name)).try_map(|name: String| {
        T::from_name(&name).ok_or_else(|| format!("unknown value '{name}'"))
    })
}

#[derive(Debug, Parser)]
#[command(
    name = "topdown",
    version,
    about = "Exact TopDown (TMA) per thread, counted with perf counter groups read by eBPF at context switches",
    propagate_version = true
)]
pub struct Cli {
    /// More output on stderr; -v also shows BPF-side diagnostics.
    #[arg(short, long, global = true, action = ArgAction::Count)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

/// What the `topdown` binary parses: the documented [`Cli`], or the hidden `generate` that
/// writes the usage reference generated from [`Cli`]. Kept out of [`Cli`] because
/// clap_complete would offer a hidden subcommand in the completions.
#[derive(Debug)]
pub enum Invocation {
    Run(Cli),
    Generate(usage::Generate),
}

impl Invocation {
    pub fn try_parse() -> Result<Self, clap::Error> {
        Self::try_parse_from(std::env::args_os())
    }

    pub fn try_parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut command = Cli::command().subcommand(usage::Generate::command());
        let matches = command.try_get_matches_from_mut(args)?;
        let parsed = match matches.subcommand() {
            Some(("generate", generate)) => {
                usage::Generate::from_arg_matches(generate).map(Invocation::Generate)
            }
            _ => Cli::from_arg_matches(&matches).map(Invocation::Run),
        };
        parsed.map_err(|err| err.format(&mut command))
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Count TopDown per task and process: system-wide, for given processes, or for a command.
    Stat(Box<StatArgs>),
    /// Re-render a JSON result, recomputing every metric from its raw counters.
    Report(ReportArgs),
    /// Show the detected CPU and PMU, the chosen model and every counter with its encoding.
    List(ListArgs),
    /// Diagnose whether tracing with TopDown can work here (exit 0) or not (exit 1), and why.
    Check(CheckArgs),
    /// Export TopDown per cgroup/container, process and function to Prometheus, continuously.
    Serve(Box<ServeArgs>),
    /// A live terminal view: processes, threads, cgroups or functions with their TopDown
    /// breakdown, refreshed every second.
    Top(Box<TopArgs>),
    /// Compare JSON results (BASE NEW, or BASE... -- NEW...) per function, call-tree edge,
    /// span, process and cgroup; exit 1 when a cost grew beyond the threshold, 2 on bad input.
    Diff(DiffArgs),
}

impl Named for DiffFormat {
    const NAMES: &'static [(&'static str, Self)] = &[
        ("table", DiffFormat::Table),
        ("json", DiffFormat::Json),
        ("svg", DiffFormat::Svg),
    ];
}

impl Named for Kind {
    const NAMES: &'static [(&'static str, Self)] = &[
        ("function", Kind::Function),
        ("edge", Kind::Edge),
        ("span", Kind::Span),
        ("process", Kind::Process),
        ("cgroup", Kind::Cgroup),
    ];
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// BASE then NEW, two JSON results of `topdown stat --format json -o FILE`; with `--`, the
    /// files before it are BASE's runs and those after it NEW's.
    #[arg(value_name = "BASE", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,

    /// NEW's runs, after `--`.
    #[arg(last = true, value_name = "NEW")]
    pub new: Vec<PathBuf>,

    /// A cost that grew by more than PCT percent is a regression (exit 1).
    #[arg(long = "threshold", value_name = "PCT", default_value = "5", value_parser = parse_threshold)]
    pub threshold: f64,

    /// Output format: a table, JSON, or an SVG differential icicle of the call tree.
    #[arg(long = "format", value_parser = named::<DiffFormat>(), default_value = "table")]
    pub format: DiffFormat,

    /// Write to FILE instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Which kinds of entities to compare (and gate on).
    #[arg(
        long = "kinds",
        value_parser = named::<Kind>(),
        value_delimiter = ',',
        default_value = "function,edge,span,process,cgroup"
    )]
    pub kinds: Vec<Kind>,
}

impl DiffArgs {
    /// The typed request: `BASE NEW`, or `BASE... -- NEW...`.
    pub fn request(&self) -> Result<crate::commands::diff::DiffRequest, String> {
        let (base, new) = if self.new.is_empty() {
            match self.files.as_slice() {
                [base, new] => (vec![base.clone()], vec![new.clone()]),
                files => {
                    return Err(format!(
                        "topdown diff takes BASE NEW, or BASE... -- NEW...; got {} file(s) and no --",
                        files.len()
                    ));
                }
            }
        } else {
            (self.files.clone(), self.new.clone())
        };
        Ok(crate::commands::diff::DiffRequest {
            base,
            new,
            threshold_pct: self.threshold,
            format: self.format,
            output: self.output.clone(),
            kinds: self.kinds.clone(),
        })
    }
}

fn parse_threshold(text: &str) -> Result<f64, String> {
    match text.trim_end_matches('%').parse::<f64>() {
        Ok(value) if (0.0..=1e6).contains(&value) => Ok(value),
        _ => Err(format!(
            "'{text}': give a percentage of at least 0, e.g. 5 or 2.5"
        )),
    }
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Show this model instead of the detected one (any name `--pmu` takes).
    #[arg(long = "pmu", value_name = "MODEL")]
    pub pmu: Option<String>,

    /// List every model by name instead.
    #[arg(long = "all")]
    pub all: bool,

    /// Plan the counters for a PMU with this many general-purpose counters free.
    #[arg(long = "max-counters", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub max_counters: Option<u32>,

    /// Print this event spec's encoding (PMU, type, config, config1, config2, exclude bits,
    /// libpfm's full name) without counting; repeatable. libpfm-style names are encoded for
    /// `--pmu`'s model unless they name a PMU (`knl::EVENT`).
    #[arg(
        short = 'e',
        long = "event",
        value_name = "SPEC",
        conflicts_with = "all"
    )]
    pub events: Vec<String>,

    /// Output format of `-e`.
    #[arg(long = "format", value_parser = named::<ListFormat>(), default_value = "table", requires = "events")]
    pub format: ListFormat,
}

/// `topdown list --format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListFormat {
    Table,
    Json,
}

impl Named for ListFormat {
    const NAMES: &'static [(&'static str, Self)] =
        &[("table", ListFormat::Table), ("json", ListFormat::Json)];
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The model to check for (default: what `--pmu auto` picks).
    #[arg(long = "pmu", default_value = "auto", value_name = "MODEL")]
    pub pmu: String,
}

#[derive(Debug, Args)]
pub struct StatArgs {
    /// What to trace, and for how long.
    #[command(flatten)]
    pub scope: ScopeArgs,

    /// Print a report every MS milliseconds (JSON: one object per line).
    #[arg(short = 'I', long = "interval", value_name = "MS", value_parser = clap::value_parser!(u64).range(10..))]
    pub interval_ms: Option<u64>,

    /// What the report shows, in which format, and where it goes.
    #[command(flatten)]
    pub report: ReportShape,

    /// Count `-- CMD` without BPF, with inherited per-task counters (what a run without root
    /// or CAP_BPF+CAP_PERFMON does): per process and thread, no -u, --by cgroup, -p, -a or -I.
    #[arg(long = "no-bpf")]
    pub no_bpf: bool,

    /// Counting options shared with `topdown serve`.
    #[command(flatten)]
    pub counting: CountingArgs,
}

/// What `stat` and `top` trace (one of `-a`, `-p`, `-- CMD`; system-wide when none is given),
/// and for how long.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("scope").args(["all_cpus", "pids", "command"])))]
pub struct ScopeArgs {
    /// System-wide: every task on every CPU (the default when no scope is given).
    #[arg(short = 'a', long = "all-cpus")]
    pub all_cpus: bool,

    /// Trace these already running processes (comma-separated pids; a thread id means its process).
    #[arg(
        short = 'p',
        long = "pid",
        value_delimiter = ',',
        value_name = "PID,..."
    )]
    pub pids: Vec<u32>,

    /// Stop after this many seconds.
    #[arg(short = 'd', long = "duration", value_name = "SECS", value_parser = parse_seconds)]
    pub duration: Option<f64>,

    /// The command to run and trace, with its children.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

impl ScopeArgs {
    /// The scope asked for: a command if given, else the pids, else every task.
    pub fn scope(&self) -> Scope {
        if !self.command.is_empty() {
            Scope::Command(self.command.clone())
        } else if !self.pids.is_empty() {
            Scope::Pids(self.pids.clone())
        } else {
            Scope::SystemWide
        }
    }
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A JSON result written by `topdown stat --format json` (one object, or one per line).
    #[arg(short = 'i', long = "input", value_name = "FILE")]
    pub input: PathBuf,

    /// Recompute at this level (default: the recorded one).
    #[arg(short = 'l', long = "level", value_parser = clap::value_parser!(u8).range(1..=2))]
    pub level: Option<u8>,

    /// What the report shows, in which format, and where it goes.
    #[command(flatten)]
    pub report: ReportShape,
}

/// A report's breakdowns, format, file and flame-graph weight: how `stat` writes its report
/// and `report -i` writes a recorded one again.
#[derive(Debug, Args)]
pub struct ReportShape {
    /// Breakdowns to show.
    #[arg(
        long = "by",
        value_parser = named::<By>(),
        value_delimiter = ',',
        default_value = "task,process"
    )]
    pub by: Vec<By>,

    /// Output format.
    #[arg(long = "format", value_parser = named::<Format>(), default_value = "table")]
    pub format: Format,

    /// Write the report to FILE instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// With --format svg: what a frame's width measures, the inclusive weight counter (slots,
    /// or cycles / cpu-clock where the model has no slots) or the probed calls; with --format
    /// folded, what each line's number is (exclusive).
    #[arg(long = "weight", value_parser = named::<Weight>(), default_value = "slots")]
    pub weight: Weight,
}

/// What to count and how: the options `stat` and `serve` share.
#[derive(Clone, Debug, Args)]
pub struct CountingArgs {
    /// TopDown level: 1 (Retiring, Bad Speculation, Frontend, Backend) or 2 (their children).
    #[arg(short = 'l', long = "level", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub level: u8,

    /// Counter model: auto (detect), software, a model name (`topdown list --all`),
    /// hybrid:<P-core model>+<E-core model>, or synthetic:<model> (syscall tracepoints standing
    /// in for the model's counters, for machines without a PMU).
    #[arg(long = "pmu", default_value = "auto", value_name = "MODEL")]
    pub pmu: String,

    /// Synthetic counter mapping overrides: COUNTER=GROUP:TRACEPOINT,...
    #[arg(long = "synthetic", value_name = "COUNTER=GROUP:TRACEPOINT,...")]
    pub synthetic: Option<String>,

    /// Count only user space.
    #[arg(long = "all-user", conflicts_with = "all_kernel")]
    pub all_user: bool,

    /// Count only the kernel.
    #[arg(long = "all-kernel")]
    pub all_kernel: bool,

    /// Count TopDown per function: TARGET is a path or a library name (libc, libssl), FUNC an
    /// exact, demangled (Rust/C++) or glob name. Repeatable.
    #[arg(short = 'u', long = "uprobe", value_name = "TARGET:FUNC")]
    pub uprobes: Vec<String>,

    /// Count hits of a USDT probe (SystemTap SDT note): TARGET is a path or a library name,
    /// PROVIDER and NAME exact or globs. Semaphore-guarded probes are enabled while counting.
    /// Repeatable.
    #[arg(short = 'U', long = "usdt", value_name = "TARGET:PROVIDER:NAME")]
    pub usdt: Vec<String>,

    /// Count TopDown between a start and an end USDT probe on each thread, per key: an integer
    /// argument of the start probe (`key=argN`) or the string it points to (`key=str:argN`).
    /// Spans whose end never comes are closed, as abandoned, at the next start or an `abort=`
    /// probe. Repeatable.
    #[arg(
        long = "span",
        value_name = "NAME=TARGET:PROVIDER:START..PROVIDER:END[,key=argN|str:argN][,abort=PROVIDER:NAME]"
    )]
    pub spans: Vec<String>,

    /// TopDown per query of a PostgreSQL server, by query id (compute_query_id) or normalised
    /// text, through its USDT probes. BIN: the server binary (default: that of the traced or
    /// running postgres processes).
    #[arg(
        long = "postgres",
        value_name = "BIN",
        num_args = 0..=1,
        default_missing_value = ""
    )]
    pub postgres: Option<String>,

    /// Capacity of the BPF map of span totals (one entry per span kind, key and bucket of the
    /// per-span distribution in use, abandoned spans apart); spans beyond it are counted in
    /// span_diagnostics.map_full.
    #[arg(long = "max-spans", default_value_t = 65536, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub max_spans: u32,

    /// How USDT sites are linked: `auto` (uprobe.multi where the kernel has it) or `per-site`
    /// (one perf uprobe event per site, as before Linux 6.6; for tests).
    #[arg(long = "usdt-links", hide = true, value_parser = named::<crate::session::bpf::UsdtLinking>(), default_value = "auto")]
    pub usdt_links: crate::session::bpf::UsdtLinking,

    /// How function returns are probed: `auto` gives each target uretprobes (cheap) when
    /// nothing in the traced program can unwind through its functions (C++ exceptions, Rust
    /// panics, pthread_cancel/pthread_exit), and a probe on every exit instruction (safe with
    /// unwinding, single-stepped) when something can. `uretprobe` and `exit` force one.
    #[arg(
        long = "returns",
        value_enum,
        default_value = "auto",
        value_name = "MODE"
    )]
    pub returns: crate::functions::unwinding::ReturnMode,

    /// Former name of `--returns uretprobe`.
    #[arg(long = "uretprobes", hide = true, conflicts_with = "returns")]
    pub uretprobes: bool,

    /// Keep the function probes' own cost in the per-function figures: by default it is
    /// measured at start (a known empty function probed on each core type) and subtracted per
    /// call and per probed callee.
    #[arg(long = "no-compensation")]
    pub no_compensation: bool,

    /// With -p, -- CMD or -G: read the counters at every context switch on the machine, as -a
    /// does, instead of only where a traced task leaves or arrives and where a CPU goes idle
    /// (costlier; see docs/usage.md, Scope).
    #[arg(long = "read-every-switch")]
    pub read_every_switch: bool,

    /// Former opt-in for what is now the default with a filter; accepted and ignored.
    #[arg(
        long = "skip-untraced-switches",
        hide = true,
        conflicts_with = "read_every_switch"
    )]
    pub skip_untraced_switches: bool,

    /// Capacity of the BPF map of per-function totals (one entry per caller -> callee edge, and
    /// per process with `--by function,task`); edges beyond it are counted as dropped.
    #[arg(long = "max-calls", default_value_t = 16384, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub max_calls: u32,

    /// Capacity of the BPF map of per-call histogram buckets (one entry per function and bucket
    /// in use, allocated as calls reach it); calls whose bucket does not fit are counted in the
    /// totals but not in the distribution (`histogram_full` in the diagnostics).
    #[arg(long = "max-buckets", default_value_t = 16384, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub max_buckets: u32,

    /// Capacity of the BPF map of per-goroutine shadow stacks (Go goroutines inside probed
    /// functions). Threads' shadow stacks and span stacks are kept in the threads themselves
    /// (BPF task storage) and have no cap.
    #[arg(long = "max-stacks", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub max_stacks: u32,

    /// Count only tasks in these cgroups and their descendants: paths relative to the cgroup v2
    /// root, or absolute.
    #[arg(
        short = 'G',
        long = "cgroup",
        value_delimiter = ',',
        value_name = "PATH,..."
    )]
    pub cgroups: Vec<String>,

    /// Roll cgroup counts up to depth N of the hierarchy (each entry includes its descendants).
    #[arg(long = "cgroup-depth", value_name = "N", value_parser = clap::value_parser!(u32).range(0..=64))]
    pub cgroup_depth: Option<u32>,

    /// What reads and attributes the counters: every context switch, or only switches between
    /// cgroups (cheaper; only for `--by cgroup` alone). Default: cgroup-switch when the only
    /// breakdown is `--by cgroup`, else sched-switch.
    #[arg(long = "trigger", value_parser = named::<Trigger>(), value_name = "TRIGGER")]
    pub trigger: Option<Trigger>,

    /// Capacity of the BPF cgroup map; cgroups beyond it are counted as dropped.
    #[arg(long = "max-cgroups", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub max_cgroups: u32,

    /// Also count this event per task, process, cgroup and function (repeatable). perf syntax
    /// (`cpu/event=0x3c,umask=0x0,cmask=1/u`, `rNNNN`, `cycles:k`, `topdown-retiring`,
    /// `armv8_pmuv3_0/stall_slot/`, `sched:sched_switch`) or libpfm syntax
    /// (`INT_MISC:RECOVERY_CYCLES:c=1:e`, `UOPS_ISSUED:ANY:u`).
    #[arg(short = 'e', long = "event", value_name = "SPEC")]
    pub events: Vec<String>,

    /// General-purpose counters the PMU has free (default: detected from the CPU, with the NMI
    /// watchdog's counter subtracted; unbounded for synthetic models). Models needing more
    /// rotate their level-2 groups, and the report marks what that makes estimated.
    #[arg(long = "max-counters", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub max_counters: Option<u32>,

    /// With a synthetic hybrid model: which CPUs play the P-cores and which the E-cores, as
    /// `cpu_core=LIST,cpu_atom=LIST` (LIST in kernel cpulist form, e.g. 0-3). Default: the first
    /// half of the online CPUs are cpu_core, the rest cpu_atom.
    #[arg(long = "hybrid-cpus", value_name = "PMU=CPUS,...")]
    pub hybrid_cpus: Option<String>,

    /// Capacity of the BPF task map; tasks beyond it are counted as dropped.
    #[arg(long = "max-tasks", default_value_t = 32768, value_parser = clap::value_parser!(u32).range(16..=4_194_304))]
    pub max_tasks: u32,

    /// Capacity of the BPF map of tracked processes (-p, -- CMD and their children).
    #[arg(long = "max-tracked", default_value_t = 8192, value_parser = clap::value_parser!(u32).range(16..=4_194_304))]
    pub max_tracked: u32,
}

impl CountingArgs {
    /// Whether any probe goes into traced processes (`-u`, `-U`, `--span`, `--postgres`): with
    /// `-- CMD` they are scoped to the command's processes (`crate::session::follow`).
    pub fn probes_processes(&self) -> bool {
        !self.uprobes.is_empty()
            || !self.usdt.is_empty()
            || !self.spans.is_empty()
            || self.postgres.is_some()
    }

    /// `--returns`, with the hidden `--uretprobes` meaning `--returns uretprobe`.
    pub fn return_mode(&self) -> crate::functions::unwinding::ReturnMode {
        if self.uretprobes {
            crate::functions::unwinding::ReturnMode::Uretprobe
        } else {
            self.returns
        }
    }
}

/// `args.pmu` and friends read through to the shared counting options.
impl std::ops::Deref for StatArgs {
    type Target = CountingArgs;

    fn deref(&self) -> &CountingArgs {
        &self.counting
    }
}

/// `topdown top`: the live terminal view.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// What to trace, and for how long.
    #[command(flatten)]
    pub scope: ScopeArgs,

    /// How often to redraw with the counts of the last refresh (milliseconds).
    #[arg(long = "refresh-ms", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub refresh_ms: u64,

    /// Breakdowns to count (the keys p, t, c, f switch between them on screen).
    #[arg(
        long = "by",
        value_parser = named::<By>(),
        value_delimiter = ',',
        default_value = "task,process,cgroup"
    )]
    pub by: Vec<By>,

    /// Counting options shared with `topdown stat` and `topdown serve`.
    #[command(flatten)]
    pub counting: CountingArgs,
}

/// `topdown serve`: the always-on exporter.
#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    /// Read serve's options from FILE instead (one `--option value` per line, `#` comments).
    /// SIGHUP re-reads it and applies -u, --max-series, --series-ttl, --max-overhead and
    /// --refresh-ms without a restart; other changes are reported as needing one.
    #[arg(long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Address to serve /metrics and /healthz on. Loopback unless you say otherwise.
    #[arg(
        long = "listen",
        default_value = "127.0.0.1:9943",
        value_name = "ADDR:PORT"
    )]
    pub listen: std::net::SocketAddr,

    /// Breakdowns to export.
    #[arg(
        long = "by",
        value_parser = named::<By>(),
        value_delimiter = ',',
        default_value = "cgroup,process"
    )]
    pub by: Vec<By>,

    /// How often to read the BPF maps into series (milliseconds).
    #[arg(long = "refresh-ms", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub refresh_ms: u64,

    /// Series limit; entities beyond it are folded into an `other` series (counted in
    /// topdown_series_overflow_total).
    #[arg(long = "max-series", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    pub max_series: u64,

    /// Drop a series after this many seconds without counts (vanished processes, removed
    /// cgroups).
    #[arg(long = "series-ttl", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub series_ttl_s: u64,

    /// Overhead budget in percent of all CPUs: topdown measures its BPF programs' run time
    /// (kernel BPF statistics) and, above the budget, detaches the function probe with the most
    /// calls, one per refresh, logging it and exporting topdown_probes_detached_total.
    #[arg(long = "max-overhead", value_name = "PCT", value_parser = parse_percent)]
    pub max_overhead: Option<f64>,

    /// Attach the function probes (-u) only ON of every PERIOD (e.g. 5s/60s; units ms, s, m, h,
    /// a bare number is seconds), bounding their cost on hot functions. Function series are
    /// then estimates: each window's counts divided by the measured fraction of it the probes
    /// were attached (topdown_function_sampled_ratio).
    #[arg(long = "duty-cycle", value_name = "ON/PERIOD", value_parser = DutyCycle::parse)]
    pub duty_cycle: Option<DutyCycle>,

    #[command(flatten)]
    pub counting: CountingArgs,
}

fn parse_percent(text: &str) -> Result<f64, String> {
    match text.trim_end_matches('%').parse::<f64>() {
        Ok(value) if value > 0.0 && value <= 100.0 => Ok(value),
        _ => Err(format!(
            "'{text}': give a percentage above 0 and at most 100, e.g. 1 or 0.5"
        )),
    }
}

/// The longest `-d`: about 31 years, far below what a `Duration` or a timer can hold.
const MAX_SECONDS: f64 = 1e9;

fn parse_seconds(text: &str) -> Result<f64, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("'{text}' is not a number of seconds"))?;
    if seconds.is_nan() || seconds <= 0.0 {
        Err(format!(
            "'{text}': the duration must be a positive number of seconds"
        ))
    } else if seconds > MAX_SECONDS {
        Err(format!(
            "'{text}' seconds is too long: the most -d takes is {MAX_SECONDS:.0} seconds (about 31 years)"
        ))
    } else {
        Ok(seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_name_what_is_wrong() {
        assert_eq!(parse_seconds("2.5"), Ok(2.5));
        assert_eq!(parse_seconds("1e9"), Ok(1e9));
        assert_eq!(
            parse_seconds("1e300"),
            Err("'1e300' seconds is too long: the most -d takes is 1000000000 seconds (about 31 years)".to_owned())
        );
        assert_eq!(
            parse_seconds("inf"),
            Err("'inf' seconds is too long: the most -d takes is 1000000000 seconds (about 31 years)".to_owned())
        );
        for bad in ["0", "-1", "NaN"] {
            assert_eq!(
                parse_seconds(bad),
                Err(format!(
                    "'{bad}': the duration must be a positive number of seconds"
                ))
            );
        }
        assert_eq!(
            parse_seconds("soon"),
            Err("'soon' is not a number of seconds".to_owned())
        );
    }

    #[test]
    fn breakdowns_formats_and_triggers_parse_by_their_names() {
        let cli = Cli::try_parse_from([
            "topdown",
            "stat",
            "--by",
            "cgroup,function",
            "--format",
            "csv",
            "--trigger",
            "cgroup-switch",
            "--",
            "true",
        ])
        .unwrap();
        let Command::Stat(args) = cli.command else {
            panic!("not stat");
        };
        assert_eq!(args.report.by, vec![By::Cgroup, By::Function]);
        assert_eq!(args.report.format, Format::Csv);
        assert_eq!(args.counting.trigger, Some(Trigger::CgroupSwitch));
        let defaults = Cli::try_parse_from(["topdown", "stat", "-a"]).unwrap();
        let Command::Stat(args) = defaults.command else {
            panic!("not stat");
        };
        assert_eq!(args.report.by, vec![By::Task, By::Process]);
        assert_eq!(args.report.format, Format::Table);
        let wrong = Cli::try_parse_from(["topdown", "stat", "--by", "thread"])
            .unwrap_err()
            .to_string();
        assert!(
            wrong.contains("invalid value 'thread' for '--by <BY>'")
                && wrong
                    .contains("[possible values: task, process, cgroup, function, span, query]"),
            "{wrong}"
        );
    }
}
