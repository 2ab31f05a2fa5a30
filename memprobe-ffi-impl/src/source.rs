//! Sources through the C ABI.

use crate::boundary::{
    check_flags, copy_out, entry_point, free_point, out, text, FfiError, FfiResult, UserData,
};
use crate::handle::{get, release, Handle, Shared, Table};
use crate::status::memprobe_status;
use memprobe_core::SmapsMetric;
use memprobe_core::{Error, ErrorKind, PeakFidelity, Sample, Source, SourceKind};
use std::ffi::{c_char, c_void};

/// A source of readings (this process, its tree, system RAM, the cgroup, a
/// custom or pushed source). Several handles may refer to one shared
/// source (e.g. the process source); each handle is freed separately.
#[allow(non_camel_case_types)]
pub struct memprobe_source {
    _private: [u8; 0],
}

static SOURCES: Table<Source, Shared> = Table::new(0x51, "memprobe_source");

impl Handle for memprobe_source {
    type Object = Source;
    type Kind = Shared;
    fn table() -> &'static Table<Source, Shared> {
        &SOURCES
    }
}

/// `memprobe_sample.valid`: `total` holds a value.
pub const MEMPROBE_SAMPLE_TOTAL: u32 = 1;
/// `memprobe_sample.valid`: `free` holds a value.
pub const MEMPROBE_SAMPLE_FREE: u32 = 2;
/// `memprobe_sample.valid`: `limit` holds a value (absent = no limit).
pub const MEMPROBE_SAMPLE_LIMIT: u32 = 4;
/// `memprobe_sample.valid`: `reserved` holds a value.
pub const MEMPROBE_SAMPLE_RESERVED: u32 = 8;

/// One reading, in bytes. Fields a source cannot supply are 0 with their bit
/// clear in `valid`; `used` is always valid.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct memprobe_sample {
    /// Bytes in use now.
    pub used: u64,
    /// Capacity (RAM, GPU memory); valid if `valid & MEMPROBE_SAMPLE_TOTAL`.
    pub total: u64,
    /// Available bytes; valid if `valid & MEMPROBE_SAMPLE_FREE`.
    pub free: u64,
    /// Enforced limit; valid if `valid & MEMPROBE_SAMPLE_LIMIT`.
    pub limit: u64,
    /// Reserved, unusable bytes; valid if `valid & MEMPROBE_SAMPLE_RESERVED`.
    pub reserved: u64,
    /// Bit set of MEMPROBE_SAMPLE_* telling which optional fields hold values.
    pub valid: u32,
    /// When the reading was taken, CLOCK_MONOTONIC nanoseconds.
    pub taken_at_ns: u64,
    /// How long the read took, nanoseconds.
    pub read_ns: u64,
}

impl From<Sample> for memprobe_sample {
    fn from(s: Sample) -> Self {
        let mut valid = 0;
        let mut take = |v: Option<u64>, bit: u32| {
            if v.is_some() {
                valid |= bit;
            }
            v.unwrap_or(0)
        };
        let total = take(s.total, MEMPROBE_SAMPLE_TOTAL);
        let free = take(s.free, MEMPROBE_SAMPLE_FREE);
        let limit = take(s.limit, MEMPROBE_SAMPLE_LIMIT);
        let reserved = take(s.reserved, MEMPROBE_SAMPLE_RESERVED);
        memprobe_sample {
            used: s.used,
            total,
            free,
            limit,
            reserved,
            valid,
            taken_at_ns: s.taken_at_ns,
            read_ns: s.read_ns,
        }
    }
}

