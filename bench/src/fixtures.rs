//! What the benchmarks are fed: cluster routes of one node ([`cluster_routes`], with our route
//! protocol [`PROTO_OURS`]), and clusters built in code ([`compute_cluster`]), written as
//! YAML files ([`write_footprint_cluster`]) or listed by the stand-in API server ([`kube`]).

pub mod kube;

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use ipnet::IpNet;
use routewarden::model::{Affinity, AllocationAttributes, Cluster, EncapMode, IpPool, IpamBlock, Node, NodeForm};
use routewarden::ownership::{OwnershipConfig, Role, VersionChoice};
use routewarden::plan::PlanConfig;
use routewarden::routes::{ClusterRoute, RouteDevices, RouteOrigin};
use routewarden::vocabulary::{PoolClass, RoutePath};

use crate::ComputeSize;

/// Route protocol of routewarden's routes in every benchmark (the default, Felix's 80).
pub const PROTO_OURS: &str = "80";

/// `n` cluster routes of node-a's kind: /26 blocks `10.128.0.0/26`, `10.128.0.64/26`, ...,
/// alternately through the tunnel to node-c at 10.0.1.13 (IPIP, other subnet) and through the
/// host NIC to node-b at 10.0.0.12 (no-encap, same subnet), all in pool `bench`. Each remote
/// node has its own name in `origin`, so nexthop-object mode makes one object per node (two in
/// all); classic mode does not read the names.
///
/// # Panics
/// Not for any `n` up to 2^26 (the /26 blocks of 10.128.0.0 and up): each prefix is formatted
/// from a valid address.
pub fn cluster_routes(n: usize) -> Vec<ClusterRoute> {
    (0..n)
        .map(|i| {
            let base = u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (i as u32) * 64;
            let dst: IpNet = format!("{}/26", Ipv4Addr::from(base)).parse().expect("valid CIDR");
            let (path, gw, class, node) = if i % 2 == 0 {
                (RoutePath::Tunnel, [10, 0, 1, 13], PoolClass::Ipip, "node-c")
            } else {
                (RoutePath::HostNic, [10, 0, 0, 12], PoolClass::NoEncap, "node-b")
            };
            ClusterRoute {
                dst,
                path,
                gateway: Some(IpAddr::from(gw)),
                device: None,
                class,
                pool: "bench".into(),
                origin: RouteOrigin::RemoteBlock { block: dst.to_string().into(), node: node.into() },
            }
        })
        .collect()
}

/// The IPv4 address with the numeric value `a`.
/// The plan settings the app would use for `node` in Felix's role with the default devices,
/// protocol 80 and the main table (what compute-100k and kube-100k plan with).
pub fn felix_plan_config(node: &str) -> PlanConfig {
    PlanConfig {
        node: node.to_owned(),
        ownership: OwnershipConfig { role: Role::Felix, version: VersionChoice::Auto, node: Some(node.to_owned()) },
        devices: RouteDevices::default(),
        protocol: 80,
        table: 254,
    }
}

pub fn v4(a: u32) -> Ipv4Addr {
    Ipv4Addr::from(a)
}

