//! The files `run` writes: JSON (against the schema), CSV, SVG.

use crate::schema::assert_valid;
use crate::support::*;

#[test]
fn json_matches_the_schema() {
    let (out, json) = run_helper_json(&["--interval", "5ms"], &["workers", "2", "16", "200"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_valid("docs/run-output.schema.json", &json);
    assert_eq!(json["schema_version"], 1);
    assert_eq!(json["kind"], "run");
    assert_eq!(json["interval_s"], 0.005);
    assert_eq!(json["timeline_merged"], 1);
    assert_eq!(
        json["timeline"].as_array().unwrap().len() as u64,
        u(&json["samples"])
    );
    // Either a cgroup or the reason there is none.
    assert!(json["cgroup"].is_object() || json["unavailable"]["cgroup"].is_string());
    // GPUs, or the reason there are none (on a machine without a driver).
    let gpus = json["gpus"].as_array().map_or(0, |a| a.len());
    assert!(
        gpus > 0 || json["unavailable"]["gpus"].is_string(),
        "{json}"
    );

    // Killed by a signal: the other branch of every nullable field.
    let (out, json) = run_json(
        &[],
        &["sh".into(), "-c".into(), "kill -KILL $$".into()],
        None,
    );
    assert_eq!(out.status.code(), Some(137));
    assert_valid("docs/run-output.schema.json", &json);
    assert_eq!(json["exit"]["code"], serde_json::Value::Null);
    assert_eq!(json["exit"]["status"], 137);
}

#[test]
fn csv_header_and_rows() {
    let dir = scratch("csv");
    let (csv, json) = (dir.join("t.csv"), dir.join("t.json"));
    let (argv, env) = crate::helper::argv(&["sleep", "150"]);
    let out = memprobe()
        .arg("run")
        .arg("--csv")
        .arg(&csv)
        .arg("--json")
        .arg(&json)
        .args(["--interval", "10ms", "--"])
        .args(&argv)
        .env(env.0, env.1)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&csv).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let expected = if v["cgroup"].is_object() {
        "t_s,tree_rss_bytes,processes,cgroup_bytes"
    } else {
        "t_s,tree_rss_bytes,processes"
    };
    assert_eq!(header, expected);
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len() as u64, u(&v["samples"]));
    assert!(rows.len() >= 10, "{} rows for 150 ms at 10 ms", rows.len());
    let columns = header.split(',').count();
    let mut last_t = -1.0;
    for r in &rows {
        let cells: Vec<&str> = r.split(',').collect();
        assert_eq!(cells.len(), columns, "{r}");
        let t: f64 = cells[0].parse().unwrap();
        assert!(t > last_t, "time goes forward: {r}");
        last_t = t;
        let _: u64 = cells[1].parse().unwrap();
        let _: u32 = cells[2].parse().unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn svg_has_series_and_axes() {
    let dir = scratch("svg");
    let svg = dir.join("run.svg");
    let (argv, env) = crate::helper::argv(&["workers", "1", "32", "200"]);
    let out = memprobe()
        .arg("run")
        .arg("--plot")
        .arg(&svg)
        .arg("--")
        .args(&argv)
        .env(env.0, env.1)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("wrote"), "{}", stderr(&out));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..100.min(text.len())]);
    assert!(text.trim_end().ends_with("</svg>"));
    for needle in [
        "host tree RSS",
        "time since start (s)",
        "memory (",
        "peak single process",
        "peak ",
    ] {
        assert!(text.contains(needle), "no {needle:?} in the SVG");
    }
    // MiB, or GiB when the container holds 2 GiB or more.
    assert!(text.contains("memory (MiB)") || text.contains("memory (GiB)"));
    if text.contains("cgroup") {
        assert!(text.contains("container (cgroup"));
    }
    assert_eq!(listing(&dir), vec!["run.svg"], "no temporary file left");
    std::fs::remove_dir_all(&dir).unwrap();
}
