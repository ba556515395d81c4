//! Audit: compare the kernel's routes with what each owner (Felix, BIRD, routewarden) should
//! have programmed, and report per prefix. Programs nothing.
//!
//! [`audit`] is a pure function over a table's routes (all protocols); [`audit_kernel`] dumps
//! the kernel and calls it. Findings carry stable codes ([`FindingCode`]) and serialize with
//! serde, for `routewarden audit -o json`.
//!
//! Rules, per destination prefix in the audited table (only unicast and blackhole routes of
//! universe scope count; kernel-protocol routes, link-scope routes and local workload routes
//! (no gateway, on a device that is neither the tunnel nor the host NIC: Felix's or a CNI's
//! routes to pods on `cali*`, which IPv6 gives universe scope) are never findings):
//!
//! - `missing`: the expected owner's route (its protocol, any metric) is absent.
//! - `wrong-path`: the owner's route exists but goes another way (tunnel vs host NIC vs
//!   blackhole, i.e. kind or device differ).
//! - `wrong-next-hop`: same path, other gateway (a moved node IP not yet followed). BIRD's
//!   routes may instead go via the underlay next hop toward the expected gateway (the
//!   gateway of the table's longest non-cluster route covering it): Calico's mesh peers use
//!   `gateway recursive` (confd `bird.cfg.template`), so a peer in another subnet is reached
//!   through the router, as BIRD resolves it.
//! - `duplicate`: more than one route for the prefix (two protocols, or one protocol at two
//!   metrics), at any metric (reference §5.1/§5.5: Felix metric 0 vs BIRD 1024).
//! - `stale`: a route from a known cluster-route writer (Felix, BIRD, routewarden) for a prefix
//!   that writer should not have (not expected at all, or expected from another owner).
//! - `foreign-writer`: a route of any other protocol on a cluster prefix (scenario S05).
//!
//! With routewarden in a table other than main, [`audit_kernel`] also checks the policy
//! rules (`crate::dataplane::table_rule`): per family of routewarden's expected routes there,
//! `no-rule-for-table` when no `ip rule` looks the table up (a finding: the report is not
//! clean), `rule-selects-some-traffic` when only selective rules do (a note).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

use crate::dataplane::kernel::dump::ReadKernel;
use crate::dataplane::kernel::netlink::NetlinkError;
use crate::dataplane::kernel::nexthop::ObservedNexthop;
use crate::dataplane::kernel::route::{Family, KernelRoute, RouteKind, RT_SCOPE_UNIVERSE};
use crate::dataplane::table_rule::{check_table, TableRuleCheck};
pub use crate::plan::{AuditScope, ExpectedRoute, WireguardRoute};
use crate::routes::{ClusterRoute, RouteDevices};
use crate::vocabulary::{RoutePath, Writer};
use crate::vocabulary::{RTPROT_BIRD, RTPROT_FELIX, RTPROT_KERNEL, RT_TABLE_MAIN};

/// Stable finding codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FindingCode {
    /// The owner's route is absent.
    Missing,
    /// A known writer's route for a prefix it should not have.
    Stale,
    /// More than one route for the prefix.
    Duplicate,
    /// The owner's route takes another path.
    WrongPath,
    /// The owner's route uses another gateway.
    WrongNextHop,
    /// Another protocol on a cluster prefix.
    ForeignWriter,
    /// A cluster prefix of a class no component programs (the ownership finding `unowned`).
    Unowned,
}

impl FindingCode {
    /// Every code, in declaration order (for metrics that report zeros too).
    pub const ALL: [FindingCode; 7] = [
        FindingCode::Missing,
        FindingCode::Stale,
        FindingCode::Duplicate,
        FindingCode::WrongPath,
        FindingCode::WrongNextHop,
        FindingCode::ForeignWriter,
        FindingCode::Unowned,
    ];

    /// The code as printed and used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            FindingCode::Missing => "missing",
            FindingCode::Stale => "stale",
            FindingCode::Duplicate => "duplicate",
            FindingCode::WrongPath => "wrong-path",
            FindingCode::WrongNextHop => "wrong-next-hop",
            FindingCode::ForeignWriter => "foreign-writer",
            FindingCode::Unowned => "unowned",
        }
    }
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct AuditFinding {
    /// The prefix.
    pub prefix: IpNet,
    /// What is wrong.
    pub code: FindingCode,
    /// Who should program the prefix (`None`: nobody should).
    pub owner: Option<Writer>,
    /// The expected route (`ip route` form), if any.
    pub expected: Option<String>,
    /// The kernel routes the finding is about (`ip route` form).
    pub found: Vec<String>,
    /// One line for humans.
    pub detail: String,
}

