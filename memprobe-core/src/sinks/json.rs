//! Minimal JSON writing for records (no dependency needed for this shape).

use crate::delta::SourceDelta;
use crate::record::Record;
use crate::release::{ReleaseEvent, ReleaseReason};
use std::fmt::Write;

pub(crate) fn string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

pub(crate) fn list<T>(out: &mut String, items: &[T], mut f: impl FnMut(&mut String, &T)) {
    out.push('[');
    for (i, it) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        f(out, it);
    }
    out.push(']');
}

pub(crate) fn source(out: &mut String, d: &SourceDelta) {
    out.push_str("{\"name\":");
    string(out, &d.name);
    let _ = write!(
        out,
        ",\"kind\":\"{}\",\"fidelity\":\"{}\",\"used_start\":{},\"used_end\":{},\"peak\":{},\"delta_used\":{},\"delta_peaked\":{}}}",
        d.kind.as_str(),
        d.fidelity.as_str(),
        d.used_start,
        d.used_end,
        d.peak,
        d.delta_used,
        d.delta_peaked
    );
}

pub(crate) fn reason(r: ReleaseReason) -> &'static str {
    match r {
        ReleaseReason::Periodic => "periodic",
        ReleaseReason::LowMemory => "low_memory",
        ReleaseReason::OutOfMemory => "out_of_memory",
        ReleaseReason::Manual => "manual",
    }
}

fn release(out: &mut String, e: &ReleaseEvent) {
    let _ = write!(out, "{{\"reason\":\"{}\",\"ran\":", reason(e.reason));
    list(out, &e.ran, |o, s| string(o, s));
    out.push_str(",\"errors\":");
    list(out, &e.errors, |o, (n, m)| {
        o.push_str("{\"callback\":");
        string(o, n);
        o.push_str(",\"message\":");
        string(o, m);
        o.push('}');
    });
    for (key, v) in [
        ("before", &e.before),
        ("after", &e.after),
        ("freed", &e.freed()),
    ] {
        let _ = write!(out, ",\"{key}\":");
        list(out, v, |o, n| {
            let _ = write!(o, "{n}");
        });
    }
    out.push('}');
}

/// One record as a JSON object (no trailing newline).
pub(crate) fn record(r: &Record) -> String {
    let mut out = String::with_capacity(256);
    out.push_str("{\"label\":");
    string(&mut out, &r.label);
    match &r.phase {
        Some(p) => {
            let _ = write!(
                out,
                ",\"phase\":{{\"kind\":\"{}\",\"name\":",
                p.kind.as_str()
            );
            string(&mut out, &p.name);
            let _ = write!(out, ",\"index\":{},\"depth\":{}}}", p.index, p.depth);
        }
        None => out.push_str(",\"phase\":null"),
    }
    let _ = write!(
        out,
        ",\"started_at_ns\":{},\"ended_at_ns\":{},\"duration_ns\":{},\"sources\":",
        r.started_at_ns,
        r.ended_at_ns,
        r.duration_ns()
    );
    list(&mut out, &r.sources, source);
    out.push_str(",\"leaks\":");
    list(&mut out, &r.leaks, |o, l| {
        let _ = write!(
            o,
            "{{\"flagged\":{},\"streak\":{},\"last_growth\":{}}}",
            l.flagged, l.streak, l.last_growth
        );
    });
    out.push_str(",\"releases\":");
    list(&mut out, &r.releases, release);
    out.push('}');
    out
}
