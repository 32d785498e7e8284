//! Function probes (`-u TARGET:FUNC`): resolved to offsets, attached with one id per function
//! (the attach cookie, the key of the per-function map), and, for the exporter running for
//! days, re-attached when a target binary is replaced on disk (uprobes belong to an inode: a
//! deployed new build would silently stop being counted) or on SIGHUP, and detached one by one
//! by the overhead guard. Function ids stay stable across re-attachment, so series keep
//! counting.

use std::{
    collections::{BTreeSet, HashMap},
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::Result;

use crate::{
    error::{Failure, fail},
    functions::{
        calibration::ReturnMechanism,
        exit_plan::{Plan, Probed, plan},
        symbols::{
            ProbeSpec, Resolution, ResolvedFunction, elf::FileFunctions,
            resolve as resolve_functions, target::file_identity, x86::ProbeCheck,
        },
        unwinding::{self, Image, ReturnMode, ReturnProbe, TargetReturns},
    },
    session::bpf::{AttachMode, Session},
    ui::progress::Progress,
};

/// Functions from which attaching shows progress on a terminal.
const ATTACH_PROGRESS_FROM: usize = 200;
/// Functions attached per call while progress is shown. Each call keeps the session's
/// exit-before-entry order for its own functions, and links accumulate in the session, so
/// detaching is unchanged.
const ATTACH_BATCH: usize = 100;

/// What to probe and how: the specs, where they resolve, how returns are seen, and whether
/// attaching says what it decided.
pub struct ProbeRequest {
    pub specs: Vec<ProbeSpec>,
    /// `-p`: the processes probed, through whose mappings library names resolve; empty: every
    /// process that maps a target.
    pub processes: Vec<u32>,
    pub returns: ReturnMode,
    /// What runs the probed functions (`--returns auto` reads it).
    pub image: Image,
    pub verbose: bool,
}

pub struct Probes {
    /// What was asked for; a configuration reload replaces its specs.
    request: ProbeRequest,
    /// The return mechanism of each attached target, and why.
    target_returns: Vec<TargetReturns>,
    /// `(target, demangled symbol)` by function id.
    functions: Vec<(String, String)>,
    /// How each function's returns are probed, by function id (the calibration's key).
    mechanisms: Vec<Option<ReturnMechanism>>,
    /// Function ids the overhead guard detached; never re-attached.
    detached: BTreeSet<u32>,
    /// Function ids whose first instruction the kernel single-steps.
    single_step: BTreeSet<u32>,
    /// Each attached target and the file identity it had.
    targets: Vec<(PathBuf, Option<(u64, u64)>)>,
    pub reattachments: u64,
    /// Detached by `serve --duty-cycle` until `resume`: re-attachments meanwhile only
    /// re-resolve.
    paused: bool,
    /// What `resume` attaches while no target changed on disk: resolving parses every
    /// target's symbols, which a duty cycle should not pay each period.
    resolution: Option<Resolution>,
}

impl Probes {
    /// Resolves the `-u` specs and attaches them.
    pub fn attach(session: &mut Session, request: ProbeRequest) -> Result<Self> {
        let resolved = resolve_functions(&request.specs, &request.processes)?;
        Self::attach_resolution(session, request, resolved)
    }

    /// Attaches `request`'s specs as `resolved` (by [`crate::functions::symbols::resolve`] over
    /// the same specs and processes), which start-up reads beside the BPF programs' loading.
    pub fn attach_resolution(
        session: &mut Session,
        request: ProbeRequest,
        resolved: Resolution,
    ) -> Result<Self> {
        let mut probes = Self {
            request,
            target_returns: Vec::new(),
            functions: Vec::new(),
            mechanisms: Vec::new(),
            detached: BTreeSet::new(),
            single_step: BTreeSet::new(),
            targets: Vec::new(),
            reattachments: 0,
            paused: false,
            resolution: None,
        };
        probes.attach_resolved(session, resolved)?;
        Ok(probes)
    }

    /// `(target, symbol)` by function id, for reports.
    pub fn functions(&self) -> &[(String, String)] {
        &self.functions
    }

    /// Each attached target's return mechanism and why.
    pub fn target_returns(&self) -> &[TargetReturns] {
        &self.target_returns
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

    /// Whether the kernel single-steps the first instruction of function `id` (part 5 of
    /// issue 10: each call then costs a second trap).
    pub fn entry_single_step(&self, id: u32) -> bool {
        self.single_step.contains(&id)
    }

    fn attach_resolved(&mut self, session: &mut Session, resolved: Resolution) -> Result<()> {
        let Resolution { functions, files } = resolved;
        let mut targets: Vec<PathBuf> = Vec::new();
        for function in &functions {
            if !targets.contains(&function.target) {
                targets.push(function.target.clone());
            }
        }
        // A duty cycle's next ON span probes the same targets in the same processes: the
        // decision (which reads every object of the image, seconds with -a) stands.
        let same_targets = self.target_returns.len() == targets.len()
            && targets.iter().all(|target| {
                let name = target.display().to_string();
                self.target_returns.iter().any(|known| known.target == name)
            });
        let reuse = self.paused && same_targets;
        let decisions = if reuse {
            self.target_returns.clone()
        } else {
            let mut decisions =
                unwinding::decide(self.request.returns, &targets, &self.request.image);
            go_returns(&mut decisions, &files);
            decisions
        };
        let exit_targets: BTreeSet<PathBuf> = targets
            .iter()
            .filter(|target| {
                decisions.iter().any(|decision| {
                    decision.return_probe == ReturnProbe::Exit
                        && decision.target == target.display().to_string()
                })
            })
            .cloned()
            .collect();
        if self.request.processes.is_empty() && !session.follows_processes() {
            warn_self_probed(&targets);
        }
        let mut candidates: Vec<(u32, ResolvedFunction)> = Vec::new();
        let mut skipped: Vec<(String, String)> = Vec::new();
        // Go functions whose calls the goroutine probes cannot follow (`symbols::go`).
        let mut go_skipped: Vec<(String, String)> = Vec::new();
        for function in functions {
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
            match refusal(&function, !exit_targets.contains(&function.target)) {
                Some(why) if function.symbol.go => go_skipped.push((function.display.clone(), why)),
                Some(why) => skipped.push((function.display.clone(), why)),
                None => candidates.push((id, function)),
            }
        }
        if (!skipped.is_empty() || !go_skipped.is_empty()) && candidates.is_empty() {
            return Err(nothing_probeable(&skipped, &go_skipped));
        }
        self.single_step = candidates
            .iter()
            .filter(|(_, function)| function.symbol.entry_probe == Some(ProbeCheck::SingleStep))
            .map(|(id, _)| *id)
            .collect();
        warn_single_step(&candidates, &self.single_step);

        // Read before anything is attached: with -a, topdown itself may map a probed file, and
        // reading every object of the image while its own calls trap took minutes.
        // Go's panics and Goexit end at the runtime hooks; other exit-probed targets need
        // catch points.
        let unwinding_targets: BTreeSet<&PathBuf> = exit_targets
            .iter()
            .filter(|target| files.get(*target).is_none_or(|file| file.go.is_none()))
            .collect();
        let catches: Option<Vec<(PathBuf, u64)>> = (!unwinding_targets.is_empty()).then(|| {
            // Unwinding can end anywhere in the image: catch points in every object of it.
            // One per file: uprobes belong to an inode, however the file was reached.
            let mut objects: Vec<PathBuf> = Vec::new();
            let mut files = std::collections::BTreeSet::new();
            for target in &unwinding_targets {
                for object in unwinding::objects_of(target, &self.request.image) {
                    if files.insert(file_identity(&object).ok_or_else(|| object.clone())) {
                        objects.push(object);
                    }
                }
            }
            let catches = unwinding::catch_points(&objects);
            if self.request.verbose {
                for (object, offset, name) in &catches {
                    eprintln!(
                        "topdown: unwinding ends at {name} in {} ({offset:#x})",
                        object.display()
                    );
                }
            }
            catches
                .into_iter()
                .map(|(object, offset, _)| (object, offset))
                .collect()
        });

        // Attached before a held command execs, so none of its calls are missed.
        let started = Instant::now();
        // The Go runtime hooks first: a goroutine switch between a function's entry and its
        // return must not go unseen.
        let mut go_targets: Vec<&PathBuf> = Vec::new();
        for (_, function) in candidates.iter().filter(|(_, function)| function.symbol.go) {
            if !go_targets.contains(&&function.target) {
                go_targets.push(&function.target);
            }
        }
        for target in go_targets {
            if let Some(runtime) = files.get(target).and_then(|file| file.go.as_ref()) {
                log::info!(
                    "{}: Go {}, runtime hooks at {:x?}",
                    target.display(),
                    runtime.version,
                    runtime.hooks
                );
                session.attach_go_runtime(target, &runtime.hooks, &self.request.processes)?;
            }
        }
        let mut mode = None;
        if !candidates.is_empty() {
            match self.attach_planned(session, &candidates, &files, &exit_targets) {
                Ok(attached) => mode = Some(attached),
                Err(err) => {
                    // The pre-check missed something the kernel refuses: find the functions
                    // whose probes fail, skip them and plan the rest again.
                    let failing = failing_functions(
                        session,
                        &candidates,
                        &files,
                        &exit_targets,
                        &self.request.processes,
                    );
                    // None failing alone, or all of them: not a matter of single functions.
                    if failing.is_empty() || failing.len() == candidates.len() {
                        return Err(err);
                    }
                    let reason = format!("{err:#}");
                    for index in failing.iter().rev() {
                        let (_, function) = candidates.remove(*index);
                        skipped.push((function.display, reason.clone()));
                    }
                    if candidates.is_empty() {
                        return Err(nothing_probeable(&skipped, &go_skipped));
                    }
                    mode =
                        Some(self.attach_planned(session, &candidates, &files, &exit_targets)?);
                }
            }
        }
        warn_skipped(&go_skipped, "Go ", "that cannot be followed");
        warn_skipped(&skipped, "", "that cannot be probed safely");
        if !reuse {
            self.report_returns(&decisions);
        }
        if let Some(catches) = &catches {
            let failed = session.attach_catch_points(catches, &self.request.processes)?;
            if let Some(first) = failed.first() {
                eprintln!(
                    "topdown: {} catch point{} not attached (first: {first}); calls unwound there count as missed returns",
                    failed.len(),
                    if failed.len() == 1 { "" } else { "s" }
                );
            }
            if let Err(err) = session.attach_thread_exit() {
                eprintln!(
                    "topdown: {err:#}: calls a pthread_exit or cancellation unwinds are counted as missed returns"
                );
            }
        }
        self.target_returns = decisions;
        let mut targets: Vec<PathBuf> = Vec::new();
        for (_, function) in &candidates {
            if !targets.contains(&function.target) {
                targets.push(function.target.clone());
            }
        }
        for (id, function) in &candidates {
            let id = *id as usize;
            if self.mechanisms.len() <= id {
                self.mechanisms.resize(id + 1, None);
            }
            self.mechanisms[id] = ReturnMechanism::of(
                !exit_targets.contains(&function.target),
                function.symbol.exits.as_deref(),
            );
        }
        let loading = session.take_program_load_time();
        eprintln!(
            "topdown: probing {} function{} in {} binar{} ({}) attached in {:.1} ms \
             ({:.1} ms of it loading the probe programs)",
            candidates.len(),
            if candidates.len() == 1 { "" } else { "s" },
            targets.len(),
            if targets.len() == 1 { "y" } else { "ies" },
            match mode {
                Some(AttachMode::Multi) => "uprobe.multi",
                Some(AttachMode::PerPoint) => "one uprobe per function",
                None => "nothing to attach",
            },
            started.elapsed().as_secs_f64() * 1e3,
            loading.as_secs_f64() * 1e3
        );
        self.targets = targets
            .into_iter()
            .map(|path| {
                let id = file_identity(&path);
                (path, id)
            })
            .collect();
        Ok(())
    }

    /// Plans `candidates`' probes, fills the exit maps and attaches, with progress for many.
    fn attach_planned(
        &self,
        session: &mut Session,
        candidates: &[(u32, ResolvedFunction)],
        files: &HashMap<PathBuf, FileFunctions>,
        exit_targets: &BTreeSet<PathBuf>,
    ) -> Result<AttachMode> {
        let plan = plan_of(candidates, files, exit_targets);
        session.set_exit_maps(&plan)?;
        // Shown only for many functions (a glob over a large binary), where attaching takes
        // seconds; without a terminal it is one call, as before.
        let progress = (plan.functions.len() >= ATTACH_PROGRESS_FROM).then(|| {
            Progress::counting("attaching probes", plan.functions.len() as u64, "functions")
        });
        let batch = match &progress {
            Some(progress) if progress.is_visible() => ATTACH_BATCH,
            _ => plan.functions.len().max(1),
        };
        let mut mode = AttachMode::PerPoint;
        let mut attached = 0;
        for chunk in plan.functions.chunks(batch) {
            match session.attach_functions(chunk, &self.request.processes) {
                Ok(chunk_mode) => mode = chunk_mode,
                Err(err) => {
                    // Leave nothing of this attempt behind: the caller may retry without
                    // the failing functions.
                    if attached > 0 {
                        session.detach_functions()?;
                    }
                    return Err(err);
                }
            }
            attached += chunk.len();
            if let Some(progress) = &progress {
                progress.inc(chunk.len() as u64);
            }
        }
        Ok(mode)
    }

    /// One line per target with `-v`; otherwise one summary line.
    fn report_returns(&self, decisions: &[TargetReturns]) {
        if decisions.is_empty() {
            return;
        }
        if self.request.verbose {
            for decision in decisions {
                eprintln!(
                    "topdown: returns of {}: {} ({})",
                    decision.target,
                    match decision.return_probe {
                        ReturnProbe::Uretprobe => "uretprobes",
                        ReturnProbe::Exit => "exit-instruction probes",
                    },
                    decision.reason
                );
            }
            return;
        }
        let exits = decisions
            .iter()
            .filter(|decision| decision.return_probe == ReturnProbe::Exit)
            .count();
        let uretprobes = decisions.len() - exits;
        eprintln!(
            "topdown: returns: {uretprobes} target{} with uretprobes, {exits} with exit-instruction probes (--returns {}; -v says why)",
            if uretprobes == 1 { "" } else { "s" },
            match self.request.returns {
                ReturnMode::Auto => "auto",
                ReturnMode::Uretprobe => "uretprobe",
                ReturnMode::Exit => "exit",
            }
        );
    }

    /// Resolves the specs again, then detaches everything and attaches that resolution. A
    /// spec that no longer resolves fails before anything is detached.
    pub fn reattach(&mut self, session: &mut Session, why: &str) -> Result<()> {
        let resolved = resolve_functions(&self.request.specs, &self.request.processes)?;
        self.reattach_resolved(session, resolved, why)
    }

    fn reattach_resolved(
        &mut self,
        session: &mut Session,
        resolved: Resolution,
        why: &str,
    ) -> Result<()> {
        eprintln!("topdown: re-attaching function probes: {why}");
        session.detach_functions()?;
        // Paused by the duty cycle: its next ON span attaches this resolution.
        if self.paused {
            self.resolution = Some(resolved);
        } else {
            self.resolution = None;
            self.attach_resolved(session, resolved)?;
        }
        self.reattachments += 1;
        Ok(())
    }

    /// A new set of `-u` specs (a configuration reload): functions already known keep their
    /// ids (and series); new ones get new ids; those no longer matched stop being probed.
    /// Specs that do not resolve fail before anything changes, so a typo keeps the running
    /// probes.
    pub fn replace_specs(&mut self, session: &mut Session, specs: Vec<ProbeSpec>) -> Result<()> {
        let resolved = resolve_functions(&specs, &self.request.processes)?;
        self.request.specs = specs;
        self.reattach_resolved(session, resolved, "configuration reloaded")
    }

    /// Targets whose file is now another one (replaced by a deploy, a package upgrade).
    pub fn replaced_targets(&self) -> Vec<PathBuf> {
        self.targets
            .iter()
            .filter(|(path, attached)| {
                let now = file_identity(path);
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

    /// `serve --duty-cycle`'s OFF span: detaches every function probe. Function ids stay, so
    /// series keep counting when `resume` attaches again.
    pub fn pause(&mut self, session: &mut Session) -> Result<()> {
        self.paused = true;
        session.detach_functions()
    }

    /// The next ON span: attaches the last resolution, or resolves the specs again where a
    /// target was replaced on disk meanwhile (then the new file is probed). If that fails,
    /// nothing stays attached and the probes stay paused.
    pub fn resume(&mut self, session: &mut Session) -> Result<()> {
        let resolved = match self.resolution.take() {
            Some(resolved) if self.replaced_targets().is_empty() => Ok(resolved),
            _ => resolve_functions(&self.request.specs, &self.request.processes),
        };
        let attached = resolved.and_then(|resolved| {
            self.resolution = Some(resolved.clone());
            self.attach_resolved(session, resolved)
        });
        match attached {
            Ok(()) => {
                self.paused = false;
                Ok(())
            }
            Err(err) => {
                // A partial attach (the first binaries of several) is undone.
                if let Err(detach) = session.detach_functions() {
                    log::warn!("undoing a partial attach: {detach:#}");
                }
                Err(err)
            }
        }
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }
}

/// Go binaries get exit-instruction probes whatever `--returns` says: a uretprobe's return
/// address is copied away when the runtime moves a goroutine's stack, corrupting the program.
fn go_returns(decisions: &mut [TargetReturns], files: &HashMap<PathBuf, FileFunctions>) {
    for decision in decisions {
        let go = files
            .iter()
            .find(|(path, _)| path.display().to_string() == decision.target)
            .and_then(|(_, file)| file.go.as_ref());
        if let Some(go) = go {
            decision.return_probe = ReturnProbe::Exit;
            decision.reason = format!(
                "a Go binary ({}): uretprobes corrupt goroutine stacks, which the runtime moves",
                go.version
            );
        }
    }
}

/// `exit_targets`: the targets whose returns are caught by exit-instruction probes (the rest
/// by uretprobes).
fn plan_of(
    candidates: &[(u32, ResolvedFunction)],
    files: &HashMap<PathBuf, FileFunctions>,
    exit_targets: &BTreeSet<PathBuf>,
) -> Plan {
    let probed: Vec<Probed<'_>> = candidates
        .iter()
        .map(|(id, function)| Probed {
            function,
            id: *id,
            uretprobe: !exit_targets.contains(&function.target),
        })
        .collect();
    plan(&probed, files)
}

/// Why the kernel would refuse a probe of `function` (x86-64 rules,
/// `crate::functions::symbols::x86`).
fn refusal(function: &ResolvedFunction, uretprobes: bool) -> Option<String> {
    if let Some(ProbeCheck::Refused(why)) = &function.symbol.entry_probe {
        return Some((*why).to_owned());
    }
    if uretprobes {
        return function.symbol.reads_return_address.then(|| {
            "reads its own return address, which a uretprobe replaces with the kernel's \
             trampoline (setjmp-like; --returns exit probes it)"
                .to_owned()
        });
    }
    function
        .symbol
        .exits
        .iter()
        .flatten()
        .find_map(|exit| match &exit.probe {
            ProbeCheck::Refused(why) => Some(format!(
                "exit at +{:#x}: {why}",
                exit.address.wrapping_sub(function.symbol.address)
            )),
            _ => None,
        })
}

/// Machine-wide probes (`-a`) go into every process that maps a probed file, topdown's own
/// included (uprobe.multi has no way to leave one process out): each of topdown's own calls of
/// a probed function then traps. Says so when topdown maps a target itself (a library it links,
/// or a copy it was given through `LD_LIBRARY_PATH`).
fn warn_self_probed(targets: &[PathBuf]) {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let mapped: BTreeSet<(u64, u64)> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.starts_with('/'))
        .filter_map(|path| file_identity(Path::new(path)))
        .collect();
    for target in targets {
        if file_identity(target).is_some_and(|id| mapped.contains(&id)) {
            eprintln!(
                "topdown: topdown itself maps {}: machine-wide probes run in topdown too, and with \
                 many functions probed it slows down (probe a copy the programs load through \
                 LD_LIBRARY_PATH, or trace them with -- CMD or -p, whose probes stay in their \
                 processes)",
                target.display()
            );
        }
    }
}

/// `function (why), ...`: skipped functions as the warnings and errors list them.
fn skipped_list(functions: &[(String, String)]) -> String {
    functions
        .iter()
        .map(|(name, why)| format!("{name} ({why})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Warns that the `skipped` functions (`kind`: `"Go "` or empty) are not probed, and `why`.
fn warn_skipped(skipped: &[(String, String)], kind: &str, why: &str) {
    if skipped.is_empty() {
        return;
    }
    eprintln!(
        "topdown: skipped {} {kind}function{} {why}: {}",
        skipped.len(),
        if skipped.len() == 1 { "" } else { "s" },
        skipped_list(skipped)
    );
}

fn nothing_probeable(
    skipped: &[(String, String)],
    go_skipped: &[(String, String)],
) -> anyhow::Error {
    let mut reasons = Vec::new();
    if !skipped.is_empty() {
        reasons.push(format!("the kernel refuses {}", skipped_list(skipped)));
    }
    if !go_skipped.is_empty() {
        reasons.push(format!(
            "Go functions that cannot be followed: {}",
            skipped_list(go_skipped)
        ));
    }
    fail(
        Failure::Usage,
        format!(
            "no function can be probed: {}; choose other functions",
            reasons.join("; ")
        ),
    )
}

/// Says, before attaching, how many probed functions start with an instruction the kernel
/// cannot emulate (x86-64 emulates nop, push, jmp, call and jcc: `branch_setup_xol_ops` and
/// `push_setup_xol_ops` in arch/x86/kernel/uprobes.c); `-v` lists them.
fn warn_single_step(candidates: &[(u32, ResolvedFunction)], single_step: &BTreeSet<u32>) {
    if single_step.is_empty() {
        return;
    }
    eprintln!(
        "topdown: {} of {} probed functions start with an instruction the kernel single-steps \
         instead of emulating (e.g. endbr64, mov, sub): each of their calls takes a second trap, \
         several times an emulated probe's cost (about 10x on the 2-vCPU VM of issue 10; not \
         measured here); -v lists them",
        single_step.len(),
        candidates.len()
    );
    for (id, function) in candidates {
        if single_step.contains(id) {
            log::info!(
                "single-stepped entry: {} in {}",
                function.display,
                function.target.display()
            );
        }
    }
}

/// Indices (ascending) of the functions whose probes the kernel refuses, found by attaching
/// halves of `candidates` and detaching them again.
fn failing_functions(
    session: &mut Session,
    candidates: &[(u32, ResolvedFunction)],
    files: &HashMap<PathBuf, FileFunctions>,
    exit_targets: &BTreeSet<PathBuf>,
    processes: &[u32],
) -> Vec<usize> {
    let mut failing = Vec::new();
    let mut pending: Vec<std::ops::Range<usize>> = Vec::new();
    pending.push(0..candidates.len());
    while let Some(range) = pending.pop() {
        let plan = plan_of(&candidates[range.clone()], files, exit_targets);
        if session.attach_functions(&plan.functions, processes).is_ok() {
            let _ = session.detach_functions();
            continue;
        }
        if range.len() == 1 {
            failing.push(range.start);
            continue;
        }
        let middle = range.start + range.len() / 2;
        pending.push(middle..range.end);
        pending.push(range.start..middle);
    }
    failing.sort_unstable();
    failing
}
