//! Serving TLS: the rustls server configuration (TLS 1.2+, ALPN `h2` and `http/1.1`) from
//! `--tls-cert-file`/`--tls-private-key-file`, or a self-signed certificate generated once and
//! kept in `--cert-dir` (reused on restart, as the generic Kubernetes API server does).
//!
//! The pair is served by a [`ReloadingCert`]: the files are re-read every
//! `--tls-reload-interval`, and a changed, valid pair is served to new connections without a
//! restart (a Secret volume update replaces both files with one symlink swap; the content is
//! compared, not the inode). A pair that does not load (half-written, key not matching the
//! certificate) is logged and the previous one stays in force until the next check.
//!
//! Also the pieces every certificate verifier of the crate that accepts any chain shares
//! (`AnyServerCert`, `verify_handshake_signatures!`): such a verifier still checks the
//! handshake signature, proof that the peer holds the key of the certificate it presented.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::config::ServingArgs;

/// Errors building the serving TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file could not be read or written.
    #[error("{flag} {path}: {source}")]
    Io {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file holds no usable PEM item.
    #[error("{flag} {path}: {message}")]
    Pem {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Generating the self-signed certificate failed.
    #[error("generating a self-signed serving certificate: {0}")]
    Generate(String),
    /// rustls refused the certificate/key pair.
    #[error("serving certificate and key: {0}")]
    Rustls(String),
}

/// Result alias for this module.
pub type Result<T> = std::result::Result<T, TlsError>;

/// File names of the self-signed pair inside `--cert-dir`, as the generic API server names them.
const SELF_SIGNED_CERT: &str = "apiserver.crt";
const SELF_SIGNED_KEY: &str = "apiserver.key";

/// Builds the rustls server configuration for the flags, serving the certificate as loaded
/// now (see [`server_config_reloading`] to follow file changes).
pub fn server_config(
    args: &ServingArgs,
    client_verifier: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> Result<Arc<ServerConfig>> {
    server_config_reloading(args, client_verifier).map(|(config, _)| config)
}

/// Builds the rustls server configuration for the flags; the returned [`ReloadingCert`] serves
/// its certificate (call [`ReloadingCert::spawn_reloader`] to follow file changes).
pub fn server_config_reloading(
    args: &ServingArgs,
    client_verifier: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> Result<(Arc<ServerConfig>, Arc<ReloadingCert>)> {
    let (cert_path, key_path) = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => ensure_self_signed(&args.cert_dir)?,
    };
    let resolver = Arc::new(ReloadingCert::load(cert_path, key_path)?);
    let versions: &[&rustls::SupportedProtocolVersion] = if args.tls_min_version == "VersionTLS13" {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let builder = ServerConfig::builder_with_protocol_versions(versions);
    let builder = match client_verifier {
        // Client certificates are requested, not required; each request verifies the chain
        // against the current CAs (see crate::auth).
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((Arc::new(config), resolver))
}

/// The serving certificate and key, reloaded from their files when they change.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// The file contents last seen (loaded or rejected), so each change is handled once.
    last_seen: Mutex<(Vec<u8>, Vec<u8>)>,
}

impl ReloadingCert {
    /// Loads the pair; fails (naming the flag) when it is unusable.
    pub fn load(cert_path: PathBuf, key_path: PathBuf) -> Result<Self> {
        let cert_pem = read_file(&cert_path, "--tls-cert-file")?;
        let key_pem = read_file(&key_path, "--tls-private-key-file")?;
        let key = certified_key(&cert_path, &cert_pem, &key_path, &key_pem)?;
        Ok(Self {
            cert_path,
            key_path,
            current: RwLock::new(Arc::new(key)),
            last_seen: Mutex::new((cert_pem, key_pem)),
        })
    }

    /// The certificate chain served now.
    pub fn current_chain(&self) -> Vec<CertificateDer<'static>> {
        self.current().cert.clone()
    }

    fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Re-reads both files: `Ok(true)` when a new pair took effect, `Ok(false)` when nothing
    /// changed, `Err` when the changed files do not make a usable pair (the previous one stays).
    pub fn reload(&self) -> Result<bool> {
        let cert_pem = read_file(&self.cert_path, "--tls-cert-file")?;
        let key_pem = read_file(&self.key_path, "--tls-private-key-file")?;
        let Ok(mut last) = self.last_seen.lock() else { return Ok(false) };
        if last.0 == cert_pem && last.1 == key_pem {
            return Ok(false);
        }
        *last = (cert_pem.clone(), key_pem.clone());
        let key = certified_key(&self.cert_path, &cert_pem, &self.key_path, &key_pem)?;
        if let Ok(mut current) = self.current.write() {
            *current = Arc::new(key);
        }
        Ok(true)
    }

    /// Checks the files every `interval` for as long as the runtime runs.
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                match this.reload() {
                    Ok(false) => {}
                    Ok(true) => {
                        tracing::info!(cert = %this.cert_path.display(), "serving certificate reloaded")
                    }
                    Err(error) => tracing::error!(
                        %error,
                        "serving certificate not reloaded; the previous one is still served"
                    ),
                }
            }
        });
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn read_file(path: &Path, flag: &'static str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| TlsError::Io { flag, path: path.to_path_buf(), source })
}

