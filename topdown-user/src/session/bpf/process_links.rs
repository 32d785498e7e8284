//! Function probes scoped to processes: one uprobe.multi link per probed binary, program and
//! traced process, created straight with `BPF_LINK_CREATE` so a tracer thread
//! (`crate::session::follow`) can add the links of a new child while the child is held, before it
//! runs a probed instruction. A link with a pid puts breakpoints only into that process's memory,
//! and its program runs only for that process's threads (`uprobe_multi_link_filter` and
//! `uprobe_prog_run` in kernel/trace/bpf_trace.c, Linux 6.18): an untraced process, even one
//! of the same binary, pays nothing.
//!
//! The templates (program, file, offsets, cookies) are what `Session::attach_functions`
//! would attach machine-wide; USDT and other per-process probes can register theirs the same
//! way. USDT sites linked one by one (`--usdt-links per-site`, the mechanism of kernels before
//! 6.6) are scoped the same way with a perf uprobe event per site opened for the process: the
//! kernel puts its breakpoint (and raises its semaphore) only in the processes whose
//! mm one of the event's targets has (`uprobe_perf_filter`, kernel/trace/trace_uprobe.c).

use std::{
    collections::BTreeMap,
    ffi::CString,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
    sync::{Arc, Mutex, MutexGuard},
};

use anyhow::{Context as _, Result, anyhow};

/// `BPF_LINK_CREATE` of `enum bpf_cmd` (include/uapi/linux/bpf.h).
const BPF_LINK_CREATE: libc::c_long = 28;
/// `BPF_TRACE_UPROBE_MULTI` of `enum bpf_attach_type`.
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
/// `BPF_F_UPROBE_MULTI_RETURN`: the link's program runs at returns (a uretprobe).
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;

/// `union bpf_attr` as `BPF_LINK_CREATE` reads it for uprobe.multi (`link_create` with its
/// `uprobe_multi` member; the union starts at byte 16).
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    padding: u32,
}

/// One program's probes on one file.
#[derive(Debug)]
pub struct LinkTemplate {
    /// A duplicate of the loaded program's fd.
    program: Arc<OwnedFd>,
    path: CString,
    offsets: Vec<u64>,
    cookies: Vec<u64>,
    /// USDT semaphores (`ref_ctr_offsets`, one per offset), or empty: the kernel raises each
    /// in the linked process only.
    ref_ctr_offsets: Vec<u64>,
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
        Ok(Self {
            program,
            path: CString::new(path.as_os_str().as_bytes())
                .map_err(|_| anyhow!("{} has a NUL byte", path.display()))?,
            offsets: points.iter().map(|(offset, _)| *offset).collect(),
            cookies: points.iter().map(|(_, cookie)| *cookie).collect(),
            ref_ctr_offsets: Vec::new(),
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
        if offsets.len() != self.offsets.len() {
            return Err(anyhow!(
                "{} semaphore offsets for {} probes",
                offsets.len(),
                self.offsets.len()
            ));
        }
        if offsets.iter().any(|offset| *offset != 0) {
            self.ref_ctr_offsets = offsets;
        }
        Ok(self)
    }

    /// The links of these probes for process `pid`: one uprobe.multi link, or per point a
    /// perf link and its event.
    fn links(&self, pid: u32) -> std::io::Result<Vec<OwnedFd>> {
        if !self.per_site {
            return Ok(vec![self.multi_link(pid)?]);
        }
        use std::os::{fd::AsFd as _, unix::ffi::OsStrExt as _};
        let path = Path::new(std::ffi::OsStr::from_bytes(self.path.as_bytes()));
        let mut links = Vec::with_capacity(2 * self.offsets.len());
        for (index, (offset, cookie)) in self.offsets.iter().zip(&self.cookies).enumerate() {
            let point = crate::spans::usdt::attach::Point {
                offset: *offset,
                ref_ctr_offset: self.ref_ctr_offsets.get(index).copied().unwrap_or(0),
                cookie: *cookie,
            };
            let [link, event] = crate::spans::usdt::attach::perf(
                self.program.as_fd(),
                path,
                &point,
                pid,
                self.returns,
            )?;
            links.extend([event, link]);
        }
        Ok(links)
    }

    /// The uprobe.multi link of these probes for process `pid`.
    fn multi_link(&self, pid: u32) -> std::io::Result<OwnedFd> {
        let attr = LinkCreateAttr {
            prog_fd: self.program.as_raw_fd() as u32,
            attach_type: BPF_TRACE_UPROBE_MULTI,
            path: self.path.as_ptr() as u64,
            offsets: self.offsets.as_ptr() as u64,
            cookies: self.cookies.as_ptr() as u64,
            ref_ctr_offsets: if self.ref_ctr_offsets.is_empty() {
                0
            } else {
                self.ref_ctr_offsets.as_ptr() as u64
            },
            cnt: self.offsets.len() as u32,
            multi_flags: if self.returns {
                BPF_F_UPROBE_MULTI_RETURN
            } else {
                0
            },
            pid,
            ..LinkCreateAttr::default()
        };
        // SAFETY: `attr` and the arrays and string it points to outlive the call, and its size
        // is passed with it.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_LINK_CREATE,
                &raw const attr,
                std::mem::size_of::<LinkCreateAttr>() as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd the kernel gave us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    fn describe(&self) -> String {
        format!(
            "{} {} probes in {}",
            self.offsets.len(),
            if self.returns { "return" } else { "entry/exit" },
            self.path.to_string_lossy()
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
