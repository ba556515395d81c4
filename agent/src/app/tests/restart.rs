//! The bad-input property across restarts: any sequence of broken inputs — every kind of
//! `docs/bad-input.md` that is not evidence of a deletion (a broken or unparsable object, a
//! value routewarden cannot interpret, a duplicate, an empty, garbled or unreadable file) —
//! interleaved with agent restarts at any point (a node reboot, a DaemonSet roll: the new
//! process has no last good version of anything) never changes the kernel: no route of the
//! valid cluster is deleted or rewritten, no foreign route is touched, nothing is added. Then,
//! with every input restored, the kernel is still the same (nothing had been lost to put back).
//!
//! Two clusters, each with foreign routes in the kernel, so that a wrong fallback is seen:
//! - *3.33, routewarden programs both classes* (`Felix Enabled`, `BGP Disabled`): Felix's
//!   default (EnabledIPIPOnly) would drop no-encap;
//! - *3.30, BIRD programs IPIP and no-encap* (its routes in the kernel): 3.33 assumed would
//!   claim them.
//!
//! The pipeline is the agent's own, as in `bad_input.rs`: the file datastore's loader at
//! explicit times, [`ViewState`], [`plan`] and the [`Reconciler`] on a fake kernel. A restart
//! drops all of it but the kernel.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::*;

use super::bad_input::Agent;
use crate::dataplane::fake::{observed as route, FakeClock, FakeNetlink};
use crate::dataplane::kernel::route::{ObservedRoute, RouteKey, RouteKind};
use crate::ownership::VersionChoice;
use crate::vocabulary::RTPROT_BIRD;

const SETTLE: Duration = Duration::from_secs(30);
const FILES: [&str; 3] = ["calico.yaml", "ipam.yaml", "nodes.yaml"];
const ETH0: u32 = 2;
const TUNL0: u32 = 3;

fn example(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster").join(name)).expect("example file")
}

/// The valid cluster of `base`, file by file.
fn valid(base: usize, file: usize) -> String {
    let text = example(FILES[file]);
    if file != 0 {
        return text;
    }
    match base {
        0 => text
            .replace("programClusterRoutes: EnabledIPIPOnly", "programClusterRoutes: Enabled")
            .replace("programClusterRoutes: EnabledNoEncapOnly", "programClusterRoutes: Disabled"),
        _ => text.replace("calicoVersion: v3.33.0", "calicoVersion: v3.30.2"),
    }
}

/// One way to break the input that is no evidence of a deletion.
#[derive(Clone, Copy, Debug)]
enum Break {
    /// node-b's address does not parse.
    NodeAddress,
    /// FelixConfiguration default's programClusterRoutes a list.
    FelixList,
    /// FelixConfiguration default's programClusterRoutes a value Felix does not accept.
    FelixUnknown,
    /// BGPConfiguration default's programClusterRoutes a list.
    BgpList,
    /// ClusterInformation default's calicoVersion a list.
    VersionList,
    /// ClusterInformation default's calicoVersion not a release.
    VersionUnknown,
    /// An IPAM block with a field that does not parse.
    BlockField,
    /// node-b defined again, in a new file that sorts first, with another address.
    DuplicateNode,
    /// ipip-always defined again, in a new file, with another CIDR.
    DuplicatePool,
    /// An IPAM block of node-c inside node-b's 10.244.20.0/26, in a new file: both
    /// refused, the /26 frozen.
    OverlappingBlock,
    /// A /24 IPAM block of node-b in ipip-always, a pool of /26 blocks, in a new file: refused
    /// (it was routed).
    WrongSizeBlock,
    /// A file emptied.
    Empty(usize),
    /// A file garbled (a syntax error).
    Garbage(usize),
    /// A file that cannot be opened (a symlink loop: ELOOP, as EACCES is for a process without
    /// CAP_DAC_OVERRIDE).
    Unreadable(usize),
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Break(Break),
    /// Every input back to the valid cluster.
    Restore,
    /// The agent stops and starts again.
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    let f = 0..3usize;
    let kind = prop_oneof![
        Just(Break::NodeAddress),
        Just(Break::FelixList),
        Just(Break::FelixUnknown),
        Just(Break::BgpList),
        Just(Break::VersionList),
        Just(Break::VersionUnknown),
        Just(Break::BlockField),
        Just(Break::DuplicateNode),
        Just(Break::DuplicatePool),
        Just(Break::OverlappingBlock),
        Just(Break::WrongSizeBlock),
        f.clone().prop_map(Break::Empty),
        f.clone().prop_map(Break::Garbage),
        f.prop_map(Break::Unreadable),
    ];
    prop_oneof![4 => kind.prop_map(Op::Break), 1 => Just(Op::Restore), 2 => Just(Op::Restart)]
}

