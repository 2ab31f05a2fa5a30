//! Host memory by kind at each process's and the tree's RAM peak.
//!
//! Two parts, of different fidelity:
//!
//! - **Resident set by kind, at the peak sample**: anonymous, file-backed
//!   and shared memory (`RssAnon`, `RssFile`, `RssShmem`). The sampler
//!   reads a process's `status` at every sample that is its largest yet,
//!   so the split at a process's peak belongs to the `statm` figures of
//!   that very tick; at a sample that is the tree's largest yet, so is
//!   that of every process whose `statm` moved at that tick (one whose
//!   `statm` reads the same kept the same split as far as the kernel's
//!   counters say). Free: no read of its own.
//! - **Sampled detail**: `smaps_rollup` (the PSS by kind) and `smaps`
//!   (the largest mappings, grouped by pathname: `[heap]`, anonymous
//!   memory, `/dev/shm/torch_*` DataLoader buffers, a library), read after
//!   a process sets a new peak. The kernel walks every page table of the
//!   process for these (milliseconds for a process of a few GiB), so they
//!   are rate-limited (at most one per process every [`MIN_GAP`]) and
//!   within a budget of memprobe's CPU ([`BUDGET_SHARE`] of a core, the
//!   reads' own time measured; a read is asked for only once the budget
//!   left covers what that process's last read cost, so that a short run
//!   is not left overdrawn by the read of a process with many mappings):
//!   taken near, not at, the peak; the report
//!   says how far from it (`taken_at_s`). The tree's detail is composed of
//!   its processes' latest ones when the tree sets a peak (again at most
//!   every [`MIN_GAP`]).

use super::pid_map::PidMap;
use serde::Serialize;
use std::fs::File;
use std::io::Read;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The shortest time between two detail reads of one process (and two
/// compositions of the tree's).
pub(crate) const MIN_GAP: Duration = Duration::from_millis(250);
/// The detail reads' share of one core, at most, over the run.
pub(crate) const BUDGET_SHARE: f64 = 0.0005;
/// The most a quiet start lends the reads ahead. A read expected to cost
/// more than this is asked for once this much is saved, and overdraws it:
/// later reads wait until it is paid back.
const BUDGET_CAP: Duration = Duration::from_millis(2);
/// Mappings kept per reading (the rest summed as "others").
pub(crate) const TOP_MAPPINGS: usize = 8;

/// A resident set by kind, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct RssKinds {
    #[serde(rename = "anon_bytes")]
    pub(crate) anon: u64,
    #[serde(rename = "file_bytes")]
    pub(crate) file: u64,
    #[serde(rename = "shmem_bytes")]
    pub(crate) shmem: u64,
}

impl RssKinds {
    fn add(&mut self, o: &RssKinds) {
        self.anon += o.anon;
        self.file += o.file;
        self.shmem += o.shmem;
    }
}

/// `RssAnon`, `RssFile` and `RssShmem` of a `/proc/<pid>/status` text
/// (Linux 4.5 and later); `None` without them. Read at every `status`
/// read of a moving process: it walks the lines only up to `RssShmem`
/// (about the 20th of 55), comparing each line's first bytes.
pub(crate) fn rss_kinds_from_status(text: &[u8]) -> Option<RssKinds> {
    let (mut anon, mut file) = (None, None);
    for line in text.split(|&c| c == b'\n') {
        if line.first() != Some(&b'R') {
            continue;
        }
        if let Some(v) = line.strip_prefix(b"RssAnon:") {
            anon = kib(v);
        } else if let Some(v) = line.strip_prefix(b"RssFile:") {
            file = kib(v);
        } else if let Some(v) = line.strip_prefix(b"RssShmem:") {
            return Some(RssKinds {
                anon: anon?,
                file: file?,
                shmem: kib(v)?,
            });
        }
    }
    None
}

/// "   123 kB" as bytes.
fn kib(v: &[u8]) -> Option<u64> {
    let digits = v.trim_ascii().split(|&c| c == b' ').next()?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits
        .iter()
        .try_fold(0u64, |n, &c| {
            n.checked_mul(10)?.checked_add(u64::from(c - b'0'))
        })?
        .checked_mul(1024)
}

/// The first `key value kB` line's value, bytes.
fn kib_field(text: &[u8], key: &[u8]) -> Option<u64> {
    let at = text.windows(key.len()).position(|w| w == key)?;
    kib(text[at + key.len()..].split(|&c| c == b'\n').next()?)
}

