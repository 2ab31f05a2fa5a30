//! The container's memory from its cgroup, v1 or v2, hybrid layouts included.
//!
//! Discovery reads `/proc/self/cgroup` per controller: if a v1 hierarchy has
//! the `memory` controller (v1 or hybrid layouts) it is used, else the v2
//! unified hierarchy. The path is resolved against the hierarchy's mount in
//! `/proc/self/mountinfo` (its root may be a sub-path inside a container).
//!
//! Peaks: v2 `memory.peak` is reset per open descriptor by writing to it
//! (Linux ≥ 6.12), which disturbs nobody; v1 `memory.max_usage_in_bytes` is
//! reset by writing 0 (cgroup-wide). Where neither works the peak is sampled.
//! An unlimited limit (`max` in v2, ≈ 2^63 in v1) is reported as no limit.
//!
//! OOM events ([`OomEvents`]): the kernel counts, per cgroup, the times the
//! OOM killer ran and the processes it killed: v2 `memory.events`, v1
//! `memory.oom_control` (its `oom_kill` line since Linux 4.13). A kill
//! shows as a rise of `oom_kill` between two reads.

use crate::error::{Error, Result};
use crate::procfs::{self, ProcFile};
use crate::sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
use crate::sampler::Sampler;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Values at or above this are v1's "no limit" (PAGE_COUNTER_MAX × page size).
const V1_UNLIMITED: u64 = 1 << 62;

/// Which cgroup hierarchy holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// cgroup v1 (`memory.usage_in_bytes`).
    V1,
    /// cgroup v2 (`memory.current`).
    V2,
}

impl CgroupVersion {
    /// `"v1"` or `"v2"`.
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        }
    }
}

/// Where this process's memory cgroup lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLocation {
    /// v1 or v2.
    pub version: CgroupVersion,
    /// The cgroup's directory.
    pub dir: PathBuf,
}

/// Finds this process's memory cgroup.
pub fn discover() -> Result<CgroupLocation> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| Error::io("read /proc/self/cgroup", &e))?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::io("read /proc/self/mountinfo", &e))?;
    discover_from(&cgroup, &mountinfo, Path::new("/"))
}

/// Finds the memory cgroup from the texts of `/proc/self/cgroup` and
/// `/proc/self/mountinfo`; mount points are taken relative to `root`
/// (`/` on a live system, a fixture directory in tests).
pub fn discover_from(cgroup: &str, mountinfo: &str, root: &Path) -> Result<CgroupLocation> {
    let mut v1_path = None;
    let mut v2_path = None;
    for line in cgroup.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2_path = Some(path);
        } else if controllers.split(',').any(|c| c == "memory") {
            v1_path = Some(path);
        }
    }
    let mounts: Vec<Mount> = mountinfo.lines().filter_map(Mount::parse).collect();
    if let Some(path) = v1_path {
        if let Some(m) = mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.super_opts.split(',').any(|o| o == "memory"))
        {
            if let Some(dir) = m.resolve(path, root, "memory.usage_in_bytes") {
                return Ok(CgroupLocation {
                    version: CgroupVersion::V1,
                    dir,
                });
            }
        }
    }
    if let Some(path) = v2_path {
        if let Some(m) = mounts.iter().find(|m| m.fstype == "cgroup2") {
            if let Some(dir) = m.resolve(path, root, "memory.current") {
                return Ok(CgroupLocation {
                    version: CgroupVersion::V2,
                    dir,
                });
            }
            return Err(Error::unavailable(format!(
                "cgroup v2 path {path} has no memory.current (the root cgroup, or the memory controller is not enabled)"
            )));
        }
    }
    Err(Error::unavailable(
        "no memory cgroup found in /proc/self/cgroup and /proc/self/mountinfo",
    ))
}

struct Mount<'a> {
    root: &'a str,
    mount_point: &'a str,
    fstype: &'a str,
    super_opts: &'a str,
}

