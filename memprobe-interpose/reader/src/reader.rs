//! Reading the interposer's counters: in this process, or in another one
//! through its region file; marks (one reader's high-water marks); finding and
//! reclaiming the regions of processes that ended.

use crate::layout::{
    Layout, COUNTERS, FLAG_COUNTING, FLAG_EXITED, FLAG_SHARED, HOST_PINNED, LAYOUT_SIZE,
    MAX_DEVICES,
};
use crate::liveness;
use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

/// The environment variable naming the directory of region files.
pub const DIR_ENV: &str = "MEMPROBE_GPU_EXACT_DIR";

/// The environment variable that switches counting off (`off`, `0`, `false`,
/// `no`) while the interposer stays loaded.
pub const SWITCH_ENV: &str = "MEMPROBE_GPU_EXACT";

/// The symbol the interposer exports for in-process readers: returns its
/// region, or NULL when counting is off.
pub const REGION_SYMBOL: &str = "memprobe_interpose_region";

/// Why counters cannot be read.
#[derive(Debug)]
pub enum Error {
    /// The interposer is not loaded in this process.
    NotLoaded,
    /// The interposer is loaded with counting switched off
    /// (`MEMPROBE_GPU_EXACT=off`).
    Disabled,
    /// No region file for this process (not interposed, or reclaimed).
    NotFound(PathBuf),
    /// The region is not one this reader understands.
    Invalid(String),
    /// Every mark slot is held by a live reader.
    NoFreeMark,
    /// A system call failed.
    Io(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotLoaded => f.write_str(
                "the GPU interposer (libmemprobe_interpose.so) is not loaded in this process",
            ),
            Error::Disabled => write!(f, "the GPU interposer is loaded but {SWITCH_ENV}=off"),
            Error::NotFound(p) => write!(f, "no GPU counter region at {}", p.display()),
            Error::Invalid(why) => f.write_str(why),
            Error::NoFreeMark => write!(
                f,
                "all {} high-water mark slots of the region are held by live readers",
                crate::layout::MAX_MARKS
            ),
            Error::Io(e) => write!(f, "GPU counter region: {e}"),
        }
    }
}

impl std::error::Error for Error {}

/// A counter: one device (CUDA ordinal as the counted process numbers it) or
/// pinned host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Device memory of CUDA device `n`.
    Device(u32),
    /// Page-locked host memory (`cuMemHostAlloc`, `cuMemAllocHost`,
    /// `cuMemHostRegister`, VMM allocations located on the host).
    HostPinned,
}

impl Counter {
    /// The block index in the layout; `None` for a device beyond the range.
    pub fn index(self) -> Option<usize> {
        match self {
            Counter::Device(d) if (d as usize) < MAX_DEVICES => Some(d as usize),
            Counter::Device(_) => None,
            Counter::HostPinned => Some(HOST_PINNED),
        }
    }

    /// The counter of block `index`.
    pub fn from_index(index: usize) -> Option<Counter> {
        match index {
            i if i < MAX_DEVICES => Some(Counter::Device(i as u32)),
            HOST_PINNED => Some(Counter::HostPinned),
            _ => None,
        }
    }
}

/// One counter's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    /// Bytes held now.
    pub current: u64,
    /// The highest `current` since the process started.
    pub lifetime_peak: u64,
    /// Allocations that failed with `CUDA_ERROR_OUT_OF_MEMORY`.
    pub failures: u64,
    /// The size asked for in the last of them.
    pub last_failure_size: u64,
}

/// What passed through uncounted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotCounted {
    /// Successful allocations not counted (no current context, ordinal beyond
    /// 64, pointer table full, size not derivable).
    pub calls: u64,
    /// Their bytes, where known.
    pub bytes: u64,
    /// Frees of pointers or handles never counted.
    pub untracked_frees: u64,
}

/// The last out-of-memory failure of an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oom {
    /// Where the allocation was asked for.
    pub counter: Counter,
    /// The size asked for.
    pub size: u64,
    /// Out-of-memory failures so far (all counters).
    pub events: u64,
    /// The entry point that failed (`cuMemAlloc_v2`, ...), when recorded.
    pub api: Option<&'static str>,
    /// When it failed (`CLOCK_MONOTONIC` nanoseconds), when recorded.
    pub at_ns: Option<u64>,
}

