//! `basic_auth_users`: bcrypt-hashed passwords, checked without making a
//! scrape pay bcrypt each time and without letting bcrypt stall the server.
//!
//! - A credential that verified once is remembered as a tag: HMAC-SHA-256,
//!   under a key drawn at start, of the user, the stored hash and the
//!   password (so a changed hash or password never matches an old tag, and
//!   memory holds no password). A scrape with it compares one tag, in
//!   constant time: microseconds instead of bcrypt's ~70 ms at cost 10.
//! - A credential that failed is remembered the same way (a bounded set),
//!   so repeating a wrong password costs no bcrypt either.
//! - Anything else goes to one worker thread through a bounded queue: the
//!   server's poll loop never runs bcrypt. When the queue is full the
//!   request is answered 503 at once, so a flood of wrong passwords costs a
//!   bounded amount of CPU and never delays a scrape whose password is
//!   known good.
//! - An unknown user is checked against a configured user's hash and
//!   refused whatever the result, so timing does not tell which users
//!   exist (as the toolkit does).

use ring::hmac;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;
use std::time::Instant;
use subtle::ConstantTimeEq;

/// A credential's tag (see the module documentation).
pub(crate) type Tag = [u8; 32];

/// Verifications waiting for the worker at most.
pub(crate) const QUEUE: usize = 8;

/// Failed tags remembered at most (then forgotten all at once).
const BAD_CAPACITY: usize = 4096;

/// What a request's `Authorization` header earns.
pub(crate) enum Check {
    /// A remembered good credential.
    Allow,
    /// No credential, a malformed one, or a remembered bad one.
    Deny,
    /// Needs bcrypt: hand it to the worker.
    Verify(Job),
}

/// One bcrypt verification.
pub(crate) struct Job {
    pub(crate) tag: Tag,
    user: String,
    password: Vec<u8>,
    hash: String,
    /// False for an unknown user: verified against another user's hash
    /// for the time it takes, refused whatever the result.
    known: bool,
    /// The configuration it was asked under (set by the server).
    pub(crate) generation: u64,
}

/// The users of one configuration and what was learned about credentials.
pub(crate) struct BasicAuth {
    users: Vec<(String, String)>,
    key: hmac::Key,
    good: HashMap<String, Tag>,
    bad: HashSet<Tag>,
}

impl BasicAuth {
    /// `users`: names and bcrypt hashes (checked by the configuration
    /// parser), at least one.
    pub(crate) fn new(users: Vec<(String, String)>) -> Option<BasicAuth> {
        if users.is_empty() {
            return None;
        }
        let rng = ring::rand::SystemRandom::new();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng).ok()?;
        Some(BasicAuth {
            users,
            key,
            good: HashMap::new(),
            bad: HashSet::new(),
        })
    }

    fn tag(&self, user: &str, hash: &str, password: &[u8]) -> Tag {
        let mut ctx = hmac::Context::with_key(&self.key);
        // Length prefixes: no two (user, hash, password) share an input.
        for part in [user.as_bytes(), hash.as_bytes(), password] {
            ctx.update(&(part.len() as u64).to_le_bytes());
            ctx.update(part);
        }
        let mut tag = [0u8; 32];
        tag.copy_from_slice(ctx.sign().as_ref());
        tag
    }

    /// Checks the value of an `Authorization` header (`None`: absent).
    pub(crate) fn check(&self, authorization: Option<&str>) -> Check {
        let Some((user, password)) = authorization.and_then(decode) else {
            return Check::Deny;
        };
        let found = self.users.iter().find(|(u, _)| *u == user);
        let (known, hash) = match found {
            Some((_, h)) => (true, h.as_str()),
            // Any configured hash: the same cost as a real check.
            None => (false, self.users[0].1.as_str()),
        };
        // An unknown user's tag is taken over an empty hash, so it can never
        // equal a known user's.
        let tag = self.tag(&user, if known { hash } else { "" }, &password);
        if known {
            if let Some(good) = self.good.get(&user) {
                if bool::from(good.ct_eq(&tag)) {
                    return Check::Allow;
                }
            }
        }
        if self.bad.contains(&tag) {
            return Check::Deny;
        }
        Check::Verify(Job {
            tag,
            user,
            password,
            hash: hash.to_owned(),
            known,
            generation: 0,
        })
    }

    /// Remembers a worker's verdict on `user`'s credential `tag`.
    pub(crate) fn settle(&mut self, user: &str, tag: Tag, ok: bool) {
        if ok {
            self.good.insert(user.to_owned(), tag);
        } else {
            if self.bad.len() >= BAD_CAPACITY {
                self.bad.clear();
            }
            self.bad.insert(tag);
        }
    }
}

/// `Basic base64(user:password)` → (user, password).
fn decode(value: &str) -> Option<(String, Vec<u8>)> {
    use base64::Engine;
    let (scheme, rest) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let colon = raw.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(raw[..colon].to_vec()).ok()?;
    Some((user, raw[colon + 1..].to_vec()))
}

/// A worker's verdict.
pub(crate) struct Verdict {
    /// The connection that asked.
    pub(crate) seq: u64,
    pub(crate) user: String,
    pub(crate) tag: Tag,
    pub(crate) generation: u64,
    /// `None`: not verified, its deadline passed while it waited.
    pub(crate) ok: Option<bool>,
}

