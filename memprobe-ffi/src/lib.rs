//! memprobe-ffi: builds memprobe's C library, `libmemprobe.so` and
//! `libmemprobe.a`, and nothing else.
//!
//! Every entry point, handle and boundary check lives in
//! [`memprobe_ffi_impl`] (the crate Rust code, the tests included, depends
//! on); linking it here exports its `#[no_mangle]` functions from both
//! artifacts. This crate is the C library's name and SONAME only (see
//! build.rs), as wasmtime's `c-api/artifact` is to `wasmtime-c-api-impl`.

pub use memprobe_ffi_impl::*;
