//! `--format pprof`: the report's stacks ([`super::stacks`]) as a gzipped `profile.proto`, the
//! format of pprof (`go tool pprof`), Pyroscope, Parca, Grafana and speedscope.
//!
//! Sample types, in this order: `calls`, the weight counter (`slots`, `cpu-clock` in
//! nanoseconds, `cycles`), then each TopDown category of the report's level in the weight
//! counter's unit (its fraction times the weight). Each sample is one stack with its exclusive
//! values, so pprof's *flat* is topdown's exclusive figure and *cum* its inclusive one; labels
//! `pid`, `tid`, `comm` and `cgroup` where the report splits by them. The default sample type
//! is the weight counter.

use std::{collections::BTreeMap, io::Write as _};

use anyhow::{Context as _, Result};

use super::{By, Report, stacks::Stacks};

/// profile.proto's messages, written by hand with `prost`'s derive from the field numbers of
/// <https://github.com/google/pprof/blob/main/proto/profile.proto> (package
/// `perftools.profiles`), so the build needs no `protoc`. Only the fields topdown writes are
/// declared; a reader skips the rest.
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        /// `string_table[0]` must be "".
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Leaf first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

/// The profile's string table: index 0 is "".
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: BTreeMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut strings = Self::default();
        strings.of("");
        strings
    }

    fn of(&mut self, text: &str) -> i64 {
        if let Some(index) = self.index.get(text) {
            return *index;
        }
        let index = self.table.len() as i64;
        self.table.push(text.to_owned());
        self.index.insert(text.to_owned(), index);
        index
    }
}

/// pprof's unit for a counter: time counters in nanoseconds (pprof then shows ms, s), the rest
/// counts.
fn unit_of(counter: &str) -> &'static str {
    match counter {
        "cpu-clock" | "task-clock" => "nanoseconds",
        _ => "count",
    }
}

fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Builds the profile (not yet encoded).
pub fn profile(report: &Report, stacks: &Stacks) -> proto::Profile {
    let mut strings = Strings::new();
    let unit = unit_of(&stacks.weight_counter);
    let mut sample_type = vec![proto::ValueType {
        r#type: strings.of("calls"),
        unit: strings.of("count"),
    }];
    let weight_type = proto::ValueType {
        r#type: strings.of(&stacks.weight_counter),
        unit: strings.of(unit),
    };
    sample_type.push(weight_type);
    for category in &stacks.categories {
        sample_type.push(proto::ValueType {
            r#type: strings.of(category),
            unit: strings.of(unit),
        });
    }

    let mut mappings: BTreeMap<String, u64> = BTreeMap::new();
    let mut functions: BTreeMap<(String, Option<String>), u64> = BTreeMap::new();
    let mut profile = proto::Profile {
        sample_type,
        period_type: Some(weight_type),
        period: 1,
        duration_nanos: (report.duration_s * 1e9) as i64,
        default_sample_type: weight_type.r#type,
        ..proto::Profile::default()
    };
    for stack in &stacks.stacks {
        let mut location_id = Vec::with_capacity(stack.frames.len());
        for frame in stack.frames.iter().rev() {
            let key = (frame.name.clone(), frame.file.clone());
            let id = match functions.get(&key) {
                Some(id) => *id,
                None => {
                    // One function and one location per frame name: ids are 1-based.
                    let id = functions.len() as u64 + 1;
                    let mapping_id = match &frame.file {
                        Some(file) => match mappings.get(file) {
                            Some(id) => *id,
                            None => {
                                let id = mappings.len() as u64 + 1;
                                mappings.insert(file.clone(), id);
                                profile.mapping.push(proto::Mapping {
                                    id,
                                    filename: strings.of(file),
                                    has_functions: true,
                                    ..proto::Mapping::default()
                                });
                                id
                            }
                        },
                        None => 0,
                    };
                    let name = strings.of(&frame.name);
                    profile.function.push(proto::Function {
                        id,
                        name,
                        system_name: name,
                        filename: frame.file.as_deref().map_or(0, |file| strings.of(file)),
                    });
                    profile.location.push(proto::Location {
                        id,
                        mapping_id,
                        address: 0,
                        line: vec![proto::Line {
                            function_id: id,
                            line: 0,
                        }],
                    });
                    functions.insert(key, id);
                    id
                }
            };
            location_id.push(id);
        }
        let mut value = vec![signed(stack.calls), signed(stack.weight)];
        value.extend(stack.categories.iter().map(|v| signed(*v)));
        let mut label = Vec::new();
        let mut number = |key: &str, num: Option<u32>| {
            if let Some(num) = num {
                label.push(proto::Label {
                    key: strings.of(key),
                    num: i64::from(num),
                    ..proto::Label::default()
                });
            }
        };
        number("pid", stack.labels.pid);
        number("tid", stack.labels.tid);
        for (key, text) in [
            ("comm", &stack.labels.comm),
            ("cgroup", &stack.labels.cgroup),
        ] {
            if let Some(text) = text {
                label.push(proto::Label {
                    key: strings.of(key),
                    str: strings.of(text),
                    ..proto::Label::default()
                });
            }
        }
        profile.sample.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }
    let mut comments = vec![format!(
        "topdown {}: model {}, level {}, scope {}",
        report.topdown_version, report.model, report.level, report.scope
    )];
    if report.synthetic {
        comments.push(
            "SYNTHETIC COUNTERS: syscall tracepoints stood in for the hardware events".into(),
        );
    }
    if stacks.truncated {
        comments.push(
            "call paths past 200000 or 64 deep were cut: their counts are in the shorter paths"
                .into(),
        );
    }
    profile.comment = comments.iter().map(|text| strings.of(text)).collect();
    profile.string_table = strings.table;
    profile
}

