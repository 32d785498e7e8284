//! Finding the file a `-u TARGET:FUNC` names, the way the dynamic loader would for the traced
//! processes: their own mappings first (through `/proc/PID/root`, so containerised processes
//! work), then `/etc/ld.so.cache`, then the standard library directories.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::error::{Failure, fail};

pub(crate) const STANDARD_DIRS: [&str; 8] = [
    "/lib",
    "/usr/lib",
    "/lib64",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
];

/// `(device, inode)` of a file: the same file however it is named (links, `/proc/PID/root`),
/// or `None` while it cannot be read (missing, mid-replacement).
pub(crate) fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path)
        .ok()
        .map(|meta| (meta.dev(), meta.ino()))
}

/// A path (anything with a `/`, or an existing file) is used as is; a name like `libc` or
/// `libssl.so.3` is looked up as a library.
pub fn find_target(target: &str, pids: &[u32]) -> Result<PathBuf> {
    let path = Path::new(target);
    if target.contains('/') || (path.is_file() && !target.starts_with("lib")) {
        return path.canonicalize().map_err(|err| {
            fail(Failure::Usage, format!("-u {target}: {err} (give a path to an executable or shared object, or a library name like libc)"))
        });
    }
    let mut found: Vec<PathBuf> = Vec::new();
    for pid in pids {
        found.extend(from_maps(*pid, target));
    }
    if found.is_empty()
        && let Ok(cache) = std::fs::read("/etc/ld.so.cache")
    {
        found.extend(
            ld_so_cache(&cache)
                .into_iter()
                .filter(|(name, _)| library_matches(target, name))
                .map(|(_, path)| PathBuf::from(path)),
        );
    }
    if found.is_empty() {
        for dir in STANDARD_DIRS {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if library_matches(target, &entry.file_name().to_string_lossy()) {
                    found.push(entry.path());
                }
            }
        }
    }
    // The same file can be reached several ways (symlinks, /proc/PID/root): one per inode.
    // /proc/PID/root paths are kept as they are: canonicalising the magic link would leave a
    // container's filesystem for the host's.
    let mut canonical: Vec<PathBuf> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for path in found {
        let Some(identity) = file_identity(&path) else {
            continue;
        };
        if seen.insert(identity) {
            let path = if path.starts_with("/proc") {
                path
            } else {
                path.canonicalize().unwrap_or(path)
            };
            canonical.push(path);
        }
    }
    // Prefer this machine's architecture when a cache lists several (e.g. lib32 and lib64).
    if canonical.len() > 1 {
        let native: Vec<PathBuf> = canonical
            .iter()
            .filter(|path| is_native_elf(path))
            .cloned()
            .collect();
        if !native.is_empty() {
            canonical = native;
        }
    }
    match canonical.len() {
        1 => Ok(canonical.remove(0)),
        0 => Err(fail(
            Failure::Usage,
            format!(
                "-u {target}: no such library in the traced processes' mappings, /etc/ld.so.cache or {}; give its path",
                STANDARD_DIRS.join(", ")
            ),
        )),
        _ => Err(fail(
            Failure::Usage,
            format!(
                "-u {target} is ambiguous: {}; give the path of the one to probe",
                crate::ui::path_list(&canonical)
            ),
        )),
    }
}

/// `libc` matches `libc.so.6` and `libc-2.31.so`; `libc.so.6` matches itself.
pub fn library_matches(wanted: &str, file_name: &str) -> bool {
    file_name == wanted
        || file_name.strip_prefix(wanted).is_some_and(|rest| {
            rest.starts_with(".so") || (rest.starts_with('-') && rest.contains(".so"))
        })
}

/// Files mapped by a process whose name matches, reached through its root (containers).
fn from_maps(pid: u32, target: &str) -> Vec<PathBuf> {
    mapped_files(pid, &|path| {
        path.file_name()
            .is_some_and(|name| library_matches(target, &name.to_string_lossy()))
    })
}

