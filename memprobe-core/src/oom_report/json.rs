//! The report as one JSON document (`docs/oom-report.schema.json`),
//! written by hand: the core has no serialization dependency.

use super::{
    FailedAllocation, OomGpuDevice, OomProcessList, OpenPhase, OutOfMemoryReport, FORMAT,
    FORMAT_VERSION,
};
use crate::sinks::json;
use std::fmt::Write as _;

/// The report as one JSON document.
impl OutOfMemoryReport {
    /// The report as one JSON document (`docs/oom-report.schema.json`).
    pub fn to_json(&self) -> String {
        document(self)
    }
}

fn document(r: &OutOfMemoryReport) -> String {
    let mut out = String::with_capacity(4096);
    let _ = write!(
        out,
        "{{\"format\":\"{FORMAT}\",\"version\":{FORMAT_VERSION},\"pid\":{},\"written_at_unix_ns\":{},\"written_at_monotonic_ns\":{}",
        r.pid, r.written_at_unix_ns, r.written_at_ns
    );
    key(&mut out, false, "failed_allocation");
    failed_json(&mut out, &r.failed);
    key(&mut out, false, "sources");
    json::list(&mut out, &r.sources, |o, s| {
        o.push_str("{\"name\":");
        json::string(o, &s.name);
        let _ = write!(
            o,
            ",\"kind\":\"{}\",\"fidelity\":\"{}\"}}",
            s.kind.as_str(),
            s.fidelity.as_str()
        );
    });
    section_head(
        &mut out,
        "open_phases",
        r.open_phases.as_ref().err().map(String::as_str),
    );
    key(&mut out, false, "phases");
    let now = r.written_at_ns;
    match &r.open_phases {
        Ok(ps) => json::list(&mut out, ps, |o, p| open_json(o, p, now)),
        Err(_) => out.push_str("[]"),
    }
    out.push('}');
    let _ = write!(
        out,
        ",\"ended_phases\":{{\"kept\":{},\"ended_total\":{},\"phases\":",
        r.keep_ended, r.ended_total
    );
    json::list(&mut out, &r.ended_phases, |o, rec| {
        o.push_str(&json::record(rec))
    });
    out.push('}');
    section_head(&mut out, "gpus", r.gpus.as_ref().err().map(String::as_str));
    key(&mut out, false, "devices");
    match &r.gpus {
        Ok(ds) => json::list(&mut out, ds, device_json),
        Err(_) => out.push_str("[]"),
    }
    out.push('}');
    section_head(
        &mut out,
        "driver_counts",
        r.driver_counts.as_ref().err().map(String::as_str),
    );
    let counts = r.driver_counts.as_ref().ok();
    key(&mut out, false, "devices");
    match counts {
        Some(c) => json::list(&mut out, &c.devices, |o, d| {
            let _ = write!(
                o,
                "{{\"device\":{},\"held_bytes\":{},\"lifetime_peak_bytes\":{},\"oom_failures\":{}}}",
                d.device, d.held_bytes, d.lifetime_peak_bytes, d.oom_failures
            );
        }),
        None => out.push_str("[]"),
    }
    key(&mut out, false, "host_pinned_bytes");
    opt_u64(&mut out, counts.map(|c| c.host_pinned_bytes));
    key(&mut out, false, "not_counted_calls");
    opt_u64(&mut out, counts.map(|c| c.not_counted_calls));
    key(&mut out, false, "not_counted_bytes");
    opt_u64(&mut out, counts.map(|c| c.not_counted_bytes));
    out.push('}');
    held_json(&mut out, r);
    let live = r.failed.live_blocks.as_ref();
    key(&mut out, false, "live_blocks");
    match live {
        Some(Ok(l)) => out.push_str(&l.json),
        _ => out.push_str("null"),
    }
    key(&mut out, false, "live_blocks_error");
    opt_str(
        &mut out,
        live.and_then(|l| l.as_ref().err()).map(String::as_str),
    );
    key(&mut out, false, "caches");
    json::list(&mut out, &r.caches(), |o, c| {
        let _ = write!(o, "{{\"device\":{}", c.device);
        key(o, false, "framework");
        opt_str(o, c.framework.as_deref());
        key(o, false, "reserved_bytes");
        opt_u64(o, c.reserved_bytes);
        key(o, false, "allocated_bytes");
        opt_u64(o, c.allocated_bytes);
        key(o, false, "releasable_bytes");
        opt_u64(o, c.releasable_bytes);
        key(o, false, "driver_held_bytes");
        opt_u64(o, c.driver_held_bytes);
        key(o, false, "basis");
        json::string(o, &c.basis);
        o.push('}');
    });
    let _ = write!(
        out,
        ",\"reports_before\":{},\"later_triggers\":{{\"count\":{},\"last\":",
        r.reports_before, r.later_count
    );
    match &r.later_last {
        Some(f) => failed_json(&mut out, f),
        None => out.push_str("null"),
    }
    out.push_str("}}");
    out
}

