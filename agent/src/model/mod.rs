//! Typed cluster model: what routewarden reads from a Calico cluster.
//!
//! Both API forms users have are accepted: `projectcalico.org/v3` (calicoctl output, etcd
//! mode, v3 CRDs) and `crd.projectcalico.org/v1` (what `kubectl get` shows in a
//! Kubernetes-datastore cluster; the spec field names are the same, reference §4.1), plus the
//! core Kubernetes `v1` Node with its `projectcalico.org/*` annotations. `kind: List` and
//! `kind: <Kind>List` documents are unpacked.
//!
//! Parsing never stops at the first problem: every object is parsed on its own, a bad object is
//! left out and reported with its kind, name and field
//! (`IPPool "pool-a": spec.cidr: invalid CIDR "10.0.0/8"`), and the good objects are kept.
//! A left-out object is a [`Rejected`]: its error and the CIDRs it mentions, which the agent
//! treats as frozen ground while no good version stands in for it (DESIGN.md, "Bad input").
//! Names follow Kubernetes' object-name rule (a DNS-1123 subdomain), IPAM blocks are named
//! after their CIDR, and IP pools are checked as Calico's IP pool client checks them (strictly
//! masked, no link-local overlap, no overlap with another pool: [`check_pools`]), and IPAM
//! blocks as Calico's IPAM writes them (no overlap, the pool's `blockSize`:
//! [`check_blocks`]). Unknown fields and unknown kinds are ignored. Text is read by the bounded streaming loader
//! ([`yaml`]). No I/O here: the datastore reads the files.
//!
//! The parts: `kind.rs` the kinds read, `error.rs` why an object is left out, `objects.rs`
//! documents to typed objects, `cluster.rs` the cluster and its builder, one file per object
//! family (`pool.rs`, `block.rs`, `node.rs`, `configurations.rs`, `ownership_inputs.rs`) with its fields,
//! `block_check.rs` the blocks against each other and their pools,
//! `fields.rs` and `names.rs` the shared field and name rules, and `yaml/` the loader.

mod block;
mod block_check;
mod cluster;
mod configurations;
mod error;
mod fields;
mod kind;
mod names;
mod node;
mod objects;
mod ownership_inputs;
mod pool;
mod shared_map;
pub mod yaml;

pub use block::{nth_ip, Affinity, AffinityState, Allocation, AllocationAttributes, BlockAffinity, IpamBlock, KEPT_SECONDARY_KEYS};
pub use block_check::{check_blocks, is_invalid_block, MAX_NAMED_OVERLAPS};
pub use cluster::{Cluster, ClusterBuilder};
pub use configurations::{parse_go_duration, BgpConfiguration, FelixConfiguration, FelixScope};
pub use error::{FieldProblem, ModelError, Rejected};
pub use kind::Kind;
pub use names::{block_name, cidrs_in_text, is_dns1123_subdomain, mentioned_cidrs, MAX_FROZEN_PER_INPUT};
pub use node::{Node, NodeAddress, NodeAddressSource, NodeAddressType, NodeForm, TunnelAddressKind};
pub use objects::{ParsedObject, ParsedObjects, MAX_REJECTED_PER_INPUT};
pub use ownership_inputs::{
    ApiChanges, CalicoGroupChange, CalicoNodeDaemonSet, ClusterInformation, EnvSetting, EnvValue, Installation, OptionalSource, CALICO_NODE,
    CALICO_NODE_NAMESPACES, FELIX_ENV,
};
pub use pool::{check_pools, AllowedUse, EncapMode, IpPool};
pub use shared_map::SharedMap;
pub use yaml::{parse_yaml_documents, YamlError, YamlLimits};

#[cfg(test)]
mod tests;
