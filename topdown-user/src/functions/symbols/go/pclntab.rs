//! Go's function table, `.gopclntab`, which every Go binary keeps (stripping removes `.symtab`
//! and DWARF, never this: the runtime needs it for tracebacks and garbage collection). Formats
//! of Go 1.18-1.19 (magic `0xfffffff0`) and 1.20 and later (`0xfffffff1`), as the runtime reads
//! them (`runtime/symtab.go`, `runtime/runtime2.go`: `pcHeader`, `functab`, `_func`,
//! `inlinedCall`, `moduledata`):
//!
//! - `pcHeader`: magic u32, two pad bytes, `minLC`, `ptrSize`, then words: `nfunc`, `nfiles`,
//!   `textStart`, and the offsets (from the header) of `funcnametab`, `cutab`, `filetab`,
//!   `pctab` and `pclntable`.
//! - `pclntable` starts with `nfunc + 1` pairs `{entryoff u32, funcoff u32}` (the last entry's
//!   `entryoff` is the end of the last function); `funcoff` points (from `pclntable`) at the
//!   function's `_func`: `entryoff`, `nameoff` (into `funcnametab`), `args`, `deferreturn`,
//!   `pcsp`, `pcfile`, `pcln`, `npcdata`, `cuOffset` (u32 each), `startLine` (i32, Go 1.20+),
//!   then the bytes `funcID`, `flag`, pad, `nfuncdata`, then `npcdata` u32 offsets into `pctab`
//!   and `nfuncdata` u32 offsets from `moduledata.gofunc` (`!0`: none).
//! - Inlining: `pcdata[2]` (`_PCDATA_InlTreeIndex`) maps each pc to an index into the table
//!   `funcdata[3]` (`_FUNCDATA_InlTree`) points at, whose entries name the inlined callees.

use std::collections::HashMap;

/// `pcHeader.magic` of Go 1.18-1.19.
const MAGIC_GO118: u32 = 0xffff_fff0;
/// `pcHeader.magic` of Go 1.20 and later.
const MAGIC_GO120: u32 = 0xffff_fff1;
/// Older tables: Go 1.16-1.17 (`0xfffffffa`) and 1.2-1.15 (`0xfffffffb`).
const MAGIC_GO116: u32 = 0xffff_fffa;
const MAGIC_GO12: u32 = 0xffff_fffb;

const PCDATA_INL_TREE_INDEX: usize = 2;
const FUNCDATA_INL_TREE: usize = 3;

/// `funcFlag` bits (`runtime/symtab.go`, `internal/abi`): the function writes an arbitrary
/// value to SP, or is written in assembly.
pub const FLAG_SPWRITE: u8 = 1 << 1;
pub const FLAG_ASM: u8 = 1 << 2;

/// Offset of `moduledata.gofunc` (x86-64): 1.18-1.19, and 1.20+ where `covctrs, ecovctrs`
/// came before it.
const GOFUNC_AT_GO118: usize = 304;
const GOFUNC_AT_GO120: usize = 320;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Go118,
    Go120,
}

/// Why a table cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableError {
    /// A format this reader does not know; the Go release it belongs to, if known.
    Unsupported(&'static str),
    /// Truncated or inconsistent data.
    Corrupt(String),
}

/// One function of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoFunc {
    pub name: String,
    /// `[entry, end)`: its code, up to the next function (alignment padding included).
    pub entry: u64,
    pub end: u64,
    pub func_id: u8,
    pub flag: u8,
    /// Names of the functions inlined into it, each once.
    pub inlined: Vec<String>,
}

/// The table's functions, and whether inlining could be read.
#[derive(Clone, Debug)]
pub struct Table {
    pub format: Format,
    pub functions: Vec<GoFunc>,
    /// False when the inline trees could not be located (`moduledata` not found or not
    /// validated): `GoFunc::inlined` is then empty for every function.
    pub inlining_known: bool,
}

/// Reads bytes at a virtual address of the file (its sections), for what lies outside
/// `.gopclntab`: `moduledata` and the inline trees.
pub trait Memory {
    fn read(&self, address: u64, len: usize) -> Option<&[u8]>;
    /// The places `moduledata` may be: (address, bytes) of the data sections.
    fn data_sections(&self) -> Vec<(u64, &[u8])>;
}

