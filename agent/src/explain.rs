//! `routewarden explain`: the ownership table per IP pool (class, who programs it, where each
//! decision came from), the findings, and the cluster routes of one node in `ip route` syntax;
//! with `--all-nodes` ([`explain_all_nodes`]), one row per node: Felix's value and its source,
//! BIRD's, and the classes double-programmed or unowned there. Pure rendering: the caller
//! loads the datastore and prints the text.

use std::fmt::Write as _;
use std::str::FromStr;

use serde::Serialize;

use crate::datastore::ObjectError;
use crate::model::Cluster;
use crate::ownership::{decide, ComponentDecision, Finding, OwnershipConfig, OwnershipDecision, PoolOwnership, Role, Severity, VersionSource};
use crate::routes::{desired_routes, routable_classes, ClusterRoute, RouteDevices, RouteOrigin};
use crate::text::escape;
use crate::vocabulary::{PoolClass, RoutePath};

mod all_nodes;

pub use all_nodes::explain_all_nodes;

/// Errors of `explain`.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("invalid output format {value:?}: expected table, json or yaml")]
    InvalidFormat { value: String },
    #[error("rendering {format}: {message}")]
    Render { format: &'static str, message: String },
}

/// `-o table|json|yaml`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputFormat {
    #[default]
    Table,
    Json,
    Yaml,
}

impl FromStr for OutputFormat {
    type Err = ExplainError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "table" => Ok(OutputFormat::Table),
            "json" => Ok(OutputFormat::Json),
            "yaml" => Ok(OutputFormat::Yaml),
            _ => Err(ExplainError::InvalidFormat { value: s.to_owned() }),
        }
    }
}

/// What to render.
#[derive(Clone, Debug)]
pub struct ExplainOptions {
    /// The node whose routes are shown (and whose `FelixConfiguration node.<name>` applies).
    /// `None`: ownership and findings only.
    pub node: Option<String>,
    pub format: OutputFormat,
    /// Route protocol shown in the routes (routewarden's `--route-protocol`).
    pub route_protocol: u8,
    /// Route metric shown in the routes; `None` prints none (metric 0).
    pub metric: Option<u32>,
    pub devices: RouteDevices,
}

/// The rendered text and whether any finding is an error (`double-programmed`, `unowned`), for
/// the exit status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    pub text: String,
    pub has_errors: bool,
}

/// One route as rendered.
#[derive(Debug, Serialize)]
struct RouteRow<'a> {
    #[serde(flatten)]
    route: &'a ClusterRoute,
    ip_route: String,
}

#[derive(Debug, Serialize)]
struct Problem {
    code: &'static str,
    message: String,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    role: String,
    /// The release in force (`3.34` stays `3.34`).
    calico_version: String,
    /// Whose rules decided (`3.26-3.30`, `3.31`, `3.32`, `3.33`).
    calico_rules: &'static str,
    /// Where the release came from: `--calico-version`, ClusterInformation, or assumed.
    calico_version_source: &'a VersionSource,
    node: Option<&'a str>,
    felix: &'a ComponentDecision,
    bird: &'a ComponentDecision,
    #[serde(skip_serializing_if = "Option::is_none")]
    explicit: Option<&'a ComponentDecision>,
    programmed_classes: Vec<PoolClass>,
    /// Classes the agent holds as they are because the object that decides their owner
    /// cannot be read or holds a value it cannot interpret (`ownership::frozen_classes`). Any
    /// makes the explanation an error.
    frozen_classes: &'a [crate::ownership::FrozenClass],
    pools: &'a [PoolOwnership],
    findings: &'a [Finding],
    /// Routes of `node`: the classes routewarden programs, or every routable class in audit
    /// mode.
    routes: Vec<RouteRow<'a>>,
    route_problems: Vec<Problem>,
    object_errors: Vec<String>,
    /// IP pools left out as invalid (overlapping another pool, `/0`, host bits, a bad field):
    /// their CIDRs are frozen ground for the agent. Any makes the explanation an error.
    invalid_pools: Vec<String>,
    /// IPAM blocks left out as invalid (overlapping another block, or not of their pool's
    /// `blockSize`: `model::check_blocks`), each error naming the blocks or pool concerned;
    /// the ground they cover is frozen. Any makes the explanation an error.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    invalid_blocks: Vec<String>,
    /// WireGuard peers of `node` (`ownership::wireguard_peers`): their routes are Felix's
    /// WireGuard routing, which BIRD's filter rejects; empty without `--node` or WireGuard.
    wireguard_peers: Vec<WireguardPeer>,
    has_errors: bool,
}

