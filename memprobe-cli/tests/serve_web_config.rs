//! `memprobe serve --web.config.file` scraped by the real Prometheus over
//! TLS with a client certificate and basic auth: `up` is 1 for the right
//! CA, certificate and password, 0 with a wrong password, without a client
//! certificate, and over plain HTTP; a changed file takes effect without a
//! restart; a broken one is refused on stderr and the last good one kept.
//! Also: the warning of a non-loopback address without a web config, and a
//! bad file failing the start. Certificates are made by the test (openssl).

#[path = "../../tests/src/required_tool.rs"]
#[allow(dead_code, unreachable_pub)]
mod required_tool;

#[path = "../../memprobe-metrics/tests/common/pki.rs"]
mod pki;

#[path = "../../memprobe-metrics/tests/common/local.rs"]
#[allow(dead_code, unreachable_pub)]
mod local;

use local::{free_port, http_get, Kill};
use pki::{replace_file, Pki};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `memprobe serve` with `args`; its stderr lines arrive on the receiver.
fn serve(args: &[&str]) -> (Kill, Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_memprobe"))
        .arg("serve")
        .args(args)
        .env("MEMPROBE_GPU_BACKEND", "none")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (Kill(child), rx)
}

/// The first stderr line containing `want`, within `secs`.
fn line_with(rx: &Receiver<String>, want: &str, secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(want) => return line,
            Ok(line) => seen.push(line),
            Err(_) => break,
        }
    }
    panic!("no stderr line with {want:?} within {secs} s; saw {seen:?}")
}

fn hash(password: &str) -> String {
    bcrypt::hash(password, 4).unwrap()
}

fn web_yml(password: &str) -> String {
    format!(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
         client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n\
         basic_auth_users:\n  prometheus: '{}'\n",
        hash(password)
    )
}

