//! The exporter behind a web configuration (exporter-toolkit's format):
//! TLS, client certificates, basic auth, protocol versions, re-reading the
//! file while serving, errors at start, and the bounds under a flood of
//! wrong passwords and slow clients. Certificates are made by the test
//! (openssl); the protocol checks use the openssl and curl commands.

mod common;

#[path = "common/pki.rs"]
mod pki;
#[path = "common/tls_client.rs"]
mod tls_client;

use memprobe_core::{ErrorKind, Source};
use memprobe_metrics::{Exporter, ExporterOptions, WebConfigEvent, WebConfigHook};
use pki::{replace_file, Pki};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tls_client::{basic, config, get};

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("memprobe-web-{name}-{}", std::process::id()))
}

/// The certificates, or `None` (skip) without openssl.
fn pki(name: &str) -> Option<Pki> {
    if !pki::openssl_installed() {
        common::required_tool::skip_or_fail(
            name,
            "openssl not installed (apt-get install openssl)",
        );
        return None;
    }
    Some(Pki::new(&scratch(name)))
}

/// A bcrypt hash at the lowest cost (4): the tests check behaviour, not cost.
fn hash(password: &str) -> String {
    bcrypt::hash(password, 4).unwrap()
}

fn tls_section(p: &Pki, extra: &str) -> String {
    format!(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: {}\n{extra}",
        p.server_key.display()
    )
}

type Events = Arc<Mutex<Vec<WebConfigEvent>>>;

fn start(file: &Path) -> (Exporter, Events) {
    let events: Events = Arc::default();
    let e2 = Arc::clone(&events);
    let e = Exporter::start(ExporterOptions {
        web_config: Some(file.to_owned()),
        on_web_config: Some(WebConfigHook(Arc::new(move |ev: &WebConfigEvent| {
            e2.lock().unwrap().push(ev.clone())
        }))),
        hostname: Some("node1".into()),
        ..ExporterOptions::default()
    })
    .unwrap();
    e.add_source(&Source::system_ram().unwrap()).unwrap();
    (e, events)
}

fn plain_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

#[test]
fn tls_with_basic_auth_serves_only_the_right_password() {
    let Some(p) = pki("tls_with_basic_auth") else {
        return;
    };
    let file = p.dir.join("web.yml");
    std::fs::write(
        &file,
        format!(
            "{}http_server_config:\n  http2: true\n  headers:\n    X-Content-Type-Options: nosniff\n\
             basic_auth_users:\n  prometheus: '{}'\n  other: '{}'\nauth_excluded_paths: ['/']\n",
            tls_section(&p, ""),
            hash("right"),
            hash("else")
        ),
    )
    .unwrap();
    let (e, _) = start(&file);
    assert_eq!(e.scheme(), "https");
    let addr = e.local_addr();
    let c = config(&p.ca, None);

    let (status, text) = get(addr, &c, "/metrics", &basic("prometheus", "right")).unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains("memprobe_source_used_bytes{source=\"system\""),
        "{text}"
    );
    assert!(
        text.contains("\r\nX-Content-Type-Options: nosniff\r\n"),
        "{text}"
    );
    // Cached now: the same again, and again without bcrypt.
    for _ in 0..3 {
        assert_eq!(
            get(addr, &c, "/metrics", &basic("prometheus", "right"))
                .unwrap()
                .0,
            200
        );
    }
    for (header, why) in [
        (basic("prometheus", "wrong"), "a wrong password"),
        (basic("prometheus", "else"), "another user's password"),
        (basic("nobody", "right"), "an unknown user"),
        (String::new(), "no password"),
        ("Authorization: Bearer x\r\n".to_owned(), "another scheme"),
    ] {
        let (status, text) = get(addr, &c, "/metrics", &header).unwrap();
        assert_eq!(status, 401, "{why}: {text}");
        assert!(
            text.contains("\r\nWWW-Authenticate: Basic\r\n"),
            "{why}: {text}"
        );
        assert!(!text.contains("memprobe_source"), "{why}: {text}");
    }
    // The index page is excluded from authentication.
    assert_eq!(get(addr, &c, "/", "").unwrap().0, 200);
    // Plain HTTP on the TLS port is told so, and gets no metrics.
    let text = plain_get(addr, "/metrics");
    assert!(text.starts_with("HTTP/1.1 400 "), "{text}");
    assert!(text.contains("HTTPS server"), "{text}");
    // A client that does not trust the CA refuses the server.
    let stranger = config(&p.dir.join("other-ca.crt"), None);
    assert!(get(addr, &stranger, "/metrics", &basic("prometheus", "right")).is_err());
}

