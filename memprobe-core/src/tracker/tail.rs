//! Tails: a phase's interval that began before the phase itself.
//!
//! A training loop's hooks often cannot tell, when a step ends, whether
//! another step follows (Lightning's next batch, or the end of the epoch, a
//! validation loop). [`Tracker::end_into`] ends the phase and keeps its
//! window running, restarted at that end, as the *tail* of the phase named
//! next; [`Tracker::resume`] begins that phase on it, its interval starting
//! at the end that made the tail: one boundary per step, nothing between two
//! steps unmeasured, and no step begun that never comes. A tail is no phase:
//! observers hear of it only when a phase begins on it (at its start time).

use super::{Tracker, TAILS};
use crate::error::Result;
use crate::phase::PhaseKind;
use crate::window::Window;
use crate::Record;

impl Tracker {
    /// Ends the innermost phase, which must be `kind` (and `name`), as
    /// [`end`](Self::end) does, and keeps its window running, restarted at
    /// this end, as the tail of the phase `next_kind` / `next_name`: the next
    /// [`resume`](Self::resume) of that phase begins at this end. A release
    /// due at this end runs after the boundary, in the tail. On error nothing
    /// changes.
    pub fn end_into(
        &mut self,
        kind: PhaseKind,
        name: Option<&str>,
        next_kind: PhaseKind,
        next_name: Option<&str>,
    ) -> Result<Record> {
        let name = Self::phase_name(kind, name)?;
        let next = Self::phase_name(next_kind, next_name)?;
        self.check_top(kind, &name)?;
        let top = self.stack.last_mut().expect("checked");
        let started = top.window.started_at_ns();
        // The one step that can fail, all or nothing.
        let deltas = top.window.reset()?;
        // The phase ends where its tail begins: back to back.
        let ended = top.window.started_at_ns();
        let open = self.stack.pop().expect("checked");
        self.set_tail(next_kind, next, open.window);
        let depth = self.stack.len();
        let record = self.finish_phase(kind, name, (started, ended), deltas, depth);
        self.observers.end(&record, false);
        Ok(record)
    }

    /// Begins a phase of `kind` (and `name`) on the tail of `from_kind` /
    /// `from_name` (made by [`end_into`](Self::end_into) or
    /// [`mark_tail`](Self::mark_tail)): its interval began when the tail
    /// did, and the tail is used up. Without such a tail, a plain
    /// [`begin`](Self::begin). Nesting as for `begin`.
    pub fn resume(
        &mut self,
        kind: PhaseKind,
        name: Option<&str>,
        from_kind: PhaseKind,
        from_name: Option<&str>,
    ) -> Result<()> {
        let name = Self::phase_name(kind, name)?;
        let from = Self::phase_name(from_kind, from_name)?;
        self.check_nesting(kind)?;
        let Some(window) = self.take_tail(from_kind, &from) else {
            let custom = (kind == PhaseKind::Custom).then_some(name.as_str());
            return self.begin(kind, custom);
        };
        // Its own stale tail, if any, is dropped: the phase is open now.
        if (kind, name.as_str()) != (from_kind, from.as_str()) {
            if let Some(w) = self.take_tail(kind, &name) {
                self.park(w);
            }
        }
        self.push(kind, name, window);
        Ok(())
    }

    /// Ends the phase of `kind` (and `name`) that began on its own tail and
    /// ends now: [`resume`](Self::resume) then [`end_into`](Self::end_into)
    /// in one call (one boundary per step, for a loop whose hooks see only
    /// the end of each step). Without a tail the phase began now. Should
    /// the boundary fail, the phase's window is its tail again (its begin
    /// was told to the observers).
    pub fn end_tail(
        &mut self,
        kind: PhaseKind,
        name: Option<&str>,
        next_kind: PhaseKind,
        next_name: Option<&str>,
    ) -> Result<Record> {
        self.resume(kind, name, kind, name)?;
        match self.end_into(kind, name, next_kind, next_name) {
            Ok(r) => Ok(r),
            Err(e) => {
                let open = self.stack.pop().expect("resumed");
                self.tails.push((open.kind, open.name, open.window));
                Err(e)
            }
        }
    }

    /// Starts the tail of `kind` (and `name`) now: the next
    /// [`resume`](Self::resume) of it begins here (a boundary of no phase;
    /// an earlier tail of it is dropped). On error the earlier tail stays.
    pub fn mark_tail(&mut self, kind: PhaseKind, name: Option<&str>) -> Result<()> {
        let name = Self::phase_name(kind, name)?;
        let window = self.tail_restarted_or_fresh(kind, &name)?;
        self.set_tail(kind, name, window);
        Ok(())
    }

