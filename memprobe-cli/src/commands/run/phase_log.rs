//! What `memprobe run` keeps of the phases its command's trackers sent over
//! the run channel ([`super::phase_channel`]), in bounded memory:
//!
//! - every epoch, experience, stream and custom phase (up to
//!   [`MAX_PHASES`], custom ones up to [`MAX_CUSTOM_PHASES`]) with its
//!   record;
//! - steps (and phases nested inside a step) only as aggregates: per
//!   enclosing phase, how many and, per source, the step with the largest
//!   peak; per process and source, the step with the largest peak of the
//!   run; and the last [`RECENT`] per tracker, to name the phase open at a
//!   given moment ([`PhaseLog::phase_at`]).
//!
//! Messages can be lost (the sender drops them rather than wait): an end
//! whose begin was lost opens and closes its phase at once; phases whose
//! end was lost are closed when a later message shows them over.
//!
//! Times are kept as nanoseconds since the command was spawned (the
//! timeline's clock); senders stamp `CLOCK_MONOTONIC`, shared with memprobe.

use memprobe_core::PhaseKind;
use memprobe_core::Ranks;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// At most this many phases (steps aside) are kept.
pub(crate) const MAX_PHASES: usize = 100_000;
/// Of which at most this many custom phases.
pub(crate) const MAX_CUSTOM_PHASES: usize = 20_000;
/// Step-level phases remembered per tracker for [`PhaseLog::phase_at`].
pub(crate) const RECENT: usize = 64;
/// Trackers followed (per process and tracker); the phases of any beyond
/// are counted as not kept.
pub(crate) const MAX_TRACKERS: usize = 4096;

// The messages as the run channel's protocol decodes them: one definition
// for both ends.
pub(crate) use memprobe_core::internal::run_channel::protocol::{Event, Message, SourceRecord};

/// The step with the largest peak of one source, within some scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StepPeak {
    pub(crate) source: String,
    pub(crate) peak: u64,
    pub(crate) index: u64,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
}

/// Steps ended inside one phase (or outside any kept phase).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StepAggregate {
    pub(crate) count: u64,
    /// The lowest step number seen: the steps' numbers count across
    /// epochs, so a step's place in its phase is its number less this.
    pub(crate) first_index: Option<u64>,
    /// Per source, in order of first appearance.
    pub(crate) peaks: Vec<StepPeak>,
}

impl StepAggregate {
    /// `count` steps from number `first`, whose peaks per source are `peaks`.
    fn add(&mut self, count: u64, first: u64, peaks: &[StepPeak]) {
        self.count += count;
        self.first_index = Some(self.first_index.map_or(first, |f| f.min(first)));
        for s in peaks {
            match self.peaks.iter_mut().find(|p| p.source == s.source) {
                Some(p) if s.peak > p.peak => *p = s.clone(),
                Some(_) => {}
                None => self.peaks.push(s.clone()),
            }
        }
    }
}

/// One kept phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Phase {
    pub(crate) pid: u32,
    pub(crate) tracker: u64,
    pub(crate) kind: PhaseKind,
    pub(crate) name: String,
    pub(crate) index: u64,
    pub(crate) depth: u32,
    /// The innermost kept phase enclosing it (an index into the kept list).
    pub(crate) parent: Option<usize>,
    pub(crate) start_ns: u64,
    /// When it ended, from its record; `None` when its end never arrived.
    pub(crate) end_ns: Option<u64>,
    /// For a phase whose end never arrived: when a later message showed it
    /// over (its end was lost), if one did; else it was open at the end.
    pub(crate) over_by_ns: Option<u64>,
    /// Its record (empty when its end never arrived).
    pub(crate) sources: Vec<SourceRecord>,
    pub(crate) truncated: bool,
    pub(crate) releases: u64,
    pub(crate) steps: StepAggregate,
}

impl Phase {
    /// `epoch 3`, `checkpoint 0`.
    pub(crate) fn label(&self) -> String {
        label(&self.name, self.index)
    }
}

fn label(name: &str, index: u64) -> String {
    format!("{name} {index}")
}

