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
//! - `/proc/<pid>/status` (8× a `statm` read: name, parent, `VmHWM`) is read
//!   when a figure asks for it: at a process's first sight, when a sample
//!   sees it above its known peak (a new peak), when it execs or renames,
//!   at every tick where its `statm` moved since the tick before (so that
//!   the kernel's high-water mark catches a spike that rose and fell
//!   between two samples, as when every tick read it), and every
//!   [`STATUS_REFRESH_IDLE`] while it reads the same (an idle worker),
//!   staggered over processes. Sleeping workers, most of a node's tree,
//!   then cost one `statm` read a tick.

use super::host_kinds::{rss_kinds_from_status, RssKinds};
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
/// How often the tree is walked when every birth comes as an event.
pub(crate) const RESCAN_WITH_EVENTS: Duration = Duration::from_secs(1);
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

/// One process at one tick: its resident set, and its status when it was
/// read at this tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) rss: u64,
    /// Boxed: read at few ticks, and the tick's list stays small.
    pub(crate) status: Option<Box<ProcessStatus>>,
    /// Whether anything of it may have changed since the tick before: its
    /// `statm` moved, or its status was read. An unmoved process's records
    /// need no update (see [`super::recording::Recording::observe`]).
    pub(crate) moved: bool,
    /// Its resident set by kind as of its last `status` read (which is at
    /// this tick whenever `statm` moved; see [`super::host_kinds`]).
    pub(crate) kinds: Option<RssKinds>,
}

/// One tick's reading of the tree.
#[derive(Debug, Default)]
pub(crate) struct Reading {
    /// Every live process followed.
    pub(crate) processes: Vec<(u32, Seen)>,
    /// Processes followed until the last tick that have exited since.
    pub(crate) exited: Vec<u32>,
}

impl Reading {
    /// The sum of the live processes' resident sets.
    pub(crate) fn rss(&self) -> u64 {
        self.processes.iter().map(|(_, s)| s.rss).sum()
    }
}

struct Member {
    statm: File,
    /// Its `statm` figures at the tick before.
    statm_last: Statm,
    /// The largest of `VmHWM` and the resident sets read: a sample above it
    /// is a new peak, worth a `status` read.
    peak: u64,
    threads: u32,
    /// Its main thread's `children`, kept open once read.
    children: Option<File>,
    /// The tick of its last `status` read.
    status_tick: u64,
    /// Its resident set by kind at its last `status` read.
    kinds: Option<RssKinds>,
    stale_name: bool,
}

/// The run's tree (see the module's description).
pub(crate) struct TreeSampler {
    root: u32,
    walker: TreeWalker,
    members: PidMap<Member>,
    feed: Option<Feed>,
    /// memprobe itself: its other children are not the command's.
    me: u32,
    interval: Duration,
    /// Newcomers not read yet (a tick's budget for them was spent).
    pending: Vec<u32>,
    /// The kernel lists children in `/proc/<pid>/task/<tid>/children`.
    children_files: bool,
    /// Ticks between `status` refreshes of an idle process, and between walks.
    idle_refresh_every: u64,
    rescan_every: u64,
    tick: u64,
    page: u64,
    buf: Vec<u8>,
    /// `status` reads done, for the summary of what sampling cost.
    pub(crate) status_reads: u64,
}

