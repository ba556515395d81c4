//! Whether a policy rule sends traffic to routewarden's table. With `--route-table` other
//! than main, routes carry traffic only once an `ip rule` makes the kernel look the table up
//! (`fib_rules_lookup`, `net/core/fib_rules.c`: rules in priority order, the first whose
//! selectors match and whose table has a route wins). Main needs no rule: the kernel's
//! default rules (0 `local`, 32766 `main`, 32767 `default`, `fib_default_rules_init`) select
//! it, so main is never checked.
//!
//! Pure: [`check_table`] takes the dumped rules and the table's routes and says, per family
//! that has routes, how the rules cover it ([`RuleCoverage`]):
//!
//! - `all`: a rule `lookup <table>` matches every packet to the table's routes: it has no
//!   selector, or only destination selectors (`to <prefix>`) each covering every route of
//!   the family in the table, and no `not`.
//! - `some`: only rules that match part of the traffic send it there (`from <prefix>`,
//!   `fwmark`, `iif`, `oif`, `tos`, `uidrange`, ports, `not`, or a `to` that misses some
//!   route). routewarden cannot know which traffic an operator means for the table, so this
//!   is reported as a note, not a finding, and the gauge says the table is selected.
//! - `none`: no rule looks the table up: the routes carry no traffic. A finding
//!   (`no-rule-for-table`), a `/readyz` line, and `routewarden_route_table_rule` 0.
//!
//! Rules of a lower priority number that end the lookup first (a `lookup main` whose table
//! has a covering route, a `blackhole`) are not considered: whether a lookup ends depends on
//! the other table's routes, which a rule dump does not hold. The check answers "does any
//! rule send traffic here", the question a deleted rule makes false.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ipnet::IpNet;
use serde::Serialize;

use crate::dataplane::kernel::route::Family;
use crate::dataplane::kernel::rule::{ObservedRule, RuleSelector, RuleVerb};
use crate::vocabulary::RT_TABLE_MAIN;

/// How the policy rules of one family send traffic to a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuleCoverage {
    /// Some rule sends every packet to the table's routes there.
    All,
    /// Only rules with narrowing selectors send traffic there.
    Some,
    /// No rule looks the table up.
    None,
}

/// The check of one family of one table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TableRuleCheck {
    /// The family.
    pub family: Family,
    /// The table (never main).
    pub table: u32,
    /// routewarden's routes of the family in the table.
    pub routes: usize,
    /// How the rules cover it.
    pub coverage: RuleCoverage,
    /// The rules that look the table up (`ip rule` form), lowest priority number first.
    pub rules: Vec<String>,
}

impl TableRuleCheck {
    /// Whether some rule sends traffic of the family to the table (`all` or `some`): the
    /// value of `routewarden_route_table_rule`.
    pub fn selected(&self) -> bool {
        self.coverage != RuleCoverage::None
    }

    /// The audit's and `/readyz`'s line: `None` when a rule selects every packet.
    ///
    /// `no-rule-for-table: table 48 has 12 IPv4 cluster routes and no ip rule selects it (ip -4
    /// rule add from all lookup 48)`, or `rule-selects-some-traffic: table 48 has 12 IPv4
    /// cluster routes; only selective ip rules send traffic to it: <rules>`.
    pub fn line(&self) -> Option<String> {
        let (name, flag) = family_words(self.family);
        let (table, routes) = (self.table, self.routes);
        match self.coverage {
            RuleCoverage::All => None,
            RuleCoverage::None => Some(format!(
                "no-rule-for-table: table {table} has {routes} {name} cluster routes and no ip rule selects it (ip {flag} rule add from all lookup {table})"
            )),
            RuleCoverage::Some => {
                let mut s = format!("rule-selects-some-traffic: table {table} has {routes} {name} cluster routes; only selective ip rules send traffic to it:");
                for r in &self.rules {
                    let _ = write!(s, " [{r}]");
                }
                Some(s)
            }
        }
    }
}

/// `IPv4`/`-4`, `IPv6`/`-6`.
pub fn family_words(family: Family) -> (&'static str, &'static str) {
    match family {
        Family::V4 => ("IPv4", "-4"),
        Family::V6 => ("IPv6", "-6"),
    }
}

/// How `rule` covers the traffic to `routes` (one family's routes in its table), if it
/// looks `table` up at all.
fn rule_coverage(rule: &ObservedRule, table: u32, routes: &[IpNet]) -> Option<RuleCoverage> {
    if rule.verb != RuleVerb::Lookup || rule.table != table {
        return None;
    }
    let covers_every_route = |p: &IpNet| !routes.is_empty() && routes.iter().all(|r| p.contains(r));
    let everything = !rule.invert && rule.selectors.iter().all(|s| matches!(s, RuleSelector::To(p) if covers_every_route(p)));
    Some(if everything { RuleCoverage::All } else { RuleCoverage::Some })
}

/// Check `table` against `rules` (any families, as dumped) for each family that has routes
/// in `routes` (routewarden's routes in the table). Empty for main. Sorted by family.
pub fn check_table(rules: &[ObservedRule], table: u32, routes: &[IpNet]) -> Vec<TableRuleCheck> {
    if table == RT_TABLE_MAIN {
        return Vec::new();
    }
    let mut by_family: BTreeMap<Family, Vec<IpNet>> = BTreeMap::new();
    for r in routes {
        by_family.entry(Family::of(r)).or_default().push(*r);
    }
    by_family
        .into_iter()
        .map(|(family, dsts)| {
            let mut coverage = RuleCoverage::None;
            let mut selecting = Vec::new();
            for r in rules.iter().filter(|r| r.family == family) {
                if let Some(c) = rule_coverage(r, table, &dsts) {
                    coverage = coverage.min(c);
                    selecting.push(r.to_string());
                }
            }
            TableRuleCheck { family, table, routes: dsts.len(), coverage, rules: selecting }
        })
        .collect()
}

/// Whether `rules` hold routewarden's own table rule for `family`: `from all lookup <table>
/// priority <priority> proto <protocol>`, no selector, no `not`. Another writer's rule at the
/// same priority and table (another protocol) is not ours, and not needed to be.
pub fn has_own_rule(rules: &[ObservedRule], family: Family, table: u32, priority: u32, protocol: u8) -> bool {
    rules.iter().any(|r| {
        r.family == family
            && r.verb == RuleVerb::Lookup
            && r.table == table
            && r.priority == priority
            && r.protocol == protocol
            && !r.invert
            && r.selectors.is_empty()
    })
}

#[cfg(test)]
mod tests;
