//! The timeline as an SVG chart: the tree's RSS, the container's usage and
//! each GPU's used memory over time (with `--gpu-exact`, the tree's exact
//! GPU memory per device too), each series' peak marked, axes
//! in MiB or GiB and seconds (or minutes, hours), a legend, and a footer with
//! the exact single-process peak. When the tree had more than one process,
//! each of the largest is a thin line of its own; when the command sent its
//! phases, epochs and evaluations (streams, and phases named `validation`,
//! `eval`, `test`, ...) are shaded and named, and the step that held each of
//! its sources' peaks is marked at the sample where it peaked. A kernel OOM
//! kill and a GPU allocation that failed out of memory (counted by the
//! interposer) are marked at their time. When the container's line would
//! squeeze the program's to the bottom of the scale, the container gets a
//! panel of its own above, with its own scale.

use super::phase_report::{PeakReport, PhaseReport};
use super::ranks;
use super::report::{command_line, PointReport, RunReport};
use crate::units;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const WIDTH: u32 = 1200;
const HEIGHT: u32 = 640;
/// At most this many points per series are drawn (bucket maxima, so peaks stay).
const MAX_DRAWN: usize = 2000;
const FONT: &str = "sans-serif";

const TREE_COLOR: RGBColor = RGBColor(31, 119, 180);
const CGROUP_COLOR: RGBColor = RGBColor(214, 39, 40);
/// The tree's PSS and USS (`--pss`): the tree's blue, lighter.
const PSS_COLOR: RGBColor = RGBColor(99, 170, 220);
const USS_COLOR: RGBColor = RGBColor(158, 202, 233);
const GPU_COLORS: [RGBColor; 6] = [
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// Processes with a coloured line and a legend entry of their own; the
/// rest of the drawn ones share one grey legend entry.
const NAMED_PROCESSES: usize = 6;
const PROCESS_COLORS: [RGBColor; NAMED_PROCESSES] = [
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
    RGBColor(227, 119, 194),
    RGBColor(140, 86, 75),
    RGBColor(148, 103, 189),
    RGBColor(127, 127, 127),
];
const OTHER_PROCESS_COLOR: RGBColor = RGBColor(190, 190, 190);
const EPOCH_SHADES: [RGBColor; 2] = [RGBColor(222, 234, 248), RGBColor(236, 243, 251)];
const EVAL_SHADE: RGBColor = RGBColor(253, 233, 204);
const PEAK_STEP_COLOR: RGBColor = RGBColor(150, 20, 60);
/// A kernel OOM kill, and a GPU allocation that failed out of memory.
const OOM_COLOR: RGBColor = RGBColor(200, 0, 0);
const GPU_OOM_COLOR: RGBColor = RGBColor(120, 40, 160);
/// PyTorch's epoch peaks (attribution records).
const TORCH_COLOR: RGBColor = RGBColor(0, 110, 110);
/// At most this many phases are shaded (more are narrower than a pixel).
const MAX_BANDS: usize = 4000;
/// Epochs are labelled when there are at most this many.
const MAX_LABELLED_EPOCHS: usize = 40;
/// Peak steps marked (one per process and source).
const MAX_PEAK_MARKS: usize = 4;

/// One line of the chart.
struct Series {
    label: String,
    color: RGBColor,
    points: Vec<(f64, u64)>,
    /// Written under the peak's label (what held it, by origin).
    note: Option<String>,
}

/// Unit of an axis: a divisor and its name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AxisUnit {
    pub(crate) divisor: f64,
    pub(crate) name: &'static str,
}

/// The memory unit for values up to `max_bytes`.
pub(crate) fn memory_unit(max_bytes: u64) -> AxisUnit {
    if max_bytes >= 2 << 30 {
        AxisUnit {
            divisor: (1u64 << 30) as f64,
            name: "GiB",
        }
    } else {
        AxisUnit {
            divisor: (1u64 << 20) as f64,
            name: "MiB",
        }
    }
}

/// The time unit for a run of `duration_s` seconds.
pub(crate) fn time_unit(duration_s: f64) -> AxisUnit {
    if duration_s <= 600.0 {
        AxisUnit {
            divisor: 1.0,
            name: "s",
        }
    } else if duration_s <= 36_000.0 {
        AxisUnit {
            divisor: 60.0,
            name: "min",
        }
    } else {
        AxisUnit {
            divisor: 3600.0,
            name: "h",
        }
    }
}

