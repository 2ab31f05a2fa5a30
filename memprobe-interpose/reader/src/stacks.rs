//! Stacks: the call paths that hold the counted bytes, a finer view of the
//! origins (`MEMPROBE_GPU_ORIGINS=stacks[:N]`). Each counted allocation's
//! path is its first N frames from the origin outward (the origin's frame
//! first), every frame named `library!symbol` (or `library+0xOFFSET` where
//! `dladdr` knows no symbol). The writer resolves a path once and keeps its
//! live bytes per counter beside the origin's, under the same lock, and
//! copies them when the counter's peak rises or an allocation fails for
//! memory: the stacks of a peak sum to it exactly, as its origins do.
//!
//! Bounded: [`MAX_STACKS`] paths and [`MAX_FRAME_NAMES`] frame names per
//! process; past them, new paths go to the last slot,
//! [`OVERFLOW_STACK`], and new frames are named [`OVERFLOW_FRAME`].

use crate::layout::{Layout, StackBreakdown, COUNTERS, FRAME_NAME_BYTES};
pub use crate::layout::{DEFAULT_STACK_DEPTH, MAX_FRAME_NAMES, MAX_STACKS, MAX_STACK_DEPTH};
use std::sync::atomic::Ordering::*;

/// The one frame of the overflow slot.
pub const OVERFLOW_STACK: &str = "(other stacks: table full)";
/// The name of a frame past [`MAX_FRAME_NAMES`].
pub const OVERFLOW_FRAME: &str = "(other frames: table full)";
/// A stack slot number meaning "no stack" (stacks off).
pub const NO_STACK: usize = usize::MAX;

use crate::slot_claim::{lock, unlock, FREE, READY};

/// The writer's side.
impl Layout {
    /// Keeps paths of `depth` frames (clamped to 1..=[`MAX_STACK_DEPTH`]).
    pub fn keep_stacks(&self, depth: usize) {
        self.stacks
            .depth
            .store(depth.clamp(1, MAX_STACK_DEPTH) as u32, Release);
    }

    /// Frames kept per path; 0 when stacks are not kept.
    pub fn stack_depth(&self) -> usize {
        self.stacks.depth.load(Acquire) as usize
    }

    fn frame_id(&self, name: &[u8]) -> u32 {
        let s = &self.stacks;
        let name = &name[..name.len().min(FRAME_NAME_BYTES)];
        let n = (s.name_count.load(Acquire) as usize).min(MAX_FRAME_NAMES);
        let same = |i: usize| {
            let f = &s.names[i];
            f.len.load(Relaxed) as usize == name.len()
                && f.text.iter().zip(name).all(|(a, b)| a.load(Relaxed) == *b)
        };
        if let Some(i) = (0..n).find(|&i| same(i)) {
            return i as u32;
        }
        let i = if n < MAX_FRAME_NAMES - 1 {
            n
        } else {
            let last = MAX_FRAME_NAMES - 1;
            if s.names[last].state.load(Acquire) == READY {
                return last as u32;
            }
            return self.name_frame(last, OVERFLOW_FRAME.as_bytes());
        };
        self.name_frame(i, name)
    }

    fn name_frame(&self, i: usize, name: &[u8]) -> u32 {
        let s = &self.stacks;
        let f = &s.names[i];
        for (d, b) in f.text.iter().zip(name) {
            d.store(*b, Relaxed);
        }
        f.len
            .store(name.len().min(FRAME_NAME_BYTES) as u32, Relaxed);
        f.state.store(READY, Release);
        if s.name_count.load(Acquire) as usize <= i {
            s.name_count.store(i as u32 + 1, Release);
        }
        i as u32
    }

    /// The slot of the path `frames` (names, innermost first, at most
    /// [`MAX_STACK_DEPTH`] kept) whose first frame is origin slot
    /// `origin`, naming it when new (the last slot when the table is full).
    pub fn claim_stack<F: AsRef<[u8]>>(&self, origin: usize, frames: &[F]) -> usize {
        let s = &self.stacks;
        lock(&s.claim_lock);
        let ids: Vec<u32> = frames
            .iter()
            .take(MAX_STACK_DEPTH)
            .map(|f| self.frame_id(f.as_ref()))
            .collect();
        let n = (s.count.load(Acquire) as usize).min(MAX_STACKS);
        let found = s.slots[..n].iter().position(|slot| {
            slot.origin.load(Relaxed) as usize == origin
                && slot.depth.load(Relaxed) as usize == ids.len()
                && slot
                    .frames
                    .iter()
                    .zip(&ids)
                    .all(|(a, b)| a.load(Relaxed) == *b)
        });
        let slot = match found {
            Some(i) => i,
            None if n < MAX_STACKS - 1 => {
                self.name_stack(n, origin, &ids);
                n
            }
            None => {
                let last = MAX_STACKS - 1;
                if s.slots[last].state.load(Acquire) == FREE {
                    let id = self.frame_id(OVERFLOW_STACK.as_bytes());
                    self.name_stack(last, origin, &[id]);
                }
                last
            }
        };
        unlock(&s.claim_lock);
        slot
    }

