//! PyTorch's epoch peaks on the chart: for each `epoch_peak` attribution
//! record, a marker at the time of the epoch's peak step (found from the
//! phase reports: the epoch phase with the record's index and rank, and in
//! it the peak step with the record's step index) and a short label with
//! the step's largest block. A record whose step's time is not known is
//! not drawn, only counted: a marker at a guessed time would mislead.

use super::super::report::RunReport;
use super::super::torch_attribution::{place, TorchRecord};
use crate::units;

/// Epoch peaks labelled at most (the highest); the rest are counted in
/// the footer.
pub(super) const MAX_TORCH_MARKS: usize = 12;
/// A label's length at most, in characters (a long path or function name
/// would run across the chart).
pub(super) const LABEL_CHARS: usize = 72;

/// One epoch peak to draw.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct TorchMark {
    /// The middle of the peak step.
    pub(super) t_s: f64,
    pub(super) bytes: u64,
    pub(super) text: String,
}

/// The epoch peaks to draw, and those left out.
#[derive(Debug, Default, PartialEq)]
pub(super) struct TorchMarks {
    /// Highest peak first, at most [`MAX_TORCH_MARKS`].
    pub(super) marks: Vec<TorchMark>,
    /// Placed, but past the bound.
    pub(super) unlabelled: usize,
    /// The step's time unknown (or ambiguous): not drawn.
    pub(super) untimed: usize,
}

/// The span of the record's step, when the phase reports tell it, and
/// tell it once: two processes' epochs that no rank tells apart, with
/// different spans, give none.
fn step_span(r: &RunReport, t: &TorchRecord) -> Option<(f64, f64)> {
    let (epoch, step) = (t.epoch?, t.step?);
    let mut spans = r
        .phases
        .iter()
        .filter(|p| {
            p.kind == "epoch"
                && p.index == epoch
                && p.ranks.map_or(true, |k| u64::from(k.rank) == t.rank)
        })
        .flat_map(|p| p.steps.peaks.iter().filter(|s| s.index == step))
        .map(|s| (s.start_s, s.end_s));
    let first = spans.next()?;
    spans.all(|s| s == first).then_some(first)
}

/// `epoch E peak, step S: 1.00 GiB train.py:42 forward (+N)`, at most
/// [`LABEL_CHARS`] characters.
fn text(t: &TorchRecord, ranks: bool) -> String {
    let rank = if ranks {
        format!(" rank {}", t.rank)
    } else {
        String::new()
    };
    let num = |v: Option<u64>| v.map_or_else(|| "?".into(), |v| v.to_string());
    let head = format!("epoch {}{rank} peak, step {}", num(t.epoch), num(t.step));
    let top = if !t.history.complete {
        format!(
            "{}, blocks unknown",
            t.peak_bytes.map_or_else(|| "?".into(), units::bytes)
        )
    } else {
        match t.blocks.first() {
            Some(b) => {
                let more = (t.blocks.len() as u64 - 1) + t.rest.blocks.unwrap_or(0);
                let more = if more > 0 {
                    format!(" (+{more})")
                } else {
                    String::new()
                };
                format!("{} {}{more}", units::bytes(b.bytes), place(b))
            }
            None => "no live blocks".into(),
        }
    };
    trim(&format!("{head}: {top}"), LABEL_CHARS)
}

/// `s` cut to `max` characters, the cut marked.
fn trim(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// The epoch peaks of `r` to draw: highest first, bounded.
pub(super) fn torch_marks(r: &RunReport) -> TorchMarks {
    let epochs: Vec<&TorchRecord> = r
        .torch_attribution
        .iter()
        .filter(|t| t.kind == "epoch_peak")
        .collect();
    let ranks = epochs.iter().any(|t| t.rank > 0);
    let mut out = TorchMarks::default();
    for t in epochs {
        match step_span(r, t) {
            Some((a, b)) => out.marks.push(TorchMark {
                t_s: (a + b) / 2.0,
                bytes: t.peak_bytes.unwrap_or(0),
                text: text(t, ranks),
            }),
            None => out.untimed += 1,
        }
    }
    // Highest first; equal peaks in time order, so the choice is stable.
    out.marks
        .sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.t_s.total_cmp(&b.t_s)));
    out.unlabelled = out.marks.len().saturating_sub(MAX_TORCH_MARKS);
    out.marks.truncate(MAX_TORCH_MARKS);
    out
}

/// The footer's words for the epoch peaks not drawn, if any.
pub(super) fn footer(m: &TorchMarks) -> Option<String> {
    let mut parts = Vec::new();
    if m.unlabelled > 0 {
        parts.push(format!(
            "{} more torch epoch {} not marked (the {} highest are)",
            m.unlabelled,
            if m.unlabelled == 1 { "peak" } else { "peaks" },
            MAX_TORCH_MARKS
        ));
    }
    if m.untimed > 0 {
        parts.push(format!(
            "{} torch epoch {} not drawn (its step's time unknown)",
            m.untimed,
            if m.untimed == 1 { "peak" } else { "peaks" }
        ));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}
