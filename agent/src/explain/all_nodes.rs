//! `routewarden explain --all-nodes`: the ownership decision of every node at once. Felix's
//! value can differ per node (`FelixConfiguration node.<name>` over `default`,
//! `felix/config/config_params.go` `SourcesInDescendingOrder`); BIRD's cannot (confd reads only
//! `BGPConfiguration default`, `confd/pkg/backends/calico/client.go` `getBGPConfig`). So a
//! pair can be consistent on most nodes and double-programmed or unowned on a few.
//!
//! Cost: one [`decide`] per node (IP pools and configuration objects only, never IPAM blocks),
//! so the table of 5,000 nodes takes about 13 ms (release build) whatever the number of blocks;
//! loading the blocks dominates (`all-nodes-5k` in BENCHMARKS.md).

use std::fmt::Write as _;

use serde::Serialize;

use super::{invalid_blocks, invalid_pools, serialize, table, ExplainError, Explanation, OutputFormat};
use crate::datastore::ObjectError;
use crate::model::Cluster;
use crate::ownership::{decide, ComponentDecision, Finding, FindingKind, OwnershipConfig, Severity, VersionSource};
use crate::text::escape;
use crate::vocabulary::{PoolClass, Writer};

/// A class two or more components program on a node, and who.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
struct DoubleProgrammed {
    class: PoolClass,
    writers: Vec<Writer>,
}

/// One node's row.
#[derive(Debug, Serialize)]
struct NodeRow {
    node: String,
    /// Felix's value on this node and where it came from.
    felix: ComponentDecision,
    double_programmed: Vec<DoubleProgrammed>,
    unowned: Vec<PoolClass>,
    /// No class with pools is double-programmed or unowned here.
    consistent: bool,
    /// Findings of this node alone (a `node.<name>` value Felix does not accept), messages.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
}

#[derive(Debug, Serialize)]
struct AllNodesReport {
    role: String,
    calico_version: String,
    calico_rules: &'static str,
    calico_version_source: VersionSource,
    /// BIRD's value, the same on every node.
    bird: ComponentDecision,
    #[serde(skip_serializing_if = "Option::is_none")]
    explicit: Option<ComponentDecision>,
    nodes: Vec<NodeRow>,
    /// Nodes where a class is double-programmed or unowned.
    inconsistent_nodes: Vec<String>,
    /// Findings that are the same on every node (release line, sources, operator).
    findings: Vec<Finding>,
    /// `FelixConfiguration node.<name>` objects that name no Node.
    overrides_without_node: Vec<String>,
    object_errors: Vec<String>,
    invalid_pools: Vec<String>,
    /// IPAM blocks left out as overlapping another block or not of their pool's `blockSize`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    invalid_blocks: Vec<String>,
    has_errors: bool,
}

/// Render every node's decision under `config` (its `node` is ignored) in `format`.
/// `has_errors` when a node is inconsistent or an IP pool or IPAM block is invalid (exit status
/// 1).
///
/// Errors: [`ExplainError::Render`] when JSON or YAML cannot be produced.
pub fn explain_all_nodes(
    cluster: &Cluster,
    object_errors: &[ObjectError],
    config: &OwnershipConfig,
    format: OutputFormat,
) -> Result<Explanation, ExplainError> {
    let base = decide(cluster, &OwnershipConfig { node: None, ..config.clone() });
    let shared: Vec<Finding> = base.findings.iter().filter(|f| f.class.is_none()).cloned().collect();
    let mut nodes = Vec::with_capacity(cluster.nodes.len());
    for name in cluster.nodes.keys() {
        let d = decide(cluster, &OwnershipConfig { node: Some(name.to_string()), ..config.clone() });
        let mut double_programmed = Vec::new();
        let mut unowned = Vec::new();
        let mut remarks = Vec::new();
        for f in d.findings {
            match (&f.kind, f.class) {
                (FindingKind::DoubleProgrammed { writers }, Some(class)) => {
                    double_programmed.push(DoubleProgrammed { class, writers: writers.clone() });
                }
                (FindingKind::Unowned, Some(class)) => unowned.push(class),
                (_, None) if !shared.contains(&f) => remarks.push(f.message),
                _ => {}
            }
        }
        let consistent = double_programmed.is_empty() && unowned.is_empty();
        nodes.push(NodeRow { node: name.to_string(), felix: d.felix, double_programmed, unowned, consistent, notes: remarks });
    }
    let inconsistent_nodes: Vec<String> = nodes.iter().filter(|n| !n.consistent).map(|n| n.node.clone()).collect();
    let invalid_pools = invalid_pools(object_errors);
    let invalid_blocks = invalid_blocks(object_errors);
    let has_errors = !inconsistent_nodes.is_empty() || !invalid_pools.is_empty() || !invalid_blocks.is_empty();
    let overrides_without_node: Vec<String> = cluster
        .felix_configurations
        .keys()
        .filter(|k| k.strip_prefix("node.").is_some_and(|n| !cluster.nodes.contains_key(n)))
        .map(|k| format!("FelixConfiguration {k}"))
        .collect();
    let report = AllNodesReport {
        role: config.role.to_string(),
        calico_version: base.version.version.to_string(),
        calico_rules: base.version.rules.label(),
        calico_version_source: base.version.source.clone(),
        bird: base.bird.clone(),
        explicit: base.explicit.clone(),
        inconsistent_nodes,
        findings: shared,
        overrides_without_node,
        object_errors: object_errors.iter().map(ToString::to_string).collect(),
        invalid_pools,
        invalid_blocks,
        has_errors,
        nodes,
    };
    let text = match format {
        OutputFormat::Json | OutputFormat::Yaml => serialize(&report, format)?,
        OutputFormat::Table => render(&report, &base.version.to_string()),
    };
    Ok(Explanation { text, has_errors })
}

