//! Compiling the fake GPU libraries of `tests/fake-gpu/`. Shared by the
//! memprobe-tests harness and memprobe-gpu's tests (which include this file
//! with `#[path]`), so both build the fakes the same way.

use std::path::Path;
use std::process::Command;

/// The `-D` name that leaves NVML symbol `symbol` out of `fake_nvml.c`.
pub fn omit_define(symbol: &str) -> String {
    format!("FAKE_OMIT_{symbol}")
}

/// Compiles `fake_dir/source` into the shared library `out`, with
/// `-D<define>` for each of `defines`; panics with the compiler's message
/// on failure. `$CC` is used when set, else `cc`.
pub fn compile_fake(fake_dir: &Path, source: &str, defines: &[String], out: &Path) {
    let mut cmd = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args([
        "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-O2", "-o",
    ])
    .arg(out)
    .arg(fake_dir.join(source));
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    cmd.arg("-lpthread");
    let o = cmd
        .output()
        .expect("running cc (a C compiler is needed for the GPU tests)");
    assert!(
        o.status.success(),
        "compiling {source} {defines:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
