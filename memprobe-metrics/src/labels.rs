//! The labels every series carries: the host and, in a distributed job, the
//! rank of the process.

use memprobe_core::{Error, Result};

/// The rank of this process in a distributed job. Each field becomes a
/// label (`rank`, `local_rank`, `world_size`) when set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rank {
    /// Global rank (`RANK`).
    pub rank: Option<u32>,
    /// Rank on this node (`LOCAL_RANK`).
    pub local_rank: Option<u32>,
    /// Number of ranks in the job (`WORLD_SIZE`).
    pub world_size: Option<u32>,
}

impl Rank {
    /// From `RANK`, `LOCAL_RANK` and `WORLD_SIZE` (torchrun, DeepSpeed,
    /// Accelerate set them); an absent or non-numeric variable is not set.
    pub fn from_env() -> Rank {
        let var = |k: &str| std::env::var(k).ok().and_then(|v| v.trim().parse().ok());
        Rank {
            rank: var("RANK"),
            local_rank: var("LOCAL_RANK"),
            world_size: var("WORLD_SIZE"),
        }
    }

    pub(crate) fn labels(&self) -> Vec<(&'static str, String)> {
        [
            ("rank", self.rank),
            ("local_rank", self.local_rank),
            ("world_size", self.world_size),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v.to_string())))
        .collect()
    }
}

/// This machine's host name (`gethostname`).
pub fn hostname() -> Result<String> {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for buf.len() bytes; gethostname writes at most that.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return Err(Error::io("gethostname", &std::io::Error::last_os_error()));
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_labels_only_when_set() {
        let r = Rank {
            rank: Some(3),
            local_rank: None,
            world_size: Some(8),
        };
        assert_eq!(
            r.labels(),
            vec![("rank", "3".to_string()), ("world_size", "8".to_string())]
        );
        assert!(!hostname().unwrap().is_empty());
    }
}
