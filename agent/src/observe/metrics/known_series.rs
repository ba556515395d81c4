//! Counters whose label values are all known in advance get every series at 0 when the
//! registry is made, so dashboards and `rate()` have a series before the first event
//! (Prometheus' instrumentation guidelines, "Avoid missing metrics"). Counters labelled by
//! something only the cluster knows (an IP pool) are left to appear with their first event.

use routewarden_common::route_watch::WriterClass;

use super::datastore::LoadErrorLabels;
use super::route_watch::{writers_label, FailingWriterLabels, FamilyLabels, RouteConflictLabels, RouteWriteLabels, FAMILY_LABELS, OP_LABELS};
use super::routes::{NetlinkErrorLabels, OperationLabels};
use super::table_rule::{RuleWriteLabels, RULE_OP_LABELS};
use super::Metrics;
use crate::dataplane::ErrorKind;
use crate::datastore::LoadErrorKind;

/// The `op` label values of `routewarden_route_operations_total`.
const OPERATIONS: [&str; 4] = ["replace", "delete", "nexthop-replace", "nexthop-delete"];

impl Metrics {
    /// Create every series of the counters with fixed label sets, at 0: route writes
    /// and refused route writes (family × op × writer class), failing-writer episodes (family × writer class), rule writes (family × add/delete × writer class), conflicts (family × writer pair), flaps, flushes and
    /// unattributed writes (family), route operations (op × result), netlink errors
    /// (`apply` × error kind, `dump` × `other`), datastore load errors (reason).
    pub(super) fn declare_known_series(&self) {
        for family in FAMILY_LABELS {
            for op in OP_LABELS.map(routewarden_common::route_watch::WriteOp::label) {
                for writer in WriterClass::ALL {
                    self.route_writes.get_or_create(&RouteWriteLabels { family, op, writer: writer.label() }).inc_by(0);
                    self.route_write_failures.get_or_create(&RouteWriteLabels { family, op, writer: writer.label() }).inc_by(0);
                }
            }
            for (i, a) in WriterClass::ALL.into_iter().enumerate() {
                for b in WriterClass::ALL.into_iter().skip(i) {
                    self.route_conflicts.get_or_create(&RouteConflictLabels { family, writers: writers_label(a, b) }).inc_by(0);
                }
            }
            self.route_flaps.get_or_create(&FamilyLabels { family }).inc_by(0);
            for writer in WriterClass::ALL {
                self.failing_writer_episodes.get_or_create(&FailingWriterLabels { family, writer: writer.label() }).inc_by(0);
            }
            self.route_flushes.get_or_create(&FamilyLabels { family }).inc_by(0);
            self.route_writes_unattributed.get_or_create(&FamilyLabels { family }).inc_by(0);
            for op in RULE_OP_LABELS.map(routewarden_common::route_watch::WriteOp::label) {
                for writer in WriterClass::ALL {
                    self.rule_writes.get_or_create(&RuleWriteLabels { family, op, writer: writer.label() }).inc_by(0);
                }
            }
        }
        for op in OPERATIONS {
            for result in ["ok", "error"] {
                self.route_operations.get_or_create(&OperationLabels { op, result }).inc_by(0);
            }
        }
        for kind in ErrorKind::ALL {
            self.netlink_errors.get_or_create(&NetlinkErrorLabels { op: "apply", kind: kind.label() }).inc_by(0);
        }
        self.netlink_errors.get_or_create(&NetlinkErrorLabels { op: "dump", kind: "other" }).inc_by(0);
        for reason in LoadErrorKind::ALL.map(LoadErrorKind::code).into_iter().chain(["object"]) {
            self.datastore_load_errors.get_or_create(&LoadErrorLabels { reason }).inc_by(0);
        }
    }
}
