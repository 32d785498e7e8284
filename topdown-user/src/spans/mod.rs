//! Spans: TopDown per unit of work, between a start probe and the matching end probe on the
//! same thread (`--span NAME=TARGET:PROVIDER:START..PROVIDER:END[,key=...][,abort=...]`), and
//! the PostgreSQL preset built on them (`--postgres`, [`postgres`]).
//!
//! This module turns specs into the sites the USDT program runs ([`usdt::SitePlan`]) and
//! says what each span kind's totals mean ([`KindInfo`]): its name, how its keys read, whether
//! its string keys are normalised (query texts) and which kind a helper's spans fold into
//! (parallel workers into their queries). The counting is the BPF side's (`spans.rs`).
//!
//! The folder holds everything about units of work a program marks itself:
//!
//! - [`usdt`]: the marks: USDT probe sites (SDT notes, argument specs, semaphore-enabling
//!   links). They sit here because a span is two of them; `-U` counts a site's hits with no
//!   span, the same sites without an end. [`usdt`] uses nothing of the spans, so it is the
//!   layer below them, as [`crate::functions::symbols`] is below the function probes.
//! - [`postgres`]: the `--postgres` preset, spans over PostgreSQL's own probes.
//! - [`normalize`]: query texts as one key per statement shape.
//! - [`report`]: span totals and USDT hits into the report.

pub mod normalize;
pub mod postgres;
pub mod report;
pub mod usdt;

use std::path::Path;

use anyhow::Result;
use topdown_common::usdt::{
    MAX_SPAN_KINDS, SpanKind, UsdtArg, UsdtSite, action, arg_kind, key_mode,
};

use crate::{
    error::{Failure, fail},
    spans::usdt::{
        Files, PlannedSite, ProbeName, SitePlan, args, find_file, notes, required_sites,
    },
};

/// What a span is keyed by (`key=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySpec {
    /// One key for all spans of the kind.
    None,
    /// The start probe's argument N (0-based), an integer.
    Integer(usize),
    /// The string the start probe's argument N points to.
    String(usize),
}

/// One `--span`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanSpec {
    pub name: String,
    pub target: String,
    pub start: (String, String),
    pub end: (String, String),
    pub key: KeySpec,
    pub abort: Option<(String, String)>,
}

impl SpanSpec {
    /// `NAME=TARGET:PROVIDER:START..PROVIDER:END[,key=argN|str:argN][,abort=PROVIDER:NAME]`.
    pub fn parse(text: &str) -> Result<Self> {
        let usage = |what: &str| {
            fail(
                Failure::Usage,
                format!(
                    "--span {text}: {what}; expected \
                     NAME=TARGET:PROVIDER:START..PROVIDER:END[,key=argN|str:argN][,abort=PROVIDER:NAME], \
                     e.g. request=./server:app:request__start..app:request__done,key=arg0"
                ),
            )
        };
        let (name, rest) = text.split_once('=').ok_or_else(|| usage("no NAME="))?;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(usage("NAME must be letters, digits, '_', '-' or '.'"));
        }
        let mut parts = rest.split(',');
        let probes = parts.next().unwrap_or_default();
        let (start, end) = probes
            .split_once("..")
            .ok_or_else(|| usage("no '..' between the start and the end probe"))?;
        let start = ProbeName::parse(start, "--span").map_err(|_| usage("bad start probe"))?;
        let (end_provider, end_name) = end
            .split_once(':')
            .filter(|(provider, name)| !provider.is_empty() && !name.is_empty())
            .ok_or_else(|| usage("the end probe must be PROVIDER:NAME"))?;
        let mut key = KeySpec::None;
        let mut abort = None;
        for option in parts {
            if let Some(value) = option.strip_prefix("key=") {
                let (string, arg) = match value.strip_prefix("str:") {
                    Some(arg) => (true, arg),
                    None => (false, value),
                };
                let index: usize = arg
                    .strip_prefix("arg")
                    .and_then(|digits| digits.parse().ok())
                    .filter(|index| *index < 12)
                    .ok_or_else(|| usage("key= takes argN or str:argN, N from 0 to 11"))?;
                key = if string {
                    KeySpec::String(index)
                } else {
                    KeySpec::Integer(index)
                };
            } else if let Some(value) = option.strip_prefix("abort=") {
                let (provider, name) = value
                    .split_once(':')
                    .filter(|(provider, name)| !provider.is_empty() && !name.is_empty())
                    .ok_or_else(|| usage("abort= takes PROVIDER:NAME"))?;
                abort = Some((provider.to_owned(), name.to_owned()));
            } else {
                return Err(usage(&format!("unknown option '{option}'")));
            }
        }
        Ok(Self {
            name: name.to_owned(),
            target: start.target,
            start: (start.provider, start.name),
            end: (end_provider.to_owned(), end_name.to_owned()),
            key,
            abort,
        })
    }
}

