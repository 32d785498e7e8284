//! The usage reference `cargo xtask setup` installs: one man page per command and the bash, zsh
//! and fish completions, all written by the built binary's hidden `topdown generate` from its
//! CLI definition. xtask cannot link topdown-user (it builds before the pinned toolchains
//! exist), so it runs the binary. Idempotent: a file is written only when its content differs.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{describe, output};

/// Where man-db looks without a MANPATH (`MANDATORY_MANPATH` in /etc/manpath.config).
pub const MAN_DIR: &str = "/usr/local/share/man/man1";

/// Each shell's script and where that shell finds it without configuration: bash-completion
/// loads from `$XDG_DATA_DIRS/bash-completion/completions` (default /usr/local/share first),
/// Debian's zsh has /usr/local/share/zsh/site-functions in `fpath`, and fish reads vendor
/// completions under its own data directory only (/usr/share, unless XDG_DATA_DIRS says more).
pub const COMPLETIONS: [(&str, &str); 3] = [
    (
        "bash",
        "/usr/local/share/bash-completion/completions/topdown",
    ),
    ("zsh", "/usr/local/share/zsh/site-functions/_topdown"),
    ("fish", "/usr/share/fish/vendor_completions.d/topdown.fish"),
];

/// Installs the man pages and the completions of `topdown` (the built binary), one line each.
pub fn install(topdown: &Path) -> Result<()> {
    man_pages(topdown)?;
    completions(topdown)
}

fn man_pages(topdown: &Path) -> Result<()> {
    // Generated afresh beside the binary, so a page of a removed command is not carried over.
    let staging = topdown.with_file_name("usage").join("man1");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)
            .with_context(|| format!("removing {}", staging.display()))?;
    }
    generate(
        Command::new(topdown)
            .arg("generate")
            .arg("man")
            .arg(&staging),
    )?;
    let wanted = read_pages(&staging, |_| true)?;
    if wanted.is_empty() {
        bail!("`topdown generate man` wrote no page");
    }
    let installed = read_pages(Path::new(MAN_DIR), is_topdown_page_name)?;
    let plan = plan(&wanted, &installed);
    let names = wanted.keys().cloned().collect::<Vec<_>>().join(" ");
    if plan.is_empty() {
        println!("ok: man pages {names} in {MAN_DIR}");
        return Ok(());
    }
    let mut line = format!("installing: man pages in {MAN_DIR}");
    if !plan.write.is_empty() {
        line.push_str(&format!(": {} (new or changed)", plan.write.join(" ")));
    }
    if !plan.remove.is_empty() {
        line.push_str(&format!(
            "; removing {} (no such command now)",
            plan.remove.join(" ")
        ));
    }
    println!("{line}");
    for name in &plan.write {
        write(&Path::new(MAN_DIR).join(name), &wanted[name])?;
    }
    for name in &plan.remove {
        let path = Path::new(MAN_DIR).join(name);
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}

fn completions(topdown: &Path) -> Result<()> {
    let mut changed = Vec::new();
    for (shell, path) in COMPLETIONS {
        let script = generate(Command::new(topdown).args(["generate", "completions", shell]))?;
        if script.is_empty() {
            bail!("`topdown generate completions {shell}` wrote nothing");
        }
        if std::fs::read(path).ok().as_deref() != Some(script.as_slice()) {
            changed.push((shell, path, script));
        }
    }
    let list = |items: &mut dyn Iterator<Item = (&str, &str)>| {
        items
            .map(|(shell, path)| format!("{shell} ({path})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if changed.is_empty() {
        println!("ok: completions {}", list(&mut COMPLETIONS.into_iter()));
        return Ok(());
    }
    println!(
        "installing: completions {}",
        list(&mut changed.iter().map(|(shell, path, _)| (*shell, *path)))
    );
    for (_, path, script) in &changed {
        write(Path::new(path), script)?;
    }
    Ok(())
}

/// Runs `topdown generate ...` and returns its stdout; a failure carries its stderr.
fn generate(command: &mut Command) -> Result<Vec<u8>> {
    let out = output(command)?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            describe(command),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

fn write(path: &Path, content: &[u8]) -> Result<()> {
    let hint = "(run `cargo xtask setup` as root)";
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating {} {hint}", dir.display()))?;
    }
    std::fs::write(path, content).with_context(|| format!("writing {} {hint}", path.display()))
}

/// The pages in `dir` whose names pass `keep`, by name; a missing `dir` has none.
fn read_pages(dir: &Path, keep: fn(&str) -> bool) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut pages = BTreeMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(pages),
        Err(err) => return Err(err).with_context(|| format!("reading {}", dir.display())),
    };
    for entry in entries {
        let path: PathBuf = entry
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
            continue;
        };
        if path.is_file() && keep(name) {
            let content =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            pages.insert(name.to_owned(), content);
        }
    }
    Ok(pages)
}