/// Memory of the mappings that share one name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct MappingGroup {
    pub(crate) name: String,
    pub(crate) rss_bytes: u64,
    pub(crate) pss_bytes: u64,
    /// Mappings summed here.
    pub(crate) mappings: u32,
}

/// The PSS by kind (`smaps_rollup`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct PssKinds {
    pub(crate) pss_bytes: u64,
    pub(crate) pss_anon_bytes: u64,
    pub(crate) pss_file_bytes: u64,
    pub(crate) pss_shmem_bytes: u64,
}

/// One sampled detail reading of a process (or the tree's composition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Detail {
    /// When it was taken, ns since the start (the tree's: its oldest
    /// reading, and `newest_ns` its newest).
    pub(crate) taken_ns: u64,
    pub(crate) newest_ns: u64,
    /// The process's resident set when it was asked for: while it reads
    /// the same, the reading stands for the process as it is.
    pub(crate) rss: u64,
    /// `None` where `smaps_rollup` has no PSS by kind (before Linux 5.9).
    pub(crate) pss: Option<PssKinds>,
    /// The largest groups first; the last one "others" when there were more.
    pub(crate) mappings: Vec<MappingGroup>,
}

/// The name a mapping is grouped under: its path (without " (deleted)"),
/// `[heap]`-like names as they are, `[anon]` for nameless ones, and
/// PyTorch's DataLoader shared buffers (`/dev/shm/torch_<pid>_<...>`) as one
/// `/dev/shm/torch_*`.
fn group_name(name: &str) -> &str {
    let name = name.trim();
    let name = name.strip_suffix(" (deleted)").unwrap_or(name);
    if name.is_empty() {
        "[anon]"
    } else if name.starts_with("/dev/shm/torch_") {
        "/dev/shm/torch_*"
    } else {
        name
    }
}

/// The name field of an `smaps` mapping header (`range perms offset dev
/// inode [name]`), `None` for any other line.
fn header_name(line: &[u8]) -> Option<&str> {
    // Headers start with the range's hex digits; fields with a capital.
    if !line
        .first()
        .is_some_and(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    {
        return None;
    }
    let mut rest = std::str::from_utf8(line).ok()?;
    let first = rest.split_ascii_whitespace().next()?;
    if !first.contains('-') || first.ends_with(':') {
        return None;
    }
    for _ in 0..5 {
        rest = rest.trim_start_matches(|c: char| c.is_ascii_whitespace());
        rest = rest.trim_start_matches(|c: char| !c.is_ascii_whitespace());
    }
    Some(rest)
}

/// `key   123 kB` as bytes, where `line` starts with `key`.
fn field_kib(line: &[u8], key: &[u8]) -> Option<u64> {
    kib(line.strip_prefix(key)?)
}

/// Groups the mappings of an `smaps` text by name, largest RSS first, at
/// most [`TOP_MAPPINGS`] (the rest as "others"). Read at every detail
/// read: a name is copied only for a group's first mapping.
pub(crate) fn group_smaps(text: &[u8]) -> Vec<MappingGroup> {
    let mut groups: Vec<MappingGroup> = Vec::new();
    let mut index: std::collections::HashMap<&str, usize> = Default::default();
    let mut current: Option<usize> = None;
    for line in text.split(|&c| c == b'\n') {
        if let Some(name) = header_name(line) {
            let g = group_name(name);
            let i = *index.entry(g).or_insert_with(|| {
                groups.push(MappingGroup {
                    name: g.to_owned(),
                    rss_bytes: 0,
                    pss_bytes: 0,
                    mappings: 0,
                });
                groups.len() - 1
            });
            groups[i].mappings += 1;
            current = Some(i);
        } else if let Some(i) = current {
            if let Some(v) = field_kib(line, b"Rss:") {
                groups[i].rss_bytes += v;
            } else if let Some(v) = field_kib(line, b"Pss:") {
                groups[i].pss_bytes += v;
            }
        }
    }
    top(groups)
}

/// The [`TOP_MAPPINGS`] largest groups, the rest summed as "others".
fn top(mut groups: Vec<MappingGroup>) -> Vec<MappingGroup> {
    groups.retain(|g| g.rss_bytes > 0);
    groups.sort_by(|a, b| b.rss_bytes.cmp(&a.rss_bytes).then(a.name.cmp(&b.name)));
    if groups.len() > TOP_MAPPINGS {
        let rest = groups.split_off(TOP_MAPPINGS - 1);
        groups.push(MappingGroup {
            name: "others".into(),
            rss_bytes: rest.iter().map(|g| g.rss_bytes).sum(),
            pss_bytes: rest.iter().map(|g| g.pss_bytes).sum(),
            mappings: rest.iter().map(|g| g.mappings).sum(),
        });
    }
    groups
}

/// `Pss`, `Pss_Anon`, `Pss_File` and `Pss_Shmem` of an `smaps_rollup` text.
pub(crate) fn pss_kinds(text: &[u8]) -> Option<PssKinds> {
    Some(PssKinds {
        pss_bytes: kib_field(text, b"\nPss:")?,
        pss_anon_bytes: kib_field(text, b"Pss_Anon:")?,
        pss_file_bytes: kib_field(text, b"Pss_File:")?,
        pss_shmem_bytes: kib_field(text, b"Pss_Shmem:")?,
    })
}

/// A process's RAM peak as sampled, with its kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KindsAtPeak {
    /// The sampled peak, bytes, and when (ns since the start).
    pub(crate) rss: u64,
    pub(crate) at_ns: u64,
    /// Its split at that sample (`None`: the kernel gives none).
    pub(crate) kinds: Option<RssKinds>,
    /// The detail read nearest after the peak (or, until one is, the
    /// last one before it).
    pub(crate) detail: Option<Detail>,
    /// For the tree: processes whose detail the composition summed, of
    /// those alive.
    pub(crate) processes: Option<(u32, u32)>,
}

