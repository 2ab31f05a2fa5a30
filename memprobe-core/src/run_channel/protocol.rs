//! The run channel's wire format, both ends of it: what a tracker sends
//! (`encode`, by hand into a reused buffer: it runs at every step
//! boundary) and what `memprobe run` reads back (`decode`, with its
//! checks), with the message types they share.
//!
//! `decode` needs a JSON parser, which the traced program's side never
//! does: it is built with the `run-channel-decode` feature (the CLI's), and
//! for this crate's tests.
//!
//! # Messages (version [`VERSION`])
//!
//! One JSON object per datagram. Every message has `"v"` (the version),
//! `"ev"` (`"begin"`, `"end"` or `"steps"`), `"pid"`, `"tracker"` (the
//! tracker's number in its process, from 1), `"seq"` (the message's number
//! in its process, from 0, dropped ones included), `"dropped"` (messages of
//! this process dropped before this one was sent), `"dropped_steps"` (the
//! steps in those of them that were batches), `"kind"` (`step`, `epoch`,
//! `experience`, `stream`, `custom`), `"name"` (the kind's name, or a
//! custom phase's), `"index"` (the phase's number among its kind and name,
//! from 0) and `"depth"` (phases enclosing it). A process that is one
//! rank of a job of several (its launcher said so: [`Ranks`]) adds
//! `"rank"`, `"world_size"` and, when known, `"local_rank"` after
//! `"dropped_steps"`, in every message (any one of them may be the one that
//! arrives); a process without ranks sends none of them. Then:
//!
//! - `begin`: `"t_ns"`, when the phase began;
//! - `end`: `"started_ns"`, `"ended_ns"`, `"next"` (true when a phase of
//!   the same kind and name, numbered `index + 1`, began at `ended_ns`:
//!   [`Tracker::next`](crate::Tracker::next) ends one phase and begins the
//!   next), `"releases"` (cache releases fired at its end), `"sources"`
//!   (per source: `name`, `kind`, `fidelity`, `used_start`, `used_end`,
//!   `peak`, `delta_used`, `delta_peaked`, in bytes) and `"truncated"` (true
//!   when sources were left out to keep the datagram under
//!   [`MAX_DATAGRAM`] bytes; at least 90 sources always fit, about 300 usually);
//! - `steps` (kind `step`): `"index"` is the first step's number,
//!   `"last"` the last's, `"count"` how many ended; `"started_ns"` the
//!   first's start, `"ended_ns"` the last's end; `"next"` as for `end`
//!   (after the last); `"releases"` their sum; `"sources"`: per source the
//!   step with the largest peak, its record as in `end` plus the step's
//!   `"index"`, `"started_ns"` and `"ended_ns"`.
//!
//! Fields may be added within a version; a reader ignores those it does
//! not know.
//!
//! ```text
//! {"v":1,"ev":"begin","pid":4242,"tracker":1,"seq":0,"dropped":0,"dropped_steps":0,"kind":"epoch","name":"epoch","index":0,"depth":0,"t_ns":81234567890}
//! {"v":1,"ev":"end","pid":4242,"tracker":1,"seq":7,"dropped":0,"dropped_steps":0,"kind":"step","name":"step","index":3,"depth":1,"started_ns":81240000000,"ended_ns":81250000000,"next":true,"releases":0,"sources":[{"name":"rss","kind":"process","fidelity":"exact","used_start":104857600,"used_end":104857600,"peak":373293056,"delta_used":0,"delta_peaked":268435456}],"truncated":false}
//! {"v":1,"ev":"begin","pid":4243,"tracker":1,"seq":0,"dropped":0,"dropped_steps":0,"rank":1,"world_size":2,"local_rank":1,"kind":"epoch","name":"epoch","index":0,"depth":0,"t_ns":81234567890}
//! {"v":1,"ev":"steps","pid":4242,"tracker":1,"seq":8,"dropped":0,"dropped_steps":0,"kind":"step","name":"step","index":4,"depth":1,"last":9,"count":6,"started_ns":81250000000,"ended_ns":81262000000,"next":true,"releases":0,"sources":[{"name":"rss","kind":"process","fidelity":"exact","used_start":104857600,"used_end":104857600,"peak":109051904,"delta_used":0,"delta_peaked":4194304,"index":7,"started_ns":81256000000,"ended_ns":81258000000}],"truncated":false}
//! ```

