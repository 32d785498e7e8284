//! Function symbols of an ELF file and the file offsets uprobes attach at.
//!
//! aya resolves symbols by exact name only and never looks at separate debug files, so topdown
//! reads `.symtab` and `.dynsym` itself, follows `.gnu_debuglink` and the build-id tree when a
//! binary is stripped, and attaches by file offset.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _, SymbolKind};

use super::x86;
use crate::{
    error::{Failure, fail},
    ui::progress::Progress,
};

/// An ELF file's loaded segments with contents in the file, `(address, size in the file,
/// file offset)`: how an address of the file's own address space maps to the file offset a
/// uprobe takes (the program headers' `p_vaddr`, `p_filesz` and `p_offset`, elf(5)).
#[derive(Clone, Debug, Default)]
pub struct Segments(Vec<(u64, u64, u64)>);

impl Segments {
    pub fn of(file: &object::File<'_>) -> Self {
        Self(
            file.segments()
                .filter_map(|segment| {
                    let (offset, size) = segment.file_range();
                    (size > 0).then_some((segment.address(), size, offset))
                })
                .collect(),
        )
    }

    /// The file offset of `address`; `None` outside every segment's file contents.
    pub fn file_offset(&self, address: u64) -> Option<u64> {
        self.0
            .iter()
            .find(|(start, size, _)| address >= *start && address < start + size)
            .map(|(start, _, offset)| address - start + offset)
    }

    /// The end of the highest segment's file contents, in the file's address space.
    pub fn end(&self) -> u64 {
        self.0
            .iter()
            .map(|(start, size, _)| start + size)
            .max()
            .unwrap_or_default()
    }
}

/// A function defined in a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionSymbol {
    /// The raw (mangled) name.
    pub name: String,
    /// The other names of the same address (aliases such as `_IO_fclose` of `fclose`, and
    /// versioned names such as `fclose@@GLIBC_2.2.5`), which resolve to this function too.
    pub aliases: Vec<String>,
    /// Virtual address in the file's own address space.
    pub address: u64,
    /// Offset of the first instruction in the file: what uprobes take.
    pub offset: u64,
    /// Size in bytes (0 when the symbol table does not say).
    pub size: u64,
    /// The instructions that leave the function (`ret`, tail-call `jmp`, its cold fragments'
    /// included), where exit probes go instead of a uretprobe. `None`: not decoded (not x86-64,
    /// or no size); `Some(empty)`: it never returns normally (e.g. it always throws).
    pub exits: Option<Vec<x86::Exit>>,
    /// Its code: `[start, end)` addresses of its body, then of its cold fragments.
    pub ranges: Vec<(u64, u64)>,
    /// What the kernel does with a probe on its first instruction (`None`: not x86-64).
    pub entry_probe: Option<x86::ProbeCheck>,
    /// It reads its return address (itself or through a tail jump): a uretprobe would give
    /// it the kernel's trampoline instead (see [`x86::return_address_use`]).
    pub reads_return_address: bool,
    /// A Go function, from `.gopclntab` (`super::go`); cgo's C functions in a Go binary are
    /// not.
    pub go: bool,
}

/// A file's functions, sorted by address, and where its loaded image ends.
#[derive(Clone, Debug, Default)]
pub struct FileFunctions {
    pub functions: Vec<FunctionSymbol>,
    /// End of the highest loaded segment (file virtual address).
    pub image_end: u64,
    /// PLT stubs and `DT_NEEDED` libraries (x86-64).
    pub imports: super::plt::Imports,
    /// PLT stubs that probed functions tail-call, by stub address: the library and address of
    /// the function they are bound to (filled in by [`super::resolve`]).
    pub bound: HashMap<u64, (PathBuf, u64)>,
    /// Names of `STT_GNU_IFUNC` symbols: their address is a resolver, not the code a call
    /// bound to the name runs (glibc's `memcpy` picks an implementation at load time).
    pub ifunc_names: std::collections::HashSet<String>,
    /// A Go binary's runtime: what its Go functions' probes hook.
    pub go: Option<GoRuntime>,
}

/// What the probes of a Go binary's functions need beyond the functions themselves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GoRuntime {
    /// The Go release it was built with (`go1.19.8`).
    pub version: String,
    /// `(file offset, topdown_common::go_hook kind)` of the runtime hooks.
    pub hooks: Vec<(u64, u64)>,
    /// Functions that exist only inlined into others (no code of their own), by name.
    pub inlined_only: Vec<String>,
}

