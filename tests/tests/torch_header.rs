//! include/memprobe_torch.hpp against the libtorch of the CI venv's torch
//! wheel: it compiles as C++20 with strict warnings, links libc10_cuda /
//! libc10 and libmemprobe, and runs what runs without a GPU (clear
//! refusals for real devices; exact peaks over c10's own DeviceStats,
//! scripted). With torch >= 2.11 it is compiled with no CUDA header at
//! all, as a libtorch user with only the wheel builds it. Older torch only
//! declares its allocator in c10/cuda, whose headers include the CUDA
//! runtime's: the test then finds them in the nvidia-* wheels torch
//! installs (crt/host_defines.h comes with nvidia-cuda-nvcc-cu12),
//! CUDA_HOME, /usr/local/cuda, or MEMPROBE_CUDA_INCLUDE. A CPU-only torch build is compiled against, not
//! linked. Skipped when torch or those headers are missing, except under
//! CI=true, where torch is installed for the framework tests and anything
//! missing is a failure. The attribution replay (memprobe_torch_attribution.hpp)
//! needs neither torch nor CUDA: it is built as C++17 and run always.

use memprobe_tests::{assert_ok, compile, fresh_scratch, lib_dir, root, run, scratch, Build};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The CI venv's python when there is one (what `make test` uses).
fn python() -> PathBuf {
    let venv = root().join("build/ci-venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// Where the wheel keeps libtorch, one line each: include dirs
/// (`;`-separated), the library dir, the CUDA headers' dirs (`;`-separated:
/// the nvidia-* wheels torch depends on, CUDA_HOME, /usr/local/cuda),
/// whether libtorch was built with the C++11 string ABI, its version.
const PROBE: &str = r#"
import glob, os, torch, torch.utils.cpp_extension as c
print(";".join(c.include_paths()))
print(c.library_paths()[0])
cuda = []
try:
    import nvidia
    for p in nvidia.__path__:
        cuda += sorted(glob.glob(os.path.join(p, "*", "include")))
except ImportError:
    pass
for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
    if home and os.path.isdir(os.path.join(home, "include")):
        cuda.append(os.path.join(home, "include"))
print(";".join(cuda))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(torch.__version__)
"#;

/// Whether a torch version string (`2.11.0+cu130`) is at least `min`.
fn at_least(version: &str, min: (u32, u32)) -> bool {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= min
}

#[test]
fn torch_versions_compare() {
    assert!(at_least("2.11.0+cu130", (2, 11)));
    assert!(at_least("3.0.0", (2, 11)));
    assert!(!at_least("2.5.1+cu124", (2, 11)));
    assert!(!at_least("2.10.0", (2, 11)));
}

/// Skips (prints why) or, under CI=true, fails.
fn skip_or_fail(why: &str) {
    memprobe_tests::required_tool::skip_or_fail("the memprobe_torch.hpp test", why);
}

#[test]
fn memprobe_torch_hpp_compiles_links_and_runs_without_cuda() {
    let py = python();
    let probe = Command::new(&py).args(["-c", PROBE]).output();
    let out = match probe {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        other => {
            let why = match other {
                Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
                Err(e) => e.to_string(),
            };
            skip_or_fail(&format!(
                "torch is not importable by {}: {why}",
                py.display()
            ));
            return;
        }
    };
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 5, "unexpected probe output: {out}");
    let (includes, libdir, cuda, cxx11_abi, version) =
        (lines[0], lines[1], lines[2], lines[3], lines[4]);
    // libtorch >= 2.11 declares its CUDA allocator in c10/core: the header
    // then builds from the wheel alone, and is compiled here with no CUDA
    // header directory at all (an include of one would fail).
    let needs_cuda_headers = !at_least(version, (2, 11));
    let cuda = if needs_cuda_headers { cuda } else { "" };
    // c10/cuda includes cuda_runtime_api.h, which needs crt/host_defines.h:
    // the CUDA toolkit, or the nvidia-cuda-runtime-cu12 and
    // nvidia-cuda-nvcc-cu12 wheels; MEMPROBE_CUDA_INCLUDE (`:`-separated)
    // adds directories.
    let extra = std::env::var("MEMPROBE_CUDA_INCLUDE").unwrap_or_default();
    let cuda: Vec<&str> = cuda
        .split(';')
        .chain(extra.split(':'))
        .filter(|s| !s.is_empty())
        .collect();
    let has = |f: &str| {
        cuda.iter()
            .any(|d| std::path::Path::new(d).join(f).exists())
    };
    if needs_cuda_headers && (!has("cuda_runtime_api.h") || !has("crt/host_defines.h")) {
        skip_or_fail(&format!(
            "torch {version}: the CUDA headers c10/cuda needs (cuda_runtime_api.h, \
             crt/host_defines.h) are not in {cuda:?}: install the CUDA toolkit or the \
             nvidia-cuda-runtime-cu12 and nvidia-cuda-nvcc-cu12 wheels matching \
             torch.version.cuda, or name their include directories in MEMPROBE_CUDA_INCLUDE"
        ));
        return;
    }

    let dir = scratch("torch_header");
    let exe = dir.join("test_torch");
    let mut cc = Command::new("c++");
    cc.args(["-std=c++20", "-Wall", "-Wextra", "-Werror", "-g"])
        .arg(format!("-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi}"))
        .arg(format!("-I{}", root().join("include").display()));
    // -isystem, as torch.utils.cpp_extension does: warnings inside
    // libtorch's own headers are not memprobe's to fix.
    for inc in includes.split(';').filter(|s| !s.is_empty()) {
        cc.arg("-isystem").arg(inc);
    }
    for inc in &cuda {
        cc.arg("-isystem").arg(inc);
    }
    cc.arg(root().join("tests/cpp/test_torch.cpp"));
    // A CPU-only torch build has the headers but no CUDA allocator to link:
    // compile only.
    let cuda_build = std::path::Path::new(libdir).join("libc10_cuda.so").exists();
    if !cuda_build {
        cc.arg("-c").arg("-o").arg(dir.join("test_torch.o"));
    } else {
        cc.arg("-o")
            .arg(&exe)
            .arg(format!("-L{}", lib_dir().display()))
            .arg(format!("-L{libdir}"))
            .args(["-lmemprobe", "-lc10_cuda", "-lc10"])
            .arg(format!("-Wl,-rpath,{}", lib_dir().display()))
            .arg(format!("-Wl,-rpath,{libdir}"));
    }
    let built = cc.output().expect("run c++");
    assert_ok(
        &format!("compiling test_torch.cpp against torch {version}"),
        &built,
    );
    // C++17 (what libtorch below 2.10 allows) with C++ stacks for the
    // attribution (libtorch's unwinder headers), compiled only.
    if needs_cuda_headers {
        let mut cc17 = Command::new("c++");
        cc17.args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-c"])
            .arg("-DMEMPROBE_TORCH_CPP_STACKS=1")
            .arg(format!("-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi}"))
            .arg(format!("-I{}", root().join("include").display()));
        for inc in includes
            .split(';')
            .filter(|s| !s.is_empty())
            .chain(cuda.iter().copied())
        {
            cc17.arg("-isystem").arg(inc);
        }
        cc17.arg(root().join("tests/cpp/test_torch.cpp"))
            .arg("-o")
            .arg(dir.join("test_torch17.o"));
        let built17 = cc17.output().expect("run c++");
        assert_ok(
            &format!("compiling test_torch.cpp as C++17 with C++ stacks against torch {version}"),
            &built17,
        );
    }
    if !cuda_build {
        eprintln!(
            "torch {version} is a CPU-only build (no libc10_cuda): compiled, not linked or run"
        );
        return;
    }

    // No GPU, whatever the machine has: the refusals are deterministic.
    let o = run(&exe, &[], &[("CUDA_VISIBLE_DEVICES", "")]);
    assert_ok("test_torch", &o);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    assert!(
        stdout.contains("device 0 without CUDA: memprobe_torch: no CUDA device is visible"),
        "{stdout}"
    );
    // Below 2.11 the CUDA headers are at hand, so attribution is built.
    if needs_cuda_headers {
        assert!(
            stdout.contains("attribution without CUDA: memprobe_torch: no CUDA device is visible"),
            "{stdout}"
        );
    }
}

/// Every record a run of test_torch_attribution wrote, checked as a reader
/// (memprobe run, the Python side) would take it: the schema, at most
/// 256 KiB, no temporary file left, and for a complete epoch peak the
/// blocks plus rest equal to peak_bytes to the byte; an incomplete one
/// names no block and leaves rest.bytes null.
fn check_records(dir: &Path) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read the records' directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                name.ends_with(".json") && !name.starts_with('.'),
                "left behind: {}",
                path.display()
            );
            let text = std::fs::read_to_string(&path).expect("a record is UTF-8");
            assert!(text.len() <= 256 * 1024, "{name}: {} bytes", text.len());
            let doc: serde_json::Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{name} is not JSON ({e}): {text}"));
            assert_eq!(doc["schema"], "memprobe.torch_attribution/1", "{name}");
            let complete = doc["history"]["complete"]
                .as_bool()
                .expect("history.complete");
            let blocks = doc["blocks"].as_array().expect("blocks");
            let rest = &doc["rest"]["bytes"];
            if !complete {
                assert!(blocks.is_empty() && rest.is_null(), "{name}: {doc}");
                assert!(doc["history"]["reason"].is_string(), "{name}");
            } else if let Some(peak) = doc["peak_bytes"].as_u64() {
                let sum: u64 = blocks.iter().map(|b| b["bytes"].as_u64().unwrap()).sum();
                assert_eq!(sum + rest.as_u64().expect("rest.bytes"), peak, "{name}");
            }
            for b in blocks {
                for key in ["bytes", "stream", "address"] {
                    assert!(b[key].is_u64(), "{name}: {key} in {b}");
                }
                assert!(
                    b["frames"].is_array() && b.get("module").is_some(),
                    "{name}: {b}"
                );
            }
            n += 1;
        }
    }
    n
}

#[test]
fn attribution_replay_runs_as_cxx17_without_torch() {
    // The replay and the record need neither torch nor CUDA: C++17, strict
    // warnings, plain and under AddressSanitizer + UBSan.
    for build in [Build::Plain, Build::Sanitized] {
        let dir = fresh_scratch("torch_attribution");
        let exe = dir.join("test_torch_attribution");
        compile(
            &[root().join("tests/cpp/test_torch_attribution.cpp")],
            &exe,
            build,
            &[],
        );
        let out = dir.join("records");
        let o = run(&exe, &[out.to_str().unwrap()], &[]);
        assert_ok(&format!("test_torch_attribution ({build:?})"), &o);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
        // escapes, truncated (2), oom-segments, incomplete; 3 epochs and
        // 2 OOMs under MEMPROBE_ATTRIBUTION_DIR; 1 in the default directory.
        assert_eq!(check_records(&out), 11, "{}", out.display());
    }
}
