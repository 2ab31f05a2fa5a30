//! [`RunChannel`]: the socket a traced program sends its messages on,
//! what it keeps while the receiver's queue is full, the counts of what it
//! dropped, its flush at the process's exit, and its behaviour across a
//! fork (see the module [`run_channel`](super)).

use super::batch::Batch;
use super::protocol::{encode, Head, Outgoing};
use super::ranks::Ranks;
use super::{ENV, FLUSH_WAIT, GONE_SKIP, MAX_PENDING};
use crate::error::{Error, Result};
use crate::fork::GateGuard;
use crate::lock::{Lock, LockGuard};
use std::collections::VecDeque;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A message kept until the receiver's queue has room.
#[derive(Debug)]
struct Kept {
    text: String,
    /// The steps it carries (a batch), else 0: a boundary.
    steps: u64,
}

/// What a channel keeps between sends: messages waiting for room, and each
/// tracker's steps not sent yet.
#[derive(Debug, Default)]
struct Queue {
    kept: VecDeque<Kept>,
    batches: Vec<Batch>,
    /// The buffer messages are encoded in (reused).
    buf: String,
}

/// How one send went.
enum Sent {
    Yes,
    /// The receiver's queue is full: keep it, try later.
    Full,
    /// The receiver is gone: drop it, and what was kept.
    Gone,
    /// This message cannot be sent (any other error): drop it alone.
    Refused,
}

/// A datagram socket aimed at a receiver (`memprobe run`), with the counts
/// of what this process sent and dropped.
///
/// [`RunChannel::from_env`] is the one every tracker uses unless told
/// otherwise ([`Tracker::set_run_channel`](crate::Tracker::set_run_channel)).
#[derive(Debug)]
pub struct RunChannel {
    fd: libc::c_int,
    addr: libc::sockaddr_un,
    addr_len: libc::socklen_t,
    /// Whether sends go to the socket connected at the start (else to the
    /// address, looked up at each send).
    connected: AtomicBool,
    /// The process the counters below belong to (a forked child resets them).
    pid: AtomicU32,
    /// The fork generation `pid` was taken in: while it holds, `pid` is
    /// this process's (no `getpid` system call per step).
    generation: AtomicU64,
    seq: AtomicU64,
    dropped: AtomicU64,
    dropped_steps: AtomicU64,
    sent: AtomicU64,
    /// Messages numbered below this are dropped without a system call.
    skip_until: AtomicU64,
    /// This process's ranks, sent in every message (a forked child keeps
    /// its parent's: it works for the same rank).
    ranks: Option<Ranks>,
    queue: Lock<Queue>,
}

static CHANNEL: OnceLock<Option<RunChannel>> = OnceLock::new();

/// At the process's exit: what the channel named by the environment kept
/// goes out (see [`RunChannel::flush`]).
extern "C" fn flush_at_exit() {
    // Never unwinds into libc's exit.
    let _ = std::panic::catch_unwind(|| {
        if let Some(Some(c)) = CHANNEL.get() {
            c.flush(FLUSH_WAIT);
        }
    });
}