impl FileFunctions {
    /// The function whose body holds `address` (its start, or inside: hand-written code such
    /// as glibc's string functions jumps into the middle of another symbol).
    pub fn containing(&self, address: u64) -> Option<&FunctionSymbol> {
        let after = self
            .functions
            .partition_point(|function| function.address <= address);
        let function = self.functions.get(after.checked_sub(1)?)?;
        (address < function.address + function.size.max(1)).then_some(function)
    }
}

/// GCC's hot/cold splitting names the cold part of `f` `f.cold` or `f.cold.N` (C++:
/// `_Z1hi.cold`, demangled `h(int) [clone .cold]`): the parent's raw name. `.part.N`
/// (partial inlining) is a function of its own, called and returning like any other.
fn cold_parent(name: &str) -> Option<&str> {
    let (parent, rest) = name.rsplit_once(".cold")?;
    let numbered = rest.is_empty()
        || rest
            .strip_prefix('.')
            .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()));
    (numbered && !parent.is_empty()).then_some(parent)
}

/// Reads every function of `path` (from a debug file if `path` is stripped), with file offsets
/// computed against `path`'s own program headers.
pub fn functions(path: &Path) -> Result<FileFunctions> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file = object::File::parse(&*data).map_err(|err| {
        fail(
            Failure::Usage,
            format!("{} is not an ELF file: {err}", path.display()),
        )
    })?;
    let go = if super::go::is_go(&file) {
        Some(super::go::read(&file, path)?)
    } else {
        None
    };
    let segments = Segments::of(&file);
    let to_offset = |address: u64| segments.file_offset(address);

    let x86_64 = file.architecture() == object::Architecture::X86_64;
    let mut names: Vec<(String, u64, u64)> = symbols_of(&file);
    let has_symtab = file.section_by_name(".symtab").is_some();
    let debug = if has_symtab {
        None
    } else {
        find_debug_file(&file, path)?
    };
    if let Some(debug) = debug {
        let debug_data =
            std::fs::read(&debug).with_context(|| format!("reading {}", debug.display()))?;
        let debug_file = object::File::parse(&*debug_data)
            .with_context(|| format!("{} is not an ELF file", debug.display()))?;
        names.extend(symbols_of(&debug_file));
    }
    // A Go binary's own functions come from its function table (the symbol table, when there
    // is one, names the same ones); what lies outside them is cgo's C code.
    let mut go_refused: HashMap<u64, &'static str> = HashMap::new();
    if let Some(go) = &go {
        // The function table names every instantiation of a generic function `pkg.F[...]`;
        // a symbol table, when there is one, names its type arguments' shapes.
        let shapes: HashMap<u64, String> = names
            .iter()
            .filter(|(name, _, _)| name.contains('['))
            .map(|(name, address, _)| (*address, name.clone()))
            .collect();
        names.retain(|(_, address, _)| !go.covers(*address));
        for function in &go.functions {
            let name = match shapes.get(&function.address) {
                Some(shaped)
                    if function.name.contains("[...]")
                        && shaped.split('[').next() == function.name.split('[').next() =>
                {
                    shaped.clone()
                }
                _ => function.name.clone(),
            };
            names.push((name, function.address, function.size));
            go_refused.insert(function.address, function.refused.unwrap_or_default());
        }
    }
    let mut functions: Vec<FunctionSymbol> = names
        .into_iter()
        .filter_map(|(name, address, size)| {
            to_offset(address).map(|offset| FunctionSymbol {
                go: go_refused.contains_key(&address),
                name,
                aliases: Vec::new(),
                address,
                offset,
                size,
                exits: None,
                ranges: vec![(address, address + size)],
                entry_probe: None,
                reads_return_address: false,
            })
        })
        .collect();
    // One entry per address, named by its shortest unversioned name; the other names
    // (versioned names, weak/global pairs, internal aliases) are kept as its aliases.
    functions.sort_by(|a, b| {
        a.address
            .cmp(&b.address)
            .then(a.name.contains('@').cmp(&b.name.contains('@')))
            .then(a.name.len().cmp(&b.name.len()))
            .then(a.name.cmp(&b.name))
    });
    functions.dedup_by(|alias, kept| {
        if alias.address != kept.address {
            return false;
        }
        // An alias may carry the size the kept name lacks (a label with size 0 beside the
        // sized symbol of hand-written code).
        if kept.size == 0 && alias.size > 0 {
            kept.size = alias.size;
            kept.ranges = alias.ranges.clone();
        }
        if alias.name != kept.name && !kept.aliases.contains(&alias.name) {
            kept.aliases.push(std::mem::take(&mut alias.name));
        }
        true
    });
    attach_cold_fragments(&mut functions);
    if x86_64 {
        let progress = (functions.len() >= super::PROGRESS_FROM).then(|| {
            Progress::counting(
                &format!("decoding {}", path.display()),
                functions.len() as u64,
                "functions",
            )
        });
        let code_at = |address: u64, size: u64| {
            let start = to_offset(address)? as usize;
            data.get(start..start.checked_add(size as usize)?)
        };
        for function in &mut functions {
            if let Some(progress) = &progress {
                progress.inc(1);
            }
            // An instruction is at most 15 bytes; symbols without a size still start one.
            function.entry_probe = code_at(function.address, 15)
                .or_else(|| code_at(function.address, function.size))
                .map(x86::check);
            if function.size == 0 {
                continue;
            }
            let mut exits = Vec::new();
            let mut decoded = true;
            for (start, end) in &function.ranges {
                match code_at(*start, end - start) {
                    Some(code) => exits.extend(x86::exits(code, *start, &function.ranges)),
                    None => decoded = false,
                }
            }
            for exit in &mut exits {
                exit.offset = to_offset(exit.address).unwrap_or_default();
            }
            function.exits = decoded.then_some(exits);
        }
        mark_return_address_readers(&mut functions, |function| {
            // A symbol without a size is read as far as a short prologue goes.
            let size = if function.size == 0 {
                64
            } else {
                function.size
            };
            code_at(function.address, size).or_else(|| code_at(function.address, 15))
        });
        for function in functions.iter_mut().filter(|function| function.go) {
            go_function_probes(function, go_refused.get(&function.address).copied());
        }
    }
    let image_end = segments.end();
    let imports = if x86_64 {
        super::plt::imports(&file)
    } else {
        super::plt::Imports::default()
    };
    // STT_GNU_IFUNC (the GNU extension of the ELF symbol types).
    let ifunc_names = file
        .dynamic_symbols()
        .chain(file.symbols())
        .filter(|symbol| {
            matches!(symbol.flags(), object::SymbolFlags::Elf { st_info, .. }
                if st_info.st_type() == object::elf::STT_GNU_IFUNC)
        })
        .filter_map(|symbol| symbol.name().ok().map(str::to_owned))
        .collect();
    Ok(FileFunctions {
        functions,
        image_end,
        imports,
        bound: HashMap::new(),
        ifunc_names,
        go: go.map(|go| GoRuntime {
            version: go.version,
            hooks: go
                .hooks
                .iter()
                .filter_map(|(address, kind)| Some((to_offset(*address)?, *kind)))
                .collect(),
            inlined_only: go.inlined_only,
        }),
    })
}

