//! The function probes' own cost, measured in each run and taken out of the per-function
//! figures: `stat` measures it after counting, before its report (the traced command does not
//! wait for it); `stat -I`, `serve` and `top`, whose reports start during the run, before
//! counting (`counting::CalibrateAt`).
//!
//! # What a probe adds
//!
//! A probed call of `f` runs two traps: the entry uprobe, which reads the thread's virtual
//! counters part-way through, and the return probe (a uretprobe at the trampoline, or a uprobe
//! on each exit instruction), which reads them part-way through too. Whatever runs between the
//! two readings lands in `f`: the entry trap's tail and the return trap's head. Call that
//! **P** (per call). A probed callee `g` called from `f` puts both of its traps whole inside
//! `f`'s readings; call that **T** (per probed callee). With true costs `f*` (inclusive) and
//! `f*x` (exclusive), per call and `n` probed callees returned inside it, the BPF side records
//! (eBPF `functions` module: inclusive = reading at return - reading at entry, exclusive =
//! inclusive - callees' inclusive):
//!
//! ```text
//! inclusive(f) = f* + P(f) + n·T(g)
//! exclusive(f) = inclusive(f) - Σ inclusive(g)
//!              = f* + P(f) + n·T(g) - (g* + P(g))·n   =   f*x + P(f) + n·(T(g) - P(g))
//! ```
//!
//! so compensation subtracts `calls·P(f) + n·T(g)` from inclusive and
//! `calls·P(f) + n·(T(g) - P(g))` from exclusive, per counter, with `n` the callee returns the
//! BPF side counted per caller -> callee edge (`CallStats::callee_calls`). The mechanism of
//! `f` gives `P`; the callees' mechanisms give `T` (the callee returns of `f` split by the
//! callees' mechanisms, as summed over `f`'s edges as a parent).
//!
//! # How P and T are measured
//!
//! topdown's own binary holds two naked functions with fixed instructions (x86-64):
//! `topdown_calibration_empty` (`push rbp; mov rbp, rsp; pop rbp; ret`) and
//! `topdown_calibration_caller`, which calls it exactly once. Both start with `push rbp`, the
//! prologue the kernel emulates, as ordinary compiled functions do. In a session of its own
//! (its own maps, the same counter fds, only topdown's process tracked) and for each return
//! mechanism the run's probes use, on one CPU of each core type:
//!
//! - run C, the empty function probed and called by an unprobed loop, `N` calls:
//!   `P = inclusive(empty) / N` (the empty body's four instructions are counted as probe cost;
//!   they are what an empty function is). Called from a probed caller instead (run A's empty
//!   function), the same traps measured 6-7% less here, in the same process and run, than
//!   called from a loop, as ordinary probed functions are: the calibration took P from there
//!   before, and every probed call kept that part of P.
//! - run A, caller and empty both probed, `N` calls of the caller.
//! - run B, only the caller probed, `N` calls: the caller's inclusive holds its body, the empty
//!   function's unprobed body and `P`. Run A's caller held the same plus `T`, so
//!   `T = (inclusive_A(caller) - inclusive_B(caller)) / N`. B calls a second copy of the pair
//!   (`topdown_calibration_lone_caller` and `topdown_calibration_lone_empty`, the same
//!   instructions), whose callee is never probed, so that all three runs share one attachment.
//!
//! One attachment of the three probed functions serves all three runs: each detach waits for
//! the kernel's grace periods (60-100 ms per detach here, next to ~2 ms of CPU), which, four
//! times over, made a run ended by Ctrl-C wait more than a second for its report. After a
//! warm-up whose counts are left out (page faults, cold caches), A, C and B take turns piece
//! by piece, so a drift of the machine's speed during the calibration weighs on all three
//! alike. Each run's calls are measured in 32 pieces of a few ms, and each figure is the mean of the pieces' per-call means
//! without the fastest and slowest quarter (`trimmed_mean`): on the 2-vCPU test VM single
//! pieces ran up to 40% slow or 20% fast (steal time, other tenants), a plain mean takes such
//! a burst in by its length. Negative estimates (noise) become 0. Counters of a hybrid PMU
//! (`cpu_core/...`) take the figures of a CPU of that type; counters counted on every CPU the
//! mean over the core types measured.
//!
//! # What is not compensated
//!
//! Task, process, cgroup and CPU totals stay raw: the traps really ran on those CPUs in those
//! tasks. The machine's speed at the calibration is not its speed later: on the test VM the
//! same traps cost 10-15% more or less from one run to the next (the calibration's own figure
//! moves that much between runs seconds apart, and a workload 10 times longer varied as much),
//! so a run's compensated figure of an empty function can be off by as much. The calibration
//! calls run back to back, so they measure traps whose kernel path is warm; after a long
//! stretch of user work a trap costs more (on the 2-vCPU test VM, with ~15 us of work between
//! calls, ~+40% per probed callee and ~+10% per call), so functions
//! that do much work between probe hits keep part of the probes' cost (a few % of their time
//! where the probes are ~10% of it). A function whose first instruction the kernel
//! single-steps instead of emulating pays more per entry than the calibration functions do,
//! and stays partly counted. A function attached later (`serve` reloading its configuration)
//! with a return mechanism not calibrated at start stays raw. Figures that would go below
//! zero are clamped to zero and counted (`clamped`).

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
    time::Instant,
};

use anyhow::{Context as _, Result, anyhow, bail};
use topdown_common::{CallKey, ROOT_FUNCTION, entry_cookie, exit_point, slot_source};

pub mod record;

pub use record::{
    CalibratedAt, CalibrationRun, CompensationReport, ProbeCost, RawFunction, ReturnMechanism,
};

use crate::{
    functions::exit_plan::{FunctionProbes, UprobeAt},
    schedule::Plan,
    session::{
        aggregate::{Aggregate, CallCounts},
        bpf::{Session, SessionConfig, Trigger},
        counters::CounterGroups,
        tracefs::Tracefs,
    },
};

