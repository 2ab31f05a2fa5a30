//! The timeline as an SVG chart: the tree's RSS, the container's usage and
//! each GPU's used memory over time (with `--gpu-exact`, the tree's exact
//! GPU memory per device too), each series' peak marked, axes
//! in MiB or GiB and seconds (or minutes, hours), a legend, and a footer with
//! the exact single-process peak.

use crate::report::{command_line, RunReport};
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
const GPU_COLORS: [RGBColor; 6] = [
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

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
            .x_label_formatter(&|v| format!("{v}"))
            .y_label_formatter(&|v| format!("{v:.y_decimals$}"))
            .axis_desc_style((FONT, 16))
            .label_style((FONT, 13))
            .light_line_style(RGBColor(235, 235, 235))
            .bold_line_style(RGBColor(210, 210, 210))
            .draw()
            .map_err(|e| e.to_string())?;

        let to_xy = |(t, v): (f64, u64)| (t / time.divisor, v as f64 / mem.divisor);
        for s in &series {
            let color = s.color;
            let drawn = decimate(&s.points, MAX_DRAWN);
            chart
                .draw_series(LineSeries::new(
                    drawn.into_iter().map(to_xy),
                    color.stroke_width(2),
                ))
                .map_err(|e| e.to_string())?
                .label(s.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(3))
                });
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
        for s in &series {
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
    fn decimation_keeps_maxima() {
        let pts: Vec<(f64, u64)> = (0..10_000).map(|i| (i as f64, (i % 97) as u64)).collect();
        let d = decimate(&pts, 100);
        assert!(d.len() <= 100);
        assert_eq!(d.iter().map(|p| p.1).max(), Some(96));
    }
}
