//! A side effect of the OOM watch: members seen ended are looked at again
//! in `/proc` until their wait status is read from their zombie.

use super::counters::MAX_CHANGES;

/// How long an ended member is watched for its zombie state.
const ZOMBIE_WATCH_NS: u64 = 2_000_000_000;

/// Catches how members that are not memprobe's child ended. A sample sees
/// a process end when it releases its memory, a moment before it becomes a
/// zombie; its parent then reaps it, at once or at its next poll. So a
/// member ended without a wait status is looked at again at every tick
/// until it is a zombie (its status read), gone (reaped), or 2 s passed.
#[derive(Debug, Default)]
pub(crate) struct ZombieWatch {
    pending: Vec<(u32, u64)>,
}

impl ZombieWatch {
    /// `pid` was seen ended at `now`: its wait status if it is a zombie
    /// already, else it is watched.
    pub(crate) fn ended(&mut self, pid: u32, now: u64) -> Option<i32> {
        let status = memprobe_core::internal::process::zombie_wait_status(pid);
        if status.is_none() && self.pending.len() < MAX_CHANGES {
            self.pending.push((pid, now));
        }
        status
    }

    /// Looks at the watched members again at `now`: those caught as
    /// zombies, with their wait status.
    pub(crate) fn tick(&mut self, now: u64) -> Vec<(u32, i32)> {
        let mut caught = Vec::new();
        self.pending.retain(|&(pid, since)| {
            if let Some(s) = memprobe_core::internal::process::zombie_wait_status(pid) {
                caught.push((pid, s));
                return false;
            }
            now.saturating_sub(since) < ZOMBIE_WATCH_NS
                && std::path::Path::new(&format!("/proc/{pid}")).exists()
        });
        caught
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    #[test]
    fn the_watch_catches_a_killed_process_as_a_zombie() {
        let mut kid = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let mut w = ZombieWatch::default();
        assert_eq!(w.ended(kid.id(), 0), None, "still running");
        kid.kill().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let caught = loop {
            let c = w.tick(MS);
            if !c.is_empty() {
                break c;
            }
            assert!(std::time::Instant::now() < deadline, "never caught");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(caught, vec![(kid.id(), libc::SIGKILL)]);
        assert!(w.tick(2 * MS).is_empty(), "reported once");
        kid.wait().unwrap();
        // Watched no longer than 2 s.
        let mut other = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert_eq!(w.ended(other.id(), 0), None);
        assert!(w.tick(3 * S).is_empty());
        assert!(w.pending.is_empty());
        other.kill().unwrap();
        other.wait().unwrap();
    }
}
