//! USDT probes (SystemTap SDT notes): `-U TARGET:PROVIDER:NAME` counts hits, and spans
//! (`crate::spans`) start and end at them.
//!
//! One module per step: [`notes`] reads a file's probe sites, [`args`] parses their argument
//! specs, [`attach`] creates the links that enable semaphores (which aya cannot). This module
//! resolves what the user named into [`SitePlan`] entries: where to attach, and the
//! [`UsdtSite`] descriptor the BPF side runs there.

pub mod args;
pub mod attach;
pub mod notes;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use anyhow::Result;
use topdown_common::usdt::{SpanKind, UsdtSite, action};

use crate::error::{Failure, fail};

/// A probe named on the command line: `TARGET:PROVIDER:NAME` (provider and name may be globs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeName {
    pub target: String,
    pub provider: String,
    pub name: String,
}

impl ProbeName {
    /// Splits at the last two colons (a path may hold colons; providers and names do not).
    pub fn parse(text: &str, option: &str) -> Result<Self> {
        let usage = || {
            fail(
                Failure::Usage,
                format!(
                    "{option} {text}: expected TARGET:PROVIDER:NAME, e.g. \
                     /usr/bin/python3.11:python:function__entry or ./app:app:request__start"
                ),
            )
        };
        let (rest, name) = text.rsplit_once(':').ok_or_else(usage)?;
        let (target, provider) = rest.rsplit_once(':').ok_or_else(usage)?;
        if target.is_empty() || provider.is_empty() || name.is_empty() {
            return Err(usage());
        }
        Ok(Self {
            target: target.to_owned(),
            provider: provider.to_owned(),
            name: name.to_owned(),
        })
    }
}

/// One site to attach and what the BPF side does there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedSite {
    pub target: PathBuf,
    pub offset: u64,
    /// The semaphore's file offset (0: none).
    pub ref_ctr_offset: u64,
    /// A function's return (a uretprobe) rather than a site or a function entry.
    pub retprobe: bool,
    pub site: UsdtSite,
}

/// Everything the USDT program is attached to in one session.
#[derive(Clone, Debug, Default)]
pub struct SitePlan {
    /// In cookie order: a site's cookie is its index here.
    pub sites: Vec<PlannedSite>,
    /// Span kinds by id, as the BPF side needs them.
    pub kinds: Vec<SpanKind>,
    /// `-U` probes by hit id: `(target, provider:name)`.
    pub hit_probes: Vec<(String, String)>,
}

/// Files' SDT notes, read once each.
#[derive(Default)]
pub struct Files {
    files: HashMap<PathBuf, notes::SdtFile>,
}

impl Files {
    pub fn get(&mut self, path: &Path) -> Result<&notes::SdtFile> {
        if !self.files.contains_key(path) {
            let file = notes::read(path)?;
            self.files.insert(path.to_owned(), file);
        }
        self.files
            .get(path)
            .ok_or_else(|| anyhow::anyhow!("{} was just read", path.display()))
    }
}

/// The file `target` names (a path or a library name, resolved as `-u` does).
pub fn find_file(target: &str, pids: &[u32]) -> Result<PathBuf> {
    crate::functions::symbols::target::find_target(target, pids)
}

/// A probe's `(provider, name)` and its sites.
pub type ProbeSites<'a> = ((String, String), Vec<&'a notes::SdtNote>);

/// The sites of `provider:name` (globs allowed) in `file`, grouped by probe, in note order.
pub fn sites<'a>(file: &'a notes::SdtFile, provider: &str, name: &str) -> Vec<ProbeSites<'a>> {
    let matches = |pattern: &str, text: &str| {
        crate::functions::symbols::matching::glob(pattern.as_bytes(), text.as_bytes())
    };
    let mut probes: Vec<ProbeSites<'a>> = Vec::new();
    for note in &file.notes {
        if !matches(provider, &note.provider) || !matches(name, &note.name) {
            continue;
        }
        let key = (note.provider.clone(), note.name.clone());
        match probes.iter_mut().find(|(known, _)| *known == key) {
            Some((_, sites)) => sites.push(note),
            None => probes.push((key, vec![note])),
        }
    }
    probes
}

/// The probe's sites, or an error that lists what the file has.
pub fn required_sites<'a>(
    file: &'a notes::SdtFile,
    path: &Path,
    provider: &str,
    name: &str,
    option: &str,
) -> Result<Vec<ProbeSites<'a>>> {
    check_architecture(file, path)?;
    let found = sites(file, provider, name);
    if found.is_empty() {
        let mut known: Vec<String> = file
            .notes
            .iter()
            .map(|note| format!("{}:{}", note.provider, note.name))
            .collect();
        known.dedup();
        let hint = if known.is_empty() {
            format!(
                "{} has no USDT probes (no .note.stapsdt section)",
                path.display()
            )
        } else {
            let shown: Vec<&str> = known.iter().take(8).map(String::as_str).collect();
            format!(
                "{} has {} probe{}: {}{}",
                path.display(),
                known.len(),
                if known.len() == 1 { "" } else { "s" },
                shown.join(", "),
                if known.len() > shown.len() {
                    ", ..."
                } else {
                    ""
                }
            )
        };
        return Err(fail(
            Failure::Usage,
            format!(
                "{option}: no USDT probe {provider}:{name} in {}; {hint}",
                path.display()
            ),
        ));
    }
    Ok(found)
}

/// Argument specs are decoded for x86-64 only.
fn check_architecture(file: &notes::SdtFile, path: &Path) -> Result<()> {
    if file.x86_64 {
        Ok(())
    } else {
        Err(fail(
            Failure::Usage,
            format!(
                "{}: USDT probes are supported on x86-64 binaries only (their argument specs \
                 are architecture-specific)",
                path.display()
            ),
        ))
    }
}

impl SitePlan {
    /// Adds the `-U` probes: every site of each counts hits of its probe.
    pub fn add_hits(&mut self, names: &[ProbeName], files: &mut Files, pids: &[u32]) -> Result<()> {
        for probe in names {
            let option = format!("-U {}:{}:{}", probe.target, probe.provider, probe.name);
            let path = find_file(&probe.target, pids)?;
            let file = files.get(&path)?;
            for ((provider, name), notes) in
                required_sites(file, &path, &probe.provider, &probe.name, &option)?
            {
                let label = format!("{provider}:{name}");
                let target = path.display().to_string();
                let id = match self
                    .hit_probes
                    .iter()
                    .position(|known| known.0 == target && known.1 == label)
                {
                    Some(id) => id,
                    None => {
                        self.hit_probes.push((target, label));
                        self.hit_probes.len() - 1
                    }
                } as u32;
                for note in notes {
                    self.sites.push(PlannedSite {
                        target: path.clone(),
                        offset: note.offset,
                        ref_ctr_offset: note.semaphore.map_or(0, |semaphore| semaphore.offset),
                        retprobe: false,
                        site: UsdtSite {
                            action: action::HIT,
                            id,
                            ..UsdtSite::default()
                        },
                    });
                }
            }
        }
        Ok(())
    }
}

/// Arbitrary strings over `alphabet`, up to `max_len` characters, from a fixed seed
/// (xorshift64): what the parsers' never-panic tests feed them.
#[cfg(test)]
pub(crate) fn arbitrary_strings(
    alphabet: &str,
    count: usize,
    max_len: u64,
    seed: u64,
) -> Vec<String> {
    let alphabet: Vec<char> = alphabet.chars().collect();
    let mut state = seed;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..count)
        .map(|_| {
            let len = next() % (max_len + 1);
            (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect()
        })
        .collect()
}
