//! Serving TLS: the rustls server configuration (TLS 1.2+, ALPN `h2` and `http/1.1`) from
//! `--tls-cert-file`/`--tls-private-key-file`, or a self-signed certificate generated once and
//! kept in `--cert-dir` (reused on restart, as the generic Kubernetes API server does).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

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

/// Builds the rustls server configuration for the flags.
pub fn server_config(
    args: &ServingArgs,
    client_verifier: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> Result<Arc<ServerConfig>> {
    let (cert_path, key_path) = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => ensure_self_signed(&args.cert_dir)?,
    };
    let certs = read_certs(&cert_path, "--tls-cert-file")?;
    let key = read_key(&key_path, "--tls-private-key-file")?;
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
    let mut config = builder.with_single_cert(certs, key).map_err(|e| TlsError::Rustls(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Reads a PEM certificate chain.
pub fn read_certs(path: &Path, flag: &'static str) -> Result<Vec<CertificateDer<'static>>> {
    let pem =
        std::fs::read(path).map_err(|source| TlsError::Io { flag, path: path.to_path_buf(), source })?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
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
    let pem =
        std::fs::read(path).map_err(|source| TlsError::Io { flag, path: path.to_path_buf(), source })?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
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
}
