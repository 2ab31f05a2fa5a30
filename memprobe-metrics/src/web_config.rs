//! The web configuration file: exporter-toolkit's format (the
//! `--web.config.file` of node_exporter, DCGM exporter and every exporter
//! built on Prometheus' toolkit), so one file serves all of a node's
//! exporters.
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt          # relative paths: from the file's directory
//!   key_file: server.key
//!   client_auth_type: RequireAndVerifyClientCert
//!   client_ca_file: ca.crt
//!   min_version: TLS12
//! basic_auth_users:
//!   prometheus: $2y$10$...          # bcrypt
//! ```
//!
//! Parsed strictly, as the toolkit does (`yaml.UnmarshalStrict`): an
//! unknown key, a value of the wrong type or a setting memprobe cannot honour
//! is an error naming it, never ignored. This module reads the YAML only;
//! the certificate files are read by [`crate::tls`].

use memprobe_core::{Error, ErrorKind, Result};
use std::path::{Path, PathBuf};
use yaml_rust2::{Yaml, YamlLoader};

/// A TLS protocol version as the toolkit names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TlsVersion {
    Tls10,
    Tls11,
    Tls12,
    Tls13,
}

impl TlsVersion {
    fn parse(s: &str, key: &str) -> Result<TlsVersion> {
        Ok(match s {
            "TLS10" => TlsVersion::Tls10,
            "TLS11" => TlsVersion::Tls11,
            "TLS12" => TlsVersion::Tls12,
            "TLS13" => TlsVersion::Tls13,
            _ => {
                return Err(parse_error(format!(
                    "{key}: unknown TLS version {s:?} (TLS10, TLS11, TLS12 or TLS13)"
                )))
            }
        })
    }
}

/// `client_auth_type`, Go's `tls.ClientAuthType` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientAuth {
    /// `NoClientCert` (the default).
    None,
    /// `RequestClientCert`: asked for, not required, not verified.
    Request,
    /// `RequireAnyClientCert` (or its old name `RequireClientCert`):
    /// required, not verified against a CA.
    RequireAny,
    /// `VerifyClientCertIfGiven`.
    VerifyIfGiven,
    /// `RequireAndVerifyClientCert`: the one that authenticates clients.
    RequireAndVerify,
}

impl ClientAuth {
    fn parse(s: &str) -> Result<ClientAuth> {
        Ok(match s {
            "" | "NoClientCert" => ClientAuth::None,
            "RequestClientCert" => ClientAuth::Request,
            "RequireAnyClientCert" | "RequireClientCert" => ClientAuth::RequireAny,
            "VerifyClientCertIfGiven" => ClientAuth::VerifyIfGiven,
            "RequireAndVerifyClientCert" => ClientAuth::RequireAndVerify,
            _ => {
                return Err(parse_error(format!(
                    "tls_server_config.client_auth_type: unknown value {s:?} (NoClientCert, \
                     RequestClientCert, RequireAnyClientCert, VerifyClientCertIfGiven or \
                     RequireAndVerifyClientCert)"
                )))
            }
        })
    }

    /// Whether a presented certificate is checked against `client_ca_file`.
    pub(crate) fn verifies(self) -> bool {
        matches!(
            self,
            ClientAuth::VerifyIfGiven | ClientAuth::RequireAndVerify
        )
    }

    /// Whether a client without a certificate is turned away.
    pub(crate) fn requires(self) -> bool {
        matches!(self, ClientAuth::RequireAny | ClientAuth::RequireAndVerify)
    }
}

/// PEM text from a file (read when the TLS configuration is built) or
/// given inline in the YAML (`cert`, `key`, `client_ca`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pem {
    File(PathBuf),
    Inline(String),
}

/// `tls_server_config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    pub(crate) cert: Pem,
    pub(crate) key: Pem,
    pub(crate) client_ca: Option<Pem>,
    pub(crate) client_auth: ClientAuth,
    pub(crate) min_version: TlsVersion,
    pub(crate) max_version: TlsVersion,
    /// Go names of TLS 1.2 suites, in the order given (empty: rustls' own).
    pub(crate) cipher_suites: Vec<String>,
    pub(crate) prefer_server_cipher_suites: bool,
    /// Go names (`X25519`, `CurveP256`, ...), in preference order.
    pub(crate) curve_preferences: Vec<String>,
}

