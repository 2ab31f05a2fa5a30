//! Maps keyed by pid, looked up once per process at every sample: a
//! multiply-shift hash instead of std's SipHash, which costs as much as a
//! third of a `statm` read per lookup. Pids are not chosen by an attacker
//! that could gain from collisions (the kernel hands them out), so the
//! flooding resistance SipHash buys is not needed here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map from pid to `V`.
pub(crate) type PidMap<V> = HashMap<u32, V, BuildHasherDefault<PidHasher>>;

/// Fibonacci hashing of one `u32`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PidHasher(u64);

impl Hasher for PidHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u32` is used for pids; any other key still hashes.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        // The high bits pick the bucket group in hashbrown: spread them.
        self.0 = (u64::from(n) ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_pids_spread_over_the_top_bits() {
        let tops: std::collections::HashSet<u64> = (1000u32..1256)
            .map(|p| {
                let mut h = PidHasher::default();
                h.write_u32(p);
                h.finish() >> 57
            })
            .collect();
        assert!(tops.len() > 64, "{}", tops.len());
        let mut m: PidMap<u32> = PidMap::default();
        for p in 0..10_000 {
            m.insert(p, p * 2);
        }
        assert!((0..10_000).all(|p| m[&p] == p * 2));
    }
}
