//! The driver entry points the interposer wraps, and what each counts.
//!
//! Every wrapper calls the driver first, with the caller's arguments
//! untouched, and returns its result unchanged; counting happens around
//! that call and never fails it. Frees take their entry out of the map
//! before the driver frees (so an address the driver hands out again at once
//! cannot meet a stale entry) and put it back if the driver refuses.

// The exports are named as cuda.h names them, and reached through the
// dynamic symbol table, not through Rust paths.
#![allow(non_snake_case, unreachable_pub)]

use crate::driver::{with_driver_functions, CUresult, CUDA_SUCCESS, H, HOOKED, NAMES};
use crate::oom_report_hook;
use crate::pools;
use crate::real::{real, record};
use crate::region;
use crate::table::{pack, unpack, Table, MAX_BYTES};
use shm::layout::{self, Layout, HOST_PINNED, MAX_DEVICES};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

type CUdeviceptr = u64;
type CUstream = *mut c_void;
type CUpool = *mut c_void;
type CUarray = *mut c_void;
type CUhandle = u64;

const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
const CUDA_ERROR_NOT_FOUND: CUresult = 500;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// Device pointers of plain, pitched and managed allocations.
static DEVPTRS: Table = Table::new(20);
/// Pinned host allocations and registrations.
static HOST: Table = Table::new(16);
/// Arrays and mipmapped arrays.
static ARRAYS: Table = Table::new(16);
/// Physical VMM allocation handles.
static HANDLES: Table = Table::new(18);

/// The wrapper of each hooked function (null for a function only used).
macro_rules! wrappers {
    (hooked: $($h:ident),* $(,)? ; internal: $($i:ident),* $(,)?) => {
        /// The wrapper of `h` (null for a function only used).
        pub(crate) fn wrapper(h: H) -> *mut c_void {
            match h {
                $(H::$h => $h as *mut c_void,)*
                _ => std::ptr::null_mut(),
            }
        }
    };
}

with_driver_functions!(wrappers);

/// The wrapped function exported under `name` (as `dlsym` is asked).
pub(crate) fn by_name(name: &[u8]) -> Option<H> {
    if !name.starts_with(b"cu") {
        return None;
    }
    HOOKED
        .iter()
        .copied()
        .find(|&h| &NAMES[h as usize][..NAMES[h as usize].len() - 1] == name)
}

/// The wrapper for what `cuGetProcAddress(symbol, cudaVersion, flags)`
/// resolves to: the base name and the version pick the ABI (as the driver
/// does: `cuMemAlloc` is `cuMemAlloc_v2` from CUDA 3.2 on), the flags the
/// per-thread default stream variant. An ABI the interposer does not wrap
/// (the 32-bit `cuMemAlloc` of before 3.2) is handed out untouched.
fn by_proc_name(symbol: &[u8], version: c_int, flags: u64) -> Option<H> {
    let ptds = flags & PER_THREAD_DEFAULT_STREAM != 0;
    let pick = |plain: H, per_thread: H| if ptds { per_thread } else { plain };
    Some(match symbol {
        b"cuMemAlloc" if version >= 3020 => H::cuMemAlloc_v2,
        b"cuMemAllocPitch" if version >= 3020 => H::cuMemAllocPitch_v2,
        b"cuMemFree" if version >= 3020 => H::cuMemFree_v2,
        b"cuMemAllocHost" if version >= 3020 => H::cuMemAllocHost_v2,
        b"cuMemHostRegister" if version >= 6050 => H::cuMemHostRegister_v2,
        b"cuArrayCreate" if version >= 3020 => H::cuArrayCreate_v2,
        b"cuArray3DCreate" if version >= 3020 => H::cuArray3DCreate_v2,
        b"cuMemAllocManaged" => H::cuMemAllocManaged,
        b"cuMemCreate" => H::cuMemCreate,
        b"cuMemRelease" => H::cuMemRelease,
        b"cuMemPoolCreate" => H::cuMemPoolCreate,
        b"cuMemAllocAsync" => pick(H::cuMemAllocAsync, H::cuMemAllocAsync_ptsz),
        b"cuMemAllocFromPoolAsync" => {
            pick(H::cuMemAllocFromPoolAsync, H::cuMemAllocFromPoolAsync_ptsz)
        }
        b"cuMemFreeAsync" => pick(H::cuMemFreeAsync, H::cuMemFreeAsync_ptsz),
        b"cuMemPoolTrimTo" => H::cuMemPoolTrimTo,
        b"cuMemPoolDestroy" => H::cuMemPoolDestroy,
        b"cuStreamSynchronize" => pick(H::cuStreamSynchronize, H::cuStreamSynchronize_ptsz),
        b"cuCtxSynchronize" => H::cuCtxSynchronize,
        b"cuArrayDestroy" => H::cuArrayDestroy,
        b"cuMipmappedArrayCreate" => H::cuMipmappedArrayCreate,
        b"cuMipmappedArrayDestroy" => H::cuMipmappedArrayDestroy,
        b"cuMemHostAlloc" => H::cuMemHostAlloc,
        b"cuMemFreeHost" => H::cuMemFreeHost,
        b"cuMemHostUnregister" => H::cuMemHostUnregister,
        b"cuGetProcAddress" if version >= 12000 => H::cuGetProcAddress_v2,
        b"cuGetProcAddress" => H::cuGetProcAddress,
        _ => return None,
    })
}

