//! Where each probed function's calls end, as uprobes and their cookies
//! (`topdown_common::exit_point`):
//!
//! - `ret` closes the frame (and the frames that tail-called into the function).
//! - A tail call keeps the caller's frame open until the callee returns, as the caller's
//!   source reads: the callee is probed itself, or gets return-only probes on its exits
//!   (a function of the same file, found by its start address). A callee whose end cannot be
//!   known (another file, a PLT stub, no symbol) closes the frame at the jump, counted.
//! - An indirect jump is decided at run time: a jump table when its target lies inside the
//!   function (its cold fragments included), a tail call otherwise.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use topdown_common::{
    FileAddress, IndirectJump, MAX_FUNCTION_RANGES, ROOT_FUNCTION, entry_cookie, exit_point,
};

use crate::functions::symbols::{
    ResolvedFunction,
    elf::{FileFunctions, FunctionSymbol},
    x86::{Exit, ExitKind, IndirectOperand, ProbeCheck},
};

/// How deep tail calls through unprobed functions are followed for return-only probes.
const MAX_TAIL_CHAIN: usize = 4;

/// A uprobe: where, and its attach cookie.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UprobeAt {
    pub target: PathBuf,
    pub offset: u64,
    pub cookie: u64,
}

/// One probed function's probes (the unit attached, or skipped, together): its entry, and
/// either a uretprobe or its exit points (with the return-only points of the unprobed
/// functions it tail-calls, first reached through it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionProbes {
    pub entry: Option<UprobeAt>,
    pub uretprobe: Option<UprobeAt>,
    pub exits: Vec<UprobeAt>,
    /// A Go function: its probes keep frames per goroutine (never a uretprobe).
    pub go: bool,
}

/// Everything to attach, with the maps the exit program reads.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// In the order of the functions given.
    pub functions: Vec<FunctionProbes>,
    pub indirect_jumps: Vec<(u32, IndirectJump)>,
    pub return_targets: Vec<FileAddress>,
}

/// A function to probe, with its id.
pub struct Probed<'a> {
    pub function: &'a ResolvedFunction,
    pub id: u32,
    /// Its returns are caught by a uretprobe (`--returns`), not by exit-instruction probes.
    pub uretprobe: bool,
}