/// Parses a PEM pair and checks that the key belongs to the certificate.
fn certified_key(cert_path: &Path, cert_pem: &[u8], key_path: &Path, key_pem: &[u8]) -> Result<CertifiedKey> {
    let certs = parse_certs(cert_pem, cert_path, "--tls-cert-file")?;
    let key = parse_key(key_pem, key_path, "--tls-private-key-file")?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(certs, key, &provider).map_err(|e| TlsError::Rustls(e.to_string()))
}

/// Reads a PEM certificate chain.
pub fn read_certs(path: &Path, flag: &'static str) -> Result<Vec<CertificateDer<'static>>> {
    parse_certs(&read_file(path, flag)?, path, flag)
}

fn parse_certs(pem: &[u8], path: &Path, flag: &'static str) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| TlsError::Pem { flag, path: path.to_path_buf(), message: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            flag,
            path: path.to_path_buf(),
            message: "no CERTIFICATE block found".into(),
        });
    }
    Ok(certs)
}

/// Reads a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub fn read_key(path: &Path, flag: &'static str) -> Result<PrivateKeyDer<'static>> {
    parse_key(&read_file(path, flag)?, path, flag)
}

fn parse_key(pem: &[u8], path: &Path, flag: &'static str) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::Pem {
        flag,
        path: path.to_path_buf(),
        message: format!("no usable PRIVATE KEY block: {e}"),
    })
}

