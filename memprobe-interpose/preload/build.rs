//! Points the exported `dlsym` at its assembly entry (src/dlsym.rs), which
//! forwards by a tail jump so that glibc sees the original caller (what
//! `RTLD_NEXT` is relative to). Only the cdylib link gets the alias.
//!
//! GNU ld and lld take it as `--defsym`. zig's linker (cargo-zigbuild, which
//! builds the wheels against an older glibc: packaging/wheel-cargo) has no
//! `--defsym` and gets the same assignment as a linker script: lld reads a
//! script without SECTIONS as an addition to its default layout (GNU ld
//! would replace its layout with it, hence not everywhere).
//!
//! It also says whether the allocation entry points can be naked-function
//! trampolines (src/trampoline.rs): naked functions are stable from Rust
//! 1.88, and the workspace builds on 1.80, where the entry points are plain
//! functions whose origin comes from the stack walk.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    println!("cargo:rustc-check-cfg=cfg(memprobe_naked)");
    if rustc_minor().is_some_and(|minor| minor >= 88) {
        println!("cargo:rustc-cfg=memprobe_naked");
    }
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if arch != "x86_64" && arch != "aarch64" {
        return;
    }
    if linker_is_zig() {
        let script = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
            .join("dlsym.ld");
        std::fs::write(&script, "dlsym = memprobe_interpose_dlsym_entry;\n")
            .expect("OUT_DIR is writable");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{}", script.display());
    } else {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--defsym=dlsym=memprobe_interpose_dlsym_entry");
    }
}

/// cargo-zigbuild's linker is a `zigcc-<target>` wrapper (cargo passes the
/// configured linker to build scripts as RUSTC_LINKER).
fn linker_is_zig() -> bool {
    std::env::var_os("RUSTC_LINKER").is_some_and(|l| {
        Path::new(&l)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains("zig"))
    })
}

/// The minor version of the compiler cargo builds with (`rustc 1.M.P ...`).
fn rustc_minor() -> Option<u32> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.split_whitespace().nth(1)?;
    version.split('.').nth(1)?.parse().ok()
}