/// Keeps at most `max` points: the maximum of each bucket, at the time of
/// the bucket's first point.
fn decimate(points: &[(f64, u64)], max: usize) -> Vec<(f64, u64)> {
    if points.len() <= max {
        return points.to_vec();
    }
    let per = points.len().div_ceil(max);
    points
        .chunks(per)
        .map(|c| (c[0].0, c.iter().map(|p| p.1).max().unwrap_or(0)))
        .collect()
}

fn series_of(r: &RunReport) -> Vec<Series> {
    let mut out = vec![Series {
        label: "host tree RSS (all processes of the run)".into(),
        color: TREE_COLOR,
        points: r
            .timeline
            .iter()
            .map(|p| (p.t_s, p.tree_rss_bytes))
            .collect(),
        note: None,
    }];
    if r.pss.is_some() {
        // Shared pages once (PSS) and each process's own pages (USS), under
        // the summed RSS that counts shared pages once per process.
        for (label, color, pick) in [
            (
                "host tree PSS (shared pages counted once)",
                PSS_COLOR,
                (|p: &PointReport| p.tree_pss_bytes.flatten()) as fn(&PointReport) -> Option<u64>,
            ),
            (
                "host tree USS (pages of one process only)",
                USS_COLOR,
                |p: &PointReport| p.tree_uss_bytes.flatten(),
            ),
        ] {
            out.push(Series {
                label: label.into(),
                color,
                points: r
                    .timeline
                    .iter()
                    .filter_map(|p| Some((p.t_s, pick(p)?)))
                    .collect(),
                note: None,
            });
        }
    }
    if let Some(c) = &r.cgroup {
        let limit = c.limit_bytes.map_or_else(
            || "no limit".into(),
            |l| format!("limit {}", units::bytes(l)),
        );
        out.push(Series {
            label: format!("container (cgroup {}, {limit})", c.version),
            color: CGROUP_COLOR,
            points: r
                .timeline
                .iter()
                .filter_map(|p| Some((p.t_s, p.cgroup_bytes?)))
                .collect(),
            note: None,
        });
    }
    for (i, g) in r.gpus.iter().enumerate() {
        out.push(Series {
            label: format!(
                "GPU {} used ({}, {} total)",
                g.index,
                g.name,
                units::bytes(g.total_bytes)
            ),
            color: GPU_COLORS[i % GPU_COLORS.len()],
            points: r
                .timeline
                .iter()
                .filter_map(|p| Some((p.t_s, p.gpu_used_bytes.get(i).copied().flatten()?)))
                .collect(),
            note: None,
        });
    }
    out.extend(process_series(r));
    if let Some(x) = &r.gpu_exact {
        for d in &x.devices {
            let i = d.index as usize;
            out.push(Series {
                label: format!(
                    "GPU {} exact, all processes of the run (interposer; peak {})",
                    d.index,
                    units::bytes(d.tree_peak_bytes)
                ),
                color: GPU_COLORS[(r.gpus.len() + i) % GPU_COLORS.len()],
                points: r
                    .timeline
                    .iter()
                    .filter_map(|p| Some((p.t_s, *p.gpu_exact_peak_bytes.as_ref()?.get(i)?)))
                    .collect(),
                // What held the peak: its three largest origins.
                note: d
                    .origins_at_tree_peak
                    .as_ref()
                    .map(|o| crate::commands::run::gpu_origins::top(&o.origins, 3)),
            });
        }
    }
    out
}

/// The largest processes, each a line of its own, when the tree had more
/// than one.
fn process_series(r: &RunReport) -> Vec<Series> {
    let pl = &r.process_lines;
    if pl.processes < 2 || pl.lines.len() < 2 {
        return Vec::new();
    }
    let drawn = pl.lines.len();
    pl.lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let label = if i < NAMED_PROCESSES {
                format!(
                    "{} {} (peak {})",
                    ranks::who(l.pid, r.phase_channel.rank_of(l.pid)),
                    l.name,
                    units::bytes(l.peak)
                )
            } else if i == NAMED_PROCESSES {
                format!(
                    "{} more processes, grey (the {drawn} largest of {} drawn)",
                    drawn - NAMED_PROCESSES,
                    pl.processes
                )
            } else {
                String::new()
            };
            Series {
                label,
                color: PROCESS_COLORS
                    .get(i)
                    .copied()
                    .unwrap_or(OTHER_PROCESS_COLOR),
                points: l.points.clone(),
                note: None,
            }
        })
        .collect()
}

