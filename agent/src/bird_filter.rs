//! `routewarden bird-filter`: the BIRD 2 side of the ownership contract, for users who run
//! upstream BIRD 2 next to routewarden without confd (scenario S07).
//!
//! [`render`] turns an [`OwnershipDecision`] into a `bird.conf` fragment with:
//! - `filter routewarden_kernel_programming_v4` and `..._v6`: BIRD's kernel export filter,
//!   modelled on confd's `calico_kernel_programming` (reference `calico-cluster-routes.md`
//!   §1.5, §1.7). One filter per family because BIRD 2 channels are per family and confd
//!   renders v4 and v6 separately (`bird_ipam.cfg` / `bird6_ipam.cfg`); each filter matches
//!   only its own family's pool CIDRs, so no cross-family `net ~` test is ever evaluated.
//! - `function routewarden_reject_foreign_cluster_routes()`: to call in the iBGP export
//!   filter; rejects kernel-learned routes routewarden (or Felix) programmed and, like
//!   confd's `IBGPExportFilterForTunnelRoutes`, tunnel-device routes (reference §5.4).
//!
//! Pure: no I/O. Checked with `bird -p` by `agent/tests/bird_filter.rs`.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use std::net::IpAddr;

use ipnet::IpNet;

use crate::ownership::{KernelFilter, OwnershipDecision, PoolOwnership, Role};
use crate::text::escape;
use crate::vocabulary::{PoolClass, PoolKind, Writer, RTPROT_FELIX};

/// Name of the IPv4 kernel export filter.
pub const KERNEL_FILTER_V4: &str = "routewarden_kernel_programming_v4";
/// Name of the IPv6 kernel export filter.
pub const KERNEL_FILTER_V6: &str = "routewarden_kernel_programming_v6";
/// Name of the iBGP export function.
pub const EXPORT_FUNCTION: &str = "routewarden_reject_foreign_cluster_routes";

/// Rendering options (from the CLI).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BirdFilterOptions {
    /// routewarden's route protocol (`--route-protocol`).
    pub route_protocol: u8,
    /// IPIP tunnel device (`--tunnel-device`, confd hard-codes `tunl0`).
    pub tunnel_device: String,
    /// confd's `NormalRoutePriority`: `krt_metric` for BGP routes (1024).
    pub normal_metric: u32,
    /// Path the header tells users to `include`.
    pub include_path: String,
    /// This node's IPv4 subnet (network of `Node.spec.bgp.ipv4Address`), confd's
    /// `/calico/bgp/v1/host/<node>/network_v4`: BGP next hops inside it get native routes in
    /// IPIP CrossSubnet pools. `None` (no `--node`, or no BGP address): every IPIP route
    /// goes through the tunnel, as for `ipipMode: Always`.
    pub local_subnet_v4: Option<IpNet>,
    /// CIDRs of IP pools that could not be classified (invalid, overlapping, unreadable),
    /// each with why: the kernel filters reject them first, so BIRD never programs a CIDR
    /// whose class it cannot know is its own (fail closed).
    pub unclassified: Vec<(IpNet, String)>,
    /// WireGuard peers, both families: `(node name, BGP address)` of every remote node that
    /// has a WireGuard interface address of the family, when this node has one too
    /// ([`wireguard_peers`](crate::ownership::wireguard_peers)). Their routes are Felix's
    /// WireGuard routing, so the kernel filter of that family rejects routes whose BGP next hop
    /// is the peer's address.
    pub wireguard_peers: Vec<(String, IpAddr)>,
}

impl Default for BirdFilterOptions {
    fn default() -> Self {
        BirdFilterOptions {
            route_protocol: 80,
            tunnel_device: "tunl0".into(),
            normal_metric: 1024,
            include_path: "/etc/bird/routewarden.conf".into(),
            local_subnet_v4: None,
            unclassified: Vec::new(),
            wireguard_peers: Vec::new(),
        }
    }
}

