//! The table-rule handler (`--route-table` other than main, program mode): whether an `ip
//! rule` sends traffic to routewarden's table, per family of its desired routes
//! ([`crate::dataplane::table_rule`]), into `routewarden_route_table_rule`, `/readyz` lines and
//! the log; and with `--route-table-rule-priority` the rule itself.
//!
//! Checked after every new plan, every resync interval, and on every rule change the route
//! watch reports. The rule routewarden makes (`from all lookup <table> priority <n> proto
//! <ours>`) follows the route invariants (DESIGN.md): it is made only when a dump shows it
//! absent (a restart or a resync with it in place writes nothing), create-exclusive (rules
//! have no replace), with routewarden's route protocol, and never deleted: not when the flag
//! goes, nor when the table or priority changes (the kernel keeps no record of what the flag
//! was, so nothing is positive evidence that the rule is unwanted; a rule left over looks up
//! a table and falls through when it has no route). Another writer's rule is never touched.

use std::collections::BTreeSet;

use ipnet::IpNet;
use tracing::{info, warn};

use crate::dataplane::kernel::rule::ObservedRule;
use crate::dataplane::table_rule::{check_table, family_words, has_own_rule, TableRuleCheck};
use crate::dataplane::{Family, KernelDump, NetlinkError};
use crate::observe::{Health, Metrics};
use crate::plan::Plan;
use crate::vocabulary::RT_TABLE_MAIN;

/// The handler's state: its reader, the flags, and the lines last reported.
pub(super) struct TableRuleHandler {
    nl: KernelDump,
    table: u32,
    priority: Option<u32>,
    protocol: u8,
    last_lines: Vec<String>,
}

impl TableRuleHandler {
    /// A handler for `table` (`None` for main, which the kernel's default rules select).
    pub(super) fn new(nl: KernelDump, table: u32, priority: Option<u32>, protocol: u8) -> Option<TableRuleHandler> {
        (table != RT_TABLE_MAIN).then_some(TableRuleHandler { nl, table, priority, protocol, last_lines: Vec::new() })
    }

    /// Both families' rules.
    async fn rules(&self) -> Result<Vec<ObservedRule>, NetlinkError> {
        let mut rules = self.nl.rules(Family::V4).await?;
        rules.extend(self.nl.rules(Family::V6).await?);
        Ok(rules)
    }

    /// Make routewarden's rule in each family of `families` whose rules lack it; true when
    /// one was made. A failure is a line for `/readyz`.
    async fn ensure_own_rules(&self, rules: &[ObservedRule], families: &BTreeSet<Family>, notes: &mut Vec<String>) -> bool {
        let Some(priority) = self.priority else { return false };
        let (table, protocol) = (self.table, self.protocol);
        let mut made = false;
        for &family in families {
            if has_own_rule(rules, family, table, priority, protocol) {
                continue;
            }
            let flag = family_words(family).1;
            match self.nl.add_table_rule(family, table, priority, protocol).await {
                Ok(()) => {
                    info!(family = family.label(), table, priority, protocol, "created the policy rule that selects routewarden's table");
                    made = true;
                }
                // Made by someone else since the dump, identical to ours: there it is.
                Err(NetlinkError::Kernel { errno: nix::errno::Errno::EEXIST, .. }) => made = true,
                Err(e) => notes.push(format!("table-rule: `ip {flag} rule add from all lookup {table} priority {priority} proto {protocol}` failed: {e}")),
            }
        }
        made
    }

    /// Check the rules against `plan`'s desired routes (and make ours first, if asked).
    pub(super) async fn check(&mut self, plan: &Plan, metrics: &Metrics, health: &Health) {
        let routes: Vec<IpNet> = plan.desired.keys().copied().collect();
        let families: BTreeSet<Family> = routes.iter().map(Family::of).collect();
        let mut notes = Vec::new();
        let mut rules = match self.rules().await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, table = self.table, "table rule: dumping the policy rules failed");
                return;
            }
        };
        if self.ensure_own_rules(&rules, &families, &mut notes).await {
            match self.rules().await {
                Ok(r) => rules = r,
                Err(e) => warn!(error = %e, table = self.table, "table rule: dumping the policy rules failed"),
            }
        }
        let checks = check_table(&rules, self.table, &routes);
        metrics.record_table_rules(&checks);
        let lines: Vec<String> = checks.iter().filter_map(TableRuleCheck::line).chain(notes).collect();
        if lines != self.last_lines {
            for l in &lines {
                warn!(table = self.table, "{l}");
            }
            if lines.is_empty() {
                info!(table = self.table, "a policy rule selects routewarden's table for every family it has routes of");
            }
        }
        health.set_table_rule_lines(lines.clone());
        self.last_lines = lines;
    }
}

/// [`TableRuleHandler::check`] when there is a handler and a plan.
pub(super) async fn recheck(handler: Option<&mut TableRuleHandler>, plan: Option<&Plan>, metrics: &Metrics, health: &Health) {
    if let (Some(h), Some(plan)) = (handler, plan) {
        h.check(plan, metrics, health).await;
    }
}
