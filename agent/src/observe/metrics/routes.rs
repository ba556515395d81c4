//! The route table's metrics: what the plan wants and why ([`Metrics::record_plan`]: the
//! Calico release line, frozen ground, ownership findings, route problems, desired routes),
//! what one apply did ([`Metrics::record_apply`], [`Metrics::record_mass_deletion_hold`]:
//! held deletions, programmed and held routes, netlink writes and errors, the apply's
//! duration), and what the audit found ([`Metrics::record_audit`],
//! [`Metrics::record_audit_failed`]). `routewarden_routes` and
//! `routewarden_netlink_errors_total` have series from two of these; each label set is still
//! built in one function here.

use prometheus_client::encoding::EncodeLabelSet;

use super::{gauge_value, Metrics};
use crate::dataplane::{ApplyReport, AuditReport, Family, FindingCode};
use crate::ownership::ResolvedVersion;
use crate::plan::Plan;
use crate::routes::routable_classes;
use crate::vocabulary::PoolClass;

/// Labels `{code, class}` of `routewarden_ownership_findings`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FindingLabels {
    /// `consistent`, `double-programmed`, `unowned`, `deprecated`, `version-skew`.
    pub code: &'static str,
    /// `ipip`, `noencap`, `vxlan`, or `none` (version skew).
    pub class: &'static str,
}

/// Labels `{class}` of `routewarden_frozen_classes`: `ipip` or `noencap` (the classes a
/// programClusterRoutes value or a release line decides), both always present.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FrozenClassLabels {
    pub class: &'static str,
}

/// Labels `{code}` of `routewarden_route_problems`. The block concerned is in the log line
/// and in `routewarden explain`, never a label (one series per block would grow without
/// bound): at most one series per problem code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProblemLabels {
    /// The problem's code (`affinity-conflict`, ...; `RouteProblem::code`).
    pub code: &'static str,
}

/// Labels `{version, rules, source}` of `routewarden_calico_version_info`: one series, for the
/// Calico release line in force (`ownership::resolve_version`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CalicoVersionLabels {
    /// `3.<minor>` as detected or given (`3.34` stays `3.34`).
    pub version: String,
    /// Whose rules decide: `3.26-3.30`, `3.31`, `3.32` or `3.33`.
    pub rules: &'static str,
    /// `flag`, `cluster-information` or `assumed`.
    pub source: &'static str,
}

/// Labels `{reason}` of `routewarden_deletions_held`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HoldLabels {
    /// `not-synced` (the view is not current, this node's Node is missing, or an input never
    /// loaded), `frozen` (the prefix is frozen ground), `mass-deletion` (the breaker).
    pub reason: &'static str,
}

/// Labels `{family, class, state}` of `routewarden_routes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    /// `ipip`, `noencap`, `vxlan`.
    pub class: &'static str,
    /// `desired`, `programmed`, or `held` (another writer's route holds the key and
    /// routewarden will not overwrite it; not programmed, not missing).
    pub state: &'static str,
}

