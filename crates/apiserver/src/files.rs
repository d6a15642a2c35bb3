//! Files a server reads while it runs, as Kubernetes updates them (a ConfigMap or Secret
//! volume swaps a symlink; a projected ServiceAccount token is rewritten):
//!
//! - [`WatchedFile`]: a configuration file checked on every change and put in force whole,
//!   or rejected whole with a log line while the last good value stays;
//! - [`SecretFile`]: a credential re-read when the file changes (one `stat` per use), its
//!   last good value kept when the file is unreadable or empty, and every value it had kept
//!   for redaction; [`Credentials`] makes the `Authorization` header of an upstream's
//!   requests from such files (a bearer token, or basic auth).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use http::HeaderValue;

/// How a [`WatchedFile`] reads a new text into a value: `generation` is the one the value will
/// have (one more than the value in force).
pub type Parse<T, E> = Box<dyn Fn(&str, u64) -> Result<T, E> + Send + Sync>;

/// A file whose value is reloaded when its content changes (the content is compared, not the
/// inode): readers take an `Arc` of the value in force, so a reload never disturbs one in
/// use; a new text that does not parse is rejected, reported once, and the last good value
/// stays in force.
pub struct WatchedFile<T, E> {
    path: Option<PathBuf>,
    parse: Parse<T, E>,
    read_error: fn(&Path, std::io::Error) -> E,
    current: RwLock<Arc<T>>,
    /// The generation of `current`, readable without a lock.
    generation: AtomicU64,
    last_text: Mutex<Option<String>>,
}

impl<T, E> std::fmt::Debug for WatchedFile<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedFile").field("path", &self.path).finish_non_exhaustive()
    }
}

impl<T: Send + Sync + 'static, E: std::fmt::Display + 'static> WatchedFile<T, E> {
    /// The file at `path` (none: `first` stays), whose `text` gave `first` (generation 0);
    /// `parse` reads later texts, `read_error` says why the file could not be read.
    pub fn new(
        path: Option<PathBuf>,
        text: Option<String>,
        first: T,
        parse: Parse<T, E>,
        read_error: fn(&Path, std::io::Error) -> E,
    ) -> Self {
        Self {
            path,
            parse,
            read_error,
            current: RwLock::new(Arc::new(first)),
            generation: AtomicU64::new(0),
            last_text: Mutex::new(text),
        }
    }

    /// The value in force.
    pub fn current(&self) -> Arc<T> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The generation of the value in force (0, then one more at every reload): a lock-free
    /// way to tell whether something built from an earlier one is still current.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Re-reads the file; `Ok(true)` when a new value took effect, `Ok(false)` when the content
    /// is unchanged (or there is no file), `Err` when the new text is invalid (the old value
    /// stays).
    pub fn reload(&self) -> Result<bool, E> {
        let Some(path) = &self.path else { return Ok(false) };
        let text = std::fs::read_to_string(path).map_err(|source| (self.read_error)(path, source))?;
        let Ok(mut last) = self.last_text.lock() else { return Ok(false) };
        if last.as_deref() == Some(text.as_str()) {
            return Ok(false);
        }
        // Remember the rejected text too, so an invalid file is reported once, not every poll.
        *last = Some(text.clone());
        let generation = self.generation() + 1;
        let value = (self.parse)(&text, generation)?;
        if let Ok(mut current) = self.current.write() {
            *current = Arc::new(value);
            self.generation.store(generation, Ordering::Release);
        }
        Ok(true)
    }

    /// Polls the file every `interval` and reloads it when it changed, logging each outcome;
    /// `observe` is told the outcome of every attempted reload (`true` = applied).
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration, observe: impl Fn(bool) + Send + 'static) {
        if self.path.is_none() {
            return;
        }
        let live = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                match live.reload() {
                    Ok(false) => {}
                    Ok(true) => {
                        tracing::info!(generation = live.generation(), "configuration reloaded");
                        observe(true);
                    }
                    Err(error) => {
                        tracing::error!(%error, "configuration rejected; the previous one stays in force");
                        observe(false);
                    }
                }
            }
        });
    }
}

/// What a secret is replaced with in messages.
pub const REDACTED: &str = "<redacted>";

/// A secret kept in a file (a token, a user name, a password), re-read when the file changes.
/// Its `Debug` shows the flag and path, never the value.
pub struct SecretFile {
    path: PathBuf,
    flag: &'static str,
    state: Mutex<SecretState>,
}

/// Why no credential can be sent.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The credential file is empty and no earlier value is known.
    #[error("{flag} {} is empty", .path.display())]
    Empty {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// The credential file cannot be read and no earlier value is known.
    #[error("{flag} {}: {error}", .path.display())]
    Unreadable {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The credentials cannot be an HTTP header's value.
    #[error("a credential file holds characters a header cannot carry")]
    NotHeaderText,
}

#[derive(Default)]
struct SecretState {
    /// The file's identity when last read: a change of any part re-reads it.
    stamp: Option<FileStamp>,
    /// When it was last read: it is read again after [`REREAD_AFTER`] whatever its stamp.
    read_at: Option<std::time::Instant>,
    /// The last failure logged, so a lasting one is logged once.
    failure: Option<String>,
    /// The value in force.
    current: Option<Arc<str>>,
    /// Values seen before (a few), still redacted from messages.
    previous: Vec<Arc<str>>,
}

/// What tells a changed file (or a swapped symlink target) apart.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    changed: (i64, i64),
    len: u64,
    inode: u64,
}

