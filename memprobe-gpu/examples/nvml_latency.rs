//! Measures a GPU memory read through memprobe on the real driver: the
//! median over many reads of `DeviceHandle::memory()` (NVML's v2 memory
//! query) and of `gpu_mem_get_used_fast`, printed as JSON for
//! scripts/gpu-validate.py. Usage: `nvml_latency [reads]`.

use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let reads: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let gpus = match memprobe_gpu::Gpus::from_env() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("nvml_latency: {e}");
            std::process::exit(1);
        }
    };
    let dev = match gpus.device(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("nvml_latency: device 0: {e}");
            std::process::exit(1);
        }
    };
    let mut memory = Vec::with_capacity(reads);
    let mut fast = Vec::with_capacity(reads);
    for _ in 0..reads {
        let t = Instant::now();
        std::hint::black_box(dev.memory().unwrap());
        memory.push(t.elapsed().as_nanos() as f64);
        let t = Instant::now();
        std::hint::black_box(memprobe_gpu::gpu_mem_get_used_fast(&dev));
        fast.push(t.elapsed().as_nanos() as f64);
    }
    println!(
        "{{\"reads\":{reads},\"memory_median_ns\":{:.0},\"used_fast_median_ns\":{:.0},\"backend\":\"{}\"}}",
        median(memory),
        median(fast),
        gpus.backend()
    );
}
