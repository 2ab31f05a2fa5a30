//! `memprobe run --pss`: the tree's PSS and USS beside its summed RSS, with
//! workers sharing their parent's pages.

use crate::support::*;

const BUF_MIB: u64 = 256;
const WORKERS: u64 = 4;

/// The command touches 256 MiB and forks 4 workers that only read it, and
/// all hold it for 1.5 s. Summed RSS counts the buffer in every process
/// (about 5 × 256 MiB); the tree's PSS counts it once; no process owns it
/// alone, so it is in nobody's USS. Real kernel figures: every bound leaves
/// at least 10% of the buffer (5% where the buffer itself is measured), and
/// the steady state is taken well inside the hold.
#[test]
fn pss_counts_the_pages_workers_share_once() {
    let dir = scratch("pss");
    let csv = dir.join("run.csv");
    let csv_arg = csv.to_str().unwrap();
    let svg = dir.join("run.svg");
    let (out, json) = run_helper_json(
        &[
            "--pss",
            "--interval",
            "50ms",
            "--csv",
            csv_arg,
            "--plot",
            svg.to_str().unwrap(),
        ],
        &[
            "shared-workers",
            &WORKERS.to_string(),
            &BUF_MIB.to_string(),
            "1500",
        ],
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    crate::schema::assert_valid("docs/run-output.schema.json", &json);

    let buf = BUF_MIB * MIB;
    let points = json["timeline"].as_array().unwrap();
    assert!(points.iter().all(|p| p.get("tree_pss_bytes").is_some()));
    // The steady state: all five processes up, the workers done reading
    // (they read for well under 0.5 s; the hold is 1.5 s), and the command
    // not yet reaping them. Before it, the buffer was the command's alone (its
    // USS), and a reading taken while workers fork is not atomic across them.
    let steady: Vec<_> = points
        .iter()
        .filter(|p| u(&p["processes"]) == WORKERS + 1)
        .filter(|p| (0.6..1.3).contains(&p["t_s"].as_f64().unwrap()))
        .collect();
    assert!(steady.len() >= 3, "too few steady samples: {points:?}");
    for p in &steady {
        let (rss, pss, uss) = (
            u(&p["tree_rss_bytes"]),
            u(&p["tree_pss_bytes"]),
            u(&p["tree_uss_bytes"]),
        );
        eprintln!("at {}: summed RSS {rss}, PSS {pss}, USS {uss}", p["t_s"]);
        assert!(rss >= (WORKERS + 1) * buf * 95 / 100, "rss {rss} at {p}");
        assert!(
            pss >= buf * 95 / 100 && pss <= buf * 110 / 100,
            "pss {pss} at {p}"
        );
        assert!(rss >= pss + WORKERS * buf * 9 / 10, "at {p}");
        assert!(uss <= buf / 10, "uss {uss} at {p}");
    }

    let pss = &json["pss"];
    let peak_pss = u(&pss["peak_pss_bytes"]);
    assert!(peak_pss >= buf * 95 / 100, "pss {peak_pss}");
    assert!(u(&json["tree"]["peak_rss_bytes"]) >= peak_pss + WORKERS * buf * 9 / 10);
    assert!(u(&pss["peak_uss_bytes"]) <= peak_pss);
    assert!(u(&pss["command_pss_at_peak_bytes"]) <= peak_pss);
    assert!(u(&pss["processes_at_peak"]) >= 1);
    assert_eq!(u(&pss["read_errors"]), 0);
    assert_eq!(u(&pss["reads"]), u(&json["samples"]));
    assert!(pss["mean_read_s"].as_f64().unwrap() > 0.0);

    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    assert!(
        header.starts_with("t_s,tree_rss_bytes,processes,tree_pss_bytes,tree_uss_bytes"),
        "{header}"
    );
    assert_eq!(lines.count(), points.len());

    assert!(err.contains("tree PSS / USS"), "{err}");
    assert!(
        err.contains("(summed; shared pages counted once per process) · PSS "),
        "{err}"
    );
    assert!(err.contains("beyond the command"), "{err}");
    assert!(err.contains("other process"), "{err}");
    // The chart draws both beside the summed RSS.
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.contains("host tree PSS (shared pages counted once)"));
    assert!(chart.contains("host tree USS (pages of one process only)"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Without --pss nothing of it appears.
#[test]
fn no_pss_without_the_option() {
    let dir = scratch("no-pss");
    let svg = dir.join("run.svg");
    let (out, json) = run_helper_json(&["--plot", svg.to_str().unwrap()], &["exit", "0"]);
    assert!(out.status.success());
    assert!(!std::fs::read_to_string(&svg).unwrap().contains("PSS"));
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(json.get("pss").is_none());
    assert!(json["timeline"][0].get("tree_pss_bytes").is_none());
    assert!(!stderr(&out).contains("PSS"));
}
