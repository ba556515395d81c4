//! IPAMBlock (`libcalico-go/lib/apis/internalapi/ipam_block.go`, model
//! `libcalico-go/lib/backend/model/block.go`) and BlockAffinity
//! (`api/pkg/apis/projectcalico/v3/blockaffinity.go`, `model/block_affinity.go`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::Serialize;
use serde_yaml_ng::Value;

use super::error::{FieldProblem, ModelError};
use super::fields::{type_name, Fields};
use super::names::{block_name, is_dns1123_subdomain};

const NODE_NAME: &str = "a node name (DNS-1123 subdomain)";

/// The `affinity` of an IPAM block: `host:<node>` or `virtual:<name>`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "type", content = "name", rename_all = "kebab-case")]
pub enum Affinity {
    Host(String),
    Virtual(String),
}

impl Affinity {
    /// Parse `host:<node>` / `virtual:<name>`; `None` for any other shape.
    pub fn parse(s: &str) -> Option<Affinity> {
        if let Some(n) = s.strip_prefix("host:") {
            (!n.is_empty()).then(|| Affinity::Host(n.to_owned()))
        } else if let Some(n) = s.strip_prefix("virtual:") {
            (!n.is_empty()).then(|| Affinity::Virtual(n.to_owned()))
        } else {
            None
        }
    }

    /// The name after the prefix, as Felix's `AllocationBlock.Host()` returns it for both forms
    /// (`model/block.go` ~L209).
    pub fn name(&self) -> &str {
        match self {
            Affinity::Host(n) | Affinity::Virtual(n) => n,
        }
    }
}

/// The `secondary` keys an IPAM block's allocation attributes keep: the node that uses the IP
/// (`ActiveOwnerAttrs["node"]`, what Felix routes by) and its `type` (`ipipTunnelAddress`,
/// `vxlanTunnelAddress`, `wireguardTunnelAddress` for tunnel addresses; `libcalico-go/lib/ipam`
/// `AttributeType`). The rest (`namespace`, `pod`, `timestamp`) is not read by any rule and is
/// dropped at parse: at 100,000 blocks it would be most of the model's memory.
pub const KEPT_SECONDARY_KEYS: [&str; 2] = ["node", "type"];

/// One `spec.attributes[]` entry of an IPAM block. Its `handle_id` (`k8s-pod-network.<id>`,
/// `ipip-tunnel-addr-<node>`) is not read by any rule and is not kept: at 100,000 blocks of
/// one pod each it was 10 MB of the agent's memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AllocationAttributes {
    /// `secondary`: of the active owner's attributes, the [`KEPT_SECONDARY_KEYS`] present, in
    /// the order written (a key appears once).
    pub secondary: Vec<(String, String)>,
}

impl AllocationAttributes {
    /// `secondary.node`, the node that uses the IP (`ActiveOwnerAttrs["node"]`); `None` when
    /// absent or empty.
    pub fn node(&self) -> Option<&str> {
        self.secondary.iter().find(|(k, _)| k == "node").map(|(_, v)| v.as_str()).filter(|n| !n.is_empty())
    }
}

/// One allocated IP of a block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation<'a> {
    /// Ordinal within the block (IP = block base + ordinal).
    pub ordinal: usize,
    pub ip: IpAddr,
    /// The allocation's attributes.
    pub attributes: &'a AllocationAttributes,
}

/// A Calico IPAM block.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IpamBlock {
    pub name: std::sync::Arc<str>,
    /// `spec.cidr`, truncated to its network.
    pub cidr: IpNet,
    /// `spec.affinity`; `None` for a block affine to no node.
    pub affinity: Option<Affinity>,
    /// `spec.allocations`, sparse: `(ordinal, attribute index)` of every allocated IP, in
    /// ordinal order; free ordinals (`null`) are not stored (a /26 with one pod is one entry,
    /// not 64). Validated at parse: every index is in range and the array had at
    /// most as many entries as the block has IPs. [`IpamBlock::dense_allocations`] builds it
    /// from Calico's dense form.
    pub allocations: Vec<(u32, u32)>,
    pub attributes: Vec<AllocationAttributes>,
    /// `spec.deleted`: the block is being deleted.
    pub deleted: bool,
}

impl IpamBlock {
    /// Affine node name, if any (`AllocationBlock.Host()`).
    pub fn host(&self) -> Option<&str> {
        self.affinity.as_ref().map(Affinity::name)
    }

    /// The sparse form of Calico's dense `allocations` array (`Some(i)`: the ordinal's
    /// attribute index, `None`: free).
    pub fn dense_allocations(dense: &[Option<usize>]) -> Vec<(u32, u32)> {
        dense.iter().enumerate().filter_map(|(ordinal, idx)| Some((u32::try_from(ordinal).ok()?, u32::try_from((*idx)?).ok()?))).collect()
    }

