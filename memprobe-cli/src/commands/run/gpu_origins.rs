//! `memprobe run --gpu-exact`: what held each process's GPU memory at its
//! peak, by origin (the first library outside the CUDA driver and runtime
//! on each allocation's stack, named by the interposer; see
//! docs/attribution.md), with the memory no driver call shows beside it.

use crate::units;
use memprobe_interpose_reader::origins::PeakOrigins;
use memprobe_interpose_reader::{Counter, Region};
use serde::Serialize;

/// One origin's bytes at a peak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct OriginLine {
    /// What the summary calls it ("PyTorch caching allocator", "NCCL",
    /// "the program", or the library's file name).
    pub(crate) name: String,
    /// The library's path as the process's loader knew it.
    pub(crate) library: String,
    /// The nearest dynamic symbol at its first call site, when known.
    pub(crate) symbol: Option<String>,
    pub(crate) bytes: u64,
}

/// One device's breakdown at a process's exact peak there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct OriginsAtPeak {
    /// The peak (the sum of `by_origin`).
    pub(crate) peak_bytes: u64,
    /// Largest first.
    pub(crate) by_origin: Vec<OriginLine>,
    /// When the interposer copied it, `CLOCK_MONOTONIC` ns (0: unknown).
    #[serde(skip)]
    pub(crate) at_mono_ns: u64,
}

/// The name the summary gives a library; `program` is the process's own
/// executable.
pub(crate) fn name_of(library: &str, program: Option<&str>) -> String {
    let file = library.rsplit('/').next().unwrap_or(library);
    // The loader names the program by its path or by argv[0]: the file
    // names are compared.
    let is_program = program.is_some_and(|p| p.rsplit('/').next() == Some(file));
    // The names every view shares (gpus, watch, the exporter, OOM reports).
    memprobe_interpose_reader::origin_names::familiar_name(library, is_program)
}

/// A breakdown read from a region, with the summary's names.
pub(crate) fn named(p: PeakOrigins, program: Option<&str>) -> OriginsAtPeak {
    OriginsAtPeak {
        peak_bytes: p.peak,
        at_mono_ns: p.at_ns,
        by_origin: p
            .by_origin
            .into_iter()
            .map(|o| OriginLine {
                // The interposer knows its program; the executable's path
                // read from outside is the fallback.
                name: if o.origin.program {
                    "the program".into()
                } else {
                    name_of(&o.origin.library, program)
                },
                library: o.origin.library,
                symbol: o.origin.symbol,
                bytes: o.bytes,
            })
            .collect(),
    }
}

/// The breakdown at the peak of each of the first `devices` devices
/// (`None` where the interposer kept none).
pub(crate) fn read(
    region: &Region,
    devices: usize,
    program: Option<&str>,
) -> Vec<Option<OriginsAtPeak>> {
    (0..devices as u32)
        .map(|d| Some(named(region.peak_origins(Counter::Device(d))?, program)))
        .collect()
}

/// The origins of a breakdown by name (same names summed), largest first.
fn by_name(p: &OriginsAtPeak) -> Vec<(String, u64)> {
    let mut named: Vec<(String, u64)> = Vec::new();
    for o in &p.by_origin {
        match named.iter_mut().find(|(n, _)| *n == o.name) {
            Some(e) => e.1 += o.bytes,
            None => named.push((o.name.clone(), o.bytes)),
        }
    }
    named.sort_by_key(|n| std::cmp::Reverse(n.1));
    named
}

/// `name BYTES, ...` of the `n` largest origins by name, then how many
/// more (`+2 more`).
pub(crate) fn top(p: &OriginsAtPeak, n: usize) -> String {
    let named = by_name(p);
    let mut parts: Vec<String> = named
        .iter()
        .take(n)
        .map(|(name, b)| format!("{name} {}", units::bytes(*b)))
        .collect();
    if named.len() > n {
        parts.push(format!("+{} more", named.len() - n));
    }
    parts.join(", ")
}

