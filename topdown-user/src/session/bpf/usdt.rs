//! The USDT program's side of the session: its sites and span kinds into the maps, its links
//! (`crate::spans::usdt::attach`, which enables semaphores), and reading hits and span totals back.
//!
//! The attach takes the same scope as [`Session::attach_functions`]: a list of processes, or
//! every process that maps the file (empty).

use std::{collections::HashMap, os::fd::AsFd as _, os::fd::OwnedFd, sync::Arc};

use anyhow::{Context as _, Result};
use aya::{
    maps::{Array, MapData, PerCpuArray},
    programs::UProbe,
};
use topdown_common::{
    names,
    usdt::{SpanKey, SpanKind, SpanStats, SpanText, SpanTotals, UsdtSite},
};

use super::{
    AttachMode, Session, load_error, loaded, loaded_ref, map, map_mut, program_mut, summed_per_cpu,
    whole_map,
};
use crate::spans::{
    report::span_stats_fieldwise,
    usdt::{PlannedSite, SitePlan, attach},
};

/// How the USDT program is linked to its sites.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UsdtLinking {
    /// uprobe.multi links where the kernel has them, else one perf link per site.
    #[default]
    Auto,
    /// One perf link per site (the uprobe PMU), as on kernels before 6.6.
    PerSite,
}

/// The links of the USDT program: dropping them detaches it and puts every semaphore back.
pub struct UsdtLinks {
    _fds: Vec<OwnedFd>,
    pub mode: AttachMode,
    pub links: usize,
}

/// Hits and span totals, cumulative since the session started.
#[derive(Clone, Debug, Default)]
pub struct SpanSnapshot {
    pub totals: Vec<(SpanKey, SpanTotals)>,
    /// Texts of string keys (and samples of other keys), by hash.
    pub texts: Arc<HashMap<u64, String>>,
    /// `-U` hits by probe id.
    pub hits: Vec<u64>,
    pub stats: SpanStats,
}

impl Session {
    /// Fills the site and kind maps from `plan` and attaches the USDT program to every site,
    /// in `processes` (empty: every process mapping each file). If any link fails, none stays.
    pub fn attach_usdt(
        &mut self,
        plan: &SitePlan,
        processes: &[u32],
        linking: UsdtLinking,
    ) -> Result<UsdtLinks> {
        {
            let mut sites: Array<&mut MapData, UsdtSite> =
                map_mut(loaded(&mut self.ebpf)?, names::USDT_SITES)?;
            for (cookie, planned) in plan.sites.iter().enumerate() {
                sites
                    .set(cookie as u32, &planned.site, 0)
                    .context("filling the USDT site map")?;
            }
        }
        {
            let mut kinds: Array<&mut MapData, SpanKind> =
                map_mut(loaded(&mut self.ebpf)?, names::SPAN_KINDS)?;
            for (id, kind) in plan.kinds.iter().enumerate() {
                kinds
                    .set(id as u32, kind, 0)
                    .context("filling the span kind map")?;
            }
        }
        let multi = linking == UsdtLinking::Auto && super::uprobe_multi_supported();
        let name = if multi {
            names::PROG_USDT_SITE_MULTI
        } else {
            names::PROG_USDT_SITE
        };
        let program: &mut UProbe = program_mut(loaded(&mut self.ebpf)?, name)?;
        if program.fd().is_err() {
            let started = std::time::Instant::now();
            program.load().map_err(load_error(name))?;
            let verified = program
                .info()
                .ok()
                .and_then(|info| info.verified_instruction_count());
            log::info!(
                "{name}: loaded in {:.1} ms ({} instructions verified)",
                started.elapsed().as_secs_f64() * 1e3,
                verified.map_or_else(|| "unknown".to_owned(), |count| count.to_string())
            );
        }
        let program = program
            .fd()
            .context("the USDT program's descriptor")?
            .as_fd();
        let pids: Vec<u32> = if processes.is_empty() {
            vec![0]
        } else {
            processes.to_vec()
        };
        let mut fds = Vec::new();
        // Per file and kind of probe, in cookie order.
        let mut groups: Vec<((&std::path::Path, bool), Vec<attach::Point>)> = Vec::new();
        for (cookie, planned) in plan.sites.iter().enumerate() {
            let PlannedSite {
                target,
                offset,
                ref_ctr_offset,
                retprobe,
                ..
            } = planned;
            let point = attach::Point {
                offset: *offset,
                ref_ctr_offset: *ref_ctr_offset,
                cookie: cookie as u64,
            };
            let key = (target.as_path(), *retprobe);
            match groups.iter_mut().find(|(known, _)| *known == key) {
                Some((_, points)) => points.push(point),
                None => groups.push((key, vec![point])),
            }
        }
        if let Some(followed) = self.followed.clone() {
            // `-- CMD`: the sites go into the command's processes only, like its functions, so
            // an untraced process of the same binary neither traps nor has its semaphores
            // raised; linked one by one as well as through uprobe.multi.
            let mut templates = Vec::with_capacity(groups.len());
            for ((target, retprobe), points) in &groups {
                let owned = program
                    .try_clone_to_owned()
                    .context("duplicating a program fd")?;
                let offsets: Vec<(u64, u64)> = points
                    .iter()
                    .map(|point| (point.offset, point.cookie))
                    .collect();
                templates.push(
                    super::process_links::LinkTemplate::new(
                        std::sync::Arc::new(owned),
                        target,
                        &offsets,
                        *retprobe,
                    )?
                    .with_ref_ctr_offsets(
                        points.iter().map(|point| point.ref_ctr_offset).collect(),
                    )?,
                );
            }
            if !multi {
                templates = templates
                    .into_iter()
                    .map(super::process_links::LinkTemplate::per_site)
                    .collect();
            }
            followed.add(templates)?;
            return Ok(UsdtLinks {
                _fds: Vec::new(),
                mode: if multi {
                    AttachMode::Multi
                } else {
                    AttachMode::PerPoint
                },
                links: if multi {
                    groups.len()
                } else {
                    groups.iter().map(|(_, points)| points.len()).sum()
                },
            });
        }
        for ((target, retprobe), points) in &groups {
            for pid in &pids {
                if multi {
                    let link = attach::multi(program, target, points, *pid, *retprobe)
                        .with_context(|| {
                            format!(
                                "attaching {} USDT site{} in {} (uprobe.multi{})",
                                points.len(),
                                if points.len() == 1 { "" } else { "s" },
                                target.display(),
                                pid_note(*pid)
                            )
                        })?;
                    fds.push(link);
                } else {
                    for point in points {
                        let [link, event] = attach::perf(program, target, point, *pid, *retprobe)
                            .with_context(|| {
                            format!(
                                "attaching the USDT site at {:#x} of {} (perf uprobe{})",
                                point.offset,
                                target.display(),
                                pid_note(*pid)
                            )
                        })?;
                        fds.push(link);
                        fds.push(event);
                    }
                }
            }
        }
        let links = if multi { fds.len() } else { fds.len() / 2 };
        Ok(UsdtLinks {
            _fds: fds,
            mode: if multi {
                AttachMode::Multi
            } else {
                AttachMode::PerPoint
            },
            links,
        })
    }

