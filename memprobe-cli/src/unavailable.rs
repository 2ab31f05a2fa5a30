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
/// and is skipped. A longer clause is cut between words, marked `…` (a path
/// or a word cut in its middle reads as another one: "/proc/self/m"); one
/// word longer than that is kept whole.
pub(crate) fn first_clause(reason: &str) -> String {
    let r = reason.strip_prefix("no GPU readings: ").unwrap_or(reason);
    let end = [": ", " (", "; "]
        .iter()
        .filter_map(|sep| r.find(sep))
        .min()
        .unwrap_or(r.len());
    let clause = &r[..end];
    let Some((limit, _)) = clause.char_indices().nth(SHORT) else {
        return clause.to_string();
    };
    // The last space at or before the limit: the words before it fit.
    match clause[..=limit].rfind(' ') {
        Some(cut) if !clause[..cut].trim_end().is_empty() => {
            format!("{}…", clause[..cut].trim_end())
        }
        _ => {
            let word_end = clause[limit..]
                .find(' ')
                .map_or(clause.len(), |i| limit + i);
            if word_end == clause.len() {
                clause.to_string()
            } else {
                format!("{}…", &clause[..word_end])
            }
        }
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
        // One word longer than the limit: kept whole, never cut inside.
        let run_on = "x".repeat(200);
        assert_eq!(shown(&run_on, false), format!("{run_on}; -v for details"));
    }

    /// A long clause is cut between words, never inside one (the cgroup's
    /// reason was shown as "…and /proc/self/m").
    #[test]
    fn a_long_clause_is_cut_between_words() {
        let reason = "the memory cgroup could not be found from /proc/self/cgroup and /proc/self/mountinfo, nothing to read";
        let shown = shown(reason, false);
        assert_eq!(
            shown,
            "the memory cgroup could not be found from /proc/self/cgroup…; -v for details"
        );
        for (r, want) in [
            (
                reason,
                "the memory cgroup could not be found from /proc/self/cgroup…",
            ),
            ("short: rest", "short"),
            ("a b", "a b"),
        ] {
            let got = first_clause(r);
            assert_eq!(got, want);
            let words: Vec<&str> = r.split([' ', ':']).collect();
            for w in got.trim_end_matches('…').split(' ') {
                assert!(words.contains(&w), "{w:?} is a whole word of {r:?}");
            }
        }
        let long_word = format!("{} {}", "y".repeat(SHORT + 10), "tail");
        assert_eq!(
            first_clause(&long_word),
            format!("{}…", "y".repeat(SHORT + 10))
        );
    }
}
