//! Inherited per-task counters on one command, and what their ring buffers say.
//!
//! Every planned group is opened once per CPU (the group's PMU's CPUs) with `pid` = the held
//! command and `cpu` = that CPU, `inherit` and `inherit_stat` set, the leader disabled until the
//! command's `execve` (`enable_on_exec`). Per CPU and not `cpu = -1`, because the kernel refuses
//! to mmap an inherited `cpu = -1` event (kernel/events/core.c, `perf_mmap`: "Don't allow mmap()
//! of inherited per-task counters"), and the ring buffer is where the per-task values arrive:
//! as each inherited task exits, `sync_child_event` writes a `PERF_RECORD_READ` with its final
//! value into the parent event's buffer (what `perf record -s` uses).
//!
//! Every counting event has a buffer of its own, and the fork, name and exit records come
//! through a separate inherited `dummy` event per CPU. One shared buffer per CPU loses records:
//! a task's exit records for CPU N's events are written from whatever CPU the task exits on,
//! and the kernel's ring buffer takes one writing CPU at a time (kernel/events/ring_buffer.c:
//! `rb->nest` is a plain counter and `rb->head` a `local_t`, both only guarded by disabling
//! preemption). Two tasks exiting at once on two CPUs then either publish a `data_head` past a
//! record still being written (read back as a zero header) or leave `nest` above 1, after
//! which `data_head` never moves again (seen on 6.18: a thread's 1234 counts written past the
//! published head, never read). A counting event's own buffer has one writer at a time: the
//! kernel writes its children's exit records holding that event's `child_mutex`
//! (`perf_event_exit_event`, since Linux 5.13). The side-band records are written only on the
//! dummy event's own CPU (`perf_iterate_ctx` matches `event->cpu` to the current CPU).
//!
//! A task counts as split only when every counting event's exit record arrived for it; the
//! others are named, and their counts stay with the command's main thread.

use std::{
    collections::HashMap,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    sync::atomic::{AtomicU64, Ordering},
};

use anyhow::{Context as _, Result, bail};
use perf_event_open_sys::bindings;

use super::records::{self, CounterValue, Record};
use crate::{
    error::{Failure, fail},
    schedule::Plan,
    session::counters::{Privilege, ResolvedCounter, place_groups},
};

/// Data pages per buffer, tried first; halved while the locked-memory limit refuses (for a
/// user without CAP_IPC_LOCK, `kernel.perf_event_mlock_kb` per online CPU, 516 KiB by
/// default, then RLIMIT_MEMLOCK). A `PERF_RECORD_READ` is 56 bytes, so 8 pages hold 585 exits
/// between two drains, and a CPU's buffers fit the default limit up to 13 counters.
const DATA_PAGES: usize = 8;

/// How the counters may count, decided from `perf_event_paranoid` and the capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exclusions {
    pub privilege: Privilege,
    /// Without CAP_PERFMON and with `perf_event_paranoid` > 1 the kernel refuses kernel
    /// counting (`perf_allow_kernel`): every event, `-e` ones too, excludes kernel and
    /// hypervisor.
    pub user_only: bool,
}

/// A counting event and the buffer its children's exit records arrive in.
struct CountingEvent {
    /// The counter's index in the plan.
    index: usize,
    ring: Ring,
    fd: OwnedFd,
}

/// One CPU's counting events, and the dummy event whose buffer takes the CPU's fork, name and
/// exit records.
struct CpuEvents {
    cpu: u32,
    counting: Vec<CountingEvent>,
    side_band: Ring,
    _side_band_fd: OwnedFd,
}

/// The command's counters on every CPU and what their records said so far.
pub struct TaskCounters {
    /// Keeps the tree's contexts from being swapped (see [`open_swap_guard`]).
    _swap_guard: OwnedFd,
    cpus: Vec<CpuEvents>,
    /// Event id (`PERF_EVENT_IOC_ID`) -> counter index; an inherited event's records carry
    /// the id of the event it was inherited from.
    ids: HashMap<u64, usize>,
    counter_count: usize,
    pub tally: Tally,
}

/// What one exited task's records said.
#[derive(Debug, Clone)]
pub struct Exited {
    pub tgid: u32,
    /// Value per counter, summed over the CPUs' events.
    pub values: Vec<CounterValue>,
    /// How many exit records (one per counting event) arrived.
    pub readings: usize,
}