/// Calls per run: 32 pieces of 500 (`trimmed_mean`), each a few ms on the 2-vCPU test VM whose
/// traps cost ~2-20 us; the whole calibration takes ~1-2.5 s there.
pub const CALIBRATION_CALLS: u64 = 16_000;
/// Calls per run on a synthetic model: its counters count syscalls, which neither the traps
/// nor the BPF programs make, so the calibration only confirms a cost of exactly 0. Both are
/// multiples of the 32 pieces.
pub const SYNTHETIC_CALIBRATION_CALLS: u64 = 2_048;
/// A run ended by a signal calibrates with this share of the calls (at least
/// `SHORTENED_CALIBRATION_CALLS`): with whole libraries under both return mechanisms the full
/// calibration took 1.6 s here, and topdown is to end within a second of the signal (issue
/// 21). Its per-call figures are means over fewer calls, so less precise; `samples` in the
/// report's costs says how many.
pub const SHORTENED_CALIBRATION_SHARE: u64 = 8;
pub const SHORTENED_CALIBRATION_CALLS: u64 = 512;
/// Calls before each measured run, not counted.
const WARM_UP_CALLS: u64 = 250;
/// Pieces each run's calls are measured in (`trimmed_mean`), the runs taking turns.
const PIECES: u64 = 32;
/// Share of the pieces left out at each end of the sorted per-call means.
const TRIM: f64 = 0.25;

/// Per-slot costs of one mechanism, as subtracted.
#[derive(Clone, Debug, Default, PartialEq)]
struct SlotCosts {
    per_call: Vec<f64>,
    per_callee: Vec<f64>,
}

/// The costs of a function whose return mechanism is unknown or was not calibrated: none.
static NO_COSTS: SlotCosts = SlotCosts {
    per_call: Vec::new(),
    per_callee: Vec::new(),
};

/// The calibration of a run, ready to subtract.
#[derive(Clone, Debug)]
pub struct Calibration {
    costs: Vec<ProbeCost>,
    by_mechanism: BTreeMap<ReturnMechanism, SlotCosts>,
}

impl Calibration {
    /// Builds the per-slot table from measured costs: each slot takes the core type its counter
    /// belongs to (`slot_core_types`, from the plan), or the mean over core types.
    fn new(
        costs: Vec<ProbeCost>,
        slot_names: &[String],
        slot_core_types: &[Option<String>],
    ) -> Self {
        let mut by_mechanism = BTreeMap::new();
        let mechanisms: std::collections::BTreeSet<ReturnMechanism> =
            costs.iter().map(|cost| cost.mechanism).collect();
        for mechanism in mechanisms {
            let of_mechanism: Vec<&ProbeCost> = costs
                .iter()
                .filter(|cost| cost.mechanism == mechanism)
                .collect();
            let pick = |slot: usize, field: fn(&ProbeCost) -> &BTreeMap<String, f64>| -> f64 {
                let Some(name) = slot_names.get(slot) else {
                    return 0.0;
                };
                let core_type = slot_core_types.get(slot).cloned().flatten();
                let matching: Vec<f64> = of_mechanism
                    .iter()
                    .filter(|cost| core_type.is_none() || cost.core_type == core_type)
                    .filter_map(|cost| field(cost).get(name).copied())
                    .collect();
                if matching.is_empty() {
                    0.0
                } else {
                    matching.iter().sum::<f64>() / matching.len() as f64
                }
            };
            let slots = 0..slot_names.len();
            by_mechanism.insert(
                mechanism,
                SlotCosts {
                    per_call: slots
                        .clone()
                        .map(|slot| pick(slot, |c| &c.per_call))
                        .collect(),
                    per_callee: slots.map(|slot| pick(slot, |c| &c.per_callee)).collect(),
                },
            );
        }
        Self {
            costs,
            by_mechanism,
        }
    }

    pub fn costs(&self) -> &[ProbeCost] {
        &self.costs
    }

    /// `aggregate` with the probes' cost taken out of every caller -> callee edge (and so of
    /// every function's totals, their sums), and what the report says about it.
    /// `mechanism_of(function id)`: how that function's returns were probed.
    /// `functions` names function ids `(target, symbol)`; `slot_names` the counter slots.
    pub fn compensate(
        &self,
        aggregate: &Aggregate,
        mechanism_of: &dyn Fn(u32) -> Option<ReturnMechanism>,
        functions: &[(String, String)],
        slot_names: &[String],
    ) -> (Aggregate, CompensationReport) {
        let mut compensated = aggregate.clone();
        let costs = RunCosts::new(self, &aggregate.calls, mechanism_of);
        let clamped = costs.compensate_calls(&mut compensated.calls)
            + costs.compensate_histograms(&mut compensated.histograms);
        let raw_functions = aggregate
            .function_totals()
            .into_iter()
            .map(|((function, tgid), total)| {
                let (target, symbol) = functions
                    .get(function as usize)
                    .cloned()
                    .unwrap_or_else(|| (String::new(), format!("function #{function}")));
                RawFunction {
                    target,
                    symbol,
                    pid: (tgid != 0).then_some(tgid),
                    calls: total.calls,
                    inclusive: total.inclusive.named(slot_names),
                    exclusive: total.exclusive.named(slot_names),
                }
            })
            .collect();
        (
            compensated,
            CompensationReport {
                calibrated: None,
                costs: self.costs.clone(),
                clamped,
                raw_functions,
            },
        )
    }

    /// `P` and `T` of `mechanism` in `slot` (the weight counter's), as subtracted.
    pub fn weight_costs(
        &self,
        mechanism: ReturnMechanism,
        slot: usize,
    ) -> Option<crate::functions::distribution::ProbeCost> {
        let costs = self.by_mechanism.get(&mechanism)?;
        Some(crate::functions::distribution::ProbeCost {
            per_call: costs.per_call.get(slot).copied().unwrap_or(0.0),
            per_callee: costs.per_callee.get(slot).copied().unwrap_or(0.0),
        })
    }

