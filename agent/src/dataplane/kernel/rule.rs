//! Policy routing rules (`ip rule`): the kernel's `RTM_NEWRULE` messages parsed into
//! [`ObservedRule`], the per-family dump, and the one rule write routewarden makes
//! (`--route-table-rule-priority`): `from all lookup <table> priority <n> proto <ours>`,
//! created exclusively (`NLM_F_CREATE | NLM_F_EXCL`), never replaced and never deleted.
//!
//! Rules have no replace: `fib_nl_newrule` (`net/core/fib_rules.c`) ignores `NLM_F_REPLACE`
//! and, without `NLM_F_EXCL`, adds a duplicate; with it, an identical rule (`rule_exists`:
//! same action, table, priority, selectors and protocol) answers `EEXIST`. So "replace-only"
//! for a rule means: create when a dump shows ours absent, never delete-then-add.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use rtnetlink::packet_core::{NetlinkMessage, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleFlags, RuleMessage};
use rtnetlink::packet_route::RouteNetlinkMessage;
use serde::Serialize;

use super::route::Family;

/// What a rule does when it matches (`fib_rule_hdr.action`, `FR_ACT_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuleVerb {
    /// `FR_ACT_TO_TBL`: look the destination up in the rule's table.
    Lookup,
    /// `FR_ACT_GOTO`, `FR_ACT_NOP`, `FR_ACT_BLACKHOLE`, `FR_ACT_UNREACHABLE`,
    /// `FR_ACT_PROHIBIT` or another: anything but a table lookup.
    Other,
}

/// A selector of a rule: a condition a packet must meet for the rule to match. Every
/// selector but a destination covering the cluster's pools narrows the traffic the rule
/// sends to its table (`crate::dataplane::table_rule`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuleSelector {
    /// `from <prefix>` (`FRA_SRC`, a source prefix longer than /0).
    From(IpNet),
    /// `to <prefix>` (`FRA_DST`).
    To(IpNet),
    /// Any other selector, as `ip rule` prints it (`fwmark 0x1/0xff`, `iif eth0`, `tos 0x10`,
    /// `uidrange`, `ipproto`, `sport`, `dport`, `l3mdev`, `tun_id`, ...).
    Other(String),
}

/// One policy rule as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ObservedRule {
    /// The rule's family.
    pub family: Family,
    /// Its priority (`FRA_PRIORITY`; 0 when absent, the kernel's `local` rule).
    pub priority: u32,
    /// What it does.
    pub verb: RuleVerb,
    /// The table it looks up (`FRA_TABLE`, else `fib_rule_hdr.table`; ids above 255 only
    /// in the attribute).
    pub table: u32,
    /// Who made it (`FRA_PROTOCOL`, 0 when absent: `RTPROT_UNSPEC`, Linux before 4.17 or a
    /// writer that set none).
    pub protocol: u8,
    /// `not` (`FIB_RULE_INVERT`): the rule matches what its selectors do not.
    pub invert: bool,
    /// Its selectors (empty: `from all`).
    pub selectors: Vec<RuleSelector>,
}

impl fmt::Display for ObservedRule {
    /// `ip rule` style: `priority 100 not from 10.0.0.0/8 fwmark 0x1 lookup 48 proto 4`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "priority {}", self.priority)?;
        if self.invert {
            f.write_str(" not")?;
        }
        if !self.selectors.iter().any(|s| matches!(s, RuleSelector::From(_))) {
            f.write_str(" from all")?;
        }
        for s in &self.selectors {
            match s {
                RuleSelector::From(p) => write!(f, " from {p}")?,
                RuleSelector::To(p) => write!(f, " to {p}")?,
                RuleSelector::Other(o) => write!(f, " {o}")?,
            }
        }
        match self.verb {
            RuleVerb::Lookup => write!(f, " lookup {}", self.table)?,
            RuleVerb::Other => f.write_str(" (no lookup)")?,
        }
        write!(f, " proto {}", self.protocol)
    }
}

