//! `--postgres [BIN]`: TopDown per query of a PostgreSQL server (built with `--enable-dtrace`,
//! as Debian's and most distributions' are), without touching it.
//!
//! Sites, all in the server binary (PostgreSQL 15's src/backend/tcop/postgres.c, pquery.c and
//! utils/activity/backend_status.c):
//!
//! - a `query` span from `postgresql:query__start(query text)` to `query__done` (the simple
//!   protocol, `exec_simple_query`), and from `query__execute__start` to
//!   `query__execute__done` (`PortalRun`: the extended protocol's Execute, whose text the
//!   server keeps in `debug_query_string`). `PortalRun` also runs inside a simple query: a
//!   start of the kind inside an open one is absorbed by it, so each execution is one call;
//! - an error longjmps past the end probe to `PostgresMain`'s recovery, which calls
//!   `AbortCurrentTransaction`: its entry closes the open query spans as abandoned;
//! - the key is the query id when `compute_query_id` gives one, read as the server reports
//!   it (`pg_stat_activity.query_id`): `pgstat_report_activity(STATE_RUNNING, ...)` clears it,
//!   `pgstat_report_query_id(id, force)` sets it if unset or forced. Their entries mirror that
//!   in a per-thread note, which the span takes at its end. Without an id the key is the text,
//!   normalised in user space;
//! - a parallel worker's part of a query runs in `ParallelQueryMain`, in another process: its
//!   entry and return delimit a worker span with the same query id, folded into the query's
//!   figures (not a call).

use std::path::{Path, PathBuf};

use anyhow::Result;
use topdown_common::usdt::{UsdtArg, UsdtSite, action, arg_kind, key_mode, kind_flags};

use super::{
    KindInfo, SpanPlan, constant_arg, function_site, register_arg, site, span_site, usdt_sites,
};
use crate::{
    error::{Failure, fail},
    spans::usdt::Files,
};

/// `BackendState::STATE_RUNNING` (src/include/utils/backend_status.h: UNDEFINED, IDLE,
/// RUNNING, ...).
const STATE_RUNNING: i64 = 2;

/// What reports call the preset's kind.
pub const KIND: &str = "query";

const OPTION: &str = "--postgres";

/// Adds the preset's kinds and sites for the server binary `binary`.
pub fn add(plan: &mut SpanPlan, binary: &Path, files: &mut Files) -> Result<()> {
    let file = files.get(binary)?;
    if file.notes.is_empty() {
        return Err(fail(
            Failure::Usage,
            format!(
                "{OPTION}: {} has no USDT probes: PostgreSQL must be built with --enable-dtrace \
                 (Debian's and most distributions' packages are)",
                binary.display()
            ),
        ));
    }
    let query = plan.add_kind(
        KindInfo {
            name: KIND.to_owned(),
            normalize_text: true,
            note_is_query_id: true,
            folds_into: None,
        },
        kind_flags::ABSORB_NESTED,
    );
    let worker = plan.add_kind(
        KindInfo {
            name: format!("{KIND} (parallel worker)"),
            normalize_text: true,
            note_is_query_id: true,
            folds_into: Some(query),
        },
        kind_flags::WORKER,
    );
    let text_start = |key: UsdtArg| UsdtSite {
        action: action::START,
        id: query,
        key: key_mode::NOTE_OR_STRING,
        args: [key, UsdtArg::default()],
        ..UsdtSite::default()
    };
    let provider = |name: &str| ("postgresql".to_owned(), name.to_owned());
    for note in usdt_sites(file, binary, &provider("query__start"), OPTION)? {
        let key = super::note_arg(file, note, 0, OPTION)?;
        plan.sites.sites.push(site(binary, note, text_start(key)));
    }
    let text_address = file.symbol("debug_query_string").ok_or_else(|| {
        fail(
            Failure::Usage,
            format!(
                "{OPTION}: {} has no debug_query_string symbol",
                binary.display()
            ),
        )
    })?;
    for note in usdt_sites(file, binary, &provider("query__execute__start"), OPTION)? {
        // The pointer `debug_query_string` holds, relative to the site (a PIE moves both).
        let key = UsdtArg {
            kind: arg_kind::MEMORY,
            size: 8,
            base: topdown_common::pt_regs_word::IP,
            index: topdown_common::pt_regs_word::NONE,
            scale: 1,
            value: text_address.wrapping_sub(note.address) as i64,
            ..UsdtArg::default()
        };
        plan.sites.sites.push(site(binary, note, text_start(key)));
    }
    for name in ["query__done", "query__execute__done"] {
        for note in usdt_sites(file, binary, &provider(name), OPTION)? {
            plan.sites
                .sites
                .push(site(binary, note, span_site(action::END, query)));
        }
    }
    let functions = [
        (
            "AbortCurrentTransaction",
            false,
            span_site(action::ABORT, query),
        ),
        (
            "pgstat_report_query_id",
            false,
            UsdtSite {
                action: action::NOTE_SET,
                args: [register_arg("8@%rdi")?, register_arg("1@%sil")?],
                ..UsdtSite::default()
            },
        ),
        (
            "pgstat_report_activity",
            false,
            UsdtSite {
                action: action::NOTE_CLEAR,
                args: [register_arg("-4@%edi")?, constant_arg(STATE_RUNNING)],
                ..UsdtSite::default()
            },
        ),
        (
            "ParallelQueryMain",
            false,
            UsdtSite {
                action: action::START,
                id: worker,
                key: key_mode::NOTE_OR_STRING,
                ..UsdtSite::default()
            },
        ),
        ("ParallelQueryMain", true, span_site(action::END, worker)),
    ];
    for (symbol, retprobe, descriptor) in functions {
        plan.sites
            .sites
            .push(function_site(file, binary, symbol, retprobe, descriptor)?);
    }
    Ok(())
}

/// The server binary `--postgres` without a value means: the executable of the traced
/// processes (`-p`) or of the command (`-- CMD`) if it is a PostgreSQL server, else of the
/// running `postgres` processes, if they all run one binary.
pub fn default_binary(pids: &[u32], command: Option<&Path>) -> Result<PathBuf> {
    let is_server = |path: &Path| {
        path.file_name()
            .is_some_and(|name| name == "postgres" || name == "postmaster")
    };
    if let Some(command) = command
        && is_server(command)
    {
        return crate::functions::symbols::target::find_target(&command.display().to_string(), &[]);
    }
    let exe = |pid: u32| std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let mut found: Vec<PathBuf> = Vec::new();
    let candidates: Vec<u32> = if pids.is_empty() {
        running_pids()
    } else {
        pids.to_vec()
    };
    for pid in candidates {
        if let Some(path) = exe(pid)
            && is_server(&path)
            && !found.contains(&path)
        {
            found.push(path);
        }
    }
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(fail(
            Failure::Usage,
            "--postgres: no running PostgreSQL server found: name its binary, e.g. --postgres \
             /usr/lib/postgresql/15/bin/postgres",
        )),
        many => Err(fail(
            Failure::Usage,
            format!(
                "--postgres: servers of several binaries are running ({}): name one",
                crate::ui::path_list(many)
            ),
        )),
    }
}

fn running_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}
