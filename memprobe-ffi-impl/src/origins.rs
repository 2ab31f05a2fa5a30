//! Who holds this process's GPU memory: the origins the driver-API
//! interposer names for every allocation it counts (the first library
//! outside the CUDA driver and runtime), now and at each device's peak.

use crate::boundary::{copy_to_fixed, entry_point, null, out, out_array, FfiError, FfiResult};
use crate::status::memprobe_status;
use memprobe_interpose_reader::origins::OriginBytes;
use memprobe_interpose_reader::{Counter, Error, Region};
use std::ffi::c_char;

/// The `device` value of memprobe_gpu_origins_live / _at_peak that reads
/// pinned host memory (`cuMemHostAlloc`, `cuMemAllocHost`,
/// `cuMemHostRegister`) instead of a device.
pub const MEMPROBE_GPU_ORIGINS_HOST_PINNED: i32 = -1;

/// What memprobe_gpu_origins_at_oom writes in `*device` when no
/// allocation has failed with out-of-memory in this process yet.
pub const MEMPROBE_GPU_ORIGINS_NO_OOM: i32 = -2;

/// The bytes one origin holds.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct memprobe_gpu_origin {
    /// The origin's number in this process (stable while it runs).
    pub id: u32,
    /// Nonzero when `symbol` is known.
    pub has_symbol: u32,
    /// Bytes it holds (now, or at the peak).
    pub bytes: u64,
    /// The first call site seen, an address in this process.
    pub address: u64,
    /// The same, relative to its library's load address.
    pub offset: u64,
    /// The library's path as the loader knows it (the program's path for
    /// the program itself; "(unknown)" for code the loader cannot place;
    /// "(other origins: table full)" past 64 origins), NUL-terminated. A
    /// path too long keeps its end.
    pub library: [c_char; 200],
    /// The nearest dynamic symbol at or before that call site,
    /// NUL-terminated ("" when none is known).
    pub symbol: [c_char; 104],
    /// Nonzero when the library is this process's own executable (the
    /// program, for a Python program the interpreter).
    pub is_program: u32,
}

fn counter(device: i32) -> FfiResult<Counter> {
    let c = match device {
        MEMPROBE_GPU_ORIGINS_HOST_PINNED => Counter::HostPinned,
        d if d >= 0 => Counter::Device(d as u32),
        _ => Counter::Device(u32::MAX),
    };
    c.index().map(|_| c).ok_or_else(|| {
        FfiError::new(
            memprobe_status::InvalidId,
            format!("device {device}: 0..63, or MEMPROBE_GPU_ORIGINS_HOST_PINNED (-1)"),
        )
    })
}

fn region() -> FfiResult<std::sync::Arc<Region>> {
    let r = Region::in_process().map_err(|e| {
        let why = match e {
            Error::NotLoaded => "the driver-API interposer is not loaded in this process \
                (run the program with `memprobe run --gpu-exact -- CMD`, or \
                LD_PRELOAD=/path/to/libmemprobe_interpose.so)"
                .to_owned(),
            other => other.to_string(),
        };
        FfiError::new(memprobe_status::Unavailable, why)
    })?;
    if !r.keeps_origins() {
        return Err(FfiError::new(
            memprobe_status::Unavailable,
            "the interposer keeps no origins here (MEMPROBE_GPU_ORIGINS=off)",
        ));
    }
    Ok(r)
}

fn to_c(o: &OriginBytes) -> memprobe_gpu_origin {
    let mut c = memprobe_gpu_origin {
        id: o.origin.id as u32,
        has_symbol: u32::from(o.origin.symbol.is_some()),
        bytes: o.bytes,
        address: o.origin.address,
        offset: o.origin.offset,
        library: [0; 200],
        symbol: [0; 104],
        is_program: u32::from(o.origin.program),
    };
    copy_to_fixed(&mut c.library, &o.origin.library);
    copy_to_fixed(&mut c.symbol, o.origin.symbol.as_deref().unwrap_or(""));
    c
}

/// Writes `items` into `out[0..capacity]`, `*count` the number of items;
/// too small a buffer: as many as fit and BufferTooSmall (`out` NULL with
/// `capacity` 0 learns the count).
fn fill(
    items: &[OriginBytes],
    out_: *mut memprobe_gpu_origin,
    capacity: usize,
    count: &mut usize,
) -> FfiResult {
    *count = items.len();
    out_array(out_, capacity, items.iter().map(to_c), "out")?;
    if items.len() > capacity && !(out_.is_null() && capacity == 0) {
        return Err(FfiError::new(
            memprobe_status::BufferTooSmall,
            format!("{} origins, room for {capacity}", items.len()),
        ));
    }
    Ok(())
}