/// The response headers `http_server_config.headers` may set (the
/// toolkit's list; any other is an error there too).
const HEADERS: [&str; 5] = [
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
];

/// A web configuration file, parsed and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebConfig {
    pub(crate) path: PathBuf,
    pub(crate) tls: Option<TlsSettings>,
    /// `basic_auth_users`: user name and bcrypt hash, in file order.
    pub(crate) users: Vec<(String, String)>,
    /// `http_server_config.headers` that are set (blank ones are unset).
    pub(crate) headers: Vec<(&'static str, String)>,
    /// Paths served without authentication (`auth_excluded_paths`).
    pub(crate) auth_excluded_paths: Vec<String>,
}

fn parse_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Parse, message)
}

/// A mapping's entries as (key, value), rejecting non-string keys.
fn entries<'a>(y: &'a Yaml, what: &str) -> Result<Vec<(&'a str, &'a Yaml)>> {
    match y {
        Yaml::Hash(h) => h
            .iter()
            .map(|(k, v)| match k {
                Yaml::String(k) => Ok((k.as_str(), v)),
                _ => Err(parse_error(format!("{what}: a key is not a string: {k:?}"))),
            })
            .collect(),
        // `key:` with nothing after it: the toolkit takes it as empty.
        Yaml::Null => Ok(Vec::new()),
        _ => Err(parse_error(format!("{what}: expected a mapping"))),
    }
}

fn string(y: &Yaml, what: &str) -> Result<String> {
    match y {
        Yaml::String(s) => Ok(s.clone()),
        Yaml::Null => Ok(String::new()),
        _ => Err(parse_error(format!("{what}: expected a string"))),
    }
}

fn boolean(y: &Yaml, what: &str) -> Result<bool> {
    match y {
        Yaml::Boolean(b) => Ok(*b),
        _ => Err(parse_error(format!("{what}: expected true or false"))),
    }
}

fn strings(y: &Yaml, what: &str) -> Result<Vec<String>> {
    match y {
        Yaml::Array(a) => a.iter().map(|v| string(v, what)).collect(),
        Yaml::Null => Ok(Vec::new()),
        _ => Err(parse_error(format!("{what}: expected a list of strings"))),
    }
}

fn unknown(section: &str, key: &str, known: &[&str]) -> Error {
    let at = if section.is_empty() {
        key.to_owned()
    } else {
        format!("{section}.{key}")
    };
    parse_error(format!(
        "unknown key {at:?} (known here: {})",
        known.join(", ")
    ))
}