struct Reader<'a> {
    data: &'a [u8],
}

impl Reader<'_> {
    fn u32(&self, at: usize) -> Result<u32, TableError> {
        self.bytes(at, "u32").map(u32::from_le_bytes)
    }

    fn word(&self, at: usize) -> Result<u64, TableError> {
        self.bytes(at, "word").map(u64::from_le_bytes)
    }

    /// The `N` bytes at `at`, or which `what` ran past the table's end.
    fn bytes<const N: usize>(&self, at: usize, what: &str) -> Result<[u8; N], TableError> {
        self.data
            .get(at..at.wrapping_add(N))
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| TableError::Corrupt(format!("{what} at {at:#x} past the table's end")))
    }

    fn byte(&self, at: usize) -> Result<u8, TableError> {
        self.data
            .get(at)
            .copied()
            .ok_or_else(|| TableError::Corrupt(format!("byte at {at:#x} past the table's end")))
    }

    fn c_string(&self, at: usize) -> Result<String, TableError> {
        let bytes = self
            .data
            .get(at..)
            .ok_or_else(|| TableError::Corrupt(format!("name at {at:#x} past the table's end")))?;
        let end = bytes
            .iter()
            .position(|byte| *byte == 0)
            .ok_or_else(|| TableError::Corrupt(format!("unterminated name at {at:#x}")))?;
        Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
    }
}

fn usize_of(value: u64) -> Result<usize, TableError> {
    usize::try_from(value).map_err(|_| TableError::Corrupt(format!("offset {value:#x}")))
}

/// The format of a table starting with `data`, or why it is not read.
pub fn format_of(data: &[u8]) -> Result<Format, TableError> {
    let reader = Reader { data };
    match reader.u32(0)? {
        MAGIC_GO118 => Ok(Format::Go118),
        MAGIC_GO120 => Ok(Format::Go120),
        MAGIC_GO116 => Err(TableError::Unsupported("Go 1.16-1.17")),
        MAGIC_GO12 => Err(TableError::Unsupported("Go 1.2-1.15")),
        _ => Err(TableError::Unsupported("an unknown Go release")),
    }
}

/// Parses the table at `address` (`data` is `.gopclntab`); `text_section` is the start of
/// `.text`, used when `textStart` was left to a dynamic relocation (position-independent
/// builds).
pub fn parse(
    data: &[u8],
    address: u64,
    text_section: u64,
    memory: &dyn Memory,
) -> Result<Table, TableError> {
    let format = format_of(data)?;
    let reader = Reader { data };
    if reader.byte(7)? != 8 {
        return Err(TableError::Unsupported("a 32-bit target"));
    }
    let min_lc = u64::from(reader.byte(6)?.max(1));
    let nfunc = usize_of(reader.word(8)?)?;
    let mut text_start = reader.word(24)?;
    if text_start == 0 {
        text_start = text_section;
    }
    let funcname = usize_of(reader.word(32)?)?;
    let pctab = usize_of(reader.word(56)?)?;
    let pcln = usize_of(reader.word(64)?)?;
    if nfunc > data.len() / 8 {
        return Err(TableError::Corrupt(format!("{nfunc} functions")));
    }
    let func_header = match format {
        Format::Go118 => 36,
        Format::Go120 => 40,
    };
    let mut raw = Vec::with_capacity(nfunc);
    for index in 0..nfunc {
        let entry = reader.u32(pcln + index * 8)?;
        let funcoff = usize_of(u64::from(reader.u32(pcln + index * 8 + 4)?))?;
        let next = reader.u32(pcln + (index + 1) * 8)?;
        let func = pcln + funcoff;
        let nameoff = usize_of(u64::from(reader.u32(func + 4)?))?;
        let npcdata = usize_of(u64::from(reader.u32(func + 28)?))?;
        let func_id = reader.byte(func + func_header)?;
        let flag = reader.byte(func + func_header + 1)?;
        let nfuncdata = usize::from(reader.byte(func + func_header + 3)?);
        let pcdata_at = func + func_header + 4;
        let funcdata_at = pcdata_at + npcdata * 4;
        let inline_index = if npcdata > PCDATA_INL_TREE_INDEX {
            reader.u32(pcdata_at + PCDATA_INL_TREE_INDEX * 4)?
        } else {
            0
        };
        let inline_tree = if nfuncdata > FUNCDATA_INL_TREE {
            Some(reader.u32(funcdata_at + FUNCDATA_INL_TREE * 4)?).filter(|off| *off != !0)
        } else {
            None
        };
        raw.push(RawFunc {
            name: reader.c_string(funcname + nameoff)?,
            entry: text_start + u64::from(entry),
            end: text_start + u64::from(next),
            func_id,
            flag,
            inline_index,
            inline_tree,
        });
    }
    let trees = raw
        .iter()
        .any(|func| func.inline_tree.is_some() && func.inline_index != 0);
    let gofunc = if trees {
        find_gofunc(
            &raw, &reader, address, funcname, pctab, min_lc, format, memory,
        )
    } else {
        None
    };
    let functions = raw
        .into_iter()
        .map(|func| {
            let inlined = match gofunc {
                Some(gofunc) => inlined_names(
                    &func, &reader, funcname, pctab, min_lc, format, gofunc, memory,
                )
                .unwrap_or_default(),
                None => Vec::new(),
            };
            GoFunc {
                name: func.name,
                entry: func.entry,
                end: func.end,
                func_id: func.func_id,
                flag: func.flag,
                inlined,
            }
        })
        .collect();
    Ok(Table {
        format,
        functions,
        inlining_known: gofunc.is_some() || !trees,
    })
}

