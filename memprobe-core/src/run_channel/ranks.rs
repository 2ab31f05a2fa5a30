//! [`Ranks`]: where a sending process stands in a job of several processes
//! (its rank, its rank on its node, the job's size), read from the
//! variables the launchers set, so that `memprobe run` can name ranks
//! rather than pids.
//!
//! A rank is a property of the process: it is read once, when the process's
//! channel is made (its first phase boundary), and a forked child (a
//! DataLoader worker) keeps its parent's: it works for the same rank.
//!
//! # Which variables ([`LAUNCHERS`], in order of precedence)
//!
//! 1. `RANK`, `LOCAL_RANK`, `WORLD_SIZE`: torchrun
//!    (`torch.distributed.run`), Accelerate, DeepSpeed;
//! 2. `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`,
//!    `OMPI_COMM_WORLD_SIZE`: Open MPI's `mpirun`;
//! 3. `PMI_RANK`, `PMI_SIZE`: MPICH and Intel MPI (Hydra), Slurm's PMI
//!    (no local rank);
//! 4. `SLURM_PROCID`, `SLURM_LOCALID`, `SLURM_NTASKS`: Slurm's `srun`;
//! 5. `NODE_RANK`, `LOCAL_RANK`, `WORLD_SIZE` with no `RANK`: Lightning's
//!    own launcher (`Trainer(strategy="ddp")` started as a plain script),
//!    which numbers processes per node. On node 0 (`NODE_RANK=0`) the
//!    rank is the local rank; on another node the rank depends on the
//!    processes per node, which no variable gives, so the process has
//!    none.
//!
//! The innermost launcher comes first: torchrun started by `srun` sets
//! `RANK` per worker where `SLURM_PROCID` numbers the node's one task.
//! The first family whose rank variable is set (and not empty) decides;
//! its values must hold, or the process has no rank at all (never another
//! launcher's): the rank and the world size are decimal integers (digits
//! only: not negative, no sign, no spaces) with the rank below the world
//! size. A local rank that does not hold (missing, not a number, not
//! below the world size) is left out alone. Nothing is ever printed or
//! raised for a bad value.

use std::ffi::OsString;

/// A process's place in a job of several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ranks {
    /// Its rank in the job, from 0.
    pub rank: u32,
    /// Its rank on its node, when the launcher says.
    pub local_rank: Option<u32>,
    /// How many processes the job has (more than `rank`).
    pub world_size: u32,
}

/// The launchers' variables, in order of precedence: the rank's, the
/// local rank's (when the launcher sets one) and the world size's.
pub const LAUNCHERS: [(&str, Option<&str>, &str); 4] = [
    ("RANK", Some("LOCAL_RANK"), "WORLD_SIZE"),
    (
        "OMPI_COMM_WORLD_RANK",
        Some("OMPI_COMM_WORLD_LOCAL_RANK"),
        "OMPI_COMM_WORLD_SIZE",
    ),
    ("PMI_RANK", None, "PMI_SIZE"),
    ("SLURM_PROCID", Some("SLURM_LOCALID"), "SLURM_NTASKS"),
];

impl Ranks {
    /// Whether these ranks can be a process's: the rank and the local
    /// rank below the world size.
    pub fn valid(&self) -> bool {
        self.rank < self.world_size && self.local_rank.map_or(true, |l| l < self.world_size)
    }

    /// This process's ranks, from its environment ([`LAUNCHERS`]); `None`
    /// when no launcher's variables are set or the first set ones do not
    /// hold.
    pub fn from_env() -> Option<Ranks> {
        Ranks::from_vars(|name| std::env::var_os(name))
    }

    /// The ranks that the variables `get` returns say (`get` answers a
    /// variable's value, `None` when unset), by the rules of
    /// [`Ranks::from_env`].
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Option<Ranks> {
        let set = |name: &str| get(name).filter(|v| !v.is_empty());
        let Some((rank_var, local_var, size_var)) = LAUNCHERS
            .into_iter()
            .find(|(rank, _, _)| set(rank).is_some())
        else {
            return Ranks::from_node_local(&set);
        };
        let rank = number(&set(rank_var)?)?;
        let world_size = number(&set(size_var)?)?;
        if rank >= world_size {
            return None;
        }
        let local_rank = local_var
            .and_then(set)
            .and_then(|v| number(&v))
            .filter(|&l| l < world_size);
        Some(Ranks {
            rank,
            local_rank,
            world_size,
        })
    }
}

impl Ranks {
    /// Lightning's launcher (the fifth family): a node's rank and a local
    /// rank; the job's rank is known on node 0 only.
    fn from_node_local(set: &impl Fn(&str) -> Option<OsString>) -> Option<Ranks> {
        let node = number(&set("NODE_RANK")?)?;
        let local = number(&set("LOCAL_RANK")?)?;
        let world_size = number(&set("WORLD_SIZE")?)?;
        (node == 0 && local < world_size).then_some(Ranks {
            rank: local,
            local_rank: Some(local),
            world_size,
        })
    }
}

