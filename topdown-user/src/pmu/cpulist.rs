//! Kernel cpulists (`0-3,8,10-11`), as in `/sys/devices/system/cpu/online` and a PMU's `cpus`
//! or `cpumask` file.
//!
//! The kernel prints these with `%*pbl` (`bitmap_print_to_pagebuf`); an empty set prints as an
//! empty line (e.g. `/sys/devices/system/cpu/offline` with every CPU online). Lists are kept
//! as merged ranges, never expanded, so a hostile `0-4294967295` costs nothing.

use std::fmt;

use anyhow::{Result, bail};

/// A set of CPU numbers, stored as sorted, disjoint, non-adjacent inclusive ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuList {
    ranges: Vec<(u32, u32)>,
}

impl CpuList {
    /// Parses a cpulist. Accepts what the kernel prints and what people type: surrounding
    /// whitespace, a trailing newline, an empty list, ranges in any order, overlaps (merged, as
    /// `bitmap_parselist` ORs them). Rejects everything else with the offending piece quoted:
    /// empty items (`1,,2`), backwards ranges (`3-1`), open ranges (`1-`, `-1`), signs, non-
    /// decimal numbers, numbers above `u32::MAX`, and the kernel's `a-b:used/group` stride form
    /// (sysfs never prints it).
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(Self::default());
        }
        let mut ranges = Vec::new();
        for item in text.split(',') {
            let item_trimmed = item.trim();
            if item_trimmed.is_empty() {
                bail!("empty item in CPU list '{text}' (two commas, or a comma at an end)");
            }
            if item_trimmed.contains(':') || item_trimmed.contains('/') {
                bail!("'{item_trimmed}': stride ranges (a-b:used/group) are not supported");
            }
            let (first, last) = match item_trimmed.split_once('-') {
                Some((first, last)) => (
                    parse_cpu(first, item_trimmed)?,
                    parse_cpu(last, item_trimmed)?,
                ),
                None => {
                    let cpu = parse_cpu(item_trimmed, item_trimmed)?;
                    (cpu, cpu)
                }
            };
            if last < first {
                bail!("CPU range '{item_trimmed}' runs backwards (write {last}-{first})");
            }
            ranges.push((first, last));
        }
        Ok(Self::from_ranges(ranges))
    }

    /// The list of these CPUs, in any order, duplicates allowed.
    pub fn from_cpus(cpus: impl IntoIterator<Item = u32>) -> Self {
        Self::from_ranges(cpus.into_iter().map(|cpu| (cpu, cpu)).collect())
    }

    fn from_ranges(mut ranges: Vec<(u32, u32)>) -> Self {
        ranges.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
        for (first, last) in ranges {
            match merged.last_mut() {
                // Overlapping or adjacent (`0-3,4-7` is `0-7`).
                Some(prev) if first <= prev.1.saturating_add(1) => prev.1 = prev.1.max(last),
                _ => merged.push((first, last)),
            }
        }
        Self { ranges: merged }
    }

    /// Number of CPUs in the list.
    pub fn len(&self) -> u64 {
        self.ranges
            .iter()
            .map(|&(first, last)| u64::from(last - first) + 1)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn contains(&self, cpu: u32) -> bool {
        self.ranges
            .iter()
            .any(|&(first, last)| first <= cpu && cpu <= last)
    }

    /// The CPUs in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ranges.iter().flat_map(|&(first, last)| first..=last)
    }

    /// The merged inclusive ranges, in increasing order.
    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges
    }
}

fn parse_cpu(number: &str, item: &str) -> Result<u32> {
    let number = number.trim();
    if number.is_empty() {
        bail!("'{item}': a range needs a CPU number on both sides of '-'");
    }
    // `u32::from_str` takes a leading '+'; a cpulist never has one.
    if !number.bytes().all(|b| b.is_ascii_digit()) {
        bail!("'{item}': '{number}' is not a decimal CPU number");
    }
    number
        .parse()
        .map_err(|_| anyhow::anyhow!("'{item}': CPU number {number} is too large"))
}

/// Prints the kernel's compact form (`0-3,8,10-11`; empty for no CPUs), so parse/print
/// round-trips.
impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(first, last)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if first == last {
                write!(f, "{first}")?;
            } else {
                write!(f, "{first}-{last}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> CpuList {
        match CpuList::parse(text) {
            Ok(list) => list,
            Err(err) => panic!("'{text}' should parse: {err:#}"),
        }
    }

    fn error(text: &str) -> String {
        match CpuList::parse(text) {
            Ok(list) => panic!("'{text}' should not parse, got {list:?}"),
            Err(err) => format!("{err:#}"),
        }
    }

    #[test]
    fn kernel_forms() {
        let list = parse("0-3,8,10-11\n");
        assert_eq!(list.ranges(), &[(0, 3), (8, 8), (10, 11)]);
        assert_eq!(list.len(), 7);
        assert_eq!(list.iter().collect::<Vec<_>>(), [0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(list.to_string(), "0-3,8,10-11");
        assert!(list.contains(10) && !list.contains(9) && !list.contains(12));
        assert_eq!(parse("0\n").to_string(), "0");
        assert_eq!(parse("16-23").len(), 8);
    }

    #[test]
    fn empty_list_is_valid() {
        // `/sys/devices/system/cpu/offline` when every CPU is online.
        for text in ["", "\n", "  \n"] {
            let list = parse(text);
            assert!(list.is_empty());
            assert_eq!(list.len(), 0);
            assert_eq!(list.to_string(), "");
        }
    }

    #[test]
    fn unordered_overlapping_and_adjacent_ranges_merge() {
        assert_eq!(parse("8,0-3").to_string(), "0-3,8");
        assert_eq!(parse("0-3,2-5").to_string(), "0-5");
        assert_eq!(parse("0-3,4-7").to_string(), "0-7");
        assert_eq!(parse("5,5,5").to_string(), "5");
        assert_eq!(parse(" 0 - 1 , 3 ").to_string(), "0-1,3");
        assert_eq!(CpuList::from_cpus([3, 1, 2, 7]).to_string(), "1-3,7");
    }

    #[test]
    fn huge_ranges_are_not_expanded() {
        let list = parse("0-4294967295");
        assert_eq!(list.len(), 1 << 32);
        assert!(list.contains(u32::MAX));
        assert_eq!(parse("4294967295,0-4294967294").to_string(), "0-4294967295");
    }

    #[test]
    fn errors_quote_the_bad_piece() {
        assert_eq!(
            error("3-1"),
            "CPU range '3-1' runs backwards (write 1-3)"
        );
        assert_eq!(
            error("1,,2"),
            "empty item in CPU list '1,,2' (two commas, or a comma at an end)"
        );
        assert!(error("0-3,").contains("empty item"));
        assert!(error(",0").contains("empty item"));
        assert_eq!(
            error("1-"),
            "'1-': a range needs a CPU number on both sides of '-'"
        );
        assert!(error("-1").contains("both sides"));
        assert_eq!(error("a"), "'a': 'a' is not a decimal CPU number");
        assert_eq!(error("0-b"), "'0-b': 'b' is not a decimal CPU number");
        assert!(error("+1").contains("not a decimal"));
        assert!(error("0x3").contains("not a decimal"));
        assert!(error("1-2-3").contains("not a decimal"));
        assert_eq!(
            error("4294967296"),
            "'4294967296': CPU number 4294967296 is too large"
        );
        assert!(error("0-9:2/5").contains("stride ranges"));
    }
}
