//! Certificates made for a test with the openssl command: a CA, a server
//! certificate for `localhost` / 127.0.0.1 signed by it, a client
//! certificate signed by it, and a client certificate from another CA.
//! Shared by memprobe-metrics' and memprobe-cli's tests.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether the openssl command runs (it has no `--version`, which
/// `required_tool::installed` tries).
pub fn openssl_installed() -> bool {
    Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The files, in `dir`.
pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub stranger_cert: PathBuf,
    pub stranger_key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A P-256 key and a certificate for `cn` signed by `ca` (self-signed when
/// `None`), with `ext` as its extensions.
fn issue(dir: &Path, name: &str, cn: &str, ca: Option<&str>, ext: &str) {
    let key = format!("{name}.key");
    let crt = format!("{name}.crt");
    let csr = format!("{name}.csr");
    let extfile = format!("{name}.ext");
    std::fs::write(dir.join(&extfile), ext).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    let mut x509 = vec![
        "x509", "-req", "-in", &csr, "-out", &crt, "-days", "2", "-sha256", "-extfile", &extfile,
    ];
    let (ca_crt, ca_key);
    match ca {
        Some(ca) => {
            ca_crt = format!("{ca}.crt");
            ca_key = format!("{ca}.key");
            x509.extend(["-CA", &ca_crt, "-CAkey", &ca_key, "-CAcreateserial"]);
        }
        None => x509.extend(["-signkey", &key]),
    }
    openssl(dir, &x509);
}

impl Pki {
    /// Makes every file in a fresh `dir`.
    pub fn new(dir: &Path) -> Pki {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        let ca_ext = "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n";
        issue(dir, "ca", "memprobe test CA", None, ca_ext);
        issue(dir, "other-ca", "another CA", None, ca_ext);
        issue(
            dir,
            "server",
            "localhost",
            Some("ca"),
            "basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        let client_ext = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\nsubjectAltName=DNS:prometheus\n";
        issue(dir, "client", "prometheus", Some("ca"), client_ext);
        issue(dir, "stranger", "prometheus", Some("other-ca"), client_ext);
        Pki {
            dir: dir.to_owned(),
            ca: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
            stranger_cert: dir.join("stranger.crt"),
            stranger_key: dir.join("stranger.key"),
        }
    }
}

/// Writes `text` to `path` whole at once (a temporary file renamed over
/// it), as configuration tools do, so a reader never sees half of it.
pub fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
