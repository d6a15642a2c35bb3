//! Trust material (docs/wire.md, "Trust material"): the client CA bundle and the request-header (front proxy)
//! settings, from flags or from the ConfigMap `kube-system/extension-apiserver-authentication`.
//!
//! Each part comes from its flag when given (`--client-ca-file`; `--requestheader-client-ca-file`
//! with the other `--requestheader-*` flags), otherwise from the ConfigMap unless
//! `--authentication-skip-lookup`. The ConfigMap is read once at start (a failure stops the
//! start unless `--authentication-tolerate-lookup-failure`) and then watched, so a rotated CA
//! or a changed header list applies to the next request. A deleted ConfigMap does not withdraw
//! the trust: as k8s.io/apiserver's dynamic CA controllers do, the last good material stays in
//! force until the ConfigMap is back (then it applies again); one warning says it is missing
//! and a gauge stays at 1 meanwhile ([`Trust::missing_gauge`]). The CA files of the flags are
//! watched too ([`crate::tls::WatchedCaFile`], polled every `--tls-reload-interval` by
//! [`Trust::spawn_file_poller`]): a rotated file applies to the next request, a file that
//! becomes unusable is logged and its last good bundle stays. The material is prebuilt (CA
//! bundles with their verifiers) and swapped atomically behind a lock; readers take an `Arc`
//! snapshot.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use openmetrics::metrics::gauge::Gauge;

use super::AuthError;
use super::x509::{CaBundle, CaBundleError};
use super::{AuthArgs, non_empty};
use crate::tls::WatchedCaFile;

/// Namespace of the trust ConfigMap.
pub(crate) const CONFIGMAP_NAMESPACE: &str = "kube-system";
/// Name of the trust ConfigMap.
pub(crate) const CONFIGMAP_NAME: &str = "extension-apiserver-authentication";

/// What to do when reading the ConfigMap is refused (printed in the start error).
pub(crate) const RBAC_HINT: &str = "the server's identity needs get, list and watch on it: bind the Role \
kube-system/extension-apiserver-authentication-reader (e.g. 'kubectl create rolebinding -n kube-system \
ROLEBINDING_NAME --role=extension-apiserver-authentication-reader --serviceaccount=YOUR_NS:YOUR_SA'), \
or start with --authentication-tolerate-lookup-failure or --authentication-skip-lookup";

/// Settings of the request-header (front proxy) authenticator.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestHeaderConfig {
    /// CAs that sign the front proxy's client certificate.
    pub ca: CaBundle,
    /// CNs allowed for that certificate; empty allows any.
    pub allowed_names: Vec<String>,
    /// Headers carrying the user name (first non-empty wins).
    pub username_headers: Vec<String>,
    /// Headers carrying the UID (first non-empty wins).
    pub uid_headers: Vec<String>,
    /// Headers carrying groups (all values of all of them).
    pub group_headers: Vec<String>,
    /// Prefixes of the headers carrying extras.
    pub extra_header_prefixes: Vec<String>,
}

impl RequestHeaderConfig {
    /// kube-apiserver's usual settings (`X-Remote-User`, `X-Remote-Uid`, `X-Remote-Group`,
    /// `X-Remote-Extra-`), any CN.
    pub fn with_defaults(ca: CaBundle) -> Self {
        Self {
            ca,
            allowed_names: Vec::new(),
            username_headers: vec!["X-Remote-User".to_owned()],
            uid_headers: vec!["X-Remote-Uid".to_owned()],
            group_headers: vec!["X-Remote-Group".to_owned()],
            extra_header_prefixes: vec!["X-Remote-Extra-".to_owned()],
        }
    }
}

/// A snapshot of everything client authentication trusts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrustMaterial {
    /// CAs of ordinary client certificates; `None` disables x509 authentication.
    pub client_ca: Option<CaBundle>,
    /// The front proxy settings; `None` disables request-header authentication.
    pub request_header: Option<RequestHeaderConfig>,
}