/// A cluster of `size.nodes` nodes (BGP addresses 172.16.x.y/24, 250 per subnet, so
/// CrossSubnet matters), `size.blocks` /26 blocks round-robin over the nodes (first half in
/// the IPIP CrossSubnet pool 10.0.0.0/9, second half in the no-encap pool 10.128.0.0/9) and
/// `size.borrowed` blocks with one IP borrowed by the next node; each node's IPIP tunnel
/// address is the first IP of its first block. Built in code, not parsed.
///
/// # Panics
/// Not for the sizes of [`crate::Options`]: every CIDR is formatted from a valid address.
pub fn compute_cluster(size: ComputeSize) -> Cluster {
    let mut c = Cluster::default();
    let pool = |name: &str, cidr: &str, ipip: EncapMode| IpPool {
        name: name.into(),
        cidr: cidr.parse().expect("valid CIDR"),
        ipip_mode: ipip,
        vxlan_mode: EncapMode::Never,
        nat_outgoing: true,
        disabled: false,
        disable_bgp_export: false,
        block_size: 26,
        allowed_uses: Vec::new(),
        node_selector: "all()".into(),
    };
    c.ip_pools.insert("ipip".into(), pool("ipip", "10.0.0.0/9", EncapMode::CrossSubnet));
    c.ip_pools.insert("flat".into(), pool("flat", "10.128.0.0/9", EncapMode::Never));
    let node_name = |i: usize| format!("node-{i:05}");
    for i in 0..size.nodes {
        let addr = u32::from(Ipv4Addr::new(172, 16, 0, 0)) + ((i / 250) as u32) * 256 + (i % 250) as u32 + 1;
        let name: Arc<str> = node_name(i).into();
        c.nodes.insert(
            name.clone(),
            Arc::new(Node {
                name,
                form: NodeForm::Calico,
                bgp_ipv4: Some(format!("{}/24", v4(addr)).parse().expect("valid CIDR")),
                bgp_ipv4_has_prefix: true,
                bgp_ipv6: None,
                bgp_ipv6_has_prefix: false,
                as_number: None,
                // Calico's IPIP tunnel address: the first IP of the node's first block (block
                // i of the IPIP pool), so the tunnel-address rule runs per node.
                ipv4_ipip_tunnel_addr: (i < size.blocks.div_ceil(2)).then(|| IpAddr::V4(v4(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + (i as u32) * 64))),
                ipv4_vxlan_tunnel_addr: None,
                ipv6_vxlan_tunnel_addr: None,
                wireguard_ipv4: None,
                wireguard_ipv6: None,
                addresses: Vec::new(),
            }),
        );
    }
    let half = size.blocks.div_ceil(2);
    let every = (size.blocks / size.borrowed.max(1)).max(1);
    let mut borrowed = 0;
    for j in 0..size.blocks {
        let base =
            if j < half { u32::from(Ipv4Addr::new(10, 0, 0, 0)) + (j as u32) * 64 } else { u32::from(Ipv4Addr::new(10, 128, 0, 0)) + ((j - half) as u32) * 64 };
        let cidr: IpNet = format!("{}/26", v4(base)).parse().expect("valid CIDR");
        let name = format!("{}-26", v4(base).to_string().replace('.', "-"));
        let owner = j % size.nodes.max(1);
        let (allocations, attributes) = if borrowed < size.borrowed && j % every == 0 {
            borrowed += 1;
            let user = (owner + 1) % size.nodes.max(1);
            let attrs = AllocationAttributes { secondary: vec![("node".to_string(), node_name(user))] };
            (vec![(5, 0)], vec![attrs])
        } else {
            (Vec::new(), Vec::new())
        };
        let name: Arc<str> = name.into();
        c.ipam_blocks.insert(
            name.clone(),
            Arc::new(IpamBlock { name, cidr, affinity: Some(Affinity::Host(node_name(owner))), allocations, attributes, deleted: false }),
        );
    }
    c
}

/// A cluster directory (calicoctl/kubectl YAML) in which node `node-0000` (192.168.0.10/24)
/// has exactly `routes` IPIP routes: `nodes` nodes (200 per /24, so some are reached through
/// the tunnel and some natively: the pool is CrossSubnet) and `routes` /26 blocks
/// round-robin over them; node-0000's own blocks become blackholes.
pub fn write_footprint_cluster(dir: &Path, nodes: usize, routes: usize) -> Result<()> {
    let mut calico = String::from(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: ipip}\n\
         spec: {cidr: 10.128.0.0/9, blockSize: 26, ipipMode: CrossSubnet, vxlanMode: Never}\n---\n\
         apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: default}\n\
         spec: {programClusterRoutes: EnabledIPIPOnly}\n---\n\
         apiVersion: projectcalico.org/v3\nkind: BGPConfiguration\nmetadata: {name: default}\n\
         spec: {programClusterRoutes: EnabledNoEncapOnly}\n---\n\
         apiVersion: projectcalico.org/v3\nkind: NodeList\nitems:\n",
    );
    for i in 0..nodes {
        let _ = writeln!(calico, "  - metadata: {{name: node-{i:04}}}\n    spec: {{bgp: {{ipv4Address: 192.168.{}.{}/24}}}}", i / 200, i % 200 + 10);
    }
    let mut ipam = String::from("apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlockList\nitems:\n");
    for j in 0..routes {
        let base = v4(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (j as u32) * 64);
        let _ = writeln!(
            ipam,
            "  - metadata: {{name: {}-26}}\n    spec: {{cidr: {base}/26, affinity: \"host:node-{:04}\"}}",
            base.to_string().replace('.', "-"),
            j % nodes
        );
    }
    std::fs::write(dir.join("calico.yaml"), calico)?;
    std::fs::write(dir.join("ipam.yaml"), ipam)?;
    Ok(())
}
