//! The run's processes read near the floor: at every tick each known
//! process costs one `pread` of its `statm` (kept open), and nothing else.
//!
//! - Births come from the kernel's process events ([`Feed`], filled by
//!   [`crate::commands::run::process_events`]) as they happen; each known
//!   process's `children` is also read slowly, as a safety net
//!   ([`RESCAN_WITH_EVENTS`]), and often where the events cannot be had
//!   ([`RESCAN_WITHOUT_EVENTS`]), staggered: a tick reads a share of them.
//!   (A kernel without `children` files, or events lost, gets memprobe-core's
//!   [`TreeWalker`] over the whole tree.)
//! - A tick spends at most half an interval on newcomers: in a storm of
//!   births (256 workers at once) the rest wait for the next tick rather
//!   than the tick being missed for every process.
//! - Deaths: the kept-open `statm` of a process that has exited reads no
//!   memory (a zombie's is all zeros, a reaped one's read fails).
//! - `/proc/<pid>/status` (5× a `statm` read: name, parent, `VmHWM`) is read
//!   when a figure asks for it: at a process's first sight, when a sample
//!   is its largest yet (a new peak), when it execs or renames,
//!   every [`STATUS_REFRESH_MOVING`] while its `statm` moves, and every
//!   [`STATUS_REFRESH_IDLE`] while it reads the same (an idle worker),
//!   staggered over processes. The kernel's high-water mark only rises, so
//!   a spike that rose and fell between two samples is in the next read of
//!   it: the peak is exact to the byte, its time within the refresh; what
//!   a process's last refresh before its exit cannot see, the kernel's
//!   exit records give ([`super::exit_stats`]) where they can be had.
//!   Sleeping workers, most of a node's tree, then cost one `statm` read a
//!   tick, busy ones little more.
//! - The loop runs on a file table of its own ([`super::own_files`]), so
//!   that each `pread` takes the kernel's single-owner path.

use super::host_kinds::{self, rss_kinds_from_status, RssKinds};
use super::pid_map::PidMap;
use memprobe_core::internal::process::{ProcessStatus, StatusFile};
use memprobe_core::internal::process_tree::TreeWalker;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest a known process goes without a `status` read while its
/// `statm` reads the same from tick to tick.
pub(crate) const STATUS_REFRESH_IDLE: Duration = Duration::from_secs(1);
/// The longest a known process goes without a `status` read while its
/// `statm` moves (and stays below its peak).
pub(crate) const STATUS_REFRESH_MOVING: Duration = Duration::from_millis(100);
/// How often the tree is walked when every birth comes as an event: a
/// safety net only (a lost event is seen, and walks at once).
pub(crate) const RESCAN_WITH_EVENTS: Duration = Duration::from_secs(5);
/// How often the tree is walked when no events can be had.
pub(crate) const RESCAN_WITHOUT_EVENTS: Duration = Duration::from_millis(50);
/// At most this many events wait for the sampler (beyond: a rescan).
const FEED_CAP: usize = 1 << 16;

/// What the process events tell the sampler between two ticks.
#[derive(Debug, Default)]
pub(crate) struct FeedState {
    /// (pid, parent) of each birth in memprobe's tree, in order.
    pub(crate) births: Vec<(u32, u32)>,
    /// Processes that exec'd or were renamed (their name is stale).
    pub(crate) renamed: Vec<u32>,
    /// Events dropped because the sampler fell behind: walk the tree.
    pub(crate) lost: bool,
}

/// The shared queue between the process events' thread and the sampler.
#[derive(Debug, Clone, Default)]
pub(crate) struct Feed(Arc<Mutex<FeedState>>);

impl Feed {
    /// A birth of `pid`, child of `ppid`.
    pub(crate) fn born(&self, pid: u32, ppid: u32) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if s.births.len() < FEED_CAP {
            s.births.push((pid, ppid));
        } else {
            s.lost = true;
        }
    }

    /// `pid` exec'd or was renamed.
    pub(crate) fn renamed(&self, pid: u32) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if s.renamed.len() < FEED_CAP {
            s.renamed.push(pid);
        }
    }

    /// The socket overflowed: some events were lost.
    pub(crate) fn lost(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).lost = true;
    }

    fn take(&self) -> FeedState {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// One process at one tick whose record may need an update: its resident
/// set, and its status when it was read at this tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) rss: u64,
    /// Boxed: read at few ticks, and the tick's list stays small.
    pub(crate) status: Option<Box<ProcessStatus>>,
    /// Its resident set by kind as of its last `status` read (at this tick
    /// when `status` is here; see [`super::host_kinds`]).
    pub(crate) kinds: Option<RssKinds>,
}

