//! The simulator's certificates, minted in one place: the cluster's CA and serving
//! certificates (`sim`), its delegated-authentication trust material, the TLS + token + tenant
//! front ([`crate::securefront`]) and the soak's serving and front-proxy pairs. A [`Ca`] signs
//! leaves; what differs between them (SANs, usage, organizations, validity, an explicit
//! `CA:FALSE`) is a parameter or an edit of the parameters.
//!
//! Errors are returned, not panicked on: the simulator is a program (`percolator-sim demo`,
//! the soak). The tests' own certificates come from `test-support` (`mk_ca`, `mk_cert`),
//! which must stay below every crate whose tests use it, so it cannot use this module.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;

/// A PKI error.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// Key or certificate generation failed.
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// rustls refused the certificate or configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A CA: its certificate and what signs with it.
pub struct Ca {
    /// The certificate, PEM.
    pub pem: String,
    /// The certificate, DER.
    pub der: CertificateDer<'static>,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("pem", &self.pem).finish_non_exhaustive()
    }
}

/// A signed leaf with its own key.
#[derive(Debug, Clone)]
pub struct Leaf {
    /// The certificate, PEM.
    pub pem: String,
    /// The certificate, DER.
    pub der: CertificateDer<'static>,
    /// The key, PEM (PKCS#8).
    pub key_pem: String,
}

impl Ca {
    /// A CA with CN `common_name` and key usages keyCertSign, cRLSign and digitalSignature.
    pub fn new(common_name: &str) -> Result<Self, PkiError> {
        Self::with(common_name, |_| {})
    }

    /// [`Ca::new`], with `edit` setting the rest (a validity).
    pub fn with(common_name: &str, edit: impl FnOnce(&mut CertificateParams)) -> Result<Self, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        edit(&mut params);
        let cert = params.self_signed(&key)?;
        Ok(Self {
            pem: cert.pem(),
            der: cert.der().clone(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA's key, PEM (the simulator writes it beside the certificate, as a cluster's
    /// `front-proxy-ca.key` lies beside its certificate).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A certificate for `key` with CN `common_name`, SANs `sans` and the extended key usage
    /// `usage` (key usages digitalSignature and keyEncipherment, an authority key identifier);
    /// `edit` sets what else differs (organizations, validity, `CA:FALSE`).
    pub fn sign(
        &self,
        key: &KeyPair,
        common_name: &str,
        sans: Vec<String>,
        usage: ExtendedKeyUsagePurpose,
        edit: impl FnOnce(&mut CertificateParams),
    ) -> Result<rcgen::Certificate, PkiError> {
        let mut params = CertificateParams::new(sans)?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        edit(&mut params);
        Ok(params.signed_by(key, &self.issuer)?)
    }

    /// [`Ca::sign`] for a key of its own, generated here.
    pub fn leaf(
        &self,
        common_name: &str,
        sans: Vec<String>,
        usage: ExtendedKeyUsagePurpose,
        edit: impl FnOnce(&mut CertificateParams),
    ) -> Result<Leaf, PkiError> {
        let key = KeyPair::generate()?;
        let cert = self.sign(&key, common_name, sans, usage, edit)?;
        Ok(Leaf { pem: cert.pem(), der: cert.der().clone(), key_pem: key.serialize_pem() })
    }
}

/// A TLS client configuration trusting the CAs of `ca_pem` and presenting the chain of
/// `cert_pem` with the key `key_pem` (all PEM), as kube-aggregator reaches an extension API
/// server; the error says what was unusable.
pub fn client_config(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.map_err(|e| format!("CA: {e}"))?).map_err(|e| format!("CA: {e}"))?;
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("client certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("client key: {e}"))?;
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| e.to_string())
}

/// Marks a leaf `CA:FALSE` explicitly (a basic-constraints extension), as the cluster's
/// client certificates and the soak's pairs are: an edit for [`Ca::sign`] and [`Ca::leaf`].
pub fn not_a_ca(params: &mut CertificateParams) {
    params.is_ca = IsCa::ExplicitNoCa;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::pki_types::UnixTime;

    use super::*;

    /// Whether a client-certificate verifier trusting `ca` accepts `leaf`.
    fn mk_accepted(ca: &Ca, leaf: &Leaf) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
        verifier.verify_client_cert(&leaf.der, &[], UnixTime::now()).is_ok()
    }

    #[test]
    fn a_leaf_is_trusted_through_its_ca_only_and_for_its_usage() {
        let (ca, other) = (Ca::new("test-ca").unwrap(), Ca::new("other-ca").unwrap());
        let client = ca.leaf("client", Vec::new(), ExtendedKeyUsagePurpose::ClientAuth, not_a_ca).unwrap();
        assert!(mk_accepted(&ca, &client));
        assert!(!mk_accepted(&other, &client), "another CA's verifier accepted the leaf");
        let server = ca.leaf("server", vec!["127.0.0.1".into()], ExtendedKeyUsagePurpose::ServerAuth, |_| {});
        assert!(!mk_accepted(&ca, &server.unwrap()), "a serverAuth leaf passed as a client");
        let expired = ca
            .leaf("client", Vec::new(), ExtendedKeyUsagePurpose::ClientAuth, |params| {
                params.not_before = rcgen::date_time_ymd(2000, 1, 1);
                params.not_after = rcgen::date_time_ymd(2001, 1, 1);
            })
            .unwrap();
        assert!(!mk_accepted(&ca, &expired), "the edit's validity was not applied");
        assert!(client.key_pem.contains("PRIVATE KEY") && ca.key_pem().contains("PRIVATE KEY"));
    }
}
