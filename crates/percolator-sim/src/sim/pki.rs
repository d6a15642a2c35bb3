//! The simulated cluster's PKI: a CA, the API server's serving certificate (for `127.0.0.1`
//! and `localhost`) and one kubelet serving certificate per node (its InternalIP and name),
//! made lazily on a node's first connection so 5,000 nodes start instantly. All kubelet
//! certificates share one key pair: only signing is per node.

use std::net::Ipv4Addr;
use std::sync::{Arc, OnceLock};

use rcgen::{ExtendedKeyUsagePurpose, KeyPair};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::pki::Ca;
pub use crate::pki::PkiError;

/// The CA and what it signs.
pub(crate) struct Pki {
    ca: Ca,
    kubelet_key: KeyPair,
    kubelet_configs: Vec<OnceLock<Arc<ServerConfig>>>,
}

fn server_config(
    cert: CertificateDer<'static>,
    ca: CertificateDer<'static>,
    key: &KeyPair,
) -> Result<Arc<ServerConfig>, PkiError> {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    // An explicit provider: works whether or not the process installed a default one.
    let mut config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert, ca], key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

impl Pki {
    /// A new CA for a cluster of `nodes` nodes.
    pub(crate) fn new(nodes: usize) -> Result<Self, PkiError> {
        Ok(Self {
            ca: Ca::new("percolator-sim-ca")?,
            kubelet_key: KeyPair::generate()?,
            kubelet_configs: (0..nodes).map(|_| OnceLock::new()).collect(),
        })
    }

    /// The CA certificate, PEM.
    pub(crate) fn ca_pem(&self) -> &str {
        &self.ca.pem
    }

    fn leaf(
        &self,
        common_name: &str,
        sans: Vec<String>,
        key: &KeyPair,
    ) -> Result<CertificateDer<'static>, PkiError> {
        let cert = self.ca.sign(key, common_name, sans, ExtendedKeyUsagePurpose::ServerAuth, |_| {})?;
        Ok(cert.der().clone())
    }

    /// The API server's TLS configuration (SANs `127.0.0.1`, `localhost`, `::1`,
    /// `kubernetes.default.svc`, and `address` when it is another).
    pub(crate) fn api_config(&self, address: Ipv4Addr) -> Result<Arc<ServerConfig>, PkiError> {
        let key = KeyPair::generate()?;
        let mut sans: Vec<String> =
            vec!["127.0.0.1".into(), "localhost".into(), "::1".into(), "kubernetes.default.svc".into()];
        if address != Ipv4Addr::LOCALHOST {
            sans.push(address.to_string());
        }
        let cert = self.leaf("kube-apiserver", sans, &key)?;
        server_config(cert, self.ca.der.clone(), &key)
    }

    /// The TLS configuration of node `index`'s kubelet, made on first use.
    pub(crate) fn kubelet_config(
        &self,
        index: u32,
        name: &str,
        ip: Ipv4Addr,
    ) -> Result<Arc<ServerConfig>, PkiError> {
        let Some(slot) = self.kubelet_configs.get(index as usize) else {
            return Err(PkiError::Rustls(rustls::Error::General(format!("no node {index}"))));
        };
        if let Some(config) = slot.get() {
            return Ok(Arc::clone(config));
        }
        let cert = self.leaf(name, vec![ip.to_string(), name.to_owned()], &self.kubelet_key)?;
        let config = server_config(cert, self.ca.der.clone(), &self.kubelet_key)?;
        // A concurrent first connection may have won the race; either config is valid.
        Ok(Arc::clone(slot.get_or_init(|| config)))
    }
}

/// The kubeconfig for `server` trusting `ca_pem`, authenticating with `token`.
pub(crate) fn kubeconfig(server: &str, ca_pem: &str, token: &str) -> String {
    let ca = super::text::base64_std(ca_pem.as_bytes());
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: percolator-sim
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: percolator-sim
  user:
    token: {token}
contexts:
- name: percolator-sim
  context:
    cluster: percolator-sim
    user: percolator-sim
    namespace: default
current-context: percolator-sim
preferences: {{}}
"
    )
}
