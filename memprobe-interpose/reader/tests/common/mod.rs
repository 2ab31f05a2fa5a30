//! Builds what the interposer tests run: the interposer itself, the fake
//! driver of tests/fake-gpu/fake_cuda.c, the C programs of tests/interpose/;
//! and runs those programs with the interposer preloaded, talking to them
//! line by line.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The workspace root (this crate is memprobe-interpose/reader).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// A scratch directory of this test process.
pub fn scratch() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = target_dir()
            .join("memprobe-interpose-tests")
            .join(std::process::id().to_string());
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    })
    .clone()
}

/// Compiles `sources` into `out` with the tests' warnings-as-errors flags.
pub fn cc(args: &[&str], sources: &[PathBuf], out: &Path, tail: &[String]) {
    let o = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O2", "-g"])
        .args(args)
        .args(sources)
        .arg("-o")
        .arg(out)
        .args(tail)
        .output()
        .expect("a C compiler (cc) is needed for the interposer tests");
    assert!(
        o.status.success(),
        "compiling {sources:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `libmemprobe_interpose.so` (dev profile), built once and copied aside so
/// a rebuild during the tests cannot change it under them.
pub fn interposer() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-q", "-p", "memprobe-interpose-preload"])
            .current_dir(root())
            .status()
            .expect("run cargo build");
        assert!(
            st.success(),
            "cargo build -p memprobe-interpose-preload failed"
        );
        let lib = scratch().join("libmemprobe_interpose.so");
        std::fs::copy(target_dir().join("debug/libmemprobe_interpose.so"), &lib).unwrap();
        lib
    })
    .clone()
}

/// A directory holding the fake driver as `libcuda.so.1` (and the
/// `libcuda.so` link programs link with); `legacy` builds an old driver
/// without VMM, pools and cuGetProcAddress.
pub fn fake_driver(legacy: bool) -> PathBuf {
    static BUILT: Mutex<Option<HashMap<bool, PathBuf>>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    built
        .entry(legacy)
        .or_insert_with(|| {
            let dir = scratch().join(if legacy { "fake-legacy" } else { "fake" });
            std::fs::create_dir_all(&dir).unwrap();
            // -Bsymbolic: the driver's calls to its own functions stay inside it,
            // as in the real one, instead of reaching the interposer.
            let mut args = vec![
                "-shared",
                "-fPIC",
                "-Wl,-soname,libcuda.so.1",
                "-Wl,-Bsymbolic",
            ];
            if legacy {
                args.push("-DFAKE_CUDA_LEGACY");
            }
            cc(
                &args,
                &[root().join("tests/fake-gpu/fake_cuda.c")],
                &dir.join("libcuda.so.1"),
                &["-lpthread".into()],
            );
            let _ = std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so"));
            dir
        })
        .clone()
}

/// A program of tests/interpose/ (`name.c`), built once; `linked` links it
/// to the fake driver directly (-DLINKED -lcuda).
pub fn program(name: &str, linked: bool) -> PathBuf {
    static BUILT: Mutex<Option<HashMap<(String, bool), PathBuf>>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    built
        .entry((name.to_owned(), linked))
        .or_insert_with(|| {
            let fake = fake_driver(false);
            let out = scratch().join(format!("{name}{}", if linked { "-linked" } else { "" }));
            let mut tail = vec!["-ldl".to_owned(), "-lpthread".to_owned()];
            let mut args = vec![];
            if linked {
                args.push("-DLINKED");
                tail.insert(0, "-lcuda".into());
                tail.insert(0, format!("-L{}", fake.display()));
            }
            cc(
                &args,
                &[root().join(format!("tests/interpose/{name}.c"))],
                &out,
                &tail,
            );
            out
        })
        .clone()
}

/// tests/interpose/deep.c as a shared library linked to the fake driver.
pub fn deep_library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let fake = fake_driver(false);
        let out = scratch().join("libdeep.so");
        cc(
            &["-shared", "-fPIC"],
            &[root().join("tests/interpose/deep.c")],
            &out,
            &[
                format!("-L{}", fake.display()),
                "-lcuda".into(),
                "-ldl".into(),
            ],
        );
        out
    })
    .clone()
}

