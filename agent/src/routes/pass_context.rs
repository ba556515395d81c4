//! What every route of a pass for one node is computed from besides the IPAM blocks (this
//! node, the Nodes, the devices), and the one route to a remote node: its path, gateway and
//! device (Felix `route_mgr.go` `updateRoutes`, `ipip_mgr.go`, `noencap_mgr.go`).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use ipnet::IpNet;

use super::problem::RouteProblem;
use super::{ClusterRoute, RouteDevices, RouteOrigin};
use crate::model::{Cluster, IpPool, Node};
use crate::vocabulary::{PoolClass, PoolKind, RoutePath};

/// What every route of a pass for one node is computed from besides the IPAM blocks.
pub(super) struct Ctx<'a> {
    pub(super) cluster: &'a Cluster,
    pub(super) local_name: &'a str,
    local: Option<&'a Node>,
    /// The devices' names, shared by every route of the pass.
    tunnel: Arc<str>,
    host_nic: Arc<str>,
    /// The Nodes this pass found by name. The cluster's map finds one by a binary search of
    /// name comparisons, and each Node is asked for again by each of its blocks and borrowed
    /// IPs: a hash lookup of a name already found is cheaper.
    found_nodes: RefCell<HashMap<&'a str, &'a Node>>,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(cluster: &'a Cluster, local_name: &'a str, devices: &RouteDevices) -> Ctx<'a> {
        let local = cluster.nodes.get(local_name).map(AsRef::as_ref);
        Ctx { cluster, local_name, local, tunnel: devices.tunnel.as_str().into(), host_nic: devices.host_nic.as_str().into(), found_nodes: RefCell::default() }
    }

    /// The Node named `name`, if the cluster has it (remembered for the rest of the pass).
    fn node(&self, name: &str) -> Option<&'a Node> {
        if let Some(node) = self.found_nodes.borrow().get(name) {
            return Some(node);
        }
        let (name, node) = self.cluster.nodes.get_key_value(name)?;
        self.found_nodes.borrow_mut().insert(name, node);
        Some(node)
    }

    /// [`RouteProblem::LocalNodeUnknown`] when this node is not in the cluster.
    pub(super) fn local_problem(&self) -> Option<(RouteProblem, Option<PoolClass>)> {
        self.local.is_none().then(|| (RouteProblem::LocalNodeUnknown { node: self.local_name.to_owned() }, None))
    }
}

impl Ctx<'_> {
    /// The pool holding `dst` and its class, when that class is requested and routable here
    /// (not VXLAN, not LoadBalancer-only).
    pub(super) fn routed_class<'c>(&'c self, dst: IpNet, classes: &BTreeSet<PoolClass>) -> Option<(&'c IpPool, PoolClass)> {
        let pool = self.cluster.pool_for(dst)?;
        let class = PoolKind::of(pool).class()?;
        (class != PoolClass::Vxlan && classes.contains(&class)).then_some((pool, class))
    }

    /// A route to `dst` via node `node`, its origin made by `origin` from the Node's name, or
    /// `None` with the reason in `problems`. Problems found on the way (next-hop sources that
    /// disagree) are added too. The route's names are the model's own (`Arc<str>`, shared),
    /// so a route pass allocates no string per route.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn route(
        &self,
        block: &str,
        dst: IpNet,
        node: &str,
        pool: &IpPool,
        class: PoolClass,
        origin: impl FnOnce(Arc<str>) -> RouteOrigin,
        problems: &mut impl Extend<(RouteProblem, Option<PoolClass>)>,
    ) -> Option<ClusterRoute> {
        debug_assert_ne!(node, self.local_name);
        let v6 = dst.addr().is_ipv6();
        let Some(remote) = self.node(node) else {
            problems.extend([(RouteProblem::UnknownNode { block: block.to_owned(), dst, node: node.to_owned() }, Some(class))]);
            return None;
        };
        let Some((node_ip, _)) = remote.next_hop(v6) else {
            problems.extend([(RouteProblem::NodeWithoutAddress { node: node.to_owned(), family: if v6 { 6 } else { 4 }, dst }, Some(class))]);
            return None;
        };
        let same_subnet = pool.cross_subnet() && self.local.and_then(|l| l.subnet(v6)).is_some_and(|subnet| subnet.contains(&node_ip));
        let path = match class {
            PoolClass::Ipip if !same_subnet => RoutePath::Tunnel,
            _ => RoutePath::HostNic,
        };
        if path == RoutePath::HostNic && self.local.is_some_and(|l| l.host_address(v6).is_none()) {
            problems.extend([(RouteProblem::LocalNodeWithoutAddress { node: self.local_name.to_owned(), family: if v6 { 6 } else { 4 } }, Some(class))]);
            return None;
        }
        let (gateway, device) = match path {
            RoutePath::Tunnel => {
                let tunnel_gateway = remote.tunnel_gateway().map(|(gw, _)| gw);
                if tunnel_gateway != Some(node_ip) {
                    problems.extend([(RouteProblem::NextHopSourcesDisagree { node: node.to_owned(), bgp_address: node_ip, tunnel_gateway }, Some(class))]);
                }
                (tunnel_gateway.unwrap_or(node_ip), self.tunnel.clone())
            }
            _ => (node_ip, self.host_nic.clone()),
        };
        Some(ClusterRoute { dst, path, gateway: Some(gateway), device: Some(device), class, pool: pool.name.clone(), origin: origin(remote.name.clone()) })
    }
}