    /// When the tail of `kind` / `name` began (`CLOCK_MONOTONIC` ns), if
    /// there is one.
    pub fn tail_started_at_ns(&self, kind: PhaseKind, name: Option<&str>) -> Option<u64> {
        let name = Self::phase_name(kind, name).ok()?;
        self.tails
            .iter()
            .find(|(k, n, _)| *k == kind && *n == name)
            .map(|(_, _, w)| w.started_at_ns())
    }

    fn set_tail(&mut self, kind: PhaseKind, name: String, window: Window) {
        if let Some(old) = self.take_tail(kind, &name) {
            self.park(old);
        }
        if self.tails.len() >= TAILS {
            let (_, _, oldest) = self.tails.remove(0);
            self.park(oldest);
        }
        self.tails.push((kind, name, window));
    }

    /// The tail of `kind` / `name` restarted now, else a fresh window; when
    /// the restart fails the tail stays as it was.
    pub(super) fn tail_restarted_or_fresh(
        &mut self,
        kind: PhaseKind,
        name: &str,
    ) -> Result<Window> {
        match self.take_tail(kind, name) {
            Some(mut w) => match w.reset() {
                Ok(_) => Ok(w),
                Err(e) => {
                    self.tails.push((kind, name.to_owned(), w));
                    Err(e)
                }
            },
            None => self.fresh_window(),
        }
    }

    pub(super) fn take_tail(&mut self, kind: PhaseKind, name: &str) -> Option<Window> {
        let i = self
            .tails
            .iter()
            .position(|(k, n, _)| *k == kind && n == name)?;
        Some(self.tails.remove(i).2)
    }
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::observer::{PhaseBegun, PhaseObserver};
    use crate::Record;
    use crate::{PhaseKind, Source, Tracker};
    use std::sync::{Arc, Mutex};

    type Log = Arc<Mutex<Vec<String>>>;

    struct Seen(Log);

    impl PhaseObserver for Seen {
        fn on_phase_begin(&mut self, p: &PhaseBegun<'_>) {
            let line = format!("begin {} {} {}", p.name, p.index(), p.t_ns);
            self.0.lock().unwrap().push(line);
        }
        fn on_phase_end(&mut self, r: &Record, next: bool) {
            let line = format!("end {} {} {next}", r.label, r.started_at_ns);
            self.0.lock().unwrap().push(line);
        }
    }

    fn tracker() -> (Tracker, Source, Log) {
        let src = Source::pushed("used").unwrap();
        src.push(10).unwrap();
        let mut t = Tracker::new(std::slice::from_ref(&src)).unwrap();
        let log: Log = Arc::default();
        t.add_observer(Box::new(Seen(Arc::clone(&log))));
        (t, src, log)
    }

    #[test]
    fn a_resumed_step_begins_at_the_end_that_made_its_tail() {
        let (mut t, used, log) = tracker();
        t.begin(PhaseKind::Epoch, None).unwrap();
        t.begin(PhaseKind::Step, None).unwrap();
        let first = t
            .end_into(PhaseKind::Step, None, PhaseKind::Step, None)
            .unwrap();
        let tail_start = t.tail_started_at_ns(PhaseKind::Step, None).unwrap();
        assert_eq!(tail_start, first.ended_at_ns);
        // Between the steps: the next step's.
        used.push(50).unwrap();
        t.resume(PhaseKind::Step, None, PhaseKind::Step, None)
            .unwrap();
        assert!(t.tail_started_at_ns(PhaseKind::Step, None).is_none());
        used.push(20).unwrap();
        let second = t.end(PhaseKind::Step, None).unwrap();
        assert_eq!(second.started_at_ns, tail_start);
        assert_eq!(second.phase.as_ref().unwrap().index, 1);
        assert_eq!(second.phase.as_ref().unwrap().depth, 1);
        assert_eq!(second.sources[0].used_start, 10);
        assert_eq!(second.sources[0].peak, 50);
        assert_eq!(first.sources[0].peak, 10);
        t.end(PhaseKind::Epoch, None).unwrap();
        let log = log.lock().unwrap();
        let begins: Vec<_> = log.iter().filter(|l| l.starts_with("begin step")).collect();
        assert_eq!(begins.len(), 2, "{log:?}");
        assert_eq!(*begins[1], format!("begin step 1 {tail_start}"));
        assert!(
            log.contains(&format!("end step {tail_start} false")),
            "{log:?}"
        );
    }

