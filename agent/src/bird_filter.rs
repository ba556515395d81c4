//! `routewarden bird-filter`: the BIRD 2 side of the ownership contract, for users who run
//! upstream BIRD 2 next to routewarden without confd (issue 9, scenario S07).
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
mod tests {
    //! Oracle: for the five confd scenarios in `../shared/calico-testdata/confd/` (Calico
    //! master = the 3.33 line), *evaluate* both the golden `calico_kernel_programming` filter
    //! and our rendered filter for every pool CIDR (first matching `if (net ~ X)` line, else
    //! the final statement) and require the same verdict. Role `felix`: routewarden stands in
    //! for Felix, so BIRD's classes are exactly what BGPConfiguration gives BIRD, as for
    //! confd. (With role `bird`, BIRD exports no pool at all, tested separately.)

    use std::path::PathBuf;

    use super::*;
    use crate::datastore::FileDatastore;
    use crate::model::Cluster;
    use crate::ownership::{decide, wireguard_peers, CalicoVersion, ClusterRoutes, OwnershipConfig};

    const SCENARIOS: [&str; 5] =
        ["cluster_routes/default", "cluster_routes/enabled", "cluster_routes/ipip-only", "cluster_routes/noencap-only", "felix_cluster_routing"];

    fn testdata() -> PathBuf {
        let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/calico-testdata/confd"));
        assert!(p.is_dir(), "confd golden data missing at {}", p.display());
        p
    }

    /// A kernel filter as evaluated by BIRD for pool routes: per-CIDR rules, then the default.
    struct Evaluated {
        rules: Vec<(IpNet, KernelFilter)>,
        default: Option<KernelFilter>,
    }

    fn verdict_of(stmt: &str) -> Option<KernelFilter> {
        if stmt.contains("reject;") {
            Some(KernelFilter::Reject)
        } else if stmt.contains("accept;") {
            Some(KernelFilter::Accept)
        } else {
            None
        }
    }

    /// Parse `filter <name> { ... }` out of BIRD config text (comments stripped).
    fn parse_filter(text: &str, name: &str) -> Evaluated {
        let start = text.find(&format!("filter {name} {{")).unwrap_or_else(|| panic!("filter {name} present"));
        let mut out = Evaluated { rules: Vec::new(), default: None };
        let mut depth = 0i32;
        for raw in text[start..].lines() {
            let line = raw.split('#').next().unwrap_or("");
            let t = line.trim();
            if depth == 1 {
                if let Some(rest) = t.strip_prefix("if (net ~ ") {
                    let (cidr, tail) = rest.split_once(')').expect("closing paren");
                    let v = verdict_of(tail).unwrap_or_else(|| panic!("no verdict in {raw:?}"));
                    out.rules.push((cidr.trim().parse().expect("CIDR"), v));
                } else if let Some(v) = verdict_of(t).filter(|_| !t.starts_with("if")) {
                    out.default = Some(v);
                }
            }
            depth += i32::try_from(line.matches('{').count()).unwrap();
            depth -= i32::try_from(line.matches('}').count()).unwrap();
            if depth == 0 && line.contains('}') {
                break;
            }
        }
        out
    }

    impl Evaluated {
        fn eval(&self, net: IpNet) -> KernelFilter {
            self.rules.iter().find(|(c, _)| c.contains(&net)).map(|(_, v)| *v).or(self.default).expect("filter ends with a default statement")
        }
    }

    fn decision_for(dir: &std::path::Path, role: Role) -> OwnershipDecision {
        let snap = FileDatastore::load(dir.join("input.yaml")).expect("input.yaml loads");
        let config = OwnershipConfig { role, version: CalicoVersion::V3_33.into(), node: None };
        decide(&snap.cluster, &config)
    }

    #[test]
    fn kernel_filter_matches_confd_golden_with_role_felix() {
        let base = testdata();
        for sc in SCENARIOS {
            let dir = base.join(sc);
            let d = decision_for(&dir, Role::Felix);
            assert!(!d.pools.is_empty(), "{sc}: pools loaded");
            let ours = render(&d, &BirdFilterOptions::default());
            for (golden_file, ours_name, v6) in [("bird_ipam.cfg", KERNEL_FILTER_V4, false), ("bird6_ipam.cfg", KERNEL_FILTER_V6, true)] {
                let golden_text = std::fs::read_to_string(dir.join(golden_file)).expect("golden file");
                let golden = parse_filter(&golden_text, "calico_kernel_programming");
                let mine = parse_filter(&ours, ours_name);
                assert_eq!(mine.default, Some(KernelFilter::Accept), "{sc}: final accept for non-pool routes");
                let pools: Vec<_> = d.pools.iter().filter(|p| matches!(p.cidr, IpNet::V6(_)) == v6).collect();
                assert!(!pools.is_empty(), "{sc} {golden_file}: has pools");
                for p in pools {
                    assert_eq!(mine.eval(p.cidr), golden.eval(p.cidr), "{sc} {golden_file}: pool {} {}", p.pool, p.cidr);
                    // Every pool gets an explicit line in ours (confd's v6 template omits accepts).
                    assert!(mine.rules.iter().any(|(c, _)| *c == p.cidr), "{sc}: explicit line for {}", p.cidr);
                }
                // Every CIDR confd names is a pool we know.
                for (c, _) in &golden.rules {
                    assert!(d.pools.iter().any(|p| p.cidr == *c), "{sc} {golden_file}: golden CIDR {c} is a pool");
                }
                // iBGP tunnel-device reject: confd adds tunl0 exactly when BIRD does not own IPIP.
                let golden_tunl0 = golden_text.contains("(ifname ~ \"tunl0\")");
                let export = &ours[ours.find(&format!("function {EXPORT_FUNCTION}()")).expect("function")..];
                assert_eq!(export.contains("(ifname ~ \"tunl0\")"), golden_tunl0, "{sc} {golden_file}: tunl0 reject");
                assert_eq!(rejects_tunnel_device(&d), golden_tunl0, "{sc}: rejects_tunnel_device");
            }
        }
    }

