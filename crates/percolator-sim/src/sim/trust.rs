//! Delegated-authentication trust material (docs/wire.md, "Trust material"): the cluster's client CA, the
//! front-proxy (request-header) CA and client certificate, user client certificates, broken
//! certificates for negative tests, and the `kube-system/extension-apiserver-authentication`
//! ConfigMap built from them.
//!
//! Files written into the state directory (keys are PEM PKCS#8, mode 0600):
//!
//! | file | what |
//! |---|---|
//! | `client-ca.crt` / `.key` | client CA (kube-apiserver `--client-ca-file`) |
//! | `front-proxy-ca.crt` / `.key` | request-header CA (`--requestheader-client-ca-file`) |
//! | `front-proxy-client.crt` / `.key` | CN `front-proxy-client`: what the aggregator presents |
//! | `users/alice.crt` / `.key` | client CA, CN `alice`, O `devs` |
//! | `users/carol.crt` / `.key` | client CA, CN `carol`, O `viewers` |
//! | `users/admin.crt` / `.key` | client CA, CN `admin`, O `system:masters` |
//! | `bad/other-ca-client.crt` / `.key` | CN `front-proxy-client`, signed by an unrelated CA |
//! | `bad/wrong-cn-front-proxy.crt` / `.key` | front-proxy CA, CN `not-the-aggregator` |
//! | `bad/expired-front-proxy.crt` / `.key` | front-proxy CA, CN `front-proxy-client`, expired |
//! | `bad/server-eku-front-proxy.crt` / `.key` | front-proxy CA, CN `front-proxy-client`, EKU serverAuth only |
//!
//! Every CA has key usages keyCertSign, cRLSign and digitalSignature; every client
//! certificate digitalSignature and keyEncipherment with EKU clientAuth (except the
//! serverAuth-only one). [`Trust::rotate`] replaces the front-proxy CA and re-signs the
//! front-proxy client certificate and the three `bad/*-front-proxy` certificates with it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::StatusCode;

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose};

use crate::pki::{Ca, Leaf, not_a_ca};

use super::cluster::Cluster;
use super::{Error, Result, write_file};

/// Namespace of the trust ConfigMap.
pub(crate) const CONFIG_MAP_NAMESPACE: &str = "kube-system";
/// Name of the trust ConfigMap.
pub(crate) const CONFIG_MAP_NAME: &str = "extension-apiserver-authentication";
/// The CN the front-proxy client certificate has and the ConfigMap allows.
pub(crate) const FRONT_PROXY_CN: &str = "front-proxy-client";

/// The user client certificates: `(name, organizations)`.
pub(crate) const USERS: &[(&str, &[&str])] =
    &[("alice", &["devs"]), ("carol", &["viewers"]), ("admin", &["system:masters"])];

/// Validity of generated CAs.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Validity of generated leaf certificates.
const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// How far back generated certificates' notBefore lies (tolerates clock skew).
const BACKDATE: Duration = Duration::from_secs(3600);

/// How long a generated certificate is valid.
#[derive(Clone, Copy)]
enum Validity {
    /// From an hour ago for this long.
    Valid(Duration),
    /// From two days ago to yesterday.
    Expired,
}

fn set_validity(params: &mut CertificateParams, validity: Validity) {
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    match validity {
        Validity::Valid(length) => {
            params.not_before = epoch + now.saturating_sub(BACKDATE);
            params.not_after = epoch + now + length;
        }
        Validity::Expired => {
            params.not_before = epoch + now.saturating_sub(Duration::from_secs(2 * 24 * 3600));
            params.not_after = epoch + now.saturating_sub(Duration::from_secs(24 * 3600));
        }
    }
}

fn new_ca(common_name: &str) -> Result<Ca> {
    Ok(Ca::with(common_name, |params| set_validity(params, Validity::Valid(CA_VALIDITY)))?)
}

fn new_leaf(
    ca: &Ca,
    common_name: &str,
    organizations: &[&str],
    eku: ExtendedKeyUsagePurpose,
    validity: Validity,
) -> Result<Leaf> {
    Ok(ca.leaf(common_name, Vec::new(), eku, |params| {
        for o in organizations {
            params.distinguished_name.push(DnType::OrganizationName, *o);
        }
        not_a_ca(params);
        set_validity(params, validity);
    })?)
}

