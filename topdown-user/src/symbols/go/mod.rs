//! Go binaries: their functions from `.gopclntab` (stripped binaries keep it), the Go release
//! from the build information blob, and the runtime entry points the goroutine-aware probes
//! hook (`topdown-ebpf`'s `goroutines` module).
//!
//! Why Go needs its own probes: the runtime multiplexes goroutines over threads and moves a
//! goroutine's stack when it grows (copying it whole), so a per-thread shadow stack keyed by
//! stack pointer mixes goroutines, and a uretprobe's rewritten return address is copied to a
//! stack that no longer holds it (corrupting the program). Instead, every return instruction
//! is probed; frames are kept per goroutine (the `g` pointer, in R14 under Go's register ABI,
//! Go 1.17+) and identified by their depth below the goroutine's stack top (`g.stack.hi - SP`,
//! unchanged by a copy); and a goroutine leaving or joining a thread is a context switch for
//! its counters. These layouts have not changed since Go 1.17 and are checked against the
//! binary's DWARF when it has some (`layout`).

use std::path::Path;

use anyhow::Result;
use object::{Object as _, ObjectSection as _};
use topdown_common::go_hook;

use crate::error::{Failure, fail};

pub mod buildinfo;
pub mod layout;
pub mod pclntab;

use buildinfo::GoVersion;

/// The first Go release whose functions keep the goroutine in R14 (the register-based
/// calling convention, `ABIInternal`, on amd64).
const REGISTER_ABI: GoVersion = GoVersion {
    major: 1,
    minor: 17,
};

/// Runtime functions topdown hooks, by `topdown_common::go_hook` kind: where a goroutine joins
/// a thread (`gogo`, every switch's last step), leaves it (`mcall`: parking, yielding,
/// preemption, exiting, recovering; `morestack`: the stack check in every function's
/// prologue, which may grow and copy the stack or reschedule), and ends (`goexit1`, also
/// reached by `runtime.Goexit` after the deferred calls).
pub const HOOKS: [(&str, u64); 4] = [
    ("runtime.gogo", go_hook::GOGO),
    ("runtime.mcall", go_hook::MCALL),
    ("runtime.morestack", go_hook::MORESTACK),
    ("runtime.goexit1", go_hook::GOEXIT),
];

/// Functions the goroutine ends in: their frames are closed by the `goexit1` hook, not by a
/// return, so they cannot be probed as functions.
const ENDS_GOROUTINES: [&str; 2] = ["runtime.goexit1", "runtime.goexit0"];

/// What topdown knows of a Go binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoImage {
    /// `go1.19.8`, or the table's format when the binary has no build information.
    pub version: String,
    pub functions: Vec<GoFunction>,
    /// Functions that only exist inlined (no code of their own), by name.
    pub inlined_only: Vec<String>,
    /// False when the inline trees could not be read: inlined calls are not detected.
    pub inlining_known: bool,
    /// `(file address, go_hook kind)` of the runtime hooks.
    pub hooks: Vec<(u64, u64)>,
}

/// One Go function with code of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoFunction {
    pub name: String,
    pub address: u64,
    pub size: u64,
    /// Why it cannot be probed, if it cannot.
    pub refused: Option<&'static str>,
}

/// Whether `file` is a Go binary.
pub fn is_go(file: &object::File<'_>) -> bool {
    file.section_by_name(".go.buildinfo").is_some()
        || file.section_by_name(".note.go.buildid").is_some()
        || file.section_by_name(".gopclntab").is_some()
}

struct Sections<'a> {
    file: &'a object::File<'a>,
}

impl pclntab::Memory for Sections<'_> {
    fn read(&self, address: u64, len: usize) -> Option<&[u8]> {
        self.file.sections().find_map(|section| {
            let offset = address.checked_sub(section.address())?;
            if offset >= section.size() {
                return None;
            }
            let data = section.data().ok()?;
            let offset = usize::try_from(offset).ok()?;
            data.get(offset..offset.checked_add(len)?)
        })
    }

    fn data_sections(&self) -> Vec<(u64, &[u8])> {
        [".noptrdata", ".data", ".data.rel.ro"]
            .iter()
            .filter_map(|name| {
                let section = self.file.section_by_name(name)?;
                Some((section.address(), section.data().ok()?))
            })
            .collect()
    }
}

