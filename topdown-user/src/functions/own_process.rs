//! Keeping topdown's own process out of machine-wide probes (`-a -u`, `serve -u`).
//!
//! A uprobe is set on a file (an inode), and machine-wide it traps in every process that maps
//! that file. uprobe.multi and perf uprobes can scope a probe to one process but cannot leave
//! one out. When topdown itself maps a probed file (a library it links, such as libc, or a
//! copy it was started with through `LD_LIBRARY_PATH`), each of its own calls of a probed
//! function would trap and run the probe: with a whole library probed, topdown slowed to a
//! crawl while reading symbols and attaching. So, before anything else runs, topdown starts
//! itself again on private copies of those files (other inodes, which no probe is set on):
//! through the dynamic loader, `ld.so --library-path DIR` (ld.so(8)), which searches DIR
//! first for this one start and leaves the environment of what topdown runs untouched. The
//! copies are removed as soon as the new process has mapped them.

use std::{
    ffi::OsString,
    os::unix::{fs::DirBuilderExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
};

use object::read::elf::{ElfFile64, ProgramHeader as _};

use crate::functions::symbols::target::{MapsLine, file_identity, find_target};

/// Set in the restarted process: the directory of the private copies (to remove), which also
/// tells it not to restart again.
const COPIES_ENV: &str = "TOPDOWN_PRIVATE_COPIES";

/// Whether this process is topdown started again on private copies, decided once at start
/// (`leave_probed_files`).
static RESTARTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// True in a topdown restarted on private copies: `/proc/self/exe` then names the dynamic
/// loader, not topdown.
pub fn restarted() -> bool {
    RESTARTED.get().copied().unwrap_or(false)
}

/// Called first thing, while topdown has no other thread and nothing open: if topdown maps a
/// file that the machine-wide probe specs (`-u TARGET:FUNC`) name, execs topdown again on
/// private copies of those files and does not return; in the restarted process, removes the
/// copies. If the restart cannot be made, topdown goes on as it is (its probes say on stderr
/// that they run in topdown too).
pub fn leave_probed_files(probe_targets: &[String]) {
    if let Some(dir) = std::env::var_os(COPIES_ENV) {
        let _ = RESTARTED.set(true);
        // SAFETY: called from `main` before any other thread exists (`set_var`'s contract);
        // what topdown runs later must not inherit it.
        unsafe { std::env::remove_var(COPIES_ENV) };
        // The loader has mapped the copies: the mappings keep the files.
        let _ = std::fs::remove_dir_all(dir);
        name_process_as_started();
        return;
    }
    let _ = RESTARTED.set(false);
    // SAFETY: no preconditions.
    if probe_targets.is_empty() || unsafe { libc::geteuid() } != 0 {
        // Not root: capabilities of topdown's file (setcap) would not pass through the
        // loader's exec.
        return;
    }
    let targets: Vec<PathBuf> = probe_targets
        .iter()
        .filter_map(|target| find_target(target, &[]).ok())
        .collect();
    let mapped = mapped_targets(&targets);
    if mapped.is_empty() {
        return;
    }
    // Only a failed `exec` returns. Carry on as we are (the probes say what that means).
    let Err(err) = restart_on_copies(&mapped);
    log::warn!(
        "could not start again on private copies of {} (topdown's own calls will trap): {err:#}",
        crate::ui::path_list(&mapped)
    );
}

/// Gives the process its own name back: started through the loader, it is named after the
/// loader (`ps`, `pgrep topdown`, `/proc/PID/comm`).
fn name_process_as_started() {
    let Some(argv0) = std::env::args_os().next() else {
        return;
    };
    let Some(name) = Path::new(&argv0).file_name() else {
        return;
    };
    use std::os::unix::ffi::OsStrExt as _;
    let mut bytes: Vec<u8> = name.as_bytes().iter().copied().take(15).collect();
    bytes.push(0);
    if bytes[..bytes.len() - 1].contains(&0) {
        return;
    }
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes, which `bytes` is.
    unsafe { libc::prctl(libc::PR_SET_NAME, bytes.as_ptr()) };
}

/// The files of `targets` that this process maps, as it maps them (by device and inode: a
/// target may be named through a link), each once.
fn mapped_targets(targets: &[PathBuf]) -> Vec<PathBuf> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    let wanted: Vec<(u64, u64)> = targets
        .iter()
        .filter_map(|path| file_identity(path))
        .collect();
    let mut mapped: Vec<PathBuf> = Vec::new();
    for line in maps.lines().filter_map(MapsLine::parse) {
        if line.deleted || !line.path.starts_with('/') {
            continue;
        }
        let path = PathBuf::from(line.path);
        if !mapped.contains(&path) && file_identity(&path).is_some_and(|id| wanted.contains(&id)) {
            mapped.push(path);
        }
    }
    mapped
}

