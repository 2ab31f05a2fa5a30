//! The summary's lines about the command's phases: a count line, the
//! table of phases (long ones cut to the first, the last and the largest),
//! where each source peaked, the ranks compared, and what was lost. Read
//! from the run's report (`phase_report.rs` builds its phase parts).

use super::RunReport;
use crate::columns;
use crate::commands::run::phase_report::PhaseReport;
use crate::commands::run::ranks;
use crate::units::{self, plural};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// A summary table longer than this shows the first and last phases and
/// those with the largest peaks, and says how many it left out.
pub(crate) const MAX_ROWS: usize = 24;
const HEAD_ROWS: usize = 5;
const TAIL_ROWS: usize = 5;
const LARGEST_ROWS: usize = 6;
/// The child's own sources shown as columns (the JSON has them all).
const SOURCE_COLUMNS: usize = 2;
/// GPUs shown as columns.
const GPU_COLUMNS: usize = 4;

/// Which rows a long table shows: the first and last phases and the
/// [`LARGEST_ROWS`] with the largest `key` in between, in order; `None`
/// marks a run of rows left out (a gap of one row is shown instead).
fn pick_rows(keys: &[u64]) -> Vec<Option<usize>> {
    let n = keys.len();
    if n <= MAX_ROWS {
        return (0..n).map(Some).collect();
    }
    let mut chosen: BTreeSet<usize> = (0..HEAD_ROWS).chain(n - TAIL_ROWS..n).collect();
    let mut middle: Vec<usize> = (HEAD_ROWS..n - TAIL_ROWS).collect();
    middle.sort_by_key(|&i| (std::cmp::Reverse(keys[i]), i));
    chosen.extend(middle.into_iter().take(LARGEST_ROWS));
    let mut rows = Vec::new();
    let mut last: Option<usize> = None;
    for i in chosen {
        let from = last.map_or(0, |l| l + 1);
        match i - from {
            0 => {}
            1 => rows.push(Some(from)),
            _ => rows.push(None),
        }
        rows.push(Some(i));
        last = Some(i);
    }
    rows
}