/// What the records said: exited tasks' values, names, parents, exits, losses.
#[derive(Debug, Default)]
pub struct Tally {
    /// tid -> its exit records. A tid reused within the run adds to its earlier instance: the
    /// records of two instances cannot be told apart across buffers without ordering every
    /// record.
    pub exited: HashMap<u32, Exited>,
    /// tid -> how many times it exited (`PERF_RECORD_EXIT`).
    pub exits: HashMap<u32, usize>,
    /// tid -> the latest name it took (time, name).
    pub comms: HashMap<u32, (u64, String)>,
    /// tid -> (tgid, the task that created it).
    pub forks: HashMap<u32, (u32, u32)>,
    /// Counting events opened: each exiting task writes one record per event.
    pub events: usize,
    /// Records the kernel dropped for want of buffer space.
    pub lost: u64,
    /// Records too short for their type, with an unknown counter id, or a buffer whose next
    /// header was broken (the rest of what it held was skipped).
    pub undecodable: u64,
}

impl TaskCounters {
    /// Opens `plan`'s groups on `pid` (held before `execve`) on each CPU of `cpus` that the
    /// group's PMU covers (`cpus_of`).
    pub fn open(
        pid: u32,
        plan: &Plan,
        counters: &[ResolvedCounter],
        cpus: &[u32],
        cpus_of: &dyn Fn(&str) -> Result<Vec<u32>>,
        exclusions: Exclusions,
    ) -> Result<Self> {
        let placed = place_groups(plan, counters, cpus_of)?;
        let swap_guard = open_swap_guard(pid)?;
        let mut ids = HashMap::new();
        let mut per_cpu = Vec::with_capacity(cpus.len());
        for &cpu in cpus {
            let mut counting = Vec::new();
            for group in placed.iter().filter(|group| group.covers(cpu)) {
                let mut leader: Option<RawFd> = None;
                for &(index, ref counter) in &group.members {
                    let role = Role {
                        leader: leader.is_none(),
                        pinned: leader.is_none() && group.pinned,
                    };
                    let fd = open_event(counter, pid, cpu, leader, role, exclusions)?;
                    ids.insert(event_id(&fd)?, index);
                    if leader.is_none() {
                        leader = Some(fd.as_raw_fd());
                    }
                    let ring = Ring::map(fd.as_raw_fd()).with_context(|| {
                        format!("mapping the record buffer of counter {index} on CPU {cpu}")
                    })?;
                    counting.push(CountingEvent { index, ring, fd });
                }
            }
            if counting.is_empty() {
                continue;
            }
            let side_band_fd = open_side_band(pid, cpu)?;
            let side_band = Ring::map(side_band_fd.as_raw_fd())
                .with_context(|| format!("mapping the task record buffer of CPU {cpu}"))?;
            per_cpu.push(CpuEvents {
                cpu,
                counting,
                side_band,
                _side_band_fd: side_band_fd,
            });
        }
        let tally = Tally {
            events: per_cpu.iter().map(|cpu| cpu.counting.len()).sum(),
            ..Tally::default()
        };
        Ok(Self {
            _swap_guard: swap_guard,
            cpus: per_cpu,
            ids,
            counter_count: counters.len(),
            tally,
        })
    }

    /// Number of CPUs with events.
    pub fn cpu_count(&self) -> usize {
        self.cpus.len()
    }

    /// Takes every record written so far into the tally.
    pub fn drain(&mut self) {
        let (ids, tally, count) = (&self.ids, &mut self.tally, self.counter_count);
        for cpu in &mut self.cpus {
            let rings = cpu
                .counting
                .iter_mut()
                .map(|event| &mut event.ring)
                .chain(std::iter::once(&mut cpu.side_band));
            for ring in rings {
                let complete = ring.drain(|bytes| tally.add(records::decode(bytes), ids, count));
                if !complete {
                    tally.undecodable += 1;
                }
            }
        }
    }

    /// Each CPU's values per counter: the command's tasks that ran there, exited or not
    /// (reading an inherited event adds its children's counts, kernel/events/core.c
    /// `perf_event_read_value`).
    pub fn read_cpus(&self) -> Result<Vec<(u32, Vec<CounterValue>)>> {
        self.cpus
            .iter()
            .map(|cpu| {
                let mut values = vec![CounterValue::default(); self.counter_count];
                for event in &cpu.counting {
                    let value = read_counter(&event.fd).with_context(|| {
                        format!("reading counter {} on CPU {}", event.index, cpu.cpu)
                    })?;
                    if let Some(slot) = values.get_mut(event.index) {
                        *slot += value;
                    }
                }
                Ok((cpu.cpu, values))
            })
            .collect()
    }
}