/// Whether a series is one process's line (thin, no peak label).
fn is_process(s: &Series) -> bool {
    s.label.is_empty() || s.label.starts_with("pid ") || s.label.contains(" more processes")
}

/// Phase names that mean an evaluation pass (compared without case).
const EVAL_NAMES: [&str; 8] = [
    "evaluation",
    "evaluate",
    "eval",
    "validation",
    "validate",
    "val",
    "test",
    "testing",
];

/// Whether a phase is an evaluation pass: a stream (Avalanche's), or a
/// phase named like one (`validation`, `eval`, `test`, ...).
pub(crate) fn is_evaluation(p: &PhaseReport) -> bool {
    p.kind == "stream" || EVAL_NAMES.iter().any(|n| p.name.eq_ignore_ascii_case(n))
}

/// One shaded phase: (start, end, colour, label).
type Band = (f64, f64, RGBColor, Option<String>);

/// The epochs and evaluations to shade, epochs first (evaluations are
/// drawn over them: a validation often runs inside its epoch).
fn bands(r: &RunReport) -> Vec<Band> {
    let epochs = r.phases.iter().filter(|p| p.kind == "epoch").count();
    let evals = r.phases.iter().filter(|p| is_evaluation(p)).count();
    let mut n_epoch = 0;
    let mut out: Vec<Band> = r
        .phases
        .iter()
        .filter(|p| p.kind == "epoch")
        .take(MAX_BANDS)
        .map(|p| {
            n_epoch += 1;
            let label = (epochs <= MAX_LABELLED_EPOCHS).then(|| p.label.clone());
            (
                p.start_s,
                p.end_s.unwrap_or(r.duration_s),
                EPOCH_SHADES[n_epoch % 2],
                label,
            )
        })
        .collect();
    out.extend(
        r.phases
            .iter()
            .filter(|p| is_evaluation(p))
            .take(MAX_BANDS)
            .map(|p| {
                let label = (evals <= MAX_LABELLED_EPOCHS).then(|| p.label.clone());
                (
                    p.start_s,
                    p.end_s.unwrap_or(r.duration_s),
                    EVAL_SHADE,
                    label,
                )
            }),
    );
    out
}

/// The evaluations' legend entry: `evaluations (shaded): validation, stream`.
fn evaluations_legend(r: &RunReport) -> Option<String> {
    let mut names: Vec<&str> = Vec::new();
    for p in r.phases.iter().filter(|p| is_evaluation(p)) {
        if !names.contains(&p.name.as_str()) {
            names.push(&p.name);
        }
    }
    if names.is_empty() {
        return None;
    }
    let more = names.len().saturating_sub(3);
    names.truncate(3);
    let mut text = format!("evaluations (shaded): {}", names.join(", "));
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    Some(text)
}

/// When the step of `p` held its peak, as far as the samples tell: the
/// time of the largest sample inside the step of the process's own line
/// (the tree's when it has none). `None` when no sample fell inside it.
fn peak_time(r: &RunReport, p: &PeakReport) -> Option<f64> {
    let inside = |t: f64| t >= p.start_s && t <= p.end_s;
    let own = r.process_lines.lines.iter().find(|l| l.pid == p.pid);
    let points: Vec<(f64, u64)> = match own {
        Some(l) => l.points.iter().copied().filter(|q| inside(q.0)).collect(),
        None => r
            .timeline
            .iter()
            .map(|q| (q.t_s, q.tree_rss_bytes))
            .filter(|q| inside(q.0))
            .collect(),
    };
    // The first sample at the largest value.
    points.iter().rev().max_by_key(|q| q.1).map(|q| q.0)
}

/// An out-of-memory event to mark: (time, label).
fn oom_marks(r: &RunReport) -> (Vec<(f64, String)>, Vec<String>) {
    let mut marks = Vec::new();
    let mut untimed = Vec::new();
    if let Some(o) = &r.oom_kill {
        // As the JSON says it.
        let verdict = serde_json::to_value(o)
            .ok()
            .and_then(|v| v.get("verdict")?.as_str().map(str::to_owned))
            .unwrap_or_default();
        if verdict != "none" && verdict != "unknown" {
            for v in &o.victims {
                marks.push((
                    v.at_s,
                    format!("OOM kill ({verdict}): pid {} {}", v.pid, v.name),
                ));
            }
        }
    }
    if let Some(x) = &r.gpu_exact {
        for p in x.processes.iter().filter(|p| p.oom_failures > 0) {
            let what = format!(
                "GPU out of memory: {} (pid {})",
                units::plural(p.oom_failures, "failed allocation", "failed allocations"),
                p.pid
            );
            match p.last_oom_at_s {
                Some(t) => marks.push((t, format!("{what}, the last here"))),
                None => untimed.push(format!("{what}, time unknown")),
            }
        }
    }
    marks.sort_by(|a, b| a.0.total_cmp(&b.0));
    (marks, untimed)
}

