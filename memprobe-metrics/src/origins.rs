//! `memprobe_gpu_origin_bytes`: the GPU memory a process holds now, by
//! origin (the library that asked for it, as memprobe's driver-API
//! interposer names it: PyTorch's caching allocator, NCCL, cuBLAS, the
//! program). In the library, this process's (when the interposer is loaded
//! in it); in `memprobe serve`, every live process whose interposer region
//! is in the regions directory, with a `pid` label.
//!
//! Bounded: per process and device, the [`TOP_ORIGINS`] largest origins by
//! bytes, same names summed, and one `origin="other"` series for the rest,
//! so a process's series are at most `TOP_ORIGINS + 1` per device whatever
//! it loads.

use crate::text::{Exposition, Type};
use memprobe_interpose_reader::origin_names::by_familiar_name;
use memprobe_interpose_reader::origins::{OriginBytes, OVERFLOW_LIBRARY};
use memprobe_interpose_reader::{all_region_dirs, processes, Counter, Region};
use std::path::PathBuf;

/// Origins with a series of their own per process and device; the rest
/// are summed under `origin="other"`.
pub const TOP_ORIGINS: usize = 8;

/// The label of the series that sums the origins past [`TOP_ORIGINS`] (and
/// the interposer's own overflow line).
pub const OTHER: &str = "other";

/// Whose origins a scrape exports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum OriginsScope {
    /// None.
    #[default]
    Off,
    /// This process's, when the interposer is loaded in it (no `pid`).
    InProcess,
    /// Every live process with a region in this directory (`pid` label).
    Regions(PathBuf),
    /// Every live process with a region in any of this user's regions
    /// directories ([`memprobe_interpose_reader::all_region_dirs`]: every
    /// `memprobe run --gpu-exact`'s too), with `pid`.
    AllRegions,
}

/// One process's live bytes by origin, per device.
pub(crate) struct ProcessOrigins {
    /// `None` in-process.
    pub(crate) pid: Option<u32>,
    /// Per device with anything held: the device and its origins.
    pub(crate) devices: Vec<(u32, Vec<OriginBytes>)>,
}

fn read_region(pid: Option<u32>, r: &Region) -> Option<ProcessOrigins> {
    if !r.keeps_origins() {
        return None;
    }
    let devices = r
        .counters_seen()
        .into_iter()
        .filter_map(|c| match c {
            Counter::Device(d) => Some((d, r.live_by_origin(c))),
            Counter::HostPinned => None,
        })
        .filter(|(_, v)| !v.is_empty())
        .collect();
    Some(ProcessOrigins { pid, devices })
}

/// What `scope` holds now; nothing where it cannot be read.
pub(crate) fn read(scope: &OriginsScope) -> Vec<ProcessOrigins> {
    match scope {
        OriginsScope::Off => Vec::new(),
        OriginsScope::InProcess => Region::in_process()
            .ok()
            .and_then(|r| read_region(None, &r))
            .into_iter()
            .collect(),
        OriginsScope::Regions(dir) => of_dirs(std::slice::from_ref(dir)),
        OriginsScope::AllRegions => of_dirs(&all_region_dirs()),
    }
}

/// Every live process with a region in `dirs`, by pid (a pid in two
/// directories, a run's and the default, counts once).
fn of_dirs(dirs: &[PathBuf]) -> Vec<ProcessOrigins> {
    let mut entries: Vec<_> = dirs
        .iter()
        .flat_map(|d| processes(d).unwrap_or_default())
        .filter(|e| e.alive)
        .collect();
    entries.sort_by_key(|e| e.pid);
    entries.dedup_by_key(|e| e.pid);
    entries
        .into_iter()
        .filter_map(|e| {
            let r = Region::open_path(&e.path).ok()?;
            read_region(Some(e.pid), &r)
        })
        .collect()
}

/// The series of one process on one device: familiar names summed, the
/// largest [`TOP_ORIGINS`], then [`OTHER`] for the rest (absent when
/// nothing is left over).
pub(crate) fn bounded(origins: &[OriginBytes]) -> Vec<(String, u64)> {
    let overflow = |o: &&OriginBytes| o.origin.library == OVERFLOW_LIBRARY;
    let mut other: u64 = origins.iter().filter(overflow).map(|o| o.bytes).sum();
    let mut named = by_familiar_name(origins.iter().filter(|o| !overflow(o)));
    if named.len() > TOP_ORIGINS {
        other += named[TOP_ORIGINS..].iter().map(|n| n.1).sum::<u64>();
        named.truncate(TOP_ORIGINS);
    }
    // A library could be called "other": it joins the rest rather than
    // clash with its series.
    if let Some(i) = named.iter().position(|(n, _)| n == OTHER) {
        other += named.remove(i).1;
    }
    if other > 0 {
        named.push((OTHER.to_owned(), other));
    }
    named
}

