//! The Prometheus exporter through the C ABI.

use crate::boundary::{entry_point, free_point, opt_text, out, FfiError, FfiResult};
use crate::handle::{lock, publish, release, Handle, Locked, Table};
use crate::source::{memprobe_source, source};
use crate::status::memprobe_status;
use crate::tracker::memprobe_tracker;
use memprobe_metrics::{Exporter, ExporterOptions, Rank};
use std::ffi::c_char;
use std::net::SocketAddr;

/// An HTTP endpoint serving `GET /metrics` in the Prometheus text format
/// (see docs/metrics.md): its sources' readings, the last ended phases of
/// the trackers it watches, and optionally the GPUs as DCGM gauges.
#[allow(non_camel_case_types)]
pub struct memprobe_exporter {
    _private: [u8; 0],
}

static EXPORTERS: Table<Exporter, Locked> = Table::new(0x45, "memprobe_exporter");

impl Handle for memprobe_exporter {
    type Object = Exporter;
    type Kind = Locked;
    fn table() -> &'static Table<Exporter, Locked> {
        &EXPORTERS
    }
}

/// `listen_addr` as an address; NULL: `None` (127.0.0.1, a free port).
fn listen_address(listen_addr: *const c_char) -> FfiResult<Option<SocketAddr>> {
    opt_text(listen_addr, "listen_addr")?
        .map(|a| {
            a.parse::<SocketAddr>().map_err(|_| {
                FfiError::new(
                    memprobe_status::InvalidArgument,
                    format!("listen_addr {a:?} is not IP:PORT (e.g. 127.0.0.1:9464)"),
                )
            })
        })
        .transpose()
}

/// Starts an exporter listening on `listen_addr` (`"IP:PORT"`, e.g.
/// `"0.0.0.0:9464"` to be scraped from other machines; NULL: `127.0.0.1`
/// on a free port, see memprobe_exporter_port). Rank labels come from
/// `RANK`, `LOCAL_RANK` and `WORLD_SIZE` when set. Scrapes are answered by
/// the exporter's own thread (one poll loop: idle or slow connections never
/// delay a scrape); a malformed address is INVALID_ARGUMENT, a
/// port in use IO ("cannot listen on ...: Address already in use").
#[no_mangle]
pub extern "C" fn memprobe_exporter_start(
    listen_addr: *const c_char,
    out: *mut *mut memprobe_exporter,
) -> memprobe_status {
    entry_point("memprobe_exporter_start", || {
        self::out(out, "out")?;
        let listen = listen_address(listen_addr)?;
        let e = Exporter::start(ExporterOptions {
            listen,
            ..ExporterOptions::default()
        })?;
        publish(e, out)
    })
}

/// Starts an exporter as memprobe_exporter_start does, served as the web
/// configuration file `web_config_file` says: the YAML of Prometheus
/// exporter-toolkit (node_exporter's `--web.config.file`): TLS
/// (`tls_server_config`: cert and key, client CA and `client_auth_type`,
/// min/max version, cipher suites) and passwords (`basic_auth_users`,
/// bcrypt). See docs/metrics.md. The file and the certificates it names
/// are re-read when they change; a bad new file keeps the last good one
/// (memprobe_exporter_get_web_config_error says why; nothing is printed).
/// A file that cannot be read, an unknown key or a bad value fails the
/// start (PARSE, UNAVAILABLE, IO, UNSUPPORTED, with the key or file named
/// by memprobe_last_error): never a fallback to plain HTTP.
/// `web_config_file` NULL is NULL_POINTER (memprobe_exporter_start serves
/// plain HTTP).
#[no_mangle]
pub extern "C" fn memprobe_exporter_start_with_web_config(
    listen_addr: *const c_char,
    web_config_file: *const c_char,
    out: *mut *mut memprobe_exporter,
) -> memprobe_status {
    entry_point("memprobe_exporter_start_with_web_config", || {
        self::out(out, "out")?;
        let listen = listen_address(listen_addr)?;
        let file = crate::boundary::text(web_config_file, "web_config_file")?;
        let e = Exporter::start(ExporterOptions {
            listen,
            web_config: Some(file.into()),
            ..ExporterOptions::default()
        })?;
        publish(e, out)
    })
}