/// An axis tick without float noise: `0.6`, not `0.6000000000000001`.
fn tick(v: f64) -> String {
    let t = format!("{v:.4}");
    let t = t.trim_end_matches('0').trim_end_matches('.');
    if t == "-0" {
        "0".into()
    } else {
        t.into()
    }
}

/// Whether the container gets a panel of its own: when its line would
/// squeeze the program's into the bottom of a shared scale.
const OWN_PANEL_RATIO: f64 = 1.5;
/// The container's panel's height, when it has one.
const PANEL_HEIGHT: u32 = 190;

fn max_of<'a>(series: impl Iterator<Item = &'a Series>) -> u64 {
    series
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(0)
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Draws the axes of `area` for times up to `x_max` (in `time`) and memory
/// up to `y_max` (in `mem`).
fn axes<'a, 'b>(
    area: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    caption: Option<String>,
    (x_max, time): (f64, AxisUnit),
    (y_max, mem): (f64, AxisUnit),
    x_desc: bool,
) -> Result<Chart<'a, 'b>, String> {
    let mut builder = ChartBuilder::on(area);
    if let Some(c) = caption {
        builder.caption(c, (FONT, 20));
    }
    let mut chart = builder
        .margin(14)
        .x_label_area_size(if x_desc { 48 } else { 24 })
        .y_label_area_size(78)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(|e| e.to_string())?;
    let y_decimals = if y_max < 10.0 { 1 } else { 0 };
    let mut mesh = chart.configure_mesh();
    if x_desc {
        mesh.x_desc(format!("time since start ({})", time.name));
    }
    mesh.y_desc(format!("memory ({})", mem.name))
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| format!("{v:.y_decimals$}"))
        .axis_desc_style((FONT, 16))
        .label_style((FONT, 13))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(210, 210, 210))
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(chart)
}

/// Draws `series` on `chart` (process lines first, thin), each run series'
/// peak marked with its value and time.
fn lines(
    chart: &mut Chart<'_, '_>,
    series: &[&Series],
    (x_max, time): (f64, AxisUnit),
    mem: AxisUnit,
) -> Result<(), String> {
    let to_xy = |(t, v): (f64, u64)| (t / time.divisor, v as f64 / mem.divisor);
    for s in series
        .iter()
        .filter(|s| is_process(s))
        .chain(series.iter().filter(|s| !is_process(s)))
    {
        let color = s.color;
        let width = if is_process(s) { 1 } else { 2 };
        let drawn = decimate(&s.points, MAX_DRAWN);
        let line = chart
            .draw_series(LineSeries::new(
                drawn.into_iter().map(to_xy),
                color.stroke_width(width),
            ))
            .map_err(|e| e.to_string())?;
        if !s.label.is_empty() {
            line.label(s.label.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(width + 1))
            });
        }
    }
    for s in series.iter().filter(|s| !is_process(s)) {
        // The first sample at the maximum, as in the JSON.
        let Some(&peak) = s.points.iter().rev().max_by_key(|p| p.1) else {
            continue;
        };
        let (x, y) = to_xy(peak);
        let right_half = x > x_max * 0.6;
        let anchor = if right_half { HPos::Right } else { HPos::Left };
        let dx = if right_half { -8 } else { 8 };
        let label = format!("peak {} at {}", units::bytes(peak.1), units::secs(peak.0));
        let style = TextStyle::from((FONT, 13).into_font())
            .color(&s.color)
            .pos(Pos::new(anchor, VPos::Bottom));
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((x, y))
                    + Circle::new((0, 0), 5, s.color.filled())
                    + Text::new(label, (dx, -6), style.clone()),
            ))
            .map_err(|e| e.to_string())?;
        if let Some(note) = &s.note {
            let style = style.pos(Pos::new(anchor, VPos::Top));
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((x, y)) + Text::new(format!("held by {note}"), (dx, 8), style),
                ))
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The container's limit, dashed, where it fits the scale.
fn limit_line(
    chart: &mut Chart<'_, '_>,
    r: &RunReport,
    x_max: f64,
    (y_max, mem): (f64, AxisUnit),
) -> Result<(), String> {
    if let Some(limit) = r.cgroup.as_ref().and_then(|c| c.limit_bytes) {
        let y = limit as f64 / mem.divisor;
        if y <= y_max {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(0.0, y), (x_max, y)],
                    6,
                    4,
                    CGROUP_COLOR.stroke_width(1),
                ))
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// A label on a white backdrop (lines under it stay visible, the text
/// stays readable), anchored at `at` with `anchor`, offset by `(dx, dy)`.
fn label<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    at: (f64, f64),
    text: String,
    style: TextStyle<'_>,
    (dx, dy): (i32, i32),
) -> Result<(), String> {
    let (w, h) = chart
        .plotting_area()
        .estimate_text_size(&text, &style)
        .map_err(|e| e.to_string())?;
    // The estimate runs about 12% wide of what SVG viewers draw.
    let (w, h) = ((f64::from(w) * 0.88) as i32, h as i32);
    let x0 = match style.pos.h_pos {
        HPos::Left => dx,
        HPos::Right => dx - w,
        HPos::Center => dx - w / 2,
    };
    let y0 = match style.pos.v_pos {
        VPos::Top => dy,
        VPos::Bottom => dy - h,
        VPos::Center => dy - h / 2,
    };
    chart
        .draw_series(std::iter::once(
            EmptyElement::at(at)
                + Rectangle::new(
                    [(x0 - 2, y0 - 1), (x0 + w + 2, y0 + h + 1)],
                    WHITE.mix(0.8).filled(),
                )
                + Text::new(text, (dx, dy), style),
        ))
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .draw()
        .map_err(|e| e.to_string())
}

