//! Origins: who asked for the memory. The interposer names, for every
//! counted allocation, the first frame outside the CUDA runtime and driver
//! (a library, or the program itself; the nearest exported symbol where
//! `dladdr` knows one), and keeps the live bytes of each such origin per
//! counter. When a counter's lifetime peak rises, the live bytes by origin
//! at that moment are copied aside: the breakdown of the peak.
//!
//! Bounded: [`MAX_ORIGINS`] origins per process (one per library and
//! symbol, not per allocation or call site); past that, everything new goes
//! to the last slot, named [`OVERFLOW_LIBRARY`]. Updates of one counter are
//! serialized by a lock of that counter, so a breakdown always sums to the
//! peak it belongs to, to the byte. The live set by origin is also copied
//! when an allocation fails with out-of-memory: what held the device then.

use crate::layout::{Layout, COUNTERS};
pub use crate::layout::{
    OriginSlot, Origins, PeakBreakdown, LIBRARY_BYTES, MAX_ORIGINS, ORIGIN_PROGRAM, SYMBOL_BYTES,
};
use std::sync::atomic::{AtomicU8, Ordering::*};

/// The library name of the overflow slot.
pub const OVERFLOW_LIBRARY: &str = "(other origins: table full)";
/// The library name of an origin whose code `dladdr` cannot place (JIT code,
/// a stack without unwind information); its address is still kept.
pub const UNKNOWN_LIBRARY: &str = "(unknown)";

use crate::slot_claim::{lock, unlock, FREE, READY};

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

fn write_bytes(dst: &[AtomicU8], src: &[u8]) -> usize {
    // Keep the end of a long path: the file name is what tells libraries apart.
    let src = &src[src.len().saturating_sub(dst.len())..];
    for (d, s) in dst.iter().zip(src) {
        d.store(*s, Relaxed);
    }
    src.len()
}

fn read_bytes(src: &[AtomicU8], len: usize) -> String {
    let v: Vec<u8> = src[..len.min(src.len())]
        .iter()
        .map(|b| b.load(Relaxed))
        .collect();
    String::from_utf8_lossy(&v).into_owned()
}

fn same(stored: &[AtomicU8], len: usize, want: &[u8]) -> bool {
    let want = &want[want.len().saturating_sub(stored.len())..];
    len == want.len() && stored.iter().zip(want).all(|(a, b)| a.load(Relaxed) == *b)
}

impl Layout {
    /// The slot of the origin `(library, symbol)`, naming it when new (the
    /// last slot when the table is full). `address` is the call site,
    /// `offset` the same relative to its library; `program`: the library is
    /// the process's own executable.
    pub fn claim_origin(
        &self,
        library: &[u8],
        symbol: &[u8],
        address: u64,
        offset: u64,
        program: bool,
    ) -> usize {
        let o = &self.origins;
        lock(&o.claim_lock);
        let n = (o.count.load(Acquire) as usize).min(MAX_ORIGINS);
        let found = o.slots[..n].iter().position(|s| {
            same(&s.library, s.library_len.load(Relaxed) as usize, library)
                && same(&s.symbol, s.symbol_len.load(Relaxed) as usize, symbol)
        });
        let slot = match found {
            Some(i) => i,
            None if n < MAX_ORIGINS - 1 => {
                self.name_slot(n, library, symbol, address, offset, program);
                n
            }
            None => {
                let last = MAX_ORIGINS - 1;
                if o.slots[last].state.load(Acquire) == FREE {
                    self.name_slot(last, OVERFLOW_LIBRARY.as_bytes(), b"", 0, 0, false);
                }
                last
            }
        };
        unlock(&o.claim_lock);
        slot
    }