/// A node Felix reaches over WireGuard from this one (confd `processWireguardPeerFilter`).
#[derive(Debug, Serialize)]
struct WireguardPeer {
    node: String,
    /// The peer's BGP address: BIRD routes with this next hop are rejected.
    bgp_address: std::net::IpAddr,
}

/// Render the explanation for `cluster` (with the object errors the datastore reported) under
/// `config`; `opts.node` replaces `config.node`.
pub fn explain(cluster: &Cluster, object_errors: &[ObjectError], config: &OwnershipConfig, opts: &ExplainOptions) -> Result<Explanation, ExplainError> {
    let config = OwnershipConfig { node: opts.node.clone(), ..config.clone() };
    let decision = decide(cluster, &config);
    let audit = config.role == Role::Audit;
    // What the agent would hold as it is: a class whose deciding object cannot be
    // read or interpreted gets nothing new programmed, so its routes are not listed as ours.
    let frozen = crate::ownership::frozen_classes(&decision, cluster, &config, object_errors.iter().filter(|e| !e.last_good).map(|e| &e.error));
    let programs: std::collections::BTreeSet<PoolClass> = decision.programmed.iter().filter(|c| !frozen.iter().any(|f| f.class == **c)).copied().collect();
    let classes = if audit { routable_classes() } else { programs.clone() };
    let desired = opts.node.as_deref().map(|n| desired_routes(cluster, n, &classes, &opts.devices));
    let routes: Vec<RouteRow<'_>> = desired
        .as_ref()
        .map(|d| d.routes.iter().map(|r| RouteRow { route: r, ip_route: ip_route_line(r, opts.route_protocol, opts.metric) }).collect())
        .unwrap_or_default();
    let route_problems: Vec<Problem> =
        desired.as_ref().map(|d| d.problems.iter().map(|p| Problem { code: p.code(), message: p.to_string() }).collect()).unwrap_or_default();
    let invalid_pools = invalid_pools(object_errors);
    let invalid_blocks = invalid_blocks(object_errors);
    let has_errors = decision.has_errors() || !invalid_pools.is_empty() || !invalid_blocks.is_empty() || !frozen.is_empty();
    let report = Report {
        role: config.role.to_string(),
        calico_version: decision.version.version.to_string(),
        calico_rules: decision.version.rules.label(),
        calico_version_source: &decision.version.source,
        node: opts.node.as_deref(),
        felix: &decision.felix,
        bird: &decision.bird,
        explicit: decision.explicit.as_ref(),
        programmed_classes: programs.into_iter().collect(),
        frozen_classes: &frozen,
        pools: &decision.pools,
        findings: &decision.findings,
        routes,
        route_problems,
        object_errors: object_errors.iter().map(ToString::to_string).collect(),
        invalid_pools,
        invalid_blocks,
        wireguard_peers: opts
            .node
            .as_deref()
            .map(|n| crate::ownership::wireguard_peers(cluster, n))
            .unwrap_or_default()
            .into_iter()
            .map(|(node, bgp_address)| WireguardPeer { node, bgp_address })
            .collect(),
        has_errors,
    };
    let text = match opts.format {
        OutputFormat::Json | OutputFormat::Yaml => serialize(&report, opts.format)?,
        OutputFormat::Table => render_table(&report, &decision, audit),
    };
    Ok(Explanation { text, has_errors })
}

/// IP pools left out as invalid, with no last good version (their errors).
fn invalid_pools(object_errors: &[ObjectError]) -> Vec<String> {
    object_errors
        .iter()
        .filter(|e| !e.last_good && e.error.object().is_some_and(|(k, _)| k == crate::model::Kind::IpPool))
        .map(|e| e.error.to_string())
        .collect()
}