/// The step with the largest peak of one source in one process's run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeakStep {
    pub(crate) pid: u32,
    pub(crate) tracker: u64,
    pub(crate) step: StepPeak,
    /// The kept phase the step was in.
    pub(crate) within: Option<usize>,
}

/// A phase open in a tracker.
#[derive(Debug, Clone)]
struct Open {
    kind: PhaseKind,
    name: String,
    index: u64,
    depth: u32,
    start_ns: u64,
    /// Its kept entry; `None` for steps and what nests inside them.
    kept: Option<usize>,
}

/// A step-level phase that ended, for [`PhaseLog::phase_at`].
#[derive(Debug, Clone)]
struct Span {
    name: String,
    index: u64,
    /// The last step of a batch (`index` when one phase).
    last: u64,
    depth: u32,
    start_ns: u64,
    end_ns: u64,
}

#[derive(Debug, Clone, Default)]
struct TrackerState {
    stack: Vec<Open>,
    recent: VecDeque<Span>,
    /// Steps ended outside any kept phase.
    loose: StepAggregate,
}

/// Per sending process: what arrived, and what it says it dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sender {
    pub(crate) received: u64,
    /// The highest message number seen, plus one: messages it sent or dropped.
    pub(crate) numbered: u64,
    /// The most it said it had dropped.
    pub(crate) dropped: u64,
    /// The most steps it said it had dropped (in batches of steps).
    pub(crate) dropped_steps: u64,
    /// Its ranks in a job of several, as its last message that had them
    /// said.
    pub(crate) ranks: Option<Ranks>,
}

impl Sender {
    /// Messages of this process that never arrived, as far as the messages
    /// that did tell (those dropped after its last one cannot be known).
    pub(crate) fn lost(&self) -> u64 {
        self.dropped
            .max(self.numbered.saturating_sub(self.received))
    }
}

/// Everything kept of the phases of one run.
#[derive(Debug, Clone, Default)]
pub(crate) struct PhaseLog {
    /// `CLOCK_MONOTONIC` at the moment the timeline counts from.
    t0_mono_ns: u64,
    pub(crate) phases: Vec<Phase>,
    customs: usize,
    /// Phases not kept because of the bounds.
    pub(crate) not_kept: u64,
    /// Step records received.
    pub(crate) steps: u64,
    /// Datagrams decoded.
    pub(crate) received: u64,
    /// Datagrams that were not messages (not JSON, missing fields).
    pub(crate) garbled: u64,
    /// Datagrams longer than the largest message.
    pub(crate) oversized: u64,
    /// Messages of a version this memprobe does not read.
    pub(crate) unknown_version: u64,
    pub(crate) senders: BTreeMap<u32, Sender>,
    trackers: HashMap<(u32, u64), TrackerState>,
    /// Per (pid, source): the step with the largest peak.
    peak_steps: BTreeMap<(u32, String), PeakStep>,
}

impl PhaseLog {
    /// An empty log whose times count from `t0_mono_ns` (`CLOCK_MONOTONIC`).
    pub(crate) fn new(t0_mono_ns: u64) -> PhaseLog {
        PhaseLog {
            t0_mono_ns,
            ..PhaseLog::default()
        }
    }

    fn run_ns(&self, mono: u64) -> u64 {
        mono.saturating_sub(self.t0_mono_ns)
    }

    /// Messages sent by the command's processes that never arrived, as far
    /// as the ones that did tell.
    pub(crate) fn dropped(&self) -> u64 {
        self.senders.values().map(Sender::lost).sum()
    }

    /// Steps the command's processes said they dropped (batches of steps
    /// among the lost messages).
    pub(crate) fn dropped_steps(&self) -> u64 {
        self.senders.values().map(|s| s.dropped_steps).sum()
    }

    /// The ranks process `pid` sent, if it sent any.
    pub(crate) fn ranks_of(&self, pid: u32) -> Option<Ranks> {
        self.senders.get(&pid).and_then(|s| s.ranks)
    }

    /// Per (pid, source), the step with the largest peak of the run.
    pub(crate) fn peak_steps(&self) -> impl Iterator<Item = &PeakStep> {
        self.peak_steps.values()
    }

