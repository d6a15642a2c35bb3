//! Delegated authentication and authorization against the simulator playing kube-apiserver:
//! front-proxy certificates with X-Remote-* headers, cluster client certificates, bearer
//! tokens through TokenReview, SubjectAccessReview decisions and their caching, CA rotation
//! through the watched ConfigMap, and secrets kept out of the logs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Env, Options};
use serde_json::Value;

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
    // certificate stops working and the new one works (chains are checked per request, so
    // even the old client's open connection is refused).
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