/// `held_by_origin`: always the same keys, `null` where unknown.
fn held_json(out: &mut String, r: &OutOfMemoryReport) {
    section_head(
        out,
        "held_by_origin",
        r.held_by_origin.as_ref().err().map(String::as_str),
    );
    let h = r.held_by_origin.as_ref().ok();
    key(out, false, "basis");
    opt_str(out, h.map(|h| h.basis.as_str()));
    key(out, false, "location");
    opt_str(out, h.map(|h| h.location.as_str()));
    key(out, false, "device");
    opt_u64(out, h.and_then(|h| h.location.device()).map(u64::from));
    key(out, false, "at_monotonic_ns");
    opt_u64(out, h.map(|h| h.at_ns));
    key(out, false, "held_bytes");
    opt_u64(out, h.map(|h| h.held_bytes));
    key(out, false, "origins");
    match h {
        Some(h) => json::list(out, &h.by_origin, |o, b| {
            o.push_str("{\"name\":");
            json::string(o, &b.name);
            key(o, false, "library");
            json::string(o, &b.library);
            key(o, false, "symbol");
            opt_str(o, b.symbol.as_deref());
            let _ = write!(o, ",\"program\":{},\"bytes\":{}}}", b.program, b.bytes);
        }),
        None => out.push_str("[]"),
    }
    key(out, false, "stacks");
    match h {
        Some(h) => json::list(out, &h.by_stack, |o, b| {
            o.push_str("{\"frames\":");
            json::list(o, &b.frames, |o, f| json::string(o, f));
            let _ = write!(o, ",\"bytes\":{}}}", b.bytes);
        }),
        None => out.push_str("[]"),
    }
    let context = r.context_and_unseen();
    key(out, false, "context_and_unseen_bytes");
    opt_u64(out, context.as_ref().ok().copied());
    key(out, false, "context_and_unseen_reason");
    opt_str(out, context.as_ref().err().map(String::as_str));
    out.push('}');
}

fn opt_u64(out: &mut String, v: Option<u64>) {
    match v {
        Some(n) => {
            let _ = write!(out, "{n}");
        }
        None => out.push_str("null"),
    }
}

fn opt_str(out: &mut String, v: Option<&str>) {
    match v {
        Some(s) => json::string(out, s),
        None => out.push_str("null"),
    }
}

fn key(out: &mut String, first: bool, k: &str) {
    if !first {
        out.push(',');
    }
    out.push('"');
    out.push_str(k);
    out.push_str("\":");
}

fn failed_json(out: &mut String, f: &FailedAllocation) {
    out.push('{');
    key(out, true, "trigger");
    json::string(out, f.trigger.as_str());
    key(out, false, "location");
    json::string(out, f.location.as_str());
    key(out, false, "device");
    opt_u64(out, f.location.device().map(u64::from));
    key(out, false, "requested_bytes");
    opt_u64(out, f.requested_bytes);
    key(out, false, "reported_by");
    json::string(out, &f.reported_by);
    key(out, false, "detail");
    opt_str(out, f.detail.as_deref());
    let _ = write!(
        out,
        ",\"at_monotonic_ns\":{},\"at_unix_ns\":{}",
        f.at_ns, f.at_unix_ns
    );
    key(out, false, "device_total_bytes");
    opt_u64(out, f.device_total_bytes);
    key(out, false, "device_free_bytes");
    opt_u64(out, f.device_free_bytes);
    key(out, false, "driver_oom_failures");
    opt_u64(out, f.driver_oom_failures);
    out.push('}');
}

fn section_head(out: &mut String, name: &str, reason: Option<&str>) {
    let _ = write!(out, ",\"{name}\":{{\"available\":{}", reason.is_none());
    key(out, false, "reason");
    opt_str(out, reason);
}

fn open_json(out: &mut String, p: &OpenPhase, now: u64) {
    out.push_str("{\"kind\":");
    json::string(out, p.kind.as_str());
    out.push_str(",\"name\":");
    json::string(out, &p.name);
    let _ = write!(
        out,
        ",\"index\":{},\"depth\":{},\"started_at_ns\":{},\"running_ns\":{},\"sources\":",
        p.index,
        p.depth,
        p.started_at_ns,
        now.saturating_sub(p.started_at_ns)
    );
    json::list(out, &p.sources, |o, s| {
        o.push_str("{\"name\":");
        json::string(o, &s.name);
        let _ = write!(
            o,
            ",\"kind\":\"{}\",\"fidelity\":\"{}\",\"used_start\":{}",
            s.kind.as_str(),
            s.fidelity.as_str(),
            s.used_start
        );
        key(o, false, "used_now");
        opt_u64(o, s.used_now);
        key(o, false, "peak");
        opt_u64(o, s.peak);
        key(o, false, "error");
        opt_str(o, s.error.as_deref());
        o.push('}');
    });
    out.push('}');
}

fn device_json(out: &mut String, d: &OomGpuDevice) {
    let _ = write!(out, "{{\"id\":{}", d.id);
    key(out, false, "name");
    opt_str(out, d.name.as_deref());
    key(out, false, "uuid");
    opt_str(out, d.uuid.as_deref());
    let (mem, mem_err) = match &d.memory {
        Ok(m) => (Some(*m), None),
        Err(e) => (None, Some(e.as_str())),
    };
    key(out, false, "total_bytes");
    opt_u64(out, mem.map(|m| m.total_bytes));
    key(out, false, "free_bytes");
    opt_u64(out, mem.map(|m| m.free_bytes));
    key(out, false, "used_bytes");
    opt_u64(out, mem.map(|m| m.used_bytes));
    key(out, false, "memory_error");
    opt_str(out, mem_err);
    key(out, false, "processes");
    match &d.processes {
        Ok(ps) => json::list(out, ps, |o, p| {
            let _ = write!(o, "{{\"pid\":{},\"used_bytes\":", p.pid);
            opt_u64(o, p.used_bytes);
            let _ = write!(
                o,
                ",\"list\":\"{}\",\"this_process\":{}}}",
                match p.list {
                    OomProcessList::Compute => "compute",
                    OomProcessList::Graphics => "graphics",
                },
                p.this_process
            );
        }),
        Err(_) => out.push_str("[]"),
    }
    key(out, false, "processes_error");
    opt_str(out, d.processes.as_ref().err().map(String::as_str));
    out.push('}');
}
