//! The names people know the origins of GPU memory by: `libc10_cuda.so` is
//! PyTorch's caching allocator, `libnccl.so.2` is NCCL. One table, so that
//! every place that shows origins (`memprobe run`, `gpus`, `watch`, the
//! out-of-memory report, the exporter's gauge) says the same thing.

use crate::origins::{Origin, OriginBytes, OVERFLOW_LIBRARY, UNKNOWN_LIBRARY};

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

/// `origins`' bytes under their familiar names (two libraries may share
/// one: `libcudnn_ops` and `libcudnn_cnn` are both cuDNN), largest first,
/// ties by name: what every per-process view lists.
pub fn by_familiar_name<'a>(
    origins: impl IntoIterator<Item = &'a OriginBytes>,
) -> Vec<(String, u64)> {
    let mut named: Vec<(String, u64)> = Vec::new();
    for o in origins {
        let name = o.origin.familiar_name();
        match named.iter_mut().find(|(n, _)| *n == name) {
            Some(e) => e.1 += o.bytes,
            None => named.push((name, o.bytes)),
        }
    }
    named.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    named
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

    #[test]
    fn same_names_are_summed_largest_first() {
        let o = |library: &str, program: bool, bytes: u64| OriginBytes {
            origin: Origin {
                id: 0,
                library: library.into(),
                symbol: None,
                address: 0,
                offset: 0,
                program,
            },
            bytes,
        };
        let v = [
            o("/x/libcudnn_ops.so.9", false, 3),
            o("/usr/lib/libnccl.so.2", false, 5),
            o("/x/libcudnn_cnn.so.9", false, 4),
            o("/usr/bin/python3", true, 5),
        ];
        assert_eq!(
            by_familiar_name(&v),
            vec![
                ("cuDNN".to_string(), 7),
                ("NCCL".to_string(), 5),
                ("the program".to_string(), 5)
            ]
        );
    }
}
