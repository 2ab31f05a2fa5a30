//! The web configuration in force, and re-reading it when its files change.
//!
//! The server's loop looks at the file and the certificate, key and client
//! CA it names once a second (their inode, size and modification time:
//! a few `stat` calls). When any changed, the whole configuration is read
//! and built again; a good one replaces the old for new connections (a
//! renewed certificate, a new password, TLS turned on), a bad one is
//! refused and the last good one stays, and the hook hears which. Watching
//! by `stat` rather than inotify: it needs no descriptor or thread of its
//! own, and it sees a Kubernetes secret's symlink swap, which inotify on
//! the file does not.

use crate::basic_auth::BasicAuth;
use crate::web_config::WebConfig;
use memprobe_core::internal::lock::Lock;
use memprobe_core::{Error, Result};
use rustls::ServerConfig;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the files are looked at.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// What became of a changed web configuration file.
#[derive(Debug, Clone)]
pub enum WebConfigEvent {
    /// The new file was read and is in force for new connections.
    Reloaded {
        /// The configuration file.
        path: PathBuf,
    },
    /// The new file (or a file it names) is bad: the last good
    /// configuration stays in force.
    Refused {
        /// The configuration file.
        path: PathBuf,
        /// Why, as the start would have said it.
        error: Error,
    },
}

/// Called from the exporter's thread after each re-read of the web
/// configuration. Keep it short: scrapes wait while it runs.
#[derive(Clone)]
pub struct WebConfigHook(pub Arc<dyn Fn(&WebConfigEvent) + Send + Sync>);

impl std::fmt::Debug for WebConfigHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebConfigHook")
    }
}

/// A configuration ready to serve with.
pub(crate) struct Web {
    pub(crate) tls: Option<Arc<ServerConfig>>,
    pub(crate) auth: Option<BasicAuth>,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) excluded_paths: Vec<String>,
    /// Changes at each reload: a verdict from before it is not remembered.
    pub(crate) generation: u64,
}

impl Web {
    fn build(config: &WebConfig, generation: u64) -> Result<Web> {
        let tls = config
            .tls
            .as_ref()
            .map(crate::tls::server_config)
            .transpose()
            .map_err(|e| {
                Error::new(
                    e.kind(),
                    format!("{}: {}", config.path.display(), e.message()),
                )
            })?;
        Ok(Web {
            tls,
            auth: BasicAuth::new(config.users.clone()),
            headers: config.headers.clone(),
            excluded_paths: config.auth_excluded_paths.clone(),
            generation,
        })
    }
}

/// A file's identity and version as `stat` shows it; `None`: unreadable.
type Stamp = Option<(u64, u64, u64, i64, i64)>;

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// The file being watched and what the exporter shows of its state.
pub(crate) struct Watched {
    path: PathBuf,
    /// The files last read (the configuration first) and their stamps.
    stamps: Vec<(PathBuf, Stamp)>,
    pub(crate) next_check: Instant,
    hook: Option<WebConfigHook>,
    /// The last refusal, until a good file is read: what
    /// `Exporter::web_config_error` returns.
    pub(crate) error: Arc<Lock<Option<Error>>>,
    generation: u64,
}

/// Reads the configuration at `path` for the start: any error is the
/// start's error, never a fallback to plain HTTP.
pub(crate) fn load(path: &Path, hook: Option<WebConfigHook>) -> Result<(Web, Watched)> {
    // Stamped before reading: a change made while it is read is seen next time.
    let before = stamp(path);
    let config = WebConfig::load(path)?;
    let web = Web::build(&config, 0)?;
    let mut stamps = vec![(path.to_owned(), before)];
    stamps.extend(config.files().into_iter().map(|f| {
        let s = stamp(&f);
        (f, s)
    }));
    let watched = Watched {
        path: path.to_owned(),
        stamps,
        next_check: Instant::now() + CHECK_EVERY,
        hook,
        error: Arc::new(Lock::new(None)),
        generation: 0,
    };
    Ok((web, watched))
}

impl Watched {
    /// When due, looks at the files; a new configuration when they changed
    /// and it is good (a bad one is reported and `None` returned).
    pub(crate) fn poll(&mut self, now: Instant) -> Option<Web> {
        if now < self.next_check {
            return None;
        }
        self.next_check = now + CHECK_EVERY;
        if self.stamps.iter().all(|(p, s)| stamp(p) == *s) {
            return None;
        }
        let before = stamp(&self.path);
        let built = WebConfig::load(&self.path).and_then(|config| {
            let web = Web::build(&config, self.generation + 1)?;
            Ok((config, web))
        });
        match built {
            Ok((config, web)) => {
                self.generation += 1;
                self.stamps = vec![(self.path.clone(), before)];
                self.stamps.extend(config.files().into_iter().map(|f| {
                    let s = stamp(&f);
                    (f, s)
                }));
                if let Ok(mut e) = self.error.lock() {
                    *e = None;
                }
                self.report(&WebConfigEvent::Reloaded {
                    path: self.path.clone(),
                });
                Some(web)
            }
            Err(error) => {
                // Remember the stamps seen, so the refusal is said once per
                // change, not once a second.
                for (p, s) in &mut self.stamps {
                    *s = stamp(p);
                }
                if let Ok(mut e) = self.error.lock() {
                    *e = Some(error.clone());
                }
                self.report(&WebConfigEvent::Refused {
                    path: self.path.clone(),
                    error,
                });
                None
            }
        }
    }

    fn report(&self, event: &WebConfigEvent) {
        if let Some(h) = &self.hook {
            // A panicking hook must not take the server down.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (h.0)(event)));
        }
    }
}
