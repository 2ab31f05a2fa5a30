//! The run channel from a tracker's side: what a tracker sends for its
//! phases, and that a receiver that never reads, or is gone, never stalls
//! the training loop (the channel named by MEMPROBE_RUN_CHANNEL is opened
//! once per process, so those cases run in a child: this test binary
//! re-executed with MEMPROBE_TEST_CHANNEL_CHILD set).

use memprobe_core::internal::run_channel::{self, MAX_DATAGRAM};
use memprobe_core::RunChannel;
use memprobe_core::{PhaseKind, Source, Tracker};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const CHILD: &str = "MEMPROBE_TEST_CHANNEL_CHILD";
const STEPS: u64 = 100_000;

fn socket_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memprobe-rc-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn pushed(v: u64) -> Source {
    let s = Source::pushed("mem").unwrap();
    s.push(v).unwrap();
    s
}

fn recv_all(sock: &UnixDatagram) -> Vec<String> {
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    let mut out = Vec::new();
    while let Ok(n) = sock.recv(&mut buf) {
        out.push(String::from_utf8(buf[..n].to_vec()).unwrap());
    }
    out
}

fn field<'a>(msg: &'a str, key: &str) -> &'a str {
    let pat = format!("\"{key}\":");
    let at = msg
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {msg}"))
        + pat.len();
    let rest = &msg[at..];
    let end = rest.find([',', '}', ']']).unwrap_or(rest.len());
    rest[..end].trim_matches('"')
}

#[test]
fn a_tracker_sends_begins_steps_and_records() {
    let dir = socket_dir("send");
    let path = dir.join("s");
    let sock = UnixDatagram::bind(&path).unwrap();
    let mem = pushed(100);
    let mut t = Tracker::new(std::slice::from_ref(&mem)).unwrap();
    t.set_run_channel(Some(Arc::new(RunChannel::connect(&path).unwrap())));
    t.begin(PhaseKind::Epoch, None).unwrap();
    t.begin(PhaseKind::Step, None).unwrap();
    mem.push(500).unwrap();
    mem.push(110).unwrap();
    let r = t.next(PhaseKind::Step, None).unwrap();
    assert_eq!(
        r.phase.unwrap().depth,
        1,
        "a step ended by next is inside the epoch only"
    );
    t.next(PhaseKind::Step, None).unwrap();
    t.end(PhaseKind::Step, None).unwrap();
    t.begin(PhaseKind::Custom, Some("eval \"x\"")).unwrap();
    t.end(PhaseKind::Custom, Some("eval \"x\"")).unwrap();
    t.end(PhaseKind::Epoch, None).unwrap();
    // Sends nowhere once told so.
    t.set_run_channel(None);
    t.begin(PhaseKind::Epoch, None).unwrap();

    let msgs = recv_all(&sock);
    let summary: Vec<String> = msgs
        .iter()
        .map(|m| {
            format!(
                "{} {} {} i{} d{}",
                field(m, "ev"),
                field(m, "kind"),
                field(m, "seq"),
                field(m, "index"),
                field(m, "depth")
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            "begin epoch 0 i0 d0",
            "begin step 1 i0 d1",
            "steps step 2 i0 d1",
            "begin custom 3 i0 d1",
            "end custom 4 i0 d1",
            "end epoch 5 i0 d0",
        ],
        "{msgs:#?}"
    );
    for m in &msgs {
        assert!(m.starts_with(r#"{"v":1,"#), "{m}");
        assert_eq!(field(m, "pid"), std::process::id().to_string());
        assert_eq!(field(m, "dropped"), "0");
    }
    // The three steps in one batch, sent before the custom phase began:
    // the first held the spike; no step is open after the last.
    let batch = &msgs[2];
    assert_eq!(field(batch, "count"), "3", "{batch}");
    assert_eq!(field(batch, "last"), "2", "{batch}");
    assert_eq!(field(batch, "next"), "false");
    assert!(
        batch.contains(r#""peak":500,"delta_used":10,"delta_peaked":390,"index":0,"#),
        "{batch}"
    );
    assert!(msgs[3].contains(r#""name":"eval \"x\"""#), "{}", msgs[3]);
    let started: u64 = field(batch, "started_ns").parse().unwrap();
    let ended: u64 = field(batch, "ended_ns").parse().unwrap();
    assert!(started > 0 && ended >= started);
    assert_eq!(field(&msgs[1], "t_ns"), started.to_string());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The child: a tracker over a pushed source runs STEPS step boundaries
/// under the channel the environment names, then prints what it sent.
#[test]
fn channel_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let mem = pushed(1 << 20);
    let mut t = Tracker::new(std::slice::from_ref(&mem)).unwrap();
    t.begin(PhaseKind::Epoch, None).unwrap();
    t.begin(PhaseKind::Step, None).unwrap();
    for _ in 0..STEPS {
        t.next(PhaseKind::Step, None).unwrap();
    }
    t.end(PhaseKind::Step, None).unwrap();
    t.end(PhaseKind::Epoch, None).unwrap();
    let ch = RunChannel::from_env().expect("the environment names a channel");
    let (kept, _) = ch.pending();
    println!(
        "CHANNEL sent {} dropped {} kept {kept} steps_dropped {}",
        ch.sent(),
        ch.dropped(),
        ch.dropped_steps()
    );
}

/// What the child said: sent, dropped, kept, steps dropped.
fn run_child(path: &Path) -> (u64, u64, u64, u64) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["channel_child", "--exact", "--nocapture", "-q"])
        .env(CHILD, "1")
        .env(run_channel::ENV, path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A guard against a hang only (a stalled child would never end), not a
    // speed test: the loop takes well under a second.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the child stalled on a receiver that never reads");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("CHANNEL"))
        .unwrap_or_else(|| panic!("{text}"));
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (v[0], v[1], v[2], v[3])
}

/// Step records: STEPS `next`s and the last step's end.
const STEP_RECORDS: u64 = STEPS + 1;

#[test]
fn a_receiver_that_never_reads_never_stalls_the_loop() {
    let dir = socket_dir("stalled");
    let path = dir.join("s");
    let sock = UnixDatagram::bind(&path).unwrap();
    let (sent, dropped, kept, _) = run_child(&path);
    // The steps went out in batches; the queue holds a handful of
    // datagrams, the rest was kept (and given up at exit), none dropped.
    assert_eq!(dropped, 0);
    assert!(sent >= 1 && sent + kept < 1000, "sent {sent}, kept {kept}");
    let queued = recv_all(&sock);
    assert_eq!(queued.len() as u64, sent);
    assert_eq!(field(&queued[0], "seq"), "0");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_gone_receiver_never_stalls_the_loop() {
    let dir = socket_dir("gone");
    let path = dir.join("s");
    drop(UnixDatagram::bind(&path).unwrap());
    // The socket file stays without its socket: ECONNREFUSED. Every
    // message is dropped and counted, every step among them.
    let (sent, dropped, kept, steps) = run_child(&path);
    assert_eq!((sent, kept, steps), (0, 0, STEP_RECORDS));
    assert!(dropped >= 4, "{dropped}");
    // No socket file at all: ENOENT.
    std::fs::remove_dir_all(&dir).unwrap();
    let (sent, dropped, kept, steps) = run_child(&path);
    assert_eq!((sent, kept, steps), (0, 0, STEP_RECORDS));
    assert!(dropped >= 4, "{dropped}");
}
