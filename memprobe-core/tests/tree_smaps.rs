//! The tree's PSS and USS against summed RSS, on a real kernel: a process
//! touches a 256 MiB buffer and forks 4 workers that only read it (as
//! DataLoader workers share a trainer's pages copy-on-write).

use memprobe_core::ProcessTreeSampler;
use memprobe_core::SmapsMetric;
use memprobe_core::TreeSmapsSampler;
use memprobe_core::{Sampler, Source, SourceKind};

const MIB: u64 = 1 << 20;
const BUF_MIB: u64 = 256;
const WORKERS: usize = 4;

/// Forks the tree: a parent holding the buffer and `WORKERS` workers reading
/// it, all sleeping until killed. Returns the parent's pid once every worker
/// has read the whole buffer. Forked code makes raw system calls only (the
/// test harness has other threads).
fn shared_buffer_tree() -> libc::pid_t {
    let mut fds = [0; 2];
    // SAFETY: a valid array of two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only makes raw system calls, then never returns.
    let parent = unsafe { libc::fork() };
    assert!(parent >= 0, "fork failed");
    if parent == 0 {
        // SAFETY: raw system calls on memory this process maps.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            let len = (BUF_MIB * MIB) as usize;
            let buf = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
            .cast::<u8>();
            if buf.cast() == libc::MAP_FAILED {
                libc::_exit(1);
            }
            for off in (0..len).step_by(4096) {
                buf.add(off).write_volatile(1);
            }
            for _ in 0..WORKERS {
                if libc::fork() == 0 {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    let mut sum = 0u32;
                    for off in (0..len).step_by(4096) {
                        sum += u32::from(buf.add(off).read_volatile());
                    }
                    let ok = [u8::from(sum > 0)];
                    libc::write(fds[1], ok.as_ptr().cast(), 1);
                    loop {
                        libc::pause();
                    }
                }
            }
            loop {
                libc::pause();
            }
        }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(fds[1]) };
    let mut ready = 0;
    for _ in 0..WORKERS {
        let mut b = [0u8];
        // SAFETY: a one-byte buffer.
        if unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) } == 1 && b[0] == 1 {
            ready += 1;
        }
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fds[0]) };
    assert_eq!(ready, WORKERS, "the workers did not all read the buffer");
    parent
}

fn kill(pid: libc::pid_t) {
    // SAFETY: our child; the workers die with it (PR_SET_PDEATHSIG).
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}

/// Summed RSS counts the buffer in every process (5 times), the tree's PSS
/// once, and the USS not at all (no process owns it alone). Tolerances: the
/// figures come from a real kernel, and the forked parent shares the test
/// binary's own pages with this process, so each check leaves 10% of the
/// buffer (or 5% where the buffer itself is measured).
#[test]
fn shared_pages_count_once_in_the_tree_pss() {
    let root = shared_buffer_tree();
    let root_u = root as u32;
    let rss = ProcessTreeSampler::at(root_u).unwrap().read().unwrap().used;
    let mut pss_sampler = TreeSmapsSampler::at(root_u, SmapsMetric::Pss).unwrap();
    let both = pss_sampler.read_tree().unwrap();
    kill(root);

    let buf = BUF_MIB * MIB;
    eprintln!(
        "tree of {} processes: summed RSS {} MiB, PSS {} MiB, USS {} MiB (buffer {BUF_MIB} MiB)",
        both.processes.len(),
        rss / MIB,
        both.pss / MIB,
        both.uss / MIB
    );
    assert_eq!(both.processes.len(), WORKERS + 1, "{both:?}");
    assert!(both.processes.iter().any(|p| p.pid == root_u), "no root");
    // Summed RSS: (workers + 1) × the buffer.
    assert!(rss >= (WORKERS as u64 + 1) * buf * 95 / 100, "rss {rss}");
    // PSS: one buffer, plus little (at most 10% of it: code, stacks).
    assert!(both.pss >= buf * 95 / 100, "pss {}", both.pss);
    assert!(both.pss <= buf * 110 / 100, "pss {}", both.pss);
    // The copies summed RSS counts beyond the first are absent from the PSS.
    assert!(rss >= both.pss + WORKERS as u64 * buf * 9 / 10);
    // Every process holds about a fifth of the buffer's PSS.
    for p in &both.processes {
        let share = buf / (WORKERS as u64 + 1);
        assert!(
            p.rollup.pss >= share * 9 / 10,
            "pid {} pss {}",
            p.pid,
            p.rollup.pss
        );
    }
    // USS: the shared buffer is in nobody's.
    assert!(both.uss <= buf / 10, "uss {}", both.uss);
    assert!(both.uss > 0);
}

/// The sources through `Source`: kind, name, fidelity, and a reading of this
/// test process's own tree (which the test beside this one grows and shrinks,
/// so the two readings are not compared).
#[test]
fn sources_of_this_process_tree() {
    let pss = Source::process_tree_smaps(SmapsMetric::Pss).unwrap();
    let uss = Source::process_tree_smaps(SmapsMetric::Uss).unwrap();
    assert_eq!(pss.info().kind, SourceKind::ProcessTreePss);
    assert_eq!(pss.info().name, "tree_pss");
    assert_eq!(uss.info().kind, SourceKind::ProcessTreeUss);
    assert_eq!(uss.info().name, "tree_uss");
    assert_eq!(pss.info().fidelity, memprobe_core::PeakFidelity::Sampled);
    let (p, u) = (pss.read().unwrap().used, uss.read().unwrap().used);
    assert!(p > 0 && u > 0, "pss {p} uss {u}");
}