/// The result of an audit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AuditReport {
    /// The audited table.
    pub table: u32,
    /// Expectations checked.
    pub expected: usize,
    /// Kernel routes considered (cluster prefixes only).
    pub kernel_routes: usize,
    /// Findings, sorted by prefix then code.
    pub findings: Vec<AuditFinding>,
    /// Cluster prefixes behind this node's WireGuard peers that BIRD does not program (confd
    /// rejects routes whose `bgp_next_hop` is the peer: "WireGuard routes handled by Felix",
    /// `processWireguardPeerFilter`): Felix routes them over WireGuard in its own table. Not
    /// findings; listed so that they do not read as missing routes.
    pub wireguard: Vec<WireguardRoute>,
    /// With routewarden's table other than main: whether a policy rule sends traffic to it,
    /// per family routewarden has routes of there ([`check_table`]); empty otherwise.
    pub table_rules: Vec<TableRuleCheck>,
}

impl AuditReport {
    /// Whether nothing was found: no finding, and a rule selects routewarden's table for
    /// every family it has routes of there.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty() && self.table_rules.iter().all(TableRuleCheck::selected)
    }

    /// Finding counts by code.
    pub fn counts(&self) -> BTreeMap<FindingCode, usize> {
        let mut m = BTreeMap::new();
        for f in &self.findings {
            *m.entry(f.code).or_insert(0) += 1;
        }
        m
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path<'a> {
    Blackhole,
    Dev(&'a str),
    Other,
}

fn kernel_path(r: &KernelRoute) -> Path<'_> {
    match r.target.kind {
        RouteKind::Blackhole => Path::Blackhole,
        RouteKind::Unicast => r.target.device.as_deref().map_or(Path::Other, Path::Dev),
        RouteKind::Other(_) => Path::Other,
    }
}

fn expected_path<'a>(c: &'a ClusterRoute, devices: &'a RouteDevices) -> Path<'a> {
    match c.path {
        RoutePath::Blackhole => Path::Blackhole,
        RoutePath::Tunnel => Path::Dev(c.device.as_deref().unwrap_or(&devices.tunnel)),
        RoutePath::HostNic => Path::Dev(c.device.as_deref().unwrap_or(&devices.host_nic)),
    }
}

fn render_expected(e: &ExpectedRoute, devices: &RouteDevices) -> String {
    let c = &e.route;
    let mut s = match c.path {
        RoutePath::Blackhole => format!("blackhole {}", c.dst),
        _ => format!("{}", c.dst),
    };
    if let Some(gw) = c.gateway {
        let _ = write!(s, " via {gw}");
    }
    if let Path::Dev(d) = expected_path(c, devices) {
        let _ = write!(s, " dev {d}");
    }
    let _ = write!(s, " proto {} ({})", e.protocol, e.owner.label());
    s
}

