//! The ownership engine: which component programs the cluster routes of each IP pool class,
//! mirroring Calico's own decision exactly (reference `calico-cluster-routes.md` §1), and
//! whether the configuration is consistent.
//!
//! Inputs: Felix's classes (the calico-node container's env `FELIX_PROGRAMCLUSTERROUTES`
//! first, then `FelixConfiguration.spec.programClusterRoutes` of `node.<name>`, then
//! `default`), `BGPConfiguration.spec.programClusterRoutes` of the object named `default`
//! (BIRD's classes), the IP pools, the Calico release line (`--calico-version`, or
//! `ClusterInformation default` with `auto`: [`resolve_version`]), the operator's
//! `Installation default` (checked against the fields it writes) and routewarden's own
//! [`Role`]. Output: an [`OwnershipDecision`] with the classes routewarden
//! programs, every writer of every class, findings with stable codes, and a per-pool table.
//! Every decision records its [`DecisionSource`] (field value, default or fallback) for
//! `routewarden explain`. Pure: no I/O.
//!
//! Also here, because they follow from the decision and nothing else: the
//! [`OwnershipPolicy`] (which kernel routes are ours, built once per plan, evaluated by the
//! dataplane) and the WireGuard routing rule ([`wireguard_peers`], used by the plan, the BIRD
//! filter and `explain`).

use std::collections::{BTreeMap, BTreeSet};

use crate::model::Cluster;
use crate::vocabulary::{PoolClass, PoolKind, Writer};

#[cfg(test)]
mod tests;

mod decision;
mod field_sources;
mod findings;
mod frozen;
mod operator;
mod policy;
mod version;
mod wireguard;

pub use decision::{ClusterRoutes, ComponentDecision, DecisionSource, KernelFilter, OwnershipConfig, OwnershipDecision, OwnershipError, PoolOwnership, Role};
pub use findings::{Finding, FindingKind, Severity};
pub use frozen::{frozen_classes, FrozenClass};
pub use operator::operator_fields;
pub use policy::{OwnershipPolicy, PolicyInputs, PolicyRoute, PolicyRouteType, Verdict};
pub use version::{resolve_version, CalicoVersion, ResolvedVersion, Rules, VersionChoice, VersionSource};
pub use wireguard::wireguard_peers;

use field_sources::{bird_value, felix_value};
use findings::{api_change_findings, class_finding, deprecated_finding, version_findings};
use operator::operator_findings;

/// Decide ownership for `cluster` under `config`.
pub fn decide(cluster: &Cluster, config: &OwnershipConfig) -> OwnershipDecision {
    let version = resolve_version(cluster, config.version);
    let mut sources = Vec::new();
    version_findings(&version, &mut sources);
    let felix = felix_value(cluster, config.node.as_deref(), &version, &mut sources);
    let bird = bird_value(cluster, &version, &mut sources);
    operator_findings(cluster, &version, &mut sources);
    api_change_findings(cluster, &mut sources);
    let explicit = match config.role {
        Role::Explicit(v) => Some(ComponentDecision { field_of: Writer::Routewarden, value: v, source: DecisionSource::Role { value: v.as_str().to_owned() } }),
        _ => None,
    };

    let mut writers: BTreeMap<PoolClass, BTreeSet<Writer>> = BTreeMap::new();
    for class in [PoolClass::Ipip, PoolClass::NoEncap, PoolClass::Vxlan] {
        writers.insert(class, class_writers(class, config.role, felix.value, bird.value));
    }
    let programmed: BTreeSet<PoolClass> = writers.iter().filter(|(_, w)| w.contains(&Writer::Routewarden)).map(|(c, _)| *c).collect();

    let pools: Vec<PoolOwnership> = cluster
        .ip_pools
        .values()
        .map(|p| {
            let kind = PoolKind::of(p);
            let class = kind.class();
            let bird_accepts = match kind {
                // confd's `programsPool` looks at encapsulation only [inferred for LB-only].
                PoolKind::Vxlan => false,
                PoolKind::IpipAlways | PoolKind::IpipCrossSubnet => bird.value.covers(PoolClass::Ipip),
                PoolKind::NoEncap | PoolKind::NoEncapV6 | PoolKind::LoadBalancerOnly => bird.value.covers(PoolClass::NoEncap),
            };
            PoolOwnership {
                pool: p.name.to_string(),
                cidr: p.cidr,
                kind,
                class,
                writers: class.and_then(|c| writers.get(&c)).map(|w| w.iter().copied().collect()).unwrap_or_default(),
                bird_kernel_filter: if bird_accepts { KernelFilter::Accept } else { KernelFilter::Reject },
            }
        })
        .collect();

    let mut findings = Vec::new();
    for (class, ws) in &writers {
        let class_pools: Vec<&str> = pools.iter().filter(|p| p.class == Some(*class)).map(|p| p.pool.as_str()).collect();
        if class_pools.is_empty() {
            continue;
        }
        findings.push(class_finding(*class, ws, &class_pools, config, &felix, &bird, explicit.as_ref()));
    }
    if version.rules == Rules::V3_33 && bird.value.covers(PoolClass::Ipip) && pools.iter().any(|p| p.class == Some(PoolClass::Ipip)) {
        findings.push(deprecated_finding(&bird));
    }
    findings.extend(sources);

    OwnershipDecision { config: config.clone(), version, felix, bird, explicit, programmed, writers, findings, pools }
}

/// Writers of one class under a role. VXLAN: always Felix (`bgp_processor.go` `programsPool`
/// returns false for VXLAN; Felix's `vxlanManager` always runs), never routewarden.
fn class_writers(class: PoolClass, role: Role, felix: ClusterRoutes, bird: ClusterRoutes) -> BTreeSet<Writer> {
    let mut out = BTreeSet::new();
    if class == PoolClass::Vxlan {
        out.insert(Writer::Felix);
        return out;
    }
    let (felix_writer, bird_writer) = match role {
        Role::Felix => (Writer::Routewarden, Writer::Bird),
        Role::Bird => (Writer::Felix, Writer::Routewarden),
        Role::Explicit(_) | Role::Audit => (Writer::Felix, Writer::Bird),
    };
    if felix.covers(class) {
        out.insert(felix_writer);
    }
    if bird.covers(class) {
        out.insert(bird_writer);
    }
    if let Role::Explicit(v) = role {
        if v.covers(class) {
            out.insert(Writer::Routewarden);
        }
    }
    out
}
