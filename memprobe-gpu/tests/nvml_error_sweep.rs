//! Every NVML error code at every call site the fake can fail: init, the
//! memory query (v2 and v1), the compute- and graphics-process queries, and
//! a GPU lost at each of the first calls. No code may crash or be reported
//! as success; unknown codes map to an error too.

mod common;
use common::Fake;
use memprobe_gpu::Gpus;

/// NVML's error codes (nvml.h: 1..=28) and an unknown one.
const CODES: &[u32] = &[
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
    27, 28, 999,
];

#[test]
fn init_fails_cleanly_with_every_code() {
    for code in CODES {
        let fake = Fake::nvml(&format!("init_error {code}\n"));
        let e = Gpus::open(fake.nvml_config())
            .err()
            .unwrap_or_else(|| panic!("init_error {code} succeeded"));
        assert!(!e.message().is_empty(), "code {code}");
    }
}

#[test]
fn memory_queries_fail_cleanly_with_every_code() {
    for code in CODES {
        for key in ["memory_error", "memory_v2_error"] {
            let fake = Fake::nvml(&format!("devices 2\ndevice 0 {key} {code}\n"));
            let gpus = Gpus::open(fake.nvml_config()).unwrap();
            let other = gpus.device(1).unwrap().memory();
            assert!(other.is_ok(), "{key} {code}: the other device still reads");
            match gpus.device(0).and_then(|d| d.memory()) {
                Ok(m) => assert!(
                    key == "memory_v2_error" && m.total > 0,
                    "{key} {code}: v1 fallback only"
                ),
                Err(e) => assert!(!e.message().is_empty(), "{key} {code}"),
            }
        }
    }
}

#[test]
fn process_queries_fail_cleanly_with_every_code() {
    for code in CODES {
        for key in ["procs_error", "gprocs_error"] {
            let fake = Fake::nvml(&format!(
                "devices 1\ndevice 0 procs self:1000\ndevice 0 {key} {code}\n"
            ));
            let gpus = Gpus::open(fake.nvml_config()).unwrap();
            let dev = gpus.device(0).unwrap();
            assert!(dev.memory().is_ok(), "{key} {code}: memory still reads");
            if let Err(e) = dev.processes() {
                assert!(!e.message().is_empty(), "{key} {code}");
            }
            let _ = dev.process_memory();
        }
    }
}

#[test]
fn gpu_lost_at_each_of_the_first_calls() {
    for k in 1..=6 {
        let fake = Fake::nvml(&format!("devices 2\ndevice 0 lost_at {k}\n"));
        let gpus = Gpus::open(fake.nvml_config()).unwrap();
        let dev = gpus.device(0).unwrap();
        let results: Vec<bool> = (0..8).map(|_| dev.memory().is_ok()).collect();
        assert!(
            results.iter().skip(k).all(|ok| !ok),
            "lost_at {k}: reads after the loss fail: {results:?}"
        );
        assert!(
            gpus.device(1).unwrap().memory().is_ok(),
            "lost_at {k}: device 1 unaffected"
        );
    }
}
