//! memprobe as the tree's subreaper (`PR_SET_CHILD_SUBREAPER`): a process of
//! the run whose parent ended before it is reparented to memprobe instead of
//! to init, and memprobe reaps it, with how it ended. Without this, a worker
//! orphaned and then OOM-killed is reaped by init at once, unseen. No
//! privilege needed: it is the fallback that works for everyone, where the
//! kernel's process events ([`crate::commands::run::process_events`]) need root.
//!
//! What the command sees: an orphan's `getppid()` is memprobe's pid, not 1,
//! while memprobe runs (as under any service manager that is a subreaper).
//! Only orphans are seen this way: a worker reaped by its own live parent
//! between two samples is not. And a reaped orphan is taken as a member of
//! the tree only where a sample (or the kernel's process events) saw it
//! there: the shell that became memprobe may have left processes of its own
//! whose orphans reach memprobe too.

/// Makes memprobe the subreaper of what it spawns from now on; `false`
/// where the kernel refuses.
pub(crate) fn become_subreaper() -> bool {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 }
}

/// One orphan reaped: its pid, name and wait status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reaped {
    pub(crate) pid: u32,
    pub(crate) name: String,
    pub(crate) wait_status: i32,
}

/// memprobe's children from before it started the command: a shell that
/// ran `cmd & exec memprobe run ...` leaves `cmd` a child of memprobe,
/// which is no orphan of the run's tree.
pub(crate) fn inherited() -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// Reaps the orphans that have ended, leaving `root` (the command, reaped
/// by [`crate::commands::run::child::reap`] for its `ru_maxrss`) alone. memprobe spawns no
/// other process: any other child is an orphan of the run's tree, except
/// those in `inherited` (reaped too, as their parent would have, but not
/// reported).
pub(crate) fn reap(root: u32, inherited: &[u32]) -> Vec<Reaped> {
    let mut out = Vec::new();
    while let Some(r) = reap_one(libc::P_ALL, 0, root, inherited) {
        out.extend(r);
    }
    out
}

/// Like [`reap`], for `pids` only (the members seen gone at a tick): each
/// a look at one process, where [`reap`]'s search goes over every child
/// of memprobe at each orphan, which a tree of hundreds orphaned at once
/// would make quadratic.
pub(crate) fn reap_pids(pids: &[u32], root: u32, inherited: &[u32]) -> Vec<Reaped> {
    let mut out = Vec::new();
    for &pid in pids {
        if let Some(r) = reap_one(libc::P_PID, pid, root, inherited) {
            out.extend(r);
        }
    }
    out
}

/// Reaps one ended child of memprobe among `(idtype, id)` that is not
/// `root`: `None` when there is none, `Some(None)` for one of `inherited`
/// (reaped, not reported).
fn reap_one(
    idtype: libc::idtype_t,
    id: libc::id_t,
    root: u32,
    inherited: &[u32],
) -> Option<Option<Reaped>> {
    // SAFETY: siginfo_t is plain data, written by the kernel.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid siginfo pointer; looks without reaping.
    let rc = unsafe {
        libc::waitid(
            idtype,
            id,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: si_pid is set by waitid (0 when nothing has ended).
    let pid = unsafe { info.si_pid() };
    if rc != 0 || pid <= 0 || pid as u32 == root {
        return None;
    }
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default();
    let mut status = 0;
    // SAFETY: a valid status pointer; `pid` is our ended child.
    if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } != pid {
        return None;
    }
    if inherited.contains(&(pid as u32)) {
        return Some(None);
    }
    Some(Some(Reaped {
        pid: pid as u32,
        name,
        wait_status: status,
    }))
}