impl RunChannel {
    /// A channel to the datagram socket bound at `path` (nothing is sent
    /// yet; the receiver need not exist), its messages carrying this
    /// process's ranks when its launcher set them ([`Ranks::from_env`]).
    /// Fails when the path cannot be a
    /// socket address (longer than 107 bytes, or holding a NUL byte) or no
    /// socket can be created.
    pub fn connect(path: &Path) -> Result<RunChannel> {
        let bytes = path.as_os_str().as_bytes();
        // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
            return Err(Error::invalid(format!(
                "{ENV}: {} is not a usable socket path (1 to {} bytes, no NUL)",
                path.display(),
                addr.sun_path.len() - 1
            )));
        }
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, &s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = s as libc::c_char;
        }
        let addr_len =
            (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
        // SAFETY: plain socket(2) call.
        let fd = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if fd < 0 {
            return Err(Error::io(
                "creating the run channel's socket",
                &std::io::Error::last_os_error(),
            ));
        }
        // The fork handlers, which tell a child it is one, are in place
        // before the pid is cached.
        drop(GateGuard::enter());
        // Connected once, a datagram socket skips the path lookup at every
        // send; without a receiver yet, each send names the address.
        // SAFETY: fd is our socket; addr is initialised for addr_len bytes.
        let connected =
            unsafe { libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), addr_len) } == 0;
        Ok(RunChannel {
            fd,
            addr,
            addr_len,
            connected: AtomicBool::new(connected),
            pid: AtomicU32::new(current_pid()),
            generation: AtomicU64::new(crate::fork::generation()),
            seq: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            dropped_steps: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            skip_until: AtomicU64::new(0),
            ranks: Ranks::from_env(),
            queue: Lock::new(Queue::default()),
        })
    }

    /// The same channel, its messages carrying `ranks` instead (`None`:
    /// none), for a program that knows its rank better than its
    /// environment does. Ranks that are not a process's (the rank or the
    /// local rank not below the world size) are left out.
    pub fn with_ranks(mut self, ranks: Option<Ranks>) -> RunChannel {
        self.ranks = ranks.filter(Ranks::valid);
        self
    }

    /// The ranks its messages carry.
    pub fn ranks(&self) -> Option<Ranks> {
        self.ranks
    }

    /// The channel named by [`ENV`], opened at the first call in this
    /// process; `None` when the variable is unset, empty or unusable. What
    /// it keeps is sent at the process's exit.
    pub fn from_env() -> Option<&'static RunChannel> {
        if let Some(c) = CHANNEL.get() {
            return c.as_ref();
        }
        // Held across the initialisation so that a fork never copies a
        // half-initialised cell into a child (it would wait on it forever).
        let _gate = GateGuard::enter();
        CHANNEL
            .get_or_init(|| {
                let path = std::env::var_os(ENV).filter(|p| !p.is_empty())?;
                let c = RunChannel::connect(Path::new(&path)).ok()?;
                // SAFETY: a plain extern "C" function with 'static lifetime.
                unsafe { libc::atexit(flush_at_exit) };
                Some(c)
            })
            .as_ref()
    }

    /// Messages this process has sent through the channel.
    pub fn sent(&self) -> u64 {
        self.pid_now();
        self.sent.load(Ordering::Relaxed)
    }

    /// Messages this process has dropped (the receiver gone, or slow for
    /// longer than [`MAX_PENDING`] messages).
    pub fn dropped(&self) -> u64 {
        self.pid_now();
        self.dropped.load(Ordering::Relaxed)
    }

    /// Steps in the batches this process has dropped.
    pub fn dropped_steps(&self) -> u64 {
        self.pid_now();
        self.dropped_steps.load(Ordering::Relaxed)
    }

    /// Messages kept until the receiver has room, and steps not sent yet.
    pub fn pending(&self) -> (usize, u64) {
        self.pid_now();
        match self.lock() {
            Some(q) => (q.kept.len(), q.batches.iter().map(|b| b.count).sum()),
            None => (0, 0),
        }
    }

    /// Sends every tracker's steps and everything kept, waiting up to `wait`
    /// for the receiver to make room. Returns whether nothing is left (what
    /// is left is sent before the next message, or dropped and counted).
    pub fn flush(&self, wait: Duration) -> bool {
        self.flush_where(wait, |_| true)
    }

    fn flush_where(&self, wait: Duration, which: impl Fn(u64) -> bool) -> bool {
        self.pid_now();
        let deadline = Instant::now() + wait;
        {
            let _gate = GateGuard::enter();
            let Some(mut q) = self.lock() else {
                return false;
            };
            let trackers: Vec<u64> = q
                .batches
                .iter()
                .filter(|b| !b.is_empty() && which(b.tracker))
                .map(|b| b.tracker)
                .collect();
            for t in trackers {
                self.send_batch(&mut q, t);
            }
        }
        loop {
            {
                // The fork gate is not held while sleeping.
                let _gate = GateGuard::enter();
                let Some(mut q) = self.lock() else {
                    return false;
                };
                match self.send_kept(&mut q) {
                    Sent::Yes | Sent::Refused => return true,
                    Sent::Gone => return q.kept.is_empty(),
                    Sent::Full if Instant::now() >= deadline => return false,
                    Sent::Full => {}
                }
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// The queue, under memprobe's lock, which holds the fork gate: a
    /// host's fork waits until the queue is released, so a child never
    /// inherits it held. `None` only on re-entry from this thread, which no
    /// path here makes (no caller's code runs under it).
    fn lock(&self) -> Option<LockGuard<'_, Queue>> {
        self.queue.lock().ok()
    }

    /// This process's pid: the cached one unless a fork happened since
    /// (then `getpid`, and the counters restart: [`RunChannel::counting_for`]).
    fn pid_now(&self) -> u32 {
        let generation = crate::fork::generation();
        if self.generation.load(Ordering::Acquire) == generation {
            return self.pid.load(Ordering::Relaxed);
        }
        let pid = current_pid();
        self.counting_for(pid);
        self.generation.store(generation, Ordering::Release);
        pid
    }

    /// Resets the counters when `pid` is not the process they counted for
    /// (the first use after a fork): the parent's kept messages are its own.
    fn counting_for(&self, pid: u32) {
        if self.pid.load(Ordering::Relaxed) != pid && self.pid.swap(pid, Ordering::AcqRel) != pid {
            self.seq.store(0, Ordering::Relaxed);
            self.dropped.store(0, Ordering::Relaxed);
            self.dropped_steps.store(0, Ordering::Relaxed);
            self.sent.store(0, Ordering::Relaxed);
            self.skip_until.store(0, Ordering::Relaxed);
            if let Some(mut q) = self.lock() {
                q.kept.clear();
                q.batches.clear();
            }
        }
    }

    fn head(&self, pid: u32, tracker: u64, seq: u64) -> Head {
        Head {
            pid,
            tracker,
            seq,
            dropped: self.dropped.load(Ordering::Relaxed),
            dropped_steps: self.dropped_steps.load(Ordering::Relaxed),
            ranks: self.ranks,
        }
    }

    fn drop_counted(&self, steps: u64) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.dropped_steps.fetch_add(steps, Ordering::Relaxed);
    }

    /// One `send`, never blocking.
    fn send_raw(&self, text: &str) -> Sent {
        let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
        let connected = self.connected.load(Ordering::Relaxed);
        let rc = if connected {
            // SAFETY: text is valid for its length; the flags make the call
            // non-blocking.
            unsafe { libc::send(self.fd, text.as_ptr().cast(), text.len(), flags) }
        } else {
            // SAFETY: as above; addr is an initialised sockaddr_un of
            // addr_len bytes.
            unsafe {
                libc::sendto(
                    self.fd,
                    text.as_ptr().cast(),
                    text.len(),
                    flags,
                    (&self.addr as *const libc::sockaddr_un).cast(),
                    self.addr_len,
                )
            }
        };
        if rc >= 0 {
            self.sent.fetch_add(1, Ordering::Relaxed);
            return Sent::Yes;
        }
        let errno = std::io::Error::last_os_error().raw_os_error();
        match errno {
            Some(libc::EAGAIN | libc::ENOBUFS | libc::EINTR) => Sent::Full,
            Some(libc::ENOENT | libc::ECONNREFUSED | libc::ENOTCONN) => {
                if connected {
                    // The receiver closed: the kernel dropped the
                    // connection. A receiver bound at the path later is
                    // reached by address.
                    self.connected.store(false, Ordering::Relaxed);
                }
                let seq = self.seq.load(Ordering::Relaxed);
                self.skip_until
                    .fetch_max(seq.saturating_add(GONE_SKIP), Ordering::Relaxed);
                Sent::Gone
            }
            _ => Sent::Refused,
        }
    }

    /// Sends what was kept, oldest first, until the receiver is full.
    fn send_kept(&self, q: &mut Queue) -> Sent {
        while let Some(k) = q.kept.front() {
            match self.send_raw(&k.text) {
                Sent::Yes => {
                    q.kept.pop_front();
                }
                Sent::Refused => {
                    let k = q.kept.pop_front().expect("front");
                    self.drop_counted(k.steps);
                }
                Sent::Full => return Sent::Full,
                Sent::Gone => {
                    // Nobody will read them: counted, not kept.
                    for k in q.kept.drain(..) {
                        self.drop_counted(k.steps);
                    }
                    return Sent::Gone;
                }
            }
        }
        Sent::Yes
    }

    /// Sends `q.buf` (a message carrying `steps` steps, 0 for a boundary)
    /// after what was kept, or keeps it.
    fn deliver(&self, q: &mut Queue, steps: u64) {
        let sent = match self.send_kept(q) {
            Sent::Yes => self.send_raw(&q.buf),
            other => other,
        };
        match sent {
            Sent::Yes => {}
            Sent::Gone | Sent::Refused => self.drop_counted(steps),
            Sent::Full => {
                if q.kept.len() >= MAX_PENDING {
                    // Over the bound: a batch of steps goes first (this one,
                    // or the oldest kept); a boundary only when none is left.
                    let victim = if steps > 0 {
                        None
                    } else {
                        q.kept.iter().position(|k| k.steps > 0)
                    };
                    match victim {
                        Some(i) => {
                            let k = q.kept.remove(i).expect("found");
                            self.drop_counted(k.steps);
                        }
                        None => {
                            self.drop_counted(steps);
                            return;
                        }
                    }
                }
                let text = q.buf.clone();
                q.kept.push_back(Kept { text, steps });
            }
        }
    }

    /// Numbers the next message; `None` when it is to be dropped unsent
    /// (the receiver was found gone a moment ago).
    /// The caller has called [`RunChannel::pid_now`] before locking.
    fn number(&self, steps: u64) -> Option<(u32, u64)> {
        let pid = self.pid.load(Ordering::Relaxed);
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        if seq < self.skip_until.load(Ordering::Relaxed) {
            self.drop_counted(steps);
            return None;
        }
        Some((pid, seq))
    }

    /// Sends the batch of `tracker`, if it holds anything.
    fn send_batch(&self, q: &mut Queue, tracker: u64) {
        let Some(i) = q.batches.iter().position(|b| b.tracker == tracker) else {
            return;
        };
        if q.batches[i].is_empty() {
            return;
        }
        let steps = q.batches[i].count;
        if let Some((pid, seq)) = self.number(steps) {
            let head = self.head(pid, tracker, seq);
            let Queue { batches, buf, .. } = &mut *q;
            encode(buf, &head, &batches[i].outgoing());
            self.deliver(q, steps);
        }
        q.batches[i].clear();
    }

    /// Numbers, encodes and sends one event of `tracker` (never blocks),
    /// after the tracker's steps.
    pub(super) fn emit(&self, tracker: u64, event: &Outgoing<'_>) {
        let _gate = GateGuard::enter();
        self.pid_now();
        let Some(mut q) = self.lock() else {
            self.drop_counted(0);
            return;
        };
        self.emit_locked(&mut q, tracker, event);
    }

    fn emit_locked(&self, q: &mut Queue, tracker: u64, event: &Outgoing<'_>) {
        self.send_batch(q, tracker);
        if let Some((pid, seq)) = self.number(0) {
            encode(&mut q.buf, &self.head(pid, tracker, seq), event);
            self.deliver(q, 0);
        }
    }

    /// A step-level event of `tracker`: a step's end (folded into its
    /// batch) or a step's begin (sent at once when nothing is batched).
    pub(super) fn step(&self, tracker: u64, event: &Outgoing<'_>) {
        let _gate = GateGuard::enter();
        self.pid_now();
        let Some(mut q) = self.lock() else {
            self.drop_counted(u64::from(matches!(event, Outgoing::End { .. })));
            return;
        };
        let i = match q.batches.iter().position(|b| b.tracker == tracker) {
            Some(i) => i,
            None => {
                q.batches.push(Batch::new(tracker));
                q.batches.len() - 1
            }
        };
        match *event {
            Outgoing::Begin { name, depth, .. } => {
                if q.batches[i].count > 0 && q.batches[i].fits(name, depth) {
                    // The step after the last one batched: the receiver
                    // opens it at the batch's end.
                    q.batches[i].next = true;
                } else {
                    self.emit_locked(&mut q, tracker, event);
                }
            }
            Outgoing::End { record, next } => {
                let (name, index, depth) = match &record.phase {
                    Some(p) => (p.name.as_str(), p.index, p.depth),
                    None => (record.label.as_str(), 0, 0),
                };
                if !q.batches[i].fits(name, depth) {
                    self.send_batch(&mut q, tracker);
                }
                q.batches[i].add(record, name, index, depth, next);
                if q.batches[i].due() {
                    self.send_batch(&mut q, tracker);
                }
            }
            // Not made by a tracker: sent as it is.
            Outgoing::Steps { .. } => self.emit_locked(&mut q, tracker, event),
        }
    }

    /// A tracker is gone: its steps and what was kept go out now, waiting
    /// up to [`FLUSH_WAIT`] for room.
    pub(super) fn close(&self, tracker: u64) {
        self.flush_where(FLUSH_WAIT, |t| t == tracker);
        let _gate = GateGuard::enter();
        if let Some(mut q) = self.lock() {
            q.batches.retain(|b| b.tracker != tracker);
        }
    }
}

