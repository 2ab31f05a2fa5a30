//! The C ABI from C: each program in tests/c is built with strict warnings
//! and run plainly, under AddressSanitizer + UBSan, and under valgrind.

use memprobe_tests::{
    assert_ok, compile, fresh_scratch, have_valgrind, lib_dir, root, run, run_valgrind, scratch,
    soname, Build,
};
use std::path::PathBuf;
use std::process::Command;

fn source(name: &str) -> Vec<PathBuf> {
    let dir = if name.ends_with(".cpp") {
        "tests/cpp"
    } else {
        "tests/c"
    };
    vec![root().join(dir).join(name)]
}

fn check_all_ways(name: &str, env: &[(&str, &str)]) {
    // Two tests may check one file (test_fork.c, with and without
    // membarrier) at the same time: each builds in a directory of its own.
    let dir = fresh_scratch(name);
    let plain = dir.join("plain");
    compile(&source(name), &plain, Build::Plain, &[]);
    let o = run(&plain, &[], env);
    assert_ok(name, &o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(" passed, 0 failed"), "{name}: {out}");
    assert!(
        o.stderr.is_empty() || name == "test_abi.c",
        "{name} printed to stderr:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );

    let asan = dir.join("asan");
    compile(&source(name), &asan, Build::Sanitized, &[]);
    // The Rust library is not instrumented; leaks inside it are checked by valgrind.
    let mut env_asan = env.to_vec();
    env_asan.push(("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0"));
    // See test_fork.c: libasan's allocator is not fork-safe with other threads allocating.
    env_asan.push(("MEMPROBE_FORK_NO_HAMMER", "1"));
    assert_ok(&format!("{name} under ASan"), &run(&asan, &[], &env_asan));

    if have_valgrind(&format!("the valgrind run of {name}")) {
        let o = run_valgrind(&plain, &[], env);
        assert_ok(&format!("{name} under valgrind"), &o);
    }
}

#[test]
fn abi_end_to_end_and_bad_input() {
    check_all_ways("test_abi.c", &[]);
}

#[test]
fn tree_pss_counts_pages_shared_with_workers_once() {
    check_all_ways("test_tree_smaps.c", &[]);
}

#[test]
fn tracker_phases_sinks_policies() {
    check_all_ways("test_tracker.c", &[]);
}

#[test]
fn tracker_tails_and_their_bad_input() {
    check_all_ways("test_tracker_tail.c", &[]);
}

#[test]
fn cpp_raii_layer() {
    check_all_ways("test_cpp.cpp", &[]);
}

#[test]
fn eight_threads_spiking_in_their_own_windows() {
    check_all_ways("test_threads.c", &[]);
}

#[test]
fn fork_inside_callbacks() {
    check_all_ways("test_fork_callback.c", &[]);
}

#[test]
fn fork_with_monitor_running() {
    check_all_ways("test_fork.c", &[]);
}

/// The fork gate's other path, taken where the kernel (before 4.14) or a
/// seccomp filter refuses `membarrier(2)`: each entry takes its own barrier.
#[test]
fn fork_with_monitor_running_without_membarrier() {
    check_all_ways("test_fork.c", &[("MEMPROBE_TEST_NO_MEMBARRIER", "1")]);
}

#[test]
fn injected_panic_is_a_status() {
    check_all_ways(
        "test_panic.c",
        &[("MEMPROBE_TEST_PANIC_IN", "memprobe_source_read")],
    );
}

#[test]
fn phases_sent_to_a_gone_run_channel_cost_nothing_but_drops() {
    // `memprobe run` gone: the socket the variable names does not exist.
    check_all_ways(
        "test_run_phases.c",
        &[("MEMPROBE_RUN_CHANNEL", "/nonexistent/memprobe-run/phases")],
    );
}

#[test]
fn soname_and_exported_symbols() {
    let so = lib_dir().join("libmemprobe.so");
    let name = soname(&so);
    let v = env!("CARGO_PKG_VERSION");
    let (major, minor) = (v.split('.').next().unwrap(), v.split('.').nth(1).unwrap());
    let want = if major == "0" {
        format!("libmemprobe.so.0.{minor}")
    } else {
        format!("libmemprobe.so.{major}")
    };
    assert_eq!(name, want);
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&so)
        .output()
        .expect("run nm");
    let text = String::from_utf8_lossy(&out.stdout);
    let exported: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, sym) = (f.next()?, f.next()?, f.next()?);
            matches!(kind, "T" | "D" | "B" | "R" | "V" | "W").then_some(sym)
        })
        .collect();
    assert!(exported.len() > 20, "{exported:?}");
    let foreign: Vec<&&str> = exported
        .iter()
        .filter(|s| !s.starts_with("memprobe_"))
        .collect();
    assert!(
        foreign.is_empty(),
        "symbols outside memprobe_* are exported: {foreign:?}"
    );
    let header = std::fs::read_to_string(root().join("include/memprobe.h")).unwrap();
    for sym in &exported {
        let declared = header.contains(&format!(" {sym}(")) || header.contains(&format!("*{sym}("));
        assert!(declared, "{sym} is exported but not declared in the header");
    }
}

