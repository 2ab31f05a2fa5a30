//! PyTorch attribution records under `memprobe run`: the command finds a
//! private directory in MEMPROBE_ATTRIBUTION_DIR, the records it writes
//! there reach the summary (one line per epoch, its top three blocks) and
//! the JSON's `torch_attribution`, bad or partial files are skipped with a
//! warning, and the directory is gone after the run; a directory the user
//! named is read for this run's files only and left as it was. The child
//! is a shell script writing records as an integration would (temporary
//! name, then rename): no torch needed.

use crate::schema::assert_valid;
use crate::support::*;
use serde_json::{json, Value};
use std::ffi::OsString;

fn record(epoch: u64, rank: u64, blocks: &[(u64, &str, u64)], rest: u64) -> Value {
    let peak: u64 = blocks.iter().map(|b| b.0).sum::<u64>() + rest;
    json!({
        "schema": "memprobe.torch_attribution/1", "kind": "epoch_peak",
        "rank": rank, "epoch": epoch, "step": 100 * epoch + 12, "stage": "train", "device": 0,
        "peak_bytes": peak, "requested_bytes": null,
        "blocks": blocks.iter().map(|(b, file, line)| json!({
            "bytes": b, "stream": 0, "address": 140_000_000u64,
            "frames": [{"file": file, "line": line, "function": "forward"}], "module": null
        })).collect::<Vec<_>>(),
        "rest": {"bytes": rest, "blocks": 2}, "segments": null,
        "history": {"complete": true, "entries": 500, "lost_entries": false},
        "cost_ms": 1.5
    })
}

/// A shell script that writes each `(name, content)` into the directory
/// memprobe names, through a temporary name, and prints the directory and
/// its mode.
fn writer(files: &[(&str, String)]) -> Vec<OsString> {
    let mut script = String::from(
        "d=\"$MEMPROBE_ATTRIBUTION_DIR\"; test -n \"$d\" || exit 3; echo \"dir $d\"; stat -c 'mode %a' \"$d\"\n",
    );
    for (name, content) in files {
        script.push_str(&format!(
            "cat > \"$d/.{name}.tmp\" <<'EOF'\n{content}\nEOF\nmv \"$d/.{name}.tmp\" \"$d/{name}\"\n"
        ));
    }
    vec!["sh".into(), "-c".into(), script.into()]
}

#[test]
fn each_epochs_peak_step_reaches_the_summary_and_the_json() {
    let files = [
        (
            "epoch-0-rank-0.json",
            record(
                0,
                0,
                &[(1 << 30, "/w/train.py", 42), (256 << 20, "/w/model.py", 7)],
                160,
            )
            .to_string(),
        ),
        (
            "epoch-1-rank-0.json",
            record(
                1,
                0,
                &[
                    (2 << 30, "/w/train.py", 42),
                    (512 << 20, "/w/model.py", 9),
                    (1 << 20, "/w/x.py", 1),
                    (4096, "/w/y.py", 2),
                ],
                64,
            )
            .to_string(),
        ),
        // A writer that died mid-file, and a record whose blocks do not
        // make its peak: skipped, said so, the run goes on.
        (
            "epoch-2-rank-0.json",
            "{\"schema\": \"memprobe.torch_attr".into(),
        ),
        ("epoch-3-rank-0.json", {
            let mut r = record(3, 0, &[(1000, "/w/train.py", 1)], 0);
            r["peak_bytes"] = 999.into();
            r.to_string()
        }),
    ];
    let (o, v) = run_json(&["--no-live"], &writer(&files), None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_valid("docs/run-output.schema.json", &v);
    let out = String::from_utf8_lossy(&o.stdout);
    let dir = out
        .lines()
        .find_map(|l| l.strip_prefix("dir "))
        .expect("the command saw the directory");
    assert!(out.contains("mode 700"), "private: {out}");
    assert!(
        !std::path::Path::new(dir).exists(),
        "{dir} left after the run"
    );
    let t = v["torch_attribution"].as_array().unwrap();
    assert_eq!(t.len(), 2, "{t:#?}");
    assert_eq!(t[0]["epoch"], 0);
    assert_eq!(t[1]["step"], 112);
    assert_eq!(u(&t[1]["blocks"][0]["bytes"]), 2 << 30);
    assert_eq!(t[1]["blocks"][0]["frames"][0]["line"], 42);
    let text = stderr(&o);
    let line = |label: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("  {label}")))
            .unwrap_or_else(|| panic!("no '{label}' line in\n{text}"))
            .to_owned()
    };
    assert!(
        line("torch epoch 0").ends_with(
            "step 12, train, GPU 0 1.25 GiB: 1.00 GiB train.py:42 forward, 256 MiB model.py:7 forward, rest 160 B in 2 blocks"
        ),
        "{text}"
    );
    // Three blocks at most; the others join the rest.
    assert!(
        line("torch epoch 1").ends_with(
            "2.00 GiB train.py:42 forward, 512 MiB model.py:9 forward, 1.00 MiB x.py:1 forward, rest 4.06 KiB in 3 blocks"
        ),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l
            .starts_with("memprobe: warning: attribution record epoch-2-rank-0.json: ")
            && l.ends_with("(skipped)")),
        "{text}"
    );
    assert!(
        text.contains("memprobe: warning: attribution record epoch-3-rank-0.json: blocks (1000) + rest (0) != peak_bytes (999) (skipped)"),
        "{text}"
    );
}

