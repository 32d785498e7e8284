//! Resolving `-u TARGET:FUNC` to attach points: which file, which file offset, which name.
//!
//! One module per step: [`target`] finds the file (paths, library names through the traced
//! processes' mappings, ld.so.cache, standard directories), [`elf`] reads its functions (and a
//! stripped binary's debug file), [`matching`] compares what the user typed with raw and
//! demangled names and globs.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
};

use anyhow::Result;

use crate::{
    error::{Failure, fail},
    ui::progress::Progress,
};

/// Functions in a file from which reading it shows progress on a terminal: a large binary
/// (a browser, a database server) has hundreds of thousands and takes seconds; a small one
/// would only flash a bar.
const PROGRESS_FROM: usize = 20_000;

pub mod elf;
pub mod go;
pub mod matching;
pub mod plt;
pub mod target;
pub mod x86;

/// One `-u TARGET:FUNC`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    pub target: String,
    pub function: String,
}

impl ProbeSpec {
    /// Splits at the first `:` that is not part of a C++/Rust `::` (targets are paths or
    /// library names, which have no `::`; functions may).
    pub fn parse(text: &str) -> Result<Self> {
        let bytes = text.as_bytes();
        let mut split = None;
        let mut index = 0;
        while index < bytes.len() {
            if bytes[index] == b':' {
                if bytes.get(index + 1) == Some(&b':') {
                    index += 2;
                    continue;
                }
                split = Some(index);
                break;
            }
            index += 1;
        }
        let usage = || {
            fail(
                Failure::Usage,
                format!(
                    "-u {text}: expected TARGET:FUNC, e.g. ./app:parse_request, libc:malloc, ./app:'myapp::db::*'"
                ),
            )
        };
        let split = split.ok_or_else(usage)?;
        let (target, function) = (&text[..split], &text[split + 1..]);
        if target.is_empty() || function.is_empty() {
            return Err(usage());
        }
        Ok(Self {
            target: target.to_owned(),
            function: function.to_owned(),
        })
    }
}

/// A function to probe: its symbol (offset, code, exits, how to probe its entry and returns)
/// in the file to attach to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedFunction {
    /// The file to attach to (through `/proc/PID/root` for a container's library).
    pub target: PathBuf,
    /// Rust without hash, C++ with parameters.
    pub display: String,
    pub symbol: elf::FunctionSymbol,
}

/// The functions to probe, and every function of their files (tail-call targets).
#[derive(Clone, Debug)]
pub struct Resolution {
    pub functions: Vec<ResolvedFunction>,
    pub files: HashMap<PathBuf, elf::FileFunctions>,
}

