//! A complete aggregated API server on this library: `zones.topology.example.com/v1alpha1`,
//! one cluster-scoped `Zone` per `topology.kubernetes.io/zone` of the cluster's nodes, with
//! its region, its node count and their allocatable CPU. Discovery, OpenAPI, Tables, label
//! and field selectors, delegated authentication and authorization, caching and the serving
//! loop are the library's; this file is the kind and its composition.
//!
//! ```text
//! cargo run -p apiserver --example zones -- --kubeconfig ~/.kube/config --secure-port 8443
//! ```
//!
//! In a cluster it runs as metrics-server does: a Deployment whose service account may list
//! nodes and is bound to `system:auth-delegator` (TokenReview, SubjectAccessReview) and, in
//! `kube-system`, to the Role `extension-apiserver-authentication-reader` (the trust
//! ConfigMap); a Service in front of it; an `APIService` `v1alpha1.topology.example.com`
//! naming that Service, with the serving certificate's CA as its `caBundle`. Then
//! `kubectl get zones`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use apiserver::kind::{
    CachedKind, Cell, Column, ComputeError, GroupVersion, KindInfo, Listing, ListingBuilder, Meta,
    ObjectMeta, ServedKind,
};
use apiserver::{ApiState, AuthArgs, CacheSettings, Metrics, ServingArgs, discovery::ServerInfo};
use clap::Parser;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use serde_json::json;

const GV: GroupVersion = GroupVersion {
    group: "topology.example.com",
    version: "v1alpha1",
    api_version: "topology.example.com/v1alpha1",
};
const ZONE: &str = "topology.kubernetes.io/zone";
const REGION: &str = "topology.kubernetes.io/region";

/// The flags: the generic server's, and where the cluster is.
#[derive(Parser)]
pub(crate) struct Args {
    #[command(flatten)]
    serving: ServingArgs,
    #[command(flatten)]
    auth: AuthArgs,
    /// The kubeconfig of the cluster (in a pod: omitted, the service account's).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Log verbosity (0: warnings, 1–2: info, 3: debug, 4 and more: trace).
    #[arg(short = 'v', long = "v", default_value_t = 2)]
    verbosity: u8,
}

/// The kind: zones computed from a list of nodes at request time.
struct Zones {
    info: KindInfo,
    nodes: Api<Node>,
}

/// What one zone holds.
#[derive(Default)]
struct Zone {
    region: String,
    nodes: u32,
    cpu_cores: f64,
}

impl ServedKind for Zones {
    fn info(&self) -> &KindInfo {
        &self.info
    }

    fn columns(&self) -> &[Column] {
        const COLUMNS: &[Column] = &[
            Column::object_name("Name of the zone."),
            Column::text("Region", "The zone's region."),
            Column::text("Nodes", "Nodes in the zone."),
            Column::quantity("CPU", "Allocatable CPU of the zone's nodes."),
        ];
        COLUMNS
    }

    fn schemas(&self) -> Vec<(String, serde_json::Value)> {
        let properties = json!({
            "region": {"type": "string", "description": "The zone's region."},
            "nodes": {"type": "integer", "format": "int32", "description": "Nodes in the zone."},
            "cpu": {"type": "string", "description": "Allocatable CPU of the zone's nodes, a Quantity."},
        });
        let schema = apiserver::kind::kind_schema(&self.info, "Standard object metadata.", properties);
        vec![(apiserver::kind::schema_name(GV, "Zone"), schema)]
    }