/// The current trust material, kept up to date from the ConfigMap where it comes from there,
/// and from the flags' CA files.
pub struct Trust {
    current: RwLock<Arc<TrustMaterial>>,
    /// The parts given by flags, rebuilt when one of their CA files changes. Lock order:
    /// `flags`, then `current`.
    flags: RwLock<TrustMaterial>,
    /// The CA files of the flags.
    files: FlagFiles,
    client_ca_from_configmap: bool,
    request_header_from_configmap: bool,
    /// Whether the ConfigMap is known to be missing (deleted, or not found).
    missing: AtomicBool,
    /// 1 while it is: `<namespace>_authentication_trust_configmap_missing`.
    missing_gauge: Gauge,
    watch: Mutex<Option<tokio::task::AbortHandle>>,
    poll: Mutex<Option<tokio::task::AbortHandle>>,
}

/// `--client-ca-file` and `--requestheader-client-ca-file`, when given.
#[derive(Default)]
struct FlagFiles {
    client_ca: Option<Arc<WatchedCaFile>>,
    request_header: Option<Arc<WatchedCaFile>>,
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trust")
            .field("client_ca_from_configmap", &self.client_ca_from_configmap)
            .field("request_header_from_configmap", &self.request_header_from_configmap)
            .finish_non_exhaustive()
    }
}

impl Drop for Trust {
    fn drop(&mut self) {
        for task in [&mut self.watch, &mut self.poll] {
            if let Some(handle) = task.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
                handle.abort();
            }
        }
    }
}