/// One tick's reading of the tree.
#[derive(Debug, Default)]
pub(crate) struct Reading {
    /// The live processes that may have changed since the tick before:
    /// newcomers, those whose `statm` moved, those whose status was read.
    /// An unmoved process's records need no update (see
    /// [`super::recording::Recording::observe`]), so a sleeping worker
    /// costs its `statm` read and nothing here.
    pub(crate) changed: Vec<(u32, Seen)>,
    /// Processes followed until the last tick that have exited since.
    pub(crate) exited: Vec<u32>,
    /// The sum of every live process's resident set.
    pub(crate) rss: u64,
    /// How many live processes are followed.
    pub(crate) processes: u32,
}

/// What every tick reads of a member, packed (two to a cache line): at
/// hundreds of processes the loop over them is the sampler's whole work.
struct Hot {
    /// `None` when no descriptor was left (`RLIMIT_NOFILE`): read by path.
    statm: Option<File>,
    pid: u32,
    /// Its `statm` text at the tick before, hashed: a change is a move.
    statm_hash: u64,
    /// The largest resident set sampled: a sample above it is a new peak
    /// of the samples, worth a `status` read (its split by kind and its
    /// `VmHWM` at that very sample).
    largest: u64,
}

impl Hot {
    /// Its `statm` now; `None` once it has exited. Without a descriptor,
    /// by path: a pid reused between two ticks would be read as this
    /// process (the run says so, see `TreeSampler::by_path`).
    fn read_statm(&self, page: u64) -> Option<Statm> {
        match &self.statm {
            Some(f) => read_statm(f, page),
            None => read_statm(&File::open(format!("/proc/{}/statm", self.pid)).ok()?, page),
        }
    }
}

/// What only a `status` read, a rescan or the host kinds look at.
struct Cold {
    /// Its `status`, kept open.
    status: StatusFile,
    threads: u32,
    /// Its main thread's `children`, kept open once read.
    children: Option<File>,
    /// The tick of its last `status` read.
    status_tick: u64,
    /// Its resident set by kind at its last `status` read.
    kinds: Option<RssKinds>,
    stale_name: bool,
    /// The process's own name, once its main thread has exited and one of
    /// its other threads is read in its place (whose name may differ).
    leader_name: Option<String>,
}

impl Cold {
    /// Its status now, under its own name when a thread is read in its
    /// place.
    fn read_status(&self, buf: &mut Vec<u8>) -> Option<Box<ProcessStatus>> {
        let mut s = self.status.read(buf)?;
        if let Some(name) = &self.leader_name {
            s.name.clone_from(name);
        }
        Some(Box::new(s))
    }
}

/// The followed processes: two parallel vectors and an index by pid.
#[derive(Default)]
struct Members {
    hot: Vec<Hot>,
    cold: Vec<Cold>,
    index: PidMap<usize>,
}

impl Members {
    fn len(&self) -> usize {
        self.hot.len()
    }

    fn position(&self, pid: u32) -> Option<usize> {
        self.index.get(&pid).copied()
    }

    fn insert(&mut self, hot: Hot, cold: Cold) {
        self.index.insert(hot.pid, self.hot.len());
        self.hot.push(hot);
        self.cold.push(cold);
    }

    /// The descriptors member `i` keeps open.
    fn kept(&self, i: usize) -> usize {
        usize::from(self.hot[i].statm.is_some())
            + usize::from(self.cold[i].status.is_open())
            + usize::from(self.cold[i].children.is_some())
    }

    /// Removes member `i`; the last one takes its place.
    fn swap_remove(&mut self, i: usize) {
        let gone = self.hot.swap_remove(i);
        self.cold.swap_remove(i);
        self.index.remove(&gone.pid);
        if let Some(moved) = self.hot.get(i) {
            self.index.insert(moved.pid, i);
        }
    }
}