/// BIRD's kernel-filter verdict for one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolVerdict {
    pub pool: String,
    pub cidr: IpNet,
    pub kind: PoolKind,
    pub verdict: KernelFilter,
    /// Who programs the pool's routes instead, when rejected (for the comment).
    pub reason: &'static str,
}

/// Whether BIRD's kernel export accepts `pool` under `decision`.
///
/// BIRD accepts exactly when confd would (`pool.bird_kernel_filter`: the `default`
/// BGPConfiguration's classes, VXLAN never) **and** routewarden does not stand in for BIRD:
/// with `--role bird` routewarden programs BIRD's classes itself, so BIRD must export none of
/// them (the `Role::Bird` contract: BIRD runs without kernel export of pool routes).
/// With the other roles this equals "BIRD is a writer of the pool's class".
pub fn bird_accepts(decision: &OwnershipDecision, pool: &PoolOwnership) -> bool {
    decision.config.role != Role::Bird && pool.bird_kernel_filter == KernelFilter::Accept
}

/// The per-pool verdicts, in the decision's pool order (by pool name).
pub fn verdicts(decision: &OwnershipDecision) -> Vec<PoolVerdict> {
    decision
        .pools
        .iter()
        .map(|p| {
            let accept = bird_accepts(decision, p);
            let reason = if accept {
                ""
            } else if p.kind == PoolKind::Vxlan {
                "VXLAN routes are handled by Felix."
            } else if p.writers.contains(&Writer::Routewarden) {
                "Cluster routes are handled by routewarden."
            } else if p.writers.contains(&Writer::Felix) {
                "Cluster routes are handled by Felix."
            } else if p.class.is_none() {
                "LoadBalancer-only pool: no cluster routes."
            } else {
                "Not BIRD's class (no component programs it: see routewarden explain)."
            };
            PoolVerdict { pool: p.pool.clone(), cidr: p.cidr, kind: p.kind, verdict: if accept { KernelFilter::Accept } else { KernelFilter::Reject }, reason }
        })
        .collect()
}

/// Whether the iBGP export must reject tunnel-device routes: exactly when BIRD does not
/// program the IPIP class (confd adds `tunl0` to `IBGPExportFilterForTunnelRoutes` when BIRD
/// does not own IPIP, `bgp_processor.go` ~L920–941, commit `dc0f49fc43`): then every
/// `tunl0` route in BIRD's table was learned from the kernel, i.e. programmed by someone else.
pub fn rejects_tunnel_device(decision: &OwnershipDecision) -> bool {
    decision.config.role == Role::Bird || !decision.writers_of(PoolClass::Ipip).contains(&Writer::Bird)
}

/// Route protocols whose kernel-learned routes the iBGP export rejects: routewarden's, plus
/// Felix's cluster-route protocol 80 when Felix programs IPIP or no-encap routes (its
/// no-encap and same-subnet routes leave through the host NIC, so no `ifname` match catches
/// them: the gap reference §5.4 records for confd).
pub fn rejected_protocols(decision: &OwnershipDecision, opts: &BirdFilterOptions) -> BTreeSet<u8> {
    let mut out = BTreeSet::from([opts.route_protocol]);
    if felix_programs(decision) {
        out.insert(RTPROT_FELIX);
    }
    out
}

fn writers_text(ws: &[Writer]) -> String {
    if ws.is_empty() {
        "nobody".into()
    } else {
        ws.iter().map(|w| w.label()).collect::<Vec<_>>().join("+")
    }
}