use super::ranks::Ranks;
use crate::delta::SourceDelta;
use crate::phase::PhaseKind;
use crate::record::Record;
use crate::sinks::json;
use std::fmt::Write as _;

/// The version of the messages (`"v"`); bumped on incompatible changes
/// (fields and events may be added within a version).
pub const VERSION: u32 = 1;

/// No datagram is longer than this many bytes (sources beyond it are left
/// out and `"truncated"` says so).
pub const MAX_DATAGRAM: usize = 60 * 1024;

/// The longest name a message carries (a tracker's rule for phase and
/// source names: 1 to 64 printable bytes).
pub const MAX_NAME: usize = 64;

/// More sources than fit in the largest message are refused.
pub const MAX_SOURCES: usize = MAX_DATAGRAM / 64;

/// One encoded source entry is at most this long (a 64-byte name with each
/// byte escaped as `\u00XX`, and eight numbers, and a step's three); the
/// encoder stops adding sources before it could pass [`MAX_DATAGRAM`].
const MAX_SOURCE_ENTRY: usize = 720;

// ---- What a tracker sends ----

/// The fields every message starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) pid: u32,
    pub(crate) tracker: u64,
    pub(crate) seq: u64,
    pub(crate) dropped: u64,
    pub(crate) dropped_steps: u64,
    /// The sending process's ranks, when it has them.
    pub(crate) ranks: Option<Ranks>,
}

/// In a batch being sent: the step with the largest peak of one source,
/// its record of the source, number and times.
#[derive(Debug, Clone)]
pub(crate) struct PeakOut {
    pub(crate) delta: SourceDelta,
    pub(crate) index: u64,
    pub(crate) started_ns: u64,
    pub(crate) ended_ns: u64,
}

/// What a message to send says, borrowed from the tracker (nothing is
/// copied to encode it).
#[derive(Debug)]
pub(crate) enum Outgoing<'a> {
    /// A phase began at `t_ns`.
    Begin {
        kind: PhaseKind,
        name: &'a str,
        index: u64,
        depth: u32,
        t_ns: u64,
    },
    /// A phase ended with `record`; with `next`, its successor began.
    End { record: &'a Record, next: bool },
    /// Steps `first..=last` of `name` ended (`count` of them).
    Steps {
        name: &'a str,
        depth: u32,
        first: u64,
        last: u64,
        count: u64,
        started_ns: u64,
        ended_ns: u64,
        next: bool,
        releases: u64,
        truncated: bool,
        peaks: &'a [PeakOut],
    },
}

