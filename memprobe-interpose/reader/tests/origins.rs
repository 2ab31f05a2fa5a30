//! Origins end to end on the fake driver: an NCCL-like library, a
//! cuBLAS-like one and the program allocate (directly and through a
//! CUDA-runtime-like library) in every way the interposer counts; the
//! bytes by origin, now and at each peak, are read from another process and
//! compared with the fake driver's truth, to the byte.

mod common;

use common::*;
use memprobe_interpose_reader::origins::{PeakOrigins, UNKNOWN_LIBRARY};
use memprobe_interpose_reader::{Counter, Region};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

const MIB: u64 = 1 << 20;

/// The libraries and the program of tests/interpose/origin*.c, built once.
fn origins_program() -> PathBuf {
    static PROG: OnceLock<PathBuf> = OnceLock::new();
    PROG.get_or_init(|| origin_program("origins", &["nccl", "cublas"], "origins.c", &[], "origins"))
        .clone()
}

/// Bytes by origin file name on `counter`, now.
fn live(r: &Region, counter: Counter) -> BTreeMap<String, u64> {
    r.live_by_origin(counter)
        .into_iter()
        .map(|o| (who(&o.origin.library), o.bytes))
        .collect()
}

fn breakdown(p: &PeakOrigins) -> BTreeMap<String, u64> {
    p.by_origin
        .iter()
        .map(|o| (who(&o.origin.library), o.bytes))
        .collect()
}

/// A short name for an origin's library: nccl, cublas, prog (the program).
fn who(library: &str) -> String {
    let file = library.rsplit('/').next().unwrap_or(library);
    match file {
        "libfake_nccl.so" => "nccl".into(),
        "libfake_cublas.so" => "cublas".into(),
        "origins" => "prog".into(),
        other => other.into(),
    }
}

fn map(v: &[(&str, u64)]) -> BTreeMap<String, u64> {
    v.iter().map(|(k, b)| (k.to_string(), *b)).collect()
}

struct At {
    label: String,
    truth: [u64; 3],
}

fn at(t: &mut Talk) -> Option<At> {
    let line = t.line();
    if line == "done" {
        return None;
    }
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(f[0], "at", "{line}");
    Some(At {
        label: f[1].to_owned(),
        truth: [f[2], f[3], f[4]].map(|v| v.parse().unwrap()),
    })
}

