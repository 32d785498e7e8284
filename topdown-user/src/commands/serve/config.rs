//! `topdown serve --config FILE`: serve's options kept in a file, so that a service manager can
//! change them and send SIGHUP (`systemctl reload topdown`) instead of restarting, which would
//! lose the exporter's counters and re-open every counter group.
//!
//! The file holds the same options as the command line, one per line: the option, then its
//! value after the first run of whitespace (so a path with spaces needs no quoting); `#` starts
//! a comment line. Only what can change without re-opening counters or the listening socket is
//! applied live ([`LIVE_OPTIONS`]); a change to anything else is reported as needing a restart.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Parser;

use crate::{
    cli::ServeArgs,
    error::{Failure, fail},
};

/// The options a reload applies to the running exporter.
pub const LIVE_OPTIONS: &str =
    "-u/--uprobe, --max-series, --series-ttl, --max-overhead, --refresh-ms";

/// serve's options alone, parsed from a config file's lines.
#[derive(Debug, Parser)]
#[command(name = "topdown serve --config", no_binary_name = true)]
struct ServeFile {
    #[command(flatten)]
    args: ServeArgs,
}

/// The effective options: the command line's, or with `--config FILE`, the file's (the
/// command line then may hold nothing else, so there is one place to look).
pub fn effective(command_line: ServeArgs) -> Result<ServeArgs> {
    let Some(path) = command_line.config.clone() else {
        return Ok(command_line);
    };
    let mut without_config = command_line;
    without_config.config = None;
    if format!("{without_config:?}") != format!("{:?}", defaults()?) {
        return Err(fail(
            Failure::Usage,
            format!(
                "with --config {} give serve's other options in that file, not on the command line",
                path.display()
            ),
        ));
    }
    read(&path)
}

/// Reads and parses a config file into serve's options (with `config` set to it).
pub fn read(path: &Path) -> Result<ServeArgs> {
    let text = std::fs::read_to_string(path).map_err(|err| {
        fail(
            Failure::Usage,
            format!("cannot read config file {}: {err}", path.display()),
        )
    })?;
    let mut args = parse(&text).map_err(|message| {
        fail(
            Failure::Usage,
            format!("config file {}: {message}", path.display()),
        )
    })?;
    args.config = Some(path.to_path_buf());
    Ok(args)
}

/// Parses a config file's text; the error is one line naming the line at fault.
pub fn parse(text: &str) -> Result<ServeArgs, String> {
    let mut tokens: Vec<String> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (option, value) = match line.split_once(char::is_whitespace) {
            Some((option, value)) => (option, Some(value.trim())),
            None => (line, None),
        };
        if !option.starts_with('-') {
            return Err(format!(
                "line {}: '{line}' is not an option: write one `--option value` per line",
                index + 1
            ));
        }
        if option == "--config" || option.starts_with("--config=") {
            return Err(format!(
                "line {}: --config cannot appear inside a config file",
                index + 1
            ));
        }
        tokens.push(option.to_owned());
        tokens.extend(value.map(str::to_owned));
    }
    ServeFile::try_parse_from(tokens)
        .map(|file| file.args)
        .map_err(|err| one_line(&err.to_string()))
}

/// serve's defaults: what an empty command line gives.
fn defaults() -> Result<ServeArgs> {
    ServeFile::try_parse_from(std::iter::empty::<String>())
        .map(|file| file.args)
        .map_err(|err| anyhow::anyhow!("serve's defaults do not parse: {err}"))
}

/// clap's first line, without its `error: ` prefix (the rest is usage help for a terminal).
fn one_line(clap_message: &str) -> String {
    let first = clap_message.lines().next().unwrap_or(clap_message);
    first.strip_prefix("error: ").unwrap_or(first).to_owned()
}

/// Whether `new` differs from `running` in anything a reload cannot apply live.
pub fn needs_restart(running: &ServeArgs, new: &ServeArgs) -> bool {
    format!("{:?}", without_live(running)) != format!("{:?}", without_live(new))
}