impl Trust {
    /// Fixed material that never changes (tests, or everything given by flags).
    pub fn fixed(material: TrustMaterial) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(Arc::new(material.clone())),
            flags: RwLock::new(material),
            files: FlagFiles::default(),
            client_ca_from_configmap: false,
            request_header_from_configmap: false,
            missing: AtomicBool::new(false),
            missing_gauge: Gauge::default(),
            watch: Mutex::new(None),
            poll: Mutex::new(None),
        })
    }

    /// The gauge that reads 1 while the ConfigMap is read from the cluster and missing (its
    /// clones share the value).
    pub(crate) fn missing_gauge(&self) -> Gauge {
        self.missing_gauge.clone()
    }

    /// Whether the ConfigMap is read from the cluster and missing now (tests).
    #[cfg(test)]
    pub(crate) fn is_configmap_missing(&self) -> bool {
        self.missing.load(Ordering::SeqCst)
    }

    /// The material to use for the request at hand.
    pub fn current(&self) -> Arc<TrustMaterial> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Builds the trust from the flags and, for the parts they leave out, the ConfigMap read
    /// with `client` (then watched in the background).
    pub async fn start(args: &AuthArgs, client: kube::Client) -> Result<Arc<Self>, AuthError> {
        let load = |path: &Option<std::path::PathBuf>, flag| {
            path.as_ref().map(|path| WatchedCaFile::load(path, flag)).transpose()
        };
        let files = FlagFiles {
            client_ca: load(&args.client_ca_file, "--client-ca-file")?,
            request_header: load(&args.requestheader_client_ca_file, "--requestheader-client-ca-file")?,
        };
        let flags = TrustMaterial {
            client_ca: match &files.client_ca {
                Some(file) => Some(bundle_of(file)?),
                None => None,
            },
            request_header: match &files.request_header {
                Some(file) => Some(RequestHeaderConfig {
                    ca: bundle_of(file)?,
                    allowed_names: non_empty(&args.requestheader_allowed_names),
                    username_headers: non_empty(&args.requestheader_username_headers),
                    uid_headers: non_empty(&args.requestheader_uid_headers),
                    group_headers: non_empty(&args.requestheader_group_headers),
                    extra_header_prefixes: non_empty(&args.requestheader_extra_headers_prefix),
                }),
                None => None,
            },
        };
        let lookup = !args.authentication_skip_lookup;
        let trust = Arc::new(Self {
            current: RwLock::new(Arc::new(flags.clone())),
            client_ca_from_configmap: lookup && args.client_ca_file.is_none(),
            request_header_from_configmap: lookup && args.requestheader_client_ca_file.is_none(),
            flags: RwLock::new(flags),
            files,
            missing: AtomicBool::new(false),
            missing_gauge: Gauge::default(),
            watch: Mutex::new(None),
            poll: Mutex::new(None),
        });
        if !(trust.client_ca_from_configmap || trust.request_header_from_configmap) {
            trust.log("from flags");
            return Ok(trust);
        }

        let api: Api<ConfigMap> = Api::namespaced(client, CONFIGMAP_NAMESPACE);
        let initial = match api.get_opt(CONFIGMAP_NAME).await {
            Ok(Some(cm)) => trust.apply(&cm).map_err(AuthError::InvalidConfigMap),
            Ok(None) => {
                trust.configmap_missing("not found at start");
                Ok(())
            }
            Err(error) => Err(AuthError::UnreadableConfigMap(error)),
        };
        if let Err(message) = initial {
            if !args.authentication_tolerate_lookup_failure {
                return Err(message);
            }
            tracing::error!(error = %message, "error looking up in-cluster authentication configuration");
            tracing::error!(
                "continuing without authentication configuration; this may treat all requests as anonymous"
            );
            tracing::error!(
                "to require authentication configuration lookup to succeed, set \
                 --authentication-tolerate-lookup-failure=false"
            );
        }
        trust.log("at start");
        trust.spawn_watch(api);
        Ok(trust)
    }

    /// Records that the ConfigMap is missing (`why`: not found, deleted): the material in
    /// force stays (the last good one, or none if it never was read), and the first time one
    /// warning says so.
    pub(crate) fn configmap_missing(&self, why: &str) {
        self.missing_gauge.set(1);
        if self.missing.swap(true, Ordering::SeqCst) {
            return;
        }
        let material = self.current();
        let kept = material.client_ca.is_some() || material.request_header.is_some();
        if kept {
            tracing::warn!(
                "ConfigMap {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME} {why}: keeping the last trust read from it \
                 (client CA and front proxy) until it is back"
            );
        } else {
            tracing::warn!(
                "ConfigMap {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME} {why}: client certificates and the front \
                 proxy are not trusted until it appears"
            );
        }
    }

    /// Folds the ConfigMap into the current material. On a parse error the current material
    /// stays.
    pub(crate) fn apply(&self, cm: &ConfigMap) -> Result<(), ConfigMapError> {
        // There again, valid or not (an invalid one is logged by the caller).
        if self.missing.swap(false, Ordering::SeqCst) {
            tracing::info!(
                "ConfigMap {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME} is there again: its trust applies"
            );
        }
        self.missing_gauge.set(0);
        let from_cm = match cm.data.as_ref() {
            Some(data) => material_from_configmap(data)?,
            None => TrustMaterial::default(),
        };
        // The flags' lock is held until the swap, so that a concurrent file reload is never
        // undone by a ConfigMap event that read the flags before it.
        let flags = self.flags.read().unwrap_or_else(PoisonError::into_inner);
        let next = TrustMaterial {
            client_ca: if self.client_ca_from_configmap {
                from_cm.client_ca
            } else {
                flags.client_ca.clone()
            },
            request_header: if self.request_header_from_configmap {
                from_cm.request_header
            } else {
                flags.request_header.clone()
            },
        };
        self.swap(flags, |_| next);
        Ok(())
    }

    /// Makes `next(current)` current if it differs (and logs it), then releases `flags`.
    /// `next` runs under the write lock, so what it keeps of the current material is current.
    fn swap(
        &self,
        flags: std::sync::RwLockReadGuard<'_, TrustMaterial>,
        next: impl FnOnce(&TrustMaterial) -> TrustMaterial,
    ) -> bool {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let next = next(&current);
        if **current == next {
            return false;
        }
        *current = Arc::new(next);
        drop(current);
        drop(flags);
        self.log("changed");
        true
    }

    /// Re-reads the flags' CA files (`--client-ca-file`, `--requestheader-client-ca-file`) and
    /// applies a changed, valid bundle to the next request; returns whether the material
    /// changed. A file that became unreadable or holds no usable certificate is logged (naming
    /// the flag and the file) and its last good bundle stays.
    pub fn reload_files(&self) -> bool {
        let client_ca = self.files.client_ca.as_ref().filter(|file| file.check());
        let request_header = self.files.request_header.as_ref().filter(|file| file.check());
        if client_ca.is_none() && request_header.is_none() {
            return false;
        }
        let mut flags = self.flags.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(file) = client_ca {
            match bundle_of(file) {
                Ok(bundle) => flags.client_ca = Some(bundle),
                Err(error) => {
                    tracing::error!(%error, "CA file not applied; the previous certificates stay in force")
                }
            }
        }
        if let (Some(file), Some(config)) = (request_header, flags.request_header.as_mut()) {
            match bundle_of(file) {
                Ok(bundle) => config.ca = bundle,
                Err(error) => {
                    tracing::error!(%error, "CA file not applied; the previous certificates stay in force")
                }
            }
        }
        drop(flags);
        let flags = self.flags.read().unwrap_or_else(PoisonError::into_inner);
        let (client_ca, request_header) = (flags.client_ca.clone(), flags.request_header.clone());
        self.swap(flags, |current| TrustMaterial {
            client_ca: if self.client_ca_from_configmap { current.client_ca.clone() } else { client_ca },
            request_header: if self.request_header_from_configmap {
                current.request_header.clone()
            } else {
                request_header
            },
        })
    }

    /// Re-reads the flags' CA files every `interval` ([`Trust::reload_files`]) until the trust
    /// is dropped. Nothing to do when no CA file flag is given.
    pub fn spawn_file_poller(self: &Arc<Self>, interval: Duration) {
        if self.files.client_ca.is_none() && self.files.request_header.is_none() {
            return;
        }
        let task = crate::tls::spawn_poller(self, interval, |trust| {
            trust.reload_files();
        });
        let previous = self.poll.lock().unwrap_or_else(PoisonError::into_inner).replace(task);
        if let Some(previous) = previous {
            previous.abort();
        }
    }

    fn log(&self, when: &str) {
        let material = self.current();
        let rh = material.request_header.as_ref();
        tracing::info!(
            client_ca_certs = material.client_ca.as_ref().map_or(0, CaBundle::len),
            requestheader_ca_certs = rh.map_or(0, |r| r.ca.len()),
            requestheader_allowed_names = ?rh.map(|r| &r.allowed_names),
            client_ca_source = source(self.client_ca_from_configmap, self.files.client_ca.as_ref()),
            requestheader_source = source(self.request_header_from_configmap, self.files.request_header.as_ref()),
            "authentication trust material {when}"
        );
    }

    fn spawn_watch(self: &Arc<Self>, api: Api<ConfigMap>) {
        let weak: Weak<Self> = Arc::downgrade(self);
        let config = watcher::Config::default().fields(&format!("metadata.name={CONFIGMAP_NAME}"));
        let stream = watcher::watcher(api, config).default_backoff();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            // Whether the current (re-)list has shown the ConfigMap.
            let mut listed = false;
            while let Some(event) = stream.next().await {
                let Some(trust) = weak.upgrade() else { return };
                let result = match event {
                    Ok(Event::Init) => {
                        listed = false;
                        Ok(())
                    }
                    Ok(Event::InitApply(cm) | Event::Apply(cm)) if is_ours(&cm) => {
                        listed = true;
                        trust.apply(&cm)
                    }
                    Ok(Event::InitDone) if !listed => {
                        trust.configmap_missing("not found");
                        Ok(())
                    }
                    Ok(Event::Delete(cm)) if is_ours(&cm) => {
                        trust.configmap_missing("deleted");
                        Ok(())
                    }
                    Ok(_) => Ok(()),
                    Err(error) => {
                        tracing::warn!(%error, "watch of ConfigMap {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME} failed; retrying with backoff");
                        Ok(())
                    }
                };
                if let Err(error) = result {
                    tracing::error!(
                        %error,
                        "ConfigMap {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME} is invalid; keeping the previous trust material"
                    );
                }
            }
        });
        *self.watch.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
    }
}