/// The summary's lines about phases: a count line, the table, where each
/// source peaked, and what was lost; empty when the program sent nothing.
pub(crate) fn summary(r: &RunReport) -> String {
    let c = &r.phase_channel;
    let mut out = String::new();
    if c.received == 0 && c.garbled + c.oversized + c.unknown_version == 0 {
        return out;
    }
    let row = |out: &mut String, label: &str, text: String| {
        let _ = writeln!(out, "  {label:<22}{text}");
    };
    let count = |kind: &str| r.phases.iter().filter(|p| p.kind == kind).count() as u64;
    let mut parts = Vec::new();
    for (kind, one, many) in [
        ("stream", "stream", "streams"),
        ("experience", "experience", "experiences"),
        ("epoch", "epoch", "epochs"),
        ("custom", "custom phase", "custom phases"),
    ] {
        let n = count(kind);
        if n > 0 {
            parts.push(plural(n, one, many));
        }
    }
    if c.steps > 0 {
        parts.push(plural(c.steps, "step", "steps"));
    }
    if parts.is_empty() {
        parts.push("no phase ended".into());
    }
    let from = if c.ranks.is_empty() {
        let pids: Vec<String> = c.processes.iter().map(u32::to_string).collect();
        format!(
            "{} {}",
            if pids.len() == 1 { "pid" } else { "pids" },
            pids.join(", ")
        )
    } else {
        // Each named by its rank: `pid 1234 (rank 0), pid 1235 (rank 1)`.
        c.processes
            .iter()
            .map(|&pid| ranks::who(pid, c.rank_of(pid)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    row(
        &mut out,
        "phases",
        format!("{} from {from}", parts.join(", ")),
    );
    if !r.phases.is_empty() {
        out.push_str(&phase_table(r));
    }
    for p in &c.peaks {
        let pid = if c.processes.len() > 1 || p.pid != r.pid {
            format!(" (pid {}{})", p.pid, ranks::after_pid(p.ranks))
        } else {
            String::new()
        };
        row(
            &mut out,
            &format!("peak {}", p.source),
            format!(
                "{} in {}{}{pid}{}",
                units::bytes(p.peak_bytes),
                p.label.replace(" / ", ", "),
                match (p.step_in_phase, p.phase.and_then(|i| r.phases.get(i))) {
                    (Some(n), Some(within)) => format!(" (#{n} of its {})", within.name),
                    _ => String::new(),
                },
                if p.fidelity.is_empty() {
                    String::new()
                } else {
                    format!(", {}", p.fidelity)
                }
            ),
        );
    }
    for text in ranks::summary_lines(&c.rank_spread) {
        row(&mut out, "rank spread", text);
    }
    let unreadable = c.garbled + c.oversized + c.unknown_version;
    if c.dropped > 0 || unreadable > 0 || c.phases_not_kept > 0 {
        let mut what = Vec::new();
        if c.dropped > 0 {
            let steps = if c.dropped_steps > 0 {
                format!(", {} among them", plural(c.dropped_steps, "step", "steps"))
            } else {
                String::new()
            };
            what.push(format!(
                "{} lost{steps} (memprobe read too slowly, or a process was killed before it sent what it kept)",
                plural(c.dropped, "message", "messages")
            ));
        }
        if unreadable > 0 {
            what.push(format!(
                "{} unreadable",
                plural(unreadable, "datagram", "datagrams")
            ));
        }
        if c.phases_not_kept > 0 {
            what.push(format!(
                "{} not kept (too many)",
                plural(c.phases_not_kept, "phase", "phases")
            ));
        }
        row(&mut out, "phase messages", what.join("; "));
    }
    out
}

fn phase_table(r: &RunReport) -> String {
    let phases = &r.phases;
    let many_pids = r.phase_channel.processes.len() > 1;
    let rank_column = many_pids && !r.phase_channel.ranks.is_empty();
    // The child's own sources, in order of first appearance.
    let mut sources: Vec<(&str, &str)> = Vec::new();
    for p in phases {
        for d in &p.sources {
            if sources.len() < SOURCE_COLUMNS && !sources.iter().any(|(n, _)| *n == d.name) {
                sources.push((&d.name, &d.fidelity));
            }
        }
    }
    let gpus = r.gpus.len().min(GPU_COLUMNS);
    let mut head = vec!["PHASE".to_string()];
    if many_pids {
        head.push("PID".into());
    }
    if rank_column {
        head.push("RANK".into());
    }
    head.extend(["START".into(), "TIME".into(), "TREE".into()]);
    if r.cgroup.is_some() {
        head.push("CONTAINER".into());
    }
    for g in r.gpus.iter().take(gpus) {
        head.push(format!("GPU {}", g.index));
    }
    for (name, fidelity) in &sources {
        head.push(format!("{name} ({fidelity})"));
    }
    head.push("STEPS".into());
    head.push("LARGEST STEP".into());
    let mut rows = vec![head];

    let key = |p: &PhaseReport| {
        p.sources
            .first()
            .map(|d| d.peak_bytes)
            .or(p.run.tree_peak_bytes)
            .unwrap_or(0)
    };
    let keys: Vec<u64> = phases.iter().map(key).collect();
    let picked = pick_rows(&keys);
    let mut left_out = 0usize;
    for (n, pick) in picked.iter().enumerate() {
        let Some(i) = *pick else {
            let next = picked[n + 1..]
                .iter()
                .find_map(|x| *x)
                .unwrap_or(phases.len());
            let prev = picked[..n]
                .iter()
                .rev()
                .find_map(|x| *x)
                .map_or(0, |p| p + 1);
            left_out += next - prev;
            rows.push(vec![format!(
                "... {} not shown",
                plural((next - prev) as u64, "phase", "phases")
            )]);
            continue;
        };
        let p = &phases[i];
        let mut row = vec![format!(
            "{}{}",
            "  ".repeat(p.depth as usize),
            p.label.rsplit(" / ").next().unwrap_or(&p.label)
        )];
        if many_pids {
            row.push(p.pid.to_string());
        }
        if rank_column {
            row.push(p.ranks.map_or_else(|| "-".into(), |k| k.rank.to_string()));
        }
        row.push(units::secs(p.start_s));
        row.push(match p.end_s {
            Some(e) => units::secs(e - p.start_s),
            None => "open".into(),
        });
        row.push(units::opt_bytes(p.run.tree_peak_bytes));
        if r.cgroup.is_some() {
            row.push(units::opt_bytes(p.run.cgroup_peak_bytes));
        }
        for g in 0..gpus {
            row.push(units::opt_bytes(
                p.run.gpu_peak_bytes.get(g).copied().flatten(),
            ));
        }
        for (name, _) in &sources {
            row.push(units::opt_bytes(
                p.sources
                    .iter()
                    .find(|d| d.name == *name)
                    .map(|d| d.peak_bytes),
            ));
        }
        row.push(if p.steps.count > 0 {
            p.steps.count.to_string()
        } else {
            "-".into()
        });
        row.push(p.steps.peaks.first().map_or_else(
            || "-".into(),
            |s| {
                format!(
                    "step {} {} {}",
                    s.index,
                    s.source,
                    units::bytes(s.peak_bytes)
                )
            },
        ));
        rows.push(row);
    }
    let mut out = columns::render_indented(&rows, "    ");
    if left_out > 0 {
        let _ = writeln!(
            out,
            "    (the first {HEAD_ROWS}, the last {TAIL_ROWS} and the {LARGEST_ROWS} largest between shown; every phase is in --json)"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_tables_keep_first_last_and_largest() {
        let keys: Vec<u64> = (0..120)
            .map(|i| if i == 60 { 1000 } else { i % 10 })
            .collect();
        let rows = pick_rows(&keys);
        let shown: Vec<usize> = rows.iter().filter_map(|r| *r).collect();
        assert!(rows.len() <= MAX_ROWS, "{rows:?}");
        assert!(shown.contains(&0) && shown.contains(&119) && shown.contains(&60));
        assert!(rows.contains(&None));
        assert!(shown.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(pick_rows(&[1, 2, 3]), vec![Some(0), Some(1), Some(2)]);
    }
}