/// Writes `report` as a gzipped profile.proto.
pub fn write_pprof(report: &Report, by: &[By], out: &mut dyn std::io::Write) -> Result<()> {
    report.check_whole_run("--format pprof writes")?;
    let stacks = super::stacks::stacks(report, by)?;
    let encoded = prost::Message::encode_to_vec(&profile(report, &stacks));
    let mut gzip = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    gzip.write_all(&encoded)
        .context("writing the pprof profile")?;
    gzip.finish().context("writing the pprof profile")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use prost::Message as _;

    use super::*;
    use crate::report::tests::report_of;

    /// The gzip decodes to a profile whose sample values add up, per type, to the report's
    /// exclusive figures, with string 0 empty and every location id resolving.
    #[test]
    fn profile_round_trips_and_sums_to_the_exclusive_figures() {
        let mut report = report_of("intel-icl", 2);
        report.interval = None;
        let mut gzipped = Vec::new();
        write_pprof(&report, &[], &mut gzipped).unwrap();
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(gzipped.as_slice())
            .read_to_end(&mut raw)
            .unwrap();
        let profile = proto::Profile::decode(raw.as_slice()).unwrap();
        let strings = &profile.string_table;
        assert_eq!(strings[0], "");
        let types: Vec<&str> = profile
            .sample_type
            .iter()
            .map(|t| strings[t.r#type as usize].as_str())
            .collect();
        assert_eq!(&types[..2], ["calls", "slots"]);
        assert_eq!(types.len(), 2 + 12);
        assert_eq!(strings[profile.default_sample_type as usize], "slots");
        let sum = |index: usize| -> i64 { profile.sample.iter().map(|s| s.value[index]).sum() };
        let calls: u64 = report.functions.iter().map(|f| f.calls).sum();
        assert_eq!(sum(0), calls as i64);
        let slots: u64 = report
            .functions
            .iter()
            .map(|f| f.exclusive.counters["slots"])
            .sum();
        assert_eq!(sum(1), slots as i64);
        let memory = types.iter().position(|t| *t == "memory_bound").unwrap();
        let expected: i64 = report
            .functions
            .iter()
            .map(|f| {
                (f.exclusive.metrics["memory_bound"].unwrap()
                    * f.exclusive.counters["slots"] as f64)
                    .round() as i64
            })
            .sum();
        assert_eq!(sum(memory), expected);
        for sample in &profile.sample {
            for id in &sample.location_id {
                assert!(profile.location.iter().any(|l| l.id == *id));
            }
        }
        let pid_label = profile
            .sample
            .iter()
            .flat_map(|s| &s.label)
            .find(|l| strings[l.key as usize] == "pid")
            .unwrap();
        assert_eq!(pid_label.num, 100);
    }

    #[test]
    fn intervals_are_refused() {
        let report = report_of("intel-icl", 1);
        let err = write_pprof(&report, &[], &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("interval 3"), "{err}");
    }
}
