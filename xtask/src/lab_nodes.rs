//! The lab's nodes, read from the example cluster with the agent's own model.
use std::path::Path;

use anyhow::{bail, Result};
use routewarden_lab::LabNodeSpec;

/// One lab node per Node of the cluster at `datastore`, with its BGP addresses.
pub fn from_cluster(datastore: &Path) -> Result<Vec<LabNodeSpec>> {
    bail!("reading nodes from {} is wired once the cluster model lands", datastore.display())
}