/// A copy with the live options cleared, to compare the rest.
fn without_live(args: &ServeArgs) -> ServeArgs {
    let mut rest = args.clone();
    rest.counting.uprobes.clear();
    rest.max_series = 0;
    rest.series_ttl_s = 0;
    rest.max_overhead = None;
    rest.refresh_ms = 0;
    rest.config = None::<PathBuf>;
    rest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::By;

    #[test]
    fn options_one_per_line_with_comments_and_spaces_in_values() {
        let args = parse(
            "# the exporter on this host\n\
             --listen 127.0.0.1:9100\n\
             \n\
             --by cgroup\n\
             -u /opt/my app/bin/server:handle_*\n\
             --uprobe libc:getppid\n\
             --max-series=500\n\
             --uretprobes\n",
        )
        .unwrap();
        assert_eq!(args.listen.to_string(), "127.0.0.1:9100");
        assert_eq!(args.by, vec![By::Cgroup]);
        assert_eq!(
            args.counting.uprobes,
            vec!["/opt/my app/bin/server:handle_*", "libc:getppid"]
        );
        assert_eq!(args.max_series, 500);
        assert!(args.counting.uretprobes);
        // Untouched options keep serve's defaults.
        assert_eq!(args.series_ttl_s, 300);
        assert_eq!(args.refresh_ms, 5000);
    }

    #[test]
    fn bad_lines_are_one_line_errors_naming_the_line() {
        assert_eq!(
            parse("--by process\nlisten 0.0.0.0:1\n").unwrap_err(),
            "line 2: 'listen 0.0.0.0:1' is not an option: write one `--option value` per line"
        );
        assert_eq!(
            parse("--config /etc/other\n").unwrap_err(),
            "line 1: --config cannot appear inside a config file"
        );
        let unknown = parse("--max-seris 5\n").unwrap_err();
        assert!(unknown.contains("--max-seris"), "{unknown}");
        assert!(!unknown.contains('\n'), "{unknown}");
        let bad_value = parse("--max-overhead 200\n").unwrap_err();
        assert!(bad_value.contains("'200'"), "{bad_value}");
    }

    #[test]
    fn live_options_do_not_need_a_restart_and_the_rest_do() {
        let running = parse("-u /bin/app:a\n--max-series 100\n").unwrap();
        let live = parse(
            "-u /bin/app:b\n--max-series 200\n--series-ttl 9\n--max-overhead 1\n--refresh-ms 100\n",
        )
        .unwrap();
        assert!(!needs_restart(&running, &live));
        for restart in [
            "--listen 127.0.0.1:1",
            "--by cgroup",
            "--pmu software",
            "-G /system.slice",
            "--max-tasks 100",
            "--duty-cycle 5s/60s",
        ] {
            let new = parse(&format!("-u /bin/app:a\n--max-series 100\n{restart}\n")).unwrap();
            assert!(needs_restart(&running, &new), "{restart}");
        }
    }

    #[test]
    fn a_duty_cycle_in_a_file_is_typed_and_a_bad_one_is_one_line() {
        let args = parse("-u /bin/app:a\n--duty-cycle 500ms/1m\n").unwrap();
        assert_eq!(
            args.duty_cycle,
            Some(crate::commands::serve::duty_cycle::DutyCycle {
                on: std::time::Duration::from_millis(500),
                period: std::time::Duration::from_secs(60),
            })
        );
        assert_eq!(parse("-u /bin/app:a\n").unwrap().duty_cycle, None);
        let bad = parse("--duty-cycle 0s/60s\n").unwrap_err();
        assert!(
            bad.contains("'0s/60s'") && bad.contains("ON must be above 0"),
            "{bad}"
        );
        assert!(!bad.contains('\n'), "{bad}");
    }

    #[test]
    fn the_shipped_example_parses() {
        let args = parse(include_str!("../../../../deploy/topdown.conf")).unwrap();
        assert_eq!(args.listen.to_string(), "127.0.0.1:9943");
        assert_eq!(args.by, vec![By::Cgroup, By::Process]);
        assert!(args.counting.uprobes.is_empty());
    }

    #[test]
    fn an_empty_file_gives_the_defaults() {
        let args = parse("# nothing yet\n").unwrap();
        assert_eq!(
            format!("{args:?}"),
            format!("{:?}", defaults().unwrap()),
            "an empty file is serve with no options"
        );
    }
}