    /// Steps ended outside any kept phase, per (pid, tracker).
    pub(crate) fn loose_steps(&self) -> impl Iterator<Item = ((u32, u64), &StepAggregate)> {
        let mut v: Vec<_> = self
            .trackers
            .iter()
            .filter(|(_, t)| t.loose.count > 0)
            .map(|(k, t)| (*k, &t.loose))
            .collect();
        v.sort_by_key(|(k, _)| *k);
        v.into_iter()
    }

    /// Folds in one decoded message.
    pub(crate) fn add(&mut self, m: Message) {
        self.received += 1;
        let s = self.senders.entry(m.pid).or_default();
        s.received += 1;
        s.numbered = s.numbered.max(m.seq.saturating_add(1));
        s.dropped = s.dropped.max(m.dropped);
        s.dropped_steps = s.dropped_steps.max(m.dropped_steps);
        if m.ranks.is_some() {
            s.ranks = m.ranks;
        }
        if self.trackers.len() >= MAX_TRACKERS && !self.trackers.contains_key(&(m.pid, m.tracker)) {
            if matches!(m.event, Event::Begin { .. }) && m.kind != PhaseKind::Step {
                self.not_kept += 1;
            }
            return;
        }
        match m.event {
            Event::Begin { t_ns } => {
                let t = self.run_ns(t_ns);
                self.close_deeper((m.pid, m.tracker), m.depth, t);
                self.open((m.pid, m.tracker), m.kind, m.name, m.index, m.depth, t);
            }
            Event::End {
                started_ns,
                ended_ns,
                next,
                releases,
                sources,
                truncated,
            } => {
                let (start, end) = (self.run_ns(started_ns), self.run_ns(ended_ns));
                let key = (m.pid, m.tracker);
                let open = self.take_open(key, m.kind, &m.name, m.depth, end);
                let open = match open {
                    Some(o) => o,
                    // Its begin was lost: it opens and closes now.
                    None => {
                        self.open(key, m.kind, m.name.clone(), m.index, m.depth, start);
                        self.trackers
                            .get_mut(&key)
                            .and_then(|t| t.stack.pop())
                            .expect("just opened")
                    }
                };
                match open.kept {
                    Some(i) => {
                        let p = &mut self.phases[i];
                        p.index = m.index;
                        p.start_ns = start;
                        p.end_ns = Some(end);
                        p.over_by_ns = None;
                        p.sources = sources;
                        p.truncated = truncated;
                        p.releases = releases;
                    }
                    None => {
                        let peaks: Vec<StepPeak> = sources
                            .iter()
                            .map(|s| StepPeak {
                                source: s.name.clone(),
                                peak: s.peak,
                                index: m.index,
                                start_ns: start,
                                end_ns: end,
                            })
                            .collect();
                        let what = (m.kind, m.name.as_str(), m.index, m.depth);
                        self.step_level_ended(key, what, (m.index, 1), (start, end), &peaks);
                    }
                }
                if next {
                    self.open(key, m.kind, m.name, m.index + 1, m.depth, end);
                }
            }
            Event::Steps {
                last,
                count,
                started_ns,
                ended_ns,
                next,
                peaks,
                ..
            } => {
                let (start, end) = (self.run_ns(started_ns), self.run_ns(ended_ns));
                let key = (m.pid, m.tracker);
                // The first step was opened by a begin or the step before;
                // if that message was lost, nothing is open.
                let _ = self.take_open(key, m.kind, &m.name, m.depth, end);
                self.trackers.entry(key).or_default();
                let peaks: Vec<StepPeak> = peaks
                    .iter()
                    .map(|p| StepPeak {
                        source: p.source.name.clone(),
                        peak: p.source.peak,
                        index: p.index,
                        start_ns: self.run_ns(p.start_ns),
                        end_ns: self.run_ns(p.end_ns),
                    })
                    .collect();
                let what = (m.kind, m.name.as_str(), m.index, m.depth);
                self.step_level_ended(key, what, (last, count), (start, end), &peaks);
                if next {
                    self.open(key, m.kind, m.name, last + 1, m.depth, end);
                }
            }
        }
    }

