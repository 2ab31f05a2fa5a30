//! What the tree's PSS and USS cost against its summed RSS: one read of a
//! process tree of 1, 8 and 64 processes, through the core's samplers, in
//! one run with the cases interleaved round by round.
//!
//! `cargo bench -p memprobe-tests --bench tree_smaps` (release build). Two
//! kinds of tree:
//! - small: a shell and `sleep`s (about 1 MiB mapped each): the fixed cost;
//! - shared: a process that touched a 64 MiB buffer and workers forked from
//!   it that read it (as DataLoader workers share a trainer's pages): the
//!   kernel walks 64 MiB of page tables per process.
//!
//! Each figure is the median over rounds of the mean time per read in a
//! round; ratios are against the summed RSS read of the same tree.

use memprobe_core::ProcessTreeSampler;
use memprobe_core::Sampler;
use memprobe_core::SmapsMetric;
use memprobe_core::TreeSmapsSampler;
use std::hint::black_box;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

const ROUNDS: usize = 15;
/// Time each case gets per round.
const ROUND_BUDGET: Duration = Duration::from_millis(60);
const SHARED_MIB: usize = 64;

struct Case {
    name: String,
    /// Index of the tree-RSS case of the same tree (the ratio's base).
    base: usize,
    read: Box<dyn FnMut()>,
    iters: usize,
    rounds: Vec<f64>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// A tree of `n` small processes: a shell and `n - 1` sleeps (one sleep
/// alone for 1), in a process group of its own.
fn small_tree(n: usize) -> std::process::Child {
    let script = if n == 1 {
        "exec sleep 600".to_string()
    } else {
        format!("for i in $(seq {}); do sleep 600 & done; wait", n - 1)
    };
    let root = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .process_group(0)
        .spawn()
        .expect("spawn sh");
    wait_for(root.id(), n);
    root
}

/// A tree of `n` processes sharing a buffer: a process touches it and forks
/// `n - 1` workers that read it. Forked code makes raw system calls only;
/// everything dies with this process (PR_SET_PDEATHSIG).
fn shared_tree(n: usize) -> u32 {
    // SAFETY: the child makes raw system calls only and never returns.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: raw system calls on memory this process maps.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            let len = SHARED_MIB << 20;
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
            for _ in 1..n {
                if libc::fork() == 0 {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    let mut sum = 0u8;
                    for off in (0..len).step_by(4096) {
                        sum = sum.wrapping_add(buf.add(off).read_volatile());
                    }
                    std::ptr::write_volatile(buf, sum);
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
    wait_for(pid as u32, n);
    pid as u32
}

/// Waits until the tree below `root` has `n` processes holding memory.
fn wait_for(root: u32, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut tree = memprobe_core::internal::process_tree::ProcessTree::new(root);
    while tree.read().processes.len() < n {
        assert!(
            Instant::now() < deadline,
            "the tree of {root} never reached {n}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Let the workers finish reading the buffer.
    std::thread::sleep(Duration::from_millis(300));
}

/// The root of a tree: a small tree's shell (killed with its process
/// group), or a shared tree's forked parent (its workers die with it).
enum Root {
    Small(std::process::Child),
    Shared(u32),
}

impl Root {
    fn pid(&self) -> u32 {
        match self {
            Root::Small(c) => c.id(),
            Root::Shared(p) => *p,
        }
    }

    fn kill(self) {
        match self {
            Root::Small(mut c) => {
                // SAFETY: the process group the shell leads.
                unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
                let _ = c.wait();
            }
            Root::Shared(p) => {
                // SAFETY: our child.
                unsafe {
                    libc::kill(p as i32, libc::SIGKILL);
                    libc::waitpid(p as i32, std::ptr::null_mut(), 0);
                }
            }
        }
    }
}

fn main() {
    let mut cases: Vec<Case> = Vec::new();
    let mut roots = Vec::new();
    for kind in ["small", "shared 64 MiB"] {
        for n in [1usize, 8, 64] {
            let tree = if kind == "small" {
                Root::Small(small_tree(n))
            } else {
                Root::Shared(shared_tree(n))
            };
            let root = tree.pid();
            roots.push(tree);
            let base = cases.len();
            let label = format!("{n} process{}, {kind}", if n == 1 { "" } else { "es" });
            let mut rss = ProcessTreeSampler::at(root).unwrap();
            let mut pss = TreeSmapsSampler::at(root, SmapsMetric::Pss).unwrap();
            let mut uss = TreeSmapsSampler::at(root, SmapsMetric::Uss).unwrap();
            let got = pss.read_tree().unwrap();
            assert_eq!(got.processes.len(), n, "{label}: {got:?}");
            cases.push(Case {
                name: format!("tree RSS (summed), {label}"),
                base,
                read: Box::new(move || {
                    black_box(rss.read().unwrap());
                }),
                iters: 0,
                rounds: Vec::new(),
            });
            cases.push(Case {
                name: format!("tree PSS, {label}"),
                base,
                read: Box::new(move || {
                    black_box(pss.read().unwrap());
                }),
                iters: 0,
                rounds: Vec::new(),
            });
            cases.push(Case {
                name: format!("tree USS, {label}"),
                base,
                read: Box::new(move || {
                    black_box(uss.read().unwrap());
                }),
                iters: 0,
                rounds: Vec::new(),
            });
        }
    }
    // Warm up, and size each case's round to the budget.
    for case in &mut cases {
        let t = Instant::now();
        let mut calls = 0;
        while t.elapsed() < ROUND_BUDGET / 2 || calls < 3 {
            (case.read)();
            calls += 1;
        }
        let per = t.elapsed().as_secs_f64() / calls as f64;
        case.iters = ((ROUND_BUDGET.as_secs_f64() / per) as usize).max(3);
    }
    for _ in 0..ROUNDS {
        for case in &mut cases {
            let t = Instant::now();
            for _ in 0..case.iters {
                (case.read)();
            }
            case.rounds
                .push(t.elapsed().as_nanos() as f64 / case.iters as f64);
        }
    }
    let medians: Vec<f64> = cases.iter_mut().map(|c| median(&mut c.rounds)).collect();
    println!(
        "tree PSS / USS against summed tree RSS: {ROUNDS} rounds, about {} ms per case per round, cases interleaved",
        ROUND_BUDGET.as_millis()
    );
    println!("{:<52} {:>12} {:>14}", "case", "median µs", "x tree RSS");
    for (i, case) in cases.iter().enumerate() {
        println!(
            "{:<52} {:>12.1} {:>13.1}x",
            case.name,
            medians[i] / 1e3,
            medians[i] / medians[case.base]
        );
    }
    for root in roots {
        root.kill();
    }
}
