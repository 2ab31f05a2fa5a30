//! Points the exported `dlsym` at its assembly entry (src/dlsym.rs), which
//! forwards by a tail jump so that glibc sees the original caller (what
//! `RTLD_NEXT` is relative to). Only the cdylib link gets the flag.

fn main() {
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if arch == "x86_64" || arch == "aarch64" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--defsym=dlsym=memprobe_interpose_dlsym_entry");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