    fn name_stack(&self, i: usize, origin: usize, ids: &[u32]) {
        let s = &self.stacks;
        let slot = &s.slots[i];
        for (d, id) in slot.frames.iter().zip(ids) {
            d.store(*id, Relaxed);
        }
        slot.depth.store(ids.len() as u32, Relaxed);
        slot.origin.store(origin as u32, Relaxed);
        slot.state.store(READY, Release);
        if s.count.load(Acquire) as usize <= i {
            s.count.store(i as u32 + 1, Release);
        }
    }

    /// `bytes` more (`add`) or fewer on counter `index` for path `stack`;
    /// called by the origins' update under the counter's lock.
    pub(crate) fn stack_change(&self, stack: usize, index: usize, bytes: u64, add: bool) {
        let Some(s) = self.stacks.slots.get(stack) else {
            return;
        };
        if add {
            s.live[index].fetch_add(bytes, Relaxed);
        } else {
            s.live[index].fetch_sub(bytes, Relaxed);
        }
    }

    /// Copies the live bytes by path on counter `index` into `b` (total
    /// `total`); under the counter's lock.
    pub(crate) fn copy_stacks(&self, b: &StackBreakdown, index: usize, total: u64, at_ns: u64) {
        let n = (self.stacks.count.load(Acquire) as usize).min(MAX_STACKS);
        b.seq.fetch_add(1, AcqRel);
        for (i, v) in b.bytes.iter().enumerate() {
            let x = if i < n {
                self.stacks.slots[i].live[index].load(Relaxed)
            } else {
                0
            };
            v.store(x, Relaxed);
        }
        b.total.store(total, Relaxed);
        b.at_ns.store(at_ns, Relaxed);
        b.seq.fetch_add(1, Release);
    }

    /// Forgets every path (with the origins: a region reused after `exec`).
    pub(crate) fn clear_stacks(&self) {
        let s = &self.stacks;
        for slot in &s.slots {
            slot.state.store(FREE, Relaxed);
            slot.depth.store(0, Relaxed);
            for l in &slot.live {
                l.store(0, Relaxed);
            }
        }
        for f in &s.names {
            f.state.store(FREE, Relaxed);
            f.len.store(0, Relaxed);
        }
        for b in s.peaks.iter().chain([&s.last_oom]) {
            b.total.store(0, Relaxed);
            for v in &b.bytes {
                v.store(0, Relaxed);
            }
        }
        s.count.store(0, Release);
        s.name_count.store(0, Release);
    }
}

/// A call path as a reader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    /// Its slot in the region (stable for the life of the process).
    pub id: usize,
    /// The origin slot of its first frame.
    pub origin: usize,
    /// `library!symbol` or `library+0xOFFSET`, innermost first.
    pub frames: Vec<String>,
}

/// Bytes of one path on one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackBytes {
    /// Which.
    pub stack: Stack,
    /// How many bytes.
    pub bytes: u64,
}

/// The live bytes by path at one moment (a peak, an out-of-memory failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeakStacks {
    /// The bytes then (the sum of `by_stack`).
    pub peak: u64,
    /// When, `CLOCK_MONOTONIC` nanoseconds.
    pub at_ns: u64,
    /// Paths that held bytes then, largest first.
    pub by_stack: Vec<StackBytes>,
}

/// The reader's side.
impl Layout {
    fn frame_name(&self, id: u32) -> String {
        let Some(f) = self.stacks.names.get(id as usize) else {
            return OVERFLOW_FRAME.to_owned();
        };
        if f.state.load(Acquire) != READY {
            return OVERFLOW_FRAME.to_owned();
        }
        let len = (f.len.load(Relaxed) as usize).min(FRAME_NAME_BYTES);
        let v: Vec<u8> = f.text[..len].iter().map(|b| b.load(Relaxed)).collect();
        String::from_utf8_lossy(&v).into_owned()
    }

    fn stack(&self, i: usize) -> Option<Stack> {
        let s = self.stacks.slots.get(i)?;
        if s.state.load(Acquire) != READY {
            return None;
        }
        let depth = (s.depth.load(Relaxed) as usize).min(MAX_STACK_DEPTH);
        Some(Stack {
            id: i,
            origin: s.origin.load(Relaxed) as usize,
            frames: s.frames[..depth]
                .iter()
                .map(|f| self.frame_name(f.load(Relaxed)))
                .collect(),
        })
    }

