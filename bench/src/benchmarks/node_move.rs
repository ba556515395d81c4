//! `node-move`: one remote node's address changes, so every route to it needs
//! a new gateway. node-b has 20 /26 blocks and a borrowed /32 (21 routes via 10.0.0.12 on
//! `eth0`); node-c (2 blocks via 10.0.1.13 on `tunl0`) and node-d (2 blocks via 10.0.0.14 on
//! `eth0`) stay where they are. After the cold programming, node-b moves to 10.0.0.22 and one
//! apply follows: timed, with its writes from the `ApplyReport` (route writes + nexthop object
//! writes; cross-checked against the ops the netlink wrapper saw), classic and in
//! nexthop-object mode, each in a fresh namespace, runs alternating.
//!
//! Target: nexthop mode does it in 1 write (the ratio: its writes ÷ 1, at most 1).
//! Classic mode's 21 route writes are the reference (`classic_writes`, required for `met`).
//! After each move the kernel must hold exactly node-b's 21 routes via 10.0.0.22 (in nexthop
//! mode, all of them through a nexthop object), node-c's and node-d's untouched.
//! The sizes are fixed (they are the case), so `--tiny` runs the same.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use routewarden::dataplane::{Reconciler, RtNetlink, SystemClock};
use routewarden::routes::{ClusterRoute, RouteOrigin};
use routewarden::vocabulary::{PoolClass, RoutePath};

use crate::benchmarks::resync_100k::Counting;
use crate::fixtures::PROTO_OURS;
use crate::netns::{count_nhid_routes, count_routes, count_routes_via, in_node_netns};
use crate::report::{kv, ms};
use crate::runs::Mode;
use crate::{median, Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "node-move", run };

/// The moving node's blocks.
const BLOCKS: usize = 20;
/// The moving node's address before the move.
const FROM: &str = "10.0.0.12";
/// The moving node's new address.
const TO: &str = "10.0.0.22";

/// A route to `dst` via `node` at `gw` on the host NIC (no-encap, same subnet) or the tunnel
/// (IPIP), in pool `bench`; a borrowed IP when `dst` is a /32.
fn to_node(dst: &str, path: RoutePath, gw: &str, node: &str) -> ClusterRoute {
    let net: ipnet::IpNet = dst.parse().expect("valid CIDR");
    let gateway: IpAddr = gw.parse().expect("valid address");
    let node: Arc<str> = node.into();
    let origin = if net.prefix_len() == net.max_prefix_len() {
        RouteOrigin::BorrowedIp { block: dst.into(), node }
    } else {
        RouteOrigin::RemoteBlock { block: dst.into(), node }
    };
    ClusterRoute {
        dst: net,
        path,
        gateway: Some(gateway),
        device: None,
        class: if path == RoutePath::HostNic { PoolClass::NoEncap } else { PoolClass::Ipip },
        pool: "bench".into(),
        origin,
    }
}

/// The routes with node-b at `gw`: its [`BLOCKS`] /26 blocks (10.130.0.0/26 and up) and a
/// borrowed 10.129.0.9/32 of its, then node-c's and node-d's two blocks each.
fn routes(gw: &str) -> Vec<ClusterRoute> {
    let mut v: Vec<ClusterRoute> =
        (0..BLOCKS).map(|i| to_node(&format!("10.130.{}.{}/26", i / 4, (i % 4) * 64), RoutePath::HostNic, gw, "node-b")).collect();
    v.push(to_node("10.129.0.9/32", RoutePath::HostNic, gw, "node-b"));
    v.push(to_node("10.131.0.0/26", RoutePath::Tunnel, "10.0.1.13", "node-c"));
    v.push(to_node("10.131.0.64/26", RoutePath::Tunnel, "10.0.1.13", "node-c"));
    v.push(to_node("10.132.0.0/26", RoutePath::HostNic, "10.0.0.14", "node-d"));
    v.push(to_node("10.132.0.64/26", RoutePath::HostNic, "10.0.0.14", "node-d"));
    v
}

/// What one move measured.
struct Move {
    /// Wall time of the apply after the move.
    took: Duration,
    /// Route writes of that apply (`ApplyReport::writes`).
    route_writes: u64,
    /// Nexthop object writes of that apply (`ApplyReport::nexthop_writes`).
    nexthop_writes: u64,
}