/// IPAM blocks left out as overlapping another block or not of their pool's `blockSize`
/// (their errors, which name the other blocks or the pool).
fn invalid_blocks(object_errors: &[ObjectError]) -> Vec<String> {
    object_errors.iter().filter(|e| !e.last_good && crate::model::is_invalid_block(&e.error)).map(|e| e.error.to_string()).collect()
}

/// `report` as pretty JSON (with a final newline) or YAML.
fn serialize(report: &impl Serialize, format: OutputFormat) -> Result<String, ExplainError> {
    match format {
        OutputFormat::Yaml => serde_yaml_ng::to_string(report).map_err(|e| ExplainError::Render { format: "yaml", message: e.to_string() }),
        _ => serde_json::to_string_pretty(report)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .map_err(|e| ExplainError::Render { format: "json", message: e.to_string() }),
    }
}

/// A route in `ip route` syntax: `10.244.20.0/26 via 10.0.0.12 dev tunl0 proto 80 onlink`,
/// `blackhole 10.244.10.0/26 proto 80`, `10.244.20.5 via ...` (host routes without `/32`, as
/// iproute2 prints them). `protocol` is printed by its iproute2 name when it has one.
pub fn ip_route_line(route: &ClusterRoute, protocol: u8, metric: Option<u32>) -> String {
    let dst = if route.dst.prefix_len() == route.dst.max_prefix_len() { route.dst.addr().to_string() } else { route.dst.to_string() };
    let mut out = String::new();
    if route.path == RoutePath::Blackhole {
        let _ = write!(out, "blackhole {dst}");
    } else {
        out.push_str(&dst);
        if let Some(gw) = route.gateway {
            let _ = write!(out, " via {gw}");
        }
        if let Some(dev) = &route.device {
            let _ = write!(out, " dev {dev}");
        }
    }
    let _ = write!(out, " proto {}", protocol_name(protocol));
    if let Some(m) = metric.filter(|m| *m != 0) {
        let _ = write!(out, " metric {m}");
    }
    if route.path != RoutePath::Blackhole {
        out.push_str(" onlink");
    }
    out
}

/// iproute2's `rt_protos` names for the protocols a cluster route table commonly shows.
fn protocol_name(p: u8) -> String {
    match p {
        2 => "kernel".into(),
        3 => "boot".into(),
        4 => "static".into(),
        11 => "zebra".into(),
        12 => "bird".into(),
        16 => "dhcp".into(),
        42 => "babel".into(),
        186 => "bgp".into(),
        187 => "isis".into(),
        188 => "ospf".into(),
        189 => "rip".into(),
        n => n.to_string(),
    }
}