    /// The live bytes by path on counter `index` now, largest first (paths
    /// holding nothing left out).
    pub fn live_by_stack(&self, index: usize) -> Vec<StackBytes> {
        if index >= COUNTERS {
            return Vec::new();
        }
        let n = (self.stacks.count.load(Acquire) as usize).min(MAX_STACKS);
        let mut v: Vec<StackBytes> = (0..n)
            .filter_map(|i| {
                let bytes = self.stacks.slots[i].live[index].load(Relaxed);
                (bytes > 0).then(|| {
                    Some(StackBytes {
                        stack: self.stack(i)?,
                        bytes,
                    })
                })?
            })
            .collect();
        v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.stack.id.cmp(&b.stack.id)));
        v
    }

    /// The breakdown by path at counter `index`'s lifetime peak; `None`
    /// before any path-counted allocation raised it.
    pub fn peak_stacks(&self, index: usize) -> Option<PeakStacks> {
        self.read_stacks(self.stacks.peaks.get(index)?)
    }

    /// The live bytes by path at the last out-of-memory failure (on the
    /// counter [`Layout::oom_origins`] names); `None` before any.
    pub fn oom_stacks(&self) -> Option<PeakStacks> {
        self.origins.last_oom_counter.load(Acquire).checked_sub(1)?;
        self.read_stacks(&self.stacks.last_oom)
    }

    fn read_stacks(&self, b: &StackBreakdown) -> Option<PeakStacks> {
        let c = crate::seqlock::read(&b.seq, &b.total, &b.at_ns, &b.bytes)?;
        if c.seq == 0 {
            return None;
        }
        let mut by_stack: Vec<StackBytes> = c
            .bytes
            .iter()
            .enumerate()
            .filter(|(_, &x)| x > 0)
            .filter_map(|(i, &x)| {
                Some(StackBytes {
                    stack: self.stack(i)?,
                    bytes: x,
                })
            })
            .collect();
        by_stack.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.stack.id.cmp(&b.stack.id)));
        Some(PeakStacks {
            peak: c.total,
            at_ns: c.at_ns,
            by_stack,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{zeroed, FLAG_COUNTING, HOST_PINNED};

    #[test]
    fn paths_are_named_once_and_sum_to_the_peak() {
        let l = zeroed();
        l.init(1, 1, FLAG_COUNTING);
        assert_eq!(l.stack_depth(), 0);
        l.keep_stacks(99);
        assert_eq!(l.stack_depth(), MAX_STACK_DEPTH);
        l.keep_stacks(8);
        let o = l.claim_origin(b"/lib/libnccl.so.2", b"ncclInit", 0, 0, false);
        let a = l.claim_stack(o, &["libnccl.so.2!ncclInit", "train!main"]);
        let b = l.claim_stack(o, &["libnccl.so.2!ncclInit", "train!setup"]);
        assert_ne!(a, b, "same origin, two paths: two stacks");
        assert_eq!(
            a,
            l.claim_stack(o, &["libnccl.so.2!ncclInit", "train!main"])
        );
        l.add_from_at(o, a, 0, 100);
        l.add_from_at(o, b, 0, 30);
        l.add_from_at(o, b, HOST_PINNED, 7);
        let peak = l.peak_stacks(0).unwrap();
        assert_eq!(peak.peak, 130);
        let by: Vec<(usize, u64)> = peak
            .by_stack
            .iter()
            .map(|s| (s.stack.id, s.bytes))
            .collect();
        assert_eq!(by, vec![(a, 100), (b, 30)]);
        assert_eq!(
            peak.by_stack[1].stack.frames,
            vec!["libnccl.so.2!ncclInit", "train!setup"]
        );
        l.sub_from_at(o, a, 0, 100);
        let live = l.live_by_stack(0);
        assert_eq!(live.len(), 1);
        assert_eq!((live[0].stack.id, live[0].bytes), (b, 30));
        // The origins' view of the same bytes is unchanged.
        assert_eq!(l.live_by_origin(0)[0].bytes, 30);
        assert_eq!(l.peak_origins(0).unwrap().peak, 130);
        assert_eq!(l.peak_stacks(HOST_PINNED).unwrap().peak, 7);
        assert_eq!(l.peak_stacks(1), None);
        assert!(l.live_by_stack(9999).is_empty());
        assert_eq!(l.oom_stacks(), None);
        l.record_oom_origins(0);
        let oom = l.oom_stacks().unwrap();
        assert_eq!((oom.peak, oom.by_stack.len()), (30, 1));
    }

    #[test]
    fn full_tables_fold_into_their_last_entries() {
        let l = zeroed();
        l.init(1, 1, FLAG_COUNTING);
        l.keep_stacks(2);
        let o = l.claim_origin(b"/lib/liba.so", b"", 0, 0, false);
        for i in 0..MAX_STACKS + 5 {
            let f = format!("liba.so!f{i}");
            let s = l.claim_stack(o, &[f.as_str()]);
            assert_eq!(s, i.min(MAX_STACKS - 1));
        }
        let last = l.stack(MAX_STACKS - 1).unwrap();
        assert_eq!(last.frames, vec![OVERFLOW_STACK]);
        l.clear_origins();
        assert_eq!(l.stacks.count.load(Relaxed), 0);
        // Frame names: the last one stands for every later name.
        for i in 0..MAX_FRAME_NAMES + 3 {
            let f = format!("libb.so!g{i}");
            let id = l.frame_id(f.as_bytes());
            assert_eq!(id as usize, i.min(MAX_FRAME_NAMES - 1));
        }
        assert_eq!(l.frame_name((MAX_FRAME_NAMES - 1) as u32), OVERFLOW_FRAME);
    }
}