/// Writes the family (nothing when no process holds anything by origin).
pub(crate) fn family(e: &mut Exposition, procs: &[ProcessOrigins], common: &[(&str, &str)]) {
    const NAME: &str = "memprobe_gpu_origin_bytes";
    let mut rows: Vec<(String, String, Option<String>, u64)> = Vec::new();
    for p in procs {
        for (device, origins) in &p.devices {
            for (origin, bytes) in bounded(origins) {
                rows.push((
                    device.to_string(),
                    origin,
                    p.pid.map(|x| x.to_string()),
                    bytes,
                ));
            }
        }
    }
    if rows.is_empty() {
        return;
    }
    e.family(
        NAME,
        "GPU memory a process holds now by origin (the library that asked for it, as memprobe's driver-API interposer names it), bytes; the largest 8 origins per process and GPU, the rest summed as origin=\"other\". gpu is the CUDA ordinal as the process numbers it.",
        Type::Gauge,
    );
    for (gpu, origin, pid, bytes) in &rows {
        let mut labels = vec![("gpu", gpu.as_str()), ("origin", origin.as_str())];
        if let Some(pid) = pid {
            labels.push(("pid", pid.as_str()));
        }
        e.sample(NAME, &labels, common, *bytes as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprobe_interpose_reader::origins::Origin;

    fn o(id: usize, library: &str, program: bool, bytes: u64) -> OriginBytes {
        OriginBytes {
            origin: Origin {
                id,
                library: library.into(),
                symbol: None,
                address: 0,
                offset: 0,
                program,
            },
            bytes,
        }
    }

    #[test]
    fn the_largest_origins_keep_a_series_and_the_rest_is_other() {
        let mut v = vec![
            o(0, "/t/libc10_cuda.so", false, 1000),
            o(1, "/n/libnccl.so.2", false, 300),
            o(2, "/usr/bin/python3", true, 5),
            o(3, "/a/libcublasLt.so.12", false, 40),
            o(4, "/b/libcublasLt.so.12", false, 2),
            o(5, OVERFLOW_LIBRARY, false, 7),
        ];
        for i in 0..10 {
            v.push(o(10 + i, &format!("/x/lib{i}.so"), false, 10 + i as u64));
        }
        let b = bounded(&v);
        assert_eq!(b.len(), TOP_ORIGINS + 1);
        assert_eq!(b[0], ("PyTorch caching allocator".into(), 1000));
        assert_eq!(b[1], ("NCCL".into(), 300));
        assert_eq!(b[2], ("cuBLASLt".into(), 42));
        assert_eq!(b.last().unwrap().0, OTHER);
        // Nothing lost, nothing counted twice.
        let all: u64 = v.iter().map(|o| o.bytes).sum();
        assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), all);
        // Few origins: no "other" series.
        let few = bounded(&v[..3]);
        assert_eq!(few.len(), 3);
        assert!(few.iter().all(|(n, _)| n != OTHER));
        assert_eq!(few[2], ("the program".into(), 5));
        // A library named "other" joins the rest.
        let odd = bounded(&[o(0, "/x/other", false, 3), o(1, "/x/liba.so", false, 4)]);
        assert_eq!(odd, vec![("liba.so".into(), 4), (OTHER.into(), 3)]);
    }

    #[test]
    fn the_family_labels_each_process_and_gpu() {
        let procs = vec![
            ProcessOrigins {
                pid: Some(42),
                devices: vec![
                    (0, vec![o(0, "/n/libnccl.so.2", false, 1 << 20)]),
                    (3, vec![o(1, "/usr/bin/x", true, 5)]),
                ],
            },
            ProcessOrigins {
                pid: Some(7),
                devices: vec![],
            },
        ];
        let mut e = Exposition::new();
        family(&mut e, &procs, &[("hostname", "h")]);
        let text = e.finish();
        assert!(
            text.contains("# TYPE memprobe_gpu_origin_bytes gauge\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "memprobe_gpu_origin_bytes{gpu=\"0\",origin=\"NCCL\",pid=\"42\",hostname=\"h\"} 1048576\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "memprobe_gpu_origin_bytes{gpu=\"3\",origin=\"the program\",pid=\"42\",hostname=\"h\"} 5\n"
            ),
            "{text}"
        );
        let mut empty = Exposition::new();
        family(&mut empty, &procs[1..], &[]);
        assert!(!empty.finish().contains("memprobe_gpu_origin_bytes"));
        // In-process: no pid label.
        let me = [ProcessOrigins {
            pid: None,
            devices: vec![(1, vec![o(0, "/n/libnccl.so.2", false, 9)])],
        }];
        let mut e = Exposition::new();
        family(&mut e, &me, &[]);
        assert!(e
            .finish()
            .contains("memprobe_gpu_origin_bytes{gpu=\"1\",origin=\"NCCL\"} 9\n"));
    }
}
