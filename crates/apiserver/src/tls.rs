//! Serving TLS: the rustls server configuration (TLS 1.2+, ALPN `h2` and `http/1.1`) from
//! `--tls-cert-file`/`--tls-private-key-file`, or a self-signed certificate generated once and
//! kept in `--cert-dir` (reused on restart, as the generic Kubernetes API server does).
//!
//! The pair is served by a [`ReloadingCert`]: the files are re-read every
//! `--tls-reload-interval`, and a changed, valid pair is served to new connections without a
//! restart (a Secret volume update replaces both files with one symlink swap; the content is
//! compared, not the inode). A pair that does not load (half-written, key not matching the
//! certificate) is logged and the previous one stays in force until the next check. Layers
//! above learn of each pair put in force through [`ReloadingCert::on_change`] (the server
//! exports the leaf's `notAfter` as a metric) without this module knowing them.
//!
//! CA bundles given as flags are watched the same way ([`WatchedCaFile`], same interval); a
//! [`WatchedRootsVerifier`] verifies servers against the bundle in force at each handshake.
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

use crate::options::ServingArgs;

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
pub(crate) type Result<T> = std::result::Result<T, TlsError>;

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
    /// The flags naming the two files, for messages.
    flags: (&'static str, &'static str),
    current: RwLock<Arc<CertifiedKey>>,
    /// The file contents last seen (loaded or rejected), so each change is handled once.
    last_seen: Mutex<(Vec<u8>, Vec<u8>)>,
    /// Told of every chain put in force (see [`ReloadingCert::on_change`]).
    observers: ChainObservers,
}

/// A function told of the certificate chain in force (leaf first).
type ChainObserver = Box<dyn Fn(&[CertificateDer<'static>]) + Send + Sync>;

/// The observers of a [`ReloadingCert`]; their lock also orders a registration against a
/// reload, so none misses the last change.
#[derive(Default)]
struct ChainObservers(Mutex<Vec<ChainObserver>>);

impl std::fmt::Debug for ChainObservers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.0.lock().map_or(0, |o| o.len());
        f.debug_struct("ChainObservers").field("count", &count).finish()
    }
}

impl ChainObservers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<ChainObserver>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ReloadingCert {
    /// Loads the serving pair; fails (naming the flag) when it is unusable.
    pub fn load(cert_path: PathBuf, key_path: PathBuf) -> Result<Self> {
        Self::load_named(cert_path, key_path, ("--tls-cert-file", "--tls-private-key-file"))
    }

    /// Loads a pair given by the flags `flags` (certificate, key), named in every message.
    pub fn load_named(
        cert_path: PathBuf,
        key_path: PathBuf,
        flags: (&'static str, &'static str),
    ) -> Result<Self> {
        let cert_pem = read_file(&cert_path, flags.0)?;
        let key_pem = read_file(&key_path, flags.1)?;
        let key = certified_key(&cert_path, &cert_pem, &key_path, &key_pem, flags)?;
        Ok(Self {
            cert_path,
            key_path,
            flags,
            current: RwLock::new(Arc::new(key)),
            last_seen: Mutex::new((cert_pem, key_pem)),
            observers: ChainObservers::default(),
        })
    }

    /// Calls `observer` with the chain in force now, then again each time a reload puts a new
    /// pair in force (not for unchanged or rejected files). This is how layers above learn of
    /// the certificate (its expiry, for the metrics) without this module knowing them.
    pub fn on_change(&self, observer: impl Fn(&[CertificateDer<'static>]) + Send + Sync + 'static) {
        // Read under the observers' lock: a reload that swapped before is seen here, one that
        // swaps after waits for the lock and then tells this observer too.
        let mut observers = self.observers.lock();
        observer(&self.current().cert);
        observers.push(Box::new(observer));
    }

    /// The certificate chain served now.
    pub fn current_chain(&self) -> Vec<CertificateDer<'static>> {
        self.current().cert.clone()
    }

    /// The certificate and key in force now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Re-reads both files: `Ok(true)` when a new pair took effect, `Ok(false)` when nothing
    /// changed, `Err` when the changed files do not make a usable pair (the previous one stays).
    pub fn reload(&self) -> Result<bool> {
        let cert_pem = read_file(&self.cert_path, self.flags.0)?;
        let key_pem = read_file(&self.key_path, self.flags.1)?;
        let Ok(mut last) = self.last_seen.lock() else { return Ok(false) };
        if last.0 == cert_pem && last.1 == key_pem {
            return Ok(false);
        }
        *last = (cert_pem.clone(), key_pem.clone());
        let key = Arc::new(certified_key(&self.cert_path, &cert_pem, &self.key_path, &key_pem, self.flags)?);
        if let Ok(mut current) = self.current.write() {
            *current = Arc::clone(&key);
        }
        for observer in self.observers.lock().iter() {
            observer(&key.cert);
        }
        Ok(true)
    }

    /// Checks the files every `interval` until the pair is dropped.
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration) {
        spawn_poller(self, interval, |this| {
            // The serving pair, or a client certificate (to an upstream).
            let kind = if this.flags.0 == "--tls-cert-file" { "serving" } else { "client" };
            match this.reload() {
                Ok(false) => {}
                Ok(true) => {
                    tracing::info!(cert = %this.cert_path.display(), flag = this.flags.0, "{kind} certificate reloaded")
                }
                Err(error) => tracing::error!(
                    %error,
                    flag = this.flags.0,
                    "{kind} certificate not reloaded; the previous one stays in use"
                ),
            }
        });
    }
}