/// The run's tree (see the module's description).
pub(crate) struct TreeSampler {
    root: u32,
    walker: TreeWalker,
    members: Members,
    feed: Option<Feed>,
    /// memprobe itself: its other children are not the command's.
    me: u32,
    interval: Duration,
    /// Newcomers not read yet (a tick's budget for them was spent).
    pending: Vec<u32>,
    /// The kernel lists children in `/proc/<pid>/task/<tid>/children`.
    children_files: bool,
    /// Ticks between `status` refreshes of an idle process and of a moving
    /// one, and between walks.
    idle_refresh_every: u64,
    moving_refresh_every: u64,
    rescan_every: u64,
    tick: u64,
    /// The tree's largest summed resident set yet.
    tree_largest: u64,
    page: u64,
    buf: Vec<u8>,
    /// `status` reads done, for the summary of what sampling cost.
    pub(crate) status_reads: u64,
    /// Processes whose `statm` could not be kept open (no descriptor left).
    pub(crate) by_path: u64,
    /// Descriptors this may keep open (see [`fd_budget`]), and kept now.
    fd_budget: usize,
    kept_fds: usize,
}

/// Ticks (of `interval`) in `every`, rounded up, at least one.
pub(crate) fn ticks(every: Duration, interval: Duration) -> u64 {
    let i = interval.as_nanos().max(1);
    u64::try_from(every.as_nanos().div_ceil(i))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Whether `pid`'s staggered slot of a cadence of `every` ticks is `tick`.
fn slot(tick: u64, pid: u32, every: u64) -> bool {
    (tick + u64::from(pid)) % every == 0
}

impl TreeSampler {
    /// The tree rooted at `root`, sampled every `interval`; `feed`: the
    /// process events' births, where they can be had.
    pub(crate) fn new(root: u32, interval: Duration, feed: Option<Feed>) -> TreeSampler {
        let rescan = if feed.is_some() {
            RESCAN_WITH_EVENTS
        } else {
            RESCAN_WITHOUT_EVENTS
        };
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        TreeSampler {
            root,
            walker: TreeWalker::new(root),
            members: Members::default(),
            feed,
            me: std::process::id(),
            interval,
            pending: vec![root],
            children_files: std::path::Path::new("/proc/self/task")
                .join(std::process::id().to_string())
                .join("children")
                .exists(),
            idle_refresh_every: ticks(STATUS_REFRESH_IDLE, interval),
            moving_refresh_every: ticks(STATUS_REFRESH_MOVING, interval),
            rescan_every: ticks(rescan, interval),
            tick: 0,
            tree_largest: 0,
            page: u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096),
            buf: vec![0; 4096],
            status_reads: 0,
            by_path: 0,
            fd_budget: fd_budget(),
            kept_fds: 0,
        }
    }

    /// The interval changed (`--max-cpu`): the cadences in ticks follow.
    pub(crate) fn set_interval(&mut self, interval: Duration) {
        let rescan = if self.feed.is_some() {
            RESCAN_WITH_EVENTS
        } else {
            RESCAN_WITHOUT_EVENTS
        };
        self.interval = interval;
        self.idle_refresh_every = ticks(STATUS_REFRESH_IDLE, interval);
        self.moving_refresh_every = ticks(STATUS_REFRESH_MOVING, interval);
        self.rescan_every = ticks(rescan, interval);
    }

    /// The root.
    pub(crate) fn root(&self) -> u32 {
        self.root
    }

    /// The live processes followed.
    pub(crate) fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.members.hot.iter().map(|h| h.pid)
    }

    /// Whether `pid` is a live process followed.
    pub(crate) fn contains(&self, pid: u32) -> bool {
        self.members.position(pid).is_some()
    }

    /// The tree's resident set by kind, as of each process's last `status`
    /// read; `None` unless every process has one.
    pub(crate) fn kinds(&self) -> Option<RssKinds> {
        let all = self.members.cold.iter().all(|c| c.kinds.is_some());
        all.then(|| host_kinds::sum(self.members.cold.iter().filter_map(|c| c.kinds.as_ref())))
    }

    /// Reads every known process, then the newcomers.
    pub(crate) fn read(&mut self) -> Reading {
        let started = Instant::now();
        let mut reading = Reading::default();
        let fed = self.feed.as_ref().map(Feed::take).unwrap_or_default();
        for pid in fed.renamed {
            if let Some(i) = self.members.position(pid) {
                self.members.cold[i].stale_name = true;
            }
        }
        let (tick, page) = (self.tick, self.page);
        let (idle_refresh, moving_refresh) = (self.idle_refresh_every, self.moving_refresh_every);
        // Staggered: a tick reads a 1/rescan share of the children files.
        let stagger = self.children_files && !fed.lost;
        let rescan = self.rescan_every;
        let mut i = 0;
        while i < self.members.len() {
            let read = self.members.hot[i].read_statm(page);
            let Some(now) = read.or_else(|| self.follow_a_live_thread(i)) else {
                let h = &self.members.hot[i];
                reading.exited.push(h.pid);
                self.walker.forget(h.pid);
                self.kept_fds -= self.members.kept(i);
                // The last member takes this place, and is read next.
                self.members.swap_remove(i);
                continue;
            };
            let h = &mut self.members.hot[i];
            // Moved since the tick before: its high-water mark may have too.
            // Idle: staggered, a tick's refreshes are a 1/idle_refresh share.
            let moved = now.hash != h.statm_hash;
            h.statm_hash = now.hash;
            reading.rss += now.rss;
            let pid = h.pid;
            let c = &mut self.members.cold[i];
            if stagger && slot(tick, pid, rescan) {
                let keep = self.kept_fds < self.fd_budget / 2;
                self.kept_fds += usize::from(read_children(
                    pid,
                    c,
                    keep,
                    &mut self.buf,
                    &mut self.pending,
                ));
            }
            let since = tick.saturating_sub(c.status_tick);
            let due = if moved {
                since >= moving_refresh
            } else {
                slot(tick, pid, idle_refresh) && since > 0
            };
            let read_status = now.rss > h.largest || c.stale_name || due;
            if moved || read_status {
                let status = if read_status {
                    self.status_reads += 1;
                    c.status_tick = tick;
                    c.read_status(&mut self.buf)
                } else {
                    None
                };
                if let Some(s) = &status {
                    c.threads = s.threads;
                    c.stale_name = false;
                    // The text just parsed is still in the buffer.
                    c.kinds = rss_kinds_from_status(&self.buf).or(c.kinds);
                }
                h.largest = h.largest.max(now.rss);
                reading.changed.push((
                    pid,
                    Seen {
                        rss: now.rss,
                        status,
                        kinds: c.kinds,
                    },
                ));
            }
            i += 1;
        }
        let (me, root) = (self.me, self.root);
        self.pending.extend(
            fed.births
                .into_iter()
                .filter(|&(pid, ppid)| pid == root || ppid != me)
                .map(|(pid, _)| pid),
        );
        if !stagger && (self.tick == 0 || fed.lost || self.tick % self.rescan_every == 0) {
            let members = &self.members;
            let tree = self.walker.walk(
                |pid| members.position(pid).map(|i| members.cold[i].threads),
                &mut self.buf,
            );
            self.pending.extend(tree);
        }
        self.take_newcomers(started, &mut reading);
        if reading.rss > self.tree_largest {
            self.tree_largest = reading.rss;
            self.read_moved_status(&mut reading);
        }
        reading.processes = u32::try_from(self.members.len()).unwrap_or(u32::MAX);
        self.tick += 1;
        reading
    }

    /// A member whose main thread has exited while other threads run
    /// (`pthread_exit`): its `statm` reads no memory, but the process lives
    /// on. One of its other threads, which has the same memory, is read in
    /// its place from now on; `None` when none is left (the process has
    /// ended).
    fn follow_a_live_thread(&mut self, i: usize) -> Option<Statm> {
        let pid = self.members.hot[i].pid;
        let (f, task, now) = live_thread(pid, self.page)?;
        let before = self.members.kept(i);
        let (h, c) = (&mut self.members.hot[i], &mut self.members.cold[i]);
        h.statm = Some(f);
        c.status = StatusFile::open_path(pid, &task.join("status"));
        c.children = None;
        if c.leader_name.is_none() {
            c.leader_name = memprobe_core::internal::process::command_name(pid);
        }
        self.kept_fds = self.kept_fds + self.members.kept(i) - before;
        Some(now)
    }

    /// At the tree's largest sample yet: the status of each process that
    /// moved at this tick without one, so that the tree's split by kind
    /// belongs to this very tick (a process that did not move kept its
    /// split).
    fn read_moved_status(&mut self, reading: &mut Reading) {
        for (pid, seen) in reading
            .changed
            .iter_mut()
            .filter(|(_, s)| s.status.is_none())
        {
            let Some(i) = self.members.position(*pid) else {
                continue;
            };
            let c = &mut self.members.cold[i];
            self.status_reads += 1;
            c.status_tick = self.tick;
            seen.status = c.read_status(&mut self.buf);
            if let Some(s) = &seen.status {
                c.threads = s.threads;
                c.stale_name = false;
                c.kinds = rss_kinds_from_status(&self.buf).or(c.kinds);
            }
            seen.kinds = c.kinds;
        }
    }

    /// Reads the pending newcomers, in order, until half the interval has
    /// gone (at least a few each tick, so that a slow machine still makes
    /// progress); the rest wait for the next tick.
    fn take_newcomers(&mut self, started: Instant, reading: &mut Reading) {
        let budget = self.interval / 2;
        let pending = std::mem::take(&mut self.pending);
        let mut left = pending.into_iter().enumerate();
        for (i, pid) in left.by_ref() {
            if self.contains(pid) {
                continue;
            }
            if let Some((hot, cold, seen)) = self.open(pid) {
                reading.rss += seen.rss;
                self.members.insert(hot, cold);
                reading.changed.push((pid, seen));
            }
            if i >= 8 && started.elapsed() > budget {
                break;
            }
        }
        self.pending.extend(left.map(|(_, pid)| pid));
    }

    /// A newcomer: its `statm` kept open and its status read; `None` when
    /// it has exited already or is a zombie.
    fn open(&mut self, pid: u32) -> Option<(Hot, Cold, Seen)> {
        let path = format!("/proc/{pid}/statm");
        let statm = if self.kept_fds < self.fd_budget {
            match File::open(&path) {
                Ok(f) => Some(f),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => None,
                Err(_) => return None,
            }
        } else {
            None
        };
        // Without a descriptor: followed all the same, read by path (see
        // `by_path`).
        let mut hot = Hot {
            statm,
            pid,
            statm_hash: 0,
            largest: 0,
        };
        // A process whose main thread has ended already is read through
        // another of its threads (see `follow_a_live_thread`).
        let (first, task) = match hot.read_statm(self.page) {
            Some(first) => (first, None),
            None => {
                let (f, task, first) = live_thread(pid, self.page)?;
                hot.statm = Some(f);
                (first, Some(task))
            }
        };
        self.status_reads += 1;
        // Read rarely: kept open only while descriptors are plenty.
        let status = match &task {
            Some(t) => StatusFile::open_path(pid, &t.join("status")),
            None if self.kept_fds < self.fd_budget / 2 => StatusFile::open(pid),
            None => StatusFile::by_path(pid),
        };
        let mut s = status.read(&mut self.buf)?;
        // Read through a thread: named as the process, not the thread.
        let leader_name = task
            .as_ref()
            .and_then(|_| memprobe_core::internal::process::command_name(pid));
        if let Some(n) = &leader_name {
            s.name.clone_from(n);
        }
        self.by_path += u64::from(hot.statm.is_none());
        self.kept_fds += usize::from(hot.statm.is_some()) + usize::from(status.is_open());
        let kinds = rss_kinds_from_status(&self.buf);
        hot.statm_hash = first.hash;
        hot.largest = first.rss.max(s.rss);
        let cold = Cold {
            status,
            threads: s.threads,
            children: None,
            status_tick: self.tick,
            stale_name: false,
            leader_name,
            kinds,
        };
        let seen = Seen {
            rss: s.rss,
            status: Some(Box::new(s)),
            kinds,
        };
        Some((hot, cold, seen))
    }
}

