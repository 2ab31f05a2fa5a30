//! The exported allocation entry points as trampolines: two instructions
//! that put the return address (the caller of the driver function) in the
//! register of one more argument and jump to the wrapper, which therefore
//! learns its caller without walking the stack and returns straight to it.
//! Frame pointers are not needed: on entry the return address is at the
//! top of the stack (x86_64) or in the link register (aarch64). Elsewhere,
//! and with a compiler older than Rust 1.88 (naked functions; build.rs sets
//! `memprobe_naked`), the wrapper is called with no caller (0) and the
//! origin comes from the stack walk.

/// Defines each `name(args) -> CUresult` as a trampoline into
/// `wrapper(args, caller)`.
macro_rules! trampolines {
    ($($name:ident => $imp:ident($($a:ident: $t:ty),*);)*) => {
        $( crate::trampoline::trampoline!(@pick $name, $imp, ($($a: $t),*), [$($a)*]); )*
    };
}

/// One trampoline: the register of the extra argument is the one after the
/// last of the function's own (System V / AAPCS64 integer registers).
macro_rules! trampoline {
    (@pick $name:ident, $imp:ident, $p:tt, [$x1:ident $x2:ident]) => {
        crate::trampoline::jump!($name, $imp, $p, "rdx", "x2");
    };
    (@pick $name:ident, $imp:ident, $p:tt, [$x1:ident $x2:ident $x3:ident]) => {
        crate::trampoline::jump!($name, $imp, $p, "rcx", "x3");
    };
    (@pick $name:ident, $imp:ident, $p:tt, [$x1:ident $x2:ident $x3:ident $x4:ident]) => {
        crate::trampoline::jump!($name, $imp, $p, "r8", "x4");
    };
    (@pick $name:ident, $imp:ident, $p:tt, [$x1:ident $x2:ident $x3:ident $x4:ident $x5:ident]) => {
        crate::trampoline::jump!($name, $imp, $p, "r9", "x5");
    };
}

#[cfg(all(memprobe_naked, target_arch = "x86_64"))]
macro_rules! jump {
    ($name:ident, $imp:ident, ($($a:ident: $t:ty),*), $x86:literal, $arm:literal) => {
        /// The driver's entry point of this name (a trampoline into its
        /// wrapper).
        ///
        /// # Safety
        /// The driver's contract.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            core::arch::naked_asm!(
                concat!("mov ", $x86, ", qword ptr [rsp]"),
                "jmp {f}",
                f = sym $imp,
            )
        }
    };
}

#[cfg(all(memprobe_naked, target_arch = "aarch64"))]
macro_rules! jump {
    ($name:ident, $imp:ident, ($($a:ident: $t:ty),*), $x86:literal, $arm:literal) => {
        /// The driver's entry point of this name (a trampoline into its
        /// wrapper).
        ///
        /// # Safety
        /// The driver's contract.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            core::arch::naked_asm!(
                concat!("mov ", $arm, ", x30"),
                "b {f}",
                f = sym $imp,
            )
        }
    };
}

#[cfg(not(all(memprobe_naked, any(target_arch = "x86_64", target_arch = "aarch64"))))]
macro_rules! jump {
    ($name:ident, $imp:ident, ($($a:ident: $t:ty),*), $x86:literal, $arm:literal) => {
        /// The driver's entry point of this name.
        ///
        /// # Safety
        /// The driver's contract.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            // SAFETY: the caller's arguments; no caller known here.
            unsafe { $imp($($a,)* 0) }
        }
    };
}

pub(crate) use {jump, trampoline, trampolines};