    /// Every allocated IP, in ordinal order.
    pub fn allocated(&self) -> impl Iterator<Item = Allocation<'_>> + '_ {
        self.allocations.iter().filter_map(|&(ordinal, idx)| {
            let attributes = self.attributes.get(idx as usize)?;
            let ordinal = ordinal as usize;
            let ip = nth_ip(self.cidr, ordinal)?;
            Some(Allocation { ordinal, ip, attributes })
        })
    }

    /// The allocation of `ip`, when `ip` is in the block and allocated.
    pub fn allocation_of(&self, ip: IpAddr) -> Option<Allocation<'_>> {
        if !self.cidr.contains(&ip) {
            return None;
        }
        let ordinal = match (self.cidr.network(), ip) {
            (IpAddr::V4(base), IpAddr::V4(ip)) => usize::try_from(u32::from(ip) - u32::from(base)).ok()?,
            (IpAddr::V6(base), IpAddr::V6(ip)) => usize::try_from(u128::from(ip) - u128::from(base)).ok()?,
            _ => return None,
        };
        let key = u32::try_from(ordinal).ok()?;
        let at = self.allocations.binary_search_by_key(&key, |&(o, _)| o).ok()?;
        let attributes = self.attributes.get(self.allocations[at].1 as usize)?;
        Some(Allocation { ordinal, ip, attributes })
    }

    /// Allocations whose `secondary.node` differs from the affine host: borrowed IPs, and
    /// allocations with no recorded node (`AllocationBlock.NonAffineAllocations`,
    /// `model/block.go` ~L234).
    pub fn non_affine_allocations(&self) -> impl Iterator<Item = Allocation<'_>> + '_ {
        // The node is compared before the IP is computed: a block of 64 pods on its own node
        // (most blocks) costs 64 compares, not 64 addresses built and dropped.
        let host = self.host();
        self.allocations.iter().filter_map(move |&(ordinal, idx)| {
            let attributes = self.attributes.get(idx as usize).filter(|a| a.node() != host)?;
            let ordinal = ordinal as usize;
            Some(Allocation { ordinal, ip: nth_ip(self.cidr, ordinal)?, attributes })
        })
    }

    pub(crate) fn parse(f: &mut Fields<'_>, name: &str) -> Result<IpamBlock, Vec<ModelError>> {
        let cidr = f.cidr(&["spec", "cidr"]);
        if cidr.is_none() && f.get(&["spec", "cidr"]).is_none() {
            f.fail("spec.cidr", FieldProblem::Missing);
        }
        let affinity = match f.string(&["spec", "affinity"]) {
            None | Some("") => None,
            Some(s) => match Affinity::parse(s) {
                Some(a) if is_dns1123_subdomain(a.name()) => Some(a),
                Some(_) => {
                    f.fail("spec.affinity", FieldProblem::InvalidValue { value: s.to_owned(), expected: "host:<node> or virtual:<name> with a DNS-1123 name" });
                    None
                }
                None => {
                    f.fail("spec.affinity", FieldProblem::InvalidValue { value: s.to_owned(), expected: "host:<node> or virtual:<name>" });
                    None
                }
            },
        };
        let deleted = f.bool_lenient(&["spec", "deleted"]).unwrap_or(false);

        // Sized exactly, here and below: a block is kept for as long as it exists, 100,000 of
        // them at fleet scale, and a growing `Vec`'s least capacity is 4 (most blocks carry
        // one or two attributes and pairs: ~30 MB of spare capacity in kube-100k).
        let items = f.seq(&["spec", "attributes"]);
        let mut attributes = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            attributes.push(parse_attributes(f, i, item));
        }
        let mut allocations = Vec::new();
        let entries = f.seq(&["spec", "allocations"]);
        let slots = entries.len();
        for (i, item) in entries.iter().enumerate() {
            // The field name is built only for an error: a block has up to 4,096 entries.
            let field = || format!("spec.allocations[{i}]");
            match item {
                Value::Null => {}
                Value::Number(n) => match n.as_u64().and_then(|n| u32::try_from(n).ok()) {
                    Some(idx) if (idx as usize) < attributes.len() => allocations.push((u32::try_from(i).unwrap_or(u32::MAX), idx)),
                    _ => f.fail(field(), FieldProblem::Inconsistent(format!("attribute index {n} out of range ({} attributes)", attributes.len()))),
                },
                other => f.fail(field(), FieldProblem::WrongType { expected: "integer or null", found: type_name(other) }),
            }
        }
        let Some(cidr) = cidr else { return Err(f.take_errors()) };
        // Calico names every block after its CIDR (`libcalico-go/lib/names` `CIDRToName`):
        // a block whose name says another CIDR is not one Calico wrote.
        let expected = block_name(cidr.trunc());
        if name != expected {
            f.fail("metadata.name", FieldProblem::Inconsistent(format!("an IPAM block for {} is named {expected:?}", cidr.trunc())));
        }
        let host_bits = u32::from(cidr.max_prefix_len() - cidr.prefix_len());
        let size = 1u128.checked_shl(host_bits).unwrap_or(u128::MAX);
        if slots as u128 > size {
            f.fail("spec.allocations", FieldProblem::Inconsistent(format!("{slots} entries for a block of {size} addresses ({cidr})")));
        }
        allocations.shrink_to_fit();
        f.take_result(IpamBlock { name: name.into(), cidr: cidr.trunc(), affinity, allocations, attributes, deleted })
    }
}