/// What a source measures (`memprobe_source_info.kind`).
#[repr(u32)]
#[allow(non_camel_case_types)]
pub enum memprobe_source_kind {
    /// This process's resident set.
    Process = 0,
    /// This process and its descendants.
    ProcessTree = 1,
    /// The machine's RAM (used = total - available).
    SystemRam = 2,
    /// The container's memory cgroup.
    Cgroup = 3,
    /// A whole GPU.
    GpuDevice = 4,
    /// This process's memory on one GPU.
    GpuProcess = 5,
    /// A custom (callback or pushed) source.
    Custom = 6,
    /// This process's PSS.
    ProcessPss = 7,
    /// This process's USS.
    ProcessUss = 8,
    /// This process's memory on one GPU, counted by the driver-API
    /// interposer (memprobe_source_new_gpu_exact).
    GpuExact = 9,
    /// The PSS of this process and its descendants: pages they share counted
    /// once (memprobe_source_new_process_tree_smaps).
    ProcessTreePss = 10,
    /// The USS of this process and its descendants: the pages private to
    /// each, summed (memprobe_source_new_process_tree_smaps).
    ProcessTreeUss = 11,
}

/// How exact a source's peaks are (`memprobe_source_info.fidelity`).
#[repr(u32)]
#[allow(non_camel_case_types)]
pub enum memprobe_fidelity {
    /// A kernel or driver high-water mark: no spike is missed.
    Exact = 0,
    /// Values pushed by the caller: as exact as the pushes.
    Pushed = 1,
    /// Polled by the monitor: spikes shorter than its interval can be missed.
    Sampled = 2,
}

/// Describes a source.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct memprobe_source_info {
    /// A memprobe_source_kind value.
    pub kind: u32,
    /// A memprobe_fidelity value.
    pub fidelity: u32,
    /// The source's name, NUL-terminated (at most 64 bytes plus the NUL).
    pub name: [c_char; 72],
}

/// The C value of a source kind (the numbering is this crate's).
pub(crate) fn kind_code(k: SourceKind) -> u32 {
    let c = match k {
        SourceKind::Process => memprobe_source_kind::Process,
        SourceKind::ProcessTree => memprobe_source_kind::ProcessTree,
        SourceKind::SystemRam => memprobe_source_kind::SystemRam,
        SourceKind::Cgroup => memprobe_source_kind::Cgroup,
        SourceKind::GpuDevice => memprobe_source_kind::GpuDevice,
        SourceKind::GpuProcess => memprobe_source_kind::GpuProcess,
        SourceKind::Custom => memprobe_source_kind::Custom,
        SourceKind::ProcessPss => memprobe_source_kind::ProcessPss,
        SourceKind::ProcessUss => memprobe_source_kind::ProcessUss,
        SourceKind::GpuExact => memprobe_source_kind::GpuExact,
        SourceKind::ProcessTreePss => memprobe_source_kind::ProcessTreePss,
        SourceKind::ProcessTreeUss => memprobe_source_kind::ProcessTreeUss,
    };
    c as u32
}

/// The C value of a peak fidelity (the numbering is this crate's).
pub(crate) fn fidelity_code(f: PeakFidelity) -> u32 {
    let c = match f {
        PeakFidelity::Exact => memprobe_fidelity::Exact,
        PeakFidelity::Pushed => memprobe_fidelity::Pushed,
        PeakFidelity::Sampled => memprobe_fidelity::Sampled,
    };
    c as u32
}

/// The source behind a handle.
pub(crate) fn source(h: *const memprobe_source) -> FfiResult<Source> {
    Ok(get(h)?.as_ref().clone())
}

/// Sources behind an array of handles. The count is checked first, so an
/// empty list is INVALID_ARGUMENT whether or not its pointer is NULL (C++'s
/// empty vector, Go's nil slice).
pub(crate) fn sources(list: *const *const memprobe_source, n: usize) -> FfiResult<Vec<Source>> {
    if n == 0 || n > 4096 {
        return Err(FfiError::new(
            memprobe_status::InvalidArgument,
            format!("n_sources must be 1..=4096, got {n}"),
        ));
    }
    if list.is_null() {
        return Err(crate::boundary::null("sources"));
    }
    // SAFETY: the caller promises `list` points to `n` handles.
    let handles = unsafe { std::slice::from_raw_parts(list, n) };
    handles.iter().map(|&h| source(h)).collect()
}