/// `ipip (routewarden+bird)`, comma separated; `-` for none.
fn doubles(d: &[DoubleProgrammed]) -> String {
    if d.is_empty() {
        return "-".to_owned();
    }
    d.iter().map(|x| format!("{} ({})", x.class.label(), x.writers.iter().map(|w| w.label()).collect::<Vec<_>>().join("+"))).collect::<Vec<_>>().join(", ")
}

fn render(r: &AllNodesReport, version: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "role {}, Calico {}, all nodes ({})", r.role, escape(version), r.nodes.len());
    let _ = writeln!(out, "bird: {} ({}), the same on every node", r.bird.value, escape(&r.bird.source.to_string()));
    if let Some(e) = &r.explicit {
        let _ = writeln!(out, "routewarden: {} ({}), the same on every node", e.value, escape(&e.source.to_string()));
    }
    out.push_str("\nNodes\n");
    let mut rows = vec![["NODE", "FELIX", "FELIX SOURCE", "BIRD", "DOUBLE-PROGRAMMED", "UNOWNED"].map(String::from).to_vec()];
    for n in &r.nodes {
        let unowned = if n.unowned.is_empty() { "-".to_owned() } else { n.unowned.iter().map(|c| c.label()).collect::<Vec<_>>().join(", ") };
        rows.push(vec![
            n.node.clone(),
            n.felix.value.to_string(),
            n.felix.source.to_string(),
            r.bird.value.to_string(),
            doubles(&n.double_programmed),
            unowned,
        ]);
    }
    if r.nodes.is_empty() {
        out.push_str("  (no nodes)\n");
    } else {
        table(&mut out, &rows);
    }
    let notes: Vec<(&str, &String)> = r.nodes.iter().flat_map(|n| n.notes.iter().map(move |m| (n.node.as_str(), m))).collect();
    if !notes.is_empty() {
        out.push_str("\nNode notes\n");
        for (node, m) in notes {
            let _ = writeln!(out, "  {}: {}", escape(node), escape(m));
        }
    }
    render_shared(&mut out, r);
    out
}

/// The findings of every node, the overrides that name no Node, the invalid pools, the
/// verdict and the objects left out.
fn render_shared(out: &mut String, r: &AllNodesReport) {
    out.push_str("\nFindings on every node\n");
    let mut rows = Vec::new();
    for f in &r.findings {
        let sev = match f.severity {
            Severity::Info => "ok",
            Severity::Warning => "warning",
            Severity::Error => "ERROR",
        };
        rows.push(vec![sev.to_owned(), f.code().to_owned(), f.message.clone()]);
    }
    for o in &r.overrides_without_node {
        rows.push(vec!["warning".to_owned(), "no-such-node".to_owned(), format!("{o} names no Node in the cluster; it applies nowhere")]);
    }
    for p in &r.invalid_pools {
        rows.push(vec!["ERROR".to_owned(), "invalid-pool".to_owned(), format!("{p}; nothing in its CIDR is routed, deleted or claimed")]);
    }
    for b in &r.invalid_blocks {
        rows.push(vec!["ERROR".to_owned(), "invalid-block".to_owned(), format!("{b}; nothing there is routed, deleted or claimed")]);
    }
    if rows.is_empty() {
        out.push_str("  (none)\n");
    } else {
        table(out, &rows);
    }
    out.push('\n');
    if r.inconsistent_nodes.is_empty() {
        let _ = writeln!(out, "every node consistent ({} nodes)", r.nodes.len());
    } else {
        let shown: Vec<String> = r.inconsistent_nodes.iter().take(20).map(|n| escape(n).into_owned()).collect();
        let more = r.inconsistent_nodes.len().saturating_sub(shown.len());
        let _ = writeln!(
            out,
            "{} of {} nodes inconsistent: {}{}",
            r.inconsistent_nodes.len(),
            r.nodes.len(),
            shown.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() }
        );
    }
    if !r.object_errors.is_empty() {
        out.push_str("\nObjects left out\n");
        for e in &r.object_errors {
            let _ = writeln!(out, "  {}", escape(e));
        }
    }
}