impl<'a> Mount<'a> {
    fn parse(line: &'a str) -> Option<Mount<'a>> {
        let (pre, post) = line.split_once(" - ")?;
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        Some(Mount {
            root: pre.get(3)?,
            mount_point: pre.get(4)?,
            fstype: post.first()?,
            super_opts: post.get(2).copied().unwrap_or(""),
        })
    }

    /// The directory of cgroup `path` under this mount, if it holds `probe`.
    fn resolve(&self, path: &str, root: &Path, probe: &str) -> Option<PathBuf> {
        let mount_point = root.join(self.mount_point.trim_start_matches('/'));
        let rel = if self.root == "/" {
            Some(path)
        } else {
            path.strip_prefix(self.root)
                .filter(|r| r.is_empty() || r.starts_with('/'))
        };
        let mut candidates = Vec::new();
        if let Some(rel) = rel {
            candidates.push(mount_point.join(rel.trim_start_matches('/')));
        }
        // Inside a cgroup namespace the mount root is the process's own cgroup.
        candidates.push(mount_point);
        candidates.into_iter().find(|d| d.join(probe).exists())
    }
}

/// The OOM event counters of a memory cgroup, as the kernel keeps them.
/// A counter the kernel does not keep (or this cgroup version lacks) is
/// `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OomEvents {
    /// v2 `oom`: times the cgroup hit its limit and reclaim failed, so the
    /// OOM killer was invoked (whether or not it killed).
    pub oom: Option<u64>,
    /// v2 and v1 (Linux ≥ 4.13) `oom_kill`: processes of the cgroup killed
    /// by an OOM killer (the cgroup's own or the machine's).
    pub oom_kill: Option<u64>,
    /// v2 `oom_group_kill` (Linux ≥ 5.17): times the whole cgroup was killed
    /// at once (`memory.oom.group`).
    pub oom_group_kill: Option<u64>,
    /// v2 `max`: times usage reached `memory.max` (reclaim ran; not a kill).
    pub max: Option<u64>,
    /// v1 `under_oom`: the cgroup is in an OOM state now (only lasts when
    /// the OOM killer is disabled for it).
    pub under_oom: Option<bool>,
}

impl OomEvents {
    /// Parses v2 `memory.events` (`<key> <count>` lines); `None` when no
    /// known key is present.
    pub fn parse_v2(text: &[u8]) -> Option<OomEvents> {
        let get = |key: &[u8]| space_keyed_u64(text, key);
        let e = OomEvents {
            oom: get(b"oom"),
            oom_kill: get(b"oom_kill"),
            oom_group_kill: get(b"oom_group_kill"),
            max: get(b"max"),
            under_oom: None,
        };
        (e != OomEvents::default()).then_some(e)
    }

    /// Parses v1 `memory.oom_control` (`oom_kill_disable`, `under_oom` and,
    /// since Linux 4.13, `oom_kill`); `None` when none is present.
    pub fn parse_v1(text: &[u8]) -> Option<OomEvents> {
        let e = OomEvents {
            oom_kill: space_keyed_u64(text, b"oom_kill"),
            under_oom: space_keyed_u64(text, b"under_oom").map(|v| v != 0),
            ..OomEvents::default()
        };
        (e != OomEvents::default()).then_some(e)
    }

    /// Parses the file of `version` (see [`OomEvents::file`]).
    pub fn parse(version: CgroupVersion, text: &[u8]) -> Option<OomEvents> {
        match version {
            CgroupVersion::V1 => OomEvents::parse_v1(text),
            CgroupVersion::V2 => OomEvents::parse_v2(text),
        }
    }

    /// The file holding the counters: `memory.events` (v2) or
    /// `memory.oom_control` (v1).
    pub fn file(version: CgroupVersion) -> &'static str {
        match version {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        }
    }

    /// Reads the counters of the cgroup at `location` once; `None` where
    /// the file is missing or unreadable, or holds no counter.
    pub fn read(location: &CgroupLocation) -> Option<OomEvents> {
        let text = std::fs::read(location.dir.join(OomEvents::file(location.version))).ok()?;
        OomEvents::parse(location.version, &text)
    }
}

/// The value of a `key value` line (cgroup flat-keyed files).
fn space_keyed_u64(text: &[u8], key: &[u8]) -> Option<u64> {
    text.split(|&c| c == b'\n').find_map(|line| {
        let rest = line.strip_prefix(key)?;
        if !rest.first().is_some_and(u8::is_ascii_whitespace) {
            return None;
        }
        procfs::parse_u64(rest)
    })
}