/// Calls `check` on `target` every `interval` (first one interval from now) until `target` is
/// dropped (the poller holds it weakly); the returned handle stops it sooner. The pollers of
/// files given as flags (certificates, CA bundles) share it.
pub(crate) fn spawn_poller<T: Send + Sync + 'static>(
    target: &Arc<T>,
    interval: Duration,
    check: impl Fn(&T) + Send + 'static,
) -> tokio::task::AbortHandle {
    let weak = Arc::downgrade(target);
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let Some(target) = weak.upgrade() else { return };
            check(&target);
        }
    })
    .abort_handle()
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// As a client certificate (to an upstream): the pair in force at each handshake.
impl rustls::client::ResolvesClientCert for ReloadingCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

fn read_file(path: &Path, flag: &'static str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| TlsError::Io { flag, path: path.to_path_buf(), source })
}

/// Parses a PEM pair and checks that the key belongs to the certificate.
fn certified_key(
    cert_path: &Path,
    cert_pem: &[u8],
    key_path: &Path,
    key_pem: &[u8],
    flags: (&'static str, &'static str),
) -> Result<CertifiedKey> {
    let certs = parse_certs(cert_pem, cert_path, flags.0)?;
    let key = parse_key(key_pem, key_path, flags.1)?;
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
/// holds the key of the one it presented (an upstream's `--*-insecure-tls` flag, and clients of tests that
/// exercise only the server's side).
#[derive(Debug)]
pub struct AnyServerCert {
    algorithms: WebPkiSupportedAlgorithms,
}

impl AnyServerCert {
    /// Checks handshake signatures with the signature algorithms of `provider`.
    pub fn new(provider: &CryptoProvider) -> Self {
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

// ---------------------------------------------------------------------------------------------
// CA files given as flags, watched
// ---------------------------------------------------------------------------------------------

/// One load of a CA file: its certificates and the trust anchors made of them.
#[derive(Debug)]
pub struct CaCerts {
    /// The certificates, in file order (DER).
    pub certs: Vec<CertificateDer<'static>>,
    /// The same certificates as rustls trust anchors.
    pub roots: Arc<rustls::RootCertStore>,
}

/// What a CA file held at the last check, so that each change is handled (and logged) once.
#[derive(Debug, PartialEq, Eq)]
enum SeenCa {
    /// The bytes read (loaded or rejected).
    Content(Vec<u8>),
    /// The file could not be read: the error's text.
    Unreadable(String),
}

/// A PEM CA bundle named by a flag (`--client-ca-file`, `--requestheader-client-ca-file`,
/// the CA file flags of upstreams), re-read when it changes.
///
/// The content is compared, not the inode or the modification time, so a Secret or ConfigMap
/// volume's `..data` symlink swap is followed. A change that is unreadable, holds no
/// certificate or an unusable one is rejected and the last good bundle stays in force.
#[derive(Debug)]
pub struct WatchedCaFile {
    path: PathBuf,
    flag: &'static str,
    current: RwLock<Arc<CaCerts>>,
    last_seen: Mutex<SeenCa>,
}

impl WatchedCaFile {
    /// Loads the bundle; fails (naming the flag and the file) when it is unusable.
    pub fn load(path: impl Into<PathBuf>, flag: &'static str) -> Result<Arc<Self>> {
        let path = path.into();
        let pem = read_file(&path, flag)?;
        let certs = parse_ca_certs(&pem, &path, flag)?;
        Ok(Arc::new(Self {
            path,
            flag,
            current: RwLock::new(Arc::new(certs)),
            last_seen: Mutex::new(SeenCa::Content(pem)),
        }))
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The flag that named the file.
    pub fn flag(&self) -> &'static str {
        self.flag
    }

    /// The bundle in force now.
    pub fn current(&self) -> Arc<CaCerts> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Re-reads the file: `Ok(true)` when a new bundle took effect, `Ok(false)` when nothing
    /// changed since the last check, `Err` when the file changed into something unusable (or
    /// became unreadable); the previous bundle then stays in force.
    pub fn reload(&self) -> Result<bool> {
        let read = std::fs::read(&self.path);
        let mut last = self.last_seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let pem = match read {
            Ok(pem) => pem,
            Err(source) => {
                let seen = SeenCa::Unreadable(source.to_string());
                if *last == seen {
                    return Ok(false);
                }
                *last = seen;
                return Err(TlsError::Io { flag: self.flag, path: self.path.clone(), source });
            }
        };
        if matches!(&*last, SeenCa::Content(seen) if *seen == pem) {
            return Ok(false);
        }
        let certs = parse_ca_certs(&pem, &self.path, self.flag);
        *last = SeenCa::Content(pem);
        drop(last);
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(certs?);
        Ok(true)
    }

    /// [`reload`](Self::reload), logged: a new bundle at info (its certificate count, never its
    /// content), a rejected change as an error naming the flag and the file. Returns whether a
    /// new bundle took effect.
    pub fn check(&self) -> bool {
        match self.reload() {
            Ok(false) => false,
            Ok(true) => {
                tracing::info!(
                    flag = self.flag,
                    path = %self.path.display(),
                    certificates = self.current().certs.len(),
                    "CA file reloaded"
                );
                true
            }
            Err(error) => {
                tracing::error!(
                    flag = self.flag,
                    path = %self.path.display(),
                    %error,
                    "CA file not reloaded; the previous certificates stay in force"
                );
                false
            }
        }
    }

    /// Checks the file every `interval` (the `--tls-reload-interval`) until the last other
    /// holder of the file is dropped.
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration) {
        spawn_poller(self, interval, |file| {
            file.check();
        });
    }
}

/// Parses a PEM CA bundle: at least one certificate, each usable as a trust anchor.
fn parse_ca_certs(pem: &[u8], path: &Path, flag: &'static str) -> Result<CaCerts> {
    let certs = parse_certs(pem, path, flag)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in &certs {
        roots.add(cert.clone()).map_err(|e| TlsError::Pem {
            flag,
            path: path.to_path_buf(),
            message: format!("unusable CA certificate: {e}"),
        })?;
    }
    Ok(CaCerts { certs, roots: Arc::new(roots) })
}

/// TLS session resumption bound to a [`WatchedCaFile`]: a resumed session skips certificate
/// verification, so every remembered session is forgotten when the bundle changes, and the
/// first connection after a rotation is verified against the new CAs. Sessions are kept
/// (rustls' memory cache) while the bundle stays, so steady-state reconnections still resume.
#[derive(Debug)]
pub struct CaBoundSessions {
    file: Arc<WatchedCaFile>,
    /// The bundle the sessions were verified against, and the sessions.
    state: Mutex<(Arc<CaCerts>, Arc<rustls::client::ClientSessionMemoryCache>)>,
}

/// Sessions remembered per [`CaBoundSessions`] (rustls' default size).
const SESSIONS: usize = 256;

impl CaBoundSessions {
    /// Sessions for connections verified against `file`'s bundle.
    pub fn new(file: Arc<WatchedCaFile>) -> Arc<Self> {
        let state =
            Mutex::new((file.current(), Arc::new(rustls::client::ClientSessionMemoryCache::new(SESSIONS))));
        Arc::new(Self { file, state })
    }

    /// The sessions of the bundle in force (a fresh, empty cache after a change).
    fn sessions(&self) -> Arc<rustls::client::ClientSessionMemoryCache> {
        let current = self.file.current();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !Arc::ptr_eq(&state.0, &current) {
            *state = (current, Arc::new(rustls::client::ClientSessionMemoryCache::new(SESSIONS)));
        }
        Arc::clone(&state.1)
    }
}

impl rustls::client::ClientSessionStore for CaBoundSessions {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: rustls::NamedGroup) {
        self.sessions().set_kx_hint(server_name, group);
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.sessions().kx_hint(server_name)
    }

    fn set_tls12_session(
        &self,
        server_name: ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.sessions().set_tls12_session(server_name, value);
    }

    fn tls12_session(&self, server_name: &ServerName<'_>) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.sessions().tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.sessions().remove_tls12_session(server_name);
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.sessions().insert_tls13_ticket(server_name, value);
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.sessions().take_tls13_ticket(server_name)
    }
}

/// A server certificate verifier (webpki, as rustls' [`WebPkiServerVerifier`]) against the
/// bundle a [`WatchedCaFile`] holds at each handshake: a verifier is built once per bundle
/// change and every verification goes to the current one, so a rotated CA file applies to the
/// next connection.
///
/// [`WebPkiServerVerifier`]: rustls::client::WebPkiServerVerifier
#[derive(Debug)]
pub struct WatchedRootsVerifier {
    file: Arc<WatchedCaFile>,
    provider: Arc<CryptoProvider>,
    algorithms: WebPkiSupportedAlgorithms,
    /// The bundle the verifier was built from, and the verifier.
    built: RwLock<(Arc<CaCerts>, Arc<rustls::client::WebPkiServerVerifier>)>,
}

impl WatchedRootsVerifier {
    /// Verifies against `file`'s current bundle with the algorithms of `provider`.
    pub fn new(file: Arc<WatchedCaFile>, provider: &Arc<CryptoProvider>) -> Result<Self> {
        let certs = file.current();
        let verifier = build_server_verifier(&certs, provider).map_err(|e| TlsError::Pem {
            flag: file.flag,
            path: file.path.clone(),
            message: e.to_string(),
        })?;
        Ok(Self {
            algorithms: provider.signature_verification_algorithms,
            provider: Arc::clone(provider),
            built: RwLock::new((certs, verifier)),
            file,
        })
    }

    /// The verifier of the file's current bundle, built when the bundle changed.
    fn current(&self) -> std::result::Result<Arc<rustls::client::WebPkiServerVerifier>, rustls::Error> {
        let certs = self.file.current();
        {
            let built = self.built.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            if Arc::ptr_eq(&built.0, &certs) {
                return Ok(Arc::clone(&built.1));
            }
        }
        let verifier = build_server_verifier(&certs, &self.provider)
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        *self.built.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            (certs, Arc::clone(&verifier));
        Ok(verifier)
    }
}

fn build_server_verifier(
    certs: &CaCerts,
    provider: &Arc<CryptoProvider>,
) -> std::result::Result<Arc<rustls::client::WebPkiServerVerifier>, BuildVerifierError> {
    rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::clone(&certs.roots),
        Arc::clone(provider),
    )
    .build()
    .map_err(BuildVerifierError)
}

