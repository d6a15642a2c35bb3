//! End-to-end harness: starts the real `percolator-sim` binary, a real Prometheus scraping it
//! (history backfilled with promtool so rates are exact from the first query) or a real
//! VictoriaMetrics ([`Options::engine`], history imported), optionally behind a TLS + token +
//! tenant front ([`Options::secure_front`]), and the real `percolator` binary over real TLS;
//! drives them with real `kubectl` and an HTTPS client. Every process is killed when the
//! [`Env`] is dropped.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The local Prometheus and the fault proxy (the simulator's library).
pub(crate) use percolator_sim::devenv;
/// Kubernetes manifests: kustomize rendering, kubernetes-validate, the Pod Security checks.
pub(crate) mod manifests;
/// Network namespaces: silent drops and one-way partitions between percolator and its upstreams.
pub(crate) mod netns;
/// The TLS + token + tenant front (the simulator's library).
pub(crate) use percolator_sim::securefront;

pub(crate) use devenv::Engine;
use devenv::{FaultProxy, MetricsEngine, PrometheusOptions, ScrapeJob};
/// Starting percolator and the simulator, and `/proc` (the simulator's library).
pub(crate) use percolator_sim::{launch, procfs};
use securefront::SecureFront;
use serde_json::Value;
use tokio::process::{Child, Command};

/// Scrape interval of the test Prometheus (and backfill step).
pub(crate) const SCRAPE: Duration = Duration::from_secs(2);
/// Bearer token of the e2e user (`tester`, group `viewers` in the simulator's policy).
pub(crate) const TESTER_TOKEN: &str = "tester-token";
/// Kubelet sample period of the simulator in tests.
pub(crate) const HOUSEKEEPING: &str = "2s";
/// The tenant the [`SecureFront`] accepts and percolator sends (`X-Scope-OrgID`).
pub(crate) const FRONT_TENANT: &str = "team-cafe";

/// Sizes and knobs of one environment.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub seed: u64,
    pub nodes: u32,
    pub pods_per_node: u32,
    pub namespaces: &'static str,
    pub cache_ttl: &'static str,
    pub window: &'static str,
    pub extra_args: Vec<String>,
    /// Whether Prometheus scrapes percolator's /metrics (each scrape is an authorized
    /// request: tests counting SubjectAccessReviews turn it off).
    pub scrape_percolator: bool,
    /// Put a [`FaultProxy`] between percolator and Prometheus ([`Env::proxy`]).
    pub prometheus_proxy: bool,
    /// Faults (`POST /sim/faults` JSON) set in the simulator before percolator starts.
    pub sim_faults: Option<&'static str>,
    /// The simulator also exports the cAdvisor and node series a cluster's Prometheus has
    /// (`--cadvisor`), with history, for `--resource-source=prometheus`.
    pub cadvisor: bool,
    /// The engine serving PromQL (Prometheus by default).
    pub engine: Engine,
    /// Put a [`SecureFront`] between percolator and the engine ([`Env::front`]): percolator
    /// reaches it over HTTPS with its CA, a client certificate, a bearer token file and the
    /// tenant header [`FRONT_TENANT`].
    pub secure_front: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            seed: 7,
            nodes: 3,
            pods_per_node: 6,
            namespaces: "shop,api,default",
            cache_ttl: "2s",
            window: "1m",
            extra_args: Vec::new(),
            scrape_percolator: true,
            prometheus_proxy: false,
            sim_faults: None,
            cadvisor: false,
            engine: Engine::Prometheus,
            secure_front: false,
        }
    }
}

/// A running environment.
pub(crate) struct Env {
    pub dir: PathBuf,
    /// percolator's flags but `--secure-port`, the certificates and those
    /// [`percolator_command`] sets, for [`Env::replica`].
    pub percolator_args: Vec<String>,
    /// The simulator's kubeconfig and the engine's URL as percolator reaches it (through the
    /// proxy and the front, when asked for), for [`Env::replica`].
    upstreams: (PathBuf, String),
    pub sim_api: String,
    pub sim_metrics: String,
    pub url: String,
    pub kubeconfig: PathBuf,
    /// The engine ([`Options::engine`]), whichever it is.
    pub prometheus: EngineHandle,
    /// The fault-injecting proxy percolator reaches Prometheus through, when asked for.
    pub proxy: Option<FaultProxy>,
    /// The TLS + token + tenant front percolator reaches the engine through, when asked for.
    pub front: Option<SecureFront>,
    pub client: reqwest::Client,
    pub stderr_log: PathBuf,
    sim: Child,
    percolator: Child,
}