#[test]
fn every_byte_is_named_by_its_origin_now_and_at_each_peak() {
    let regions = region_dir("origins");
    let mut cmd = Command::new(origins_program());
    interposed(&mut cmd, &fake_driver(false), &regions);
    let libs = format!(
        "{}:{}",
        scratch().join("origins").display(),
        fake_driver(false).display()
    );
    cmd.env("LD_LIBRARY_PATH", libs);
    let mut t = Talk::start(cmd);
    let pid = t.child.id();
    let (d0, d1, host) = (Counter::Device(0), Counter::Device(1), Counter::HostPinned);
    let mut region: Option<std::sync::Arc<Region>> = None;
    let mut before_pool = 0;
    let mut peak1 = None;
    while let Some(a) = at(&mut t) {
        if a.label == "start" {
            t.go();
            continue;
        }
        let r = region
            .get_or_insert_with(|| open_region(&regions, pid))
            .clone();
        assert!(r.keeps_origins());
        // Every counted byte belongs to exactly one origin.
        for (i, c) in [d0, d1, host].into_iter().enumerate() {
            let sum: u64 = r.live_by_origin(c).iter().map(|o| o.bytes).sum();
            assert_eq!(sum, a.truth[i], "{}: {c:?}", a.label);
            assert_eq!(r.current(c), a.truth[i], "{}: {c:?}", a.label);
        }
        match a.label.as_str() {
            "prog-plain" => {
                assert_eq!(live(&r, d0), map(&[("prog", MIB)]));
                // The interposer knows its own program.
                assert!(r.origins().iter().all(|o| o.program));
            }
            "nccl" => assert_eq!(live(&r, d0), map(&[("prog", MIB), ("nccl", 6 * MIB)])),
            "peak1" => {
                let p = r.peak_origins(d0).unwrap();
                assert_eq!(p.peak, 15 * MIB);
                assert_eq!(
                    breakdown(&p),
                    map(&[("prog", MIB), ("nccl", 6 * MIB), ("cublas", 8 * MIB)])
                );
                // The largest first.
                assert_eq!(who(&p.by_origin[0].origin.library), "cublas");
                peak1 = Some(p);
            }
            "peak2" => {
                let p = r.peak_origins(d0).unwrap();
                assert_eq!(p.peak, 17 * MIB);
                assert_eq!(breakdown(&p), map(&[("prog", MIB), ("nccl", 16 * MIB)]));
                assert!(p.at_ns > peak1.as_ref().unwrap().at_ns);
                assert!(!p.by_origin[0].origin.program);
                // Each symbol dladdr knows is kept with its origin.
                assert_eq!(p.by_origin[0].origin.symbol.as_deref(), Some("nccl_alloc"));
            }
            "after-peak2" => {
                // Frees lower the live set, never the peak's breakdown.
                assert_eq!(live(&r, d0), map(&[("prog", MIB), ("nccl", 6 * MIB)]));
                assert_eq!(r.peak_origins(d0).unwrap().peak, 17 * MIB);
                assert_eq!(r.peak_origins(d1), None);
                // The failed allocation: what held device 0 when it failed.
                let (c, oom) = r.oom_origins().expect("the failure's breakdown");
                assert_eq!((c, oom.peak), (d0, 7 * MIB));
                assert_eq!(breakdown(&oom), map(&[("prog", MIB), ("nccl", 6 * MIB)]));
            }
            "dev1" => {
                assert_eq!(live(&r, d1), map(&[("cublas", 3 * MIB)]));
                let p = r.peak_origins(d1).unwrap();
                assert_eq!(
                    (p.peak, breakdown(&p)),
                    (3 * MIB, map(&[("cublas", 3 * MIB)]))
                );
                // Device 0's peak keeps its own breakdown.
                assert_eq!(r.peak_origins(d0).unwrap().peak, 17 * MIB);
                before_pool = a.truth[0];
            }
            "pool" => {
                // The pool's whole reservation, as the driver grew it.
                let grown = a.truth[0] - before_pool;
                assert!(grown >= MIB);
                assert_eq!(
                    live(&r, d0),
                    map(&[("prog", MIB), ("nccl", 6 * MIB), ("cublas", grown)])
                );
            }
            "pool-freed" => {
                let kept = a.truth[0] - 7 * MIB;
                let mut want = map(&[("prog", MIB), ("nccl", 6 * MIB)]);
                if kept > 0 {
                    want.insert("cublas".into(), kept);
                }
                assert_eq!(live(&r, d0), want);
            }
            "pinned" => {
                assert_eq!(live(&r, host), map(&[("prog", MIB), ("nccl", 3 * MIB)]));
                let p = r.peak_origins(host).unwrap();
                assert_eq!(breakdown(&p), map(&[("prog", MIB), ("nccl", 3 * MIB)]));
            }
            "runtime" => {
                // Through the runtime-like library: named by its caller; the
                // runtime itself holds nothing.
                let l = live(&r, d0);
                assert_eq!(l.get("prog"), Some(&(6 * MIB)), "{l:?}");
                assert_eq!(l.get("nccl"), Some(&(8 * MIB)), "{l:?}");
                assert!(!l.keys().any(|k| k.starts_with("libcudart")), "{l:?}");
            }
            "threads" => {
                let l = live(&r, d0);
                let pool_kept = a.truth[0] - 7 * MIB - 4 * 50 * (64 << 10);
                assert_eq!(
                    l.get("cublas"),
                    Some(&(4 * 50 * (64 << 10) + pool_kept)),
                    "{l:?}"
                );
                let p = r.peak_origins(d0).unwrap();
                assert_eq!(p.by_origin.iter().map(|o| o.bytes).sum::<u64>(), p.peak);
            }
            "jit" => {
                // Code no library holds: counted by its address, never
                // dropped.
                let unknown: Vec<_> = r
                    .live_by_origin(d0)
                    .into_iter()
                    .filter(|o| o.origin.library == UNKNOWN_LIBRARY)
                    .collect();
                assert_eq!(unknown.len(), 1, "{:?}", r.live_by_origin(d0));
                assert_eq!(unknown[0].bytes, 3 * MIB);
                assert_ne!(unknown[0].origin.address, 0);
                assert_eq!(unknown[0].origin.symbol, None);
            }
            "no-jit" => {}
            "forked" => {}
            "end" => {
                let l = live(&r, d0);
                assert!(!l.contains_key("prog") && !l.contains_key("nccl"), "{l:?}");
                // The threads' allocations set the last peak.
                let p = r.peak_origins(d0).unwrap();
                assert_eq!(p.peak, r.read(d0).lifetime_peak);
                assert!(p.peak > 17 * MIB);
                assert_eq!(p.by_origin.iter().map(|o| o.bytes).sum::<u64>(), p.peak);
            }
            other => panic!("unexpected checkpoint {other}"),
        }
        if matches!(a.label.as_str(), "jit" | "no-jit") {
            t.go();
            // The forked child: a region of its own, its origin only.
            let line = t.line();
            let child: u32 = line.strip_prefix("child ").unwrap().parse().unwrap();
            let c = open_region(&regions, child);
            assert_eq!(live(&c, d0), map(&[("nccl", 2 * MIB)]));
            assert_eq!(
                breakdown(&c.peak_origins(d0).unwrap()),
                map(&[("nccl", 2 * MIB)])
            );
            t.go();
            continue;
        }
        t.go();
    }
    t.finish();
}

/// `MEMPROBE_GPU_ORIGINS=off`: counted as exactly, with no origin named.
#[test]
fn origins_switched_off_count_the_same_and_name_nothing() {
    let regions = region_dir("origins-off");
    let mut cmd = Command::new(origins_program());
    interposed(&mut cmd, &fake_driver(false), &regions);
    let libs = format!(
        "{}:{}",
        scratch().join("origins").display(),
        fake_driver(false).display()
    );
    cmd.env("LD_LIBRARY_PATH", libs)
        .env("MEMPROBE_GPU_ORIGINS", "off");
    let mut t = Talk::start(cmd);
    let pid = t.child.id();
    let mut checked = 0;
    while let Some(a) = at(&mut t) {
        if a.label != "start" {
            let r = open_region(&regions, pid);
            assert!(!r.keeps_origins());
            for (i, c) in [Counter::Device(0), Counter::Device(1), Counter::HostPinned]
                .into_iter()
                .enumerate()
            {
                assert_eq!(r.current(c), a.truth[i], "{}: {c:?}", a.label);
                assert!(r.live_by_origin(c).is_empty());
                assert_eq!(r.peak_origins(c), None);
                assert_eq!(r.oom_origins(), None);
            }
            checked += 1;
        }
        t.go();
        if matches!(a.label.as_str(), "jit" | "no-jit") {
            assert!(t.line().starts_with("child "));
            t.go();
        }
    }
    t.finish();
    assert_eq!(checked, 14);
}