#[test]
fn a_required_client_certificate_is_verified() {
    let Some(p) = pki("client_cert") else { return };
    let file = p.dir.join("web.yml");
    std::fs::write(
        &file,
        tls_section(
            &p,
            "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n",
        ),
    )
    .unwrap();
    let (e, _) = start(&file);
    let addr = e.local_addr();
    let with = config(&p.ca, Some((&p.client_cert, &p.client_key)));
    assert_eq!(get(addr, &with, "/metrics", "").unwrap().0, 200);
    let without = config(&p.ca, None);
    let err = get(addr, &without, "/metrics", "").unwrap_err();
    assert!(!err.is_empty());
    let stranger = config(&p.ca, Some((&p.stranger_cert, &p.stranger_key)));
    assert!(get(addr, &stranger, "/metrics", "").is_err());
    // The same file, made optional: no certificate passes, a bad one not.
    replace_file(
        &file,
        &tls_section(
            &p,
            "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.crt\n",
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(addr, &without, "/metrics", "").is_err() {
        assert!(Instant::now() < deadline, "the new file was not taken");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(get(addr, &stranger, "/metrics", "").is_err());
}

/// Whether `openssl s_client` with `args` completes a handshake.
fn s_client(addr: SocketAddr, p: &Pki, args: &[&str]) -> bool {
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-CAfile"])
        .arg(&p.ca)
        .args(["-verify_return_error", "-servername", "localhost"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Nothing to send: the handshake's outcome is all.
    drop(child.stdin.take());
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    o.status.success()
        && out.contains("Verify return code: 0 (ok)")
        && !out.contains("Cipher is (NONE)")
}

#[test]
fn protocol_versions_and_cipher_suites_are_those_configured() {
    let Some(p) = pki("versions") else { return };
    let file = p.dir.join("web.yml");
    std::fs::write(&file, tls_section(&p, "  min_version: TLS13\n")).unwrap();
    let (e, events) = start(&file);
    let addr = e.local_addr();
    assert!(s_client(addr, &p, &["-tls1_3"]));
    assert!(
        !s_client(addr, &p, &["-tls1_2"]),
        "TLS 1.2 below min_version"
    );
    let wait_reload = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while events.lock().unwrap().len() < n {
            assert!(Instant::now() < deadline, "no re-read");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(matches!(
            events.lock().unwrap()[n - 1],
            WebConfigEvent::Reloaded { .. }
        ));
    };
    replace_file(
        &file,
        &tls_section(
            &p,
            "  max_version: TLS12\n  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]\n",
        ),
    );
    wait_reload(1);
    assert!(
        !s_client(addr, &p, &["-tls1_3"]),
        "TLS 1.3 above max_version"
    );
    assert!(s_client(addr, &p, &["-tls1_2"]));
    assert!(s_client(
        addr,
        &p,
        &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"]
    ));
    assert!(
        !s_client(
            addr,
            &p,
            &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"]
        ),
        "a suite left out of cipher_suites"
    );
    // curl agrees, where it is installed.
    if common::required_tool::require(
        "protocol_versions (curl)",
        &["curl"],
        "apt-get install curl",
    ) {
        let curl = |args: &[&str]| {
            Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
                .arg(&p.ca)
                .args(args)
                .arg(format!("https://localhost:{}/metrics", addr.port()))
                .output()
                .unwrap()
        };
        let ok = curl(&["--tlsv1.2", "--tls-max", "1.2"]);
        assert_eq!(String::from_utf8_lossy(&ok.stdout), "200");
        let refused = curl(&["--tlsv1.3"]);
        assert!(
            !refused.status.success(),
            "curl --tlsv1.3 against max_version TLS12"
        );
    }
}

#[test]
fn a_changed_file_takes_effect_and_a_broken_one_keeps_the_last_good() {
    let Some(p) = pki("reload") else { return };
    let file = p.dir.join("web.yml");
    let users = |pw: &str| format!("basic_auth_users:\n  prometheus: '{}'\n", hash(pw));
    std::fs::write(&file, format!("{}{}", tls_section(&p, ""), users("first"))).unwrap();
    let (e, events) = start(&file);
    let addr = e.local_addr();
    let c = config(&p.ca, None);
    let status = |pw: &str| {
        get(addr, &c, "/metrics", &basic("prometheus", pw))
            .unwrap()
            .0
    };
    assert_eq!((status("first"), status("second")), (200, 401));

    let wait = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(ev) = events.lock().unwrap().get(n - 1) {
                return ev.clone();
            }
            assert!(Instant::now() < deadline, "no re-read within 10 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    replace_file(
        &file,
        &format!("{}{}", tls_section(&p, ""), users("second")),
    );
    assert!(matches!(wait(1), WebConfigEvent::Reloaded { .. }));
    assert_eq!((status("first"), status("second")), (401, 200));
    assert!(e.web_config_error().is_none());

    // A typo: refused, said once, and the last good file stays in force.
    replace_file(
        &file,
        &format!(
            "{}{}",
            tls_section(&p, "  client_auth_typo: x\n"),
            users("third")
        ),
    );
    let WebConfigEvent::Refused { error, .. } = wait(2) else {
        panic!("a broken file was taken")
    };
    assert!(
        error.message().contains("client_auth_typo"),
        "{}",
        error.message()
    );
    assert_eq!((status("second"), status("third")), (200, 401));
    assert_eq!(
        e.web_config_error().map(|e| e.kind()),
        Some(ErrorKind::Parse)
    );
    let gauge = "memprobe_web_config_last_reload_successful{hostname=\"node1\"} ";
    assert!(
        e.render().contains(&format!("{gauge}0\n")),
        "{}",
        e.render()
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        events.lock().unwrap().len(),
        2,
        "the refusal is said once per change"
    );

    // A certificate that cannot be read is refused the same way.
    replace_file(
        &file,
        &format!(
            "tls_server_config:\n  cert_file: missing.crt\n  key_file: server.key\n{}",
            users("third")
        ),
    );
    assert!(matches!(wait(3), WebConfigEvent::Refused { .. }));
    assert_eq!(status("second"), 200);

    // Fixed: taken, and the error clears. Dropping TLS is taken too.
    replace_file(&file, &users("fourth"));
    assert!(matches!(wait(4), WebConfigEvent::Reloaded { .. }));
    assert!(e.web_config_error().is_none());
    assert!(e.render().contains(&format!("{gauge}1\n")));
    assert_eq!(e.scheme(), "http");
    let text = plain_get(addr, "/metrics");
    assert!(text.starts_with("HTTP/1.1 401 "), "{text}");
}

#[test]
fn a_bad_file_fails_the_start_and_never_serves_plain_http() {
    let Some(p) = pki("start_errors") else { return };
    let cases: Vec<(String, &str)> = vec![
        (tls_section(&p, "  bogus: 1\n"), "tls_server_config.bogus"),
        (
            "tls_server_config:\n  cert_file: nope.crt\n  key_file: server.key\n".into(),
            "nope.crt",
        ),
        (
            "tls_server_config:\n  cert_file: client.crt\n  key_file: server.key\n".into(),
            "key pair",
        ),
        (
            "tls_server_config:\n  cert_file: server.key\n  key_file: server.key\n".into(),
            "CERTIFICATE",
        ),
        ("basic_auth_users:\n  a: 'password'\n".into(), "bcrypt"),
        (
            tls_section(&p, "  cipher_suites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n"),
            "TLS_RSA_WITH_AES_128_CBC_SHA",
        ),
        (
            tls_section(&p, "  curve_preferences: [CurveP521]\n"),
            "CurveP521",
        ),
    ];
    for (text, want) in cases {
        let file = p.dir.join("bad.yml");
        std::fs::write(&file, &text).unwrap();
        let err = Exporter::start(ExporterOptions {
            web_config: Some(file.clone()),
            ..ExporterOptions::default()
        })
        .expect_err(&text);
        assert!(err.message().contains(want), "{text}: {}", err.message());
    }
    let err = Exporter::start(ExporterOptions {
        web_config: Some(p.dir.join("absent.yml")),
        ..ExporterOptions::default()
    })
    .unwrap_err();
    assert!(err.message().contains("absent.yml"), "{}", err.message());
}
