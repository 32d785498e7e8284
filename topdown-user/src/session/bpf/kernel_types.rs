//! Field offsets of kernel structures, read from the kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! aya-ebpf has no CO-RE for Rust programs, so the sched_switch program gets the offsets it
//! needs to read the arriving task's pid, tgid and cgroup as load-time globals.
//!
//! Hand-written rather than a crate: aya-obj's BTF parser keeps member offsets private, and the
//! maintained standalone parser (btf-rs) is LGPL, which this MIT/Apache binary does not take in.
//! Only what offsets need is decoded: the header, each type's kind and trailing data length, and
//! struct/union members. Format: Linux `Documentation/bpf/btf.rst`, sections 2 ("BTF Type and
//! String Encoding") and 2.2 ("Type Encoding").

use std::collections::HashMap;

use anyhow::{Context as _, Result, bail};
use topdown_common::{FIELD_ABSENT, kernel_offset};

/// `BTF_MAGIC` (btf.rst 2.1, `struct btf_header`).
const MAGIC: u16 = 0xeb9f;

// Kinds (btf.rst 2.2, `BTF_KIND_*`).
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;

/// A struct or union member: byte offset within its parent, and its type id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Member {
    name: u32,
    type_id: u32,
    bit_offset: u32,
}

#[derive(Debug, Default)]
struct Composite {
    members: Vec<Member>,
}

/// The structs and unions of one BTF blob, with their members.
pub struct KernelTypes {
    strings: Vec<u8>,
    /// By type id (ids start at 1); `None` for kinds other than struct and union.
    composites: Vec<Option<Composite>>,
    /// Named structs by name (the first of each name: vmlinux has one definition per name).
    structs: HashMap<String, u32>,
}

impl KernelTypes {
    pub fn from_sys_fs() -> Result<Self> {
        let path = "/sys/kernel/btf/vmlinux";
        let data = std::fs::read(path).with_context(|| format!("reading {path}"))?;
        Self::parse(&data).with_context(|| format!("parsing {path}"))
    }

    pub fn parse(data: &[u8]) -> Result<Self> {
        let u16_at = |at: usize| -> Result<u16> {
            let bytes = data.get(at..at + 2).context("truncated BTF header")?;
            Ok(u16::from_ne_bytes([bytes[0], bytes[1]]))
        };
        if u16_at(0)? != MAGIC {
            bail!("not BTF in this machine's byte order (bad magic)");
        }
        let header_u32 = |at: usize| read_u32(data, at).context("truncated BTF header");
        let header_len = header_u32(4)? as usize;
        let type_off = header_u32(8)? as usize;
        let type_len = header_u32(12)? as usize;
        let str_off = header_u32(16)? as usize;
        let str_len = header_u32(20)? as usize;
        let types = slice(data, header_len + type_off, type_len).context("type section")?;
        let strings = slice(data, header_len + str_off, str_len)
            .context("string section")?
            .to_vec();

        let mut composites = vec![None];
        let mut structs = HashMap::new();
        let mut at = 0;
        while at < types.len() {
            let name = read_u32(types, at).context("truncated type")?;
            let info = read_u32(types, at + 4).context("truncated type")?;
            at += 12;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31 != 0;
            let trailing = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                _ => 0,
            };
            let body = slice(types, at, trailing).context("truncated type data")?;
            at += trailing;
            if kind != KIND_STRUCT && kind != KIND_UNION {
                composites.push(None);
                continue;
            }
            let mut members = Vec::with_capacity(vlen);
            for member in body.as_chunks::<12>().0 {
                let offset = read_u32(member, 8).context("member")?;
                members.push(Member {
                    name: read_u32(member, 0).context("member")?,
                    type_id: read_u32(member, 4).context("member")?,
                    // With kind_flag, the top 8 bits are a bitfield's size (btf.rst 2.2.4).
                    bit_offset: if kind_flag {
                        offset & 0x00ff_ffff
                    } else {
                        offset
                    },
                });
            }
            let id = composites.len() as u32;
            if kind == KIND_STRUCT && name != 0 {
                let name = string_at(&strings, name).to_owned();
                structs.entry(name).or_insert(id);
            }
            composites.push(Some(Composite { members }));
        }
        Ok(Self {
            strings,
            composites,
            structs,
        })
    }

    /// Byte offset of `field` in `struct name`, looking into anonymous struct and union members
    /// (where the kernel puts many fields). `None` if either is not there or is a bitfield.
    pub fn offset_of(&self, name: &str, field: &str) -> Option<u32> {
        let id = *self.structs.get(name)?;
        self.find(id, field, 0)
    }

    fn find(&self, id: u32, field: &str, depth: u32) -> Option<u32> {
        // Anonymous members nest a few levels at most; the bound only guards bad input.
        if depth > 8 {
            return None;
        }
        let composite = self.composites.get(id as usize)?.as_ref()?;
        for member in &composite.members {
            if member.name != 0 {
                if string_at(&self.strings, member.name) == field {
                    return (member.bit_offset % 8 == 0).then_some(member.bit_offset / 8);
                }
                continue;
            }
            if let Some(inner) = self.find(member.type_id, field, depth + 1) {
                return Some(member.bit_offset / 8 + inner);
            }
        }
        None
    }
}

