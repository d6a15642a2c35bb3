//! The simulated workload: nodes, pods, containers and their (constant) usage rates,
//! generated deterministically from the seed.
//!
//! Every counter the simulator exports is linear in time: `value(t) = rate × (t − o)` with
//! `o = max(origin, start of the container or pod)`, where `origin` is one hour before the
//! simulator started. Pods of the initial workload all started before `origin`, so for them
//! `o = origin`; replacement pods created by churn count from their own start.
//!
//! Which pods are special is decided by the pod's index, not by chance, so even the
//! default 3 × 4 cluster contains every kind (Pending, Succeeded, no 5xx series, no HTTP
//! series, with and without `tier`); the seed picks names, apps, rates and ages.
//!
//! Cafes ([`Cafe`]) come on top: `cafes_per_namespace` per namespace, each with 1–3 Running
//! serving pods (`app: cafe`) placed round-robin on the nodes after the regular pods.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Arc;

use super::cafe::{self, CAFE_LABEL, Cafe};
use super::rng::SplitMix64;

/// How long before the simulator's start its counters begin.
pub(super) const ORIGIN_OFFSET_SECONDS: i64 = 3600;

const DOMAIN_NODE: u64 = 1;
const DOMAIN_POD: u64 = 2;
const DOMAIN_HASH: u64 = 3;
const DOMAIN_CHURN: u64 = 4;
const DOMAIN_TOKEN: u64 = 5;
const DOMAIN_CAFE_POD: u64 = 7;

/// The app a pod runs (its `app` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum App {
    /// A web frontend (HTTP series).
    Web,
    /// An API backend (HTTP series).
    Api,
    /// A queue worker (no HTTP series).
    Worker,
    /// A cache (no HTTP series).
    Cache,
    /// A cafe's serving pod (cafe series, no HTTP series).
    Cafe,
}

impl App {
    /// The `app` label value.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            App::Web => "web",
            App::Api => "api",
            App::Worker => "worker",
            App::Cache => "cache",
            App::Cafe => "cafe",
        }
    }

    fn index(self) -> u64 {
        match self {
            App::Web => 0,
            App::Api => 1,
            App::Worker => 2,
            App::Cache => 3,
            App::Cafe => 4,
        }
    }

    const fn image(self) -> &'static str {
        match self {
            App::Web => "registry.example.com/shop/web:1.8.2",
            App::Api => "registry.example.com/shop/api:3.2.0",
            App::Worker => "registry.example.com/shop/worker:2.0.7",
            App::Cache => "docker.io/library/redis:7.4",
            App::Cafe => "registry.example.com/une-tasse-de/brewer:2.4.1",
        }
    }
}

/// The `tier` label some pods carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tier {
    /// `tier=frontend`
    Frontend,
    /// `tier=backend`
    Backend,
}

impl Tier {
    /// The `tier` label value.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Tier::Frontend => "frontend",
            Tier::Backend => "backend",
        }
    }
}

/// A pod's phase (`status.phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Scheduled, containers still being created; no usage, no series.
    Pending,
    /// Running: the only phase with kubelet and app series.
    Running,
    /// Completed; no series.
    Succeeded,
}

impl Phase {
    /// The `status.phase` string.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
        }
    }
}

/// A simulated node.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SimNode {
    /// Index `i` of `node-i`.
    pub index: u32,
    /// `node-i`.
    pub name: String,
    /// Deterministic UUID-shaped uid.
    pub uid: String,
    /// InternalIP, `127.1.(i/250).(i%250+1)`; its kubelet listens there.
    pub ip: Ipv4Addr,
    /// creationTimestamp, unix seconds.
    pub created: i64,
    /// resourceVersion of the node object.
    pub resource_version: u64,
    /// CPU used outside pods (system daemons), cores.
    pub system_cpu_cores: f64,
    /// Memory used outside pods, bytes.
    pub system_memory_bytes: f64,
    /// Offset of this kubelet's housekeeping ticks inside the period, milliseconds.
    pub housekeeping_phase_ms: u64,
}

/// The zones of the simulated cluster, a node each in turn (`node-i` in `ZONES[i % 3]`), as
/// (region, zone): two zones of one region and one of another, as a cloud's nodes are labelled.
pub(crate) const ZONES: [(&str, &str); 3] = [("sim-1", "sim-1a"), ("sim-1", "sim-1b"), ("sim-2", "sim-2a")];