/// In a fresh namespace: program [`routes`] with node-b at [`FROM`] in `mode`, then move node-b
/// to [`TO`] and time the one apply that follows. Checks afterwards (untimed) that the kernel
/// holds exactly node-b's routes via [`TO`] (through nexthop objects in nexthop mode) and the
/// other nodes' routes unchanged, and that the wrapper saw as many ops as the report counts.
fn move_once(mode: Mode) -> Result<Move> {
    in_node_netns(move |rt| {
        let work = async move {
            let (before, after) = (routes(FROM), routes(TO));
            let moved = BLOCKS + 1;
            let cfg = mode.config();
            let mut r = Reconciler::new(cfg.clone(), cfg.policy_owning(&["10.0.0.0/8"]), Counting::new(RtNetlink::connect()?), SystemClock);
            r.set_datastore_synced(true);
            r.set_desired(&before);
            let rep = r.apply().await;
            ensure!(rep.writes == before.len() as u64 && rep.error_count() == 0, "setup: {} writes: {:?}", rep.writes, rep.error_messages);
            ensure!(count_routes_via(PROTO_OURS, FROM)? == moved, "setup: node-b's routes not via {FROM}");
            let ops0 = (r.netlink().ops, r.netlink().nexthop_ops);
            r.set_desired(&after);
            let t = Instant::now();
            let rep = r.apply().await;
            let took = t.elapsed();
            ensure!(rep.error_count() == 0 && rep.deletes == 0, "move: {} deletes, errors {:?}", rep.deletes, rep.error_messages);
            let ops = (r.netlink().ops - ops0.0, r.netlink().nexthop_ops - ops0.1);
            ensure!(ops == (rep.writes, rep.nexthop_writes), "the wrapper saw {ops:?} route and nexthop ops, the report says {}, {}", rep.writes, rep.nexthop_writes);
            let (all, via_to, via_c, via_d) =
                (count_routes(PROTO_OURS)?, count_routes_via(PROTO_OURS, TO)?, count_routes_via(PROTO_OURS, "10.0.1.13")?, count_routes_via(PROTO_OURS, "10.0.0.14")?);
            ensure!(
                (all, via_to, via_c, via_d) == (after.len(), moved, 2, 2),
                "after the move: {all} routes of ours, {via_to} via {TO}, {via_c} via node-c, {via_d} via node-d; expected {}, {moved}, 2, 2",
                after.len()
            );
            if mode == Mode::Nexthops {
                let via_nh = count_nhid_routes(PROTO_OURS)?;
                ensure!(via_nh == after.len(), "after the move: {via_nh} of {} routes of ours through a nexthop object", after.len());
            }
            Ok(Move { took, route_writes: rep.writes, nexthop_writes: rep.nexthop_writes })
        };
        // A spawned task on the multi-thread runtime, as the agent runs `dataplane::run`.
        rt.block_on(rt.spawn(work))?
    })
}

/// node-move: the writes of the apply after node-b's address change in nexthop mode (target 1),
/// with its wall time, and classic mode's writes and time for the same move.
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    let (mut classic, mut nh) = (Vec::new(), Vec::new());
    // Alternate, so slow phases of a noisy machine hit both modes.
    for _ in 0..opts.runs {
        classic.push(move_once(Mode::Classic)?);
        nh.push(move_once(Mode::Nexthops)?);
    }
    // Writes are the same every run; the most any run did is reported.
    let most = |v: &[Move], f: fn(&Move) -> u64| v.iter().map(f).max().unwrap_or_default();
    let (classic_writes, classic_nh_writes) = (most(&classic, |m| m.route_writes), most(&classic, |m| m.nexthop_writes));
    let (nh_route_writes, nh_nexthop_writes) = (most(&nh, |m| m.route_writes), most(&nh, |m| m.nexthop_writes));
    let nh_writes = most(&nh, |m| m.route_writes + m.nexthop_writes);
    let classic_ms = median(classic.iter().map(|m| m.took).collect());
    let nh_ms = median(nh.iter().map(|m| m.took).collect());
    let moved = BLOCKS + 1;
    Ok(Outcome::Measured {
        name: BENCHMARK.name.into(),
        ratio: nh_writes as f64,
        target: Target::AtMost(1.0),
        ok: classic_writes == moved as u64 && classic_nh_writes == 0,
        details: vec![
            kv("routes", routes(FROM).len()),
            kv("moved_routes", moved),
            kv("classic_writes", classic_writes + classic_nh_writes),
            kv("nh_writes", nh_writes),
            kv("nh_route_writes", nh_route_writes),
            kv("nh_nexthop_writes", nh_nexthop_writes),
            kv("classic_ms", ms(classic_ms)),
            kv("nh_ms", ms(nh_ms)),
            kv("runs", opts.runs),
        ],
    })
}
