//! What a [`Tracker`](crate::Tracker) tells the consumers of its phases.
//!
//! The tracker is a stack of phases; each boundary is told to its
//! observers, in the order they were added: a phase began
//! ([`PhaseObserver::on_phase_begin`]), its record is made (the observers
//! may add to it before the sinks see it:
//! [`PhaseObserver::on_phase_record`]), it ended
//! ([`PhaseObserver::on_phase_end`], after the sinks). When the tracker is
//! dropped they are told last-added first ([`PhaseObserver::on_tracker_drop`]).
//!
//! The run channel's end (`run_channel`), the leak trends (`leak`) and the
//! out-of-memory reporter ([`OomReporter`](crate::oom_report::OomReporter))
//! are observers; another consumer (an integration, a profiler) is one more
//! ([`Tracker::add_observer`](crate::Tracker::add_observer)), and the
//! tracker does not change for it. Every method has a default that does
//! nothing, as [`Sink`](crate::Sink)'s do.

use crate::phase::PhaseKind;
use crate::record::Record;
use std::any::Any;

/// A phase that began, as observers see it.
pub struct PhaseBegun<'a> {
    /// Its kind.
    pub kind: PhaseKind,
    /// Its name (the kind's, or a custom phase's).
    pub name: &'a str,
    /// Phases enclosing it.
    pub depth: usize,
    /// When it began (`CLOCK_MONOTONIC` ns).
    pub t_ns: u64,
    /// Its number among its kind and name, looked up only when asked.
    pub(crate) index: &'a dyn Fn() -> u64,
}

impl PhaseBegun<'_> {
    /// Its number among its kind and name, from 0.
    pub fn index(&self) -> u64 {
        (self.index)()
    }
}

impl std::fmt::Debug for PhaseBegun<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhaseBegun")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("index", &self.index())
            .field("depth", &self.depth)
            .field("t_ns", &self.t_ns)
            .finish()
    }
}

/// Lets a tracker find an observer of a given type among its observers
/// (implemented for every `'static` type).
pub trait AsAny {
    /// `self`, as [`Any`].
    fn as_any(&self) -> &dyn Any;
    /// `self`, as [`Any`], mutable.
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// `self`, boxed as [`Any`].
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<T: Any> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// A consumer of a tracker's phases. Called on the tracker's thread, at
/// its boundaries: keep it short (a step boundary is a hot path), never
/// block, never panic.
pub trait PhaseObserver: AsAny + Send + 'static {
    /// A phase began.
    fn on_phase_begin(&mut self, _phase: &PhaseBegun<'_>) {}

    /// A phase's record was made (its releases run), before the sinks see
    /// it: an observer may add to it.
    fn on_phase_record(&mut self, _record: &mut Record) {}

    /// A phase ended with `record` (the sinks have it); with `next`, the
    /// next phase of its kind and name, numbered one more, began at its
    /// end ([`Tracker::next`](crate::Tracker::next)).
    fn on_phase_end(&mut self, _record: &Record, _next: bool) {}

    /// The tracker is dropped, or the observer removed from it.
    fn on_tracker_drop(&mut self) {}
}

/// A tracker's observers, in the order they were added.
#[derive(Default)]
pub(crate) struct Observers {
    list: Vec<Box<dyn PhaseObserver>>,
}

impl Observers {
    pub(crate) fn add(&mut self, observer: Box<dyn PhaseObserver>) {
        self.list.push(observer);
    }

    /// The first observer of type `T`.
    pub(crate) fn get<T: PhaseObserver>(&self) -> Option<&T> {
        self.list
            .iter()
            .find_map(|o| <dyn PhaseObserver as AsAny>::as_any(&**o).downcast_ref())
    }

    /// The first observer of type `T`, mutable.
    pub(crate) fn get_mut<T: PhaseObserver>(&mut self) -> Option<&mut T> {
        self.list
            .iter_mut()
            .find_map(|o| <dyn PhaseObserver as AsAny>::as_any_mut(&mut **o).downcast_mut())
    }

    /// Takes out the first observer of type `T` (it is not told).
    pub(crate) fn take<T: PhaseObserver>(&mut self) -> Option<T> {
        let i = self
            .list
            .iter()
            .position(|o| <dyn PhaseObserver as AsAny>::as_any(&**o).is::<T>())?;
        let o = self.list.remove(i);
        <dyn PhaseObserver as AsAny>::into_any(o)
            .downcast()
            .ok()
            .map(|t| *t)
    }

    pub(crate) fn begin(&mut self, phase: &PhaseBegun<'_>) {
        for o in &mut self.list {
            o.on_phase_begin(phase);
        }
    }

    pub(crate) fn record(&mut self, record: &mut Record) {
        for o in &mut self.list {
            o.on_phase_record(record);
        }
    }

    pub(crate) fn end(&mut self, record: &Record, next: bool) {
        for o in &mut self.list {
            o.on_phase_end(record, next);
        }
    }

    /// Last added first, as values are dropped.
    pub(crate) fn drop_all(&mut self) {
        for mut o in self.list.drain(..).rev() {
            o.on_tracker_drop();
        }
    }
}