struct RawFunc {
    name: String,
    entry: u64,
    end: u64,
    func_id: u8,
    flag: u8,
    /// `pctab` offset of its inline-tree index table (0: none).
    inline_index: u32,
    /// Offset of its inline tree from `moduledata.gofunc`.
    inline_tree: Option<u32>,
}

/// `moduledata.gofunc`: `moduledata` starts with a pointer to the table's header, followed
/// by the `funcnametab` slice; of the layouts known for this format, the one whose inline
/// trees decode to names of the table is taken.
#[allow(clippy::too_many_arguments)]
fn find_gofunc(
    functions: &[RawFunc],
    reader: &Reader<'_>,
    address: u64,
    funcname: usize,
    pctab: usize,
    min_lc: u64,
    format: Format,
    memory: &dyn Memory,
) -> Option<u64> {
    let needle = address.to_le_bytes();
    let names_at = (address + funcname as u64).to_le_bytes();
    let at = match format {
        Format::Go118 => GOFUNC_AT_GO118,
        Format::Go120 => GOFUNC_AT_GO120,
    };
    let probes: Vec<&RawFunc> = functions
        .iter()
        .filter(|func| func.inline_tree.is_some() && func.inline_index != 0)
        .take(16)
        .collect();
    for (_, bytes) in memory.data_sections() {
        let mut from = 0;
        while let Some(found) = bytes
            .get(from..)
            .and_then(|rest| rest.windows(8).position(|window| window == needle))
        {
            let start = from + found;
            from = start + 1;
            if start % 8 != 0 || bytes.get(start + 8..start + 16) != Some(&names_at[..]) {
                continue;
            }
            let Some(gofunc) = bytes
                .get(start + at..start + at + 8)
                .and_then(|word| word.try_into().ok())
                .map(u64::from_le_bytes)
            else {
                continue;
            };
            let valid = probes.iter().all(|func| {
                inlined_names(
                    func, reader, funcname, pctab, min_lc, format, gofunc, memory,
                )
                .is_some_and(|names| !names.is_empty())
            });
            if valid && !probes.is_empty() {
                return Some(gofunc);
            }
        }
    }
    None
}

