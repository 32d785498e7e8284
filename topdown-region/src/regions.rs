//! Named regions: a per-thread stack of open regions, each region's calls and inclusive and
//! exclusive counts per thread (inclusive: begin to end, nested regions included; exclusive:
//! inclusive minus the inclusive counts of the regions nested directly in it, as topdown's
//! `-u` function probes report), and the misuse of the API, counted instead of crashing.
//!
//! A thread's counters open at its first region. Its totals live in a record the process
//! keeps after the thread exits, so a report made at the end covers every thread.

use std::{
    cell::RefCell,
    sync::{
        Arc, Mutex, MutexGuard, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
};

use crate::{
    counters::{ReadPath, ThreadCounters, monotonic_ns},
    setup::{Config, Setup},
};

/// Regions open at once on one thread beyond which begins are counted and ignored (the same
/// 64 as topdown's `-u`, the kernel's uretprobe nesting limit).
pub const MAX_DEPTH: usize = 64;

/// Misuse of the API on one thread: counted, reported, never fatal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Misuse {
    /// `end` with no region open.
    pub unmatched_ends: u64,
    /// `end` naming a region that is open but not innermost: the regions opened inside it
    /// are closed unrecorded (counted in `abandoned`) and it ends.
    pub mismatched_ends: u64,
    /// `end` naming no open region: ignored.
    pub unknown_ends: u64,
    /// Regions closed unrecorded by a mismatched end.
    pub abandoned: u64,
    /// `begin` past [`MAX_DEPTH`] open regions: ignored, with the `end` that closes it.
    pub too_deep: u64,
    /// Regions still open when their thread exited.
    pub open_at_exit: u64,
}

/// One region's totals on one thread.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RegionTotals {
    pub name: String,
    pub calls: u64,
    /// One value per slot of [`Snapshot::slot_names`].
    pub inclusive: Vec<u64>,
    pub exclusive: Vec<u64>,
}

/// A caller -> callee edge of one thread's region tree (as topdown's `call_tree`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RegionEdge {
    /// The enclosing region, `None` for an outermost one.
    pub caller: Option<String>,
    pub callee: String,
    pub calls: u64,
    pub inclusive: Vec<u64>,
}

/// One thread's results.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ThreadRecord {
    pub tid: u32,
    pub comm: String,
    pub exited: bool,
    pub path: ReadPath,
    /// Why the thread's counters are read the way they are (or are disabled).
    pub reason: String,
    pub regions: Vec<RegionTotals>,
    pub edges: Vec<RegionEdge>,
    /// What the thread's outermost regions counted, summed.
    pub outermost: Vec<u64>,
    pub misuse: Misuse,
    /// Counter readings taken, failed, and taken while a group was multiplexed.
    pub readings: u64,
    pub read_errors: u64,
    pub multiplexed_readings: u64,
}

impl ThreadRecord {
    pub fn region(&self, name: &str) -> Option<&RegionTotals> {
        self.regions.iter().find(|region| region.name == name)
    }
}

struct Session {
    /// The config the session was set up with (`Err`: the environment's did not parse).
    config: Result<Config, String>,
    setup: Result<Setup, String>,
    slot_names: Vec<String>,
    /// Every thread's record, with the fork generation it was made in.
    threads: Mutex<Vec<(u64, Arc<Mutex<ThreadRecord>>)>>,
    start_ns: u64,
}

static SESSION: OnceLock<Session> = OnceLock::new();

/// Bumped in a forked child. Counters opened with pid 0 count the thread that opened them,
/// so after a fork the child's copy of a thread's state would read the parent's counters:
/// a state (and a record) from an earlier generation is set aside at the child's next call.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

extern "C" fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Ordering::Relaxed);
}

fn fork_generation() -> u64 {
    FORK_GENERATION.load(Ordering::Relaxed)
}

