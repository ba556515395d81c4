//! IPPool (`api/pkg/apis/projectcalico/v3/ippool.go`).

use ipnet::IpNet;
use serde::Serialize;

use super::fields::{path_label, Fields};
use super::{FieldProblem, ModelError};

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
    pub name: String,
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
                    f.fail(
                        path_label(&path),
                        FieldProblem::InvalidValue { value: s.to_owned(), expected: "Never, Always or CrossSubnet" },
                    );
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
                Some(other) => f.fail(
                    field,
                    FieldProblem::InvalidValue { value: other.to_owned(), expected: "Workload, Tunnel or LoadBalancer" },
                ),
                None => f.fail(field, FieldProblem::WrongType { expected: "string", found: super::fields::type_name(item) }),
            }
        }
        let node_selector = f.string(&["spec", "nodeSelector"]).unwrap_or("all()").to_owned();

        let Some(cidr) = cidr else { return Err(f.take_errors()) };
        let v4 = matches!(cidr, IpNet::V4(_));
        let (min, max, default) = if v4 { (20, 32, 26) } else { (116, 128, 122) };
        let block_size = f.uint(&["spec", "blockSize"], min, max).map_or(default, |n| u8::try_from(n).unwrap_or(default));
        if block_size < cidr.prefix_len() {
            f.fail(
                "spec.blockSize",
                FieldProblem::Inconsistent(format!("block size /{block_size} is larger than the pool {cidr}")),
            );
        }
        // CRD XValidation on IPPoolSpec (ippool.go): "IPIP is not supported on IPv6 pools".
        if !v4 && ipip_mode.enabled() {
            f.fail("spec.ipipMode", FieldProblem::Inconsistent("IPIP is not supported on IPv6 pools".into()));
        }
        // v3 validation (libcalico-go validator): IPIP and VXLAN cannot both be enabled.
        if ipip_mode.enabled() && vxlan_mode.enabled() {
            f.fail(
                "spec.vxlanMode",
                FieldProblem::Inconsistent("ipipMode and vxlanMode cannot both be enabled".into()),
            );
        }
        let pool = IpPool {
            name: name.to_owned(),
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
