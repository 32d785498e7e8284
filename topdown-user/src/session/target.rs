//! What `topdown stat` traces: every task (`-a`), given processes (`-p`), or a command it starts
//! (`-- CMD`), and how it learns that they are gone.
//!
//! A command is forked first and held before `execve` until its pid is in the BPF tracked set,
//! so not a single count of it (or of a child it forks at once) is missed.

use std::{
    ffi::{CString, OsStr, OsString},
    fs,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use tokio::io::unix::AsyncFd;

use crate::error::{Failure, fail, read_or_fail};

/// The scope the user asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    SystemWide,
    Pids(Vec<u32>),
    Command(Vec<OsString>),
}

impl Scope {
    /// How reports name the scope.
    pub fn describe(&self) -> String {
        match self {
            Scope::SystemWide => "system-wide".to_owned(),
            Scope::Pids(pids) => format!(
                "pid {}",
                pids.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Scope::Command(argv) => format!(
                "command: {}",
                argv.iter()
                    .map(|arg| arg.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        }
    }
}

/// Checks that each `-p` pid exists and returns the process (tgid) of each, so that giving a
/// thread id traces its whole process, as perf's `-p` does.
pub fn resolve_pids(pids: &[u32]) -> Result<Vec<u32>> {
    let mut tgids = Vec::with_capacity(pids.len());
    for &pid in pids {
        let status_path = format!("/proc/{pid}/status");
        let status = read_or_fail(&status_path, Failure::NoSuchProcess, |_| {
            format!("no such process: {pid} (nothing at /proc/{pid}); check the -p list")
        })?;
        let tgid = status
            .lines()
            .find_map(|line| line.strip_prefix("Tgid:"))
            .and_then(|value| value.trim().parse().ok())
            .with_context(|| format!("{status_path} has no Tgid line"))?;
        if !tgids.contains(&tgid) {
            tgids.push(tgid);
        }
    }
    Ok(tgids)
}

/// A process that has exited can be awaited through its pidfd.
pub struct ProcessWatch {
    pid: u32,
    pidfd: AsyncFd<OwnedFd>,
}

impl ProcessWatch {
    /// Watches an existing process. `None` when it is already gone.
    pub fn new(pid: u32) -> Result<Option<Self>> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ESRCH) {
                return Ok(None);
            }
            return Err(err).with_context(|| format!("pidfd_open({pid})"));
        }
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        // SAFETY: the AsyncFd owns the fd, so it stays open as long as it is registered.
        let pidfd = unsafe { AsyncFd::register(fd) }
            .map_err(|err| anyhow::anyhow!("registering a pidfd with the event loop: {err}"))?;
        Ok(Some(Self { pid, pidfd }))
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Resolves when the process has exited (a pidfd becomes readable then).
    pub async fn exited(&self) -> Result<()> {
        let _guard = self.pidfd.readable().await.context("waiting on a pidfd")?;
        Ok(())
    }
}

/// A forked command waiting for [`PendingCommand::release`] before it execs.
pub struct PendingCommand {
    pid: u32,
    program: PathBuf,
    go: OwnedFd,
    exec_error: OwnedFd,
}

impl PendingCommand {
    /// Forks the command; it blocks before `execve` until released.
    pub fn spawn(argv: &[OsString]) -> Result<Self> {
        let Some(name) = argv.first() else {
            return Err(fail(Failure::Usage, "no command given after --"));
        };
        let program = find_program(name)?;
        let program_c = cstring(program.as_os_str())?;
        let args: Vec<CString> = argv.iter().map(|arg| cstring(arg)).collect::<Result<_>>()?;
        let env: Vec<CString> = std::env::vars_os()
            .map(|(key, value)| {
                let mut pair = key;
                pair.push("=");
                pair.push(value);
                cstring(&pair)
            })
            .collect::<Result<_>>()?;
        let mut arg_ptrs: Vec<*const libc::c_char> = args.iter().map(|arg| arg.as_ptr()).collect();
        arg_ptrs.push(std::ptr::null());
        let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|pair| pair.as_ptr()).collect();
        env_ptrs.push(std::ptr::null());