fn encode_head(buf: &mut String, head: &Head, ev: &str, kind: PhaseKind, name: &str) {
    buf.clear();
    let _ = write!(
        buf,
        r#"{{"v":{VERSION},"ev":"{ev}","pid":{},"tracker":{},"seq":{},"dropped":{},"dropped_steps":{}"#,
        head.pid, head.tracker, head.seq, head.dropped, head.dropped_steps
    );
    if let Some(r) = head.ranks {
        let _ = write!(buf, r#","rank":{},"world_size":{}"#, r.rank, r.world_size);
        if let Some(l) = r.local_rank {
            let _ = write!(buf, r#","local_rank":{l}"#);
        }
    }
    buf.push_str(",\"kind\":");
    json::string(buf, kind.as_str());
    buf.push_str(",\"name\":");
    json::string(buf, name);
}

/// Whether one more source entry could pass [`MAX_DATAGRAM`].
fn full(buf: &str) -> bool {
    buf.len() + MAX_SOURCE_ENTRY + 32 > MAX_DATAGRAM
}

/// Encodes `message` as one JSON object into `buf` (cleared first; its
/// capacity is reused, so a boundary allocates nothing once it has grown).
pub(crate) fn encode(buf: &mut String, head: &Head, message: &Outgoing<'_>) {
    match *message {
        Outgoing::Begin {
            kind,
            name,
            index,
            depth,
            t_ns,
        } => {
            encode_head(buf, head, "begin", kind, name);
            let _ = write!(buf, r#","index":{index},"depth":{depth},"t_ns":{t_ns}}}"#);
        }
        Outgoing::End { record, next } => {
            let (kind, name, index, depth) = match &record.phase {
                Some(p) => (p.kind, p.name.as_str(), p.index, p.depth),
                None => (PhaseKind::Custom, record.label.as_str(), 0, 0),
            };
            encode_head(buf, head, "end", kind, name);
            let _ = write!(
                buf,
                r#","index":{index},"depth":{depth},"started_ns":{},"ended_ns":{},"next":{next},"releases":{},"sources":["#,
                record.started_at_ns,
                record.ended_at_ns,
                record.releases.len()
            );
            let mut truncated = false;
            for (i, d) in record.sources.iter().enumerate() {
                if full(buf) {
                    truncated = true;
                    break;
                }
                if i > 0 {
                    buf.push(',');
                }
                json::source(buf, d);
            }
            let _ = write!(buf, r#"],"truncated":{truncated}}}"#);
        }
        Outgoing::Steps {
            name,
            depth,
            first,
            last,
            count,
            started_ns,
            ended_ns,
            next,
            releases,
            truncated,
            peaks,
        } => {
            encode_head(buf, head, "steps", PhaseKind::Step, name);
            let _ = write!(
                buf,
                r#","index":{first},"depth":{depth},"last":{last},"count":{count},"started_ns":{started_ns},"ended_ns":{ended_ns},"next":{next},"releases":{releases},"sources":["#,
            );
            let mut truncated = truncated;
            for (i, p) in peaks.iter().enumerate() {
                if full(buf) {
                    truncated = true;
                    break;
                }
                if i > 0 {
                    buf.push(',');
                }
                json::source(buf, &p.delta);
                buf.pop();
                let _ = write!(
                    buf,
                    r#","index":{},"started_ns":{},"ended_ns":{}}}"#,
                    p.index, p.started_ns, p.ended_ns
                );
            }
            let _ = write!(buf, r#"],"truncated":{truncated}}}"#);
        }
    }
}

// ---- What the receiver reads ----

/// One source of an ended phase's record, as its tracker measured it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRecord {
    /// The source's name.
    pub name: String,
    /// What it measures (`process`, `gpu`, ...), as the sender named it.
    pub kind: String,
    /// How exact its peak is (`exact`, `sampled`, ...), as sent.
    pub fidelity: String,
    /// Used at the phase's start, bytes.
    pub used_start: u64,
    /// Used at its end, bytes.
    pub used_end: u64,
    /// The highest use within it, bytes.
    pub peak: u64,
    /// `used_end - used_start`, bytes.
    pub delta_used: i64,
    /// How far the peak rose above the start, bytes.
    pub delta_peaked: u64,
}

/// In a batch of steps: the step with the largest peak of one source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPeak {
    /// The step's number.
    pub index: u64,
    /// When it began (`CLOCK_MONOTONIC` ns).
    pub start_ns: u64,
    /// When it ended.
    pub end_ns: u64,
    /// Its record of the source.
    pub source: SourceRecord,
}

/// A message, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The sending process (as it saw itself; a receiver that knows the
    /// kernel's view may replace it).
    pub pid: u32,
    /// The tracker's number in its process.
    pub tracker: u64,
    /// The message's number in its process.
    pub seq: u64,
    /// Messages of this process dropped before this one.
    pub dropped: u64,
    /// Steps in the dropped messages that were batches of steps.
    pub dropped_steps: u64,
    /// The sending process's ranks, when it sent them.
    pub ranks: Option<Ranks>,
    /// The phase's kind.
    pub kind: PhaseKind,
    /// The phase's name.
    pub name: String,
    /// The phase's number among its kind and name (a batch's first step).
    pub index: u64,
    /// Phases enclosing it.
    pub depth: u32,
    /// What happened.
    pub event: Event,
}

/// What happened, with its times (`CLOCK_MONOTONIC` ns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The phase began.
    Begin {
        /// When.
        t_ns: u64,
    },
    /// The phase ended.
    End {
        /// When it began.
        started_ns: u64,
        /// When it ended.
        ended_ns: u64,
        /// Whether the next one of its kind and name began at `ended_ns`.
        next: bool,
        /// Cache releases fired at its end.
        releases: u64,
        /// Its record, per source.
        sources: Vec<SourceRecord>,
        /// Whether sources were left out to fit the datagram.
        truncated: bool,
    },
    /// Steps `index..=last` ended (`count` of them), the first starting at
    /// `started_ns`, the last ending at `ended_ns`; per source, the step
    /// with the largest peak.
    Steps {
        /// The last step's number.
        last: u64,
        /// How many steps ended.
        count: u64,
        /// The first step's start.
        started_ns: u64,
        /// The last step's end.
        ended_ns: u64,
        /// Whether a step began at `ended_ns`.
        next: bool,
        /// Cache releases fired at their ends, summed.
        releases: u64,
        /// Per source, the step with the largest peak.
        peaks: Vec<BatchPeak>,
        /// Whether sources were left out to fit the datagram.
        truncated: bool,
    },
}

/// Why a datagram was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// Not a message: not JSON, missing or malformed fields.
    Garbled,
    /// Longer than any message (the receiver's verdict: it saw the
    /// datagram cut).
    Oversized,
    /// A message of another version.
    Version,
}

