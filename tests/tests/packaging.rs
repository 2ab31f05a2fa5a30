//! `make install PREFIX=...` lays out the `memprobe` command, the library,
//! its SONAME links, the static library, the headers, the pkg-config file and
//! the CMake package; programs built against the installed prefix with
//! pkg-config, with `find_package(memprobe CONFIG)` and (Go) from a module
//! outside the repository run; versions come from Cargo.toml. The README's
//! C build line works, verbatim, after `make lib`.

use memprobe_tests::required_tool::require;
use memprobe_tests::{assert_ok, root, scratch, soname};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// A command that does not inherit the make jobserver or cargo's
/// `LD_LIBRARY_PATH` of the test process.
fn command(program: &str) -> Command {
    let mut c = Command::new(program);
    for var in ["MAKEFLAGS", "MFLAGS", "MAKELEVEL", "LD_LIBRARY_PATH"] {
        c.env_remove(var);
    }
    c
}

fn output(what: &str, c: &mut Command) -> Output {
    let o = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_ok(what, &o);
    o
}

/// Runs `make -C <root> ARGS`. One make at a time in this test binary: they
/// share target/release.
fn make(args: &[&str]) -> Output {
    static MAKE: Mutex<()> = Mutex::new(());
    let _one = MAKE.lock().unwrap_or_else(|e| e.into_inner());
    let what = format!("make {}", args.join(" "));
    output(&what, command("make").arg("-C").arg(root()).args(args))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs the README's install command once, into a fresh prefix.
fn prefix() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let p = scratch("packaging").join("prefix");
        let _ = std::fs::remove_dir_all(&p);
        make(&["install", &format!("PREFIX={}", p.display())]);
        p
    })
}

fn link_target(p: &Path) -> String {
    std::fs::read_link(p)
        .unwrap_or_else(|e| panic!("{} is not a symlink: {e}", p.display()))
        .display()
        .to_string()
}

fn soname_of_version() -> String {
    let mut parts = VERSION.split('.');
    let major = parts.next().unwrap();
    let minor = parts.next().unwrap();
    if major == "0" {
        format!("libmemprobe.so.0.{minor}")
    } else {
        format!("libmemprobe.so.{major}")
    }
}

#[test]
fn install_lays_out_library_links_headers_and_package_files() {
    let p = prefix();
    let lib = p.join("lib");
    let real = lib.join(format!("libmemprobe.so.{VERSION}"));
    assert!(real.is_file() && !real.is_symlink(), "{}", real.display());
    let so = soname(&real);
    assert_eq!(so, soname_of_version());
    assert_eq!(
        link_target(&lib.join(&so)),
        format!("libmemprobe.so.{VERSION}")
    );
    assert_eq!(link_target(&lib.join("libmemprobe.so")), so);
    assert!(lib.join("libmemprobe.a").is_file());
    // The command, runnable from the prefix alone (it does not load the
    // shared library).
    let exe = p.join("bin/memprobe");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&exe).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o755, "{}", exe.display());
    let o = output(
        "memprobe --version",
        command(exe.to_str().unwrap()).arg("--version"),
    );
    assert_eq!(stdout(&o).trim(), format!("memprobe {VERSION}"));
    let o = output(
        "memprobe status --json",
        command(exe.to_str().unwrap())
            .args(["status", "--json"])
            .env("MEMPROBE_GPU_BACKEND", "none"),
    );
    assert!(stdout(&o).trim_start().starts_with('{'), "{}", stdout(&o));
    let header = std::fs::read(p.join("include/memprobe.h")).unwrap();
    assert_eq!(
        header,
        std::fs::read(root().join("include/memprobe.h")).unwrap()
    );
    if root().join("include/memprobe.hpp").exists() {
        assert!(p.join("include/memprobe.hpp").is_file());
    }
    // memprobe_torch.hpp includes the attribution header beside it.
    for h in ["memprobe_torch.hpp", "memprobe_torch_attribution.hpp"] {
        assert!(p.join("include").join(h).is_file(), "{h} not installed");
    }
    let pc = std::fs::read_to_string(lib.join("pkgconfig/memprobe.pc")).unwrap();
    assert!(pc.contains(&format!("\nVersion: {VERSION}\n")), "{pc}");
    assert!(pc.contains(&format!("prefix={}\n", p.display())), "{pc}");
    assert!(!pc.contains('@'), "unsubstituted template variable:\n{pc}");
    let cmake = lib.join("cmake/memprobe");
    let version = std::fs::read_to_string(cmake.join("memprobeConfigVersion.cmake")).unwrap();
    assert!(
        version.contains(&format!("set(PACKAGE_VERSION \"{VERSION}\")")),
        "{version}"
    );
    let config = std::fs::read_to_string(cmake.join("memprobeConfig.cmake")).unwrap();
    for text in [&config, &version] {
        assert!(
            !text.contains('@'),
            "unsubstituted template variable:\n{text}"
        );
    }
}