    /// The costs of probes with return mechanism `mechanism`, as subtracted (`NO_COSTS`
    /// without one or without its calibration).
    fn slot_costs(&self, mechanism: Option<ReturnMechanism>) -> &SlotCosts {
        mechanism
            .and_then(|mechanism| self.by_mechanism.get(&mechanism))
            .unwrap_or(&NO_COSTS)
    }
}

/// The probes' costs in one run: each function's, by how its returns were probed, and the mix
/// of each caller's probed callees (by their calls, which compensation leaves as they are).
struct RunCosts<'c> {
    calibration: &'c Calibration,
    mechanism_of: &'c dyn Fn(u32) -> Option<ReturnMechanism>,
    callee_mix: HashMap<(u32, u32), Vec<(u64, &'c SlotCosts)>>,
}

impl<'c> RunCosts<'c> {
    fn new(
        calibration: &'c Calibration,
        calls: &[CallCounts],
        mechanism_of: &'c dyn Fn(u32) -> Option<ReturnMechanism>,
    ) -> Self {
        let costs_of = |function: u32| calibration.slot_costs(mechanism_of(function));
        Self {
            calibration,
            mechanism_of,
            callee_mix: callee_mix(calls, &costs_of),
        }
    }

    /// Per slot, what the probes added to `calls` calls of `function` in process `tgid`, whose
    /// probed callees returned `callee_calls` times: `(slot, inclusive, exclusive)`, the
    /// inclusive figures' `calls x P + callee_calls x T` and the exclusive figures' share of it.
    fn added(
        &self,
        (function, tgid): (u32, u32),
        calls: u64,
        callee_calls: u64,
    ) -> impl Iterator<Item = (usize, f64, f64)> + '_ {
        let own = self.calibration.slot_costs((self.mechanism_of)(function));
        let callees = self
            .callee_mix
            .get(&(function, tgid))
            .map(Vec::as_slice)
            .unwrap_or_default();
        (0..own.per_call.len().max(per_callee_len(callees))).map(move |slot| {
            let per_call = own.per_call.get(slot).copied().unwrap_or(0.0);
            let (callee_inclusive, callee_exclusive) = mean_callee_costs(callees, slot);
            let (calls, callee_calls) = (calls as f64, callee_calls as f64);
            (
                slot,
                calls * per_call + callee_calls * callee_inclusive,
                calls * per_call + callee_calls * callee_exclusive,
            )
        })
    }

    /// Takes the probes' cost out of each per-call histogram bucket of a function, as out of
    /// its inclusive figures (`calls x P + callee_calls x T`, T weighted by the mix of the
    /// callees of the function's edges), so the buckets still add up to them.
    /// Returns how many figures were clamped at zero.
    fn compensate_histograms(
        &self,
        histograms: &mut [crate::session::aggregate::HistogramCounts],
    ) -> u64 {
        let mut clamped = 0;
        for bucket in histograms.iter_mut() {
            if bucket.key.kind != topdown_common::histogram::FUNCTION {
                continue;
            }
            let function = (bucket.key.owner, bucket.key.tgid);
            for (slot, inclusive, _) in self.added(function, bucket.calls, bucket.callee_calls) {
                clamped += subtract(&mut bucket.counts.0, slot, inclusive);
            }
        }
        clamped
    }

    /// Subtracts in place; returns how many figures were clamped at zero.
    fn compensate_calls(&self, calls: &mut [CallCounts]) -> u64 {
        let mut clamped = 0;
        for call in calls.iter_mut() {
            let function = (call.key.function, call.key.tgid);
            for (slot, inclusive, exclusive) in self.added(function, call.calls, call.callee_calls)
            {
                clamped += subtract(&mut call.inclusive.0, slot, inclusive);
                clamped += subtract(&mut call.exclusive.0, slot, exclusive);
            }
        }
        clamped
    }
}

/// Per (caller, process): its probed callees' returns, by the callee's costs. The BPF side
/// counts callee returns per edge but not by mechanism; this split is exact when one mechanism
/// is in use, and the callee mix of the caller's whole run otherwise.
fn callee_mix<'c>(
    calls: &[CallCounts],
    costs_of: &dyn Fn(u32) -> &'c SlotCosts,
) -> HashMap<(u32, u32), Vec<(u64, &'c SlotCosts)>> {
    let mut mix: HashMap<(u32, u32), Vec<(u64, &SlotCosts)>> = HashMap::new();
    for call in calls {
        if call.key.parent == ROOT_FUNCTION {
            continue;
        }
        mix.entry((call.key.parent, call.key.tgid))
            .or_default()
            .push((call.calls, costs_of(call.key.function)));
    }
    mix
}

/// Mean T and T - P in `slot` over the callees of `mix`, weighted by their calls.
fn mean_callee_costs(mix: &[(u64, &SlotCosts)], slot: usize) -> (f64, f64) {
    let total: u64 = mix.iter().map(|(calls, _)| calls).sum();
    if total == 0 {
        return (0.0, 0.0);
    }
    mix.iter().fold((0.0, 0.0), |(inc, exc), (calls, costs)| {
        let weight = *calls as f64 / total as f64;
        let t = costs.per_callee.get(slot).copied().unwrap_or(0.0);
        let p = costs.per_call.get(slot).copied().unwrap_or(0.0);
        (inc + weight * t, exc + weight * (t - p).max(0.0))
    })
}

fn per_callee_len(mix: &[(u64, &SlotCosts)]) -> usize {
    mix.iter()
        .map(|(_, costs)| costs.per_callee.len())
        .max()
        .unwrap_or(0)
}