impl Session {
    fn new(config: Result<Config, String>) -> Self {
        // SAFETY: registers a handler that only bumps an atomic; once per process.
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_in_child));
        }
        let setup = config.clone().and_then(Setup::new);
        let slot_names = setup.as_ref().map(Setup::slot_names).unwrap_or_default();
        Self {
            config,
            setup,
            slot_names,
            threads: Mutex::new(Vec::new()),
            start_ns: monotonic_ns(),
        }
    }
}

fn session() -> &'static Session {
    SESSION.get_or_init(|| Session::new(Config::from_env()))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding a record must not stop the counting.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Sets the library up with `config`. Only the first setup counts (explicit or, at the first
/// region, from the environment): a later call returns an error saying so. A setup that fails
/// (unknown model, tracefs missing) still leaves the library working without counters; the
/// error is the reason, also in every thread's [`ThreadRecord::reason`].
pub fn init(config: Config) -> Result<(), String> {
    let mut fresh = false;
    let wanted = config.clone();
    let session = SESSION.get_or_init(|| {
        fresh = true;
        Session::new(Ok(config))
    });
    if !fresh && session.config.as_ref() != Ok(&wanted) {
        return Err(
            "topdown-region is already set up (init must come before the first region)".to_owned(),
        );
    }
    session.setup.as_ref().map(|_| ()).map_err(Clone::clone)
}

struct Frame {
    region: usize,
    /// False when the begin's reading failed: the end records nothing for it.
    valid: bool,
}

struct ThreadState {
    generation: u64,
    /// Set aside in a forked child: dropping it records nothing.
    forked: bool,
    counters: Option<ThreadCounters>,
    record: Arc<Mutex<ThreadRecord>>,
    /// Region names in the record's order, to find a region without taking its lock.
    names: Vec<Box<str>>,
    stack: Vec<Frame>,
    /// Per open frame, `width` values each: the reading at begin, and the inclusive counts
    /// of the regions directly inside it.
    starts: Vec<u64>,
    children: Vec<u64>,
    /// Begins past the depth limit still waiting for their end.
    skipped: usize,
    now: Vec<u64>,
    width: usize,
}

impl ThreadState {
    fn new() -> Self {
        let session = session();
        let width = session.slot_names.len();
        let (counters, path, reason) = match &session.setup {
            Err(err) => (None, ReadPath::Disabled, err.clone()),
            Ok(setup) => match ThreadCounters::open(setup) {
                Ok(counters) => {
                    let (path, reason) = (counters.path(), counters.reason().to_owned());
                    (Some(counters), path, reason)
                }
                Err(err) => (None, ReadPath::Disabled, err),
            },
        };
        let record = Arc::new(Mutex::new(ThreadRecord {
            tid: current_tid(),
            comm: current_comm(),
            exited: false,
            path,
            reason,
            regions: Vec::new(),
            edges: Vec::new(),
            outermost: vec![0; width],
            misuse: Misuse::default(),
            readings: 0,
            read_errors: 0,
            multiplexed_readings: 0,
        }));
        let generation = fork_generation();
        lock(&session.threads).push((generation, Arc::clone(&record)));
        Self {
            generation,
            forked: false,
            counters,
            record,
            names: Vec::new(),
            stack: Vec::with_capacity(MAX_DEPTH),
            starts: vec![0; width * MAX_DEPTH],
            children: vec![0; width * MAX_DEPTH],
            skipped: 0,
            now: vec![0; width],
            width,
        }
    }

    fn region_index(&mut self, name: &str) -> usize {
        if let Some(index) = self.names.iter().position(|known| &**known == name) {
            return index;
        }
        self.names.push(name.into());
        lock(&self.record).regions.push(RegionTotals {
            name: name.to_owned(),
            calls: 0,
            inclusive: vec![0; self.width],
            exclusive: vec![0; self.width],
        });
        self.names.len() - 1
    }

    /// Reads the counters into `now`; false (counted) when there are none or the read failed.
    fn read_now(&mut self) -> bool {
        let Some(counters) = &mut self.counters else {
            return true;
        };
        let outcome = counters.read(&mut self.now);
        let mut record = lock(&self.record);
        record.readings += 1;
        match outcome {
            Ok(info) => {
                record.multiplexed_readings += u64::from(info.multiplexed);
                true
            }
            Err(err) => {
                record.read_errors += 1;
                if record.read_errors == 1 {
                    record.reason = format!("{}; first failed reading: {err}", record.reason);
                }
                false
            }
        }
    }

    fn begin(&mut self, name: &str) {
        if self.stack.len() >= MAX_DEPTH || self.skipped > 0 {
            self.skipped += 1;
            lock(&self.record).misuse.too_deep += 1;
            return;
        }
        let region = self.region_index(name);
        if self.stack.is_empty()
            && let Some(counters) = &mut self.counters
            && let Err(err) = counters.reset_if_due(&mut self.now)
        {
            let mut record = lock(&self.record);
            record.read_errors += 1;
            record.reason = format!("{}; {err}", record.reason);
        }
        let valid = self.read_now();
        let depth = self.stack.len();
        let frame = depth * self.width..(depth + 1) * self.width;
        self.starts[frame.clone()].copy_from_slice(&self.now);
        self.children[frame].fill(0);
        self.stack.push(Frame { region, valid });
    }

    fn end(&mut self, name: &str) {
        if self.skipped > 0 {
            self.skipped -= 1;
            return;
        }
        let Some(position) = self
            .stack
            .iter()
            .rposition(|frame| &*self.names[frame.region] == name)
        else {
            let mut record = lock(&self.record);
            if self.stack.is_empty() {
                record.misuse.unmatched_ends += 1;
            } else {
                record.misuse.unknown_ends += 1;
            }
            return;
        };
        let abandoned = self.stack.len() - 1 - position;
        if abandoned > 0 {
            let mut record = lock(&self.record);
            record.misuse.mismatched_ends += 1;
            record.misuse.abandoned += abandoned as u64;
            self.stack.truncate(position + 1);
        }
        let valid = self.read_now();
        let Some(frame) = self.stack.pop() else {
            return;
        };
        if !(valid && frame.valid) {
            return;
        }
        let depth = self.stack.len();
        let range = depth * self.width..(depth + 1) * self.width;
        let caller = self.stack.last().map(|parent| &*self.names[parent.region]);
        let callee = &*self.names[frame.region];
        let mut record = lock(&self.record);
        let record = &mut *record;
        let edge = match record
            .edges
            .iter()
            .position(|edge| edge.caller.as_deref() == caller && edge.callee == callee)
        {
            Some(edge) => edge,
            None => {
                record.edges.push(RegionEdge {
                    caller: caller.map(str::to_owned),
                    callee: callee.to_owned(),
                    calls: 0,
                    inclusive: vec![0; self.width],
                });
                record.edges.len() - 1
            }
        };
        record.edges[edge].calls += 1;
        let Some(totals) = record.regions.get_mut(frame.region) else {
            return;
        };
        totals.calls += 1;
        for (slot, index) in range.clone().enumerate() {
            let inclusive = self.now[slot].saturating_sub(self.starts[index]);
            let exclusive = inclusive.saturating_sub(self.children[index]);
            totals.inclusive[slot] = totals.inclusive[slot].saturating_add(inclusive);
            totals.exclusive[slot] = totals.exclusive[slot].saturating_add(exclusive);
            record.edges[edge].inclusive[slot] =
                record.edges[edge].inclusive[slot].saturating_add(inclusive);
            if depth == 0 {
                record.outermost[slot] = record.outermost[slot].saturating_add(inclusive);
            } else {
                let parent = index - self.width;
                self.children[parent] = self.children[parent].saturating_add(inclusive);
            }
        }
    }
}

impl Drop for ThreadState {
    fn drop(&mut self) {
        if self.forked {
            return;
        }
        let mut record = lock(&self.record);
        record.exited = true;
        record.misuse.open_at_exit += (self.stack.len() + self.skipped) as u64;
    }
}

thread_local! {
    static STATE: RefCell<Option<ThreadState>> = const { RefCell::new(None) };
}

/// Runs `action` on the calling thread's state, creating it at first use. Does nothing while
/// the thread is being torn down or when re-entered (a region begun from a destructor that
/// runs inside the library).
fn with_state(action: impl FnOnce(&mut ThreadState)) {
    let _ = STATE.try_with(|cell| {
        if let Ok(mut state) = cell.try_borrow_mut() {
            if let Some(mut stale) = state.take_if(|state| state.generation != fork_generation()) {
                // The parent's thread, not this one: its fds close here, and its record (the
                // parent's) is left alone.
                stale.forked = true;
            }
            action(state.get_or_insert_with(ThreadState::new));
        }
    });
}

/// Opens region `name` on the calling thread.
pub fn begin(name: &str) {
    with_state(|state| state.begin(name));
}

/// Closes region `name` on the calling thread (see [`Misuse`] for what a wrong name does).
pub fn end(name: &str) {
    with_state(|state| state.end(name));
}

/// A region open until this guard drops.
#[must_use = "the region ends when the guard drops"]
pub struct Region<'a> {
    name: &'a str,
}