/// The detail readings' cost and what the budget put off.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct KindsCost {
    pub(crate) reads: u64,
    pub(crate) read_ms_total: f64,
    pub(crate) read_ms_max: f64,
    /// Ticks where processes waited for a detail read (due or soon due)
    /// because the budget was spent.
    pub(crate) deferred: u64,
    pub(crate) budget_percent_of_a_core: f64,
}

/// Schedules the detail reads (see the module's description). The reads
/// run on a thread of their own, one at a time: a read of a process of
/// several GiB takes milliseconds, which would make the sampler miss ticks.
#[derive(Debug)]
pub(crate) struct KindsReader {
    /// pid -> when its last detail was asked for (ns since the start).
    last_read: PidMap<u64>,
    /// pid -> what its last read cost, ns of the reading thread's CPU:
    /// what its next one is expected to.
    last_cost: PidMap<u64>,
    /// Processes whose peak is newer than their last detail.
    pending: Vec<u32>,
    /// Budget left, ns of the reading thread's CPU (negative: overdrawn).
    allowance_ns: i64,
    last_tick_ns: u64,
    /// The reading thread: requests (pid, when) out, results back.
    thread: Option<Worker>,
    /// A read is in flight.
    busy: bool,
    /// The budget the read chosen last waits for (0: none waits): until
    /// it is saved, the ticks skip the search for the next read.
    need_ns: i64,
    cost: KindsCost,
    read_ns_total: u64,
    read_ns_max: u64,
}

/// The reading thread's two ends.
#[derive(Debug)]
struct Worker {
    ask: mpsc::Sender<(u32, u64, u64)>,
    done: mpsc::Receiver<Done>,
}

/// One finished read: the pid, its detail (None: it had ended), and the
/// reading thread's CPU time for it.
#[derive(Debug)]
struct Done {
    pid: u32,
    detail: Option<Detail>,
    cpu_ns: u64,
}

impl Default for KindsReader {
    fn default() -> Self {
        KindsReader {
            last_read: PidMap::default(),
            last_cost: PidMap::default(),
            pending: Vec::new(),
            allowance_ns: i64::try_from(BUDGET_CAP.as_nanos()).unwrap_or(i64::MAX),
            last_tick_ns: 0,
            thread: None,
            busy: false,
            need_ns: 0,
            cost: KindsCost::default(),
            read_ns_total: 0,
            read_ns_max: 0,
        }
    }
}

impl KindsReader {
    /// `pid` set a new sampled peak: a detail read is due.
    pub(crate) fn peak(&mut self, pid: u32) {
        if !self.pending.contains(&pid) {
            self.pending.push(pid);
        }
    }

    /// `pid` ended: nothing more can be read of it.
    pub(crate) fn ended(&mut self, pid: u32) {
        self.pending.retain(|&p| p != pid);
        self.last_read.remove(&pid);
        self.last_cost.remove(&pid);
        // It may have been the one waited for.
        self.need_ns = 0;
    }

