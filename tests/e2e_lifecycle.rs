//! Lifecycle against the real binary over real TLS (RELIABILITY.md, "Lifecycle"): SIGTERM
//! fails `/readyz` first, keeps serving for `--shutdown-delay-duration`, drains the request in
//! flight and exits 0; `--request-timeout` answers a stuck request 504; a rotated serving
//! certificate (Secret-volume symlink swap) reaches new connections without a restart; a
//! panic in a handler is a 500 on a connection that keeps serving; and the generic server's
//! flags read their `PERCOLATOR_<FLAG>` environment variables, which the binary names.
//!
//! Each test runs its own `percolator-sim` (the cluster) and a fake Prometheus whose answers
//! take a chosen time, so "a slow request" is deterministic. Figures are printed
//! (`cargo test --test e2e_lifecycle -- --nocapture`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::devenv::FakePrometheus;
use common::{START_TIMEOUT, launch, mk_dir, mk_sim, percolator_command, procfs, serving_pair};
use serde_json::Value;
use tokio::process::Child;

const GV: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1";
const TOKEN: &str = "tester-token";

/// A Prometheus whose every answer (an empty vector) takes `delay`; stops when dropped.
async fn mk_prometheus(delay: Duration) -> FakePrometheus {
    FakePrometheus::start(delay).await.unwrap()
}

/// The simulated cluster; returns its kubeconfig.
async fn start_sim(dir: &Path) -> (Child, PathBuf) {
    let mut command = percolator_sim::command(dir).unwrap();
    command
        .args(["--seed", "7", "--nodes", "2", "--pods-per-node", "4", "--namespaces", "shop,default"])
        .args(["--housekeeping", "2s"]);
    let (sim, _) = mk_sim(command).await;
    (sim, dir.join("sim/kubeconfig"))
}

/// A running `percolator` with its log lines.
struct Server {
    child: Child,
    url: String,
    logs: Arc<Mutex<Vec<String>>>,
    _sim: Child,
}

impl Server {
    async fn start(dir: &Path, prometheus_url: &str, extra: &[&str]) -> Server {
        Self::start_with_env(dir, prometheus_url, extra, &[]).await
    }