pub(crate) use crate::handle::publish;

/// `memprobe_source_new_process` flag: never touch this process's `VmHWM`;
/// the peak is then sampled by the monitor.
pub const MEMPROBE_PROCESS_PRESERVE_HWM: u32 = 1;

/// This process's RSS (`/proc/self/statm`, one pread). By default its peak is
/// exact: the kernel high-water mark is folded into windows and reset at each
/// boundary (this source is then shared process-wide). `flags`: 0 or
/// MEMPROBE_PROCESS_PRESERVE_HWM.
#[no_mangle]
pub extern "C" fn memprobe_source_new_process(
    flags: u32,
    out: *mut *mut memprobe_source,
) -> memprobe_status {
    entry_point("memprobe_source_new_process", || {
        check_flags(flags, MEMPROBE_PROCESS_PRESERVE_HWM, "process flags")?;
        let src = if flags & MEMPROBE_PROCESS_PRESERVE_HWM != 0 {
            Source::process_preserving_hwm()?
        } else {
            Source::process()?
        };
        publish(src, out)
    })
}

/// This process and all its descendants (sum of RSS; sampled).
#[no_mangle]
pub extern "C" fn memprobe_source_new_process_tree(
    out: *mut *mut memprobe_source,
) -> memprobe_status {
    entry_point("memprobe_source_new_process_tree", || {
        publish(Source::process_tree()?, out)
    })
}

/// The machine's RAM: used = MemTotal - MemAvailable (sampled).
#[no_mangle]
pub extern "C" fn memprobe_source_new_system_ram(
    out: *mut *mut memprobe_source,
) -> memprobe_status {
    entry_point("memprobe_source_new_system_ram", || {
        publish(Source::system_ram()?, out)
    })
}

/// The container's memory cgroup (v1 or v2): usage, limit (absent = no
/// limit); exact peak where the kernel's can be reset. MEMPROBE_STATUS_UNAVAILABLE
/// when no memory cgroup is found.
#[no_mangle]
pub extern "C" fn memprobe_source_new_cgroup(out: *mut *mut memprobe_source) -> memprobe_status {
    entry_point("memprobe_source_new_cgroup", || {
        publish(Source::cgroup()?, out)
    })
}

/// `memprobe_source_new_smaps` / `memprobe_source_new_process_tree_smaps`
/// metric: proportional set size.
pub const MEMPROBE_SMAPS_PSS: u32 = 0;
/// `memprobe_source_new_smaps` / `memprobe_source_new_process_tree_smaps`
/// metric: unique set size (private pages).
pub const MEMPROBE_SMAPS_USS: u32 = 1;

/// PSS or USS of this process from /proc/self/smaps_rollup. Opt-in: each read
/// costs milliseconds per GiB mapped. `metric`: MEMPROBE_SMAPS_PSS or _USS.
#[no_mangle]
pub extern "C" fn memprobe_source_new_smaps(
    metric: u32,
    out: *mut *mut memprobe_source,
) -> memprobe_status {
    entry_point("memprobe_source_new_smaps", || {
        publish(Source::smaps(smaps_metric(metric)?)?, out)
    })
}

/// The PSS or USS of this process and all its descendants (e.g. DataLoader
/// workers): the sum of each one's `/proc/<pid>/smaps_rollup` (sampled).
/// Where the tree's summed RSS counts a page once in every process sharing
/// it (workers forked from a trainer share its pages copy-on-write), the
/// tree's PSS counts it once; the USS counts only pages private to each
/// process. Opt-in: each read walks every mapping of every process of the
/// tree (milliseconds for big processes). Processes that exit during a read
/// are skipped, and a read during which one ends is taken again once (its
/// shared pages would otherwise be counted twice). `metric`: MEMPROBE_SMAPS_PSS (kind
/// MEMPROBE_SOURCE_KIND_PROCESS_TREE_PSS) or MEMPROBE_SMAPS_USS (kind
/// MEMPROBE_SOURCE_KIND_PROCESS_TREE_USS). MEMPROBE_STATUS_UNAVAILABLE
/// without smaps_rollup (Linux < 4.14); MEMPROBE_STATUS_PERMISSION_DENIED
/// when a process of the tree belongs to another user.
#[no_mangle]
pub extern "C" fn memprobe_source_new_process_tree_smaps(
    metric: u32,
    out: *mut *mut memprobe_source,
) -> memprobe_status {
    entry_point("memprobe_source_new_process_tree_smaps", || {
        publish(Source::process_tree_smaps(smaps_metric(metric)?)?, out)
    })
}