impl Tally {
    fn add(&mut self, record: Option<Record>, ids: &HashMap<u64, usize>, counters: usize) {
        match record {
            Some(Record::Read {
                pid,
                tid,
                id,
                counter,
            }) => match ids.get(&id) {
                Some(&index) => {
                    let exited = self.exited.entry(tid).or_insert_with(|| Exited {
                        tgid: pid,
                        values: vec![CounterValue::default(); counters],
                        readings: 0,
                    });
                    if let Some(slot) = exited.values.get_mut(index) {
                        *slot += counter;
                    }
                    exited.readings += 1;
                }
                None => self.undecodable += 1,
            },
            Some(Record::Fork { pid, tid, ptid }) => {
                self.forks.insert(tid, (pid, ptid));
            }
            Some(Record::Exit { tid, .. }) => *self.exits.entry(tid).or_default() += 1,
            Some(Record::Comm {
                tid, comm, time, ..
            }) => {
                let entry = self.comms.entry(tid).or_insert((time, comm.clone()));
                if time >= entry.0 {
                    *entry = (time, comm);
                }
            }
            Some(Record::Lost { lost }) => self.lost += lost,
            Some(Record::Other) => {}
            None => self.undecodable += 1,
        }
    }

    /// Whether every exit record of `tid` arrived: one per counting event for each time it
    /// exited. A task with fewer cannot be split from the command's main thread.
    pub fn complete(&self, tid: u32) -> bool {
        let exits = self.exits.get(&tid).copied().unwrap_or(0);
        let readings = self.exited.get(&tid).map_or(0, |exited| exited.readings);
        exits > 0 && readings == exits * self.events
    }

    /// The name of `tid`: its own latest, else its creator's (a new thread or process starts
    /// with its parent's name), else `fallback`.
    pub fn comm_of(&self, tid: u32, fallback: &str) -> String {
        let mut task = tid;
        // Bounded: a reused tid could make the parent chain loop.
        for _ in 0..64 {
            if let Some((_, comm)) = self.comms.get(&task) {
                return comm.clone();
            }
            match self.forks.get(&task) {
                Some(&(_, parent)) if parent != task => task = parent,
                _ => break,
            }
        }
        fallback.to_owned()
    }
}

/// What an event is in its group.
#[derive(Clone, Copy)]
struct Role {
    leader: bool,
    pinned: bool,
}