impl WebConfig {
    /// Reads and checks the file at `path`: its YAML, every key and value,
    /// the bcrypt hashes. Relative file names in it are taken from the
    /// file's directory, as the toolkit does.
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`] when the file does not exist,
    /// [`ErrorKind::Io`] (or `PermissionDenied`) when it cannot be read; [`ErrorKind::Parse`]
    /// naming the key for bad YAML, an unknown key or a bad value;
    /// [`ErrorKind::Unsupported`] for a setting memprobe cannot honour
    /// (e.g. `max_version: TLS11`: rustls speaks TLS 1.2 and 1.3 only).
    pub fn load(path: &Path) -> Result<WebConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("cannot read {}", path.display()), &e))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        WebConfig::parse(&text, dir, path)
            .map_err(|e| Error::new(e.kind(), format!("{}: {}", path.display(), e.message())))
    }

    /// Parses `text`, resolving relative file names against `dir`.
    pub(crate) fn parse(text: &str, dir: &Path, path: &Path) -> Result<WebConfig> {
        let docs = YamlLoader::load_from_str(text)
            .map_err(|e| parse_error(format!("not valid YAML: {e}")))?;
        if docs.len() > 1 {
            return Err(parse_error("holds more than one YAML document"));
        }
        let mut config = WebConfig {
            path: path.to_owned(),
            tls: None,
            users: Vec::new(),
            headers: Vec::new(),
            auth_excluded_paths: Vec::new(),
        };
        let Some(root) = docs.first() else {
            // An empty file: plain HTTP, no users (the toolkit's reading too).
            return Ok(config);
        };
        const TOP: [&str; 4] = [
            "tls_server_config",
            "http_server_config",
            "basic_auth_users",
            "auth_excluded_paths",
        ];
        for (key, value) in entries(root, "the file")? {
            match key {
                "tls_server_config" => config.tls = tls_settings(value, dir)?,
                "http_server_config" => config.headers = http_settings(value)?,
                "basic_auth_users" => config.users = users(value)?,
                "auth_excluded_paths" => {
                    config.auth_excluded_paths = strings(value, "auth_excluded_paths")?
                }
                // Parsed by the toolkit, but a rate limiter memprobe does not
                // have: refusing it beats serving without the limit asked for.
                "rate_limit" => {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        "rate_limit is not supported by memprobe (its server already bounds \
                         connections and request sizes; see docs/metrics.md)",
                    ))
                }
                _ => return Err(unknown("", key, &TOP)),
            }
        }
        Ok(config)
    }

    /// The file this configuration was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it turns TLS on.
    pub fn has_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// How many `basic_auth_users` it has (0: no password asked).
    pub fn basic_auth_users(&self) -> usize {
        self.users.len()
    }

    /// The files it names (certificate, key, client CA), for change watching.
    pub(crate) fn files(&self) -> Vec<PathBuf> {
        let Some(t) = &self.tls else {
            return Vec::new();
        };
        [Some(&t.cert), Some(&t.key), t.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|p| match p {
                Pem::File(f) => Some(f.clone()),
                Pem::Inline(_) => None,
            })
            .collect()
    }
}

fn tls_settings(y: &Yaml, dir: &Path) -> Result<Option<TlsSettings>> {
    const KNOWN: [&str; 13] = [
        "cert_file",
        "key_file",
        "cert",
        "key",
        "client_ca_file",
        "client_ca",
        "client_auth_type",
        "client_allowed_sans",
        "min_version",
        "max_version",
        "cipher_suites",
        "prefer_server_cipher_suites",
        "curve_preferences",
    ];
    let s = "tls_server_config";
    let (mut cert_file, mut key_file, mut ca_file) = (String::new(), String::new(), String::new());
    let (mut cert, mut key, mut ca) = (String::new(), String::new(), String::new());
    let mut client_auth = String::new();
    let mut min_version = TlsVersion::Tls12;
    let mut max_version = TlsVersion::Tls13;
    let mut cipher_suites = Vec::new();
    let mut prefer_server_cipher_suites = true;
    let mut curve_preferences = Vec::new();
    for (key_name, v) in entries(y, s)? {
        let what = format!("{s}.{key_name}");
        match key_name {
            "cert_file" => cert_file = string(v, &what)?,
            "key_file" => key_file = string(v, &what)?,
            "client_ca_file" => ca_file = string(v, &what)?,
            "cert" => cert = string(v, &what)?,
            "key" => key = string(v, &what)?,
            "client_ca" => ca = string(v, &what)?,
            "client_auth_type" => client_auth = string(v, &what)?,
            "client_allowed_sans" => {
                if !strings(v, &what)?.is_empty() {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!(
                            "{what} is not supported by memprobe: use client_ca_file with a CA \
                             that signs only the clients allowed"
                        ),
                    ));
                }
            }
            "min_version" => min_version = TlsVersion::parse(&string(v, &what)?, &what)?,
            "max_version" => max_version = TlsVersion::parse(&string(v, &what)?, &what)?,
            "cipher_suites" => cipher_suites = strings(v, &what)?,
            "prefer_server_cipher_suites" => prefer_server_cipher_suites = boolean(v, &what)?,
            "curve_preferences" => curve_preferences = strings(v, &what)?,
            _ => return Err(unknown(s, key_name, &KNOWN)),
        }
    }
    let enabled = [
        &cert_file,
        &key_file,
        &ca_file,
        &cert,
        &key,
        &ca,
        &client_auth,
    ]
    .iter()
    .any(|v| !v.is_empty());
    if !enabled {
        return Ok(None);
    }
    let pem = |file: String, inline: String, name: &str| -> Result<Option<Pem>> {
        match (file.is_empty(), inline.is_empty()) {
            (false, false) => Err(parse_error(format!(
                "{s}: give {name}_file or {name}, not both"
            ))),
            (false, true) => Ok(Some(Pem::File(dir.join(file)))),
            (true, false) => Ok(Some(Pem::Inline(inline))),
            (true, true) => Ok(None),
        }
    };
    let cert = pem(cert_file, cert, "cert")?
        .ok_or_else(|| parse_error(format!("{s}: missing cert_file")))?;
    let key =
        pem(key_file, key, "key")?.ok_or_else(|| parse_error(format!("{s}: missing key_file")))?;
    let client_ca = pem(ca_file, ca, "client_ca")?;
    let client_auth = ClientAuth::parse(&client_auth)?;
    if client_ca.is_some() && client_auth == ClientAuth::None {
        return Err(parse_error(format!(
            "{s}: client_ca_file is set but client_auth_type is NoClientCert (set \
             client_auth_type: RequireAndVerifyClientCert to authenticate clients)"
        )));
    }
    if client_auth.verifies() && client_ca.is_none() {
        return Err(parse_error(format!(
            "{s}: client_auth_type needs client_ca_file to verify client certificates"
        )));
    }
    if max_version < TlsVersion::Tls12 {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("{s}.max_version: memprobe speaks TLS 1.2 and 1.3 only (rustls)"),
        ));
    }
    if min_version > max_version {
        return Err(parse_error(format!(
            "{s}: min_version is above max_version"
        )));
    }
    Ok(Some(TlsSettings {
        cert,
        key,
        client_ca,
        client_auth,
        min_version,
        max_version,
        cipher_suites,
        prefer_server_cipher_suites,
        curve_preferences,
    }))
}

fn http_settings(y: &Yaml) -> Result<Vec<(&'static str, String)>> {
    let s = "http_server_config";
    let mut headers = Vec::new();
    for (key, v) in entries(y, s)? {
        match key {
            // HTTP/2 is never offered (ALPN names http/1.1 only): a
            // scraper asking for it falls back, as the toolkit's clients do
            // with http2: false. Accepted so one file serves every exporter.
            "http2" => {
                boolean(v, "http_server_config.http2")?;
            }
            "headers" => {
                for (name, value) in entries(v, "http_server_config.headers")? {
                    let what = format!("http_server_config.headers.{name}");
                    let Some(known) = HEADERS.iter().find(|h| **h == name) else {
                        return Err(parse_error(format!(
                            "{what}: this header cannot be set (settable: {})",
                            HEADERS.join(", ")
                        )));
                    };
                    let value = string(value, &what)?;
                    check_header_value(known, &value, &what)?;
                    if !value.is_empty() {
                        headers.push((*known, value));
                    }
                }
            }
            _ => return Err(unknown(s, key, &["http2", "headers"])),
        }
    }
    Ok(headers)
}

/// The toolkit's checks on header values, plus no line breaks (they
/// would split the answer's head).
fn check_header_value(name: &str, value: &str, what: &str) -> Result<()> {
    if value.contains(['\r', '\n']) {
        return Err(parse_error(format!(
            "{what}: a header value cannot hold a line break"
        )));
    }
    let allowed: &[&str] = match name {
        "X-Frame-Options" => &["deny", "sameorigin"],
        "X-Content-Type-Options" => &["nosniff"],
        _ => return Ok(()),
    };
    if value.is_empty() || allowed.iter().any(|a| value.eq_ignore_ascii_case(a)) {
        Ok(())
    } else {
        Err(parse_error(format!(
            "{what}: {value:?} is not one of {}",
            allowed.join(", ")
        )))
    }
}

fn users(y: &Yaml) -> Result<Vec<(String, String)>> {
    let mut users = Vec::new();
    for (user, v) in entries(y, "basic_auth_users")? {
        let what = format!("basic_auth_users.{user}");
        let hash = string(v, &what)?;
        // Checked now, so that a typo fails the start, not every scrape.
        let parts: bcrypt::HashParts = hash.parse().map_err(|e| {
            parse_error(format!("{what}: not a bcrypt hash ({e}); make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`"))
        })?;
        if parts.get_cost() < 4 || parts.get_cost() > 31 {
            return Err(parse_error(format!("{what}: bcrypt cost out of range")));
        }
        if user.contains(':') {
            return Err(parse_error(format!(
                "{what}: a user name cannot contain ':' (basic auth splits on it)"
            )));
        }
        users.push((user.to_owned(), hash));
    }
    Ok(users)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<WebConfig> {
        WebConfig::parse(
            text,
            Path::new("/etc/memprobe"),
            Path::new("/etc/memprobe/web.yml"),
        )
    }

    const HASH: &str = "$2y$04$xy3lTQzqd4M8Hi.pUWoaTO8uRmPXp7Hl1RlFvCfQ9I/NVl5Z.DiHu";

    #[test]
    fn the_toolkit_sample_parses_with_paths_from_the_file_directory() {
        let c = parse(&format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: /abs/server.key\n  \
             client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n  \
             min_version: TLS13\n  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n  \
             prefer_server_cipher_suites: false\n  curve_preferences: [X25519]\n\
             http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n    \
             X-XSS-Protection: ''\n\
             basic_auth_users:\n  alice: {HASH}\n"
        ))
        .unwrap();
        let t = c.tls.as_ref().unwrap();
        assert_eq!(t.cert, Pem::File("/etc/memprobe/server.crt".into()));
        assert_eq!(t.key, Pem::File("/abs/server.key".into()));
        assert_eq!(t.client_ca, Some(Pem::File("/etc/memprobe/ca.crt".into())));
        assert_eq!(t.client_auth, ClientAuth::RequireAndVerify);
        assert_eq!(
            (t.min_version, t.max_version),
            (TlsVersion::Tls13, TlsVersion::Tls13)
        );
        assert!(!t.prefer_server_cipher_suites);
        assert_eq!(c.headers, vec![("X-Frame-Options", "deny".to_owned())]);
        assert_eq!(c.users, vec![("alice".to_owned(), HASH.to_owned())]);
        assert_eq!(c.files().len(), 3);
    }

    #[test]
    fn an_empty_file_or_section_is_plain_http_without_users() {
        for text in [
            "",
            "tls_server_config:\nbasic_auth_users:\n",
            "tls_server_config: {}\n",
        ] {
            let c = parse(text).unwrap();
            assert!(!c.has_tls() && c.basic_auth_users() == 0, "{text:?}");
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors_that_name_them() {
        let cases = [
            ("tls_server_config:\n  cert_flie: a\n", "tls_server_config.cert_flie"),
            ("basic_auth_user:\n  a: b\n", "basic_auth_user"),
            ("tls_server_config:\n  key_file: k\n", "missing cert_file"),
            ("tls_server_config:\n  cert_file: c\n", "missing key_file"),
            (
                "tls_server_config:\n  cert_file: c\n  key_file: k\n  client_ca_file: ca\n",
                "client_auth_type",
            ),
            (
                "tls_server_config:\n  cert_file: c\n  key_file: k\n  client_auth_type: RequireAndVerifyClientCert\n",
                "client_ca_file",
            ),
            (
                "tls_server_config:\n  cert_file: c\n  key_file: k\n  client_auth_type: Sometimes\n",
                "Sometimes",
            ),
            ("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS14\n", "TLS14"),
            (
                "tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS13\n  max_version: TLS12\n",
                "min_version is above",
            ),
            ("tls_server_config:\n  cert_file: c\n  key_file: k\n  max_version: TLS11\n", "1.2 and 1.3"),
            ("tls_server_config:\n  cert_file: c\n  cert: x\n  key_file: k\n", "not both"),
            ("basic_auth_users:\n  a: plaintext\n", "not a bcrypt hash"),
            ("basic_auth_users:\n  a: [1]\n", "expected a string"),
            ("http_server_config:\n  headers:\n    Server: x\n", "cannot be set"),
            ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n", "deny"),
            ("http_server_config:\n  http2: maybe\n", "true or false"),
            ("rate_limit:\n  interval: 1s\n", "rate_limit"),
            ("tls_server_config: [\n", "not valid YAML"),
            ("- a\n", "expected a mapping"),
            ("basic_auth_users:\n  a: x\n  a: y\n", "duplicated"),
        ];
        for (text, want) in cases {
            let e = parse(text).expect_err(text);
            assert!(e.message().contains(want), "{text:?}: {}", e.message());
        }
    }

    #[test]
    fn an_unreadable_file_is_an_io_error_naming_it() {
        let e = WebConfig::load(Path::new("/nonexistent/web.yml")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(
            e.message().contains("/nonexistent/web.yml"),
            "{}",
            e.message()
        );
    }
}
