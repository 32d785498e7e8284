//! Function probes (`-u TARGET:FUNC`): resolved to offsets, attached with one id per function
//! (the attach cookie, the key of the per-function map), and, for the exporter running for
//! days, re-attached when a target binary is replaced on disk (uprobes belong to an inode: a
//! deployed new build would silently stop being counted) or on SIGHUP, and detached one by one
//! by the overhead guard. Function ids stay stable across re-attachment, so series keep
//! counting.

use std::{
    collections::BTreeSet,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::Result;

use crate::{
    bpf::{AttachMode, ProbePoint, Session},
    calibration::ReturnMechanism,
    progress::Progress,
    symbols::{ProbeSpec, ResolvedFunction, resolve as resolve_functions},
};

/// Functions from which attaching shows progress on a terminal.
const ATTACH_PROGRESS_FROM: usize = 200;
/// Functions attached per call while progress is shown. Each call keeps the session's
/// exit-before-entry order for its own functions, and links accumulate in the session, so
/// detaching is unchanged.
const ATTACH_BATCH: usize = 100;

/// `(dev, inode)` of a file, or `None` while it is missing (mid-replacement).
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path)
        .ok()
        .map(|meta| (meta.dev(), meta.ino()))
}

pub struct Probes {
    specs: Vec<ProbeSpec>,
    /// `-p`: the processes probed, through whose mappings library names resolve; empty: every
    /// process that maps a target.
    processes: Vec<u32>,
    uretprobes: bool,
    /// `(target, demangled symbol)` by function id.
    functions: Vec<(String, String)>,
    /// How each function's returns are probed, by function id (the calibration's key).
    mechanisms: Vec<Option<ReturnMechanism>>,
    /// Function ids the overhead guard detached; never re-attached.
    detached: BTreeSet<u32>,
    /// Each attached target and the file identity it had.
    targets: Vec<(PathBuf, Option<(u64, u64)>)>,
    pub reattachments: u64,
}

impl Probes {
    /// Resolves the `-u` specs and attaches them.
    pub fn attach(
        session: &mut Session,
        specs: Vec<ProbeSpec>,
        processes: Vec<u32>,
        uretprobes: bool,
    ) -> Result<Self> {
        let mut probes = Self {
            specs,
            processes,
            uretprobes,
            functions: Vec::new(),
            mechanisms: Vec::new(),
            detached: BTreeSet::new(),
            targets: Vec::new(),
            reattachments: 0,
        };
        let resolved = resolve_functions(&probes.specs, &probes.processes)?;
        probes.attach_resolved(session, resolved)?;
        Ok(probes)
    }

    /// `(target, symbol)` by function id, for reports.
    pub fn functions(&self) -> &[(String, String)] {
        &self.functions
    }

    /// How function `id`'s returns are probed (`None`: unknown id, or it never returns).
    pub fn mechanism(&self, id: u32) -> Option<ReturnMechanism> {
        self.mechanisms.get(id as usize).copied().flatten()
    }

    /// The return mechanisms in use, each once.
    pub fn mechanisms_in_use(&self) -> Vec<ReturnMechanism> {
        let used: BTreeSet<ReturnMechanism> = self.mechanisms.iter().flatten().copied().collect();
        used.into_iter().collect()
    }

    pub fn detached(&self) -> impl Iterator<Item = &(String, String)> {
        self.detached
            .iter()
            .filter_map(|id| self.functions.get(*id as usize))
    }

