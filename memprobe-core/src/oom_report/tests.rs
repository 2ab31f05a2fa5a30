//! The reporter end to end: configuration, arming, both renderings, every
//! destination.

use super::*;
use crate::lock::Lock;
use crate::source::Source;
use crate::{ErrorKind, PhaseKind, Tracker};
use std::io::Write;
use std::sync::{Arc, Mutex};

/// A writer into shared memory, for the tests.
#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buf {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

struct FakeGpu;

impl OomGpuProvider for FakeGpu {
    fn devices(&self) -> std::result::Result<Vec<OomGpuDevice>, String> {
        Ok(vec![OomGpuDevice {
            id: 0,
            name: Some("Fake \"GPU\"".into()),
            uuid: None,
            memory: Ok(OomGpuMemory {
                total_bytes: 16 << 30,
                free_bytes: 1 << 20,
                used_bytes: (16 << 30) - (1 << 20),
            }),
            processes: Ok(vec![
                OomGpuProcess {
                    pid: std::process::id(),
                    used_bytes: Some(12 << 30),
                    list: OomProcessList::Compute,
                    this_process: true,
                },
                OomGpuProcess {
                    pid: 4242,
                    used_bytes: None,
                    list: OomProcessList::Graphics,
                    this_process: false,
                },
            ]),
        }])
    }
    fn driver_counts(&self) -> std::result::Result<OomDriverCounts, String> {
        Err("the interposer is not loaded".into())
    }
}

fn tracker() -> Tracker {
    Tracker::new(&[Source::pushed("alloc").unwrap()]).unwrap()
}

fn options(buf: &Buf) -> OomReportOptions {
    OomReportOptions {
        json_writer: Some(Box::new(buf.clone())),
        gpu: Some(Arc::new(FakeGpu)),
        ..OomReportOptions::default()
    }
}

#[test]
fn configuration_is_checked() {
    let mut t = tracker();
    let e = t
        .set_oom_report(Some(OomReportOptions::default()))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.message().contains("destination"), "{e}");
    let buf = Buf::default();
    let mut o = options(&buf);
    o.triggers = OomTriggers::default();
    assert!(t.set_oom_report(Some(o)).is_err());
    let mut o = options(&buf);
    o.keep_ended = MAX_KEEP_ENDED + 1;
    assert!(t.set_oom_report(Some(o)).is_err());
    let mut o = options(&buf);
    o.path = Some("/nonexistent-memprobe-dir/x.json".into());
    assert_eq!(
        t.set_oom_report(Some(o)).unwrap_err().kind(),
        ErrorKind::Unavailable
    );
    // Reporting before configuring, configuring twice.
    let f = FailedAllocation::new(OomTrigger::Caller, OomLocation::Device(0), Some(1), "x");
    assert_eq!(
        t.report_oom(f.clone()).unwrap_err().kind(),
        ErrorKind::WrongOrder
    );
    t.set_oom_report(Some(options(&buf))).unwrap();
    assert_eq!(
        t.set_oom_report(Some(options(&buf))).unwrap_err().kind(),
        ErrorKind::WrongOrder
    );
    // The driver trigger was not asked for.
    let d = FailedAllocation::new(OomTrigger::Driver, OomLocation::Unknown, None, "cu");
    assert_eq!(t.report_oom(d).unwrap_err().kind(), ErrorKind::WrongOrder);
    // Removed, then configured again.
    t.set_oom_report(None).unwrap();
    t.set_oom_report(None).unwrap();
    assert_eq!(t.report_oom(f).unwrap_err().kind(), ErrorKind::WrongOrder);
    t.set_oom_report(Some(options(&buf))).unwrap();
    assert!(buf.text().is_empty(), "nothing written before a trigger");
}

