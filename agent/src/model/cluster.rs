//! The [`Cluster`] as routewarden sees it (every good object, keyed by name, and the optional
//! sources that could not be read), the lookups the rest of the agent uses, and its
//! construction from parsed objects ([`ClusterBuilder`]: duplicates across inputs, then the
//! checks that need every object).

use std::collections::BTreeMap;
use std::sync::Arc;

use ipnet::IpNet;
use serde::Serialize;
use serde_yaml_ng::Value;

use super::block::{BlockAffinity, IpamBlock};
use super::block_check::check_blocks;
use super::configurations::{BgpConfiguration, FelixConfiguration};
use super::error::{ModelError, Rejected};
use super::kind::Kind;
use super::node::Node;
use super::objects::{ParsedObject, ParsedObjects};
use super::ownership_inputs::{ApiChanges, CalicoNodeDaemonSet, ClusterInformation, Installation, OptionalSource, CALICO_NODE_NAMESPACES};
use super::pool::{check_pools, IpPool};
use super::shared_map::SharedMap;
use super::yaml::{YamlError, YamlLimits};

/// The cluster as routewarden sees it. Maps are keyed by object name (deterministic order).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Cluster {
    pub ip_pools: BTreeMap<String, IpPool>,
    /// The three kinds a large cluster has by the hundred thousand are shared (`Arc`), names
    /// too, in maps whose copies share every chunk that did not change ([`SharedMap`]): a
    /// snapshot at 100,000 blocks copies ~3,200 chunk pointers, not 205,000 entries, dropping
    /// one frees only what changed, and comparing two compares pointers first.
    pub ipam_blocks: SharedMap<Arc<str>, Arc<IpamBlock>>,
    pub block_affinities: SharedMap<Arc<str>, Arc<BlockAffinity>>,
    pub nodes: SharedMap<Arc<str>, Arc<Node>>,
    pub felix_configurations: BTreeMap<String, FelixConfiguration>,
    pub bgp_configurations: BTreeMap<String, BgpConfiguration>,
    pub cluster_informations: BTreeMap<String, ClusterInformation>,
    pub installations: BTreeMap<String, Installation>,
    /// calico-node DaemonSets by `namespace/calico-node` ([`CalicoNodeDaemonSet::key`]).
    pub calico_node_daemonsets: BTreeMap<String, CalicoNodeDaemonSet>,
    /// Optional sources the datastore could not read, with why (`forbidden (403)`): what they
    /// would say is unknown, and the decision says so ([`OptionalSource`]). Always empty from
    /// the file datastore, which reads what the files hold.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", serialize_with = "serialize_unread")]
    pub unread: BTreeMap<OptionalSource, String>,
    /// What API discovery found changed while the datastore ran ([`ApiChanges`]).
    #[serde(skip_serializing_if = "ApiChanges::is_empty")]
    pub api_changes: ApiChanges,
}

/// `unread` as `{"calico-node env (kube-system/calico-node)": "forbidden (403)"}`: JSON map
/// keys are strings.
fn serialize_unread<S: serde::Serializer>(unread: &BTreeMap<OptionalSource, String>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(unread.iter().map(|(k, v)| (k.label(), v)))
}