    /// Takes the details read since the last tick, then asks for the next
    /// one due at `now` within the budget (largest `rss_of` first).
    pub(crate) fn tick(&mut self, now: u64, rss_of: impl Fn(u32) -> u64) -> Vec<(u32, Detail)> {
        let elapsed = now.saturating_sub(self.last_tick_ns);
        self.last_tick_ns = now;
        let earned = (elapsed as f64 * BUDGET_SHARE) as i64;
        let cap = i64::try_from(BUDGET_CAP.as_nanos()).unwrap_or(i64::MAX);
        self.allowance_ns = self.allowance_ns.saturating_add(earned).min(cap);
        let out = self.collect();
        if self.pending.is_empty() || self.busy {
            return out;
        }
        if self.allowance_ns <= 0 || self.allowance_ns < self.need_ns {
            // Whether or not one is due yet: the budget decides first.
            self.cost.deferred += 1;
            return out;
        }
        let gap = u64::try_from(MIN_GAP.as_nanos()).unwrap_or(u64::MAX);
        let due = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                self.last_read
                    .get(p)
                    .map_or(true, |&t| now.saturating_sub(t) >= gap)
            })
            .max_by_key(|(_, &p)| rss_of(p))
            .map(|(i, _)| i);
        let Some(i) = due else {
            return out;
        };
        // The largest waits for its own read to be affordable rather than
        // let smaller ones go first (it would never be read in a busy tree).
        let cost = self.expected_ns(self.pending[i]);
        if !self.affords(cost) {
            let cap = i64::try_from(BUDGET_CAP.as_nanos()).unwrap_or(i64::MAX);
            self.need_ns = i64::try_from(cost).unwrap_or(i64::MAX).min(cap);
            self.cost.deferred += 1;
            return out;
        }
        self.need_ns = 0;
        let pid = self.pending.swap_remove(i);
        if self.ask(pid, now, rss_of(pid)) {
            self.busy = true;
            self.last_read.insert(pid, now);
        }
        out
    }

    /// What a read of `pid` is expected to cost: its last read's, or for
    /// one never read the mean of the reads so far.
    fn expected_ns(&self, pid: u32) -> u64 {
        self.last_cost
            .get(&pid)
            .copied()
            .unwrap_or_else(|| self.read_ns_total / self.cost.reads.max(1))
    }

    /// Whether the budget left covers a read of `cost` ns; one dearer than
    /// all that may be lent goes once that is saved.
    fn affords(&self, cost: u64) -> bool {
        let cap = i64::try_from(BUDGET_CAP.as_nanos()).unwrap_or(i64::MAX);
        let cost = i64::try_from(cost).unwrap_or(i64::MAX);
        self.allowance_ns >= cost.min(cap)
    }

    /// The reads finished since the last call.
    fn collect(&mut self) -> Vec<(u32, Detail)> {
        let mut out = Vec::new();
        let Some(w) = &self.thread else {
            return out;
        };
        for d in w.done.try_iter() {
            self.busy = false;
            self.allowance_ns = self
                .allowance_ns
                .saturating_sub(i64::try_from(d.cpu_ns).unwrap_or(i64::MAX));
            self.read_ns_total += d.cpu_ns;
            self.read_ns_max = self.read_ns_max.max(d.cpu_ns);
            self.cost.reads += 1;
            if self.last_read.contains_key(&d.pid) {
                self.last_cost.insert(d.pid, d.cpu_ns);
            }
            out.extend(d.detail.map(|x| (d.pid, x)));
        }
        out
    }

    /// A reader whose thread is started now: from the sampling thread
    /// before it takes a file table of its own ([`super::own_files`]), so
    /// that the two do not share one.
    pub(crate) fn started() -> KindsReader {
        let mut k = KindsReader::default();
        k.start();
        k
    }

    /// Sends a request to the reading thread (started at the first).
    fn ask(&mut self, pid: u32, now: u64, rss: u64) -> bool {
        self.start()
            && self
                .thread
                .as_ref()
                .is_some_and(|w| w.ask.send((pid, now, rss)).is_ok())
    }

    /// Starts the reading thread unless it runs; whether it runs.
    fn start(&mut self) -> bool {
        if self.thread.is_none() {
            let (req_tx, req_rx) = mpsc::channel::<(u32, u64, u64)>();
            let (done_tx, done_rx) = mpsc::channel::<Done>();
            let started = std::thread::Builder::new()
                .name("memprobe-kinds".into())
                .spawn(move || {
                    let mut buf = Vec::new();
                    // Ends when the sampler drops its sender.
                    for (pid, now, rss) in req_rx {
                        let cpu0 = thread_cpu_ns();
                        let detail = read_detail(pid, now, &mut buf).map(|d| Detail { rss, ..d });
                        let cpu_ns = thread_cpu_ns().saturating_sub(cpu0);
                        if done_tx
                            .send(Done {
                                pid,
                                detail,
                                cpu_ns,
                            })
                            .is_err()
                        {
                            return;
                        }
                    }
                });
            if started.is_err() {
                return false;
            }
            self.thread = Some(Worker {
                ask: req_tx,
                done: done_rx,
            });
        }
        true
    }

    /// Waits up to `timeout` for the read in flight, asking for no other
    /// (the end of the run: a peak's detail asked for at the last ticks is
    /// kept).
    pub(crate) fn settle(&mut self, timeout: Duration) -> Vec<(u32, Detail)> {
        let t = Instant::now();
        let mut out = Vec::new();
        while self.busy && t.elapsed() < timeout {
            out.extend(self.collect());
            if self.busy {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        out
    }

    /// The cost so far.
    pub(crate) fn cost(&self) -> KindsCost {
        KindsCost {
            read_ms_total: self.read_ns_total as f64 / 1e6,
            read_ms_max: self.read_ns_max as f64 / 1e6,
            budget_percent_of_a_core: BUDGET_SHARE * 100.0,
            ..self.cost.clone()
        }
    }
}

/// The calling thread's CPU time, ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// One detail reading of `pid` asked for at `now`; `None` when it has
/// ended.
fn read_detail(pid: u32, now: u64, buf: &mut Vec<u8>) -> Option<Detail> {
    let pss =
        read_into(&format!("/proc/{pid}/smaps_rollup"), buf).and_then(|n| pss_kinds(&buf[..n]));
    let n = read_into(&format!("/proc/{pid}/smaps"), buf)?;
    let mappings = group_smaps(&buf[..n]);
    if mappings.is_empty() {
        return None;
    }
    Some(Detail {
        taken_ns: now,
        newest_ns: now,
        rss: 0,
        pss,
        mappings,
    })
}

/// Reads all of `path` into `buf` (kept for the next read); its length.
fn read_into(path: &str, buf: &mut Vec<u8>) -> Option<usize> {
    buf.clear();
    File::open(path).ok()?.read_to_end(buf).ok()?;
    Some(buf.len())
}

/// The tree's detail for its peak at `peak`: the latest details of its
/// live processes (each with the process's resident set now), summed by
/// mapping name; `processes` (with a detail, alive). A reading of a
/// process whose resident set is the same now as when it was read held
/// across the peak: it counts as taken at the peak.
pub(crate) fn compose<'a>(
    details: impl Iterator<Item = (Option<&'a Detail>, u64)>,
    peak: u64,
) -> (Detail, (u32, u32)) {
    let mut groups: Vec<MappingGroup> = Vec::new();
    let mut index: std::collections::HashMap<&str, usize> = Default::default();
    let mut pss: Option<PssKinds> = Some(PssKinds::default());
    let (mut with, mut alive) = (0u32, 0u32);
    let (mut oldest, mut newest) = (u64::MAX, 0);
    let mut all: Vec<&Detail> = Vec::new();
    for (d, rss) in details {
        alive += 1;
        let Some(d) = d else {
            continue;
        };
        with += 1;
        let (taken, latest) = if d.rss == rss {
            (peak, peak)
        } else {
            (d.taken_ns, d.newest_ns)
        };
        oldest = oldest.min(taken);
        newest = newest.max(latest);
        all.push(d);
        pss = match (pss, d.pss) {
            (Some(mut a), Some(b)) => {
                a.pss_bytes += b.pss_bytes;
                a.pss_anon_bytes += b.pss_anon_bytes;
                a.pss_file_bytes += b.pss_file_bytes;
                a.pss_shmem_bytes += b.pss_shmem_bytes;
                Some(a)
            }
            _ => None,
        };
    }
    for d in &all {
        for m in &d.mappings {
            let i = *index.entry(m.name.as_str()).or_insert_with(|| {
                groups.push(MappingGroup {
                    name: m.name.clone(),
                    rss_bytes: 0,
                    pss_bytes: 0,
                    mappings: 0,
                });
                groups.len() - 1
            });
            groups[i].rss_bytes += m.rss_bytes;
            groups[i].pss_bytes += m.pss_bytes;
            groups[i].mappings += m.mappings;
        }
    }
    // "others" of each process stays one group: sorted with the rest.
    (
        Detail {
            taken_ns: oldest.min(peak),
            newest_ns: newest.max(oldest.min(peak)),
            rss: 0,
            pss: pss.filter(|_| with > 0),
            mappings: top(groups),
        },
        (with, alive),
    )
}

/// The run JSON's `host_kinds_at_peak` (of a process, or the tree).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct KindsReport {
    /// The largest sample, and when.
    pub(crate) rss_bytes: u64,
    pub(crate) at_s: f64,
    /// Its split at that very sample (null where the kernel gives none).
    pub(crate) anon_bytes: Option<u64>,
    pub(crate) file_bytes: Option<u64>,
    pub(crate) shmem_bytes: Option<u64>,
    /// Read near the peak, not at it (null: none could be taken).
    pub(crate) sampled: Option<SampledReport>,
}

