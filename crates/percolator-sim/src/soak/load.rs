//! The soak's steady clients: HTTP/2 over TLS with the front proxy's client certificate and
//! `X-Remote-User`/`X-Remote-Group`, as kube-aggregator reaches an aggregated API server, and
//! the record of every answer (when it started, how long it took, its code).

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::Result;

/// The user and groups the aggregator forwards (the simulator's policy lets `viewers` get and
/// list every served API and `/metrics`).
pub(super) const USER: &str = "tester";
const GROUPS: [&str; 2] = ["viewers", "system:authenticated"];
/// The CN of the front proxy's client certificate (`--requestheader-allowed-names`).
pub(super) const FRONT_PROXY_CN: &str = "front-proxy-client";
/// What `kubectl get -o wide` asks for.
pub(super) const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// Which client sent a request (a row of the report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// A list of a kind (JSON or Table, one namespace or all, with or without a selector).
    List,
    /// An HPA-like custom metrics get.
    Custom,
    /// An HPA-like external metrics get.
    External,
    /// `kubectl top` (metrics.k8s.io).
    Top,
}

impl Class {
    /// The class's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Class::List => "kinds list",
            Class::Custom => "custom metrics",
            Class::External => "external metrics",
            Class::Top => "metrics.k8s.io",
        }
    }
}

/// One answered (or failed) request.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    /// Seconds since the run's start when it was sent.
    pub at: f64,
    /// How long until its body was read whole (or it failed), in seconds.
    pub took: f64,
    /// HTTP status; 0 when the request failed without one (connection, TLS, client timeout).
    pub code: u16,
    /// Which client.
    pub class: Class,
}

/// Every request of the run, in completion order.
#[derive(Debug, Default)]
pub struct Records(Mutex<Vec<Record>>);

impl Records {
    pub(super) fn push(&self, record: Record) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(record);
    }

    /// A copy of every record so far.
    pub fn snapshot(&self) -> Vec<Record> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// Makes HTTP/2 clients trusting the serving CAs and presenting the front proxy's certificate.
#[derive(Clone)]
pub(super) struct Clients {
    cas: Vec<Vec<u8>>,
    identity: Vec<u8>,
    timeout: Duration,
}

impl Clients {
    /// `cas`: PEM CAs the clients trust; `cert`/`key`: the front proxy's pair; `timeout`: the
    /// client's own limit, above the server's `--request-timeout` so that a late answer is
    /// measured rather than cut.
    pub(super) fn new(cas: Vec<Vec<u8>>, cert: &Path, key: &Path, timeout: Duration) -> Result<Self> {
        let mut identity = std::fs::read(cert)?;
        identity.extend(std::fs::read(key)?);
        Ok(Self { cas, identity, timeout })
    }

    /// A client with its own connection pool (one HTTP/2 connection per server).
    pub(super) fn client(&self) -> Result<reqwest::Client> {
        self.client_trusting(&self.cas)
    }

    /// A client trusting only `cas`.
    pub(super) fn client_trusting(&self, cas: &[Vec<u8>]) -> Result<reqwest::Client> {
        let certs = cas
            .iter()
            .map(|pem| reqwest::Certificate::from_pem(pem))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(reqwest::Client::builder()
            .tls_certs_only(certs)
            .identity(reqwest::Identity::from_pem(&self.identity)?)
            .http2_prior_knowledge()
            .timeout(self.timeout)
            .build()?)
    }
}

/// `request` with the identity headers the aggregator adds (set on each request: reqwest's
/// default headers lost the front proxy's identity here, every answer was a 403).
pub(super) fn identified(request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    GROUPS.iter().fold(request.header("x-remote-user", USER), |r, group| r.header("x-remote-group", *group))
}

/// One request of a steady client.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub path: String,
    pub accept: Option<&'static str>,
    pub class: Class,
}

impl Target {
    pub(super) fn json(path: String, class: Class) -> Self {
        Self { path, accept: None, class }
    }
}

