//! memprobe_source_new_gpu_exact from C (tests/c/test_gpu_exact.c): under
//! the driver-API interposer (LD_PRELOAD) with the fake driver of
//! tests/fake-gpu/fake_cuda.c, with counting switched off, and without the
//! interposer; plainly and under valgrind.
//!
//! No AddressSanitizer run: ASan's runtime must come first in the initial
//! library list, and an LD_PRELOAD'ed interposer is loaded before the
//! program's own libraries, so ASan refuses to start ("ASan runtime does not
//! come first"); preloading libasan ahead of it would make a different
//! program from the one users run. valgrind checks the same memory accesses.

use memprobe_tests::{assert_ok, compile, have_valgrind, root, run, run_valgrind, scratch, Build};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

struct Staged {
    program: PathBuf,
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
        compile(
            &[root().join("tests/c/test_gpu_exact.c")],
            &program,
            Build::Plain,
            &["-ldl"],
        );
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-q", "-p", "memprobe-interpose-preload"])
            .current_dir(root())
            .status()
            .expect("run cargo build -p memprobe-interpose-preload");
        assert!(
            st.success(),
            "cargo build -p memprobe-interpose-preload failed"
        );
        let interposer = dir.join("libmemprobe_interpose.so");
        std::fs::copy(
            memprobe_tests::target_dir().join("debug/libmemprobe_interpose.so"),
            &interposer,
        )
        .expect("copy the interposer");
        let driver_dir = dir.join("driver");
        std::fs::create_dir_all(&driver_dir).unwrap();
        // -Bsymbolic: the driver's calls to its own functions stay inside
        // it, as in the real one.
        let o = Command::new("cc")
            .args([
                "-std=gnu11",
                "-O1",
                "-g",
                "-shared",
                "-fPIC",
                "-Wl,-soname,libcuda.so.1",
                "-Wl,-Bsymbolic",
            ])
            .arg(root().join("tests/fake-gpu/fake_cuda.c"))
            .arg("-o")
            .arg(driver_dir.join("libcuda.so.1"))
            .arg("-lpthread")
            .output()
            .expect("run cc");
        assert_ok("compiling the fake driver", &o);
        Staged {
            program,
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

fn run_mode(mode: &str, interposed: bool, valgrind: bool) -> Output {
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
    if valgrind {
        run_valgrind(&s.program, &[mode], &all)
    } else {
        run(&s.program, &[mode], &all)
    }
}

fn check(mode: &str, interposed: bool) {
    let o = run_mode(mode, interposed, false);
    assert_ok(&format!("test_gpu_exact {mode}"), &o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(" 0 failed"), "{out}");
    if have_valgrind() {
        let o = run_mode(mode, interposed, true);
        assert_ok(&format!("test_gpu_exact {mode} under valgrind"), &o);
    } else {
        eprintln!("valgrind not installed: skipped the valgrind run of {mode}");
    }
}

#[test]
fn spikes_are_exact_peaks_of_nested_and_sibling_windows_under_the_interposer() {
    check("interposed", true);
    let o = run_mode("interposed", true, false);
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