/// A server certificate verifier that could not be built from a CA bundle.
#[derive(Debug, thiserror::Error)]
#[error("building the certificate verifier: {0}")]
struct BuildVerifierError(rustls::client::VerifierBuilderError);

impl ServerCertVerifier for WatchedRootsVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        self.current()?.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
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
        let dir = std::env::temp_dir().join(format!("apiserver-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let args = crate::options::TestFlags::parse_from(["apiserver", "--cert-dir", dir.to_str().unwrap()]);
        let config = server_config(&args.serving, None).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
        let first = std::fs::read(dir.join(SELF_SIGNED_CERT)).unwrap();
        server_config(&args.serving, None).unwrap();
        assert_eq!(std::fs::read(dir.join(SELF_SIGNED_CERT)).unwrap(), first);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn missing_file_names_the_flag() {
        let args = crate::options::TestFlags::parse_from([
            "apiserver",
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
        let dir = std::env::temp_dir().join(format!("apiserver-tls-reload-{}", std::process::id()));
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

    #[test]
    fn observers_see_the_chain_at_once_and_after_each_change_in_force() {
        crate::install_crypto_provider();
        let dir = std::env::temp_dir().join(format!("apiserver-tls-observe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (first_der, first_cert, first_key) = write_pair(&dir, "first");
        let (second_der, second_cert, second_key) = write_pair(&dir, "second");
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::copy(&first_cert, &cert).unwrap();
        std::fs::copy(&first_key, &key).unwrap();
        let certs = ReloadingCert::load(cert.clone(), key.clone()).unwrap();
        let seen = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
        let record = Arc::clone(&seen);
        certs.on_change(move |chain| record.lock().unwrap().push(chain[0].to_vec()));
        assert_eq!(*seen.lock().unwrap(), std::slice::from_ref(&first_der));

        assert!(!certs.reload().unwrap());
        std::fs::copy(&second_cert, &cert).unwrap();
        std::fs::copy(&second_key, &key).unwrap();
        assert!(certs.reload().unwrap());
        assert_eq!(*seen.lock().unwrap(), [first_der.clone(), second_der.clone()]);

        // A rejected pair (key of the first, certificate of the second) is not told.
        std::fs::copy(&first_key, &key).unwrap();
        assert!(certs.reload().is_err());
        assert_eq!(*seen.lock().unwrap(), [first_der, second_der]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod watched_ca_tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

    struct MkCa {
        pem: String,
        der: CertificateDer<'static>,
        issuer: Issuer<'static, KeyPair>,
    }

    fn mk_ca(cn: &str) -> MkCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).unwrap();
        MkCa { pem: cert.pem(), der: cert.der().clone(), issuer: Issuer::new(params, key) }
    }

    fn mk_server_leaf(ca: &MkCa) -> CertificateDer<'static> {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.signed_by(&key, &ca.issuer).unwrap().der().clone()
    }

    fn mk_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("apiserver-watched-ca-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// As a Secret volume: `ca.crt -> ..data/ca.crt`, `..data -> ..<version>`.
    fn mk_version(dir: &Path, version: &str, pem: &str) {
        std::fs::create_dir_all(dir.join(version)).unwrap();
        std::fs::write(dir.join(version).join("ca.crt"), pem).unwrap();
    }

    fn swap_data(dir: &Path, version: &str) {
        let _ = std::fs::remove_file(dir.join("..data_tmp"));
        std::os::unix::fs::symlink(version, dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    }

    fn ders(file: &WatchedCaFile) -> Vec<CertificateDer<'static>> {
        file.current().certs.clone()
    }

    #[test]
    fn a_watched_ca_file_follows_symlink_swaps_and_keeps_the_last_good_bundle() {
        let (ca1, ca2, ca3) = (mk_ca("one"), mk_ca("two"), mk_ca("three"));
        let dir = mk_dir("follow");
        mk_version(&dir, "..v1", &ca1.pem);
        mk_version(&dir, "..v2", &format!("{}{}", ca2.pem, ca3.pem));
        swap_data(&dir, "..v1");
        std::os::unix::fs::symlink("..data/ca.crt", dir.join("ca.crt")).unwrap();
        let path = dir.join("ca.crt");
        let shown = path.display().to_string();

        let file = WatchedCaFile::load(&path, "--client-ca-file").unwrap();
        assert_eq!((file.flag(), file.path()), ("--client-ca-file", path.as_path()));
        assert_eq!(ders(&file), std::slice::from_ref(&ca1.der));
        assert_eq!(file.current().roots.len(), 1);
        assert!(!file.reload().unwrap(), "an unchanged file is not a reload");

        swap_data(&dir, "..v2");
        assert!(file.reload().unwrap());
        assert_eq!(ders(&file), [ca2.der.clone(), ca3.der.clone()]);
        assert_eq!(file.current().roots.len(), 2);
        assert!(!file.reload().unwrap());

        // Rejected changes, each reported once; the bundle in force stays.
        let v2 = dir.join("..v2/ca.crt");
        for (content, message) in [
            ("not PEM at all\n", "no CERTIFICATE block found".to_owned()),
            ("", "no CERTIFICATE block found".to_owned()),
            (
                "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n",
                "unusable CA certificate: invalid peer certificate: BadEncoding".to_owned(),
            ),
        ] {
            std::fs::write(&v2, content).unwrap();
            let err = file.reload().unwrap_err().to_string();
            assert_eq!(err, format!("--client-ca-file {shown}: {message}"), "{content:?}");
            assert_eq!(ders(&file), [ca2.der.clone(), ca3.der.clone()]);
            assert!(!file.reload().unwrap(), "{content:?} is reported once");
        }
        std::fs::remove_file(&v2).unwrap();
        let err = file.reload().unwrap_err().to_string();
        assert_eq!(err, format!("--client-ca-file {shown}: No such file or directory (os error 2)"));
        assert!(!file.reload().unwrap(), "an unreadable file is reported once");
        assert!(!file.check());
        assert_eq!(ders(&file), [ca2.der.clone(), ca3.der.clone()]);

        // Back to a good bundle.
        swap_data(&dir, "..v1");
        assert!(file.check());
        assert_eq!(ders(&file), std::slice::from_ref(&ca1.der));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unusable_ca_file_is_refused_at_load_naming_the_flag() {
        let dir = mk_dir("load");
        let missing = dir.join("missing.crt");
        let err = WatchedCaFile::load(&missing, "--upstream-certificate-authority").unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "--upstream-certificate-authority {}: No such file or directory (os error 2)",
                missing.display()
            )
        );
        let empty = dir.join("empty.crt");
        std::fs::write(&empty, "").unwrap();
        let err = WatchedCaFile::load(&empty, "--client-ca-file").unwrap_err().to_string();
        assert_eq!(err, format!("--client-ca-file {}: no CERTIFICATE block found", empty.display()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_verifier_verifies_against_the_bundle_in_force() {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (ca1, ca2) = (mk_ca("one"), mk_ca("two"));
        let (leaf1, leaf2) = (mk_server_leaf(&ca1), mk_server_leaf(&ca2));
        let dir = mk_dir("verifier");
        let path = dir.join("ca.crt");
        std::fs::write(&path, &ca1.pem).unwrap();
        let file = WatchedCaFile::load(&path, "--upstream-certificate-authority").unwrap();
        let verifier = WatchedRootsVerifier::new(Arc::clone(&file), &provider).unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let verify = |leaf: &CertificateDer<'static>| {
            verifier
                .verify_server_cert(leaf, &[], &name, &[], UnixTime::now())
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert_eq!(verify(&leaf1), Ok(()));
        assert_eq!(verify(&leaf2), Err("invalid peer certificate: UnknownIssuer".to_owned()));
        let other_name = ServerName::try_from("example.com").unwrap();
        assert!(verifier.verify_server_cert(&leaf1, &[], &other_name, &[], UnixTime::now()).is_err());

        std::fs::write(&path, &ca2.pem).unwrap();
        assert!(file.reload().unwrap());
        assert_eq!(verify(&leaf1), Err("invalid peer certificate: UnknownIssuer".to_owned()));
        assert_eq!(verify(&leaf2), Ok(()));
        // Built once per bundle: the verifier kept is the one of the bundle in force.
        assert!(Arc::ptr_eq(&verifier.built.read().unwrap().0, &file.current()));
        assert_eq!(
            verifier.supported_verify_schemes(),
            provider.signature_verification_algorithms.supported_schemes()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn the_reloader_picks_up_a_change_and_stops_with_the_file() {
        let (ca1, ca2) = (mk_ca("one"), mk_ca("two"));
        let dir = mk_dir("reloader");
        let path = dir.join("ca.crt");
        std::fs::write(&path, &ca1.pem).unwrap();
        let file = WatchedCaFile::load(&path, "--client-ca-file").unwrap();
        file.spawn_reloader(Duration::from_millis(20));
        std::fs::write(&path, &ca2.pem).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while ders(&file) != [ca2.der.clone()] {
            assert!(std::time::Instant::now() < deadline, "the change was not picked up");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let weak = Arc::downgrade(&file);
        drop(file);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(weak.upgrade().is_none(), "the reloader does not keep the file alive");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn resumable_sessions_are_forgotten_when_the_ca_file_changes() {
        use rustls::client::ClientSessionStore as _;
        let dir = mk_dir("sessions");
        let (ca1, ca2) = (mk_ca("ca-1"), mk_ca("ca-2"));
        std::fs::write(dir.join("ca.crt"), &ca1.pem).unwrap();
        let file = WatchedCaFile::load(dir.join("ca.crt"), "--upstream-ca-file").unwrap();
        let sessions = CaBoundSessions::new(Arc::clone(&file));
        let server = ServerName::try_from("upstream.example").unwrap();
        sessions.set_kx_hint(server.clone(), rustls::NamedGroup::X25519);
        assert_eq!(sessions.kx_hint(&server), Some(rustls::NamedGroup::X25519));
        // An unchanged file keeps them (reconnections resume).
        assert!(!file.reload().unwrap());
        assert_eq!(sessions.kx_hint(&server), Some(rustls::NamedGroup::X25519));
        // A rotated bundle drops every session verified against the old one.
        std::fs::write(dir.join("ca.crt"), &ca2.pem).unwrap();
        assert!(file.reload().unwrap());
        assert_eq!(sessions.kx_hint(&server), None);
    }
}