/// Marks the functions that read their return address, directly or through tail jumps with
/// the return address still on top of the stack (`setjmp` -> `__sigsetjmp`).
fn mark_return_address_readers<'a>(
    functions: &mut [FunctionSymbol],
    code_of: impl Fn(&FunctionSymbol) -> Option<&'a [u8]>,
) {
    let uses: Vec<x86::ReturnAddressUse> = functions
        .iter()
        .map(|function| {
            code_of(function).map_or(x86::ReturnAddressUse::Unused, |code| {
                x86::return_address_use(code, function.address)
            })
        })
        .collect();
    let index_at = |address: u64| {
        functions
            .binary_search_by_key(&address, |function| function.address)
            .ok()
    };
    let reads: Vec<bool> = (0..functions.len())
        .map(|start| {
            // Follows tail jumps, a few at most (a cycle ends the walk).
            let mut at = start;
            for _ in 0..8 {
                match uses[at] {
                    x86::ReturnAddressUse::Reads => return true,
                    x86::ReturnAddressUse::Unused => return false,
                    x86::ReturnAddressUse::TailJump(target) => match index_at(target) {
                        Some(next) => at = next,
                        None => return false,
                    },
                }
            }
            false
        })
        .collect();
    for (function, reads) in functions.iter_mut().zip(reads) {
        function.reads_return_address = reads;
    }
}

/// A Go function's probes: the jump back to its first instruction after the prologue's
/// `runtime.morestack` call is no exit (the function starts again on the grown stack, the
/// same call), and a function topdown cannot follow (`super::go`), or whose exits were not
/// decoded, is refused: Go functions never get a uretprobe.
fn go_function_probes(function: &mut FunctionSymbol, refused: Option<&'static str>) {
    let start = function.address;
    if let Some(exits) = &mut function.exits {
        exits.retain(|exit| exit.kind != x86::ExitKind::Jump(start));
    }
    let refused = refused.filter(|why| !why.is_empty()).or_else(|| {
        function
            .exits
            .is_none()
            .then_some("its code could not be decoded")
    });
    if let Some(why) = refused {
        function.entry_probe = Some(x86::ProbeCheck::Refused(why));
    }
}

