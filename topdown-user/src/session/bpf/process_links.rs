//! Function probes scoped to processes: one uprobe.multi link per probed binary, program and
//! traced process, created straight with `BPF_LINK_CREATE` so a tracer thread
//! (`crate::session::follow`) can add the links of a new child while the child is held, before it
//! runs a probed instruction. A link with a pid puts breakpoints only into that process's memory,
//! and its program runs only for that process's threads (`uprobe_multi_link_filter` and
//! `uprobe_prog_run` in kernel/trace/bpf_trace.c, Linux 6.18): an untraced process, even one
//! of the same binary, pays nothing.
//!
//! The links are made by `crate::spans::usdt::attach` (raw `BPF_LINK_CREATE`). The templates
//! (program, file, offsets, cookies) are what `Session::attach_functions`
//! would attach machine-wide; USDT and other per-process probes can register theirs the same
//! way. USDT sites linked one by one (`--usdt-links per-site`, the mechanism of kernels before
//! 6.6) are scoped the same way with a perf uprobe event per site opened for the process: the
//! kernel puts its breakpoint (and raises its semaphore) only in the processes whose
//! mm one of the event's targets has (`uprobe_perf_filter`, kernel/trace/trace_uprobe.c).

use std::{
    collections::BTreeMap,
    os::fd::{AsFd as _, OwnedFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
};

use anyhow::{Context as _, Result, anyhow};

use crate::spans::usdt::attach::{self, Point};

/// One program's probes on one file.
#[derive(Debug)]
pub struct LinkTemplate {
    /// A duplicate of the loaded program's fd.
    program: Arc<OwnedFd>,
    path: PathBuf,
    /// Offsets, cookies and USDT semaphores' offsets (0: none; the kernel raises each in the
    /// linked process only).
    points: Vec<Point>,
    returns: bool,
    /// One perf uprobe event and perf link per point instead of one uprobe.multi link.
    per_site: bool,
}

impl LinkTemplate {
    pub fn new(
        program: Arc<OwnedFd>,
        path: &Path,
        points: &[(u64, u64)],
        returns: bool,
    ) -> Result<Self> {
        use std::os::unix::ffi::OsStrExt as _;
        if path.as_os_str().as_bytes().contains(&0) {
            return Err(anyhow!("{} has a NUL byte", path.display()));
        }
        Ok(Self {
            program,
            path: path.to_path_buf(),
            points: points
                .iter()
                .map(|(offset, cookie)| Point {
                    offset: *offset,
                    ref_ctr_offset: 0,
                    cookie: *cookie,
                })
                .collect(),
            returns,
            per_site: false,
        })
    }

    /// The same probes, each point linked on its own (a perf uprobe event and a perf link):
    /// the mechanism of kernels without uprobe.multi.
    pub fn per_site(mut self) -> Self {
        self.per_site = true;
        self
    }

    /// The same probes with a semaphore file offset per point (0: none), in point order.
    pub fn with_ref_ctr_offsets(mut self, offsets: Vec<u64>) -> Result<Self> {
        if offsets.len() != self.points.len() {
            return Err(anyhow!(
                "{} semaphore offsets for {} probes",
                offsets.len(),
                self.points.len()
            ));
        }
        for (point, offset) in self.points.iter_mut().zip(offsets) {
            point.ref_ctr_offset = offset;
        }
        Ok(self)
    }

    /// The links of these probes for process `pid`: one uprobe.multi link, or per point a
    /// perf link and its event.
    fn links(&self, pid: u32) -> std::io::Result<Vec<OwnedFd>> {
        let program = self.program.as_fd();
        if !self.per_site {
            return Ok(vec![attach::multi(
                program,
                &self.path,
                &self.points,
                pid,
                self.returns,
            )?]);
        }
        let mut links = Vec::with_capacity(2 * self.points.len());
        for point in &self.points {
            let [link, event] = attach::perf(program, &self.path, point, pid, self.returns)?;
            links.extend([event, link]);
        }
        Ok(links)
    }

    fn describe(&self) -> String {
        format!(
            "{} {} probes in {}",
            self.points.len(),
            if self.returns { "return" } else { "entry/exit" },
            self.path.display()
        )
    }
}

#[derive(Debug, Default)]
struct State {
    /// In attach order (return side first, entries last): links are created in it.
    templates: Vec<LinkTemplate>,
    /// Each followed process's links, in template order (one per uprobe.multi template, two per
    /// point of a per-site one).
    links: BTreeMap<u32, Vec<OwnedFd>>,
}

/// The probes of the traced processes, shared with the tracer thread that follows them.
#[derive(Clone, Debug, Default)]
pub struct ProcessLinks(Arc<Mutex<State>>);

impl ProcessLinks {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere never leaves the state half-changed: every change is one push or
        // one removal.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts probing process `pid` with every template. On failure nothing of it stays.
    pub fn follow(&self, pid: u32) -> Result<()> {
        let mut state = self.state();
        if state.links.contains_key(&pid) {
            return Ok(());
        }
        let mut links = Vec::with_capacity(state.templates.len());
        for template in &state.templates {
            links.extend(
                template
                    .links(pid)
                    .with_context(|| format!("attaching {} to pid {pid}", template.describe()))?,
            );
        }
        state.links.insert(pid, links);
        Ok(())
    }

    /// Stops probing `pid` (it exited).
    pub fn forget(&self, pid: u32) {
        let links = self.state().links.remove(&pid);
        // Closed with the lock released: closing a process's links unregisters every probe of
        // a whole library (300+ ms here), and the report waited on the lock meanwhile. Entries
        // stop before returns, as in `clear`.
        for link in links.into_iter().flatten().rev() {
            drop(link);
        }
    }

    /// Re-creates `pid`'s links: after an exec from another thread than the leader, the
    /// task a link holds is gone, and the new image would get no breakpoints.
    pub fn renew(&self, pid: u32) -> Result<()> {
        self.forget(pid);
        self.follow(pid)
    }

    /// Adds templates and creates their links in every followed process. All or nothing.
    pub fn add(&self, templates: Vec<LinkTemplate>) -> Result<()> {
        let mut state = self.state();
        let pids: Vec<u32> = state.links.keys().copied().collect();
        let mut created: Vec<(u32, Vec<OwnedFd>)> = Vec::new();
        for pid in pids {
            let mut links = Vec::with_capacity(templates.len());
            for template in &templates {
                links.extend(
                    template
                        .links(pid)
                        .with_context(|| format!("attaching {}", template.describe()))?,
                );
            }
            created.push((pid, links));
        }
        for (pid, links) in created {
            if let Some(existing) = state.links.get_mut(&pid) {
                existing.extend(links);
            }
        }
        state.templates.extend(templates);
        Ok(())
    }

    /// Detaches every probe, keeping the followed processes (a later `add` probes them).
    pub fn clear(&self) {
        let mut taken = Vec::new();
        {
            let mut state = self.state();
            for links in state.links.values_mut() {
                taken.push(std::mem::take(links));
            }
            state.templates.clear();
        }
        // With the lock released (`forget`). Entries stop before returns: reverse attach
        // order, as `Session::detach_functions`.
        for links in taken {
            for link in links.into_iter().rev() {
                drop(link);
            }
        }
    }

    /// Takes every process's links (each in reverse attach order: entries stop before
    /// returns, as in `clear`) for the caller to drop; no process is probed from here on.
    pub fn take(&self) -> Vec<OwnedFd> {
        let mut state = self.state();
        state.templates.clear();
        std::mem::take(&mut state.links)
            .into_values()
            .flat_map(|links| links.into_iter().rev())
            .collect()
    }

    /// The processes probed.
    pub fn followed(&self) -> Vec<u32> {
        self.state().links.keys().copied().collect()
    }

    /// How many links are open (tests).
    pub fn link_count(&self) -> usize {
        self.state().links.values().map(Vec::len).sum()
    }
}
