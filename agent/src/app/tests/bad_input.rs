//! The bad-input property over the file datastore: any sequence of writes, truncations, partial
//! writes, renames, deletions, symlink changes and directory swaps made within one settle
//! period, ending in a stable valid tree, converges to exactly that tree's routes, and at no
//! point deletes a route the final tree still wants.
//!
//! The pipeline is the agent's own, with a fake kernel and a manual clock: the file
//! datastore's [`Loader`](crate::datastore) (rescanned at explicit times), [`ViewState`],
//! [`plan`] and the [`Reconciler`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::*;

use crate::app::view::ViewState;
use crate::dataplane::fake::{FakeClock, FakeNetlink};
use crate::dataplane::kernel::route::{to_kernel_route, ObservedRoute, RouteKey};
use crate::dataplane::{Clock, DataplaneConfig, Reconciler};
use crate::datastore::file_loader_for_tests as loader_for;
use crate::ownership::{CalicoVersion, OwnershipConfig, Role};
use crate::plan::{plan, Plan, PlanConfig};
use crate::routes::RouteDevices;

const SETTLE: Duration = Duration::from_secs(30);
const FILES: [&str; 3] = ["calico.yaml", "ipam.yaml", "nodes.yaml"];

fn example(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster").join(name)).expect("example file")
}

/// Valid versions of each file: the example, and a deliberate edit of it.
fn variants(file: usize) -> Vec<String> {
    let original = example(FILES[file]);
    let edited = match file {
        // No-encap pool gone, IPIP pool kept.
        0 => original.replace("10.246.0.0/16", "10.249.0.0/16"),
        // node-d's IPIP-always block released.
        1 => original.replace(
            "spec: {cidr: 10.245.40.0/26, affinity: \"host:node-d\", deleted: false}",
            "spec: {cidr: 10.245.40.0/26, affinity: \"host:node-d\", deleted: true}",
        ),
        // node-b's address changed.
        _ => original.replace("10.0.0.12", "10.0.0.22"),
    };
    assert_ne!(edited, original, "variant of {}", FILES[file]);
    vec![original, edited]
}

#[derive(Clone, Debug)]
enum Op {
    Write { file: usize, variant: usize },
    Truncate { file: usize, permille: u32 },
    PartialWrite { file: usize, variant: usize, permille: u32 },
    Empty { file: usize },
    Garbage { file: usize },
    RenameAway { file: usize },
    RenameBack { file: usize },
    Delete { file: usize },
    SymlinkDangling { file: usize },
    SymlinkTo { file: usize, variant: usize },
    SwapDirectory,
    RestoreDirectory,
}

fn op() -> impl Strategy<Value = Op> {
    let f = 0..3usize;
    prop_oneof![
        (f.clone(), 0..2usize).prop_map(|(file, variant)| Op::Write { file, variant }),
        (f.clone(), 0..1000u32).prop_map(|(file, permille)| Op::Truncate { file, permille }),
        (f.clone(), 0..2usize, 0..1000u32).prop_map(|(file, variant, permille)| Op::PartialWrite { file, variant, permille }),
        f.clone().prop_map(|file| Op::Empty { file }),
        f.clone().prop_map(|file| Op::Garbage { file }),
        f.clone().prop_map(|file| Op::RenameAway { file }),
        f.clone().prop_map(|file| Op::RenameBack { file }),
        f.clone().prop_map(|file| Op::Delete { file }),
        f.clone().prop_map(|file| Op::SymlinkDangling { file }),
        (f, 0..2usize).prop_map(|(file, variant)| Op::SymlinkTo { file, variant }),
        Just(Op::SwapDirectory),
        Just(Op::RestoreDirectory),
    ]
}

struct Tree {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    aside: PathBuf,
    elsewhere: PathBuf,
}

impl Tree {
    fn new(initial: &[usize; 3]) -> Tree {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cluster");
        let aside = tmp.path().join("cluster.old");
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        let t = Tree { _tmp: tmp, root, aside, elsewhere };
        for (i, v) in initial.iter().enumerate() {
            t.write(i, &variants(i)[*v]);
        }
        t
    }

    fn path(&self, file: usize) -> PathBuf {
        self.root.join(FILES[file])
    }

    /// Replace the file's path with a regular file holding `text` (whatever was there).
    fn write(&self, file: usize, text: &str) {
        let p = self.path(file);
        let _ = std::fs::remove_file(&p);
        std::fs::create_dir_all(&self.root).unwrap();
        std::fs::write(&p, text).unwrap();
    }