    #[test]
    fn a_tail_not_resumed_makes_no_phase_and_another_phase_can_take_it() {
        let (mut t, _used, log) = tracker();
        t.begin(PhaseKind::Custom, Some("train")).unwrap();
        t.mark_tail(PhaseKind::Step, None).unwrap();
        let since = t.tail_started_at_ns(PhaseKind::Step, None).unwrap();
        t.resume(PhaseKind::Custom, Some("eval"), PhaseKind::Step, None)
            .unwrap();
        let eval = t
            .end_into(PhaseKind::Custom, Some("eval"), PhaseKind::Step, None)
            .unwrap();
        assert_eq!((eval.label.as_str(), eval.started_at_ns), ("eval", since));
        assert_eq!(t.open_phases(), vec![(PhaseKind::Custom, "train".into())]);
        t.end(PhaseKind::Custom, Some("train")).unwrap();
        // No step was begun or ended.
        assert!(!log.lock().unwrap().iter().any(|l| l.contains("step")));
    }

    #[test]
    fn resume_without_a_tail_begins_and_keeps_the_nesting_rules() {
        let (mut t, _used, _log) = tracker();
        t.resume(PhaseKind::Epoch, None, PhaseKind::Epoch, None)
            .unwrap();
        assert_eq!(t.open_phases(), vec![(PhaseKind::Epoch, "epoch".into())]);
        t.begin(PhaseKind::Step, None).unwrap();
        t.end_into(PhaseKind::Step, None, PhaseKind::Step, None)
            .unwrap();
        // An epoch inside an epoch: refused, and the tail is kept.
        let e = t
            .resume(PhaseKind::Epoch, None, PhaseKind::Step, None)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WrongOrder);
        assert!(t.tail_started_at_ns(PhaseKind::Step, None).is_some());
        // Wrong order and bad names change nothing.
        let e = t
            .end_into(PhaseKind::Step, None, PhaseKind::Step, None)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WrongOrder);
        let e = t.mark_tail(PhaseKind::Custom, None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let e = t
            .resume(PhaseKind::Step, Some("named"), PhaseKind::Step, None)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(t.open_phases().len(), 1);
        // A fresh begin of the step drops its tail.
        t.begin(PhaseKind::Step, None).unwrap();
        assert!(t.tail_started_at_ns(PhaseKind::Step, None).is_none());
    }

    #[test]
    fn end_tail_is_resume_and_end_into_in_one_call() {
        let (mut t, used, log) = tracker();
        t.begin(PhaseKind::Epoch, None).unwrap();
        t.mark_tail(PhaseKind::Step, None).unwrap();
        let since = t.tail_started_at_ns(PhaseKind::Step, None).unwrap();
        used.push(70).unwrap();
        used.push(30).unwrap();
        let a = t
            .end_tail(PhaseKind::Step, None, PhaseKind::Step, None)
            .unwrap();
        let b = t
            .end_tail(PhaseKind::Step, None, PhaseKind::Step, None)
            .unwrap();
        assert_eq!((a.started_at_ns, a.sources[0].peak), (since, 70));
        assert_eq!((b.started_at_ns, b.sources[0].peak), (a.ended_at_ns, 30));
        assert_eq!(b.phase.as_ref().unwrap().index, 1);
        assert_eq!(t.open_phases(), vec![(PhaseKind::Epoch, "epoch".into())]);
        // Nesting as for resume: nothing changes on a refusal.
        let e = t
            .end_tail(PhaseKind::Epoch, None, PhaseKind::Epoch, None)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WrongOrder);
        t.end(PhaseKind::Epoch, None).unwrap();
        let log = log.lock().unwrap();
        assert_eq!(
            log.iter().filter(|l| l.starts_with("begin step")).count(),
            2
        );
        assert_eq!(log.iter().filter(|l| l.starts_with("end step")).count(), 2);
    }

    #[test]
    fn tails_are_bounded() {
        let (mut t, _used, _log) = tracker();
        for i in 0..super::TAILS + 3 {
            t.mark_tail(PhaseKind::Custom, Some(&format!("p{i}")))
                .unwrap();
        }
        assert_eq!(t.tails.len(), super::TAILS);
        assert!(t
            .tail_started_at_ns(PhaseKind::Custom, Some("p0"))
            .is_none());
        let last = format!("p{}", super::TAILS + 2);
        assert!(t
            .tail_started_at_ns(PhaseKind::Custom, Some(&last))
            .is_some());
    }
}