/// The sampled part of [`KindsReport`].
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SampledReport {
    /// Seconds from the peak to the reading (negative: before it); for
    /// the tree, its oldest reading, and `latest_at_s` its newest.
    pub(crate) taken_at_s: f64,
    pub(crate) latest_at_s: f64,
    /// For the tree: processes whose reading is summed, of those alive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) processes: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) processes_alive: Option<u32>,
    /// PSS by kind (`smaps_rollup`; null before Linux 5.9).
    pub(crate) pss: Option<PssKinds>,
    /// The largest mappings, grouped by name, largest first.
    pub(crate) mappings: Vec<MappingGroup>,
}

impl KindsReport {
    pub(crate) fn new(k: &KindsAtPeak) -> KindsReport {
        let off = |t: u64| (t as f64 - k.at_ns as f64) / 1e9;
        KindsReport {
            rss_bytes: k.rss,
            at_s: k.at_ns as f64 / 1e9,
            anon_bytes: k.kinds.map(|x| x.anon),
            file_bytes: k.kinds.map(|x| x.file),
            shmem_bytes: k.kinds.map(|x| x.shmem),
            sampled: k.detail.as_ref().map(|d| SampledReport {
                taken_at_s: off(d.taken_ns),
                latest_at_s: off(d.newest_ns),
                processes: k.processes.map(|p| p.0),
                processes_alive: k.processes.map(|p| p.1),
                pss: d.pss,
                mappings: d.mappings.clone(),
            }),
        }
    }

