//! Where a jump to a PLT stub really goes: the stub's GOT slot names the function (its
//! `R_X86_64_JUMP_SLOT` relocation), and the first of the file's `DT_NEEDED` libraries that
//! defines it is where the dynamic linker binds it (System V ABI, "Shared Object Dependencies";
//! preloaded libraries and symbol interposition aside). Tail calls through the PLT
//! (`jmp usleep@plt`) then keep their caller's frame open until the callee returns.

use std::collections::HashMap;

use iced_x86::{Code, Decoder, DecoderOptions};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _, ObjectSymbolTable as _};

/// `DT_NEEDED` (ELF gABI, "Dynamic Section").
const DT_NEEDED: u64 = 1;
/// Every x86-64 PLT entry (`.plt`, `.plt.sec`) is 16 bytes (psABI, "Procedure Linkage Table").
const PLT_ENTRY: u64 = 16;

/// The PLT stubs of an x86-64 file by address, with the name of the function each one jumps
/// to, and the file's `DT_NEEDED` libraries in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Imports {
    pub stubs: HashMap<u64, String>,
    pub needed: Vec<String>,
}

pub fn imports(file: &object::File<'_>) -> Imports {
    let mut slots: HashMap<u64, String> = HashMap::new();
    if let (Some(relocations), Some(symbols)) =
        (file.dynamic_relocations(), file.dynamic_symbol_table())
    {
        for (slot, relocation) in relocations {
            let object::RelocationFlags::Elf { r_type } = relocation.flags() else {
                continue;
            };
            let object::RelocationTarget::Symbol(index) = relocation.target() else {
                continue;
            };
            // System V x86-64 psABI, table "Relocation Types".
            if r_type != object::elf::R_X86_64_JUMP_SLOT {
                continue;
            }
            if let Ok(name) = symbols.symbol_by_index(index).and_then(|s| s.name()) {
                slots.insert(slot, name.to_owned());
            }
        }
    }
    let mut stubs = HashMap::new();
    for section in [".plt", ".plt.sec"] {
        let Some(section) = file.section_by_name(section) else {
            continue;
        };
        let Ok(code) = section.data() else {
            continue;
        };
        let start = section.address();
        let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
        while decoder.can_decode() {
            let instruction = decoder.decode();
            if instruction.code() == Code::Jmp_rm64 && instruction.is_ip_rel_memory_operand() {
                let stub = start + (instruction.ip() - start) / PLT_ENTRY * PLT_ENTRY;
                if let Some(name) = slots.get(&instruction.memory_displacement64()) {
                    stubs.insert(stub, name.clone());
                }
            }
        }
    }
    Imports {
        stubs,
        needed: needed(file),
    }
}

/// `DT_NEEDED` names, from `.dynamic` (16-byte little-endian `Elf64_Dyn` entries) and
/// `.dynstr`.
fn needed(file: &object::File<'_>) -> Vec<String> {
    let (Some(dynamic), Some(strings)) = (
        file.section_by_name(".dynamic")
            .and_then(|section| section.data().ok()),
        file.section_by_name(".dynstr")
            .and_then(|section| section.data().ok()),
    ) else {
        return Vec::new();
    };
    let (entries, _) = dynamic.as_chunks::<16>();
    entries
        .iter()
        .filter_map(|entry| {
            let (tag, value) = entry.split_at(8);
            let tag = u64::from_le_bytes(tag.try_into().ok()?);
            let value = u64::from_le_bytes(value.try_into().ok()?) as usize;
            if tag != DT_NEEDED {
                return None;
            }
            let name = strings.get(value..)?;
            let end = name.iter().position(|byte| *byte == 0)?;
            Some(String::from_utf8_lossy(&name[..end]).into_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test binary itself is a dynamically linked x86-64 executable calling libc through
    /// its PLT.
    #[test]
    fn this_binarys_plt_names_libc_functions() {
        if std::env::consts::ARCH != "x86_64" {
            return;
        }
        let path = std::env::current_exe().unwrap();
        let data = std::fs::read(path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let imports = imports(&file);
        assert!(
            imports
                .needed
                .iter()
                .any(|name| name.starts_with("libc.so")),
            "{:?}",
            imports.needed
        );
        // Rust binaries are linked with -z now and may have no lazy PLT; then there are no
        // stubs to name, but any stub found must name a function.
        assert!(imports.stubs.values().all(|name| !name.is_empty()));
    }
}
