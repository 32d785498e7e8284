//! Following `-- CMD` into every process it creates, so function probes can be scoped to the
//! traced processes (`crate::session::bpf::ProcessLinks`) and no other process pays for them.
//!
//! A forked child starts with a copy of its parent's memory, breakpoints included, but the
//! kernel runs a pid-scoped program only for the process it was attached to: the child needs
//! links of its own before it runs a probed instruction. A tracer thread holds the command
//! with `PTRACE_SEIZE` and `PTRACE_O_TRACEFORK | VFORK | CLONE | EXEC`: the kernel stops every
//! new child before its first user instruction, the tracer creates the child's links, then
//! lets it go. Everything else passes through unchanged: signals are re-delivered as they
//! came, group stops (Ctrl-Z, SIGSTOP) stay stops through `PTRACE_LISTEN` until SIGCONT.
//! What ptrace changes that a program can see: it cannot be traced by another tracer
//! (`gdb -p`, `strace -p`, `PTRACE_TRACEME` fail with EPERM) and `/proc/PID/status` shows
//! topdown as `TracerPid`. A child whose links fail is counted and said at the end.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use anyhow::{Context as _, Result, anyhow};

use crate::session::bpf::ProcessLinks;

/// Exit statuses (as a shell reports them) of processes the tracer thread reaped: its
/// `waitpid(-1)` also collects the command's own exit, which `crate::session::target::reap` looks
/// up here.
static REAPED: Mutex<BTreeMap<u32, i32>> = Mutex::new(BTreeMap::new());

/// The exit status of `pid` if the tracer reaped it.
pub fn reaped(pid: u32) -> Option<i32> {
    REAPED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(&pid)
        .copied()
}

/// What following did.
#[derive(Debug, Default)]
pub struct FollowStats {
    /// Processes probed (the command and every process it created).
    pub processes: AtomicU64,
    /// Processes whose probes could not be attached: their calls are not counted.
    pub unfollowed: AtomicU64,
    pub first_error: Mutex<Option<String>>,
}

/// Follows the held command `pid` so its probes go into its processes only: the tracer and
/// the links it keeps per process. If ptrace is refused (topdown is traced itself, or a
/// security module forbids it), says so and returns `None`: the probes are then attached
/// machine-wide.
pub fn follow_command(pid: u32) -> Option<(Follower, ProcessLinks)> {
    let links = ProcessLinks::new();
    match Follower::start(pid, links.clone()) {
        Ok(follower) => Some((follower, links)),
        Err(err) => {
            eprintln!(
                "topdown: cannot follow the command ({err:#}): its function and USDT probes are \
                 attached machine-wide, so other processes mapping the probed files pay for them too"
            );
            None
        }
    }
}

/// The tracer thread; it ends by itself when no traced process is left.
pub struct Follower {
    stats: Arc<FollowStats>,
}

impl Follower {
    /// Seizes `pid` (held before its exec by `crate::session::target::PendingCommand`) and follows
    /// it and its descendants, keeping `links` on each of their processes.
    pub fn start(pid: u32, links: ProcessLinks) -> Result<Self> {
        let stats = Arc::new(FollowStats::default());
        let (seized_tx, seized_rx) = std::sync::mpsc::channel();
        let thread_stats = stats.clone();
        let thread_links = links.clone();
        std::thread::Builder::new()
            .name("topdown-follow".to_owned())
            .spawn(move || {
                // The thread that seizes is the tracer: only it can wait for and resume the
                // traced tasks.
                let seized = seize(pid);
                let ok = seized.is_ok();
                let _ = seized_tx.send(seized);
                if ok {
                    trace(pid, &thread_links, &thread_stats);
                }
            })
            .context("starting the tracer thread")?;
        seized_rx
            .recv()
            .map_err(|_| anyhow!("the tracer thread ended before seizing the command"))??;
        links.follow(pid)?;
        stats.processes.fetch_add(1, Ordering::Relaxed);
        Ok(Self { stats })
    }

    pub fn stats(&self) -> &FollowStats {
        &self.stats
    }

    /// One line on stderr when some process could not be probed.
    pub fn report(&self) {
        let unfollowed = self.stats.unfollowed.load(Ordering::Relaxed);
        if unfollowed == 0 {
            return;
        }
        let first = self
            .stats
            .first_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
            .unwrap_or_default();
        eprintln!(
            "topdown: {unfollowed} of {} processes of the command ran without their function probes \
             (first: {first}): their calls are not counted",
            self.stats.processes.load(Ordering::Relaxed) + unfollowed
        );
    }
}

