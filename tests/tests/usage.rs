//! The usage reference generated from the CLI definition (`topdown generate`, installed by
//! `cargo xtask setup`): a man page for every command `--help` lists, with every option its
//! `--help` has, that man renders; completion scripts that the shells accept and that complete
//! the real commands, options and values. No BPF: runs as any user.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use topdown_tests::*;

/// A fresh directory for one test.
fn scratch(test: &str) -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("usage-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn ok(command: &mut Command) -> Output {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `topdown PATH... --help`.
fn help(path: &[String]) -> String {
    let out = ok(topdown().args(path).arg("--help"));
    String::from_utf8(out.stdout).unwrap()
}

/// The commands a `--help` lists under `Commands:`, less clap's `help` (it prints the others'
/// help and has no page of its own).
fn listed_commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// `--name` from the start of `text` (`--pid <PID,...>`, `--verbose...`, `--postgres [<BIN>]`).
fn long_name(text: &str) -> Option<String> {
    let rest = text.strip_prefix("--")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    (!name.is_empty()).then(|| format!("--{name}"))
}

/// The long options of a `--help`: option lines are indented 2 (`  -p, --pid <PID,...>`) or 6
/// (`      --by <BY>`), their descriptions 10.
fn help_options(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter(|line| {
            let indent = line.len() - line.trim_start().len();
            indent <= 6 && line.trim_start().starts_with('-')
        })
        .flat_map(|line| {
            line.trim()
                .split(", ")
                .filter_map(long_name)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A roff line as text: `\fB\-\-pid\fR \fI<PID,...>\fR` is `--pid <PID,...>`.
fn unroff(line: &str) -> String {
    line.replace("\\fB", "")
        .replace("\\fR", "")
        .replace("\\fI", "")
        .replace("\\-", "-")
}

/// The lines of a page's section (`.SH OPTIONS` up to the next `.SH`).
fn section<'a>(roff: &'a str, name: &str) -> Vec<&'a str> {
    let heading = format!(".SH {name}");
    roff.lines()
        .skip_while(|line| *line != heading)
        .skip(1)
        .take_while(|line| !line.starts_with(".SH "))
        .collect()
}

/// The long options of a page: the tags (the line after each `.TP`) of its OPTIONS section.
fn page_options(roff: &str) -> BTreeSet<String> {
    let lines = section(roff, "OPTIONS");
    lines
        .windows(2)
        .filter(|pair| pair[0] == ".TP")
        .flat_map(|pair| {
            unroff(pair[1])
                .split([',', ' '])
                .filter_map(long_name)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every command with its path below `topdown` (`[]`, `["stat"]`, ...), as `--help` lists
/// them, recursively.
fn commands() -> Vec<Vec<String>> {
    let mut found = vec![Vec::new()];
    let mut next = 0;
    while next < found.len() {
        let path = found[next].clone();
        for name in listed_commands(&help(&path)) {
            let mut sub = path.clone();
            sub.push(name);
            found.push(sub);
        }
        next += 1;
    }
    found
}

fn page_name(path: &[String]) -> String {
    let mut name = String::from("topdown");
    for part in path {
        name.push('-');
        name.push_str(part);
    }
    name + ".1"
}

fn generate_man(dir: &Path) {
    ok(topdown().arg("generate").arg("man").arg(dir));
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|out| out.status.success())
}

#[test]
fn every_command_has_a_page_with_every_option_of_its_help() {
    let dir = scratch("pages");
    generate_man(&dir);
    let commands = commands();
    let top = &commands[1..];
    for expected in ["stat", "top", "report", "diff", "serve", "list", "check"] {
        assert!(
            top.iter().any(|path| path == &[expected]),
            "`topdown --help` lists no {expected}: {top:?}"
        );
    }
    let wanted: BTreeSet<String> = commands.iter().map(|path| page_name(path)).collect();
    let written: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(written, wanted, "one page per command, and no other");

    for path in &commands {
        let name = page_name(path);
        let roff = std::fs::read_to_string(dir.join(&name)).unwrap();
        let from_help = help_options(&help(path));
        assert!(
            from_help.contains("--help") && from_help.contains("--verbose"),
            "{name}: the --help parse found {from_help:?}"
        );
        let from_page = page_options(&roff);
        let missing: Vec<_> = from_help.difference(&from_page).collect();
        assert!(missing.is_empty(), "{name} lacks {missing:?}");
        // Hidden options stay out of both.
        let extra: Vec<_> = from_page.difference(&from_help).collect();
        assert!(
            extra.is_empty(),
            "{name} has {extra:?}, which --help has not"
        );
        let title = name.trim_end_matches(".1");
        assert!(
            roff.lines()
                .any(|line| line.starts_with(&format!(".TH {title} 1 "))),
            "{name}: no .TH {title}"
        );
    }
    let stat = page_options(&std::fs::read_to_string(dir.join("topdown-stat.1")).unwrap());
    for option in [
        "--pid",
        "--uprobe",
        "--format",
        "--max-counters",
        "--no-bpf",
    ] {
        assert!(stat.contains(option), "topdown-stat.1 lacks {option}");
    }

    // The root page points at each command's page.
    let root = std::fs::read_to_string(dir.join("topdown.1")).unwrap();
    let subcommands = section(&root, "SUBCOMMANDS").join("\n");
    for path in top {
        let reference = format!("{}(1)", page_name(path).trim_end_matches(".1"));
        assert!(
            unroff(&subcommands).contains(&reference),
            "topdown.1 does not name {reference}:\n{subcommands}"
        );
    }
}

#[test]
fn pages_render_without_error() {
    let dir = scratch("render");
    generate_man(&dir);
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    pages.sort();
    assert!(pages.len() > 7, "{pages:?}");
    let (tool, render): (&str, fn(&Path) -> Command) = if have("man") {
        ("man", |page| {
            let mut command = Command::new("man");
            command
                .args(["--warnings", "-l"])
                .arg(page)
                .env("LC_ALL", "C")
                .env("MANWIDTH", "80")
                .env_remove("MANPAGER")
                .env_remove("PAGER");
            command
        })
    } else if have("groff") {
        ("groff", |page| {
            let mut command = Command::new("groff");
            command.args(["-man", "-Tascii", "-ww"]).arg(page);
            command
        })
    } else if have("mandoc") {
        ("mandoc", |page| {
            let mut command = Command::new("mandoc");
            command.args(["-Tascii", "-Wwarning"]).arg(page);
            command
        })
    } else {
        skipped("neither man, groff nor mandoc is installed: the pages are not rendered");
        return;
    };
    for page in &pages {
        let out = ok(&mut render(page));
        // troff's one tolerated warning: a value name longer than the line (`--span`'s
        // NAME=TARGET:PROVIDER:START..., 80 characters) overflows it instead of breaking.
        let stderr = String::from_utf8_lossy(&out.stderr);
        let complaints: Vec<&str> = stderr
            .lines()
            .filter(|line| !line.contains("can't break line"))
            .collect();
        assert!(
            complaints.is_empty(),
            "{tool} on {}: {complaints:?}",
            page.display()
        );
        let text = String::from_utf8_lossy(&out.stdout);
        for heading in ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS"] {
            assert!(
                text.lines().any(|line| line == heading),
                "{tool} on {}: no {heading} in\n{text}",
                page.display()
            );
        }
        // Every option reaches the rendered text, at the start of its entry.
        let roff = std::fs::read_to_string(page).unwrap();
        let entries: BTreeSet<String> = text
            .lines()
            .filter(|line| line.trim_start().starts_with('-'))
            .flat_map(|line| {
                line.trim()
                    .split([',', ' '])
                    .filter_map(long_name)
                    .collect::<Vec<_>>()
            })
            .collect();
        let missing: Vec<_> = page_options(&roff).difference(&entries).cloned().collect();
        assert!(
            missing.is_empty(),
            "{tool} on {}: {missing:?} not rendered",
            page.display()
        );
    }
}

/// Runs `script` in a bash that has sourced the bash completion, and returns its stdout.
fn bash_with_completion(completion: &Path, script: &str) -> String {
    let out = ok(Command::new("bash")
        .args(["--norc", "--noprofile", "-c"])
        .arg(format!("source {}\n{script}", completion.display())));
    String::from_utf8(out.stdout).unwrap()
}

/// What the completion function offers for the words typed so far (the last one being
/// completed), one candidate a line.
fn bash_complete(completion: &Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|word| format!("'{word}'")).collect();
    let line = words.join(" ");
    let script = format!(
        "COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE='{line}'; COMP_POINT={point}\n\
         _topdown topdown '{current}' '{previous}'\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        words = quoted.join(" "),
        cword = words.len() - 1,
        point = line.len(),
        current = words[words.len() - 1],
        previous = words[words.len() - 2],
    );
    bash_with_completion(completion, &script)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The possible values `--help` lists for `option` (`[possible values: table, json, ...]`).
fn possible_values(help: &str, option: &str) -> Vec<String> {
    let mut lines = help
        .lines()
        .skip_while(|line| long_name(line.trim()).as_deref() != Some(option))
        .skip(1)
        .take_while(|line| long_name(line.trim()).is_none());
    let values = lines
        .find_map(|line| line.trim().strip_prefix("[possible values: "))
        .unwrap_or_else(|| panic!("{option} lists no possible values in\n{help}"));
    values
        .trim_end_matches(']')
        .split(", ")
        .map(str::to_owned)
        .collect()
}

#[test]
fn bash_completion_completes_commands_options_and_values() {
    let dir = scratch("bash");
    let completion = dir.join("topdown.bash");
    ok(topdown()
        .args(["generate", "completions", "bash", "-o"])
        .arg(&completion));
    ok(Command::new("bash").arg("-n").arg(&completion));
    let registered = bash_with_completion(&completion, "complete -p topdown");
    assert!(
        registered.contains("-F _topdown") && registered.trim_end().ends_with(" topdown"),
        "{registered}"
    );

    assert_eq!(bash_complete(&completion, &["topdown", "st"]), ["stat"]);
    let all: BTreeSet<String> = bash_complete(&completion, &["topdown", ""])
        .into_iter()
        .collect();
    for path in &commands()[1..] {
        assert!(
            all.contains(&path[0]),
            "`topdown <TAB>` lacks {path:?}: {all:?}"
        );
    }
    assert!(!all.contains("generate"), "the hidden generate is offered");

    let stat_help = help(&["stat".to_owned()]);
    let offered: BTreeSet<String> = bash_complete(&completion, &["topdown", "stat", "--max-c"])
        .into_iter()
        .collect();
    let wanted: BTreeSet<String> = help_options(&stat_help)
        .into_iter()
        .filter(|option| option.starts_with("--max-c"))
        .collect();
    assert!(wanted.contains("--max-counters"), "{wanted:?}");
    assert_eq!(offered, wanted);
    assert_eq!(
        bash_complete(&completion, &["topdown", "stat", "--format", ""]),
        possible_values(&stat_help, "--format")
    );
}

#[test]
fn zsh_and_fish_completions_name_every_command() {
    let dir = scratch("zsh-fish");
    let top: Vec<String> = commands()[1..].iter().map(|path| path[0].clone()).collect();

    let zsh = dir.join("_topdown");
    ok(topdown()
        .args(["generate", "completions", "zsh", "-o"])
        .arg(&zsh));
    let script = std::fs::read_to_string(&zsh).unwrap();
    assert!(script.starts_with("#compdef topdown\n"), "{script}");
    for name in &top {
        assert!(
            script.contains(&format!("\n'{name}:")),
            "_topdown lacks {name}"
        );
    }
    if have("zsh") {
        ok(Command::new("zsh").arg("-n").arg(&zsh));
    } else {
        skipped("zsh is not installed: the zsh script's syntax is not checked");
    }

    let fish = dir.join("topdown.fish");
    ok(topdown()
        .args(["generate", "completions", "fish", "-o"])
        .arg(&fish));
    if !have("fish") {
        skipped("fish is not installed: the fish script is not run");
        return;
    }
    let complete = |line: &str| -> Vec<String> {
        let out = ok(Command::new("fish")
            .args(["--no-config", "-c"])
            .arg(format!("source {}; complete -C '{line}'", fish.display())));
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter_map(|line| line.split('\t').next())
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(complete("topdown st"), ["stat"]);
    let offered = complete("topdown ");
    for name in &top {
        assert!(
            offered.contains(name),
            "fish offers {offered:?}, not {name}"
        );
    }
    assert!(complete("topdown diff --k").contains(&"--kinds".to_owned()));
}

/// One line on stderr, naming the problem, and a failing exit.
fn fails_on_one_line(out: &Output, code: i32, mentions: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("topdown: ") && stderr.contains(mentions),
        "{stderr}"
    );
}

#[test]
fn bad_requests_fail_on_one_line() {
    let dir = scratch("bad");
    let out = topdown()
        .args(["generate", "completions", "tcsh"])
        .output()
        .unwrap();
    fails_on_one_line(&out, 2, "'tcsh'");
    assert!(out.stdout.is_empty());

    // A directory below a regular file cannot be created, even by root.
    let file = dir.join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = topdown()
        .arg("generate")
        .arg("man")
        .arg(file.join("man1"))
        .output()
        .unwrap();
    fails_on_one_line(&out, 1, &file.join("man1").display().to_string());

    let out = topdown()
        .args(["generate", "completions", "bash", "-o"])
        .arg(file.join("topdown"))
        .output()
        .unwrap();
    fails_on_one_line(&out, 2, &file.join("topdown").display().to_string());
    assert_eq!(std::fs::read(&file).unwrap(), b"");
}