/// The files process `pid` maps whose path (as the process names it) is `wanted`, each once
/// per run of mappings, reached as `MapsLine::mapped_file` reaches them; none when its maps
/// cannot be read (it exited).
pub fn mapped_files(pid: u32, wanted: &dyn Fn(&Path) -> bool) -> Vec<PathBuf> {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = maps
        .lines()
        .filter_map(MapsLine::parse)
        .filter(|mapping| mapping.path.starts_with('/') && wanted(Path::new(mapping.path)))
        .map(|mapping| mapping.mapped_file(pid))
        .collect();
    paths.dedup();
    paths
}

/// One line of `/proc/PID/maps`: `ADDRESS-RANGE PERMS OFFSET DEV INODE   PATHNAME`
/// (proc_pid_maps(5)). The pathname is everything after the fifth field and its padding, and
/// may hold spaces; the kernel appends ` (deleted)` when the mapped file was unlinked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsLine<'a> {
    /// `start-end` in hex, as `/proc/PID/map_files/` names the mapping.
    pub range: &'a str,
    /// The pathname (without ` (deleted)`), `[heap]`-style pseudo-paths, or empty (anonymous).
    pub path: &'a str,
    pub deleted: bool,
}

impl<'a> MapsLine<'a> {
    pub fn parse(line: &'a str) -> Option<Self> {
        let mut rest = line;
        let mut range = "";
        for index in 0..5 {
            rest = rest.trim_start_matches([' ', '\t']);
            if rest.is_empty() {
                return None;
            }
            let end = rest.find([' ', '\t']).unwrap_or(rest.len());
            if index == 0 {
                range = &rest[..end];
            }
            rest = &rest[end..];
        }
        // Only the padding before the path goes: a path's own spaces, even trailing ones, stay.
        let path = rest.trim_start_matches([' ', '\t']);
        let (path, deleted) = match path.strip_suffix(" (deleted)") {
            Some(path) => (path, true),
            None => (path, false),
        };
        Some(Self {
            range,
            path,
            deleted,
        })
    }

    /// A path to the file mapped here, as process `pid` sees it: through its root (its mount
    /// namespace), or, when deleted, through its `map_files` link, since the file at that
    /// path now is another one (an upgraded library) or none.
    pub fn mapped_file(&self, pid: u32) -> PathBuf {
        if self.deleted {
            PathBuf::from(format!("/proc/{pid}/map_files/{}", self.range))
        } else {
            PathBuf::from(format!("/proc/{pid}/root{}", self.path))
        }
    }
}