#[test]
fn default_prefix_is_usr_local() {
    let o = output(
        "make -n install",
        command("make")
            .arg("-C")
            .arg(root())
            .args(["-n", "install"]),
    );
    let plan = stdout(&o);
    assert!(plan.contains("bin='/usr/local/bin'"), "{plan}");
    assert!(plan.contains("lib='/usr/local/lib'"), "{plan}");
    assert!(plan.contains("inc='/usr/local/include'"), "{plan}");
}

#[test]
fn pkg_config_consumer_builds_and_runs() {
    if !require(
        "pkg_config_consumer_builds_and_runs",
        &["pkg-config"],
        "apt-get install pkg-config",
    ) {
        return;
    }
    let p = prefix();
    let pc_path = p.join("lib/pkgconfig");
    let pkg = |args: &[&str]| {
        let o = output(
            "pkg-config",
            command("pkg-config")
                .env("PKG_CONFIG_PATH", &pc_path)
                .args(args)
                .arg("memprobe"),
        );
        stdout(&o).trim().to_owned()
    };
    assert_eq!(pkg(&["--modversion"]), VERSION);
    assert_eq!(pkg(&["--variable=soname"]), soname_of_version());
    let dir = scratch("pkg-config-consumer");
    let exe = dir.join("consumer");
    let mut cc = command("cc");
    cc.arg(root().join("tests/packaging/consumer.c"))
        .arg("-o")
        .arg(&exe)
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"]);
    cc.args(pkg(&["--cflags", "--libs"]).split_whitespace());
    output("cc with pkg-config flags", &mut cc);
    // It runs as built, with no LD_LIBRARY_PATH (`command` removes it): the
    // .pc file's Libs: give the run path to this custom prefix.
    let o = output("pkg-config consumer", &mut command(exe.to_str().unwrap()));
    let out = stdout(&o);
    assert!(
        out.contains(&format!("memprobe {VERSION} ")) && out.contains("used"),
        "{out}"
    );
    // It really links the installed shared library, found by that run path.
    let o = output("objdump", command("objdump").arg("-p").arg(&exe));
    let dynamic = stdout(&o);
    assert!(
        dynamic.contains(&format!("NEEDED               {}", soname_of_version())),
        "{dynamic}"
    );
    assert!(
        dynamic.contains(&p.join("lib").display().to_string()),
        "the run path does not name the prefix's lib/:\n{dynamic}"
    );
}

fn cmake_configure(src: &Path, build: &Path, prefix: &Path, want: &str) -> Output {
    let _ = std::fs::remove_dir_all(build);
    command("cmake")
        .arg("-S")
        .arg(src)
        .arg("-B")
        .arg(build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
        .arg(format!("-DMEMPROBE_WANT={want}"))
        .output()
        .expect("run cmake")
}

#[test]
fn cmake_consumer_builds_and_runs_shared_and_static() {
    if !require(
        "cmake_consumer_builds_and_runs_shared_and_static",
        &["cmake"],
        "apt-get install cmake",
    ) {
        return;
    }
    let p = prefix();
    let src = root().join("tests/packaging/cmake-consumer");
    let build = scratch("cmake-consumer").join("build");
    let minor = VERSION.rsplit_once('.').unwrap().0;
    let o = cmake_configure(&src, &build, p, minor);
    assert_ok("cmake configure", &o);
    assert!(
        stdout(&o).contains(&format!("memprobe {VERSION} (")),
        "{}",
        stdout(&o)
    );
    output("cmake --build", command("cmake").arg("--build").arg(&build));
    for exe in ["consumer", "consumer_static"] {
        let o = output(exe, &mut command(build.join(exe).to_str().unwrap()));
        assert!(
            stdout(&o).contains(&format!("memprobe {VERSION} ")),
            "{}",
            stdout(&o)
        );
    }
    let dynamic = output(
        "objdump",
        command("objdump").arg("-p").arg(build.join("consumer")),
    );
    assert!(stdout(&dynamic).contains(&soname_of_version()));
    let fixed = output(
        "objdump",
        command("objdump")
            .arg("-p")
            .arg(build.join("consumer_static")),
    );
    assert!(
        !stdout(&fixed).contains("libmemprobe"),
        "static consumer needs libmemprobe.so"
    );
}

#[test]
fn cmake_version_check_follows_the_abi() {
    if !require(
        "cmake_version_check_follows_the_abi",
        &["cmake"],
        "apt-get install cmake",
    ) {
        return;
    }
    let p = prefix();
    let src = root().join("tests/packaging/cmake-consumer");
    let build = scratch("cmake-version").join("build");
    let mut parts = VERSION.split('.').map(|s| s.parse::<u64>().unwrap());
    let (major, minor) = (parts.next().unwrap(), parts.next().unwrap());
    let newer = format!("{}.0", major + 1);
    let o = cmake_configure(&src, &build, p, &newer);
    assert!(
        !o.status.success(),
        "find_package({newer}) accepted {VERSION}"
    );
    if major == 0 {
        // Before 1.0 another minor is another ABI, older or newer.
        let other = format!("0.{}", minor + 1);
        assert!(!cmake_configure(&src, &build, p, &other).status.success());
        if minor > 0 {
            let older = format!("0.{}", minor - 1);
            assert!(!cmake_configure(&src, &build, p, &older).status.success());
        }
    }
    let exact = cmake_configure(&src, &build, p, VERSION);
    assert_ok("find_package(exact version)", &exact);
}

#[test]
fn installed_prefix_can_be_moved() {
    if !require(
        "installed_prefix_can_be_moved",
        &["cmake", "pkg-config"],
        "apt-get install cmake pkg-config",
    ) {
        return;
    }
    let moved = scratch("packaging-moved").join("elsewhere");
    let _ = std::fs::remove_dir_all(&moved);
    output("cp -a", command("cp").arg("-a").arg(prefix()).arg(&moved));
    let o = output(
        "pkg-config --define-prefix",
        command("pkg-config")
            .env("PKG_CONFIG_PATH", moved.join("lib/pkgconfig"))
            .args(["--define-prefix", "--variable=libdir", "memprobe"]),
    );
    assert_eq!(stdout(&o).trim(), moved.join("lib").display().to_string());
    let src = root().join("tests/packaging/cmake-consumer");
    let build = scratch("cmake-moved").join("build");
    let o = cmake_configure(&src, &build, &moved, "");
    assert_ok("cmake configure (moved prefix)", &o);
    output("cmake --build", command("cmake").arg("--build").arg(&build));
    let o = output(
        "objdump",
        command("objdump").arg("-p").arg(build.join("consumer")),
    );
    assert!(
        stdout(&o).contains(&moved.join("lib").display().to_string()),
        "consumer's run path does not name the moved prefix:\n{}",
        stdout(&o)
    );
    output(
        "consumer (moved prefix)",
        &mut command(build.join("consumer").to_str().unwrap()),
    );
}

/// The fenced blocks of README.md whose info string is `lang`, each as its
/// lines.
fn readme_blocks(lang: &str) -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in readme.lines() {
        match (&mut current, line.strip_prefix("```")) {
            (None, Some(info)) if info.trim() == lang => current = Some(Vec::new()),
            (Some(_), Some("")) => blocks.extend(current.take()),
            (Some(b), _) => b.push(line.to_owned()),
            (None, _) => {}
        }
    }
    blocks
}

