//! A side effect of the OOM watch: memprobe shields itself from the OOM
//! killer before it spawns the command.

/// Keeps the OOM killer off memprobe itself, where it may: writes -1000
/// to `/proc/self/oom_score_adj` (lowering it needs `CAP_SYS_RESOURCE`;
/// without it nothing changes). Why: memprobe shares its container with the
/// command. When the kernel kills the command, the victim's memory is
/// released a moment later; an allocation of memprobe's in that moment would
/// find the container still full and, with the victim already dealt with,
/// memprobe the next process to kill, leaving the OOM kill unexplained.
/// Shielded, memprobe waits for the memory instead. Its own memory is
/// bounded (a timeline of at most 100 000 points).
///
/// Returns the value to give the command back (a child inherits the value
/// at fork; raising it back needs no privilege): `None` when nothing changed.
pub(crate) fn shield_self() -> Option<i32> {
    let before: i32 = std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    std::fs::write("/proc/self/oom_score_adj", b"-1000").ok()?;
    Some(before)
}