macro_rules! driver {
    ($h:ident : $t:ty) => {{
        let p = real(H::$h, wrapper);
        if p.is_null() {
            None
        } else {
            // SAFETY: the driver exports `$h` with the signature `$t`
            // (cuda.h).
            Some(unsafe { std::mem::transmute::<*mut c_void, $t>(p) })
        }
    }};
}

macro_rules! call {
    ($h:ident : $t:ty, $($arg:expr),*) => {{
        let Some(f) = driver!($h: $t) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the caller's arguments, passed to the driver unchanged.
        unsafe { f($($arg),*) }
    }};
}

/// The device of the calling thread's current context, as a counter index.
fn ctx_counter() -> Option<usize> {
    let f = driver!(cuCtxGetDevice: unsafe extern "C" fn(*mut c_int) -> CUresult)?;
    let mut dev: c_int = -1;
    // SAFETY: writes one int.
    let rc = unsafe { f(&mut dev) };
    (rc == CUDA_SUCCESS && dev >= 0 && (dev as usize) < MAX_DEVICES).then_some(dev as usize)
}

/// The counter of a `CUmemLocation` (`{ int type; int id; }`, the third
/// and fourth ints of `CUmemAllocationProp` and `CUmemPoolProps`).
///
/// # Safety
/// `props` is null or points at such a struct.
unsafe fn location_counter(props: *const c_void) -> Option<usize> {
    if props.is_null() {
        return None;
    }
    // SAFETY: the caller's struct, at least 16 bytes.
    let (kind, id) = unsafe {
        let p = props.cast::<c_int>();
        (*p.add(2), *p.add(3))
    };
    match kind {
        1 if id >= 0 && (id as usize) < MAX_DEVICES => Some(id as usize),
        2..=4 => Some(HOST_PINNED),
        _ => None,
    }
}

/// The number of one of the allocation tables (call paths are kept per
/// allocation in one map, its keys tagged by their table).
fn table_number(table: &Table) -> usize {
    [&DEVPTRS, &HOST, &ARRAYS, &HANDLES]
        .iter()
        .position(|t| std::ptr::eq(*t, table))
        .unwrap_or(0)
}

