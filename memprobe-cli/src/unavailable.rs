//! Why a source was not measured, for people. The JSON outputs carry the
//! whole reason (often a paragraph: the library tried, the OS error, what to
//! install); the summary of `run`, `status` and `watch` show a short one on
//! one line, and the whole one with `-v`.

/// Reasons up to this many characters are shown whole.
const SHORT: usize = 60;

/// `reason` as text for people: whole when `verbose` or already short, else
/// its first clause and a pointer to `-v`.
pub(crate) fn shown(reason: &str, verbose: bool) -> String {
    if verbose || reason.chars().count() <= SHORT {
        return reason.to_string();
    }
    format!("{}; -v for details", first_clause(reason))
}

/// The first clause of a reason: up to its first `: `, ` (` or `; `, at most
/// [`SHORT`] characters (for one-line places with no `-v`, like the chart's
/// footer). A "no GPU readings: " lead-in says nothing the label does not,
/// and is skipped.
pub(crate) fn first_clause(reason: &str) -> &str {
    let r = reason.strip_prefix("no GPU readings: ").unwrap_or(reason);
    let end = [": ", " (", "; "]
        .iter()
        .filter_map(|sep| r.find(sep))
        .min()
        .unwrap_or(r.len());
    let clause = &r[..end];
    match clause.char_indices().nth(SHORT) {
        Some((i, _)) => &clause[..i],
        None => clause,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVML: &str = "no GPU readings: NVML unavailable (libnvidia-ml.so.1): cannot load the NVML library: libnvidia-ml.so.1: cannot open shared object file: No such file or directory; install the NVIDIA driver or set MEMPROBE_NVML_LIBRARY to libnvidia-ml.so (the CUDA runtime is not tried automatically because it creates a CUDA context; set MEMPROBE_GPU_BACKEND=cudart to use it)";

    #[test]
    fn long_reasons_are_cut_unless_verbose() {
        assert_eq!(shown(NVML, false), "NVML unavailable; -v for details");
        assert_eq!(shown(NVML, true), NVML);
        let short = "no GPU is visible to this process";
        assert_eq!(shown(short, false), short);
        let run_on = "x".repeat(200);
        assert_eq!(
            shown(&run_on, false).chars().count(),
            SHORT + "; -v for details".len()
        );
    }
}