fn write_pair(dir: &Path, stem: &str, cert_pem: &str, key_pem: &str) -> Result<()> {
    // Key first: a reader that sees the new certificate also finds its key.
    write_file(&dir.join(format!("{stem}.key")), key_pem.as_bytes(), true)?;
    write_file(&dir.join(format!("{stem}.crt")), cert_pem.as_bytes(), false)
}

/// The front-proxy side, replaced on rotation.
struct FrontProxy {
    ca: Ca,
    generation: u32,
}

impl FrontProxy {
    /// A new front-proxy CA (generation `generation`) and everything it signs, written.
    fn create(dir: &Path, generation: u32) -> Result<Self> {
        let ca = new_ca(&format!("front-proxy-ca-{generation}"))?;
        let client = new_leaf(&ca, FRONT_PROXY_CN, &[], ExtendedKeyUsagePurpose::ClientAuth, leaf())?;
        let wrong_cn = new_leaf(&ca, "not-the-aggregator", &[], ExtendedKeyUsagePurpose::ClientAuth, leaf())?;
        let expired =
            new_leaf(&ca, FRONT_PROXY_CN, &[], ExtendedKeyUsagePurpose::ClientAuth, Validity::Expired)?;
        let server_eku = new_leaf(&ca, FRONT_PROXY_CN, &[], ExtendedKeyUsagePurpose::ServerAuth, leaf())?;
        // The CA last: whoever reloads on the CA file's change finds the new client cert.
        write_pair(dir, "front-proxy-client", &client.pem, &client.key_pem)?;
        let bad = dir.join("bad");
        write_pair(&bad, "wrong-cn-front-proxy", &wrong_cn.pem, &wrong_cn.key_pem)?;
        write_pair(&bad, "expired-front-proxy", &expired.pem, &expired.key_pem)?;
        write_pair(&bad, "server-eku-front-proxy", &server_eku.pem, &server_eku.key_pem)?;
        write_pair(dir, "front-proxy-ca", &ca.pem, ca.key_pem())?;
        Ok(Self { ca, generation })
    }
}

fn leaf() -> Validity {
    Validity::Valid(LEAF_VALIDITY)
}

/// The trust material and where it lives.
pub(crate) struct Trust {
    dir: PathBuf,
    client_ca_pem: String,
    front_proxy: Mutex<FrontProxy>,
}