    fn apply(&self, op: &Op) {
        let cut = |text: &str, permille: u32| -> String {
            let n = text.len() * permille as usize / 1000;
            let mut n = n.min(text.len());
            while !text.is_char_boundary(n) {
                n -= 1;
            }
            text[..n].to_owned()
        };
        match *op {
            Op::Write { file, variant } => self.write(file, &variants(file)[variant]),
            Op::Truncate { file, permille } => {
                if let Ok(text) = std::fs::read_to_string(self.path(file)) {
                    self.write(file, &cut(&text, permille));
                }
            }
            Op::PartialWrite { file, variant, permille } => self.write(file, &cut(&variants(file)[variant], permille)),
            Op::Empty { file } => self.write(file, ""),
            Op::Garbage { file } => self.write(file, "kind: [ {\n\u{1}\u{2} not yaml: ["),
            Op::RenameAway { file } => {
                let _ = std::fs::rename(self.path(file), self.root.join(format!(".{}.bak", FILES[file])));
            }
            Op::RenameBack { file } => {
                let _ = std::fs::rename(self.root.join(format!(".{}.bak", FILES[file])), self.path(file));
            }
            Op::Delete { file } => {
                let _ = std::fs::remove_file(self.path(file));
            }
            Op::SymlinkDangling { file } => {
                let _ = std::fs::remove_file(self.path(file));
                let _ = std::os::unix::fs::symlink("/nonexistent/routewarden", self.path(file));
            }
            Op::SymlinkTo { file, variant } => {
                let target = self.elsewhere.join(format!("{}-{variant}", FILES[file]));
                std::fs::write(&target, &variants(file)[variant]).unwrap();
                let _ = std::fs::remove_file(self.path(file));
                let _ = std::os::unix::fs::symlink(&target, self.path(file));
            }
            Op::SwapDirectory => {
                if !self.aside.exists() && std::fs::rename(&self.root, &self.aside).is_ok() {
                    std::fs::create_dir_all(&self.root).unwrap();
                }
            }
            Op::RestoreDirectory => {
                if self.aside.exists() {
                    let _ = std::fs::remove_dir_all(&self.root);
                    let _ = std::fs::rename(&self.aside, &self.root);
                }
            }
        }
    }

    /// The final, stable, valid tree: every file a regular file with the chosen variant.
    fn settle_on(&self, last: &[usize; 3]) {
        if self.aside.exists() {
            let _ = std::fs::remove_dir_all(&self.root);
            std::fs::rename(&self.aside, &self.root).unwrap();
        }
        for (i, v) in last.iter().enumerate() {
            self.write(i, &variants(i)[*v]);
        }
    }
}

/// The agent's pipeline on a fake kernel (also `restart.rs`'s).
pub(super) struct Agent {
    loader: crate::datastore::TestLoader,
    view: ViewState,
    config: PlanConfig,
    last: Option<Plan>,
    reconciler: Reconciler<FakeNetlink, FakeClock>,
    nl: FakeNetlink,
    clock: FakeClock,
}

impl Agent {
    fn new(root: &Path, nl: FakeNetlink, clock: FakeClock) -> Agent {
        Agent::with_version(root, nl, clock, CalicoVersion::V3_33.into())
    }

    /// The pipeline in Felix's role on node-a with release line `version` (`auto`: as
    /// `routewarden run` is configured by default).
    pub(super) fn with_version(root: &Path, nl: FakeNetlink, clock: FakeClock, version: crate::ownership::VersionChoice) -> Agent {
        let cfg = DataplaneConfig { settle: SETTLE, ..DataplaneConfig::default() };
        let reconciler = Reconciler::new(cfg.clone(), cfg.base_policy(), nl.clone(), clock.clone());
        let ownership = OwnershipConfig { role: Role::Felix, version, node: Some("node-a".into()) };
        let config = PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 };
        Agent { loader: loader_for(root.to_path_buf(), SETTLE), view: ViewState::default(), config, last: None, reconciler, nl, clock }
    }

    /// One rescan and one apply at the clock's time.
    pub(super) fn step(&mut self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            for ev in self.loader.rescan_at(self.clock.now()) {
                self.view.on_event(&ev);
                if let crate::datastore::DatastoreEvent::Snapshot(s) = &ev {
                    let previous = self.last.as_ref().map(|p| p.programmed.clone()).unwrap_or_default();
                    let owned = self.last.as_ref().map(|p| p.policy.owned.clone()).unwrap_or_default();
                    let p = plan(s, &self.config, &previous, &owned);
                    // A route we write that the plan's own ownership policy would not call ours
                    // (outside the owned pools, say) would be another writer's to the next
                    // resync: held forever, never ours to remove.
                    let settings = DataplaneConfig::default().route_settings();
                    for r in p.desired.values() {
                        let Ok(d) = to_kernel_route(r, &settings) else { continue };
                        let verdict = p.policy.verdict(&d.route);
                        assert!(verdict.is_ours(), "desired {} is {verdict:?} to the plan's policy (owned {:?})", r.dst, p.policy.owned);
                    }
                    self.reconciler.set_policy(p.policy.clone());
                    self.reconciler.set_desired_with_handover(&p.desired.values().map(|r| (**r).clone()).collect::<Vec<_>>(), &p.handovers);
                    self.last = Some(p);
                }
            }
            self.reconciler.set_datastore_synced(self.view.deletions_allowed(self.last.as_ref()));
            self.reconciler.apply().await;
        })
    }

    fn kernel(&self) -> BTreeMap<RouteKey, ObservedRoute> {
        self.nl.state().routes.clone()
    }
}