/// How reports read one span kind's totals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KindInfo {
    /// What reports call it (`query`, or the `--span` name).
    pub name: String,
    /// String keys are query texts: normalised (constants to `$n`) before they are compared.
    pub normalize_text: bool,
    /// Note keys are PostgreSQL query ids (reported signed, as `pg_stat_statements` has them).
    pub note_is_query_id: bool,
    /// Spans of this kind are a helper's (a parallel worker's): their counts fold into the
    /// entry of this kind with the same key, and they are not calls.
    pub folds_into: Option<u32>,
}

/// The sites and kinds of every span, preset and `-U` probe of a session.
#[derive(Clone, Debug, Default)]
pub struct SpanPlan {
    pub sites: SitePlan,
    pub kinds: Vec<KindInfo>,
}

impl SpanPlan {
    /// Builds the plan: `-U` probes, `--span`s and the PostgreSQL preset (its binary), with
    /// library names resolved through `pids`' mappings.
    pub fn build(
        hits: &[ProbeName],
        specs: &[SpanSpec],
        postgres: Option<&Path>,
        pids: &[u32],
    ) -> Result<Self> {
        let mut plan = Self::default();
        let mut files = Files::default();
        plan.sites.add_hits(hits, &mut files, pids)?;
        for spec in specs {
            if plan.kinds.iter().any(|kind| kind.name == spec.name) {
                return Err(fail(
                    Failure::Usage,
                    format!("--span {}: the name is given twice", spec.name),
                ));
            }
            plan.add_span(spec, &mut files, pids)?;
        }
        if let Some(binary) = postgres {
            postgres::add(&mut plan, binary, &mut files)?;
        }
        if plan.kinds.len() > MAX_SPAN_KINDS {
            return Err(fail(
                Failure::Usage,
                format!("at most {MAX_SPAN_KINDS} span kinds can be counted at once"),
            ));
        }
        Ok(plan)
    }

    /// A new span kind; its id.
    pub fn add_kind(&mut self, info: KindInfo, flags: u32) -> u32 {
        self.kinds.push(info);
        self.sites.kinds.push(SpanKind { flags });
        (self.kinds.len() - 1) as u32
    }

    pub fn is_empty(&self) -> bool {
        self.sites.sites.is_empty()
    }

    fn add_span(&mut self, spec: &SpanSpec, files: &mut Files, pids: &[u32]) -> Result<()> {
        let option = format!("--span {}", spec.name);
        let path = find_file(&spec.target, pids)?;
        let kind = self.add_kind(
            KindInfo {
                name: spec.name.clone(),
                normalize_text: false,
                note_is_query_id: false,
                folds_into: None,
            },
            0,
        );
        let file = files.get(&path)?;
        let (mode, key_arg) = match spec.key {
            KeySpec::None => (key_mode::NONE, None),
            KeySpec::Integer(index) => (key_mode::INTEGER, Some(index)),
            KeySpec::String(index) => (key_mode::STRING, Some(index)),
        };
        let starts = usdt_sites(file, &path, &spec.start, &option)?;
        for note in starts {
            let key = match key_arg {
                Some(index) => note_arg(file, note, index, &option)?,
                None => UsdtArg::default(),
            };
            self.sites.sites.push(site(
                &path,
                note,
                UsdtSite {
                    action: action::START,
                    id: kind,
                    key: mode,
                    args: [key, UsdtArg::default()],
                    ..UsdtSite::default()
                },
            ));
        }
        for note in usdt_sites(file, &path, &spec.end, &option)? {
            self.sites
                .sites
                .push(site(&path, note, span_site(action::END, kind)));
        }
        if let Some(abort) = &spec.abort {
            for note in usdt_sites(file, &path, abort, &option)? {
                self.sites
                    .sites
                    .push(site(&path, note, span_site(action::ABORT, kind)));
            }
        }
        Ok(())
    }
}

/// A site that only names its kind (ends, aborts).
pub fn span_site(action: u32, kind: u32) -> UsdtSite {
    UsdtSite {
        action,
        id: kind,
        ..UsdtSite::default()
    }
}

