//! Our `dlsym`: `cu*` names the interposer wraps are answered with its
//! wrappers; every other lookup goes to glibc's `dlsym` by a tail jump, with
//! the caller's return address untouched, so `RTLD_NEXT` stays relative to
//! the real caller (another interposer asking for the next `malloc` gets
//! it). Only the jump needs assembly; the decision is Rust.
//!
//! build.rs aliases the exported `dlsym` to `memprobe_interpose_dlsym_entry`.

// The export is reached through the dynamic symbol table.
#![allow(unreachable_pub)]

use crate::hooks::{by_name, wrapper};
use crate::real::{real_dlsym, record};
use std::ffi::{c_char, c_void, CStr};

#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl memprobe_interpose_dlsym_entry",
    ".type memprobe_interpose_dlsym_entry,@function",
    ".p2align 4",
    "memprobe_interpose_dlsym_entry:",
    // Keep the arguments; 24 more bytes align the stack to 16 for the call
    // and leave 8 for the answer.
    "push rdi",
    "push rsi",
    "sub rsp, 24",
    "mov rdx, rsp",
    "call {decide}",
    "mov r11, [rsp]",
    "add rsp, 24",
    "pop rsi",
    "pop rdi",
    "test eax, eax",
    "jnz 2f",
    "mov rax, r11",
    "ret",
    "2:",
    "jmp r11",
    ".size memprobe_interpose_dlsym_entry, .-memprobe_interpose_dlsym_entry",
    decide = sym decide,
);

#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
    ".globl memprobe_interpose_dlsym_entry",
    ".type memprobe_interpose_dlsym_entry,%function",
    ".p2align 4",
    "memprobe_interpose_dlsym_entry:",
    "stp x29, x30, [sp, #-48]!",
    "mov x29, sp",
    "stp x0, x1, [sp, #16]",
    "add x2, sp, #32",
    "bl {decide}",
    "ldr x16, [sp, #32]",
    "mov x17, x0",
    "ldp x0, x1, [sp, #16]",
    "ldp x29, x30, [sp], #48",
    "cbnz x17, 2f",
    "mov x0, x16",
    "ret",
    "2:",
    "br x16",
    ".size memprobe_interpose_dlsym_entry, .-memprobe_interpose_dlsym_entry",
    decide = sym decide,
);

/// What `dlsym(handle, name)` does: returns 0 with the answer in `*out`, or
/// 1 with glibc's `dlsym` in `*out` to jump to.
unsafe extern "C" fn decide(
    handle: *mut c_void,
    name: *const c_char,
    out: *mut *mut c_void,
) -> u32 {
    let Some(real) = real_dlsym() else {
        // SAFETY: `out` points into the entry's stack frame.
        unsafe { *out = std::ptr::null_mut() };
        return 0;
    };
    // SAFETY: as above.
    unsafe { *out = real as *mut c_void };
    // `RTLD_NEXT` is relative to the caller, which only the jump preserves:
    // such lookups pass through (and are not counted). Every other name but
    // the wrapped ones goes through before anything else happens: a malloc
    // implementation looking itself up never meets our set-up.
    if name.is_null() || handle == libc::RTLD_NEXT {
        return 1;
    }
    // SAFETY: dlsym's contract: a NUL-terminated name.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    let Some(h) = by_name(bytes) else {
        return 1;
    };
    if !crate::region::counting() {
        return 1;
    }
    // SAFETY: glibc's dlsym with the caller's arguments.
    let p = unsafe { real(handle, name) };
    if p.is_null() {
        // SAFETY: as above.
        unsafe { *out = std::ptr::null_mut() };
        return 0;
    }
    record(h, p, wrapper);
    // SAFETY: as above.
    unsafe { *out = wrapper(h) };
    0
}

/// Where the assembly entry is not written (other architectures): a plain
/// forward, with `RTLD_NEXT` relative to this library.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[no_mangle]
pub unsafe extern "C" fn memprobe_interpose_dlsym_entry(
    handle: *mut c_void,
    name: *const c_char,
) -> *mut c_void {
    let mut out = std::ptr::null_mut();
    // SAFETY: forwarding the caller's arguments.
    let forward = unsafe { decide(handle, name, &mut out) };
    if forward == 1 {
        // SAFETY: `out` is glibc's dlsym.
        let f: crate::real::DlsymFn = unsafe { std::mem::transmute(out) };
        // SAFETY: the caller's arguments.
        return unsafe { f(handle, name) };
    }
    out
}

/// The exported name. Its body never runs on x86_64 and aarch64: the link
/// points `dlsym` at the assembly entry (build.rs); this definition only
/// puts the name on the library's export list.
///
/// # Safety
/// dlsym's contract.
#[cfg(not(test))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let mut out = std::ptr::null_mut();
    // SAFETY: forwarding the caller's arguments.
    if unsafe { decide(handle, name, &mut out) } == 1 {
        // SAFETY: `out` is glibc's dlsym.
        let f: crate::real::DlsymFn = unsafe { std::mem::transmute(out) };
        // SAFETY: the caller's arguments.
        return unsafe { f(handle, name) };
    }
    out
}