impl Cluster {
    /// Put one good object in place of any object of its kind and name (O(log n): the etcd
    /// datastore applies a changed key this way). An error item changes nothing. No check that needs the whole cluster runs here (duplicates, overlapping pools
    /// or blocks): the caller runs those on the snapshot it sends, as
    /// [`ClusterBuilder::finish`] does.
    pub fn put_parsed(&mut self, item: ParsedObject) {
        match item {
            ParsedObject::IpPool(name, o) => drop(self.ip_pools.insert(name, o)),
            ParsedObject::IpamBlock(name, o) => drop(self.ipam_blocks.insert(shared_name(name, &o.name), o)),
            ParsedObject::BlockAffinity(name, o) => drop(self.block_affinities.insert(shared_name(name, &o.name), o)),
            ParsedObject::Node(name, o) => drop(self.nodes.insert(shared_name(name, &o.name), o)),
            ParsedObject::FelixConfiguration(name, o) => drop(self.felix_configurations.insert(name, o)),
            ParsedObject::BgpConfiguration(name, o) => drop(self.bgp_configurations.insert(name, o)),
            ParsedObject::ClusterInformation(name, o) => drop(self.cluster_informations.insert(name, o)),
            ParsedObject::Installation(name, o) => drop(self.installations.insert(name, o)),
            ParsedObject::DaemonSet(name, o) => drop(self.calico_node_daemonsets.insert(name, o)),
            ParsedObject::Error(_) => {}
        }
    }

    /// Take the object `kind`/`name` out: the CIDRs it routes or claims (a pool's, a block's,
    /// an affinity's), or `None` when it is not there.
    pub fn take_object(&mut self, kind: Kind, name: &str) -> Option<Vec<IpNet>> {
        take_out(self, kind, name)
    }

    /// Build a cluster from parsed YAML documents. Returns the cluster of every good object and
    /// one error per bad object (or per bad field of it), pool and block overlaps included.
    pub fn from_values<'a>(docs: impl IntoIterator<Item = &'a Value>) -> (Cluster, Vec<ModelError>) {
        let mut b = ClusterBuilder::default();
        let mut errors = Vec::new();
        for doc in docs {
            errors.extend(b.add(doc).into_iter().map(|r| r.error));
        }
        let (cluster, rejected) = b.finish();
        errors.extend(rejected.into_iter().map(|r| r.error));
        (cluster, errors)
    }

    /// Parse a multi-document YAML string with the bounded loader and default limits (pure;
    /// the datastore does the file reading).
    ///
    /// Errors: a YAML syntax error (or nesting past the limit) fails the whole text; object
    /// errors are returned alongside the cluster.
    pub fn from_yaml_str(text: &str) -> Result<(Cluster, Vec<ModelError>), YamlError> {
        let parsed = ParsedObjects::from_yaml_str(text, &YamlLimits::default())?;
        let mut b = ClusterBuilder::default();
        let mut errors: Vec<ModelError> = b.add_parsed(parsed.into_items()).into_iter().map(|r| r.error).collect();
        let (cluster, rejected) = b.finish();
        errors.extend(rejected.into_iter().map(|r| r.error));
        Ok((cluster, errors))
    }

    /// The IP pool containing `cidr`: the most specific one when pools overlap, ties broken
    /// by name.
    pub fn pool_for(&self, cidr: IpNet) -> Option<&IpPool> {
        self.ip_pools.values().filter(|p| p.cidr.contains(&cidr)).max_by(|a, b| a.cidr.prefix_len().cmp(&b.cidr.prefix_len()).then_with(|| b.name.cmp(&a.name)))
    }

    /// The BGPConfiguration named `default`, the only one that affects ownership.
    pub fn bgp_default(&self) -> Option<&BgpConfiguration> {
        self.bgp_configurations.get("default")
    }

    /// The FelixConfiguration named `default`.
    pub fn felix_default(&self) -> Option<&FelixConfiguration> {
        self.felix_configurations.get("default")
    }

    /// The FelixConfiguration named `node.<node>`.
    pub fn felix_for_node(&self, node: &str) -> Option<&FelixConfiguration> {
        self.felix_configurations.get(&format!("node.{node}"))
    }

    /// The ClusterInformation named `default` (the only one calico-node writes).
    pub fn cluster_information_default(&self) -> Option<&ClusterInformation> {
        self.cluster_informations.get("default")
    }

    /// The Installation named `default` (the only one the operator reconciles).
    pub fn installation_default(&self) -> Option<&Installation> {
        self.installations.get("default")
    }

    /// The calico-node DaemonSets, preferred first: `calico-system`, then `kube-system`, then
    /// any other namespace by name.
    pub fn calico_node_daemonsets_preferred(&self) -> Vec<&CalicoNodeDaemonSet> {
        let rank = |ds: &CalicoNodeDaemonSet| CALICO_NODE_NAMESPACES.iter().position(|n| *n == ds.namespace).unwrap_or(CALICO_NODE_NAMESPACES.len());
        let mut v: Vec<&CalicoNodeDaemonSet> = self.calico_node_daemonsets.values().collect();
        v.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.namespace.cmp(&b.namespace)));
        v
    }
}