fn parse_attributes(f: &mut Fields<'_>, index: usize, item: &Value) -> AllocationAttributes {
    let i = index;
    let mut out = AllocationAttributes::default();
    let Value::Mapping(map) = item else {
        f.fail(format!("spec.attributes[{i}]"), FieldProblem::WrongType { expected: "mapping", found: type_name(item) });
        return out;
    };
    match map.get("secondary") {
        None | Some(Value::Null) => {}
        Some(Value::Mapping(sec)) => {
            for (key, val) in sec {
                let (Some(key), Some(val)) = (key.as_str(), val.as_str()) else {
                    f.fail(format!("spec.attributes[{i}].secondary"), FieldProblem::WrongType { expected: "map of strings", found: type_name(val) });
                    continue;
                };
                if key == "node" && !val.is_empty() && !is_dns1123_subdomain(val) {
                    f.fail(format!("spec.attributes[{i}].secondary.node"), FieldProblem::InvalidValue { value: val.to_owned(), expected: NODE_NAME });
                    continue;
                }
                if KEPT_SECONDARY_KEYS.contains(&key) && !out.secondary.iter().any(|(k, _)| k == key) {
                    out.secondary.push((key.to_owned(), val.to_owned()));
                }
            }
        }
        Some(other) => f.fail(format!("spec.attributes[{i}].secondary"), FieldProblem::WrongType { expected: "mapping", found: type_name(other) }),
    }
    out.secondary.shrink_to_fit();
    out
}

/// The `n`th address of `net` (network address + n); `None` past the end.
pub fn nth_ip(net: IpNet, n: usize) -> Option<IpAddr> {
    match net {
        IpNet::V4(v4) => {
            let n = u32::try_from(n).ok()?;
            let base = u32::from(v4.network());
            let ip = base.checked_add(n)?;
            v4.contains(&Ipv4Addr::from(ip)).then(|| IpAddr::V4(Ipv4Addr::from(ip)))
        }
        IpNet::V6(v6) => {
            let base = u128::from(v6.network());
            let ip = base.checked_add(n as u128)?;
            v6.contains(&Ipv6Addr::from(ip)).then(|| IpAddr::V6(Ipv6Addr::from(ip)))
        }
    }
}

/// `spec.state` of a BlockAffinity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum AffinityState {
    Confirmed,
    Pending,
    PendingDeletion,
}

/// A Calico BlockAffinity: node `node` claims block `cidr`. confd/BIRD reads these for the
/// node's own blackholes (`bird_aggr.cfg.template`); Felix does not read them and follows the
/// IPAM block's `affinity` instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BlockAffinity {
    pub name: std::sync::Arc<str>,
    pub node: String,
    pub cidr: IpNet,
    /// `spec.state`; absent means confirmed (older objects carry none).
    pub state: AffinityState,
    /// `spec.type`: `host` (default) or `virtual`.
    pub affinity_type: String,
    /// `spec.deleted`: a string (`"false"`) in the v1 CRD, a bool in v3; both accepted.
    pub deleted: bool,
}

impl BlockAffinity {
    /// True for a live claim (not deleted, not being deleted).
    pub fn is_active(&self) -> bool {
        !self.deleted && self.state != AffinityState::PendingDeletion
    }

    pub(crate) fn parse(f: &mut Fields<'_>, name: &str) -> Result<BlockAffinity, Vec<ModelError>> {
        let node = f.required_string(&["spec", "node"]);
        if let Some(n) = node.filter(|n| !is_dns1123_subdomain(n)) {
            f.fail("spec.node", FieldProblem::InvalidValue { value: n.to_owned(), expected: NODE_NAME });
        }
        let cidr = f.cidr(&["spec", "cidr"]);
        if cidr.is_none() && f.get(&["spec", "cidr"]).is_none() {
            f.fail("spec.cidr", FieldProblem::Missing);
        }
        let state = match f.string(&["spec", "state"]) {
            None | Some("" | "confirmed") => AffinityState::Confirmed,
            Some("pending") => AffinityState::Pending,
            Some("pendingDeletion") => AffinityState::PendingDeletion,
            Some(other) => {
                f.fail("spec.state", FieldProblem::InvalidValue { value: other.to_owned(), expected: "confirmed, pending or pendingDeletion" });
                AffinityState::Confirmed
            }
        };
        let affinity_type = f.string(&["spec", "type"]).filter(|s| !s.is_empty()).unwrap_or("host").to_owned();
        let deleted = f.bool_lenient(&["spec", "deleted"]).unwrap_or(false);
        let (Some(node), Some(cidr)) = (node, cidr) else { return Err(f.take_errors()) };
        f.take_result(BlockAffinity { name: name.into(), node: node.to_owned(), cidr: cidr.trunc(), state, affinity_type, deleted })
    }
}
