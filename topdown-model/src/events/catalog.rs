//! The PMUs an event spec can name: their `type`, `format/` (where each term's bits go in
//! `config`, `config1`, `config2`) and `events/` aliases, read from
//! `<root>/sys/bus/event_source/devices` (`/` live, a fixture tree in tests).

use std::{collections::BTreeMap, fs, path::Path};

use anyhow::{Result, bail};

/// Which `perf_event_attr` word a format term writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigWord {
    Config,
    Config1,
    Config2,
}

/// A format term: `config:0-7,32-35` is bits 0-7 of the value into config bits 0-7, and value
/// bits 8-11 into config bits 32-35.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format {
    pub word: ConfigWord,
    /// Inclusive bit ranges, low value bits first.
    pub ranges: Vec<(u32, u32)>,
}

impl Format {
    /// Parses a `format/` file's text.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        let Some((word, ranges)) = text.split_once(':') else {
            bail!("format '{text}' is not WORD:BITS");
        };
        let word = match word {
            "config" => ConfigWord::Config,
            "config1" => ConfigWord::Config1,
            "config2" => ConfigWord::Config2,
            other => bail!("format '{text}': unknown word '{other}'"),
        };
        let mut parsed = Vec::new();
        for range in ranges.split(',') {
            let (low, high) = match range.split_once('-') {
                Some((low, high)) => (low, high),
                None => (range, range),
            };
            let (Ok(low), Ok(high)) = (low.trim().parse::<u32>(), high.trim().parse::<u32>())
            else {
                bail!("format '{text}': bad bit range '{range}'");
            };
            if low > high || high > 63 {
                bail!("format '{text}': bit range '{range}' outside 0-63");
            }
            parsed.push((low, high));
        }
        Ok(Self {
            word,
            ranges: parsed,
        })
    }

    /// Total bits the term holds.
    pub fn width(&self) -> u32 {
        self.ranges.iter().map(|(low, high)| high - low + 1).sum()
    }

    /// Scatters `value` into the word's bits; `None` if it does not fit.
    pub fn place(&self, value: u64) -> Option<u64> {
        let width = self.width();
        if width < 64 && value >> width != 0 {
            return None;
        }
        let mut placed = 0u64;
        let mut rest = value;
        for (low, high) in &self.ranges {
            let bits = high - low + 1;
            let mask = if bits == 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
            placed |= (rest & mask) << low;
            rest = if bits == 64 { 0 } else { rest >> bits };
        }
        Some(placed)
    }
}

/// One PMU of the catalog.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CatalogPmu {
    pub name: String,
    pub perf_type: u32,
    pub formats: BTreeMap<String, Format>,
    /// Alias name -> its term string (`event=0x00,umask=0x80`).
    pub events: BTreeMap<String, String>,
    /// `caps/*` files.
    pub caps: BTreeMap<String, String>,
}

impl CatalogPmu {
    /// A CPU core PMU (raw events and named core events resolve here).
    pub fn is_core(&self) -> bool {
        matches!(self.name.as_str(), "cpu" | "cpu_core" | "cpu_atom")
            || self.name.starts_with("armv8_")
            || self.name.starts_with("armv9_")
    }
}

/// Every PMU found, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PmuCatalog {
    pub pmus: BTreeMap<String, CatalogPmu>,
    /// The CPU's vendor from `<root>/proc/cpuinfo` (`GenuineIntel`, `AuthenticAMD`, or
    /// `Arm (CPU implementer 0x41)`); `None` when there is no cpuinfo to read. Raw encodings
    /// are vendor-specific: an Intel event code on an AMD or Arm core counts something else.
    pub cpu_vendor: Option<String>,
    /// The topdown model in use (`intel-skl`): libpfm-style names without a `PMU::` prefix
    /// are encoded for its PMU rather than the one libpfm detects.
    pub model: Option<String>,
}