fn fake_kernel() -> FakeNetlink {
    FakeNetlink::with_links(&[(1, "lo"), (2, "eth0"), (3, "tunl0")])
}

/// What the final tree alone converges to, from an empty kernel.
fn reference(tree_root: &Path) -> BTreeMap<RouteKey, ObservedRoute> {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let clock = FakeClock::new();
    let mut a = Agent::new(tree_root, fake_kernel(), clock.clone());
    rt.block_on(async {
        for _ in 0..3 {
            a.step().await;
            clock.advance(SETTLE);
        }
    });
    a.kernel()
}

fn run(initial: [usize; 3], ops: &[(Op, u64)], last: [usize; 3]) -> Result<(), TestCaseError> {
    let tree = Tree::new(&initial);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let clock = FakeClock::new();
    let nl = fake_kernel();
    let mut agent = Agent::new(&tree.root, nl.clone(), clock.clone());
    rt.block_on(agent.step());
    prop_assert!(!agent.kernel().is_empty(), "the initial tree programs routes");
    let mut elapsed = Duration::ZERO;
    for (op, advance_ms) in ops {
        tree.apply(op);
        let d = Duration::from_millis(*advance_ms);
        elapsed += d;
        clock.advance(d);
        rt.block_on(agent.step());
    }
    prop_assert!(elapsed < SETTLE, "the sequence fits in one settle period");
    tree.settle_on(&last);
    // Stable from here: rescans and applies every 5 s for four settle periods.
    for _ in 0..24 {
        rt.block_on(agent.step());
        clock.advance(Duration::from_secs(5));
    }
    let want = reference(&tree.root);
    let got = agent.kernel();
    prop_assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "routes of the final tree");
    prop_assert_eq!(&got, &want);
    let wanted: BTreeSet<String> = want.keys().map(ToString::to_string).collect();
    let deleted_wanted: Vec<String> = nl.take_log().into_iter().filter(|l| l.strip_prefix("delete ").is_some_and(|k| wanted.contains(k))).collect();
    prop_assert!(deleted_wanted.is_empty(), "deleted routes the final tree wants: {:?}", deleted_wanted);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn any_mistake_within_a_settle_period_converges_and_deletes_nothing_still_wanted(
        initial in [0..2usize, 0..2usize, 0..2usize],
        ops in proptest::collection::vec((op(), 0..3_000u64), 1..9),
        last in [0..2usize, 0..2usize, 0..2usize],
    ) {
        run(initial, &ops, last)?;
    }
}

/// The table's rows 1-5 as fixed sequences (the property covers their combinations).
#[test]
fn rows_one_to_five_as_sequences() {
    let keep = [0, 0, 0];
    let cases: Vec<Vec<(Op, u64)>> = vec![
        vec![(Op::Empty { file: 1 }, 1_000)],
        vec![(Op::Empty { file: 1 }, 1_500), (Op::Write { file: 1, variant: 0 }, 0)],
        vec![(Op::SwapDirectory, 1_000), (Op::RestoreDirectory, 10_000)],
        vec![(Op::SymlinkDangling { file: 2 }, 1_000)],
        vec![(Op::Delete { file: 2 }, 1_000)],
        vec![(Op::Truncate { file: 1, permille: 300 }, 1_000)],
    ];
    for ops in cases {
        run(keep, &ops, keep).unwrap_or_else(|e| panic!("{ops:?}: {e}"));
    }
}
