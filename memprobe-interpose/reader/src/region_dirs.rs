//! Where regions are: the directory a process under the interposer writes
//! to (`MEMPROBE_GPU_EXACT_DIR`, else [`crate::default_dir`]), and the
//! private directory of each `memprobe run --gpu-exact`, so a reader of the
//! whole machine (`memprobe gpus`, `watch`, `serve`) finds those too.

use std::path::{Path, PathBuf};

/// The name of the regions directory of `memprobe run` process `pid` run
/// by user `uid` (in `/dev/shm`, or the temporary directory without it).
pub fn run_dir_name(uid: u32, pid: u32) -> String {
    format!("memprobe-run-{uid}-{pid}")
}

/// Every directory of this user's regions: only `MEMPROBE_GPU_EXACT_DIR`
/// when it is set; else the default directory and every `memprobe run`'s
/// (whether that run still goes on is the regions' own business: a dead
/// process's region is left out by its liveness).
pub fn all_region_dirs() -> Vec<PathBuf> {
    if std::env::var_os(crate::DIR_ENV).is_some_and(|d| !d.is_empty()) {
        return vec![crate::default_dir()];
    }
    let mut dirs = vec![crate::default_dir()];
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let prefix = format!("memprobe-run-{uid}-");
    for base in [Path::new("/dev/shm").to_path_buf(), std::env::temp_dir()] {
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix(&prefix))
                    .is_some_and(|pid| pid.parse::<u32>().is_ok())
            })
            .map(|e| e.path())
            .filter(|p| !dirs.contains(p))
            .collect();
        found.sort();
        dirs.extend(found);
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_directory_is_found_by_its_name() {
        assert_eq!(run_dir_name(1000, 42), "memprobe-run-1000-42");
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let base = std::env::temp_dir();
        let mine = base.join(run_dir_name(uid, std::process::id()));
        let other = base.join(format!("memprobe-run-{uid}-x"));
        std::fs::create_dir_all(&mine).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let dirs = all_region_dirs();
        let _ = std::fs::remove_dir(&mine);
        let _ = std::fs::remove_dir(&other);
        if std::env::var_os(crate::DIR_ENV).is_some_and(|d| !d.is_empty()) {
            assert_eq!(dirs, vec![crate::default_dir()]);
        } else {
            assert_eq!(dirs[0], crate::default_dir());
            assert!(dirs.contains(&mine), "{dirs:?}");
            assert!(!dirs.contains(&other), "{dirs:?}");
        }
    }
}