/// Every site of `provider:name` (exact) in `file`.
pub fn usdt_sites<'a>(
    file: &'a notes::SdtFile,
    path: &Path,
    (provider, name): &(String, String),
    option: &str,
) -> Result<Vec<&'a notes::SdtNote>> {
    let exact = |text: &str| text.contains(['*', '?']);
    if exact(provider) || exact(name) {
        return Err(fail(
            Failure::Usage,
            format!("{option}: span probes are named exactly, not by glob ({provider}:{name})"),
        ));
    }
    Ok(required_sites(file, path, provider, name, option)?
        .into_iter()
        .flat_map(|(_, notes)| notes)
        .collect())
}

/// A USDT site of `path` with its semaphore.
pub fn site(path: &Path, note: &notes::SdtNote, site: UsdtSite) -> PlannedSite {
    PlannedSite {
        target: path.to_owned(),
        offset: note.offset,
        ref_ctr_offset: note.semaphore.map_or(0, |semaphore| semaphore.offset),
        retprobe: false,
        site,
    }
}

/// Argument `index` of `note`, lowered for the BPF side.
pub fn note_arg(
    file: &notes::SdtFile,
    note: &notes::SdtNote,
    index: usize,
    option: &str,
) -> Result<UsdtArg> {
    let specs = args::parse_all(&note.args).map_err(|err| {
        fail(
            Failure::Usage,
            format!("{option}: probe {}:{}: {err:#}", note.provider, note.name),
        )
    })?;
    let spec = specs.get(index).ok_or_else(|| {
        fail(
            Failure::Usage,
            format!(
                "{option}: probe {}:{} has {} argument{} ('{}'): there is no arg{index}",
                note.provider,
                note.name,
                specs.len(),
                if specs.len() == 1 { "" } else { "s" },
                note.args
            ),
        )
    })?;
    spec.lower(note.address, &|name| file.symbol(name))
        .map_err(|err| {
            fail(
                Failure::Usage,
                format!(
                    "{option}: probe {}:{} arg{index}: {err:#}",
                    note.provider, note.name
                ),
            )
        })
}

/// A function's entry (or, with `retprobe`, its returns) in `path`, by symbol name.
pub fn function_site(
    file: &notes::SdtFile,
    path: &Path,
    symbol: &str,
    retprobe: bool,
    site: UsdtSite,
) -> Result<PlannedSite> {
    let address = file.symbol(symbol).ok_or_else(|| {
        fail(
            Failure::Usage,
            format!(
                "{}: no function {symbol} (is it the right binary?)",
                path.display()
            ),
        )
    })?;
    let offset = file.offset_of(address).ok_or_else(|| {
        fail(
            Failure::Usage,
            format!(
                "{}: function {symbol} at {address:#x} is in no segment",
                path.display()
            ),
        )
    })?;
    Ok(PlannedSite {
        target: path.to_owned(),
        offset,
        ref_ctr_offset: 0,
        retprobe,
        site,
    })
}

/// An argument read from a register (a function's argument at its entry).
pub fn register_arg(text: &str) -> Result<UsdtArg> {
    args::parse(text)?.lower(0, &|_| None)
}

/// A constant argument.
pub fn constant_arg(value: i64) -> UsdtArg {
    UsdtArg {
        kind: arg_kind::CONSTANT,
        size: 8,
        value,
        ..UsdtArg::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_specs_parse_with_their_options() {
        let spec = SpanSpec::parse(
            "req=/srv/app:app:request__start..app:request__done,key=str:arg1,abort=app:reset",
        )
        .unwrap();
        assert_eq!(
            spec,
            SpanSpec {
                name: "req".into(),
                target: "/srv/app".into(),
                start: ("app".into(), "request__start".into()),
                end: ("app".into(), "request__done".into()),
                key: KeySpec::String(1),
                abort: Some(("app".into(), "reset".into())),
            }
        );
        let plain = SpanSpec::parse("x=libfoo:p:a..p:b,key=arg0").unwrap();
        assert_eq!(plain.key, KeySpec::Integer(0));
        assert_eq!(plain.target, "libfoo");
        for (bad, why) in [
            ("p:a..p:b", "no NAME="),
            ("x=app:p:a", "no '..'"),
            ("x=app:p:a..b", "PROVIDER:NAME"),
            ("x=app:p:a..p:b,key=arg12", "N from 0 to 11"),
            ("x=app:p:a..p:b,key=argx", "argN"),
            ("x=app:p:a..p:b,color=red", "unknown option 'color=red'"),
            ("x y=app:p:a..p:b", "NAME must be"),
            ("x=p:a..p:b", "bad start probe"),
        ] {
            let err = SpanSpec::parse(bad).unwrap_err().to_string();
            assert!(
                err.contains(why) && err.starts_with("--span "),
                "{bad}: {err}"
            );
        }
    }
}