/// A decimal number of digits only, within `u32`.
fn number(value: &OsString) -> Option<u32> {
    let s = value.to_str()?;
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Option<Ranks> {
        Ranks::from_vars(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        })
    }

    fn ranks(rank: u32, local_rank: Option<u32>, world_size: u32) -> Option<Ranks> {
        Some(Ranks {
            rank,
            local_rank,
            world_size,
        })
    }

    #[test]
    fn each_launchers_variables_give_the_ranks() {
        assert_eq!(
            from(&[("RANK", "3"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "4")]),
            ranks(3, Some(1), 4)
        );
        assert_eq!(
            from(&[
                ("OMPI_COMM_WORLD_RANK", "5"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
                ("OMPI_COMM_WORLD_SIZE", "8"),
            ]),
            ranks(5, Some(1), 8)
        );
        assert_eq!(
            from(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]),
            ranks(0, None, 2)
        );
        assert_eq!(
            from(&[
                ("SLURM_PROCID", "7"),
                ("SLURM_LOCALID", "3"),
                ("SLURM_NTASKS", "16"),
            ]),
            ranks(7, Some(3), 16)
        );
        // One process of one.
        assert_eq!(
            from(&[("RANK", "0"), ("WORLD_SIZE", "1")]),
            ranks(0, None, 1)
        );
    }

    #[test]
    fn the_innermost_launcher_comes_first() {
        // torchrun inside srun: the worker's RANK, not the node's task.
        let all = [
            ("SLURM_PROCID", "1"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS", "2"),
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("RANK", "6"),
            ("LOCAL_RANK", "2"),
            ("WORLD_SIZE", "8"),
        ];
        assert_eq!(from(&all), ranks(6, Some(2), 8));
        assert_eq!(from(&all[..7]), ranks(2, None, 3));
        assert_eq!(from(&all[..5]), ranks(1, None, 2));
        assert_eq!(from(&all[..3]), ranks(1, Some(0), 2));
        // An empty variable counts as unset.
        let mut empty = all.to_vec();
        empty[7] = ("RANK", "");
        assert_eq!(from(&empty), ranks(2, None, 3));
    }

    #[test]
    fn missing_or_garbage_values_give_no_rank_never_a_crash() {
        assert_eq!(from(&[]), None);
        for bad in [
            // The world size missing, or the rank alone.
            vec![("RANK", "1")],
            vec![("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")],
            // Not numbers, negative, signed, spaced, too large.
            vec![("RANK", "one"), ("WORLD_SIZE", "2")],
            vec![("RANK", "-1"), ("WORLD_SIZE", "2")],
            vec![("RANK", "+1"), ("WORLD_SIZE", "2")],
            vec![("RANK", " 1"), ("WORLD_SIZE", "2")],
            vec![("RANK", "1"), ("WORLD_SIZE", "2x")],
            vec![("RANK", "1"), ("WORLD_SIZE", "99999999999")],
            vec![("RANK", "1.0"), ("WORLD_SIZE", "2")],
            // The rank not below the world size.
            vec![("RANK", "2"), ("WORLD_SIZE", "2")],
            vec![("RANK", "0"), ("WORLD_SIZE", "0")],
            // The first launcher set decides: a broken one is not
            // replaced by another's.
            vec![
                ("RANK", "x"),
                ("WORLD_SIZE", "2"),
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "2"),
            ],
        ] {
            assert_eq!(from(&bad), None, "{bad:?}");
        }
        // A bad local rank is left out alone.
        for local in ["-1", "x", "2", "", "1 "] {
            assert_eq!(
                from(&[("RANK", "1"), ("LOCAL_RANK", local), ("WORLD_SIZE", "2")]),
                ranks(1, None, 2),
                "{local:?}"
            );
        }
        // Not UTF-8.
        use std::os::unix::ffi::OsStringExt;
        let odd = Ranks::from_vars(|name| match name {
            "RANK" => Some(OsString::from_vec(vec![0xff, b'1'])),
            "WORLD_SIZE" => Some("2".into()),
            _ => None,
        });
        assert_eq!(odd, None);
    }

    #[test]
    fn lightnings_launcher_gives_ranks_on_node_0_only() {
        let node = |n: &'static str, local: &'static str| {
            from(&[("NODE_RANK", n), ("LOCAL_RANK", local), ("WORLD_SIZE", "4")])
        };
        assert_eq!(node("0", "0"), ranks(0, Some(0), 4));
        assert_eq!(node("0", "3"), ranks(3, Some(3), 4));
        // Another node: the processes per node are not known.
        assert_eq!(node("1", "0"), None);
        // Not below the world size, garbage, or a variable missing.
        assert_eq!(node("0", "4"), None);
        assert_eq!(node("0", "x"), None);
        assert_eq!(node("x", "0"), None);
        assert_eq!(from(&[("NODE_RANK", "0"), ("LOCAL_RANK", "1")]), None);
        // Any launcher that sets a rank comes first.
        assert_eq!(
            from(&[
                ("NODE_RANK", "0"),
                ("LOCAL_RANK", "1"),
                ("WORLD_SIZE", "4"),
                ("SLURM_PROCID", "2"),
                ("SLURM_NTASKS", "4"),
            ]),
            ranks(2, None, 4)
        );
    }

    #[test]
    fn validity() {
        assert!(ranks(1, Some(1), 2).unwrap().valid());
        assert!(!ranks(2, None, 2).unwrap().valid());
        assert!(!ranks(0, Some(2), 2).unwrap().valid());
    }
}