fn seize(pid: u32) -> Result<()> {
    let options = libc::PTRACE_O_TRACEFORK
        | libc::PTRACE_O_TRACEVFORK
        | libc::PTRACE_O_TRACECLONE
        | libc::PTRACE_O_TRACEEXEC;
    // SAFETY: ptrace with no memory arguments.
    let done = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            options as usize as *mut libc::c_void,
        )
    };
    if done != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("PTRACE_SEIZE of the command (pid {pid})"));
    }
    Ok(())
}

/// The thread group of task `tid` (`Tgid:` of /proc/TID/status).
fn tgid_of(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))
        .and_then(|value| value.trim().parse().ok())
}

fn event_message(tid: libc::pid_t) -> Option<u32> {
    let mut message: libc::c_ulong = 0;
    // SAFETY: the kernel writes one c_ulong into `message`.
    let done = unsafe {
        libc::ptrace(
            libc::PTRACE_GETEVENTMSG,
            tid,
            std::ptr::null_mut::<libc::c_void>(),
            &raw mut message,
        )
    };
    (done == 0).then_some(message as u32)
}

fn resume(request: libc::c_uint, tid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: ptrace with no memory arguments; a task that vanished meanwhile gives ESRCH,
    // and its exit is reported by waitpid.
    unsafe {
        libc::ptrace(
            request,
            tid,
            std::ptr::null_mut::<libc::c_void>(),
            signal as usize as *mut libc::c_void,
        );
    }
}

fn note_failure(stats: &FollowStats, error: String) {
    stats.unfollowed.fetch_add(1, Ordering::Relaxed);
    let mut first = stats
        .first_error
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    first.get_or_insert(error);
}

/// A task appeared (its creator's event or its own first stop, whichever came first): a new
/// process gets its links before it is resumed.
fn new_task(tid: u32, processes: &mut HashSet<u32>, links: &ProcessLinks, stats: &FollowStats) {
    if processes.contains(&tid) || tgid_of(tid) != Some(tid) {
        return;
    }
    match links.follow(tid) {
        Ok(()) => {
            processes.insert(tid);
            stats.processes.fetch_add(1, Ordering::Relaxed);
        }
        Err(err) => note_failure(stats, format!("pid {tid}: {err:#}")),
    }
}

fn trace(command: u32, links: &ProcessLinks, stats: &FollowStats) {
    let mut processes: HashSet<u32> = HashSet::from([command]);
    // Tasks whose first stop was seen: the command was seized running, so it has none.
    let mut started: HashSet<u32> = HashSet::from([command]);
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes one int.
        let tid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
        if tid < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                // No child and no tracee left.
                _ => return,
            }
        }
        let task = tid as u32;
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            started.remove(&task);
            if processes.remove(&task) {
                links.forget(task);
            }
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
            REAPED
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .insert(task, code);
            continue;
        }
        if !libc::WIFSTOPPED(status) {
            continue;
        }
        let signal = libc::WSTOPSIG(status);
        let mut deliver = 0;
        match status >> 16 {
            libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK | libc::PTRACE_EVENT_CLONE => {
                if let Some(child) = event_message(tid) {
                    new_task(child, &mut processes, links, stats);
                }
            }
            libc::PTRACE_EVENT_EXEC => {
                // After an exec from another thread than the leader, the task a link holds is
                // gone: the new image would get no breakpoints.
                if event_message(tid).is_some_and(|former| former != task)
                    && processes.contains(&task)
                    && let Err(err) = links.renew(task)
                {
                    note_failure(stats, format!("pid {task} after exec: {err:#}"));
                }
            }
            libc::PTRACE_EVENT_STOP => {
                if started.insert(task) {
                    // A new task's first stop, before its first instruction.
                    new_task(task, &mut processes, links, stats);
                } else if matches!(
                    signal,
                    libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
                ) {
                    // A group stop: stays stopped, as without topdown, until SIGCONT.
                    resume(libc::PTRACE_LISTEN as libc::c_uint, tid, 0);
                    continue;
                }
            }
            _ => {
                if started.insert(task) && signal == libc::SIGSTOP {
                    // The first stop of a task attached the older way: no signal was sent.
                    new_task(task, &mut processes, links, stats);
                } else {
                    deliver = signal;
                }
            }
        }
        resume(libc::PTRACE_CONT as libc::c_uint, tid, deliver);
    }
}