/// Why the last re-read of the exporter's web configuration was refused
/// (the last good configuration is still served): its status to `*error`
/// and its message copied into `buf[..len]` with a NUL (`*needed`, when
/// not NULL, gets the size needed; a short buffer is BUFFER_TOO_SMALL).
/// `*error` is OK and the message empty when the last read was good or the
/// exporter has no web configuration.
#[no_mangle]
pub extern "C" fn memprobe_exporter_get_web_config_error(
    exporter: *const memprobe_exporter,
    error: *mut memprobe_status,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> memprobe_status {
    entry_point("memprobe_exporter_get_web_config_error", || {
        let slot = out(error, "error")?;
        let last = lock(exporter)?.web_config_error();
        let (status, message) = match &last {
            None => (memprobe_status::Ok, ""),
            Some(e) => (memprobe_status::from_kind(e.kind()), e.message()),
        };
        *slot = status;
        crate::boundary::copy_out(message, buf, len, needed)
    })
}

/// The port the exporter listens on, to `*port` (also after it stopped).
#[no_mangle]
pub extern "C" fn memprobe_exporter_port(
    exporter: *const memprobe_exporter,
    port: *mut u16,
) -> memprobe_status {
    entry_point("memprobe_exporter_port", || {
        let slot = out(port, "port")?;
        *slot = lock(exporter)?.port();
        Ok(())
    })
}

/// Exports `source`'s readings (`memprobe_source_used_bytes`, ...), read at
/// each scrape; the exporter keeps its own reference, so the source handle
/// may be freed afterwards. Adding a source twice exports it once.
#[no_mangle]
pub extern "C" fn memprobe_exporter_add_source(
    exporter: *mut memprobe_exporter,
    source: *const memprobe_source,
) -> memprobe_status {
    entry_point("memprobe_exporter_add_source", || {
        let s = self::source(source)?;
        Ok(lock(exporter)?.add_source(&s)?)
    })
}

/// Exports `tracker`'s sources and, from then on, the records of its ended
/// steps, epochs, experiences and streams (`memprobe_phase_*`), its cache
/// releases and leak flags. The tracker only stores each record into a
/// snapshot (no I/O, no waiting on a scrape). Either may be freed first.
#[no_mangle]
pub extern "C" fn memprobe_exporter_watch_tracker(
    exporter: *mut memprobe_exporter,
    tracker: *mut memprobe_tracker,
) -> memprobe_status {
    entry_point("memprobe_exporter_watch_tracker", || {
        let e = lock(exporter)?;
        let t = crate::handle::get(tracker)?;
        let mut t = t.lock()?;
        Ok(e.watch(&mut t)?)
    })
}

/// Sets the rank labels (`rank`, `local_rank`, `world_size`); a negative
/// value leaves that label out. Replaces what the environment gave.
#[no_mangle]
pub extern "C" fn memprobe_exporter_set_rank(
    exporter: *mut memprobe_exporter,
    rank: i64,
    local_rank: i64,
    world_size: i64,
) -> memprobe_status {
    entry_point("memprobe_exporter_set_rank", || {
        let v = |x: i64, what: &str| -> FfiResult<Option<u32>> {
            if x < 0 {
                return Ok(None);
            }
            u32::try_from(x).map(Some).map_err(|_| {
                FfiError::new(
                    memprobe_status::InvalidArgument,
                    format!("{what} {x} is out of range"),
                )
            })
        };
        let r = Rank {
            rank: v(rank, "rank")?,
            local_rank: v(local_rank, "local_rank")?,
            world_size: v(world_size, "world_size")?,
        };
        Ok(lock(exporter)?.set_rank(r)?)
    })
}

/// Exports the GPUs this process sees (the process-wide GPU instance, see
/// memprobe_gpu_configure) as `DCGM_FI_DEV_FB_USED` / `_FREE` / `_TOTAL`
/// (MiB), and with `with_processes` non-zero each process's memory on them
/// (`memprobe_gpu_process_used_bytes`). Without a GPU the families are
/// simply absent.
#[no_mangle]
pub extern "C" fn memprobe_exporter_add_gpus(
    exporter: *mut memprobe_exporter,
    with_processes: i32,
) -> memprobe_status {
    entry_point("memprobe_exporter_add_gpus", || {
        let gpus = memprobe_gpu::Gpus::shared();
        Ok(lock(exporter)?.set_gpus(Some(gpus), with_processes != 0)?)
    })
}

/// Stops serving and frees the port; requests in progress finish (each is
/// bounded to a few seconds). WRONG_ORDER when already stopped. The handle
/// stays valid until memprobe_exporter_free.
#[no_mangle]
pub extern "C" fn memprobe_exporter_stop(exporter: *mut memprobe_exporter) -> memprobe_status {
    entry_point("memprobe_exporter_stop", || Ok(lock(exporter)?.stop()?))
}

/// Stops the exporter if it is running and releases it. NULL is a no-op.
#[no_mangle]
pub extern "C" fn memprobe_exporter_free(exporter: *mut memprobe_exporter) -> memprobe_status {
    free_point("memprobe_exporter_free", || {
        if let Some(mut e) = release(exporter)? {
            if e.is_running() {
                e.stop()?;
            }
        }
        Ok(())
    })
}