fn counted(l: &Layout, table: &Table, key: u64, counter: Option<usize>, bytes: u64) {
    match counter {
        Some(c) if bytes <= MAX_BYTES => {
            let o = crate::origin::here(l);
            let s = crate::stack::here(l, o);
            if table.insert(key, pack(c, o, bytes)) {
                crate::stack::remember(table_number(table), key, s);
                region::add(l, o, s, c, bytes);
            } else {
                l.record_not_counted(bytes);
            }
        }
        _ => l.record_not_counted(bytes),
    }
}

/// After an allocation through `api` that failed: an out-of-memory failure
/// is recorded in the region (on a known counter) and reported to the
/// registered hook, before the caller sees the error.
fn failed(l: &Layout, rc: CUresult, counter: Option<usize>, bytes: u64, api: H) {
    if rc != CUDA_ERROR_OUT_OF_MEMORY {
        return;
    }
    let name = NAMES[api as usize];
    let at = memprobe_core::monotonic_ns();
    if let Some(c) = counter {
        let code = std::str::from_utf8(&name[..name.len() - 1]).map_or(0, layout::oom_api_code);
        // What held the device when it ran out, before the failure is
        // counted (a reader that sees the failure finds its breakdown).
        if crate::origin::enabled() {
            l.record_oom_origins(c);
        }
        l.record_oom(c, bytes, code, at);
    }
    let failures = l
        .header
        .oom_events
        .load(std::sync::atomic::Ordering::SeqCst);
    oom_report_hook::fire(counter, bytes, name, rc, failures, at);
}

/// After an allocation of `bytes` at `*out` on `counter`.
///
/// # Safety
/// `out` is null or readable when `rc` is success.
unsafe fn allocated<T: Copy + Into<u64>>(
    rc: CUresult,
    table: &Table,
    out: *const T,
    counter: impl FnOnce() -> Option<usize>,
    bytes: u64,
    api: H,
) {
    let Some(l) = region::get() else {
        return;
    };
    let counter = counter();
    if rc == CUDA_SUCCESS {
        let key = if out.is_null() {
            0
        } else {
            // SAFETY: the driver wrote the result.
            unsafe { *out }.into()
        };
        counted(l, table, key, counter, bytes);
    } else {
        failed(l, rc, counter, bytes, api);
    }
}

/// Takes `key`'s entry out before the driver frees it.
fn take(table: &Table, key: u64) -> Option<u64> {
    region::get()?;
    table.remove(key)
}

/// After the driver's free of `key`.
fn freed(rc: CUresult, table: &Table, key: u64, taken: Option<u64>) {
    let Some(l) = region::get() else {
        return;
    };
    match taken {
        Some(v) if rc == CUDA_SUCCESS => {
            let (c, o, b) = unpack(v);
            let s = crate::stack::take(table_number(table), key);
            region::sub(l, o, s, c, b);
        }
        Some(v) => {
            table.insert(key, v);
        }
        None if rc == CUDA_SUCCESS && key != 0 => l.record_untracked_free(),
        None => {}
    }
}

/// Forgets every allocation (a forked child).
pub(crate) fn forget_all() {
    for t in [&DEVPTRS, &HOST, &ARRAYS, &HANDLES] {
        t.clear();
    }
    pools::forget_all();
}

// ---- the exported allocation entry points ----------------------------------