    #[test]
    fn role_bird_rejects_every_pool_and_tunnel_routes() {
        let dir = testdata().join("cluster_routes/enabled");
        let d = decision_for(&dir, Role::Bird);
        let ours = render(&d, &BirdFilterOptions::default());
        for (name, v6) in [(KERNEL_FILTER_V4, false), (KERNEL_FILTER_V6, true)] {
            let f = parse_filter(&ours, name);
            for p in d.pools.iter().filter(|p| matches!(p.cidr, IpNet::V6(_)) == v6) {
                assert_eq!(f.eval(p.cidr), KernelFilter::Reject, "{} under role bird", p.cidr);
            }
            assert_eq!(f.default, Some(KernelFilter::Accept));
        }
        assert!(rejects_tunnel_device(&d));
        assert!(ours.contains("Role bird"));
    }

    #[test]
    fn export_rejects_routewarden_protocol_and_felix_protocol_when_felix_programs() {
        let dir = testdata().join("cluster_routes/default");
        // Role felix: Felix programs nothing but VXLAN, so only routewarden's protocol.
        let d = decision_for(&dir, Role::Felix);
        let opts = BirdFilterOptions { route_protocol: 90, ..BirdFilterOptions::default() };
        assert_eq!(rejected_protocols(&d, &opts), BTreeSet::from([90]));
        let ours = render(&d, &opts);
        assert!(ours.contains("if (krt_source = 90) then { reject; }"), "{ours}");
        assert!(!ours.contains("krt_source = 80"));
        // routewarden as a third writer: Felix keeps its classes (default EnabledIPIPOnly),
        // so Felix's protocol 80 is rejected too.
        let third = decision_for(&dir, Role::Explicit(ClusterRoutes::Disabled));
        assert!(third.writers_of(PoolClass::Ipip).contains(&Writer::Felix));
        assert_eq!(rejected_protocols(&third, &opts), BTreeSet::from([80, 90]));
        let ours = render(&third, &opts);
        assert!(ours.contains("if (krt_source = 80) then { reject; } # programmed by Felix"), "{ours}");
        // The guard: krt_source is read only for kernel-learned routes.
        let func = &ours[ours.find("function ").unwrap()..];
        let pos = |needle: &str| func.find(needle).unwrap_or_else(|| panic!("{needle} in function"));
        assert!(pos("source = RTS_INHERIT") < pos("defined(krt_source)"));
        assert!(pos("defined(krt_source)") < pos("krt_source = 80"));
    }

    #[test]
    fn header_names_the_decision_and_include() {
        let d = decision_for(&testdata().join("cluster_routes/noencap-only"), Role::Felix);
        let ours = render(&d, &BirdFilterOptions::default());
        assert!(ours.contains("routewarden role felix"));
        assert!(ours.contains(&format!("BIRD field:  {}", d.bird.value)));
        assert!(ours.contains(&format!("Felix field: {}", d.felix.value)));
        assert!(ours.contains("route protocol: 80"));
        assert!(ours.contains("include \"/etc/bird/routewarden.conf\";"));
        assert!(ours.contains("krt_metric = 1024;"));
    }