    fn attach_resolved(
        &mut self,
        session: &mut Session,
        resolved: Vec<ResolvedFunction>,
    ) -> Result<()> {
        let mut points = Vec::new();
        let mut targets: Vec<PathBuf> = Vec::new();
        for function in resolved {
            let key = (
                function.target.display().to_string(),
                function.display.clone(),
            );
            let id = match self.functions.iter().position(|known| *known == key) {
                Some(id) => id,
                None => {
                    self.functions.push(key);
                    self.functions.len() - 1
                }
            } as u32;
            if self.detached.contains(&id) {
                continue;
            }
            if !targets.contains(&function.target) {
                targets.push(function.target.clone());
            }
            points.push(ProbePoint {
                target: function.target,
                offset: function.offset,
                exits: if self.uretprobes {
                    None
                } else {
                    function.exits
                },
                function_id: id,
            });
        }
        for point in &points {
            let id = point.function_id as usize;
            if self.mechanisms.len() <= id {
                self.mechanisms.resize(id + 1, None);
            }
            self.mechanisms[id] = ReturnMechanism::of(point);
        }
        // Attached before a held command execs, so none of its calls are missed.
        let started = Instant::now();
        let mode = if points.is_empty() {
            None
        } else {
            // Shown only for many functions (a glob over a large binary), where attaching takes
            // seconds; without a terminal it is one call, as before.
            let progress = (points.len() >= ATTACH_PROGRESS_FROM)
                .then(|| Progress::counting("attaching probes", points.len() as u64, "functions"));
            let batch = match &progress {
                Some(progress) if progress.is_visible() => ATTACH_BATCH,
                _ => points.len(),
            };
            let mut mode = None;
            for chunk in points.chunks(batch) {
                mode = Some(session.attach_functions(chunk, &self.processes)?);
                if let Some(progress) = &progress {
                    progress.inc(chunk.len() as u64);
                }
            }
            mode
        };
        eprintln!(
            "topdown: probing {} function{} in {} binar{} ({}) attached in {:.1} ms",
            points.len(),
            if points.len() == 1 { "" } else { "s" },
            targets.len(),
            if targets.len() == 1 { "y" } else { "ies" },
            match mode {
                Some(AttachMode::Multi) => "uprobe.multi",
                Some(AttachMode::PerPoint) => "one uprobe per function",
                None => "nothing to attach",
            },
            started.elapsed().as_secs_f64() * 1e3
        );
        self.targets = targets
            .into_iter()
            .map(|path| {
                let id = identity(&path);
                (path, id)
            })
            .collect();
        Ok(())
    }

    /// Resolves the specs again, then detaches everything and attaches that resolution. A
    /// spec that no longer resolves fails before anything is detached.
    pub fn reattach(&mut self, session: &mut Session, why: &str) -> Result<()> {
        let resolved = resolve_functions(&self.specs, &self.processes)?;
        self.reattach_resolved(session, resolved, why)
    }

    fn reattach_resolved(
        &mut self,
        session: &mut Session,
        resolved: Vec<ResolvedFunction>,
        why: &str,
    ) -> Result<()> {
        eprintln!("topdown: re-attaching function probes: {why}");
        session.detach_functions()?;
        self.attach_resolved(session, resolved)?;
        self.reattachments += 1;
        Ok(())
    }

    /// A new set of `-u` specs (a configuration reload): functions already known keep their
    /// ids (and series); new ones get new ids; those no longer matched stop being probed.
    /// Specs that do not resolve fail before anything changes, so a typo keeps the running
    /// probes.
    pub fn replace_specs(&mut self, session: &mut Session, specs: Vec<ProbeSpec>) -> Result<()> {
        let resolved = resolve_functions(&specs, &self.processes)?;
        self.specs = specs;
        self.reattach_resolved(session, resolved, "configuration reloaded")
    }

    /// Targets whose file is now another one (replaced by a deploy, a package upgrade).
    pub fn replaced_targets(&self) -> Vec<PathBuf> {
        self.targets
            .iter()
            .filter(|(path, attached)| {
                let now = identity(path);
                now.is_some() && now != *attached
            })
            .map(|(path, _)| path.clone())
            .collect()
    }

    /// The overhead guard's step: stop probing `id` for good.
    pub fn detach_function(&mut self, session: &mut Session, id: u32) -> Result<()> {
        self.detached.insert(id);
        let name = self
            .functions
            .get(id as usize)
            .map_or_else(|| format!("function {id}"), |(_, symbol)| symbol.clone());
        self.reattach(session, &format!("overhead guard detached {name}"))
    }

    /// Ids still attached.
    pub fn attached_ids(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.functions.len() as u32).filter(|id| !self.detached.contains(id))
    }
}
