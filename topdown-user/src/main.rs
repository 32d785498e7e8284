//! The `topdown` command.

use std::{io::Write as _, process::ExitCode};

use topdown::{
    cli::{Cli, Command, Invocation},
    commands::stat,
    error::{EXIT_RUNTIME, failure_of},
    functions::{own_process, symbols::ProbeSpec},
    session::target::Scope,
};

fn main() -> ExitCode {
    let cli = match Invocation::try_parse() {
        Ok(Invocation::Run(cli)) => cli,
        Ok(Invocation::Generate(generate)) => {
            return match generate.run() {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("topdown: error: {err:#}");
                    ExitCode::from(
                        failure_of(&err).map_or(EXIT_RUNTIME, |failure| failure.exit_code()),
                    )
                }
            };
        }
        Err(err) if !err.use_stderr() => err.exit(),
        Err(err) => {
            // Usage errors on one line: clap's message and its hint (possible values, the
            // conflicting option), without the blank lines and the generic `--help` tip.
            let text = err.render().to_string();
            let line: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with("For more information"))
                .collect();
            eprintln!("topdown: {}", line.join(" "));
            return ExitCode::from(2);
        }
    };
    init_logging(cli.verbose);
    match run(cli) {
        Ok(status) => ExitCode::from(status),
        Err(err) => {
            // One line: the outermost context first, then the causes.
            eprintln!("topdown: error: {err:#}");
            ExitCode::from(failure_of(&err).map_or(EXIT_RUNTIME, |failure| failure.exit_code()))
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    // Machine-wide probes trap in every process that maps a probed file: topdown restarts
    // itself on private copies of those it maps, before it has a thread or a probe.
    let machine_wide = match &cli.command {
        Command::Stat(args) if matches!(args.scope.scope(), Scope::SystemWide) => {
            Some(&args.counting)
        }
        Command::Top(args) if matches!(args.scope.scope(), Scope::SystemWide) => {
            Some(&args.counting)
        }
        Command::Serve(args) => Some(&args.counting),
        _ => None,
    };
    let probe_targets: Vec<String> = machine_wide
        .map(|counting| {
            let functions = counting
                .uprobes
                .iter()
                .filter_map(|spec| ProbeSpec::parse(spec).ok())
                .map(|spec| spec.target);
            // `-U TARGET:PROVIDER:NAME`: USDT sites are uprobes too.
            let usdt = counting
                .usdt
                .iter()
                .filter_map(|spec| spec.split_once(':').map(|(target, _)| target.to_owned()));
            functions.chain(usdt).collect()
        })
        .unwrap_or_default();
    own_process::leave_probed_files(&probe_targets);
    match cli.command {
        Command::Stat(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|err| anyhow::anyhow!("starting the event loop: {err}"))?;
            runtime.block_on(stat::run(*args, cli.verbose > 0))
        }
        Command::Top(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|err| anyhow::anyhow!("starting the event loop: {err}"))?;
            runtime.block_on(topdown::commands::top::run(*args, cli.verbose > 0))
        }
        Command::Report(args) => {
            // FILE is replaced only once the report is complete: a bad input keeps it.
            let mut output = topdown::ui::output::Output::open(args.report.output.as_deref())?;
            topdown::commands::report::run(&args, output.as_mut())?;
            output.commit()?;
            Ok(0)
        }
        Command::List(args) => {
            let mut out = std::io::stdout().lock();
            topdown::commands::list::run(&args, &mut out)?;
            Ok(0)
        }
        Command::Serve(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|err| anyhow::anyhow!("starting the event loop: {err}"))?;
            runtime.block_on(topdown::commands::serve::run(*args, cli.verbose > 0))
        }
        Command::Diff(args) => {
            let request = args
                .request()
                .map_err(|line| topdown::error::fail(topdown::error::Failure::Usage, line))?;
            topdown::commands::diff::command(&request)
        }
        Command::Check(args) => {
            let (model, announcement) =
                topdown::session::counting::select_model_by(&args.pmu, None)?;
            let mut out = std::io::stdout().lock();
            topdown::commands::check::run(model.as_ref(), announcement.as_deref(), &mut out)
        }
    }
}

/// A small stderr logger: warnings always, info with -v, debug with -vv.
fn init_logging(verbose: u8) {
    struct Stderr;
    impl log::Log for Stderr {
        fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
            metadata.level() <= log::max_level()
        }
        fn log(&self, record: &log::Record<'_>) {
            if self.enabled(record.metadata()) {
                let _ = writeln!(
                    std::io::stderr(),
                    "topdown: {}: {}",
                    record.level().as_str().to_lowercase(),
                    record.args()
                );
            }
        }
        fn flush(&self) {}
    }
    static LOGGER: Stderr = Stderr;
    let level = match verbose {
        0 => log::LevelFilter::Warn,
        1 => log::LevelFilter::Info,
        _ => log::LevelFilter::Debug,
    };
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}
