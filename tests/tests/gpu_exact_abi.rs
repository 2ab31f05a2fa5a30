//! memprobe_source_new_gpu_exact from C (tests/c/test_gpu_exact.c): under
//! the driver-API interposer (LD_PRELOAD) with the fake driver of
//! tests/fake-gpu/fake_cuda.c, with counting switched off, and without the
//! interposer; plainly, under AddressSanitizer + UBSan and under valgrind.
//!
//! ASan wants its runtime first in the initial library list and refuses to
//! start behind an LD_PRELOAD'ed library ("ASan runtime does not come
//! first"); the interposer replaces no allocator or libc function ASan
//! intercepts (only `dlsym` and the driver's `cu*` names), so the ASan runs
//! set `verify_asan_link_order=0` and run the same program users run.

use memprobe_tests::{
    assert_ok, compile, have_valgrind, root, run, run_valgrind, scratch,
    stage_interposer_and_driver, Build,
};
use std::path::PathBuf;
use std::process::Output;
use std::sync::OnceLock;

struct Staged {
    program: PathBuf,
    asan: PathBuf,
    interposer: PathBuf,
    driver_dir: PathBuf,
    dir: PathBuf,
}

/// Builds the program, the interposer (copied aside) and the fake driver,
/// once per test process.
fn staged() -> &'static Staged {
    static S: OnceLock<Staged> = OnceLock::new();
    S.get_or_init(|| {
        let dir = scratch("gpu_exact_abi");
        let program = dir.join("test_gpu_exact");
        let src = [root().join("tests/c/test_gpu_exact.c")];
        compile(&src, &program, Build::Plain, &["-ldl"]);
        let asan = dir.join("test_gpu_exact-asan");
        compile(&src, &asan, Build::Sanitized, &["-ldl"]);
        let (interposer, driver_dir) = stage_interposer_and_driver(&dir);
        Staged {
            program,
            asan,
            interposer,
            driver_dir,
            dir,
        }
    })
}

/// The environment of a run: the fake driver always on the loader's path,
/// the interposer preloaded when asked, a region directory of its own.
fn env(s: &Staged, mode: &str, interposed: bool) -> Vec<(String, String)> {
    let regions = s.dir.join(format!("regions-{mode}"));
    let mut v = vec![
        ("LD_LIBRARY_PATH".into(), s.driver_dir.display().to_string()),
        (
            "MEMPROBE_GPU_EXACT_DIR".into(),
            regions.display().to_string(),
        ),
        ("FAKE_CUDA_DEVICES".into(), "2".into()),
    ];
    if interposed {
        v.push(("LD_PRELOAD".into(), s.interposer.display().to_string()));
    }
    if mode == "off" {
        v.push(("MEMPROBE_GPU_EXACT".into(), "off".into()));
    }
    v
}

#[derive(Clone, Copy, PartialEq)]
enum How {
    Plain,
    Asan,
    Valgrind,
}

fn run_mode(mode: &str, interposed: bool, how: How) -> Output {
    let s = staged();
    let owned = env(s, mode, interposed);
    let pairs: Vec<(&str, &str)> = owned
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    // The parent's own LD_PRELOAD / switch must not leak into the "plain" run.
    let mut all = pairs;
    if !interposed {
        all.push(("LD_PRELOAD", ""));
    }
    if mode != "off" {
        all.push(("MEMPROBE_GPU_EXACT", ""));
    }
    match how {
        How::Plain => run(&s.program, &[mode], &all),
        How::Asan => {
            all.push((
                "ASAN_OPTIONS",
                "verify_asan_link_order=0:detect_leaks=1:abort_on_error=0",
            ));
            run(&s.asan, &[mode], &all)
        }
        How::Valgrind => run_valgrind(&s.program, &[mode], &all),
    }
}

fn check(mode: &str, interposed: bool) {
    for how in [How::Plain, How::Asan] {
        let o = run_mode(mode, interposed, how);
        assert_ok(
            &format!(
                "test_gpu_exact {mode} ({})",
                if how == How::Asan { "ASan" } else { "plain" }
            ),
            &o,
        );
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains(" 0 failed"), "{out}");
    }
    if have_valgrind(&format!("the valgrind run of {mode}")) {
        let o = run_mode(mode, interposed, How::Valgrind);
        assert_ok(&format!("test_gpu_exact {mode} under valgrind"), &o);
    }
}

#[test]
fn spikes_are_exact_peaks_of_nested_and_sibling_windows_under_the_interposer() {
    check("interposed", true);
    let o = run_mode("interposed", true, How::Plain);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("caught inner 200/200 outer 200/200 sibling 200/200"),
        "{out}"
    );
}

#[test]
fn counting_switched_off_is_unavailable() {
    check("off", true);
}

#[test]
fn without_the_interposer_it_is_unavailable_and_says_how_to_load_it() {
    check("plain", false);
}