/// Labels `{op, result}` of `routewarden_route_operations_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// `replace` or `delete`.
    pub op: &'static str,
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Labels `{op, kind}` of `routewarden_netlink_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NetlinkErrorLabels {
    /// `apply` (route writes, deletes, link and resync dumps of one apply pass) or `dump`
    /// (the audit's dumps).
    pub op: &'static str,
    /// Error kind from a fixed set (`dataplane::ErrorKind::label`): `dump-interrupted`,
    /// `foreign-route-at-key`, `no-device`, `device-down`, `net-unreachable`, `timeout`,
    /// `permission`, `invalid`, `bad-desired-route`, `other`.
    pub kind: &'static str,
}

/// Labels `{code}` of `routewarden_audit_findings`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuditLabels {
    /// `missing`, `stale`, `duplicate`, `wrong-path`, `wrong-next-hop`, `foreign-writer`.
    pub code: &'static str,
}

/// The `reason` values of `routewarden_deletions_held`, in the order
/// [`Metrics::record_apply`] reads them from the report.
const HOLD_REASONS: [&str; 3] = ["not-synced", "frozen", "mass-deletion"];

/// The `family` label value of a route family.
fn family_label(f: Family) -> &'static str {
    match f {
        Family::V4 => "ipv4",
        Family::V6 => "ipv6",
    }
}

impl Metrics {
    /// A new plan (every snapshot): the release line in force, the number of frozen
    /// prefixes, the ownership findings and route problems by code (replacing the previous
    /// plan's series), and the desired routes of each routable class and family.
    pub fn record_plan(&self, plan: &Plan) {
        let d = &plan.decision;
        self.frozen_prefixes.set(gauge_value(plan.frozen.len()));
        for class in [PoolClass::Ipip, PoolClass::NoEncap] {
            let frozen = plan.frozen_classes.iter().any(|f| f.class == class);
            self.frozen_classes.get_or_create(&FrozenClassLabels { class: class.label() }).set(i64::from(frozen));
        }
        self.route_problems.clear();
        for p in &plan.problems {
            self.route_problems.get_or_create(&ProblemLabels { code: p.code() }).inc();
        }
        self.record_calico_version(&d.version);
        self.ownership_findings.clear();
        for f in &d.findings {
            self.ownership_findings.get_or_create(&FindingLabels { code: f.code(), class: f.class_label() }).inc();
        }
        // Desired counts by family and class (programmed counts come from apply reports), in
        // one pass over the desired routes.
        let mut desired: std::collections::BTreeMap<(PoolClass, Family), usize> =
            routable_classes().into_iter().flat_map(|c| [Family::V4, Family::V6].map(|f| ((c, f), 0))).collect();
        for r in plan.desired.values() {
            if let Some(n) = desired.get_mut(&(r.class, Family::of(&r.dst))) {
                *n += 1;
            }
        }
        for ((class, fam), n) in desired {
            self.set_routes(fam, class, "desired", n);
        }
    }

    /// Set `routewarden_calico_version_info` to the one series of `version` (the previous
    /// one, if different, is removed).
    pub fn record_calico_version(&self, version: &ResolvedVersion) {
        let labels = CalicoVersionLabels { version: version.version.to_string(), rules: version.rules.label(), source: version.source.label() };
        if self.calico_version.get(&labels).is_none() {
            self.calico_version.clear();
        }
        self.calico_version.get_or_create(&labels).set(1);
    }

    /// One apply of the dataplane ([`ApplyReport`]): the deletions it held by reason, the
    /// route writes and deletes by result, its netlink errors by kind (`op="apply"`), its
    /// duration, and the programmed and held routes of each routable class and family.
    pub fn record_apply(&self, report: &ApplyReport) {
        let held = [report.deletes_deferred_unsynced, report.deletes_deferred_frozen, report.deletes_held_mass];
        for (reason, n) in HOLD_REASONS.into_iter().zip(held) {
            self.set_deletions_held(reason, n);
        }
        let ops = |op, result, n| self.route_operations.get_or_create(&OperationLabels { op, result }).inc_by(n);
        ops("replace", "ok", report.writes);
        ops("delete", "ok", report.deletes + report.deletes_already_gone);
        ops("replace", "error", report.write_errors);
        ops("delete", "error", report.delete_errors);
        ops("nexthop-replace", "ok", report.nexthop_writes);
        ops("nexthop-delete", "ok", report.nexthop_deletes);
        ops("nexthop-replace", "error", report.nexthop_write_errors);
        ops("nexthop-delete", "error", report.nexthop_delete_errors);
        for (kind, n) in &report.errors {
            self.count_netlink_errors("apply", kind.label(), *n);
        }
        self.reconcile_duration.0.observe(report.duration.as_secs_f64());
        for class in routable_classes() {
            for fam in [Family::V4, Family::V6] {
                let counts = report.by_class.iter().filter(|((f, c, _), _)| *f == fam && *c == class).map(|(_, v)| v);
                let (programmed, held) = counts.fold((0, 0), |(p, h), v| (p + v.programmed, h + v.held));
                self.set_routes(fam, class, "programmed", programmed);
                self.set_routes(fam, class, "held", held);
            }
        }
    }

    /// The mass-deletion breaker engaged (once per engagement, not per apply it holds):
    /// `routewarden_mass_deletion_holds_total` + 1.
    pub fn record_mass_deletion_hold(&self) {
        self.mass_deletion_holds.inc();
    }

    /// One audit of the kernel (`--mode audit`): `routewarden_audit_findings` by code, every
    /// code present (0 when clean).
    pub fn record_audit(&self, report: &AuditReport) {
        self.audit_findings.clear();
        for code in FindingCode::ALL {
            let n = report.findings.iter().filter(|f| f.code == code).count();
            self.audit_findings.get_or_create(&AuditLabels { code: code.as_str() }).set(gauge_value(n));
        }
    }

    /// The audit's route dump failed: `routewarden_netlink_errors_total{op="dump",kind="other"}`
    /// + 1.
    pub fn record_audit_failed(&self) {
        self.count_netlink_errors("dump", "other", 1);
    }

    /// Declare `routewarden_deletions_held` at 0 for every reason, so that alerts see the
    /// first increase.
    pub(super) fn declare_deletions_held(&self) {
        for reason in HOLD_REASONS {
            self.set_deletions_held(reason, 0);
        }
    }

    fn set_deletions_held(&self, reason: &'static str, n: usize) {
        self.deletions_held.get_or_create(&HoldLabels { reason }).set(gauge_value(n));
    }

    fn set_routes(&self, family: Family, class: PoolClass, state: &'static str, n: usize) {
        self.routes.get_or_create(&RouteLabels { family: family_label(family), class: class.label(), state }).set(gauge_value(n));
    }

    fn count_netlink_errors(&self, op: &'static str, kind: &'static str, n: u64) {
        self.netlink_errors.get_or_create(&NetlinkErrorLabels { op, kind }).inc_by(n);
    }
}