impl SimNode {
    /// Its `topology.kubernetes.io/region` and `topology.kubernetes.io/zone` labels.
    pub(crate) fn topology(&self) -> (&'static str, &'static str) {
        ZONES[self.index as usize % ZONES.len()]
    }
}

/// A container of a pod, with its constant usage.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SimContainer {
    /// `app` or `envoy`; `brewer` or `exporter` in a cafe's pods.
    pub name: &'static str,
    /// Image reference.
    pub image: &'static str,
    /// CPU usage rate, cores.
    pub cpu_cores: f64,
    /// Working set, bytes.
    pub memory_bytes: f64,
    /// When the container started, unix seconds.
    pub started: i64,
}

/// HTTP status codes of `http_requests_total`, in the order of [`HttpProfile::rates`].
pub(super) const HTTP_CODES: [&str; 4] = ["200", "404", "500", "503"];

/// A pod's HTTP request rates per code.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct HttpProfile {
    /// Requests per second for each of [`HTTP_CODES`].
    pub rates: [f64; 4],
    /// Whether the 5xx series exist at all (when false, `500`/`503` are never exported).
    pub has_errors: bool,
}

impl HttpProfile {
    /// The exported `(code, rate)` series.
    pub(super) fn series(&self) -> impl Iterator<Item = (&'static str, f64)> + '_ {
        let n = if self.has_errors { 4 } else { 2 };
        HTTP_CODES.iter().copied().zip(self.rates).take(n)
    }

    /// Sum over all exported codes.
    pub(super) fn requests_per_second(&self) -> f64 {
        self.series().map(|(_, r)| r).sum()
    }

    /// Sum over the 5xx codes, `None` when the pod has no 5xx series.
    pub(super) fn errors_per_second(&self) -> Option<f64> {
        self.has_errors.then(|| self.rates[2] + self.rates[3])
    }
}

/// A simulated pod. Kept small: the simulator holds up to 150k of them.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SimPod {
    /// Namespace.
    pub namespace: String,
    /// `<app>-<10 hex>-<5 alnum>` (`<cafe>-<10 hex>-<5 alnum>` for a cafe's pods).
    pub name: String,
    /// Deterministic UUID-shaped uid.
    pub uid: String,
    /// `app` label.
    pub app: App,
    /// `pod-template-hash` label (shared by the pods of one app in one namespace, or of one
    /// cafe).
    pub template_hash: String,
    /// Optional `tier` label.
    pub tier: Option<Tier>,
    /// Index of the node it is scheduled on.
    pub node: u32,
    /// Phase.
    pub phase: Phase,
    /// creationTimestamp, unix seconds.
    pub created: i64,
    /// Pod IP.
    pub ip: Ipv4Addr,
    /// Containers (usage is meaningful only when Running).
    pub containers: Vec<SimContainer>,
    /// HTTP rates, `None` for pods without HTTP series.
    pub http: Option<HttpProfile>,
    /// The cafe this pod serves (label `une-tasse-de.cafe/cafe`), if any.
    pub cafe: Option<Arc<Cafe>>,
    /// resourceVersion of the object.
    pub resource_version: u64,
    /// Set on the copy sent in a DELETED event.
    pub deleted: Option<i64>,
}

impl SimPod {
    /// The value of label `key`, if the pod has it.
    pub(super) fn label(&self, key: &str) -> Option<&str> {
        match key {
            "app" => Some(self.app.as_str()),
            "pod-template-hash" => Some(&self.template_hash),
            "tier" => self.tier.map(Tier::as_str),
            CAFE_LABEL => self.cafe.as_ref().map(|c| c.name.as_str()),
            _ => None,
        }
    }

    /// All labels, sorted by key.
    pub(super) fn labels(&self) -> Vec<(&'static str, &str)> {
        let mut labels = vec![("app", self.app.as_str()), ("pod-template-hash", self.template_hash.as_str())];
        if let Some(tier) = self.tier {
            labels.push(("tier", tier.as_str()));
        }
        if let Some(cafe) = &self.cafe {
            labels.push((CAFE_LABEL, cafe.name.as_str()));
        }
        labels
    }

    /// Whether the pod is Running (only those have series).
    pub(super) fn is_running(&self) -> bool {
        self.phase == Phase::Running
    }