impl Drop for RunChannel {
    fn drop(&mut self) {
        self.flush(FLUSH_WAIT);
        // SAFETY: fd is the socket this value owns.
        unsafe { libc::close(self.fd) };
    }
}

fn current_pid() -> u32 {
    // SAFETY: getpid has no preconditions (and is not cached by glibc, so a
    // forked child sees its own).
    unsafe { libc::getpid() as u32 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::phase::PhaseInfo;
    use crate::phase::PhaseKind;
    use crate::record::Record;
    use crate::run_channel::protocol::tests::record;
    use crate::run_channel::{Hook, BATCH_NS, MAX_DATAGRAM};
    use std::os::unix::net::UnixDatagram;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn bound(tag: &str) -> (std::path::PathBuf, UnixDatagram) {
        let dir =
            std::env::temp_dir().join(format!("memprobe-run-channel-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        let sock = UnixDatagram::bind(&path).unwrap();
        (path, sock)
    }

    fn begin_event() -> Outgoing<'static> {
        Outgoing::Begin {
            kind: PhaseKind::Epoch,
            name: "epoch",
            index: 0,
            depth: 0,
            t_ns: 1,
        }
    }

    fn read_all(sock: &UnixDatagram) -> Vec<String> {
        sock.set_nonblocking(true).unwrap();
        let mut got = vec![0u8; MAX_DATAGRAM];
        let mut out = Vec::new();
        while let Ok(n) = sock.recv(&mut got) {
            out.push(String::from_utf8(got[..n].to_vec()).unwrap());
        }
        out
    }

    #[test]
    fn a_full_receiver_loses_no_boundary_they_are_kept_and_sent_in_order() {
        let (path, sock) = bound("count");
        let ch = RunChannel::connect(&path).unwrap();
        let ev = begin_event();
        // Never read: the queue fills, later messages are kept, no call blocks.
        for _ in 0..200 {
            ch.emit(1, &ev);
        }
        let (kept, _) = ch.pending();
        assert_eq!(ch.dropped(), 0);
        assert_eq!(ch.sent() + kept as u64, 200);
        assert!(kept > 0, "the queue never filled");
        // Read while flushing: everything arrives, in order.
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            while all.len() < 200 && Instant::now() < deadline {
                all.extend(read_all(&sock));
                std::thread::sleep(Duration::from_millis(1));
            }
            (all, sock)
        });
        assert!(ch.flush(Duration::from_secs(10)));
        let (all, sock) = reader.join().unwrap();
        assert_eq!(all.len(), 200);
        for (i, m) in all.iter().enumerate() {
            assert!(m.contains(&format!(r#""seq":{i},"dropped":0,"#)), "{m}");
        }
        // Over the bound with nothing to read: the excess (less what the
        // kernel queues) is dropped and counted, and the next message that
        // gets through carries the count.
        for _ in 0..MAX_PENDING + 100 {
            ch.emit(1, &ev);
        }
        let dropped = ch.dropped();
        assert!(dropped > 50 && dropped <= 100, "{dropped}");
        assert_eq!(ch.dropped_steps(), 0);
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                let got = read_all(&sock);
                if got.iter().any(|m| m.contains(r#""tracker":2,"#)) {
                    all.extend(got);
                    break;
                }
                all.extend(got);
                std::thread::sleep(Duration::from_millis(1));
            }
            all
        });
        assert!(ch.flush(Duration::from_secs(10)));
        ch.emit(2, &ev);
        assert!(ch.flush(Duration::from_secs(10)));
        let all = reader.join().unwrap();
        let last = all.last().unwrap();
        assert!(
            last.contains(&format!(r#""dropped":{dropped},"dropped_steps":0,"#)),
            "{last}"
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    fn step_record(index: u64, start: u64, end: u64, peak: u64) -> Record {
        let mut r = record(1, "rss");
        r.started_at_ns = start;
        r.ended_at_ns = end;
        r.sources[0].peak = peak;
        r.phase.as_mut().unwrap().index = index;
        r
    }

    #[test]
    fn steps_go_out_in_batches_before_their_epochs_end() {
        let (path, sock) = bound("batch");
        let ch = Arc::new(RunChannel::connect(&path).unwrap());
        let mut hook = Hook::new();
        hook.set(Some(Arc::clone(&ch)));
        hook.begin(PhaseKind::Epoch, "epoch", || 0, 0, 10);
        hook.begin(PhaseKind::Step, "step", || 0, 1, 10);
        // 1000 steps of 1 µs, the 700th peaking: one batch.
        for i in 0..1000u64 {
            let t = 10 + i * 1000;
            let peak = if i == 700 { 9000 } else { 400 };
            hook.end(&step_record(i, t, t + 1000, peak), true);
        }
        assert_eq!(ch.sent(), 2, "the steps wait for their batch");
        assert_eq!(ch.pending(), (0, 1000));
        let mut epoch = record(1, "rss");
        epoch.phase = Some(PhaseInfo {
            kind: PhaseKind::Epoch,
            name: "epoch".into(),
            index: 0,
            depth: 0,
        });
        hook.end(&epoch, false);
        let got = read_all(&sock);
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(got[1].contains(r#""ev":"begin","#) && got[1].contains(r#""kind":"step""#));
        let batch = &got[2];
        assert!(
            batch.contains(r#""ev":"steps","#)
                && batch.contains(r#""index":0,"depth":1,"last":999,"count":1000,"started_ns":10,"ended_ns":1000010,"next":true,"#),
            "{batch}"
        );
        assert!(
            batch.contains(r#""peak":9000,"delta_used":20,"delta_peaked":180,"index":700,"started_ns":700010,"ended_ns":701010}"#),
            "{batch}"
        );
        assert!(got[3].contains(r#""ev":"end","#) && got[3].contains(r#""kind":"epoch""#));
        // A step longer than a batch's span goes out alone, at its end.
        hook.end(&step_record(1000, 0, BATCH_NS, 1), false);
        let got = read_all(&sock);
        assert_eq!(got.len(), 1);
        assert!(got[0].contains(r#""count":1,"#), "{}", got[0]);
        // Dropping the tracker sends what it batched.
        hook.end(&step_record(1001, BATCH_NS, BATCH_NS + 5, 1), false);
        assert_eq!(read_all(&sock).len(), 0);
        drop(hook);
        assert_eq!(read_all(&sock).len(), 1);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_gone_receiver_costs_no_system_call_for_a_while() {
        let (path, sock) = bound("gone");
        let ch = RunChannel::connect(&path).unwrap();
        drop(sock);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
        let ev = begin_event();
        for _ in 0..1000 {
            ch.emit(1, &ev);
        }
        assert_eq!((ch.sent(), ch.dropped()), (0, 1000));
        // The first failure, and one try after each skip of GONE_SKIP.
        assert!(
            ch.skip_until.load(Ordering::Relaxed) > 1000 - GONE_SKIP - 2,
            "{:?}",
            ch
        );
    }

    #[test]
    fn a_receiver_bound_again_at_the_path_is_reached_again() {
        let (path, sock) = bound("again");
        let ch = RunChannel::connect(&path).unwrap();
        assert!(ch.connected.load(Ordering::Relaxed));
        let ev = begin_event();
        ch.emit(1, &ev);
        drop(sock);
        std::fs::remove_file(&path).unwrap();
        let again = UnixDatagram::bind(&path).unwrap();
        again.set_nonblocking(true).unwrap();
        // The first send finds the old receiver closed; the skipped ones
        // follow; then the address reaches the new one.
        for _ in 0..GONE_SKIP + 2 {
            ch.emit(1, &ev);
        }
        assert!(!ch.connected.load(Ordering::Relaxed));
        assert_eq!((ch.sent(), ch.dropped()), (2, GONE_SKIP + 1));
        let mut got = vec![0u8; 4096];
        let n = again.recv(&mut got).unwrap();
        let text = std::str::from_utf8(&got[..n]).unwrap();
        assert!(
            text.contains(&format!(r#""dropped":{},"#, GONE_SKIP + 1)),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// A host's fork while another thread is inside the channel (here
    /// holding its queue, as `pending()` does) waits for it: the child's
    /// next boundary and `pending()` do not deadlock on a queue held by a
    /// thread the child does not have.
    #[test]
    fn a_fork_while_the_queue_is_held_leaves_the_child_a_free_queue() {
        let (path, _sock) = bound("fork-held");
        let ch = Arc::new(RunChannel::connect(&path).unwrap());
        let held = ch.clone();
        crate::fork::fork_test::fork_while_held(
            move |inside, leaving| {
                let q = held.lock().expect("not re-entered");
                inside();
                leaving();
                drop(q);
                assert_eq!(held.pending(), (0, 0));
            },
            || {
                ch.emit(1, &begin_event());
                ch.pending() == (0, 0) && ch.sent() == 1
            },
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_forked_child_sends_with_its_own_pid_and_counts_from_zero() {
        let (path, sock) = bound("fork");
        let ch = RunChannel::connect(&path).unwrap();
        let ev = begin_event();
        ch.emit(1, &ev);
        ch.emit(1, &ev);
        // SAFETY: the child only sends and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            ch.emit(1, &ev);
            let ok = ch.sent() == 1 && ch.flush(Duration::from_secs(5));
            // SAFETY: ends the child without running the parent's handlers.
            unsafe { libc::_exit(i32::from(!ok)) };
        }
        let mut status = 0;
        // SAFETY: our child; a valid status pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert_eq!(status, 0);
        let got = read_all(&sock);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(
            got[2].contains(&format!(r#""pid":{pid},"tracker":1,"seq":0,"#)),
            "{}",
            got[2]
        );
        ch.emit(1, &ev);
        let mine = read_all(&sock);
        assert!(
            mine[0].contains(&format!(
                r#""pid":{},"tracker":1,"seq":2,"#,
                std::process::id()
            )),
            "{}",
            mine[0]
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn every_message_carries_the_process_ranks_and_a_forked_child_keeps_them() {
        let (path, sock) = bound("ranks");
        let ranks = crate::run_channel::Ranks {
            rank: 1,
            local_rank: Some(1),
            world_size: 2,
        };
        let ch = RunChannel::connect(&path).unwrap().with_ranks(Some(ranks));
        assert_eq!(ch.ranks(), Some(ranks));
        let mut hook = Hook::new();
        let ch = Arc::new(ch);
        hook.set(Some(Arc::clone(&ch)));
        hook.begin(PhaseKind::Epoch, "epoch", || 0, 0, 10);
        hook.begin(PhaseKind::Step, "step", || 0, 1, 10);
        hook.end(&step_record(0, 10, 20, 1), false);
        ch.flush(Duration::from_secs(5));
        // SAFETY: the child only sends and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            ch.emit(1, &begin_event());
            let ok = ch.flush(Duration::from_secs(5));
            // SAFETY: ends the child without running the parent's handlers.
            unsafe { libc::_exit(i32::from(!ok)) };
        }
        let mut status = 0;
        // SAFETY: our child; a valid status pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert_eq!(status, 0);
        let got = read_all(&sock);
        assert_eq!(got.len(), 4, "{got:?}");
        for m in &got {
            assert!(
                m.contains(r#","rank":1,"world_size":2,"local_rank":1,"kind":"#),
                "{m}"
            );
        }
        assert!(got[3].contains(&format!(r#""pid":{pid},"#)), "{}", got[3]);
        // Ranks no process could have are left out, not sent.
        let bad = crate::run_channel::Ranks {
            rank: 2,
            local_rank: None,
            world_size: 2,
        };
        let ch = RunChannel::connect(&path).unwrap().with_ranks(Some(bad));
        assert_eq!(ch.ranks(), None);
        ch.emit(1, &begin_event());
        let got = read_all(&sock);
        assert!(!got[0].contains("rank"), "{}", got[0]);
        drop(hook);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn unusable_paths_are_refused() {
        assert!(RunChannel::connect(Path::new("")).is_err());
        let long = "/tmp/".to_string() + &"x".repeat(200);
        let e = RunChannel::connect(Path::new(&long)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
}