/// Copies `mapped` into a new private directory and execs topdown through the dynamic loader
/// with that directory first in its library path. Returns only if that fails.
fn restart_on_copies(mapped: &[PathBuf]) -> anyhow::Result<std::convert::Infallible> {
    use anyhow::Context as _;
    let executable = std::fs::read_link("/proc/self/exe").context("reading /proc/self/exe")?;
    let loader = interpreter(&executable)
        .with_context(|| format!("{} names no dynamic loader", executable.display()))?;
    // Private (mode 0700, made here: creating fails rather than reuse what is there) and not
    // guessable in advance in a shared /tmp.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    let dir =
        std::env::temp_dir().join(format!("topdown-private-{}-{nanos:09}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let copied = copy_into(&dir, mapped, &executable, &loader).and_then(|copies| {
        // A directory on a `noexec` mount would let the copies be written but not loaded,
        // and the loader would fail after the exec, with nothing to fall back to.
        if copies.files.iter().all(|copy| can_map_executable(copy)) {
            Ok((copies.program, copies.loader))
        } else {
            Err(anyhow::anyhow!(
                "{} does not allow executable mappings (noexec): set TMPDIR to a directory that does",
                dir.display()
            ))
        }
    });
    let (program, loader_to_run) = match copied {
        Ok(paths) => paths,
        Err(err) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(err);
        }
    };
    let mut library_path = dir.as_os_str().to_owned();
    // `--library-path` stands instead of LD_LIBRARY_PATH for this start: keep its directories.
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|old| !old.is_empty()) {
        library_path.push(":");
        library_path.push(old);
    }
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_else(|| executable.clone().into());
    let mut command = std::process::Command::new(&loader_to_run);
    command.arg("--library-path").arg(&library_path);
    if loader_takes_argv0() {
        command.arg("--argv0").arg(argv0);
    }
    let err = command
        .arg(&program)
        .args(args)
        .env(COPIES_ENV, &dir)
        .exec();
    let _ = std::fs::remove_dir_all(&dir);
    Err(err).with_context(|| format!("running {}", loader_to_run.display()))
}

/// What `copy_into` made.
struct Copies {
    /// Every copy.
    files: Vec<PathBuf>,
    /// The program and the loader to run: the copies where topdown's executable or loader
    /// is probed.
    program: PathBuf,
    loader: PathBuf,
}

/// Copies each of `mapped` into `dir` under the name the loader looks for.
fn copy_into(
    dir: &Path,
    mapped: &[PathBuf],
    executable: &Path,
    loader: &Path,
) -> anyhow::Result<Copies> {
    use anyhow::Context as _;
    let same =
        |a: &Path, b: &Path| file_identity(a).is_some() && file_identity(a) == file_identity(b);
    let mut copies = Copies {
        files: Vec::new(),
        program: executable.to_owned(),
        loader: loader.to_owned(),
    };
    for file in mapped {
        // The loader looks a library up by its DT_NEEDED name, which is its soname.
        let name = soname(file)
            .map(OsString::from)
            .or_else(|| file.file_name().map(OsString::from))
            .with_context(|| format!("{} has no file name", file.display()))?;
        let copy = dir.join(name);
        std::fs::copy(file, &copy)
            .with_context(|| format!("copying {} to {}", file.display(), copy.display()))?;
        if same(file, executable) {
            copies.program = copy.clone();
        } else if same(file, loader) {
            copies.loader = copy.clone();
        }
        copies.files.push(copy);
    }
    Ok(copies)
}

/// Whether the dynamic loader knows `--argv0` (glibc 2.33 and later); an older one would
/// refuse the whole start. Without it the program's path stands as its argv[0].
fn loader_takes_argv0() -> bool {
    // SAFETY: glibc returns a static NUL-terminated string.
    let version = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
    let mut parts = version
        .to_str()
        .unwrap_or("")
        .split('.')
        .map(|part| part.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (2, 33)
}

/// Whether `path` can be mapped executable (its mount is not `noexec`).
fn can_map_executable(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    use std::os::fd::AsRawFd as _;
    // SAFETY: a private read-only mapping of one page of an open file, unmapped at once; the
    // pointer is not read.
    unsafe {
        let address = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        );
        if address == libc::MAP_FAILED {
            return false;
        }
        libc::munmap(address, 4096);
    }
    true
}

/// The program interpreter (PT_INTERP) of an ELF executable.
fn interpreter(executable: &Path) -> Option<PathBuf> {
    let data = std::fs::read(executable).ok()?;
    let file = ElfFile64::<object::Endianness>::parse(&*data).ok()?;
    let endian = file.endian();
    file.elf_program_headers().iter().find_map(|header| {
        let bytes = header.interpreter(endian, &*data).ok()??;
        let text = std::str::from_utf8(bytes).ok()?;
        Some(PathBuf::from(text.trim_end_matches('\0')))
    })
}

/// A shared object's DT_SONAME.
fn soname(path: &Path) -> Option<String> {
    crate::functions::unwinding::dynamic_of(path)?.soname
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary's own loader and libc, as the restart finds them.
    #[test]
    fn the_loader_and_libc_soname_are_read_from_the_files() {
        let me = std::fs::read_link("/proc/self/exe").unwrap();
        let loader = interpreter(&me).unwrap();
        assert!(loader.is_file(), "{}", loader.display());
        let libc = mapped_targets(&[find_target("libc", &[]).unwrap()]);
        assert_eq!(libc.len(), 1, "{libc:?}");
        assert_eq!(soname(&libc[0]).as_deref(), Some("libc.so.6"));
        assert!(mapped_targets(&[PathBuf::from("/bin/sh")]).is_empty());
    }
}