/// Renders the chart of `r` as SVG text.
pub(crate) fn render(r: &RunReport) -> Result<String, String> {
    let series = series_of(r);
    let (container, program): (Vec<&Series>, Vec<&Series>) =
        series.iter().partition(|s| s.color == CGROUP_COLOR);
    let program_max = max_of(program.iter().copied());
    let container_max = max_of(container.iter().copied());
    // The container (the whole machine's cgroup, often) would set the scale
    // and squeeze the program's own lines to the bottom: it gets a panel.
    let own_panel = !container.is_empty()
        && program_max > 0
        && container_max as f64 > OWN_PANEL_RATIO * program_max as f64;
    let main_series: Vec<&Series> = if own_panel {
        program
    } else {
        series.iter().collect()
    };
    let max_bytes = max_of(main_series.iter().copied()).max(1 << 20);
    let mem = memory_unit(max_bytes);
    let time = time_unit(r.duration_s);
    let x_max = (r.duration_s / time.divisor).max(1e-3) * 1.02;
    let y_max = max_bytes as f64 / mem.divisor * 1.2;
    let height = if own_panel {
        HEIGHT + PANEL_HEIGHT
    } else {
        HEIGHT
    };

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (chart_area, footer) = root.split_vertically(height - 48);
        let title = format!("memprobe run: {}", command_line(&r.command, 96));
        let (top, main_area) = if own_panel {
            let (a, b) = chart_area.split_vertically(PANEL_HEIGHT + 30);
            (Some(a), b)
        } else {
            (None, chart_area)
        };
        if let Some(top) = &top {
            let cmax = container_max.max(1 << 20);
            let cmem = memory_unit(cmax);
            let cy_max = cmax as f64 / cmem.divisor * 1.35;
            let mut chart = axes(
                top,
                Some(title.clone()),
                (x_max, time),
                (cy_max, cmem),
                false,
            )?;
            limit_line(&mut chart, r, x_max, (cy_max, cmem))?;
            lines(&mut chart, &container, (x_max, time), cmem)?;
            legend(&mut chart)?;
        }
        let caption = top.is_none().then_some(title);
        let mut chart = axes(&main_area, caption, (x_max, time), (y_max, mem), true)?;

        draw_bands(&mut chart, r, (x_max, time), y_max)?;
        if !own_panel {
            limit_line(&mut chart, r, x_max, (y_max, mem))?;
        }
        lines(&mut chart, &main_series, (x_max, time), mem)?;
        peak_marks(&mut chart, r, (x_max, time), (y_max, mem))?;
        torch_peaks(&mut chart, r, (x_max, time), (y_max, mem))?;
        oom_lines(&mut chart, r, (x_max, time), y_max)?;
        legend(&mut chart)?;

        footer
            .draw(&Text::new(footer_text(r), (24, 12), (FONT, 14)))
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// The phases' bands behind the lines (epochs, evaluations), each labelled
/// where it is wide enough, and their swatches in the legend.
fn draw_bands<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    r: &RunReport,
    (x_max, time): (f64, AxisUnit),
    y_max: f64,
) -> Result<(), String> {
    let shaded = bands(r);
    for &(a, b, color, _) in &shaded {
        let rect = [(a / time.divisor, 0.0), (b / time.divisor, y_max)];
        chart
            .draw_series(std::iter::once(Rectangle::new(rect, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    let px_per_x = f64::from(WIDTH - 120) / x_max;
    for (a, b, color, label) in &shaded {
        let Some(label) = label else { continue };
        if (b - a) / time.divisor * px_per_x < 7.0 * label.len() as f64 {
            continue;
        }
        // At the foot of its band (the legend covers the top left);
        // evaluations one line up, clear of the epoch they sit in.
        let dy = if *color == EVAL_SHADE { -18 } else { -3 };
        let ink = if *color == EVAL_SHADE {
            RGBColor(150, 90, 20)
        } else {
            RGBColor(70, 95, 130)
        };
        let style = TextStyle::from((FONT, 12).into_font())
            .color(&ink)
            .pos(Pos::new(HPos::Left, VPos::Bottom));
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((a / time.divisor, 0.0))
                    + Text::new(label.clone(), (3, dy), style),
            ))
            .map_err(|e| e.to_string())?;
    }
    let mut swatches = Vec::new();
    if r.phases.iter().any(|p| p.kind == "epoch") {
        swatches.push((EPOCH_SHADES[0], "epochs (shaded)".to_string()));
    }
    if let Some(text) = evaluations_legend(r) {
        swatches.push((EVAL_SHADE, text));
    }
    for (color, label) in swatches {
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 22, y + 6)], color.filled()));
    }
    Ok(())
}

