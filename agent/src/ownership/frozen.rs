//! Classes whose owner cannot be known now: the object that decides it exists but cannot be
//! read, or holds a value routewarden cannot interpret. Calico's own fallback for
//! such a value still decides what `explain` and `audit` expect Felix and BIRD to do (the
//! [`OwnershipDecision`]); routewarden itself programs nothing new in such a class, deletes
//! nothing there and claims nothing there until the object is readable again, before a restart
//! or after it. A fallback to a default must never move a class between writers on its own:
//! after a restart there is no last good version to stand in, and the default is a guess.

use serde::Serialize;

use super::{CalicoVersion, DecisionSource, OwnershipConfig, OwnershipDecision, VersionChoice, VersionSource};
use crate::model::{Cluster, Kind, ModelError};
use crate::vocabulary::PoolClass;
use crate::vocabulary::Writer;

/// A class frozen because its owner cannot be known, and why.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct FrozenClass {
    pub class: PoolClass,
    /// The object and field that cannot be read or interpreted, and what is done meanwhile.
    pub reason: String,
}

/// The classes a programClusterRoutes value or a release line can move between writers: IPIP
/// and no-encap (VXLAN is always Felix's, `bgp_processor.go` `programsPool`).
const DECIDED_CLASSES: [PoolClass; 2] = [PoolClass::Ipip, PoolClass::NoEncap];

/// The classes whose owner cannot be known under `decision`, each with the first reason
/// found, in class order. `rejected` are the errors of the objects the datastore left out
/// with no last good version in their place.
///
/// A class is frozen when any of these could decide who programs it:
/// - a rejected `FelixConfiguration` `default` or `node.<this node>` (or one whose name could
///   not be read), unless Felix's value is fixed by the release line;
/// - a rejected `BGPConfiguration` `default` (or unnamed), unless BIRD's value is fixed;
/// - a rejected `ClusterInformation` `default` (or unnamed) while the release line is `auto`;
/// - a rejected `calico-node` DaemonSet (its env outranks every FelixConfiguration), unless
///   Felix's value is fixed;
/// - Felix's or BIRD's value is a fallback: the field holds a value that component does not
///   accept on this release line (`DecisionSource::Fallback`);
/// - `spec.calicoVersion` is set but is not a Calico 3 release (`auto`).
///
/// An absent object is not frozen: Calico's defaults apply to it exactly as they do to Felix
/// and BIRD. A source routewarden does not read by design (an env `valueFrom`, a DaemonSet it
/// may not list) stays a warning finding: freezing on it would freeze for good.
pub fn frozen_classes<'a>(
    decision: &OwnershipDecision,
    cluster: &Cluster,
    config: &OwnershipConfig,
    rejected: impl IntoIterator<Item = &'a ModelError>,
) -> Vec<FrozenClass> {
    let felix_fixed = matches!(decision.felix.source, DecisionSource::Fixed { .. });
    let bird_fixed = matches!(decision.bird.source, DecisionSource::Fixed { .. });
    let auto = config.version == VersionChoice::Auto;
    let mut reasons: Vec<String> = Vec::new();
    for e in rejected {
        let (kind, name) = match e {
            ModelError::Unreadable { kind: Some(kind), name, .. } => (*kind, name.as_deref()),
            other => match other.object() {
                Some((kind, name)) => (kind, Some(name)),
                None => continue,
            },
        };
        let decides = match kind {
            Kind::FelixConfiguration => {
                !felix_fixed && name.is_none_or(|n| n == "default" || config.node.as_deref().is_some_and(|me| n == format!("node.{me}")))
            }
            Kind::BgpConfiguration => !bird_fixed && name.is_none_or(|n| n == "default"),
            Kind::ClusterInformation => auto && name.is_none_or(|n| n == "default"),
            Kind::DaemonSet => !felix_fixed,
            _ => false,
        };
        if decides {
            reasons.push(format!("{e}: the object that decides who programs the class cannot be read"));
        }
    }
    for component in [&decision.felix, &decision.bird] {
        if let DecisionSource::Fallback { object, value, .. } = &component.source {
            reasons.push(format!(
                "{object}: programClusterRoutes {value:?} is not a value {} accepts on Calico {}: it falls back to its default, which routewarden does not follow",
                if component.field_of == Writer::Bird { "confd" } else { "Felix" },
                decision.version.version
            ));
        }
    }
    if auto && matches!(decision.version.source, VersionSource::Assumed { .. }) {
        if let Some(raw) = cluster.cluster_information_default().and_then(|i| i.calico_version.as_deref()).filter(|v| !v.is_empty()) {
            if CalicoVersion::parse_release(raw).is_err() {
                reasons.push(format!(
                    "ClusterInformation default: spec.calicoVersion {raw:?} is not a Calico 3 release: the release line, which decides who programs the class, is unknown"
                ));
            }
        }
    }
    let Some(first) = reasons.first() else { return Vec::new() };
    let more = if reasons.len() > 1 { format!(" (and {} more)", reasons.len() - 1) } else { String::new() };
    DECIDED_CLASSES
        .iter()
        .map(|class| FrozenClass {
            class: *class,
            reason: format!("{first}{more}; routes of the class are held as they are: nothing new programmed, deleted or claimed until it is fixed"),
        })
        .collect()
}