fn smaps_metric(metric: u32) -> FfiResult<SmapsMetric> {
    match metric {
        MEMPROBE_SMAPS_PSS => Ok(SmapsMetric::Pss),
        MEMPROBE_SMAPS_USS => Ok(SmapsMetric::Uss),
        other => Err(FfiError::new(
            memprobe_status::InvalidArgument,
            format!(
                "unknown smaps metric {other} (MEMPROBE_SMAPS_PSS = 0, MEMPROBE_SMAPS_USS = 1)"
            ),
        )),
    }
}

/// A source whose values the caller pushes with memprobe_source_push (e.g. a
/// framework allocator's allocated bytes). `name`: 1 to 64 printable bytes.
#[no_mangle]
pub extern "C" fn memprobe_source_new_pushed(
    name: *const c_char,
    out: *mut *mut memprobe_source,
) -> memprobe_status {
    entry_point("memprobe_source_new_pushed", || {
        publish(Source::pushed(text(name, "name")?)?, out)
    })
}

/// The read function of a custom source: store the bytes in use in
/// `*out_bytes` and return 0, or return non-zero on failure. May be called
/// from the monitor thread.
#[allow(non_camel_case_types)]
pub type memprobe_read_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, out_bytes: *mut u64) -> i32>;

/// A custom source read by calling `read(user_data, &bytes)` (sampled: the
/// monitor polls it while a window is open over it). `user_data` must stay
/// valid until the source and every window or trace over it are freed.
#[no_mangle]
pub extern "C" fn memprobe_source_new_callback(
    name: *const c_char,
    read: memprobe_read_fn,
    user_data: *mut c_void,
    out: *mut *mut memprobe_source,
) -> memprobe_status {
    entry_point("memprobe_source_new_callback", || {
        let name = text(name, "name")?;
        let read = read.ok_or_else(|| crate::boundary::null("read"))?;
        let data = UserData::new(user_data);
        let f = move || {
            let mut bytes = 0u64;
            // SAFETY: the caller's function, with the caller's data, per the contract above.
            let rc = unsafe { read(data.get(), &mut bytes) };
            if rc == 0 {
                Ok(bytes)
            } else {
                Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("read callback returned {rc}"),
                ))
            }
        };
        publish(Source::callback(name, Box::new(f))?, out)
    })
}

/// Releases a source handle. Windows and traces opened over the source keep
/// it alive until they are freed. NULL is a no-op.
#[no_mangle]
pub extern "C" fn memprobe_source_free(source: *mut memprobe_source) -> memprobe_status {
    free_point("memprobe_source_free", || {
        release(source)?;
        Ok(())
    })
}

/// Takes one reading now (a pushed source returns its last pushed value).
#[no_mangle]
pub extern "C" fn memprobe_source_read(
    source: *const memprobe_source,
    out: *mut memprobe_sample,
) -> memprobe_status {
    entry_point("memprobe_source_read", || {
        let slot = self::out(out, "out")?;
        *slot = self::source(source)?.read()?.into();
        Ok(())
    })
}

/// The bytes in use now, in `*out`: the cheapest read, for a hot loop that
/// needs only the figure. Like memprobe_source_read it counts towards the
/// peak of every open window, but it reads no clock and fills no sample. A
/// pushed source returns its last pushed value.
#[no_mangle]
pub extern "C" fn memprobe_source_read_used(
    source: *const memprobe_source,
    out: *mut u64,
) -> memprobe_status {
    entry_point("memprobe_source_read_used", || {
        let slot = self::out(out, "out")?;
        *slot = self::source(source)?.read_used()?;
        Ok(())
    })
}