// Each allocation entry point is a two-instruction trampoline that hands
// its return address (the caller: the origin, unless it is the CUDA
// runtime) to the wrapper as one more argument, then jumps to it; the
// wrapper returns straight to the caller. See crate::origin.
crate::trampoline::trampolines! {
    cuMemAlloc_v2 => cuMemAlloc_v2_at(dptr: *mut CUdeviceptr, bytesize: usize);
    cuMemAllocPitch_v2 => cuMemAllocPitch_v2_at(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint);
    cuMemAllocManaged => cuMemAllocManaged_at(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint);
    cuMemCreate => cuMemCreate_at(handle: *mut CUhandle, size: usize, prop: *const c_void, flags: u64);
    cuMemPoolCreate => cuMemPoolCreate_at(pool: *mut CUpool, props: *const c_void);
    cuMemAllocAsync => cuMemAllocAsync_at(dptr: *mut CUdeviceptr, size: usize, s: CUstream);
    cuMemAllocAsync_ptsz => cuMemAllocAsync_ptsz_at(dptr: *mut CUdeviceptr, size: usize, s: CUstream);
    cuMemAllocFromPoolAsync => cuMemAllocFromPoolAsync_at(dptr: *mut CUdeviceptr, size: usize, pool: CUpool, s: CUstream);
    cuMemAllocFromPoolAsync_ptsz => cuMemAllocFromPoolAsync_ptsz_at(dptr: *mut CUdeviceptr, size: usize, pool: CUpool, s: CUstream);
    cuArrayCreate_v2 => cuArrayCreate_v2_at(array: *mut CUarray, desc: *const ArrayDescriptor);
    cuArray3DCreate_v2 => cuArray3DCreate_v2_at(array: *mut CUarray, desc: *const Array3dDescriptor);
    cuMipmappedArrayCreate => cuMipmappedArrayCreate_at(array: *mut CUarray, desc: *const Array3dDescriptor, levels: c_uint);
    cuMemHostAlloc => cuMemHostAlloc_at(pp: *mut *mut c_void, size: usize, flags: c_uint);
    cuMemAllocHost_v2 => cuMemAllocHost_v2_at(pp: *mut *mut c_void, size: usize);
    cuMemHostRegister_v2 => cuMemHostRegister_v2_at(p: *mut c_void, size: usize, flags: c_uint);
}

// ---- plain, pitched, managed ------------------------------------------

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuMemAlloc_v2_at(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuMemAlloc_v2: unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult, dptr, bytesize);
    // SAFETY: the driver wrote *dptr on success.
    unsafe {
        allocated(
            rc,
            &DEVPTRS,
            dptr,
            ctx_counter,
            bytesize as u64,
            H::cuMemAlloc_v2,
        )
    };
    rc
}

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuMemAllocPitch_v2_at(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuMemAllocPitch_v2: unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult,
        dptr, pitch, width, height, elem);
    let row = if rc == CUDA_SUCCESS && !pitch.is_null() {
        // SAFETY: the driver wrote the pitch.
        unsafe { *pitch }
    } else {
        width
    };
    let bytes = (row as u64).saturating_mul(height as u64);
    // SAFETY: as in cuMemAlloc_v2.
    unsafe {
        allocated(
            rc,
            &DEVPTRS,
            dptr,
            ctx_counter,
            bytes,
            H::cuMemAllocPitch_v2,
        )
    };
    rc
}

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuMemAllocManaged_at(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuMemAllocManaged: unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult, dptr, bytesize, flags);
    // SAFETY: as in cuMemAlloc_v2.
    unsafe {
        allocated(
            rc,
            &DEVPTRS,
            dptr,
            ctx_counter,
            bytesize as u64,
            H::cuMemAllocManaged,
        )
    };
    rc
}

/// # Safety
/// The driver's contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    let taken = take(&DEVPTRS, dptr);
    let rc = call!(cuMemFree_v2: unsafe extern "C" fn(CUdeviceptr) -> CUresult, dptr);
    freed(rc, &DEVPTRS, dptr, taken);
    rc
}

// ---- virtual memory management -----------------------------------------

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuMemCreate_at(
    handle: *mut CUhandle,
    size: usize,
    prop: *const c_void,
    flags: u64,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuMemCreate: unsafe extern "C" fn(*mut CUhandle, usize, *const c_void, u64) -> CUresult, handle, size, prop, flags);
    // SAFETY: `prop` is the caller's CUmemAllocationProp; *handle written
    // on success.
    unsafe {
        allocated(
            rc,
            &HANDLES,
            handle,
            || location_counter(prop),
            size as u64,
            H::cuMemCreate,
        )
    };
    rc
}

