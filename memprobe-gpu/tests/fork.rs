//! fork() while another thread initialises NVML: the fork waits for the
//! initialisation (the shared instance's lock is fork-gated), so the child
//! finds the instance ready instead of an initialisation that never ends.

mod common;

use common::{assert_child_ok, is_child, run_child, Fake};
use memprobe_gpu::Gpus;
use std::time::Duration;

#[test]
fn fork_during_nvml_init() {
    let fake = Fake::nvml("init_delay_ms 300\ndevices 2\n");
    let out = run_child(
        "fork_during_nvml_init_child",
        &[("MEMPROBE_NVML_LIBRARY", fake.lib.to_str().unwrap())],
    );
    assert_child_ok(&out, "CHILD-DONE fork");
}

#[test]
fn fork_during_nvml_init_child() {
    if !is_child("fork_during_nvml_init_child") {
        return;
    }
    let opener = std::thread::spawn(|| Gpus::shared().device_count().unwrap());
    // Let the thread get into the fake's 300 ms nvmlInit_v2.
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: the child only makes an atomic load and async-signal-safe calls
    // (alarm, _exit) before exiting.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: as above; alarm kills a deadlocked child.
        unsafe { libc::alarm(10) };
        let ok = Gpus::shared().device_count() == Ok(2);
        // SAFETY: leaves the child without running the parent's destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for the child created above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x} (SIGALRM = deadlocked)"
    );
    assert_eq!(opener.join().unwrap(), 2);
    println!("CHILD-DONE fork");
}
