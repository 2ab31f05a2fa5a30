//! Host samplers: cgroup discovery on fixtures, the live cgroup, system RAM,
//! the process tree, PSS/USS.

use memprobe_core::internal::cgroup::discover_from;
use memprobe_core::{
    CgroupLocation, CgroupOptions, CgroupSampler, CgroupVersion, ErrorKind, Sampler, SmapsMetric,
    Source, SourceKind,
};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memprobe-cg-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

const HYBRID_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

#[test]
fn hybrid_layout_uses_the_v1_memory_controller() {
    let root = fixture("hybrid");
    write(
        &root,
        "sys/fs/cgroup/memory/job/abc/memory.usage_in_bytes",
        "68112384\n",
    );
    write(
        &root,
        "sys/fs/cgroup/memory/job/abc/memory.limit_in_bytes",
        "9223372036854771712\n",
    );
    write(
        &root,
        "sys/fs/cgroup/memory/job/abc/memory.max_usage_in_bytes",
        "1015148544\n",
    );
    let cg = "5:devices:/\n4:memory:/job/abc\n0::/\n";
    let loc = discover_from(cg, HYBRID_MOUNTS, &root).unwrap();
    assert_eq!(
        loc,
        CgroupLocation {
            version: CgroupVersion::V1,
            dir: root.join("sys/fs/cgroup/memory/job/abc")
        }
    );
    let mut s = CgroupSampler::at(loc, CgroupOptions { reset_peak: false }).unwrap();
    let r = s.read().unwrap();
    assert_eq!(r.used, 68112384);
    assert_eq!(r.limit, None, "9223372036854771712 is 'no limit'");
    assert_eq!(r.free, None);
    assert_eq!(s.info().kind, SourceKind::Cgroup);
    assert_eq!(s.lifetime_peak(), Some(1015148544), "read, never reset");
    assert_eq!(s.lifetime_peak(), Some(1015148544));
}

#[test]
fn v2_with_limit_and_namespace_root() {
    let root = fixture("v2");
    write(&root, "sys/fs/cgroup/memory.current", "1000\n");
    write(&root, "sys/fs/cgroup/memory.max", "4000\n");
    // Inside a cgroup namespace the mount root is the process's own cgroup,
    // while /proc/self/cgroup may still name a path the mount doesn't show.
    let mounts = "30 1 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
    let loc = discover_from("0::/kubepods/pod1\n", mounts, &root).unwrap();
    assert_eq!(loc.version, CgroupVersion::V2);
    assert_eq!(loc.dir, root.join("sys/fs/cgroup"));
    let mut s = CgroupSampler::at(loc, CgroupOptions { reset_peak: false }).unwrap();
    let r = s.read().unwrap();
    assert_eq!((r.used, r.limit, r.free), (1000, Some(4000), Some(3000)));
    assert_eq!(
        s.read_used().unwrap(),
        1000,
        "the bytes alone, the same figure"
    );
    assert_eq!(s.lifetime_peak(), None, "no memory.peak before Linux 5.19");
    write(&root, "sys/fs/cgroup/memory.peak", "5000\n");
    assert_eq!(s.lifetime_peak(), Some(5000));
    write(&root, "sys/fs/cgroup/memory.max", "max\n");
    assert_eq!(s.read().unwrap().limit, None, "'max' is no limit");
    write(&root, "sys/fs/cgroup/memory.current", "garbage\n");
    assert_eq!(
        s.read().unwrap_err().kind(),
        ErrorKind::Parse,
        "malformed file: an error, not a number"
    );
    assert_eq!(s.read_used().unwrap_err().kind(), ErrorKind::Parse);
}

