//! A tracker's end of the run channel: its number in the process and the
//! channel it sends to (the one [`ENV`] names, or one its caller chose).
//! Step-level messages go to the channel's batch, the others out at once.

use super::protocol::Outgoing;
use super::sender::RunChannel;
#[cfg(doc)]
use super::ENV;
use crate::observer::{PhaseBegun, PhaseObserver};
use crate::phase::PhaseKind;
use crate::record::Record;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Where a tracker sends: the channel named by the environment, or one the
/// caller chose (or none).
#[derive(Debug)]
enum Target {
    Env,
    Chosen(Option<Arc<RunChannel>>),
}

/// A tracker's end of the channel: its number and where it sends.
#[derive(Debug)]
pub(crate) struct Hook {
    tracker: u64,
    target: Target,
    /// Whether anything was handed to a channel (its steps go out at drop).
    used: bool,
}

impl Hook {
    /// The next tracker's hook, sending where [`ENV`] says.
    pub(crate) fn new() -> Hook {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Hook {
            tracker: NEXT.fetch_add(1, Ordering::Relaxed),
            target: Target::Env,
            used: false,
        }
    }

    /// Sends to `channel` from now on (`None`: nowhere); what went to the
    /// previous one is sent there first.
    pub(crate) fn set(&mut self, channel: Option<Arc<RunChannel>>) {
        self.close();
        self.target = Target::Chosen(channel);
    }

    /// A phase began (`index` is asked only when a message is sent).
    pub(crate) fn begin(
        &mut self,
        kind: PhaseKind,
        name: &str,
        index: impl FnOnce() -> u64,
        depth: usize,
        t_ns: u64,
    ) {
        let Some(c) = channel(&self.target) else {
            return;
        };
        self.used = true;
        let event = Outgoing::Begin {
            kind,
            name,
            index: index(),
            depth: u32::try_from(depth).unwrap_or(u32::MAX),
            t_ns,
        };
        if kind == PhaseKind::Step {
            c.step(self.tracker, &event);
        } else {
            c.emit(self.tracker, &event);
        }
    }

    /// A phase ended with `record`; with `next`, the next one began.
    pub(crate) fn end(&mut self, record: &Record, next: bool) {
        let Some(c) = channel(&self.target) else {
            return;
        };
        self.used = true;
        let event = Outgoing::End { record, next };
        if record
            .phase
            .as_ref()
            .is_some_and(|p| p.kind == PhaseKind::Step)
        {
            c.step(self.tracker, &event);
        } else {
            c.emit(self.tracker, &event);
        }
    }

    /// Sends this tracker's steps and what its channel kept.
    fn close(&mut self) {
        if std::mem::take(&mut self.used) {
            if let Some(c) = channel(&self.target) {
                c.close(self.tracker);
            }
        }
    }
}

/// The run channel observes every phase of its tracker.
impl PhaseObserver for Hook {
    fn on_phase_begin(&mut self, phase: &PhaseBegun<'_>) {
        self.begin(
            phase.kind,
            phase.name,
            || phase.index(),
            phase.depth,
            phase.t_ns,
        );
    }

    fn on_phase_end(&mut self, record: &Record, next: bool) {
        self.end(record, next);
    }

    fn on_tracker_drop(&mut self) {
        self.close();
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        self.close();
    }
}

fn channel(target: &Target) -> Option<&RunChannel> {
    match target {
        Target::Env => RunChannel::from_env(),
        Target::Chosen(c) => c.as_deref(),
    }
}

impl Default for Hook {
    fn default() -> Self {
        Hook::new()
    }
}
