//! This process's counter region: a file `<dir>/<pid>` mapped shared (dir:
//! `$MEMPROBE_GPU_EXACT_DIR`, else `/dev/shm/memprobe-gpu-<uid>`, mode 0700),
//! else anonymous memory (in-process readers only). Made when the process
//! first touches the driver through the interposer (or a reader asks), so a
//! process that never uses CUDA leaves no file; a forked child gets a region
//! of its own the same way.
//!
//! In a directory with a tree region (`<dir>/tree`, made by `memprobe run
//! --gpu-exact`; see `memprobe_interpose_reader::tree_counter`) every count also goes to the
//! tree's counter, mapped when the library loads and inherited across fork.

use shm::layout::{
    Layout, FLAG_COUNTING, FLAG_EXITED, FLAG_ORIGINS, FLAG_SHARED, LAYOUT_SIZE, MAGIC,
};
use std::ffi::CString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering::*};
use std::sync::OnceLock;

static REGION: AtomicPtr<Layout> = AtomicPtr::new(ptr::null_mut());
static TREE: AtomicPtr<Layout> = AtomicPtr::new(ptr::null_mut());
static STATE: AtomicU32 = AtomicU32::new(UNINIT);
static CREATING: AtomicBool = AtomicBool::new(false);
static DIR: OnceLock<Option<CString>> = OnceLock::new();

const UNINIT: u32 = 0;
const STARTING: u32 = 1;
const READY: u32 = 2;
const OFF: u32 = 3;

/// The region, when counting (made on first use).
#[inline]
pub(crate) fn get() -> Option<&'static Layout> {
    let p = REGION.load(Acquire);
    if p.is_null() {
        return make();
    }
    // SAFETY: a region is never unmapped once published.
    Some(unsafe { &*p })
}

#[cold]
fn make() -> Option<&'static Layout> {
    if STATE.load(Acquire) == UNINIT {
        init();
    }
    if STATE.load(Acquire) != READY {
        return None;
    }
    // One thread makes it; the others wait for it (system calls only).
    while CREATING.swap(true, AcqRel) {
        if !REGION.load(Acquire).is_null() {
            break;
        }
        std::thread::yield_now();
    }
    if REGION.load(Acquire).is_null() {
        let dir = DIR.get_or_init(prepare_dir);
        if let Some(dir) = dir {
            // Regions of processes that ended and that no live reader holds.
            let path = std::path::Path::new(std::ffi::OsStr::from_bytes(dir.to_bytes()));
            let _ = shm::reclaim_dead(path);
        }
        // SAFETY: getpid cannot fail.
        let pid = unsafe { libc::getpid() } as u32;
        REGION.store(create(dir.as_ref(), pid), Release);
    }
    CREATING.store(false, Release);
    // SAFETY: as in `get`.
    unsafe { REGION.load(Acquire).as_ref() }
}

/// The tree's counter, when this process belongs to a run that keeps one.
#[inline]
fn tree() -> Option<&'static Layout> {
    // SAFETY: the tree mapping is never unmapped once published.
    unsafe { TREE.load(Acquire).as_ref() }
}

/// Counts `bytes` more on counter `c` for origin slot `o` and stack slot
/// `s`: this process's (by origin and path) and its tree's.
#[inline]
pub(crate) fn add(l: &Layout, o: usize, s: usize, c: usize, bytes: u64) {
    l.add_from_at(o, s, c, bytes);
    if let Some(t) = tree() {
        t.add(c, bytes);
    }
}

/// Counts `bytes` fewer on counter `c` for origin slot `o` and stack slot
/// `s`: this process's and its tree's.
#[inline]
pub(crate) fn sub(l: &Layout, o: usize, s: usize, c: usize, bytes: u64) {
    l.sub_from_at(o, s, c, bytes);
    if let Some(t) = tree() {
        t.sub(c, bytes);
    }
}

/// Whether the interposer counts (and so hands out wrappers).
pub(crate) fn counting() -> bool {
    get().is_some()
}

/// The region pointer for in-process readers (null when off).
pub(crate) fn raw() -> *mut Layout {
    get().map_or(ptr::null_mut(), |l| l as *const Layout as *mut Layout)
}

fn switched_off() -> bool {
    // SAFETY: a NUL-terminated name; the value is read at once.
    let v = unsafe { libc::getenv(c"MEMPROBE_GPU_EXACT".as_ptr()) };
    if v.is_null() {
        return false;
    }
    // SAFETY: getenv returns a NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes();
    matches!(
        v.to_ascii_lowercase().as_slice(),
        b"off" | b"0" | b"false" | b"no" | b"disabled"
    )
}