/// Options for the cgroup sampler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupOptions {
    /// Reset the kernel's peak at window boundaries where it can be reset
    /// (exact peaks). With v1 this resets the cgroup-wide
    /// `max_usage_in_bytes`, which other tools reading it will notice.
    pub reset_peak: bool,
}

impl Default for CgroupOptions {
    fn default() -> Self {
        CgroupOptions { reset_peak: true }
    }
}

/// Reads the container's usage, limit and peak.
pub struct CgroupSampler {
    location: CgroupLocation,
    usage: ProcFile,
    limit: ProcFile,
    peak: Option<PeakFile>,
    /// The OOM event counters' file, kept open; `None` where it cannot be
    /// opened.
    events: Option<ProcFile>,
}

struct PeakFile {
    file: File,
    path: PathBuf,
    buf: [u8; 32],
    version: CgroupVersion,
}

impl PeakFile {
    fn read(&mut self) -> Result<u64> {
        let n = self
            .file
            .read_at(&mut self.buf, 0)
            .map_err(|e| Error::io(format!("read {}", self.path.display()), &e))?;
        procfs::parse_u64(&self.buf[..n])
            .ok_or_else(|| procfs::malformed(&self.path, "not a number"))
    }

    fn reset(&mut self) -> Result<()> {
        let data: &[u8] = match self.version {
            CgroupVersion::V1 => b"0",
            CgroupVersion::V2 => b"reset\n",
        };
        self.file
            .write_at(data, 0)
            .map_err(|e| Error::io(format!("reset {}", self.path.display()), &e))?;
        Ok(())
    }
}

impl CgroupSampler {
    /// Discovers this process's cgroup and opens it.
    pub fn new(options: CgroupOptions) -> Result<Self> {
        Self::at(discover()?, options)
    }

    /// Opens the cgroup at `location`.
    pub fn at(location: CgroupLocation, options: CgroupOptions) -> Result<Self> {
        let (usage, limit, peak) = files(location.version);
        let usage = ProcFile::open(location.dir.join(usage))?;
        let limit = ProcFile::open(location.dir.join(limit))?;
        let peak = if options.reset_peak {
            open_resettable_peak(&location, peak)
        } else {
            None
        };
        let events = ProcFile::open(location.dir.join(OomEvents::file(location.version))).ok();
        let mut s = CgroupSampler {
            location,
            usage,
            limit,
            peak,
            events,
        };
        s.read()?;
        Ok(s)
    }

    /// Where the cgroup is.
    pub fn location(&self) -> &CgroupLocation {
        &self.location
    }

    /// The cgroup's own high-water mark since it was created (or last reset,
    /// by anyone), read without resetting it: v2 `memory.peak`, v1
    /// `memory.max_usage_in_bytes`. `None` where unreadable (v2 before
    /// Linux 5.19 has no `memory.peak`).
    pub fn lifetime_peak(&self) -> Option<u64> {
        let text = std::fs::read(self.location.dir.join(files(self.location.version).2)).ok()?;
        procfs::parse_u64(&text)
    }

    /// The OOM event counters now (one `pread` of a kept-open file); `None`
    /// where this kernel or cgroup keeps none, or the read failed.
    pub fn oom_events(&mut self) -> Option<OomEvents> {
        let version = self.location.version;
        let text = self.events.as_mut()?.read().ok()?;
        OomEvents::parse(version, text)
    }

    fn read_limit(&mut self) -> Result<Option<u64>> {
        let text = self.limit.read()?;
        let trimmed = text.trim_ascii();
        if trimmed == b"max" {
            return Ok(None);
        }
        let v = procfs::parse_u64(trimmed)
            .ok_or_else(|| procfs::malformed(self.limit.path(), "not a number or 'max'"))?;
        Ok((v < V1_UNLIMITED).then_some(v))
    }
}

/// The usage, limit and high-water-mark files of a cgroup version.
fn files(version: CgroupVersion) -> (&'static str, &'static str, &'static str) {
    match version {
        CgroupVersion::V1 => (
            "memory.usage_in_bytes",
            "memory.limit_in_bytes",
            "memory.max_usage_in_bytes",
        ),
        CgroupVersion::V2 => ("memory.current", "memory.max", "memory.peak"),
    }
}