/// A live thread of `pid` other than its main one: its `statm` kept open,
/// its `/proc/<pid>/task/<tid>` directory, and what the `statm` reads.
fn live_thread(pid: u32, page: u64) -> Option<(File, std::path::PathBuf, Statm)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks.flatten().find_map(|t| {
        let tid = t.file_name().to_str()?.parse::<u32>().ok()?;
        if tid == pid {
            return None;
        }
        let f = File::open(t.path().join("statm")).ok()?;
        let now = read_statm(&f, page)?;
        Some((f, t.path(), now))
    })
}

/// Descriptors the sampler may keep open: the soft `RLIMIT_NOFILE` (raised
/// to the hard one by `run`, see [`super::fd_limit`]) less a reserve for
/// the rest of memprobe and for the reads by path beyond it.
fn fd_budget() -> usize {
    let Some(l) = super::fd_limit::current() else {
        return 0;
    };
    let limit = usize::try_from(l.rlim_cur).unwrap_or(usize::MAX);
    limit.saturating_sub((limit / 8).max(64))
}

/// Appends the children of member `pid` to `out`: its main thread's
/// `children` through a descriptor kept open (where `keep` allows one) when
/// it has one thread, every thread's otherwise (a child belongs to the
/// thread that forked it). Whether it opened a descriptor to keep.
fn read_children(
    pid: u32,
    m: &mut Cold,
    keep: bool,
    buf: &mut Vec<u8>,
    out: &mut Vec<u32>,
) -> bool {
    let mut opened = false;
    let pids = |text: &[u8], out: &mut Vec<u32>| {
        out.extend(
            text.split(|c| c.is_ascii_whitespace())
                .filter_map(|w| std::str::from_utf8(w).ok()?.parse::<u32>().ok()),
        );
    };
    if m.threads == 1 {
        if m.children.is_none() && keep {
            m.children = File::open(format!("/proc/{pid}/task/{pid}/children")).ok();
            opened = m.children.is_some();
        }
        if let Some(f) = &m.children {
            if buf.len() < 4096 {
                buf.resize(4096, 0);
            }
            if let Ok(n) = f.read_at(buf, 0) {
                // A process with more children than fit gets the listing.
                if n < buf.len() {
                    pids(&buf[..n], out);
                    return opened;
                }
            }
        }
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return opened;
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read(t.path().join("children")) {
            pids(&text, out);
        }
    }
    opened
}