fn ticks(every: Duration, interval: Duration) -> u64 {
    let i = interval.as_nanos().max(1);
    u64::try_from(every.as_nanos().div_ceil(i))
        .unwrap_or(u64::MAX)
        .max(1)
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
            members: PidMap::default(),
            feed,
            me: std::process::id(),
            interval,
            pending: vec![root],
            children_files: std::path::Path::new("/proc/self/task")
                .join(std::process::id().to_string())
                .join("children")
                .exists(),
            idle_refresh_every: ticks(STATUS_REFRESH_IDLE, interval),
            rescan_every: ticks(rescan, interval),
            tick: 0,
            page: u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096),
            buf: vec![0; 4096],
            status_reads: 0,
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
        self.rescan_every = ticks(rescan, interval);
    }

    /// The root.
    pub(crate) fn root(&self) -> u32 {
        self.root
    }

    /// Reads every known process, then the newcomers.
    pub(crate) fn read(&mut self) -> Reading {
        let started = Instant::now();
        let mut reading = Reading {
            processes: Vec::with_capacity(self.members.len() + 1),
            exited: Vec::new(),
        };
        let fed = self.feed.as_ref().map(Feed::take).unwrap_or_default();
        for pid in fed.renamed {
            if let Some(m) = self.members.get_mut(&pid) {
                m.stale_name = true;
            }
        }
        let (tick, page) = (self.tick, self.page);
        let idle_refresh = self.idle_refresh_every;
        let buf = &mut self.buf;
        let reads = &mut self.status_reads;
        self.members.retain(|&pid, m| {
            let Some(now) = read_statm(&m.statm) else {
                reading.exited.push(pid);
                return false;
            };
            let rss = now.resident * page;
            // Moved since the tick before: its high-water mark may have too.
            // Idle: staggered, a tick's refreshes are a 1/idle_refresh share.
            let moved = now != m.statm_last;
            m.statm_last = now;
            let due = (tick + u64::from(pid)) % idle_refresh == 0;
            let status = if rss > m.peak || m.stale_name || moved || (due && m.status_tick != tick)
            {
                *reads += 1;
                m.status_tick = tick;
                StatusFile::open(pid).read(buf).map(Box::new)
            } else {
                None
            };
            if let Some(s) = &status {
                m.peak = m.peak.max(s.hwm);
                m.threads = s.threads;
                m.stale_name = false;
                // The text just parsed is still in the buffer.
                m.kinds = rss_kinds_from_status(buf).or(m.kinds);
            }
            m.peak = m.peak.max(rss);
            let kinds = m.kinds;
            let moved = moved || status.is_some();
            reading.processes.push((
                pid,
                Seen {
                    rss,
                    status,
                    moved,
                    kinds,
                },
            ));
            true
        });
        for &pid in &reading.exited {
            self.walker.forget(pid);
        }
        let (me, root) = (self.me, self.root);
        self.pending.extend(
            fed.births
                .into_iter()
                .filter(|&(pid, ppid)| pid == root || ppid != me)
                .map(|(pid, _)| pid),
        );
        if !self.children_files || fed.lost {
            if self.tick == 0 || fed.lost || self.tick % self.rescan_every == 0 {
                let members = &self.members;
                let tree = self
                    .walker
                    .walk(|pid| members.get(&pid).map(|m| m.threads), &mut self.buf);
                self.pending.extend(tree);
            }
        } else {
            // Staggered: a tick reads a 1/rescan share of the children files.
            let every = self.rescan_every;
            for (&pid, m) in self.members.iter_mut() {
                if (tick + u64::from(pid)) % every == 0 {
                    read_children(pid, m, &mut self.buf, &mut self.pending);
                }
            }
        }
        self.take_newcomers(started, &mut reading);
        self.tick += 1;
        reading
    }

    /// Reads the pending newcomers, in order, until half the interval has
    /// gone (at least a few each tick, so that a slow machine still makes
    /// progress); the rest wait for the next tick.
    fn take_newcomers(&mut self, started: Instant, reading: &mut Reading) {
        let budget = self.interval / 2;
        let pending = std::mem::take(&mut self.pending);
        let mut left = pending.into_iter().enumerate();
        for (i, pid) in left.by_ref() {
            if self.members.contains_key(&pid) {
                continue;
            }
            if let Some((m, seen)) = self.open(pid) {
                self.members.insert(pid, m);
                reading.processes.push((pid, seen));
            }
            if i >= 8 && started.elapsed() > budget {
                break;
            }
        }
        self.pending.extend(left.map(|(_, pid)| pid));
    }

    /// A newcomer: its `statm` kept open and its status read; `None` when
    /// it has exited already or is a zombie.
    fn open(&mut self, pid: u32) -> Option<(Member, Seen)> {
        let statm = File::open(format!("/proc/{pid}/statm")).ok()?;
        let statm_last = read_statm(&statm)?;
        self.status_reads += 1;
        let s = StatusFile::open(pid).read(&mut self.buf)?;
        let kinds = rss_kinds_from_status(&self.buf);
        let m = Member {
            statm,
            statm_last,
            peak: s.hwm.max(s.rss),
            threads: s.threads,
            children: None,
            status_tick: self.tick,
            stale_name: false,
            kinds,
        };
        Some((
            m,
            Seen {
                rss: s.rss,
                status: Some(Box::new(s)),
                moved: true,
                kinds,
            },
        ))
    }
}