/// Incremental [`Cluster`] construction, one document at a time (the datastore uses it to tie
/// errors to files).
#[derive(Debug, Default)]
pub struct ClusterBuilder {
    cluster: Cluster,
    /// Objects defined more than once: [`ClusterBuilder::finish`] takes the first definition
    /// out too.
    duplicated: std::collections::BTreeSet<(Kind, String)>,
    /// Objects with a definition that was rejected and has no last good version in its place:
    /// a good definition of the same kind and name elsewhere is one of two definitions, and
    /// not known to be the right one, so [`ClusterBuilder::finish`] takes it out too.
    rejected: std::collections::BTreeSet<(Kind, String)>,
}

impl ClusterBuilder {
    /// Add one document: a Kubernetes object, or a `List` of them. Unknown kinds are ignored.
    /// Returns the rejections of this document's objects.
    pub fn add(&mut self, doc: &Value) -> Vec<Rejected> {
        let mut parsed = ParsedObjects::default();
        parsed.add(doc);
        self.add_parsed(parsed.into_items())
    }

    /// Add objects parsed earlier ([`ParsedObjects`]), in their document order, exactly as
    /// [`ClusterBuilder::add`] of the documents they came from would. Returns their
    /// rejections (including duplicates of objects added before).
    pub fn add_parsed(&mut self, items: impl IntoIterator<Item = ParsedObject>) -> Vec<Rejected> {
        let c = &mut self.cluster;
        let mut errors = Vec::new();
        for item in items {
            let cidrs = item.cidrs();
            let identity = item.identity().map(|(k, n)| (k, n.to_owned()));
            let dup = match item {
                ParsedObject::IpPool(name, o) => insert(&mut c.ip_pools, Kind::IpPool, name, o),
                ParsedObject::IpamBlock(name, o) => insert_shared(&mut c.ipam_blocks, Kind::IpamBlock, shared_name(name, &o.name), o),
                ParsedObject::BlockAffinity(name, o) => insert_shared(&mut c.block_affinities, Kind::BlockAffinity, shared_name(name, &o.name), o),
                ParsedObject::Node(name, o) => insert_shared(&mut c.nodes, Kind::Node, shared_name(name, &o.name), o),
                ParsedObject::FelixConfiguration(name, o) => insert(&mut c.felix_configurations, Kind::FelixConfiguration, name, o),
                ParsedObject::BgpConfiguration(name, o) => insert(&mut c.bgp_configurations, Kind::BgpConfiguration, name, o),
                ParsedObject::ClusterInformation(name, o) => insert(&mut c.cluster_informations, Kind::ClusterInformation, name, o),
                ParsedObject::Installation(name, o) => insert(&mut c.installations, Kind::Installation, name, o),
                ParsedObject::DaemonSet(name, o) => insert(&mut c.calico_node_daemonsets, Kind::DaemonSet, name, o),
                ParsedObject::Error(r) => {
                    if let (false, Some((kind, name))) = (r.last_good, r.error.object()) {
                        self.rejected.insert((kind, name.to_owned()));
                    }
                    errors.push(r);
                    continue;
                }
            };
            if let (Some(e), Some(id)) = (dup, identity) {
                errors.push(Rejected::new(e, cidrs));
                self.duplicated.insert(id);
            }
        }
        errors
    }