#[test]
fn a_directory_the_user_named_is_read_for_this_run_and_kept() {
    let dir = scratch("attribution-user");
    // From an earlier run: not this run's.
    std::fs::write(
        dir.join("epoch-5-rank-0.json"),
        record(5, 0, &[(1 << 20, "/w/old.py", 1)], 0).to_string(),
    )
    .unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(dir.join("epoch-5-rank-0.json"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    let files = [(
        "epoch-0-rank-1.json",
        record(0, 1, &[(8 << 20, "/w/train.py", 3)], 0).to_string(),
    )];
    let (o, v) = run_json(
        &["--no-live"],
        &writer(&files),
        Some(("MEMPROBE_ATTRIBUTION_DIR", dir.display().to_string())),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let t = v["torch_attribution"].as_array().unwrap();
    assert_eq!(t.len(), 1, "{t:#?}");
    assert_eq!(t[0]["rank"], 1);
    assert!(
        stderr(&o).contains("  torch epoch 0 rank 1"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        listing(&dir),
        vec!["epoch-0-rank-1.json", "epoch-5-rank-0.json"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_chart_marks_each_epochs_peak_step_with_its_top_block() {
    // Epoch 0's peak step is step 1 (the helper's phases: one epoch of
    // three steps, the second spiking); epoch 1 has no phase, so its
    // step's time is unknown: counted, not drawn.
    let mut e0 = record(
        0,
        0,
        &[(1 << 30, "/w/train.py", 42), (256 << 20, "/w/model.py", 7)],
        160,
    );
    e0["step"] = 1.into();
    let files = [
        ("epoch-0-rank-0.json", e0.to_string()),
        (
            "epoch-1-rank-0.json",
            record(1, 0, &[(2 << 30, "/w/train.py", 42)], 0).to_string(),
        ),
    ];
    // The records first, then the helper sends its phases.
    let (helper, env) = crate::helper::argv(&["phase-garbage"]);
    let mut argv = writer(&files);
    let script = format!("{}exec \"$@\"\n", argv[2].to_string_lossy());
    argv[2] = script.into();
    argv.push("sh".into());
    argv.extend(helper);
    let dir = scratch("attribution-plot");
    let svg = dir.join("run.svg");
    let (o, v) = run_json(
        &["--no-live", "--plot", svg.to_str().unwrap()],
        &argv,
        Some((env.0, env.1)),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["torch_attribution"].as_array().unwrap().len(), 2);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("epoch 0 peak, step 1: 1.00 GiB train.py:42 forward (+3)"),
        "no epoch 0 label in the chart"
    );
    assert!(!text.contains("epoch 1 peak"), "epoch 1 has no step time");
    assert!(
        text.contains("1 torch epoch peak not drawn (its step&apos;s time unknown)"),
        "the footer counts epoch 1"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
