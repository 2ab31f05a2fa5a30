//! Who holds each GPU process's memory, for `memprobe gpus` and `watch`:
//! where memprobe's driver-API interposer counts a process (its region is
//! in the regions directory, `MEMPROBE_GPU_EXACT_DIR`), the live bytes on
//! that device by origin — the library that asked for them — as the top
//! [`TOP`] origins and one line for the rest.

use crate::units;
use memprobe_interpose_reader::origin_names::by_familiar_name;
use memprobe_interpose_reader::{all_region_dirs, processes, Counter, Region};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Origins shown by name under a process; the rest are summed.
pub(crate) const TOP: usize = 3;

/// One origin's live bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct OriginHeld {
    /// What people call it ("PyTorch caching allocator", "NCCL", "the
    /// program", else the library's file name); same names summed.
    pub(crate) name: String,
    pub(crate) bytes: u64,
}

/// A process's live bytes on one device, by origin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ProcessOrigins {
    /// Everything the interposer counts for the process on the device.
    pub(crate) held_bytes: u64,
    /// The largest [`TOP`] origins, largest first.
    pub(crate) top: Vec<OriginHeld>,
    /// How many origins are past those, and their bytes.
    pub(crate) rest_origins: usize,
    pub(crate) rest_bytes: u64,
}

impl ProcessOrigins {
    /// `name BYTES, ..., N more BYTES`.
    pub(crate) fn line(&self) -> String {
        let mut parts: Vec<String> = self
            .top
            .iter()
            .map(|o| format!("{} {}", o.name, units::bytes(o.bytes)))
            .collect();
        if self.rest_origins > 0 {
            parts.push(format!(
                "{} more {}",
                self.rest_origins,
                units::bytes(self.rest_bytes)
            ));
        }
        if parts.is_empty() {
            return "nothing counted".into();
        }
        parts.join(", ")
    }
}

/// The breakdown of one process's region on `device` (`None` when the
/// interposer keeps no origins there).
fn of_region(r: &Region, device: u32) -> Option<ProcessOrigins> {
    if !r.keeps_origins() {
        return None;
    }
    let mut named: Vec<OriginHeld> = by_familiar_name(&r.live_by_origin(Counter::Device(device)))
        .into_iter()
        .map(|(name, bytes)| OriginHeld { name, bytes })
        .collect();
    let held_bytes = named.iter().map(|n| n.bytes).sum();
    let rest: Vec<OriginHeld> = named.split_off(named.len().min(TOP));
    Some(ProcessOrigins {
        held_bytes,
        top: named,
        rest_origins: rest.len(),
        rest_bytes: rest.iter().map(|n| n.bytes).sum(),
    })
}

/// The live regions of `dir`, by pid.
fn regions(dir: &Path) -> BTreeMap<u32, Arc<Region>> {
    processes(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.alive)
        .filter_map(|e| Some((e.pid, Region::open_path(&e.path).ok()?)))
        .collect()
}

/// The regions of every process the interposer counts, found in a regions
/// directory (`MEMPROBE_GPU_EXACT_DIR` when set, else the default one and
/// every `memprobe run --gpu-exact`'s).
pub(crate) struct Counted {
    regions: BTreeMap<u32, Arc<Region>>,
    mine: Option<std::ffi::OsString>,
}

impl Counted {
    /// Finds them now.
    pub(crate) fn find() -> Counted {
        let mut regions = BTreeMap::new();
        for dir in all_region_dirs() {
            regions.extend(self::regions(&dir));
        }
        Counted {
            regions,
            mine: std::env::var_os("CUDA_VISIBLE_DEVICES"),
        }
    }

    /// What process `pid` holds on CUDA device `device` by origin; `None`
    /// when it is not counted, keeps no origins, or numbers its devices
    /// otherwise than this process (its `CUDA_VISIBLE_DEVICES` differs: the
    /// ordinals would not match).
    pub(crate) fn of(&self, pid: u32, device: u32) -> Option<ProcessOrigins> {
        let r = self.regions.get(&pid)?;
        if !same_devices(pid, self.mine.as_deref()) {
            return None;
        }
        of_region(r, device)
    }
}

/// Whether process `pid` numbers CUDA devices as this one does (the same
/// `CUDA_VISIBLE_DEVICES`, or neither has one); unreadable: assumed so.
fn same_devices(pid: u32, mine: Option<&std::ffi::OsStr>) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return true;
    };
    let theirs = env
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"CUDA_VISIBLE_DEVICES="));
    theirs == mine.map(OsStrExt::as_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_top_and_sums_the_rest() {
        let p = ProcessOrigins {
            held_bytes: 14 << 20,
            top: vec![
                OriginHeld {
                    name: "the program".into(),
                    bytes: 6 << 20,
                },
                OriginHeld {
                    name: "NCCL".into(),
                    bytes: 4 << 20,
                },
            ],
            rest_origins: 2,
            rest_bytes: 4 << 20,
        };
        assert_eq!(
            p.line(),
            "the program 6.00 MiB, NCCL 4.00 MiB, 2 more 4.00 MiB"
        );
        let none = ProcessOrigins {
            held_bytes: 0,
            top: vec![],
            rest_origins: 0,
            rest_bytes: 0,
        };
        assert_eq!(none.line(), "nothing counted");
    }

    #[test]
    fn a_process_with_another_cuda_visible_devices_is_told_apart() {
        // This test process: compare with its own environment.
        let me = std::process::id();
        let mine = std::env::var_os("CUDA_VISIBLE_DEVICES");
        assert!(same_devices(me, mine.as_deref()));
        let other = std::ffi::OsStr::new("7,3");
        assert_eq!(
            same_devices(me, Some(other)),
            mine.as_deref() == Some(other)
        );
        // A process that is gone: nothing to compare, assumed the same.
        assert!(same_devices(u32::MAX, Some(other)));
    }
}