/// A process's counter region, mapped for reading (and for claiming marks).
/// Cheap to share: hand out `Arc<Region>`.
#[derive(Debug)]
pub struct Region {
    layout: NonNull<Layout>,
    /// Unmapped on drop (a file mapping); the in-process region belongs to
    /// the interposer and stays.
    owned: bool,
}

// SAFETY: the layout is made of atomics only, shared by design.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: the mapping was made by `open_path` with this length
            // and nothing else refers to it once the last `Arc` is gone.
            unsafe {
                libc::munmap(self.layout.as_ptr().cast(), LAYOUT_SIZE);
            }
        }
    }
}

type RegionFn = unsafe extern "C" fn() -> *mut Layout;

impl Region {
    /// This process's region, when the interposer is loaded here.
    pub fn in_process() -> Result<Arc<Region>, Error> {
        let name = CString::new(REGION_SYMBOL).expect("no NUL in the symbol name");
        // SAFETY: a plain symbol lookup in the global scope.
        let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        if sym.is_null() {
            return Err(Error::NotLoaded);
        }
        // SAFETY: the interposer exports this name with this signature.
        let f: RegionFn = unsafe { std::mem::transmute::<*mut libc::c_void, RegionFn>(sym) };
        // SAFETY: the function takes no argument and only reads statics.
        let ptr = unsafe { f() };
        let layout = NonNull::new(ptr).ok_or(Error::Disabled)?;
        let region = Region {
            layout,
            owned: false,
        };
        region.layout().validate().map_err(Error::Invalid)?;
        Ok(Arc::new(region))
    }

    /// The region of process `pid` in the default directory ([`default_dir`]).
    pub fn open(pid: u32) -> Result<Arc<Region>, Error> {
        Region::open_path(&region_path(&default_dir(), pid))
    }

    /// The region file at `path`.
    pub fn open_path(path: &Path) -> Result<Arc<Region>, Error> {
        let region = Region::map_unchecked(path)?;
        region
            .layout()
            .validate()
            .map_err(|why| Error::Invalid(format!("{}: {why}", path.display())))?;
        Ok(region)
    }

