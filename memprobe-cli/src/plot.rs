//! The timeline as an SVG chart: the tree's RSS, the container's usage and
//! each GPU's used memory over time (with `--gpu-exact`, the tree's exact
//! GPU memory per device too), each series' peak marked, axes
//! in MiB or GiB and seconds (or minutes, hours), a legend, and a footer with
//! the exact single-process peak. When the tree had more than one process,
//! each of the largest is a thin line of its own; when the command sent its
//! phases, epochs and evaluations (streams) are shaded and the step that
//! held each of its sources' peaks is marked.

use crate::report::{command_line, PointReport, RunReport};
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
                format!("pid {} {} (peak {})", l.pid, l.name, units::bytes(l.peak))
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
            }
        })
        .collect()
}

/// Whether a series is one process's line (thin, no peak label).
fn is_process(s: &Series) -> bool {
    s.label.is_empty() || s.label.starts_with("pid ") || s.label.contains(" more processes")
}

/// The epochs and evaluations to shade: (start, end, colour, label).
fn bands(r: &RunReport) -> Vec<(f64, f64, RGBColor, Option<String>)> {
    let epochs = r.phases.iter().filter(|p| p.kind == "epoch").count();
    let mut n_epoch = 0;
    r.phases
        .iter()
        .filter(|p| p.kind == "epoch" || p.kind == "stream")
        .take(MAX_BANDS)
        .map(|p| {
            let end = p.end_s.unwrap_or(r.duration_s);
            if p.kind == "epoch" {
                n_epoch += 1;
                let label = (epochs <= MAX_LABELLED_EPOCHS).then(|| p.label.clone());
                (p.start_s, end, EPOCH_SHADES[n_epoch % 2], label)
            } else {
                (p.start_s, end, EVAL_SHADE, None)
            }
        })
        .collect()
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

/// Renders the chart of `r` as SVG text.
pub(crate) fn render(r: &RunReport) -> Result<String, String> {
    let series = series_of(r);
    let max_bytes = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(0)
        .max(1 << 20);
    let mem = memory_unit(max_bytes);
    let time = time_unit(r.duration_s);
    let x_max = (r.duration_s / time.divisor).max(1e-3) * 1.02;
    let y_max = max_bytes as f64 / mem.divisor * 1.15;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (chart_area, footer) = root.split_vertically(HEIGHT - 48);
        let title = format!("memprobe run: {}", command_line(&r.command, 96));
        let mut chart = ChartBuilder::on(&chart_area)
            .caption(title, (FONT, 20))
            .margin(14)
            .x_label_area_size(48)
            .y_label_area_size(78)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(|e| e.to_string())?;
        let y_decimals = if y_max < 10.0 { 1 } else { 0 };
        chart
            .configure_mesh()
            .x_desc(format!("time since start ({})", time.name))
            .y_desc(format!("memory ({})", mem.name))
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| format!("{v:.y_decimals$}"))
            .axis_desc_style((FONT, 16))
            .label_style((FONT, 13))
            .light_line_style(RGBColor(235, 235, 235))
            .bold_line_style(RGBColor(210, 210, 210))
            .draw()
            .map_err(|e| e.to_string())?;

        let to_xy = |(t, v): (f64, u64)| (t / time.divisor, v as f64 / mem.divisor);
        let shaded = bands(r);
        for &(a, b, color, _) in &shaded {
            let rect = [(a / time.divisor, 0.0), (b / time.divisor, y_max)];
            chart
                .draw_series(std::iter::once(Rectangle::new(rect, color.filled())))
                .map_err(|e| e.to_string())?;
        }
        let px_per_x = f64::from(WIDTH - 120) / x_max;
        for (a, b, _, label) in &shaded {
            let Some(label) = label else { continue };
            if (b - a) / time.divisor * px_per_x < 8.0 * label.len() as f64 {
                continue;
            }
            // At the foot of its band: the legend covers the top left.
            let style = TextStyle::from((FONT, 12).into_font())
                .color(&RGBColor(70, 95, 130))
                .pos(Pos::new(HPos::Left, VPos::Bottom));
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((a / time.divisor, 0.0))
                        + Text::new(label.clone(), (3, -3), style),
                ))
                .map_err(|e| e.to_string())?;
        }
        for (color, label) in [
            (EPOCH_SHADES[0], "epochs (shaded)"),
            (EVAL_SHADE, "evaluations: streams (shaded)"),
        ] {
            let kind = if color == EVAL_SHADE {
                "stream"
            } else {
                "epoch"
            };
            if !r.phases.iter().any(|p| p.kind == kind) {
                continue;
            }
            chart
                .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
                .map_err(|e| e.to_string())?
                .label(label)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 22, y + 6)], color.filled())
                });
        }
        // Process lines first, under the run's series.
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
        for (i, p) in r
            .phase_channel
            .peaks
            .iter()
            .take(MAX_PEAK_MARKS)
            .enumerate()
        {
            let x = (p.start_s + p.end_s) / 2.0 / time.divisor;
            let y = p.peak_bytes as f64 / mem.divisor;
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(x, 0.0), (x, y_max)],
                    4,
                    4,
                    PEAK_STEP_COLOR.stroke_width(1),
                ))
                .map_err(|e| e.to_string())?;
            let right_half = x > x_max * 0.6;
            let anchor = if right_half { HPos::Right } else { HPos::Left };
            let dx = if right_half { -6 } else { 6 };
            let pid = if r.phase_channel.processes.len() > 1 || p.pid != r.pid {
                format!(" (pid {})", p.pid)
            } else {
                String::new()
            };
            let text = format!(
                "{} peak {} in {}{pid}",
                p.source,
                units::bytes(p.peak_bytes),
                p.label.replace(" / ", ", ")
            );
            let style = TextStyle::from((FONT, 13).into_font())
                .color(&PEAK_STEP_COLOR)
                .pos(Pos::new(anchor, VPos::Top));
            let row = 18 + 16 * i as i32;
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((x, y_max)) + Text::new(text, (dx, row), style),
                ))
                .map_err(|e| e.to_string())?;
            // The program's own (exact) peak, where the step held it.
            if y <= y_max {
                chart
                    .draw_series(std::iter::once(
                        EmptyElement::at((x, y))
                            + TriangleMarker::new((0, 0), 6, PEAK_STEP_COLOR.filled()),
                    ))
                    .map_err(|e| e.to_string())?;
            }
        }
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
                        + Text::new(label, (dx, -6), style),
                ))
                .map_err(|e| e.to_string())?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()
            .map_err(|e| e.to_string())?;

        footer
            .draw(&Text::new(footer_text(r), (24, 12), (FONT, 14)))
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

