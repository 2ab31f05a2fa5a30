//! `memprobe run --gpu-exact=stacks[:N]`: the call paths that held each
//! process's GPU memory at its exact peak on each device, as the
//! interposer keeps them (`MEMPROBE_GPU_ORIGINS=stacks:N`, see
//! docs/attribution.md): the summary shows the largest [`TOP`] under the
//! process's origins, the run's JSON the largest [`JSON_TOP`] and the rest.

use crate::units;
use memprobe_interpose_reader::stacks::{PeakStacks, DEFAULT_STACK_DEPTH, MAX_STACK_DEPTH};
use memprobe_interpose_reader::{Counter, Region};
use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;

/// Paths shown per process and device.
pub(crate) const TOP: usize = 3;

/// Frames of a path shown on its line (the rest are counted).
const SHOWN_FRAMES: usize = 4;

/// The depth `--gpu-exact`'s value asks for: `None` for plain counting
/// (no value, or `on`), `Some(N)` for `stacks[:N]`.
pub(crate) fn parse_mode(v: &str) -> Result<Option<usize>, String> {
    let v = v.trim();
    if v.is_empty() || v == "on" {
        return Ok(None);
    }
    let Some(rest) = v.strip_prefix("stacks") else {
        return Err(format!("--gpu-exact={v}: the value is stacks or stacks:N"));
    };
    match rest.strip_prefix(':') {
        None if rest.is_empty() => Ok(Some(DEFAULT_STACK_DEPTH)),
        Some(n) => match n.parse::<usize>() {
            Ok(n) if (1..=MAX_STACK_DEPTH).contains(&n) => Ok(Some(n)),
            _ => Err(format!(
                "--gpu-exact=stacks:{n}: N is a number of frames, 1 to {MAX_STACK_DEPTH}"
            )),
        },
        None => Err(format!("--gpu-exact={v}: the value is stacks or stacks:N")),
    }
}

/// The paths at the peak of each of the first `devices` devices (`None`
/// where none are kept).
pub(crate) fn read(region: &Region, devices: usize) -> Vec<Option<PeakStacks>> {
    if region.stack_depth() == 0 {
        return Vec::new();
    }
    (0..devices as u32)
        .map(|d| region.peak_stacks(Counter::Device(d)))
        .collect()
}

/// The summary's lines for one breakdown: `BYTES  frame < frame < ...`,
/// the largest [`TOP`] paths, then how many more and their bytes.
pub(crate) fn lines(p: &PeakStacks) -> Vec<String> {
    let mut out: Vec<String> = p
        .by_stack
        .iter()
        .take(TOP)
        .map(|s| {
            let f = &s.stack.frames;
            let mut text = f[..f.len().min(SHOWN_FRAMES)].join(" < ");
            if f.len() > SHOWN_FRAMES {
                text.push_str(&format!(" < ({} more)", f.len() - SHOWN_FRAMES));
            }
            format!("{} {text}", units::bytes(s.bytes))
        })
        .collect();
    if p.by_stack.len() > TOP {
        let rest = &p.by_stack[TOP..];
        out.push(format!(
            "{} in {} more paths",
            units::bytes(rest.iter().map(|s| s.bytes).sum()),
            rest.len()
        ));
    }
    out
}

/// Paths kept per process and device in the run's JSON; the rest summed.
pub(crate) const JSON_TOP: usize = 16;

/// One path in the run's JSON.
#[derive(Debug, Serialize, PartialEq, Eq)]
struct PathJson<'a> {
    /// `library!symbol` (or `library+0xOFFSET`), innermost first.
    frames: &'a [String],
    bytes: u64,
}

/// The paths past [`JSON_TOP`].
#[derive(Debug, Serialize, PartialEq, Eq)]
struct RestJson {
    bytes: u64,
    paths: usize,
}

/// One device's paths at the process's peak, as the run's JSON has them.
#[derive(Debug, Serialize, PartialEq, Eq)]
struct StacksJson<'a> {
    /// The bytes then (the sum of every path's).
    peak_bytes: u64,
    /// The largest [`JSON_TOP`], largest first.
    paths: Vec<PathJson<'a>>,
    rest: RestJson,
}