fn open_event(
    counter: &ResolvedCounter,
    pid: u32,
    cpu: u32,
    leader: Option<RawFd>,
    role: Role,
    exclusions: Exclusions,
) -> Result<OwnedFd> {
    let mut attr = crate::session::counters::counter_attr(counter);
    // No PERF_FORMAT_GROUP: an exiting task's group is taken apart event by event, and a
    // group-format PERF_RECORD_READ written then lists only the members still attached
    // (seen on 6.18: nr = 1 for a two-event group). One record per event, named by its id.
    attr.read_format = u64::from(
        bindings::PERF_FORMAT_TOTAL_TIME_ENABLED
            | bindings::PERF_FORMAT_TOTAL_TIME_RUNNING
            | bindings::PERF_FORMAT_ID,
    );
    attr.set_inherit(1);
    attr.set_inherit_stat(1);
    attr.set_pinned(u64::from(role.pinned));
    // Members follow their leader; the leader starts at the command's execve.
    attr.set_disabled(u64::from(role.leader));
    attr.set_enable_on_exec(u64::from(role.leader));
    attr.set_sample_id_all(1);
    attr.sample_type = u64::from(bindings::PERF_SAMPLE_TIME);
    match counter.exclude {
        Some(exclude) => {
            attr.set_exclude_user(u64::from(exclude.user));
            attr.set_exclude_kernel(u64::from(exclude.kernel || exclusions.user_only));
            attr.set_exclude_hv(u64::from(exclude.hv || exclusions.user_only));
            attr.set_exclude_host(u64::from(exclude.host));
            attr.set_exclude_guest(u64::from(exclude.guest));
            attr.set_exclude_idle(u64::from(exclude.idle));
        }
        None => {
            let user_only = exclusions.user_only || exclusions.privilege == Privilege::UserOnly;
            attr.set_exclude_user(u64::from(exclusions.privilege == Privilege::KernelOnly));
            attr.set_exclude_kernel(u64::from(user_only));
            attr.set_exclude_hv(u64::from(user_only));
        }
    }
    // SAFETY: attr is initialised and outlives the call.
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            &mut attr,
            pid as libc::pid_t,
            cpu as libc::c_int,
            leader.unwrap_or(-1),
            libc::c_ulong::from(bindings::PERF_FLAG_FD_CLOEXEC),
        )
    };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        let what = format!(
            "cannot open counter {} (type {}, config {:#x}) for pid {pid} on CPU {cpu}: {err}",
            counter.name, counter.perf_type, counter.config
        );
        return Err(match err.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => fail(
                Failure::Permission,
                format!(
                    "{what}: kernel.perf_event_paranoid forbids it for this user (3 or more \
                     refuses every unprivileged counter): lower it, or run as root"
                ),
            ),
            Some(libc::ENOENT)
            | Some(libc::EOPNOTSUPP)
            | Some(libc::ENODEV)
            | Some(libc::EINVAL) => fail(
                Failure::PmuUnavailable,
                format!(
                    "{what}: this PMU does not provide it (check `--pmu`; use --pmu \
                         software on machines without the hardware)"
                ),
            ),
            _ => anyhow::anyhow!(what),
        });
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A software `dummy` event on the command alone, not inherited. It keeps the kernel from
/// marking the children's perf contexts as clones of the command's (kernel/events/core.c,
/// `inherit_task_group` clears `inherited_all` for an event that is not inherited), and only
/// clones are swapped wholesale at a context switch between two tasks of the tree
/// (`perf_event_context_sched_out`, `context_equiv`). A swap between the command and one of
/// its tasks moves the original events to that task, which then exits without a
/// `PERF_RECORD_READ` while the command's main thread writes one carrying the other task's
/// values (seen on 6.18: a thread's 5 getppid calls reported under the main thread's tid).
fn open_swap_guard(pid: u32) -> Result<OwnedFd> {
    open_dummy(dummy_attr(), pid, -1).with_context(|| format!("opening a dummy event on pid {pid}"))
}

/// An inherited `dummy` event on the command for `cpu`, counting nothing: its buffer takes
/// the fork, exit (`task`) and name (`comm`) records of the command's tasks on that CPU. No
/// `inherit_stat`, so it writes no exit readings of its own.
fn open_side_band(pid: u32, cpu: u32) -> Result<OwnedFd> {
    let mut attr = dummy_attr();
    attr.set_inherit(1);
    attr.set_task(1);
    attr.set_comm(1);
    attr.set_sample_id_all(1);
    attr.sample_type = u64::from(bindings::PERF_SAMPLE_TIME);
    open_dummy(attr, pid, cpu as libc::c_int)
        .with_context(|| format!("opening the task record event of pid {pid} on CPU {cpu}"))
}

/// A software `dummy` event, user space only (allowed at any `perf_event_paranoid` below 3).
fn dummy_attr() -> bindings::perf_event_attr {
    // SAFETY: perf_event_attr is plain data; all-zero is its documented default.
    let mut attr: bindings::perf_event_attr = unsafe { std::mem::zeroed() };
    attr.size = std::mem::size_of::<bindings::perf_event_attr>() as u32;
    attr.type_ = bindings::PERF_TYPE_SOFTWARE;
    attr.config = u64::from(bindings::PERF_COUNT_SW_DUMMY);
    attr.set_exclude_kernel(1);
    attr.set_exclude_hv(1);
    attr
}

fn open_dummy(mut attr: bindings::perf_event_attr, pid: u32, cpu: libc::c_int) -> Result<OwnedFd> {
    // SAFETY: attr is initialised and outlives the call.
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            &mut attr,
            pid as libc::pid_t,
            cpu,
            -1,
            libc::c_ulong::from(bindings::PERF_FLAG_FD_CLOEXEC),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn event_id(fd: &OwnedFd) -> Result<u64> {
    let mut id = 0u64;
    // SAFETY: `id` is a valid u64 for the kernel to write.
    let rc = unsafe { perf_event_open_sys::ioctls::ID(fd.as_raw_fd(), &mut id) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).context("PERF_EVENT_IOC_ID");
    }
    Ok(id)
}

