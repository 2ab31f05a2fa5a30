//! Test harness: compiles the fake NVML / CUDA runtime libraries of
//! `tests/fake-gpu/` once per test binary, and gives each test its own copy
//! of a library with its own script beside it, so tests running in parallel
//! threads share no state and never touch the environment.
#![allow(dead_code, unreachable_pub, missing_docs)]

use memprobe_gpu::{GpuBackend, GpuConfig};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

fn fake_src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fake-gpu")
}

/// This process's build directory; stale ones of dead test processes are removed.
fn build_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake-gpu");
        if let Ok(entries) = std::fs::read_dir(&root) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Ok(pid) = name.parse::<u32>() {
                    if !Path::new(&format!("/proc/{pid}")).exists() {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
        }
        let dir = root.join(std::process::id().to_string());
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
}

#[path = "../../../tests/src/fake_gpu.rs"]
mod fake_gpu;

/// Compiles `source` (in tests/fake-gpu) with `defines`, once per binary.
pub fn compile(source: &str, defines: &[&str]) -> PathBuf {
    static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let key = format!("{source} {}", defines.join(" "));
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    if let Some(p) = built.get(&key) {
        return p.clone();
    }
    let out = build_dir().join(format!("variant{}.so", built.len()));
    let defines: Vec<String> = defines.iter().map(|d| d.to_string()).collect();
    fake_gpu::compile_fake(&fake_src_dir(), source, &defines, &out);
    built.insert(key, out.clone());
    out
}

/// One test's private fake library (a copy of a compiled variant) and its script.
pub struct Fake {
    pub dir: PathBuf,
    pub lib: PathBuf,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

impl Fake {
    fn new(compiled: PathBuf, lib_name: &str, script_name: &str, script: &str) -> Fake {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = build_dir().join(format!("t{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join(lib_name);
        std::fs::copy(&compiled, &lib).unwrap();
        std::fs::write(dir.join(script_name), script).unwrap();
        Fake { dir, lib }
    }

    /// A fake NVML answering `script`.
    pub fn nvml(script: &str) -> Fake {
        Fake::nvml_omitting(&[], script)
    }

    /// A fake NVML built without the symbols in `omit`.
    pub fn nvml_omitting(omit: &[&str], script: &str) -> Fake {
        let defines: Vec<String> = omit.iter().map(|s| fake_gpu::omit_define(s)).collect();
        let defines: Vec<&str> = defines.iter().map(String::as_str).collect();
        Fake::new(
            compile("fake_nvml.c", &defines),
            "libnvidia-ml.so.1",
            "fake_nvml.script",
            script,
        )
    }

    /// A fake CUDA runtime answering `script`.
    pub fn cudart(script: &str) -> Fake {
        Fake::new(
            compile("fake_cudart.c", &[]),
            "libcudart.so",
            "fake_cudart.script",
            script,
        )
    }

    /// A config that opens this fake NVML and nothing else.
    pub fn nvml_config(&self) -> GpuConfig {
        GpuConfig {
            backend: GpuBackend::Nvml,
            nvml_path: Some(self.lib.clone()),
            ..GpuConfig::default()
        }
    }

    /// A config that opens this fake CUDA runtime.
    pub fn cudart_config(&self) -> GpuConfig {
        GpuConfig {
            backend: GpuBackend::Cudart,
            cudart_path: Some(self.lib.clone()),
            ..GpuConfig::default()
        }
    }

    /// `fake_nvml_calls(what)` of this library instance.
    pub fn nvml_calls(&self, what: &str) -> i64 {
        let what = std::ffi::CString::new(what).unwrap();
        // SAFETY: the fake library's test hook has this signature; loading the
        // same path again returns the instance memprobe already loaded.
        unsafe {
            let lib = libloading::Library::new(&self.lib).unwrap();
            let f: libloading::Symbol<unsafe extern "C" fn(*const std::os::raw::c_char) -> i64> =
                lib.get(b"fake_nvml_calls").unwrap();
            let n = f(what.as_ptr());
            std::mem::forget(lib);
            n
        }
    }

    /// `fake_cudart_contexts()` of this library instance.
    pub fn cudart_contexts(&self) -> i32 {
        // SAFETY: as for nvml_calls.
        unsafe {
            let lib = libloading::Library::new(&self.lib).unwrap();
            let f: libloading::Symbol<unsafe extern "C" fn() -> i32> =
                lib.get(b"fake_cudart_contexts").unwrap();
            let n = f();
            std::mem::forget(lib);
            n
        }
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        // The library stays mapped (memprobe never unloads it); the files can go.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The environment variable that tells a re-run test binary which child test to run.
pub const CHILD: &str = "MEMPROBE_GPU_TEST_CHILD";

/// Whether this process is the child run of test `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(name)
}

/// Runs test `name` of this binary in a fresh process with `env` (the
/// memprobe and CUDA variables of this process removed first).
pub fn run_child(name: &str, env: &[(&str, &str)]) -> Output {
    run_child_with(None, name, env)
}

/// As [`run_child`], with the binary started through `wrapper` (e.g. `unshare`).
pub fn run_child_with(wrapper: Option<&[&str]>, name: &str, env: &[(&str, &str)]) -> Output {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match wrapper {
        Some(w) => {
            let mut c = Command::new(w[0]);
            c.args(&w[1..]).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]);
    for var in [
        "MEMPROBE_GPU_BACKEND",
        "MEMPROBE_NVML_LIBRARY",
        "MEMPROBE_CUDART_LIBRARY",
        "CUDA_VISIBLE_DEVICES",
        "FAKE_NVML_SCRIPT",
        "FAKE_CUDART_SCRIPT",
        "MEMPROBE_TEST_NVML",
    ] {
        cmd.env_remove(var);
    }
    cmd.env(CHILD, name).envs(env.iter().copied());
    cmd.output().unwrap()
}

/// Asserts a child run passed and printed `marker` (so it really ran).
pub fn assert_child_ok(out: &Output, marker: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(marker),
        "child failed: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;