    /// When the pod started (its first container), unix seconds.
    pub(super) fn started(&self) -> i64 {
        self.containers.iter().map(|c| c.started).min().unwrap_or(self.created)
    }

    /// The `<app>-<hash>` (`<cafe>-<hash>`) ReplicaSet name owning the pod.
    pub(super) fn replica_set(&self) -> String {
        match &self.cafe {
            Some(cafe) => format!("{}-{}", cafe.name, self.template_hash),
            None => format!("{}-{}", self.app.as_str(), self.template_hash),
        }
    }
}

/// Where a linear counter starts counting: `max(origin, started)`.
pub(super) fn counter_origin(origin: f64, started: i64) -> f64 {
    origin.max(started as f64)
}

/// The value at `t` of a counter growing at `rate` since `start` (0 before it).
pub(super) fn linear(rate: f64, start: f64, t: f64) -> f64 {
    rate * (t - start).max(0.0)
}

/// The sizing and seed of a workload.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct WorkloadParams {
    /// Seed of every random choice.
    pub seed: u64,
    /// Number of nodes.
    pub nodes: u32,
    /// Pods per node.
    pub pods_per_node: u32,
    /// Namespaces pods are spread over.
    pub namespaces: Vec<String>,
    /// Cafes in each namespace (each with 1–3 serving pods on top of the regular pods).
    pub cafes_per_namespace: u32,
}

/// A generated workload (before any churn).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Workload {
    /// Nodes, by index.
    pub nodes: Vec<SimNode>,
    /// Pods, in generation order (the cafes' serving pods last).
    pub pods: Vec<SimPod>,
    /// Cafes, namespace by namespace.
    pub cafes: Vec<Arc<Cafe>>,
    /// The service-account bearer token.
    pub token: String,
}

/// The name of node `index`: `node-i`.
pub(super) fn node_name(index: u32) -> String {
    format!("node-{index}")
}

/// The InternalIP of node `index`: `127.1.(i/250).(i%250+1)`.
pub(super) fn node_ip(index: u32) -> Ipv4Addr {
    Ipv4Addr::new(127, 1, (index / 250) as u8, (index % 250 + 1) as u8)
}

/// The IP of the `slot`-th pod created on node `node`, inside the node's /24.
fn pod_ip(node: u32, slot: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, (128 + node / 256) as u8, (node % 256) as u8, (slot % 250 + 2) as u8)
}