/// Resolves every spec; a glob that matches nothing or an unknown function is an error, as is
/// a target that cannot be found. Functions reached twice are listed once.
pub fn resolve(specs: &[ProbeSpec], pids: &[u32]) -> Result<Resolution> {
    let mut files: HashMap<PathBuf, Vec<(elf::FunctionSymbol, matching::Names)>> = HashMap::new();
    let mut code: HashMap<PathBuf, elf::FileFunctions> = HashMap::new();
    let mut resolved: Vec<(ResolvedFunction, matching::Names)> = Vec::new();
    // What `resolved` holds, by file and offset: a glob over a library matches thousands.
    let mut seen: HashSet<(PathBuf, u64)> = HashSet::new();
    for spec in specs {
        let path = target::find_target(&spec.target, pids)?;
        elf::check_file(&path)?;
        if !files.contains_key(&path) {
            let file = elf::functions(&path)?;
            let functions = file.functions.clone();
            code.insert(path.clone(), file);
            let progress = (functions.len() >= PROGRESS_FROM).then(|| {
                Progress::counting(
                    &format!("demangling {}", path.display()),
                    functions.len() as u64,
                    "symbols",
                )
            });
            let named = functions
                .into_iter()
                .map(|function| {
                    if let Some(progress) = &progress {
                        progress.inc(1);
                    }
                    let mut names = matching::names(&function.name);
                    names.add_symbol_aliases(&function.aliases);
                    (function, names)
                })
                .collect();
            files.insert(path.clone(), named);
        }
        let functions = files.get(&path).map(Vec::as_slice).unwrap_or(&[]);
        let matched: Vec<&(elf::FunctionSymbol, matching::Names)> = functions
            .iter()
            .filter(|(_, names)| matching::matches(&spec.function, names))
            .collect();
        if matched.is_empty() {
            // A Go function inlined into every caller has no code: say so rather than "no
            // such function".
            let inlined: Vec<&String> = code
                .get(&path)
                .and_then(|file| file.go.as_ref())
                .map(|go| {
                    go.inlined_only
                        .iter()
                        .filter(|name| matching::matches(&spec.function, &matching::names(name)))
                        .collect()
                })
                .unwrap_or_default();
            if !inlined.is_empty() {
                return Err(fail(
                    Failure::Usage,
                    format!(
                        "-u {}:{}: {}",
                        spec.target,
                        spec.function,
                        inlined
                            .iter()
                            .map(|name| go::inlined_only_message(name))
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                ));
            }
            let hint = close_matches(&spec.function, functions);
            let go = code.get(&path).is_some_and(|file| file.go.is_some());
            return Err(fail(
                Failure::Usage,
                format!(
                    "-u {}:{}: no function of {} matches{}{}",
                    spec.target,
                    spec.function,
                    path.display(),
                    if hint.is_empty() {
                        String::new()
                    } else {
                        format!(" (did you mean {}?)", hint.join(", "))
                    },
                    if go {
                        " (a Go function the compiler inlined into every caller, or left out \
                         as unused, has no code in the binary)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        if matching::is_glob(&spec.function) {
            eprintln!(
                "topdown: -u {}:{} matched {} function{}",
                spec.target,
                spec.function,
                matched.len(),
                if matched.len() == 1 { "" } else { "s" }
            );
        }
        for (function, names) in matched {
            let entry = ResolvedFunction {
                target: path.clone(),
                display: names.display.clone(),
                symbol: function.clone(),
            };
            if seen.insert((entry.target.clone(), entry.symbol.offset)) {
                resolved.push((entry, names.clone()));
            }
        }
    }
    disambiguate(&mut resolved);
    bind_plt_tail_calls(&resolved, &mut code, pids);
    Ok(Resolution {
        functions: resolved.into_iter().map(|(function, _)| function).collect(),
        files: code,
    })
}

/// Finds, for each PLT stub a probed function tail-calls (`jmp usleep@plt`), the function the
/// stub is bound to: the first `DT_NEEDED` library of the file that defines it. Libraries that
/// cannot be found or read leave the stub unbound (the tail call then ends the call, counted).
fn bind_plt_tail_calls(
    resolved: &[(ResolvedFunction, matching::Names)],
    code: &mut HashMap<PathBuf, elf::FileFunctions>,
    pids: &[u32],
) {
    let mut wanted: Vec<(PathBuf, u64, String, Vec<String>)> = Vec::new();
    for (function, _) in resolved {
        let Some(file) = code.get(&function.target) else {
            continue;
        };
        for exit in function.symbol.exits.iter().flatten() {
            if let x86::ExitKind::Jump(stub) = exit.kind
                && let Some(name) = file.imports.stubs.get(&stub)
            {
                wanted.push((
                    function.target.clone(),
                    stub,
                    name.clone(),
                    file.imports.needed.clone(),
                ));
            }
        }
    }
    // Many stubs name the same few libraries: each is looked up once.
    let mut libraries: HashMap<String, Option<PathBuf>> = HashMap::new();
    for (target, stub, name, needed) in wanted {
        let mut bound = None;
        for library in &needed {
            let path = libraries
                .entry(library.clone())
                .or_insert_with(|| target::find_target(library, pids).ok());
            let Some(path) = path.clone() else {
                continue;
            };
            if !code.contains_key(&path) {
                match elf::functions(&path) {
                    Ok(functions) => {
                        code.insert(path.clone(), functions);
                    }
                    Err(err) => {
                        log::debug!("{}: {err:#}", path.display());
                        continue;
                    }
                }
            }
            let Some(file) = code.get(&path) else {
                continue;
            };
            let defined: Vec<u64> = file
                .functions
                .iter()
                .filter(|function| function.name == name || function.aliases.contains(&name))
                .map(|function| function.address)
                .collect();
            if defined.is_empty() && !file.ifunc_names.contains(&name) {
                continue;
            }
            // Bound only when it is plain: an IFUNC's symbol is its resolver (the stub runs
            // whatever it chose), and of several versions of a name (`memcpy@GLIBC_2.2.5`,
            // `memcpy@@GLIBC_2.14`) the one bound depends on the importer's version needs.
            if let [address] = defined[..]
                && !file.ifunc_names.contains(&name)
            {
                bound = Some((path, address));
            }
            break;
        }
        match (bound, code.get_mut(&target)) {
            (Some(bound), Some(file)) => {
                file.bound.insert(stub, bound);
            }
            _ => log::debug!("{name}@plt of {}: no defining library", target.display()),
        }
    }
}

/// Gives functions of one file that would print the same name distinct names: reports key
/// functions by name, so two instantiations of a generic Rust function (legacy mangling keeps
/// only a hash apart; `{:#}` drops it) or two C `static` functions must not share one.
/// Rust names get their hash back; names still shared get their file offset.
fn disambiguate(functions: &mut [(ResolvedFunction, matching::Names)]) {
    // The functions whose (file, name) another one shares, counted once per pass.
    let clashing = |functions: &[(ResolvedFunction, matching::Names)]| -> Vec<usize> {
        let mut uses: HashMap<(&Path, &str), usize> = HashMap::new();
        for (function, _) in functions {
            *uses
                .entry((function.target.as_path(), function.display.as_str()))
                .or_default() += 1;
        }
        (0..functions.len())
            .filter(|&index| {
                let function = &functions[index].0;
                uses[&(function.target.as_path(), function.display.as_str())] > 1
            })
            .collect()
    };
    for index in clashing(functions) {
        let (function, names) = &mut functions[index];
        if let Some(with_hash) = &names.with_hash {
            function.display = with_hash.clone();
        }
    }
    for index in clashing(functions) {
        let function = &mut functions[index].0;
        function.display = format!("{}@{:#x}", function.display, function.symbol.offset);
    }
}

/// Up to three names that end like (or contain) what was typed.
fn close_matches(
    wanted: &str,
    functions: &[(elf::FunctionSymbol, matching::Names)],
) -> Vec<String> {
    let tail = wanted.rsplit("::").next().unwrap_or(wanted);
    functions
        .iter()
        .map(|(_, names)| &names.display)
        .filter(|name| name.ends_with(tail) || name.contains(wanted))
        .take(3)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_printing_the_same_name_are_told_apart() {
        let function = |raw: &str, offset: u64| {
            let names = matching::names(raw);
            let function = ResolvedFunction {
                target: PathBuf::from("/bin/app"),
                display: names.display.clone(),
                symbol: elf::FunctionSymbol {
                    name: raw.to_owned(),
                    aliases: Vec::new(),
                    address: offset,
                    offset,
                    size: 0,
                    exits: None,
                    ranges: Vec::new(),
                    entry_probe: None,
                    reads_return_address: false,
                    go: false,
                },
            };
            (function, names)
        };
        let mut functions = vec![
            // Two instantiations of a generic function: legacy mangling differs only in hash.
            function("_ZN3app5parse17h0123456789abcdefE", 0x1000),
            function("_ZN3app5parse17hfedcba9876543210E", 0x2000),
            function("_ZN3app4main17h00000000000000ffE", 0x3000),
            // Two C `static` functions of the same name in different translation units.
            function("helper", 0x4000),
            function("helper", 0x5000),
        ];
        let mut other_file = function("helper", 0x6000);
        other_file.0.target = PathBuf::from("/lib/libother.so");
        functions.push(other_file);
        disambiguate(&mut functions);
        let displays: Vec<&str> = functions.iter().map(|(f, _)| f.display.as_str()).collect();
        assert_eq!(
            displays,
            [
                "app::parse::h0123456789abcdef",
                "app::parse::hfedcba9876543210",
                "app::main",
                "helper@0x4000",
                "helper@0x5000",
                "helper",
            ]
        );
    }

    #[test]
    fn specs_split_at_the_first_single_colon() {
        let spec = ProbeSpec::parse("./app:myapp::parser::parse_request").unwrap();
        assert_eq!(
            (spec.target.as_str(), spec.function.as_str()),
            ("./app", "myapp::parser::parse_request")
        );
        let spec = ProbeSpec::parse("libstdc++:std::sort*").unwrap();
        assert_eq!(
            (spec.target.as_str(), spec.function.as_str()),
            ("libstdc++", "std::sort*")
        );
        assert!(ProbeSpec::parse("nocolon").is_err());
        assert!(ProbeSpec::parse(":f").is_err());
        assert!(ProbeSpec::parse("t:").is_err());
    }
}