/// Whether `s` can be a phase's or a source's name.
#[cfg(any(test, feature = "run-channel-decode"))]
fn name_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME && !s.chars().any(char::is_control)
}

#[cfg(any(test, feature = "run-channel-decode"))]
mod wire {
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub(super) struct Versioned {
        pub(super) v: u32,
    }

    #[derive(Deserialize)]
    pub(super) struct Wire {
        pub(super) ev: String,
        pub(super) pid: u32,
        pub(super) tracker: u64,
        pub(super) seq: u64,
        #[serde(default)]
        pub(super) dropped: u64,
        #[serde(default)]
        pub(super) dropped_steps: u64,
        pub(super) rank: Option<u32>,
        pub(super) local_rank: Option<u32>,
        pub(super) world_size: Option<u32>,
        pub(super) kind: String,
        pub(super) name: String,
        pub(super) index: u64,
        pub(super) depth: u32,
        pub(super) t_ns: Option<u64>,
        pub(super) last: Option<u64>,
        pub(super) count: Option<u64>,
        pub(super) started_ns: Option<u64>,
        pub(super) ended_ns: Option<u64>,
        #[serde(default)]
        pub(super) next: bool,
        #[serde(default)]
        pub(super) releases: u64,
        #[serde(default)]
        pub(super) sources: Vec<WireSource>,
        #[serde(default)]
        pub(super) truncated: bool,
    }

    #[derive(Deserialize)]
    pub(super) struct WireSource {
        pub(super) name: String,
        pub(super) kind: String,
        pub(super) fidelity: String,
        pub(super) used_start: u64,
        pub(super) used_end: u64,
        pub(super) peak: u64,
        pub(super) delta_used: i64,
        pub(super) delta_peaked: u64,
        /// In a `steps` message: the step that held the peak.
        pub(super) index: Option<u64>,
        pub(super) started_ns: Option<u64>,
        pub(super) ended_ns: Option<u64>,
    }
}