/// # Safety
/// The driver's contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUhandle) -> CUresult {
    // Imported handles were never counted: they pass through here.
    let taken = take(&HANDLES, handle);
    let rc = call!(cuMemRelease: unsafe extern "C" fn(CUhandle) -> CUresult, handle);
    freed(rc, &HANDLES, handle, taken);
    rc
}

// ---- stream-ordered pools ------------------------------------------------

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuMemPoolCreate_at(
    pool: *mut CUpool,
    props: *const c_void,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuMemPoolCreate: unsafe extern "C" fn(*mut CUpool, *const c_void) -> CUresult, pool, props);
    if rc == CUDA_SUCCESS && !pool.is_null() {
        // SAFETY: `props` is the caller's CUmemPoolProps.
        if let Some(c) = unsafe { location_counter(props) } {
            // SAFETY: written by the driver.
            pools::created(unsafe { *pool }, c);
        }
    }
    rc
}

/// The current pool of the current context's device.
fn device_pool(counter: usize) -> CUpool {
    let Some(f) = driver!(cuDeviceGetMemPool: unsafe extern "C" fn(*mut CUpool, c_int) -> CUresult)
    else {
        return std::ptr::null_mut();
    };
    let mut pool = std::ptr::null_mut();
    // SAFETY: writes one handle.
    if unsafe { f(&mut pool, counter as c_int) } == CUDA_SUCCESS {
        pool
    } else {
        std::ptr::null_mut()
    }
}

fn after_pool_alloc(rc: CUresult, pool: Option<CUpool>, bytes: u64, api: H) {
    let Some(l) = region::get() else {
        return;
    };
    let c = ctx_counter();
    match (rc == CUDA_SUCCESS, pool, c) {
        // A pool of known device needs no context.
        (true, Some(p), _) if pools::refresh_known(p) => {}
        (true, Some(p), Some(c)) => pools::refresh(p, c),
        (true, None, Some(c)) => pools::refresh(device_pool(c), c),
        (true, _, None) => l.record_not_counted(bytes),
        // A pool of known device says where the failure was.
        (false, Some(p), c) => failed(l, rc, pools::counter_of(p).or(c), bytes, api),
        (false, None, c) => failed(l, rc, c, bytes, api),
    }
}

type AllocAsync = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
type AllocFromPool = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUpool, CUstream) -> CUresult;
type FreeAsync = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuMemAllocAsync_at(
    dptr: *mut CUdeviceptr,
    size: usize,
    s: CUstream,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuMemAllocAsync: AllocAsync, dptr, size, s);
    after_pool_alloc(rc, None, size as u64, H::cuMemAllocAsync);
    rc
}

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuMemAllocAsync_ptsz_at(
    dptr: *mut CUdeviceptr,
    size: usize,
    s: CUstream,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuMemAllocAsync_ptsz: AllocAsync, dptr, size, s);
    after_pool_alloc(rc, None, size as u64, H::cuMemAllocAsync_ptsz);
    rc
}

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuMemAllocFromPoolAsync_at(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUpool,
    s: CUstream,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuMemAllocFromPoolAsync: AllocFromPool, dptr, size, pool, s);
    after_pool_alloc(rc, Some(pool), size as u64, H::cuMemAllocFromPoolAsync);
    rc
}

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz_at(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUpool,
    s: CUstream,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuMemAllocFromPoolAsync_ptsz: AllocFromPool, dptr, size, pool, s);
    after_pool_alloc(rc, Some(pool), size as u64, H::cuMemAllocFromPoolAsync_ptsz);
    rc
}

fn free_async(f: Option<FreeAsync>, dptr: CUdeviceptr, s: CUstream) -> CUresult {
    let Some(f) = f else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // A cuMemAlloc'd pointer may be freed in stream order too.
    let taken = take(&DEVPTRS, dptr);
    // SAFETY: the caller's arguments.
    let rc = unsafe { f(dptr, s) };
    if taken.is_some() {
        freed(rc, &DEVPTRS, dptr, taken);
    }
    pools::refresh_all();
    rc
}