/// A UUID-shaped (version 4 layout) string from random bits.
pub(crate) fn uuid(rng: &mut SplitMix64) -> String {
    let a = rng.next_u64();
    let b = rng.next_u64();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        ((b >> 48) & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// Kubernetes' name-suffix alphabet (no vowels, no ambiguous characters).
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn suffix(rng: &mut SplitMix64) -> String {
    (0..5)
        .map(|_| char::from(SUFFIX_ALPHABET[rng.range(0, SUFFIX_ALPHABET.len() as u64 - 1) as usize]))
        .collect()
}

/// The 10-hex-digit `pod-template-hash` of `app` in namespace number `ns`.
fn template_hash(seed: u64, ns: usize, app: App) -> String {
    let mut rng = SplitMix64::stream(seed, DOMAIN_HASH, ns as u64 * 4 + app.index());
    format!("{:010x}", rng.next_u64() & 0xff_ffff_ffff)
}

/// A kind of container: its name, its image and the ranges its usage is drawn from
/// (log-uniformly).
struct ContainerSpec {
    name: &'static str,
    image: &'static str,
    /// CPU usage, cores.
    cores: (f64, f64),
    /// Working set, MiB.
    mib: (f64, f64),
}

impl ContainerSpec {
    /// A container of this kind started at `started`, with its usage drawn from `rng` (CPU
    /// in whole millicores, at least 5; working sets in whole 4 KiB pages).
    fn draw(&self, rng: &mut SplitMix64, started: i64) -> SimContainer {
        let cores = rng.log_uniform(self.cores.0, self.cores.1);
        let bytes = rng.log_uniform(self.mib.0 * 1048576.0, self.mib.1 * 1048576.0);
        SimContainer {
            name: self.name,
            image: self.image,
            cpu_cores: (cores * 1000.0).round().max(5.0) / 1000.0,
            memory_bytes: (bytes / 4096.0).round() * 4096.0,
            started,
        }
    }
}

/// The proxy sidecar of some web and API pods.
const ENVOY: ContainerSpec = ContainerSpec {
    name: "envoy",
    image: "docker.io/envoyproxy/envoy:v1.34.1",
    cores: (0.005, 0.1),
    mib: (20.0, 80.0),
};

/// The main container of a cafe's serving pod.
const BREWER: ContainerSpec =
    ContainerSpec { name: "brewer", image: App::Cafe.image(), cores: (0.01, 0.3), mib: (24.0, 160.0) };

/// The sidecar of the cafes that run one.
const CAFE_EXPORTER: ContainerSpec = ContainerSpec {
    name: "exporter",
    image: "registry.example.com/une-tasse-de/cafe-exporter:0.9.3",
    cores: (0.005, 0.03),
    mib: (12.0, 32.0),
};

/// Containers of a pod created at `created`: `main`, and the sidecar `sidecar` picks (after
/// `main` is drawn), started a second later.
fn containers(
    rng: &mut SplitMix64,
    created: i64,
    main: &ContainerSpec,
    sidecar: impl FnOnce(&mut SplitMix64) -> Option<&'static ContainerSpec>,
) -> Vec<SimContainer> {
    let started = created + rng.range(2, 20) as i64;
    let mut out = vec![main.draw(rng, started)];
    if let Some(spec) = sidecar(rng) {
        out.push(spec.draw(rng, started + 1));
    }
    out
}

/// HTTP rates: a total of 0.50–40.00 req/s split over the codes, two decimals each.
fn http_profile(rng: &mut SplitMix64, has_errors: bool) -> HttpProfile {
    let cents = |v: f64| (v * 100.0).round() / 100.0;
    let total = rng.range(50, 4000) as f64 / 100.0;
    let r404 = cents(total * (0.01 + 0.07 * rng.next_f64())).max(0.01);
    let (r500, r503) = if has_errors {
        (
            cents(total * (0.005 + 0.045 * rng.next_f64())).max(0.01),
            cents(total * (0.005 + 0.025 * rng.next_f64())).max(0.01),
        )
    } else {
        (0.0, 0.0)
    };
    let r200 = cents(total - r404 - r500 - r503);
    HttpProfile { rates: [r200, r404, r500, r503], has_errors }
}

/// Which app a pod of global index `i` runs.
fn app_for(i: u64, rng: &mut SplitMix64) -> App {
    // One pod in six is a worker or cache: those have no HTTP series.
    if i % 6 == 2 {
        if (i / 6).is_multiple_of(2) { App::Worker } else { App::Cache }
    } else if rng.chance(0.5) {
        App::Web
    } else {
        App::Api
    }
}

impl Workload {
    /// Generates the workload for `params`, relative to `start` (unix seconds).
    pub(super) fn generate(params: &WorkloadParams, start: i64) -> Workload {
        let seed = params.seed;
        let n_nodes = params.nodes.max(1);
        let nodes: Vec<SimNode> = (0..n_nodes)
            .map(|i| {
                let mut rng = SplitMix64::stream(seed, DOMAIN_NODE, u64::from(i));
                SimNode {
                    index: i,
                    name: node_name(i),
                    uid: uuid(&mut rng),
                    ip: node_ip(i),
                    created: start - rng.range(10 * 86400, 40 * 86400) as i64,
                    resource_version: 0,
                    system_cpu_cores: rng.range(80, 300) as f64 / 1000.0,
                    system_memory_bytes: rng.range(1024, 2048) as f64 * 1048576.0,
                    housekeeping_phase_ms: rng.range(0, 9_999),
                }
            })
            .collect();

        let namespaces = &params.namespaces;
        let n_ns = namespaces.len().max(1) as u64;
        let total = u64::from(n_nodes) * u64::from(params.pods_per_node);
        let mut names = HashSet::with_capacity(total as usize);
        let mut slots = vec![0u32; n_nodes as usize];
        let mut pods = Vec::with_capacity(total as usize);
        for i in 0..total {
            let mut rng = SplitMix64::stream(seed, DOMAIN_POD, i);
            let node = (i % u64::from(n_nodes)) as u32;
            // Offset the namespace by the round so a node hosts several namespaces even
            // when the node and namespace counts are equal.
            let ns_index = ((i + i / u64::from(n_nodes)) % n_ns) as usize;
            let namespace = namespaces.get(ns_index).cloned().unwrap_or_else(|| "default".into());
            let app = app_for(i, &mut rng);
            let tier = (i % 3 == 0).then_some(if app == App::Web { Tier::Frontend } else { Tier::Backend });
            let phase = if i % 12 == 6 {
                Phase::Pending
            } else if i % 20 == 9 {
                Phase::Succeeded
            } else {
                Phase::Running
            };
            let hash = template_hash(seed, ns_index, app);
            let name = loop {
                let candidate = format!("{}-{}-{}", app.as_str(), hash, suffix(&mut rng));
                if names.insert((ns_index, candidate.clone())) {
                    break candidate;
                }
            };
            // Ages from 61 minutes to 9 days, log-uniform: every container started before
            // the counters' origin (one hour before start).
            let age = rng.log_uniform(3660.0, 9.0 * 86400.0) as i64;
            let created = start - age;
            let main =
                ContainerSpec { name: "app", image: app.image(), cores: (0.005, 0.8), mib: (8.0, 600.0) };
            let containers = containers(&mut rng, created, &main, |rng| {
                (matches!(app, App::Web | App::Api) && rng.chance(0.6)).then_some(&ENVOY)
            });
            let http = matches!(app, App::Web | App::Api).then(|| http_profile(&mut rng, i % 4 != 3));
            let slot = &mut slots[node as usize];
            let ip = pod_ip(node, *slot);
            *slot += 1;
            pods.push(SimPod {
                namespace,
                name,
                uid: uuid(&mut rng),
                app,
                template_hash: hash,
                tier,
                node,
                phase,
                created,
                ip,
                containers,
                http,
                cafe: None,
                resource_version: 0,
                deleted: None,
            });
        }

        // The cafes' serving pods, round-robin on the nodes after the regular pods.
        let cafes: Vec<Arc<Cafe>> =
            cafe::generate(seed, namespaces, params.cafes_per_namespace).into_iter().map(Arc::new).collect();
        let mut k = 0u64;
        for cafe in &cafes {
            let ns_index = namespaces.iter().position(|n| *n == cafe.namespace).unwrap_or(0);
            for _ in 0..cafe.pods {
                let mut rng = SplitMix64::stream(seed, DOMAIN_CAFE_POD, k);
                let node = ((total + k) % u64::from(n_nodes)) as u32;
                k += 1;
                let name = loop {
                    let candidate = format!("{}-{}-{}", cafe.name, cafe.template_hash, suffix(&mut rng));
                    if names.insert((ns_index, candidate.clone())) {
                        break candidate;
                    }
                };
                let created = start - rng.log_uniform(3660.0, 9.0 * 86400.0) as i64;
                let containers =
                    containers(&mut rng, created, &BREWER, |_| cafe.sidecar.then_some(&CAFE_EXPORTER));
                let slot = &mut slots[node as usize];
                let ip = pod_ip(node, *slot);
                *slot += 1;
                pods.push(SimPod {
                    namespace: cafe.namespace.clone(),
                    name,
                    uid: uuid(&mut rng),
                    app: App::Cafe,
                    template_hash: cafe.template_hash.clone(),
                    tier: None,
                    node,
                    phase: Phase::Running,
                    created,
                    ip,
                    containers,
                    http: None,
                    cafe: Some(Arc::clone(cafe)),
                    resource_version: 0,
                    deleted: None,
                });
            }
        }
        Workload { nodes, pods, cafes, token: token(seed) }
    }
}

/// A deterministic, random-looking service-account bearer token.
fn token(seed: u64) -> String {
    let mut rng = SplitMix64::stream(seed, DOMAIN_TOKEN, 0);
    let bytes: Vec<u8> = (0..4).flat_map(|_| rng.next_u64().to_be_bytes()).collect();
    format!("sim.{}", super::text::base64_url(&bytes))
}

/// A replacement for `old` created by the `n`-th churn at `now`: same deployment (or cafe),
/// node and usage profile, new name, uid, IP and start time.
pub(super) fn replacement(
    seed: u64,
    n: u64,
    old: &SimPod,
    ip_slot: u32,
    taken: impl Fn(&str) -> bool,
    now: i64,
) -> SimPod {
    let mut rng = SplitMix64::stream(seed, DOMAIN_CHURN, n);
    let name = loop {
        let candidate = format!("{}-{}", old.replica_set(), suffix(&mut rng));
        if !taken(&candidate) && candidate != old.name {
            break candidate;
        }
    };
    let containers = old
        .containers
        .iter()
        .enumerate()
        .map(|(k, c)| SimContainer { started: now + k as i64, ..c.clone() })
        .collect();
    SimPod {
        namespace: old.namespace.clone(),
        name,
        uid: uuid(&mut rng),
        app: old.app,
        template_hash: old.template_hash.clone(),
        tier: old.tier,
        node: old.node,
        phase: Phase::Running,
        created: now,
        ip: pod_ip(old.node, ip_slot),
        containers,
        http: old.http.clone(),
        cafe: old.cafe.clone(),
        resource_version: 0,
        deleted: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::testutil::{self, START};

    /// The default workload with `seed`.
    fn mk_params(seed: u64) -> WorkloadParams {
        WorkloadParams { seed, ..testutil::params() }
    }

    #[test]
    fn same_seed_same_workload() {
        let a = Workload::generate(&mk_params(1), START);
        let b = Workload::generate(&mk_params(1), START);
        let c = Workload::generate(&mk_params(2), START);
        assert_eq!(a, b);
        assert_ne!(a.pods, c.pods);
        assert_ne!(a.token, c.token);
        assert_ne!(a.cafes, c.cafes);
    }

    #[test]
    fn default_cluster_has_every_kind_of_pod() {
        let mut w = Workload::generate(&mk_params(1), START);
        // The cafes' serving pods are checked in `cafe`.
        w.pods.retain(|p| p.cafe.is_none());
        assert_eq!(w.pods.len(), 12);
        assert!(w.pods.iter().any(|p| p.phase == Phase::Pending));
        assert!(w.pods.iter().any(|p| p.phase == Phase::Succeeded));
        let running: Vec<_> = w.pods.iter().filter(|p| p.is_running()).collect();
        assert!(running.iter().any(|p| p.http.is_none()));
        assert!(running.iter().any(|p| p.http.as_ref().is_some_and(|h| !h.has_errors)));
        assert!(running.iter().any(|p| p.http.as_ref().is_some_and(|h| h.has_errors)));
        assert!(running.iter().any(|p| p.tier.is_some()));
        assert!(running.iter().any(|p| p.tier.is_none()));
        for (k, node) in w.nodes.iter().enumerate() {
            let nss: HashSet<_> =
                w.pods.iter().filter(|p| p.node as usize == k).map(|p| &p.namespace).collect();
            assert!(nss.len() > 1, "{} hosts one namespace only", node.name);
        }
        for p in &w.pods {
            let parts: Vec<_> = p.name.split('-').collect();
            assert_eq!(parts.len(), 3, "{}", p.name);
            assert_eq!(parts[1].len(), 10);
            assert_eq!(parts[2].len(), 5);
            assert_eq!(p.uid.len(), 36);
            for c in &p.containers {
                assert!(c.started < START - ORIGIN_OFFSET_SECONDS);
                assert!((0.005..=0.8).contains(&c.cpu_cores), "{}", c.cpu_cores);
            }
            if let Some(h) = &p.http {
                let total = h.requests_per_second();
                assert!((0.5..=40.0 + 1e-9).contains(&total), "{total}");
                assert!(h.rates.iter().take(2).all(|r| *r > 0.0));
            }
        }
    }

    #[test]
    fn node_ips() {
        assert_eq!(node_ip(0), Ipv4Addr::new(127, 1, 0, 1));
        assert_eq!(node_ip(249), Ipv4Addr::new(127, 1, 0, 250));
        assert_eq!(node_ip(250), Ipv4Addr::new(127, 1, 1, 1));
        assert_eq!(node_ip(4999), Ipv4Addr::new(127, 1, 19, 250));
    }

    #[test]
    fn names_are_unique_at_scale() {
        let params = WorkloadParams {
            seed: 7,
            nodes: 200,
            pods_per_node: 30,
            namespaces: vec!["a".into()],
            cafes_per_namespace: 40,
        };
        let w = Workload::generate(&params, START);
        let names: HashSet<_> = w.pods.iter().map(|p| &p.name).collect();
        assert_eq!(names.len(), w.pods.len());
    }
}
