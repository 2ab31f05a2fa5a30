//! What the GPU-origin tests run over, built alike for each: the
//! interposer (by cargo, beside the memprobe binary), the fake driver
//! (tests/fake-gpu/fake_cuda.c), a CUDA runtime stand-in, libraries that
//! allocate as NCCL or cuBLAS would (tests/interpose/origin_lib.c) and
//! programs linked to them. Shared by tests/gpu_origins.rs and
//! cli/gpu_origins_views.rs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn src(n: &str) -> String {
    root().join(n).display().to_string()
}

fn cc(args: &[String], out: &Path) {
    let o = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-g"])
        .args(args)
        .arg("-o")
        .arg(out)
        .output()
        .expect("run cc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The interposer, built by the workspace's cargo.
pub(crate) fn build_interposer() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "-q", "-p", "memprobe-interpose-preload"])
        .current_dir(root())
        .status()
        .expect("run cargo build");
    assert!(st.success(), "cargo build -p memprobe-interpose-preload");
}

/// In `dir`: the fake driver (libcuda.so.1), the runtime (libcudart.so.12)
/// and `libfake_<LIB>.so` for each of `libs`.
pub(crate) fn origin_libs(dir: &Path, libs: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    let link = [format!("-L{}", dir.display()), "-l:libcuda.so.1".into()];
    let mut driver = strings(&[
        "-shared",
        "-fPIC",
        "-Wl,-soname,libcuda.so.1",
        "-Wl,-Bsymbolic",
    ]);
    driver.extend([src("tests/fake-gpu/fake_cuda.c"), "-lpthread".into()]);
    cc(&driver, &dir.join("libcuda.so.1"));
    let mut rt = strings(&["-shared", "-fPIC", "-Wl,-soname,libcudart.so.12"]);
    rt.push(src("tests/interpose/origin_runtime.c"));
    rt.extend(link.iter().cloned());
    cc(&rt, &dir.join("libcudart.so.12"));
    for lib in libs {
        let mut v = strings(&["-shared", "-fPIC"]);
        v.extend([
            format!("-DLIB={lib}"),
            format!("-Wl,-soname,libfake_{lib}.so"),
            src("tests/interpose/origin_lib.c"),
            "-l:libcudart.so.12".into(),
        ]);
        v.extend(link.iter().cloned());
        cc(&v, &dir.join(format!("libfake_{lib}.so")));
    }
}

/// `tests/interpose/<source>` built as `out`, allocating itself as "the
/// program" and linked to `libs` of [`origin_libs`]'s `dir`; `flags` added.
pub(crate) fn origin_program(dir: &Path, source: &str, libs: &[&str], flags: &[&str], out: &Path) {
    let mut v = strings(&["-DLINKED", "-DLIB=prog"]);
    v.extend(strings(flags));
    v.extend([
        format!("-I{}", root().join("tests/interpose").display()),
        src(&format!("tests/interpose/{source}")),
        src("tests/interpose/origin_lib.c"),
    ]);
    v.extend(libs.iter().map(|l| format!("-l:libfake_{l}.so")));
    v.extend(strings(&["-l:libcudart.so.12", "-ldl"]));
    v.extend([format!("-L{}", dir.display()), "-l:libcuda.so.1".into()]);
    cc(&v, out);
}

/// The fake NVML as `out`.
#[allow(dead_code)] // used by the cli crate only
pub(crate) fn fake_nvml(out: &Path) {
    let v = vec![
        "-shared".into(),
        "-fPIC".into(),
        src("tests/fake-gpu/fake_nvml.c"),
        "-lpthread".into(),
    ];
    cc(&v, out);
}
