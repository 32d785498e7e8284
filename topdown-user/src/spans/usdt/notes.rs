//! SystemTap SDT notes (`.note.stapsdt`): where each USDT probe site is, its semaphore, and its
//! argument specs, as `sys/sdt.h` writes them.
//!
//! Each note (type 3, owner `stapsdt`) holds the site's address, the link-time address of
//! `_.stapsdt.base`, the semaphore's address (0 without one), then the provider, the name and
//! the argument specs as three NUL-terminated strings. Addresses are adjusted by how far the
//! `.stapsdt.base` section has moved since (a prelinked object), then turned into file offsets
//! through the program headers: what uprobes and their reference counters take.

use std::path::Path;

use anyhow::{Context as _, Result};
use object::{Object as _, ObjectSection as _};

use crate::{
    error::{Failure, fail},
    functions::symbols::elf::Segments,
};

/// `NT_STAPSDT`.
const NOTE_TYPE: u32 = 3;
const NOTE_OWNER: &[u8] = b"stapsdt";

/// One probe site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SdtNote {
    pub provider: String,
    pub name: String,
    /// The site's address in the file's own address space (after the prelink adjustment).
    pub address: u64,
    /// Its file offset: where the uprobe goes.
    pub offset: u64,
    /// The semaphore's address and file offset, when the probe has one.
    pub semaphore: Option<Semaphore>,
    /// The argument specs, e.g. `8@%rbx -4@-20(%rbp)` (empty without arguments).
    pub args: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Semaphore {
    pub address: u64,
    pub offset: u64,
}

/// The probes of one file.
#[derive(Clone, Debug, Default)]
pub struct SdtFile {
    pub notes: Vec<SdtNote>,
    /// x86-64 (the only architecture whose argument specs are decoded).
    pub x86_64: bool,
    /// `ET_DYN`: position-independent (a PIE or a shared library).
    pub position_independent: bool,
    /// Symbols with their addresses, for arguments relative to one (`8@sym(%rip)`) and for
    /// function entries spans use.
    pub symbols: std::collections::HashMap<String, u64>,
    /// Loaded segments with file contents.
    pub segments: Segments,
}

impl SdtFile {
    /// The address of `name` in the file (a data or function symbol).
    pub fn symbol(&self, name: &str) -> Option<u64> {
        self.symbols.get(name).copied()
    }

    /// The file offset of `address` (what a uprobe takes), through the program headers.
    pub fn offset_of(&self, address: u64) -> Option<u64> {
        self.segments.file_offset(address)
    }
}

/// Reads the SDT notes of `path`.
pub fn read(path: &Path) -> Result<SdtFile> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&data).map_err(|err| fail(Failure::Usage, format!("{}: {err:#}", path.display())))
}

/// Parses the SDT notes of an ELF image.
pub fn parse(data: &[u8]) -> Result<SdtFile> {
    let file =
        object::File::parse(data).map_err(|err| anyhow::anyhow!("not an ELF file: {err}"))?;
    let segments = Segments::of(&file);
    let to_offset = |address: u64| segments.file_offset(address);
    let little = file.is_little_endian();
    let wide = file.is_64();
    // Where `_.stapsdt.base` is now, against where each note says it was linked.
    let base_now = file
        .section_by_name(".stapsdt.base")
        .map(|section| section.address());
    let mut symbols = std::collections::HashMap::new();
    for symbol in file.symbols().chain(file.dynamic_symbols()) {
        use object::ObjectSymbol as _;
        if let Ok(name) = symbol.name()
            && symbol.is_definition()
            && !name.is_empty()
        {
            symbols.entry(name.to_owned()).or_insert(symbol.address());
        }
    }
    let mut notes = Vec::new();
    if let Some(section) = file.section_by_name(".note.stapsdt") {
        let bytes = section
            .data()
            .map_err(|err| anyhow::anyhow!("reading .note.stapsdt: {err}"))?;
        for (index, raw) in raw_notes(bytes, little).enumerate() {
            let raw = raw.with_context(|| format!("SDT note {index}"))?;
            if raw.kind != NOTE_TYPE || raw.owner != NOTE_OWNER {
                continue;
            }
            let note = decode(raw.desc, wide, little, base_now, &to_offset)
                .with_context(|| format!("SDT note {index}"))?;
            notes.push(note);
        }
    }
    Ok(SdtFile {
        notes,
        x86_64: file.architecture() == object::Architecture::X86_64,
        position_independent: file.kind() == object::ObjectKind::Dynamic,
        symbols,
        segments,
    })
}