    /// Maps the file at `path` (at least a region long) without looking at
    /// its contents.
    pub(crate) fn map_unchecked(path: &Path) -> Result<Arc<Region>, Error> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| Error::Invalid(format!("path {} holds a NUL", path.display())))?;
        // SAFETY: `c` is NUL-terminated; the descriptor is closed below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(if e.kind() == io::ErrorKind::NotFound {
                Error::NotFound(path.to_owned())
            } else {
                Error::Io(e)
            });
        }
        // SAFETY: `st` is written by fstat; `fd` is open.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: closing our descriptor.
            unsafe { libc::close(fd) };
            return Err(Error::Io(e));
        }
        if (st.st_size as u64) < LAYOUT_SIZE as u64 {
            // SAFETY: closing our descriptor.
            unsafe { libc::close(fd) };
            return Err(Error::Invalid(format!(
                "{}: {} bytes, smaller than a counter region ({LAYOUT_SIZE})",
                path.display(),
                st.st_size
            )));
        }
        // SAFETY: mapping LAYOUT_SIZE bytes of a file at least that long.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LAYOUT_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        let e = io::Error::last_os_error();
        // SAFETY: the mapping stays valid after its descriptor is closed.
        unsafe { libc::close(fd) };
        if p == libc::MAP_FAILED {
            return Err(Error::Io(e));
        }
        Ok(Arc::new(Region {
            layout: NonNull::new(p.cast()).expect("mmap never maps at 0"),
            owned: true,
        }))
    }

    /// The shared layout (for readers that need a field this API lacks).
    pub fn layout(&self) -> &Layout {
        // SAFETY: mapped for the lifetime of `self`; only atomics inside.
        unsafe { self.layout.as_ref() }
    }

    /// The process the counts belong to.
    pub fn pid(&self) -> u32 {
        self.layout().header.pid.load(SeqCst)
    }

    /// Whether the interposer counts in that process.
    pub fn counting(&self) -> bool {
        self.layout().header.flags.load(SeqCst) & FLAG_COUNTING != 0
    }

    /// Whether the region is a file other processes can map.
    pub fn shared(&self) -> bool {
        self.layout().header.flags.load(SeqCst) & FLAG_SHARED != 0
    }

    /// Whether the process ran its exit handlers (its counts are final).
    pub fn exited(&self) -> bool {
        self.layout().header.flags.load(SeqCst) & FLAG_EXITED != 0
    }

    /// Whether the process still runs (the same one: pid reuse is detected).
    pub fn alive(&self) -> bool {
        let h = &self.layout().header;
        liveness::alive(h.pid.load(SeqCst), h.start_time.load(SeqCst))
    }

    /// Counters that ever counted something (or saw an out-of-memory).
    pub fn counters_seen(&self) -> Vec<Counter> {
        (0..COUNTERS)
            .filter(|&i| self.layout().counters[i].seen.load(SeqCst) != 0)
            .filter_map(Counter::from_index)
            .collect()
    }

    /// One counter's figures (zeros for a device beyond the range).
    pub fn read(&self, counter: Counter) -> Reading {
        let Some(i) = counter.index() else {
            return Reading::default();
        };
        let c = &self.layout().counters[i];
        Reading {
            current: c.current.load(SeqCst),
            lifetime_peak: c.lifetime_peak.load(SeqCst),
            failures: c.failures.load(SeqCst),
            last_failure_size: c.last_failure_size.load(SeqCst),
        }
    }

    /// Bytes held now on `counter`.
    pub fn current(&self, counter: Counter) -> u64 {
        self.read(counter).current
    }

    /// What passed through uncounted.
    pub fn not_counted(&self) -> NotCounted {
        let h = &self.layout().header;
        NotCounted {
            calls: h.not_counted_calls.load(SeqCst),
            bytes: h.not_counted_bytes.load(SeqCst),
            untracked_frees: h.untracked_frees.load(SeqCst),
        }
    }

    /// The last allocation that failed with out-of-memory, if any.
    pub fn last_oom(&self) -> Option<Oom> {
        let h = &self.layout().header;
        let events = h.oom_events.load(SeqCst);
        if events == 0 {
            return None;
        }
        Some(Oom {
            counter: Counter::from_index(h.last_oom_counter.load(SeqCst) as usize)?,
            size: h.last_oom_size.load(SeqCst),
            events,
            api: crate::layout::OOM_APIS
                .get(h.last_oom_api.load(SeqCst) as usize)
                .copied()
                .filter(|n| !n.is_empty()),
            at_ns: Some(h.last_oom_at_ns.load(SeqCst)).filter(|&t| t != 0),
        })
    }

    /// Whether the writer names the origin of what it counts
    /// ([`crate::origins`]).
    pub fn keeps_origins(&self) -> bool {
        self.layout().header.flags.load(SeqCst) & crate::layout::FLAG_ORIGINS != 0
    }

    /// The origins named so far in that process.
    pub fn origins(&self) -> Vec<crate::origins::Origin> {
        self.layout().origins()
    }

    /// The bytes held now on `counter`, by origin, largest first.
    pub fn live_by_origin(&self, counter: Counter) -> Vec<crate::origins::OriginBytes> {
        counter
            .index()
            .map_or_else(Vec::new, |i| self.layout().live_by_origin(i))
    }

    /// The bytes by origin at `counter`'s lifetime peak (`None` before
    /// anything was counted there with its origin).
    pub fn peak_origins(&self, counter: Counter) -> Option<crate::origins::PeakOrigins> {
        self.layout().peak_origins(counter.index()?)
    }

    /// What was live by origin on the counter of the last allocation that
    /// failed with out-of-memory, when it failed (`peak`: what that counter
    /// held then), and that counter; `None` before any failure (or without
    /// origins).
    pub fn oom_origins(&self) -> Option<(Counter, crate::origins::PeakOrigins)> {
        let (i, b) = self.layout().oom_origins()?;
        Some((Counter::from_index(i)?, b))
    }

    /// Frames kept per call path (`MEMPROBE_GPU_ORIGINS=stacks[:N]`); 0
    /// when the writer keeps no paths ([`crate::stacks`]).
    pub fn stack_depth(&self) -> usize {
        self.layout().stack_depth()
    }

    /// The bytes held now on `counter`, by call path, largest first.
    pub fn live_by_stack(&self, counter: Counter) -> Vec<crate::stacks::StackBytes> {
        counter
            .index()
            .map_or_else(Vec::new, |i| self.layout().live_by_stack(i))
    }

    /// The bytes by call path at `counter`'s lifetime peak (`None` before
    /// anything was counted there with its path).
    pub fn peak_stacks(&self, counter: Counter) -> Option<crate::stacks::PeakStacks> {
        self.layout().peak_stacks(counter.index()?)
    }

    /// The bytes by call path at the last out-of-memory failure, on the
    /// counter [`Region::oom_origins`] names.
    pub fn oom_stacks(&self) -> Option<crate::stacks::PeakStacks> {
        self.layout().oom_stacks()
    }

    /// Claims a high-water mark of this reader's own: it starts at the
    /// current bytes of every counter and only this reader resets it.
    pub fn mark(self: &Arc<Self>) -> Result<Mark, Error> {
        let me = std::process::id();
        let slot = self
            .layout()
            .claim_mark(me, liveness::start_time(me))
            .ok_or(Error::NoFreeMark)?;
        Ok(Mark {
            region: Arc::clone(self),
            slot,
            owner: me,
        })
    }
}