/// Compare `kernel` (every route of the table, all protocols) with `expected`.
/// Pure; see the module documentation for the rules.
#[expect(clippy::too_many_lines, reason = "one pass over the prefixes, each rule next to the finding it makes; split, the rules would read out of order")]
pub fn audit<'e, E: IntoIterator<Item = &'e ExpectedRoute> + Clone>(kernel: &[KernelRoute], expected: E, scope: &AuditScope) -> AuditReport {
    let mut writers: BTreeMap<u8, Writer> = BTreeMap::new();
    writers.insert(RTPROT_FELIX, Writer::Felix);
    writers.insert(RTPROT_BIRD, Writer::Bird);
    writers.insert(scope.our_protocol, Writer::Routewarden);
    for e in expected.clone() {
        writers.insert(e.protocol, e.owner);
    }
    let mut exp_by_dst: BTreeMap<IpNet, &ExpectedRoute> = BTreeMap::new();
    let mut exp_count = 0;
    for e in expected {
        exp_by_dst.entry(e.route.dst.trunc()).or_insert(e);
        exp_count += 1;
    }
    let is_cluster = |dst: &IpNet| exp_by_dst.contains_key(dst) || scope.cluster_cidrs.iter().any(|c| c.contains(dst));
    let local_workload = |r: &KernelRoute| {
        r.target.kind == RouteKind::Unicast
            && r.target.gateway.is_none()
            && r.target.device.as_deref().is_some_and(|d| d != scope.devices.tunnel && d != scope.devices.host_nic)
    };
    let relevant = |r: &&KernelRoute| {
        r.key.table == scope.table
            && matches!(r.target.kind, RouteKind::Unicast | RouteKind::Blackhole)
            && r.target.scope == RT_SCOPE_UNIVERSE
            && r.target.protocol != RTPROT_KERNEL
            && !local_workload(r)
            && is_cluster(&r.key.dst)
    };
    // The underlay's next hop toward an address: the gateway of the longest non-cluster
    // unicast route covering it (for BIRD's recursive next hops).
    let underlay_gateway = |addr: IpAddr| -> Option<IpAddr> {
        kernel
            .iter()
            .filter(|r| r.key.table == scope.table && r.target.kind == RouteKind::Unicast && !is_cluster(&r.key.dst) && r.key.dst.contains(&addr))
            .max_by_key(|r| (r.key.dst.prefix_len(), std::cmp::Reverse(r.key.metric)))
            .and_then(|r| r.target.gateway)
    };
    let mut by_dst: BTreeMap<IpNet, Vec<&KernelRoute>> = BTreeMap::new();
    let mut considered = 0;
    for r in kernel.iter().filter(relevant) {
        considered += 1;
        by_dst.entry(r.key.dst).or_default().push(r);
    }
    let unowned: BTreeMap<IpNet, &String> = scope.unowned.iter().map(|(d, why)| (d.trunc(), why)).collect();
    let prefixes: BTreeSet<IpNet> = exp_by_dst.keys().chain(by_dst.keys()).chain(unowned.keys()).copied().collect();
    let mut findings = Vec::new();
    for dst in prefixes {
        let routes = by_dst.get(&dst).map(Vec::as_slice).unwrap_or_default();
        let exp = exp_by_dst.get(&dst).copied();
        let owner = exp.map(|e| e.owner);
        let expected_str = exp.map(|e| render_expected(e, &scope.devices));
        let mut push = |code: FindingCode, found: Vec<String>, detail: String| {
            findings.push(AuditFinding { prefix: dst, code, owner, expected: expected_str.clone(), found, detail });
        };
        if let (None, Some(why)) = (exp, unowned.get(&dst)) {
            push(FindingCode::Unowned, routes.iter().map(ToString::to_string).collect(), format!("nobody programs {dst}: {why}"));
        }
        if let Some(e) = exp {
            let mine: Vec<&&KernelRoute> = routes.iter().filter(|r| r.target.protocol == e.protocol).collect();
            if mine.is_empty() {
                push(
                    FindingCode::Missing,
                    routes.iter().map(ToString::to_string).collect(),
                    format!("{} should program {dst} (proto {}) but the kernel has no such route", e.owner.label(), e.protocol),
                );
            }
            let want_path = expected_path(&e.route, &scope.devices);
            for r in &mine {
                let have = kernel_path(r);
                if have != want_path {
                    push(FindingCode::WrongPath, vec![r.to_string()], format!("{dst} goes {} but should go {}", path_label(have), path_label(want_path)));
                } else if want_path != Path::Blackhole
                    && r.target.gateway != e.route.gateway
                    && !(e.owner == Writer::Bird && r.target.gateway.is_some() && r.target.gateway == e.route.gateway.and_then(underlay_gateway))
                {
                    push(
                        FindingCode::WrongNextHop,
                        vec![r.to_string()],
                        format!("{dst} goes via {} but should go via {}", opt_ip(r.target.gateway), opt_ip(e.route.gateway)),
                    );
                }
            }
        }
        for r in routes.iter().filter(|r| exp.is_none_or(|e| r.target.protocol != e.protocol)) {
            match writers.get(&r.target.protocol) {
                Some(w) => push(
                    FindingCode::Stale,
                    vec![r.to_string()],
                    match owner {
                        Some(o) => format!("{} route for {dst}, which {} owns", w.label(), o.label()),
                        None => format!("{} route for {dst}, which nobody should program", w.label()),
                    },
                ),
                None => push(FindingCode::ForeignWriter, vec![r.to_string()], format!("proto {} writes cluster prefix {dst}", r.target.protocol)),
            }
        }
        let distinct: BTreeSet<(u8, u32)> = routes.iter().map(|r| (r.target.protocol, r.key.metric)).collect();
        if distinct.len() > 1 {
            push(
                FindingCode::Duplicate,
                routes.iter().map(ToString::to_string).collect(),
                format!("{} routes for {dst} (protocol, metric): {distinct:?}", distinct.len()),
            );
        }
    }
    findings.sort();
    AuditReport { table: scope.table, expected: exp_count, kernel_routes: considered, findings, wireguard: scope.wireguard.clone(), table_rules: Vec::new() }
}