struct RawNote<'a> {
    owner: &'a [u8],
    kind: u32,
    desc: &'a [u8],
}

/// The notes of a note section: `namesz`, `descsz`, `type`, then the name and the descriptor,
/// each padded to 4 bytes (ELF notes use 4-byte alignment for `SHT_NOTE` of either class).
fn raw_notes(bytes: &[u8], little: bool) -> impl Iterator<Item = Result<RawNote<'_>>> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        if at + 12 > bytes.len() {
            return None;
        }
        let word = |offset: usize| read_u32(&bytes[offset..offset + 4], little);
        let (name_size, desc_size, kind) = (word(at) as usize, word(at + 4) as usize, word(at + 8));
        let name_start = at + 12;
        let desc_start = name_start + name_size.next_multiple_of(4);
        let end = desc_start + desc_size.next_multiple_of(4);
        if desc_start + desc_size > bytes.len() || name_start + name_size > bytes.len() {
            at = bytes.len();
            return Some(Err(anyhow::anyhow!("truncated note at byte {name_start}")));
        }
        let owner = &bytes[name_start..name_start + name_size];
        let owner = owner.strip_suffix(b"\0").unwrap_or(owner);
        let note = RawNote {
            owner,
            kind,
            desc: &bytes[desc_start..desc_start + desc_size],
        };
        at = end;
        Some(Ok(note))
    })
}

fn read_u32(bytes: &[u8], little: bool) -> u32 {
    let array = [bytes[0], bytes[1], bytes[2], bytes[3]];
    if little {
        u32::from_le_bytes(array)
    } else {
        u32::from_be_bytes(array)
    }
}

fn read_address(bytes: &[u8], wide: bool, little: bool) -> u64 {
    if wide {
        let mut array = [0u8; 8];
        array.copy_from_slice(&bytes[..8]);
        if little {
            u64::from_le_bytes(array)
        } else {
            u64::from_be_bytes(array)
        }
    } else {
        u64::from(read_u32(bytes, little))
    }
}