/// The peak steps the command's trackers reported: a dashed line up to a
/// marker, and what the peak was, in which step, when.
fn peak_marks<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    r: &RunReport,
    (x_max, time): (f64, AxisUnit),
    (y_max, mem): (f64, AxisUnit),
) -> Result<(), String> {
    for p in r.phase_channel.peaks.iter().take(MAX_PEAK_MARKS) {
        let y = (p.peak_bytes as f64 / mem.divisor).min(y_max);
        let at = peak_time(r, p);
        let pid = if r.phase_channel.processes.len() > 1 || p.pid != r.pid {
            format!(" (pid {}{})", p.pid, ranks::after_pid(p.ranks))
        } else {
            String::new()
        };
        let mut text = format!(
            "{} peak {} in {}{pid}",
            p.source,
            units::bytes(p.peak_bytes),
            p.label.replace(" / ", ", ")
        );
        let x = match at {
            Some(t) => {
                text.push_str(&format!(", at {}", units::secs(t)));
                t / time.divisor
            }
            None => {
                // No sample inside the step: its span, and say so.
                text.push_str(&format!(
                    " ({}–{}; no sample inside the step)",
                    units::secs(p.start_s),
                    units::secs(p.end_s)
                ));
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(p.start_s / time.divisor, y), (p.end_s / time.divisor, y)],
                        PEAK_STEP_COLOR.stroke_width(3),
                    )))
                    .map_err(|e| e.to_string())?;
                p.start_s / time.divisor
            }
        };
        // The line stops at the marker; the label sits below it, beside
        // the line, never across it.
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x, 0.0), (x, y)],
                4,
                4,
                PEAK_STEP_COLOR.stroke_width(1),
            ))
            .map_err(|e| e.to_string())?;
        let right_half = x > x_max * 0.6;
        let anchor = if right_half { HPos::Right } else { HPos::Left };
        let dx = if right_half { -9 } else { 9 };
        let style = TextStyle::from((FONT, 13).into_font())
            .color(&PEAK_STEP_COLOR)
            .pos(Pos::new(anchor, VPos::Top));
        label(chart, (x, y), text, style, (dx, 6))?;
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((x, y)) + TriangleMarker::new((0, 0), 6, PEAK_STEP_COLOR.filled()),
            ))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// PyTorch's epoch peaks: a marker at each peak step, and its largest
