//! Gives libmemprobe.so the SONAME that memprobe-ffi-impl's build script
//! computed (and that its `memprobe_soname()` returns).

fn main() {
    let soname =
        std::env::var("DEP_MEMPROBE_SONAME").expect("memprobe-ffi-impl's build script sets it");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    println!("cargo:rerun-if-changed=build.rs");
}