/// Takes `amount` (rounded to whole counts) off `counts[slot]`; 1 if that had to clamp at 0.
fn subtract(counts: &mut [u64], slot: usize, amount: f64) -> u64 {
    let Some(count) = counts.get_mut(slot) else {
        return 0;
    };
    let amount = amount.round();
    if amount <= 0.0 {
        return 0;
    }
    // f64 -> u64 saturates: a cost beyond u64 clamps like any other too-large one.
    let amount = amount as u64;
    if amount > *count {
        *count = 0;
        1
    } else {
        *count -= amount;
        0
    }
}

/// Each slot's hybrid PMU (`None`: counted on every CPU): the PMU of the group whose counter
/// the slot reads (`schedule::Plan`: a slot's source names an fd slot, which is a counter's
/// index, which a group lists as a member).
pub fn slot_core_types(plan: &Plan) -> Vec<Option<String>> {
    plan.slots
        .iter()
        .map(|slot| {
            let counter = slot_source::fd_slot(slot.source) as usize;
            plan.groups
                .iter()
                .find(|group| group.members.contains(&counter))
                .and_then(|group| group.pmu.clone())
        })
        .collect()
}

// The calibration functions. Naked, so their instructions are exactly these whatever the
// compiler's optimisation level: `push rbp` first (emulated by the kernel's uprobe code, like an
// ordinary prologue), one `ret` each, and a real call from the caller to the empty function.
#[cfg(target_arch = "x86_64")]
mod functions {
    /// Bytes of `push rbp; mov rbp, rsp; pop rbp; ret`.
    pub const EMPTY: [u8; 6] = [0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3];
    /// Offset of `ret` in the empty function.
    pub const EMPTY_RET: u64 = 5;
    /// Bytes of `push rbp; mov rbp, rsp` then `call rel32`, then `pop rbp; ret` at 9.
    pub const CALLER_PROLOGUE: [u8; 5] = [0x55, 0x48, 0x89, 0xe5, 0xe8];
    pub const CALLER_EPILOGUE: [u8; 2] = [0x5d, 0xc3];
    pub const CALLER_CALL: usize = 4;
    pub const CALLER_RET: u64 = 10;

