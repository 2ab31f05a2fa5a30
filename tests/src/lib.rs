//! Harness for memprobe's cross-language tests: builds `libmemprobe.so`,
//! stages it with its SONAME, compiles C and C++ programs against
//! `include/`, and runs them (plainly, under AddressSanitizer, under valgrind).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

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

/// Runs a program and returns its output; `env` is added to the environment.
pub fn run(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

/// Whether valgrind is installed.
pub fn have_valgrind() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `program` under valgrind memcheck; fails on any error or definite leak.
pub fn run_valgrind(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--error-exitcode=99",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite",
        "--show-leak-kinds=definite",
        "--quiet",
    ]);
    // A forked child holds copies of blocks owned by threads that exist only
    // in the parent; leak-checking it is meaningless. The parent is checked in
    // full, and children's memory errors are caught by the ASan runs.
    cmd.arg("--child-silent-after-fork=yes");
    cmd.arg(program).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
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
