//! Object names and the CIDRs an object mentions.
//!
//! - [`is_dns1123_subdomain`]: the Kubernetes rule for object names (and so for Calico's
//!   names, node names included): `k8s.io/apimachinery/pkg/util/validation`
//!   `IsDNS1123Subdomain` — at most 253 characters of `[a-z0-9.-]`, dot-separated labels that
//!   start and end with a letter or digit.
//! - [`block_name`]: the name of an IPAM block, its CIDR with `.`, `:` and `/` turned into `-`
//!   (`libcalico-go/lib/names` `CIDRToName`; `libcalico-go/lib/backend/k8s/resources/
//!   ipam_block.go` names every block so).
//! - [`mentioned_cidrs`]: every CIDR and address a (possibly broken) object mentions, for
//!   freezing the ground a rejected object could want.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_yaml_ng::Value;

use super::kind::Kind;

/// Whether `name` is a DNS-1123 subdomain (Kubernetes object names).
pub fn is_dns1123_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty() && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-') && b[0] != b'-' && b[b.len() - 1] != b'-'
        })
}

/// The object name Calico gives the IPAM block of `cidr` (`10.244.1.0/26` → `10-244-1-0-26`,
/// `fd00:10:244::/122` → `fd00-10-244---122`).
pub fn block_name(cidr: IpNet) -> String {
    cidr.to_string().replace(['.', ':', '/'], "-")
}

/// The CIDR an IPAM block name encodes, when it is in [`block_name`] form.
pub fn parse_block_name(name: &str) -> Option<IpNet> {
    let (addr, len) = name.rsplit_once('-')?;
    let len: u8 = len.parse().ok()?;
    // IPv4: four dash-separated decimal parts.
    let v4 = addr.replace('-', ".");
    if let Ok(ip) = v4.parse::<std::net::Ipv4Addr>() {
        return IpNet::new(IpAddr::V4(ip), len).ok().filter(|n| block_name(*n) == name);
    }
    let v6 = addr.replace('-', ":");
    let ip = v6.parse::<std::net::Ipv6Addr>().ok()?;
    IpNet::new(IpAddr::V6(ip), len).ok().filter(|n| block_name(*n) == name)
}

/// Most CIDRs one broken input or object freezes one by one: past it, the whole address space
/// is frozen (`0.0.0.0/0`, `::/0`), which costs the reconciler two comparisons a route, not
/// thousands.
pub const MAX_FROZEN_PER_INPUT: usize = 1024;

fn capped(set: BTreeSet<IpNet>) -> Vec<IpNet> {
    if set.len() > MAX_FROZEN_PER_INPUT {
        return ["0.0.0.0/0", "::/0"].iter().filter_map(|s| s.parse().ok()).collect();
    }
    set.into_iter().collect()
}

/// Every CIDR and address in the string scalars of `doc` (an address as a host prefix), and
/// the CIDR an IPAM block's name encodes. Sorted, deduplicated, truncated to networks; more
/// than [`MAX_FROZEN_PER_INPUT`] become the whole address space. Strings that are not
/// addresses are skipped, so a broken object still yields what it names.
pub fn mentioned_cidrs(doc: &Value, kind: Option<Kind>, name: Option<&str>) -> Vec<IpNet> {
    let mut out = BTreeSet::new();
    walk(doc, &mut out, 0);
    if let (Some(Kind::IpamBlock), Some(n)) = (kind, name) {
        out.extend(parse_block_name(n));
    }
    capped(out)
}

/// The CIDRs and addresses in free text (a file that is not valid YAML): every token of
/// address characters that parses (capped as [`mentioned_cidrs`]).
pub fn cidrs_in_text(text: &str) -> Vec<IpNet> {
    let mut out = BTreeSet::new();
    let is_addr_char = |c: char| c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '/');
    for token in text.split(|c: char| !is_addr_char(c)) {
        if token.len() >= 2 {
            out.extend(parse_cidr_or_ip(token.trim_matches(|c| c == ':' || c == '.')));
        }
    }
    capped(out)
}

fn parse_cidr_or_ip(s: &str) -> Option<IpNet> {
    if s.contains('/') {
        s.parse::<IpNet>().ok().map(|n| n.trunc())
    } else if s.contains('.') || s.matches(':').count() >= 2 {
        s.parse::<IpAddr>().ok().map(IpNet::from)
    } else {
        None
    }
}

fn walk(v: &Value, out: &mut BTreeSet<IpNet>, depth: usize) {
    if depth > 64 {
        return;
    }
    match v {
        Value::String(s) => out.extend(parse_cidr_or_ip(s.trim())),
        Value::Sequence(items) => items.iter().for_each(|i| walk(i, out, depth + 1)),
        Value::Mapping(m) => m.iter().for_each(|(k, v)| {
            walk(k, out, depth + 1);
            walk(v, out, depth + 1);
        }),
        Value::Tagged(t) => walk(&t.value, out, depth + 1),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::*;

    #[test]
    fn dns1123_subdomains() {
        for good in ["a", "node-a", "node.node-a", "10-244-1-0-26", "a.b.c", &"a".repeat(253)] {
            assert!(is_dns1123_subdomain(good), "{good}");
        }
        for bad in ["", "A", "node_a", "-a", "a-", "a..b", ".a", "a.", "a\nb", "a\u{1b}[31m", "a b", &"a".repeat(254), "ä"] {
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
    }

    #[test]
    fn block_names_round_trip() {
        for (cidr, name) in [("10.244.1.0/26", "10-244-1-0-26"), ("fd00:10:244:0:10::/122", "fd00-10-244-0-10---122"), ("fd00::/122", "fd00---122")] {
            let net: IpNet = cidr.parse().unwrap();
            assert_eq!(block_name(net), name);
            assert_eq!(parse_block_name(name), Some(net));
        }
        assert_eq!(parse_block_name("b1"), None);
        assert_eq!(parse_block_name("10-244-1-0"), None);
    }

    #[test]
    fn cidrs_are_found_in_values_and_text() {
        let v: Value =
            serde_yaml_ng::from_str("metadata: {name: 10-244-9-0-26}\nspec: {cidr: 10.244.9.0/26, node: 10.0.0.11, x: [fd00::1, 'not an address', 12, 1.2]}")
                .unwrap();
        let got: Vec<String> = mentioned_cidrs(&v, Some(Kind::IpamBlock), Some("10-245-1-0-26")).iter().map(ToString::to_string).collect();
        assert_eq!(got, ["10.0.0.11/32", "10.244.9.0/26", "10.245.1.0/26", "fd00::1/128"]);
        let text = "kind: IPPool\nspec: {cidr: 10.244.0.0/16, ipipMode: Always\n  # node 10.0.1.14, time 10:05:00.000\n";
        let got: Vec<String> = cidrs_in_text(text).iter().map(ToString::to_string).collect();
        assert_eq!(got, ["10.0.1.14/32", "10.244.0.0/16"]);
        // Too many to freeze one by one: everything.
        let many = (0..2000).fold(String::new(), |mut s, i| {
            let _ = write!(s, "10.{}.{}.0/24 ", i / 256, i % 256);
            s
        });
        let got: Vec<String> = cidrs_in_text(&many).iter().map(ToString::to_string).collect();
        assert_eq!(got, ["0.0.0.0/0", "::/0"]);
    }
}