/// Sends `target` and records it; returns the code and the body (empty on failure).
pub(super) async fn send(
    client: &reqwest::Client,
    base: &str,
    target: &Target,
    started: Instant,
    records: &Records,
) -> (u16, bytes::Bytes) {
    let sent = Instant::now();
    let mut request = identified(client.get(format!("{base}{}", target.path)));
    if let Some(accept) = target.accept {
        request = request.header("accept", accept);
    }
    let outcome = async {
        let response = request.send().await?;
        let code = response.status().as_u16();
        let body = response.bytes().await?;
        Ok::<_, reqwest::Error>((code, body))
    }
    .await;
    let (code, body) = match outcome {
        Ok(answer) => answer,
        Err(error) => {
            tracing::warn!(path = %target.path, %error, "soak request failed");
            (0, bytes::Bytes::new())
        }
    };
    records.push(Record {
        at: (sent - started).as_secs_f64(),
        took: sent.elapsed().as_secs_f64(),
        code,
        class: target.class,
    });
    (code, body)
}

/// Where and until when the clients send, and where they record.
#[derive(Clone)]
pub(super) struct Run {
    /// `https://127.0.0.1:PORT` of percolator.
    pub base: String,
    /// The run's start (records count from it).
    pub started: Instant,
    /// When the clients stop.
    pub until: Instant,
    pub records: Arc<Records>,
}

/// Sends `targets` in turn, `every` apart (each worker offset by `every / workers`), until the
/// run ends. Each worker has its own client, so its own HTTP/2 connection.
pub(super) async fn steady(
    clients: &Clients,
    run: &Run,
    targets: Arc<Vec<Target>>,
    workers: usize,
    every: Duration,
) -> Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..workers.max(1) {
        let client = clients.client()?;
        let (run, targets) = (run.clone(), targets.clone());
        let offset = every.mul_f64(worker as f64 / workers.max(1) as f64);
        tasks.spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + offset, every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut next = worker;
            loop {
                ticks.tick().await;
                if Instant::now() >= run.until || targets.is_empty() {
                    return;
                }
                let target = &targets[next % targets.len()];
                next += workers.max(1);
                send(&client, &run.base, target, run.started, &run.records).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Every target of `targets` once per `period`, spread evenly over it (as an HPA controller
/// spreads its 15 s syncs over its HPAs), until `until`; each request on its own task, so a
/// slow answer does not hold the others back.
pub(super) async fn periodic(client: reqwest::Client, run: Run, targets: Vec<Target>, period: Duration) {
    if targets.is_empty() {
        return;
    }
    let step = period.div_f64(targets.len() as f64);
    let mut ticks = tokio::time::interval(step);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = tokio::task::JoinSet::new();
    for target in targets.iter().cycle() {
        ticks.tick().await;
        if Instant::now() >= run.until {
            break;
        }
        let (client, run, target) = (client.clone(), run.clone(), target.clone());
        tasks.spawn(async move {
            send(&client, &run.base, &target, run.started, &run.records).await;
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// Makes the serving CA, a serving pair signed by it, and the front proxy's CA and client pair
/// (with the simulator's [`crate::pki`]).
pub(super) mod pki {
    use rcgen::ExtendedKeyUsagePurpose;

    use crate::pki::{Ca, PkiError, not_a_ca};

    use super::super::{Result, SoakError};

    fn failed(e: PkiError) -> SoakError {
        SoakError::Setup(format!("certificate: {e}"))
    }

    /// A new CA named `cn`.
    pub(crate) fn ca(cn: &str) -> Result<Ca> {
        Ca::new(cn).map_err(failed)
    }

    /// A leaf signed by `ca`: for `127.0.0.1` (serving) or with CN `cn` (client); (cert, key) PEM.
    pub(crate) fn leaf(ca: &Ca, cn: &str, serving: bool) -> Result<(String, String)> {
        let (names, usage) = if serving {
            (vec!["127.0.0.1".to_owned(), "localhost".to_owned()], ExtendedKeyUsagePurpose::ServerAuth)
        } else {
            (vec![], ExtendedKeyUsagePurpose::ClientAuth)
        };
        let leaf = ca.leaf(cn, names, usage, not_a_ca).map_err(failed)?;
        Ok((leaf.pem, leaf.key_pem))
    }
}