/// The offsets the sched_switch program reads the arriving task through
/// (`topdown_common::kernel_offset`), from this kernel's BTF; an error names what is missing.
pub fn switch_offsets() -> Result<[u32; kernel_offset::COUNT]> {
    KernelTypes::from_sys_fs()?.switch_offsets()
}

impl KernelTypes {
    pub fn switch_offsets(&self) -> Result<[u32; kernel_offset::COUNT]> {
        let fields = [
            (kernel_offset::TASK_PID, "task_struct", "pid"),
            (kernel_offset::TASK_CGROUPS, "task_struct", "cgroups"),
            (kernel_offset::CSS_SET_DFL_CGRP, "css_set", "dfl_cgrp"),
            (kernel_offset::CGROUP_LEVEL, "cgroup", "level"),
            // Linux >= 6.2; older kernels have `ancestor_ids` instead.
            (kernel_offset::CGROUP_ANCESTORS, "cgroup", "ancestors"),
            (kernel_offset::CGROUP_KN, "cgroup", "kn"),
            (kernel_offset::KERNFS_NODE_ID, "kernfs_node", "id"),
        ];
        let mut offsets = [FIELD_ABSENT; kernel_offset::COUNT];
        for (index, name, field) in fields {
            offsets[index] = self
                .offset_of(name, field)
                .with_context(|| format!("no {name}.{field} in the kernel's BTF"))?;
        }
        if self.offset_of("task_struct", "tgid") != Some(offsets[kernel_offset::TASK_PID] + 4) {
            bail!("task_struct.tgid does not follow task_struct.pid in the kernel's BTF");
        }
        Ok(offsets)
    }
}

fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    let bytes = data.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

fn slice(data: &[u8], at: usize, len: usize) -> Option<&[u8]> {
    data.get(at..at.checked_add(len)?)
}

fn string_at(strings: &[u8], offset: u32) -> &str {
    let rest = strings.get(offset as usize..).unwrap_or_default();
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    std::str::from_utf8(&rest[..end]).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with `struct outer { int a; union { int b; int c; }; }` (the union anonymous,
    /// at byte 8), built by hand following btf.rst.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0outer\0a\0b\0c\0".to_vec();
        let (int, outer, a, b, c) = (1u32, 5u32, 11u32, 13u32, 15u32);
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            for word in words {
                types.extend_from_slice(&word.to_ne_bytes());
            }
        };
        // [1] int: name, info (kind 1), size 4, encoding word.
        push(&[int, KIND_INT << 24, 4, 32]);
        // [2] anonymous union { b at 0, c at 0 }.
        push(&[0, (KIND_UNION << 24) | 2, 4, b, 1, 0, c, 1, 0]);
        // [3] struct outer { a at 0, <anon union> at bit 64 }.
        push(&[outer, (KIND_STRUCT << 24) | 2, 12, a, 1, 0, 0, 2, 64]);
        let mut data = Vec::new();
        data.extend_from_slice(&MAGIC.to_ne_bytes());
        data.extend_from_slice(&[1, 0]);
        for word in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            data.extend_from_slice(&word.to_ne_bytes());
        }
        data.extend_from_slice(&types);
        data.extend_from_slice(&strings);
        data
    }

    #[test]
    fn offsets_of_direct_and_anonymous_members() {
        let types = KernelTypes::parse(&blob()).unwrap();
        assert_eq!(types.offset_of("outer", "a"), Some(0));
        assert_eq!(types.offset_of("outer", "c"), Some(8));
        assert_eq!(types.offset_of("outer", "missing"), None);
        assert_eq!(types.offset_of("nothing", "a"), None);
    }

    #[test]
    fn bad_blobs_are_errors() {
        assert!(KernelTypes::parse(&[0, 1]).is_err());
        let mut truncated = blob();
        truncated.truncate(40);
        assert!(KernelTypes::parse(&truncated).is_err());
    }

    /// The running kernel's own BTF, where there is one: the fields the sched_switch program
    /// reads all exist, and `tgid` follows `pid` as `struct task_struct` has always had it.
    #[test]
    fn this_kernel_has_the_fields_read_at_switches() {
        let Ok(types) = KernelTypes::from_sys_fs() else {
            eprintln!("skipped: no readable /sys/kernel/btf/vmlinux");
            return;
        };
        let offsets = types.switch_offsets().unwrap();
        assert!(offsets.iter().all(|offset| *offset != FIELD_ABSENT));
        // Offsets differ between builds; these two fields have been first in their structs
        // for as long as the kernel has had them.
        assert_eq!(offsets[kernel_offset::CGROUP_LEVEL] % 4, 0);
        assert_eq!(types.offset_of("css_set", "subsys"), Some(0));
    }
}