/// tests/interpose/next.c as a shared library (a second interposer).
pub fn next_library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let out = scratch().join("libnext.so");
        cc(
            &["-shared", "-fPIC"],
            &[root().join("tests/interpose/next.c")],
            &out,
            &["-ldl".into()],
        );
        out
    })
    .clone()
}

/// In `scratch()/<name>`: the runtime stand-in (libcudart.so.12) and
/// `libfake_<LIB>.so` for each of `libs` (tests/interpose/origin_lib.c),
/// over the fake driver; and the program `out_name` built from
/// tests/interpose/`source` with its own copy of the library code (its
/// allocations are the program's), `flags` added, linked to `libs`.
pub fn origin_program(
    name: &str,
    libs: &[&str],
    source: &str,
    flags: &[&str],
    out_name: &str,
) -> PathBuf {
    let fake = fake_driver(false);
    let dir = scratch().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let src = |n: &str| root().join("tests/interpose").join(n);
    let link = |extra: &[String]| {
        let mut v = vec![
            format!("-L{}", dir.display()),
            format!("-L{}", fake.display()),
        ];
        v.extend(extra.iter().cloned());
        v.push("-lcuda".into());
        v
    };
    let rt = ["-l:libcudart.so.12".to_string()];
    cc(
        &["-shared", "-fPIC", "-Wl,-soname,libcudart.so.12"],
        &[src("origin_runtime.c")],
        &dir.join("libcudart.so.12"),
        &link(&[]),
    );
    for lib in libs {
        let def = format!("-DLIB={lib}");
        let soname = format!("-Wl,-soname,libfake_{lib}.so");
        cc(
            &["-shared", "-fPIC", &def, &soname],
            &[src("origin_lib.c")],
            &dir.join(format!("libfake_{lib}.so")),
            &link(&rt),
        );
    }
    let out = dir.join(out_name);
    let inc = format!("-I{}", root().join("tests/interpose").display());
    let mut args = vec!["-DLINKED", "-DLIB=prog", &inc];
    args.extend(flags);
    let mut tail: Vec<String> = libs.iter().map(|l| format!("-l:libfake_{l}.so")).collect();
    tail.extend(["-l:libcudart.so.12", "-ldl", "-lpthread"].map(String::from));
    cc(
        &args,
        &[src(source), src("origin_lib.c")],
        &out,
        &link(&tail),
    );
    out
}

/// A fresh directory for region files (one per test: tests run in
/// parallel and must not reclaim each other's).
pub fn region_dir(test: &str) -> PathBuf {
    let d = scratch().join("shm").join(test);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.parent().unwrap()).unwrap();
    d
}

/// The environment of a program under the interposer.
pub fn interposed(cmd: &mut Command, fake: &Path, regions: &Path) {
    cmd.env("LD_PRELOAD", interposer())
        .env("LD_LIBRARY_PATH", fake)
        .env("MEMPROBE_GPU_EXACT_DIR", regions)
        .env_remove("MEMPROBE_GPU_EXACT")
        .env_remove("FAKE_CUDA_DEVICES")
        .env_remove("FAKE_CUDA_MEMORY");
}

/// A program run with the interposer, spoken to line by line.
pub struct Talk {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Talk {
    pub fn start(mut cmd: Command) -> Talk {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the test program");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Talk {
            child,
            stdin,
            stdout,
        }
    }

    /// The next line (without its newline); panics at end of output.
    pub fn line(&mut self) -> String {
        let mut l = String::new();
        let n = self.stdout.read_line(&mut l).unwrap();
        assert!(
            n > 0,
            "the program ended early ({:?})",
            self.child.try_wait()
        );
        l.trim_end().to_owned()
    }

    pub fn go(&mut self) {
        self.stdin.write_all(b"\n").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits for the end; asserts success.
    pub fn finish(mut self) {
        drop(self.stdin);
        let st = self.child.wait().unwrap();
        assert!(st.success(), "the program failed: {st:?}");
    }
}

/// Reads the region of `pid` in `dir`, waiting (bounded) for the file.
pub fn open_region(dir: &Path, pid: u32) -> std::sync::Arc<memprobe_interpose_reader::Region> {
    let path = memprobe_interpose_reader::region_path(dir, pid);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match memprobe_interpose_reader::Region::open_path(&path) {
            Ok(r) => return r,
            Err(e) if std::time::Instant::now() > deadline => panic!("region of {pid}: {e}"),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
        }
    }
}
