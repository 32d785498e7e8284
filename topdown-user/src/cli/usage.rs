//! The usage reference, generated from the CLI definition: one man page per command
//! (clap_mangen) and shell completion scripts (clap_complete). The hidden `topdown generate`
//! writes them and `cargo xtask setup` installs them, so they always match what `topdown`
//! parses.

use std::{io::Write as _, path::PathBuf};

use anyhow::{Context as _, Result};
use clap::{CommandFactory as _, Parser, Subcommand};
use clap_complete::Shell;

use super::Cli;

/// The binary's name in the pages' synopses and in the completion scripts.
const BIN: &str = "topdown";

/// `topdown generate`: left out of `--help`, of the man pages and of the completions (it is
/// not part of [`Cli`], see [`super::Invocation`]).
#[derive(Debug, Parser)]
#[command(
    name = "generate",
    hide = true,
    about = "Write the usage reference generated from the CLI definition: man pages or shell completions"
)]
pub struct Generate {
    #[command(subcommand)]
    pub what: Reference,
}

#[derive(Debug, Subcommand)]
pub enum Reference {
    /// One man page per command and subcommand into DIR (created if missing): topdown.1,
    /// topdown-stat.1, ...
    Man {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// The completion script for SHELL, on stdout or in FILE.
    Completions {
        #[arg(value_name = "SHELL", value_parser = clap::value_parser!(Shell))]
        shell: Shell,

        /// Write to FILE instead of stdout.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

impl Generate {
    pub fn run(&self) -> Result<()> {
        match &self.what {
            Reference::Man { dir } => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                for page in man_pages()? {
                    let path = dir.join(&page.file_name);
                    std::fs::write(&path, &page.roff)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                }
                Ok(())
            }
            Reference::Completions { shell, output } => {
                let mut out = crate::ui::output::Output::open(output.as_deref())?;
                out.write_all(&completion(*shell))
                    .context("writing the completion script")?;
                out.commit()
            }
        }
    }
}

/// The documented command line: exactly what `topdown` parses, less the hidden `generate`.
pub fn command() -> clap::Command {
    Cli::command()
}

/// A rendered man page and the file name it goes by (`topdown-stat.1`).
#[derive(Debug)]
pub struct ManPage {
    pub file_name: String,
    pub roff: Vec<u8>,
}

/// One page per visible command, recursively: `topdown.1`, then `topdown-stat.1` etc. in the
/// order `--help` lists them. clap's `help` subcommand gets none (each page has `--help`).
pub fn man_pages() -> Result<Vec<ManPage>> {
    let mut root = command().disable_help_subcommand(true);
    // Built once here: subcommands then carry the global options (-v) and their display names
    // (`topdown-stat`), which name their pages.
    root.build();
    let mut pages = Vec::new();
    collect_pages(&root, &mut pages)?;
    Ok(pages)
}

fn collect_pages(command: &clap::Command, pages: &mut Vec<ManPage>) -> Result<()> {
    // Every page's footer names topdown and its version, not the subcommand's name.
    let man = clap_mangen::Man::new(command.clone())
        .source(format!("{BIN} {}", env!("CARGO_PKG_VERSION")));
    let mut roff = Vec::new();
    man.render(&mut roff)
        .with_context(|| format!("rendering the man page of {}", command.get_name()))?;
    pages.push(ManPage {
        file_name: man.get_filename(),
        roff,
    });
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        collect_pages(sub, pages)?;
    }
    Ok(())
}

/// The completion script of `topdown` for `shell`.
pub fn completion(shell: Shell) -> Vec<u8> {
    let mut command = command();
    let mut script = Vec::new();
    // Writes to a Vec, which cannot fail (clap_complete panics on a failed write).
    clap_complete::generate(shell, &mut command, BIN, &mut script);
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(command: &clap::Command) -> Vec<String> {
        command
            .get_subcommands()
            .filter(|sub| !sub.is_hide_set())
            .map(|sub| sub.get_name().to_owned())
            .collect()
    }

    #[test]
    fn one_page_per_command_named_after_it() {
        let pages = man_pages().unwrap();
        let files: Vec<&str> = pages.iter().map(|page| page.file_name.as_str()).collect();
        let mut expected = vec!["topdown.1".to_owned()];
        expected.extend(
            names(&command())
                .iter()
                .filter(|name| *name != "help")
                .map(|name| format!("topdown-{name}.1")),
        );
        assert_eq!(files, expected);
        assert!(files.contains(&"topdown-stat.1") && files.contains(&"topdown-top.1"));
        for page in &pages {
            let roff = String::from_utf8(page.roff.clone()).unwrap();
            assert!(roff.starts_with(".ie \\n(.g .ds Aq"), "{}", page.file_name);
            assert!(roff.contains(".SH NAME"), "{}", page.file_name);
        }
    }

    #[test]
    fn generate_parses_beside_the_documented_commands_but_is_not_listed() {
        use crate::cli::Invocation;
        let parsed = Invocation::try_parse_from(["topdown", "generate", "completions", "zsh"]);
        let Ok(Invocation::Generate(Generate {
            what: Reference::Completions { shell, output },
        })) = parsed
        else {
            panic!("not generate completions: {parsed:?}");
        };
        assert_eq!((shell, output), (Shell::Zsh, None));
        let parsed = Invocation::try_parse_from(["topdown", "-v", "generate", "man", "out"]);
        assert!(
            matches!(&parsed, Ok(Invocation::Generate(Generate { what: Reference::Man { dir } })) if dir.as_os_str() == "out"),
            "{parsed:?}"
        );
        let parsed = Invocation::try_parse_from(["topdown", "stat", "-a"]);
        assert!(
            matches!(&parsed, Ok(Invocation::Run(cli)) if matches!(cli.command, crate::cli::Command::Stat(_))),
            "{parsed:?}"
        );
        let unknown = Invocation::try_parse_from(["topdown", "generate", "completions", "tcsh"])
            .unwrap_err()
            .to_string();
        assert!(
            unknown.contains("invalid value 'tcsh' for '<SHELL>'"),
            "{unknown}"
        );
        let help = Invocation::try_parse_from(["topdown", "--help"])
            .unwrap_err()
            .to_string();
        assert!(
            help.contains("stat") && !help.contains("generate"),
            "{help}"
        );
    }

    #[test]
    fn the_hidden_generator_is_in_no_page_nor_completion() {
        assert!(!names(&command()).iter().any(|name| name == "generate"));
        for page in man_pages().unwrap() {
            let roff = String::from_utf8(page.roff).unwrap();
            assert!(!roff.contains("generate"), "{}", page.file_name);
        }
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = String::from_utf8(completion(shell)).unwrap();
            assert!(script.contains("stat"), "{shell}");
            assert!(!script.contains("generate"), "{shell}");
        }
    }
}
