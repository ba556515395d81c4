//! Policy rules: whether an `ip rule` sends traffic to routewarden's table
//! (`routewarden_route_table_rule{family,table}`, from [`crate::dataplane::table_rule`]), and
//! the rule writes the route watch sees (`routewarden_rule_writes_total{family,op,writer}`,
//! from the kernel's per-CPU counters, as route writes).

use prometheus_client::encoding::EncodeLabelSet;
use routewarden_common::route_watch::{RouteWatchCounters, WriteOp, WriterClass, RULE_OPS, WRITER_CLASSES};

use super::route_watch::FAMILY_LABELS;
use super::Metrics;
use crate::dataplane::table_rule::TableRuleCheck;
use crate::dataplane::Family;

/// Labels `{family, table}` of `routewarden_route_table_rule`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableRuleLabels {
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    /// routewarden's table (`--route-table`), one value per agent.
    pub table: String,
}

/// Labels `{family, op, writer}` of `routewarden_rule_writes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleWriteLabels {
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    /// `add` or `delete` (rules have no replace).
    pub op: &'static str,
    /// Writer class: `self`, `felix`, `bird`, `kernel`, `boot`, `static`, `other`.
    pub writer: &'static str,
}

/// The operations by the kernel rule counters' operation index.
pub(super) const RULE_OP_LABELS: [WriteOp; RULE_OPS] = [WriteOp::Add, WriteOp::Delete];

fn family_label(f: Family) -> &'static str {
    match f {
        Family::V4 => FAMILY_LABELS[0],
        Family::V6 => FAMILY_LABELS[1],
    }
}

impl Metrics {
    /// `routewarden_route_table_rule{family,table}`: 1 when some rule sends traffic of the
    /// family to the table ([`TableRuleCheck::selected`]), 0 when none does, for each family
    /// routewarden has routes of there; the series of a family or table no longer checked are
    /// removed (no routes, or the table is main: nothing to select).
    pub fn record_table_rules(&self, checks: &[TableRuleCheck]) {
        let mut keep = Vec::new();
        for c in checks {
            let labels = TableRuleLabels { family: family_label(c.family), table: c.table.to_string() };
            self.route_table_rule.get_or_create(&labels).set(i64::from(c.selected()));
            keep.push(labels);
        }
        let mut known = self.table_rule_series.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for old in known.iter().filter(|l| !keep.contains(l)) {
            self.route_table_rule.remove(old);
        }
        *known = keep;
    }

    /// Add the rule writes the route watch's kernel counters counted between two reads
    /// (`before`, then `now`), by family, operation and writer class.
    pub(super) fn record_rule_writes(&self, now: &RouteWatchCounters, before: &RouteWatchCounters) {
        for (fi, family) in FAMILY_LABELS.into_iter().enumerate() {
            for (oi, op) in RULE_OP_LABELS.into_iter().enumerate() {
                for ci in 0..WRITER_CLASSES {
                    let d = now.rule_writes[fi][oi][ci].saturating_sub(before.rule_writes[fi][oi][ci]);
                    if d > 0 {
                        self.rule_writes.get_or_create(&RuleWriteLabels { family, op: op.label(), writer: WriterClass::ALL[ci].label() }).inc_by(d);
                    }
                }
            }
        }
    }
}