/// Sets the region up (once; later calls return at once).
pub(crate) fn init() {
    if STATE
        .compare_exchange(UNINIT, STARTING, AcqRel, Acquire)
        .is_err()
    {
        return;
    }
    if switched_off() {
        STATE.store(OFF, Release);
        return;
    }
    let _ = crate::real::real_dlsym();
    // A run's directory (named in the environment) may keep a tree counter.
    // SAFETY: a NUL-terminated name; only whether it is set is used.
    if !unsafe { libc::getenv(c"MEMPROBE_GPU_EXACT_DIR".as_ptr()) }.is_null() {
        if let Some(dir) = DIR.get_or_init(prepare_dir) {
            map_tree(dir);
            if tree().is_some() {
                settle_previous_image(dir);
            }
        }
    }
    STATE.store(READY, Release);
    // SAFETY: registering plain extern "C" handlers.
    unsafe {
        libc::pthread_atfork(None, None, Some(crate::in_child));
        libc::atexit(at_exit);
    }
}

/// The directory, created 0700 if missing; `None` if it is not a private
/// directory of this user (then the region is anonymous).
fn prepare_dir() -> Option<CString> {
    let dir = shm::default_dir();
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: a NUL-terminated path.
    unsafe { libc::mkdir(c.as_ptr(), 0o700) };
    // SAFETY: `st` is written by lstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::lstat(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let private =
        st.st_mode & libc::S_IFMT == libc::S_IFDIR && st.st_uid == uid && st.st_mode & 0o077 == 0;
    private.then_some(c)
}

/// After an `exec`: what the old image held went with it, so it leaves the
/// tree's count now, even if this image never uses the driver.
fn settle_previous_image(dir: &CString) {
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let mut path = dir.as_bytes().to_vec();
    path.push(b'/');
    path.extend_from_slice(pid.to_string().as_bytes());
    let path = std::path::PathBuf::from(std::ffi::OsString::from_vec(path));
    let Ok(region) = shm::Region::open_path(&path) else {
        return;
    };
    let l = region.layout();
    if l.header.pid.load(SeqCst) != pid
        || l.header.start_time.load(SeqCst) != shm::liveness::start_time(pid)
    {
        return;
    }
    if let Some(t) = tree() {
        shm::tree_counter::settle(t, l);
    }
    for c in &l.counters {
        c.current.store(0, SeqCst);
    }
    l.header
        .flags
        .fetch_and(!shm::tree_counter::FLAG_TREE_SETTLED, SeqCst);
}

