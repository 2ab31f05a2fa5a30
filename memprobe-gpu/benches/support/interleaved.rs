//! Nanoseconds per call of several cases, measured interleaved: each round
//! times a batch of every case, in an order that alternates between rounds,
//! so drift (clock boosts, caches, other load) falls on all cases alike.
//!
//! Included with `#[path]` by the benchmarks that compare calls (this
//! crate's gpu_read, memprobe-tests' monitor_cpu): a library shared by both
//! would make memprobe-gpu depend on the test crate that depends on it.

use std::time::Instant;

/// The median of `v` (the upper middle one for an even count).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Median ns per call of each case over `rounds` rounds of `batch` calls,
/// interleaved round by round, after 10 batches of each as a warm-up.
pub(crate) fn per_call(batch: usize, rounds: usize, cases: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    let mut per_case: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); cases.len()];
    for _ in 0..batch * 10 {
        for c in cases.iter_mut() {
            c();
        }
    }
    for round in 0..rounds {
        let n = cases.len();
        for k in 0..n {
            let i = if round % 2 == 0 { k } else { n - 1 - k };
            let start = Instant::now();
            for _ in 0..batch {
                (cases[i])();
            }
            per_case[i].push(start.elapsed().as_nanos() as f64 / batch as f64);
        }
    }
    per_case.into_iter().map(median).collect()
}