/// Left-aligned columns separated by two spaces; every cell escaped (no control character from
/// the datastore reaches the terminal).
fn table(out: &mut String, rows: &[Vec<String>]) {
    let rows: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(|c| escape(c).into_owned()).collect()).collect();
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    for row in &rows {
        let mut line = String::from("  ");
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

fn render_table(r: &Report<'_>, d: &OwnershipDecision, audit: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "role {}, Calico {}{}", r.role, escape(&d.version.to_string()), r.node.map(|n| format!(", node {}", escape(n))).unwrap_or_default());
    out.push_str("\nDecisions\n");
    let mut rows = vec![vec!["COMPONENT".to_owned(), "VALUE".to_owned(), "SOURCE".to_owned()]];
    rows.push(vec!["felix".into(), d.felix.value.to_string(), d.felix.source.to_string()]);
    rows.push(vec!["bird".into(), d.bird.value.to_string(), d.bird.source.to_string()]);
    if let Some(e) = &d.explicit {
        rows.push(vec!["routewarden".into(), e.value.to_string(), e.source.to_string()]);
    }
    table(&mut out, &rows);

    out.push_str("\nIP pools\n");
    let mut rows = vec![["POOL", "CIDR", "KIND", "CLASS", "PROGRAMMED BY", "BIRD KERNEL FILTER"].map(String::from).to_vec()];
    for p in &d.pools {
        let writers: Vec<&str> = p.writers.iter().map(|w| w.label()).collect();
        rows.push(vec![
            p.pool.clone(),
            p.cidr.to_string(),
            p.kind.label().to_owned(),
            p.class.map_or("-", |c| c.label()).to_owned(),
            if writers.is_empty() { "nobody".to_owned() } else { writers.join("+") },
            match p.bird_kernel_filter {
                crate::ownership::KernelFilter::Accept => "accept".to_owned(),
                crate::ownership::KernelFilter::Reject => "reject".to_owned(),
            },
        ]);
    }
    if d.pools.is_empty() {
        out.push_str("  (no IP pools)\n");
    } else {
        table(&mut out, &rows);
    }

    out.push_str("\nFindings\n");
    let mut rows = Vec::new();
    for f in &d.findings {
        let sev = match f.severity {
            Severity::Info => "ok",
            Severity::Warning => "warning",
            Severity::Error => "ERROR",
        };
        rows.push(vec![sev.to_owned(), f.code().to_owned(), f.class_label().to_owned(), f.message.clone()]);
    }
    for f in r.frozen_classes {
        rows.push(vec!["ERROR".to_owned(), "frozen-class".to_owned(), f.class.label().to_owned(), f.reason.clone()]);
    }
    for p in &r.invalid_pools {
        rows.push(vec!["ERROR".to_owned(), "invalid-pool".to_owned(), "none".to_owned(), format!("{p}; nothing in its CIDR is routed, deleted or claimed")]);
    }
    for b in &r.invalid_blocks {
        rows.push(vec!["ERROR".to_owned(), "invalid-block".to_owned(), "none".to_owned(), format!("{b}; nothing there is routed, deleted or claimed")]);
    }
    if rows.is_empty() {
        out.push_str("  (none)\n");
    } else {
        table(&mut out, &rows);
    }

    render_wireguard_peers(&mut out, r);

    if let Some(node) = r.node {
        if audit {
            let _ = writeln!(out, "\nExpected cluster routes on {} (every routable class; audit mode programs nothing)", escape(node));
        } else {
            let labels: Vec<&str> = r.programmed_classes.iter().map(|c| c.label()).collect();
            let classes = if labels.is_empty() { "none".to_owned() } else { labels.join(", ") };
            let _ = writeln!(out, "\nRoutes routewarden programs on {} (classes: {classes})", escape(node));
        }
        if r.routes.is_empty() {
            out.push_str("  (none)\n");
        }
        for row in &r.routes {
            let why = match &row.route.origin {
                RouteOrigin::RemoteBlock { node, .. } => format!("block of {node}"),
                RouteOrigin::BorrowedIp { block, node } => format!("borrowed by {node} from {block}"),
                RouteOrigin::OwnBlock { .. } => "own block".to_owned(),
                RouteOrigin::TunnelAddress { block, node, tunnel } => format!("{} tunnel address of {node} in {block}", tunnel.label()),
            };
            let _ = writeln!(out, "  {:<60}  # {}, pool {}", row.ip_route, escape(&why), escape(&row.route.pool));
        }
        if !r.route_problems.is_empty() {
            out.push_str("\nRoute problems\n");
            for p in &r.route_problems {
                let _ = writeln!(out, "  {}: {}", p.code, escape(&p.message));
            }
        }
    }
    if !r.object_errors.is_empty() {
        out.push_str("\nObjects left out\n");
        for e in &r.object_errors {
            let _ = writeln!(out, "  {}", escape(e));
        }
    }
    out
}

/// The WireGuard section of the table output, when `node` has WireGuard peers: routes through
/// them are Felix's WireGuard routing (its own table and rule), not a missing or
/// double-programmed cluster route, and `bird-filter` rejects them for BIRD.
fn render_wireguard_peers(out: &mut String, r: &Report<'_>) {
    let (Some(node), false) = (r.node, r.wireguard_peers.is_empty()) else { return };
    let _ = writeln!(out, "\nWireGuard peers of {} (Felix routes to them over WireGuard in its own table; BIRD's routes via them are rejected)", escape(node));
    let mut rows = vec![["NODE", "BGP ADDRESS"].map(String::from).to_vec()];
    for p in &r.wireguard_peers {
        rows.push(vec![p.node.clone(), p.bgp_address.to_string()]);
    }
    table(out, &rows);
}