    /// Opens a phase in a tracker (kept unless it is step-level or over the
    /// bounds).
    fn open(
        &mut self,
        key: (u32, u64),
        kind: PhaseKind,
        name: String,
        index: u64,
        depth: u32,
        start_ns: u64,
    ) {
        let t = self.trackers.entry(key).or_default();
        let in_step = t.stack.iter().any(|o| o.kind == PhaseKind::Step);
        let kept = if kind == PhaseKind::Step || in_step {
            None
        } else if self.phases.len() >= MAX_PHASES
            || (kind == PhaseKind::Custom && self.customs >= MAX_CUSTOM_PHASES)
        {
            self.not_kept += 1;
            None
        } else {
            self.customs += usize::from(kind == PhaseKind::Custom);
            self.phases.push(Phase {
                pid: key.0,
                tracker: key.1,
                kind,
                name: name.clone(),
                index,
                depth,
                parent: t.stack.iter().rev().find_map(|o| o.kept),
                start_ns,
                end_ns: None,
                over_by_ns: None,
                sources: Vec::new(),
                truncated: false,
                releases: 0,
                steps: StepAggregate::default(),
            });
            Some(self.phases.len() - 1)
        };
        t.stack.push(Open {
            kind,
            name,
            index,
            depth,
            start_ns,
            kept,
        });
    }

    /// Phases at `depth` or deeper are over (a phase begins at `depth`):
    /// their ends were lost.
    fn close_deeper(&mut self, key: (u32, u64), depth: u32, t: u64) {
        let Some(state) = self.trackers.get_mut(&key) else {
            return;
        };
        while state.stack.last().is_some_and(|o| o.depth >= depth) {
            let o = state.stack.pop().expect("checked");
            if let Some(i) = o.kept {
                self.phases[i].over_by_ns = Some(t);
            }
        }
    }

    /// Takes the open phase an end names (the innermost of that kind, name
    /// and depth); phases inside it lost their ends and are closed at `end`.
    fn take_open(
        &mut self,
        key: (u32, u64),
        kind: PhaseKind,
        name: &str,
        depth: u32,
        end: u64,
    ) -> Option<Open> {
        let state = self.trackers.get_mut(&key)?;
        let at = state
            .stack
            .iter()
            .rposition(|o| o.kind == kind && o.name == name && o.depth == depth)?;
        for o in state.stack.drain(at + 1..) {
            if let Some(i) = o.kept {
                self.phases[i].over_by_ns = Some(end);
            }
        }
        state.stack.pop()
    }