/// `read()` with this read format: value, time enabled, time running, id.
fn read_counter(fd: &OwnedFd) -> Result<CounterValue> {
    let mut words = [0u64; 4];
    // SAFETY: the buffer is 32 writable bytes.
    let got = unsafe {
        libc::read(
            fd.as_raw_fd(),
            words.as_mut_ptr().cast(),
            std::mem::size_of_val(&words),
        )
    };
    if got < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    if got as usize != std::mem::size_of_val(&words) {
        bail!("short read of {got} bytes");
    }
    Ok(CounterValue {
        value: words[0],
        enabled_ns: words[1],
        running_ns: words[2],
    })
}

/// A perf event's mmapped ring buffer: the metadata page, then a power-of-two data area.
struct Ring {
    base: *mut libc::c_void,
    len: usize,
    data_offset: usize,
    data_size: usize,
    /// One record, copied out of the ring (records can wrap around its end).
    scratch: Vec<u8>,
}

impl Ring {
    fn map(fd: RawFd) -> Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|&page| page > 0)
            .context("sysconf(_SC_PAGESIZE)")?;
        let mut pages = DATA_PAGES;
        loop {
            let len = (pages + 1) * page;
            // SAFETY: a fresh shared mapping of the event's buffer; the kernel checks the size.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if base != libc::MAP_FAILED {
                let meta = base.cast::<bindings::perf_event_mmap_page>();
                // SAFETY: the first page is the kernel's perf_event_mmap_page.
                let (offset, size) = unsafe { ((*meta).data_offset, (*meta).data_size) };
                // Kernels before 4.1 leave these 0: the data area then starts at page 1.
                let (data_offset, data_size) = if size == 0 {
                    (page, pages * page)
                } else {
                    (offset as usize, size as usize)
                };
                return Ok(Self {
                    base,
                    len,
                    data_offset,
                    data_size,
                    scratch: Vec::new(),
                });
            }
            let err = std::io::Error::last_os_error();
            // EPERM: over kernel.perf_event_mlock_kb and RLIMIT_MEMLOCK; try a smaller one.
            if pages > 1 && matches!(err.raw_os_error(), Some(libc::EPERM | libc::ENOMEM)) {
                pages /= 2;
                continue;
            }
            return Err(err).context("mmap");
        }
    }

    /// Hands every complete record to `each`, then frees its space for the kernel. `false`
    /// when a broken header made it skip the rest of what the buffer held.
    fn drain(&mut self, mut each: impl FnMut(&[u8])) -> bool {
        let meta = self.base.cast::<bindings::perf_event_mmap_page>();
        // SAFETY: data_head/data_tail are aligned u64s in the mapped metadata page; the kernel
        // writes data_head, we write data_tail (the documented protocol, perf_event.h).
        let (head_word, tail_word) = unsafe {
            (
                AtomicU64::from_ptr(&raw mut (*meta).data_head),
                AtomicU64::from_ptr(&raw mut (*meta).data_tail),
            )
        };
        // Acquire: the records before data_head are written once we see it.
        let head = head_word.load(Ordering::Acquire);
        let mut tail = tail_word.load(Ordering::Relaxed);
        let mut complete = true;
        while tail < head {
            self.copy_out(tail, records::HEADER_SIZE);
            let size = records::record_size(&self.scratch).unwrap_or(0);
            if size < records::HEADER_SIZE || size > self.data_size || tail + size as u64 > head {
                // A broken header would make every later record garbage: drop the rest.
                tail = head;
                complete = false;
                break;
            }
            self.copy_out(tail, size);
            each(&self.scratch);
            tail += size as u64;
        }
        // Release: we are done reading the space we hand back.
        tail_word.store(tail, Ordering::Release);
        complete
    }

    /// Copies `len` bytes at ring position `position` into `scratch`, across the wrap.
    fn copy_out(&mut self, position: u64, len: usize) {
        self.scratch.clear();
        let start = (position % self.data_size as u64) as usize;
        let first = len.min(self.data_size - start);
        // SAFETY: both ranges lie in the data area of the mapping.
        unsafe {
            let data = self.base.cast::<u8>().add(self.data_offset);
            self.scratch
                .extend_from_slice(std::slice::from_raw_parts(data.add(start), first));
            self.scratch
                .extend_from_slice(std::slice::from_raw_parts(data, len - first));
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}