/// Maps `<dir>/tree` when a run made one (never creates it).
fn map_tree(dir: &CString) {
    let mut path = dir.as_bytes().to_vec();
    path.extend_from_slice(b"/tree\0");
    // SAFETY: `path` is NUL-terminated; the descriptor is closed below.
    let fd = unsafe {
        libc::open(
            path.as_ptr().cast(),
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return;
    }
    // SAFETY: `st` is written by fstat; `fd` is ours.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let big_enough =
        unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_size as u64 >= LAYOUT_SIZE as u64;
    let Some(l) = map_and_close(fd, big_enough) else {
        return;
    };
    // SAFETY: mapped, LAYOUT_SIZE bytes, atomics only.
    if unsafe { &*l }.validate().is_ok() {
        TREE.store(l, Release);
    } else {
        // SAFETY: our mapping, unused.
        unsafe { libc::munmap(l.cast(), LAYOUT_SIZE) };
    }
}

/// Maps the first LAYOUT_SIZE bytes of the file open as `fd`, shared and
/// writable, when `sized` says the file is at least that long; closes `fd`
/// either way (the mapping outlives it). `None` when nothing was mapped.
fn map_and_close(fd: libc::c_int, sized: bool) -> Option<*mut Layout> {
    let m = if sized {
        // SAFETY: the caller checked the file holds LAYOUT_SIZE bytes.
        unsafe {
            libc::mmap(
                ptr::null_mut(),
                LAYOUT_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        }
    } else {
        libc::MAP_FAILED
    };
    // SAFETY: closing our descriptor; the mapping stays.
    unsafe { libc::close(fd) };
    (m != libc::MAP_FAILED).then(|| m.cast::<Layout>())
}

/// Maps the region of `pid`: its file in `dir` (kept if it already belongs
/// to this very process, i.e. after an exec), else anonymous memory.
/// Async-signal-safe enough for a fork child: system calls and a stack
/// buffer only.
fn create(dir: Option<&CString>, pid: u32) -> *mut Layout {
    let start = shm::liveness::start_time(pid);
    if let Some(dir) = dir {
        let mut path = [0u8; 4096];
        let d = dir.to_bytes();
        if d.len() + 12 < path.len() {
            path[..d.len()].copy_from_slice(d);
            path[d.len()] = b'/';
            let n = d.len() + 1 + shm::liveness::write_u32(&mut path[d.len() + 1..], pid);
            path[n] = 0;
            if let Some(l) = map_file(&path, pid, start) {
                return l;
            }
        }
    }
    // SAFETY: a fresh anonymous mapping; zero bytes are a valid layout.
    let m = unsafe {
        libc::mmap(
            ptr::null_mut(),
            LAYOUT_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if m == libc::MAP_FAILED {
        return ptr::null_mut();
    }
    let l = m.cast::<Layout>();
    // SAFETY: just mapped.
    unsafe { (*l).init(pid, start, FLAG_COUNTING | origins_flag()) };
    // SAFETY: as above.
    keep_stacks(unsafe { &*l });
    l
}

/// Says in the region how deep the paths kept are, when they are.
fn keep_stacks(l: &Layout) {
    let depth = crate::origin::stack_depth_kept();
    if depth > 0 {
        l.keep_stacks(depth);
    }
}

fn map_file(path: &[u8], pid: u32, start: u64) -> Option<*mut Layout> {
    // SAFETY: `path` is NUL-terminated; the descriptor is closed below.
    let fd = unsafe {
        libc::open(
            path.as_ptr().cast(),
            libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is ours.
    let ok = unsafe { libc::ftruncate(fd, LAYOUT_SIZE as libc::off_t) } == 0;
    let l = map_and_close(fd, ok)?;
    // SAFETY: mapped, LAYOUT_SIZE bytes, atomics only.
    let layout = unsafe { &*l };
    let h = &layout.header;
    if h.magic.load(SeqCst) == MAGIC
        && layout.validate().is_ok()
        && h.pid.load(SeqCst) == pid
        && h.start_time.load(SeqCst) == start
    {
        // This process before an exec: the old image's device memory went
        // with it (and leaves the tree's count); its peaks and readers'
        // marks stay.
        if let Some(t) = tree() {
            shm::tree_counter::settle(t, layout);
        }
        for c in &layout.counters {
            c.current.store(0, SeqCst);
        }
        h.flags
            .fetch_and(!shm::tree_counter::FLAG_TREE_SETTLED, SeqCst);
        h.flags.fetch_and(!FLAG_EXITED, SeqCst);
        // The old image's origins name its libraries, not this one's.
        layout.clear_origins();
        h.flags.fetch_and(!FLAG_ORIGINS, SeqCst);
        h.flags.fetch_or(origins_flag(), SeqCst);
        keep_stacks(layout);
        return Some(l);
    }
    // SAFETY: ours to overwrite: a new file, or a dead process's.
    unsafe { ptr::write_bytes(l.cast::<u8>(), 0, LAYOUT_SIZE) };
    layout.init(pid, start, FLAG_COUNTING | FLAG_SHARED | origins_flag());
    keep_stacks(layout);
    Some(l)
}

/// [`FLAG_ORIGINS`] when origins are kept.
fn origins_flag() -> u32 {
    if crate::origin::enabled() {
        FLAG_ORIGINS
    } else {
        0
    }
}

/// A forked child (called by the library's fork handler, with the hooks'
/// maps emptied): a region of its own when it first uses the driver; the
/// parent's region stays mapped, untouched.
pub(crate) fn forget_in_child() {
    REGION.store(ptr::null_mut(), Release);
    CREATING.store(false, Release);
}

extern "C" fn at_exit() {
    // SAFETY: as in `get`; no region is made at exit.
    if let Some(l) = unsafe { REGION.load(Acquire).as_ref() } {
        l.header.flags.fetch_or(FLAG_EXITED, SeqCst);
        // What the process still holds, the driver frees at exit with no
        // call seen here: it leaves the tree's count now, before a parent
        // that waits for this process allocates again. The tree is detached
        // first, so frees during the rest of the exit touch this region only.
        if let Some(t) = tree() {
            TREE.store(ptr::null_mut(), Release);
            shm::tree_counter::settle(t, l);
        }
    }
}