fn to_json(p: &PeakStacks) -> StacksJson<'_> {
    let rest = p.by_stack.get(JSON_TOP..).unwrap_or(&[]);
    StacksJson {
        peak_bytes: p.peak,
        paths: p
            .by_stack
            .iter()
            .take(JSON_TOP)
            .map(|s| PathJson {
                frames: &s.stack.frames,
                bytes: s.bytes,
            })
            .collect(),
        rest: RestJson {
            bytes: rest.iter().map(|s| s.bytes).sum(),
            paths: rest.len(),
        },
    }
}

/// `stacks_at_peak` of a process in the run's JSON: per device ordinal,
/// the top [`JSON_TOP`] paths and the rest, or null where none are kept
/// (bounded whatever the number of paths the interposer kept).
pub(crate) fn serialize_at_peak<S: Serializer>(
    v: &[Option<PeakStacks>],
    s: S,
) -> Result<S::Ok, S::Error> {
    let mut seq = s.serialize_seq(Some(v.len()))?;
    for p in v {
        seq.serialize_element(&p.as_ref().map(to_json))?;
    }
    seq.end()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprobe_interpose_reader::stacks::{Stack, StackBytes};

    #[test]
    fn the_mode_is_counting_or_stacks_of_a_depth() {
        assert_eq!(parse_mode(""), Ok(None));
        assert_eq!(parse_mode("on"), Ok(None));
        assert_eq!(parse_mode("stacks"), Ok(Some(8)));
        assert_eq!(parse_mode("stacks:3"), Ok(Some(3)));
        assert!(parse_mode("stacks:0").is_err());
        assert!(parse_mode("stacks:33").is_err());
        assert!(parse_mode("stacks:x").unwrap_err().contains("1 to 32"));
        assert!(parse_mode("stack").is_err());
        assert!(parse_mode("stacksy").is_err());
    }

    #[test]
    fn lines_show_the_top_paths_and_sum_the_rest() {
        let s = |id: usize, frames: &[&str], mib: u64| StackBytes {
            stack: Stack {
                id,
                origin: 0,
                frames: frames.iter().map(|f| f.to_string()).collect(),
            },
            bytes: mib << 20,
        };
        let p = PeakStacks {
            peak: 15 << 20,
            at_ns: 1,
            by_stack: vec![
                s(0, &["a!f", "p!g", "p!h", "p!i", "p!j", "p!k"], 8),
                s(1, &["a!f", "p!x"], 4),
                s(2, &["b!y"], 1),
                s(3, &["c!z"], 1),
                s(4, &["c!w"], 1),
            ],
        };
        assert_eq!(
            lines(&p),
            vec![
                "8.00 MiB a!f < p!g < p!h < p!i < (2 more)",
                "4.00 MiB a!f < p!x",
                "1.00 MiB b!y",
                "2.00 MiB in 2 more paths",
            ]
        );
    }

    #[test]
    fn the_json_keeps_the_top_sixteen_and_sums_the_rest() {
        let p = PeakStacks {
            peak: 40,
            at_ns: 1,
            by_stack: (0..20)
                .map(|i| StackBytes {
                    stack: Stack {
                        id: i,
                        origin: 0,
                        frames: vec![format!("lib!f{i}"), "p!main".into()],
                    },
                    bytes: 2,
                })
                .collect(),
        };
        #[derive(Serialize)]
        struct W(#[serde(serialize_with = "serialize_at_peak")] Vec<Option<PeakStacks>>);
        let v = serde_json::to_value(W(vec![Some(p), None])).unwrap();
        assert_eq!(v[1], serde_json::Value::Null);
        let d = &v[0];
        assert_eq!(d["peak_bytes"], 40);
        let paths = d["paths"].as_array().unwrap();
        assert_eq!(paths.len(), JSON_TOP);
        assert_eq!(
            paths[0],
            serde_json::json!({"frames": ["lib!f0", "p!main"], "bytes": 2})
        );
        assert_eq!(d["rest"], serde_json::json!({"bytes": 8, "paths": 4}));
        let kept: u64 = paths.iter().map(|p| p["bytes"].as_u64().unwrap()).sum();
        assert_eq!(kept + d["rest"]["bytes"].as_u64().unwrap(), 40);
    }
}
