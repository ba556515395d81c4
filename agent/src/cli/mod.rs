//! The subcommands of the `routewarden` binary, one file each, and what they share: loading
//! the cluster once from `--datastore`, the route devices with `--host-device auto` resolved,
//! and one plan of the node as the agent would compute it.

pub mod audit;
pub mod bird_filter;
pub mod events;
pub mod explain;
pub mod run;
pub mod status;

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use clap::ValueEnum;
use routewarden::app::flags::{ClusterArgs, DatastoreSpec};
use routewarden::datastore::{Datastore, FileDatastore, KubernetesDatastore, Snapshot};
use routewarden::model::Cluster;
use routewarden::ownership::OwnershipConfig;
use routewarden::plan::{self, Plan, PlanConfig};
use routewarden::routes::RouteDevices;

/// Output format of `explain`, `audit` and `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Human-readable table.
    Table,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// Load the cluster once (a file tree, or one list of every resource from the API server).
async fn load(spec: DatastoreSpec) -> Result<Snapshot> {
    match spec {
        DatastoreSpec::File(path) => FileDatastore::load(&path).with_context(|| format!("load the cluster description from {}", path.display())),
        DatastoreSpec::Kubernetes(opts) => {
            let ds = KubernetesDatastore::connect(&opts).await?;
            ds.load().await.with_context(|| format!("list the cluster from {}", ds.describe()))
        }
        DatastoreSpec::Etcd(opts) => {
            let ds = routewarden::datastore::EtcdDatastore::new(opts);
            ds.load().await.with_context(|| format!("read the cluster from {}", ds.describe()))
        }
    }
}

/// A current-thread runtime for the one-shot commands.
fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

/// [`load`] for the synchronous commands.
fn load_blocking(cluster: &ClusterArgs) -> Result<Snapshot> {
    runtime()?.block_on(load(cluster.required_datastore_spec()?))
}

/// The devices the flags name (`--host-device` possibly still `auto`).
fn devices(c: &ClusterArgs) -> RouteDevices {
    RouteDevices { tunnel: c.tunnel_device.clone(), host_nic: c.host_device.clone() }
}

/// [`devices`] with a host NIC of `auto` resolved for `node` in this network namespace (the
/// link holding its Calico address). Where no link here holds it (explain run away from the
/// node), `eth0`, said on stderr, so the route lines stay readable. Without a node nothing is
/// routed, and `eth0` stands in silently.
async fn devices_for(c: &ClusterArgs, cluster: &Cluster, node: Option<&str>) -> RouteDevices {
    use routewarden::dataplane::tasks::host_nic;
    let mut d = devices(c);
    if d.host_nic != host_nic::AUTO {
        return d;
    }
    let Some(name) = node else {
        d.host_nic = "eth0".into();
        return d;
    };
    let found = match routewarden::dataplane::KernelDump::connect() {
        Ok(nl) => host_nic::find_host_nic(&nl, name, cluster.nodes.get(name).map(AsRef::as_ref)).await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    d.host_nic = found.unwrap_or_else(|why| {
        eprintln!("note: --host-device auto: {}; using eth0", routewarden::text::escape(&why));
        "eth0".into()
    });
    d
}

/// The plan of `node` from one snapshot, as the agent's first pass computes it (nothing
/// programmed before, nothing owned before).
fn plan_once(snap: &Snapshot, cluster: &ClusterArgs, node: String, ownership: OwnershipConfig, devices: RouteDevices) -> Plan {
    let config = PlanConfig { node, ownership, devices, protocol: cluster.route_protocol, table: cluster.route_table };
    plan::plan(snap, &config, &BTreeSet::new(), &[])
}