    async fn start_with_env(
        dir: &Path,
        prometheus_url: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Server {
        apiserver::install_crypto_provider();
        let (sim, kubeconfig) = start_sim(dir).await;
        let mut command = percolator_command(0, &kubeconfig, prometheus_url);
        command
            .envs(env.iter().copied())
            .args(["-v", "4", "--cert-dir"])
            .arg(dir.join("certs"))
            .args(["--prometheus-timeout", "20s", "--cache-ttl", "1s"])
            .args(extra);
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let started = launch::start(command, "percolator", START_TIMEOUT, move |line| {
            sink.lock().unwrap().push(line.to_owned());
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let server = Server { url: started.url(), child: started.child, logs, _sim: sim };
        server
            .wait_ready(&server.client_trusting(&std::fs::read(dir.join("certs/apiserver.crt")).ok()))
            .await;
        server
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    fn client_trusting(&self, ca: &Option<Vec<u8>>) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        let mut builder = reqwest::Client::builder().default_headers(headers);
        match ca {
            Some(ca) => builder = builder.add_root_certificate(reqwest::Certificate::from_pem(ca).unwrap()),
            None => builder = builder.danger_accept_invalid_certs(true),
        }
        builder.build().unwrap()
    }

    async fn wait_ready(&self, client: &reqwest::Client) {
        let ready = launch::wait_ready(client, &self.url, Duration::from_secs(30)).await;
        assert!(ready, "never ready: {}", self.logs.lock().unwrap().join("\n"));
    }

    fn logged(&self, message: &str) -> bool {
        self.logs.lock().unwrap().iter().any(|l| l.contains(message))
    }
}

fn signal(pid: u32, name: &str) {
    let status =
        std::process::Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status().unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_fails_readiness_then_drains_in_flight_requests_and_exits_0() {
    let dir = mk_dir("sigterm");
    let prometheus = mk_prometheus(Duration::from_secs(3)).await;
    let mut server = Server::start(&dir, &prometheus.url(), &["--shutdown-delay-duration", "1s"]).await;
    let client = server.client_trusting(&Some(std::fs::read(dir.join("certs/apiserver.crt")).unwrap()));

    // A list that takes about 3 s (every PromQL query does), started before the signal.
    let in_flight = {
        let client = client.clone();
        let url = format!("{}{GV}/namespaces/shop/podmetricssummaries", server.url);
        tokio::spawn(async move {
            let response = client.get(url).send().await.unwrap();
            let status = response.status().as_u16();
            let body = response.text().await.unwrap();
            (status, body, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sigterm = Instant::now();
    signal(server.pid(), "TERM");

    // Readiness fails first, while everything else is still served, also on new connections.
    let not_ready = loop {
        let r = client.get(format!("{}/readyz?verbose", server.url)).send().await.unwrap();
        if r.status() == 500 {
            let body = r.text().await.unwrap();
            assert!(body.contains("[-]shutdown failed: reason withheld"), "{body}");
            break sigterm.elapsed();
        }
        assert!(sigterm.elapsed() < Duration::from_secs(1), "readyz still 200 after 1s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let fresh = server.client_trusting(&Some(std::fs::read(dir.join("certs/apiserver.crt")).unwrap()));
    let r = fresh.get(format!("{}{GV}", server.url)).send().await.unwrap();
    assert_eq!(r.status(), 200, "discovery is served during the shutdown delay");
    let r = fresh.get(format!("{}/livez", server.url)).send().await.unwrap();
    assert_eq!(r.status(), 200, "livez stays ok: the process must not be restarted");

    // The request in flight completes normally, after the listener closed.
    let (status, body, done) = in_flight.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let list: Value = serde_json::from_str(&body).unwrap();
    assert!(!list["items"].as_array().unwrap().is_empty(), "{body}");
    let completed = done.duration_since(sigterm);
    assert!(completed > Duration::from_secs(1), "completed during the drain, after the delay: {completed:?}");

    let exit = tokio::time::timeout(Duration::from_secs(30), server.child.wait()).await.unwrap().unwrap();
    let exited = sigterm.elapsed();
    assert!(exit.success(), "exit status {exit:?}");
    assert_eq!(exit.code(), Some(0));
    assert!(server.logged("listener closed, draining open connections"));
    let refused = fresh.get(format!("{}/livez", server.url)).send().await;
    assert!(refused.is_err(), "nothing listens after exit");
    println!(
        "\nSIGTERM: readyz 500 after {not_ready:.1?}; in-flight list 200 after {completed:.2?}; exit 0 after {exited:.2?} (--shutdown-delay-duration 1s, list ~3s)\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stuck_request_is_answered_504_at_the_request_timeout() {
    let dir = mk_dir("timeout");
    let prometheus = mk_prometheus(Duration::from_secs(15)).await;
    let server = Server::start(&dir, &prometheus.url(), &["--request-timeout", "2s"]).await;
    let client = server.client_trusting(&Some(std::fs::read(dir.join("certs/apiserver.crt")).unwrap()));
    let start = Instant::now();
    let stuck = {
        let client = client.clone();
        let url = format!("{}{GV}/namespaces/shop/podmetricssummaries", server.url);
        tokio::spawn(async move {
            let r = client.get(url).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap(), Instant::now())
        })
    };
    // Meanwhile discovery answers at once.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let r = client.get(format!("{}{GV}", server.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let discovery = t.elapsed();
    let (status, body, done) = stuck.await.unwrap();
    let took = done.duration_since(start);
    assert_eq!(status, 504, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "Status");
    assert_eq!(v["reason"], "Timeout");
    assert_eq!(
        v["message"],
        "Timeout: request did not complete within requested timeout - context deadline exceeded"
    );
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(4), "{took:?}");
    // kubectl's --request-timeout sends ?timeout=, which shortens the deadline.
    let t = Instant::now();
    let r = client.get(format!("{}{GV}/cafebrewstats?timeout=1s", server.url)).send().await.unwrap();
    assert_eq!(r.status(), 504);
    let short = t.elapsed();
    assert!(short < Duration::from_secs(2), "{short:?}");
    println!(
        "\n--request-timeout 2s, Prometheus answering in 15s: list 504 after {took:.2?}; ?timeout=1s 504 after {short:.2?}; discovery meanwhile {discovery:.1?}\n"
    );
}

/// A serving pair for 127.0.0.1 signed by a CA of its own; returns the CA's PEM.
fn write_pair(dir: &Path) -> String {
    String::from_utf8(serving_pair(dir).pem).unwrap()
}

/// Points `<secret>/..data` at `version` atomically, as the kubelet updates a Secret volume.
fn swap_data(secret: &Path, version: &str) {
    let tmp = secret.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, secret.join("..data")).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_serving_certificate_reaches_new_connections_without_restart() {
    let dir = mk_dir("rotate");
    let secret = dir.join("secret");
    let first = write_pair(&secret.join("..2026_11_30_v1"));
    let second = write_pair(&secret.join("..2026_11_30_v2"));
    swap_data(&secret, "..2026_11_30_v1");
    std::os::unix::fs::symlink("..data/tls.crt", secret.join("tls.crt")).unwrap();
    std::os::unix::fs::symlink("..data/tls.key", secret.join("tls.key")).unwrap();

    let prometheus = mk_prometheus(Duration::ZERO).await;
    let crt = secret.join("tls.crt");
    let key = secret.join("tls.key");
    let args = [
        "--tls-cert-file",
        crt.to_str().unwrap(),
        "--tls-private-key-file",
        key.to_str().unwrap(),
        "--tls-reload-interval",
        "1s",
    ];
    let server = Server::start(&dir, &prometheus.url(), &args).await;
    let trusts_first = server.client_trusting(&Some(first.clone().into_bytes()));
    let healthz = format!("{}/healthz", server.url);
    assert_eq!(trusts_first.get(&healthz).send().await.unwrap().status(), 200);
    let trusts_second = server.client_trusting(&Some(second.clone().into_bytes()));
    assert!(trusts_second.get(&healthz).send().await.is_err(), "the second certificate is not served yet");

    let pid = server.pid();
    swap_data(&secret, "..2026_11_30_v2");
    let swapped = Instant::now();
    let picked_up = loop {
        // A new client, so a new connection and a new handshake.
        let client = server.client_trusting(&Some(second.clone().into_bytes()));
        if client.get(&healthz).send().await.is_ok_and(|r| r.status() == 200) {
            break swapped.elapsed();
        }
        assert!(swapped.elapsed() < Duration::from_secs(60), "new certificate not served within a minute");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(server.pid(), pid, "no restart");
    assert!(server.logged("serving certificate reloaded"));
    let fresh_first = server.client_trusting(&Some(first.clone().into_bytes()));
    assert!(fresh_first.get(&healthz).send().await.is_err(), "new connections no longer get the old one");
    // The connection opened before the swap keeps working.
    assert_eq!(trusts_first.get(&healthz).send().await.unwrap().status(), 200);

    // A broken update (key of another certificate) is refused; the last good pair stays.
    let third = secret.join("..2026_11_30_v3");
    write_pair(&third);
    std::fs::copy(secret.join("..2026_11_30_v1/tls.key"), third.join("tls.key")).unwrap();
    swap_data(&secret, "..2026_11_30_v3");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.logged("serving certificate not reloaded") {
        assert!(Instant::now() < deadline, "the broken pair was not reported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = server.client_trusting(&Some(second.into_bytes()));
    assert_eq!(client.get(&healthz).send().await.unwrap().status(), 200);
    println!(
        "\ncertificate rotation (--tls-reload-interval 1s): new connections got the new certificate {picked_up:.2?} after the symlink swap\n"
    );
}

// ---- a panicking handler, served over real TLS by the real accept loop ----

mod panicking {
    use std::sync::Arc;

    use futures::future::BoxFuture;
    use percolator::testing::{Column, ComputeError, KindInfo, Listing, ServedKind, Text, Texts};

    pub(crate) static INFO: KindInfo = KindInfo {
        gv: percolator::testing::STATS,
        plural: Text::Borrowed("bombs"),
        singular: Text::Borrowed("bomb"),
        kind: Text::Borrowed("Bomb"),
        list_kind: Text::Borrowed("BombList"),
        short_names: Texts::Borrowed(&[]),
        categories: Texts::Borrowed(&[]),
        namespaced: true,
        description: Text::Borrowed("Bomb panics while its list is rendered."),
        typed_list_items: true,
    };

    /// Computes fine; panics when the handler asks for its columns to render the answer, i.e.
    /// outside the kind computation (which has its own catch).
    pub(crate) struct Bomb;

    impl ServedKind for Bomb {
        fn info(&self) -> &KindInfo {
            &INFO
        }
        fn columns(&self) -> &[Column] {
            panic!("bomb: rendering panics")
        }
        fn schemas(&self) -> Vec<(String, serde_json::Value)> {
            vec![("cafe.une-tasse-de.stats.v1alpha1.Bomb".to_owned(), serde_json::json!({"type": "object"}))]
        }
        fn list<'a>(&'a self, _: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
            Box::pin(async { Ok(Arc::new(Listing::default())) })
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_handler_is_a_500_and_the_server_keeps_serving() {
    use clap::Parser;
    apiserver::install_crypto_provider();
    let dir = mk_dir("panic");
    let args = percolator::config::Args::parse_from(["percolator", "--cert-dir", dir.to_str().unwrap()]);
    let tls = apiserver::server_config(&args.serving, None).unwrap();
    let kinds: percolator::testing::Kinds = vec![Arc::new(panicking::Bomb)];
    let state = percolator::testing::ApiState::new(
        kinds,
        Arc::new(|| true),
        apiserver::Metrics::new(percolator::METRICS_NAMESPACE),
    );
    let app = percolator::testing::router(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(percolator::testing::serve(listener, tls, app, 1000, async {
        let _ = stopped.await;
    }));
    let ca = std::fs::read(dir.join("apiserver.crt")).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    for _ in 0..20 {
        let r = client.get(format!("{url}{GV}/namespaces/a/bombs")).send().await.unwrap();
        assert_eq!(r.status(), 500);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["reason"], "InternalError");
        assert!(!v.to_string().contains("bomb"), "the panic message stays in the log: {v}");
        // Same connection, next request.
        assert_eq!(client.get(format!("{url}/healthz")).send().await.unwrap().status(), 200);
    }
    let fresh = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .http1_only()
        .build()
        .unwrap();
    assert_eq!(fresh.get(format!("{url}{GV}/namespaces/a/bombs")).send().await.unwrap().status(), 500);
    assert_eq!(fresh.get(format!("{url}/readyz")).send().await.unwrap().status(), 200);
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(30), server).await.unwrap().unwrap();
}

/// The generic server's flags (the `apiserver` crate's, which names no variable) read the
/// `PERCOLATOR_<FLAG>` variables the binary gives them: the value shows in `--help` and is
/// parsed, and checked, as the flag's.
#[test]
fn an_apiserver_flag_reads_its_percolator_environment_variable() {
    let run = |vars: &[(&str, &str)], args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_percolator"))
            .args(args)
            .env_remove("PERCOLATOR_SECURE_PORT")
            .env_remove("PERCOLATOR_TLS_MIN_VERSION")
            .envs(vars.iter().copied())
            .output()
            .unwrap()
    };
    let help = run(&[("PERCOLATOR_SECURE_PORT", "12345")], &["--help"]);
    assert!(help.status.success(), "{help:?}");
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("[env: PERCOLATOR_SECURE_PORT=12345]"), "{text}");
    assert!(text.contains("[env: PERCOLATOR_TLS_MIN_VERSION=]"), "{text}");

    let refused = run(&[("PERCOLATOR_TLS_MIN_VERSION", "VersionTLS10")], &[]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let text = String::from_utf8_lossy(&refused.stderr);
    assert!(text.contains("invalid value 'VersionTLS10' for '--tls-min-version"), "{text}");
}

/// `THP_enabled` of the process in /proc (0 once `prctl(PR_SET_THP_DISABLE)` is set).
fn thp_enabled(pid: u32) -> String {
    procfs::status(pid, "THP_enabled").unwrap_or_else(|| panic!("no THP_enabled in /proc/{pid}/status"))
}

#[tokio::test(flavor = "multi_thread")]
async fn transparent_huge_pages_are_off_unless_mimalloc_is_told() {
    let prometheus = mk_prometheus(Duration::ZERO).await;
    let server = Server::start(&mk_dir("thp-off"), &prometheus.url(), &[]).await;
    assert_eq!(thp_enabled(server.pid()), "0", "huge pages off for percolator's heap");
    assert_eq!(
        thp_enabled(std::process::id()),
        "1",
        "this test process keeps them: the flag is percolator's own"
    );
    let told =
        Server::start_with_env(&mk_dir("thp-told"), &prometheus.url(), &[], &[("MIMALLOC_ALLOW_THP", "1")])
            .await;
    assert_eq!(thp_enabled(told.pid()), "1", "MIMALLOC_ALLOW_THP decides when set");
}