    fn name_slot(
        &self,
        i: usize,
        library: &[u8],
        symbol: &[u8],
        address: u64,
        offset: u64,
        program: bool,
    ) {
        let s = &self.origins.slots[i];
        s.flags
            .store(if program { ORIGIN_PROGRAM } else { 0 }, Relaxed);
        let ll = write_bytes(&s.library, library);
        let sl = write_bytes(&s.symbol, symbol);
        s.library_len.store(ll as u32, Relaxed);
        s.symbol_len.store(sl as u32, Relaxed);
        s.address.store(address, Relaxed);
        s.offset.store(offset, Relaxed);
        s.state.store(READY, Release);
        let count = &self.origins.count;
        if count.load(Acquire) as usize <= i {
            count.store(i as u32 + 1, Release);
        }
    }

    /// Counts `bytes` more on counter `index` for origin slot `origin`; when
    /// the counter's lifetime peak rises, the live bytes by origin are
    /// copied into its breakdown.
    pub fn add_from(&self, origin: usize, index: usize, bytes: u64) {
        self.add_from_at(origin, crate::stacks::NO_STACK, index, bytes);
    }

    /// [`Layout::add_from`], also for call path `stack`
    /// ([`crate::stacks`]; `NO_STACK` for none), whose breakdown is copied
    /// with the origins'.
    pub fn add_from_at(&self, origin: usize, stack: usize, index: usize, bytes: u64) {
        let (Some(p), Some(s)) = (
            self.origins.peaks.get(index),
            self.origins.slots.get(origin),
        ) else {
            self.add(index, bytes);
            return;
        };
        lock(&p.lock);
        s.live[index].fetch_add(bytes, Relaxed);
        self.stack_change(stack, index, bytes, true);
        let before = self.counters[index].lifetime_peak.load(Relaxed);
        self.add(index, bytes);
        let now = self.counters[index].current.load(Relaxed);
        if now > before {
            let at = self.copy_breakdown(p, index, now);
            if self.stack_depth() > 0 {
                self.copy_stacks(&self.stacks.peaks[index], index, now, at);
            }
        }
        unlock(&p.lock);
    }

    /// Counts `bytes` fewer on counter `index` for origin slot `origin`.
    pub fn sub_from(&self, origin: usize, index: usize, bytes: u64) {
        self.sub_from_at(origin, crate::stacks::NO_STACK, index, bytes);
    }

    /// [`Layout::sub_from`], also for call path `stack`.
    pub fn sub_from_at(&self, origin: usize, stack: usize, index: usize, bytes: u64) {
        let (Some(p), Some(s)) = (
            self.origins.peaks.get(index),
            self.origins.slots.get(origin),
        ) else {
            self.sub(index, bytes);
            return;
        };
        lock(&p.lock);
        s.live[index].fetch_sub(bytes, Relaxed);
        self.stack_change(stack, index, bytes, false);
        self.sub(index, bytes);
        unlock(&p.lock);
    }

    /// Copies the live bytes by origin on counter `index` as those of the
    /// last out-of-memory failure (called when an allocation there fails).
    pub fn record_oom_origins(&self, index: usize) {
        let Some(p) = self.origins.peaks.get(index) else {
            return;
        };
        lock(&p.lock);
        let held = self.counters[index].current.load(Relaxed);
        let at = self.copy_breakdown(&self.origins.last_oom, index, held);
        if self.stack_depth() > 0 {
            self.copy_stacks(&self.stacks.last_oom, index, held, at);
        }
        self.origins
            .last_oom_counter
            .store(index as u32 + 1, Release);
        unlock(&p.lock);
    }

    /// Copies the live bytes by origin; returns the time it stamps.
    fn copy_breakdown(&self, p: &PeakBreakdown, index: usize, total: u64) -> u64 {
        let n = (self.origins.count.load(Acquire) as usize).min(MAX_ORIGINS);
        p.seq.fetch_add(1, AcqRel);
        for (i, b) in p.bytes.iter().enumerate() {
            let v = if i < n {
                self.origins.slots[i].live[index].load(Relaxed)
            } else {
                0
            };
            b.store(v, Relaxed);
        }
        p.total.store(total, Relaxed);
        let at = monotonic_ns();
        p.at_ns.store(at, Relaxed);
        p.seq.fetch_add(1, Release);
        at
    }

