//! Which return probes a target gets (`--returns`), and where unwinding ends.
//!
//! A uretprobe replaces the return address on the stack with the kernel's trampoline. That is
//! cheap (the kernel emulates the trampoline's trap), but an unwinder walking the stack (a C++
//! exception, a Rust panic, `pthread_cancel`/`pthread_exit`'s forced unwind) finds no unwind
//! information for the trampoline and terminates the program. A uprobe on each exit
//! instruction leaves the stack alone, but `ret` is single-stepped (several times the cost).
//! `auto` gives a target uretprobes only when nothing in the traced image can unwind: no
//! object throws, panics or cancels threads. `longjmp` does not walk the stack: the kernel
//! drops the return instances a longjmp skipped by stack pointer (`cleanup_return_instances`,
//! kernel/events/uprobes.c), so it is safe with uretprobes.
//!
//! The traced image is read the way the dynamic loader would load it (ld.so(8): DT_RPATH,
//! LD_LIBRARY_PATH, DT_RUNPATH, /etc/ld.so.cache, default directories), or from the traced
//! processes' mappings.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use object::{
    Object as _, ObjectSymbol as _,
    read::elf::{ElfFile64, FileHeader as _},
};
use serde::{Deserialize, Serialize};

use crate::functions::symbols::{
    elf::Segments,
    target::{STANDARD_DIRS, file_identity, ld_so_cache, mapped_files},
};

/// `--returns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReturnMode {
    /// Per target: uretprobes where nothing in the traced image can unwind, exit probes where
    /// something can.
    Auto,
    /// uretprobes everywhere (a program that unwinds through a probed function aborts).
    Uretprobe,
    /// A uprobe on every exit instruction everywhere (safe with unwinding; `ret` is
    /// single-stepped).
    Exit,
}

/// The return mechanism a target got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReturnProbe {
    Uretprobe,
    Exit,
}

impl ReturnProbe {
    pub fn name(self) -> &'static str {
        match self {
            Self::Uretprobe => "uretprobe",
            Self::Exit => "exit",
        }
    }
}

/// Which mechanism a target got, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetReturns {
    pub target: String,
    pub return_probe: ReturnProbe,
    pub reason: String,
}

/// What is traced: the processes whose objects could unwind through a target's functions.
#[derive(Clone, Debug)]
pub enum Image {
    /// `-- CMD`: the program, and the libraries it loads.
    Command(PathBuf),
    /// `-p`: these processes' mappings.
    Processes(Vec<u32>),
    /// `-a`: every process that maps the target now.
    Everything,
}

/// Symbols that mean "this object throws or unwinds": C++ throw (Itanium C++ ABI §2.4),
/// the unwinder's raising entry points (§1.6 of its base ABI), the personality routines that
/// run landing pads (C++ and Rust), and glibc's forced unwind.
const UNWINDS: [(&str, &str); 7] = [
    ("__cxa_throw", "C++ exceptions"),
    ("__cxa_rethrow", "C++ exceptions"),
    ("__gxx_personality_v0", "C++ exceptions"),
    ("rust_eh_personality", "Rust panics"),
    ("_Unwind_RaiseException", "exceptions or panics"),
    ("_Unwind_Resume_or_Rethrow", "exceptions"),
    ("_Unwind_ForcedUnwind", "forced unwinding"),
];

/// Thread exits that unwind the thread's stack (glibc nptl: `__pthread_unwind`), when a
/// program (not libc, which defines them) uses them.
const CANCELS: [&str; 2] = ["pthread_cancel", "pthread_exit"];

