//! Who holds each GPU process's memory, by origin, in `memprobe gpus`
//! (table and JSON), `memprobe watch` and `memprobe serve`'s
//! `memprobe_gpu_origin_bytes`: a process under the driver-API interposer
//! (tests/interpose/hold_origins.c on the fake driver) holds 6 MiB from the
//! program, 4 from libfake_nccl, 3 from libfake_cublas and 1 from
//! libfake_cudnn; a fake NVML lists it with 20 MiB. And `memprobe run
//! --gpu-exact=stacks:N`'s call paths (tests/interpose/stacks.c).

use crate::fake_gpu_libs;
use crate::schema::assert_valid;
use crate::serve::{announced, get};
use crate::support::{memprobe, scratch, MIB};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

struct Built {
    libs: PathBuf,
    program: PathBuf,
    stacks: PathBuf,
    interposer: PathBuf,
    nvml: PathBuf,
}

/// The interposer, the fake driver and NVML, the libraries, the program.
fn built() -> &'static Built {
    static B: OnceLock<Built> = OnceLock::new();
    B.get_or_init(|| {
        fake_gpu_libs::build_interposer();
        let interposer =
            Path::new(env!("CARGO_BIN_EXE_memprobe")).with_file_name("libmemprobe_interpose.so");
        assert!(interposer.exists(), "{}", interposer.display());
        let dir = scratch("origin-views");
        let nvml = dir.join("libnvidia-ml.so.1");
        fake_gpu_libs::fake_nvml(&nvml);
        let libs = ["nccl", "cublas", "cudnn"];
        fake_gpu_libs::origin_libs(&dir, &libs);
        let program = dir.join("hold_origins");
        fake_gpu_libs::origin_program(&dir, "hold_origins.c", &libs, &[], &program);
        let stacks = dir.join("stacks");
        fake_gpu_libs::origin_program(&dir, "stacks.c", &["nccl"], &["-rdynamic"], &stacks);
        Built {
            libs: dir,
            program,
            stacks,
            interposer,
            nvml,
        }
    })
}

/// The holder, running under the interposer with its region in `regions`,
/// and a fake NVML script listing it on device 0.
struct Holder {
    child: Child,
    regions: PathBuf,
    script: PathBuf,
}

impl Holder {
    fn start(tag: &str) -> Holder {
        let regions = scratch(tag).join("regions");
        Holder::start_in(tag, regions)
    }