/// `topdown.1` and `topdown-*.1`: the names topdown's pages take.
fn is_topdown_page_name(name: &str) -> bool {
    name == "topdown.1" || (name.starts_with("topdown-") && name.ends_with(".1"))
}

/// Whether an installed page was written by `topdown generate`: its `.TH` line names topdown as
/// the source (`.TH topdown-stat 1  "topdown 0.1.0"`). Only those are removed as stale, so a
/// page another program installed under a `topdown-` name is left alone.
fn is_generated_page(content: &[u8]) -> bool {
    String::from_utf8_lossy(content)
        .lines()
        .find(|line| line.starts_with(".TH "))
        .is_some_and(|line| line.contains("\"topdown "))
}

/// What installing `wanted` over `installed` (both by file name) does.
#[derive(Debug, Default, PartialEq, Eq)]
struct Plan {
    /// New pages and pages whose content differs.
    write: Vec<String>,
    /// Generated pages of commands that no longer exist.
    remove: Vec<String>,
}

impl Plan {
    fn is_empty(&self) -> bool {
        self.write.is_empty() && self.remove.is_empty()
    }
}

fn plan(wanted: &BTreeMap<String, Vec<u8>>, installed: &BTreeMap<String, Vec<u8>>) -> Plan {
    Plan {
        write: wanted
            .iter()
            .filter(|(name, content)| installed.get(*name) != Some(content))
            .map(|(name, _)| name.clone())
            .collect(),
        remove: installed
            .iter()
            .filter(|(name, content)| !wanted.contains_key(*name) && is_generated_page(content))
            .map(|(name, _)| name.clone())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages(list: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        list.iter()
            .map(|(name, content)| ((*name).to_owned(), content.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn writes_only_what_differs_and_removes_only_its_own_stale_pages() {
        let page =
            |name: &str| format!(".ie \\n(.g .ds Aq \\(aq\n.TH {name} 1  \"topdown 0.1.0\"\n");
        let wanted = pages(&[
            ("topdown.1", &page("topdown")),
            ("topdown-stat.1", &page("topdown-stat")),
            ("topdown-top.1", &page("topdown-top")),
        ]);
        let installed = pages(&[
            ("topdown.1", &page("topdown")),
            ("topdown-stat.1", ".TH topdown-stat 1  \"topdown 0.0.9\"\n"),
            ("topdown-old.1", &page("topdown-old")),
            (
                "topdown-region.1",
                ".TH TOPDOWN-REGION 1 \"2026\" \"other\"\n",
            ),
        ]);
        assert_eq!(
            plan(&wanted, &installed),
            Plan {
                write: vec!["topdown-stat.1".into(), "topdown-top.1".into()],
                remove: vec!["topdown-old.1".into()],
            }
        );
        assert!(plan(&wanted, &wanted).is_empty());
        assert_eq!(
            plan(&wanted, &BTreeMap::new()).write,
            ["topdown-stat.1", "topdown-top.1", "topdown.1"]
        );
    }

    #[test]
    fn recognises_topdown_page_names() {
        assert!(is_topdown_page_name("topdown.1"));
        assert!(is_topdown_page_name("topdown-stat.1"));
        assert!(!is_topdown_page_name("topdownx.1"));
        assert!(!is_topdown_page_name("topdown-stat.1.gz"));
        assert!(!is_topdown_page_name("perf.1"));
    }
}
