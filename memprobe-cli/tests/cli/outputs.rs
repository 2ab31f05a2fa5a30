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

/// Whether `p` is a character device.
fn is_char_device(p: &str) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_char_device())
}

/// `--json /dev/full`: the device stays a device, the write error (ENOSPC)
/// is reported, "wrote" is not claimed, and the run fails; `/dev/null` is
/// written to and stays a device. The same for every output option.
#[test]
fn a_device_is_written_to_never_replaced() {
    for opt in ["--json", "--csv", "--plot"] {
        if !std::path::Path::new("/dev/full").exists() || opt == "--plot" {
            // The chart must be named .svg: a device is checked with --json
            // and --csv only.
            continue;
        }
        let out = memprobe()
            .args(["run", opt, "/dev/full", "--", "true"])
            .output()
            .unwrap();
        let err = stderr(&out);
        assert!(is_char_device("/dev/full"), "{opt}: /dev/full replaced");
        assert_eq!(out.status.code(), Some(1), "{opt}: {err}");
        assert!(!err.contains("wrote /dev/full"), "{opt}: {err}");
        assert!(err.contains("/dev/full"), "{opt}: {err}");
        assert!(err.to_lowercase().contains("no space"), "{opt}: {err}");
        let out = memprobe()
            .args(["run", opt, "/dev/null", "--", "true"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{opt}: {}", stderr(&out));
        assert!(is_char_device("/dev/null"), "{opt}: /dev/null replaced");
    }
}

/// An output named through a symbolic link lands on the link's target
/// (made beside it); the link stays.
#[test]
fn a_symbolic_link_output_updates_its_target() {
    let dir = scratch("symlink-out");
    std::fs::create_dir(dir.join("real")).unwrap();
    for (opt, name) in [
        ("--json", "run.json"),
        ("--csv", "run.csv"),
        ("--plot", "run.svg"),
    ] {
        let target = dir.join("real").join(name);
        std::fs::write(&target, b"stale").unwrap();
        let link = dir.join(format!("link-{name}"));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let out = memprobe()
            .arg("run")
            .arg(opt)
            .arg(&link)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{opt}: {}", stderr(&out));
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        let text = std::fs::read_to_string(&target).unwrap();
        assert_ne!(text, "stale", "{opt}: the target was left stale");
        assert_eq!(std::fs::read_to_string(&link).unwrap(), text);
    }
    assert_eq!(
        listing(&dir.join("real")),
        vec!["run.csv", "run.json", "run.svg"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--json /dev/stdout` writes the document on memprobe's stdout (a pipe
/// here); `--csv` to a FIFO another program reads.
#[test]
fn stdout_and_a_fifo_are_written_to() {
    let out = memprobe()
        .args(["run", "--json", "/dev/stdout", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(doc["kind"], "run");

    let dir = scratch("fifo-out");
    let fifo = dir.join("rows");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(&fifo).unwrap())
    };
    let out = memprobe()
        .arg("run")
        .arg("--csv")
        .arg(&fifo)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let rows = reader.join().unwrap();
    assert!(rows.starts_with("t_s,"), "{rows}");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert_eq!(listing(&dir), vec!["rows"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--html` writes one page holding the run's whole document (the same as
/// `--json`'s), with nothing to fetch. (The page is driven in a browser by
/// the unit tests of `run/html`.)
#[test]
fn html_page_embeds_the_run_and_fetches_nothing() {
    let dir = scratch("html");
    let (page, json) = (dir.join("run.html"), dir.join("run.json"));
    let (argv, env) = crate::helper::argv(&["workers", "2", "16", "300"]);
    let out = memprobe()
        .arg("run")
        .arg("--html")
        .arg(&page)
        .arg("--json")
        .arg(&json)
        .arg("--")
        .args(&argv)
        .env(env.0, env.1)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("wrote"), "{}", stderr(&out));
    let html = std::fs::read_to_string(&page).unwrap();
    for bad in ["src=", "href=", "http://", "https://"] {
        assert!(!html.contains(bad), "{bad} in the page");
    }
    let key = "id=\"memprobe-data\">";
    let start = html.find(key).unwrap() + key.len();
    let end = start + html[start..].find("</script>").unwrap();
    let embedded: serde_json::Value = serde_json::from_str(&html[start..end]).unwrap();
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(embedded == doc, "the page's document is not --json's");
    assert_eq!(u(&embedded["processes_seen"]), 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--html` and `--json` naming one file is a usage error before anything runs.
#[test]
fn html_and_json_on_one_file_is_a_usage_error() {
    let dir = scratch("html-same");
    let f = dir.join("x");
    let out = memprobe()
        .arg("run")
        .arg("--html")
        .arg(&f)
        .arg("--json")
        .arg(&f)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--html"), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}