/// The vendor line of a cpuinfo text (see [`PmuCatalog::cpu_vendor`]).
fn cpu_vendor(cpuinfo: &str) -> String {
    let field = |name: &str| {
        cpuinfo.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_owned())
        })
    };
    if let Some(vendor) = field("vendor_id") {
        vendor
    } else if let Some(implementer) = field("CPU implementer") {
        format!("Arm (CPU implementer {implementer})")
    } else {
        "unknown".to_owned()
    }
}

fn read_dir_files(dir: &Path) -> BTreeMap<String, String> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let text = fs::read_to_string(entry.path()).ok()?;
                    Some((name, text.trim().to_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
}

impl PmuCatalog {
    /// Loads `<root>/sys/bus/event_source/devices`. A PMU whose format file does not parse is
    /// kept without that term (an error only if a spec uses it).
    pub fn load(root: &Path) -> Self {
        let cpu_vendor = fs::read_to_string(root.join("proc/cpuinfo"))
            .ok()
            .map(|text| cpu_vendor(&text));
        let devices = root.join("sys/bus/event_source/devices");
        let mut pmus = BTreeMap::new();
        let Ok(entries) = fs::read_dir(&devices) else {
            return Self {
                pmus,
                cpu_vendor,
                model: None,
            };
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let dir = devices.join(&name);
            let Some(perf_type) = fs::read_to_string(dir.join("type"))
                .ok()
                .and_then(|text| text.trim().parse().ok())
            else {
                continue;
            };
            let formats = read_dir_files(&dir.join("format"))
                .into_iter()
                .filter_map(|(term, text)| Some((term, Format::parse(&text).ok()?)))
                .collect();
            let events = read_dir_files(&dir.join("events"))
                .into_iter()
                // `.scale`, `.unit`, `.per-pkg`, `.snapshot` describe an alias; they are none.
                .filter(|(alias, _)| {
                    ![".scale", ".unit", ".per-pkg", ".snapshot"]
                        .iter()
                        .any(|suffix| alias.ends_with(suffix))
                })
                .collect();
            let caps = read_dir_files(&dir.join("caps"));
            pmus.insert(
                name.clone(),
                CatalogPmu {
                    name,
                    perf_type,
                    formats,
                    events,
                    caps,
                },
            );
        }
        Self {
            pmus,
            cpu_vendor,
            model: None,
        }
    }

    /// The catalog for specs counted with `model` (see [`PmuCatalog::model`]).
    pub fn with_model(mut self, model: &str) -> Self {
        self.model = Some(model.to_owned());
        self
    }

    /// The core PMUs, `cpu` first.
    pub fn core_pmus(&self) -> Vec<&CatalogPmu> {
        let mut core: Vec<&CatalogPmu> = self.pmus.values().filter(|pmu| pmu.is_core()).collect();
        core.sort_by_key(|pmu| (pmu.name != "cpu", pmu.name.clone()));
        core
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_scatter_values_across_ranges() {
        let amd_event = Format::parse("config:0-7,32-35").unwrap();
        assert_eq!(amd_event.width(), 12);
        // Event 0x1A0: low byte 0xA0 to bits 0-7, high nibble 0x1 to bits 32-35.
        assert_eq!(amd_event.place(0x1a0), Some(0x1_0000_00a0));
        assert_eq!(amd_event.place(0x1000), None);
        let flag = Format::parse("config:18").unwrap();
        assert_eq!(flag.place(1), Some(1 << 18));
        assert_eq!(flag.place(2), None);
        let whole = Format::parse("config1:0-63").unwrap();
        assert_eq!(whole.place(u64::MAX), Some(u64::MAX));
        assert_eq!(whole.word, ConfigWord::Config1);
        assert!(Format::parse("config3:0-7").is_err());
        assert!(Format::parse("config:9-2").is_err());
        assert!(Format::parse("config:0-64").is_err());
        assert!(Format::parse("nonsense").is_err());
    }

    #[test]
    fn the_vendor_comes_from_cpuinfo() {
        assert_eq!(
            cpu_vendor("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n"),
            "AuthenticAMD"
        );
        assert_eq!(
            cpu_vendor("processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd49\n"),
            "Arm (CPU implementer 0x41)"
        );
        assert_eq!(cpu_vendor(""), "unknown");
    }
}