impl Trust {
    /// Generates every CA and certificate and writes them into `dir` (which must exist).
    ///
    /// # Errors
    /// Certificate generation or a file write failed.
    pub(crate) fn create(dir: &Path) -> Result<Self> {
        for sub in ["users", "bad"] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|source| Error::Write { path, source })?;
        }
        let client_ca = new_ca("percolator-sim-client-ca")?;
        write_pair(dir, "client-ca", &client_ca.pem, client_ca.key_pem())?;
        for (name, orgs) in USERS {
            let user = new_leaf(&client_ca, name, orgs, ExtendedKeyUsagePurpose::ClientAuth, leaf())?;
            write_pair(&dir.join("users"), name, &user.pem, &user.key_pem)?;
        }
        let other_ca = new_ca("unrelated-ca")?;
        let other = new_leaf(&other_ca, FRONT_PROXY_CN, &[], ExtendedKeyUsagePurpose::ClientAuth, leaf())?;
        write_pair(&dir.join("bad"), "other-ca-client", &other.pem, &other.key_pem)?;
        let front_proxy = FrontProxy::create(dir, 1)?;
        Ok(Self { dir: dir.to_owned(), client_ca_pem: client_ca.pem, front_proxy: Mutex::new(front_proxy) })
    }

    fn front_proxy(&self) -> std::sync::MutexGuard<'_, FrontProxy> {
        // Poisoning only means a panic mid-rotation; the old or new state is complete.
        self.front_proxy.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The client CA certificate, PEM.
    #[cfg(test)]
    pub(crate) fn client_ca_pem(&self) -> &str {
        &self.client_ca_pem
    }

    /// The current front-proxy CA certificate, PEM.
    #[cfg(test)]
    pub(crate) fn front_proxy_ca_pem(&self) -> String {
        self.front_proxy().ca.pem.clone()
    }

    /// How many front-proxy CAs there have been (1 before any rotation).
    pub(crate) fn generation(&self) -> u32 {
        self.front_proxy().generation
    }

    fn data(client_ca: &str, front_proxy_ca: &str) -> BTreeMap<String, String> {
        let list = |v: &str| serde_json::to_string(&[v]).unwrap_or_default();
        BTreeMap::from([
            ("client-ca-file".to_owned(), client_ca.to_owned()),
            ("requestheader-client-ca-file".to_owned(), front_proxy_ca.to_owned()),
            ("requestheader-allowed-names".to_owned(), list(FRONT_PROXY_CN)),
            ("requestheader-username-headers".to_owned(), list("X-Remote-User")),
            ("requestheader-uid-headers".to_owned(), list("X-Remote-Uid")),
            ("requestheader-group-headers".to_owned(), list("X-Remote-Group")),
            ("requestheader-extra-headers-prefix".to_owned(), list("X-Remote-Extra-")),
        ])
    }

    /// The trust ConfigMap's `data` (docs/wire.md, "Trust material").
    pub(crate) fn config_map_data(&self) -> BTreeMap<String, String> {
        Self::data(&self.client_ca_pem, &self.front_proxy().ca.pem)
    }

    /// Publishes the trust ConfigMap into `cluster` (ADDED the first time, MODIFIED after);
    /// returns its resourceVersion.
    pub(crate) fn publish(&self, cluster: &Cluster) -> u64 {
        let data = self.config_map_data();
        cluster.put_config_map(CONFIG_MAP_NAMESPACE, CONFIG_MAP_NAME, data, super::cluster::now())
    }

    /// Replaces the front-proxy CA: a new CA, a new `front-proxy-client` certificate and new
    /// `bad/*-front-proxy` certificates are written (each file atomically), and the
    /// ConfigMap then trusts only the new CA (a MODIFIED watch event). Returns the
    /// ConfigMap's new resourceVersion.
    ///
    /// # Errors
    /// Certificate generation or a file write failed; the old CA then stays in force.
    pub(crate) fn rotate(&self, cluster: &Cluster) -> Result<u64> {
        let mut front_proxy = self.front_proxy();
        let fresh = FrontProxy::create(&self.dir, front_proxy.generation + 1)?;
        *front_proxy = fresh;
        let data = Self::data(&self.client_ca_pem, &front_proxy.ca.pem);
        let rv = cluster.put_config_map(CONFIG_MAP_NAMESPACE, CONFIG_MAP_NAME, data, super::cluster::now());
        tracing::info!(generation = front_proxy.generation, resource_version = rv, "front-proxy CA rotated");
        Ok(rv)
    }
}

/// State of the rotation endpoint.
#[derive(Clone)]
struct Control {
    cluster: Arc<Cluster>,
    trust: Arc<Trust>,
}

/// The control route `POST /sim/rotate-front-proxy-ca` (for the metrics/control listener):
/// [`Trust::rotate`], answering `{"resourceVersion": "<rv>", "generation": <n>}`.
pub(crate) fn control_router(cluster: Arc<Cluster>, trust: Arc<Trust>) -> axum::Router {
    axum::Router::new()
        .route("/sim/rotate-front-proxy-ca", axum::routing::post(rotate))
        .with_state(Control { cluster, trust })
}