/// Plans the probes of `functions` (exit points when decoded and not `uretprobe`, else a
/// uretprobe plus a marker on each tail-call jump). `files`: every function of each target,
/// for tail-call targets.
pub fn plan(functions: &[Probed<'_>], files: &HashMap<PathBuf, FileFunctions>) -> Plan {
    let mut planner = Planner {
        files,
        file_index: HashMap::new(),
        probed: HashMap::new(),
        return_only: HashMap::new(),
        plan: Plan::default(),
    };
    for probed in functions {
        let function = probed.function;
        let file = planner.file(&function.target);
        planner.probed.insert((file, function.symbol.address), ());
    }
    for probed in functions {
        let function = probed.function;
        let file = planner.file(&function.target);
        let by_uretprobe = probed.uretprobe || function.symbol.exits.is_none();
        // Go functions are refused before planning unless their exits are known and probed.
        debug_assert!(
            !(function.symbol.go && by_uretprobe),
            "a uretprobe on a Go function"
        );
        let mut probes = FunctionProbes {
            entry: Some(UprobeAt {
                target: function.target.clone(),
                offset: function.symbol.offset,
                cookie: entry_cookie::encode(probed.id, by_uretprobe),
            }),
            go: function.symbol.go,
            ..FunctionProbes::default()
        };
        match function.symbol.exits.as_ref().filter(|_| !probed.uretprobe) {
            None => {
                probes.uretprobe = Some(UprobeAt {
                    target: function.target.clone(),
                    offset: function.symbol.offset,
                    cookie: u64::from(probed.id),
                });
                // The uretprobe closes the frame when a tail callee returns (the kernel chains
                // both return instances), but the callee's entry comes at the frame's own stack
                // pointer, which would otherwise read as a return skipped by longjmp: each
                // tail-call jump marks the frame first. Direct jumps are emulated by the
                // kernel, so the marker costs one trap per tail call.
                for exit in function.symbol.exits.iter().flatten() {
                    planner.tail_marker(&mut probes.exits, function, file, probed.id, exit);
                }
            }
            Some(exits) => {
                for exit in exits {
                    planner.exit(
                        &mut probes.exits,
                        &function.target,
                        file,
                        probed.id,
                        &function.symbol.ranges,
                        exit,
                        0,
                    );
                }
            }
        }
        planner.plan.functions.push(probes);
    }
    let Planner {
        mut plan,
        probed,
        return_only,
        ..
    } = planner;
    plan.return_targets = probed
        .into_keys()
        .chain(
            return_only
                .into_iter()
                .filter(|(_, state)| *state == ReturnOnly::Probed)
                .map(|(key, _)| key),
        )
        .map(|(file, address)| FileAddress {
            file,
            _pad: 0,
            address,
        })
        .collect();
    plan
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReturnOnly {
    /// Its exits are being planned: a tail call back to it (a cycle) is closed by them.
    Planning,
    Probed,
    Unknowable,
}

struct Planner<'a> {
    files: &'a HashMap<PathBuf, FileFunctions>,
    file_index: HashMap<PathBuf, u32>,
    /// `(file, address)` of the probed functions.
    probed: HashMap<(u32, u64), ()>,
    /// Unprobed tail-call targets and whether their returns got probes.
    return_only: HashMap<(u32, u64), ReturnOnly>,
    plan: Plan,
}

impl Planner<'_> {
    /// For a function closed by its uretprobe: a probe on a tail-call jump that only marks its
    /// frame (an indirect jump is still checked at run time for staying inside the function).
    fn tail_marker(
        &mut self,
        points: &mut Vec<UprobeAt>,
        function: &ResolvedFunction,
        file: u32,
        id: u32,
        exit: &Exit,
    ) {
        let at = |cookie: u64| UprobeAt {
            target: function.target.clone(),
            offset: exit.offset,
            cookie,
        };
        match &exit.kind {
            ExitKind::Return => {}
            ExitKind::Jump(_) | ExitKind::Unknown => {
                points.push(at(exit_point::encode(id, exit_point::TAIL_CALL, 0)));
            }
            ExitKind::Indirect(operand) => {
                let index = self.plan.indirect_jumps.len() as u32;
                let image_end = self
                    .files
                    .get(&function.target)
                    .map_or(0, |file| file.image_end);
                self.plan.indirect_jumps.push((
                    index,
                    indirect_jump(
                        id,
                        file,
                        exit.address,
                        image_end,
                        &function.symbol.ranges,
                        operand,
                    ),
                ));
                points.push(at(exit_point::encode(id, exit_point::INDIRECT, index)));
            }
        }
    }

    fn file(&mut self, path: &Path) -> u32 {
        let next = self.file_index.len() as u32;
        *self.file_index.entry(path.to_path_buf()).or_insert(next)
    }

    /// Adds the probe of one exit of `function` (`ROOT_FUNCTION` for a return-only function).
    #[allow(clippy::too_many_arguments)]
    fn exit(
        &mut self,
        points: &mut Vec<UprobeAt>,
        target: &Path,
        file: u32,
        function: u32,
        ranges: &[(u64, u64)],
        exit: &Exit,
        depth: usize,
    ) {
        let at = |cookie: u64| UprobeAt {
            target: target.to_path_buf(),
            offset: exit.offset,
            cookie,
        };
        match &exit.kind {
            ExitKind::Return => {
                points.push(at(exit_point::encode(function, exit_point::RETURN, 0)))
            }
            ExitKind::Unknown => points.push(at(exit_point::encode(function, exit_point::CUT, 0))),
            ExitKind::Jump(callee) => {
                let bound = self
                    .files
                    .get(target)
                    .and_then(|functions| functions.bound.get(callee));
                let ends_known = match bound {
                    // Through the PLT to the library that defines the callee.
                    Some((library, address)) => {
                        let library_file = self.file(library);
                        self.returns_probed(points, library, library_file, *address, depth)
                    }
                    None => self.returns_probed(points, target, file, *callee, depth),
                };
                if function == ROOT_FUNCTION && ends_known {
                    // A return-only function passing the call on: the next one closes it.
                    return;
                }
                let kind = if ends_known {
                    exit_point::TAIL_CALL
                } else {
                    exit_point::CUT
                };
                points.push(at(exit_point::encode(function, kind, 0)));
            }
            ExitKind::Indirect(operand) => {
                let index = self.plan.indirect_jumps.len() as u32;
                let image_end = self.files.get(target).map_or(0, |file| file.image_end);
                self.plan.indirect_jumps.push((
                    index,
                    indirect_jump(function, file, exit.address, image_end, ranges, operand),
                ));
                points.push(at(exit_point::encode(
                    function,
                    exit_point::INDIRECT,
                    index,
                )));
            }
        }
    }

    /// Whether the function whose code holds `callee` (in `file`: its start, or inside it)
    /// has its returns probed, adding return-only probes to it when it is not probed itself
    /// and they can be.
    fn returns_probed(
        &mut self,
        points: &mut Vec<UprobeAt>,
        target: &Path,
        file: u32,
        callee: u64,
        depth: usize,
    ) -> bool {
        let files = self.files;
        let Some(symbol) = files
            .get(target)
            .and_then(|functions| functions.containing(callee))
        else {
            return false;
        };
        let start = symbol.address;
        if self.probed.contains_key(&(file, start)) {
            return true;
        }
        if let Some(known) = self.return_only.get(&(file, start)) {
            return *known != ReturnOnly::Unknowable;
        }
        if depth >= MAX_TAIL_CHAIN || !return_only_probeable(symbol) {
            self.return_only
                .insert((file, start), ReturnOnly::Unknowable);
            return false;
        }
        self.return_only.insert((file, start), ReturnOnly::Planning);
        for exit in symbol.exits.iter().flatten() {
            self.exit(
                points,
                target,
                file,
                ROOT_FUNCTION,
                &symbol.ranges,
                exit,
                depth + 1,
            );
        }
        self.return_only.insert((file, start), ReturnOnly::Probed);
        true
    }
}

