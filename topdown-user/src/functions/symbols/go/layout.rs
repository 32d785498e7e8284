//! The runtime structure fields the Go probes read (`topdown_common::go_layout`): where
//! `runtime.g` keeps its stack's top (`g.stack.hi`) and where `runtime.gobuf` keeps the
//! resumed stack pointer and goroutine (`gobuf.sp`, `gobuf.g`). Every Go release from 1.17 on
//! lays them out the same way; when the binary has DWARF (not stripped), its own description
//! of those types is checked against that, so a runtime that moved them is refused rather
//! than misread.

use std::borrow::Cow;

use object::{Object as _, ObjectSection as _};
use topdown_common::go_layout;

type Slice<'a> = gimli::EndianSlice<'a, gimli::LittleEndian>;

/// Member offsets found in the DWARF, `None` where a type or member was not found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Found {
    g_stack: Option<u64>,
    stack_hi: Option<u64>,
    gobuf_sp: Option<u64>,
    gobuf_g: Option<u64>,
}

/// Ok when the binary's DWARF (if any) agrees with the layout the probes read; the reason
/// otherwise.
pub fn check(file: &object::File<'_>) -> Result<(), String> {
    if file.section_by_name(".debug_info").is_none() {
        return Ok(());
    }
    let found = match find(file) {
        Ok(found) => found,
        Err(err) => {
            log::warn!("reading the Go runtime's types from DWARF: {err}; using Go's layout");
            return Ok(());
        }
    };
    compare(found)
}

fn compare(found: Found) -> Result<(), String> {
    let expected = [
        (
            "runtime.g.stack.hi",
            found.g_stack.zip(found.stack_hi).map(|(a, b)| a + b),
            go_layout::G_STACK_HI,
        ),
        ("runtime.gobuf.sp", found.gobuf_sp, go_layout::GOBUF_SP),
        ("runtime.gobuf.g", found.gobuf_g, go_layout::GOBUF_G),
    ];
    for (field, at, want) in expected {
        match at {
            Some(at) if at == want => {}
            Some(at) => {
                return Err(format!(
                    "its runtime keeps {field} at offset {at}, where topdown reads {want}: a Go \
                     release whose goroutines topdown cannot follow"
                ));
            }
            None => log::debug!("{field}: not in the binary's DWARF"),
        }
    }
    Ok(())
}

/// A DWARF section's bytes, decompressed when the linker compressed it (Go compresses DWARF
/// with zlib by default: `SHF_COMPRESSED`, or the older `.zdebug_` sections).
fn section_data<'a>(file: &object::File<'a>, name: &str) -> Result<Cow<'a, [u8]>, String> {
    let Some(section) = file.section_by_name(name) else {
        return Ok(Cow::Borrowed(&[]));
    };
    let compressed = section
        .compressed_data()
        .map_err(|err| format!("{name}: {err}"))?;
    match compressed.format {
        object::CompressionFormat::None => Ok(Cow::Borrowed(compressed.data)),
        object::CompressionFormat::Zlib => {
            use std::io::Read as _;
            let mut out = Vec::with_capacity(
                usize::try_from(compressed.uncompressed_size).unwrap_or_default(),
            );
            flate2::read::ZlibDecoder::new(compressed.data)
                .read_to_end(&mut out)
                .map_err(|err| format!("{name}: {err}"))?;
            Ok(Cow::Owned(out))
        }
        other => Err(format!("{name}: {other:?} compression")),
    }
}

fn find(file: &object::File<'_>) -> Result<Found, String> {
    let sections = gimli::DwarfSections::load(|id| -> Result<Cow<'_, [u8]>, String> {
        section_data(file, id.name())
    })?;
    let dwarf = sections.borrow(|section| Slice::new(section, gimli::LittleEndian));
    let mut found = Found::default();
    let mut units = dwarf.units();
    while let Some(header) = units.next().map_err(|err| err.to_string())? {
        let unit = dwarf.unit(header).map_err(|err| err.to_string())?;
        let mut entries = unit.entries();
        // The structure whose members are being read, if it is one of ours.
        let mut inside: Option<(&str, isize)> = None;
        let mut depth = 0isize;
        while let Some((delta, entry)) = entries.next_dfs().map_err(|err| err.to_string())? {
            depth += delta;
            if inside.is_some_and(|(_, at)| depth <= at) {
                inside = None;
            }
            let name = || -> Option<String> {
                let value = entry.attr_value(gimli::DW_AT_name).ok()??;
                let name = dwarf.attr_string(&unit, value).ok()?;
                Some(name.to_string_lossy().into_owned())
            };
            match entry.tag() {
                gimli::DW_TAG_structure_type => {
                    inside = match name().as_deref() {
                        Some("runtime.g") => Some(("g", depth)),
                        Some("runtime.stack") => Some(("stack", depth)),
                        Some("runtime.gobuf") => Some(("gobuf", depth)),
                        _ => None,
                    };
                }
                gimli::DW_TAG_member => {
                    let Some((structure, _)) = inside else {
                        continue;
                    };
                    let offset = match entry.attr_value(gimli::DW_AT_data_member_location) {
                        Ok(Some(gimli::AttributeValue::Udata(offset))) => Some(offset),
                        Ok(Some(value)) => value.udata_value(),
                        _ => None,
                    };
                    let slot = match (structure, name().as_deref()) {
                        ("g", Some("stack")) => &mut found.g_stack,
                        ("stack", Some("hi")) => &mut found.stack_hi,
                        ("gobuf", Some("sp")) => &mut found.gobuf_sp,
                        ("gobuf", Some("g")) => &mut found.gobuf_g,
                        _ => continue,
                    };
                    if slot.is_none() {
                        *slot = offset;
                    }
                }
                _ => {}
            }
        }
        if found.g_stack.is_some()
            && found.stack_hi.is_some()
            && found.gobuf_sp.is_some()
            && found.gobuf_g.is_some()
        {
            break;
        }
    }
    Ok(found)
}

/// `(g.stack, stack.hi, gobuf.sp, gobuf.g)` as the binary's DWARF has them.
#[cfg(test)]
pub fn find_for_tests(file: &object::File<'_>) -> Result<[Option<u64>; 4], String> {
    let found = find(file)?;
    Ok([found.g_stack, found.stack_hi, found.gobuf_sp, found.gobuf_g])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_field_is_refused_and_a_missing_one_is_not() {
        let layout = Found {
            g_stack: Some(0),
            stack_hi: Some(8),
            gobuf_sp: Some(0),
            gobuf_g: Some(16),
        };
        assert_eq!(compare(layout), Ok(()));
        let moved = Found {
            gobuf_g: Some(24),
            ..layout
        };
        let err = compare(moved).unwrap_err();
        assert!(err.contains("runtime.gobuf.g at offset 24"), "{err}");
        assert_eq!(compare(Found::default()), Ok(()));
    }
}