fn is_ours(cm: &ConfigMap) -> bool {
    cm.metadata.name.as_deref() == Some(CONFIGMAP_NAME)
        && cm.metadata.namespace.as_deref().is_none_or(|ns| ns == CONFIGMAP_NAMESPACE)
}

fn source<T>(from_configmap: bool, flag: Option<&T>) -> &'static str {
    match (from_configmap, flag.is_some()) {
        (true, _) => "configmap",
        (false, true) => "flags",
        (false, false) => "none",
    }
}

/// The client-certificate verifier of a CA file's current bundle.
fn bundle_of(file: &WatchedCaFile) -> Result<CaBundle, AuthError> {
    let error =
        |message: String| AuthError::File { flag: file.flag(), path: file.path().to_path_buf(), message };
    CaBundle::from_der(file.current().certs.clone())
        .map_err(|e| error(e.to_string()))?
        .ok_or_else(|| error("no CERTIFICATE block found".to_owned()))
}

/// Why the ConfigMap's trust material was not taken (the current material stays).
#[derive(Debug, thiserror::Error)]
pub enum ConfigMapError {
    /// A CA bundle key holds no usable bundle.
    #[error("{key}: {error}")]
    Bundle {
        /// `client-ca-file` or `requestheader-client-ca-file`.
        key: &'static str,
        /// Why.
        error: CaBundleError,
    },
    /// A header list or the allowed names are not a JSON array of strings.
    #[error("{key}: not a JSON array of strings: {error}")]
    NotStrings {
        /// The key.
        key: &'static str,
        /// Why.
        error: serde_json::Error,
    },
}

