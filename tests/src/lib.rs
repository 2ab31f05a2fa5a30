//! Harness for memprobe's cross-language tests: builds `libmemprobe.so`,
//! stages it with its SONAME, compiles C and C++ programs against
//! `include/`, builds the fake GPU libraries of `tests/fake-gpu/`, and runs
//! programs (plainly, under AddressSanitizer, under valgrind).

pub mod c_header;
pub mod fake_gpu;
pub mod required_tool;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The cargo target directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// A scratch directory for this test binary.
pub fn scratch(name: &str) -> PathBuf {
    let d = target_dir()
        .join("memprobe-tests")
        .join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

/// A directory of its own under `scratch(name)`, new at each call: for
/// tests of one binary that build or write the same names at the same
/// time (two tests building one C file: one would run the binary the other
/// is still writing, ETXTBSY or worse).
pub fn fresh_scratch(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = scratch(name).join(n.to_string());
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

/// Builds memprobe-ffi (dev profile) once and returns a directory holding
/// `libmemprobe.so`, the SONAME link and `libmemprobe.a`.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-q", "-p", "memprobe-ffi"])
            .current_dir(root())
            .status()
            .expect("run cargo build -p memprobe-ffi");
        assert!(status.success(), "cargo build -p memprobe-ffi failed");
        let built = target_dir().join("debug");
        let stage = target_dir()
            .join("memprobe-tests")
            .join(format!("lib-{}", std::process::id()));
        std::fs::create_dir_all(&stage).expect("create lib stage");
        let so = stage.join("libmemprobe.so");
        std::fs::copy(built.join("libmemprobe.so"), &so).expect("copy libmemprobe.so");
        std::fs::copy(built.join("libmemprobe.a"), stage.join("libmemprobe.a"))
            .expect("copy libmemprobe.a");
        let soname = soname(&so);
        let link = stage.join(&soname);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("libmemprobe.so", &link).expect("symlink soname");
        stage
    })
}

/// The SONAME recorded in a shared library (via `objdump -p`).
pub fn soname(lib: &Path) -> String {
    let out = Command::new("objdump")
        .arg("-p")
        .arg(lib)
        .output()
        .expect("run objdump");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("SONAME").map(|s| s.trim().to_owned()))
        .expect("library has a SONAME")
}

/// Strict warning flags every C and C++ program is built with.
pub const STRICT: &[&str] = &["-Wall", "-Wextra", "-Werror", "-pedantic"];

/// How a test program is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// Plain `-O1 -g`.
    Plain,
    /// `-fsanitize=address,undefined`.
    Sanitized,
}

