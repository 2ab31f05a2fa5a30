//! The names people know the origins of GPU memory by: `libc10_cuda.so` is
//! PyTorch's caching allocator, `libnccl.so.2` is NCCL. One table, so that
//! every place that shows origins (`memprobe run`, `gpus`, `watch`, the
//! out-of-memory report, the exporter's gauge) says the same thing.

use crate::origins::{Origin, OVERFLOW_LIBRARY, UNKNOWN_LIBRARY};

/// Library file-name prefixes and what they are.
const KNOWN: [(&str, &str); 9] = [
    ("libc10_cuda.so", "PyTorch caching allocator"),
    ("libtorch_cuda.so", "PyTorch (libtorch_cuda)"),
    ("libnccl.so", "NCCL"),
    ("libcublasLt.so", "cuBLASLt"),
    ("libcublas.so", "cuBLAS"),
    ("libcudnn", "cuDNN"),
    ("libcufft.so", "cuFFT"),
    ("libcusparse.so", "cuSPARSE"),
    ("libcudart.so", "CUDA runtime"),
];

/// The name of the code in `library` (a path as the loader knows it);
/// `program`: it is the process's own executable.
pub fn familiar_name(library: &str, program: bool) -> String {
    if program {
        return "the program".into();
    }
    let file = library.rsplit('/').next().unwrap_or(library);
    if let Some((_, name)) = KNOWN.iter().find(|(p, _)| file.starts_with(p)) {
        return (*name).into();
    }
    match library {
        UNKNOWN_LIBRARY => "code the loader cannot place".into(),
        OVERFLOW_LIBRARY => "other origins".into(),
        _ => file.into(),
    }
}

impl Origin {
    /// What people call this origin ([`familiar_name`]).
    pub fn familiar_name(&self) -> String {
        familiar_name(&self.library, self.program)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_get_the_names_users_know() {
        assert_eq!(
            familiar_name("/site/torch/lib/libc10_cuda.so", false),
            "PyTorch caching allocator"
        );
        assert_eq!(familiar_name("/usr/lib/libnccl.so.2", false), "NCCL");
        assert_eq!(familiar_name("/x/libcublasLt.so.12", false), "cuBLASLt");
        assert_eq!(familiar_name("/x/libcublas.so.12", false), "cuBLAS");
        assert_eq!(familiar_name("/x/libcudnn_ops.so.9", false), "cuDNN");
        assert_eq!(familiar_name("/usr/bin/python3.11", true), "the program");
        assert_eq!(familiar_name("/usr/bin/python3.11", false), "python3.11");
        assert_eq!(familiar_name("/opt/libmine.so", false), "libmine.so");
        assert_eq!(
            familiar_name(UNKNOWN_LIBRARY, false),
            "code the loader cannot place"
        );
        assert_eq!(familiar_name(OVERFLOW_LIBRARY, false), "other origins");
    }
}
