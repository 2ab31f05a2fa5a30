//! The container's OOM event counters as the run saw them: the first
//! reading and every change (cgroup v2 `memory.events`, v1
//! `memory.oom_control`). The sampling thread reads the file and hands each
//! reading to [`CounterLog::observe`]; this keeps the record, pure.

use memprobe_core::internal::cgroup::OomEvents;
use memprobe_core::CgroupVersion;

/// At most this many counter changes are kept (each kill is one change at
/// most; a run killed this often has long lost its memory).
pub(super) const MAX_CHANGES: usize = 4096;

/// The container's OOM event counters over the run: the first reading, then
/// every change, each with the time of the reading before it (the change
/// happened between the two).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CounterLog {
    /// Which file the counters come from; `None` until the cgroup is known.
    pub(crate) file: Option<&'static str>,
    pub(crate) first: Option<(u64, OomEvents)>,
    pub(crate) changes: Vec<Change>,
    last: Option<(u64, OomEvents)>,
    /// Changes dropped beyond [`MAX_CHANGES`].
    pub(crate) dropped: u64,
}

/// One change of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Change {
    /// The last reading with the old values, ns since the start.
    pub(crate) after_ns: u64,
    /// The first reading with the new ones.
    pub(crate) at_ns: u64,
    pub(crate) before: OomEvents,
    pub(crate) now: OomEvents,
}

impl CounterLog {
    /// A log of the counters of a cgroup of `version`.
    pub(crate) fn new(version: CgroupVersion) -> CounterLog {
        CounterLog {
            file: Some(match version {
                CgroupVersion::V1 => "memory.oom_control (cgroup v1)",
                CgroupVersion::V2 => "memory.events (cgroup v2)",
            }),
            ..CounterLog::default()
        }
    }

    /// Folds in one reading taken at `now` (`None`: none could be had).
    pub(crate) fn observe(&mut self, now: u64, events: Option<OomEvents>) {
        let Some(events) = events else { return };
        match self.last {
            None => self.first = Some((now, events)),
            Some((then, before)) if before != events => {
                if self.changes.len() < MAX_CHANGES {
                    self.changes.push(Change {
                        after_ns: then,
                        at_ns: now,
                        before,
                        now: events,
                    });
                } else {
                    self.dropped += 1;
                }
            }
            Some(_) => {}
        }
        self.last = Some((now, events));
    }

    /// Whether `oom_kill` was read at all.
    pub(super) fn has_oom_kill(&self) -> bool {
        self.first.is_some_and(|(_, e)| e.oom_kill.is_some())
    }

    /// The rise of a counter from the first reading to the last.
    pub(super) fn rise(&self, field: impl Fn(&OomEvents) -> Option<u64>) -> Option<u64> {
        let first = field(&self.first?.1)?;
        let last = field(&self.last?.1)?;
        Some(last.saturating_sub(first))
    }

    /// The intervals in which `oom_kill` rose, with how much.
    pub(super) fn kills(&self) -> Vec<(u64, u64, u64)> {
        self.changes
            .iter()
            .filter_map(|c| {
                let rise = c.now.oom_kill?.checked_sub(c.before.oom_kill?)?;
                (rise > 0).then_some((c.after_ns, c.at_ns, rise))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_the_first_reading_and_changes_only() {
        let mut l = CounterLog::new(CgroupVersion::V2);
        l.observe(0, None);
        assert_eq!(l.first, None);
        let e = |k| OomEvents {
            oom_kill: Some(k),
            ..OomEvents::default()
        };
        l.observe(10, Some(e(1)));
        l.observe(20, Some(e(1)));
        l.observe(30, None);
        l.observe(40, Some(e(2)));
        assert_eq!(l.first, Some((10, e(1))));
        assert_eq!(
            l.changes,
            vec![Change {
                after_ns: 20,
                at_ns: 40,
                before: e(1),
                now: e(2)
            }]
        );
        assert_eq!(l.rise(|e| e.oom_kill), Some(1));
    }
}