    /// The bytes of the `/dev/shm/torch_*` group, where there is one.
    pub(crate) fn torch_shm(&self) -> Option<u64> {
        self.sampled
            .as_ref()?
            .mappings
            .iter()
            .find(|m| m.name == "/dev/shm/torch_*")
            .map(|m| m.rss_bytes)
    }
}

/// The summary's line: "at the tree's RAM peak 12.3 GiB: anon 9.1 GiB,
/// file 2.0 GiB, shmem 1.2 GiB (/dev/shm/torch_* 1.1 GiB), mappings sampled
/// 40 ms after the peak"; `None` without the split.
pub(crate) fn summary(k: &KindsReport) -> Option<String> {
    use memprobe_core::internal::units;
    let (anon, file, shmem) = (k.anon_bytes?, k.file_bytes?, k.shmem_bytes?);
    let mut line = format!(
        "at the tree's sampled RAM peak {}: anon {}, file {}, shmem {}",
        units::bytes(k.rss_bytes),
        units::bytes(anon),
        units::bytes(file),
        units::bytes(shmem),
    );
    if let Some(torch) = k.torch_shm() {
        line += &format!(" (/dev/shm/torch_* {})", units::bytes(torch));
    }
    if let Some(s) = &k.sampled {
        // The reading farthest from the peak bounds how near they are.
        let far = if s.latest_at_s.abs() > s.taken_at_s.abs() {
            s.latest_at_s
        } else {
            s.taken_at_s
        };
        let ms = (far.abs() * 1e3).round();
        line += &if ms == 0.0 {
            ", mappings sampled at the peak".to_string()
        } else if far > 0.0 {
            format!(", mappings sampled up to {ms} ms after the peak")
        } else {
            format!(", mappings sampled up to {ms} ms before the peak")
        };
    }
    Some(line)
}