/// # Safety
/// The driver's contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, s: CUstream) -> CUresult {
    free_async(driver!(cuMemFreeAsync: FreeAsync), dptr, s)
}

/// # Safety
/// The driver's contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, s: CUstream) -> CUresult {
    free_async(driver!(cuMemFreeAsync_ptsz: FreeAsync), dptr, s)
}

/// # Safety
/// The driver's contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUpool, keep: usize) -> CUresult {
    let rc = call!(cuMemPoolTrimTo: unsafe extern "C" fn(CUpool, usize) -> CUresult, pool, keep);
    if rc == CUDA_SUCCESS && !pools::refresh_known(pool) {
        if let Some(c) = ctx_counter() {
            pools::refresh(pool, c);
        }
    }
    rc
}

/// # Safety
/// The driver's contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUpool) -> CUresult {
    let rc = call!(cuMemPoolDestroy: unsafe extern "C" fn(CUpool) -> CUresult, pool);
    if rc == CUDA_SUCCESS {
        pools::destroyed(pool);
    }
    rc
}

/// # Safety
/// The driver's contract.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    let rc = call!(cuStreamSynchronize: unsafe extern "C" fn(CUstream) -> CUresult, s);
    pools::refresh_all();
    rc
}

/// # Safety
/// The driver's contract.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(s: CUstream) -> CUresult {
    let rc = call!(cuStreamSynchronize_ptsz: unsafe extern "C" fn(CUstream) -> CUresult, s);
    pools::refresh_all();
    rc
}

/// # Safety
/// The driver's contract.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    let rc = call!(cuCtxSynchronize: unsafe extern "C" fn() -> CUresult,);
    pools::refresh_all();
    rc
}

// ---- arrays ----------------------------------------------------------------

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub(crate) struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: c_uint,
    channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub(crate) struct Array3dDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
    flags: c_uint,
}

/// Bytes per channel of a `CUarray_format`; `None` for the packed, video
/// and block-compressed formats, whose arrays are reported as not counted.
fn format_bytes(format: c_uint) -> Option<u64> {
    match format {
        0x01 | 0x08 => Some(1),        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => Some(2), // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => Some(4), // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => None,
    }
}

/// Bytes of an array `levels` mip levels deep (1: a plain array). Levels
/// halve each extent down to 1, except the layer count of a layered array.
fn array_bytes(
    w: usize,
    h: usize,
    d: usize,
    format: c_uint,
    channels: c_uint,
    flags: c_uint,
    levels: c_uint,
) -> Option<u64> {
    const LAYERED: c_uint = 1;
    let texel = format_bytes(format)?.checked_mul(u64::from(channels))?;
    let mut total: u64 = 0;
    for level in 0..levels.clamp(1, 64) {
        let shrink = |x: usize| ((x.max(1) as u64) >> level).max(1);
        let depth = if flags & LAYERED != 0 {
            d.max(1) as u64
        } else {
            shrink(d)
        };
        let texels = shrink(w).checked_mul(shrink(h))?.checked_mul(depth)?;
        total = total.checked_add(texels.checked_mul(texel)?)?;
    }
    Some(total)
}