async fn rotate(State(control): State<Control>) -> Response {
    // Key generation and a few small file writes: cheap, but keep them off the reactor.
    let result = tokio::task::spawn_blocking(move || {
        let rv = control.trust.rotate(&control.cluster)?;
        Ok::<_, Error>((rv, control.trust.generation()))
    })
    .await;
    match result {
        Ok(Ok((rv, generation))) => {
            Json(serde_json::json!({ "resourceVersion": rv.to_string(), "generation": generation }))
                .into_response()
        }
        Ok(Err(e)) => {
            (StatusCode::INTERNAL_SERVER_ERROR, Json(serde_json::json!({ "error": e.to_string() })))
                .into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Json(serde_json::json!({ "error": e.to_string() })))
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::RootCertStore;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
    use rustls::server::WebPkiClientVerifier;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("percolator-sim-trust-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn cert(dir: &Path, stem: &str) -> CertificateDer<'static> {
        let path = dir.join(format!("{stem}.crt"));
        let certs: Vec<_> = CertificateDer::pem_file_iter(&path).unwrap().collect::<Result<_, _>>().unwrap();
        assert_eq!(certs.len(), 1, "{stem}");
        // The key parses as PKCS#8 too.
        let key = PrivateKeyDer::from_pem_file(dir.join(format!("{stem}.key"))).unwrap();
        assert!(matches!(key, PrivateKeyDer::Pkcs8(_)), "{stem}");
        certs.into_iter().next().unwrap()
    }

    fn verifier(ca: &str) -> Arc<dyn rustls::server::danger::ClientCertVerifier> {
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap()
    }

    fn verifies(v: &Arc<dyn rustls::server::danger::ClientCertVerifier>, c: &CertificateDer<'_>) -> bool {
        v.verify_client_cert(c, &[], UnixTime::now()).is_ok()
    }

    #[test]
    fn certificates_parse_and_chain() {
        let dir = temp_dir("chain");
        let trust = Trust::create(&dir).unwrap();
        let client_ca = std::fs::read_to_string(dir.join("client-ca.crt")).unwrap();
        assert_eq!(client_ca, trust.client_ca_pem());
        let front_ca = std::fs::read_to_string(dir.join("front-proxy-ca.crt")).unwrap();
        assert_eq!(front_ca, trust.front_proxy_ca_pem());
        let _ = cert(&dir, "client-ca");
        let _ = cert(&dir, "front-proxy-ca");

        let users = verifier(&client_ca);
        let front = verifier(&front_ca);
        for (name, _) in USERS {
            let c = cert(&dir.join("users"), name);
            assert!(verifies(&users, &c), "{name}");
            assert!(!verifies(&front, &c), "{name} must not chain to the front-proxy CA");
        }
        let client = cert(&dir, "front-proxy-client");
        assert!(verifies(&front, &client));
        assert!(!verifies(&users, &client));
        let bad = dir.join("bad");
        assert!(!verifies(&front, &cert(&bad, "other-ca-client")));
        assert!(!verifies(&users, &cert(&bad, "other-ca-client")));
        assert!(!verifies(&front, &cert(&bad, "expired-front-proxy")));
        assert!(!verifies(&front, &cert(&bad, "server-eku-front-proxy")));
        // The wrong CN chains fine: only the allowed-names check rejects it.
        assert!(verifies(&front, &cert(&bad, "wrong-cn-front-proxy")));

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.join("users/alice.key")).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn config_map_data_and_rotation() {
        let dir = temp_dir("rotate");
        let trust = Trust::create(&dir).unwrap();
        let data = trust.config_map_data();
        assert_eq!(data["requestheader-allowed-names"], r#"["front-proxy-client"]"#);
        assert_eq!(data["requestheader-username-headers"], r#"["X-Remote-User"]"#);
        assert_eq!(data["requestheader-uid-headers"], r#"["X-Remote-Uid"]"#);
        assert_eq!(data["requestheader-group-headers"], r#"["X-Remote-Group"]"#);
        assert_eq!(data["requestheader-extra-headers-prefix"], r#"["X-Remote-Extra-"]"#);
        assert_eq!(data["client-ca-file"], trust.client_ca_pem());
        assert_ne!(data["client-ca-file"], data["requestheader-client-ca-file"]);
        assert_eq!(data.len(), 7);

        let cluster = crate::sim::testutil::cluster_without_cafes();
        let rv1 = trust.publish(&cluster);
        let old_ca = trust.front_proxy_ca_pem();
        let old_client = cert(&dir, "front-proxy-client");
        let rv2 = trust.rotate(&cluster).unwrap();
        assert!(rv2 > rv1);
        assert_eq!(trust.generation(), 2);
        let new_ca = std::fs::read_to_string(dir.join("front-proxy-ca.crt")).unwrap();
        assert_ne!(new_ca, old_ca);
        let cm = cluster.config_map(CONFIG_MAP_NAMESPACE, CONFIG_MAP_NAME).unwrap();
        let data = cm.data.clone().unwrap();
        assert_eq!(data["requestheader-client-ca-file"], new_ca);
        assert_eq!(data["client-ca-file"], trust.client_ca_pem());
        let front = verifier(&new_ca);
        assert!(verifies(&front, &cert(&dir, "front-proxy-client")));
        assert!(!verifies(&front, &old_client));
        assert!(verifies(&front, &cert(&dir.join("bad"), "wrong-cn-front-proxy")));
        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