/// The names of the functions inlined into `func`, or `None` if its tree does not decode.
#[allow(clippy::too_many_arguments)]
fn inlined_names(
    func: &RawFunc,
    reader: &Reader<'_>,
    funcname: usize,
    pctab: usize,
    min_lc: u64,
    format: Format,
    gofunc: u64,
    memory: &dyn Memory,
) -> Option<Vec<String>> {
    let tree = func.inline_tree?;
    if func.inline_index == 0 {
        return Some(Vec::new());
    }
    let size = func.end.checked_sub(func.entry)?;
    let values = pc_values(
        reader.data.get(pctab + func.inline_index as usize..)?,
        min_lc,
        size,
    )?;
    let Some(last) = values.into_iter().filter(|value| *value >= 0).max() else {
        return Some(Vec::new());
    };
    let (stride, name_at) = match format {
        // {parent i16, funcID u8, pad, file i32, line i32, func_ i32, parentPc i32}
        Format::Go118 => (20, 12),
        // {funcID u8, pad [3]u8, nameOff i32, parentPc i32, startLine i32}
        Format::Go120 => (16, 4),
    };
    let count = usize::try_from(last).ok()? + 1;
    let entries = memory.read(gofunc.checked_add(u64::from(tree))?, count * stride)?;
    let mut names: Vec<String> = Vec::new();
    for entry in entries.chunks_exact(stride) {
        let nameoff = u32::from_le_bytes(entry.get(name_at..name_at + 4)?.try_into().ok()?);
        let name = reader.c_string(funcname + nameoff as usize).ok()?;
        if name.is_empty() || name.contains(|c: char| c.is_control()) {
            return None;
        }
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Some(names)
}

/// The values of a pc-value table (`runtime.step`): pairs of a zig-zag varint value delta
/// and a varint pc delta (in `min_lc` units), starting at value -1, ending at a zero value
/// delta after the first pair or once the function's `size` is covered.
fn pc_values(table: &[u8], min_lc: u64, size: u64) -> Option<Vec<i64>> {
    let mut at = 0;
    let mut value: i64 = -1;
    let mut pc = 0u64;
    let mut values = Vec::new();
    let mut first = true;
    while pc < size {
        let (delta, used) = varint(table.get(at..)?)?;
        if delta == 0 && !first {
            break;
        }
        at += used;
        first = false;
        let signed = if delta & 1 != 0 {
            -((delta >> 1) as i64) - 1
        } else {
            (delta >> 1) as i64
        };
        value += signed;
        let (pc_delta, used) = varint(table.get(at..)?)?;
        at += used;
        pc += u64::from(pc_delta) * min_lc;
        values.push(value);
    }
    Some(values)
}

fn varint(bytes: &[u8]) -> Option<(u32, usize)> {
    let mut value = 0u32;
    let mut shift = 0;
    for (index, byte) in bytes.iter().enumerate().take(5) {
        value |= u32::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((value, index + 1));
        }
        shift += 7;
    }
    None
}

/// Functions by name, the first of each name (`skip`ped ones left out).
pub fn by_name<'a>(
    functions: &'a [GoFunc],
    skip: &std::collections::HashSet<u64>,
) -> HashMap<&'a str, &'a GoFunc> {
    let mut named: HashMap<&str, &GoFunc> = HashMap::new();
    for func in functions.iter().filter(|func| !skip.contains(&func.entry)) {
        named.entry(func.name.as_str()).or_insert(func);
    }
    named
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `runtime.step`'s encoding, written out: value deltas zig-zag encoded.
    fn encode(pairs: &[(i64, u32)]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut push = |mut value: u32| loop {
            let byte = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        };
        for (delta, pc) in pairs {
            let zigzag = if *delta < 0 {
                ((-delta - 1) as u32) << 1 | 1
            } else {
                (*delta as u32) << 1
            };
            push(zigzag);
            push(*pc);
        }
        push(0);
        out
    }

    #[test]
    fn pc_value_tables_decode_as_the_runtime_steps_them() {
        // -1 for 10 bytes, then index 0 for 5, then 2 (a nested inline) for 200, then -1.
        let table = encode(&[(0, 10), (1, 5), (2, 200), (-3, 40)]);
        assert_eq!(pc_values(&table, 1, 255), Some(vec![-1, 0, 2, -1]));
        // The table stops at the function's size even without its terminator.
        assert_eq!(pc_values(&table, 1, 15), Some(vec![-1, 0]));
        // A truncated table is no table.
        assert_eq!(pc_values(&table[..1], 1, 255), None);
    }

    #[test]
    fn older_and_unknown_tables_are_named() {
        assert_eq!(
            format_of(&0xffff_fffau32.to_le_bytes()),
            Err(TableError::Unsupported("Go 1.16-1.17"))
        );
        assert_eq!(format_of(&0xffff_fff1u32.to_le_bytes()), Ok(Format::Go120));
        assert!(matches!(
            format_of(&[0xde, 0xad]),
            Err(TableError::Corrupt(_))
        ));
    }
}