    fn list<'a>(&'a self, _namespace: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
        Box::pin(async move {
            let nodes = self
                .nodes
                .list(&ListParams::default())
                .await
                .map_err(|e| ComputeError::Upstream(e.to_string()))?;
            let mut zones: BTreeMap<String, Zone> = BTreeMap::new();
            for node in &nodes.items {
                let Some(labels) = &node.metadata.labels else { continue };
                // A label value may not be an object name (capitals, `_`): such a zone is left out.
                let Some(name) = labels.get(ZONE).filter(|z| k8s_wire::is_dns1123_subdomain(z).is_empty())
                else {
                    continue;
                };
                let zone = zones.entry(name.clone()).or_default();
                if let Some(region) = labels.get(REGION) {
                    zone.region.clone_from(region);
                }
                zone.nodes += 1;
                let cpu =
                    node.status.as_ref().and_then(|s| s.allocatable.as_ref()).and_then(|a| a.get("cpu"));
                zone.cpu_cores += cpu.and_then(|q| k8s_wire::quantity::parse(&q.0).ok()).unwrap_or(0.0);
            }
            let version = nodes.metadata.resource_version.unwrap_or_default();
            let mut list = ListingBuilder::new(&self.info, version);
            for (name, zone) in zones {
                let labels: BTreeMap<String, String> = [(REGION.to_owned(), zone.region.clone())]
                    .into_iter()
                    .filter(|(_, r)| !r.is_empty())
                    .collect();
                let meta = Meta {
                    name: name.into(),
                    namespace: Meta::cluster_scoped(),
                    labels: Arc::new(labels),
                    ..Meta::default()
                };
                let object = json!({"kind": "Zone", "apiVersion": GV.api_version, "metadata": ObjectMeta::from(&meta),
                    "region": zone.region, "nodes": zone.nodes, "cpu": k8s_wire::quantity::decimal_si(zone.cpu_cores)});
                let cpu = k8s_wire::quantity::cpu_cell(zone.cpu_cores);
                let region = Cell::text(&zone.region);
                let cells = [
                    Cell::Text(meta.name.clone()),
                    region,
                    Cell::text(&zone.nodes.to_string()),
                    Cell::text(&cpu),
                ];
                list.push(&meta, &object, &cells);
            }
            Ok(Arc::new(list.finish(Vec::new())))
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = Args::parse();
    apiserver::init_logging(args.verbosity, &["zones", "apiserver"]);
    run(args, apiserver::shutdown_signal()).await
}

/// Serves zones as `args` say until `shutdown` resolves (SIGTERM in `main`).
pub(crate) async fn run(
    args: Args,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    apiserver::install_crypto_provider();
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    // Who may read zones is the cluster's call: TokenReview and SubjectAccessReview.
    let auth = apiserver::Auth::start(&args.auth, &config).await?;
    // Rotated CA files (`--client-ca-file`, `--requestheader-client-ca-file`) apply without a
    // restart, as the serving certificate does.
    auth.trust().spawn_file_poller(args.serving.tls_reload_interval);
    let (tls, cert) = apiserver::server_config_reloading(&args.serving, Some(auth.client_cert_verifier()))?;
    cert.spawn_reloader(args.serving.tls_reload_interval);

    let metrics = Metrics::new("zones");
    metrics.export_auth(auth.metrics());
    apiserver::export_serving_certificate_expiry(&cert, &metrics);
    let nodes = Api::<Node>::all(kube::Client::try_from(config)?);
    let info =
        KindInfo::new(GV, "Zone", false, "The nodes of one zone of the cluster.").with_short_names(&["zn"]);
    // A list of nodes per request at most every five seconds, however many clients ask.
    let cache = CacheSettings::new(std::time::Duration::from_secs(5), metrics.clone());
    let zones = CachedKind::new(Arc::new(Zones { info, nodes }), &cache, Arc::new(|| 0));
    let state = ApiState::new(vec![Arc::new(zones) as Arc<dyn ServedKind>], Arc::new(|| true), metrics)
        .with_server_info(ServerInfo::new("zones", "0.1.0").with_home(GV))
        .with_auth(auth)
        .with_limits(args.serving.max_requests_inflight, args.serving.request_timeout);

    let listener =
        apiserver::serve::listener::bind((args.serving.bind_address, args.serving.secure_port).into())?;
    tracing::info!(address = %listener.local_addr()?, "serving");
    apiserver::serve::serve(listener, tls, apiserver::app(state), &args.serving, shutdown).await;
    Ok(())
}