/// The bcrypt worker: one thread, a bounded queue in, verdicts out, a byte
/// on `wake` after each verdict so that the poll loop looks.
pub(crate) struct Worker {
    jobs: Option<SyncSender<(u64, Job, Instant)>>,
    verdicts: Receiver<Verdict>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    pub(crate) fn start(wake: UnixStream) -> std::io::Result<Worker> {
        let (jobs, queue) = mpsc::sync_channel::<(u64, Job, Instant)>(QUEUE);
        let (done, verdicts) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("memprobe-auth".into())
            .spawn(move || {
                let mut wake = wake;
                for (seq, job, deadline) in queue {
                    let ok = (Instant::now() < deadline).then(|| {
                        let matched = bcrypt::verify(&job.password, &job.hash).unwrap_or(false);
                        matched && job.known
                    });
                    let verdict = Verdict {
                        seq,
                        user: job.user,
                        tag: job.tag,
                        generation: job.generation,
                        ok,
                    };
                    if done.send(verdict).is_err() {
                        return;
                    }
                    // Non-blocking: a full socket already means "look".
                    let _ = wake.write(&[1]);
                }
            })?;
        Ok(Worker {
            jobs: Some(jobs),
            verdicts,
            thread: Some(thread),
        })
    }

    /// Queues `job` for connection `seq`; false when the queue is full.
    pub(crate) fn submit(&self, seq: u64, job: Job, deadline: Instant) -> bool {
        // Full or closed: either way the request is not checked now.
        self.jobs
            .as_ref()
            .is_some_and(|j| j.try_send((seq, job, deadline)).is_ok())
    }

    /// The verdicts ready now.
    pub(crate) fn verdicts(&self) -> impl Iterator<Item = Verdict> + '_ {
        self.verdicts.try_iter()
    }
}

impl Drop for Worker {
    /// Closes the queue and waits for the job in progress (one bcrypt).
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn header(user: &str, password: &str) -> String {
        let b = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Basic {b}")
    }

    fn auth() -> BasicAuth {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        BasicAuth::new(vec![("alice".into(), hash)]).unwrap()
    }

    fn job(c: Check) -> Job {
        match c {
            Check::Verify(j) => j,
            Check::Allow => panic!("allowed without bcrypt"),
            Check::Deny => panic!("denied without bcrypt"),
        }
    }

    #[test]
    fn a_verified_password_is_allowed_from_the_cache_and_a_failed_one_denied() {
        let mut a = auth();
        let good = header("alice", "s3cret");
        let j = job(a.check(Some(&good)));
        assert!(bcrypt::verify(&j.password, &j.hash).unwrap() && j.known);
        a.settle(&j.user, j.tag, true);
        assert!(matches!(a.check(Some(&good)), Check::Allow));

        let bad = header("alice", "guess");
        let j = job(a.check(Some(&bad)));
        assert!(!bcrypt::verify(&j.password, &j.hash).unwrap());
        a.settle(&j.user, j.tag, false);
        assert!(matches!(a.check(Some(&bad)), Check::Deny));
        // The good one is still good; another wrong one needs bcrypt.
        assert!(matches!(a.check(Some(&good)), Check::Allow));
        job(a.check(Some(&header("alice", "guess2"))));
    }

    #[test]
    fn an_unknown_user_is_verified_for_the_time_and_never_allowed() {
        let a = auth();
        let j = job(a.check(Some(&header("mallory", "s3cret"))));
        assert!(!j.known, "refused whatever bcrypt says");
        // Its tag is not alice's for the same password.
        let alice = job(a.check(Some(&header("alice", "s3cret"))));
        assert_ne!(j.tag, alice.tag);
    }

    #[test]
    fn malformed_headers_are_denied_without_bcrypt() {
        let a = auth();
        for h in [
            None,
            Some("Bearer abc"),
            Some("Basic !!!"),
            Some("Basic YWxpY2U="), // "alice", no colon
            Some(""),
        ] {
            assert!(matches!(a.check(h), Check::Deny), "{h:?}");
        }
        // The scheme is case-insensitive, and a password may hold ':'.
        let b = base64::engine::general_purpose::STANDARD.encode("alice:a:b");
        let j = job(a.check(Some(&format!("basic {b}"))));
        assert_eq!(j.password, b"a:b");
    }

    #[test]
    fn the_worker_verifies_skips_expired_jobs_and_wakes_the_loop() {
        let a = auth();
        let (wake, mut woken) = UnixStream::pair().unwrap();
        wake.set_nonblocking(true).unwrap();
        let w = Worker::start(wake).unwrap();
        let far = Instant::now() + std::time::Duration::from_secs(60);
        assert!(w.submit(1, job(a.check(Some(&header("alice", "s3cret")))), far));
        assert!(w.submit(2, job(a.check(Some(&header("alice", "nope")))), far));
        assert!(w.submit(
            3,
            job(a.check(Some(&header("alice", "s3cret")))),
            Instant::now()
        ));
        let mut got = Vec::new();
        while got.len() < 3 {
            let mut b = [0u8; 8];
            let _ = std::io::Read::read(&mut woken, &mut b);
            got.extend(w.verdicts().map(|v| (v.seq, v.ok)));
        }
        assert_eq!(got, vec![(1, Some(true)), (2, Some(false)), (3, None)]);
        drop(w);
    }
}