/// Sums kinds (the tree's at its peak sample).
pub(crate) fn sum<'a>(kinds: impl Iterator<Item = &'a RssKinds>) -> RssKinds {
    let mut total = RssKinds::default();
    for k in kinds {
        total.add(k);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
Size:                132 kB
Rss:                 100 kB
Pss:                 100 kB
7f0000000000-7f0000100000 rw-s 00000000 00:1a 12                         /dev/shm/torch_123_456_0 (deleted)
Size:               1024 kB
Rss:                1024 kB
Pss:                 512 kB
7f0000200000-7f0000300000 rw-s 00000000 00:1a 13                         /dev/shm/torch_123_789_1
Size:               1024 kB
Rss:                 512 kB
Pss:                 256 kB
7f0000400000-7f0000500000 rw-p 00000000 00:00 0 
Size:               1024 kB
Rss:                 300 kB
Pss:                 300 kB
7f1000000000-7f1000010000 r-xp 00000000 08:01 99                         /usr/lib/libc.so.6
Size:                 64 kB
Rss:                  64 kB
Pss:                   8 kB
VmFlags: rd ex mr mw me sd
";

    #[test]
    fn smaps_groups_by_name_with_torch_buffers_as_one() {
        let g = group_smaps(SMAPS.as_bytes());
        let names: Vec<(&str, u64, u64, u32)> = g
            .iter()
            .map(|m| {
                (
                    m.name.as_str(),
                    m.rss_bytes >> 10,
                    m.pss_bytes >> 10,
                    m.mappings,
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("/dev/shm/torch_*", 1536, 768, 2),
                ("[anon]", 300, 300, 1),
                ("[heap]", 100, 100, 1),
                ("/usr/lib/libc.so.6", 64, 8, 1),
            ]
        );
    }

    #[test]
    fn more_groups_than_kept_end_in_others() {
        let mut text = String::new();
        for i in 0..20u64 {
            text += &format!(
                "{:x}-{:x} r--p 0 08:01 {i} /lib/l{i}.so\nRss: {} kB\nPss: {} kB\n",
                i << 20,
                (i << 20) + 4096,
                i + 1,
                i + 1
            );
        }
        let g = group_smaps(text.as_bytes());
        assert_eq!(g.len(), TOP_MAPPINGS);
        assert_eq!(g[0].name, "/lib/l19.so");
        let last = g.last().unwrap();
        assert_eq!(last.name, "others");
        // Every byte is still there: 1 + 2 + ... + 20 kB.
        assert_eq!(g.iter().map(|m| m.rss_bytes).sum::<u64>(), 210 << 10);
        assert_eq!(last.mappings, 20 - (TOP_MAPPINGS as u32 - 1));
    }

    #[test]
    fn status_and_rollup_kinds() {
        let status = b"Name:\tx\nVmHWM:\t  10 kB\nVmRSS:\t  7 kB\nRssAnon:\t 4 kB\nRssFile:\t 2 kB\nRssShmem:\t 1 kB\n";
        assert_eq!(
            rss_kinds_from_status(status),
            Some(RssKinds {
                anon: 4096,
                file: 2048,
                shmem: 1024
            })
        );
        assert_eq!(rss_kinds_from_status(b"VmRSS:\t 7 kB\n"), None);
        let rollup = b"00400000-7fff [rollup]\nRss: 9 kB\nPss: 8 kB\nPss_Dirty: 1 kB\nPss_Anon: 5 kB\nPss_File: 2 kB\nPss_Shmem: 1 kB\n";
        assert_eq!(
            pss_kinds(rollup),
            Some(PssKinds {
                pss_bytes: 8 << 10,
                pss_anon_bytes: 5 << 10,
                pss_file_bytes: 2 << 10,
                pss_shmem_bytes: 1 << 10,
            })
        );
    }

    /// The real files of this process parse, and the kinds add up to the
    /// resident set the status gives.
    #[test]
    fn this_process_reads() {
        let text = std::fs::read("/proc/self/status").unwrap();
        let k = rss_kinds_from_status(&text).expect("RssAnon and co.");
        let rss = kib_field(&text, b"VmRSS:").unwrap();
        assert_eq!(k.anon + k.file + k.shmem, rss);
        let mut r = KindsReader::default();
        let me = std::process::id();
        r.peak(me);
        let mut got = r.tick(1, |_| 0);
        got.extend(r.settle(Duration::from_secs(5)));
        let (pid, d) = got.pop().expect("a detail");
        assert_eq!(pid, me);
        assert_eq!(d.taken_ns, 1);
        assert!(d
            .mappings
            .iter()
            .any(|m| m.name.contains("[heap]") || m.name == "[anon]"));
        assert_eq!(r.cost().reads, 1);
    }

    /// At most one read per process per MIN_GAP, and none once the budget
    /// is spent until it is earned back.
    #[test]
    fn reads_are_rate_limited_and_budgeted() {
        let mut r = KindsReader::default();
        let me = std::process::id();
        let ms = 1_000_000u64;
        let mut reads = 0;
        let step = |r: &mut KindsReader, now: u64| {
            let mut n = r.tick(now, |_| 0).len();
            n += r.settle(Duration::from_secs(5)).len();
            n
        };
        r.peak(me);
        reads += step(&mut r, 0);
        r.peak(me);
        reads += step(&mut r, 100 * ms);
        assert_eq!(reads, 1, "within MIN_GAP: waits");
        // 200 ms earn 0.1 ms of reading: still overdrawn.
        r.allowance_ns = -300_000;
        reads += step(&mut r, 300 * ms);
        assert_eq!(reads, 1, "out of budget: waits");
        assert!(r.cost().deferred >= 1);
        // 0.05 % of a second earns 0.5 ms of reading: enough for one
        // that costs what this one is taken to have cost.
        r.last_cost.insert(me, 100_000);
        reads += step(&mut r, 1300 * ms);
        assert_eq!(reads, 2);
        assert!(r.pending.is_empty());
    }

    /// A read is asked for only when the budget left covers what the
    /// process's last one cost (a short run ends without an overdraft);
    /// one dearer than all that may be lent goes once that is saved.
    #[test]
    fn a_read_waits_until_its_cost_is_saved() {
        let me = std::process::id();
        let ms = 1_000_000u64;
        let cap = i64::try_from(BUDGET_CAP.as_nanos()).unwrap();
        let mut r = KindsReader::default();
        r.last_read.insert(me, 0);
        r.last_cost.insert(me, 1_500_000);
        r.allowance_ns = 1_000_000;
        r.peak(me);
        // 300 ms earn 0.15 ms: 1.15 ms saved, 1.5 ms expected.
        assert!(r.tick(300 * ms, |_| 0).is_empty());
        assert!(!r.busy, "not asked for");
        assert_eq!(r.pending, [me]);
        assert_eq!(r.cost().deferred, 1);
        assert_eq!(r.need_ns, 1_500_000, "the next ticks wait for it");
        r.tick(400 * ms, |_| 0);
        assert!(!r.busy);
        assert_eq!(r.cost().deferred, 2);
        // 700 ms more earn 0.35 ms: 1.55 ms saved.
        r.tick(1100 * ms, |_| 0);
        assert!(r.busy, "asked for once its cost is saved");
        r.settle(Duration::from_secs(5));
        assert_eq!(r.cost().reads, 1);
        assert!(r.last_cost[&me] > 0, "its cost kept for the next");

        let mut r = KindsReader::default();
        r.last_read.insert(me, 0);
        r.last_cost.insert(me, 3 * u64::try_from(cap).unwrap());
        r.allowance_ns = cap - 1;
        r.peak(me);
        r.tick(250 * ms, |_| 0);
        assert!(r.busy, "dearer than the cap: goes at the cap");
        r.settle(Duration::from_secs(5));
        // Never read before: the mean of the reads so far.
        assert_eq!(r.expected_ns(me + 1), r.read_ns_total);
        assert_eq!(KindsReader::default().expected_ns(me), 0);
    }

    #[test]
    fn the_tree_sums_its_processes_details() {
        let d = |t: u64, rss: u64| Detail {
            taken_ns: t,
            newest_ns: t,
            rss: t,
            pss: Some(PssKinds {
                pss_bytes: rss,
                ..PssKinds::default()
            }),
            mappings: vec![MappingGroup {
                name: "/dev/shm/torch_*".into(),
                rss_bytes: rss,
                pss_bytes: rss / 2,
                mappings: 1,
            }],
        };
        let (a, b) = (d(10, 100), d(20, 50));
        let (tree, n) = compose([(Some(&a), 0), (None, 0), (Some(&b), 0)].into_iter(), 30);
        assert_eq!(n, (2, 3));
        assert_eq!(
            (tree.taken_ns, tree.newest_ns),
            (10, 20),
            "its readings' span"
        );
        assert_eq!(tree.mappings[0].rss_bytes, 150);
        assert_eq!(tree.pss.unwrap().pss_bytes, 150);
        // `a` has not moved since it was read: it held across the peak.
        let (tree, _) = compose([(Some(&a), 10), (Some(&b), 0)].into_iter(), 30);
        assert_eq!((tree.taken_ns, tree.newest_ns), (20, 30));
        let (tree, _) = compose([(Some(&a), 10)].into_iter(), 30);
        assert_eq!((tree.taken_ns, tree.newest_ns), (30, 30));
    }
}