/// The bytes this process holds now on CUDA device `device` (or pinned
/// host memory: MEMPROBE_GPU_ORIGINS_HOST_PINNED), by origin, largest
/// first: the first library outside the CUDA driver and runtime on the
/// stack of each allocation, as the driver-API interposer counted it.
/// `out[0..min(capacity, *count)]` receives them; entries past those are
/// never touched. Origins that hold nothing now are left out.
///
/// Errors: MEMPROBE_STATUS_NULL_POINTER for a NULL `count`, or a NULL `out`
/// with `capacity` > 0; MEMPROBE_STATUS_INVALID_ID for a device beyond
/// 0..63 other than -1; MEMPROBE_STATUS_BUFFER_TOO_SMALL when more origins
/// than `capacity` (the first `capacity` are written; `out` NULL with
/// `capacity` 0 only learns the count); MEMPROBE_STATUS_UNAVAILABLE when
/// the interposer is not loaded in this process, counts nothing
/// (MEMPROBE_GPU_EXACT=off) or keeps no origins (MEMPROBE_GPU_ORIGINS=off).
#[no_mangle]
pub extern "C" fn memprobe_gpu_origins_live(
    device: i32,
    out: *mut memprobe_gpu_origin,
    capacity: usize,
    count: *mut usize,
) -> memprobe_status {
    entry_point("memprobe_gpu_origins_live", || {
        let count = self::out(count, "count")?;
        *count = 0;
        if out.is_null() && capacity > 0 {
            return Err(null("out"));
        }
        let c = counter(device)?;
        let r = region()?;
        fill(&r.live_by_origin(c), out, capacity, count)
    })
}

/// The bytes by origin at this process's highest use of CUDA device
/// `device` so far (or of pinned host memory:
/// MEMPROBE_GPU_ORIGINS_HOST_PINNED), largest first; `*peak` receives that
/// peak (the sum of the entries) and `*at_ns` when it was reached
/// (CLOCK_MONOTONIC nanoseconds), both optional. The breakdown is copied by
/// the interposer at the allocation that raised the peak, exact to the
/// byte. Before anything was counted there: `*count` = 0, `*peak` = 0 and
/// MEMPROBE_STATUS_OK. Buffer and errors as memprobe_gpu_origins_live.
#[no_mangle]
pub extern "C" fn memprobe_gpu_origins_at_peak(
    device: i32,
    out: *mut memprobe_gpu_origin,
    capacity: usize,
    count: *mut usize,
    peak: *mut u64,
    at_ns: *mut u64,
) -> memprobe_status {
    entry_point("memprobe_gpu_origins_at_peak", || {
        let count = self::out(count, "count")?;
        *count = 0;
        for p in [peak, at_ns] {
            if let Some(p) = crate::boundary::opt_out(p) {
                *p = 0;
            }
        }
        if out.is_null() && capacity > 0 {
            return Err(null("out"));
        }
        let c = counter(device)?;
        let r = region()?;
        let Some(p) = r.peak_origins(c) else {
            return Ok(());
        };
        if let Some(v) = crate::boundary::opt_out(peak) {
            *v = p.peak;
        }
        if let Some(v) = crate::boundary::opt_out(at_ns) {
            *v = p.at_ns;
        }
        fill(&p.by_origin, out, capacity, count)
    })
}

