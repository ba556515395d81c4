//! Unit tests of the model, by topic; the helpers they share are here.

use std::net::IpAddr;

use ipnet::IpNet;

use super::*;

pub(super) fn load(text: &str) -> (Cluster, Vec<ModelError>) {
    Cluster::from_yaml_str(text).expect("valid YAML")
}

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().expect("test IP")
}

pub(super) const GOOD: &str = r"
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: good-pool}
spec: {cidr: 10.244.0.0/16, ipipMode: Always}
---
apiVersion: projectcalico.org/v3
kind: Node
metadata: {name: node-a}
spec:
  bgp: {ipv4Address: 10.0.0.11/24}
";

mod blocks;
mod documents;
mod fields;
mod objects;
