//! IPPool (`api/pkg/apis/projectcalico/v3/ippool.go`), validated as Calico's IP pool client
//! validates a pool before storing it (`libcalico-go/lib/clientv3/ippool.go`
//! `validateAndSetDefaults`): a valid CIDR that is strictly masked, a block size in range and
//! no larger than the pool, not both IPIP and VXLAN, no IPIP on IPv6, no overlap with the
//! link-local ranges (so never `/0`), and no overlap with another pool ([`check_pools`]).
//! A pool written past those checks (`kubectl apply` of the CRD, a file) is an invalid object
//! here: its CIDR becomes frozen ground, never routed, claimed or cleaned.

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::Serialize;

use super::error::{FieldProblem, ModelError, Rejected};
use super::fields::{path_label, Fields};
use super::kind::Kind;

/// `ipipMode` / `vxlanMode` of an IP pool. Absent means `Never`
/// (`libcalico-go/lib/backend/k8s/resources/ippool.go` `IPPoolV3ToV1`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum EncapMode {
    #[default]
    Never,
    Always,
    CrossSubnet,
}

impl EncapMode {
    /// Exact-case parse, as the CRD enum and the v3 API validation accept it.
    pub fn parse(s: &str) -> Option<EncapMode> {
        match s {
            "Never" | "" => Some(EncapMode::Never),
            "Always" => Some(EncapMode::Always),
            "CrossSubnet" => Some(EncapMode::CrossSubnet),
            _ => None,
        }
    }

    /// `Always` or `CrossSubnet`.
    pub fn enabled(self) -> bool {
        self != EncapMode::Never
    }
}

/// One entry of `spec.allowedUses`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum AllowedUse {
    Workload,
    Tunnel,
    LoadBalancer,
}

/// A Calico IP pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IpPool {
    /// `metadata.name`.
    pub name: std::sync::Arc<str>,
    /// `spec.cidr`, truncated to its network (Calico stores the normalised network).
    pub cidr: IpNet,
    pub ipip_mode: EncapMode,
    pub vxlan_mode: EncapMode,
    pub nat_outgoing: bool,
    /// `spec.disabled`: stops IPAM allocating from the pool; routing is unaffected (neither
    /// confd `processIPPool` nor Felix `getPoolInfo` reads it).
    pub disabled: bool,
    /// `spec.disableBGPExport`: affects only BIRD's export filter, not kernel programming.
    pub disable_bgp_export: bool,
    /// `spec.blockSize`, prefix length of the pool's IPAM blocks (default 26 for IPv4, 122 for
    /// IPv6).
    pub block_size: u8,
    /// `spec.allowedUses`; empty in the source means `[Workload, Tunnel]`.
    pub allowed_uses: Vec<AllowedUse>,
    /// `spec.nodeSelector` (default `all()`); steers IPAM only, never routing.
    pub node_selector: String,
}

impl IpPool {
    /// True when the pool is used only for LoadBalancer IPs: Felix's L3 resolver gives it pool
    /// type NONE and no cluster routes (`felix/calc/l3_route_resolver.go`
    /// `isLoadBalancerOnlyPool`).
    pub fn is_load_balancer_only(&self) -> bool {
        !self.allowed_uses.is_empty() && self.allowed_uses.iter().all(|u| *u == AllowedUse::LoadBalancer)
    }

    /// True when either mode is `CrossSubnet` (`l3_route_resolver.go` `getPoolInfo`).
    pub fn cross_subnet(&self) -> bool {
        self.ipip_mode == EncapMode::CrossSubnet || self.vxlan_mode == EncapMode::CrossSubnet
    }

    pub(crate) fn parse(f: &mut Fields<'_>, name: &str) -> Result<IpPool, Vec<ModelError>> {
        let cidr = f.cidr(&["spec", "cidr"]);
        if cidr.is_none() && f.get(&["spec", "cidr"]).is_none() {
            f.fail("spec.cidr", FieldProblem::Missing);
        }
        let mode = |f: &mut Fields<'_>, key: &str| -> EncapMode {
            let path = ["spec", key];
            match f.string(&path) {
                None => EncapMode::Never,
                Some(s) => EncapMode::parse(s).unwrap_or_else(|| {
                    f.fail(path_label(&path), FieldProblem::InvalidValue { value: s.to_owned(), expected: "Never, Always or CrossSubnet" });
                    EncapMode::Never
                }),
            }
        };
        let ipip_mode = mode(f, "ipipMode");
        let vxlan_mode = mode(f, "vxlanMode");
        let nat_outgoing = f.bool_lenient(&["spec", "natOutgoing"]).unwrap_or(false);
        let disabled = f.bool_lenient(&["spec", "disabled"]).unwrap_or(false);
        let disable_bgp_export = f.bool_lenient(&["spec", "disableBGPExport"]).unwrap_or(false);
        let mut allowed_uses = Vec::new();
        for (i, item) in f.seq(&["spec", "allowedUses"]).iter().enumerate() {
            let field = format!("spec.allowedUses[{i}]");
            match item.as_str() {
                Some("Workload") => allowed_uses.push(AllowedUse::Workload),
                Some("Tunnel") => allowed_uses.push(AllowedUse::Tunnel),
                Some("LoadBalancer") => allowed_uses.push(AllowedUse::LoadBalancer),
                Some(other) => f.fail(field, FieldProblem::InvalidValue { value: other.to_owned(), expected: "Workload, Tunnel or LoadBalancer" }),
                None => f.fail(field, FieldProblem::WrongType { expected: "string", found: super::fields::type_name(item) }),
            }
        }
        let node_selector = f.string(&["spec", "nodeSelector"]).unwrap_or("all()").to_owned();