#[test]
fn metrics_exporter() {
    check_all_ways("test_metrics.c", &[("MEMPROBE_GPU_BACKEND", "none")]);
}

#[test]
fn metrics_exporter_with_a_web_config() {
    check_all_ways("test_web_config.c", &[("MEMPROBE_GPU_BACKEND", "none")]);
}

#[test]
fn file_sinks_refuse_directories_and_leave_no_temporary_files() {
    check_all_ways("test_sink_paths.c", &[]);
}

#[test]
fn exact_sources_over_a_callers_resettable_marks() {
    check_all_ways("test_marks.c", &[]);
}

#[test]
fn cpp_sources_marks_runtime_lists_callbacks_exporter() {
    check_all_ways("test_cpp_sources.cpp", &[("MEMPROBE_GPU_BACKEND", "none")]);
}

#[path = "../../memprobe-cli/tests/cli/schema.rs"]
mod schema;

/// The reports test_oom.c left (JSON, one per line), against
/// docs/oom-report.schema.json.
fn assert_reports_valid(dir: &std::path::Path, names: &[&str]) {
    for name in names {
        let path = dir.join(name);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // A file holds one report; a descriptor one per line.
        for line in text.lines() {
            let doc: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{} is not JSON: {e}\n{line}", path.display()));
            schema::assert_valid("docs/oom-report.schema.json", &doc);
        }
    }
}

#[test]
fn out_of_memory_reports_from_the_caller() {
    let dir = scratch("oom-reports");
    let shown = dir.display().to_string();
    check_all_ways("test_oom.c", &[("OOM_TEST_DIR", &shown)]);
    assert_reports_valid(&dir, &["report.json", "report.fd.json"]);
}

#[test]
fn out_of_memory_reports_carry_the_live_blocks_table() {
    let dir = scratch("oom-live-blocks");
    let shown = dir.display().to_string();
    check_all_ways("test_oom_live_blocks.c", &[("OOM_TEST_DIR", &shown)]);
    assert_reports_valid(&dir, &["live.fd.json"]);
}

#[test]
fn cpp_out_of_memory_reports() {
    let dir = scratch("oom-reports-cpp");
    let shown = dir.display().to_string();
    check_all_ways("test_cpp_oom.cpp", &[("OOM_TEST_DIR", &shown)]);
    assert_reports_valid(&dir, &["cpp.json"]);
}

#[test]
fn a_boundary_that_fails_part_way_keeps_every_peak() {
    check_all_ways("test_failed_boundary.c", &[]);
}

#[test]
fn out_of_memory_report_destinations_refused_broken_and_retried() {
    let dir = scratch("oom-destinations");
    let shown = dir.display().to_string();
    check_all_ways("test_oom_destinations.c", &[("OOM_TEST_DIR", &shown)]);
    assert_reports_valid(&dir, &["piped.json", "retry.json"]);
}

/// The deprecated C names (memprobe_oom_report, memprobe_oom_status,
/// memprobe_oom_event, memprobe_oom_cache, until 0.3.0) still build and
/// work, and using each gives a deprecation warning.
#[test]
fn deprecated_names_build_work_and_warn() {
    let name = "test_deprecated_names.c";
    let dir = scratch(name);
    let plain = dir.join("plain");
    let built = compile(
        &source(name),
        &plain,
        Build::Plain,
        &["-Wno-error=deprecated-declarations"],
    );
    let warnings = String::from_utf8_lossy(&built.stderr);
    for old in [
        "memprobe_oom_report",
        "memprobe_oom_status",
        "memprobe_oom_event",
        "memprobe_oom_cache",
    ] {
        assert!(
            // The compiler quotes the name with ' or, in a UTF-8 locale, with ’.
            warnings.lines().any(|l| l.contains("deprecated")
                && (l.contains(&format!("{old}'")) || l.contains(&format!("{old}\u{2019}")))),
            "no deprecation warning for {old}:\n{warnings}"
        );
    }
    let o = run(&plain, &[], &[]);
    assert_ok(name, &o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(" passed, 0 failed"), "{name}: {out}");
}