/// block. The labels start below the "held by" note a GPU peak carries
/// (which takes the 8 to 21 pixels under its point: an epoch's peak is often
/// the run's), in four rows, so neighbours do not print over each other.
fn torch_peaks<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    r: &RunReport,
    (x_max, time): (f64, AxisUnit),
    (y_max, mem): (f64, AxisUnit),
) -> Result<(), String> {
    let marks = torch_marks::torch_marks(r);
    for (i, m) in marks.marks.iter().enumerate() {
        let (x, y) = (
            m.t_s / time.divisor,
            (m.bytes as f64 / mem.divisor).min(y_max),
        );
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((x, y))
                    + Rectangle::new([(-4, -4), (4, 4)], TORCH_COLOR.stroke_width(2)),
            ))
            .map_err(|e| e.to_string())?;
        let right_half = x > x_max * 0.6;
        let anchor = if right_half { HPos::Right } else { HPos::Left };
        let dx = if right_half { -8 } else { 8 };
        let style = TextStyle::from((FONT, 12).into_font())
            .color(&TORCH_COLOR)
            .pos(Pos::new(anchor, VPos::Top));
        let row = 24 + 15 * (i % 4) as i32;
        label(chart, (x, y), m.text.clone(), style, (dx, row))?;
    }
    Ok(())
}

/// The OOM kills and the GPU out-of-memory failures, each a line at its
/// time with what happened.
fn oom_lines<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    r: &RunReport,
    (x_max, time): (f64, AxisUnit),
    y_max: f64,
) -> Result<(), String> {
    let (marks, _) = oom_marks(r);
    for (i, (t, text)) in marks.iter().enumerate() {
        let x = t / time.divisor;
        let color = if text.starts_with("GPU") {
            GPU_OOM_COLOR
        } else {
            OOM_COLOR
        };
        chart
            .draw_series(LineSeries::new(
                vec![(x, 0.0), (x, y_max * 0.93)],
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?;
        let right_half = x > x_max * 0.5;
        let anchor = if right_half { HPos::Right } else { HPos::Left };
        let dx = if right_half { -5 } else { 5 };
        let style = TextStyle::from((FONT, 13).into_font().style(FontStyle::Bold))
            .color(&color)
            .pos(Pos::new(anchor, VPos::Top));
        let row = 4 + 16 * (i % 4) as i32;
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((x, y_max * 0.93)) + Cross::new((0, 0), 5, color.stroke_width(2)),
            ))
            .map_err(|e| e.to_string())?;
        label(chart, (x, y_max), text.clone(), style, (dx, row))?;
    }
    Ok(())
}

fn footer_text(r: &RunReport) -> String {
    let mut parts = Vec::new();
    if let Some(p) = &r.peak_process {
        parts.push(format!(
            "peak single process {} (pid {}{}, {}, exact)",
            units::bytes(p.peak_rss_bytes),
            p.pid,
            ranks::after_pid(p.ranks),
            p.name
        ));
    }
    parts.push(if r.tree.raised_to_a_process() {
        format!(
            "peak tree RSS {} (its largest process's exact peak)",
            units::bytes(r.tree.peak_rss_bytes)
        )
    } else {
        format!(
            "peak tree RSS {} (sampled every {})",
            units::bytes(r.tree.peak_rss_bytes),
            units::duration(std::time::Duration::from_secs_f64(r.interval_s))
        )
    });
    if let Some(x) = &r.gpu_exact {
        for d in &x.devices {
            parts.push(format!(
                "GPU {} exact tree peak {}",
                d.index,
                units::bytes(d.tree_peak_bytes)
            ));
        }
    }
    for what in oom_marks(r).1 {
        parts.push(what);
    }
    if let Some(what) = torch_marks::footer(&torch_marks::torch_marks(r)) {
        parts.push(what);
    }
    parts.push(format!("exit status {}", r.exit.status));
    parts.push(format!("{} samples", r.samples));
    if r.gpus.is_empty() {
        if let Some(why) = r.unavailable.get("gpus") {
            // The footer is one line: the reason's first clause (the JSON
            // carries it whole).
            parts.push(format!("GPUs: {}", crate::unavailable::first_clause(why)));
        }
    }
    parts.join("  ·  ")
}

mod torch_marks;

#[cfg(test)]
mod tests;