fn array_created(rc: CUresult, out: *const CUarray, bytes: Option<u64>, api: H) {
    let Some(l) = region::get() else {
        return;
    };
    let counter = ctx_counter();
    match bytes {
        // SAFETY: *out written by the driver on success.
        Some(b) => unsafe { allocated(rc, &ARRAYS, out.cast::<u64>(), || counter, b, api) },
        None if rc == CUDA_SUCCESS => l.record_not_counted(0),
        // A size the descriptor does not give: the failure is still one.
        None => failed(l, rc, counter, 0, api),
    }
}

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuArrayCreate_v2_at(
    array: *mut CUarray,
    desc: *const ArrayDescriptor,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuArrayCreate_v2: unsafe extern "C" fn(*mut CUarray, *const ArrayDescriptor) -> CUresult, array, desc);
    // SAFETY: the caller's descriptor (the driver read it too).
    let bytes = unsafe { desc.as_ref() }
        .and_then(|d| array_bytes(d.width, d.height, 1, d.format, d.channels, 0, 1));
    array_created(rc, array, bytes, H::cuArrayCreate_v2);
    rc
}

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuArray3DCreate_v2_at(
    array: *mut CUarray,
    desc: *const Array3dDescriptor,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuArray3DCreate_v2: unsafe extern "C" fn(*mut CUarray, *const Array3dDescriptor) -> CUresult, array, desc);
    // SAFETY: as above.
    let bytes = unsafe { desc.as_ref() }
        .and_then(|d| array_bytes(d.width, d.height, d.depth, d.format, d.channels, d.flags, 1));
    array_created(rc, array, bytes, H::cuArray3DCreate_v2);
    rc
}

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuMipmappedArrayCreate_at(
    array: *mut CUarray,
    desc: *const Array3dDescriptor,
    levels: c_uint,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuMipmappedArrayCreate: unsafe extern "C" fn(*mut CUarray, *const Array3dDescriptor, c_uint) -> CUresult, array, desc, levels);
    // SAFETY: as above.
    let bytes = unsafe { desc.as_ref() }.and_then(|d| {
        array_bytes(
            d.width, d.height, d.depth, d.format, d.channels, d.flags, levels,
        )
    });
    array_created(rc, array, bytes, H::cuMipmappedArrayCreate);
    rc
}

/// # Safety
/// The driver's contract.
#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(array: CUarray) -> CUresult {
    let key = array as u64;
    let taken = take(&ARRAYS, key);
    let rc = call!(cuArrayDestroy: unsafe extern "C" fn(CUarray) -> CUresult, array);
    freed(rc, &ARRAYS, key, taken);
    rc
}

/// # Safety
/// The driver's contract.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(array: CUarray) -> CUresult {
    let key = array as u64;
    let taken = take(&ARRAYS, key);
    let rc = call!(cuMipmappedArrayDestroy: unsafe extern "C" fn(CUarray) -> CUresult, array);
    freed(rc, &ARRAYS, key, taken);
    rc
}

// ---- pinned host memory ------------------------------------------------------

fn host() -> Option<usize> {
    Some(HOST_PINNED)
}

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuMemHostAlloc_at(
    pp: *mut *mut c_void,
    size: usize,
    flags: c_uint,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuMemHostAlloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CUresult, pp, size, flags);
    // SAFETY: *pp written on success.
    unsafe {
        allocated(
            rc,
            &HOST,
            pp.cast::<u64>(),
            host,
            size as u64,
            H::cuMemHostAlloc,
        )
    };
    rc
}

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuMemAllocHost_v2_at(
    pp: *mut *mut c_void,
    size: usize,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuMemAllocHost_v2: unsafe extern "C" fn(*mut *mut c_void, usize) -> CUresult, pp, size);
    // SAFETY: as above.
    unsafe {
        allocated(
            rc,
            &HOST,
            pp.cast::<u64>(),
            host,
            size as u64,
            H::cuMemAllocHost_v2,
        )
    };
    rc
}

/// # Safety
/// The driver's contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    let key = p as u64;
    let taken = take(&HOST, key);
    let rc = call!(cuMemFreeHost: unsafe extern "C" fn(*mut c_void) -> CUresult, p);
    freed(rc, &HOST, key, taken);
    rc
}

