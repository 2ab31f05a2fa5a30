//! `tls_server_config` as a rustls server configuration.
//!
//! rustls with *ring* as its crypto provider: it builds with the C compiler
//! the workspace already needs (aws-lc-rs would add cmake and a long
//! build). What the toolkit's Go TLS offers and rustls does not is refused
//! with a reason, never quietly weakened: TLS 1.0 and 1.1 (a `min_version`
//! below TLS12 serves TLS 1.2 and up, the stricter reading; a
//! `max_version` below it is an error), CBC and RSA-key-exchange suites,
//! the P-521 curve.

use crate::web_config::{ClientAuth, Pem, TlsSettings, TlsVersion};
use memprobe_core::{Error, ErrorKind, Result};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{ring as provider, CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use std::sync::Arc;

fn tls_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Parse, message)
}

fn pem_bytes(pem: &Pem, what: &str) -> Result<Vec<u8>> {
    match pem {
        Pem::Inline(text) => Ok(text.as_bytes().to_vec()),
        Pem::File(path) => std::fs::read(path)
            .map_err(|e| Error::io(format!("cannot read {what} {}", path.display()), &e)),
    }
}

fn where_from(pem: &Pem, what: &str) -> String {
    match pem {
        Pem::File(p) => format!("{what} {}", p.display()),
        Pem::Inline(_) => format!("the inline {what}"),
    }
}

fn certificates(pem: &Pem, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = pem_bytes(pem, what)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| tls_error(format!("{}: bad PEM: {e}", where_from(pem, what))))?;
    if certs.is_empty() {
        return Err(tls_error(format!(
            "{}: no CERTIFICATE in it",
            where_from(pem, what)
        )));
    }
    Ok(certs)
}

/// Go's name of a TLS 1.2 suite (crypto/tls `CipherSuiteName`), which is
/// rustls' name for the suites both have.
fn suite_name(s: &rustls::SupportedCipherSuite) -> &'static str {
    s.suite().as_str().unwrap_or("?")
}

/// The provider narrowed to the suites and curves asked for.
fn narrowed_provider(t: &TlsSettings) -> Result<CryptoProvider> {
    // Deprecated since rustls 0.23.48 because ring has no post-quantum key
    // exchange (X25519MLKEM768); aws-lc-rs has it, at the price of cmake
    // and a C build several times ring's. Metrics of memory use do not need
    // secrecy decades from now: ring, knowingly.
    #[allow(deprecated)]
    let mut p = provider::default_provider();
    if !t.cipher_suites.is_empty() {
        let all = provider::ALL_CIPHER_SUITES;
        let tls12 = || all.iter().filter(|s| s.tls13().is_none());
        let mut chosen: Vec<rustls::SupportedCipherSuite> = all
            .iter()
            .filter(|s| s.tls13().is_some())
            .copied()
            .collect();
        for name in &t.cipher_suites {
            // Go also accepts the suffix-less ChaCha20 names.
            let found = tls12()
                .find(|s| suite_name(s) == name || suite_name(s) == format!("{name}_SHA256"));
            match found {
                Some(s) => chosen.push(*s),
                None => {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!(
                            "tls_server_config.cipher_suites: {name:?} is not offered by memprobe \
                             (TLS 1.2 suites it has: {}; TLS 1.3 suites cannot be chosen, as in Go)",
                            tls12().map(suite_name).collect::<Vec<_>>().join(", ")
                        ),
                    ))
                }
            }
        }
        // TLS 1.3 suites first: rustls picks within the negotiated version.
        p.cipher_suites = chosen;
    }
    if !t.curve_preferences.is_empty() {
        let mut groups = Vec::new();
        for name in &t.curve_preferences {
            let g = match name.as_str() {
                "X25519" => provider::kx_group::X25519,
                "CurveP256" => provider::kx_group::SECP256R1,
                "CurveP384" => provider::kx_group::SECP384R1,
                _ => {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!(
                            "tls_server_config.curve_preferences: {name:?} is not offered by \
                             memprobe (X25519, CurveP256, CurveP384)"
                        ),
                    ))
                }
            };
            groups.push(g);
        }
        p.kx_groups = groups;
    }
    Ok(p)
}

/// Builds the server configuration, reading the certificate, key and
/// client CA it names.
pub(crate) fn server_config(t: &TlsSettings) -> Result<Arc<ServerConfig>> {
    let provider = Arc::new(narrowed_provider(t)?);
    let mut versions: Vec<&'static rustls::SupportedProtocolVersion> = Vec::new();
    if t.min_version <= TlsVersion::Tls12 && t.max_version >= TlsVersion::Tls12 {
        versions.push(&rustls::version::TLS12);
    }
    if t.max_version >= TlsVersion::Tls13 {
        versions.push(&rustls::version::TLS13);
    }
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&versions)
        .map_err(|e| {
            Error::new(
                ErrorKind::Unsupported,
                format!("tls_server_config: no cipher suite left for the versions asked: {e}"),
            )
        })?;
    let verifier: Arc<dyn ClientCertVerifier> = match t.client_auth {
        ClientAuth::None => Arc::new(rustls::server::NoClientAuth),
        ClientAuth::Request | ClientAuth::RequireAny => Arc::new(AnyClientCert {
            mandatory: t.client_auth.requires(),
            algorithms: provider.signature_verification_algorithms,
        }),
        ClientAuth::VerifyIfGiven | ClientAuth::RequireAndVerify => {
            let ca = t
                .client_ca
                .as_ref()
                .ok_or_else(|| tls_error("client_auth_type needs client_ca_file"))?;
            let mut roots = RootCertStore::empty();
            for c in certificates(ca, "client_ca_file")? {
                roots
                    .add(c)
                    .map_err(|e| tls_error(format!("{}: {e}", where_from(ca, "client_ca_file"))))?;
            }
            let b =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider));
            let b = if t.client_auth.requires() {
                b
            } else {
                b.allow_unauthenticated()
            };
            b.build()
                .map_err(|e| tls_error(format!("client_ca_file: {e}")))?
        }
    };
    let certs = certificates(&t.cert, "cert_file")?;
    let key_bytes = pem_bytes(&t.key, "key_file")?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
        tls_error(format!(
            "{}: no private key in it ({e})",
            where_from(&t.key, "key_file")
        ))
    })?;
    let mut config = builder
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| {
            tls_error(format!(
                "{} and {} do not make a key pair: {e}",
                where_from(&t.cert, "cert_file"),
                where_from(&t.key, "key_file")
            ))
        })?;
    config.ignore_client_order = t.prefer_server_cipher_suites;
    // HTTP/1.1 only: a client offering h2 as well settles on it.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// `RequestClientCert` / `RequireAnyClientCert`: a certificate is taken
/// without checking who issued it (the client still proves it holds the
/// key). The toolkit warns these are insecure; they exist for parity.
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AnyClientCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