/// Opens the peak file read-write and checks that a reset is accepted.
fn open_resettable_peak(location: &CgroupLocation, name: &str) -> Option<PeakFile> {
    let path = location.dir.join(name);
    let file = OpenOptions::new().read(true).write(true).open(&path).ok()?;
    let mut p = PeakFile {
        file,
        path,
        buf: [0; 32],
        version: location.version,
    };
    p.reset().ok()?;
    p.read().ok()?;
    Some(p)
}

impl Sampler for CgroupSampler {
    fn info(&self) -> SourceInfo {
        let fidelity = if self.peak.is_some() {
            PeakFidelity::Exact
        } else {
            PeakFidelity::Sampled
        };
        SourceInfo {
            name: "cgroup".into(),
            kind: SourceKind::Cgroup,
            fidelity,
        }
    }

    fn read(&mut self) -> Result<Sample> {
        let t0 = monotonic_ns();
        let used = self.read_used()?;
        let limit = self.read_limit()?;
        Ok(Sample {
            limit,
            free: limit.map(|l| l.saturating_sub(used)),
            ..Sample::timed(used, t0)
        })
    }

    fn read_used(&mut self) -> Result<u64> {
        let text = self.usage.read()?;
        procfs::parse_u64(text).ok_or_else(|| procfs::malformed(self.usage.path(), "not a number"))
    }

    fn read_peak(&mut self) -> Result<Option<u64>> {
        match self.peak.as_mut() {
            Some(p) => p.read().map(Some),
            None => Ok(None),
        }
    }

    fn reset_peak(&mut self) -> Result<Sample> {
        if let Some(p) = self.peak.as_mut() {
            p.reset()?;
        }
        self.read()
    }
}

impl std::fmt::Debug for CgroupSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CgroupSampler")
            .field("location", &self.location)
            .field("resettable_peak", &self.peak.is_some())
            .field("oom_events", &self.events.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v2_memory_events() {
        let text = b"low 0\nhigh 12\nmax 40\noom 3\noom_kill 2\noom_group_kill 1\n";
        let e = OomEvents::parse_v2(text).unwrap();
        assert_eq!(
            e,
            OomEvents {
                oom: Some(3),
                oom_kill: Some(2),
                oom_group_kill: Some(1),
                max: Some(40),
                under_oom: None,
            }
        );
        // Before Linux 5.17: no oom_group_kill.
        let old = OomEvents::parse_v2(b"low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n").unwrap();
        assert_eq!((old.oom_kill, old.oom_group_kill), (Some(0), None));
        assert_eq!(OomEvents::parse_v2(b""), None);
        assert_eq!(OomEvents::parse_v2(b"low 1\n"), None);
    }

    #[test]
    fn parses_v1_oom_control() {
        let e = OomEvents::parse_v1(b"oom_kill_disable 0\nunder_oom 1\noom_kill 7\n").unwrap();
        assert_eq!(
            (e.oom_kill, e.under_oom, e.oom),
            (Some(7), Some(true), None)
        );
        // Before Linux 4.13: no oom_kill line.
        let old = OomEvents::parse_v1(b"oom_kill_disable 0\nunder_oom 0\n").unwrap();
        assert_eq!((old.oom_kill, old.under_oom), (None, Some(false)));
        // `oom_kill_disable` is not `oom_kill`.
        assert_eq!(OomEvents::parse_v1(b"oom_kill_disable 1\n"), None);
        assert_eq!(
            OomEvents::parse(CgroupVersion::V1, b"under_oom 0\noom_kill 2\n")
                .unwrap()
                .oom_kill,
            Some(2)
        );
    }

    #[test]
    fn this_machines_counters_or_none() {
        // Whatever this machine has: a reading that parses, or None; never
        // an error or a panic.
        if let Ok(loc) = discover() {
            if let Some(e) = OomEvents::read(&loc) {
                assert!(e.oom_kill.is_some() || e.under_oom.is_some() || e.oom.is_some());
            }
            if let Ok(mut s) = CgroupSampler::at(loc, CgroupOptions { reset_peak: false }) {
                let _ = s.oom_events();
            }
        }
    }
}