    /// Forgets every origin and breakdown (a region reused after `exec`:
    /// the old image's origins are not the new one's).
    pub fn clear_origins(&self) {
        let o = &self.origins;
        for s in &o.slots {
            s.state.store(FREE, Relaxed);
            s.library_len.store(0, Relaxed);
            s.symbol_len.store(0, Relaxed);
            s.flags.store(0, Relaxed);
            for l in &s.live {
                l.store(0, Relaxed);
            }
        }
        for p in o.peaks.iter().chain([&o.last_oom]) {
            p.total.store(0, Relaxed);
            for b in &p.bytes {
                b.store(0, Relaxed);
            }
        }
        o.last_oom_counter.store(0, Release);
        o.count.store(0, Release);
        self.clear_stacks();
    }
}

/// An origin as a reader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Its slot in the region (stable for the life of the process).
    pub id: usize,
    /// The library's path (the program's own path for the program);
    /// [`UNKNOWN_LIBRARY`] or [`OVERFLOW_LIBRARY`] for those two lines.
    pub library: String,
    /// The nearest dynamic symbol at or before the first call site, when
    /// `dladdr` knows one.
    pub symbol: Option<String>,
    /// The first call site seen, absolute.
    pub address: u64,
    /// The same, relative to the library's load address.
    pub offset: u64,
    /// Whether the library is the process's own executable.
    pub program: bool,
}

impl Origin {
    /// The library's file name (`libnccl.so.2` of `/usr/lib/libnccl.so.2`).
    pub fn file_name(&self) -> &str {
        self.library.rsplit('/').next().unwrap_or(&self.library)
    }
}

/// Bytes of one origin on one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginBytes {
    /// Who.
    pub origin: Origin,
    /// How many bytes.
    pub bytes: u64,
}

/// The live bytes by origin at a counter's lifetime peak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeakOrigins {
    /// The peak (the sum of `by_origin`).
    pub peak: u64,
    /// When it was reached, `CLOCK_MONOTONIC` nanoseconds.
    pub at_ns: u64,
    /// Origins that held bytes then, largest first.
    pub by_origin: Vec<OriginBytes>,
}

/// Reading origins out of a layout.
impl Layout {
    /// The origins named so far.
    pub fn origins(&self) -> Vec<Origin> {
        let n = (self.origins.count.load(Acquire) as usize).min(MAX_ORIGINS);
        (0..n).filter_map(|i| self.origin(i)).collect()
    }

    fn origin(&self, i: usize) -> Option<Origin> {
        let s = self.origins.slots.get(i)?;
        if s.state.load(Acquire) != READY {
            return None;
        }
        let symbol_len = s.symbol_len.load(Relaxed) as usize;
        Some(Origin {
            id: i,
            library: read_bytes(&s.library, s.library_len.load(Relaxed) as usize),
            symbol: (symbol_len > 0).then(|| read_bytes(&s.symbol, symbol_len)),
            address: s.address.load(Relaxed),
            offset: s.offset.load(Relaxed),
            program: s.flags.load(Relaxed) & ORIGIN_PROGRAM != 0,
        })
    }

