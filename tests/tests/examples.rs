//! The C trainer example builds with strict warnings, reports exact step
//! peaks that include each spike, and runs clean under valgrind.

use memprobe_tests::{assert_ok, compile, have_valgrind, root, run, run_valgrind, scratch, Build};

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
    if have_valgrind() {
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
    assert!(out.starts_with("epoch  cpu used  peak  leak\n"), "{out}");
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
    if have_valgrind() {
        assert_ok(
            "trainer_cpp under valgrind",
            &run_valgrind(&exe, &["2", "1"], &[]),
        );
    }
}