/// # Safety
/// The driver's contract.
unsafe extern "C" fn cuMemHostRegister_v2_at(
    p: *mut c_void,
    size: usize,
    flags: c_uint,
    caller: usize,
) -> CUresult {
    let _caller = crate::origin::Caller::set(caller);
    let rc = call!(cuMemHostRegister_v2: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CUresult, p, size, flags);
    let key = p as u64;
    // SAFETY: reads our local `key`.
    unsafe { allocated(rc, &HOST, &key, host, size as u64, H::cuMemHostRegister_v2) };
    rc
}

/// # Safety
/// The driver's contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    let key = p as u64;
    let taken = take(&HOST, key);
    let rc = call!(cuMemHostUnregister: unsafe extern "C" fn(*mut c_void) -> CUresult, p);
    freed(rc, &HOST, key, taken);
    rc
}

// ---- cuGetProcAddress ------------------------------------------------------------

/// Replaces what the driver resolved with the wrapper, when there is one.
fn resolved(
    rc: CUresult,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) {
    if rc != CUDA_SUCCESS || symbol.is_null() || pfn.is_null() || !region::counting() {
        return;
    }
    // SAFETY: the driver wrote *pfn on success; the name is the caller's C string.
    let (p, name) = unsafe { (*pfn, CStr::from_ptr(symbol).to_bytes()) };
    if p.is_null() {
        return;
    }
    if let Some(h) = by_proc_name(name, version, flags).or_else(|| by_name(name)) {
        record(h, p, wrapper);
        // SAFETY: as above.
        unsafe { *pfn = wrapper(h) };
    }
}

/// # Safety
/// The driver's contract (CUDA 11.3 ABI).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    let rc = call!(cuGetProcAddress: unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult,
        symbol, pfn, version, flags);
    resolved(rc, symbol, pfn, version, flags);
    rc
}

/// # Safety
/// The driver's contract (CUDA 12.0 ABI).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    let rc = call!(cuGetProcAddress_v2: unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult,
        symbol, pfn, version, flags, status);
    resolved(rc, symbol, pfn, version, flags);
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_pick_the_abi() {
        assert_eq!(by_proc_name(b"cuMemAlloc", 3020, 0), Some(H::cuMemAlloc_v2));
        assert_eq!(by_proc_name(b"cuMemAlloc", 2000, 0), None);
        assert_eq!(
            by_proc_name(b"cuMemAllocAsync", 11020, 2),
            Some(H::cuMemAllocAsync_ptsz)
        );
        assert_eq!(
            by_proc_name(b"cuMemAllocAsync", 11020, 1),
            Some(H::cuMemAllocAsync)
        );
        assert_eq!(
            by_proc_name(b"cuGetProcAddress", 11030, 0),
            Some(H::cuGetProcAddress)
        );
        assert_eq!(
            by_proc_name(b"cuGetProcAddress", 12000, 0),
            Some(H::cuGetProcAddress_v2)
        );
        assert_eq!(by_proc_name(b"cuLaunchKernel", 12000, 0), None);
        assert_eq!(by_name(b"cuMemFree_v2"), Some(H::cuMemFree_v2));
        assert_eq!(by_name(b"cuMemFree"), None);
        assert_eq!(by_name(b"cuCtxGetDevice"), None);
    }

    #[test]
    fn array_sizes_follow_the_descriptor() {
        assert_eq!(array_bytes(100, 0, 0, 0x20, 4, 0, 1), Some(1600));
        assert_eq!(array_bytes(64, 32, 2, 0x01, 1, 0, 1), Some(4096));
        // 8x8, 4x4, 2x2, 1x1 of 2-byte texels.
        assert_eq!(
            array_bytes(8, 8, 0, 0x10, 1, 0, 4),
            Some(2 * (64 + 16 + 4 + 1))
        );
        // Layered: the layer count does not shrink.
        assert_eq!(array_bytes(4, 4, 3, 0x01, 1, 1, 2), Some(3 * 16 + 3 * 4));
        assert_eq!(array_bytes(4, 4, 1, 0xb0, 1, 0, 1), None);
    }
}