/// Compiles `sources` (C if `.c`, C++ if `.cpp`) into `out`, linked against
/// libmemprobe.so with an rpath to it.
pub fn compile(sources: &[PathBuf], out: &Path, build: Build, extra: &[&str]) -> Output {
    let cpp = sources
        .iter()
        .any(|s| s.extension().is_some_and(|e| e == "cpp"));
    let mut cmd = Command::new(if cpp { "c++" } else { "cc" });
    cmd.args(if cpp {
        &["-std=c++17"][..]
    } else {
        &["-std=c99"][..]
    });
    cmd.args(STRICT).args(["-O1", "-g", "-D_GNU_SOURCE"]);
    if build == Build::Sanitized {
        cmd.args(["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]);
    }
    cmd.arg("-I")
        .arg(root().join("include"))
        .arg("-I")
        .arg(root().join("tests/c"));
    cmd.args(sources).arg("-o").arg(out);
    let lib = lib_dir();
    cmd.arg("-L")
        .arg(lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lmemprobe")
        .arg("-lpthread");
    cmd.args(extra);
    let o = cmd.output().expect("run the C compiler");
    assert!(
        o.status.success(),
        "compile {:?} failed:\n{}",
        sources,
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Variables that choose GPUs and fake GPU scripts. Programs run by this
/// harness never inherit them, so the developer's environment (a real GPU,
/// `CUDA_VISIBLE_DEVICES`) cannot change a test; tests pass them explicitly.
pub const GPU_ENV: &[&str] = &[
    "MEMPROBE_GPU_BACKEND",
    "MEMPROBE_NVML_LIBRARY",
    "MEMPROBE_CUDART_LIBRARY",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "FAKE_NVML_SCRIPT",
    "FAKE_CUDART_SCRIPT",
];

fn set_env(cmd: &mut Command, env: &[(&str, &str)]) {
    for v in GPU_ENV {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
}

/// Runs a program and returns its output; `env` is added to the environment
/// (from which [`GPU_ENV`] is removed first).
pub fn run(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args);
    set_env(&mut cmd, env);
    cmd.output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

/// Whether valgrind is installed; missing, the caller's test skips (or,
/// under `CI=true`, fails) through [`required_tool`].
pub fn have_valgrind(test: &str) -> bool {
    required_tool::require(test, &["valgrind"], "apt-get install valgrind")
}

/// Runs `program` under valgrind memcheck with its default leak kinds, as a
/// user's CI would: any error, definite or possible leak fails it.
pub fn run_valgrind(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("valgrind");
    cmd.args(["--error-exitcode=99", "--leak-check=full", "--quiet"]);
    // A forked child holds copies of blocks owned by threads that exist only
    // in the parent; leak-checking it is meaningless. The parent is checked in
    // full, and children's memory errors are caught by the ASan runs.
    cmd.arg("--child-silent-after-fork=yes");
    cmd.arg(program).args(args);
    set_env(&mut cmd, env);
    cmd.output().expect("run valgrind")
}

/// Asserts a program exited 0, showing its output otherwise.
pub fn assert_ok(what: &str, o: &Output) {
    assert!(
        o.status.success(),
        "{what} failed ({:?})\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A fake GPU library of `tests/fake-gpu/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FakeGpu {
    /// `fake_nvml.c`, standing in for `libnvidia-ml.so.1`.
    Nvml,
    /// `fake_cudart.c`, standing in for `libcudart.so`.
    Cudart,
}

impl FakeGpu {
    fn source(self) -> &'static str {
        match self {
            FakeGpu::Nvml => "fake_nvml.c",
            FakeGpu::Cudart => "fake_cudart.c",
        }
    }

    /// The name the real library has, which a copy of the fake takes.
    pub fn lib_name(self) -> &'static str {
        match self {
            FakeGpu::Nvml => "libnvidia-ml.so.1",
            FakeGpu::Cudart => "libcudart.so",
        }
    }

    /// The script file the fake reads from its own directory.
    pub fn script_name(self) -> &'static str {
        match self {
            FakeGpu::Nvml => "fake_nvml.script",
            FakeGpu::Cudart => "fake_cudart.script",
        }
    }
}

/// Compiles a fake GPU library (once per variant and test process) and
/// returns its path. `omit` lists NVML symbols to leave out (`nvmlShutdown`,
/// ...; see tests/fake-gpu/README.md); it must be empty for the CUDA runtime.
pub fn fake_gpu_lib(kind: FakeGpu, omit: &[&str]) -> PathBuf {
    type Built = HashMap<(FakeGpu, Vec<String>), PathBuf>;
    static BUILT: Mutex<Option<Built>> = Mutex::new(None);
    assert!(
        kind == FakeGpu::Nvml || omit.is_empty(),
        "only the fake NVML can leave symbols out"
    );
    let defines: Vec<String> = omit.iter().map(|s| fake_gpu::omit_define(s)).collect();
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    let key = (kind, defines.clone());
    if let Some(p) = built.get(&key) {
        return p.clone();
    }
    let out = scratch("fake-gpu").join(format!("variant{}.so", built.len()));
    fake_gpu::compile_fake(
        &root().join("tests/fake-gpu"),
        kind.source(),
        &defines,
        &out,
    );
    built.insert(key, out.clone());
    out
}

/// A private copy of a fake GPU library in `dir` (created), under the real
/// library's name, with `script` beside it; returns the library's path.
/// Each copy is a separate library instance with its own script.
pub fn stage_fake_gpu(kind: FakeGpu, omit: &[&str], script: &str, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("create the fake GPU directory");
    let lib = dir.join(kind.lib_name());
    std::fs::copy(fake_gpu_lib(kind, omit), &lib).expect("copy the fake GPU library");
    std::fs::write(dir.join(kind.script_name()), script).expect("write the fake GPU script");
    lib
}

/// Builds the driver-API interposer and copies it to
/// `dir/libmemprobe_interpose.so`, and compiles the fake driver
/// (tests/fake-gpu/fake_cuda.c) as `dir/driver/libcuda.so.1`; returns the
/// interposer's path and the driver's directory (for `LD_LIBRARY_PATH`).
pub fn stage_interposer_and_driver(dir: &Path) -> (PathBuf, PathBuf) {
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
        target_dir().join("debug/libmemprobe_interpose.so"),
        &interposer,
    )
    .expect("copy the interposer");
    let driver_dir = dir.join("driver");
    std::fs::create_dir_all(&driver_dir).unwrap();
    // -Bsymbolic: the driver's calls to its own functions stay inside it,
    // as in the real one.
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
    (interposer, driver_dir)
}