/// The README's C program (the block with `memprobe_window_open`), as
/// written: it is a whole program, saved as `app.c` by its reader.
fn readme_app_c() -> String {
    let block = readme_blocks("c")
        .into_iter()
        .find(|b| b.iter().any(|l| l.contains("memprobe_window_open")))
        .expect("README.md has the C program with memprobe_window_open");
    assert!(
        block.iter().any(|l| l.starts_with("int main(")),
        "the README's C block is a whole program"
    );
    block.join("\n") + "\n"
}

#[test]
fn readme_c_build_lines_work_verbatim_after_make_lib() {
    let block = readme_blocks("sh")
        .into_iter()
        .find(|b| {
            b.iter()
                .any(|l| l.starts_with("cc ") && l.contains("app.c"))
        })
        .expect("README.md has a sh block with the `cc ... app.c` build line");
    assert!(
        block[0].starts_with("make lib"),
        "the README's build lines start with `make lib`: {block:?}"
    );
    // `make lib` alone must leave target/release usable: start without the
    // SONAME link that other targets (demo-c, earlier versions) made.
    let release = root().join("target/release");
    make(&["lib"]);
    let link = release.join(soname(&release.join("libmemprobe.so")));
    let _ = std::fs::remove_file(&link);
    make(&["lib"]);
    assert_eq!(link_target(&link), "libmemprobe.so");
    // The remaining lines run verbatim, in a directory laid out like the
    // repository root for them: include/ and target/ of the repository, and
    // app.c (the README's C program).
    let dir = scratch("readme-c");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for d in ["include", "target"] {
        std::os::unix::fs::symlink(root().join(d), dir.join(d)).unwrap();
    }
    std::fs::write(dir.join("app.c"), readme_app_c()).unwrap();
    let script = block[1..].join("\n");
    let o = output(
        &format!("the README's lines\n{script}\n"),
        command("sh")
            .args(["-ec", &script])
            .current_dir(&dir)
            .env_remove("LD_LIBRARY_PATH"),
    );
    let out = stdout(&o);
    // Each step's 32 MiB shows in its exact peak.
    let peaks: Vec<u64> = out
        .lines()
        .filter_map(|l| {
            l.strip_prefix("step ")?
                .split(" peak ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(peaks.len(), 3, "{out}");
    assert!(peaks.iter().all(|&p| p >= 32 << 20), "{out}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("(eval: done)"),
        "the trace reports to stderr:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