        let Some(cidr) = cidr else { return Err(f.take_errors()) };
        // `validateAndSetDefaults`: "IPPool CIDR is not strictly masked".
        if cidr.addr() != cidr.network() {
            f.fail("spec.cidr", FieldProblem::Inconsistent(format!("{cidr} is not strictly masked (host bits are set; the network is {})", cidr.trunc())));
        }
        // `validateAndSetDefaults`: a pool must not overlap the link-local ranges; this also
        // refuses `0.0.0.0/0` and `::/0`.
        let link_local: IpNet = if cidr.addr().is_ipv4() { LINK_LOCAL_V4.parse().unwrap_or(cidr) } else { LINK_LOCAL_V6.parse().unwrap_or(cidr) };
        if overlaps(cidr, link_local) {
            f.fail("spec.cidr", FieldProblem::Inconsistent(format!("{cidr} overlaps the link-local range {link_local}")));
        }
        let v4 = matches!(cidr, IpNet::V4(_));
        let (min, max, default) = if v4 { (20, 32, 26) } else { (116, 128, 122) };
        let block_size = f.uint(&["spec", "blockSize"], min, max).map_or(default, |n| u8::try_from(n).unwrap_or(default));
        if block_size < cidr.prefix_len() {
            f.fail("spec.blockSize", FieldProblem::Inconsistent(format!("block size /{block_size} is larger than the pool {cidr}")));
        }
        // CRD XValidation on IPPoolSpec (ippool.go): "IPIP is not supported on IPv6 pools".
        if !v4 && ipip_mode.enabled() {
            f.fail("spec.ipipMode", FieldProblem::Inconsistent("IPIP is not supported on IPv6 pools".into()));
        }
        // v3 validation (libcalico-go validator): IPIP and VXLAN cannot both be enabled.
        if ipip_mode.enabled() && vxlan_mode.enabled() {
            f.fail("spec.vxlanMode", FieldProblem::Inconsistent("ipipMode and vxlanMode cannot both be enabled".into()));
        }
        let pool = IpPool {
            name: name.into(),
            cidr: cidr.trunc(),
            ipip_mode,
            vxlan_mode,
            nat_outgoing,
            disabled,
            disable_bgp_export,
            block_size,
            allowed_uses,
            node_selector,
        };
        f.take_result(pool)
    }
}

const LINK_LOCAL_V4: &str = "169.254.0.0/16";
const LINK_LOCAL_V6: &str = "fe80::/10";

/// Whether two prefixes share an address (one contains the other).
pub(crate) fn overlaps(a: IpNet, b: IpNet) -> bool {
    a.contains(&b) || b.contains(&a)
}

/// Take every IP pool whose CIDR overlaps another pool's out of `ip_pools` and return one
/// rejection per such pool, naming the pools it overlaps. Calico's IP pool client refuses to
/// create a pool that overlaps an existing one ("IPPool(a) CIDR overlaps with IPPool(b) CIDR
/// 10.244.0.0/16", `libcalico-go/lib/clientv3/ippool.go` `validateAndSetDefaults`); which one
/// came first is not known here, so every pool of an overlap is invalid and a prefix inside
/// two pools is never routed as either's. Pure; O(n log n) in the number of pools.
pub fn check_pools(ip_pools: &mut BTreeMap<String, IpPool>) -> Vec<Rejected> {
    let mut pools: Vec<(&String, IpNet)> = ip_pools.iter().map(|(n, p)| (n, p.cidr)).collect();
    // Sorted by address then prefix length, a pool can only overlap later pools that start
    // inside it; each run of overlaps is found with one pass and a running maximum.
    pools.sort_by(|a, b| (a.1.network(), a.1.prefix_len(), a.0).cmp(&(b.1.network(), b.1.prefix_len(), b.0)));
    let mut overlapping: std::collections::BTreeMap<String, Vec<(String, IpNet)>> = std::collections::BTreeMap::new();
    for (i, (name, cidr)) in pools.iter().enumerate() {
        for (other, ocidr) in pools.iter().skip(i + 1) {
            if ocidr.addr().is_ipv4() != cidr.addr().is_ipv4() {
                continue;
            }
            if !cidr.contains(ocidr) {
                if ocidr.network() > cidr.broadcast() {
                    break;
                }
                continue;
            }
            overlapping.entry((*name).clone()).or_default().push(((*other).clone(), *ocidr));
            overlapping.entry((*other).clone()).or_default().push(((*name).clone(), *cidr));
        }
    }
    let mut out = Vec::new();
    for (name, others) in overlapping {
        let Some(pool) = ip_pools.remove(&name) else { continue };
        let list = others.iter().map(|(n, c)| format!("IPPool {n:?} ({c})")).collect::<Vec<_>>().join(", ");
        let error = ModelError::Field {
            kind: Kind::IpPool,
            name: name.clone(),
            field: "spec.cidr".into(),
            problem: FieldProblem::Inconsistent(format!("{} overlaps {list}; overlapping pools are invalid and their CIDRs are frozen until fixed", pool.cidr)),
        };
        out.push(Rejected::new(error, vec![pool.cidr]));
    }
    out
}
