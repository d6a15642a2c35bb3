//! The rustls client configuration for kubelet connections: verification against the
//! `--kubelet-certificate-authority` file as it is when a connection is made (the file is
//! watched, [`apiserver::WatchedRootsVerifier`]), else against the cluster CA of the
//! kubeconfig (fixed), or, with `--kubelet-insecure-tls`, of nothing but the handshake
//! signature (the verifier shared with the rest of the crate, [`apiserver::WatchedRootsVerifier`]). HTTPS without
//! any of them is refused.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::{Error, KubeletConfig, Result};
use apiserver::{AnyServerCert, CaBoundSessions, WatchedRootsVerifier};

/// Builds the rustls configuration for kubelet connections.
pub(super) fn tls_config(config: &KubeletConfig) -> Result<rustls::ClientConfig> {
    // main installs ring process-wide; fall back to it explicitly rather than panic.
    let provider = CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let mut tls = if config.insecure_tls {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServerCert::new(&provider)))
            .with_no_client_auth()
    } else if let Some(file) = &config.ca_file {
        let verifier = WatchedRootsVerifier::new(Arc::clone(file), &provider)
            .map_err(|e| Error::CertificateAuthority(e.to_string()))?;
        let mut tls =
            builder.dangerous().with_custom_certificate_verifier(Arc::new(verifier)).with_no_client_auth();
        // A resumed session is not verified again: forget them when the CA file changes.
        tls.resumption = rustls::client::Resumption::store(CaBoundSessions::new(Arc::clone(file)));
        tls
    } else {
        let mut roots = RootCertStore::empty();
        match config.ca_pem.as_deref() {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| Error::CertificateAuthority(e.to_string()))?;
                    roots.add(cert).map_err(|e| Error::CertificateAuthority(e.to_string()))?;
                }
                if roots.is_empty() {
                    return Err(Error::CertificateAuthority("no certificate in the PEM bundle".to_owned()));
                }
            }
            None => {
                return Err(Error::CertificateAuthority(
                    "none given: set --kubelet-certificate-authority or --kubelet-insecure-tls".to_owned(),
                ));
            }
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    // HTTP/1.1 only: an idle h2 connection holds more (hpack tables, 16 KiB frame buffers)
    // and one request per node at a time gains nothing from multiplexing.
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tls)
}