/// A function can close its tail callers' frames when every exit of it can be probed and it
/// returns at all.
fn return_only_probeable(symbol: &FunctionSymbol) -> bool {
    symbol.exits.as_ref().is_some_and(|exits| {
        !exits.is_empty()
            && exits
                .iter()
                .all(|exit| !matches!(exit.probe, ProbeCheck::Refused(_)))
    })
}

fn indirect_jump(
    function: u32,
    file: u32,
    address: u64,
    image_end: u64,
    ranges: &[(u64, u64)],
    operand: &IndirectOperand,
) -> IndirectJump {
    let mut own = [[0u64; 2]; MAX_FUNCTION_RANGES];
    for (slot, (start, end)) in own.iter_mut().zip(ranges) {
        *slot = [*start, *end];
    }
    if ranges.len() > MAX_FUNCTION_RANGES {
        log::debug!(
            "function at {:#x} has {} code ranges; jumps into the last ones count as tail calls",
            ranges.first().map_or(0, |range| range.0),
            ranges.len()
        );
    }
    IndirectJump {
        function,
        file,
        base: operand.base,
        index: operand.index,
        scale: operand.scale,
        memory: u8::from(operand.memory),
        _pad: 0,
        displacement: operand.displacement,
        address,
        file_end: image_end,
        ranges: own,
    }
}

/// Whether `base` names a `pt_regs` word BPF reads (for tests of the encoding).
#[cfg(test)]
fn is_register_word(word: u8) -> bool {
    use topdown_common::pt_regs_word;
    word < pt_regs_word::COUNT || word == pt_regs_word::NONE
}

#[cfg(test)]
mod tests {
    use topdown_common::pt_regs_word;

    use super::*;

    fn exit(address: u64, kind: ExitKind) -> Exit {
        Exit {
            address,
            offset: address,
            kind,
            probe: ProbeCheck::SingleStep,
        }
    }

    fn symbol(name: &str, address: u64, size: u64, exits: Vec<Exit>) -> FunctionSymbol {
        FunctionSymbol {
            name: name.to_owned(),
            aliases: Vec::new(),
            address,
            offset: address,
            size,
            exits: Some(exits),
            ranges: vec![(address, address + size)],
            entry_probe: Some(ProbeCheck::Emulated),
            reads_return_address: false,
            go: false,
        }
    }

    /// The function under test: `f`, 32 bytes at 0x1000, leaving by `exits`.
    fn function_f(exits: Vec<Exit>) -> FunctionSymbol {
        symbol("f", 0x1000, 0x20, exits)
    }

    fn resolved(symbol: &FunctionSymbol) -> ResolvedFunction {
        ResolvedFunction {
            target: PathBuf::from("/bin/app"),
            display: symbol.name.clone(),
            symbol: symbol.clone(),
        }
    }

    /// The plan for `probed` (each symbol with its id, and whether a uretprobe closes it) in
    /// `/bin/app`, whose functions are `functions` and whose image ends at `image_end`.
    fn plan_app(
        functions: Vec<FunctionSymbol>,
        image_end: u64,
        probed: &[(&FunctionSymbol, u32, bool)],
    ) -> Plan {
        let files = HashMap::from([(
            PathBuf::from("/bin/app"),
            FileFunctions {
                functions,
                image_end,
                ..FileFunctions::default()
            },
        )]);
        let resolved: Vec<ResolvedFunction> =
            probed.iter().map(|(symbol, ..)| resolved(symbol)).collect();
        let probed: Vec<Probed<'_>> = resolved
            .iter()
            .zip(probed)
            .map(|(function, &(_, id, uretprobe))| Probed {
                function,
                id,
                uretprobe,
            })
            .collect();
        plan(&probed, &files)
    }