    /// Reads hits, span totals and the texts not seen yet. `hit_probes`: how many `-U`
    /// probes there are.
    pub fn span_snapshot(&mut self, hit_probes: usize) -> Result<SpanSnapshot> {
        let totals: Vec<(SpanKey, SpanTotals)> = whole_map(
            loaded_ref(&self.ebpf)?,
            names::SPAN_TOTALS,
            "reading the span map",
        )?;
        let wanted = totals.iter().any(|(key, totals)| {
            let text = if key.key_type == topdown_common::usdt::key_type::TEXT {
                key.key
            } else {
                totals.text
            };
            text != 0 && !self.span_texts.contains_key(&text)
        });
        if wanted {
            let texts: Vec<(u64, SpanText)> = whole_map(
                loaded_ref(&self.ebpf)?,
                names::SPAN_TEXTS,
                "reading the span text map",
            )?;
            let known = Arc::make_mut(&mut self.span_texts);
            for (hash, text) in texts {
                known.entry(hash).or_insert_with(|| {
                    let length = (text.len as usize).min(text.bytes.len());
                    String::from_utf8_lossy(&text.bytes[..length]).into_owned()
                });
            }
        }
        let hits_map: PerCpuArray<&MapData, u64> = map(loaded_ref(&self.ebpf)?, names::USDT_HITS)?;
        let mut hits = Vec::with_capacity(hit_probes);
        for id in 0..hit_probes as u32 {
            let per_cpu = hits_map.get(&id, 0).context("reading USDT hits")?;
            hits.push(per_cpu.iter().sum());
        }
        let stats = summed_per_cpu(
            loaded_ref(&self.ebpf)?,
            names::SPAN_STATS,
            "reading span statistics",
            |sum, cpu| span_stats_fieldwise(std::ops::Add::add, &sum, cpu),
        )?;
        Ok(SpanSnapshot {
            totals,
            texts: Arc::clone(&self.span_texts),
            hits,
            stats,
        })
    }
}

fn pid_note(pid: u32) -> String {
    if pid == 0 {
        String::new()
    } else {
        format!(", pid {pid}")
    }
}