impl Drop for Region<'_> {
    fn drop(&mut self) {
        end(self.name);
    }
}

/// Begins region `name`; it ends when the returned guard drops.
pub fn region(name: &str) -> Region<'_> {
    begin(name);
    Region { name }
}

/// The calling thread's read path and why (opening its counters if it has none yet).
pub fn thread_path() -> (ReadPath, String) {
    let mut answer = (ReadPath::Disabled, "thread is exiting".to_owned());
    with_state(|state| {
        let record = lock(&state.record);
        answer = (record.path, record.reason.clone());
    });
    answer
}

/// Everything recorded so far, every thread (exited ones included).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Snapshot {
    /// The model's `--pmu` name (`synthetic:intel-icl`); empty when setup failed.
    pub model: String,
    pub level: u8,
    /// The names of each counter value (the counters, then rotating groups' times).
    pub slot_names: Vec<String>,
    /// Why the library has no counters at all, when setup failed.
    pub setup_error: Option<String>,
    pub duration_s: f64,
    pub threads: Vec<ThreadRecord>,
}

impl Snapshot {
    /// The value named `counter` among `values` (a region's or thread's counts).
    pub fn value(&self, values: &[u64], counter: &str) -> Option<u64> {
        let position = self.slot_names.iter().position(|name| name == counter)?;
        values.get(position).copied()
    }