struct Tree {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    base: usize,
}

impl Tree {
    fn new(base: usize) -> Tree {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cluster");
        std::fs::create_dir_all(&root).unwrap();
        let t = Tree { _tmp: tmp, root, base };
        t.restore();
        t
    }

    fn path(&self, file: usize) -> PathBuf {
        self.root.join(FILES[file])
    }

    fn write(&self, file: usize, text: &str) {
        let p = self.path(file);
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, text).unwrap();
    }

    /// `file`'s current text with `from` replaced by `to` (when the file is a readable one
    /// that has `from`; a break of a file already broken otherwise changes nothing).
    fn edit(&self, file: usize, from: &str, to: &str) {
        if let Ok(text) = std::fs::read_to_string(self.path(file)) {
            if text.contains(from) {
                self.write(file, &text.replacen(from, to, 1));
            }
        }
    }

    fn restore(&self) {
        for f in 0..3 {
            self.write(f, &valid(self.base, f));
        }
        for extra in ["00-node.yaml", "00-pool.yaml", "00-block.yaml", "00-wide-block.yaml"] {
            let _ = std::fs::remove_file(self.root.join(extra));
        }
    }

    fn apply(&self, b: Break) {
        match b {
            Break::NodeAddress => self.edit(2, "projectcalico.org/IPv4Address: 10.0.0.12/24", "projectcalico.org/IPv4Address: not-an-ip/99"),
            Break::FelixList => {
                self.edit(0, "programClusterRoutes: Enabled\n", "programClusterRoutes: [Enabled]\n");
                self.edit(0, "programClusterRoutes: EnabledIPIPOnly\n", "programClusterRoutes: [EnabledIPIPOnly]\n");
            }
            Break::FelixUnknown => {
                self.edit(0, "programClusterRoutes: Enabled\n", "programClusterRoutes: Bogus\n");
                self.edit(0, "programClusterRoutes: EnabledIPIPOnly\n", "programClusterRoutes: Bogus\n");
            }
            Break::BgpList => {
                self.edit(0, "programClusterRoutes: Disabled\n", "programClusterRoutes: [Disabled]\n");
                self.edit(0, "programClusterRoutes: EnabledNoEncapOnly\n", "programClusterRoutes: [EnabledNoEncapOnly]\n");
            }
            Break::VersionList => {
                self.edit(0, "calicoVersion: v3.33.0", "calicoVersion: [v3.33.0]");
                self.edit(0, "calicoVersion: v3.30.2", "calicoVersion: [v3.30.2]");
            }
            Break::VersionUnknown => {
                self.edit(0, "calicoVersion: v3.33.0", "calicoVersion: banana");
                self.edit(0, "calicoVersion: v3.30.2", "calicoVersion: banana");
            }
            Break::BlockField => {
                self.edit(1, "spec: {cidr: 10.245.20.0/26, affinity: \"host:node-b\"", "spec: {cidr: 10.245.20.0/99, affinity: \"host:node-b\"");
            }
            Break::DuplicateNode => std::fs::write(
                self.root.join("00-node.yaml"),
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-b\n  annotations: {projectcalico.org/IPv4Address: 10.0.0.99/24}\n",
            )
            .unwrap(),
            Break::DuplicatePool => std::fs::write(
                self.root.join("00-pool.yaml"),
                "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: ipip-always}\nspec: {cidr: 10.250.0.0/16, ipipMode: Never}\n",
            )
            .unwrap(),
            Break::OverlappingBlock => std::fs::write(
                self.root.join("00-block.yaml"),
                "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-20-32-27}\nspec: {cidr: 10.244.20.32/27, affinity: 'host:node-c'}\n",
            )
            .unwrap(),
            Break::WrongSizeBlock => std::fs::write(
                self.root.join("00-wide-block.yaml"),
                "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-245-64-0-24}\nspec: {cidr: 10.245.64.0/24, affinity: 'host:node-b'}\n",
            )
            .unwrap(),
            Break::Empty(f) => self.write(f, ""),
            Break::Garbage(f) => self.write(f, "kind: [ {\n\u{1} not yaml: ["),
            Break::Unreadable(f) => {
                let p = self.path(f);
                let _ = std::fs::remove_file(&p);
                std::os::unix::fs::symlink(&p, &p).unwrap();
            }
        }
    }
}