fn footer_text(r: &RunReport) -> String {
    let mut parts = Vec::new();
    if let Some(p) = &r.peak_process {
        parts.push(format!(
            "peak single process {} (pid {}, {}, exact)",
            units::bytes(p.peak_rss_bytes),
            p.pid,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_follow_the_range() {
        assert_eq!(memory_unit(100 << 20).name, "MiB");
        assert_eq!(memory_unit(3 << 30).name, "GiB");
        assert_eq!(time_unit(30.0).name, "s");
        assert_eq!(time_unit(3000.0).name, "min");
        assert_eq!(time_unit(86_400.0).name, "h");
    }

    #[test]
    fn ticks_have_no_float_noise() {
        assert_eq!(tick(0.6000000000000001), "0.6");
        assert_eq!(tick(2.0), "2");
        assert_eq!(tick(0.125), "0.125");
        assert_eq!(tick(-0.0), "0");
    }

    #[test]
    fn phases_and_processes_on_the_chart() {
        let mut r = crate::phase_report::tests::run_with_phases(3, 13);
        r.process_lines = crate::process_lines::LinesReport {
            lines: (0..20u32)
                .map(|i| crate::process_lines::DrawnLine {
                    pid: 600 + i,
                    name: "worker".to_string(),
                    peak: u64::from(20 - i) << 20,
                    points: vec![(0.0, 1 << 20), (0.03, u64::from(20 - i) << 20)],
                })
                .collect(),
            processes: 40,
        };
        r.process_lines.lines.truncate(crate::process_lines::DRAWN);
        let svg = render(&r).unwrap();
        for needle in [
            "epochs (shaded)",
            "evaluations: streams (shaded)",
            "rss peak 900 MiB in epoch 1, step 13",
            "pid 600 worker (peak 20.0 MiB)",
            "10 more processes, grey (the 16 largest of 40 drawn)",
            "epoch 2",
        ] {
            assert!(svg.contains(needle), "no {needle:?} in the SVG");
        }
        assert!(!svg.contains("pid 606 "), "only 6 processes are named");
        // Three epochs and three streams shaded.
        let shade = |c: RGBColor| format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
        let bands = svg.matches(&shade(EPOCH_SHADES[0])).count()
            + svg.matches(&shade(EPOCH_SHADES[1])).count();
        assert_eq!(bands, 3 + 1, "3 epochs and the legend's swatch");
        assert_eq!(svg.matches(&shade(EVAL_SHADE)).count(), 3 + 1);
        // Without phases or workers, nothing of it.
        let plain = crate::phase_report::tests::run_with_phases(0, 0);
        let svg = render(&plain).unwrap();
        assert!(!svg.contains("shaded") && !svg.contains("pid 6"));
    }

    #[test]
    fn decimation_keeps_maxima() {
        let pts: Vec<(f64, u64)> = (0..10_000).map(|i| (i as f64, (i % 97) as u64)).collect();
        let d = decimate(&pts, 100);
        assert!(d.len() <= 100);
        assert_eq!(d.iter().map(|p| p.1).max(), Some(96));
    }
}