/// Removes cold fragments from `functions` and adds their code to their parent's ranges: they
/// are never entered by a call, and their exits are the parent's. A fragment whose parent is
/// not found (or that has no size) is dropped too: it is no function to probe.
fn attach_cold_fragments(functions: &mut Vec<FunctionSymbol>) {
    let mut fragments = Vec::new();
    functions.retain(|function| {
        let cold = cold_parent(&function.name).is_some();
        if cold {
            fragments.push(function.clone());
        }
        !cold
    });
    for fragment in fragments {
        let Some(parent) = cold_parent(&fragment.name) else {
            continue;
        };
        // Two static functions may share a name: the nearest one is the fragment's.
        let parent = functions
            .iter_mut()
            .filter(|function| function.name == parent)
            .min_by_key(|function| function.address.abs_diff(fragment.address));
        match parent {
            Some(parent) if fragment.size > 0 => parent
                .ranges
                .push((fragment.address, fragment.address + fragment.size)),
            _ => log::debug!("cold fragment {} without a parent", fragment.name),
        }
    }
}

/// Defined function symbols with their addresses and sizes, from both symbol tables.
fn symbols_of(file: &object::File<'_>) -> Vec<(String, u64, u64)> {
    file.symbols()
        .chain(file.dynamic_symbols())
        .filter(|symbol| {
            symbol.kind() == SymbolKind::Text && symbol.is_definition() && symbol.address() != 0
        })
        .filter_map(|symbol| {
            Some((
                symbol.name().ok()?.to_owned(),
                symbol.address(),
                symbol.size(),
            ))
        })
        .collect()
}

/// The separate debug file of a stripped binary: `.gnu_debuglink` (next to it, in `.debug/`,
/// under `/usr/lib/debug/<dir>/`, CRC-checked) or the build-id tree.
fn find_debug_file(file: &object::File<'_>, path: &Path) -> Result<Option<PathBuf>> {
    if let Ok(Some((name, crc))) = file.gnu_debuglink() {
        let name = String::from_utf8_lossy(name).into_owned();
        let dir = path.parent().unwrap_or(Path::new("/"));
        let canonical_dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        let candidates = [
            dir.join(&name),
            dir.join(".debug").join(&name),
            Path::new("/usr/lib/debug")
                .join(canonical_dir.strip_prefix("/").unwrap_or(&canonical_dir))
                .join(&name),
        ];
        for candidate in candidates.into_iter().filter(|candidate| candidate != path) {
            let Ok(data) = std::fs::read(&candidate) else {
                continue;
            };
            if crc32(&data) == crc {
                return Ok(Some(candidate));
            }
            log::warn!(
                "{}: CRC does not match the debuglink of {}",
                candidate.display(),
                path.display()
            );
        }
    }
    if let Ok(Some(id)) = file.build_id()
        && id.len() >= 2
    {
        let hex: String = id.iter().map(|byte| format!("{byte:02x}")).collect();
        let candidate = PathBuf::from(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &hex[..2],
            &hex[2..]
        ));
        if candidate.exists() {
            return Ok(Some(candidate));
        }
    }
    Ok(None)
}

/// CRC-32 (IEEE, as zlib's `crc32`), the checksum `.gnu_debuglink` records.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Fails clearly if `path` is not a readable regular file.
pub fn check_file(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(_) => Err(fail(
            Failure::Usage,
            format!(
                "probe target {} is not a regular file: give an executable or shared object",
                path.display()
            ),
        )),
        Err(err) => Err(fail(
            Failure::Usage,
            format!("probe target {}: {err}", path.display()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_fragments_name_their_parent() {
        assert_eq!(cold_parent("h.cold"), Some("h"));
        assert_eq!(cold_parent("foo.cold.12"), Some("foo"));
        assert_eq!(cold_parent("_Z1hi.cold"), Some("_Z1hi"));
        assert_eq!(cold_parent("foo.part.0"), None);
        assert_eq!(cold_parent("coldstart"), None);
        assert_eq!(cold_parent("foo.cold.x"), None);
    }

    /// A bad probe target is a usage error (exit 2; docs/usage.md, Exit status), a directory
    /// included.
    #[test]
    fn a_directory_target_is_a_usage_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = check_file(dir.path()).unwrap_err();
        assert_eq!(crate::error::failure_of(&err), Some(Failure::Usage));
        assert!(err.to_string().contains("is not a regular file"), "{err}");
    }

    #[test]
    fn crc32_matches_zlib() {
        // zlib.crc32(b"123456789") == 0xCBF43926, the standard check value.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }
}