/// Runtimes that define the unwinder or the thread functions without using them themselves:
/// their own definitions say nothing about the program.
fn is_runtime(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    ["libgcc_s.so", "libunwind.so", "libc.so", "libpthread.so"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
}

/// Why `path` can unwind, if it can.
fn unwinds(path: &Path) -> Option<String> {
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let runtime = is_runtime(path);
    let symbols = file.dynamic_symbols().chain(file.symbols());
    for symbol in symbols {
        let Ok(name) = symbol.name() else { continue };
        let defined = !symbol.is_undefined();
        if let Some((_, what)) = UNWINDS.iter().find(|(known, _)| *known == name)
            && !(runtime && defined)
        {
            return Some(format!(
                "{} {} {name} ({what})",
                path.display(),
                if defined { "defines" } else { "imports" }
            ));
        }
        if !runtime && !defined && CANCELS.contains(&name) {
            return Some(format!(
                "{} imports {name} (thread exit unwinds the stack)",
                path.display()
            ));
        }
    }
    None
}

/// Decides the mechanism of each target (`targets` as they are attached).
pub fn decide(mode: ReturnMode, targets: &[PathBuf], image: &Image) -> Vec<TargetReturns> {
    targets
        .iter()
        .map(|target| {
            let (return_probe, reason) = match mode {
                ReturnMode::Uretprobe => (ReturnProbe::Uretprobe, "--returns uretprobe".into()),
                // Exit instructions are only decoded on x86-64 (`symbols::elf`).
                _ if !cfg!(target_arch = "x86_64") => (
                    ReturnProbe::Uretprobe,
                    "exit-instruction probes need x86-64".into(),
                ),
                ReturnMode::Exit => (ReturnProbe::Exit, "--returns exit".into()),
                ReturnMode::Auto => {
                    let objects = objects_of(target, image);
                    match objects.iter().find_map(|object| unwinds(object)) {
                        Some(why) => (ReturnProbe::Exit, why),
                        None => (
                            ReturnProbe::Uretprobe,
                            format!(
                                "nothing can unwind through it ({} object{} read)",
                                objects.len(),
                                if objects.len() == 1 { "" } else { "s" }
                            ),
                        ),
                    }
                }
            };
            TargetReturns {
                target: target.display().to_string(),
                return_probe,
                reason,
            }
        })
        .collect()
}

/// Every object that can run in the same threads as `target`'s functions.
pub fn objects_of(target: &Path, image: &Image) -> Vec<PathBuf> {
    let mut objects = Vec::new();
    let mut seen = BTreeSet::new();
    let mut add_closure = |root: &Path, objects: &mut Vec<PathBuf>| {
        for object in needed_closure(root) {
            if seen.insert(identity(&object)) {
                objects.push(object);
            }
        }
    };
    add_closure(target, &mut objects);
    let pids = match image {
        Image::Command(program) => {
            add_closure(program, &mut objects);
            Vec::new()
        }
        Image::Processes(pids) => pids.clone(),
        Image::Everything => processes_mapping(target),
    };
    for pid in pids {
        for object in mapped_objects(pid) {
            if seen.insert(identity(&object)) {
                objects.push(object);
            }
        }
    }
    objects
}

/// `(dev, inode)`, or the path when it cannot be read (then it is never equal to another).
fn identity(path: &Path) -> Result<(u64, u64), PathBuf> {
    file_identity(path).ok_or_else(|| path.to_owned())
}

/// The files a process maps (ELF or not; non-ELF files are skipped when read).
fn mapped_objects(pid: u32) -> Vec<PathBuf> {
    mapped_files(pid, &|_| true)
}

/// Processes that map `target` now (for `-a`).
fn processes_mapping(target: &Path) -> Vec<u32> {
    let Ok(wanted) = identity(target) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            mapped_objects(*pid)
                .iter()
                .any(|path| identity(path).ok() == Some(wanted))
        })
        .collect()
}