/// Pushes the current value of a pushed source, in bytes.
#[no_mangle]
pub extern "C" fn memprobe_source_push(
    source: *const memprobe_source,
    used: u64,
) -> memprobe_status {
    entry_point("memprobe_source_push", || {
        Ok(self::source(source)?.push(used)?)
    })
}

/// Name, kind and fidelity of a source.
#[no_mangle]
pub extern "C" fn memprobe_source_get_info(
    source: *const memprobe_source,
    out: *mut memprobe_source_info,
) -> memprobe_status {
    entry_point("memprobe_source_get_info", || {
        let slot = self::out(out, "out")?;
        let src = self::source(source)?;
        let info = src.info();
        let mut name = [0 as c_char; 72];
        crate::boundary::copy_to_fixed(&mut name, &info.name);
        *slot = memprobe_source_info {
            kind: kind_code(info.kind),
            fidelity: fidelity_code(info.fidelity),
            name,
        };
        Ok(())
    })
}

/// Why the source's last read failed — a read by memprobe_source_read, a
/// window boundary or the monitor thread (e.g. MEMPROBE_STATUS_GPU_LOST for
/// a GPU that fell off the bus while the monitor polled it). `*error`
/// receives the failure's status, MEMPROBE_STATUS_OK when the last read
/// succeeded (a good read clears it); the message goes to `buf[0..len]` as
/// in memprobe_trace_format (`""` when there is none; `buf` may be NULL when
/// `len` is 0; `*needed`, nullable, receives the size needed).
#[no_mangle]
pub extern "C" fn memprobe_source_get_last_error(
    source: *const memprobe_source,
    error: *mut memprobe_status,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> memprobe_status {
    entry_point("memprobe_source_get_last_error", || {
        let slot = out(error, "error")?;
        let last = self::source(source)?.last_error()?;
        let (status, message) = match &last {
            None => (memprobe_status::Ok, ""),
            Some(e) => (memprobe_status::from_kind(e.kind()), e.message()),
        };
        *slot = status;
        copy_out(message, buf, len, needed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fidelity_and_kind_has_its_c_value() {
        // Exhaustive: a new fidelity does not compile until it is numbered here.
        let promised = |f: PeakFidelity| match f {
            PeakFidelity::Exact => 0,
            PeakFidelity::Pushed => 1,
            PeakFidelity::Sampled => 2,
        };
        for f in [
            PeakFidelity::Exact,
            PeakFidelity::Pushed,
            PeakFidelity::Sampled,
        ] {
            assert_eq!(fidelity_code(f), promised(f));
        }
        // Exhaustive too: the values the header promises (memprobe.h).
        let promised = |k: SourceKind| match k {
            SourceKind::Process => 0,
            SourceKind::ProcessTree => 1,
            SourceKind::SystemRam => 2,
            SourceKind::Cgroup => 3,
            SourceKind::GpuDevice => 4,
            SourceKind::GpuProcess => 5,
            SourceKind::Custom => 6,
            SourceKind::ProcessPss => 7,
            SourceKind::ProcessUss => 8,
            SourceKind::GpuExact => 9,
            SourceKind::ProcessTreePss => 10,
            SourceKind::ProcessTreeUss => 11,
        };
        for k in [
            SourceKind::Process,
            SourceKind::ProcessTree,
            SourceKind::SystemRam,
            SourceKind::Cgroup,
            SourceKind::GpuDevice,
            SourceKind::GpuProcess,
            SourceKind::Custom,
            SourceKind::ProcessPss,
            SourceKind::ProcessUss,
            SourceKind::GpuExact,
            SourceKind::ProcessTreePss,
            SourceKind::ProcessTreeUss,
        ] {
            assert_eq!(kind_code(k), promised(k), "{k:?}");
        }
    }
}