/// Reads the ConfigMap's data the way the generic server does: PEM bundles under
/// `client-ca-file` and `requestheader-client-ca-file`, JSON string arrays for the header
/// lists and allowed names (missing = empty). Request-header settings exist only with a
/// request-header CA.
pub(crate) fn material_from_configmap(
    data: &BTreeMap<String, String>,
) -> Result<TrustMaterial, ConfigMapError> {
    let bundle = |key: &'static str| match data.get(key) {
        Some(pem) => {
            CaBundle::from_pem(pem.as_bytes()).map_err(|error| ConfigMapError::Bundle { key, error })
        }
        None => Ok(None),
    };
    let client_ca = bundle("client-ca-file")?;
    let request_header = match bundle("requestheader-client-ca-file")? {
        Some(ca) => Some(RequestHeaderConfig {
            ca,
            allowed_names: json_strings(data, "requestheader-allowed-names")?,
            username_headers: json_strings(data, "requestheader-username-headers")?,
            uid_headers: json_strings(data, "requestheader-uid-headers")?,
            group_headers: json_strings(data, "requestheader-group-headers")?,
            extra_header_prefixes: json_strings(data, "requestheader-extra-headers-prefix")?,
        }),
        None => None,
    };
    Ok(TrustMaterial { client_ca, request_header })
}

/// `deserializeStrings`: empty = none, else a JSON array of strings (or `null`).
fn json_strings(data: &BTreeMap<String, String>, key: &'static str) -> Result<Vec<String>, ConfigMapError> {
    match data.get(key).map(|s| s.trim()) {
        None | Some("") => Ok(Vec::new()),
        Some(text) => serde_json::from_str::<Option<Vec<String>>>(text)
            .map(Option::unwrap_or_default)
            .map_err(|error| ConfigMapError::NotStrings { key, error }),
    }
}