/// Render the whole `bird.conf` fragment.
pub fn render(decision: &OwnershipDecision, opts: &BirdFilterOptions) -> String {
    let mut s = String::new();
    let vs = verdicts(decision);
    let protos = rejected_protocols(decision, opts);
    let protos_text = protos.iter().map(u8::to_string).collect::<Vec<_>>().join(", ");

    // Header.
    let _ = writeln!(s, "# Generated by `routewarden bird-filter` for upstream BIRD 2 (no confd). Regenerate when");
    let _ = writeln!(s, "# the IP pools, FelixConfiguration or BGPConfiguration programClusterRoutes change.");
    let _ = writeln!(s, "#");
    let _ = writeln!(s, "# Ownership decision (Calico {}, routewarden role {}):", escape(&decision.version.to_string()), decision.config.role);
    let _ = writeln!(s, "#   Felix field: {} ({})", decision.felix.value, escape(&decision.felix.source.to_string()));
    let _ = writeln!(s, "#   BIRD field:  {} ({})", decision.bird.value, escape(&decision.bird.source.to_string()));
    if let Some(e) = &decision.explicit {
        let _ = writeln!(s, "#   routewarden: {} ({})", e.value, escape(&e.source.to_string()));
    }
    for class in [PoolClass::Ipip, PoolClass::NoEncap, PoolClass::Vxlan] {
        let _ = writeln!(s, "#   {:<8} programmed by {}", class.label(), writers_text(&decision.writers_of(class)));
    }
    let _ = writeln!(s, "#   routewarden route protocol: {}", opts.route_protocol);
    for f in decision.findings.iter().filter(|f| f.is_error()) {
        let _ = writeln!(s, "# WARNING ({}): {}", f.code(), escape(&f.message));
    }
    for (cidr, why) in &opts.unclassified {
        let _ = writeln!(s, "# ERROR: {cidr} is rejected for BIRD: its IP pool could not be classified: {}", escape(why));
    }
    if decision.config.role == Role::Bird {
        let _ = writeln!(s, "# Role bird: routewarden programs BIRD's classes, so BIRD's kernel export rejects every pool.");
    }
    for (name, addr) in &opts.wireguard_peers {
        let _ = writeln!(s, "# WireGuard peer {} ({addr}): routes through it are Felix's WireGuard routing, rejected for BIRD.", escape(name));
    }
    let _ = writeln!(s, "#");
    let _ = writeln!(s, "# Use in bird.conf:");
    let _ = writeln!(s, "#   include \"{}\";", escape(&opts.include_path));
    let _ = writeln!(s, "#   protocol kernel k4 {{ learn; metric 0; ipv4 {{ import all; export filter {KERNEL_FILTER_V4}; }}; }}");
    let _ = writeln!(s, "#   protocol kernel k6 {{ learn; metric 0; ipv6 {{ import all; export filter {KERNEL_FILTER_V6}; }}; }}");
    let _ = writeln!(s, "# `metric 0`: BIRD 2 applies the filters' krt_metric (1024, as Felix and routewarden use) only");
    let _ = writeln!(s, "# when the kernel protocol's own metric is 0; with its default (32) every route gets 32.");
    let _ = writeln!(s, "# IPIP routes via {} need BIRD >= 2.0.12 (the `onlink` route attribute).", opts.tunnel_device);
    let _ = writeln!(s, "#   template bgp mesh {{ ... ipv4 {{ export filter {{ {EXPORT_FUNCTION}(); <your own-block accepts>; }}; }}; }}");
    let _ = writeln!(s, "# Call {EXPORT_FUNCTION}() for iBGP peers only (confd keeps eBGP as is).");
    let _ = writeln!(s, "# It rejects every kernel-learned route of protocol {protos_text}, including routewarden's own");
    let _ = writeln!(s, "# blackholes: advertise this node's blocks from a `protocol static` (as confd's bird_aggr.cfg does).");

    for (name, v6) in [(KERNEL_FILTER_V4, false), (KERNEL_FILTER_V6, true)] {
        render_kernel_filter(&mut s, &vs, name, v6, opts);
    }
    render_export_function(&mut s, decision, opts);
    s
}

