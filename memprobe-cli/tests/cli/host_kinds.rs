//! Host memory by kind at the tree's and each process's RAM peak.

use crate::support::*;
use serde_json::Value;

const SHM_MIB: u64 = 64;
const ANON_MIB: u64 = 96;

fn kinds(v: &Value) -> &Value {
    &v["host_kinds_at_peak"]
}

/// A DataLoader-like tree: a 64 MiB buffer in /dev/shm/torch_* mapped by
/// the command and two workers, and 96 MiB of the command's own. At the
/// tree's peak the split says so (the shared buffer once per process, as
/// the summed RSS counts it), and the sampled mappings name the buffer.
#[test]
fn the_peak_is_split_by_kind_and_the_torch_buffers_are_named() {
    let (out, json) = run_helper_json(
        &["--interval", "20ms"],
        &[
            "shm-buffers",
            &SHM_MIB.to_string(),
            &ANON_MIB.to_string(),
            "1500",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    crate::schema::assert_valid("docs/run-output.schema.json", &json);
    let tree = kinds(&json["tree"]);
    assert_eq!(
        u(&tree["anon_bytes"]) + u(&tree["file_bytes"]) + u(&tree["shmem_bytes"]),
        u(&tree["rss_bytes"]),
        "the kinds sum to the sample: {tree}"
    );
    assert!(u(&tree["shmem_bytes"]) >= 3 * SHM_MIB * MIB, "{tree}");
    assert!(u(&tree["anon_bytes"]) >= ANON_MIB * MIB, "{tree}");
    assert!(u(&json["tree"]["peak_rss_bytes"]) >= u(&tree["rss_bytes"]));
    let sampled = &tree["sampled"];
    let torch = sampled["mappings"]
        .as_array()
        .unwrap_or_else(|| panic!("no sampled mappings: {tree}"))
        .iter()
        .find(|m| m["name"] == "/dev/shm/torch_*")
        .unwrap_or_else(|| panic!("the torch buffers not named: {sampled}"));
    // Read near the peak, within a budget: as much of the buffer as the
    // readings found mapped, never more than the three mappings of it.
    assert!(
        (1..=3 * SHM_MIB * MIB).contains(&u(&torch["rss_bytes"])),
        "{torch}"
    );
    assert!(u(&sampled["processes"]) >= 1, "{sampled}");
    // The command's own peak: its anon memory and its share of the buffer.
    let command = json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == json["pid"])
        .unwrap();
    let own = kinds(command);
    assert!(u(&own["anon_bytes"]) >= ANON_MIB * MIB, "{own}");
    assert!(u(&own["shmem_bytes"]) >= SHM_MIB * MIB, "{own}");
    // Its share of the buffer, read near its peak (within the budget: it
    // may be a reading from before it mapped the buffer): never more than
    // the buffer.
    let pss = &own["sampled"]["pss"];
    assert!(u(&pss["pss_shmem_bytes"]) <= SHM_MIB * MIB, "{own}");
    let cost = &json["host_kinds"];
    assert!(u(&cost["reads"]) >= 1, "{cost}");
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.contains("RAM by kind"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("shmem") && line.contains("/dev/shm/torch_*"),
        "{line}"
    );
}

/// --no-host-kinds keeps none and reads no smaps.
#[test]
fn no_host_kinds_keeps_none() {
    let (out, json) = run_helper_json(
        &["--interval", "20ms", "--no-host-kinds"],
        &["spike-then-run", "32", "300"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    crate::schema::assert_valid("docs/run-output.schema.json", &json);
    assert!(kinds(&json["tree"]).is_null(), "{}", json["tree"]);
    assert!(json.get("host_kinds").is_none());
    assert!(!stderr(&out).contains("RAM by kind"));
}