    /// With its region in `regions`.
    fn start_in(tag: &str, regions: PathBuf) -> Holder {
        let b = built();
        let dir = scratch(tag);
        let mut child = Command::new(&b.program)
            .env("LD_PRELOAD", &b.interposer)
            .env("LD_LIBRARY_PATH", &b.libs)
            .env("MEMPROBE_GPU_EXACT_DIR", &regions)
            .env("FAKE_CUDA_DEVICES", "1")
            .env_remove("MEMPROBE_GPU_EXACT")
            .env_remove("MEMPROBE_GPU_ORIGINS")
            .env_remove("FAKE_CUDA_MEMORY")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start hold_origins");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n");
        let script = dir.join("fake_nvml.script");
        std::fs::write(
            &script,
            format!(
                "devices 1\ndevice 0 name Fake GPU\ndevice 0 total 17179869184\n\
                 device 0 used 41943040\ndevice 0 procs {}:20971520\n",
                child.id()
            ),
        )
        .unwrap();
        Holder {
            child,
            regions,
            script,
        }
    }

    /// `memprobe ARGS` seeing the holder through the fake NVML and its region.
    fn memprobe(&self, args: &[&str]) -> Command {
        let mut c = memprobe();
        c.args(args)
            .env("MEMPROBE_NVML_LIBRARY", &built().nvml)
            .env("FAKE_NVML_SCRIPT", &self.script)
            .env("MEMPROBE_GPU_EXACT_DIR", &self.regions)
            .env_remove("MEMPROBE_GPU_BACKEND")
            .env_remove("CUDA_VISIBLE_DEVICES");
        c
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

#[test]
fn gpus_names_who_holds_each_process_memory() {
    let h = Holder::start("gpus");
    let o = h.memprobe(&["gpus", "--json"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_valid("docs/gpus-output.schema.json", &v);
    let p = &v["gpus"][0]["processes"][0];
    assert_eq!(p["pid"], h.child.id(), "{v:#}");
    assert_eq!(p["used_bytes"], 20 * MIB);
    let origins = &p["origins"];
    assert_eq!(origins["held_bytes"], 14 * MIB, "{origins:#}");
    let top: Vec<(String, u64)> = origins["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["name"].as_str().unwrap().to_owned(),
                o["bytes"].as_u64().unwrap() / MIB,
            )
        })
        .collect();
    assert_eq!(
        top,
        vec![
            ("the program".to_owned(), 6),
            ("libfake_nccl.so".to_owned(), 4),
            ("libfake_cublas.so".to_owned(), 3)
        ]
    );
    assert_eq!(origins["rest_origins"], 1);
    assert_eq!(origins["rest_bytes"], MIB);

    let t = h.memprobe(&["gpus"]).output().unwrap();
    assert!(t.status.success());
    let text = String::from_utf8_lossy(&t.stdout);
    let at = text
        .lines()
        .position(|l| l.split_whitespace().nth(1) == Some(&h.child.id().to_string()))
        .unwrap_or_else(|| panic!("no process row in\n{text}"));
    assert_eq!(
        text.lines().nth(at + 1).unwrap(),
        "    by origin: 14.0 MiB counted: the program 6.00 MiB, libfake_nccl.so 4.00 MiB, \
         libfake_cublas.so 3.00 MiB, 1 more 1.00 MiB",
        "{text}"
    );
}

#[test]
fn gpus_finds_a_process_of_a_memprobe_run_without_being_told_where() {
    // A directory named as `memprobe run --gpu-exact` names its own.
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let run = std::env::temp_dir().join(memprobe_interpose_reader::run_dir_name(
        uid,
        4_000_000_000 + std::process::id() % 1_000_000,
    ));
    let h = Holder::start_in("gpus-run", run.clone());
    let o = h
        .memprobe(&["gpus", "--json"])
        .env_remove("MEMPROBE_GPU_EXACT_DIR")
        .output()
        .unwrap();
    drop(h);
    let _ = std::fs::remove_dir_all(&run);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let origins = &v["gpus"][0]["processes"][0]["origins"];
    assert_eq!(origins["held_bytes"], 14 * MIB, "{v:#}");
}

#[test]
fn without_a_region_gpus_shows_no_origins() {
    let h = Holder::start("gpus-none");
    let empty = scratch("no-regions");
    let o = h
        .memprobe(&["gpus", "--json"])
        .env("MEMPROBE_GPU_EXACT_DIR", &empty)
        .output()
        .unwrap();
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_valid("docs/gpus-output.schema.json", &v);
    let p = &v["gpus"][0]["processes"][0];
    assert_eq!(p["used_bytes"], 20 * MIB, "{v:#}");
    assert!(p.get("origins").is_none(), "{p:#}");
    // The holder numbers its devices otherwise: not matched, not shown.
    let o = h
        .memprobe(&["gpus", "--json"])
        .env("CUDA_VISIBLE_DEVICES", "0")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["gpus"][0]["processes"][0].get("origins").is_none(),
        "{v:#}"
    );
}