/// The kernel of `base` before the agent first starts: foreign routes only. A static route
/// outside every pool, a BIRD route in the VXLAN pool (Felix's class); on 3.30, BIRD's routes
/// for the IPIP and no-encap blocks it programs there (and its own-block blackhole).
fn kernel(base: usize) -> FakeNetlink {
    let nl = FakeNetlink::with_links(&[(1, "lo"), (ETH0, "eth0"), (TUNL0, "tunl0")]);
    nl.insert(route("192.168.77.0/24", 0, 4, Some("10.0.0.1"), Some(ETH0), RouteKind::Unicast));
    nl.insert(route("10.247.40.0/26", 0, RTPROT_BIRD, Some("10.0.1.14"), Some(ETH0), RouteKind::Unicast));
    if base == 1 {
        nl.insert(route("10.244.10.0/26", 0, RTPROT_BIRD, None, None, RouteKind::Blackhole));
        nl.insert(route("10.244.20.0/26", 0, RTPROT_BIRD, Some("10.0.0.12"), Some(ETH0), RouteKind::Unicast));
        nl.insert(route("10.244.40.0/26", 0, RTPROT_BIRD, Some("10.0.1.14"), Some(TUNL0), RouteKind::Unicast));
        nl.insert(route("10.245.20.0/26", 0, RTPROT_BIRD, Some("10.0.0.12"), Some(TUNL0), RouteKind::Unicast));
        nl.insert(route("10.246.30.0/26", 0, RTPROT_BIRD, Some("10.0.0.13"), Some(ETH0), RouteKind::Unicast));
    }
    nl
}

/// Run `ops` (each followed by `advance_s` seconds) on `base`'s cluster: after every step the
/// kernel is exactly what the valid cluster converged to, and so it is at the end, with every
/// input restored and four settle periods past.
fn run(base: usize, ops: &[(Op, u64)]) -> Result<(), TestCaseError> {
    let tree = Tree::new(base);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let clock = FakeClock::new();
    let nl = kernel(base);
    let mut agent = Agent::with_version(&tree.root, nl.clone(), clock.clone(), VersionChoice::Auto);
    for _ in 0..3 {
        rt.block_on(agent.step());
        clock.advance(SETTLE);
    }
    let valid: BTreeMap<RouteKey, ObservedRoute> = nl.state().routes.clone();
    let ours = valid.values().filter(|r| r.protocol == 80).count();
    prop_assert_eq!(ours, if base == 0 { 11 } else { 0 }, "the valid cluster's routes of routewarden");
    nl.take_log();
    for (i, (op, advance_s)) in ops.iter().enumerate() {
        match op {
            Op::Break(b) => tree.apply(*b),
            Op::Restore => tree.restore(),
            Op::Restart => agent = Agent::with_version(&tree.root, nl.clone(), clock.clone(), VersionChoice::Auto),
        }
        rt.block_on(agent.step());
        clock.advance(Duration::from_secs(*advance_s));
        rt.block_on(agent.step());
        let now = nl.state().routes.clone();
        prop_assert!(now == valid, "step {i} ({op:?}): the kernel changed: writes {:?}", nl.take_log());
    }
    tree.restore();
    for _ in 0..24 {
        rt.block_on(agent.step());
        clock.advance(Duration::from_secs(5));
    }
    prop_assert!(nl.state().routes == valid, "restored: the kernel changed");
    let writes: Vec<String> = nl.take_log().into_iter().filter(|l| !l.starts_with("dump")).collect();
    prop_assert!(writes.is_empty(), "no change is zero writes: {writes:?}");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn broken_inputs_and_restarts_in_any_order_never_change_the_kernel(
        base in 0..2usize,
        ops in proptest::collection::vec((op(), 0..45u64), 1..10),
    ) {
        run(base, &ops)?;
    }
}

/// The restart cases as fixed sequences (the property covers their combinations).
#[test]
fn each_break_then_a_restart() {
    let kinds = [
        Break::NodeAddress,
        Break::FelixList,
        Break::FelixUnknown,
        Break::BgpList,
        Break::VersionList,
        Break::VersionUnknown,
        Break::BlockField,
        Break::DuplicateNode,
        Break::DuplicatePool,
        Break::OverlappingBlock,
        Break::WrongSizeBlock,
        Break::Empty(1),
        Break::Garbage(0),
        Break::Unreadable(1),
    ];
    for base in 0..2 {
        for b in kinds {
            let ops = [(Op::Break(b), 40), (Op::Restart, 40), (Op::Restart, 40)];
            run(base, &ops).unwrap_or_else(|e| panic!("base {base}, {b:?}: {e}"));
        }
    }
}
