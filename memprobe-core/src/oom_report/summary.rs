//! The report for people: a few lines; sizes, durations and dates in the
//! workspace's one text for each ([`crate::units`]).

use super::{OomHeldBasis, OomLocation, OutOfMemoryReport};
use crate::delta::SourceDelta;
use crate::units::{bytes, secs_ns, utc};
use std::fmt::Write as _;

/// The summary of `r`.
impl OutOfMemoryReport {
    /// The report for people: a few lines, sizes in KiB / MiB / GiB.
    pub fn summary(&self) -> String {
        text(self)
    }
}

fn text(r: &OutOfMemoryReport) -> String {
    let mut s = String::with_capacity(2048);
    let f = &r.failed;
    let _ = writeln!(
        s,
        "memprobe: out-of-memory report (pid {}, {} UTC)",
        r.pid,
        utc(f.at_unix_ns)
    );
    let place = match f.location {
        OomLocation::Device(d) => format!("GPU {d}"),
        OomLocation::HostPinned => "pinned host memory".to_owned(),
        OomLocation::Unknown => "an unknown device".to_owned(),
    };
    let asked = f
        .requested_bytes
        .map_or_else(|| "an unknown size".to_owned(), bytes);
    let _ = write!(
        s,
        "  failed: {} asked {asked} on {place} ({} trigger)",
        f.reported_by,
        f.trigger.as_str()
    );
    if let Some(free) = f.device_free_bytes {
        let _ = write!(s, "; {} free", bytes(free));
        if let Some(t) = f.device_total_bytes {
            let _ = write!(s, " of {}", bytes(t));
        }
    }
    s.push('\n');
    if let Some(d) = &f.detail {
        let _ = writeln!(s, "  detail: {}", one_line(d, 200));
    }
    match &r.open_phases {
        Ok(ps) if ps.is_empty() => s.push_str("  open phases: none\n"),
        Ok(ps) => {
            s.push_str("  open phases (outermost first):\n");
            for p in ps {
                let _ = write!(
                    s,
                    "    {:<12} for {:>8}:",
                    format!("{} #{}", p.name, p.index),
                    secs_ns(r.written_at_ns.saturating_sub(p.started_at_ns))
                );
                for (i, src) in p.sources.iter().enumerate() {
                    let sep = if i == 0 { " " } else { "; " };
                    match (src.peak, src.used_now) {
                        (Some(peak), Some(now)) => {
                            let _ = write!(
                                s,
                                "{sep}{} peak {} (start {}, now {})",
                                src.name,
                                bytes(peak),
                                bytes(src.used_start),
                                bytes(now)
                            );
                        }
                        _ => {
                            let _ = write!(
                                s,
                                "{sep}{} unknown ({})",
                                src.name,
                                src.error.as_deref().unwrap_or("not read")
                            );
                        }
                    }
                }
                s.push('\n');
            }
        }
        Err(why) => {
            let _ = writeln!(s, "  open phases: unknown ({why})");
        }
    }
    if r.ended_phases.is_empty() {
        s.push_str("  ended phases: none yet\n");
    } else {
        let _ = writeln!(
            s,
            "  last {} ended phases (of {}):",
            r.ended_phases.len(),
            r.ended_total
        );
        for rec in &r.ended_phases {
            let name = rec
                .phase
                .as_ref()
                .map_or_else(|| rec.label.clone(), |p| format!("{} #{}", p.name, p.index));
            let _ = write!(s, "    {name:<12} {:>8}:", secs_ns(rec.duration_ns()));
            for (i, d) in rec.sources.iter().enumerate() {
                let sep = if i == 0 { " " } else { "; " };
                let _ = write!(s, "{sep}{} peak {}", d.name, bytes(d.peak));
                s.push_str(&delta_note(d));
            }
            s.push('\n');
        }
    }
    match &r.gpus {
        Ok(ds) if ds.is_empty() => s.push_str("  GPUs: none visible\n"),
        Ok(ds) => {
            s.push_str("  GPUs:\n");
            for d in ds {
                let name = d.name.as_deref().unwrap_or("unnamed");
                match &d.memory {
                    Ok(m) => {
                        let _ = writeln!(
                            s,
                            "    GPU {} ({name}): {} used of {}, {} free",
                            d.id,
                            bytes(m.used_bytes),
                            bytes(m.total_bytes),
                            bytes(m.free_bytes)
                        );
                    }
                    Err(e) => {
                        let _ = writeln!(s, "    GPU {} ({name}): memory unknown ({e})", d.id);
                    }
                }
                match &d.processes {
                    Ok(ps) if ps.is_empty() => s.push_str("      no process listed\n"),
                    Ok(ps) => {
                        for p in ps {
                            let _ = writeln!(
                                s,
                                "      pid {}{}: {}",
                                p.pid,
                                if p.this_process {
                                    " (this process)"
                                } else {
                                    ""
                                },
                                p.used_bytes.map_or_else(|| "unknown".to_owned(), bytes)
                            );
                        }
                    }
                    Err(e) => {
                        let _ = writeln!(s, "      processes unknown ({e})");
                    }
                }
            }
        }
        Err(why) => {
            let _ = writeln!(s, "  GPUs: unavailable ({why})");
        }
    }
    if let Err(why) = &r.driver_counts {
        let _ = writeln!(s, "  driver counts: unavailable ({why})");
    }
    held_line(&mut s, r);
    live_lines(&mut s, r);
    for c in r.caches() {
        let releasable = c
            .releasable_bytes
            .map_or_else(|| "unknown".to_owned(), bytes);
        let _ = write!(s, "  releasing caches on GPU {}: {releasable}", c.device);
        if c.releasable_bytes.is_none() {
            let _ = write!(s, " ({})", c.basis);
        } else if let Some(fw) = &c.framework {
            let _ = write!(s, " ({fw})");
        }
        if let Some(h) = c.driver_held_bytes {
            let _ = write!(s, "; this process holds {} through the driver", bytes(h));
        }
        s.push('\n');
    }
    if r.later_count > 0 {
        let _ = writeln!(
            s,
            "  {} later out-of-memory failures were counted, not reported",
            r.later_count
        );
    }
    s
}