#[test]
fn read_used_is_the_reading_s_bytes_and_counts_towards_windows() {
    use memprobe_core::{PeakFidelity, Window};
    // This process: the same figure as a full reading, to the counters'
    // batching (both read statm).
    let rss = Source::process().unwrap();
    let used = rss.read_used().unwrap();
    let full = rss.read().unwrap().used;
    assert!(used.abs_diff(full) < 4 << 20, "{used} vs {full}");
    // A sampled source: a value only read_used saw is in every open
    // window's peak, and the last full reading is untouched.
    let value = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(10));
    let v = value.clone();
    let cb = Source::callback(
        "cb",
        Box::new(move || Ok(v.load(std::sync::atomic::Ordering::SeqCst))),
    )
    .unwrap();
    assert_eq!(cb.info().fidelity, PeakFidelity::Sampled);
    let w = Window::open(std::slice::from_ref(&cb)).unwrap();
    let last = cb.last().unwrap();
    value.store(1000, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(cb.read_used().unwrap(), 1000);
    assert_eq!(cb.last().unwrap(), last, "read_used builds no reading");
    value.store(5, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(w.peaks().unwrap(), vec![1000]);
    // A pushed source: its last value; a failing read is an error, kept.
    let pushed = Source::pushed("p").unwrap();
    assert_eq!(pushed.read_used().unwrap(), 0);
    pushed.push(77).unwrap();
    assert_eq!(pushed.read_used().unwrap(), 77);
    let failing = Source::callback(
        "f",
        Box::new(|| Err(memprobe_core::Error::new(ErrorKind::Unavailable, "gone"))),
    )
    .unwrap();
    assert_eq!(
        failing.read_used().unwrap_err().kind(),
        ErrorKind::Unavailable
    );
    assert!(failing.last_error().unwrap().is_some());
}

#[test]
fn v2_subpath_and_missing_cgroups() {
    let root = fixture("v2sub");
    write(&root, "sys/fs/cgroup/user.slice/job/memory.current", "5\n");
    write(&root, "sys/fs/cgroup/user.slice/job/memory.max", "max\n");
    let mounts = "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
    let loc = discover_from("0::/user.slice/job\n", mounts, &root).unwrap();
    assert_eq!(loc.dir, root.join("sys/fs/cgroup/user.slice/job"));
    // The root cgroup has no memory.current.
    let e = discover_from("0::/\n", mounts, &fixture("v2root")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    // No cgroup mounts at all.
    let e = discover_from("0::/\n", "", &root).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    // Garbage input does not panic.
    assert!(discover_from("::::\n\n:memory\n", "x - y\n - \n", &root).is_err());
}

#[test]
fn live_cgroup_reads_or_says_why() {
    match Source::cgroup() {
        Ok(src) => {
            let s = src.read().unwrap();
            assert!(s.used > 0);
            eprintln!(
                "cgroup: {:?} used={} limit={:?}",
                src.info().fidelity,
                s.used,
                s.limit
            );
        }
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
            eprintln!("skipped: no memory cgroup here: {e}");
        }
    }
}

#[test]
fn system_ram_and_smaps() {
    let sys = Source::system_ram().unwrap();
    let s = sys.read().unwrap();
    assert!(s.total.unwrap() > s.used && s.free.is_some());
    let pss = Source::smaps(SmapsMetric::Pss)
        .unwrap()
        .read()
        .unwrap()
        .used;
    let uss = Source::smaps(SmapsMetric::Uss)
        .unwrap()
        .read()
        .unwrap()
        .used;
    assert!(
        pss > 0 && uss > 0 && uss <= pss + (1 << 20),
        "pss={pss} uss={uss}"
    );
}

#[test]
fn process_tree_includes_children() {
    let kids: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("5")
                .spawn()
                .unwrap()
        })
        .collect();
    let pids = memprobe_core::internal::process_tree::descendants(std::process::id());
    for k in &kids {
        assert!(
            pids.contains(&k.id()),
            "child {} missing from {pids:?}",
            k.id()
        );
    }
    let tree = Source::process_tree().unwrap().read().unwrap().used;
    let me = Source::process().unwrap().read().unwrap().used;
    assert!(tree > me, "tree {tree} should exceed this process {me}");
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}

#[test]
fn clear_refs_not_permitted_degrades_to_sampled() {
    use memprobe_core::{HwmMode, ProcessSampler};
    // A path that cannot be opened for writing stands for a /proc mounted
    // read-only or a kernel without clear_refs.
    let s = ProcessSampler::with_clear_refs(HwmMode::Reset, "/proc/self").expect("RSS still reads");
    let why = s.hwm_error().expect("the reset cannot work");
    assert!(why.message().contains("clear_refs"), "{why}");
    assert_eq!(
        s.info().fidelity,
        memprobe_core::PeakFidelity::Sampled,
        "degrades, never claims exact"
    );
    let src = Source::from_sampler(Box::new(s));
    assert_eq!(src.info().fidelity, memprobe_core::PeakFidelity::Sampled);
    let w = memprobe_core::Window::open(std::slice::from_ref(&src)).unwrap();
    let now = src.read().unwrap().used;
    assert!(
        w.peaks().unwrap()[0] >= now,
        "sampled peaks still cover readings"
    );
    let d = w.measure().unwrap();
    assert_eq!(d[0].fidelity, memprobe_core::PeakFidelity::Sampled);
}

#[test]
fn unreadable_or_malformed_proc_files_are_errors_with_the_path() {
    use memprobe_core::SystemRamSampler;
    let dir = fixture("meminfo");
    // Missing file: unavailable, naming it.
    let e = SystemRamSampler::at(dir.join("absent")).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("absent"), "{e}");
    // A directory where a file should be: an error, not a panic.
    let e = SystemRamSampler::at(&dir).err().unwrap();
    assert!(e.message().contains("meminfo"), "{e}");
    // Malformed: a parse error, never a wrong number.
    write(&dir, "bad", "MemTotal: lots kB\nMemAvailable: 5 kB\n");
    let e = SystemRamSampler::at(dir.join("bad")).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Parse, "{e}");
    // Unreadable (mode 000) where permissions apply (not as root).
    write(&dir, "locked", "MemTotal: 10 kB\nMemAvailable: 5 kB\n");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join("locked"), std::fs::Permissions::from_mode(0o000)).unwrap();
    match SystemRamSampler::at(dir.join("locked")) {
        Ok(_) => eprintln!("running as root: mode 000 does not stop reads; skipped that case"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}"),
    }
    // A file that turns malformed after opening: the next read fails.
    write(&dir, "turns", "MemTotal: 10 kB\nMemAvailable: 5 kB\n");
    let mut s = SystemRamSampler::at(dir.join("turns")).unwrap();
    write(&dir, "turns", "garbage\n");
    assert_eq!(s.read().unwrap_err().kind(), ErrorKind::Parse);
}
