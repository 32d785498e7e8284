//! The Go version a binary was built with, from its build information blob, which stripped
//! binaries keep (`debug/buildinfo` in Go's standard library reads the same bytes): 14 magic
//! bytes, the pointer size, a flags byte, then either (flags bit 1, Go 1.18+) the version as a
//! varint-prefixed string at offset 32, or (older) the addresses of two Go string headers,
//! `runtime.buildVersion` first.

use object::{Object as _, ObjectSection as _};

const MAGIC: &[u8] = b"\xff Go buildinf:";
/// The blob is 16-byte aligned and its header 32 bytes long (cmd/link `buildinfo`).
const ALIGN: usize = 16;
const HEADER: usize = 32;

/// A Go release, as `go1.19.8` names it (`major.minor`; patch level and pre-release suffixes
/// do not change the runtime's layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoVersion {
    pub major: u32,
    pub minor: u32,
}

impl GoVersion {
    /// `go1.19.8`, `go1.21rc2`, `go1.22.0 X:boringcrypto`, `devel go1.23-abcdef ...`.
    pub fn parse(text: &str) -> Option<Self> {
        let start = text.find("go1")? + 2;
        let rest = &text[start..];
        let digits = |text: &str| {
            let end = text
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(text.len());
            text[..end].parse::<u32>().ok().map(|value| (value, end))
        };
        let (major, end) = digits(rest)?;
        let minor = match rest[end..].strip_prefix('.') {
            Some(after) => digits(after).map_or(0, |(minor, _)| minor),
            None => 0,
        };
        Some(Self { major, minor })
    }
}

impl std::fmt::Display for GoVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "go{}.{}", self.major, self.minor)
    }
}

/// The version string of the binary (`go1.19.8`), or `None` when it has no readable blob.
pub fn version(file: &object::File<'_>) -> Option<String> {
    // The linker puts the blob at the start of `.go.buildinfo` (ELF), else near the start of
    // the data segment.
    let section = file
        .section_by_name(".go.buildinfo")
        .or_else(|| file.section_by_name(".data"))?;
    let data = section.data().ok()?;
    let window = &data[..data.len().min(64 * 1024)];
    let mut from = 0;
    let blob = loop {
        let at = from + find(&window[from..], MAGIC)?;
        if at % ALIGN == 0 && window.len() - at >= HEADER {
            break &window[at..];
        }
        from = at + 1;
    };
    let pointer_size = usize::from(blob[14]);
    let flags = blob[15];
    if flags & 2 != 0 {
        return varint_string(&blob[HEADER..]);
    }
    // Older blobs: the address of `runtime.buildVersion`, a string header {data, len}.
    if flags & 1 != 0 || pointer_size != 8 {
        return None; // big-endian or 32-bit: not a target topdown probes
    }
    let header = read_u64(blob, 16)?;
    let string = read_at(file, header, 16)?;
    let (data, len) = (read_u64(&string, 0)?, read_u64(&string, 8)?);
    if len > 256 {
        return None;
    }
    let bytes = read_at(file, data, len as usize)?;
    String::from_utf8(bytes).ok()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let word = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(word.try_into().ok()?))
}

/// `len` bytes at virtual address `address`, from whichever section holds them.
fn read_at(file: &object::File<'_>, address: u64, len: usize) -> Option<Vec<u8>> {
    file.sections().find_map(|section| {
        let start = section.address();
        let offset = address.checked_sub(start)?;
        if offset >= section.size() {
            return None;
        }
        let data = section.data().ok()?;
        let offset = usize::try_from(offset).ok()?;
        data.get(offset..offset.checked_add(len)?)
            .map(<[u8]>::to_vec)
    })
}

/// A string prefixed by its length as an unsigned varint (encoding/binary `Uvarint`).
fn varint_string(bytes: &[u8]) -> Option<String> {
    let mut len = 0u64;
    let mut shift = 0;
    let mut used: usize = 0;
    for byte in bytes.iter().take(10) {
        used += 1;
        len |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    let len = usize::try_from(len).ok()?;
    let text = bytes.get(used..used.checked_add(len)?)?;
    String::from_utf8(text.to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_go_names_them() {
        let v = |major, minor| Some(GoVersion { major, minor });
        assert_eq!(GoVersion::parse("go1.19.8"), v(1, 19));
        assert_eq!(GoVersion::parse("go1.21rc2"), v(1, 21));
        assert_eq!(GoVersion::parse("go1.16"), v(1, 16));
        assert_eq!(GoVersion::parse("go1.22.0 X:boringcrypto"), v(1, 22));
        assert_eq!(GoVersion::parse("devel go1.23-abcdef Tue"), v(1, 23));
        assert_eq!(GoVersion::parse("gccgo"), None);
        assert!(GoVersion::parse("go1.16").unwrap() < GoVersion::parse("go1.17.1").unwrap());
    }

    #[test]
    fn inline_version_strings_are_varint_prefixed() {
        let mut blob = b"go1.19.8".to_vec();
        blob.insert(0, 8);
        assert_eq!(varint_string(&blob).as_deref(), Some("go1.19.8"));
        // A length past the data is no string.
        assert_eq!(varint_string(&[0x20, b'g']), None);
        // Two-byte varint: 130 bytes.
        let mut long = vec![0x82, 0x01];
        long.extend(std::iter::repeat_n(b'x', 130));
        assert_eq!(varint_string(&long).map(|s| s.len()), Some(130));
    }
}