    /// The cluster built so far, with the checks that need every object applied: an object
    /// defined more than once is taken out (its first definition is refused as the later ones
    /// were, with the CIDRs it routes or claims: no definition is the right one, so none
    /// decides a route, and what they name is frozen ground) — also when the other definition
    /// is one that was rejected with no last good version (after a restart, a broken
    /// definition in one file and a good one in another are still two) — then IP pools that
    /// overlap another pool are taken out ([`check_pools`]), then IPAM blocks that overlap
    /// another block or are not of their valid pool's `blockSize` ([`check_blocks`]). All are
    /// returned as rejections: the first definitions', then the pools', then the blocks'.
    pub fn finish(self) -> (Cluster, Vec<Rejected>) {
        let mut cluster = self.cluster;
        let mut rejected = Vec::new();
        let mut twice = self.duplicated;
        twice.extend(self.rejected);
        for (kind, name) in twice {
            if let Some(cidrs) = take_out(&mut cluster, kind, &name) {
                rejected.push(Rejected::new(ModelError::Duplicate { kind, name }, cidrs));
            }
        }
        rejected.extend(check_pools(&mut cluster.ip_pools));
        rejected.extend(check_blocks(&cluster.ip_pools, &mut cluster.ipam_blocks));
        (cluster, rejected)
    }
}

/// Remove the object `kind`/`name` from `cluster`: the CIDRs it routes or claims (a pool's,
/// a block's, an affinity's, as [`ParsedObject::cidrs`] gives them), or `None` when it is not
/// there.
fn take_out(cluster: &mut Cluster, kind: Kind, name: &str) -> Option<Vec<IpNet>> {
    match kind {
        Kind::IpPool => cluster.ip_pools.remove(name).map(|p| vec![p.cidr]),
        Kind::IpamBlock => cluster.ipam_blocks.remove(name).map(|b| vec![b.cidr]),
        Kind::BlockAffinity => cluster.block_affinities.remove(name).map(|a| vec![a.cidr]),
        Kind::Node => cluster.nodes.remove(name).map(|_| Vec::new()),
        Kind::FelixConfiguration => cluster.felix_configurations.remove(name).map(|_| Vec::new()),
        Kind::BgpConfiguration => cluster.bgp_configurations.remove(name).map(|_| Vec::new()),
        Kind::ClusterInformation => cluster.cluster_informations.remove(name).map(|_| Vec::new()),
        Kind::Installation => cluster.installations.remove(name).map(|_| Vec::new()),
        Kind::DaemonSet => cluster.calico_node_daemonsets.remove(name).map(|_| Vec::new()),
    }
}

/// [`insert`] for the shared maps.
fn insert_shared<T>(map: &mut SharedMap<Arc<str>, Arc<T>>, kind: Kind, name: Arc<str>, obj: Arc<T>) -> Option<ModelError> {
    if map.contains_key(&*name) {
        return Some(ModelError::Duplicate { kind, name: name.to_string() });
    }
    map.insert(name, obj);
    None
}

/// Insert unless the name is taken; a duplicate is reported and the first kept.
fn insert<K: Ord + std::ops::Deref<Target = str>, T>(map: &mut BTreeMap<K, T>, kind: Kind, name: K, obj: T) -> Option<ModelError> {
    match map.entry(name) {
        std::collections::btree_map::Entry::Occupied(e) => Some(ModelError::Duplicate { kind, name: e.key().to_string() }),
        std::collections::btree_map::Entry::Vacant(e) => {
            e.insert(obj);
            None
        }
    }
}

/// The map key for an object named `name` whose own name field is `own`: `own` itself (one
/// allocation per object, not two: 100,000 blocks and as many affinities hold ~8 MB of names)
/// when they are the same, as they are for every object parsed from its document.
fn shared_name(name: String, own: &Arc<str>) -> Arc<str> {
    if **own == *name {
        own.clone()
    } else {
        name.into()
    }
}
