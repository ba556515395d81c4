//! `all-nodes-5k`: `routewarden explain --all-nodes` on 5,000 nodes and
//! 100,000 IPAM blocks in files, against its 2 s budget. Target: at most 1. Pure: no routes,
//! links or namespaces.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};

use crate::fixtures::write_footprint_cluster;
use crate::report::{kv, ms};
use crate::{median, Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "all-nodes-5k", run };

/// The budget of `routewarden explain --all-nodes` on 5,000 nodes and 100,000 blocks.
const ALL_NODES_BUDGET: Duration = Duration::from_secs(2);

/// `routewarden explain --all-nodes` on `opts.compute.nodes` nodes and `opts.compute.blocks`
/// IPAM blocks in files (as `write_footprint_cluster` writes them, one IPIP pool) plus one
/// `FelixConfiguration node.<name>` override that leaves IPIP unowned on that node: the file
/// load and the table, in-process (what the command does, minus process start). ratio = the
/// median time / 2 s. Side condition: exactly that one node is reported inconsistent. Pure
/// (no routes, links or namespaces).
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    let dir = tempfile::tempdir()?;
    let (nodes, blocks) = (opts.compute.nodes.max(2), opts.compute.blocks);
    write_footprint_cluster(dir.path(), nodes, blocks)?;
    std::fs::write(
        dir.path().join("override.yaml"),
        "apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: node.node-0001}\nspec: {programClusterRoutes: Disabled}\n",
    )?;
    let config = routewarden::ownership::OwnershipConfig::default();
    let (mut total, mut load, mut render) = (Vec::new(), Vec::new(), Vec::new());
    let mut ok = true;
    let mut lines = 0;
    for _ in 0..opts.runs.max(1) {
        let t = Instant::now();
        let snap = routewarden::datastore::FileDatastore::load(dir.path())?;
        let loaded = t.elapsed();
        let e = routewarden::explain::explain_all_nodes(&snap.cluster, &snap.object_errors, &config, routewarden::explain::OutputFormat::Table)?;
        let done = t.elapsed();
        ensure!(snap.cluster.ipam_blocks.len() == blocks && snap.cluster.nodes.len() == nodes, "the cluster did not load whole");
        ok &= e.has_errors && e.text.lines().last() == Some(&format!("1 of {nodes} nodes inconsistent: node-0001")[..]);
        lines = e.text.lines().count();
        total.push(done);
        load.push(loaded);
        render.push(done.saturating_sub(loaded));
    }
    let total = median(total);
    Ok(Outcome::Measured {
        name: BENCHMARK.name.into(),
        ratio: total.as_secs_f64() / ALL_NODES_BUDGET.as_secs_f64(),
        target: Target::AtMost(1.0),
        ok,
        details: vec![
            kv("nodes", nodes),
            kv("blocks", blocks),
            kv("total_ms", ms(total)),
            kv("load_ms", ms(median(load))),
            kv("table_ms", ms(median(render))),
            kv("lines", lines),
            kv("runs", opts.runs),
        ],
    })
}