    /// A step-level phase ended (or, for steps, `count` of them, numbered
    /// `index..=last`, from `start` to `end`, with their peaks per source).
    fn step_level_ended(
        &mut self,
        key: (u32, u64),
        (kind, name, index, depth): (PhaseKind, &str, u64, u32),
        (last, count): (u64, u64),
        (start, end): (u64, u64),
        peaks: &[StepPeak],
    ) {
        let Some(state) = self.trackers.get_mut(&key) else {
            return;
        };
        if state.recent.len() >= RECENT {
            state.recent.pop_front();
        }
        state.recent.push_back(Span {
            name: name.to_owned(),
            index,
            last,
            depth,
            start_ns: start,
            end_ns: end,
        });
        if kind != PhaseKind::Step {
            return;
        }
        self.steps += count;
        let within = state.stack.iter().rev().find_map(|o| o.kept);
        match within {
            Some(i) => self.phases[i].steps.add(count, index, peaks),
            None => state.loose.add(count, index, peaks),
        }
        for s in peaks {
            let new = PeakStep {
                pid: key.0,
                tracker: key.1,
                step: s.clone(),
                within,
            };
            match self.peak_steps.entry((key.0, s.source.clone())) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(new);
                }
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    if s.peak > o.get().step.peak {
                        o.insert(new);
                    }
                }
            }
        }
    }

    /// The label of a kept phase with its enclosing kept phases:
    /// `stream 0 / experience 1`.
    pub(crate) fn path(&self, i: usize) -> String {
        let mut parts = vec![self.phases[i].label()];
        let mut at = self.phases[i].parent;
        while let Some(p) = at {
            parts.push(self.phases[p].label());
            at = self.phases[p].parent;
        }
        parts.reverse();
        parts.join(" / ")
    }

    /// The phases open at `t_ns` (nanoseconds since the command was
    /// spawned, the timeline's clock) in process `pid` (any process of the
    /// run when `None`), outermost first, as one label: `epoch 3 / step
    /// 120`. Steps are named while they are open or among the last
    /// [`RECENT`] ended in their tracker. `None` when no phase was open.
    pub(crate) fn phase_at(&self, pid: Option<u32>, t_ns: u64) -> Option<String> {
        let mut best: Option<Vec<(u32, String)>> = None;
        let mut keys: Vec<&(u32, u64)> = self
            .trackers
            .keys()
            .filter(|(p, _)| pid.map_or(true, |want| *p == want))
            .collect();
        keys.sort();
        for key in keys {
            let state = &self.trackers[key];
            // depth -> (start, label): the latest-starting phase covering t.
            let mut at: BTreeMap<u32, (u64, String)> = BTreeMap::new();
            let mut cover = |depth: u32, start: u64, label: String| {
                let e = at.entry(depth).or_insert((start, label.clone()));
                if start >= e.0 {
                    *e = (start, label);
                }
            };
            for p in self
                .phases
                .iter()
                .filter(|p| (p.pid, p.tracker) == *key && p.start_ns <= t_ns)
            {
                let end = p.end_ns.or(p.over_by_ns).unwrap_or(u64::MAX);
                if t_ns <= end {
                    cover(p.depth, p.start_ns, p.label());
                }
            }
            for o in state.stack.iter().filter(|o| o.start_ns <= t_ns) {
                cover(o.depth, o.start_ns, label(&o.name, o.index));
            }
            for s in state
                .recent
                .iter()
                .filter(|s| s.start_ns <= t_ns && t_ns <= s.end_ns)
            {
                let l = if s.last > s.index {
                    format!("{} {}–{}", s.name, s.index, s.last)
                } else {
                    label(&s.name, s.index)
                };
                cover(s.depth, s.start_ns, l);
            }
            let chain: Vec<(u32, String)> = at.into_iter().map(|(d, (_, l))| (d, l)).collect();
            if best.as_ref().map_or(true, |b| chain.len() > b.len()) {
                best = Some(chain);
            }
        }
        best.filter(|c| !c.is_empty()).map(|c| {
            c.into_iter()
                .map(|(_, l)| l)
                .collect::<Vec<_>>()
                .join(" / ")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprobe_core::internal::run_channel::protocol::BatchPeak;

    const MS: u64 = 1_000_000;

    fn msg(pid: u32, seq: u64, kind: PhaseKind, index: u64, depth: u32, event: Event) -> Message {
        Message {
            pid,
            tracker: 1,
            seq,
            dropped: 0,
            dropped_steps: 0,
            ranks: None,
            kind,
            name: kind.as_str().into(),
            index,
            depth,
            event,
        }
    }

    fn rss(peak: u64) -> Vec<SourceRecord> {
        vec![SourceRecord {
            name: "rss".into(),
            kind: "process".into(),
            fidelity: "exact".into(),
            used_start: 10,
            used_end: 10,
            peak,
            delta_used: 0,
            delta_peaked: peak.saturating_sub(10),
        }]
    }

    fn end(start: u64, end: u64, next: bool, peak: u64) -> Event {
        Event::End {
            started_ns: start,
            ended_ns: end,
            next,
            releases: 0,
            sources: rss(peak),
            truncated: false,
        }
    }

    /// Two epochs of 10 steps each (10 ms per step, from t0 = 1000 ms),
    /// with a spike in step 13 (epoch 1).
    fn two_epochs(log: &mut PhaseLog) {
        let t0 = 1000 * MS;
        let mut seq = 0;
        let mut step = 0;
        for epoch in 0..2u64 {
            let e0 = t0 + epoch * 100 * MS;
            log.add(msg(
                7,
                seq,
                PhaseKind::Epoch,
                epoch,
                0,
                Event::Begin { t_ns: e0 },
            ));
            seq += 1;
            log.add(msg(
                7,
                seq,
                PhaseKind::Step,
                step,
                1,
                Event::Begin { t_ns: e0 },
            ));
            seq += 1;
            for i in 0..10u64 {
                let s = e0 + i * 10 * MS;
                let peak = if step == 13 { 500 } else { 100 + step };
                log.add(msg(
                    7,
                    seq,
                    PhaseKind::Step,
                    step,
                    1,
                    end(s, s + 10 * MS, i < 9, peak),
                ));
                seq += 1;
                step += 1;
            }
            log.add(msg(
                7,
                seq,
                PhaseKind::Epoch,
                epoch,
                0,
                end(e0, e0 + 100 * MS, false, 500),
            ));
            seq += 1;
        }
    }

    #[test]
    fn epochs_keep_their_steps_aggregated_and_the_peak_step_is_found() {
        let mut log = PhaseLog::new(1000 * MS);
        two_epochs(&mut log);
        assert_eq!(log.phases.len(), 2, "steps are not kept one by one");
        assert_eq!(log.steps, 20);
        assert_eq!((log.received, log.dropped(), log.garbled), (26, 0, 0));
        assert_eq!(log.phases[1].steps.first_index, Some(10));
        let e1 = &log.phases[1];
        assert_eq!(
            (e1.label().as_str(), e1.start_ns, e1.end_ns),
            ("epoch 1", 100 * MS, Some(200 * MS))
        );
        assert_eq!(e1.steps.count, 10);
        assert_eq!((e1.steps.peaks[0].index, e1.steps.peaks[0].peak), (13, 500));
        let p: Vec<&PeakStep> = log.peak_steps().collect();
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].pid, p[0].step.index, p[0].within), (7, 13, Some(1)));
        assert_eq!(
            log.phase_at(Some(7), 135 * MS).as_deref(),
            Some("epoch 1 / step 13")
        );
        assert_eq!(
            log.phase_at(None, 5 * MS).as_deref(),
            Some("epoch 0 / step 0")
        );
        assert_eq!(log.phase_at(Some(8), 5 * MS), None);
        assert_eq!(log.phase_at(Some(7), 500 * MS), None);
    }

    #[test]
    fn lost_messages_are_counted_and_the_phases_still_hold_together() {
        let mut log = PhaseLog::new(0);
        log.add(msg(
            3,
            0,
            PhaseKind::Epoch,
            0,
            0,
            Event::Begin { t_ns: 10 * MS },
        ));
        log.add(msg(
            3,
            1,
            PhaseKind::Step,
            0,
            1,
            Event::Begin { t_ns: 10 * MS },
        ));
        // Messages 2..=4 were dropped (the sender says so in message 5),
        // the epoch's end among them: the next epoch's begin closes it.
        let mut m = msg(3, 5, PhaseKind::Epoch, 1, 0, Event::Begin { t_ns: 50 * MS });
        m.dropped = 3;
        log.add(m);
        // An end whose begin was lost.
        log.add(msg(
            3,
            6,
            PhaseKind::Step,
            9,
            1,
            end(60 * MS, 70 * MS, false, 900),
        ));
        assert_eq!(log.dropped(), 3);
        assert_eq!(log.phases.len(), 2);
        assert_eq!(
            (log.phases[0].end_ns, log.phases[0].over_by_ns),
            (None, Some(50 * MS))
        );
        assert_eq!(log.phases[1].steps.count, 1);
        assert_eq!(
            log.phase_at(Some(3), 65 * MS).as_deref(),
            Some("epoch 1 / step 9")
        );
        // Still open at the end of the run: an open epoch covers later times.
        assert_eq!(log.phase_at(Some(3), 900 * MS).as_deref(), Some("epoch 1"));
        // A gap in the numbers counts even when nobody said so.
        log.add(msg(
            3,
            20,
            PhaseKind::Epoch,
            1,
            0,
            end(50 * MS, 95 * MS, false, 1),
        ));
        assert_eq!(log.dropped(), 21 - 5);
    }

    #[test]
    fn batches_of_steps_count_every_step_and_keep_each_peak() {
        let mut log = PhaseLog::new(0);
        log.add(msg(5, 0, PhaseKind::Epoch, 0, 0, Event::Begin { t_ns: 0 }));
        log.add(msg(5, 1, PhaseKind::Step, 0, 1, Event::Begin { t_ns: 0 }));
        let batch =
            |first: u64, last: u64, start: u64, end: u64, peak_at: u64, peak: u64| Event::Steps {
                last,
                count: last - first + 1,
                started_ns: start,
                ended_ns: end,
                next: true,
                releases: 0,
                peaks: vec![BatchPeak {
                    index: peak_at,
                    start_ns: start + 1000,
                    end_ns: start + 2000,
                    source: rss(peak).remove(0),
                }],
                truncated: false,
            };
        log.add(msg(
            5,
            2,
            PhaseKind::Step,
            0,
            1,
            batch(0, 99, 0, 20 * MS, 42, 700),
        ));
        // Step 100 is open from the batch's end.
        assert_eq!(
            log.phase_at(Some(5), 20 * MS + 1).as_deref(),
            Some("epoch 0 / step 100")
        );
        assert_eq!(
            log.phase_at(Some(5), 10 * MS).as_deref(),
            Some("epoch 0 / step 0–99")
        );
        let mut m = msg(
            5,
            3,
            PhaseKind::Step,
            100,
            1,
            batch(100, 149, 20 * MS, 30 * MS, 120, 300),
        );
        m.dropped = 2;
        m.dropped_steps = 64;
        log.add(m);
        log.add(msg(
            5,
            6,
            PhaseKind::Epoch,
            0,
            0,
            end(0, 31 * MS, false, 700),
        ));
        assert_eq!(log.steps, 150);
        assert_eq!((log.dropped(), log.dropped_steps()), (2, 64));
        let e = &log.phases[0];
        assert_eq!((e.steps.count, e.steps.first_index), (150, Some(0)));
        assert_eq!((e.steps.peaks[0].index, e.steps.peaks[0].peak), (42, 700));
        let p: Vec<&PeakStep> = log.peak_steps().collect();
        assert_eq!((p[0].step.index, p[0].step.start_ns), (42, 1000));
        // The epoch's end closed the open step: nothing is left open.
        assert_eq!(log.phase_at(Some(5), 40 * MS), None);
    }

    #[test]
    fn bounds_hold() {
        let mut log = PhaseLog::new(0);
        let mut m = msg(1, 0, PhaseKind::Custom, 0, 0, Event::Begin { t_ns: 0 });
        for i in 0..(MAX_CUSTOM_PHASES as u64 + 10) {
            m.seq = 2 * i;
            m.index = i;
            m.event = Event::Begin { t_ns: i };
            log.add(m.clone());
            m.seq += 1;
            m.event = end(i, i + 1, false, 1);
            log.add(m.clone());
        }
        assert_eq!(log.phases.len(), MAX_CUSTOM_PHASES);
        assert_eq!(log.not_kept, 10);
        // Epochs are still kept past the custom phases' bound.
        log.add(msg(
            1,
            1_000_000,
            PhaseKind::Epoch,
            0,
            0,
            Event::Begin { t_ns: 5 },
        ));
        assert_eq!(log.phases.len(), MAX_CUSTOM_PHASES + 1);
        let t = &log.trackers[&(1, 1)];
        assert!(t.recent.len() <= RECENT);
        // Trackers beyond the bound are not followed; their phases count.
        let before = log.not_kept;
        for tracker in 0..MAX_TRACKERS as u64 + 5 {
            let mut m = msg(2, tracker, PhaseKind::Epoch, 0, 0, Event::Begin { t_ns: 1 });
            m.tracker = tracker;
            log.add(m);
        }
        assert_eq!(log.trackers.len(), MAX_TRACKERS);
        // One tracker was followed already: 4095 more are, 6 are not.
        assert_eq!(log.not_kept - before, 6);
    }
}
