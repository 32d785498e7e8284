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
        || function_table(file).is_some()
}

/// `.gopclntab`; in a position-independent build, `.data.rel.ro.gopclntab`.
fn function_table<'data, 'file>(
    file: &'file object::File<'data>,
) -> Option<object::Section<'data, 'file>> {
    file.section_by_name(".gopclntab")
        .or_else(|| file.section_by_name(".data.rel.ro.gopclntab"))
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
    let section = function_table(file).ok_or_else(|| {
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
    layout::check(file).map_err(&refuse)?;

    let wrappers = abi_wrappers(&table.functions, &Sections { file });
    let by_name = pclntab::by_name(&table.functions, &wrappers);
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
            let wrapper = wrappers.contains(&function.entry);
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

/// Entries of the ABI wrappers: the linker makes one for callers of the other calling
/// convention (`runtime.goexit1.abi0` in a symbol table), under the same name in the function
/// table, and it is a few instructions that end in a jump to the function. Several functions
/// may share a name otherwise too: each instantiation of a generic function is `pkg.F[...]`.
fn abi_wrappers(
    functions: &[pclntab::GoFunc],
    memory: &dyn pclntab::Memory,
) -> std::collections::HashSet<u64> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl};
    let mut entries: std::collections::HashMap<&str, Vec<u64>> = std::collections::HashMap::new();
    for function in functions {
        entries
            .entry(function.name.as_str())
            .or_default()
            .push(function.entry);
    }
    let mut wrappers = std::collections::HashSet::new();
    for function in functions {
        let Some(same_name) = entries
            .get(function.name.as_str())
            .filter(|all| all.len() > 1)
        else {
            continue;
        };
        let size = function.end.saturating_sub(function.entry).min(64);
        let Some(code) = memory.read(function.entry, size as usize) else {
            continue;
        };
        let mut decoder = Decoder::with_ip(64, code, function.entry, DecoderOptions::NONE);
        for _ in 0..6 {
            if !decoder.can_decode() {
                break;
            }
            let instruction = decoder.decode();
            match instruction.flow_control() {
                FlowControl::Next => continue,
                FlowControl::UnconditionalBranch => {
                    let target = instruction.near_branch_target();
                    if target != function.entry && same_name.contains(&target) {
                        wrappers.insert(function.entry);
                    }
                }
                _ => {}
            }
            break;
        }
    }
    wrappers
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

#[cfg(test)]
mod tests {
    //! Against Go's own tools, on programs built here with the Go toolchain `cargo xtask setup`
    //! installs (Debian's `golang-go`): `go tool nm` for the functions, the compiler's `-m`
    //! report for inlining, DWARF for the runtime's layout.

    use std::{
        collections::{BTreeMap, BTreeSet},
        path::{Path, PathBuf},
        process::Command,
    };

    use super::*;
    use crate::functions::symbols::{elf, x86};

    fn workload(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/workloads")
            .join(name)
    }

    /// Builds `source` with `flags` into a temporary directory, offline, with Go's build cache
    /// in the workspace's `target/` (shared with the benchmark's, safe for concurrent builds);
    /// `None` (after saying why) where there is no Go toolchain outside CI.
    fn go_build(source: &str, flags: &[&str]) -> Option<(tempfile::TempDir, PathBuf, String)> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let out = dir.path().join("program");
        let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/go-cache");
        let built = Command::new("go")
            .arg("build")
            .args(flags)
            .arg("-o")
            .arg(&out)
            .arg(workload(source))
            .env("GOCACHE", cache.join("build"))
            .env("GOPATH", cache.join("gopath"))
            .env("GOFLAGS", "")
            .env("GOPROXY", "off")
            .env("GO111MODULE", "off")
            .output();
        match built {
            Ok(output) if output.status.success() => {
                let report = String::from_utf8_lossy(&output.stderr).into_owned();
                Some((dir, out, report))
            }
            Ok(output) => panic!(
                "go build {source}: {}",
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(err) if std::env::var_os("CI").is_none() => {
                eprintln!(
                    "SKIPPED: Go symbol tests: no Go toolchain ({err}); cargo xtask setup installs it"
                );
                None
            }
            Err(err) => panic!("go: {err} (cargo xtask setup installs golang-go)"),
        }
    }

    /// `go tool nm -size` text symbols: address -> (name, size), several names at an address
    /// (`runtime.text` is the first function's address too).
    fn nm(program: &Path) -> BTreeMap<u64, Vec<(String, u64)>> {
        let output = Command::new("go")
            .args(["tool", "nm", "-size"])
            .arg(program)
            .output()
            .expect("go tool nm");
        assert!(output.status.success());
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                let address = u64::from_str_radix(words.next()?, 16).ok()?;
                let size = words.next()?.parse().ok()?;
                let kind = words.next()?;
                let name = words.collect::<Vec<_>>().join(" ");
                matches!(kind, "T" | "t").then_some((address, (name, size)))
            })
            .fold(BTreeMap::new(), |mut all, (address, symbol)| {
                all.entry(address).or_insert_with(Vec::new).push(symbol);
                all
            })
    }

    #[test]
    fn go_functions_are_those_go_tool_nm_lists() {
        let Some((_dir, program, _)) = go_build("goroutines.go", &[]) else {
            return;
        };
        let file = elf::functions(&program).expect("reading the Go program");
        let listed = nm(&program);
        let go: Vec<&elf::FunctionSymbol> = file
            .functions
            .iter()
            .filter(|function| function.go)
            .collect();
        assert!(go.len() > 1000, "{} Go functions", go.len());
        for function in &go {
            let symbols = listed.get(&function.address).cloned().unwrap_or_default();
            // nm names ABI wrappers `.abi0`; the function table by the function's own name.
            let Some((name, size)) = symbols
                .iter()
                .find(|(name, _)| name.strip_suffix(".abi0").unwrap_or(name) == function.name)
            else {
                panic!(
                    "{} at {:#x}: go tool nm has {symbols:?} there",
                    function.name, function.address
                );
            };
            // The table's extent reaches the next function (alignment padding included).
            assert!(*size <= function.size, "{name}: {size} > {}", function.size);
        }
        let work = go
            .iter()
            .find(|function| function.name == "main.work")
            .expect("main.work");
        assert!(
            work.entry_probe
                .as_ref()
                .is_some_and(|check| !matches!(check, x86::ProbeCheck::Refused(_)))
        );
        // Its exits: every `ret`, and not the jump back to its start after morestack.
        let exits = work.exits.as_ref().expect("decoded");
        assert!(!exits.is_empty());
        assert!(
            exits.iter().all(|exit| exit.kind == x86::ExitKind::Return),
            "{exits:?}"
        );
        // The runtime hooks are where nm puts those functions.
        let hooks = file.go.as_ref().expect("a Go runtime").hooks.clone();
        let address_of = |wanted: &str| {
            listed
                .iter()
                .find(|(_, symbols)| symbols.iter().any(|(name, _)| name == wanted))
                .map(|(address, _)| *address)
                .unwrap_or_else(|| panic!("{wanted} not in nm"))
        };
        let text = file
            .functions
            .iter()
            .find(|function| function.name == "main.work")
            .map(|function| function.address - function.offset)
            .expect("main.work");
        let expected: Vec<(u64, u64)> = [
            ("runtime.gogo.abi0", go_hook::GOGO),
            ("runtime.mcall", go_hook::MCALL),
            ("runtime.morestack.abi0", go_hook::MORESTACK),
            ("runtime.goexit1", go_hook::GOEXIT),
        ]
        .iter()
        .map(|(name, kind)| (address_of(name) - text, *kind))
        .collect();
        assert_eq!(hooks, expected);
        // Assembly and the goroutine's end are refused.
        let refused = |name: &str| {
            go.iter()
                .find(|function| function.name == name && !function.name.is_empty())
                .and_then(|function| match &function.entry_probe {
                    Some(x86::ProbeCheck::Refused(why)) => Some(*why),
                    _ => None,
                })
        };
        assert_eq!(
            refused("runtime.memmove"),
            Some("Go assembly: it need not keep the goroutine in R14")
        );
        assert_eq!(
            refused("runtime.goexit1"),
            Some("the goroutine ends inside it")
        );
        assert_eq!(refused("main.work"), None);
    }

    #[test]
    fn stripped_go_binaries_keep_their_functions() {
        let Some((_dir, program, _)) = go_build("goroutines.go", &[]) else {
            return;
        };
        let Some((_stripped_dir, stripped, _)) = go_build("goroutines.go", &["-ldflags=-s -w"])
        else {
            return;
        };
        let data = std::fs::read(&stripped).expect("reading");
        let object = object::File::parse(&*data).expect("an ELF file");
        use object::Object as _;
        assert!(object.section_by_name(".symtab").is_none(), "not stripped");
        assert!(
            object.section_by_name(".debug_info").is_none(),
            "not stripped"
        );
        let functions = |path: &Path| -> Vec<(String, u64, bool)> {
            elf::functions(path)
                .expect("reading")
                .functions
                .into_iter()
                .filter(|function| function.go)
                .map(|function| {
                    let refused = matches!(function.entry_probe, Some(x86::ProbeCheck::Refused(_)));
                    (function.name, function.address, refused)
                })
                .collect()
        };
        let full = functions(&program);
        let bare = functions(&stripped);
        // Only the symbol table knows a generic instantiation's shapes (`Sum[go.shape.int_0]`);
        // the function table says `Sum[...]`.
        let same =
            |(name, address, refused): &(String, u64, bool),
             (bare_name, bare_address, bare_refused): &(String, u64, bool)| {
                address == bare_address
                    && refused == bare_refused
                    && (name == bare_name
                        || (bare_name.contains("[...]")
                            && name.split('[').next() == bare_name.split('[').next()))
            };
        let differing: Vec<_> = full
            .iter()
            .zip(&bare)
            .filter(|(a, b)| !same(a, b))
            .take(5)
            .collect();
        assert!(
            differing.is_empty() && full.len() == bare.len(),
            "{} vs {}: {differing:?}",
            full.len(),
            bare.len()
        );
        let version = read(&object, &stripped).expect("a Go image").version;
        let go_version = Command::new("go")
            .arg("version")
            .output()
            .expect("go version");
        assert!(
            String::from_utf8_lossy(&go_version.stdout).contains(&format!("{version} ")),
            "{version}"
        );
    }

    #[test]
    fn inlined_functions_are_those_the_compiler_inlined() {
        let Some((_dir, program, report)) = go_build("gofuncs.go", &["-gcflags=-m"]) else {
            return;
        };
        // `./gofuncs.go:76:48: inlining call to partlyInlined` (package main's own names
        // without their package).
        let reported: BTreeSet<String> = report
            .lines()
            .filter_map(|line| line.split("inlining call to ").nth(1))
            .map(|name| {
                if name.contains('.') {
                    name.to_owned()
                } else {
                    format!("main.{name}")
                }
            })
            .collect();
        let data = std::fs::read(&program).expect("reading");
        let object = object::File::parse(&*data).expect("an ELF file");
        let image = read(&object, &program).expect("a Go image");
        assert!(image.inlining_known);
        // Calls the compiler inlined into package main whose code is still there (an inlined
        // body folded away entirely leaves no trace in the binary).
        let found: BTreeSet<String> = image
            .inlined_only
            .iter()
            .cloned()
            .chain(
                image
                    .functions
                    .iter()
                    .filter(|function| function.refused.is_some_and(|why| why.contains("inlined")))
                    .map(|function| function.name.clone()),
            )
            .filter(|name| reported.contains(name) || name.starts_with("main."))
            .collect();
        assert!(
            found.is_subset(&reported),
            "{found:?} not all in {reported:?}"
        );
        for name in ["main.getppid", "main.partlyInlined"] {
            assert!(found.contains(name), "{name}: {found:?}");
        }
        assert!(image.inlined_only.contains(&"main.getppid".to_owned()));
        let partly = image
            .functions
            .iter()
            .find(|function| function.name == "main.partlyInlined")
            .expect("its code is kept for the function value");
        assert!(
            partly
                .refused
                .is_some_and(|why| why.contains("inlined into callers"))
        );
        let plain = image
            .functions
            .iter()
            .find(|function| function.name == "main.plain");
        assert_eq!(plain.map(|function| function.refused), Some(None));
    }

    #[test]
    fn the_runtime_layout_read_is_the_binarys_dwarf() {
        let Some((_dir, program, _)) = go_build("goroutines.go", &[]) else {
            return;
        };
        let data = std::fs::read(&program).expect("reading");
        let object = object::File::parse(&*data).expect("an ELF file");
        let found = layout::find_for_tests(&object).expect("DWARF");
        assert_eq!(found, [Some(0), Some(8), Some(0), Some(16)]);
        assert_eq!(layout::check(&object), Ok(()));
    }
}