/// One family's kernel export filter.
fn render_kernel_filter(s: &mut String, vs: &[PoolVerdict], name: &str, v6: bool, opts: &BirdFilterOptions) {
    {
        let _ = writeln!(s);
        let _ = writeln!(s, "# Kernel programming ({}): accept the pool classes BIRD owns, reject the others.", if v6 { "IPv6" } else { "IPv4" });
        let _ = writeln!(s, "# Mirrors confd's `filter calico_kernel_programming` (node/filesystem/etc/calico/confd/templates/");
        let _ = writeln!(s, "# bird{}_ipam.cfg.template; per-pool lines from `processIPPool`, confd/pkg/backends/calico/", if v6 { "6" } else { "" });
        let _ = writeln!(s, "# bgp_processor.go ~L1100-1140; metric block `SetMetricForBGPRoutes` from `populateNodeConfig` ~L242).");
        let _ = writeln!(s, "filter {name} {{");
        let m = opts.normal_metric;
        let _ = writeln!(s, "  if (defined(source) && (source = RTS_BGP) && !defined(krt_metric)) then {{");
        let _ = writeln!(s, "    krt_metric = {m};");
        let _ = writeln!(s, "    # confd derives the metric from bgp_local_pref, which Calico's BIRD carries only to elevate a");
        let _ = writeln!(s, "    # route (live migration). Upstream BIRD 2 gives every iBGP route local_pref 100, so only a");
        let _ = writeln!(s, "    # local_pref that elevates (metric below {m}) is honoured here.");
        let _ = writeln!(s, "    if (defined(bgp_local_pref) && (bgp_local_pref > {})) then {{", 2_147_483_647 - m);
        let _ = writeln!(s, "      krt_metric = 2147483647 - bgp_local_pref;");
        let _ = writeln!(s, "      preference = 200;");
        let _ = writeln!(s, "    }}");
        let _ = writeln!(s, "  }}");
        // Fail closed: a CIDR whose pool could not be classified is rejected before any pool
        // line can accept it.
        for (cidr, why) in opts.unclassified.iter().filter(|(c, _)| matches!(c, IpNet::V6(_)) == v6) {
            let _ = writeln!(s, "  if (net ~ {cidr}) then {{ reject; }} # unclassified IP pool: {}", escape(why));
        }
        // WireGuard peers: Felix routes to them over WireGuard in its own table, so BIRD must
        // not program routes through them (confd's `WireguardPeerKernelFilter`, placed after
        // the metric block in `calico_kernel_programming`; confd sorts the lines as text).
        let mut wg: Vec<String> = opts
            .wireguard_peers
            .iter()
            .filter(|(_, a)| a.is_ipv6() == v6)
            .map(|(name, a)| {
                format!("  if (defined(bgp_next_hop) && bgp_next_hop = {a}) then {{ reject; }} # WireGuard peer {}: Felix's WireGuard routing", escape(name))
            })
            .collect();
        wg.sort();
        for line in wg {
            let _ = writeln!(s, "{line}");
        }
        let mut rows: Vec<&PoolVerdict> = vs.iter().filter(|v| matches!(v.cidr, IpNet::V6(_)) == v6).collect();
        // confd sorts its statement list.
        rows.sort_by_key(|v| v.cidr);
        for v in rows {
            match v.verdict {
                KernelFilter::Accept => {
                    let stmt = match v.kind {
                        PoolKind::IpipAlways | PoolKind::IpipCrossSubnet => ipip_statement(v, opts),
                        _ => format!("accept; }} # {}", v.pool),
                    };
                    let _ = writeln!(s, "  if (net ~ {}) then {{ {}", v.cidr, escape(&stmt));
                }
                KernelFilter::Reject => {
                    let _ = writeln!(s, "  if (net ~ {}) then {{ reject; }} # {}: {}", v.cidr, escape(&v.pool), v.reason);
                }
            }
        }
        let _ = writeln!(s, "  accept; # not in an IP pool (confd's final accept)");
        let _ = writeln!(s, "}}");
    }
}