/// `(soname, path)` entries of a glibc `ld.so.cache` (format `glibc-ld.so.cache1.1`, possibly
/// after an old `ld.so-1.7.0` table). String offsets are relative to the new header.
pub fn ld_so_cache(data: &[u8]) -> Vec<(String, String)> {
    const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    let Some(base) = data.windows(MAGIC.len()).position(|window| window == MAGIC) else {
        return Vec::new();
    };
    let u32_at = |offset: usize| -> Option<u32> {
        data.get(offset..offset + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    let string_at = |offset: u32| -> Option<String> {
        let start = base + offset as usize;
        let end = data.get(start..)?.iter().position(|&b| b == 0)? + start;
        Some(String::from_utf8_lossy(&data[start..end]).into_owned())
    };
    let Some(count) = u32_at(base + 20) else {
        return Vec::new();
    };
    // Header: magic+version (20), nlibs, len_strings, flags+pad, extension offset, 3 unused.
    let entries = base + 48;
    (0..count as usize)
        .filter_map(|index| {
            let entry = entries + index * 24;
            let key = u32_at(entry + 4)?;
            let value = u32_at(entry + 8)?;
            Some((string_at(key)?, string_at(value)?))
        })
        .collect()
}

fn is_native_elf(path: &Path) -> bool {
    let Ok(data) = std::fs::read(path) else {
        return false;
    };
    let Ok(file) = object::File::parse(&*data) else {
        return false;
    };
    use object::Object as _;
    let native = if cfg!(target_arch = "x86_64") {
        object::Architecture::X86_64
    } else if cfg!(target_arch = "aarch64") {
        object::Architecture::Aarch64
    } else {
        return true;
    };
    file.architecture() == native
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names() {
        assert!(library_matches("libc", "libc.so.6"));
        assert!(library_matches("libc", "libc-2.31.so"));
        assert!(library_matches("libstdc++", "libstdc++.so.6.0.30"));
        assert!(!library_matches("libc", "libcrypt.so.1"));
        assert!(!library_matches("libc", "libc_nonshared.a"));
    }

    #[test]
    fn maps_lines_keep_spaces_and_mark_deleted_files() {
        let parse = |line| MapsLine::parse(line).unwrap();
        assert_eq!(
            parse(
                "7f1c2a000000-7f1c2a028000 r--p 00000000 08:01 1234567                    /usr/lib/x86_64-linux-gnu/libc.so.6"
            ),
            MapsLine {
                range: "7f1c2a000000-7f1c2a028000",
                path: "/usr/lib/x86_64-linux-gnu/libc.so.6",
                deleted: false
            }
        );
        assert_eq!(
            parse(
                "55d0c0a00000-55d0c0a21000 r-xp 00001000 fd:00 42  /opt/My App/lib/libfoo  bar.so.1"
            ),
            MapsLine {
                range: "55d0c0a00000-55d0c0a21000",
                path: "/opt/My App/lib/libfoo  bar.so.1",
                deleted: false
            }
        );
        assert_eq!(
            parse("7f00-7f10 r-xp 00000000 08:01 99 /usr/lib/libssl.so.3 (deleted)"),
            MapsLine {
                range: "7f00-7f10",
                path: "/usr/lib/libssl.so.3",
                deleted: true
            }
        );
        // A file whose name really ends in spaces keeps them.
        assert_eq!(parse("1-2 r--p 0 0:0 5 /tmp/x.so  ").path, "/tmp/x.so  ");
        assert_eq!(parse("1-2 rw-p 00000000 00:00 0 ").path, "");
        assert_eq!(parse("1-2 rw-p 00000000 00:00 0").path, "");
        assert_eq!(parse("1-2 rw-p 00000000 00:00 0    [heap]").path, "[heap]");
        assert_eq!(MapsLine::parse("1-2 rw-p 0"), None);
        assert_eq!(MapsLine::parse(""), None);
    }

    /// A library mapped from a directory with a space in its name, then deleted, still resolves
    /// from the process's mappings (to the mapped file, not to whatever now has its path).
    #[test]
    fn mapped_libraries_with_spaces_and_deleted_ones_resolve() {
        let dir = tempfile::tempdir().unwrap();
        let spaced = dir.path().join("my libs");
        std::fs::create_dir(&spaced).unwrap();
        let library = spaced.join("libtdspace.so.1");
        std::fs::write(&library, vec![0u8; 8192]).unwrap();
        let file = std::fs::File::open(&library).unwrap();
        // SAFETY: a fresh private read-only mapping of a file we own; unmapped below.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(address, libc::MAP_FAILED);
        let me = std::process::id();
        let found = from_maps(me, "libtdspace");
        assert_eq!(
            found,
            [PathBuf::from(format!(
                "/proc/{me}/root{}",
                library.display()
            ))]
        );
        std::fs::remove_file(&library).unwrap();
        let found = from_maps(me, "libtdspace");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with(format!("/proc/{me}/map_files/")),
            "{found:?}"
        );
        assert_eq!(std::fs::read(&found[0]).unwrap().len(), 8192);
        // SAFETY: the mapping made above, of that length.
        unsafe { libc::munmap(address, 4096) };
    }

    #[test]
    fn this_machines_libc_resolves_through_maps_and_the_cache() {
        use std::os::unix::fs::MetadataExt as _;
        let me = std::process::id();
        let through_maps = find_target("libc", &[me]).unwrap();
        assert!(
            through_maps.starts_with(format!("/proc/{me}/root")),
            "{}",
            through_maps.display()
        );
        let through_cache = find_target("libc", &[]).unwrap();
        let inode = |path: &Path| {
            std::fs::metadata(path)
                .map(|meta| (meta.dev(), meta.ino()))
                .unwrap()
        };
        assert_eq!(inode(&through_maps), inode(&through_cache));
        let cache = std::fs::read("/etc/ld.so.cache").unwrap();
        assert!(
            ld_so_cache(&cache)
                .iter()
                .any(|(name, _)| name == "libc.so.6")
        );
        let err = find_target("libdefinitely-not-here", &[]).unwrap_err();
        assert!(err.to_string().contains("no such library"));
    }
}