#[test]
fn watch_shows_the_origin_line_under_the_process() {
    let h = Holder::start("watch");
    let mut w = h
        .memprobe(&["watch", "--interval", "100ms"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(w.stdout.take().unwrap());
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !text.contains("TOP PROCESSES BY RSS") && Instant::now() < deadline {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        text.push_str(&line);
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(w.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(w.wait().unwrap().code(), Some(0));
    assert!(
        text.contains(
            "    by origin: 14.0 MiB counted: the program 6.00 MiB, libfake_nccl.so 4.00 MiB, \
             libfake_cublas.so 3.00 MiB, 1 more 1.00 MiB\n"
        ),
        "{text}"
    );
}

#[test]
fn serve_exports_each_process_memory_by_origin() {
    let h = Holder::start("serve");
    let mut child = h
        .memprobe(&["serve", "--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = announced(&mut child);
    let text = get(&addr, "/metrics");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(
        text.contains("# TYPE memprobe_gpu_origin_bytes gauge\n"),
        "{text}"
    );
    let pid = h.child.id();
    for (origin, mib) in [
        ("the program", 6),
        ("libfake_nccl.so", 4),
        ("libfake_cublas.so", 3),
        ("libfake_cudnn.so", 1),
    ] {
        let series = format!(
            "memprobe_gpu_origin_bytes{{gpu=\"0\",origin=\"{origin}\",pid=\"{pid}\",hostname="
        );
        let line = text
            .lines()
            .find(|l| l.starts_with(&series))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"));
        assert!(line.ends_with(&format!(" {}", mib * MIB)), "{line}");
    }
}

/// `memprobe run MODE --no-live --interval 10ms EXTRA -- stacks`, its
/// checkpoints answered on stdin (also gpu_stacks_json.rs's run).
pub(crate) fn run_stacks(mode: &str, extra: &[&std::ffi::OsStr]) -> std::process::Output {
    let b = built();
    let mut child = memprobe()
        .args(["run", mode, "--no-live", "--interval", "10ms"])
        .args(extra)
        .arg("--")
        .arg(&b.stacks)
        .env("LD_LIBRARY_PATH", &b.libs)
        .env("FAKE_CUDA_DEVICES", "1")
        .env("MEMPROBE_GPU_BACKEND", "none")
        .env_remove("MEMPROBE_INTERPOSE_LIBRARY")
        .env_remove("MEMPROBE_GPU_EXACT")
        .env_remove("MEMPROBE_GPU_ORIGINS")
        .env_remove("MEMPROBE_GPU_EXACT_DIR")
        .env_remove("FAKE_CUDA_MEMORY")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"\n\n\n").unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn run_gpu_exact_stacks_shows_the_paths_at_each_peak() {
    let o = run_stacks("--gpu-exact=stacks:2", &[]);
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{text}");
    let at = text
        .lines()
        .position(|l| l.trim_start().starts_with("paths at GPU 0"))
        .unwrap_or_else(|| panic!("no paths line in\n{text}"));
    let lines: Vec<&str> = text.lines().skip(at).take(3).collect();
    assert!(
        lines[0].ends_with("5.00 MiB libfake_nccl.so!nccl_alloc < stacks!path_b"),
        "{text}"
    );
    assert!(
        lines[1].ends_with("3.00 MiB libfake_nccl.so!nccl_alloc < stacks!path_a"),
        "{text}"
    );
    assert!(
        lines[2].ends_with("2.00 MiB stacks!prog_alloc < stacks!main"),
        "{text}"
    );
    // Plain --gpu-exact keeps origins only.
    let plain = run_stacks("--gpu-exact", &[]);
    let text = String::from_utf8_lossy(&plain.stderr);
    assert!(plain.status.success(), "{text}");
    assert!(text.contains("at GPU 0's peak"), "{text}");
    assert!(!text.contains("paths at GPU"), "{text}");
}

#[test]
fn run_gpu_exact_refuses_an_unknown_mode() {
    for bad in [
        "--gpu-exact=stacks:0",
        "--gpu-exact=stacks:33",
        "--gpu-exact=stack",
    ] {
        let o = memprobe()
            .args(["run", bad, "--", "true"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("stacks"), "{bad}: {err}");
    }
}
