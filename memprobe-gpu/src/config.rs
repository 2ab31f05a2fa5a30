//! Which GPU backend to use and where its library is: explicit, or from the
//! environment.

use memprobe_core::{Error, Result};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// `MEMPROBE_GPU_BACKEND`: `auto`, `nvml`, `cudart` or `none`.
pub const ENV_GPU_BACKEND: &str = "MEMPROBE_GPU_BACKEND";
/// `MEMPROBE_NVML_LIBRARY`: the path of libnvidia-ml to load.
pub const ENV_NVML_LIBRARY: &str = "MEMPROBE_NVML_LIBRARY";
/// `MEMPROBE_CUDART_LIBRARY`: the path of libcudart to load.
pub const ENV_CUDART_LIBRARY: &str = "MEMPROBE_CUDART_LIBRARY";
/// `CUDA_VISIBLE_DEVICES`, as CUDA reads it.
pub const ENV_CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// A GPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GpuBackend {
    /// NVML if it loads and initialises, else no GPU readings. The CUDA
    /// runtime is never tried automatically: it would create a CUDA context
    /// (hundreds of MB on the GPU) and break CUDA in later-forked children.
    #[default]
    Auto,
    /// NVML (libnvidia-ml), loaded at run time: no CUDA context, fork-safe.
    Nvml,
    /// The CUDA runtime (libcudart), loaded at run time: creates a context.
    Cudart,
    /// No GPU readings.
    None,
}

impl GpuBackend {
    /// The name used in `MEMPROBE_GPU_BACKEND`.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuBackend::Auto => "auto",
            GpuBackend::Nvml => "nvml",
            GpuBackend::Cudart => "cudart",
            GpuBackend::None => "none",
        }
    }
}

impl fmt::Display for GpuBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for GpuBackend {
    type Err = Error;

    /// Parses `auto`, `nvml`, `cudart` or `none` (any case, blanks trimmed);
    /// an empty string is `auto`.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(GpuBackend::Auto),
            "nvml" => Ok(GpuBackend::Nvml),
            "cudart" => Ok(GpuBackend::Cudart),
            "none" => Ok(GpuBackend::None),
            _ => Err(Error::invalid(format!(
                "unknown GPU backend {s:?} (in {ENV_GPU_BACKEND}?): expected auto, nvml, cudart or none"
            ))),
        }
    }
}

/// How to open the GPUs. [`Default`] reads nothing from the environment:
/// `auto`, the default library names, every device visible.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuConfig {
    /// Which backend.
    pub backend: GpuBackend,
    /// libnvidia-ml to load; `None`: `libnvidia-ml.so.1` through the
    /// dynamic loader's search path.
    pub nvml_path: Option<PathBuf>,
    /// libcudart to load (the cudart backend and [`preload`](crate::Gpus::preload));
    /// `None`: the newest of `libcudart.so`, `.so.13`, `.so.12`, `.so.11.0`,
    /// `.so.10.x` that loads.
    pub cudart_path: Option<PathBuf>,
    /// A `CUDA_VISIBLE_DEVICES` value to apply (NVML backend); `None` means
    /// unset: every device. The CUDA runtime applies the real variable itself
    /// and ignores this.
    pub visible_devices: Option<String>,
}

impl GpuConfig {
    /// The configuration the environment asks for: `MEMPROBE_GPU_BACKEND`,
    /// `MEMPROBE_NVML_LIBRARY`, `MEMPROBE_CUDART_LIBRARY`,
    /// `CUDA_VISIBLE_DEVICES`. Empty library paths count as unset.
    ///
    /// # Errors
    /// [`InvalidArgument`](memprobe_core::ErrorKind::InvalidArgument) for an
    /// unknown `MEMPROBE_GPU_BACKEND`.
    pub fn from_env() -> Result<GpuConfig> {
        let backend = match std::env::var_os(ENV_GPU_BACKEND) {
            None => GpuBackend::Auto,
            Some(v) => v.to_string_lossy().parse()?,
        };
        let path = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Ok(GpuConfig {
            backend,
            nvml_path: path(ENV_NVML_LIBRARY),
            cudart_path: path(ENV_CUDART_LIBRARY),
            visible_devices: std::env::var_os(ENV_CUDA_VISIBLE_DEVICES)
                .map(|v| v.to_string_lossy().into_owned()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprobe_core::ErrorKind;

    #[test]
    fn backend_names() {
        for b in [
            GpuBackend::Auto,
            GpuBackend::Nvml,
            GpuBackend::Cudart,
            GpuBackend::None,
        ] {
            assert_eq!(b.as_str().parse::<GpuBackend>().unwrap(), b);
            assert_eq!(b.to_string(), b.as_str());
        }
        assert_eq!(" NVML ".parse::<GpuBackend>().unwrap(), GpuBackend::Nvml);
        assert_eq!("".parse::<GpuBackend>().unwrap(), GpuBackend::Auto);
        let e = "rocm".parse::<GpuBackend>().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(
            e.message().contains("rocm") && e.message().contains("auto, nvml, cudart or none"),
            "{e}"
        );
    }
}