/// The body of an accepted IPIP pool's line, after `if (net ~ <cidr>) then {`.
///
/// confd sets `krt_tunnel="tunl0"`, which only Calico's BIRD fork knows
/// (`bird_ipam.cfg.template`; reference §1.5: CrossSubnet keeps native routes for next hops
/// in the local subnet). Upstream BIRD ≥ 2.0.12 expresses the same kernel route,
/// `via <next hop> dev tunl0 onlink`, with its route attributes: `ifname` makes the route a
/// device route on the tunnel, `onlink` (new in 2.0.12) lets `gw` name a next hop that is not
/// on the tunnel's subnet. Only BGP-learned routes (with a `bgp_next_hop`) are changed; this
/// node's own blackholes stay blackholes.
fn ipip_statement(v: &PoolVerdict, opts: &BirdFilterOptions) -> String {
    let dev = &opts.tunnel_device;
    let tunnel = format!("ifname = \"{dev}\"; onlink = true; gw = bgp_next_hop;");
    match (v.kind, opts.local_subnet_v4) {
        (PoolKind::IpipCrossSubnet, Some(subnet)) => format!(
            "if (defined(bgp_next_hop)) then {{ if !(bgp_next_hop ~ {subnet}) then {{ {tunnel} }} }} accept; }} # {}: IPIP CrossSubnet: via {dev} onlink unless the next hop is in {subnet} (confd's krt_tunnel)",
            v.pool
        ),
        (PoolKind::IpipCrossSubnet, None) => format!(
            "if (defined(bgp_next_hop)) then {{ {tunnel} }} accept; }} # {}: IPIP CrossSubnet, but this node's subnet is unknown (pass --node): every route via {dev}",
            v.pool
        ),
        _ => format!(
            "if (defined(bgp_next_hop)) then {{ {tunnel} }} accept; }} # {}: IPIP: via {dev} onlink (confd's krt_tunnel=\"{dev}\")",
            v.pool
        ),
    }
}

/// The iBGP export function.
fn render_export_function(s: &mut String, decision: &OwnershipDecision, opts: &BirdFilterOptions) {
    let protos = rejected_protocols(decision, opts);
    let tunnel = rejects_tunnel_device(decision);
    let _ = writeln!(s);
    let _ = writeln!(s, "# iBGP export: never re-advertise routes another component programmed on this node (scenario S07).");
    let _ = writeln!(s, "# The kernel protocol's `learn` imports them (source RTS_INHERIT), and the iBGP rule against");
    let _ = writeln!(s, "# re-advertising iBGP-learned routes does not cover them. krt_source is the kernel route's");
    let _ = writeln!(s, "# rtm_protocol, defined only on kernel-learned routes (BIRD 2 doc, kernel protocol attributes).");
    let _ = writeln!(s, "# The ifname rejects mirror confd's `IBGPExportFilterForTunnelRoutes` (bgp_processor.go ~L920-941).");
    let _ = writeln!(s, "function {EXPORT_FUNCTION}() {{");
    let _ = writeln!(s, "  if (source = RTS_INHERIT) then {{");
    let _ = writeln!(s, "    if (defined(krt_source)) then {{");
    for p in &protos {
        let who = match (*p == opts.route_protocol, *p == RTPROT_FELIX && felix_programs(decision)) {
            (true, true) => "routewarden and Felix",
            (true, false) => "routewarden",
            _ => "Felix",
        };
        let _ = writeln!(s, "      if (krt_source = {p}) then {{ reject; }} # programmed by {who}");
    }
    let _ = writeln!(s, "    }}");
    let _ = writeln!(s, "  }}");
    let _ = writeln!(s, "  if (defined(ifname)) then {{");
    if tunnel {
        let _ = writeln!(
            s,
            "    if ((ifname ~ \"*.cali\") || (ifname ~ \"*.calico\") || (ifname ~ \"{}\")) then {{ reject; }} # VXLAN, WireGuard; IPIP not BIRD's",
            opts.tunnel_device
        );
    } else {
        let _ = writeln!(s, "    if ((ifname ~ \"*.cali\") || (ifname ~ \"*.calico\")) then {{ reject; }} # VXLAN, WireGuard");
    }
    let _ = writeln!(s, "  }}");
    let _ = writeln!(s, "}}");
}

/// Whether Felix programs IPIP or no-encap routes under `decision`.
fn felix_programs(decision: &OwnershipDecision) -> bool {
    [PoolClass::Ipip, PoolClass::NoEncap].iter().any(|c| decision.writers_of(*c).contains(&Writer::Felix))
}

#[cfg(test)]
mod tests;
