//! The TLS side of client authentication (docs/wire.md, "The TLS listener"): the listener requests, but does not
//! require, a client certificate, and accepts any presented chain at handshake time while still
//! checking the handshake signature (proof that the peer holds the certificate's key). The
//! chain itself is verified per request against the *current* CA bundles ([`super::trust`]),
//! so a rotated CA takes effect on the next request without rebuilding the TLS configuration.

use std::sync::Arc;

use rustls::DistinguishedName;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};

/// Requests a client certificate, defers chain verification to the request, verifies
/// handshake signatures with the ring provider's algorithms.
#[derive(Debug)]
struct RequestClientCert {
    algorithms: WebPkiSupportedAlgorithms,
}

/// The handshake-time client certificate verifier for the serving `rustls::ServerConfig`
/// (`ServerConfig::builder().with_client_cert_verifier(...)`).
pub(crate) fn client_cert_verifier() -> Arc<dyn ClientCertVerifier> {
    Arc::new(RequestClientCert {
        algorithms: rustls::crypto::ring::default_provider().signature_verification_algorithms,
    })
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: the bundles change at run time, and with an empty list clients send the
        // certificate they have (Go's crypto/tls does).
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    crate::tls::verify_handshake_signatures!(algorithms);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::PeerCertificates;
    use crate::tls::AnyServerCert;
    use rustls::SignatureScheme;
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use test_support::{mk_ca, mk_leaf};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn mk_server_config(versions: &[&'static rustls::SupportedProtocolVersion]) -> Arc<rustls::ServerConfig> {
        let ca = mk_ca("server-ca");
        let leaf = mk_leaf(&ca, "localhost", &[], rcgen::ExtendedKeyUsagePurpose::ServerAuth, false);
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf.key_der.clone()));
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .unwrap()
            .with_client_cert_verifier(client_cert_verifier())
            .with_single_cert(vec![leaf.der.clone()], key)
            .unwrap();
        Arc::new(config)
    }

    fn mk_client_config(
        versions: &[&'static rustls::SupportedProtocolVersion],
        identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    ) -> Arc<rustls::ClientConfig> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .unwrap()
            .dangerous()
            // Any server: only the client side of authentication is under test.
            .with_custom_certificate_verifier(Arc::new(AnyServerCert::new(&provider())));
        let config = match identity {
            // Through a resolver: `with_client_auth_cert` would refuse a key that does not
            // match the certificate, which one test needs.
            Some((chain, key)) => {
                let key = provider().key_provider.load_private_key(key).unwrap();
                let certified = Arc::new(rustls::sign::CertifiedKey::new(chain, key));
                builder.with_client_cert_resolver(Arc::new(Fixed(certified)))
            }
            None => builder.with_no_client_auth(),
        };
        Arc::new(config)
    }

    #[derive(Debug)]
    struct Fixed(Arc<rustls::sign::CertifiedKey>);

    impl rustls::client::ResolvesClientCert for Fixed {
        fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<rustls::sign::CertifiedKey>> {
            Some(self.0.clone())
        }
        fn has_certs(&self) -> bool {
            true
        }
    }

    /// Runs one handshake over a duplex pipe and returns what the server saw.
    async fn handshake(
        versions: &[&'static rustls::SupportedProtocolVersion],
        identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    ) -> Result<Option<PeerCertificates>, String> {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let acceptor = tokio_rustls::TlsAcceptor::from(mk_server_config(versions));
        let connector = tokio_rustls::TlsConnector::from(mk_client_config(versions, identity));
        let server = tokio::spawn(async move {
            let mut stream = acceptor.accept(server_io).await.map_err(|e| e.to_string())?;
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
            Ok::<_, String>(PeerCertificates::from_server_connection(stream.get_ref().1))
        });
        let client = async move {
            let name = ServerName::try_from("localhost").unwrap();
            let mut stream = connector.connect(name, client_io).await.map_err(|e| e.to_string())?;
            stream.write_all(b"x").await.map_err(|e| e.to_string())?;
            stream.flush().await.map_err(|e| e.to_string())?;
            Ok::<_, String>(stream)
        };
        let (client, server) = tokio::join!(client, server);
        let peer = server.map_err(|e| e.to_string())?;
        // Keep the client alive until the server has read.
        drop(client);
        peer
    }

    const TLS13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
    const TLS12: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];

    #[test]
    fn optional_and_hintless() {
        let verifier = client_cert_verifier();
        assert!(verifier.offer_client_auth());
        assert!(!verifier.client_auth_mandatory());
        assert!(verifier.root_hint_subjects().is_empty());
        assert!(!verifier.supported_verify_schemes().is_empty());
    }

    #[tokio::test]
    async fn no_client_certificate_is_accepted() {
        for versions in [TLS13, TLS12] {
            let peer = handshake(versions, None).await.unwrap();
            assert!(peer.is_none());
        }
    }

    #[tokio::test]
    async fn any_chain_is_accepted_and_exposed() {
        // A chain from a CA the server has never heard of, with an intermediate: accepted at
        // handshake time, verified later per request.
        let ca = mk_ca("unknown-ca");
        let leaf = mk_leaf(&ca, "alice", &["devs"], rcgen::ExtendedKeyUsagePurpose::ClientAuth, false);
        for versions in [TLS13, TLS12] {
            let chain = vec![leaf.der.clone(), ca.der.clone()];
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf.key_der.clone()));
            let peer = handshake(versions, Some((chain.clone(), key))).await.unwrap().unwrap();
            assert_eq!(peer.chain(), chain.as_slice());
        }
    }

    #[tokio::test]
    async fn a_certificate_without_its_key_is_refused() {
        // The client presents alice's certificate but signs with another key: the handshake
        // signature does not verify.
        let ca = mk_ca("ca");
        let alice = mk_leaf(&ca, "alice", &[], rcgen::ExtendedKeyUsagePurpose::ClientAuth, false);
        let mallory = mk_leaf(&ca, "mallory", &[], rcgen::ExtendedKeyUsagePurpose::ClientAuth, false);
        for versions in [TLS13, TLS12] {
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(mallory.key_der.clone()));
            let result = handshake(versions, Some((vec![alice.der.clone()], key))).await;
            let err = result.unwrap_err();
            assert!(err.contains("BadSignature"), "{versions:?}: {err}");
        }
    }
}