fn decode(
    desc: &[u8],
    wide: bool,
    little: bool,
    base_now: Option<u64>,
    to_offset: &dyn Fn(u64) -> Option<u64>,
) -> Result<SdtNote> {
    let width = if wide { 8 } else { 4 };
    anyhow::ensure!(desc.len() > 3 * width, "descriptor of {} bytes", desc.len());
    let mut address = read_address(desc, wide, little);
    let base = read_address(&desc[width..], wide, little);
    let mut semaphore = read_address(&desc[2 * width..], wide, little);
    // A prelinked object moved its sections after sdt.h wrote the notes: `.stapsdt.base`
    // moved with them, by the same amount.
    if let Some(now) = base_now
        && base != 0
    {
        let moved = now.wrapping_sub(base);
        address = address.wrapping_add(moved);
        if semaphore != 0 {
            semaphore = semaphore.wrapping_add(moved);
        }
    }
    let mut strings = desc[3 * width..].split(|byte| *byte == 0);
    let mut text = |what: &str| -> Result<String> {
        let bytes = strings.next().with_context(|| format!("no {what}"))?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    };
    let provider = text("provider")?;
    let name = text("name")?;
    let args = text("arguments").unwrap_or_default();
    let offset = to_offset(address)
        .with_context(|| format!("{provider}:{name}: address {address:#x} is in no segment"))?;
    let semaphore = match semaphore {
        0 => None,
        address => Some(Semaphore {
            address,
            offset: to_offset(address).with_context(|| {
                format!("{provider}:{name}: semaphore {address:#x} is in no segment")
            })?,
        }),
    };
    Ok(SdtNote {
        provider,
        name,
        address,
        offset,
        semaphore,
        args: args.trim().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use object::ObjectSegment as _;

    use super::*;

    /// The notes and the bytes of `path`, or `None` (said: the test is skipped) where it is
    /// not installed.
    fn installed(path: &str) -> Option<(SdtFile, Vec<u8>)> {
        let path = Path::new(path);
        if !path.exists() {
            eprintln!("SKIPPED: no {}", path.display());
            return None;
        }
        Some((read(path).unwrap(), std::fs::read(path).unwrap()))
    }

    /// The first note of probe `name`.
    fn note<'a>(file: &'a SdtFile, name: &str) -> &'a SdtNote {
        file.notes.iter().find(|note| note.name == name).unwrap()
    }

    /// Debian's python3.11 is a non-PIE executable: its code's file offsets and addresses
    /// differ by the image base (0x400000), and its semaphores (in `.probes`, a data segment)
    /// by another amount. Checked against `readelf -n` and the program headers.
    #[test]
    fn non_pie_python_offsets_follow_the_program_headers() {
        let Some((file, data)) = installed("/usr/bin/python3.11") else {
            return;
        };
        assert!(!file.position_independent && file.x86_64);
        assert_eq!(file.notes.len(), 8, "{:#?}", file.notes);
        let elf = object::File::parse(&*data).unwrap();
        for note in &file.notes {
            assert_eq!(note.provider, "python");
            let segment = elf
                .segments()
                .find(|segment| {
                    note.address >= segment.address()
                        && note.address < segment.address() + segment.file_range().1
                })
                .unwrap();
            assert_eq!(
                note.offset,
                note.address - segment.address() + segment.file_range().0
            );
            // The site is sdt.h's one-byte nop.
            assert_eq!(data[note.offset as usize], 0x90, "{}", note.name);
            let semaphore = note.semaphore.unwrap();
            assert_ne!(semaphore.offset, semaphore.address);
            // A semaphore is a 16-bit counter, zero in the file.
            let at = semaphore.offset as usize;
            assert_eq!(&data[at..at + 2], &[0, 0], "{}", note.name);
        }
        assert_eq!(note(&file, "gc__start").args, "-4@112(%rsp)");
    }

    /// PostgreSQL 15 (Debian) is a PIE with 71 notes, all with semaphores, one probe (e.g.
    /// `query__execute__start`) at several sites.
    #[test]
    fn pie_postgres_has_every_site() {
        let Some((file, data)) = installed("/usr/lib/postgresql/15/bin/postgres") else {
            return;
        };
        assert!(file.position_independent);
        assert!(file.notes.len() >= 70, "{}", file.notes.len());
        for note in &file.notes {
            assert_eq!(data[note.offset as usize], 0x90, "{}", note.name);
            assert!(note.semaphore.is_some(), "{}", note.name);
        }
        let starts = file
            .notes
            .iter()
            .filter(|note| note.name == "query__execute__start")
            .count();
        assert!(starts >= 2, "{starts}");
        assert_eq!(note(&file, "query__start").args, "8@%rbx");
        assert!(file.symbol("debug_query_string").is_some());
    }

    #[test]
    fn prelinked_notes_move_with_the_base_section() {
        let mut desc = Vec::new();
        desc.extend_from_slice(&0x1010u64.to_le_bytes());
        desc.extend_from_slice(&0x2000u64.to_le_bytes());
        desc.extend_from_slice(&0x3000u64.to_le_bytes());
        desc.extend_from_slice(b"app\0start\0-4@%edi\0");
        let to_offset = |address: u64| Some(address - 0x100);
        let moved = decode(&desc, true, true, Some(0x2400), &to_offset).unwrap();
        assert_eq!(moved.address, 0x1410);
        assert_eq!(moved.offset, 0x1310);
        assert_eq!(
            moved.semaphore,
            Some(Semaphore {
                address: 0x3400,
                offset: 0x3300
            })
        );
        assert_eq!(moved.args, "-4@%edi");
        let unmoved = decode(&desc, true, true, Some(0x2000), &to_offset).unwrap();
        assert_eq!(unmoved.address, 0x1010);
        assert!(decode(&desc[..20], true, true, None, &to_offset).is_err());
    }

    /// A note section cut anywhere, or with sizes that lie, is an error or fewer notes, never a
    /// panic.
    #[test]
    fn truncated_and_lying_notes_never_panic() {
        let mut section = Vec::new();
        let mut desc = Vec::new();
        desc.extend_from_slice(&0x1010u64.to_le_bytes());
        desc.extend_from_slice(&0u64.to_le_bytes());
        desc.extend_from_slice(&0u64.to_le_bytes());
        desc.extend_from_slice(b"p\0n\08@%rax\0");
        section.extend_from_slice(&8u32.to_le_bytes());
        section.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        section.extend_from_slice(&NOTE_TYPE.to_le_bytes());
        section.extend_from_slice(b"stapsdt\0");
        section.extend_from_slice(&desc);
        let to_offset = |address: u64| Some(address);
        for cut in 0..=section.len() {
            for raw in raw_notes(&section[..cut], true).flatten() {
                let _ = decode(raw.desc, true, true, None, &to_offset);
            }
        }
        let mut lying = section.clone();
        lying[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(raw_notes(&lying, true).all(|raw| raw.is_err()));
    }
}