/// What a `statm` read says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Statm {
    /// The resident set, in bytes.
    rss: u64,
    /// The whole text hashed: any field that changes changes it.
    hash: u64,
}

/// A kept-open `statm` (`page`: the page size); `None` once the process
/// has exited (a zombie's reads all zeros: a live process always has a
/// size).
fn read_statm(f: &File, page: u64) -> Option<Statm> {
    let mut buf = [0u8; 128];
    let len = f.read_at(&mut buf, 0).ok()?;
    let text = &buf[..len];
    // size resident shared text lib data dt
    let mut fields = text.trim_ascii_end().split(|&c| c == b' ');
    let size = parse(fields.next()?)?;
    let resident = parse(fields.next()?)?;
    (size > 0).then(|| Statm {
        rss: resident.saturating_mul(page),
        hash: fingerprint(text),
    })
}

/// A fast 64-bit hash of a short text (eight bytes a step). A collision
/// would only skip one `status` refresh.
fn fingerprint(text: &[u8]) -> u64 {
    let mut h = text.len() as u64;
    for chunk in text.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h.rotate_left(29) ^ u64::from_le_bytes(w)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    h
}

fn parse(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |n, &c| {
        c.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(c - b'0')))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn statm_reads_the_resident_set_and_sees_an_end() {
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let f = File::open(format!("/proc/{}/statm", child.id())).unwrap();
        let s = read_statm(&f, 4096).expect("alive");
        assert!(s.rss > 0 && s.rss % 4096 == 0, "{s:?}");
        assert_eq!(read_statm(&f, 4096).map(|t| t.hash), Some(s.hash));
        child.kill().unwrap();
        // A zombie until reaped: no memory.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(read_statm(&f, 4096), None);
        child.wait().unwrap();
        assert_eq!(read_statm(&f, 4096), None);
    }

    #[test]
    fn parse_takes_digits_only() {
        assert_eq!(parse(b"123"), Some(123));
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"12a"), None);
        assert_eq!(parse(b"99999999999999999999999"), None);
    }

    #[test]
    fn cadences_in_ticks() {
        assert_eq!(ticks(STATUS_REFRESH_IDLE, Duration::from_millis(10)), 100);
        assert_eq!(ticks(STATUS_REFRESH_IDLE, Duration::from_secs(1)), 1);
        assert_eq!(ticks(RESCAN_WITHOUT_EVENTS, Duration::from_millis(30)), 2);
    }

    /// Without process events, each member's children are read every
    /// 50 ms, staggered: a worker is found within that.
    #[test]
    fn without_events_children_are_found_by_the_staggered_scan() {
        let mut root = Command::new("sh")
            .args(["-c", "sleep 5 & sleep 5 & wait"])
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let mut t = TreeSampler::new(root.id(), Duration::from_millis(10), None);
        assert_eq!(t.read().processes, 1, "the root, at once");
        for _ in 0..6 {
            t.read();
        }
        assert_eq!(t.members.len(), 3);
        root.kill().unwrap();
        root.wait().unwrap();
    }

    /// A storm of births is read over several ticks, a budget each, rather
    /// than one tick overrunning: every newcomer is followed in the end.
    #[test]
    fn a_storm_of_births_is_spread_over_ticks() {
        let mut kids: Vec<_> = (0..30)
            .map(|_| Command::new("sleep").arg("5").spawn().unwrap())
            .collect();
        let feed = Feed::default();
        // An interval of 2 µs: the budget is spent after the first few.
        let mut t = TreeSampler::new(kids[0].id(), Duration::from_micros(2), Some(feed.clone()));
        for k in &kids[1..] {
            feed.born(k.id(), 1);
        }
        let first = t.read().processes as usize;
        assert!((9..30).contains(&first), "{first} newcomers in one tick");
        for _ in 0..10 {
            t.read();
        }
        assert_eq!(t.members.len(), 30);
        for k in &mut kids {
            k.kill().unwrap();
            k.wait().unwrap();
        }
    }

    /// Births fed as events are read at the next tick without a walk; a
    /// process seen above its peak gets its status read.
    #[test]
    fn fed_births_are_followed_and_new_peaks_read() {
        let mut root = Command::new("sh")
            .args(["-c", "sleep 5 & sleep 5 & wait"])
            .spawn()
            .unwrap();
        let feed = Feed::default();
        let mut t = TreeSampler::new(root.id(), Duration::from_millis(10), Some(feed.clone()));
        let first = t.read();
        assert!(first.changed.iter().all(|(_, s)| s.status.is_some()));
        // Until the children are there, through the walk of tick 0 or later.
        let t0 = std::time::Instant::now();
        while t.members.len() < 3 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
            let children =
                std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", root.id()))
                    .unwrap_or_default();
            for c in children.split_whitespace() {
                feed.born(c.parse().unwrap(), root.id());
            }
            t.read();
        }
        assert_eq!(t.members.len(), 3);
        // Steady and idle: no status reads but the staggered refreshes.
        let before = t.status_reads;
        for _ in 0..100 {
            t.read();
        }
        assert_eq!(t.status_reads - before, 3, "one refresh each per 100 ticks");
        // One whose statm moved since the tick before: a changed record at
        // once, and its status too once the last is 100 ms old.
        let pid = root.id();
        let i = t.members.position(pid).unwrap();
        t.members.hot[i].statm_hash ^= 1;
        t.members.cold[i].status_tick = t.tick - 1;
        let r = t.read();
        let (_, seen) = r.changed.iter().find(|(p, _)| *p == pid).unwrap();
        assert!(seen.status.is_none(), "moved, status read 10 ms ago");
        let i = t.members.position(pid).unwrap();
        t.members.hot[i].statm_hash ^= 1;
        t.members.cold[i].status_tick = t.tick - 10;
        let r = t.read();
        let (_, seen) = r.changed.iter().find(|(p, _)| *p == pid).unwrap();
        assert!(seen.status.is_some(), "moved: status read at this tick");
        // Unmoved, and no refresh due: nothing to update.
        assert!(!t.read().changed.iter().any(|(p, _)| *p == pid));
        // A stale peak: the next read sees a new one and reads status.
        let i = t.members.position(pid).unwrap();
        t.members.hot[i].largest = 0;
        let r = t.read();
        let (_, seen) = r.changed.iter().find(|(p, _)| *p == pid).unwrap();
        assert!(seen.status.is_some());
        root.kill().unwrap();
        root.wait().unwrap();
        let r = t.read();
        assert!(r.exited.contains(&pid));
    }
}
