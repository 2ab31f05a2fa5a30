//! Computes the SONAME of libmemprobe.so: `libmemprobe.so.<major>` from 1.0
//! on, `libmemprobe.so.0.<minor>` before (every 0.x minor may break the ABI).
//! `memprobe_soname()` returns it; memprobe-ffi, which links the library,
//! reads it as DEP_MEMPROBE_SONAME.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets it");
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").expect("cargo sets it");
    let soname = if major == "0" {
        format!("libmemprobe.so.0.{minor}")
    } else {
        format!("libmemprobe.so.{major}")
    };
    println!("cargo:rustc-env=MEMPROBE_SONAME={soname}");
    println!("cargo:soname={soname}");
    println!("cargo:rerun-if-changed=build.rs");
}
