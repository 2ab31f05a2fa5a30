//! The C trainer example builds with strict warnings, reports exact step
//! peaks that include each spike, and runs clean under valgrind. The
//! examples build as a user who copies them would: plain compiler flags, no
//! feature macros.

use memprobe_tests::{
    assert_ok, compile, have_valgrind, lib_dir, root, run, run_valgrind, scratch, Build,
};
use std::process::Command;

fn parse_peaks(out: &str) -> Vec<(f64, f64)> {
    out.lines()
        .filter(|l| l.contains("exact peak"))
        .map(|l| {
            let start: f64 = l
                .split("rss")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
            let peak: f64 = l
                .split("exact peak")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
            (start, peak)
        })
        .collect()
}

#[test]
fn c_trainer_reports_every_spike() {
    let dir = scratch("trainer");
    let exe = dir.join("trainer");
    compile(
        &[root().join("examples-c/trainer.c")],
        &exe,
        Build::Plain,
        &[],
    );
    let o = run(&exe, &["2", "3", "128", "8"], &[]);
    assert_ok("trainer", &o);
    let out = String::from_utf8_lossy(&o.stdout);
    let peaks = parse_peaks(&out);
    assert_eq!(peaks.len(), 6, "{out}");
    for (start, peak) in peaks {
        // Each step's 128 MiB spike stands above its start (the kept buffer
        // may replace a freed one, so only the spike is guaranteed).
        assert!(
            peak >= start + 128.0 - 2.0,
            "step peak {peak} misses the spike over {start}:\n{out}"
        );
    }
    assert_eq!(out.matches("△Used Peaked MB:").count(), 2, "{out}");
    assert!(
        out.contains("(epoch: 1)") && out.contains("(epoch: 2)"),
        "{out}"
    );
    assert!(
        o.stderr.is_empty(),
        "the library printed to stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    let asan = dir.join("trainer-asan");
    compile(
        &[root().join("examples-c/trainer.c")],
        &asan,
        Build::Sanitized,
        &[],
    );
    assert_ok(
        "trainer under ASan",
        &run(&asan, &["1", "2", "16", "4"], &[]),
    );
    if have_valgrind("trainer under valgrind") {
        assert_ok(
            "trainer under valgrind",
            &run_valgrind(&exe, &["1", "2", "16", "4"], &[]),
        );
    }
}

#[test]
fn cpp_trainer_flags_the_leak_and_releases_the_cache() {
    let dir = scratch("trainer-cpp");
    let exe = dir.join("trainer_cpp");
    compile(
        &[root().join("examples-c/trainer.cpp")],
        &exe,
        Build::Plain,
        &[],
    );
    let o = run(&exe, &["5", "8"], &[]);
    assert_ok("trainer_cpp", &o);
    let out = String::from_utf8_lossy(&o.stdout);
    // The table's first row comes after nothing the program printed (it
    // printed nothing before), its column named as the source.
    assert!(
        out.starts_with("epoch  rss used  peak  leak\n    0 "),
        "{out}"
    );
    let flags: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("epoch ") && l.contains("leak flag"))
        .map(|l| l.rsplit(' ').next().unwrap())
        .collect();
    // After each epoch's cache release, 8 MiB more stays: growing from epoch
    // 2 on, flagged once 2 epochs in a row have grown.
    assert_eq!(flags, ["off", "off", "ON", "ON", "ON"], "{out}");
    let releases: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("epoch ") && l.contains("releases "))
        .map(|l| {
            l.split("releases ")
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap()
        })
        .collect();
    assert_eq!(releases, ["1", "1", "1", "1", "1"], "every epoch:\n{out}");
    assert!(
        out.contains("releases fired: 5; process flagged as leaking: yes"),
        "{out}"
    );
    if have_valgrind("trainer_cpp under valgrind") {
        assert_ok(
            "trainer_cpp under valgrind",
            &run_valgrind(&exe, &["2", "1"], &[]),
        );
    }
}

/// Builds `source` with exactly `flags` (plus the include path and the
/// library), as a user copying the example would, and runs it with `args`.
fn build_plain_and_run(compiler: &str, flags: &[&str], source: &str, args: &[&str]) {
    let dir = scratch("examples-plain");
    let name = format!(
        "{}-{}",
        source.replace(['/', '.'], "_"),
        flags.join("").replace(['-', '='], "")
    );
    let exe = dir.join(name);
    let lib = lib_dir();
    let o = Command::new(compiler)
        .args(flags)
        .arg("-I")
        .arg(root().join("include"))
        .arg(root().join(source))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lmemprobe")
        .output()
        .expect("run the compiler");
    assert_ok(&format!("{compiler} {} {source}", flags.join(" ")), &o);
    assert_ok(
        &format!("{source} built with {flags:?}"),
        &run(&exe, args, &[]),
    );
}

#[test]
fn examples_build_with_plain_flags() {
    // What a user types, and the Makefile's strict build without its old
    // -D_GNU_SOURCE: the example asks for what it needs itself.
    for flags in [
        &["-Wall", "-Wextra", "-Werror"][..],
        &["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"][..],
    ] {
        build_plain_and_run("cc", flags, "examples-c/trainer.c", &["1", "2", "16", "4"]);
    }
    for flags in [
        &["-std=c++17", "-Wall", "-Wextra", "-Werror"][..],
        &["-std=c++17", "-Wall", "-Wextra", "-Werror", "-pedantic"][..],
    ] {
        build_plain_and_run("c++", flags, "examples-c/trainer.cpp", &["2", "1"]);
    }
}

#[test]
fn makefile_builds_the_examples_without_feature_macros() {
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    let strict = makefile
        .lines()
        .find(|l| l.starts_with("CFLAGS_STRICT :="))
        .expect("the Makefile defines CFLAGS_STRICT");
    assert!(!strict.contains("-D_"), "{strict}");
}
