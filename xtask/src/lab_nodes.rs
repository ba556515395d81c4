//! The lab's nodes, read from the example cluster with the agent's own model.
use std::path::Path;

use anyhow::{bail, Context, Result};
use routewarden::datastore::FileDatastore;
use routewarden_lab::LabNodeSpec;

/// One lab node per Node of the cluster at `datastore`, with its BGP addresses (IPv4 and
/// IPv6, in CIDR form, as `spec.bgp.ipv4Address` / the `projectcalico.org/IPv4Address`
/// annotation give them). Nodes without a BGP address are left out with a note.
pub fn from_cluster(datastore: &Path) -> Result<Vec<LabNodeSpec>> {
    let snap = FileDatastore::load(datastore).with_context(|| format!("load {}", datastore.display()))?;
    let mut nodes = Vec::new();
    for node in snap.cluster.nodes.values() {
        let addresses: Vec<String> = node.bgp_addresses().iter().map(ToString::to_string).collect();
        if addresses.is_empty() {
            eprintln!("lab: node {} has no BGP address; not in the lab", node.name);
            continue;
        }
        nodes.push(LabNodeSpec { name: node.name.to_string(), addresses });
    }
    if nodes.is_empty() {
        bail!("{} has no Node with a BGP address", datastore.display());
    }
    Ok(nodes)
}
