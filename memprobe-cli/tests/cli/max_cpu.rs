//! `--max-cpu`: memprobe's own CPU capped by widening the interval, said in
//! the summary and the JSON.

use crate::support::*;

/// Sampling 17 processes every 200 µs costs far more than 0.05 % of a
/// core: the interval widens, the run says so, and the tree is still
/// followed whole.
#[test]
fn a_cap_widens_the_interval_and_says_so() {
    let (out, json) = run_helper_json(
        &["--interval", "200us", "--max-cpu", "0.05%"],
        &["workers", "16", "1", "2500"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    crate::schema::assert_valid("docs/run-output.schema.json", &json);
    let cap = &json["cpu_cap"];
    assert_eq!(cap["max_cpu_percent"].as_f64(), Some(0.05), "{cap}");
    assert!(u(&cap["widenings"]) >= 1, "{cap}");
    let widest = cap["widest_interval_s"].as_f64().unwrap();
    assert!(widest >= 0.002, "widened tenfold at least: {cap}");
    // Far fewer samples than the interval asked for would take.
    let asked = json["duration_s"].as_f64().unwrap() / 200e-6;
    assert!(
        (u(&json["samples"]) as f64) < asked / 5.0,
        "{}",
        json["samples"]
    );
    // Every worker seen, with its exact peak.
    let root = u(&json["pid"]);
    let workers = json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["ppid"].as_u64() == Some(root))
        .count();
    assert_eq!(workers, 16, "{}", json["processes"]);
    let err = stderr(&out);
    assert!(err.contains("widened up to"), "{err}");
    assert!(err.contains("--max-cpu 0.05%"), "{err}");
    assert!(err.contains("capped at 0.05%"), "{err}");
}

/// Without the option there is no cap in the JSON, and the summary still
/// says what memprobe cost.
#[test]
fn without_a_cap_the_cost_is_still_shown() {
    let (out, json) = run_helper_json(&["--interval", "10ms"], &["sleep", "300"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(json.get("cpu_cap").is_none(), "{json}");
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.contains("memprobe CPU"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("% of one core"), "{line}");
    assert!(!err.contains("widened"), "{err}");
}

#[test]
fn a_cap_out_of_range_is_a_usage_error() {
    for bad in ["0", "0%", "101%", "-1", "one"] {
        let out = memprobe()
            .args(["run", &format!("--max-cpu={bad}"), "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("--max-cpu"),
            "{bad}: {}",
            stderr(&out)
        );
    }
}