/// `TOTAL: name BYTES, ...`: the origins of a breakdown, same names summed,
/// largest first.
pub(crate) fn held(p: &OriginsAtPeak) -> String {
    held_in(p, None)
}

/// [`held`] with where the peak was (`TOTAL in epoch 3 / step 812: ...`).
pub(crate) fn held_in(p: &OriginsAtPeak, place: Option<&str>) -> String {
    let parts: Vec<String> = by_name(p)
        .iter()
        .map(|(n, b)| format!("{n} {}", units::bytes(*b)))
        .collect();
    format!(
        "{}{}: {}",
        units::bytes(p.peak_bytes),
        place.map(|w| format!(" in {w}")).unwrap_or_default(),
        if parts.is_empty() {
            "nothing counted".to_owned()
        } else {
            parts.join(", ")
        }
    )
}

/// The summary's line for one process's peak on one device: its origins
/// (same names summed, largest first), then the memory NVML shows beyond
/// what the interposer counted (`context`, sampled), or "unknown" without
/// NVML's per-process figure.
pub(crate) fn summary(p: &OriginsAtPeak, context: Option<u64>) -> String {
    summary_in(p, context, None)
}

/// [`summary`] with where the peak was.
pub(crate) fn summary_in(p: &OriginsAtPeak, context: Option<u64>, place: Option<&str>) -> String {
    format!(
        "{}; CUDA context and unseen {}",
        held_in(p, place),
        context.map_or_else(
            || "unknown (no NVML per-process figure)".to_owned(),
            |c| format!("{} (NVML minus counted, sampled)", units::bytes(c))
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprobe_interpose_reader::origins::{OVERFLOW_LIBRARY, UNKNOWN_LIBRARY};

    fn line(library: &str, bytes: u64) -> OriginLine {
        OriginLine {
            name: name_of(library, Some("/usr/bin/python3.11")),
            library: library.into(),
            symbol: None,
            bytes,
        }
    }

    #[test]
    fn libraries_get_the_names_users_know() {
        let p = Some("/usr/bin/python3.11");
        assert_eq!(
            name_of("/site/torch/lib/libc10_cuda.so", p),
            "PyTorch caching allocator"
        );
        assert_eq!(name_of("/usr/lib/libnccl.so.2", p), "NCCL");
        assert_eq!(name_of("/x/libcublasLt.so.12", p), "cuBLASLt");
        assert_eq!(name_of("/x/libcublas.so.12", p), "cuBLAS");
        assert_eq!(name_of("/x/libcudnn_ops.so.9", p), "cuDNN");
        assert_eq!(name_of("/usr/bin/python3.11", p), "the program");
        assert_eq!(name_of("/opt/libmine.so", p), "libmine.so");
        assert_eq!(name_of(UNKNOWN_LIBRARY, p), "code the loader cannot place");
        assert_eq!(name_of(OVERFLOW_LIBRARY, None), "other origins");
    }

    #[test]
    fn the_summary_sums_names_and_says_what_nvml_adds() {
        const MIB: u64 = 1 << 20;
        let p = OriginsAtPeak {
            peak_bytes: 100 * MIB,
            at_mono_ns: 0,
            by_origin: vec![
                line("/t/libc10_cuda.so", 60 * MIB),
                line("/n/libnccl.so.2", 30 * MIB),
                line("/usr/bin/python3.11", 6 * MIB),
                line("/t/libc10_cuda.so", 4 * MIB),
            ],
        };
        let s = summary(&p, Some(5 * MIB));
        assert!(
            s.starts_with(
                "100 MiB: PyTorch caching allocator 64.0 MiB, NCCL 30.0 MiB, the program 6.00 MiB;"
            ),
            "{s}"
        );
        assert!(
            s.ends_with("CUDA context and unseen 5.00 MiB (NVML minus counted, sampled)"),
            "{s}"
        );
        assert!(summary(&p, None).ends_with("unknown (no NVML per-process figure)"));
        let empty = OriginsAtPeak {
            peak_bytes: 0,
            at_mono_ns: 0,
            by_origin: vec![],
        };
        assert_eq!(held(&empty), "0 B: nothing counted");
    }
}
