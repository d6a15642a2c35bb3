//! Delegated authentication and authorization against the simulator playing kube-apiserver:
//! front-proxy certificates with X-Remote-* headers, cluster client certificates, bearer
//! tokens through TokenReview, SubjectAccessReview decisions and their caching, CA rotation
//! through the watched ConfigMap and through the watched CA files given as flags
//! (`--client-ca-file`, `--requestheader-client-ca-file`, `--kubelet-certificate-authority`),
//! the selectors SubjectAccessReviews carry, and secrets kept out of the logs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Env, Options};
use serde_json::Value;
use test_support::{MkCa, mk_ca, mk_leaf};

const GV: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1";

/// A client presenting the certificate `name` (a path under the simulator's state dir).
fn client_with_cert(env: &Env, name: &str) -> reqwest::Client {
    let state = env.dir.join("sim");
    let mut pem = std::fs::read(state.join(format!("{name}.crt"))).unwrap();
    pem.extend(std::fs::read(state.join(format!("{name}.key"))).unwrap());
    let ca = std::fs::read(env.dir.join("certs/apiserver.crt")).unwrap();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .build()
        .unwrap()
}

async fn call(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.send().await.unwrap();
    let code = response.status().as_u16();
    let body = response.text().await.unwrap();
    (code, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

#[track_caller]
fn assert_status(got: &(u16, Value), code: u16, reason: &str, message: &str) {
    assert_eq!(got.0, code, "{}", got.1);
    assert_eq!(got.1["kind"], "Status", "{}", got.1);
    assert_eq!(got.1["reason"], reason, "{}", got.1);
    assert_eq!(got.1["message"], message, "{}", got.1);
}

async fn sars(env: &Env) -> u64 {
    env.sim_stats().await["apiRequests"]["create subjectaccessreviews"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_credential_is_verified_and_every_request_authorized() {
    let env = Env::start("authn", Options { scrape_percolator: false, ..Options::default() }).await;
    let shop = format!("{}{GV}/namespaces/shop/podmetricssummaries", env.url);
    let api = format!("{}{GV}/namespaces/api/podmetricssummaries", env.url);
    let all = format!("{}{GV}/podmetricssummaries", env.url);

    // Allowed: front-proxy certificate + X-Remote-* headers, as kube-apiserver proxies.
    let front_proxy = client_with_cert(&env, "front-proxy-client");
    let got = call(
        front_proxy
            .get(&all)
            .header("X-Remote-User", "dora")
            .header("X-Remote-Group", "viewers")
            .header("X-Remote-Group", "qa")
            .header("X-Remote-Extra-Acme.com%2fproject", "coffee"),
    )
    .await;
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(got.1["kind"], "PodMetricsSummaryList");
    // The same headers without the group the policy allows are refused for that user.
    let got = call(front_proxy.get(&shop).header("X-Remote-User", "dora")).await;
    assert_status(
        &got,
        403,
        "Forbidden",
        "podmetricssummaries.stats.une-tasse-de.cafe is forbidden: User \"dora\" cannot list resource \"podmetricssummaries\" in API group \"stats.une-tasse-de.cafe\" in the namespace \"shop\"",
    );
    // The aggregator's availability probe: system:masters passes without a SubjectAccessReview.
    let before = sars(&env).await;
    let got = call(
        front_proxy
            .get(format!("{}{GV}", env.url))
            .header("X-Remote-User", "system:kube-aggregator")
            .header("X-Remote-Group", "system:masters"),
    )
    .await;
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(sars(&env).await, before, "system:masters needs no SubjectAccessReview");

    // Allowed: a bearer token (TokenReview), and a cluster client certificate (CN, O groups).
    let got = call(env.client_as(Some("carol-token")).get(&all)).await;
    assert_eq!(got.0, 200, "{}", got.1);
    let got = call(client_with_cert(&env, "users/carol").get(&all)).await;
    assert_eq!(got.0, 200, "{}", got.1);
    let got = call(env.client_as(Some("alice-token")).get(&shop)).await;
    assert_eq!(got.0, 200, "{}", got.1);
    let got = call(client_with_cert(&env, "users/alice").get(&shop)).await;
    assert_eq!(got.0, 200, "{}", got.1);

    // Allowed: kubectl with a token kubeconfig.
    let out = env.kubectl_ok(&["get", "pms", "-n", "shop", "-o", "name"]);
    assert!(out.lines().count() >= 3, "{out}");

    // Denied: no credentials → anonymous → 403.
    let anonymous = env.client_as(None);
    let got = call(anonymous.get(&shop)).await;
    assert_status(
        &got,
        403,
        "Forbidden",
        "podmetricssummaries.stats.une-tasse-de.cafe is forbidden: User \"system:anonymous\" cannot list resource \"podmetricssummaries\" in API group \"stats.une-tasse-de.cafe\" in the namespace \"shop\"",
    );
    // Health stays open to anyone.
    assert_eq!(anonymous.get(format!("{}/readyz", env.url)).send().await.unwrap().status(), 200);
    assert_eq!(anonymous.get(format!("{}/livez", env.url)).send().await.unwrap().status(), 200);
    // Denied: X-Remote-User without a client certificate is ignored (still anonymous).
    let got = call(
        anonymous.get(&shop).header("X-Remote-User", "admin").header("X-Remote-Group", "system:masters"),
    )
    .await;
    assert_eq!(got.0, 403, "{}", got.1);
    assert!(got.1["message"].as_str().unwrap().contains("User \"system:anonymous\""), "{}", got.1);
    // Denied: certificates from another CA, with a CN outside the allowed names, expired, or
    // without the clientAuth usage: 401.
    for bad in [
        "bad/other-ca-client",
        "bad/wrong-cn-front-proxy",
        "bad/expired-front-proxy",
        "bad/server-eku-front-proxy",
    ] {
        let got = call(
            client_with_cert(&env, bad)
                .get(&shop)
                .header("X-Remote-User", "admin")
                .header("X-Remote-Group", "system:masters"),
        )
        .await;
        assert_status(&got, 401, "Unauthorized", "Unauthorized");
    }
    // Denied: an unknown token is 401; a known user without rights is 403.
    let got = call(env.client_as(Some("not-a-token")).get(&shop)).await;
    assert_status(&got, 401, "Unauthorized", "Unauthorized");
    let out = std::process::Command::new(common::kubectl_bin())
        .args(["--server", &env.url, "--certificate-authority"])
        .arg(env.dir.join("certs/apiserver.crt"))
        .args(["--token", "not-a-token", "--cache-dir"])
        .arg(env.dir.join("kube-cache-bad"))
        .args(["get", "--raw", &format!("{GV}/namespaces/shop/podmetricssummaries")])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "error: You must be logged in to the server (Unauthorized)"
    );
    let got = call(env.client_as(Some("bob-token")).get(&shop)).await;
    assert_status(
        &got,
        403,
        "Forbidden",
        "podmetricssummaries.stats.une-tasse-de.cafe is forbidden: User \"bob\" cannot list resource \"podmetricssummaries\" in API group \"stats.une-tasse-de.cafe\" in the namespace \"shop\"",
    );
    let pod = env.truth().await["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["namespace"] == "shop" && p["phase"] == "Running")
        .unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    let got = call(env.client_as(Some("bob-token")).get(format!("{shop}/{pod}"))).await;
    assert_status(
        &got,
        403,
        "Forbidden",
        &format!(
            "podmetricssummaries.stats.une-tasse-de.cafe \"{pod}\" is forbidden: User \"bob\" cannot get resource \"podmetricssummaries\" in API group \"stats.une-tasse-de.cafe\" in the namespace \"shop\""
        ),
    );
    // Denied: alice may read shop only, not another namespace nor all of them.
    let alice = env.client_as(Some("alice-token"));
    let got = call(alice.get(&api)).await;
    assert_status(
        &got,
        403,
        "Forbidden",
        "podmetricssummaries.stats.une-tasse-de.cafe is forbidden: User \"alice\" cannot list resource \"podmetricssummaries\" in API group \"stats.une-tasse-de.cafe\" in the namespace \"api\"",
    );
    let got = call(alice.get(&all)).await;
    assert_status(
        &got,
        403,
        "Forbidden",
        "podmetricssummaries.stats.une-tasse-de.cafe is forbidden: User \"alice\" cannot list resource \"podmetricssummaries\" in API group \"stats.une-tasse-de.cafe\" at the cluster scope",
    );
    let got = call(alice.get(format!("{}/metrics", env.url))).await;
    assert_status(&got, 403, "Forbidden", "forbidden: User \"alice\" cannot get path \"/metrics\"");

    // No token or certificate material in the logs.
    let log = std::fs::read_to_string(&env.stderr_log).unwrap();
    let sa_token = std::fs::read_to_string(env.dir.join("sim/token")).unwrap();
    for secret in [
        "alice-token",
        "carol-token",
        "bob-token",
        "tester-token",
        "not-a-token",
        sa_token.trim(),
        "BEGIN CERTIFICATE",
        "PRIVATE KEY",
    ] {
        assert!(!log.contains(secret), "the log contains {secret:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn decisions_are_cached_and_expire_and_rotated_cas_apply_without_restart() {
    let env = Env::start(
        "authz-cache",
        Options {
            extra_args: vec![
                "--authorization-webhook-cache-authorized-ttl=3s".into(),
                "--authorization-webhook-cache-unauthorized-ttl=3s".into(),
            ],
            scrape_percolator: false,
            ..Options::default()
        },
    )
    .await;
    let shop = format!("{}{GV}/namespaces/shop/podmetricssummaries", env.url);

    // Allowed decisions: one SubjectAccessReview for many identical requests, then expiry.
    let carol = env.client_as(Some("carol-token"));
    let before = sars(&env).await;
    for _ in 0..10 {
        assert_eq!(carol.get(&shop).send().await.unwrap().status(), 200);
    }
    assert_eq!(sars(&env).await - before, 1, "allowed decisions are cached");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(carol.get(&shop).send().await.unwrap().status(), 200);
    assert_eq!(sars(&env).await - before, 2, "allowed decisions expire");

    // Denied decisions are cached on their own.
    let bob = env.client_as(Some("bob-token"));
    let before = sars(&env).await;
    for _ in 0..10 {
        assert_eq!(bob.get(&shop).send().await.unwrap().status(), 403);
    }
    assert_eq!(sars(&env).await - before, 1, "denied decisions are cached");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(bob.get(&shop).send().await.unwrap().status(), 403);
    assert_eq!(sars(&env).await - before, 2, "denied decisions expire: {}", env.sim_stats().await);

    // A rotated front-proxy CA in the ConfigMap is honoured without restart: the old client
    // certificate stops working and the new one works (a connection's chain is verified
    // again when the CAs change, so even the old client's open connection is refused).
    let as_aggregator = |client: &reqwest::Client| {
        client.get(&shop).header("X-Remote-User", "dora").header("X-Remote-Group", "viewers").send()
    };
    let old = client_with_cert(&env, "front-proxy-client");
    assert_eq!(as_aggregator(&old).await.unwrap().status(), 200);
    let rotated =
        env.client.post(format!("{}/sim/rotate-front-proxy-ca", env.sim_metrics)).send().await.unwrap();
    assert!(rotated.status().is_success());
    let new = client_with_cert(&env, "front-proxy-client");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let old_status = as_aggregator(&old).await.unwrap().status().as_u16();
        let new_status = as_aggregator(&new).await.unwrap().status().as_u16();
        if old_status == 401 && new_status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "rotation not honoured: old {old_status}, new {new_status}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

// ------------------------------------------------------------------ CA files given as flags

/// A client trusting percolator's serving certificate that presents a clientAuth certificate
/// with CN `cn` and O `org` (when given) signed by `ca` (a CA minted by the test: the
/// simulator's are made after percolator's flags are fixed).
fn mk_client_of(env: &Env, ca: &MkCa, cn: &str, org: Option<&str>) -> reqwest::Client {
    let orgs: Vec<&str> = org.into_iter().collect();
    let leaf = mk_leaf(ca, cn, &orgs, rcgen::ExtendedKeyUsagePurpose::ClientAuth, false);
    let identity = format!("{}{}", leaf.pem, leaf.key_pem);
    let serving_ca = std::fs::read(env.dir.join("certs/apiserver.crt")).unwrap();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&serving_ca).unwrap())
        .identity(reqwest::Identity::from_pem(identity.as_bytes()).unwrap())
        .build()
        .unwrap()
}

/// Replaces `path` in one step (write beside, rename), as an editor or a volume update does.
fn replace_file(path: &std::path::Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// percolator's log lines (JSON) whose message is `message`, as `fields` objects.
fn log_lines(env: &Env, message: &str) -> Vec<Value> {
    std::fs::read_to_string(&env.stderr_log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["message"] == message)
        .map(|v| v["fields"].clone())
        .collect()
}

/// Polls `check` every 300 ms until it returns true, for at most `seconds`.
async fn eventually<F: std::future::Future<Output = bool>>(
    seconds: u64,
    what: &str,
    mut check: impl FnMut() -> F,
) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ca_files_given_as_flags_are_watched() {
    let files = common::mk_dir("ca-files");
    let (client_1, client_2) = (mk_ca("client-ca-1"), mk_ca("client-ca-2"));
    let (proxy_1, proxy_2) = (mk_ca("front-proxy-ca-1"), mk_ca("front-proxy-ca-2"));
    // The client CA as a Secret volume mounts it (rotated by a `..data` symlink swap); the
    // front proxy CA and the kubelet CA as plain files, replaced. The kubelet CA starts as
    // one that did not sign the simulator's kubelets.
    let volume = files.join("client-ca");
    std::fs::create_dir_all(&volume).unwrap();
    test_support::volume_swap(&volume, "..2026_01", &client_1.pem);
    let proxy_file = files.join("front-proxy-ca.crt");
    replace_file(&proxy_file, &proxy_1.pem);
    let kubelet_file = files.join("kubelet-ca.crt");
    replace_file(&kubelet_file, &mk_ca("not-the-kubelets-ca").pem);
    let mut env = Env::start(
        "ca-files",
        Options {
            extra_args: vec![
                format!("--client-ca-file={}", volume.join("ca.crt").display()),
                format!("--requestheader-client-ca-file={}", proxy_file.display()),
                "--requestheader-allowed-names=front-proxy-client".into(),
                format!("--kubelet-certificate-authority={}", kubelet_file.display()),
                "--tls-reload-interval=1s".into(),
            ],
            scrape_percolator: false,
            ..Options::default()
        },
    )
    .await;
    let all = format!("{}{GV}/podmetricssummaries", env.url);

    // Client certificates (carol, group viewers) and the front proxy (dora, group viewers)
    // under each CA; open connections are kept across the rotation.
    let carol_1 = mk_client_of(&env, &client_1, "carol", Some("viewers"));
    let carol_2 = mk_client_of(&env, &client_2, "carol", Some("viewers"));
    let front_1 = mk_client_of(&env, &proxy_1, "front-proxy-client", None);
    let front_2 = mk_client_of(&env, &proxy_2, "front-proxy-client", None);
    let statuses = || async {
        let mut codes = Vec::new();
        for client in [&carol_1, &carol_2] {
            codes.push(client.get(&all).send().await.unwrap().status().as_u16());
        }
        for client in [&front_1, &front_2] {
            let request =
                client.get(&all).header("X-Remote-User", "dora").header("X-Remote-Group", "viewers");
            codes.push(request.send().await.unwrap().status().as_u16());
        }
        codes
    };
    assert_eq!(statuses().await, [200, 401, 200, 401]);

    // Rotation: CA 2 only, in both files.
    test_support::volume_swap(&volume, "..2026_02", &client_2.pem);
    replace_file(&proxy_file, &proxy_2.pem);
    eventually(10, "the rotated CA files were not applied", || async {
        statuses().await == [401, 200, 401, 200]
    })
    .await;
    let reloaded = log_lines(&env, "CA file reloaded");
    for (flag, path) in
        [("--client-ca-file", volume.join("ca.crt")), ("--requestheader-client-ca-file", proxy_file.clone())]
    {
        let expected = serde_json::json!({
            "message": "CA file reloaded", "flag": flag, "path": path.display().to_string(), "certificates": 1
        });
        assert!(reloaded.contains(&expected), "{flag}: {reloaded:?}");
    }

    // A file that becomes unusable is logged, naming the flag and the file; the last good
    // bundle stays in force.
    replace_file(&proxy_file, "not a certificate\n");
    let rejected = serde_json::json!({
        "message": "CA file not reloaded; the previous certificates stay in force",
        "flag": "--requestheader-client-ca-file",
        "path": proxy_file.display().to_string(),
        "error": format!("--requestheader-client-ca-file {}: no CERTIFICATE block found", proxy_file.display()),
    });
    eventually(10, "the unusable file was not reported", || {
        let found = log_lines(&env, "CA file not reloaded; the previous certificates stay in force")
            .contains(&rejected);
        async move { found }
    })
    .await;
    assert_eq!(statuses().await, [401, 200, 401, 200]);

    // The kubelet CA: nothing reached a kubelet while the file held another CA; once it holds
    // the simulator's, the next connections verify and the pods get their usage.
    assert_eq!(common::kubelet_fetches(&env.sim_stats().await), 0);
    let response =
        env.client.get(format!("{}{GV}/namespaces/shop/podmetricssummaries", env.url)).send().await.unwrap();
    let warnings: Vec<String> =
        response.headers().get_all("warning").iter().map(|w| w.to_str().unwrap().to_owned()).collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("cpu and memory omitted for pods on")
                && w.contains("invalid peer certificate")),
        "{warnings:?}"
    );
    replace_file(&kubelet_file, &std::fs::read_to_string(env.dir.join("sim/ca.crt")).unwrap());
    let shop = format!("{}{GV}/namespaces/shop/podmetricssummaries", env.url);
    eventually(15, "the rotated kubelet CA was not applied", || async {
        // Each request needs the kubelets (the failures are not cached).
        env.client.get(&shop).send().await.unwrap();
        common::kubelet_fetches(&env.sim_stats().await) > 0
    })
    .await;
    env.wait_for_cpu(Some("shop")).await;
    let reloaded = log_lines(&env, "CA file reloaded");
    let expected = serde_json::json!({
        "message": "CA file reloaded", "flag": "--kubelet-certificate-authority",
        "path": kubelet_file.display().to_string(), "certificates": 1
    });
    assert!(reloaded.contains(&expected), "{reloaded:?}");

    // All of it without a restart, and without certificate material in the log.
    assert!(env.percolator_alive());
    assert_eq!(log_lines(&env, "serving").len(), 1);
    let log = std::fs::read_to_string(&env.stderr_log).unwrap();
    assert!(!log.contains("BEGIN CERTIFICATE"));
    let _ = std::fs::remove_dir_all(&files);
}

// ------------------------------------------------------------------ selectors in reviews

#[tokio::test(flavor = "multi_thread")]
async fn subject_access_reviews_carry_the_selectors() {
    let env = Env::start("sar-selectors", Options { scrape_percolator: false, ..Options::default() }).await;
    let reviews = || async { env.sim_stats().await["subjectAccessReviews"].as_array().unwrap().clone() };
    let before = reviews().await.len();

    let out = env.kubectl(&[
        "get",
        "pms",
        "-n",
        "shop",
        "-l",
        "app=x,tier!=y",
        "--field-selector",
        "metadata.name=z",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "No resources found in shop namespace.");
    let expected = serde_json::json!({
        "namespace": "shop", "verb": "list", "group": "stats.une-tasse-de.cafe", "version": "v1alpha1",
        "resource": "podmetricssummaries", "name": "z",
        "labelSelector": {"requirements": [
            {"key": "app", "operator": "In", "values": ["x"]},
            {"key": "tier", "operator": "NotIn", "values": ["y"]}
        ]},
        "fieldSelector": {"requirements": [{"key": "metadata.name", "operator": "In", "values": ["z"]}]}
    });
    let sent = reviews().await;
    let lists: Vec<&Value> =
        sent[before..].iter().filter(|spec| spec["resourceAttributes"]["verb"] == "list").collect();
    assert_eq!(lists.len(), 1, "{sent:?}");
    assert_eq!(lists[0]["resourceAttributes"], expected);
    assert_eq!(lists[0]["user"], "tester");

    // Another spelling of the same selectors sends the same review: the cached decision
    // answers. Another value is another review. (The simulator's policy, like a cluster
    // before 1.31, decides without the selectors.)
    let list = format!("{}{GV}/namespaces/shop/podmetricssummaries", env.url);
    let count = sent.len();
    let query = [("labelSelector", "tier notin (y),app==x"), ("fieldSelector", "metadata.name==z")];
    let response = env.client.get(&list).query(&query).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(reviews().await.len(), count, "the same review is not sent twice");
    let response = env.client.get(&list).query(&[("labelSelector", "app in (x,w)")]).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let sent = reviews().await;
    assert_eq!(sent.len(), count + 1);
    assert_eq!(
        sent[count]["resourceAttributes"],
        serde_json::json!({
            "namespace": "shop", "verb": "list", "group": "stats.une-tasse-de.cafe", "version": "v1alpha1",
            "resource": "podmetricssummaries",
            "labelSelector": {"requirements": [{"key": "app", "operator": "In", "values": ["w", "x"]}]}
        })
    );
}
