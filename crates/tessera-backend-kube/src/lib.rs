//! # tessera-backend-kube
//!
//! The `kubernetes` backend (`tessera serve --backend kubernetes`): Tessera as the
//! GPU-as-a-service layer on a Kubernetes cluster that runs the NVIDIA GPU Operator, speaking
//! the cluster's own language through kube-rs. It never schedules anything itself beyond
//! binding its own pods to the nodes its engine chose.
//!
//! * [`fleet`]: GPU nodes from Node objects (device-plugin capacity, GPU Feature Discovery
//!   labels, the configured pool label) mapped to the catalogue; node changes as
//!   `NodeChanged` events through a watch, and the fleet rebuilt the same way as a
//!   `FleetChanged` event when a node joins, leaves or changes GPUs, pool or model.
//! * [`pods`]: a workload is a Pod (a multi-node gang: one Pod per node-share, with a headless
//!   Service) in its project's namespace with `schedulerName: tessera`, the device-plugin
//!   resource of its shape and Tessera's labels, bound with the Binding subresource; pod phases
//!   drive the lifecycle (evicted or deleted = lost).
//! * [`tenancy`]: per tenant project a Namespace, ResourceQuota, RoleBinding and
//!   NetworkPolicy, by server-side apply under the field manager `tessera`.
//! * [`mig`]: the engine's layouts as mig-parted configs for the GPU Operator's MIG manager.
//! * [`KubeBackend`]: the backend contract (`WholeGpu` partitioning, `PerNodeCount` devices),
//!   cordon (`spec.unschedulable`) and drain through the Eviction API.
//!
//! * [`dcgm`]: GPU telemetry from the GPU Operator's DCGM exporter on each node (read every
//!   30 s by default), attributed to workloads by the exporter's pod mapping.
//!
//! Not here: workload logs, and image admission (the control plane checks images).

pub mod admission;
mod backend;
pub mod dcgm;
pub mod fleet;
pub mod mig;
pub mod names;
pub mod pods;
pub mod tenancy;

pub use backend::{KubeBackend, KubeConfig};

/// Connects with the ambient configuration (in a pod: the service account; elsewhere:
/// `KUBECONFIG` or `~/.kube/config`) and reads the fleet ([`KubeBackend::connect`]).
pub async fn connect_default(
    cfg: KubeConfig,
) -> Result<(KubeBackend, tessera_model::Fleet), tessera_backend::BackendError> {
    let unreachable = |e: &dyn std::fmt::Display| {
        tessera_backend::BackendError::Unreachable(format!("no Kubernetes configuration: {e}"))
    };
    let config = kube::Config::infer().await.map_err(|e| unreachable(&e))?;
    let client = kube::Client::try_from(config.clone()).map_err(|e| unreachable(&e))?;
    let mut no_retry = config;
    no_retry.default_retry = false;
    let evict_client = kube::Client::try_from(no_retry).map_err(|e| unreachable(&e))?;
    KubeBackend::connect_with(client, evict_client, cfg).await
}