    /// The live bytes by origin on counter `index` now, largest first
    /// (origins holding nothing left out).
    pub fn live_by_origin(&self, index: usize) -> Vec<OriginBytes> {
        if index >= COUNTERS {
            return Vec::new();
        }
        let mut v: Vec<OriginBytes> = self
            .origins()
            .into_iter()
            .map(|o| OriginBytes {
                bytes: self.origins.slots[o.id].live[index].load(Relaxed),
                origin: o,
            })
            .filter(|b| b.bytes > 0)
            .collect();
        v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.origin.id.cmp(&b.origin.id)));
        v
    }

    /// The breakdown at counter `index`'s lifetime peak; `None` before any
    /// origin-counted allocation raised it.
    pub fn peak_origins(&self, index: usize) -> Option<PeakOrigins> {
        self.read_breakdown(self.origins.peaks.get(index)?)
    }

    /// The live bytes by origin on the counter of the last allocation that
    /// failed with out-of-memory, when it failed (`peak`: what that counter
    /// held then), with that counter's index; `None` before any failure.
    pub fn oom_origins(&self) -> Option<(usize, PeakOrigins)> {
        let c = self.origins.last_oom_counter.load(Acquire) as usize;
        let index = c.checked_sub(1)?;
        let o = &self.origins.last_oom;
        // A failure with nothing held still has its (empty) breakdown.
        for _ in 0..1000 {
            let seq = o.seq.load(Acquire);
            if seq % 2 == 0 && seq > 0 {
                let mut b = self.read_breakdown(o).unwrap_or(PeakOrigins {
                    peak: 0,
                    at_ns: o.at_ns.load(Relaxed),
                    by_origin: Vec::new(),
                });
                if o.seq.load(Acquire) == seq {
                    b.at_ns = o.at_ns.load(Relaxed);
                    return Some((index, b));
                }
            }
            std::thread::yield_now();
        }
        None
    }

    fn read_breakdown(&self, p: &PeakBreakdown) -> Option<PeakOrigins> {
        let c = crate::seqlock::read(&p.seq, &p.total, &p.at_ns, &p.bytes)?;
        if c.total == 0 {
            return None;
        }
        let mut by_origin: Vec<OriginBytes> = c
            .bytes
            .iter()
            .enumerate()
            .filter(|(_, &b)| b > 0)
            .filter_map(|(i, &b)| {
                Some(OriginBytes {
                    origin: self.origin(i)?,
                    bytes: b,
                })
            })
            .collect();
        by_origin.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.origin.id.cmp(&b.origin.id)));
        Some(PeakOrigins {
            peak: c.total,
            at_ns: c.at_ns,
            by_origin,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::layout::{zeroed, Layout, FLAG_COUNTING, HOST_PINNED};

    #[test]
    fn origins_are_named_once_and_keep_their_bytes() {
        let l = zeroed();
        l.init(1, 1, FLAG_COUNTING);
        let a = l.claim_origin(b"/usr/lib/libnccl.so.2", b"ncclInit", 0x1000, 0x10, false);
        let b = l.claim_origin(b"/usr/lib/libcublasLt.so.12", b"", 0x2000, 0x20, false);
        assert_eq!(
            a,
            l.claim_origin(b"/usr/lib/libnccl.so.2", b"ncclInit", 0x3000, 0, false)
        );
        assert_ne!(a, b);
        l.add_from(a, 0, 100);
        l.add_from(b, 0, 50);
        l.add_from(b, HOST_PINNED, 7);
        l.sub_from(a, 0, 100);
        let live = l.live_by_origin(0);
        assert_eq!(live.len(), 1);
        assert_eq!(
            (live[0].origin.file_name(), live[0].bytes),
            ("libcublasLt.so.12", 50)
        );
        assert_eq!(live[0].origin.symbol, None);
        let peak = l.peak_origins(0).unwrap();
        assert_eq!(peak.peak, 150);
        let by: Vec<(usize, u64)> = peak
            .by_origin
            .iter()
            .map(|o| (o.origin.id, o.bytes))
            .collect();
        assert_eq!(by, vec![(a, 100), (b, 50)]);
        assert_eq!(l.peak_origins(HOST_PINNED).unwrap().peak, 7);
        assert_eq!(l.peak_origins(1), None);
        assert_eq!(l.peak_origins(9999), None);
        assert!(l.live_by_origin(9999).is_empty());
        // A lower high after the peak leaves the peak's breakdown alone.
        l.add_from(a, 0, 60);
        assert_eq!(l.peak_origins(0).unwrap().peak, 150);
        l.add_from(a, 0, 60);
        let later = l.peak_origins(0).unwrap();
        assert_eq!(later.peak, 170);
        assert_eq!(later.by_origin[0].bytes, 120);
    }

    #[test]
    fn an_out_of_memory_failure_keeps_what_was_live_then() {
        let l = zeroed();
        l.init(1, 1, FLAG_COUNTING);
        assert_eq!(l.oom_origins(), None);
        // A failure on a device holding nothing: recorded, empty.
        l.record_oom_origins(2);
        let (c, b) = l.oom_origins().unwrap();
        assert_eq!((c, b.peak, b.by_origin.len()), (2, 0, 0));
        let a = l.claim_origin(b"/lib/liba.so", b"", 0, 0, false);
        let b2 = l.claim_origin(b"/lib/libb.so", b"", 0, 0, false);
        l.add_from(a, 0, 100);
        l.add_from(b2, 0, 30);
        l.add_from(a, 1, 5);
        l.record_oom_origins(0);
        l.sub_from(a, 0, 100);
        let (c, b) = l.oom_origins().unwrap();
        assert_eq!((c, b.peak), (0, 130));
        let by: Vec<(usize, u64)> = b.by_origin.iter().map(|o| (o.origin.id, o.bytes)).collect();
        assert_eq!(by, vec![(a, 100), (b2, 30)]);
        assert!(b.at_ns > 0);
        l.clear_origins();
        assert_eq!(l.oom_origins(), None);
    }

    #[test]
    fn a_full_table_folds_into_the_last_slot_and_long_paths_keep_their_end() {
        let l = zeroed();
        l.init(1, 1, FLAG_COUNTING);
        for i in 0..super::MAX_ORIGINS + 10 {
            let name = format!("/lib/lib{i}.so");
            let slot = l.claim_origin(name.as_bytes(), b"", 0, 0, false);
            assert_eq!(slot, i.min(super::MAX_ORIGINS - 1));
        }
        let last = &l.origins()[super::MAX_ORIGINS - 1];
        assert_eq!(last.library, super::OVERFLOW_LIBRARY);
        l.clear_origins();
        let long = format!("/{}/libtail.so", "d".repeat(400));
        let i = l.claim_origin(long.as_bytes(), b"f", 0, 0, false);
        let o = &l.origins()[i];
        assert!(o.library.ends_with("/libtail.so"));
        assert_eq!(o.library.len(), super::LIBRARY_BYTES);
        assert_eq!(l.claim_origin(long.as_bytes(), b"f", 0, 0, false), i);
    }

    #[test]
    fn breakdowns_stay_exact_under_threads() {
        let l: std::sync::Arc<Layout> = std::sync::Arc::from(zeroed());
        l.init(1, 1, FLAG_COUNTING);
        let ids: Vec<usize> = (0..4)
            .map(|i| l.claim_origin(format!("lib{i}").as_bytes(), b"", 0, 0, false))
            .collect();
        let hs: Vec<_> = ids
            .iter()
            .map(|&o| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for k in 1..2000u64 {
                        l.add_from(o, 0, k);
                        if k % 3 != 0 {
                            l.sub_from(o, 0, k);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let peak = l.peak_origins(0).unwrap();
        assert_eq!(
            peak.by_origin.iter().map(|o| o.bytes).sum::<u64>(),
            peak.peak
        );
        assert_eq!(
            peak.peak,
            l.counters[0]
                .lifetime_peak
                .load(std::sync::atomic::Ordering::SeqCst)
        );
        let live: u64 = l.live_by_origin(0).iter().map(|o| o.bytes).sum();
        assert_eq!(
            live,
            l.counters[0]
                .current
                .load(std::sync::atomic::Ordering::SeqCst)
        );
    }
}