    /// Defines an empty function (`EMPTY`) and a caller of it (`CALLER_*`) under the given
    /// names. Each pair is two symbols of its own: the runs' probes are attached together, and
    /// run B's callee stays unprobed while run A's is probed.
    macro_rules! empty_and_caller {
        ($(#[$empty_doc:meta])* $empty:ident, $(#[$caller_doc:meta])* $caller:ident) => {
            $(#[$empty_doc])*
            #[unsafe(naked)]
            #[unsafe(no_mangle)]
            pub extern "C" fn $empty() {
                core::arch::naked_asm!("push rbp", "mov rbp, rsp", "pop rbp", "ret")
            }

            $(#[$caller_doc])*
            #[unsafe(naked)]
            #[unsafe(no_mangle)]
            pub extern "C" fn $caller() {
                core::arch::naked_asm!(
                    "push rbp",
                    "mov rbp, rsp",
                    "call {empty}",
                    "pop rbp",
                    "ret",
                    empty = sym $empty,
                )
            }
        };
    }

    empty_and_caller!(topdown_calibration_empty, topdown_calibration_caller);
    empty_and_caller!(
        /// Run B's copy of the empty function: never probed.
        topdown_calibration_lone_empty,
        /// Run B's copy of the caller: probed, its callee not.
        topdown_calibration_lone_caller
    );
}

/// Where the calibration functions are: the file topdown runs from, their entries' file
/// offsets and their `ret`s'.
#[derive(Clone, Debug)]
struct Located {
    target: std::path::PathBuf,
    empty: u64,
    empty_ret: u64,
    caller: u64,
    caller_ret: u64,
    lone_caller: u64,
    lone_caller_ret: u64,
}

/// Checks that the caller at `caller_address` and the empty function at `empty_address` are
/// the instructions written in `functions`, the one calling the other.
#[cfg(target_arch = "x86_64")]
fn check_pair(caller_address: usize, empty_address: usize) -> Result<()> {
    use functions::*;
    // SAFETY: reading the first bytes of two functions of this binary (mapped, readable code).
    let empty_bytes: [u8; 6] = unsafe { std::ptr::read_unaligned(empty_address as *const _) };
    // SAFETY: as above.
    let caller_bytes: [u8; 11] = unsafe { std::ptr::read_unaligned(caller_address as *const _) };
    let call_end = caller_address + CALLER_CALL + 5;
    let rel = i32::from_le_bytes([
        caller_bytes[CALLER_CALL + 1],
        caller_bytes[CALLER_CALL + 2],
        caller_bytes[CALLER_CALL + 3],
        caller_bytes[CALLER_CALL + 4],
    ]);
    let call_target = call_end.wrapping_add_signed(rel as isize);
    if empty_bytes != EMPTY
        || caller_bytes[..5] != CALLER_PROLOGUE
        || caller_bytes[9..] != CALLER_EPILOGUE
        || call_target != empty_address
    {
        bail!(
            "the calibration functions are not the instructions they were written as \
             (empty: {empty_bytes:02x?}, caller: {caller_bytes:02x?})"
        );
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
fn locate() -> Result<Located> {
    use functions::*;
    let empty_address = topdown_calibration_empty as *const () as usize;
    let caller_address = topdown_calibration_caller as *const () as usize;
    let lone_caller_address = topdown_calibration_lone_caller as *const () as usize;
    check_pair(caller_address, empty_address)?;
    check_pair(
        lone_caller_address,
        topdown_calibration_lone_empty as *const () as usize,
    )?;
    let maps = std::fs::read_to_string("/proc/self/maps").context("reading /proc/self/maps")?;
    let mapping_of = |address: usize| -> Result<(u64, &str)> {
        for line in maps.lines() {
            let mut fields = line.split_whitespace();
            let (Some(range), Some(_perms), Some(offset)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Some((start, end)) = range.split_once('-') else {
                continue;
            };
            let (Ok(start), Ok(end), Ok(offset)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
                u64::from_str_radix(offset, 16),
            ) else {
                continue;
            };
            if (start..end).contains(&address) {
                return Ok((offset + (address - start) as u64, range));
            }
        }
        Err(anyhow!(
            "address {address:#x} is in no mapping of /proc/self/maps"
        ))
    };
    let offset_of =
        |address: usize| -> Result<u64> { mapping_of(address).map(|(offset, _)| offset) };
    let empty = offset_of(empty_address)?;
    let caller = offset_of(caller_address)?;
    let lone_caller = offset_of(lone_caller_address)?;
    // The kernel resolves the path in topdown's own process: the running file, even if it
    // was replaced on disk since. Started through the loader on private copies,
    // `/proc/self/exe` is the loader: the mapping of the code itself names the file then.
    let target = if crate::functions::own_process::restarted() {
        format!("/proc/self/map_files/{}", mapping_of(empty_address)?.1).into()
    } else {
        "/proc/self/exe".into()
    };
    Ok(Located {
        target,
        empty,
        empty_ret: empty + EMPTY_RET,
        caller,
        caller_ret: caller + CALLER_RET,
        lone_caller,
        lone_caller_ret: lone_caller + CALLER_RET,
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn locate() -> Result<Located> {
    bail!("probe-cost calibration is implemented for x86-64 only")
}

/// Which calibration function a run's loop calls.
#[derive(Clone, Copy, Debug)]
enum Calls {
    /// The caller, which calls the empty function once (run A).
    Caller,
    /// The empty function itself, from an unprobed loop (run C).
    Empty,
    /// The lone caller, whose callee is never probed (run B).
    LoneCaller,
}

#[cfg(target_arch = "x86_64")]
fn call(calls: Calls, times: u64) {
    let function: extern "C" fn() = std::hint::black_box(match calls {
        Calls::Caller => functions::topdown_calibration_caller,
        Calls::Empty => functions::topdown_calibration_empty,
        Calls::LoneCaller => functions::topdown_calibration_lone_caller,
    });
    for _ in 0..times {
        function();
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn call(_calls: Calls, _times: u64) {}

/// Function ids inside the calibration session (its own maps: they never meet the run's).
const CALLER_ID: u32 = 0;
const EMPTY_ID: u32 = 1;
const LONE_CALLER_ID: u32 = 2;

/// What the calibration needs from the run being started.
pub struct Setup<'a> {
    /// The run's counters, through duplicated fds (`CounterGroups::try_clone`).
    pub groups: CounterGroups,
    pub plan: &'a Plan,
    pub tracefs: &'a Tracefs,
    /// The return mechanisms the run's probes use.
    pub mechanisms: Vec<ReturnMechanism>,
    /// `CounterGroups::hybrid_cpus` of the run's counters.
    pub hybrid_cpus: Vec<(String, Vec<u32>)>,
    pub calls: u64,
    /// The run's `SessionConfig::weight_slot`.
    pub weight_slot: u32,
    /// The run has stopped counting: the calibration session is dropped on a thread of its
    /// own. Its detach waits ~100 ms for the kernel's grace periods on almost no CPU, which
    /// the report need not wait for; a run still counting waits, so that none of the
    /// calibration's programs runs beside it.
    pub after_counting: bool,
}

/// Measures P and T (module documentation) for each mechanism on each core type.
pub fn calibrate(setup: Setup<'_>) -> Result<Calibration> {
    let started = Instant::now();
    let located = locate()?;
    let slot_names = setup.plan.slot_names();
    let pid = std::process::id();
    let config = SessionConfig {
        tracked_tgids: Some(vec![pid]),
        follow_forks: false,
        max_tasks: 256,
        max_tracked: 16,
        verbose: false,
        split_functions_by_process: false,
        max_stacks: 64,
        max_calls: 16,
        // The run's probes update a histogram bucket per call: so do the calibration's, whose
        // cost is part of what they measure. No preallocation: only buckets reached use memory.
        max_buckets: 1024,
        weight_slot: setup.weight_slot,
        by_cgroup: false,
        cgroup_filter: None,
        max_cgroups: 16,
        num_slots: setup.plan.slots.len() as u32,
        slot_sources: setup.plan.slot_sources(),
        trigger: Trigger::SchedSwitch,
        skip_untraced_switches: false,
        usdt: Default::default(),
    };
    let mut session = Session::start(&config, setup.groups, setup.tracefs)
        .context("starting the calibration session")?;
    log::debug!(
        "calibration: session started after {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    // One CPU per core type; one core type: wherever the scheduler runs it.
    let core_types: Vec<(Option<String>, Option<u32>)> = if setup.hybrid_cpus.is_empty() {
        vec![(None, None)]
    } else {
        setup
            .hybrid_cpus
            .iter()
            .filter_map(|(pmu, cpus)| cpus.first().map(|cpu| (Some(pmu.clone()), Some(*cpu))))
            .collect()
    };
    let mut costs = Vec::new();
    for (index, &mechanism) in setup.mechanisms.iter().enumerate() {
        // One mechanism's probes at a time on the same functions.
        if index > 0 {
            session
                .detach_functions()
                .context("detaching the calibration probes")?;
        }
        let point = |id: u32, offset: u64, ret: u64| {
            let at = |offset: u64, cookie: u64| UprobeAt {
                target: located.target.clone(),
                offset,
                cookie,
            };
            let uretprobe = mechanism == ReturnMechanism::Uretprobe;
            FunctionProbes {
                entry: Some(at(offset, entry_cookie::encode(id, uretprobe))),
                uretprobe: uretprobe.then(|| at(offset, u64::from(id))),
                exits: if uretprobe {
                    Vec::new()
                } else {
                    vec![at(ret, exit_point::encode(id, exit_point::RETURN, 0))]
                },
                go: false,
            }
        };
        let probed = [
            point(CALLER_ID, located.caller, located.caller_ret),
            point(EMPTY_ID, located.empty, located.empty_ret),
            point(LONE_CALLER_ID, located.lone_caller, located.lone_caller_ret),
        ];
        // A, C and B take turns piece by piece, so a drift of the machine's speed during the
        // calibration lands in all three and cancels out of T = A - B. The loop calling the
        // empty function directly (C) records it as called from outside any probed function.
        log::debug!(
            "calibration ({mechanism:?}): attaching after {:.0} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        let samples = (setup.calls / PIECES).max(1) * PIECES;
        let runs = measure(
            &mut session,
            &probed,
            &[Calls::Caller, Calls::Empty, Calls::LoneCaller],
            &core_types,
            setup.calls,
            pid,
        )?;
        log::debug!(
            "calibration ({mechanism:?}): measured after {:.0} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        for ((core_type, cpu), loops) in core_types.iter().zip(&runs) {
            let [a, c, b] = loops.as_slice() else {
                bail!("the calibration measured {} runs, not 3", loops.len());
            };
            let mean = |pieces: &[Piece], key: CallKey| -> Result<(u64, Vec<f64>)> {
                let (recorded, means) = trimmed_mean(pieces, key, slot_names.len());
                if recorded == 0 {
                    bail!("the calibration probes recorded no calls ({mechanism:?})");
                }
                // A hit whose counter reading kept racing with context switches is dropped
                // (eBPF `functions`: read_failures); a few of those leave the mean sound.
                if recorded * 100 < samples * 99 {
                    bail!(
                        "the calibration probes recorded {recorded} of {samples} calls \
                         ({mechanism:?})"
                    );
                }
                Ok((recorded, means))
            };
            // P from the empty function called by an unprobed loop, as an ordinary probed
            // function is; called from a probed caller (run A) it costs less here (module
            // documentation), which left a part of P in every function's figures.
            let (recorded, per_call) = mean(c, key(EMPTY_ID, ROOT_FUNCTION))?;
            let (_, with_callee) = mean(a, key(CALLER_ID, ROOT_FUNCTION))?;
            let (_, without_callee) = mean(b, key(LONE_CALLER_ID, ROOT_FUNCTION))?;
            if log::log_enabled!(log::Level::Debug) {
                let (_, nested) = mean(a, key(EMPTY_ID, CALLER_ID))?;
                log::debug!(
                    "calibration ({mechanism:?}): per call {per_call:.0?} called from a loop, \
                     {nested:.0?} called from a probed caller; pieces' per call: {:.0?}",
                    piece_means(c, key(EMPTY_ID, ROOT_FUNCTION)),
                );
            }
            let per_callee: Vec<f64> = with_callee
                .iter()
                .zip(&without_callee)
                .map(|(with, without)| (with - without).max(0.0))
                .collect();
            let named = |values: &[f64]| -> BTreeMap<String, f64> {
                slot_names
                    .iter()
                    .cloned()
                    .zip(values.iter().copied())
                    .collect()
            };
            costs.push(ProbeCost {
                mechanism,
                core_type: core_type.clone(),
                cpu: *cpu,
                samples: recorded,
                per_call: named(&per_call),
                per_callee: named(&per_callee),
            });
        }
    }
    if setup.after_counting {
        // Not joined: at exit the kernel completes a close the threads have started.
        let closing = session.close_in_background();
        std::thread::spawn(move || {
            let _ = closing.join();
            drop(session);
        });
    } else {
        drop(session);
    }
    log::info!(
        "probe-cost calibration took {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(Calibration::new(
        costs,
        &slot_names,
        &slot_core_types(setup.plan),
    ))
}

/// One piece of a run: what its calls recorded, by call-tree edge.
type Piece = HashMap<CallKey, CallCounts>;

/// Each piece's per-call mean of the first counter (`-vv`).
fn piece_means(pieces: &[Piece], key: CallKey) -> Vec<f64> {
    pieces
        .iter()
        .filter_map(|piece| piece.get(&key))
        .filter(|call| call.calls > 0)
        .map(|call| call.inclusive.0[0] as f64 / call.calls as f64)
        .collect()
}

/// Calls recorded at `key` in all pieces, and per counter the mean of the pieces' per-call
/// means after leaving out the highest and lowest `TRIM` of them. A piece lasts a few ms:
/// one that a burst of steal time or an interrupt storm slowed says nothing about the probes,
/// and weighs on a plain mean by as much as the burst lasted (here single pieces ran 40% slow).
fn trimmed_mean(pieces: &[Piece], key: CallKey, slots: usize) -> (u64, Vec<f64>) {
    let calls: Vec<&CallCounts> = pieces
        .iter()
        .filter_map(|piece| piece.get(&key))
        .filter(|call| call.calls > 0)
        .collect();
    let recorded = calls.iter().map(|call| call.calls).sum();
    let means = (0..slots)
        .map(|slot| {
            let mut per_call: Vec<f64> = calls
                .iter()
                .map(|call| call.inclusive.0[slot] as f64 / call.calls as f64)
                .collect();
            per_call.sort_by(f64::total_cmp);
            let cut = (per_call.len() as f64 * TRIM).floor() as usize;
            let kept = &per_call[cut..per_call.len() - cut];
            if kept.is_empty() {
                0.0
            } else {
                kept.iter().sum::<f64>() / kept.len() as f64
            }
        })
        .collect();
    (recorded, means)
}

fn key(function: u32, parent: u32) -> CallKey {
    CallKey {
        function,
        parent,
        tgid: 0,
        _pad: 0,
    }
}

/// Attaches `points`, runs the calibration calls on each core type and returns, per core type
/// and per loop of `called`, what each of `PIECES` pieces of `calls` calls recorded (warm-up
/// left out; the loops take turns piece by piece). The probes stay attached until the session
/// is dropped: a detach here would wait for the kernel's grace periods once more.
fn measure(
    session: &mut Session,
    points: &[FunctionProbes],
    called: &[Calls],
    core_types: &[(Option<String>, Option<u32>)],
    calls: u64,
    pid: u32,
) -> Result<Vec<Vec<Vec<Piece>>>> {
    let attaching = Instant::now();
    session
        .attach_functions(points, &[pid])
        .context("attaching the calibration probes")?;
    log::debug!(
        "calibration: attached in {:.0} ms",
        attaching.elapsed().as_secs_f64() * 1e3
    );
    let mut results = Vec::new();
    for (_, cpu) in core_types {
        // One thread (pinned to `cpu` if given) runs every piece and takes the snapshots
        // between them: a thread per piece waited for the scheduler at each start, which on
        // a busy machine took longer than the calls themselves.
        let pieces = std::thread::scope(|scope| {
            scope
                .spawn(|| -> Result<Vec<Vec<Piece>>> {
                    if let Some(cpu) = cpu {
                        pin_to(*cpu)?;
                    }
                    for &loop_calls in called {
                        call(loop_calls, WARM_UP_CALLS);
                    }
                    let mut before = session.snapshot()?;
                    let mut pieces = vec![Vec::new(); called.len()];
                    let (mut calling, mut reading) = (Duration::ZERO, Duration::ZERO);
                    for _ in 0..PIECES {
                        for (&loop_calls, pieces) in called.iter().zip(&mut pieces) {
                            let started = Instant::now();
                            call(loop_calls, (calls / PIECES).max(1));
                            calling += started.elapsed();
                            let started = Instant::now();
                            let after = session.snapshot()?;
                            reading += started.elapsed();
                            let delta = Aggregate::since(&after, Some(&before));
                            pieces.push(
                                delta
                                    .calls
                                    .into_iter()
                                    .map(|call| (call.key, call))
                                    .collect(),
                            );
                            before = after;
                        }
                    }
                    log::debug!(
                        "calibration: {:.0} ms calling, {:.0} ms reading the maps",
                        calling.as_secs_f64() * 1e3,
                        reading.as_secs_f64() * 1e3
                    );
                    Ok(pieces)
                })
                .join()
                .map_err(|_| anyhow!("the calibration thread panicked"))?
        })?;
        results.push(pieces);
    }
    Ok(results)
}

fn pin_to(cpu: u32) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET only write inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is initialised and its size given.
    let status = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if status != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("pinning the calibration thread to CPU {cpu}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::aggregate::SlotCounts;
    use topdown_common::MAX_COUNTERS;

    fn cost(mechanism: ReturnMechanism, per_call: f64, per_callee: f64) -> ProbeCost {
        ProbeCost {
            mechanism,
            core_type: None,
            cpu: None,
            samples: 1000,
            per_call: BTreeMap::from([("cpu-clock".to_owned(), per_call)]),
            per_callee: BTreeMap::from([("cpu-clock".to_owned(), per_callee)]),
        }
    }

    /// `cpu-clock` alone, `mechanism` calibrated at P = 10 ns per call and T = 30 ns per callee.
    fn calibrated(mechanism: ReturnMechanism) -> Calibration {
        Calibration::new(
            vec![cost(mechanism, 10.0, 30.0)],
            &["cpu-clock".to_owned()],
            &[None],
        )
    }

    /// `calls` compensated as if every function's returns were probed with `mechanism`;
    /// returns how many figures were clamped at zero.
    fn compensate_calls(
        calibration: &Calibration,
        calls: &mut [CallCounts],
        mechanism: ReturnMechanism,
    ) -> u64 {
        RunCosts::new(calibration, calls, &|_| Some(mechanism)).compensate_calls(calls)
    }

    fn edge(
        function: u32,
        parent: u32,
        calls: u64,
        callees: u64,
        inc: u64,
        exc: u64,
    ) -> CallCounts {
        let mut inclusive = SlotCounts::ZERO;
        inclusive.0[0] = inc;
        let mut exclusive = SlotCounts::ZERO;
        exclusive.0[0] = exc;
        CallCounts {
            key: key(function, parent),
            calls,
            unwound: 0,
            inclusive,
            exclusive,
            callee_calls: callees,
        }
    }

    /// Two levels, true costs known: mid (id 0) runs 100 ns itself and calls leaf (id 1) twice,
    /// which runs 50 ns; P = 10, T = 30. The raw figures are what the BPF side records.
    #[test]
    fn subtracts_per_call_and_per_callee_costs() {
        let calibration = calibrated(ReturnMechanism::Exit);
        // leaf: inclusive = exclusive = 50 + P = 60 per call, 4 calls.
        // mid: inclusive = 100 + 2·50 + P + 2·T = 270 per call, 2 calls;
        // exclusive = 270 - 2·60 = 150.
        let mut calls = vec![
            edge(0, ROOT_FUNCTION, 2, 4, 540, 300),
            edge(1, 0, 4, 0, 240, 240),
        ];
        let clamped = compensate_calls(&calibration, &mut calls, ReturnMechanism::Exit);
        assert_eq!(clamped, 0);
        assert_eq!(calls[0].inclusive.0[0], 2 * 200);
        assert_eq!(calls[0].exclusive.0[0], 2 * 100);
        assert_eq!(calls[1].inclusive.0[0], 4 * 50);
        assert_eq!(calls[1].exclusive.0[0], 4 * 50);
        assert!(
            calls[0].inclusive.0[1..MAX_COUNTERS]
                .iter()
                .all(|c| *c == 0)
        );
    }

    /// The same run's histograms: mid's two calls in one bucket (270 each), leaf's four in
    /// another (60 each; its calls have no probed callees). Each bucket loses `calls x P +
    /// callee_calls x T`, so the buckets still add up to the compensated inclusive figures.
    #[test]
    fn histogram_buckets_lose_what_their_calls_carry() {
        use crate::session::aggregate::HistogramCounts;
        use topdown_common::{HistogramKey, histogram};
        let calibration = calibrated(ReturnMechanism::Exit);
        let calls = vec![
            edge(0, ROOT_FUNCTION, 2, 4, 540, 300),
            edge(1, 0, 4, 0, 240, 240),
        ];
        let bucket = |owner: u32, per_call: u64, calls: u64, callee_calls: u64| {
            let mut counts = SlotCounts::ZERO;
            counts.0[0] = per_call * calls;
            HistogramCounts {
                key: HistogramKey {
                    kind: histogram::FUNCTION,
                    owner,
                    tgid: 0,
                    bucket: histogram::bucket(per_call),
                },
                calls,
                callee_calls,
                counts,
            }
        };
        let mut buckets = vec![bucket(0, 270, 2, 4), bucket(1, 60, 4, 0)];
        let clamped = RunCosts::new(&calibration, &calls, &|_| Some(ReturnMechanism::Exit))
            .compensate_histograms(&mut buckets);
        assert_eq!(clamped, 0);
        assert_eq!(buckets[0].counts.0[0], 2 * 200);
        assert_eq!(buckets[1].counts.0[0], 4 * 50);
        // The bounds stay those of the raw figures: 270 is in [256, 320).
        assert_eq!(histogram::bounds(buckets[0].key.bucket), (256, 320));
        assert_eq!(
            calibration.weight_costs(ReturnMechanism::Exit, 0),
            Some(crate::functions::distribution::ProbeCost {
                per_call: 10.0,
                per_callee: 30.0
            })
        );
    }

    #[test]
    fn clamps_at_zero_and_counts_it() {
        let calibration = calibrated(ReturnMechanism::Uretprobe);
        let mut calls = vec![edge(0, ROOT_FUNCTION, 3, 0, 25, 25)];
        let clamped = compensate_calls(&calibration, &mut calls, ReturnMechanism::Uretprobe);
        assert_eq!(clamped, 2);
        assert_eq!(calls[0].inclusive.0[0], 0);
        assert_eq!(calls[0].exclusive.0[0], 0);
    }

    /// A function attached with another mechanism than the one calibrated is left as it was.
    #[test]
    fn uncalibrated_mechanism_is_left_raw() {
        let calibration = calibrated(ReturnMechanism::Exit);
        let mut calls = vec![edge(0, ROOT_FUNCTION, 3, 0, 90, 90)];
        compensate_calls(&calibration, &mut calls, ReturnMechanism::Uretprobe);
        assert_eq!(calls[0].inclusive.0[0], 90);
    }

    /// The report keeps each function's figures from before the subtraction, named.
    #[test]
    fn report_keeps_raw_figures() {
        let calibration = calibrated(ReturnMechanism::Exit);
        let aggregate = Aggregate {
            calls: vec![edge(0, ROOT_FUNCTION, 2, 0, 100, 100)],
            ..Aggregate::default()
        };
        let functions = [("/bin/app".to_owned(), "work".to_owned())];
        let (compensated, report) = calibration.compensate(
            &aggregate,
            &|_| Some(ReturnMechanism::Exit),
            &functions,
            &["cpu-clock".to_owned()],
        );
        assert_eq!(compensated.calls[0].inclusive.0[0], 80);
        assert_eq!(report.clamped, 0);
        assert_eq!(report.raw_functions.len(), 1);
        let raw = &report.raw_functions[0];
        assert_eq!((raw.symbol.as_str(), raw.calls), ("work", 2));
        assert_eq!(raw.inclusive["cpu-clock"], 100);
        assert_eq!(raw.exclusive["cpu-clock"], 100);
    }

    /// Eight pieces of 10 calls: the two slowest and the two fastest per-call means are left
    /// out, whatever their size; the calls recorded count all pieces.
    #[test]
    fn trimmed_mean_leaves_out_each_end() {
        let per_call = [1000, 10, 102, 98, 100, 104, 96, 0];
        let pieces: Vec<Piece> = per_call
            .iter()
            .map(|ns| {
                let call = edge(EMPTY_ID, ROOT_FUNCTION, 10, 0, ns * 10, ns * 10);
                HashMap::from([(call.key, call)])
            })
            .collect();
        let (recorded, means) = trimmed_mean(&pieces, key(EMPTY_ID, ROOT_FUNCTION), 1);
        assert_eq!(recorded, 80);
        // Sorted: 0, 10, | 96, 98, 100, 102, | 104, 1000.
        assert_eq!(means, vec![99.0]);
        let (recorded, _) = trimmed_mean(&pieces, key(CALLER_ID, ROOT_FUNCTION), 1);
        assert_eq!(recorded, 0);
    }

    /// Hybrid: a `cpu_atom/` slot takes the atom CPU's figures, a slot counted everywhere the
    /// mean of both.
    #[test]
    fn hybrid_slots_take_their_core_types_costs() {
        let typed = |core_type: &str, per_call: f64| ProbeCost {
            core_type: Some(core_type.to_owned()),
            per_call: BTreeMap::from([
                ("cpu_atom/slots".to_owned(), per_call),
                ("cpu-clock".to_owned(), per_call),
            ]),
            ..cost(ReturnMechanism::Exit, 0.0, 0.0)
        };
        let calibration = Calibration::new(
            vec![typed("cpu_core", 10.0), typed("cpu_atom", 30.0)],
            &["cpu_atom/slots".to_owned(), "cpu-clock".to_owned()],
            &[Some("cpu_atom".to_owned()), None],
        );
        let costs = &calibration.by_mechanism[&ReturnMechanism::Exit];
        assert_eq!(costs.per_call, vec![30.0, 20.0]);
    }
}