/// `up` of each job (Prometheus' API), with the time of its sample.
fn up(web: u16) -> Vec<(String, f64, String)> {
    let Some(text) = http_get(web, "/api/v1/query?query=up") else {
        return Vec::new();
    };
    // Small enough to read by hand: {"metric":{...,"job":"good"},"value":[ts,"1"]}.
    let mut out = Vec::new();
    for part in text.split("{\"metric\":").skip(1) {
        let job = part
            .split("\"job\":\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("")
            .to_owned();
        let value = part.split("\"value\":[").nth(1).unwrap_or("");
        let ts: f64 = value
            .split(',')
            .next()
            .unwrap_or("0")
            .parse()
            .unwrap_or(0.0);
        let v = value.split('"').nth(1).unwrap_or("").to_owned();
        out.push((job, ts, v));
    }
    out
}

/// Waits until `up` of every job in `want` was sampled after `after`
/// (Unix seconds) with the wanted value.
fn wait_up(web: u16, want: &[(&str, &str)], after: f64, dir: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let last = up(web);
        let ok = want.iter().all(|(job, v)| {
            last.iter()
                .any(|(j, ts, value)| j == job && *ts > after && value == v)
        });
        if ok {
            return;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
            let tail: String = log.lines().rev().take(20).collect::<Vec<_>>().join("\n");
            panic!("{what}: want {want:?}, last {last:?}\n--- prometheus log (last lines, newest first)\n{tail}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn prometheus_scrapes_serve_over_tls_with_client_certificates_and_passwords() {
    let test = "prometheus_scrapes_serve_over_tls";
    if !required_tool::require(test, &["prometheus"], "apt-get install prometheus") {
        return;
    }
    if !pki::openssl_installed() {
        required_tool::skip_or_fail(test, "openssl not installed (apt-get install openssl)");
        return;
    }
    let dir: PathBuf =
        std::env::temp_dir().join(format!("memprobe-serve-tls-{}", std::process::id()));
    let p = Pki::new(&dir);
    let file = dir.join("web.yml");
    std::fs::write(&file, web_yml("right")).unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (_serve, stderr) = serve(&[
        "--listen",
        &listen,
        "--web.config.file",
        file.to_str().unwrap(),
    ]);
    let announced = line_with(&stderr, "memprobe: serving", 10);
    assert_eq!(
        announced,
        format!("memprobe: serving https://{listen}/metrics")
    );

    let job = |name: &str, scheme: &str, tls: &str, auth: &str| {
        format!(
            "  - job_name: {name}\n    scheme: {scheme}\n{tls}{auth}    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        )
    };
    let tls_full = format!(
        "    tls_config:\n      ca_file: {}\n      cert_file: {}\n      key_file: {}\n      server_name: localhost\n",
        p.ca.display(),
        p.client_cert.display(),
        p.client_key.display()
    );
    let tls_no_cert = format!(
        "    tls_config:\n      ca_file: {}\n      server_name: localhost\n",
        p.ca.display()
    );
    let auth =
        |pw: &str| format!("    basic_auth:\n      username: prometheus\n      password: {pw}\n");
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{}{}{}{}",
        job("good", "https", &tls_full, &auth("right")),
        job("wrongpw", "https", &tls_full, &auth("other")),
        job("nocert", "https", &tls_no_cert, &auth("right")),
        job("plain", "http", "", &auth("right")),
    );
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let web = free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let _prom = Kill(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{web}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let t0 = now();
    wait_up(
        web,
        &[
            ("good", "1"),
            ("wrongpw", "0"),
            ("nocert", "0"),
            ("plain", "0"),
        ],
        t0,
        &dir,
        "the first scrapes",
    );
    // The good job's samples are memprobe's.
    let q = http_get(
        web,
        "/api/v1/query?query=memprobe_source_up%7Bjob%3D%22good%22%7D",
    )
    .unwrap();
    assert!(q.contains("\"kind\":\"system_ram\""), "{q}");

    // The password changes while serving: the other job's becomes right.
    replace_file(&file, &web_yml("other"));
    line_with(&stderr, "web config", 10);
    let t1 = now();
    wait_up(
        web,
        &[("good", "0"), ("wrongpw", "1")],
        t1,
        &dir,
        "after the change",
    );

    // A broken file is refused on stderr; the last good one stays.
    replace_file(
        &file,
        "tls_server_config:\n  cert_file: server.crt\n  key_fiel: server.key\n",
    );
    let refused = line_with(&stderr, "refused", 10);
    assert!(refused.contains("key_fiel"), "{refused}");
    let t2 = now();
    wait_up(
        web,
        &[
            ("good", "0"),
            ("wrongpw", "1"),
            ("nocert", "0"),
            ("plain", "0"),
        ],
        t2 + 1.0,
        &dir,
        "after the broken file",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_beyond_loopback_without_a_web_config_warns_once() {
    let (_serve, stderr) = serve(&["--listen", "0.0.0.0:0"]);
    let warning = line_with(&stderr, "warning", 10);
    assert!(warning.contains("without --web.config.file"), "{warning}");
    line_with(&stderr, "memprobe: serving http://", 10);
    // Loopback: no warning before the announcement.
    let (_serve, stderr) = serve(&["--listen", "127.0.0.1:0"]);
    let first = line_with(&stderr, "memprobe:", 10);
    assert!(first.starts_with("memprobe: serving http://"), "{first}");
}

#[test]
fn serve_refuses_to_start_on_a_bad_web_config() {
    let dir = std::env::temp_dir().join(format!("memprobe-serve-badweb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("web.yml");
    std::fs::write(&file, "basic_auth_users: {}\nbasic_auth_userz: {}\n").unwrap();
    for (f, want) in [
        (file.clone(), "basic_auth_userz"),
        (dir.join("absent.yml"), "absent.yml"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_memprobe"))
            .args(["serve", "--listen", "127.0.0.1:0", "--web.config.file"])
            .arg(&f)
            .env("MEMPROBE_GPU_BACKEND", "none")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want) && !err.contains("serving"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