    /// f tail-calls g (probed, into its middle), h (unprobed: return-only probes on its ret,
    /// and h's own tail call to i passes the call on to i's ret) and an address with no
    /// symbol (cut).
    #[test]
    fn tail_calls_keep_frames_open_only_where_the_callee_ends_are_probed() {
        let f = function_f(vec![
            exit(0x1004, ExitKind::Jump(0x2004)),
            exit(0x1008, ExitKind::Jump(0x3000)),
            exit(0x100c, ExitKind::Jump(0x5000)),
            exit(0x1010, ExitKind::Return),
        ]);
        let g = symbol("g", 0x2000, 0x10, vec![exit(0x2008, ExitKind::Return)]);
        let h = symbol(
            "h",
            0x3000,
            0x10,
            vec![
                exit(0x3004, ExitKind::Return),
                exit(0x3008, ExitKind::Jump(0x4000)),
            ],
        );
        let i = symbol("i", 0x4000, 0x10, vec![exit(0x400c, ExitKind::Return)]);
        let plan = plan_app(
            vec![f.clone(), g.clone(), h, i],
            0x6000,
            &[(&f, 0, false), (&g, 1, false)],
        );
        let cookies: Vec<(u64, u64)> = plan.functions[0]
            .exits
            .iter()
            .map(|point| (point.offset, point.cookie))
            .collect();
        let root = ROOT_FUNCTION;
        assert_eq!(
            cookies,
            vec![
                (0x1004, exit_point::encode(0, exit_point::TAIL_CALL, 0)),
                (0x3004, exit_point::encode(root, exit_point::RETURN, 0)),
                (0x400c, exit_point::encode(root, exit_point::RETURN, 0)),
                (0x1008, exit_point::encode(0, exit_point::TAIL_CALL, 0)),
                (0x100c, exit_point::encode(0, exit_point::CUT, 0)),
                (0x1010, exit_point::encode(0, exit_point::RETURN, 0)),
            ]
        );
        let mut targets: Vec<u64> = plan.return_targets.iter().map(|t| t.address).collect();
        targets.sort_unstable();
        assert_eq!(targets, vec![0x1000, 0x2000, 0x3000, 0x4000]);
    }

    /// A function closed by its uretprobe keeps it, and its tail-call jumps get markers only:
    /// no return-only probes on the callee, no probe on its `ret`.
    #[test]
    fn uretprobe_functions_mark_their_tail_calls() {
        let f = function_f(vec![
            exit(0x1004, ExitKind::Jump(0x2000)),
            exit(0x1010, ExitKind::Return),
        ]);
        let g = symbol("g", 0x2000, 0x10, vec![exit(0x2008, ExitKind::Return)]);
        let plan = plan_app(vec![f.clone(), g], 0x3000, &[(&f, 3, true)]);
        let probes = &plan.functions[0];
        assert_eq!(
            probes.entry.as_ref().map(|entry| entry.cookie),
            Some(entry_cookie::encode(3, true))
        );
        assert!(probes.uretprobe.is_some());
        let cookies: Vec<(u64, u64)> = probes
            .exits
            .iter()
            .map(|point| (point.offset, point.cookie))
            .collect();
        assert_eq!(
            cookies,
            vec![(0x1004, exit_point::encode(3, exit_point::TAIL_CALL, 0))]
        );
    }

    #[test]
    fn indirect_jumps_carry_the_functions_ranges() {
        let operand = IndirectOperand {
            base: 10,
            index: pt_regs_word::NONE,
            scale: 0,
            memory: true,
            displacement: 0x80,
        };
        let mut f = function_f(vec![exit(0x1004, ExitKind::Indirect(operand))]);
        f.ranges.push((0x9000, 0x9010));
        let plan = plan_app(vec![f.clone()], 0xa000, &[(&f, 7, false)]);
        let (index, jump) = plan.indirect_jumps[0];
        assert_eq!(
            plan.functions[0].exits[0].cookie,
            exit_point::encode(7, exit_point::INDIRECT, index)
        );
        assert_eq!(jump.ranges[0], [0x1000, 0x1020]);
        assert_eq!(jump.ranges[1], [0x9000, 0x9010]);
        assert_eq!(
            (jump.address, jump.file_end, jump.displacement),
            (0x1004, 0xa000, 0x80)
        );
        assert!(is_register_word(jump.base) && is_register_word(jump.index));
    }
}
