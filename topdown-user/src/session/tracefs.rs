//! Finding (and if needed mounting) tracefs, and reading tracepoint ids and record layouts.
//!
//! Tracepoint ids are what `PERF_TYPE_TRACEPOINT` takes as `config`; record layouts give the
//! field offsets the classic-tracepoint BPF programs need (they change between kernels, e.g.
//! `sched_process_fork` switched its comm fields to `__data_loc` in 6.x).

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

use crate::error::{Failure, fail};

/// Where modern kernels expect tracefs.
const TRACEFS_DEFAULT: &str = "/sys/kernel/tracing";
/// Older mount point, under debugfs.
const TRACEFS_DEBUGFS: &str = "/sys/kernel/debug/tracing";

/// A mounted tracefs.
#[derive(Clone, Debug)]
pub struct Tracefs {
    root: PathBuf,
}

impl Tracefs {
    /// Finds tracefs in `/proc/self/mounts`, mounting it at `/sys/kernel/tracing` when absent
    /// (fresh machines here do not mount it).
    pub fn locate_or_mount() -> Result<Self> {
        let mounts =
            fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
        if let Some(root) = find_tracefs_mount(&mounts) {
            return Ok(Self { root });
        }
        if Path::new(TRACEFS_DEBUGFS).join("events").is_dir() {
            return Ok(Self {
                root: PathBuf::from(TRACEFS_DEBUGFS),
            });
        }
        mount_tracefs(Path::new(TRACEFS_DEFAULT))?;
        Ok(Self {
            root: PathBuf::from(TRACEFS_DEFAULT),
        })
    }

    /// A tracefs rooted somewhere else (tests).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The id of `group:name`, for `perf_event_attr.config`.
    pub fn tracepoint_id(&self, group: &str, name: &str) -> Result<u64> {
        let path = self.root.join("events").join(group).join(name).join("id");
        let text = fs::read_to_string(&path).map_err(|err| {
            if err.kind() == std::io::ErrorKind::NotFound {
                fail(
                    Failure::PmuUnavailable,
                    format!(
                        "tracepoint {group}:{name} does not exist on this kernel (no {}): pick one \
                     listed under {}/events",
                        path.display(),
                        self.root.display()
                    ),
                )
            } else {
                anyhow::anyhow!("reading {}: {err}", path.display())
            }
        })?;
        text.trim()
            .parse()
            .with_context(|| format!("{} does not hold a number", path.display()))
    }

    /// Offset of `field` in the records of `group:name`, or `None` if the kernel has no such field.
    pub fn field_offset(&self, group: &str, name: &str, field: &str) -> Result<Option<u32>> {
        let path = self
            .root
            .join("events")
            .join(group)
            .join(name)
            .join("format");
        let format =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(parse_field_offset(&format, field))
    }
}

/// The mount point of the first tracefs in a `/proc/self/mounts` text.
pub fn find_tracefs_mount(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let _source = fields.next()?;
        let target = fields.next()?;
        let fstype = fields.next()?;
        (fstype == "tracefs").then(|| PathBuf::from(unescape_mount_path(target)))
    })
}

/// `/proc/self/mounts` and mountinfo escape space, tab, newline and backslash as octal (`\040`).
pub(crate) fn unescape_mount_path(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|digits| std::str::from_utf8(digits).ok())
            .and_then(|digits| u8::from_str_radix(digits, 8).ok());
        if let (b'\\', Some(value)) = (bytes[i], octal) {
            out.push(value);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn mount_tracefs(target: &Path) -> Result<()> {
    let source = c"nodev";
    let fstype = c"tracefs";
    let target_c = std::ffi::CString::new(target.as_os_str().as_encoded_bytes())
        .context("tracefs mount point contains a NUL byte")?;
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target_c.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        bail!(
            "tracefs is not mounted and mounting it at {} failed ({err}): run as root, or mount it \
             yourself with `mount -t tracefs nodev {}`",
            target.display(),
            target.display()
        );
    }
    log::info!("mounted tracefs at {}", target.display());
    Ok(())
}

/// Finds `field:<type> <field>;\toffset:<n>;` in a tracefs `format` file.
pub fn parse_field_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let line = line.trim();
        let decl = line.strip_prefix("field:")?;
        let (decl, rest) = decl.split_once(';')?;
        // The name is the last word of the declaration, minus any array suffix.
        let name = decl.split_whitespace().last()?;
        let name = name.split('[').next()?;
        if name != field {
            return None;
        }
        let offset = rest.trim().strip_prefix("offset:")?;
        offset.split(';').next()?.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fork record of Linux 6.18 (data_loc comms), as this kernel prints it.
    const FORK_618: &str = "name: sched_process_fork
ID: 366
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;
\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;
";

    /// The older layout with inline comm arrays (e.g. Linux 6.1).
    const FORK_61: &str = "\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:0;
\tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;
";

    #[test]
    fn field_offsets_follow_the_kernel_layout() {
        assert_eq!(parse_field_offset(FORK_618, "child_pid"), Some(20));
        assert_eq!(parse_field_offset(FORK_618, "parent_pid"), Some(12));
        assert_eq!(parse_field_offset(FORK_61, "child_pid"), Some(44));
        assert_eq!(parse_field_offset(FORK_61, "child_comm"), Some(28));
        assert_eq!(parse_field_offset(FORK_618, "group_dead"), None);
    }

    #[test]
    fn finds_tracefs_among_mounts() {
        let mounts = "sysfs /sys sysfs rw 0 0\n\
                      nodev /sys/kernel/debug/tracing\\040x tracefs rw 0 0\n";
        assert_eq!(
            find_tracefs_mount(mounts),
            Some(PathBuf::from("/sys/kernel/debug/tracing x"))
        );
        assert_eq!(find_tracefs_mount("proc /proc proc rw 0 0\n"), None);
    }

    #[test]
    fn missing_tracepoint_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = Tracefs::at(dir.path())
            .tracepoint_id("syscalls", "sys_enter_nope")
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("tracepoint syscalls:sys_enter_nope does not exist")
        );
    }
}