/// Returns the self-signed pair in `dir`, generating it when absent.
fn ensure_self_signed(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let cert_path = dir.join(SELF_SIGNED_CERT);
    let key_path = dir.join(SELF_SIGNED_KEY);
    if cert_path.exists() && key_path.exists() {
        return Ok((cert_path, key_path));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TlsError::Io { flag: "--cert-dir", path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    if let Ok(host) = std::fs::read_to_string("/etc/hostname") {
        let host = host.trim();
        if !host.is_empty() && host != "localhost" {
            names.push(host.to_string());
        }
    }
    let generated =
        rcgen::generate_simple_self_signed(names).map_err(|e| TlsError::Generate(e.to_string()))?;
    std::fs::write(&cert_path, generated.cert.pem()).map_err(io(&cert_path))?;
    write_private(&key_path, generated.signing_key.serialize_pem().as_bytes()).map_err(io(&key_path))?;
    tracing::info!(cert = %cert_path.display(), "generated a self-signed serving certificate");
    Ok((cert_path, key_path))
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    file.write_all(bytes)
}

// ---------------------------------------------------------------------------------------------
// Verifiers that accept any chain
// ---------------------------------------------------------------------------------------------

/// Implements the handshake-signature methods of a rustls certificate verifier
/// (`verify_tls12_signature`, `verify_tls13_signature`, `supported_verify_schemes`: the same on
/// [`ServerCertVerifier`] and [`ClientCertVerifier`](rustls::server::danger::ClientCertVerifier))
/// with the [`WebPkiSupportedAlgorithms`] held in the named field of the verifier. Invoke it
/// inside the trait `impl`: `verify_handshake_signatures!(algorithms);`.
macro_rules! verify_handshake_signatures {
    ($algorithms:ident) => {
        $crate::tls::verify_handshake_signatures!(@delegate verify_tls12_signature, $algorithms);
        $crate::tls::verify_handshake_signatures!(@delegate verify_tls13_signature, $algorithms);

        fn supported_verify_schemes(&self) -> ::std::vec::Vec<::rustls::SignatureScheme> {
            self.$algorithms.supported_schemes()
        }
    };
    // One signature method, delegating to the `rustls::crypto` function of the same name.
    (@delegate $method:ident, $algorithms:ident) => {
        fn $method(
            &self,
            message: &[u8],
            cert: &::rustls::pki_types::CertificateDer<'_>,
            dss: &::rustls::DigitallySignedStruct,
        ) -> ::std::result::Result<::rustls::client::danger::HandshakeSignatureValid, ::rustls::Error> {
            ::rustls::crypto::$method(message, cert, dss, &self.$algorithms)
        }
    };
}
pub(crate) use verify_handshake_signatures;

/// A server certificate verifier that accepts any certificate, but still checks that the server
/// holds the key of the one it presented (`--kubelet-insecure-tls`, and clients of tests that
/// exercise only the server's side).
#[derive(Debug)]
pub(crate) struct AnyServerCert {
    algorithms: WebPkiSupportedAlgorithms,
}

impl AnyServerCert {
    /// Checks handshake signatures with the signature algorithms of `provider`.
    pub(crate) fn new(provider: &CryptoProvider) -> Self {
        Self { algorithms: provider.signature_verification_algorithms }
    }
}

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    verify_handshake_signatures!(algorithms);
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn self_signed_is_generated_once_and_reused() {
        crate::install_crypto_provider();
        let dir = std::env::temp_dir().join(format!("percolator-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let args = crate::config::Args::parse_from(["percolator", "--cert-dir", dir.to_str().unwrap()]);
        let config = server_config(&args.serving, None).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
        let first = std::fs::read(dir.join(SELF_SIGNED_CERT)).unwrap();
        server_config(&args.serving, None).unwrap();
        assert_eq!(std::fs::read(dir.join(SELF_SIGNED_CERT)).unwrap(), first);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn missing_file_names_the_flag() {
        let args = crate::config::Args::parse_from([
            "percolator",
            "--tls-cert-file",
            "/nonexistent/c.pem",
            "--tls-private-key-file",
            "/nonexistent/k.pem",
        ]);
        let err = server_config(&args.serving, None).unwrap_err().to_string();
        assert!(err.starts_with("--tls-cert-file /nonexistent/c.pem"), "{err}");
    }

    fn write_pair(dir: &Path, name: &str) -> (Vec<u8>, PathBuf, PathBuf) {
        let generated = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, generated.cert.pem()).unwrap();
        std::fs::write(&key, generated.signing_key.serialize_pem()).unwrap();
        (generated.cert.der().to_vec(), cert, key)
    }

    #[test]
    fn reload_follows_a_symlink_swap_and_keeps_the_last_good_pair() {
        crate::install_crypto_provider();
        let dir = std::env::temp_dir().join(format!("percolator-tls-reload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (first_der, first_cert, first_key) = write_pair(&dir, "first");
        let (second_der, second_cert, second_key) = write_pair(&dir, "second");
        // As a Secret volume: tls.crt -> ..data/tls.crt, ..data -> a timestamped directory.
        let version = |n: &str, cert: &Path, key: &Path| {
            let v = dir.join(n);
            std::fs::create_dir_all(&v).unwrap();
            std::fs::copy(cert, v.join("tls.crt")).unwrap();
            std::fs::copy(key, v.join("tls.key")).unwrap();
        };
        version("..v1", &first_cert, &first_key);
        version("..v2", &second_cert, &second_key);
        std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/tls.crt", dir.join("tls.crt")).unwrap();
        std::os::unix::fs::symlink("..data/tls.key", dir.join("tls.key")).unwrap();

        let certs = ReloadingCert::load(dir.join("tls.crt"), dir.join("tls.key")).unwrap();
        assert_eq!(certs.current_chain()[0].as_ref(), first_der.as_slice());
        assert!(!certs.reload().unwrap(), "unchanged files are not a reload");

        std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        assert!(certs.reload().unwrap());
        assert_eq!(certs.current_chain()[0].as_ref(), second_der.as_slice());

        // A key that does not match the certificate is refused; the last good pair stays.
        std::fs::copy(&first_key, dir.join("..v2/tls.key")).unwrap();
        let err = certs.reload().unwrap_err().to_string();
        assert!(err.contains("serving certificate and key"), "{err}");
        assert_eq!(certs.current_chain()[0].as_ref(), second_der.as_slice());
        assert!(!certs.reload().unwrap(), "a rejected pair is reported once");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
