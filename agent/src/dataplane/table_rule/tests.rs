use super::*;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn rule(family: Family, priority: u32, table: u32, selectors: Vec<RuleSelector>) -> ObservedRule {
    ObservedRule { family, priority, verb: RuleVerb::Lookup, table, protocol: 3, invert: false, selectors }
}

/// The kernel's default rules of a family: local, main, default.
fn defaults(family: Family) -> Vec<ObservedRule> {
    vec![rule(family, 0, 255, vec![]), rule(family, 32766, 254, vec![]), rule(family, 32767, 253, vec![])]
}

fn routes() -> Vec<IpNet> {
    vec![net("10.244.1.0/26"), net("10.244.2.0/26"), net("fd00:10:244:1::/122")]
}

#[test]
fn default_rules_alone_select_no_table_but_main() {
    let rules: Vec<ObservedRule> = defaults(Family::V4).into_iter().chain(defaults(Family::V6)).collect();
    let checks = check_table(&rules, 48, &routes());
    assert_eq!(
        checks,
        vec![
            TableRuleCheck { family: Family::V4, table: 48, routes: 2, coverage: RuleCoverage::None, rules: vec![] },
            TableRuleCheck { family: Family::V6, table: 48, routes: 1, coverage: RuleCoverage::None, rules: vec![] },
        ]
    );
    assert_eq!(
        checks[0].line().as_deref(),
        Some("no-rule-for-table: table 48 has 2 IPv4 cluster routes and no ip rule selects it (ip -4 rule add from all lookup 48)")
    );
    assert_eq!(
        checks[1].line().as_deref(),
        Some("no-rule-for-table: table 48 has 1 IPv6 cluster routes and no ip rule selects it (ip -6 rule add from all lookup 48)")
    );
    assert!(!checks[0].selected());
    assert_eq!(check_table(&rules, RT_TABLE_MAIN, &routes()), vec![], "main is selected by the default rules and never checked");
}

#[test]
fn a_rule_per_family_is_checked_per_family() {
    let mut rules = defaults(Family::V4);
    rules.push(rule(Family::V4, 100, 48, vec![]));
    let checks = check_table(&rules, 48, &routes());
    assert_eq!(checks[0].coverage, RuleCoverage::All);
    assert_eq!(checks[0].rules, vec!["priority 100 from all lookup 48 proto 3".to_string()]);
    assert_eq!(checks[0].line(), None);
    assert!(checks[0].selected());
    assert_eq!(checks[1].coverage, RuleCoverage::None, "an IPv4 rule selects nothing for IPv6");
}

#[test]
fn table_ids_above_255_compare_whole() {
    let rules = vec![rule(Family::V4, 100, 1000 + 48, vec![]), rule(Family::V4, 101, 48 + 256, vec![])];
    let checks = check_table(&rules, 1048, &[net("10.244.1.0/26")]);
    assert_eq!(checks[0].coverage, RuleCoverage::All);
    assert_eq!(checks[0].rules, vec!["priority 100 from all lookup 1048 proto 3".to_string()]);
}

#[test]
fn destination_selectors_covering_every_route_select_all_traffic() {
    let covering = rule(Family::V4, 100, 48, vec![RuleSelector::To(net("10.244.0.0/16"))]);
    assert_eq!(check_table(&[covering], 48, &routes())[0].coverage, RuleCoverage::All);
    let partial = rule(Family::V4, 100, 48, vec![RuleSelector::To(net("10.244.1.0/24"))]);
    assert_eq!(check_table(&[partial], 48, &routes())[0].coverage, RuleCoverage::Some, "10.244.2.0/26 is not covered");
}

#[test]
fn narrowing_selectors_and_not_select_some_traffic_only() {
    for selectors in [
        vec![RuleSelector::From(net("10.0.0.0/8"))],
        vec![RuleSelector::Other("fwmark 0x10/0xff".into())],
        vec![RuleSelector::Other("iif eth0".into())],
        vec![RuleSelector::To(net("10.244.0.0/16")), RuleSelector::Other("ipproto 6".into())],
    ] {
        let r = rule(Family::V4, 100, 48, selectors.clone());
        let checks = check_table(&[r], 48, &routes());
        assert_eq!(checks[0].coverage, RuleCoverage::Some, "{selectors:?}");
        assert!(checks[0].selected());
    }
    let mut inverted = rule(Family::V4, 100, 48, vec![RuleSelector::Other("fwmark 0x10".into())]);
    inverted.invert = true;
    let checks = check_table(&[inverted], 48, &routes());
    assert_eq!(checks[0].coverage, RuleCoverage::Some);
    assert_eq!(
        checks[0].line().as_deref(),
        Some("rule-selects-some-traffic: table 48 has 2 IPv4 cluster routes; only selective ip rules send traffic to it: [priority 100 not from all fwmark 0x10 lookup 48 proto 3]")
    );
}

#[test]
fn one_unselective_rule_makes_all_whatever_else_there_is() {
    let rules = vec![rule(Family::V4, 50, 48, vec![RuleSelector::Other("fwmark 0x1".into())]), rule(Family::V4, 100, 48, vec![])];
    let checks = check_table(&rules, 48, &routes());
    assert_eq!(checks[0].coverage, RuleCoverage::All);
    assert_eq!(checks[0].rules.len(), 2);
}

#[test]
fn non_lookup_rules_and_other_tables_select_nothing() {
    let mut goto = rule(Family::V4, 100, 48, vec![]);
    goto.verb = RuleVerb::Other;
    let rules = vec![goto, rule(Family::V4, 101, 49, vec![])];
    assert_eq!(check_table(&rules, 48, &routes())[0].coverage, RuleCoverage::None);
}

#[test]
fn own_rule_is_ours_only_with_our_protocol_priority_and_no_selector() {
    let ours = ObservedRule { protocol: 200, ..rule(Family::V4, 100, 48, vec![]) };
    assert!(has_own_rule(std::slice::from_ref(&ours), Family::V4, 48, 100, 200));
    assert!(!has_own_rule(std::slice::from_ref(&ours), Family::V6, 48, 100, 200));
    assert!(!has_own_rule(std::slice::from_ref(&ours), Family::V4, 48, 101, 200));
    assert!(!has_own_rule(std::slice::from_ref(&ours), Family::V4, 49, 100, 200));
    assert!(!has_own_rule(&[rule(Family::V4, 100, 48, vec![])], Family::V4, 48, 100, 200), "another protocol's rule is not ours");
    let selective = ObservedRule { selectors: vec![RuleSelector::Other("fwmark 0x1".into())], ..ours };
    assert!(!has_own_rule(&[selective], Family::V4, 48, 100, 200));
}