/// Parse one rule message; `None` for a family other than IPv4 and IPv6.
pub fn parse_rule(m: &RuleMessage) -> Option<ObservedRule> {
    let family = match m.header.family {
        rtnetlink::packet_route::AddressFamily::Inet => Family::V4,
        rtnetlink::packet_route::AddressFamily::Inet6 => Family::V6,
        _ => return None,
    };
    let mut rule = ObservedRule {
        family,
        priority: 0,
        verb: if m.header.action == RuleAction::ToTable { RuleVerb::Lookup } else { RuleVerb::Other },
        table: u32::from(m.header.table),
        protocol: 0,
        invert: m.header.flags.contains(RuleFlags::Invert),
        selectors: Vec::new(),
    };
    let prefix = |ip: IpAddr, len: u8| IpNet::new(ip, len).ok();
    let mut mark = None;
    let mut mark_mask = None;
    for a in &m.attributes {
        match a {
            RuleAttribute::Priority(p) => rule.priority = *p,
            RuleAttribute::Table(t) => rule.table = *t,
            RuleAttribute::Protocol(p) => rule.protocol = u8::from(*p),
            RuleAttribute::Source(ip) if m.header.src_len > 0 => rule.selectors.extend(prefix(*ip, m.header.src_len).map(RuleSelector::From)),
            RuleAttribute::Destination(ip) => rule.selectors.extend(prefix(*ip, m.header.dst_len).map(RuleSelector::To)),
            RuleAttribute::FwMark(v) if *v != 0 => mark = Some(*v),
            RuleAttribute::FwMask(v) => mark_mask = Some(*v),
            RuleAttribute::Iifname(n) => rule.selectors.push(RuleSelector::Other(format!("iif {}", crate::text::escape(n)))),
            RuleAttribute::Oifname(n) => rule.selectors.push(RuleSelector::Other(format!("oif {}", crate::text::escape(n)))),
            RuleAttribute::L3MDev(true) => rule.selectors.push(RuleSelector::Other("l3mdev".into())),
            RuleAttribute::UidRange(r) => rule.selectors.push(RuleSelector::Other(format!("uidrange {}-{}", r.start, r.end))),
            RuleAttribute::IpProtocol(p) => rule.selectors.push(RuleSelector::Other(format!("ipproto {}", i32::from(*p)))),
            RuleAttribute::SourcePortRange(r) => rule.selectors.push(RuleSelector::Other(format!("sport {}-{}", r.start, r.end))),
            RuleAttribute::DestinationPortRange(r) => rule.selectors.push(RuleSelector::Other(format!("dport {}-{}", r.start, r.end))),
            RuleAttribute::TunId(id) if *id != 0 => rule.selectors.push(RuleSelector::Other(format!("tun_id {id}"))),
            _ => {}
        }
    }
    if m.header.tos != 0 {
        rule.selectors.push(RuleSelector::Other(format!("tos {:#x}", m.header.tos)));
    }
    if let Some(mark) = mark {
        let sel = match mark_mask {
            Some(bits) if bits != u32::MAX => format!("fwmark {mark:#x}/{bits:#x}"),
            _ => format!("fwmark {mark:#x}"),
        };
        rule.selectors.push(RuleSelector::Other(sel));
    }
    Some(rule)
}

/// The `RTM_GETRULE` dump request of one family.
pub(super) fn rule_dump_request(family: Family) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut msg = RuleMessage::default();
    msg.header.family = family.address_family();
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetRule(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    req
}

/// The rule routewarden writes with `--route-table-rule-priority`: `from all lookup <table>
/// priority <priority> proto <protocol>` in `family`, as an exclusive create.
pub fn table_rule_request(family: Family, table: u32, priority: u32, protocol: u8) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut msg = RuleMessage::default();
    msg.header.family = family.address_family();
    msg.header.action = RuleAction::ToTable;
    // As `ip rule` does: the header holds ids below 256, `RT_TABLE_COMPAT` (252) otherwise,
    // and FRA_TABLE always carries the full id.
    msg.header.table = u8::try_from(table).unwrap_or(252);
    msg.attributes.push(RuleAttribute::Table(table));
    msg.attributes.push(RuleAttribute::Priority(priority));
    msg.attributes.push(RuleAttribute::Protocol(protocol.into()));
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewRule(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    req
}

#[cfg(test)]
mod tests;
