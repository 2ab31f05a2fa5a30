//! An HTTPS client for the exporter's tests, on rustls' client side.
#![allow(dead_code, unreachable_pub)]

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A client configuration trusting `ca`, with a client certificate when given.
pub fn config(ca: &Path, client: Option<(&Path, &Path)>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let c = match client {
        Some((cert, key)) => {
            let certs = CertificateDer::pem_file_iter(cert)
                .unwrap()
                .map(Result::unwrap)
                .collect();
            b.with_client_auth_cert(certs, PrivateKeyDer::from_pem_file(key).unwrap())
                .unwrap()
        }
        None => b.with_no_client_auth(),
    };
    Arc::new(c)
}

/// `Authorization: Basic` for `user:password`.
pub fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    let b = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Authorization: Basic {b}\r\n")
}

/// Sends `request` over TLS; the answer's status and text, or why the
/// connection failed (a refused handshake).
pub fn send(
    addr: SocketAddr,
    config: &Arc<ClientConfig>,
    request: &[u8],
) -> Result<(u16, String), String> {
    let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    tcp.set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let conn = ClientConnection::new(
        Arc::clone(config),
        ServerName::try_from("localhost").unwrap(),
    )
    .map_err(|e| e.to_string())?;
    let mut s = StreamOwned::new(conn, tcp);
    s.write_all(request).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    match s.read_to_end(&mut bytes) {
        Ok(_) => {}
        // The server closes after the answer: an EOF without close_notify
        // after a whole answer still counts.
        Err(e) if !bytes.is_empty() && e.kind() == std::io::ErrorKind::UnexpectedEof => {}
        Err(e) => return Err(e.to_string()),
    }
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {text:?}"))?;
    Ok((status, text))
}

/// `GET path` with the extra header lines `headers`.
pub fn get(
    addr: SocketAddr,
    config: &Arc<ClientConfig>,
    path: &str,
    headers: &str,
) -> Result<(u16, String), String> {
    send(
        addr,
        config,
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n").as_bytes(),
    )
}