fn opt_ip(ip: Option<IpAddr>) -> String {
    ip.map_or_else(|| "-".to_string(), |i| i.to_string())
}

fn path_label(p: Path<'_>) -> String {
    match p {
        Path::Blackhole => "blackhole".into(),
        Path::Dev(d) => format!("dev {d}"),
        Path::Other => "elsewhere".into(),
    }
}

/// [`audit`] with routewarden in its own table (`--route-table`, e.g. 48): routewarden's
/// expectations are checked in `scope.table`, Felix's and BIRD's in main, where they
/// program (Felix's route table and BIRD's kernel protocol without `kernel table`, reference
/// §1.7); the unowned prefixes are reported once, from main. With `scope.table` main this is
/// [`audit`]. `kernel` holds the routes of both tables.
pub fn audit_tables<'e>(kernel: &[KernelRoute], expected: impl IntoIterator<Item = &'e ExpectedRoute> + Clone, scope: &AuditScope) -> AuditReport {
    if scope.table == RT_TABLE_MAIN {
        return audit(kernel, expected, scope);
    }
    let (ours, others): (Vec<&ExpectedRoute>, Vec<&ExpectedRoute>) = expected.into_iter().partition(|e| e.owner == Writer::Routewarden);
    let mut report = audit(kernel, ours.iter().copied(), &AuditScope { unowned: Vec::new(), wireguard: Vec::new(), ..scope.clone() });
    let main = audit(kernel, others.iter().copied(), &AuditScope { table: RT_TABLE_MAIN, ..scope.clone() });
    report.expected += main.expected;
    report.kernel_routes += main.kernel_routes;
    report.findings.extend(main.findings);
    report.wireguard = main.wireguard;
    report.findings.sort();
    report
}

/// Dump every route of `scope.table` and of main (both families, all protocols) and every
/// link, then [`audit_tables`]; with `scope.table` other than main and routewarden expected
/// to have routes there, dump the policy rules too and [`check_table`].
///
/// # Errors
/// A failed dump ([`NetlinkError`]).
pub async fn audit_kernel<'e, N: ReadKernel>(
    nl: &mut N,
    expected: impl IntoIterator<Item = &'e ExpectedRoute> + Clone,
    scope: &AuditScope,
) -> Result<AuditReport, NetlinkError> {
    let links = nl.read_links().await?;
    let names: BTreeMap<u32, std::sync::Arc<str>> = links.into_iter().map(|l| (l.index, l.name.into())).collect();
    // A route through a nexthop object is judged by the object's gateway and device (with
    // `nexthop_compat_mode` off the kernel reports only the id). No nexthop objects (a kernel
    // before 5.3): nothing to resolve.
    let nexthops: BTreeMap<u32, ObservedNexthop> = nl.read_nexthops().await.unwrap_or_default().into_iter().map(|n| (n.id, n)).collect();
    let mut routes = Vec::new();
    for table in BTreeSet::from([scope.table, RT_TABLE_MAIN]) {
        for family in [Family::V4, Family::V6] {
            let observed = nl.read_routes(family, table, 0).await?;
            routes.extend(observed.into_iter().filter(|r| !r.cloned).map(|r| r.through(&nexthops).named(|i| names.get(&i).cloned())));
        }
    }
    let mut report = audit_tables(&routes, expected.clone(), scope);
    let ours: Vec<IpNet> = expected.into_iter().filter(|e| e.owner == Writer::Routewarden).map(|e| e.route.dst).collect();
    if scope.table != RT_TABLE_MAIN && !ours.is_empty() {
        let mut rules = nl.read_rules(Family::V4).await?;
        rules.extend(nl.read_rules(Family::V6).await?);
        report.table_rules = check_table(&rules, scope.table, &ours);
    }
    Ok(report)
}

#[cfg(test)]
mod tests;