/// Appends the children of member `pid` to `out`: its main thread's
/// `children` through a descriptor kept open when it has one thread, every
/// thread's otherwise (a child belongs to the thread that forked it).
fn read_children(pid: u32, m: &mut Member, buf: &mut Vec<u8>, out: &mut Vec<u32>) {
    let pids = |text: &[u8], out: &mut Vec<u32>| {
        out.extend(
            text.split(|c| c.is_ascii_whitespace())
                .filter_map(|w| std::str::from_utf8(w).ok()?.parse::<u32>().ok()),
        );
    };
    if m.threads == 1 {
        if m.children.is_none() {
            m.children = File::open(format!("/proc/{pid}/task/{pid}/children")).ok();
        }
        if let Some(f) = &m.children {
            if buf.len() < 4096 {
                buf.resize(4096, 0);
            }
            if let Ok(n) = f.read_at(buf, 0) {
                // A process with more children than fit gets the listing.
                if n < buf.len() {
                    pids(&buf[..n], out);
                    return;
                }
            }
        }
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read(t.path().join("children")) {
            pids(&text, out);
        }
    }
}

/// What a `statm` read says, in pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Statm {
    size: u64,
    resident: u64,
    shared: u64,
    data: u64,
}

/// A kept-open `statm`; `None` once the process has exited (a zombie's
/// reads all zeros: a live process always has a size).
fn read_statm(f: &File) -> Option<Statm> {
    let mut buf = [0u8; 128];
    let len = f.read_at(&mut buf, 0).ok()?;
    // size resident shared text lib data dt
    let mut fields = buf[..len].trim_ascii_end().split(|&c| c == b' ');
    let mut next = || parse(fields.next()?);
    let (size, resident, shared, _text, _lib, data) =
        (next()?, next()?, next()?, next()?, next()?, next()?);
    (size > 0).then_some(Statm {
        size,
        resident,
        shared,
        data,
    })
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
        let s = read_statm(&f).expect("alive");
        assert!(
            s.resident > 0 && s.size >= s.resident && s.data > 0,
            "{s:?}"
        );
        child.kill().unwrap();
        // A zombie until reaped: no memory.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(read_statm(&f), None);
        child.wait().unwrap();
        assert_eq!(read_statm(&f), None);
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
        assert_eq!(t.read().processes.len(), 1, "the root, at once");
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
        let first = t.read().processes.len();
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
        assert!(first.processes.iter().all(|(_, s)| s.status.is_some()));
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
        // One whose statm moved since the tick before is read at once.
        let pid = root.id();
        t.members.get_mut(&pid).unwrap().statm_last.resident += 1;
        let r = t.read();
        let (_, seen) = r.processes.iter().find(|(p, _)| *p == pid).unwrap();
        assert!(seen.status.is_some(), "moved: status read at this tick");
        // A stale peak: the next read sees a new one and reads status.
        t.members.get_mut(&pid).unwrap().peak = 0;
        let r = t.read();
        let (_, seen) = r.processes.iter().find(|(p, _)| *p == pid).unwrap();
        assert!(seen.status.is_some());
        root.kill().unwrap();
        root.wait().unwrap();
        let r = t.read();
        assert!(r.exited.contains(&pid));
    }
}
