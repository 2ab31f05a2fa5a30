//! The timeline as CSV: one row per point.
//!
//! Columns: `t_s` (seconds since the child started, 6 decimals),
//! `tree_rss_bytes`, `processes`, then with `--pss` `tree_pss_bytes` and
//! `tree_uss_bytes`, then `cgroup_bytes` when the container's
//! cgroup was measured, then `gpu<index>_used_bytes` per GPU, then with
//! `--gpu-exact` `gpu<ordinal>_exact_peak_bytes` per device used (the tree's
//! exact peak since the previous row). An empty cell is a reading that
//! failed.

use super::report::RunReport;
use std::fmt::Write as _;

/// Renders the timeline of `r` as CSV text.
pub(crate) fn render(r: &RunReport) -> String {
    let with_cgroup = r.cgroup.is_some();
    let mut out = String::with_capacity(64 * (r.timeline.len() + 1));
    let with_pss = r.pss.is_some();
    out.push_str("t_s,tree_rss_bytes,processes");
    if with_pss {
        out.push_str(",tree_pss_bytes,tree_uss_bytes");
    }
    if with_cgroup {
        out.push_str(",cgroup_bytes");
    }
    for g in &r.gpus {
        let _ = write!(out, ",gpu{}_used_bytes", g.index);
    }
    let exact = r.gpu_exact.as_ref().map_or(0, |x| x.devices.len());
    for d in 0..exact {
        let _ = write!(out, ",gpu{d}_exact_peak_bytes");
    }
    out.push('\n');
    let cell = |out: &mut String, v: Option<u64>| {
        out.push(',');
        if let Some(v) = v {
            let _ = write!(out, "{v}");
        }
    };
    for p in &r.timeline {
        let _ = write!(out, "{:.6},{},{}", p.t_s, p.tree_rss_bytes, p.processes);
        if with_pss {
            cell(&mut out, p.tree_pss_bytes.flatten());
            cell(&mut out, p.tree_uss_bytes.flatten());
        }
        if with_cgroup {
            cell(&mut out, p.cgroup_bytes);
        }
        for i in 0..r.gpus.len() {
            cell(&mut out, p.gpu_used_bytes.get(i).copied().flatten());
        }
        for d in 0..exact {
            let v = p
                .gpu_exact_peak_bytes
                .as_ref()
                .and_then(|v| v.get(d).copied());
            cell(&mut out, v);
        }
        out.push('\n');
    }
    out
}