    pub fn thread(&self, tid: u32) -> Option<&ThreadRecord> {
        self.threads.iter().find(|thread| thread.tid == tid)
    }
}

pub fn snapshot() -> Snapshot {
    let session = session();
    let generation = fork_generation();
    let threads = lock(&session.threads)
        .iter()
        .filter(|(made_in, _)| *made_in == generation)
        .map(|(_, record)| lock(record).clone())
        .collect();
    let (model, level) = match &session.setup {
        Ok(setup) => (setup.model.name(), setup.level),
        Err(_) => (String::new(), 0),
    };
    Snapshot {
        model,
        level,
        slot_names: session.slot_names.clone(),
        setup_error: session.setup.as_ref().err().cloned(),
        duration_s: monotonic_ns().saturating_sub(session.start_ns) as f64 / 1e9,
        threads,
    }
}

/// The process's model, for reports.
pub(crate) fn with_setup<T>(action: impl FnOnce(Option<&Setup>) -> T) -> T {
    action(session().setup.as_ref().ok())
}

/// The calling thread's id.
pub fn current_tid() -> u32 {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    u32::try_from(tid).unwrap_or(0)
}

fn current_comm() -> String {
    let mut name = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes and a NUL into the buffer.
    let result = unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    if result != 0 {
        return String::new();
    }
    let end = name.iter().position(|&byte| byte == 0).unwrap_or(16);
    String::from_utf8_lossy(&name[..end]).into_owned()
}