/// What this process held by origin on the device of the last allocation
/// that failed with out-of-memory, copied by the interposer inside that
/// allocation, before its error returned: `*device` receives that device
/// (MEMPROBE_GPU_ORIGINS_HOST_PINNED for pinned host memory), `*held` what
/// the process held there then (the sum of the entries), `*at_ns` when it
/// failed (CLOCK_MONOTONIC nanoseconds); all three optional. Only the last
/// failure is kept. Before any failure: `*count` = 0, `*device` =
/// MEMPROBE_GPU_ORIGINS_NO_OOM, `*held` = `*at_ns` = 0 and
/// MEMPROBE_STATUS_OK. Buffer and errors as memprobe_gpu_origins_live.
#[no_mangle]
pub extern "C" fn memprobe_gpu_origins_at_oom(
    out: *mut memprobe_gpu_origin,
    capacity: usize,
    count: *mut usize,
    device: *mut i32,
    held: *mut u64,
    at_ns: *mut u64,
) -> memprobe_status {
    entry_point("memprobe_gpu_origins_at_oom", || {
        let count = self::out(count, "count")?;
        *count = 0;
        if let Some(d) = crate::boundary::opt_out(device) {
            *d = MEMPROBE_GPU_ORIGINS_NO_OOM;
        }
        for p in [held, at_ns] {
            if let Some(p) = crate::boundary::opt_out(p) {
                *p = 0;
            }
        }
        if out.is_null() && capacity > 0 {
            return Err(null("out"));
        }
        let r = region()?;
        let Some((c, p)) = r.oom_origins() else {
            return Ok(());
        };
        if let Some(d) = crate::boundary::opt_out(device) {
            *d = match c {
                Counter::Device(d) => d as i32,
                Counter::HostPinned => MEMPROBE_GPU_ORIGINS_HOST_PINNED,
            };
        }
        if let Some(v) = crate::boundary::opt_out(held) {
            *v = p.peak;
        }
        if let Some(v) = crate::boundary::opt_out(at_ns) {
            *v = p.at_ns;
        }
        fill(&p.by_origin, out, capacity, count)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // No interposer is loaded in the unit tests: every valid call is
    // Unavailable; bad arguments are refused first.
    #[test]
    fn arguments_are_checked_before_the_interposer_is_looked_for() {
        let mut n = 7usize;
        assert_eq!(
            memprobe_gpu_origins_live(0, std::ptr::null_mut(), 0, std::ptr::null_mut()),
            memprobe_status::NullPointer
        );
        assert_eq!(
            memprobe_gpu_origins_live(0, std::ptr::null_mut(), 4, &mut n),
            memprobe_status::NullPointer
        );
        assert_eq!(n, 0);
        for bad in [64, -2, i32::MIN, i32::MAX] {
            assert_eq!(
                memprobe_gpu_origins_live(bad, std::ptr::null_mut(), 0, &mut n),
                memprobe_status::InvalidId,
                "{bad}"
            );
            assert_eq!(
                memprobe_gpu_origins_at_peak(
                    bad,
                    std::ptr::null_mut(),
                    0,
                    &mut n,
                    std::ptr::null_mut(),
                    std::ptr::null_mut()
                ),
                memprobe_status::InvalidId
            );
        }
        let (mut peak, mut at) = (5u64, 5u64);
        assert_eq!(
            memprobe_gpu_origins_at_peak(
                0,
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                &mut peak,
                &mut at
            ),
            memprobe_status::NullPointer
        );
        assert_eq!(
            memprobe_gpu_origins_at_peak(
                MEMPROBE_GPU_ORIGINS_HOST_PINNED,
                std::ptr::null_mut(),
                0,
                &mut n,
                &mut peak,
                &mut at
            ),
            memprobe_status::Unavailable
        );
        assert_eq!((n, peak, at), (0, 0, 0));
        assert_eq!(
            memprobe_gpu_origins_live(63, std::ptr::null_mut(), 0, &mut n),
            memprobe_status::Unavailable
        );
    }

    #[test]
    fn the_oom_view_checks_its_pointers_and_says_nothing_failed() {
        let (mut n, mut dev, mut held, mut at) = (7usize, 5i32, 5u64, 5u64);
        let nul = std::ptr::null_mut();
        assert_eq!(
            memprobe_gpu_origins_at_oom(nul, 0, nul.cast(), &mut dev, &mut held, &mut at),
            memprobe_status::NullPointer
        );
        assert_eq!(
            memprobe_gpu_origins_at_oom(nul, 3, &mut n, &mut dev, &mut held, &mut at),
            memprobe_status::NullPointer
        );
        assert_eq!((n, dev, held, at), (0, MEMPROBE_GPU_ORIGINS_NO_OOM, 0, 0));
        // Optional outputs may be NULL; without the interposer: UNAVAILABLE.
        assert_eq!(
            memprobe_gpu_origins_at_oom(nul, 0, &mut n, nul.cast(), nul.cast(), nul.cast()),
            memprobe_status::Unavailable
        );
    }

    #[test]
    fn a_buffer_too_small_gets_what_fits() {
        use memprobe_interpose_reader::origins::Origin;
        let item = |id: usize, bytes: u64| OriginBytes {
            origin: Origin {
                id,
                library: format!("/lib/lib{id}.so"),
                symbol: (id == 1).then(|| "f".to_owned()),
                address: 0x1000 + id as u64,
                offset: id as u64,
                program: id == 0,
            },
            bytes,
        };
        let items = [item(1, 30), item(0, 20), item(2, 10)];
        let mut n = 0;
        let mut buf: Vec<memprobe_gpu_origin> = (0..2).map(|_| to_c(&item(9, 0))).collect();
        let e = fill(&items, buf.as_mut_ptr(), 2, &mut n).unwrap_err();
        assert_eq!(e.status, memprobe_status::BufferTooSmall);
        assert_eq!(n, 3);
        assert_eq!((buf[0].id, buf[0].bytes, buf[0].has_symbol), (1, 30, 1));
        assert_eq!((buf[1].id, buf[1].bytes, buf[1].has_symbol), (0, 20, 0));
        assert_eq!((buf[0].is_program, buf[1].is_program), (0, 1));
        // SAFETY: NUL-terminated by copy_to_fixed.
        let lib = unsafe { std::ffi::CStr::from_ptr(buf[1].library.as_ptr()) };
        assert_eq!(lib.to_str().unwrap(), "/lib/lib0.so");
        assert!(fill(&items, std::ptr::null_mut(), 0, &mut n).is_ok());
        assert_eq!(n, 3);
    }
}