/// The framework's largest live blocks at the failure and its
/// fragmentation by segment, when it gave its table.
fn live_lines(s: &mut String, r: &OutOfMemoryReport) {
    let l = match &r.failed.live_blocks {
        None => return,
        Some(Err(why)) => {
            let _ = writeln!(s, "  live blocks: left out ({why})");
            return;
        }
        Some(Ok(l)) => l,
    };
    let _ = write!(s, "  live blocks ({} listed", l.block_count);
    if let Some(asked) = l.requested_bytes {
        let _ = write!(s, "; {} asked", bytes(asked));
    }
    s.push_str("):\n");
    for b in &l.top {
        let _ = writeln!(
            s,
            "    {:>10} {}",
            bytes(b.bytes),
            b.site.as_deref().unwrap_or("no frame")
        );
    }
    if let Some(f) = l.fragmentation {
        let _ = writeln!(
            s,
            "  fragmentation: {} reserved in {} segments, {} allocated, {} free \
             (reserved - allocated); at most {} free in one segment",
            bytes(f.reserved_bytes),
            f.segments,
            bytes(f.allocated_bytes),
            bytes(f.reserved_bytes - f.allocated_bytes),
            bytes(f.largest_free_bytes)
        );
    }
}

/// Origins named in the summary's line; the rest are summed.
const TOP_ORIGINS: usize = 5;

/// `  held on GPU 0 when it failed: 1.00 GiB: NCCL 600 MiB, ...; CUDA
/// context and unseen ...`: the origins, same names summed, largest first.
fn held_line(s: &mut String, r: &OutOfMemoryReport) {
    let h = match &r.held_by_origin {
        Ok(h) => h,
        Err(why) => {
            let _ = writeln!(s, "  held by origin: unknown ({why})");
            return;
        }
    };
    let place = match h.location {
        OomLocation::Device(d) => format!("GPU {d}"),
        OomLocation::HostPinned => "pinned host memory".to_owned(),
        OomLocation::Unknown => "an unknown device".to_owned(),
    };
    let when = match h.basis {
        OomHeldBasis::AtFailure => "when it failed",
        OomHeldBasis::AtReport => "at the report",
    };
    let mut named: Vec<(&str, u64)> = Vec::new();
    for o in &h.by_origin {
        match named.iter_mut().find(|(n, _)| *n == o.name) {
            Some(e) => e.1 += o.bytes,
            None => named.push((&o.name, o.bytes)),
        }
    }
    named.sort_by_key(|n| std::cmp::Reverse(n.1));
    let mut parts: Vec<String> = named
        .iter()
        .take(TOP_ORIGINS)
        .map(|(n, b)| format!("{n} {}", bytes(*b)))
        .collect();
    if named.len() > TOP_ORIGINS {
        let rest: u64 = named[TOP_ORIGINS..].iter().map(|n| n.1).sum();
        parts.push(format!(
            "{} more {}",
            named.len() - TOP_ORIGINS,
            bytes(rest)
        ));
    }
    let _ = write!(
        s,
        "  held on {place} {when}: {}: {}",
        bytes(h.held_bytes),
        if parts.is_empty() {
            "nothing counted".to_owned()
        } else {
            parts.join(", ")
        }
    );
    if let OomLocation::Device(_) = h.location {
        match r.context_and_unseen() {
            Ok(c) => {
                let _ = write!(
                    s,
                    "; CUDA context and unseen {} (NVML minus counted)",
                    bytes(c)
                );
            }
            Err(why) => {
                let _ = write!(s, "; CUDA context and unseen unknown ({why})");
            }
        }
    }
    s.push('\n');
    for p in h.by_stack.iter().take(TOP_STACKS) {
        let _ = writeln!(s, "    {} {}", bytes(p.bytes), p.frames.join(" < "));
    }
    if h.by_stack.len() > TOP_STACKS {
        let rest = &h.by_stack[TOP_STACKS..];
        let _ = writeln!(
            s,
            "    {} in {} more paths",
            bytes(rest.iter().map(|p| p.bytes).sum()),
            rest.len()
        );
    }
}

/// Call paths named under the line of origins; the rest are summed.
const TOP_STACKS: usize = 3;

fn delta_note(d: &SourceDelta) -> String {
    let sign = if d.delta_used < 0 { "-" } else { "+" };
    format!(
        " (used {sign}{}, peaked {})",
        bytes(d.delta_used.unsigned_abs()),
        bytes(d.delta_peaked)
    )
}

fn one_line(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect();
    if s.chars().count() > max {
        out.push_str("...");
    }
    out
}