#[test]
fn the_first_trigger_writes_later_ones_are_counted() {
    let dir = std::env::temp_dir().join(format!("memprobe-oom-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("oom.json");
    let alloc = Source::pushed("alloc").unwrap();
    let mut t = Tracker::new(std::slice::from_ref(&alloc)).unwrap();
    let json_buf = Buf::default();
    let summary_buf = Buf::default();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen2 = seen.clone();
    let reporter = t
        .set_oom_report(Some(OomReportOptions {
            keep_ended: 2,
            path: Some(path.clone()),
            json_writer: Some(Box::new(json_buf.clone())),
            summary_writer: Some(Box::new(summary_buf.clone())),
            callback: Some(Box::new(move |r, j, _| {
                assert_eq!(r.to_json(), j);
                seen2.lock().unwrap().push(j.to_owned());
            })),
            gpu: Some(Arc::new(FakeGpu)),
            ..OomReportOptions::default()
        }))
        .unwrap()
        .unwrap();
    assert!(!path.exists());
    t.begin(PhaseKind::Epoch, None).unwrap();
    t.begin(PhaseKind::Step, None).unwrap();
    for i in 0..3u64 {
        alloc.push(100 + i).unwrap();
        alloc.push(10).unwrap();
        t.next(PhaseKind::Step, None).unwrap();
    }
    alloc.push(5000).unwrap();
    let mut f = FailedAllocation::new(
        OomTrigger::Caller,
        OomLocation::Device(1),
        Some(1 << 40),
        "torch",
    );
    f.detail = Some("CUDA out of memory.\nTried to allocate 1 TiB".into());
    f.caches.push(CacheFigures {
        device: 1,
        framework: "torch".into(),
        reserved_bytes: Some(300),
        allocated_bytes: Some(100),
        releasable_bytes: None,
    });
    assert_eq!(t.report_oom(f.clone()).unwrap(), OomOutcome::Written);
    // A burst of retries: counted, not written.
    for _ in 0..1000 {
        assert_eq!(t.report_oom(f.clone()).unwrap(), OomOutcome::Counted);
    }
    let st = reporter.status().unwrap();
    assert!(!st.armed);
    assert_eq!(
        (st.reports_written, st.triggers_seen, st.later_triggers),
        (1, 1001, 1000)
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
    let first = std::fs::read_to_string(&path).unwrap();
    assert_eq!(json_buf.text(), first);
    assert!(first.ends_with("}\n"));
    assert!(first.contains("\"later_triggers\":{\"count\":0,\"last\":null}"));
    // The open phases, with the step's peak so far; the last two ended.
    assert!(first.contains("\"open_phases\":{\"available\":true,\"reason\":null,\"phases\":[{\"kind\":\"epoch\",\"name\":\"epoch\",\"index\":0,\"depth\":0"), "{first}");
    assert!(first.contains("\"kind\":\"step\",\"name\":\"step\",\"index\":3,\"depth\":1"));
    assert!(first.contains("\"used_start\":10,\"used_now\":5000,\"peak\":5000"));
    assert!(first.contains("\"kept\":2,\"ended_total\":3"));
    assert!(first.contains("\"index\":1,") && first.contains("\"peak\":102"));
    assert!(!first.contains("\"peak\":100,"), "step 0 left the ring");
    assert!(first.contains("\"detail\":\"CUDA out of memory.\\nTried to allocate 1 TiB\""));
    assert!(first.contains("\"releasable_bytes\":null"));
    assert!(first.contains("\"reserved_bytes\":300"));
    assert!(first.contains("Fake \\\"GPU\\\""));
    assert!(first.contains(
        "\"driver_counts\":{\"available\":false,\"reason\":\"the interposer is not loaded\""
    ));
    let summary = summary_buf.text();
    assert!(
        summary.contains("torch asked 1.00 TiB on GPU 1 (caller trigger)"),
        "{summary}"
    );
    assert!(summary.contains("step #3"), "{summary}");
    assert!(summary.contains("(this process): 12.0 GiB"), "{summary}");
    // Sizes read as everywhere else in memprobe (`memprobe run` included):
    // three significant digits.
    assert!(
        summary.contains("16.0 GiB used of 16.0 GiB, 1.00 MiB free"),
        "{summary}"
    );
    assert!(
        summary.contains("releasing caches on GPU 1: unknown"),
        "{summary}"
    );
    assert!(
        summary.contains("detail: CUDA out of memory. Tried"),
        "{summary}"
    );

    // Re-armed: the first file is written again with the count, then the
    // next trigger replaces it.
    reporter.rearm().unwrap();
    let settled = std::fs::read_to_string(&path).unwrap();
    assert!(settled.contains("\"later_triggers\":{\"count\":1000,\"last\":{\"trigger\":\"caller\""));
    assert_eq!(
        json_buf.text(),
        first,
        "the writers get the first report only"
    );
    assert!(reporter.armed());
    t.report_oom(f).unwrap();
    let second = std::fs::read_to_string(&path).unwrap();
    assert!(second.contains("\"reports_before\":1"));
    assert_eq!(seen.lock().unwrap().len(), 2);
    drop(t);
    assert!(reporter.is_closed());
    let listing: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(listing.len(), 1, "no temporary file left");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_report_without_phases_says_why() {
    let buf = Buf::default();
    let mut t = tracker();
    let r = t.set_oom_report(Some(options(&buf))).unwrap().unwrap();
    let f = FailedAllocation::new(OomTrigger::Caller, OomLocation::Unknown, None, "caller");
    r.trigger(f, Err("the tracker was busy".into())).unwrap();
    let doc = buf.text();
    assert!(doc.contains(
        "\"open_phases\":{\"available\":false,\"reason\":\"the tracker was busy\",\"phases\":[]}"
    ));
    assert!(doc.contains("\"requested_bytes\":null"));
    assert!(doc.contains("\"location\":\"unknown\",\"device\":null"));
}

#[test]
fn a_report_being_written_never_blocks_the_training_loop() {
    // A hook's trigger (outside any tracker call, as the driver's is)
    // whose callback blocks: phases end meanwhile, and the callback
    // cannot trigger the reporter again.
    let t = Arc::new(Lock::new(tracker()));
    let (entered_tx, entered_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    let inner: Arc<Mutex<Option<OomReporter>>> = Arc::default();
    let inner2 = inner.clone();
    let again: Arc<Mutex<Option<ErrorKind>>> = Arc::default();
    let again2 = again.clone();
    let r = t
        .lock()
        .unwrap()
        .set_oom_report(Some(OomReportOptions {
            callback: Some(Box::new(move |_, _, _| {
                let me = inner2.lock().unwrap().clone().unwrap();
                let f = FailedAllocation::new(OomTrigger::Caller, OomLocation::Unknown, None, "x");
                *again2.lock().unwrap() = me.trigger(f, Ok(vec![])).err().map(|e| e.kind());
                entered_tx.send(()).unwrap();
                go_rx.lock().unwrap().recv().unwrap();
            })),
            ..OomReportOptions::default()
        }))
        .unwrap()
        .unwrap();
    *inner.lock().unwrap() = Some(r.clone());
    t.lock().unwrap().begin(PhaseKind::Step, None).unwrap();
    let hook = {
        let r = r.clone();
        std::thread::spawn(move || {
            let f = FailedAllocation::new(OomTrigger::Caller, OomLocation::Device(0), None, "x");
            r.trigger(f, Err("hook".into())).unwrap()
        })
    };
    entered_rx.recv().unwrap();
    for _ in 0..3 {
        t.lock().unwrap().next(PhaseKind::Step, None).unwrap();
    }
    assert_eq!(r.status().unwrap().reports_written, 1);
    go_tx.send(()).unwrap();
    assert_eq!(hook.join().unwrap(), OomOutcome::Written);
    assert_eq!(*again.lock().unwrap(), Some(ErrorKind::WrongOrder));
    t.lock().unwrap().set_oom_report(None).unwrap();
    assert!(r.is_closed());
}

/// A provider that names origins: 8 libraries, two of them under one
/// name; `.0`: NVML gives per-process figures.
struct FakeOrigins(bool);

impl OomGpuProvider for FakeOrigins {
    fn devices(&self) -> std::result::Result<Vec<OomGpuDevice>, String> {
        let mut d = FakeGpu.devices()?;
        if !self.0 {
            for p in d[0].processes.as_mut().unwrap() {
                p.used_bytes = None;
            }
        }
        Ok(d)
    }
    fn driver_counts(&self) -> std::result::Result<OomDriverCounts, String> {
        FakeGpu.driver_counts()
    }
    fn held_by_origin(
        &self,
        failed: &FailedAllocation,
    ) -> std::result::Result<OomHeldByOrigin, String> {
        const MIB: u64 = 1 << 20;
        let o = |name: &str, library: &str, mib: u64| OomOriginBytes {
            name: name.into(),
            library: library.into(),
            symbol: (mib == 600).then(|| "ncclCommInit\"Rank".to_owned()),
            program: name == "the program",
            bytes: mib * MIB,
        };
        let by_origin = vec![
            o("PyTorch caching allocator", "/t/libc10_cuda.so", 9000),
            o("NCCL", "/n/libnccl.so.2", 600),
            o("cuBLASLt", "/c/libcublasLt.so.12", 300),
            o("the program", "/usr/bin/python3", 50),
            o("libmine.so", "/x/libmine.so", 40),
            o("cuBLASLt", "/c2/libcublasLt.so.12", 30),
            o("libb.so", "/x/libb.so", 20),
            o("libc.so", "/x/libc.so", 10),
        ];
        Ok(OomHeldByOrigin {
            location: failed.location,
            basis: match failed.trigger {
                OomTrigger::Driver => OomHeldBasis::AtFailure,
                OomTrigger::Caller => OomHeldBasis::AtReport,
            },
            at_ns: 42,
            held_bytes: by_origin.iter().map(|o| o.bytes).sum(),
            by_origin,
            by_stack: (0..5u64)
                .map(|i| OomStackBytes {
                    frames: vec![
                        "libc10_cuda.so!malloc".to_owned(),
                        format!("train!layer{i}"),
                    ],
                    bytes: (5 - i) * MIB,
                })
                .collect(),
        })
    }
}

#[test]
fn what_held_the_device_is_named_by_origin_with_the_context_beside_it() {
    const MIB: u64 = 1 << 20;
    let json = Buf::default();
    let summary = Buf::default();
    let mut t = tracker();
    t.set_oom_report(Some(OomReportOptions {
        json_writer: Some(Box::new(json.clone())),
        summary_writer: Some(Box::new(summary.clone())),
        gpu: Some(Arc::new(FakeOrigins(true))),
        ..OomReportOptions::default()
    }))
    .unwrap();
    let f = FailedAllocation::new(
        OomTrigger::Caller,
        OomLocation::Device(0),
        Some(MIB),
        "torch",
    );
    t.report_oom(f).unwrap();
    let doc = json.text();
    let held = 10_050 * MIB;
    assert!(
        doc.contains(&format!(
            "\"held_by_origin\":{{\"available\":true,\"reason\":null,\"basis\":\"at_report\",\
             \"location\":\"device\",\"device\":0,\"at_monotonic_ns\":42,\"held_bytes\":{held},\
             \"origins\":[{{\"name\":\"PyTorch caching allocator\",\"library\":\"/t/libc10_cuda.so\",\
             \"symbol\":null,\"program\":false,\"bytes\":{}}}",
            9000 * MIB
        )),
        "{doc}"
    );
    assert!(doc.contains("\"symbol\":\"ncclCommInit\\\"Rank\""), "{doc}");
    assert!(
        doc.contains(&format!(
            "\"stacks\":[{{\"frames\":[\"libc10_cuda.so!malloc\",\"train!layer0\"],\"bytes\":{}}},",
            5 * MIB
        )),
        "{doc}"
    );
    // FakeGpu's NVML says this process holds 12 GiB.
    let context = (12 << 30) - held;
    assert!(
        doc.contains(&format!(
            "\"context_and_unseen_bytes\":{context},\"context_and_unseen_reason\":null}}"
        )),
        "{doc}"
    );
    let text = summary.text();
    // Same names summed (cuBLASLt 330 MiB), the top five, the rest summed.
    assert!(
        text.contains(
            "  held on GPU 0 at the report: 9.81 GiB: PyTorch caching allocator 8.79 GiB, \
             NCCL 600 MiB, cuBLASLt 330 MiB, the program 50.0 MiB, libmine.so 40.0 MiB, \
             2 more 30.0 MiB; CUDA context and unseen 2.19 GiB (NVML minus counted)\n\
             \x20   5.00 MiB libc10_cuda.so!malloc < train!layer0\n\
             \x20   4.00 MiB libc10_cuda.so!malloc < train!layer1\n\
             \x20   3.00 MiB libc10_cuda.so!malloc < train!layer2\n\
             \x20   3.00 MiB in 2 more paths\n"
        ),
        "{text}"
    );
}

#[test]
fn without_origins_or_nvml_the_report_says_why() {
    let json = Buf::default();
    let summary = Buf::default();
    let mut t = tracker();
    t.set_oom_report(Some(OomReportOptions {
        json_writer: Some(Box::new(json.clone())),
        summary_writer: Some(Box::new(summary.clone())),
        gpu: Some(Arc::new(FakeGpu)),
        ..OomReportOptions::default()
    }))
    .unwrap();
    let f = FailedAllocation::new(OomTrigger::Caller, OomLocation::Device(0), None, "torch");
    t.report_oom(f).unwrap();
    let doc = json.text();
    assert!(
        doc.contains(
            "\"held_by_origin\":{\"available\":false,\"reason\":\"this GPU provider names no \
             origins\",\"basis\":null,\"location\":null,\"device\":null,\"at_monotonic_ns\":null,\
             \"held_bytes\":null,\"origins\":[],\"stacks\":[],\"context_and_unseen_bytes\":null,\
             \"context_and_unseen_reason\":\"no breakdown by origin\"}"
        ),
        "{doc}"
    );
    assert!(summary
        .text()
        .contains("  held by origin: unknown (this GPU provider names no origins)\n"));
    // NVML without a per-process figure, and pinned host memory: the
    // context is unknown, said why; never a 0 standing in.
    for (location, why) in [
        (
            OomLocation::Device(0),
            "NVML gives no per-process figure on this driver",
        ),
        (
            OomLocation::HostPinned,
            "pinned host memory has no device figure",
        ),
    ] {
        let json = Buf::default();
        let summary = Buf::default();
        let mut t = tracker();
        t.set_oom_report(Some(OomReportOptions {
            json_writer: Some(Box::new(json.clone())),
            summary_writer: Some(Box::new(summary.clone())),
            gpu: Some(Arc::new(FakeOrigins(false))),
            ..OomReportOptions::default()
        }))
        .unwrap();
        t.report_oom(FailedAllocation::new(
            OomTrigger::Caller,
            location,
            None,
            "x",
        ))
        .unwrap();
        let doc = json.text();
        assert!(
            doc.contains(&format!(
                "\"context_and_unseen_bytes\":null,\"context_and_unseen_reason\":\"{why}\""
            )),
            "{doc}"
        );
        let text = summary.text();
        match location {
            OomLocation::Device(_) => assert!(
                text.contains(&format!("; CUDA context and unseen unknown ({why})\n")),
                "{text}"
            ),
            _ => assert!(
                text.contains("held on pinned host memory at the report: 9.81 GiB: "),
                "{text}"
            ),
        }
    }
}

#[test]
fn the_live_blocks_table_is_embedded_or_left_out_with_why() {
    let record = r#"{"schema": "memprobe.torch_attribution/1", "kind": "oom", "rank": 0,
        "requested_bytes": 2147483648,
        "blocks": [{"bytes": 1073741824, "stream": 0, "address": 1,
                    "frames": [{"file": "train.py", "line": 42, "function": "forward"}]},
                   {"bytes": 4096, "stream": 0, "address": 2, "frames": []}],
        "rest": {"bytes": 0, "blocks": 0},
        "segments": [{"address": 1, "bytes": 1610612736, "allocated": 1073745920, "stream": 0}],
        "history": {"complete": true, "entries": 2, "lost_entries": false}}"#;
    let cases: [(&str, Option<&str>); 3] = [
        (record, None),
        ("{\"schema\":", Some("not JSON: unexpected end")),
        (
            "{\"schema\":\"memprobe.other/1\"}",
            Some("schema is \\\"memprobe.other/1\\\""),
        ),
    ];
    for (given, refused) in cases {
        let json = Buf::default();
        let summary = Buf::default();
        let mut t = tracker();
        t.set_oom_report(Some(OomReportOptions {
            json_writer: Some(Box::new(json.clone())),
            summary_writer: Some(Box::new(summary.clone())),
            ..OomReportOptions::default()
        }))
        .unwrap();
        let mut f = FailedAllocation::new(
            OomTrigger::Caller,
            OomLocation::Device(0),
            Some(2 << 30),
            "torch",
        );
        f.set_live_blocks_json(given);
        assert_eq!(t.report_oom(f).unwrap(), OomOutcome::Written);
        let doc = json.text();
        let v: serde_json::Value = serde_json::from_str(doc.trim_end()).expect(&doc);
        let text = summary.text();
        match refused {
            None => {
                let l = &v["live_blocks"];
                assert_eq!(l["schema"], "memprobe.torch_attribution/1");
                assert_eq!(l["requested_bytes"], 2147483648u64);
                assert_eq!(l["blocks"][0]["frames"][0]["line"], 42);
                assert_eq!(l["segments"][0]["allocated"], 1073745920u64);
                assert!(v["live_blocks_error"].is_null());
                assert!(
                    text.contains("  live blocks (2 listed; 2.00 GiB asked):\n")
                        && text.contains("  1.00 GiB train.py:42 forward\n")
                        && text.contains("  4.00 KiB no frame\n")
                        && text.contains(
                            "  fragmentation: 1.50 GiB reserved in 1 segments, 1.00 GiB \
                             allocated, 512 MiB free (reserved - allocated); at most 512 MiB \
                             free in one segment\n"
                        ),
                    "{text}"
                );
            }
            Some(why) => {
                assert!(v["live_blocks"].is_null());
                let e = v["live_blocks_error"].as_str().unwrap();
                assert!(doc.contains(why), "{doc}");
                assert!(
                    text.contains(&format!("  live blocks: left out ({e})\n")),
                    "{text}"
                );
            }
        }
    }
}