/// `root` and every library it needs, transitively, resolved like ld.so.
pub fn needed_closure(root: &Path) -> Vec<PathBuf> {
    let cache = std::fs::read("/etc/ld.so.cache")
        .map(|data| ld_so_cache(&data))
        .unwrap_or_default();
    let library_path: Vec<PathBuf> = std::env::var("LD_LIBRARY_PATH")
        .map(|value| {
            value
                .split(':')
                .filter(|dir| !dir.is_empty())
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default();
    let mut found = vec![root.to_owned()];
    let mut names: BTreeSet<String> = BTreeSet::new();
    let mut index = 0;
    while index < found.len() {
        let object = found[index].clone();
        index += 1;
        let Some(dynamic) = dynamic_of(&object) else {
            continue;
        };
        let origin = object.parent().map(Path::to_owned).unwrap_or_default();
        let expand = |list: &Option<String>| -> Vec<PathBuf> {
            list.as_deref()
                .unwrap_or("")
                .split(':')
                .filter(|dir| !dir.is_empty())
                .map(|dir| {
                    PathBuf::from(
                        dir.replace("${ORIGIN}", &origin.to_string_lossy())
                            .replace("$ORIGIN", &origin.to_string_lossy()),
                    )
                })
                .collect()
        };
        // ld.so(8): DT_RPATH only counts when there is no DT_RUNPATH.
        let rpath = if dynamic.runpath.is_none() {
            expand(&dynamic.rpath)
        } else {
            Vec::new()
        };
        let runpath = expand(&dynamic.runpath);
        for name in dynamic.needed {
            if !names.insert(name.clone()) {
                continue;
            }
            let in_dirs = |dirs: &[PathBuf]| {
                dirs.iter()
                    .map(|dir| dir.join(&name))
                    .find(|path| path.is_file())
            };
            let path = if name.contains('/') {
                Some(PathBuf::from(&name))
            } else {
                in_dirs(&rpath)
                    .or_else(|| in_dirs(&library_path))
                    .or_else(|| in_dirs(&runpath))
                    .or_else(|| {
                        cache
                            .iter()
                            .find(|(soname, _)| *soname == name)
                            .map(|(_, path)| PathBuf::from(path))
                    })
                    .or_else(|| {
                        let dirs: Vec<PathBuf> = STANDARD_DIRS.iter().map(PathBuf::from).collect();
                        in_dirs(&dirs)
                    })
            };
            if let Some(path) = path {
                found.push(path);
            } else {
                log::debug!("{}: needed {name} not found", object.display());
            }
        }
    }
    found
}

pub(crate) struct Dynamic {
    pub(crate) needed: Vec<String>,
    pub(crate) rpath: Option<String>,
    pub(crate) runpath: Option<String>,
    pub(crate) soname: Option<String>,
}

/// DT_NEEDED, DT_RPATH, DT_RUNPATH and DT_SONAME of a 64-bit ELF object (System V gABI,
/// "Dynamic Section").
pub(crate) fn dynamic_of(path: &Path) -> Option<Dynamic> {
    let data = std::fs::read(path).ok()?;
    let file = ElfFile64::<object::Endianness>::parse(&*data).ok()?;
    let endian = file.endian();
    let sections = file.elf_header().sections(endian, &*data).ok()?;
    let (entries, link) = sections.dynamic(endian, &*data).ok()??;
    let strings = sections.strings(endian, &*data, link).ok()?;
    let mut dynamic = Dynamic {
        needed: Vec::new(),
        rpath: None,
        runpath: None,
        soname: None,
    };
    for entry in entries {
        let tag = entry.d_tag.get(endian);
        let string = || {
            strings
                .get(entry.d_val.get(endian) as u32)
                .ok()
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
        };
        match tag {
            object::elf::DT_NEEDED => dynamic.needed.extend(string()),
            object::elf::DT_RPATH => dynamic.rpath = string(),
            object::elf::DT_RUNPATH => dynamic.runpath = string(),
            object::elf::DT_SONAME => dynamic.soname = string(),
            _ => {}
        }
    }
    Some(dynamic)
}

/// Where unwinding ends in the objects of an image: functions a landing pad calls first once
/// the unwinder has stopped in the catching frame. `__cxa_begin_catch` (Itanium C++ ABI
/// §2.5.3); Rust's `catch_unwind` calls std's `cleanup` from its landing pad, which calls
/// `__rust_panic_cleanup` (library/std/src/panicking.rs).
pub fn catch_points(objects: &[PathBuf]) -> Vec<(PathBuf, u64, String)> {
    let mut points = Vec::new();
    for object in objects {
        if is_runtime(object) {
            continue;
        }
        let Ok(data) = std::fs::read(object) else {
            continue;
        };
        let Ok(file) = object::File::parse(&*data) else {
            continue;
        };
        // Only the names are needed: no decoding of every function of every mapped object.
        let segments = Segments::of(&file);
        let mut found: Vec<(u64, String)> = file
            .dynamic_symbols()
            .chain(file.symbols())
            .filter(|symbol| symbol.kind() == object::SymbolKind::Text && !symbol.is_undefined())
            .filter_map(|symbol| {
                let name = symbol.name().ok()?;
                if !is_catch_point(name) {
                    return None;
                }
                Some((segments.file_offset(symbol.address())?, name.to_owned()))
            })
            .collect();
        found.sort();
        found.dedup_by_key(|(offset, _)| *offset);
        points.extend(
            found
                .into_iter()
                .map(|(offset, name)| (object.clone(), offset, name)),
        );
    }
    points
}

fn is_catch_point(name: &str) -> bool {
    if name == "__cxa_begin_catch" || name.ends_with("__rust_panic_cleanup") {
        return true;
    }
    if !name.contains("cleanup") {
        return false;
    }
    let demangled = format!("{:#}", rustc_demangle::demangle(name));
    demangled == "std::panicking::catch_unwind::cleanup"
        || demangled == "std::panicking::try::cleanup"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catch_points_by_name() {
        assert!(is_catch_point("__cxa_begin_catch"));
        assert!(is_catch_point(
            "_RNvCs6rREvFdRhLb_7___rustc20___rust_panic_cleanup"
        ));
        assert!(is_catch_point(
            "_ZN3std9panicking12catch_unwind7cleanup17h0123456789abcdefE"
        ));
        assert!(is_catch_point(
            "_ZN3std9panicking3try7cleanup17h0123456789abcdefE"
        ));
        assert!(!is_catch_point(
            "_ZN3std2io5stdio7cleanup17h0123456789abcdefE"
        ));
        assert!(!is_catch_point("__cxa_end_catch"));
    }

    /// This test binary is Rust: it defines the panic personality, so it can unwind; the
    /// closure of it has libc, whose own pthread_cancel does not count.
    #[test]
    fn rust_binaries_unwind_and_libc_alone_does_not() {
        let me = std::env::current_exe().unwrap();
        let why = unwinds(&me).expect("a Rust test binary unwinds");
        assert!(
            why.contains("rust_eh_personality") || why.contains("_Unwind_RaiseException"),
            "{why}"
        );
        let closure = needed_closure(&me);
        let libc = closure
            .iter()
            .find(|path| path.file_name().is_some_and(|name| name == "libc.so.6"))
            .expect("libc.so.6 in the closure");
        assert_eq!(unwinds(libc), None);
    }
}
