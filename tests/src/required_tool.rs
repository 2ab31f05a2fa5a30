//! Tests that need an external program (valgrind, pkg-config, cmake,
//! prometheus, promtool, torch): where it is missing, a test skips and says
//! why — except under `CI=true`, where `.ci/run` installs every one of them
//! and a missing program fails the test, so CI can never pass on a test
//! that did not run. Shared by memprobe-tests and memprobe-metrics' tests
//! (which include this file with `#[path]`).

/// Whether the environment says this is CI (`CI=true`, as CI runners and
/// `.ci/run` set it).
pub fn under_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Whether `program --version` runs and succeeds.
pub fn installed(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// For a test that cannot run because `why`: panics under `CI=true`,
/// otherwise prints `SKIP test: why` on stderr (the caller then returns).
pub fn skip_or_fail(test: &str, why: &str) {
    assert!(
        !under_ci(),
        "{test}: {why} (CI=true: .ci/run installs it, so this is a failure)"
    );
    eprintln!("SKIP {test}: {why}");
}

/// `true` when every one of `programs` is installed; otherwise
/// [`skip_or_fail`] names the missing ones with `hint` (how to install
/// them) and returns `false`.
pub fn require(test: &str, programs: &[&str], hint: &str) -> bool {
    let missing: Vec<&str> = programs.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return true;
    }
    skip_or_fail(
        test,
        &format!("{} not installed ({hint})", missing.join(", ")),
    );
    false
}