/// A temporary directory of a test that needs no looking into after a failure (a copy of the
/// tree, a scratch layout), removed when dropped; [`mk_dir`] keeps its directories instead.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A new empty [`Scratch`] `percolator-<name>-<pid>-<n>` under the temporary directory.
pub(crate) fn mk_scratch(name: &str) -> Scratch {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "percolator-{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

pub(crate) fn mk_dir(name: &str) -> PathBuf {
    // Unique within the process: a test's own directory and its `Env`'s often share a name
    // (the suffix was the nanoseconds of an `Instant` just taken, which repeat, so `Env::start`
    // could delete the files a test had just written for it).
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(remove_dead_runs_dirs);
    let dir = std::env::temp_dir().join(format!(
        "percolator-e2e-{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Removes the directories [`mk_dir`] made for test processes that are gone (their pid, the
/// next-to-last part of the name, is not running): each holds a Prometheus TSDB of tens of
/// MB, and runs add dozens. Those of a run still going (this one, a parallel one) are left,
/// and so are a finished run's until the next run starts, to read after a failure.
fn remove_dead_runs_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("percolator-e2e-")) else { continue };
        let pid = rest.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && !procfs::alive(pid)
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// How long a child of a test (the simulator, percolator) may take to say it is ready.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts the simulator `command` ([`percolator_sim::command`] with the cluster's flags) and
/// waits for its ready line ([`START_TIMEOUT`]): the child and that line.
pub(crate) async fn mk_sim(command: Command) -> (Child, Value) {
    launch::start_sim(command, START_TIMEOUT).await.unwrap_or_else(|e| panic!("{e}"))
}

/// Starts the percolator `command` ([`launch::percolator_command`] with the test's flags),
/// its log in `log`, and waits for its serving line ([`START_TIMEOUT`]).
pub(crate) async fn mk_percolator(command: Command, what: &str, log: &Path) -> launch::Started {
    launch::start(command, what, START_TIMEOUT, launch::log_file(log)).await.unwrap_or_else(|e| panic!("{e}"))
}

/// [`launch::percolator_command`] for this build's binary.
pub(crate) fn percolator_command(port: u16, kubeconfig: &Path, prometheus_url: &str) -> Command {
    launch::percolator_command(Path::new(env!("CARGO_BIN_EXE_percolator")), port, kubeconfig, prometheus_url)
}

impl Env {
    pub(crate) async fn start(name: &str, options: Options) -> Env {
        apiserver::install_crypto_provider();
        let dir = mk_dir(name);
        let state = dir.join("sim");
        let mut command = percolator_sim::command(&dir).unwrap();
        command
            .args(["--seed", &options.seed.to_string()])
            .args(["--nodes", &options.nodes.to_string()])
            .args(["--pods-per-node", &options.pods_per_node.to_string()])
            .args(["--namespaces", options.namespaces])
            .args(["--housekeeping", HOUSEKEEPING])
            .args(options.cadvisor.then_some("--cadvisor"));
        let (sim, ready) = mk_sim(command).await;
        let sim_api = ready["api"].as_str().unwrap().to_string();
        let sim_metrics = ready["metrics"].as_str().unwrap().to_string();
        let metrics_target = sim_metrics.trim_start_matches("http://").to_string();

        // Backfill 15 minutes of history at the scrape interval, ending one interval ago.
        let history =
            devenv::sim_history(&sim_metrics, "sim-apps", &metrics_target, Duration::from_secs(900), SCRAPE)
                .await
                .unwrap();
        let prometheus = MetricsEngine::start(
            options.engine,
            PrometheusOptions {
                dir: dir.join("prometheus"),
                jobs: vec![
                    ScrapeJob::http("sim-apps", metrics_target),
                    // percolator's own /metrics, once it has bound its port.
                    ScrapeJob {
                        job: "percolator".into(),
                        target: String::new(),
                        scheme: "https".into(),
                        bearer_token: Some(TESTER_TOKEN.into()),
                        targets_file: Some(dir.join("percolator-targets.json")),
                    },
                ],
                scrape_interval: SCRAPE,
                backfill: Some(history),
            },
        )
        .await
        .expect("the engine starts");
        prometheus
            .wait_for_job("sim-apps", Duration::from_secs(30))
            .await
            .expect("the engine scrapes the simulator");

        if let Some(faults) = options.sim_faults {
            post_faults(&reqwest::Client::new(), &sim_metrics, faults).await;
        }
        let proxy = if options.prometheus_proxy {
            let upstream = prometheus.url().trim_start_matches("http://").to_string();
            Some(FaultProxy::start(&upstream).await.expect("fault proxy starts"))
        } else {
            None
        };
        let upstream_url = proxy.as_ref().map_or_else(|| prometheus.url(), FaultProxy::url);
        let front = if options.secure_front {
            let upstream = upstream_url.trim_start_matches("http://").to_string();
            Some(
                SecureFront::start(&dir.join("front"), &upstream, &front_token(1), FRONT_TENANT)
                    .await
                    .expect("the secure front starts"),
            )
        } else {
            None
        };
        let (prometheus_url, connection_args) = match &front {
            Some(front) => {
                let files = front.files();
                let path = |p: &Path| p.display().to_string();
                (
                    front.url(),
                    vec![
                        "--prometheus-ca-file".to_string(),
                        path(&files.ca),
                        "--prometheus-client-tls-cert-file".to_string(),
                        path(&files.client_cert),
                        "--prometheus-client-tls-key-file".to_string(),
                        path(&files.client_key),
                        "--prometheus-token-file".to_string(),
                        path(&files.token),
                        "--prometheus-header".to_string(),
                        format!("{}={FRONT_TENANT}", securefront::TENANT_HEADER),
                    ],
                )
            }
            None => (upstream_url, Vec::new()),
        };

        let stderr_log = dir.join("percolator.log");
        let kubeconfig = state.join("kubeconfig");
        // Every flag but the port and the certificates, which replicas choose ([`Replica`]),
        // and those of [`percolator_command`].
        let mut percolator_args: Vec<String> = connection_args.clone();
        for flag in ["--cache-ttl", options.cache_ttl, "--window", options.window, "-v", "4"] {
            percolator_args.push(flag.into());
        }
        percolator_args.extend(options.extra_args.iter().cloned());
        let mut command = percolator_command(0, &kubeconfig, &prometheus_url);
        command.arg("--cert-dir").arg(dir.join("certs")).args(&percolator_args);
        let started = mk_percolator(command, "percolator", &stderr_log).await;
        let serving = started.address.clone();
        let upstreams = (kubeconfig, prometheus_url);
        let url = started.url();
        if options.scrape_percolator {
            devenv::write_targets_file(&dir.join("percolator-targets.json"), &serving).unwrap();
        }

        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: percolator\n  cluster:\n    server: {url}\n    certificate-authority: {}\ncontexts:\n- name: percolator\n  context: {{cluster: percolator, user: tester}}\ncurrent-context: percolator\nusers:\n- name: tester\n  user: {{token: tester-token}}\n",
                dir.join("certs/apiserver.crt").display()
            ),
        )
        .unwrap();
        let client = mk_percolator_client(&dir.join("certs"));
        let env = Env {
            dir,
            percolator_args,
            upstreams,
            sim_api,
            sim_metrics,
            url,
            kubeconfig,
            prometheus: EngineHandle(prometheus),
            proxy,
            front,
            client,
            stderr_log,
            sim,
            percolator: started.child,
        };
        env.wait_ready().await;
        env
    }

    async fn wait_ready(&self) {
        let ready = launch::wait_ready(&self.client, &self.url, Duration::from_secs(30)).await;
        assert!(ready, "percolator never became ready");
    }

    /// A client trusting percolator's serving certificate that authenticates with `token`
    /// (anonymous when `None`).
    pub(crate) fn client_as(&self, token: Option<&str>) -> reqwest::Client {
        let ca = std::fs::read(self.dir.join("certs/apiserver.crt")).unwrap();
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token {
            headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .default_headers(headers)
            .build()
            .unwrap()
    }

    /// Runs real kubectl against percolator with a per-environment discovery cache.
    pub(crate) fn kubectl(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(kubectl_bin())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("kube-cache"))
            .args(args)
            .output()
            .expect("kubectl runs")
    }

    /// Waits (15 s at most) until percolator has counted one rejected configuration reload
    /// and reports its last reload as failed.
    pub(crate) async fn wait_for_rejected_reload(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (_, _, metrics) = self.get("/metrics", None).await;
            if metrics.contains("percolator_config_reloads_total{file=\"config\",result=\"failure\"} 1") {
                assert!(
                    metrics.contains("percolator_config_last_reload_successful{file=\"config\"} 0"),
                    "{metrics}"
                );
                return;
            }
            assert!(Instant::now() < deadline, "the rejected file was not counted");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// kubectl that must succeed; returns stdout.
    pub(crate) fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// GET with an Accept header; returns status, headers and body.
    pub(crate) async fn get(
        &self,
        path: &str,
        accept: Option<&str>,
    ) -> (u16, reqwest::header::HeaderMap, String) {
        let mut request = self.client.get(format!("{}{path}", self.url));
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        (status, headers, response.text().await.unwrap())
    }

    /// GET returning JSON.
    pub(crate) async fn get_json(&self, path: &str) -> Value {
        let (status, _, body) = self.get(path, None).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// The simulator's ground truth now.
    pub(crate) async fn truth(&self) -> Value {
        self.client.get(format!("{}/sim/truth", self.sim_metrics)).send().await.unwrap().json().await.unwrap()
    }

    /// The simulator's upstream call counters.
    pub(crate) async fn sim_stats(&self) -> Value {
        self.client.get(format!("{}/sim/stats", self.sim_metrics)).send().await.unwrap().json().await.unwrap()
    }

    /// Sets simulator faults (`POST /sim/faults`, e.g. `{"kubelet": {"node-0": "hang"}}`);
    /// returns the fault state.
    pub(crate) async fn set_faults(&self, faults: &str) -> Value {
        post_faults(&self.client, &self.sim_metrics, faults).await
    }

    /// Deletes one running pod and creates its replacement (`POST /sim/churn`).
    pub(crate) async fn churn(&self) -> Value {
        self.client
            .post(format!("{}/sim/churn", self.sim_metrics))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The fault-injecting proxy in front of Prometheus (started with `prometheus_proxy`).
    pub(crate) fn proxy(&self) -> &FaultProxy {
        self.proxy.as_ref().expect("the environment was started with prometheus_proxy")
    }

    /// The TLS + token + tenant front before the engine (started with `secure_front`).
    pub(crate) fn front(&self) -> &SecureFront {
        self.front.as_ref().expect("the environment was started with secure_front")
    }

    /// percolator's resident set and its peak so far (`VmRSS`, `VmHWM`), in KiB.
    pub(crate) fn percolator_memory_kib(&self) -> (u64, u64) {
        let pid = self.percolator_pid();
        let field = |name: &str| {
            procfs::status_number(pid, name).unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        };
        (field("VmRSS"), field("VmHWM"))
    }

    /// The pid of percolator's process.
    pub(crate) fn percolator_pid(&self) -> u32 {
        self.percolator.id().expect("percolator is running")
    }

    /// Whether the percolator process is still running.
    pub(crate) fn percolator_alive(&mut self) -> bool {
        matches!(self.percolator.try_wait(), Ok(None))
    }

    /// A client trusting percolator's serving certificate that presents the certificate
    /// `name` from the simulator's state directory (e.g. `front-proxy-client`).
    pub(crate) fn client_with_cert(&self, name: &str) -> reqwest::Client {
        let state = self.dir.join("sim");
        let mut pem = std::fs::read(state.join(format!("{name}.crt"))).unwrap();
        pem.extend(std::fs::read(state.join(format!("{name}.key"))).unwrap());
        let ca = std::fs::read(self.dir.join("certs/apiserver.crt")).unwrap();
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .identity(reqwest::Identity::from_pem(&pem).unwrap())
            .build()
            .unwrap()
    }

    /// Waits until every running pod of `namespace` (all when None) has a CPU value, which
    /// needs two kubelet samples one housekeeping period apart.
    pub(crate) async fn wait_for_cpu(&self, namespace: Option<&str>) -> Value {
        let path = match namespace {
            Some(ns) => format!("/apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/{ns}/podmetricssummaries"),
            None => "/apis/stats.une-tasse-de.cafe/v1alpha1/podmetricssummaries".to_string(),
        };
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let list = self.get_json(&path).await;
            let items = list["items"].as_array().unwrap();
            if !items.is_empty() && items.iter().all(|i| i.get("cpu").is_some()) {
                return list;
            }
            assert!(Instant::now() < deadline, "cpu never appeared: {list}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// A serving certificate and key for 127.0.0.1 shared by [`Replica`]s (as the replicas of a
/// Deployment mount one Secret), and the certificate's PEM to trust it.
pub(crate) struct ServingPair {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub pem: Vec<u8>,
}

/// Writes a serving pair for 127.0.0.1 and localhost, signed by a CA of its own, into `dir`
/// (`tls.crt`, `tls.key`); `pem` is the CA's.
pub(crate) fn serving_pair(dir: &Path) -> ServingPair {
    let ca = test_support::mk_ca("percolator-test-serving-ca");
    let leaf = test_support::mk_serving(&ca, &["127.0.0.1", "localhost"]);
    std::fs::create_dir_all(dir).unwrap();
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert, &leaf.pem).unwrap();
    std::fs::write(&key, &leaf.key_pem).unwrap();
    ServingPair { cert, key, pem: ca.pem.into_bytes() }
}

/// One more percolator process of an [`Env`], with the environment's flags (as the replicas
/// of one Deployment have), a [`ServingPair`], and a port of its own that it keeps across
/// restarts. Killed when dropped.
pub(crate) struct Replica {
    pub name: String,
    pub url: String,
    pub log: PathBuf,
    port: u16,
    upstreams: (PathBuf, String),
    args: Vec<String>,
    ca: Vec<u8>,
    child: Option<Child>,
}

impl Env {
    /// Starts a replica named `name` serving `pair`, with the environment's flags and `extra`;
    /// returns once its `/readyz` passes.
    pub(crate) async fn replica(&self, name: &str, pair: &ServingPair, extra: &[&str]) -> Replica {
        let mut args = self.percolator_args.clone();
        args.extend(["--tls-cert-file".into(), pair.cert.display().to_string()]);
        args.extend(["--tls-private-key-file".into(), pair.key.display().to_string()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut replica = Replica {
            name: name.to_owned(),
            url: String::new(),
            log: self.dir.join(format!("{name}.log")),
            port: 0,
            upstreams: self.upstreams.clone(),
            args,
            ca: pair.pem.clone(),
            child: None,
        };
        replica.start_again().await;
        replica
    }
}

impl Replica {
    /// Starts the process (again, on the same port); returns once its `/readyz` passes.
    pub(crate) async fn start_again(&mut self) {
        assert!(self.child.is_none(), "{} is running", self.name);
        let (kubeconfig, prometheus_url) = &self.upstreams;
        let mut command = percolator_command(self.port, kubeconfig, prometheus_url);
        command.args(&self.args);
        let started = mk_percolator(command, &self.name, &self.log).await;
        self.port = started.address.rsplit_once(':').unwrap().1.parse().unwrap();
        self.url = started.url();
        self.child = Some(started.child);
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&self.ca).unwrap())
            .build()
            .unwrap();
        let ready = launch::wait_ready(&client, &self.url, Duration::from_secs(30)).await;
        assert!(ready, "{} never became ready", self.name);
    }

    /// Sends SIGTERM and waits (60 s at most) for the process to exit; its exit status.
    pub(crate) async fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("the replica is running");
        let pid = child.id().expect("the replica is running");
        let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
        assert!(status.success(), "kill -TERM {pid}");
        tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} did not exit within 60 s of SIGTERM", self.name))
            .unwrap()
    }
}

/// The engine of an [`Env`]: a [`MetricsEngine`] (through `Deref`), with the query log that
/// the parts of tests checking PromQL read.
pub(crate) struct EngineHandle(MetricsEngine);

impl EngineHandle {
    /// Every PromQL expression the engine has run so far, in order. Only Prometheus keeps a
    /// query log: on VictoriaMetrics this fails the test (parts reading the log run on
    /// Prometheus only; [`MetricsEngine::logged_queries`] asks without failing).
    pub(crate) fn queries(&self) -> Vec<String> {
        self.0.logged_queries().unwrap_or_else(|| panic!("{:?} keeps no query log", self.0.engine()))
    }
}

impl std::ops::Deref for EngineHandle {
    type Target = MetricsEngine;
    fn deref(&self) -> &MetricsEngine {
        &self.0
    }
}

impl std::ops::DerefMut for EngineHandle {
    fn deref_mut(&mut self) -> &mut MetricsEngine {
        &mut self.0
    }
}

/// The `generation`th bearer token of a [`SecureFront`]: unique to this process, so that a
/// search of the logs for it finds only a leak.
pub(crate) fn front_token(generation: u32) -> String {
    format!("front-token-{generation}-{}-{}", std::process::id(), jiff::Timestamp::now().as_nanosecond())
}

async fn post_faults(client: &reqwest::Client, sim_metrics: &str, faults: &str) -> Value {
    mk_post_json(client, &format!("{sim_metrics}/sim/faults"), faults).await
}

/// POSTs the JSON `body` to `url` and returns the JSON answer, failing unless it is a 2xx.
pub(crate) async fn mk_post_json(client: &reqwest::Client, url: &str, body: &str) -> Value {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status();
    let answer: Value = response.json().await.unwrap();
    assert!(status.is_success(), "POST {url} {body}: {answer}");
    answer
}

/// Headers authenticating as the e2e user.
/// The Running pods of `namespace` in the simulator's truth.
pub(crate) fn running_pods<'a>(truth: &'a Value, namespace: &str) -> Vec<&'a Value> {
    truth["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["namespace"] == namespace && p["phase"] == "Running")
        .collect()
}

/// Kubelet fetches of every node so far, from the simulator's stats.
pub(crate) fn kubelet_fetches(stats: &Value) -> u64 {
    stats["kubeletFetches"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum()
}

/// A client of the percolator whose `--cert-dir` is `cert_dir` (trusting the self-signed
/// certificate it generated there), sending the test's credentials.
pub(crate) fn mk_percolator_client(cert_dir: &Path) -> reqwest::Client {
    let ca = std::fs::read(cert_dir.join("apiserver.crt")).unwrap();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .default_headers(auth_headers())
        .build()
        .unwrap()
}

pub(crate) fn auth_headers() -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", format!("Bearer {TESTER_TOKEN}").parse().unwrap());
    headers
}

pub(crate) fn kubectl_bin() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| "/usr/bin/kubectl".to_string())
}

/// The repository: `CARGO_MANIFEST_DIR` at run time (cargo sets it), so that a compiled test
/// can be pointed at a copy of the tree (one holding an older Dockerfile, another `deny.toml`).
pub(crate) fn repo_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

/// The text of the repository's file `name` ([`repo_root`]); fails naming the path.
pub(crate) fn repo_read(name: &str) -> String {
    let path = repo_root().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The virtual environment of the Python test tools, as `scripts/install-deps.sh` makes it:
/// `$PERCOLATOR_VENV` (absolute, or relative to the repository) or `<repo>/.venv`.
pub(crate) fn venv() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    match std::env::var_os("PERCOLATOR_VENV") {
        Some(dir) if !dir.is_empty() => root.join(dir),
        _ => root.join(".venv"),
    }
}

/// `bin/NAME` of the [`venv`] (`python`, `kubernetes-validate`); panics saying how to make it
/// when it is missing.
pub(crate) fn venv_bin(name: &str) -> PathBuf {
    let bin = venv().join("bin").join(name);
    assert!(
        bin.exists(),
        "{} is missing: run scripts/install-deps.sh, which installs the Python test tools in a \
         virtual environment (<repo>/.venv, or $PERCOLATOR_VENV)",
        bin.display()
    );
    bin
}

/// The Python of the [`venv`], which has every Python test tool (`tests/python/*.py` run with
/// it).
pub(crate) fn python() -> PathBuf {
    venv_bin("python")
}

/// Parses a Quantity string to a float.
pub(crate) fn q(v: &Value) -> f64 {
    k8s_wire::quantity::parse(v.as_str().unwrap_or_else(|| panic!("not a quantity: {v}"))).unwrap()
}

/// Asserts `actual` is within `tolerance` (relative) of `expected`.
#[track_caller]
pub(crate) fn assert_close(actual: f64, expected: f64, tolerance: f64, what: &str) {
    let ok = if expected == 0.0 {
        actual.abs() < 1e-9
    } else {
        ((actual - expected) / expected).abs() <= tolerance
    };
    assert!(ok, "{what}: got {actual}, expected {expected} (±{}%)", tolerance * 100.0);
}

/// Asserts a cafe's `brewsPerMinute` and `failureRatio` Quantities are within 5% of the
/// simulator's truth `cafe`.
pub(crate) fn assert_cafe_rates(item: &Value, cafe: &Value, what: &str) {
    let rates = [("brewsPerMinute", "brews/min"), ("failureRatio", "failure ratio")];
    for (field, name) in rates {
        assert_close(q(&item[field]), cafe[field].as_f64().unwrap(), 0.05, &format!("{what} {name}"));
    }
}

/// Asserts the `cpu` and `memory` Quantities of `usage` are within the (cpu, memory)
/// tolerances of `truth`'s `cpuCores` and `memoryBytes`, as "`what` cpu" and "`what` memory".
pub(crate) fn assert_usage_close(usage: &Value, truth: &Value, (cpu, memory): (f64, f64), what: &str) {
    assert_close(q(&usage["cpu"]), truth["cpuCores"].as_f64().unwrap(), cpu, &format!("{what} cpu"));
    assert_close(
        q(&usage["memory"]),
        truth["memoryBytes"].as_f64().unwrap(),
        memory,
        &format!("{what} memory"),
    );
}

/// Splits kubectl's table output at the header's column starts (a header such as
/// `LAST BREWED` holds a space, and a cell may be empty).
pub(crate) fn table(out: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = out.lines().filter(|l| !l.trim().is_empty());
    let header = lines.next().unwrap_or_default();
    let bytes = header.as_bytes();
    let starts: Vec<usize> = (0..bytes.len())
        .filter(|&i| bytes[i] != b' ' && (i == 0 || (i >= 2 && bytes[i - 1] == b' ' && bytes[i - 2] == b' ')))
        .collect();
    let cut = |line: &str| -> Vec<String> {
        starts
            .iter()
            .enumerate()
            .map(|(n, &start)| {
                let end = starts.get(n + 1).copied().unwrap_or(line.len()).min(line.len());
                line.get(start.min(line.len())..end).unwrap_or("").trim().to_string()
            })
            .collect()
    };
    (cut(header), lines.map(cut).collect())
}

/// Writes `text` as a ConfigMap volume update does: a new data directory, then an atomic swap
/// of the `..data` symlink that `config.yaml` points through.
pub(crate) fn configmap_write(dir: &Path, generation: u32, text: &str) {
    let data = format!("..2026_{generation:02}");
    std::fs::create_dir_all(dir.join(&data)).unwrap();
    std::fs::write(dir.join(&data).join("config.yaml"), text).unwrap();
    let _ = std::fs::remove_file(dir.join("..data_tmp"));
    std::os::unix::fs::symlink(&data, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    if std::fs::symlink_metadata(dir.join("config.yaml")).is_err() {
        std::os::unix::fs::symlink("..data/config.yaml", dir.join("config.yaml")).unwrap();
    }
}

/// Upper bounds of the simulator's brew-duration buckets.
pub(crate) const BUCKETS: &[f64] = &[5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 50.0, 60.0];

/// Width of the histogram bucket holding `value`.
pub(crate) fn bucket_width(value: f64) -> f64 {
    let mut lower = 0.0;
    for &upper in BUCKETS {
        if value <= upper {
            return upper - lower;
        }
        lower = upper;
    }
    f64::INFINITY
}

/// The (namespace, name) of an object's metadata or of a simulator truth entry.
pub(crate) fn key(v: &Value) -> (String, String) {
    (v["namespace"].as_str().unwrap().to_string(), v["name"].as_str().unwrap().to_string())
}