    /// One node of confd's `processWireguardPeerFilter` tests: `(name, BGP v4, BGP v6, WG v4,
    /// WG v6)`.
    type WgNode<'a> = (&'a str, Option<&'a str>, Option<&'a str>, Option<&'a str>, Option<&'a str>);

    fn wg_cluster(nodes: &[WgNode<'_>]) -> Cluster {
        let docs: Vec<serde_yaml_ng::Value> = nodes
            .iter()
            .map(|(name, b4, b6, w4, w6)| {
                let mut bgp = serde_yaml_ng::Mapping::new();
                if let Some(a) = b4 {
                    bgp.insert("ipv4Address".into(), format!("{a}/24").into());
                }
                if let Some(a) = b6 {
                    bgp.insert("ipv6Address".into(), format!("{a}/64").into());
                }
                let mut wg = serde_yaml_ng::Mapping::new();
                if let Some(a) = w4 {
                    wg.insert("interfaceIPv4Address".into(), (*a).into());
                }
                if let Some(a) = w6 {
                    wg.insert("interfaceIPv6Address".into(), (*a).into());
                }
                serde_yaml_ng::from_str(&format!(
                    "{{apiVersion: projectcalico.org/v3, kind: Node, metadata: {{name: {name}}}, spec: {{bgp: {}, wireguard: {}}}}}",
                    serde_json::to_string(&bgp).unwrap(),
                    serde_json::to_string(&wg).unwrap()
                ))
                .unwrap()
            })
            .collect();
        let (cluster, errors) = Cluster::from_values(&docs);
        assert!(errors.is_empty(), "{errors:?}");
        cluster
    }

    /// The statements of one family's kernel filter that test `bgp_next_hop`, without our
    /// trailing comment (confd's comment differs; the statement is what BIRD runs).
    fn wg_rejects(cluster: &Cluster, v6: bool) -> Vec<String> {
        let opts = BirdFilterOptions { wireguard_peers: wireguard_peers(cluster, "local-node"), ..BirdFilterOptions::default() };
        let d = crate::ownership::decide(cluster, &OwnershipConfig::default());
        let text = render(&d, &opts);
        let name = if v6 { KERNEL_FILTER_V6 } else { KERNEL_FILTER_V4 };
        let body = &text[text.find(&format!("filter {name} {{")).unwrap()..];
        let body = &body[..body.find("\n}").unwrap()];
        body.lines().filter(|l| l.contains("bgp_next_hop")).map(|l| l[..=l.find("} #").unwrap()].to_owned()).collect()
    }

    /// Golden: confd's own tests of `processWireguardPeerFilter`
    /// (`confd/pkg/backends/calico/bgp_processor_test.go`, `Test_processWireguardPeerFilterV4`,
    /// `..V6`, `.._NoWireguard`, `.._AllWireguard`, `.._LocalNoWireguard`): the same nodes give
    /// the same reject statements, in confd's (sorted) order, each in its own family's filter.
    #[test]
    fn wireguard_peer_rejects_match_confd() {
        let reject = |a: &str| format!("  if (defined(bgp_next_hop) && bgp_next_hop = {a}) then {{ reject; }}");
        // V4: one remote with WireGuard, one without.
        let c = wg_cluster(&[
            ("local-node", Some("10.0.0.1"), None, Some("192.168.1.1"), None),
            ("remote-wg", Some("10.0.0.2"), None, Some("192.168.1.2"), None),
            ("remote-nowg", Some("10.0.0.3"), None, None, None),
        ]);
        assert_eq!(wg_rejects(&c, false), [reject("10.0.0.2")]);
        assert_eq!(wg_rejects(&c, true), Vec::<String>::new());
        assert_eq!(wireguard_peers(&c, "local-node"), [("remote-wg".to_owned(), "10.0.0.2".parse().unwrap())]);
        // V6.
        let c = wg_cluster(&[
            ("local-node", None, Some("fd00::1"), None, Some("fd00:1::1")),
            ("remote-wg", None, Some("fd00::2"), None, Some("fd00:1::2")),
            ("remote-nowg", None, Some("fd00::3"), None, None),
        ]);
        assert_eq!(wg_rejects(&c, true), [reject("fd00::2")]);
        assert_eq!(wg_rejects(&c, false), Vec::<String>::new());
        // No WireGuard anywhere.
        let c = wg_cluster(&[
            ("local-node", Some("10.0.0.1"), None, None, None),
            ("remote-a", Some("10.0.0.2"), None, None, None),
            ("remote-b", Some("10.0.0.3"), None, None, None),
        ]);
        assert_eq!(wg_rejects(&c, false), Vec::<String>::new());
        // Everyone: one line per remote, sorted (as text: 10.0.0.10 before 10.0.0.2).
        let c = wg_cluster(&[
            ("local-node", Some("10.0.0.1"), None, Some("192.168.1.1"), None),
            ("remote-a", Some("10.0.0.2"), None, Some("192.168.1.2"), None),
            ("remote-b", Some("10.0.0.3"), None, Some("192.168.1.3"), None),
            ("remote-c", Some("10.0.0.10"), None, Some("192.168.1.10"), None),
        ]);
        assert_eq!(wg_rejects(&c, false), [reject("10.0.0.10"), reject("10.0.0.2"), reject("10.0.0.3")]);
        // The local node without WireGuard routes to WireGuard peers over BGP: nothing rejected.
        let c = wg_cluster(&[("local-node", Some("10.0.0.1"), None, None, None), ("remote-wg", Some("10.0.0.2"), None, Some("192.168.1.2"), None)]);
        assert_eq!(wg_rejects(&c, false), Vec::<String>::new());
        // A WireGuard peer without a BGP address has nothing to reject.
        let c = wg_cluster(&[("local-node", Some("10.0.0.1"), None, Some("192.168.1.1"), None), ("remote-wg", None, None, Some("192.168.1.2"), None)]);
        assert_eq!(wg_rejects(&c, false), Vec::<String>::new());
    }
}