        let (go_read, go_write) = pipe()?;
        let (error_read, error_write) = pipe()?;
        // SAFETY: after fork the child only calls async-signal-safe functions (read, write,
        // close, execve, _exit) on memory prepared before the fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error()).context("fork");
        }
        if pid == 0 {
            // Child.
            unsafe {
                libc::close(go_write.as_raw_fd());
                libc::close(error_read.as_raw_fd());
                let mut byte = 0u8;
                let got = libc::read(go_read.as_raw_fd(), (&raw mut byte).cast(), 1);
                if got != 1 {
                    // topdown went away without releasing us: do not run untraced.
                    libc::_exit(126);
                }
                libc::close(go_read.as_raw_fd());
                // Rust's runtime ignores SIGPIPE in topdown, and an ignored signal stays
                // ignored across execve: the command would get EPIPE where it should die
                // (`sort | head` printing "write error"). Back to the default, as
                // std::process::Command does.
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::execve(program_c.as_ptr(), arg_ptrs.as_ptr(), env_ptrs.as_ptr());
                let errno = *libc::__errno_location();
                let bytes = errno.to_ne_bytes();
                libc::write(error_write.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
                libc::_exit(127);
            }
        }
        drop(go_read);
        drop(error_write);
        Ok(Self {
            pid: pid as u32,
            program,
            go: go_write,
            exec_error: error_read,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The program it will exec.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Lets the command exec. Fails (after reaping it) if `execve` failed.
    pub fn release(self) -> Result<u32> {
        let byte = [1u8];
        // SAFETY: writing one byte from a valid buffer to a pipe we own.
        let wrote = unsafe { libc::write(self.go.as_raw_fd(), byte.as_ptr().cast(), 1) };
        if wrote != 1 {
            return Err(std::io::Error::last_os_error()).context("releasing the command");
        }
        drop(self.go);
        let mut errno = [0u8; 4];
        // The error pipe is close-on-exec: EOF means the exec succeeded.
        let got = loop {
            // SAFETY: reading into a valid 4-byte buffer from a pipe we own.
            let got =
                unsafe { libc::read(self.exec_error.as_raw_fd(), errno.as_mut_ptr().cast(), 4) };
            if got < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
                continue;
            }
            break got;
        };
        if got == 4 {
            let mut status = 0;
            // SAFETY: reaping our own child.
            unsafe { libc::waitpid(self.pid as libc::pid_t, &mut status, 0) };
            let err = std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno));
            return Err(fail(
                Failure::CommandNotFound,
                format!("cannot execute {}: {err}", self.program.display()),
            ));
        }
        Ok(self.pid)
    }
}

/// Reaps an exited child and returns its exit status as a shell reports it (128+signal).
/// Waits for the command `pid` to end; its exit status (128 + signal if a signal ended it).
pub async fn wait_command(pid: u32) -> u8 {
    loop {
        if let Some(status) = reap(pid) {
            return u8::try_from(status).unwrap_or(u8::MAX);
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

pub fn reap(pid: u32) -> Option<i32> {
    // The tracer thread following the command (`crate::session::follow`) reaps with waitpid(-1).
    if let Some(status) = crate::session::follow::reaped(pid) {
        return Some(status);
    }
    let mut status = 0;
    // SAFETY: reaping our own child without blocking.
    let got = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
    if got != pid as libc::pid_t {
        return crate::session::follow::reaped(pid);
    }
    if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Some(128 + libc::WTERMSIG(status))
    } else {
        None
    }
}

/// Sends a signal to a process (forwarding Ctrl-C/SIGTERM to the traced command).
pub fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(pid as libc::pid_t, signal) };
}

/// Resolves a command name the way a shell does: a name with a slash is a path, otherwise the
/// first executable match in `$PATH`.
fn find_program(name: &OsStr) -> Result<PathBuf> {
    let not_found = || {
        fail(
            Failure::CommandNotFound,
            format!(
                "command not found: {} (not an executable file{})",
                name.to_string_lossy(),
                if name.as_bytes().contains(&b'/') {
                    ""
                } else {
                    " in $PATH"
                }
            ),
        )
    };
    if name.as_bytes().contains(&b'/') {
        let path = PathBuf::from(name);
        return if is_executable(&path) {
            Ok(path)
        } else {
            Err(not_found())
        };
    }
    let search = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&search)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(not_found)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

fn cstring(text: &OsStr) -> Result<CString> {
    CString::new(text.as_bytes()).map_err(|_| {
        fail(
            Failure::Usage,
            format!("argument contains a NUL byte: {}", text.to_string_lossy()),
        )
    })
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe2");
    }
    // SAFETY: fresh fds we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::failure_of;

    #[test]
    fn missing_commands_and_pids_are_categorised() {
        let err = find_program(OsStr::new("surely-not-a-command-xyz")).unwrap_err();
        assert_eq!(failure_of(&err), Some(Failure::CommandNotFound));
        assert!(
            err.to_string()
                .contains("command not found: surely-not-a-command-xyz")
        );
        assert!(find_program(OsStr::new("sh")).is_ok());
        let err = resolve_pids(&[u32::MAX - 1]).unwrap_err();
        assert_eq!(failure_of(&err), Some(Failure::NoSuchProcess));
    }

    #[test]
    fn a_thread_id_resolves_to_its_process() {
        let me = std::process::id();
        assert_eq!(resolve_pids(&[me, me]).unwrap(), vec![me]);
    }

    #[test]
    fn held_command_runs_only_after_release() {
        let pending = PendingCommand::spawn(&["true".into()]).unwrap();
        let pid = pending.pid();
        assert_eq!(reap(pid), None, "must wait before exec");
        pending.release().unwrap();
        let mut status = 0;
        unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }

    /// The command gets SIGPIPE's default action though topdown's runtime ignores it: a shell
    /// that sends itself SIGPIPE dies of it.
    #[test]
    fn the_command_does_not_inherit_ignored_sigpipe() {
        let pending =
            PendingCommand::spawn(&["sh".into(), "-c".into(), "kill -PIPE $$; exit 0".into()])
                .unwrap();
        let pid = pending.pid();
        pending.release().unwrap();
        let mut status = 0;
        unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGPIPE,
            "SIGPIPE did not end the command: {status:#x}"
        );
    }
}