/// Decodes one datagram, checking what a tracker could have sent: anything
/// else (not JSON, missing or malformed fields, names longer than a
/// tracker allows, times out of order, ranks that are not a process's) is
/// [`Unreadable::Garbled`], another
/// version [`Unreadable::Version`]. Never panics.
#[cfg(any(test, feature = "run-channel-decode"))]
pub fn decode(bytes: &[u8]) -> Result<Message, Unreadable> {
    use wire::{Versioned, Wire};
    let v: Versioned = serde_json::from_slice(bytes).map_err(|_| Unreadable::Garbled)?;
    if v.v != VERSION {
        return Err(Unreadable::Version);
    }
    let w: Wire = serde_json::from_slice(bytes).map_err(|_| Unreadable::Garbled)?;
    let kind = PhaseKind::from_name(&w.kind).ok_or(Unreadable::Garbled)?;
    let short = |s: &str| {
        (s.len() <= MAX_NAME)
            .then_some(())
            .ok_or(Unreadable::Garbled)
    };
    if !name_ok(&w.name) || w.sources.len() > MAX_SOURCES {
        return Err(Unreadable::Garbled);
    }
    let ranks = match (w.rank, w.local_rank, w.world_size) {
        (None, None, None) => None,
        (Some(rank), local_rank, Some(world_size)) => Some(Ranks {
            rank,
            local_rank,
            world_size,
        })
        .filter(Ranks::valid)
        .map(Some)
        .ok_or(Unreadable::Garbled)?,
        _ => return Err(Unreadable::Garbled),
    };
    let mut sources = Vec::with_capacity(w.sources.len());
    let mut steps = Vec::new();
    for s in w.sources {
        if !name_ok(&s.name) {
            return Err(Unreadable::Garbled);
        }
        short(&s.kind)?;
        short(&s.fidelity)?;
        let at = match (s.index, s.started_ns, s.ended_ns) {
            (Some(i), Some(a), Some(b)) if a <= b => Some((i, a, b)),
            (None, None, None) => None,
            _ => return Err(Unreadable::Garbled),
        };
        let record = SourceRecord {
            name: s.name,
            kind: s.kind,
            fidelity: s.fidelity,
            used_start: s.used_start,
            used_end: s.used_end,
            peak: s.peak,
            delta_used: s.delta_used,
            delta_peaked: s.delta_peaked,
        };
        match at {
            Some((index, start, end)) => steps.push(BatchPeak {
                index,
                start_ns: start,
                end_ns: end,
                source: record,
            }),
            None => sources.push(record),
        }
    }
    let event = match (w.ev.as_str(), w.t_ns, w.started_ns, w.ended_ns) {
        ("begin", Some(t_ns), _, _) => Event::Begin { t_ns },
        ("end", _, Some(started_ns), Some(ended_ns))
            if ended_ns >= started_ns && steps.is_empty() =>
        {
            Event::End {
                started_ns,
                ended_ns,
                next: w.next,
                releases: w.releases,
                sources,
                truncated: w.truncated,
            }
        }
        ("steps", _, Some(started_ns), Some(ended_ns))
            if ended_ns >= started_ns
                && kind == PhaseKind::Step
                && sources.is_empty()
                && w.count.is_some_and(|c| c > 0)
                && w.last.is_some_and(|l| l >= w.index)
                && steps
                    .iter()
                    .all(|p| (w.index..=w.last.unwrap_or(0)).contains(&p.index)) =>
        {
            Event::Steps {
                last: w.last.unwrap_or(w.index),
                count: w.count.unwrap_or(1),
                started_ns,
                ended_ns,
                next: w.next,
                releases: w.releases,
                peaks: steps,
                truncated: w.truncated,
            }
        }
        _ => return Err(Unreadable::Garbled),
    };
    Ok(Message {
        pid: w.pid,
        tracker: w.tracker,
        seq: w.seq,
        dropped: w.dropped,
        dropped_steps: w.dropped_steps,
        ranks,
        kind,
        name: w.name,
        index: w.index,
        depth: w.depth,
        event,
    })
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
pub(crate) mod tests;
