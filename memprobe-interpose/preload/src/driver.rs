//! The CUDA driver functions the interposer calls, named once: the wrapped
//! ones and those it only uses, as an enum ([`H`]) with their names, and
//! the driver API's result type. `hooks.rs` makes a wrapper of each hooked
//! one from the same list; `real.rs` finds the driver's own.

use std::ffi::c_int;

/// `CUresult`.
pub(crate) type CUresult = c_int;

pub(crate) const CUDA_SUCCESS: CUresult = 0;

/// Calls `$m!` with the list of driver functions: `hooked:` those wrapped,
/// `internal:` those only called.
macro_rules! with_driver_functions {
    ($m:ident) => {
        $m! {
    hooked:
        cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemAllocManaged, cuMemFree_v2,
        cuMemCreate, cuMemRelease,
        cuMemPoolCreate, cuMemAllocAsync, cuMemAllocAsync_ptsz, cuMemAllocFromPoolAsync,
        cuMemAllocFromPoolAsync_ptsz, cuMemFreeAsync, cuMemFreeAsync_ptsz, cuMemPoolTrimTo,
        cuMemPoolDestroy, cuStreamSynchronize, cuStreamSynchronize_ptsz, cuCtxSynchronize,
        cuArrayCreate_v2, cuArray3DCreate_v2, cuArrayDestroy, cuMipmappedArrayCreate,
        cuMipmappedArrayDestroy,
        cuMemHostAlloc, cuMemAllocHost_v2, cuMemFreeHost, cuMemHostRegister_v2, cuMemHostUnregister,
        cuGetProcAddress, cuGetProcAddress_v2;
    internal:
        cuCtxGetDevice, cuMemPoolGetAttribute, cuDeviceGetMemPool,
        }
    };
}
pub(crate) use with_driver_functions;

macro_rules! names {
    (hooked: $($h:ident),* $(,)? ; internal: $($i:ident),* $(,)?) => {
        /// Every driver function the interposer calls: the wrapped ones,
        /// then those it only uses.
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        pub(crate) enum H { $($h,)* $($i,)* }

        /// Their NUL-terminated names, by `H as usize`.
        pub(crate) const NAMES: [&[u8]; [$(stringify!($h),)* $(stringify!($i),)*].len()] = [
            $(concat!(stringify!($h), "\0").as_bytes(),)*
            $(concat!(stringify!($i), "\0").as_bytes(),)*
        ];

        /// The wrapped ones.
        pub(crate) const HOOKED: &[H] = &[$(H::$h),*];
    };
}

with_driver_functions!(names);