impl FileStamp {
    fn of(path: &Path) -> std::io::Result<Self> {
        let metadata = std::fs::metadata(path)?;
        #[cfg(unix)]
        let (inode, changed) = {
            use std::os::unix::fs::MetadataExt as _;
            (metadata.ino(), (metadata.ctime(), metadata.ctime_nsec()))
        };
        #[cfg(not(unix))]
        let (inode, changed) = (0, (0, 0));
        Ok(Self { modified: metadata.modified().ok(), changed, len: metadata.len(), inode })
    }
}

/// Secret values remembered for redaction after they were replaced.
const REMEMBERED: usize = 4;

/// A credential file is read again at least this often, even when its stamp did not change
/// (a rewrite within the clock's granularity, a network file system's cached attributes), as
/// client-go's cached token file source does.
const REREAD_AFTER: Duration = Duration::from_secs(60);

impl SecretFile {
    /// Reads the file once now, so a missing or empty file fails the start; `flag` names it
    /// in messages.
    pub fn load(path: &Path, flag: &'static str) -> Result<Self, CredentialError> {
        let file = Self { path: path.to_path_buf(), flag, state: Mutex::new(SecretState::default()) };
        file.current()?;
        Ok(file)
    }

    /// The value in force: re-read when the file changed. A file that cannot be read or is
    /// empty keeps the last good value (logged); without one it is an error naming the flag.
    pub fn current(&self) -> Result<Arc<str>, CredentialError> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let stamp = FileStamp::of(&self.path);
        let fresh = state.read_at.is_some_and(|at| at.elapsed() < REREAD_AFTER);
        if let (Ok(stamp), Some(current)) = (&stamp, &state.current)
            && state.stamp.as_ref() == Some(stamp)
            && fresh
        {
            return Ok(Arc::clone(current));
        }
        let read = stamp.and_then(|stamp| Ok((stamp, std::fs::read_to_string(&self.path)?)));
        let failure = match read {
            Ok((stamp, text)) => {
                let value = text.trim();
                if value.is_empty() {
                    state.stamp = Some(stamp);
                    CredentialError::Empty { flag: self.flag, path: self.path.clone() }
                } else {
                    if state.current.as_deref() != Some(value) {
                        if let Some(old) = state.current.take() {
                            state.previous.insert(0, old);
                            state.previous.truncate(REMEMBERED);
                            tracing::info!(flag = self.flag, path = %self.path.display(), "credential file changed; the new value applies from the next request");
                        }
                        state.current = Some(Arc::from(value));
                    }
                    state.stamp = Some(stamp);
                    state.read_at = Some(std::time::Instant::now());
                    state.failure = None;
                    // Set just above.
                    return Ok(state.current.clone().unwrap_or_else(|| Arc::from(value)));
                }
            }
            Err(error) => CredentialError::Unreadable { flag: self.flag, path: self.path.clone(), error },
        };
        match state.current.clone() {
            Some(current) => {
                let failure = failure.to_string();
                if state.failure.as_deref() != Some(failure.as_str()) {
                    tracing::warn!(error = %failure, "keeping the last value read");
                    state.failure = Some(failure);
                }
                Ok(current)
            }
            None => Err(failure),
        }
    }

    /// Every value to keep out of messages.
    pub fn values(&self) -> Vec<Arc<str>> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.current.iter().chain(&state.previous).cloned().collect()
    }
}

impl std::fmt::Debug for SecretFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretFile")
            .field("flag", &self.flag)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// How an upstream's requests authenticate. Its `Debug` holds no secret.
pub enum Credentials {
    /// No `Authorization` header.
    None,
    /// `Authorization: Bearer <token>`.
    Bearer(SecretFile),
    /// `Authorization: Basic <base64 of user:password>`.
    Basic {
        /// The user name's file.
        username: SecretFile,
        /// The password's file.
        password: SecretFile,
    },
}

impl Credentials {
    /// The `Authorization` header of the next request, from the credential files as they are
    /// now (marked sensitive).
    pub fn authorization(&self) -> Result<Option<HeaderValue>, CredentialError> {
        let value = match self {
            Self::None => return Ok(None),
            Self::Bearer(token) => format!("Bearer {}", token.current()?),
            Self::Basic { username, password } => {
                let pair = format!("{}:{}", username.current()?, password.current()?);
                format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
            }
        };
        let mut value = HeaderValue::from_str(&value).map_err(|_| CredentialError::NotHeaderText)?;
        value.set_sensitive(true);
        Ok(Some(value))
    }

    /// Every secret the credentials had, as they may appear in a message (a basic auth pair
    /// also base64-encoded, as a header echoed back shows it).
    pub fn secrets(&self) -> Vec<String> {
        match self {
            Self::None => Vec::new(),
            Self::Bearer(token) => token.values().iter().map(|v| v.to_string()).collect(),
            Self::Basic { username, password } => {
                let passwords = password.values();
                let mut secrets = Vec::new();
                for user in username.values() {
                    for pass in &passwords {
                        let pair = format!("{user}:{pass}");
                        secrets.push(base64::engine::general_purpose::STANDARD.encode(&pair));
                    }
                }
                secrets.extend(passwords.iter().map(|v| v.to_string()));
                secrets
            }
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::Bearer(token) => f.debug_tuple("Bearer").field(token).finish(),
            Self::Basic { username, password } => {
                f.debug_struct("Basic").field("username", username).field("password", password).finish()
            }
        }
    }
}

/// `message` with every one of `secrets` replaced by [`REDACTED`], the longest first (a secret
/// containing another is replaced whole).
pub fn redact(message: String, mut secrets: Vec<String>) -> String {
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.iter().filter(|s| !s.is_empty()).fold(message, |message, secret| {
        if message.contains(secret.as_str()) { message.replace(secret.as_str(), REDACTED) } else { message }
    })
}