/// Reads a Go binary; fails (usage error) for one topdown cannot probe: built before Go 1.17,
/// a function table it cannot read, or runtime structures laid out otherwise than it knows.
pub fn read(file: &object::File<'_>, path: &Path) -> Result<GoImage> {
    let version_text = buildinfo::version(file);
    let version = version_text.as_deref().and_then(GoVersion::parse);
    let refuse = |why: String| fail(Failure::Usage, format!("{}: {why}", path.display()));
    if let Some(version) = version
        && version < REGISTER_ABI
    {
        return Err(refuse(format!(
            "built with {version}: topdown probes Go 1.17 and later, whose register calling \
             convention keeps the running goroutine in R14 (rebuild with a newer Go)"
        )));
    }
    if file.architecture() != object::Architecture::X86_64 {
        return Err(refuse(
            "a Go binary for another architecture than x86-64: its goroutines cannot be followed"
                .into(),
        ));
    }
    let section = file.section_by_name(".gopclntab").ok_or_else(|| {
        refuse("a Go binary without .gopclntab: its functions cannot be found".into())
    })?;
    let data = section
        .data()
        .map_err(|err| refuse(format!("reading .gopclntab: {err}")))?;
    let text = file
        .section_by_name(".text")
        .map_or(0, |section| section.address());
    let table = pclntab::parse(data, section.address(), text, &Sections { file }).map_err(
        |err| match err {
            pclntab::TableError::Unsupported(release) => refuse(format!(
                "its function table (.gopclntab) has the format of {release}, which topdown \
                 does not read: rebuild with Go 1.18 or later"
            )),
            pclntab::TableError::Corrupt(why) => {
                refuse(format!("its function table (.gopclntab) is damaged: {why}"))
            }
        },
    )?;
    layout::check(file).map_err(|why| refuse(why))?;

    let by_name = pclntab::by_name(&table.functions);
    let mut hooks = Vec::new();
    for (name, kind) in HOOKS {
        let function = by_name.get(name).ok_or_else(|| {
            refuse(format!(
                "its runtime has no {name}, which topdown hooks to follow goroutines"
            ))
        })?;
        hooks.push((function.entry, kind));
    }
    let inlined: std::collections::BTreeSet<&str> = table
        .functions
        .iter()
        .flat_map(|function| function.inlined.iter().map(String::as_str))
        .collect();
    let functions = table
        .functions
        .iter()
        .map(|function| {
            let wrapper = by_name
                .get(function.name.as_str())
                .is_some_and(|named| named.entry != function.entry);
            GoFunction {
                name: function.name.clone(),
                address: function.entry,
                size: function.end.saturating_sub(function.entry),
                refused: if wrapper {
                    Some("an ABI wrapper, which jumps to the function of the same name")
                } else {
                    refusal(function, inlined.contains(function.name.as_str()))
                },
            }
        })
        .collect();
    let inlined_only = inlined
        .iter()
        .filter(|name| !by_name.contains_key(*name))
        .map(|name| (*name).to_owned())
        .collect();
    if !table.inlining_known {
        log::warn!(
            "{}: the inline trees of its function table were not found: calls of inlined \
             functions are not detected",
            path.display()
        );
    }
    Ok(GoImage {
        version: version_text.unwrap_or_else(|| match table.format {
            pclntab::Format::Go118 => "go1.18-1.19 (function table format)".into(),
            pclntab::Format::Go120 => "go1.20+ (function table format)".into(),
        }),
        functions,
        inlined_only,
        inlining_known: table.inlining_known,
        hooks,
    })
}

/// Why a Go function cannot be probed.
fn refusal(function: &pclntab::GoFunc, inlined: bool) -> Option<&'static str> {
    if function.flag & pclntab::FLAG_ASM != 0 {
        return Some("Go assembly: it need not keep the goroutine in R14");
    }
    if function.flag & pclntab::FLAG_SPWRITE != 0 {
        return Some("switches stacks");
    }
    if ENDS_GOROUTINES.contains(&function.name.as_str()) {
        return Some("the goroutine ends inside it");
    }
    if inlined {
        return Some(
            "also inlined into callers, whose calls cannot be probed: mark it //go:noinline or \
             build with -gcflags=-l",
        );
    }
    None
}

/// The message for a name that exists only inlined.
pub fn inlined_only_message(name: &str) -> String {
    format!(
        "{name} is inlined into every caller: it has no code of its own to probe (mark it \
         //go:noinline or build with -gcflags=-l)"
    )
}

impl GoImage {
    /// Whether `address` lies in a Go function (cgo's C functions do not).
    pub fn covers(&self, address: u64) -> bool {
        let after = self
            .functions
            .partition_point(|function| function.address <= address);
        after
            .checked_sub(1)
            .and_then(|index| self.functions.get(index))
            .is_some_and(|function| address < function.address + function.size.max(1))
    }
}
