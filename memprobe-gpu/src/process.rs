//! Processes on a GPU, and this process's share of one.

/// Which of NVML's lists a process came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuProcessKind {
    /// A compute context (CUDA, OpenCL).
    Compute,
    /// A graphics context (OpenGL, Vulkan, display).
    Graphics,
}

/// One entry of a device's process list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProcess {
    /// The PID as the driver reports it: usually the host PID, even inside a
    /// container (see the crate documentation).
    pub pid: u32,
    /// Bytes the process uses on the device; `None` when the driver does not
    /// say (`NVML_VALUE_NOT_AVAILABLE`, e.g. Windows WDDM).
    pub used: Option<u64>,
    /// The list it came from.
    pub kind: GpuProcessKind,
}

/// This process's memory on one device at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuProcessMemory {
    /// Bytes this process uses on the device (0 when it has no context there).
    pub used: u64,
    /// When the reading was taken (`memprobe_core::monotonic_ns()`).
    pub taken_at_ns: u64,
    /// How long the query took, in nanoseconds.
    pub read_ns: u64,
}
