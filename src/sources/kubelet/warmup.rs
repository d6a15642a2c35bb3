//! Starting the kubelet source: its client configuration from the flags and the cluster's
//! credentials ([`kubelet_config`]), and the warm-up `/readyz` waits for
//! ([`warm_up_kubelets`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use apiserver::CacheSettings;

use crate::config::KubeletArgs;
use crate::sources::kubelet::{BearerToken, KubeletConfig};
use crate::sources::{Inventory, KubeletSource};

/// Fetches every node's kubelet after the inventory has synced, and again every half
/// sampling interval until each node that answers has a CPU rate (two distinct samples), then
/// sets `done`: `/readyz` waits for it (check `metric-storage-ready`, as metrics-server's), so
/// a replica starting during a rolling restart enters the Service's rotation with CPU for
/// `kubectl top` and the HPA rather than empty lists. A node whose kubelet fails does not hold
/// readiness (requests fetch it again on demand and say what failed), and neither does the
/// whole warm-up past `--max-rate-window`: a kubelet that never publishes a second sample
/// leaves that node's CPU out, as it would on any replica.
pub(crate) async fn warm_up_kubelets(
    inventory: Arc<dyn Inventory>,
    kubelet: Arc<dyn KubeletSource>,
    done: Arc<AtomicBool>,
) {
    while !inventory.is_synced() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sampling = kubelet.sampling();
    let deadline = tokio::time::Instant::now() + sampling.max_window;
    let mut waiting: std::collections::BTreeSet<String> = inventory
        .running_pods(None)
        .iter()
        .filter_map(|p| p.node_name.as_deref().map(str::to_owned))
        .collect();
    let nodes = waiting.len();
    let mut errors: Vec<String> = Vec::new();
    loop {
        let fetches = futures::future::join_all(waiting.iter().map(|node| kubelet.node_usage(node))).await;
        let mut still = std::collections::BTreeSet::new();
        for (node, fetch) in waiting.iter().zip(fetches) {
            match fetch {
                Ok(usage) if !has_cpu_rate(&usage) => {
                    still.insert(node.clone());
                }
                Ok(_) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
        waiting = still;
        if waiting.is_empty() || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep((sampling.interval / 2).max(Duration::from_millis(100))).await;
    }
    done.store(true, Ordering::SeqCst);
    match errors.first() {
        None if waiting.is_empty() => {
            tracing::info!(nodes, "kubelet warm-up done: every node has a CPU rate")
        }
        None => tracing::warn!(
            nodes,
            without_cpu = waiting.len(),
            "kubelet warm-up gave up waiting for a second sample after --max-rate-window"
        ),
        Some(first) => {
            tracing::warn!(nodes, failed = errors.len(), first = %first, "kubelet warm-up done with errors")
        }
    }
}

/// Whether a node's usage carries a CPU rate: the node's own, or any container's (a kubelet
/// may publish no node series; a node without running containers has nothing to wait for).
fn has_cpu_rate(usage: &crate::sources::NodeUsage) -> bool {
    let containers = || usage.pods.values().flat_map(|c| c.iter());
    usage.node.as_ref().is_some_and(|n| n.cpu_nanocores.is_some())
        || containers().any(|c| c.cpu_nanocores.is_some())
        || (usage.node.is_none() && containers().next().is_none())
}

/// The kubelet client configuration: flags, plus the cluster's credentials and CA from the
/// kubeconfig (the service account's token and the cluster CA in-cluster), as metrics-server
/// does. `ca_file` is `--kubelet-certificate-authority` (then the cluster CA is not used).
pub(crate) fn kubelet_config(
    args: &KubeletArgs,
    kube_config: &kube::Config,
    ca_file: Option<Arc<apiserver::WatchedCaFile>>,
    cache: &CacheSettings,
) -> KubeletConfig {
    use base64::Engine;
    use secrecy::ExposeSecret;
    let auth = &kube_config.auth_info;
    let bearer_token = match (&auth.token_file, &auth.token) {
        (Some(file), _) => Some(BearerToken::File(file.into())),
        (None, Some(token)) => Some(BearerToken::Static(token.expose_secret().to_string())),
        _ => None,
    };
    let cluster_ca = kube_config.root_cert.as_ref().filter(|_| ca_file.is_none()).map(|ders| {
        let engine = base64::engine::general_purpose::STANDARD;
        ders.iter()
            .map(|der| {
                format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", engine.encode(der))
            })
            .collect::<String>()
            .into_bytes()
    });
    KubeletConfig {
        port: args.kubelet_port,
        preferred_address_types: args.kubelet_preferred_address_types.clone(),
        insecure_tls: args.kubelet_insecure_tls,
        ca_file,
        ca_pem: cluster_ca,
        bearer_token,
        request_timeout: args.kubelet_request_timeout,
        cache: cache.clone(),
        use_node_status_port: args.kubelet_use_node_status_port,
        reuse_connections: args.kubelet_reuse_connections,
        max_rate_window: args.max_rate_window,
        idle_after: args.idle_after,
        ..KubeletConfig::default()
    }
}