/// One reader's high-water marks over every counter of a region, independent
/// of every other reader's (in this process or another). Released on drop
/// by the process that claimed it only: a forked child that inherited it
/// (its slot is the parent's, in a mapping the child shares) must claim a
/// mark of its own ([`Mark::inherited`]) and leaves the parent's alone.
#[derive(Debug)]
pub struct Mark {
    region: Arc<Region>,
    slot: usize,
    /// The process that claimed the slot.
    owner: u32,
}

impl Mark {
    /// The region the mark belongs to.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// The slot this mark holds (0..32).
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Whether this process did not claim the mark: a forked child's copy
    /// of its parent's. Reading or taking it would read or restart the
    /// parent's peaks.
    pub fn inherited(&self) -> bool {
        std::process::id() != self.owner
    }

    /// The highest bytes held on `counter` since the mark was claimed or
    /// last reset.
    pub fn peak(&self, counter: Counter) -> u64 {
        counter
            .index()
            .map_or(0, |i| self.region.layout().mark_peak(self.slot, i))
    }

    /// Returns the peak on `counter` and restarts it from the current bytes,
    /// in one step (the fold-and-reset of a window boundary).
    pub fn take(&self, counter: Counter) -> u64 {
        counter
            .index()
            .map_or(0, |i| self.region.layout().take_mark(self.slot, i))
    }

    /// Restarts every counter's peak from its current bytes.
    pub fn reset(&self) {
        for i in 0..COUNTERS {
            self.region.layout().take_mark(self.slot, i);
        }
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        // A forked child's copy: the slot is still its parent's.
        if !self.inherited() {
            self.region.layout().release_mark(self.slot);
        }
    }
}

/// The directory of region files: `$MEMPROBE_GPU_EXACT_DIR`, else
/// `/dev/shm/memprobe-gpu-<uid>`.
pub fn default_dir() -> PathBuf {
    match std::env::var_os(DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        // SAFETY: getuid cannot fail.
        _ => PathBuf::from(format!("/dev/shm/memprobe-gpu-{}", unsafe {
            libc::getuid()
        })),
    }
}

/// The region file of process `pid` in `dir`.
pub fn region_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(pid.to_string())
}

/// A region file found in a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The process it counts for.
    pub pid: u32,
    /// The file.
    pub path: PathBuf,
    /// Whether that process (the same one, not a pid reuse) still runs.
    pub alive: bool,
}

/// The region files in `dir` (a missing directory holds none).
pub fn processes(dir: &Path) -> io::Result<Vec<Entry>> {
    let read = match std::fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in read {
        let entry = entry?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let path = entry.path();
        let alive = match Region::open_path(&path) {
            Ok(r) => r.pid() == pid && r.alive(),
            Err(_) => liveness::alive(pid, 0),
        };
        out.push(Entry { pid, path, alive });
    }
    out.sort_by_key(|e| e.pid);
    Ok(out)
}
